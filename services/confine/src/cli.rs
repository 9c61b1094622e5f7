//! The command line, parsed in two stages: clap checks syntax here, then
//! [`Cli::to_policy`] builds the [`Policy`] the library validates.

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use airlock_sandbox::{Limits, MAX_LANDLOCK_ABI, Policy};
use clap::Parser;

const ABOUT: &str = "Run a command confined: its own minimal root, other ids, no capabilities, no_new_privs, rlimits, Landlock, seccomp";

const LONG_ABOUT: &str = "\
airlock-confine runs one command in a fresh sandbox and returns its exit status. \
It is built on the same engine as airlock's executor, which prepares the sandbox \
once and starts every verification command with it; here it serves one command.

The helper is single-threaded and prepares, in this fixed order, every step \
failing hard:

 1. The view. Where the kernel allows it, a minimal root: a user namespace when not \
run as root (mapping only your own uid and gid), a mount namespace, and in it a root \
holding only the system paths (/usr, /bin, /lib*, a few files of /etc, never all of \
/etc) bound read-only, --ro paths read-only and --rw directories read-write at their \
own places, a /dev with only null, zero, full, random and urandom, a private tmpfs \
on /tmp (/dev/shm points at it) and /proc of the command's own pid namespace; \
nothing else exists, so not even chmod, chown, utime or xattr calls (which Landlock \
does not govern) can reach another file. Where user namespaces are refused (disabled \
by sysctl, or restricted as Ubuntu's AppArmor does), or with --no-namespaces, the \
host view: the same Landlock grants, and seccomp refuses every metadata call by \
path. The report's \"view\" says which.
 2. The command's init is cloned into new mount, pid, IPC, UTS and network (only a \
down loopback) namespaces; it mounts the command's directories, /tmp and /proc, \
pivots into the minimal root, and forks the command's process, which empties the \
capability bounding set and locks securebits, then (as root) clears supplementary \
groups and switches gid and uid (default 65534), then clears the ambient, \
inheritable, effective and permitted capability sets and verifies them empty.
 3. no_new_privs: setuid bits and file capabilities can never grant anything again.
 4. Resource limits (soft = hard): processes, address space, file size, open files, \
CPU seconds, and no core dumps.
 5. Landlock: every access right of the running kernel's Landlock ABI is handled. \
Read and execute: --ro paths and system paths; read-write: --rw directories and the \
private /tmp; /dev/null, /dev/zero, /dev/full, /dev/random, /dev/urandom. A ruleset \
that is not fully enforced is refused unless --allow-degraded is given.
 6. seccomp, last (compiled once, before any fork): sockets other than AF_UNIX, \
ptrace, process_vm_*, pidfd_getfd, mount and the new mount API, umount, pivot_root, \
chroot, unshare, setns, clone with namespace flags, keyrings, bpf, perf_event_open, \
io_uring, userfaultfd, kexec, module loading, reboot, swap, acct, quotactl, syslog and \
the TIOCSTI and TIOCLINUX ioctls fail with EPERM; clone3 fails with ENOSYS so that \
glibc falls back to clone; x32 system calls fail with ENOSYS and foreign-architecture \
calls kill the process. Where Landlock cannot confine pathname UNIX sockets (ABI \
below 9), connect and datagram UNIX sockets fail with EPERM too, so that the host's \
sockets (the system bus, journald, /dev/log) stay out of reach; socketpair streams \
still work. In the host view, chmod, chown, utime, setxattr and removexattr by path \
(and fchownat or fchmodat2 on an O_PATH descriptor) fail with EPERM; their \
descriptor forms work on files the command may open.
 7. A clean environment: only PATH, LC_ALL, HOME (the working directory), TMPDIR \
(/tmp when private, else the working directory) and --env entries; default signal \
dispositions; then a new session (setsid) and execve.

When the command exits, the init kills every process left in the sandbox (daemons \
included), and the kernel lets the init's exit complete only once its pid namespace \
is empty; on --timeout the helper kills the init, which takes the whole namespace \
with it. In the host view the helper is a child subreaper and kills the command's \
orphans until it has no child left.";

const AFTER_LONG_HELP: &str = "\
EXIT STATUS:
  the command's exit status, or 128+N when it was killed by signal N;
  124  the --timeout passed and the sandbox was killed;
  125  the sandbox could not be set up (the message names the step and the airlock
       code, e.g. SANDBOX_UNAVAILABLE), or invalid arguments;
  126  the command was found but could not be executed;
  127  the command was not found.

EXAMPLES:
  airlock-confine --rw \"$PWD\" --timeout 10m -- make check
  airlock-confine --uid 1000 --gid 1000 --ro /opt/toolchain --rw /srv/ws \\
      --report /run/airlock/report.json -- cargo test --offline";

/// A resource limit value: a number or `unlimited` (keep the inherited limit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit(pub Option<u64>);

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(n) => write!(f, "{n}"),
            None => f.write_str("unlimited"),
        }
    }
}

/// A size in bytes with an optional K, M or G (binary) suffix.
fn parse_size(s: &str) -> Result<u64, String> {
    let (digits, shift) = match s.as_bytes().last() {
        Some(b'K' | b'k') => (&s[..s.len() - 1], 10),
        Some(b'M' | b'm') => (&s[..s.len() - 1], 20),
        Some(b'G' | b'g') => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a size (e.g. 4096, 512M, 8G)"))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))
}

fn parse_limit_size(s: &str) -> Result<Limit, String> {
    if s == "unlimited" {
        return Ok(Limit(None));
    }
    parse_size(s).map(|n| Limit(Some(n)))
}

/// A duration: a number with an optional ms, s, m or h suffix (default s).
fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?} is not a duration (e.g. 500ms, 30, 30s, 10m, 1h)");
    let (num, unit_ms) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1000)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60_000)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3_600_000)
    } else {
        (s, 1000)
    };
    let n: u64 = num.parse().map_err(|_| bad())?;
    let ms = n.checked_mul(unit_ms).ok_or_else(bad)?;
    if ms == 0 {
        return Err("the timeout must be positive".into());
    }
    Ok(Duration::from_millis(ms))
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))?;
    Ok((k.to_owned(), v.to_owned()))
}

fn default_limits() -> Limits {
    Limits::default()
}

/// airlock-confine's options.
#[derive(Debug, Parser)]
#[command(
    name = "airlock-confine",
    version,
    about = ABOUT,
    long_about = LONG_ABOUT,
    after_long_help = AFTER_LONG_HELP,
    max_term_width = 100
)]
pub struct Cli {
    /// Run the command as this uid (root only). Default when root: 65534
    /// (nobody); otherwise your own uid, which is the only one allowed.
    #[arg(long, value_name = "UID")]
    pub uid: Option<u32>,

    /// Run the command as this gid (root only). Default: the --uid value,
    /// else 65534 when root, else your own gid.
    #[arg(long, value_name = "GID")]
    pub gid: Option<u32>,

    /// Grant read and execute access to PATH (a directory tree or a file).
    /// Repeatable. Must exist.
    #[arg(long = "ro", value_name = "PATH")]
    pub ro: Vec<PathBuf>,

    /// Grant full access to the directory tree DIR (the workspace).
    /// Repeatable. Must exist. The first one is the default working directory.
    #[arg(long = "rw", value_name = "DIR")]
    pub rw: Vec<PathBuf>,

    /// Working directory and HOME of the command. Default: the first --rw
    /// directory, else the current directory.
    #[arg(long, value_name = "DIR")]
    pub workdir: Option<PathBuf>,

    /// Do not grant the system paths (/usr, /bin, /lib*, selected /etc files)
    /// read and execute access; only --ro and --rw paths are reachable.
    #[arg(long)]
    pub no_system_ro: bool,

    /// Kill the whole sandbox after DURATION (500ms, 30, 30s, 10m, 1h) and
    /// exit with status 124.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub timeout: Option<Duration>,

    /// RLIMIT_NPROC: processes of the command's uid (system-wide count), or
    /// "unlimited".
    #[arg(long, value_name = "N", value_parser = parse_limit_size, default_value_t = Limit(default_limits().nproc))]
    pub limit_nproc: Limit,

    /// RLIMIT_AS: address space in bytes (K, M, G suffixes), or "unlimited".
    #[arg(long, value_name = "SIZE", value_parser = parse_limit_size, default_value_t = Limit(default_limits().address_space))]
    pub limit_as: Limit,

    /// RLIMIT_FSIZE: largest file the command may write, in bytes (K, M, G
    /// suffixes), or "unlimited".
    #[arg(long, value_name = "SIZE", value_parser = parse_limit_size, default_value_t = Limit(default_limits().file_size))]
    pub limit_fsize: Limit,

    /// RLIMIT_NOFILE: open file descriptors, or "unlimited".
    #[arg(long, value_name = "N", value_parser = parse_limit_size, default_value_t = Limit(default_limits().open_files))]
    pub limit_nofile: Limit,

    /// RLIMIT_CPU: CPU seconds, or "unlimited".
    #[arg(long, value_name = "SECONDS", value_parser = parse_limit_size, default_value_t = Limit(default_limits().cpu_seconds))]
    pub limit_cpu: Limit,

    /// The lowest Landlock ABI counted as fully enforced. A kernel below it
    /// (or without Landlock) is refused unless --allow-degraded is given.
    #[arg(long, value_name = "N", default_value_t = Policy::default().landlock_min_abi,
          value_parser = clap::value_parser!(u8).range(1..=i64::from(MAX_LANDLOCK_ABI)))]
    pub landlock_min_abi: u8,

    /// Run even when Landlock is not fully enforced. A loud warning goes to
    /// stderr and the report records "degraded": true.
    #[arg(long)]
    pub allow_degraded: bool,

    /// Add KEY=VALUE to the command's clean environment (repeatable; may
    /// override PATH, LC_ALL, HOME or TMPDIR).
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse_env)]
    pub env: Vec<(String, String)>,

    /// Do not mount a private tmpfs on /tmp (it is also skipped when a
    /// --ro, --rw or --workdir path lies under /tmp).
    #[arg(long)]
    pub no_private_tmp: bool,

    /// Create no namespace at all (for kernels or containers where they
    /// misbehave). Landlock, seccomp, rlimits and the id switch still apply;
    /// /proc is then not granted, and leftover processes are found as
    /// orphans reparented to the helper instead of by pid namespace.
    #[arg(long)]
    pub no_namespaces: bool,

    /// Size of the private /tmp (K, M, G suffixes).
    #[arg(long, value_name = "SIZE", value_parser = parse_size, default_value_t = Policy::default().tmp_size)]
    pub tmp_size: u64,

    /// Write a JSON report (ids, namespaces, Landlock ABI and status, seccomp,
    /// degraded mode, outcome, survivors) to FILE, created mode 0600.
    #[arg(long, value_name = "FILE", conflicts_with = "report_fd")]
    pub report: Option<PathBuf>,

    /// Write the JSON report to the already open file descriptor FD.
    #[arg(long, value_name = "FD")]
    pub report_fd: Option<i32>,

    /// Print this manual page in roff format and exit.
    #[arg(long, hide = true)]
    pub print_man: bool,

    /// The command and its arguments, after "--". Found in
    /// /usr/local/bin:/usr/bin:/bin unless it contains a slash.
    #[arg(
        last = true,
        value_name = "COMMAND",
        required_unless_present = "print_man"
    )]
    pub command: Vec<OsString>,
}

impl Cli {
    /// The policy these options describe (relative paths made absolute).
    pub fn to_policy(&self) -> std::io::Result<Policy> {
        let abs = |p: &PathBuf| std::path::absolute(p);
        Ok(Policy {
            uid: self.uid,
            gid: self.gid,
            ro: self.ro.iter().map(abs).collect::<Result<_, _>>()?,
            rw: self.rw.iter().map(abs).collect::<Result<_, _>>()?,
            workdir: self.workdir.as_ref().map(abs).transpose()?,
            system_ro: !self.no_system_ro,
            limits: Limits {
                nproc: self.limit_nproc.0,
                address_space: self.limit_as.0,
                file_size: self.limit_fsize.0,
                open_files: self.limit_nofile.0,
                cpu_seconds: self.limit_cpu.0,
            },
            allow_degraded: self.allow_degraded,
            landlock_min_abi: self.landlock_min_abi,
            timeout: self.timeout,
            env: self.env.clone(),
            private_tmp: !self.no_private_tmp,
            namespaces: !self.no_namespaces,
            tmp_size: self.tmp_size,
        })
    }
}

/// The manual page, in roff.
pub fn man_page() -> Vec<u8> {
    let mut out = Vec::new();
    clap_mangen::Man::new(<Cli as clap::CommandFactory>::command())
        .render(&mut out)
        .expect("rendering to memory cannot fail");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("airlock-confine").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults_are_the_library_defaults() {
        let cli = parse(&["--", "true"]);
        assert_eq!(cli.to_policy().unwrap(), Policy::default());
    }

    #[test]
    fn policy_round_trips_through_to_args() {
        let policy = Policy {
            uid: Some(1000),
            gid: Some(1001),
            ro: vec!["/opt".into(), "/srv/ro".into()],
            rw: vec!["/srv/ws".into()],
            workdir: Some("/srv/ws/sub".into()),
            system_ro: false,
            limits: Limits {
                nproc: Some(10),
                address_space: None,
                file_size: Some(1 << 20),
                open_files: Some(64),
                cpu_seconds: None,
            },
            allow_degraded: true,
            landlock_min_abi: 3,
            timeout: Some(Duration::from_millis(1500)),
            env: vec![("A".into(), "b=c".into())],
            private_tmp: false,
            namespaces: false,
            tmp_size: 1 << 20,
        };
        let mut argv: Vec<OsString> = vec!["airlock-confine".into()];
        argv.extend(policy.to_args());
        argv.extend(["--".into(), "true".into()]);
        let cli = Cli::try_parse_from(argv).unwrap();
        assert_eq!(cli.to_policy().unwrap(), policy);
        assert_eq!(cli.command, [OsString::from("true")]);
    }

    #[test]
    fn sizes_and_durations_parse() {
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("8G").unwrap(), 8 << 30);
        assert!(parse_size("x").is_err());
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("30").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert!(parse_duration("0").is_err());
        assert_eq!(parse_limit_size("unlimited").unwrap(), Limit(None));
    }

    #[test]
    fn command_needs_the_separator() {
        assert!(Cli::try_parse_from(["airlock-confine", "true"]).is_err());
        assert!(Cli::try_parse_from(["airlock-confine"]).is_err());
        assert!(Cli::try_parse_from(["airlock-confine", "--print-man"]).is_ok());
    }

    #[test]
    fn man_page_mentions_every_option() {
        let man = String::from_utf8(man_page()).unwrap();
        for arg in Cli::command().get_arguments() {
            if arg.is_hide_set() {
                continue;
            }
            if let Some(long) = arg.get_long() {
                // roff escapes '-' as '\-'.
                let escaped = format!("\\-\\-{}", long.replace('-', "\\-"));
                assert!(man.contains(&escaped), "man page lacks --{long}");
            }
        }
        assert!(man.contains("EXIT STATUS"));
    }

    #[test]
    fn committed_man_page_is_current() {
        let committed =
            std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/airlock-confine.1")).unwrap();
        assert!(
            committed == man_page(),
            "regenerate: cargo run -p airlock-confine -- --print-man > services/confine/airlock-confine.1"
        );
    }
}

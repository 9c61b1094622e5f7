//! airlock's systemd testbed.
//!
//! The package is checked the way an administrator meets it: `scripts/package`
//! builds the .deb, a minimal Debian root (debootstrap, cached between runs)
//! is booted with `systemd-nspawn --volatile=overlay`, so it has a real
//! systemd as pid 1, a real system bus and polkitd, the .deb is installed
//! with apt-get, and the services are driven with systemctl and airlockctl.
//! [`scenario`] holds the checks; this module holds the machinery: commands
//! with time limits, the cached root, the booted container and the report.
//!
//! The container is driven with `nsenter` into its init's namespaces (the
//! host's systemd is not pid 1 on every machine this runs on, so
//! `machinectl` and `systemd-run --machine` are not relied on).

#![allow(clippy::missing_errors_doc)]

pub mod hardening;
pub mod scenario;
pub mod units;

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Packages debootstrap adds to the minimal root (DESIGN.md §5): what the
/// package depends on, and Debian's node exporter with acl for the metrics
/// check (docs/metrics.md's ACL), and Cockpit (with dbus-user-session,
/// which debootstrap does not pick for dconf-service's alternative) for the
/// Cockpit page.
pub const ROOT_INCLUDE: &str = "systemd,systemd-sysv,dbus,libpam-systemd,polkitd,git,python3,prometheus-node-exporter,acl,cockpit-ws,cockpit-system,cockpit-bridge,dbus-user-session,sudo";
/// The Debian release of the root.
pub const ROOT_SUITE: &str = "bookworm";
/// Default cache directory for the root; `AIRLOCK_TESTBED_CACHE` overrides it.
pub const DEFAULT_CACHE: &str = "/var/cache/airlock-testbed";
/// The Debian mirror debootstrap fetches from: `AIRLOCK_TESTBED_MIRROR`,
/// else the one this host's apt uses (the first `deb` source of
/// `/etc/apt/sources.list` or a deb822 file in `sources.list.d/` that is
/// not a security archive), so that the testbed asks apt which registry
/// to use rather than naming one.
pub fn debian_mirror() -> Result<String, String> {
    if let Ok(m) = std::env::var("AIRLOCK_TESTBED_MIRROR") {
        return Ok(m);
    }
    let mut files = vec![PathBuf::from("/etc/apt/sources.list")];
    if let Ok(dir) = fs::read_dir("/etc/apt/sources.list.d") {
        let mut more: Vec<PathBuf> = dir.flatten().map(|e| e.path()).collect();
        more.sort();
        files.extend(more);
    }
    files
        .iter()
        .filter_map(|f| fs::read_to_string(f).ok().map(|t| (f, t)))
        .flat_map(|(f, text)| mirrors_in(f, &text))
        .find(|uri| !uri.trim_end_matches('/').ends_with("-security"))
        .ok_or_else(|| {
            "no Debian mirror in /etc/apt/sources.list{,.d}: set AIRLOCK_TESTBED_MIRROR".to_owned()
        })
}

/// The `deb` source URIs of one apt sources file (one-line or deb822).
#[must_use]
fn mirrors_in(file: &Path, text: &str) -> Vec<String> {
    let name = file.to_string_lossy();
    if name.ends_with(".sources") {
        text.split("\n\n")
            .filter(|stanza| {
                stanza.lines().any(|l| {
                    l.strip_prefix("Types:")
                        .is_some_and(|t| t.split_whitespace().any(|t| t == "deb"))
                }) && !stanza.lines().any(|l| l.trim() == "Enabled: no")
            })
            .flat_map(|stanza| {
                stanza
                    .lines()
                    .filter_map(|l| l.strip_prefix("URIs:"))
                    .flat_map(|u| u.split_whitespace().map(str::to_owned))
                    .collect::<Vec<_>>()
            })
            .collect()
    } else if name.ends_with(".list") {
        text.lines()
            .map(str::trim)
            .filter(|l| l.starts_with("deb "))
            .filter_map(|l| {
                // `deb [options] URI suite …`: the options may hold spaces.
                let rest = &l[4..];
                let rest = match rest.trim_start().strip_prefix('[') {
                    Some(opts) => opts.split_once(']').map_or("", |(_, r)| r),
                    None => rest,
                };
                rest.split_whitespace().next().map(str::to_owned)
            })
            .collect()
    } else {
        vec![]
    }
}
/// Host tools the testbed needs, with the Debian package providing each.
pub const HOST_TOOLS: &[(&str, &str)] = &[
    ("debootstrap", "debootstrap"),
    ("systemd-nspawn", "systemd-container"),
    ("nsenter", "util-linux"),
    ("dpkg-deb", "dpkg"),
    ("dpkg-shlibdeps", "dpkg-dev"),
    ("lintian", "lintian"),
    ("rpmbuild", "rpm"),
    ("help2man", "help2man"),
    ("systemd-analyze", "systemd"),
];

/// The workspace root (two levels above this crate).
pub fn workspace_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.join("../..")
        .canonicalize()
        .unwrap_or_else(|_| here.join("../.."))
}

/// True when the effective uid is 0.
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// The first directory of `PATH` holding an executable `name`.
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

// ---------------------------------------------------------------------------
// Commands with a time limit.

/// What a finished command left.
#[derive(Clone, Debug, Default)]
pub struct Out {
    /// Exit code; `None` when killed by a signal or at the time limit.
    pub code: Option<i32>,
    /// Standard output, lossily decoded.
    pub stdout: String,
    /// Standard error, lossily decoded.
    pub stderr: String,
    /// True when the time limit killed it.
    pub timed_out: bool,
}

impl Out {
    /// True for exit code 0.
    pub fn ok(&self) -> bool {
        self.code == Some(0)
    }

    /// Standard output and error together, for messages.
    pub fn both(&self) -> String {
        let mut s = self.stdout.clone();
        if !self.stderr.is_empty() {
            if !s.is_empty() && !s.ends_with('\n') {
                s.push('\n');
            }
            s.push_str(&self.stderr);
        }
        s
    }

    /// `Ok(self)` on exit code 0, else an error naming `what` with the output.
    pub fn expect_ok(self, what: &str) -> Result<Self, String> {
        if self.ok() {
            Ok(self)
        } else {
            Err(format!(
                "{what}: {}\n{}",
                self.describe(),
                tail(&self.both(), 40)
            ))
        }
    }

    /// "exit N", "killed", or "timed out".
    pub fn describe(&self) -> String {
        match (self.timed_out, self.code) {
            (true, _) => "timed out".into(),
            (false, Some(c)) => format!("exit {c}"),
            (false, None) => "killed by a signal".into(),
        }
    }
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn drain(mut from: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = from.read_to_end(&mut buf);
        buf
    })
}

fn wait_until(child: &mut Child, deadline: Instant) -> (Option<ExitStatus>, bool) {
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return (Some(status), false),
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                return (child.wait().ok(), true);
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(_) => return (None, false),
        }
    }
}

/// Runs `cmd` (stdin from /dev/null unless `input` is given) and waits at
/// most `limit`, then kills it.
pub fn run(cmd: &mut Command, input: Option<&[u8]>, limit: Duration) -> Result<Out, String> {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.stdin(if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run {:?}: {e}", cmd.get_program()))?;
    if let (Some(data), Some(mut stdin)) = (input, child.stdin.take()) {
        let data = data.to_vec();
        std::thread::spawn(move || {
            let _ = stdin.write_all(&data);
        });
    }
    let out = drain(child.stdout.take().ok_or("no stdout")?);
    let err = drain(child.stderr.take().ok_or("no stderr")?);
    let (status, timed_out) = wait_until(&mut child, Instant::now() + limit);
    Ok(Out {
        code: status.and_then(|s| s.code()),
        stdout: String::from_utf8_lossy(&out.join().unwrap_or_default()).into_owned(),
        stderr: String::from_utf8_lossy(&err.join().unwrap_or_default()).into_owned(),
        timed_out,
    })
}

// ---------------------------------------------------------------------------
// The report: progress lines as the run goes, a log file, a summary.

/// How a check ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It held.
    Pass,
    /// It did not.
    Fail,
    /// An earlier failure made it meaningless.
    Skipped,
}

/// One line of the summary.
#[derive(Clone, Debug)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// How it ended.
    pub outcome: Outcome,
    /// How long it took.
    pub took: Duration,
    /// What it found (figures on success, the reason on failure).
    pub detail: String,
}

/// Progress and results of a run. Progress goes straight to the test's
/// standard error (live under `cargo test`; `cargo nextest` shows it for a
/// failing test, or with `--no-capture`) and to a log file.
#[derive(Debug)]
pub struct Report {
    started: Instant,
    log: Arc<Mutex<File>>,
    log_path: PathBuf,
    /// Every check so far.
    pub checks: Vec<Check>,
}

impl Report {
    /// A report logging to `log_path` (truncated).
    pub fn new(log_path: &Path) -> Result<Self, String> {
        if let Some(dir) = log_path.parent() {
            fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let log = File::create(log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
        Ok(Report {
            started: Instant::now(),
            log: Arc::new(Mutex::new(log)),
            log_path: log_path.to_owned(),
            checks: Vec::new(),
        })
    }

    /// The log file.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Seconds since the start.
    pub fn elapsed(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// A progress line.
    pub fn say(&self, msg: &str) {
        let line = format!("[testbed {:6.1}s] {msg}\n", self.elapsed());
        // Written to fd 2 directly, not with eprint!, so that libtest's
        // capture does not hold it back until the end.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
        self.log(&line);
    }

    /// A line in the log file only.
    pub fn log(&self, text: &str) {
        if let Ok(mut f) = self.log.lock() {
            let _ = f.write_all(text.as_bytes());
            if !text.ends_with('\n') {
                let _ = f.write_all(b"\n");
            }
        }
    }

    /// Runs one check and records it; returns whether it passed.
    pub fn check<T>(&mut self, name: &str, f: impl FnOnce(&Self) -> Result<T, String>) -> Option<T>
    where
        T: Detail,
    {
        self.say(&format!("... {name}"));
        let t = Instant::now();
        let result = f(self);
        let took = t.elapsed();
        let (outcome, detail, value) = match result {
            Ok(v) => (Outcome::Pass, v.detail(), Some(v)),
            Err(e) => (Outcome::Fail, e, None),
        };
        let mark = if outcome == Outcome::Pass {
            "PASS"
        } else {
            "FAIL"
        };
        let first = detail.lines().next().unwrap_or("");
        self.say(&format!(
            "{mark} {name} ({:.1}s){}{first}",
            took.as_secs_f64(),
            if first.is_empty() { "" } else { ": " }
        ));
        if outcome == Outcome::Fail {
            for line in detail.lines().skip(1).take(60) {
                self.say(&format!("     {line}"));
            }
        } else {
            self.log(&detail);
        }
        self.checks.push(Check {
            name: name.to_owned(),
            outcome,
            took,
            detail,
        });
        value
    }

    /// Records checks that could not run.
    pub fn skip(&mut self, names: &[&str], why: &str) {
        for name in names {
            self.say(&format!("SKIP {name}: {why}"));
            self.checks.push(Check {
                name: (*name).to_owned(),
                outcome: Outcome::Skipped,
                took: Duration::ZERO,
                detail: why.to_owned(),
            });
        }
    }

    /// The summary table.
    pub fn summary(&self) -> String {
        let mut s = String::from("\nsystemd testbed summary\n");
        for c in &self.checks {
            let mark = match c.outcome {
                Outcome::Pass => "PASS",
                Outcome::Fail => "FAIL",
                Outcome::Skipped => "SKIP",
            };
            let first = c.detail.lines().next().unwrap_or("");
            s.push_str(&format!(
                "  {mark}  {:6.1}s  {:<52} {}\n",
                c.took.as_secs_f64(),
                c.name,
                first
            ));
        }
        let failed = self
            .checks
            .iter()
            .filter(|c| c.outcome != Outcome::Pass)
            .count();
        s.push_str(&format!(
            "  {} checks, {} not passed, {:.1}s in all; log: {}\n",
            self.checks.len(),
            failed,
            self.elapsed(),
            self.log_path.display()
        ));
        s
    }

    /// True when every check passed.
    pub fn all_passed(&self) -> bool {
        self.checks.iter().all(|c| c.outcome == Outcome::Pass)
    }
}

/// A check's value, rendered for the report.
pub trait Detail {
    /// One line (or more) for the report.
    fn detail(&self) -> String;
}

impl Detail for String {
    fn detail(&self) -> String {
        self.clone()
    }
}

impl Detail for () {
    fn detail(&self) -> String {
        String::new()
    }
}

// ---------------------------------------------------------------------------
// The cached Debian root.

fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Returns the cached minimal root, making it first with debootstrap when
/// it is missing (under a lock, into a temporary directory renamed when
/// complete). `--volatile=overlay` keeps it pristine afterwards.
pub fn debian_root(cache: &Path, mirror: &str, report: &Report) -> Result<PathBuf, String> {
    fs::create_dir_all(cache).map_err(|e| format!("{}: {e}", cache.display()))?;
    let key = format!("{ROOT_SUITE} minbase {ROOT_INCLUDE}");
    let root = cache.join(format!("{ROOT_SUITE}-minbase-{:016x}", fnv1a(&key)));
    let ready = root.join(".airlock-testbed-ready");
    let lock_file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(cache.join(".lock"))
        .map_err(|e| format!("{}/.lock: {e}", cache.display()))?;
    report.say(&format!(
        "waiting for the cache lock in {}",
        cache.display()
    ));
    let _lock = nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| format!("locking {}/.lock: {e}", cache.display()))?;
    if ready.exists() {
        report.say(&format!("cached root: {}", root.display()));
        return Ok(root);
    }
    let tmp = cache.join(format!(
        "{}.tmp",
        root.file_name().and_then(|n| n.to_str()).unwrap_or("root")
    ));
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
    }
    if root.exists() {
        fs::remove_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
    }
    report.say(&format!(
        "no cached root: debootstrap --variant=minbase --include={ROOT_INCLUDE} {ROOT_SUITE} (a few minutes, once)"
    ));
    // A mirror that fails a download once (a fresh machine has no cached
    // root, so every CI run depends on it) is tried once more from scratch.
    let mut tries = 0;
    loop {
        tries += 1;
        match debootstrap(&tmp, mirror, report) {
            Ok(()) => break,
            Err(e) if tries < 2 => {
                report.say(&format!("{e}\ntrying debootstrap once more"));
                fs::remove_dir_all(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
            }
            Err(e) => return Err(e),
        }
    }
    // Nothing is installed on top: what the package needs must already be in
    // the root, as on a fresh minimal system.
    let _ = Command::new("chroot")
        .arg(&tmp)
        .args(["apt-get", "clean"])
        .status();
    fs::write(tmp.join(".airlock-testbed-ready"), format!("{key}\n")).map_err(|e| e.to_string())?;
    fs::rename(&tmp, &root).map_err(|e| format!("{} -> {}: {e}", tmp.display(), root.display()))?;
    report.say(&format!("root ready: {}", root.display()));
    Ok(root)
}

/// One run of debootstrap into `tmp`.
fn debootstrap(tmp: &Path, mirror: &str, report: &Report) -> Result<(), String> {
    let mut child = Command::new("debootstrap")
        .args(["--variant=minbase", &format!("--include={ROOT_INCLUDE}")])
        .arg(ROOT_SUITE)
        .arg(tmp)
        .arg(mirror)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run debootstrap: {e}"))?;
    let err = drain(child.stderr.take().ok_or("no stderr")?);
    let mut phase = String::new();
    for line in BufReader::new(child.stdout.take().ok_or("no stdout")?)
        .lines()
        .map_while(Result::ok)
    {
        report.log(&line);
        let verb = line
            .strip_prefix("I: ")
            .and_then(|l| l.split_whitespace().next())
            .unwrap_or("")
            .to_owned();
        if !verb.is_empty() && verb != phase {
            report.say(&format!(
                "  debootstrap: {}",
                line.trim_start_matches("I: ")
            ));
            phase = verb;
        }
    }
    let (status, _) = wait_until(&mut child, Instant::now() + Duration::from_secs(1200));
    let stderr = String::from_utf8_lossy(&err.join().unwrap_or_default()).into_owned();
    report.log(&stderr);
    if status.is_some_and(|s| s.success()) {
        return Ok(());
    }
    Err(format!(
        "debootstrap failed ({status:?}); see {}\n{}",
        report.log_path().display(),
        tail(&stderr, 20)
    ))
}

// ---------------------------------------------------------------------------
// The booted container.

/// A booted `systemd-nspawn --boot` container. Dropping it powers it off.
#[derive(Debug)]
pub struct Container {
    nspawn: Child,
    leader: u32,
    /// The machine name.
    pub name: String,
}

fn children_of(pid: u32) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    let Ok(entries) = fs::read_dir("/proc") else {
        return found;
    };
    for e in entries.flatten() {
        let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        // pid (comm) state ppid ...; comm may hold spaces and parentheses.
        let Some(close) = stat.rfind(')') else {
            continue;
        };
        let comm = stat[stat.find('(').map_or(0, |i| i + 1)..close].to_owned();
        let ppid = stat[close + 1..]
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse::<u32>().ok());
        if ppid == Some(pid) {
            found.push((p, comm));
        }
    }
    found
}

impl Container {
    /// Boots `root` (volatile overlay, private network, `binds` read-only)
    /// and waits until its systemd reports the boot finished.
    pub fn boot(
        root: &Path,
        binds: &[(PathBuf, &str)],
        log: &Path,
        report: &Report,
    ) -> Result<Self, String> {
        let name = format!("airlock-testbed-{}", std::process::id());
        let log_file = File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        let log_err = log_file.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = Command::new("systemd-nspawn");
        cmd.arg("--directory").arg(root).args([
            "--volatile=overlay",
            "--boot",
            "--private-network",
            "--register=no",
            "--keep-unit",
            "--console=passive",
            // systemd 252's nspawn filter lacks the Landlock calls the
            // executor and airlock-confine make; a real host has them.
            "--system-call-filter=landlock_create_ruleset landlock_add_rule landlock_restrict_self",
            &format!("--machine={name}"),
        ]);
        for (host, inside) in binds {
            cmd.arg(format!("--bind-ro={}:{inside}", host.display()));
        }
        // If the test process dies without powering the container off (a
        // test-runner timeout, ^C), nspawn gets SIGTERM and shuts it down.
        // SAFETY: the closure runs in the forked child before exec and only
        // makes the async-signal-safe prctl(PR_SET_PDEATHSIG) call.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM)
                    .map_err(std::io::Error::from)
            });
        }
        let nspawn = cmd
            .stdin(Stdio::null())
            .stdout(log_file)
            .stderr(log_err)
            .spawn()
            .map_err(|e| format!("cannot run systemd-nspawn: {e}"))?;
        let mut c = Container {
            nspawn,
            leader: 0,
            name,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while c.leader == 0 {
            if let Ok(Some(status)) = c.nspawn.try_wait() {
                return Err(format!(
                    "systemd-nspawn exited ({status}) before the container booted:\n{}",
                    tail(&fs::read_to_string(log).unwrap_or_default(), 20)
                ));
            }
            if Instant::now() > deadline {
                return Err("the container's init did not appear within 60 s".into());
            }
            if let Some((pid, _)) = children_of(c.nspawn.id())
                .into_iter()
                .find(|(_, comm)| comm == "systemd")
            {
                c.leader = pid;
            } else {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        report.say(&format!(
            "container {} booting (init pid {})",
            c.name, c.leader
        ));
        loop {
            let out = c.sh(
                "systemctl is-system-running --wait",
                Duration::from_secs(90),
            )?;
            let state = out.stdout.trim().to_owned();
            if matches!(state.as_str(), "running" | "degraded") {
                if state == "degraded" {
                    let failed = c.sh(
                        "systemctl --failed --no-legend --plain",
                        Duration::from_secs(10),
                    )?;
                    report.say(&format!(
                        "container is degraded (not airlock's doing): {}",
                        failed.stdout.trim()
                    ));
                }
                break;
            }
            if Instant::now() > deadline + Duration::from_secs(60) {
                return Err(format!(
                    "the container did not finish booting: {}",
                    out.both()
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(c)
    }

    /// The container's init, as the host sees it.
    pub fn leader(&self) -> u32 {
        self.leader
    }

    /// Runs `script` with /bin/sh as root inside the container (all of its
    /// init's namespaces), with a clean environment.
    pub fn sh(&self, script: &str, limit: Duration) -> Result<Out, String> {
        let mut cmd = Command::new("nsenter");
        cmd.arg("--target")
            .arg(self.leader.to_string())
            .args(["--all", "/bin/sh", "-c", script])
            .env_clear()
            .envs(BTreeMap::from([
                (
                    "PATH",
                    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                ),
                ("HOME", "/root"),
                ("LANG", "C.UTF-8"),
                ("DEBIAN_FRONTEND", "noninteractive"),
                ("SYSTEMD_PAGER", ""),
                ("NO_COLOR", "1"),
            ]));
        run(&mut cmd, None, limit)
    }

    /// Like [`Container::sh`], failing unless the script exits 0.
    pub fn sh_ok(&self, script: &str, limit: Duration) -> Result<String, String> {
        let first = script.lines().next().unwrap_or(script);
        self.sh(script, limit)?.expect_ok(first).map(|o| o.stdout)
    }

    /// Where `path` inside the container is on the host (through the
    /// init's root), for checks made with the host's tools.
    pub fn host_path(&self, path: &str) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root{path}", self.leader))
    }

    /// Writes a file inside the container (through the init's root).
    pub fn write(&self, path: &str, content: &str) -> Result<(), String> {
        let host = PathBuf::from(format!("/proc/{}/root{path}", self.leader));
        if let Some(dir) = host.parent() {
            fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        fs::write(&host, content).map_err(|e| format!("{}: {e}", host.display()))
    }

    /// Powers the container off (SIGTERM to nspawn asks its systemd to shut
    /// down) and waits, killing it after `limit`.
    pub fn shutdown(&mut self, limit: Duration) -> Result<(), String> {
        if let Ok(Some(_)) = self.nspawn.try_wait() {
            return Ok(());
        }
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.nspawn.id()).unwrap_or(0));
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let (status, timed_out) = wait_until(&mut self.nspawn, Instant::now() + limit);
        if timed_out {
            return Err(format!(
                "the container did not power off within {limit:?}; killed"
            ));
        }
        match status {
            Some(s) if s.success() => Ok(()),
            other => Err(format!("systemd-nspawn ended with {other:?}")),
        }
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = self.shutdown(Duration::from_secs(20));
    }
}

#[cfg(test)]
mod mirror_tests {
    use super::mirrors_in;
    use std::path::Path;

    #[test]
    fn apt_sources_name_their_mirrors() {
        let deb822 = "Types: deb\nURIs: http://mirror.example.invalid/debian\nSuites: bookworm\n\n\
                      Types: deb-src\nURIs: http://src.example.invalid/debian\n\n\
                      Types: deb\nEnabled: no\nURIs: http://off.example.invalid/debian\n";
        assert_eq!(
            mirrors_in(Path::new("x.sources"), deb822),
            vec!["http://mirror.example.invalid/debian"]
        );
        let list = "# comment\ndeb-src http://src.example.invalid/debian bookworm main\n\
                    deb [arch=amd64 signed-by=/k.gpg] http://one.example.invalid/debian bookworm main\n\
                    deb http://two.example.invalid/debian bookworm main\n";
        assert_eq!(
            mirrors_in(Path::new("sources.list"), list),
            vec![
                "http://one.example.invalid/debian",
                "http://two.example.invalid/debian"
            ]
        );
        assert!(mirrors_in(Path::new("x.disabled"), list).is_empty());
    }
}

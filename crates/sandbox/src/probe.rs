//! Test builds only (feature `lockdown-probe`, enabled by the daemons' own
//! dev-dependencies, never by default): proves from inside a running
//! daemon that its lockdown holds.
//!
//! When `AIRLOCK_LOCKDOWN_PROBE` names a path at lockdown, SIGUSR2 is
//! blocked (every later thread inherits the mask) and a thread waits for
//! it. On each SIGUSR2 the probe tries to open that path for reading and
//! to call process_vm_readv(2) on its own process (harmless, and denied to
//! every role), and writes one line to stderr:
//!
//! `airlock-lockdown-probe: role=<program> open=<errno> process_vm_readv=<errno>`
//!
//! with `0` for success. A test starts the daemon with a readable file
//! outside its grants, sends SIGUSR2 and expects `open=13` (EACCES,
//! Landlock) and `process_vm_readv=1` (EPERM, seccomp).

use nix::sys::signal::{SigSet, Signal};

use crate::role::Role;

/// The environment variable naming the path to try.
pub const PROBE_ENV: &str = "AIRLOCK_LOCKDOWN_PROBE";

/// The line's prefix.
pub const PROBE_PREFIX: &str = "airlock-lockdown-probe:";

pub(crate) fn arm(role: Role) {
    let Some(path) = std::env::var_os(PROBE_ENV) else {
        return;
    };
    let mut set = SigSet::empty();
    set.add(Signal::SIGUSR2);
    if set.thread_block().is_err() {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("lockdown-probe".into())
        .spawn(move || {
            loop {
                if set.wait().is_err() {
                    return;
                }
                let open = match std::fs::File::open(&path) {
                    Ok(_) => 0,
                    Err(e) => e.raw_os_error().unwrap_or(-1),
                };
                let vm = process_vm_readv_self();
                eprintln!(
                    "{PROBE_PREFIX} role={} open={open} process_vm_readv={vm}",
                    role.program()
                );
            }
        });
    if let Err(e) = spawned {
        eprintln!("{PROBE_PREFIX} cannot start: {e}");
    }
}

/// process_vm_readv(2) of nothing from this process: 0 when allowed.
fn process_vm_readv_self() -> i32 {
    // SAFETY: zero iovecs with null pointers: the kernel reads and writes
    // no memory of ours; the call only checks permission.
    let r = unsafe {
        libc::syscall(
            libc::SYS_process_vm_readv,
            libc::getpid(),
            std::ptr::null::<libc::iovec>(),
            0usize,
            std::ptr::null::<libc::iovec>(),
            0usize,
            0usize,
        )
    };
    if r < 0 {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
    } else {
        0
    }
}

/// What a test observes of a running daemon ([`observe`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    /// `NoNewPrivs:` of every thread, from /proc/PID/task/*/status.
    pub no_new_privs: Vec<String>,
    /// `Seccomp:` of every thread.
    pub seccomp: Vec<String>,
    /// The probe's errno opening the forbidden path (0: it opened).
    pub open: i32,
    /// The probe's errno calling process_vm_readv(2) (0: allowed).
    pub process_vm_readv: i32,
}

/// Test helper: reads every thread's status of `pid`, sends it SIGUSR2 and
/// waits up to `timeout` for a new probe line in the daemon's stderr log.
pub fn observe(
    pid: u32,
    log: &std::path::Path,
    timeout: std::time::Duration,
) -> Result<Observed, String> {
    let mut no_new_privs = Vec::new();
    let mut seccomp = Vec::new();
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).map_err(|e| e.to_string())?;
    for task in tasks {
        let task = task.map_err(|e| e.to_string())?;
        let status =
            std::fs::read_to_string(task.path().join("status")).map_err(|e| e.to_string())?;
        let field = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .map(|v| v.trim().to_owned())
                .unwrap_or_default()
        };
        no_new_privs.push(field("NoNewPrivs:"));
        seccomp.push(field("Seccomp:"));
    }
    let lines = |text: &str| {
        text.lines()
            .filter(|l| l.contains(PROBE_PREFIX))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let before = lines(&std::fs::read_to_string(log).unwrap_or_default()).len();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGUSR2,
    )
    .map_err(|e| format!("kill: {e}"))?;
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let all = lines(&std::fs::read_to_string(log).unwrap_or_default());
        if let Some(line) = all.get(before) {
            let value = |k: &str| {
                line.split_whitespace()
                    .find_map(|w| w.strip_prefix(k))
                    .and_then(|v| v.parse::<i32>().ok())
                    .ok_or_else(|| format!("no {k} in {line:?}"))
            };
            return Ok(Observed {
                no_new_privs,
                seccomp,
                open: value("open=")?,
                process_vm_readv: value("process_vm_readv=")?,
            });
        }
        if std::time::Instant::now() > deadline {
            return Err(format!("no probe line in {} after SIGUSR2", log.display()));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

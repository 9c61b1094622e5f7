//! Confine-then-exec for airlock's untrusted verification commands.
//!
//! This crate is the whole of `airlock-confine`, a small single-threaded
//! helper that confines itself and then executes a command. The
//! multithreaded executor never forks into a sandbox itself: it spawns
//! `airlock-confine` with [`std::process::Command`], which does no
//! allocation between fork and exec, and passes the [`Policy`] as argv
//! ([`Policy::to_args`]). Every further fork happens inside the helper,
//! which [`run`] first verifies to be single-threaded, so the forked
//! children may allocate freely (they build paths, JSON and C strings).
//!
//! # Processes
//!
//! ```text
//! airlock-confine (supervisor)     namespaces: user (unprivileged only),
//!   │  enforces --timeout,         ipc, uts, net, pid (for its children)
//!   │  verifies nothing survives, writes the report
//!   └─ init (pid 1 of the new pid namespace)
//!        │  mount namespace: / private, fresh /proc, private /tmp
//!        │  reaps; when the command exits, kill(-1, SIGKILL)
//!        └─ command: bounding set → ids → capabilities → no_new_privs →
//!           rlimits → Landlock → seccomp → environment → setsid → execve
//! ```
//!
//! Each confinement step is its own module ([`ids`], [`caps`],
//! [`no_new_privs`], [`rlimits`], [`landlock`], [`seccomp`] with its policy
//! table [`seccomp_policy`], [`namespaces`], [`mod@env`], [`exec`]); the
//! command's process runs them in the order above (see `target.rs`), each
//! failing hard with one [`Error`] variant. Landlock that is not fully
//! enforced refuses to run (`SANDBOX_UNAVAILABLE`) unless the policy allows
//! a degraded mode, which warns loudly and is recorded in the [`Report`].
//!
//! # The daemons' own confinement
//!
//! The same steps confine the daemons themselves: [`role`] holds each
//! daemon's policy as data (Landlock grants and seccomp denials with a
//! reason each), and [`lockdown::lockdown`] applies one at the top of the
//! daemon's main, through the same [`landlock::enforce`] and
//! [`seccomp::install_rules`] as the command sandbox.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use airlock_sandbox::{Policy, run};
//!
//! let policy = Policy {
//!     uid: Some(65534),
//!     gid: Some(65534),
//!     rw: vec!["/srv/airlock/ws/task-1".into()],
//!     timeout: Some(Duration::from_secs(60)),
//!     ..Policy::default()
//! };
//! // In airlock-confine itself (single-threaded):
//! let report = run(&policy, &["cargo".into(), "test".into()]);
//! std::process::exit(report.exit_status);
//! ```
//!
//! The executor instead runs
//! `airlock-confine <policy.to_args()> --report-fd N -- cargo test`
//! and reads the JSON [`Report`] from that descriptor.
//!
//! # What this does not do
//!
//! - RLIMIT_NPROC counts every process of the uid on the machine: give
//!   concurrent sandboxes distinct uids, or count them together.
//! - RLIMIT_AS bounds each process, not the sandbox as a whole; a total
//!   memory and CPU budget needs a cgroup (the executor's systemd unit).
//! - Namespaces are used when the kernel allows them and recorded, not
//!   required. Without a pid namespace, leftover processes are found as
//!   orphans reparented to the (subreaper) init and helper, which covers
//!   every descendant that did not escape by other means; /proc is then not
//!   granted at all, because the host's would show every process.
//! - Landlock before ABI 9 does not confine pathname UNIX sockets; on such
//!   kernels seccomp denies `connect(2)` and datagram UNIX sockets instead
//!   ([`seccomp_policy::UNIX_PATH_RULES`]), so a command cannot serve and
//!   connect to a socket even in its own workspace there.
//! - Landlock does not confine metadata changes (chmod, chown, utime,
//!   xattrs): a command may change those of any file its uid owns, inside
//!   or outside its grants. Run commands as a uid that owns nothing else.
//! - Landlock's floor is `landlock_min_abi` (default 1: Landlock present,
//!   every right of the kernel's ABI handled). Raise it to demand e.g. ABI 3
//!   (truncate) or 6 (signal and abstract-socket scoping) everywhere.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod caps;
pub mod env;
mod error;
pub mod exec;
pub mod fds;
pub mod ids;
mod init;
pub mod landlock;
pub mod lockdown;
pub mod namespaces;
pub mod no_new_privs;
mod policy;
#[cfg(feature = "lockdown-probe")]
pub mod probe;
pub mod reaper;
mod report;
pub mod rlimits;
pub mod role;
pub mod seccomp;
pub mod seccomp_policy;
mod target;

use std::ffi::{CString, OsString};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, ppoll};
use nix::sys::prctl;
use nix::sys::signal::{
    SaFlags, SigAction, SigHandler, SigSet, SigmaskHow, Signal, kill, sigaction, sigprocmask,
};
use nix::sys::time::TimeSpec;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork, getgid, getuid};

pub use error::{Error, Result};
pub use policy::{
    DEVICES_RO, DEVICES_RW, Limits, MAX_LANDLOCK_ABI, NOBODY, Policy, SANDBOX_PATH, SYSTEM_RO,
};
pub use report::{LandlockReport, Namespaces, Outcome, REPORT_SCHEMA, Report};

use error::errno;
use report::Message;

/// Exit status of the helper when the timeout killed the sandbox (as
/// coreutils `timeout`).
pub const EXIT_TIMEOUT: i32 = 124;

/// What the command's process needs, resolved from the [`Policy`] by the
/// supervisor before any fork.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    privileged: bool,
    uid: u32,
    gid: u32,
    limits: Limits,
    grants: landlock::Grants,
    min_abi: u8,
    allow_degraded: bool,
    workdir: PathBuf,
    env: Vec<(String, String)>,
    command: OsString,
    argv: Vec<CString>,
    tmp_size: Option<u64>,
    namespaces: bool,
}

/// Runs `command` confined by `policy` and returns the report; its
/// `exit_status` is what the helper exits with: the command's status,
/// 128 + signal, [`EXIT_TIMEOUT`], or 125/126/127 when confinement or
/// execution failed (see [`Error::exit_status`]).
///
/// Must be called from a single-threaded process (checked).
pub fn run(policy: &Policy, command: &[OsString]) -> Report {
    let start = Instant::now();
    let mut report = Report {
        schema: REPORT_SCHEMA.into(),
        uid: getuid().as_raw(),
        gid: getgid().as_raw(),
        namespaces: Namespaces::default(),
        landlock: None,
        seccomp: false,
        no_new_privs: false,
        capabilities_dropped: false,
        limits: policy.limits.clone(),
        degraded: false,
        warnings: Vec::new(),
        outcome: Outcome::Failed {
            step: "supervise".into(),
            code: airlock_proto::Code::INTERNAL.as_str().into(),
            message: "not started".into(),
        },
        exit_status: 125,
        survivors: 0,
        elapsed_ms: 0,
    };
    if let Err(e) = supervise(policy, command, &mut report) {
        eprintln!("airlock-confine: {}: {e}", e.code().as_str());
        report.outcome = Outcome::Failed {
            step: e.step().into(),
            code: e.code().as_str().into(),
            message: e.to_string(),
        };
        report.exit_status = e.exit_status();
    }
    report.elapsed_ms = start.elapsed().as_millis().try_into().unwrap_or(u64::MAX);
    report
}

fn supervise(policy: &Policy, command: &[OsString], report: &mut Report) -> Result<()> {
    // 0. Preconditions: one thread (forking is only safe then), a valid policy.
    let threads = thread_count();
    if threads != 1 {
        return Err(Error::NotSingleThreaded { threads });
    }
    policy.validate()?;
    let privileged = nix::unistd::geteuid().is_root();
    let (uid, gid) = target_ids(policy, privileged)?;
    report.uid = uid;
    report.gid = gid;
    let plan = make_plan(policy, command, privileged, uid, gid)?;

    // 1. Namespaces of the supervisor (pid applies to the init we fork next).
    let ns = if policy.namespaces {
        namespaces::enter_supervisor(privileged, getuid().as_raw(), getgid().as_raw())?
    } else {
        Namespaces::default()
    };
    report.namespaces = ns.clone();

    // 2. Pipes: status (children → us, closed by execve) and lifeline
    //    (closed when we die, so the init knows).
    let (status_r, status_w) =
        nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| Error::Pipe(errno(e)))?;
    let (life_r, life_w) =
        nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| Error::Pipe(errno(e)))?;
    // Orphans come back to us if there is no pid namespace and the init dies.
    let _ = prctl::set_child_subreaper(true);

    // 3. Fork the init.
    let forked = Instant::now();
    // SAFETY: this process has exactly one thread (checked above), so the
    // child inherits no lock held by another thread and may allocate.
    let init = match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            drop((status_r, life_w));
            init::run(plan, File::from(status_w), life_r, &ns)
        }
        Ok(ForkResult::Parent { child }) => child,
        Err(e) => return Err(Error::Fork(errno(e))),
    };
    drop((status_w, life_r));
    let pid_ns = ns
        .pid
        .then(|| namespaces::identity(Path::new("/proc/self/ns/pid_for_children")).ok())
        .flatten();

    // 4. Wait, enforcing the timeout; then kill whatever came back to us.
    let deadline = policy.timeout.map(|t| forked + t);
    let (init_status, stop, raw) = wait_for_init(init, &status_r, deadline)?;
    reaper::kill_and_reap_all();
    drop(life_w);

    // 5. Verify that nothing of the sandbox survived.
    report.survivors = match pid_ns {
        Some(id) => reaper::pid_namespace_members(id),
        None => reaper::children_of(nix::unistd::getpid()).len(),
    };

    // 6. The outcome.
    let mut raw = raw;
    drain(&status_r, &mut raw);
    apply_messages(report, &raw, init_status, stop);
    if report.survivors > 0 {
        return Err(Error::Survivors {
            count: report.survivors,
        });
    }
    Ok(())
}

fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}

fn target_ids(policy: &Policy, privileged: bool) -> Result<(u32, u32)> {
    if privileged {
        let uid = policy.uid.unwrap_or(NOBODY);
        let gid = policy.gid.or(policy.uid).unwrap_or(NOBODY);
        return Ok((uid, gid));
    }
    let (current, current_gid) = (getuid().as_raw(), getgid().as_raw());
    let uid = policy.uid.unwrap_or(current);
    let gid = policy.gid.unwrap_or(current_gid);
    if uid != current || gid != current_gid {
        return Err(Error::IdsUnavailable { uid, gid, current });
    }
    Ok((uid, gid))
}

fn make_plan(
    policy: &Policy,
    command: &[OsString],
    privileged: bool,
    uid: u32,
    gid: u32,
) -> Result<Plan> {
    let Some(first) = command.first() else {
        return Err(Error::Policy("no command given".into()));
    };
    let argv = command
        .iter()
        .map(|a| {
            CString::new(a.as_bytes()).map_err(|_| Error::Policy("NUL byte in the command".into()))
        })
        .collect::<Result<Vec<_>>>()?;
    let workdir = match policy.effective_workdir() {
        Some(w) => w.to_path_buf(),
        None => std::env::current_dir().map_err(|source| Error::Workdir {
            path: ".".into(),
            source,
        })?,
    };
    let mut grants = landlock::Grants {
        ro: policy.ro.clone(),
        rw: policy.rw.clone(),
        ..Default::default()
    };
    if policy.system_ro {
        grants.ro_if_present = SYSTEM_RO.iter().map(PathBuf::from).collect();
    }
    grants.rw_files_if_present = DEVICES_RW.iter().map(PathBuf::from).collect();
    grants.ro_files_if_present = DEVICES_RO.iter().map(PathBuf::from).collect();
    // A tmpfs on /tmp would hide policy paths that live under it.
    let under_tmp = policy
        .ro
        .iter()
        .chain(&policy.rw)
        .chain([&workdir])
        .any(|p| p.starts_with("/tmp"));
    let tmp_size = (policy.private_tmp && !under_tmp).then_some(policy.tmp_size);
    Ok(Plan {
        privileged,
        uid,
        gid,
        limits: policy.limits.clone(),
        grants,
        min_abi: policy.landlock_min_abi,
        allow_degraded: policy.allow_degraded,
        workdir,
        env: policy.env.clone(),
        command: first.clone(),
        argv,
        tmp_size,
        namespaces: policy.namespaces,
    })
}

/// pidfd_open(2), so poll can wake when the init exits.
fn pidfd_open(pid: Pid) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and touches no memory.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid.as_raw(), 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: the kernel just returned this new descriptor; we own it.
    Some(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) })
}

/// Why the supervisor killed the sandbox before the command finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    /// The wall-clock timeout passed.
    Timeout,
    /// The helper received SIGTERM, SIGINT or SIGHUP.
    Signal(i32),
}

/// The stop signal received, 0 if none (set by [`on_stop_signal`]).
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_stop_signal(sig: libc::c_int) {
    // Async-signal-safe: one atomic store.
    STOP_SIGNAL.store(sig, Ordering::SeqCst);
}

const STOP_SIGNALS: [Signal; 3] = [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP];

/// In the supervisor only (after the fork): SIGTERM, SIGINT and SIGHUP are
/// blocked except while waiting in ppoll, where they interrupt the wait and
/// tear the sandbox down instead of killing the helper outright.
fn catch_stop_signals() -> SigSet {
    let action = SigAction::new(
        SigHandler::Handler(on_stop_signal),
        SaFlags::empty(),
        SigSet::empty(),
    );
    let mut set = SigSet::empty();
    for sig in STOP_SIGNALS {
        set.add(sig);
        // SAFETY: the handler only stores into an atomic, which is async-signal-safe.
        let _ = unsafe { sigaction(sig, &action) };
    }
    let mut old = SigSet::empty();
    let _ = sigprocmask(SigmaskHow::SIG_BLOCK, Some(&set), Some(&mut old));
    old
}

/// Waits for the init, reading status messages meanwhile; at the deadline
/// or on a stop signal kills it (and with it its pid namespace). Returns
/// its status, why it was stopped, and the bytes read.
fn wait_for_init(
    init: Pid,
    status_r: &OwnedFd,
    deadline: Option<Instant>,
) -> Result<(WaitStatus, Option<Stop>, Vec<u8>)> {
    let wait_mask = catch_stop_signals();
    let pidfd = pidfd_open(init);
    let mut raw = Vec::new();
    let mut pipe_open = true;
    let mut stop = None;
    loop {
        match waitpid(init, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(Errno::EINTR) => {}
            Ok(st) => return Ok((st, stop, raw)),
            Err(e) => return Err(Error::Supervise(errno(e))),
        }
        let signal = STOP_SIGNAL.load(Ordering::SeqCst);
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        if stop.is_none() && (signal != 0 || left.is_some_and(|l| l.is_zero())) {
            let _ = kill(init, Signal::SIGKILL);
            stop = Some(if signal != 0 {
                Stop::Signal(signal)
            } else {
                Stop::Timeout
            });
            continue;
        }
        let mut wait = if stop.is_none() { left } else { None };
        if pidfd.is_none() {
            // No pidfd: look at the child every 50 ms.
            wait = Some(wait.map_or(Duration::from_millis(50), |w| {
                w.min(Duration::from_millis(50))
            }));
        }
        let mut fds = Vec::with_capacity(2);
        if pipe_open {
            fds.push(PollFd::new(status_r.as_fd(), PollFlags::POLLIN));
        }
        if let Some(p) = &pidfd {
            fds.push(PollFd::new(p.as_fd(), PollFlags::POLLIN));
        }
        match ppoll(&mut fds, wait.map(TimeSpec::from_duration), Some(wait_mask)) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => return Err(Error::Supervise(errno(e))),
        }
        let readable = pipe_open && fds[0].revents().is_some_and(|r| !r.is_empty());
        drop(fds);
        if readable {
            let mut buf = [0u8; 4096];
            match nix::unistd::read(status_r.as_raw_fd(), &mut buf) {
                Ok(0) => pipe_open = false,
                Ok(n) => raw.extend_from_slice(&buf[..n]),
                Err(Errno::EINTR | Errno::EAGAIN) => {}
                Err(_) => pipe_open = false,
            }
        }
    }
}

/// Reads what is left in the status pipe without blocking.
fn drain(status_r: &OwnedFd, raw: &mut Vec<u8>) {
    let _ = nix::fcntl::fcntl(
        status_r.as_raw_fd(),
        nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK),
    );
    let Ok(fd) = status_r.try_clone() else { return };
    let _ = File::from(fd).read_to_end(raw);
}

fn apply_messages(report: &mut Report, raw: &[u8], init_status: WaitStatus, stop: Option<Stop>) {
    let mut failed = None;
    let mut exit = None;
    for line in raw.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let Ok(msg) = serde_json::from_slice::<Message>(line) else {
            continue;
        };
        match msg {
            Message::Mounts {
                mount,
                proc,
                tmp,
                shm,
            } => {
                report.namespaces.mount = mount;
                report.namespaces.proc = proc;
                report.namespaces.tmp = tmp;
                report.namespaces.shm = shm;
            }
            Message::Confined {
                uid,
                gid,
                landlock,
                degraded,
                warnings,
                capabilities_dropped,
            } => {
                report.uid = uid;
                report.gid = gid;
                report.landlock = Some(landlock);
                report.degraded = degraded;
                report.warnings = warnings;
                report.capabilities_dropped = capabilities_dropped;
                report.no_new_privs = true;
                report.seccomp = true;
            }
            Message::Failed {
                step,
                code,
                message,
                exit_status,
            } => {
                failed = Some((
                    Outcome::Failed {
                        step,
                        code,
                        message,
                    },
                    exit_status,
                ));
            }
            Message::Exit { outcome } => exit = Some(outcome),
        }
    }
    let (outcome, status) = if stop == Some(Stop::Timeout) {
        (Outcome::TimedOut, EXIT_TIMEOUT)
    } else if let Some(Stop::Signal(signal)) = stop {
        (Outcome::Interrupted { signal }, 128 + signal)
    } else if let Some(f) = failed {
        f
    } else if let Some(outcome) = exit {
        let status = match outcome {
            Outcome::Exited { code } => code,
            Outcome::Signaled { signal } => 128 + signal,
            _ => 125,
        };
        (outcome, status)
    } else {
        let message = format!("the sandbox's init ended without a report: {init_status:?}");
        eprintln!("airlock-confine: INTERNAL: {message}");
        let code = airlock_proto::Code::INTERNAL.as_str().into();
        (
            Outcome::Failed {
                step: "supervise".into(),
                code,
                message,
            },
            125,
        )
    };
    report.outcome = outcome;
    report.exit_status = status;
}

/// Writes one status message as a JSON line (one write, below PIPE_BUF).
pub(crate) fn send(w: &mut File, msg: &Message) {
    if let Ok(mut line) = serde_json::to_vec(msg) {
        line.push(b'\n');
        let _ = w.write_all(&line);
    }
}

/// Exits the calling (forked) process at once, without running atexit
/// handlers or flushing buffers it shares with its parent.
pub(crate) fn exit_now(code: i32) -> ! {
    // SAFETY: _exit terminates the process immediately; it is the correct
    // way to leave a forked child and has no memory-safety preconditions.
    unsafe { libc::_exit(code) }
}

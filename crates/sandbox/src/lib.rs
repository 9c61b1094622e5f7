//! Confinement for airlock's untrusted verification commands, and for the
//! daemons themselves.
//!
//! A [`Sandbox`] is prepared once by a single-threaded process — the
//! executor's spawner, or `airlock-confine` — and then starts each command
//! with one fork and one exec:
//!
//! ```text
//! spawner (prepared once: user + mount namespace, the minimal root's
//!   │      template, compiled seccomp, Landlock grants)
//!   └─ init: pid 1 of the command's pid namespace; mounts the workspace,
//!        │   /tmp and /proc, pivot_root into the minimal root; reaps;
//!        │   when the command exits, kill(-1, SIGKILL)
//!        └─ command: bounding set → ids → capabilities → no_new_privs →
//!           rlimits → Landlock → seccomp → environment → setsid → execve
//! ```
//!
//! The minimal root ([`root`]) is the command's whole filesystem: its
//! workspace, a private /tmp, its own /proc, a minimal /dev and read-only
//! system paths — nothing else exists, so no call (chmod, chown, utime and
//! xattrs included, which Landlock does not govern) reaches outside. Where
//! the kernel refuses user namespaces the command gets the host's view
//! narrowed by Landlock, and seccomp refuses every metadata call by path
//! ([`seccomp_policy::METADATA_PATH_RULES`]); the [`Report`] says which
//! ([`ViewMode`]).
//!
//! Each confinement step is its own module ([`ids`], [`caps`],
//! [`no_new_privs`], [`rlimits`], [`landlock`], [`seccomp`] with its policy
//! table [`seccomp_policy`], [`namespaces`], [`root`], [`mod@env`],
//! [`exec`]); the command's process runs them in the order above (see
//! `target.rs`), each failing hard with one [`Error`] variant. Landlock
//! that is not fully enforced refuses to run (`SANDBOX_UNAVAILABLE`) unless
//! the policy allows a degraded mode, which warns loudly and is recorded.
//!
//! [`spawner`] runs a prepared sandbox in a process of its own, forked by
//! the executor before it confines itself, and serves commands over a
//! socket.
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
//! # What this does not do
//!
//! - RLIMIT_NPROC counts every process of the uid on the machine: give
//!   concurrent sandboxes distinct uids, or count them together.
//! - RLIMIT_AS bounds each process, not the sandbox as a whole; a total
//!   memory and CPU budget needs a cgroup (the executor's systemd unit).
//! - The minimal root is used when the kernel allows it and recorded, not
//!   required; the host view keeps Landlock, seccomp (with every metadata
//!   call by path refused) and the id switch, and finds leftover processes
//!   as orphans of the (subreaper) spawner.
//! - Landlock before ABI 9 does not confine pathname UNIX sockets; on such
//!   kernels seccomp denies `connect(2)` and datagram UNIX sockets instead
//!   ([`seccomp_policy::UNIX_PATH_RULES`]), so a command cannot serve and
//!   connect to a socket even in its own workspace there.
//! - Landlock's floor is `landlock_min_abi` (default 1: Landlock present,
//!   every right of the kernel's ABI handled). Raise it to demand e.g. ABI 3
//!   (truncate) or 6 (signal and abstract-socket scoping) everywhere.
//!
//! Owns: confinement: a command's sandbox (namespaces, Landlock, seccomp,
//! limits, the minimal root) and each daemon's own lockdown (role.rs).
//! Never: speak to the bus, a database, the network or git; it decides
//! nothing about tasks.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod caps;
pub mod cgroup;
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
pub mod root;
mod sandbox;
pub mod seccomp;
pub mod seccomp_policy;
pub mod spawner;
mod target;

use std::ffi::OsString;

pub use error::{Error, Result};
pub use policy::{
    DEVICES_RO, DEVICES_RW, Limits, MAX_LANDLOCK_ABI, NOBODY, Policy, SANDBOX_PATH, SYSTEM_RO,
};
pub use report::{LandlockReport, Namespaces, Outcome, REPORT_SCHEMA, Report, ViewMode};
pub use root::{Bind, Nested, Overlay};
pub use sandbox::{Job, Sandbox, Setup, Stdio};

/// Exit status of the helper when the timeout killed the sandbox (as
/// coreutils `timeout`).
pub const EXIT_TIMEOUT: i32 = 124;

/// Runs `command` confined by `policy` (airlock-confine: one command per
/// process) and returns the report; its `exit_status` is what the helper
/// exits with: the command's status, 128 + signal, [`EXIT_TIMEOUT`], or
/// 125/126/127 when confinement or execution failed (see
/// [`Error::exit_status`]).
///
/// Must be called from a single-threaded process (checked). In the minimal
/// root, every `rw` directory appears at its own path, and so do `ro` paths.
pub fn run(policy: &Policy, command: &[OsString]) -> Report {
    let failed = |e: Error| {
        eprintln!("airlock-confine: {}: {e}", e.code().as_str());
        Report {
            schema: REPORT_SCHEMA.into(),
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
            namespaces: Namespaces::default(),
            landlock: None,
            seccomp: false,
            no_new_privs: false,
            capabilities_dropped: false,
            limits: policy.limits.clone(),
            degraded: false,
            warnings: Vec::new(),
            outcome: Outcome::Failed {
                step: e.step().into(),
                code: e.code().as_str().into(),
                message: e.to_string(),
            },
            exit_status: e.exit_status(),
            survivors: 0,
            elapsed_ms: 0,
            view: ViewMode::HostView,
            cpu_ms: 0,
            peak_rss_kib: 0,
        }
    };
    if let Err(e) = policy.validate() {
        return failed(e);
    }
    let workdir = match policy.effective_workdir() {
        Some(w) => w.to_path_buf(),
        None => match std::env::current_dir() {
            Ok(d) => d,
            Err(source) => {
                return failed(Error::Workdir {
                    path: ".".into(),
                    source,
                });
            }
        },
    };
    // A tmpfs on /tmp would hide policy paths that live under it.
    let under_tmp = policy
        .ro
        .iter()
        .chain(&policy.rw)
        .chain([&workdir])
        .any(|p| p.starts_with("/tmp"));
    let setup = Setup {
        uid: policy.uid,
        gid: policy.gid,
        system_ro: policy.system_ro,
        ro: policy.ro.clone(),
        mountpoints: policy.rw.clone(),
        limits: policy.limits.clone(),
        allow_degraded: policy.allow_degraded,
        landlock_min_abi: policy.landlock_min_abi,
        private_tmp: policy.private_tmp && !under_tmp,
        tmp_size: policy.tmp_size,
        namespaces: policy.namespaces,
        net: true,
        uts: true,
        ipc: true,
        keep: None,
    };
    let job = Job {
        binds: policy
            .rw
            .iter()
            .map(|p| Bind {
                source: p.clone(),
                target: p.clone(),
            })
            .collect(),
        overlay: None,
        workdir,
        env: policy.env.clone(),
        argv: command.to_vec(),
        timeout: policy.timeout,
        nested: Vec::new(),
        network: None,
    };
    match Sandbox::prepare(setup) {
        Ok(sandbox) => sandbox.run(&job, None),
        Err(e) => failed(e),
    }
}

/// Exits the calling (forked) process at once, without running atexit
/// handlers or flushing buffers it shares with its parent.
pub(crate) fn exit_now(code: i32) -> ! {
    // SAFETY: _exit terminates the process immediately; it is the correct
    // way to leave a forked child and has no memory-safety preconditions.
    unsafe { libc::_exit(code) }
}

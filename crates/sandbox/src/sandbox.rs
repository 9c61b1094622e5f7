//! The sandbox engine: everything decided once ([`Sandbox::prepare`]),
//! then one fork and one exec per command ([`Sandbox::run`]).
//!
//! Prepared once, in the single-threaded process that will start commands
//! (airlock-confine itself, or the executor's spawner):
//! - the view: a user namespace (unless root) and a mount namespace of its
//!   own, in which the minimal root's template is built ([`crate::root`]);
//!   where the kernel refuses them, the host's view (see [`ViewMode`]);
//! - the seccomp programs, compiled to BPF;
//! - the Landlock grants of the view, and the namespaces each command gets.
//!
//! Per command, in the minimal root:
//!
//! ```text
//! spawner ──clone(NEWNS|NEWPID|NEWIPC…)──▶ init, pid 1 of its pid namespace:
//!   mounts the workspace, /tmp, /proc; pivot_root; forks
//!     └─▶ command: bounding set → ids → capabilities → no_new_privs →
//!         rlimits → Landlock → seccomp (precompiled) → env → setsid → execve
//! ```
//!
//! When the command exits the init kills whatever is left (`kill(-1)` in
//! its own pid namespace) and exits; the kernel does not let an init's exit
//! complete before every other process of its namespace is gone, so once
//! the spawner has reaped the init nothing of the sandbox survives — no
//! /proc scan is needed. In the host view the spawner is a child subreaper:
//! the command's orphans become its children, and after the command exits
//! it kills and reaps them (reading only its own `children` list) until
//! none is left.

use std::ffi::{CString, OsString};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, ppoll};
use nix::sched::{CloneFlags, unshare};
use nix::sys::prctl;
use nix::sys::signal::{
    SaFlags, SigAction, SigHandler, SigSet, SigmaskHow, Signal, kill, sigaction, sigprocmask,
};
use nix::sys::time::TimeSpec;
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{Pid, getgid, getuid};
use seccompiler::BpfProgram;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result, errno};
use crate::landlock::Grants;
use crate::policy::{DEVICES_RO, DEVICES_RW, Limits, NOBODY, SYSTEM_RO};
use crate::report::{Message, Namespaces, Outcome, REPORT_SCHEMA, Report, ViewMode};
use crate::root::{Bind, Nested, Overlay, Template, TemplateSpec};
use crate::seccomp_policy::{Extras, LANDLOCK_ABI_TRUNCATE};
use crate::{EXIT_TIMEOUT, landlock, namespaces, reaper, seccomp, target};

/// What every command of one spawner shares, decided once.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Setup {
    /// Uid commands run as, when the spawner runs as root (default 65534).
    pub uid: Option<u32>,
    /// Gid commands run as, when the spawner runs as root.
    pub gid: Option<u32>,
    /// Grant (and in the minimal root, bind) the system paths read-only.
    pub system_ro: bool,
    /// More read-only paths, at the same place in the view.
    pub ro: Vec<PathBuf>,
    /// Where jobs' read-write directories appear in the minimal root.
    pub mountpoints: Vec<PathBuf>,
    /// Resource limits of every command.
    pub limits: Limits,
    /// Run when Landlock is not fully enforced (warns, recorded).
    pub allow_degraded: bool,
    /// The lowest Landlock ABI that counts as fully enforced.
    pub landlock_min_abi: u8,
    /// A private tmpfs on /tmp per command (minimal root only).
    pub private_tmp: bool,
    /// Its size in bytes.
    pub tmp_size: u64,
    /// Try the minimal root (user, mount and pid namespaces); off, every
    /// command gets the host view.
    pub namespaces: bool,
    /// A network namespace (only a down `lo`) per command.
    pub net: bool,
    /// A UTS namespace per command (host name `airlock-sandbox`).
    pub uts: bool,
    /// An IPC namespace per command; without one, creating System V IPC
    /// objects and POSIX message queues is refused
    /// ([`crate::seccomp_policy::SHARED_IPC_RULES`]).
    pub ipc: bool,
    /// After the template is built, keep only these host paths in the
    /// spawner's view; `None` keeps the host (a one-shot spawner).
    pub keep: Option<Vec<PathBuf>>,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            uid: None,
            gid: None,
            system_ro: true,
            ro: Vec::new(),
            mountpoints: Vec::new(),
            limits: Limits::default(),
            allow_degraded: false,
            landlock_min_abi: 1,
            private_tmp: true,
            tmp_size: 256 << 20,
            namespaces: true,
            net: true,
            uts: true,
            ipc: true,
            keep: None,
        }
    }
}

/// One command.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Job {
    /// Read-write directories. In the minimal root each is bound at its
    /// target (a [`Setup::mountpoints`] entry); in the host view its source
    /// is granted (and must equal its target).
    pub binds: Vec<Bind>,
    /// An overlay workspace (minimal root only).
    pub overlay: Option<Overlay>,
    /// Working directory, in the command's view.
    pub workdir: PathBuf,
    /// Environment entries on top of the clean environment.
    pub env: Vec<(String, String)>,
    /// The command and its arguments.
    pub argv: Vec<OsString>,
    /// Wall-clock limit.
    pub timeout: Option<Duration>,
    /// Directories mounted beneath the workspace or /tmp (minimal root
    /// only): a setup's outputs, a dependency layer's HOME part.
    #[serde(default)]
    pub nested: Vec<Nested>,
    /// A setup's network (minimal root with a network namespace only):
    /// `lo` is brought up, the init listens on `127.0.0.1:PORT` and hands
    /// the listener over [`Stdio::network`]; the command may create IP
    /// sockets, and Landlock is asked to let it connect over TCP to this
    /// port alone (not tested apart from the namespace).
    #[serde(default)]
    pub network: Option<u16>,
}

/// Standard streams for a command: input is always /dev/null.
#[derive(Debug)]
pub struct Stdio {
    /// Becomes descriptor 1.
    pub stdout: OwnedFd,
    /// Becomes descriptor 2.
    pub stderr: OwnedFd,
    /// For a job with a [`Job::network`]: a UNIX socket over which the
    /// init sends the loopback listener (`SCM_RIGHTS`), once.
    pub network: Option<OwnedFd>,
    /// The read end of a pipe the executor holds the other end of: a byte
    /// written there kills the command (its pid namespace) as a timeout
    /// would, but reported as killed, not timed out (the executor's disk
    /// watch: the executor's Landlock scope lets it signal no command).
    pub cancel: Option<OwnedFd>,
}

/// What was decided at preparation.
#[derive(Debug)]
pub struct Sandbox {
    setup: Setup,
    privileged: bool,
    uid: u32,
    gid: u32,
    view: ViewMode,
    view_reason: Option<String>,
    ns: Namespaces,
    template: Option<Template>,
    clone_flags: CloneFlags,
    /// Compiled filters: `[ip][unix]`, `ip` for a setup's job (IP sockets
    /// allowed), `unix` when Landlock does not confine UNIX sockets.
    programs: [[Vec<BpfProgram>; 2]; 2],
    grants: Grants,
    devnull: OwnedFd,
}

/// Per-command data the child processes use, built before any fork.
pub(crate) struct CommandPlan<'a> {
    pub privileged: bool,
    pub uid: u32,
    pub gid: u32,
    pub limits: &'a Limits,
    pub grants: Grants,
    pub min_abi: u8,
    pub allow_degraded: bool,
    pub programs: &'a [Vec<BpfProgram>; 2],
    pub workdir: PathBuf,
    pub env: Vec<(String, String)>,
    pub command: OsString,
    pub argv: Vec<CString>,
    pub stdio: Option<[RawFd; 3]>,
    pub tmp: bool,
}

fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}

impl Sandbox {
    /// Prepares the sandbox in the calling process, which must be
    /// single-threaded (checked) and stays so. In the minimal root this
    /// process enters its own user (unless root) and mount namespaces and
    /// its root becomes the template's tmpfs.
    pub fn prepare(setup: Setup) -> Result<Sandbox> {
        let threads = thread_count();
        if threads != 1 {
            return Err(Error::NotSingleThreaded { threads });
        }
        validate_setup(&setup)?;
        let privileged = nix::unistd::geteuid().is_root();
        let (uid, gid) = target_ids(&setup, privileged)?;
        let devnull = nix::fcntl::open(
            "/dev/null",
            OFlag::O_RDWR | OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(|e| Error::Supervise(errno(e)))?;
        // SAFETY: open just returned this descriptor; we own it.
        let devnull = unsafe { OwnedFd::from_raw_fd(devnull) };
        let mut ns = Namespaces::default();
        let mut clone_flags = CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWPID;
        if setup.ipc {
            clone_flags |= CloneFlags::CLONE_NEWIPC;
        }
        if setup.uts {
            clone_flags |= CloneFlags::CLONE_NEWUTS;
        }
        if setup.net {
            clone_flags |= CloneFlags::CLONE_NEWNET;
        }
        let (template, view_reason) = if setup.namespaces {
            match enter_view(&setup, privileged, uid, gid, clone_flags, &mut ns) {
                Ok(t) => (Some(t), None),
                Err(ViewFailure::Unavailable(why)) => (None, Some(why)),
                Err(ViewFailure::Broken(e)) => return Err(e),
            }
        } else {
            (None, Some("namespaces turned off".to_owned()))
        };
        let view = if template.is_some() {
            ViewMode::MinimalRoot
        } else {
            ViewMode::HostView
        };
        ns.root = template.is_some();
        if template.is_some() {
            ns.mount = true;
            ns.pid = true;
            ns.ipc = setup.ipc;
            ns.uts = setup.uts;
            ns.net = setup.net;
        }
        let kernel = landlock::kernel_abi();
        let host_view = view == ViewMode::HostView;
        let truncate = host_view && kernel < i32::from(LANDLOCK_ABI_TRUNCATE);
        let shared_ipc = !(setup.ipc && template.is_some());
        let compile = |ip_sockets, unix_paths| {
            seccomp::compile_with(Extras {
                unix_paths,
                metadata_paths: host_view,
                truncate_paths: truncate,
                shared_ipc,
                ip_sockets,
            })
        };
        let programs = [
            [compile(false, false)?, compile(false, true)?],
            [compile(true, false)?, compile(true, true)?],
        ];
        let grants = match &template {
            // The view's own frame (/, /etc, /dev) is not listable, as in
            // the host view: only the granted paths are.
            Some(t) => Grants {
                ro: Vec::new(),
                ro_if_present: t.ro_present.clone(),
                read_dirs: Vec::new(),
                rw: Vec::new(),
                rw_files_if_present: t.devices_rw.clone(),
                ro_files_if_present: t.devices_ro.clone(),
                tcp_connect: Vec::new(),
            },
            None => Grants {
                ro: setup.ro.clone(),
                ro_if_present: if setup.system_ro {
                    SYSTEM_RO.iter().map(PathBuf::from).collect()
                } else {
                    Vec::new()
                },
                rw: Vec::new(),
                rw_files_if_present: DEVICES_RW.iter().map(PathBuf::from).collect(),
                ro_files_if_present: DEVICES_RO.iter().map(PathBuf::from).collect(),
                read_dirs: Vec::new(),
                tcp_connect: Vec::new(),
            },
        };
        Ok(Sandbox {
            setup,
            privileged,
            uid,
            gid,
            view,
            view_reason,
            ns,
            template,
            clone_flags,
            programs,
            grants,
            devnull,
        })
    }

    /// The view commands get.
    pub fn view(&self) -> ViewMode {
        self.view
    }

    /// Why the minimal root is not used, when it is not.
    pub fn view_reason(&self) -> Option<&str> {
        self.view_reason.as_deref()
    }

    /// Whether an overlay workspace can be mounted over directories of
    /// `dir` (a directory in this process's view, e.g. the executor's work
    /// root): tried once in a throw-away mount namespace. overlayfs refuses
    /// some file systems as its upper layer (an overlayfs itself, as in a
    /// container with a volatile root); the caller then copies instead.
    pub fn probe_overlay(&self, dir: &std::path::Path) -> std::result::Result<(), String> {
        if self.template.is_none() {
            return Err("no minimal root".into());
        }
        let probe = dir.join(format!(".overlay-probe-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&probe);
        let made = ["lower", "upper", "work", "mnt"]
            .iter()
            .try_for_each(|d| std::fs::create_dir_all(probe.join(d)))
            .and_then(|()| std::fs::write(probe.join("lower").join("f"), b"x"));
        if let Err(e) = made {
            let _ = std::fs::remove_dir_all(&probe);
            return Err(format!("cannot lay out {}: {e}", probe.display()));
        }
        let opts = format!(
            "lowerdir={},upperdir={},workdir={},userxattr",
            probe.join("lower").display(),
            probe.join("upper").display(),
            probe.join("work").display()
        );
        let target = probe.join("mnt");
        // SAFETY: single-threaded (checked at preparation); the child mounts
        // in its own mount namespace and exits.
        let outcome = match unsafe { clone_process(CloneFlags::CLONE_NEWNS) } {
            Ok(None) => {
                let r = nix::mount::mount(
                    Some("overlay"),
                    &target,
                    Some("overlay"),
                    nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
                    Some(opts.as_str()),
                );
                crate::exit_now(match r {
                    Ok(()) => 0,
                    Err(e) => (e as i32).clamp(1, 255),
                })
            }
            Ok(Some(pid)) => match waitpid(pid, None) {
                Ok(WaitStatus::Exited(_, 0)) => Ok(()),
                Ok(WaitStatus::Exited(_, e)) => Err(format!(
                    "overlayfs refuses {}: {}",
                    dir.display(),
                    Errno::from_raw(e)
                )),
                other => Err(format!("overlay probe: {other:?}")),
            },
            Err(e) => Err(format!("overlay probe: {e}")),
        };
        remove_probe(&probe);
        outcome
    }

    /// Namespaces every command gets.
    pub fn namespaces(&self) -> &Namespaces {
        &self.ns
    }

    /// Uid and gid commands run as (in the spawner's user namespace).
    pub fn ids(&self) -> (u32, u32) {
        (self.uid, self.gid)
    }

    /// Runs one command; the report's `exit_status` is the command's status,
    /// 128 + signal, [`EXIT_TIMEOUT`], or 125/126/127 when confinement or
    /// execution failed.
    pub fn run(&self, job: &Job, stdio: Option<Stdio>) -> Report {
        let start = Instant::now();
        let mut report = Report {
            schema: REPORT_SCHEMA.into(),
            uid: self.uid,
            gid: self.gid,
            namespaces: self.ns.clone(),
            landlock: None,
            seccomp: false,
            no_new_privs: false,
            capabilities_dropped: false,
            limits: self.setup.limits.clone(),
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
            view: self.view,
            cpu_ms: 0,
            peak_rss_kib: 0,
        };
        if let Some(why) = &self.view_reason {
            if self.setup.namespaces {
                report
                    .warnings
                    .push(format!("host view, not the minimal root: {why}"));
            }
        }
        if let Err(e) = self.supervise(job, stdio, &mut report) {
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

    fn plan<'a>(&'a self, job: &Job, stdio: Option<&Stdio>) -> Result<CommandPlan<'a>> {
        let Some(first) = job.argv.first() else {
            return Err(Error::Policy("no command given".into()));
        };
        crate::policy::check_path(&job.workdir)?;
        let argv = job
            .argv
            .iter()
            .map(|a| {
                CString::new(a.as_bytes())
                    .map_err(|_| Error::Policy("NUL byte in the command".into()))
            })
            .collect::<Result<Vec<_>>>()?;
        crate::policy::check_env(&job.env)?;
        let mut grants = self.grants.clone();
        let tmp = self.template.as_ref().is_some_and(|t| t.tmp);
        match &self.template {
            Some(_) => {
                for b in &job.binds {
                    crate::policy::check_path(&b.source)?;
                    if !self.setup.mountpoints.contains(&b.target) {
                        return Err(Error::Policy(format!(
                            "{} is not a mount point of the minimal root",
                            b.target.display()
                        )));
                    }
                    grants.rw.push(b.target.clone());
                }
                if let Some(o) = &job.overlay {
                    if !self.setup.mountpoints.contains(&o.target) {
                        return Err(Error::Policy(format!(
                            "{} is not a mount point of the minimal root",
                            o.target.display()
                        )));
                    }
                    grants.rw.push(o.target.clone());
                }
                if tmp {
                    grants.rw.push("/tmp".into());
                }
                for n in &job.nested {
                    crate::policy::check_path(&n.source)?;
                    crate::policy::check_path(&n.target)?;
                    let beneath =
                        |top: &std::path::Path| n.target.starts_with(top) && n.target != top;
                    let under_mountpoint = job
                        .binds
                        .iter()
                        .map(|b| &b.target)
                        .chain(job.overlay.iter().map(|o| &o.target))
                        .any(|t| beneath(t));
                    if !(under_mountpoint || (tmp && beneath(std::path::Path::new("/tmp")))) {
                        return Err(Error::Policy(format!(
                            "{} is beneath neither the workspace nor /tmp",
                            n.target.display()
                        )));
                    }
                }
                if let Some(port) = job.network {
                    if !self.ns.net {
                        return Err(Error::Policy(
                            "a setup's network needs a network namespace per command".into(),
                        ));
                    }
                    if stdio.is_none_or(|s| s.network.is_none()) {
                        return Err(Error::Policy(
                            "a setup's network needs a socket to hand its listener over".into(),
                        ));
                    }
                    grants.tcp_connect.push(port);
                }
                // /proc is granted once it is mounted (the init reports it).
                grants.ro_if_present.push("/proc".into());
            }
            None => {
                if job.overlay.is_some() {
                    return Err(Error::Policy(
                        "an overlay workspace needs the minimal root".into(),
                    ));
                }
                if !job.nested.is_empty() {
                    return Err(Error::Policy("nested mounts need the minimal root".into()));
                }
                if job.network.is_some() {
                    return Err(Error::Policy(
                        "a setup's network needs the minimal root (a network namespace of its own)"
                            .into(),
                    ));
                }
                for b in &job.binds {
                    crate::policy::check_path(&b.source)?;
                    if b.source != b.target {
                        return Err(Error::Policy(format!(
                            "in the host view {} must appear at its own path",
                            b.source.display()
                        )));
                    }
                    grants.rw.push(b.source.clone());
                }
            }
        }
        Ok(CommandPlan {
            privileged: self.privileged,
            uid: self.uid,
            gid: self.gid,
            limits: &self.setup.limits,
            grants,
            min_abi: self.setup.landlock_min_abi,
            allow_degraded: self.setup.allow_degraded,
            programs: &self.programs[usize::from(job.network.is_some())],
            workdir: job.workdir.clone(),
            env: job.env.clone(),
            command: first.clone(),
            argv,
            stdio: stdio.map(|s| {
                [
                    self.devnull.as_raw_fd(),
                    s.stdout.as_raw_fd(),
                    s.stderr.as_raw_fd(),
                ]
            }),
            tmp,
        })
    }

    fn supervise(&self, job: &Job, stdio: Option<Stdio>, report: &mut Report) -> Result<()> {
        let plan = self.plan(job, stdio.as_ref())?;
        let mut stdio = stdio;
        let handoff = stdio.as_mut().and_then(|s| s.network.take());
        let cancel = stdio.as_mut().and_then(|s| s.cancel.take());
        // Status (children → us, closed by execve) and lifeline (closed
        // when we die, so the init knows).
        let (status_r, status_w) =
            nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| Error::Pipe(errno(e)))?;
        let (life_r, life_w) =
            nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| Error::Pipe(errno(e)))?;
        // Orphans come back to us when there is no pid namespace.
        let _ = prctl::set_child_subreaper(true);
        let started = Instant::now();
        let child = match &self.template {
            Some(template) => {
                let flags = self.clone_flags;
                // SAFETY: this process is single-threaded (checked at
                // preparation; it starts no thread), so the child inherits
                // no lock held elsewhere and may allocate before it execs.
                match unsafe { clone_process(flags) } {
                    Ok(None) => {
                        drop((status_r, life_w));
                        crate::init::run(
                            plan,
                            template,
                            job,
                            self.setup.tmp_size,
                            crate::init::Channels {
                                status: File::from(status_w),
                                lifeline: life_r,
                                handoff,
                            },
                            &self.ns,
                        )
                    }
                    Ok(Some(pid)) => pid,
                    Err(e) => return Err(Error::Fork(errno(e))),
                }
            }
            None => {
                // SAFETY: as above, single-threaded.
                match unsafe { nix::unistd::fork() } {
                    Ok(nix::unistd::ForkResult::Child) => {
                        drop((status_r, life_w, life_r));
                        let mut status = File::from(status_w);
                        let _ = prctl::set_pdeathsig(Signal::SIGKILL);
                        target::run(&plan, crate::root::Entered::default(), &mut status)
                    }
                    Ok(nix::unistd::ForkResult::Parent { child }) => child,
                    Err(e) => return Err(Error::Fork(errno(e))),
                }
            }
        };
        drop((status_w, life_r, plan, stdio, handoff));
        // Wait, enforcing the timeout; then kill whatever came back to us.
        let deadline = job.timeout.map(|t| started + t);
        let (status, stop, raw, usage) = wait_for(child, &status_r, deadline, cancel.as_ref())?;
        drop(cancel);
        reaper::kill_and_reap_all();
        drop(life_w);
        report.survivors = usize::from(reaper::has_live_child());
        report.cpu_ms = usage.0;
        report.peak_rss_kib = usage.1;
        let mut raw = raw;
        drain(&status_r, &mut raw);
        let direct = self.template.is_none().then_some(status);
        apply_messages(report, &raw, status, direct, stop);
        if report.survivors > 0 {
            return Err(Error::Survivors {
                count: report.survivors,
            });
        }
        Ok(())
    }
}

/// Removes the overlay probe's directories (overlayfs leaves its work
/// directory's `work` subdirectory with mode 000).
fn remove_probe(probe: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(
        probe.join("work").join("work"),
        std::fs::Permissions::from_mode(0o700),
    );
    let _ = std::fs::remove_dir_all(probe);
}

enum ViewFailure {
    /// The kernel (or a filter above us) refuses: use the host view.
    Unavailable(String),
    /// Half-built: refuse to run.
    Broken(Error),
}

/// Enters the spawner's namespaces and builds the template.
fn enter_view(
    setup: &Setup,
    privileged: bool,
    uid: u32,
    gid: u32,
    clone_flags: CloneFlags,
    ns: &mut Namespaces,
) -> std::result::Result<Template, ViewFailure> {
    let unavailable = |what: &str, e: Errno| ViewFailure::Unavailable(format!("{what}: {e}"));
    if !privileged {
        unshare(CloneFlags::CLONE_NEWUSER).map_err(|e| unavailable("user namespace", e))?;
        ns.user = true;
        // A process that dropped from root is not dumpable, and its /proc
        // files (the id maps among them) then belong to root: writable
        // just for the maps, undumpable again afterwards.
        let dumpable = prctl::get_dumpable().unwrap_or(true);
        let _ = prctl::set_dumpable(true);
        let mapped = namespaces::write_own_maps(uid, gid);
        let _ = prctl::set_dumpable(dumpable);
        mapped.map_err(ViewFailure::Broken)?;
    }
    unshare(CloneFlags::CLONE_NEWNS).map_err(|e| unavailable("mount namespace", e))?;
    nix::mount::mount(
        None::<&str>,
        "/",
        None::<&str>,
        nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| unavailable("private mount propagation", e))?;
    // The namespaces each command needs: try them once.
    probe_clone(clone_flags).map_err(|e| unavailable("per-command namespaces", e))?;
    // A first mount tells whether mounting is allowed at all (a Landlocked
    // caller may not); it changes nothing visible.
    nix::mount::mount(
        Some("tmpfs"),
        "/tmp",
        Some("tmpfs"),
        nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
        Some("size=4k"),
    )
    .map_err(|e| unavailable("mount", e))?;
    nix::mount::umount2("/tmp", nix::mount::MntFlags::MNT_DETACH)
        .map_err(|e| ViewFailure::Broken(Error::Supervise(errno(e))))?;
    let under_tmp = setup
        .ro
        .iter()
        .chain(&setup.mountpoints)
        .any(|p| p.starts_with("/tmp"));
    Template::build(&TemplateSpec {
        system: setup.system_ro,
        ro: setup.ro.clone(),
        mountpoints: setup.mountpoints.clone(),
        tmp: setup.private_tmp && !under_tmp,
        keep: setup.keep.clone(),
    })
    .map_err(ViewFailure::Broken)
}

/// Forks a child in new namespaces `flags` that exits at once, and reaps it.
fn probe_clone(flags: CloneFlags) -> std::result::Result<(), Errno> {
    // SAFETY: single-threaded (checked by the caller); the child only calls _exit.
    match unsafe { clone_process(flags)? } {
        None => crate::exit_now(0),
        Some(pid) => {
            let _ = waitpid(pid, None);
            Ok(())
        }
    }
}

/// clone(2) without CLONE_VM: fork into new namespaces. `None` in the child.
///
/// # Safety
/// As fork: the calling process must be single-threaded, or the child must
/// only make async-signal-safe calls.
pub(crate) unsafe fn clone_process(flags: CloneFlags) -> std::result::Result<Option<Pid>, Errno> {
    // SAFETY: clone with a null stack and without CLONE_VM behaves as fork
    // (the child gets a copy of the address space at the same stack
    // pointer); the caller upholds fork's conditions.
    let r = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (flags.bits() | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    match r {
        -1 => Err(Errno::last()),
        0 => Ok(None),
        pid => Ok(Some(Pid::from_raw(pid as i32))),
    }
}

fn validate_setup(setup: &Setup) -> Result<()> {
    for p in setup.ro.iter().chain(&setup.mountpoints) {
        crate::policy::check_path(p)?;
    }
    if let Some(keep) = &setup.keep {
        for p in keep {
            crate::policy::check_path(p)?;
        }
    }
    if !(1..=crate::policy::MAX_LANDLOCK_ABI).contains(&setup.landlock_min_abi) {
        return Err(Error::Policy(format!(
            "landlock minimum ABI must be 1..={}, not {}",
            crate::policy::MAX_LANDLOCK_ABI,
            setup.landlock_min_abi
        )));
    }
    Ok(())
}

fn target_ids(setup: &Setup, privileged: bool) -> Result<(u32, u32)> {
    if privileged {
        let uid = setup.uid.unwrap_or(NOBODY);
        let gid = setup.gid.or(setup.uid).unwrap_or(NOBODY);
        return Ok((uid, gid));
    }
    let (current, current_gid) = (getuid().as_raw(), getgid().as_raw());
    let uid = setup.uid.unwrap_or(current);
    let gid = setup.gid.unwrap_or(current_gid);
    if uid != current || gid != current_gid {
        return Err(Error::IdsUnavailable { uid, gid, current });
    }
    Ok((uid, gid))
}

/// pidfd_open(2), so poll can wake when the child exits.
fn pidfd_open(pid: Pid) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and touches no memory.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid.as_raw(), 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: the kernel just returned this new descriptor; we own it.
    Some(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Why the sandbox was killed before the command finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    /// The wall-clock timeout passed.
    Timeout,
    /// This process received SIGTERM, SIGINT or SIGHUP.
    Signal(i32),
    /// The executor asked through the job's cancel pipe (a wall the
    /// kernel does not hold: the disk): reported as killed by SIGKILL.
    Cancelled,
}

/// The stop signal received, 0 if none (set by [`on_stop_signal`]).
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_stop_signal(sig: libc::c_int) {
    // Async-signal-safe: one atomic store.
    STOP_SIGNAL.store(sig, Ordering::SeqCst);
}

const STOP_SIGNALS: [Signal; 3] = [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP];

/// SIGTERM, SIGINT and SIGHUP are blocked except while waiting in ppoll,
/// where they interrupt the wait and tear the sandbox down instead of
/// killing this process outright. Returns the mask to wait with.
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
    for sig in STOP_SIGNALS {
        old.remove(sig);
    }
    old
}

/// (CPU ms, peak RSS KiB) of a reaped child and its reaped descendants.
type Usage = (u64, u64);

/// wait4(2) without blocking; `None` while the child runs.
fn try_wait4(pid: Pid) -> std::result::Result<Option<(WaitStatus, Usage)>, Errno> {
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain old data; zeroed is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `status` and `usage` are valid, exclusively borrowed
    // out-parameters for the duration of the call.
    let r = unsafe { libc::wait4(pid.as_raw(), &mut status, libc::WNOHANG, &mut usage) };
    match r {
        -1 => Err(Errno::last()),
        0 => Ok(None),
        _ => {
            let ws = WaitStatus::from_raw(pid, status).map_err(|_| Errno::EINVAL)?;
            let ms = |tv: libc::timeval| {
                u64::try_from(tv.tv_sec).unwrap_or(0) * 1000
                    + u64::try_from(tv.tv_usec).unwrap_or(0) / 1000
            };
            let cpu = ms(usage.ru_utime) + ms(usage.ru_stime);
            Ok(Some((
                ws,
                (cpu, u64::try_from(usage.ru_maxrss).unwrap_or(0)),
            )))
        }
    }
}

/// Waits for `child`, reading status messages meanwhile; at the deadline,
/// on a stop signal or when `cancel` becomes readable kills it (and with
/// it its pid namespace).
fn wait_for(
    child: Pid,
    status_r: &OwnedFd,
    deadline: Option<Instant>,
    cancel: Option<&OwnedFd>,
) -> Result<(WaitStatus, Option<Stop>, Vec<u8>, Usage)> {
    let mut cancel = cancel;
    let wait_mask = catch_stop_signals();
    let pidfd = pidfd_open(child);
    let mut raw = Vec::new();
    let mut pipe_open = true;
    let mut stop = None;
    loop {
        match try_wait4(child) {
            Ok(None) | Err(Errno::EINTR) => {}
            Ok(Some((st, usage))) => return Ok((st, stop, raw, usage)),
            Err(e) => return Err(Error::Supervise(errno(e))),
        }
        let signal = STOP_SIGNAL.load(Ordering::SeqCst);
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        if stop.is_none() && (signal != 0 || left.is_some_and(|l| l.is_zero())) {
            let _ = kill(child, Signal::SIGKILL);
            stop = Some(if signal != 0 {
                Stop::Signal(signal)
            } else {
                Stop::Timeout
            });
            continue;
        }
        let mut wait = if stop.is_none() { left } else { None };
        if pidfd.is_none() {
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
        if let Some(c) = cancel {
            fds.push(PollFd::new(c.as_fd(), PollFlags::POLLIN));
        }
        match ppoll(&mut fds, wait.map(TimeSpec::from_duration), Some(wait_mask)) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => return Err(Error::Supervise(errno(e))),
        }
        let readable = pipe_open && fds[0].revents().is_some_and(|r| !r.is_empty());
        let cancelled = cancel.is_some()
            && fds
                .last()
                .and_then(|p| p.revents())
                .is_some_and(|r| !r.is_empty());
        drop(fds);
        if cancelled {
            // Asked once: killed, and the pipe no longer watched.
            let _ = kill(child, Signal::SIGKILL);
            cancel = None;
            stop.get_or_insert(Stop::Cancelled);
        }
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

/// Folds the children's messages into the report. `direct` is the
/// command's own wait status when it was our child (host view).
fn apply_messages(
    report: &mut Report,
    raw: &[u8],
    status: WaitStatus,
    direct: Option<WaitStatus>,
    stop: Option<Stop>,
) {
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
                root,
            } => {
                report.namespaces.mount = mount;
                report.namespaces.proc = proc;
                report.namespaces.tmp = tmp;
                report.namespaces.shm = shm;
                report.namespaces.root = root;
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
                report.warnings.extend(warnings);
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
    if let Some(st) = direct {
        exit = match st {
            WaitStatus::Exited(_, code) => Some(Outcome::Exited { code }),
            WaitStatus::Signaled(_, sig, _) => Some(Outcome::Signaled { signal: sig as i32 }),
            _ => exit,
        };
    }
    let (outcome, code) = if stop == Some(Stop::Timeout) {
        (Outcome::TimedOut, EXIT_TIMEOUT)
    } else if let Some(Stop::Signal(signal)) = stop {
        (Outcome::Interrupted { signal }, 128 + signal)
    } else if stop == Some(Stop::Cancelled) {
        let signal = Signal::SIGKILL as i32;
        (Outcome::Signaled { signal }, 128 + signal)
    } else if let Some(f) = failed {
        f
    } else if let Some(outcome) = exit {
        let code = match outcome {
            Outcome::Exited { code } => code,
            Outcome::Signaled { signal } => 128 + signal,
            _ => 125,
        };
        (outcome, code)
    } else {
        let message = format!("the sandbox's init ended without a report: {status:?}");
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
    report.exit_status = code;
}

/// Writes one status message as a JSON line (one write, below PIPE_BUF).
pub(crate) fn send(w: &mut File, msg: &Message) {
    if let Ok(mut line) = serde_json::to_vec(msg) {
        line.push(b'\n');
        let _ = w.write_all(&line);
    }
}

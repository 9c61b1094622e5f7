//! The process driver: each agent a child process of the supervisor (under
//! airlock-local, where there is no systemd), as the agent user when run
//! as root, in a cgroup and a process group of its own, watched through a
//! pidfd.
//!
//! - start: a clean environment (PATH, HOME, AIRLOCK_AGENT, the bus
//!   address, the agent's allowlisted variables, CREDENTIALS_DIRECTORY when
//!   it has a credential), stdin from /dev/null, stdout and stderr appended
//!   to `<runtime>/<name>.log`; in the child, in order: into the agent's
//!   new cgroup (`airlock-agent@NAME`, [`crate::cgroup`]; with cgroups),
//!   a new session (and process group; its id, the leader's pid, is what
//!   `start` returns), RLIMIT_AS and RLIMIT_NPROC from the agent's limits,
//!   RLIMIT_CORE 0, the agent's groups, gid and uid, then the parent-death
//!   signal SIGKILL (the leader does not outlive the thread that started
//!   it).
//! - probe: `waitid(P_PIDFD, WNOHANG | WNOWAIT)`, so the exited leader stays
//!   unreaped and its process group id cannot be reused before stop.
//! - stop: SIGTERM to the group and to every process of the cgroup, up to
//!   `grace` for the leader to exit and the cgroup to empty, then SIGKILL
//!   to the group (descendants included) while the leader, still unreaped,
//!   keeps the group id reserved, and every process left in the cgroup
//!   killed ([`crate::cgroup::Cgroup::kill_all`]: a descendant that left
//!   the group with `setsid` cannot leave the cgroup); then the leader is
//!   reaped and the cgroup removed. [`ProcessDriver::shutdown`] stops every
//!   agent and removes the stack's cgroups.
//!
//! Without cgroups (airlock-local not run as root, where it cannot make
//! them) a descendant that left the group is not reached.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write as _;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use airlock_config::Agent;
use nix::sys::signal::{Signal, killpg};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
use nix::unistd::{Gid, Pid, Uid};

use crate::cgroup::{Cgroup, Tree};
use crate::driver::{Driver, DriverError, Liveness};
use crate::policy::Exit;

/// The user an agent runs as.
#[derive(Debug, Clone)]
pub struct Identity {
    /// Its uid.
    pub uid: Uid,
    /// Its primary gid.
    pub gid: Gid,
    /// Its supplementary groups (airlock-readers, to read the repositories).
    pub groups: Vec<Gid>,
}

impl Identity {
    /// Looks up `user` and its groups.
    pub fn lookup(user: &str) -> Result<Identity, DriverError> {
        let u = nix::unistd::User::from_name(user)
            .map_err(|e| DriverError(format!("user {user}: {e}")))?
            .ok_or_else(|| DriverError(format!("no user {user}")))?;
        let name = std::ffi::CString::new(user).map_err(|e| DriverError(e.to_string()))?;
        let groups = nix::unistd::getgrouplist(&name, u.gid)
            .map_err(|e| DriverError(format!("groups of {user}: {e}")))?;
        Ok(Identity {
            uid: u.uid,
            gid: u.gid,
            groups,
        })
    }
}

/// Runs agents as child processes.
#[derive(Debug)]
pub struct ProcessDriver {
    identity: Option<Identity>,
    runtime: PathBuf,
    base_env: Vec<(String, String)>,
    grace: Duration,
    cgroups: Option<Tree>,
    running: Mutex<HashMap<String, Running>>,
}

#[derive(Debug)]
struct Running {
    child: Child,
    pidfd: OwnedFd,
    cgroup: Option<Cgroup>,
}

impl ProcessDriver {
    /// A driver that starts agents as `identity` (None: as this process's
    /// own user, which must then not be root), keeps their logs and
    /// credentials under `runtime` (made 0711 if missing), and gives each the
    /// variables of `base_env` (the bus address under airlock-local).
    pub fn new(
        identity: Option<Identity>,
        runtime: PathBuf,
        base_env: Vec<(String, String)>,
    ) -> Result<ProcessDriver, DriverError> {
        if identity.is_none() && Uid::effective().is_root() {
            return Err(DriverError(
                "as root, agents need a user of their own (airlock-agent)".into(),
            ));
        }
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(&runtime)
            .map_err(|e| DriverError(format!("{}: {e}", runtime.display())))?;
        Ok(ProcessDriver {
            identity,
            runtime,
            base_env,
            grace: Duration::from_secs(2),
            cgroups: None,
            running: Mutex::new(HashMap::new()),
        })
    }

    /// Puts each agent in a cgroup of its own below `tree` (what its
    /// processes cannot leave: module doc).
    pub fn with_cgroups(mut self, tree: Tree) -> ProcessDriver {
        self.cgroups = Some(tree);
        self
    }

    /// The cgroup of the running agent `name`, if it has one.
    pub fn cgroup_path(&self, name: &str) -> Option<PathBuf> {
        let running = self.running.lock().ok()?;
        Some(running.get(name)?.cgroup.as_ref()?.path().to_path_buf())
    }

    /// Stops every agent (as [`Driver::stop`] does) and removes the
    /// stack's cgroups, killing whatever is left in them: what airlock-local
    /// does as it stops, so no agent's process outlives the stack.
    pub async fn shutdown(&self) {
        let all: Vec<Running> = match self.running.lock() {
            Ok(mut running) => running.drain().map(|(_, r)| r).collect(),
            Err(_) => Vec::new(),
        };
        futures_util::future::join_all(all.into_iter().map(|r| self.terminate(r))).await;
        if let Some(tree) = &self.cgroups {
            if let Err(e) = tree.remove() {
                tracing::warn!(cgroup = %tree.path().display(), "removing the agents' cgroups: {e}");
            }
        }
    }

    /// How long stop waits after SIGTERM before SIGKILL.
    pub fn with_grace(mut self, grace: Duration) -> ProcessDriver {
        self.grace = grace;
        self
    }

    /// The leader's pid of the running agent `name`, if any.
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.running.lock().ok()?.get(name).map(|r| r.child.id())
    }

    /// The log file of the agent `name`.
    pub fn log_path(&self, name: &str) -> PathBuf {
        self.runtime.join(format!("{name}.log"))
    }

    /// Copies the agent's credential into `<runtime>/<name>.credentials/model-key`,
    /// the directory 0500 and the file 0400, both owned by the agent's user.
    fn credentials(&self, agent: &Agent) -> Result<Option<PathBuf>, DriverError> {
        let Some(source) = &agent.credential_file else {
            return Ok(None);
        };
        let fail = |what: &str, e: std::io::Error| DriverError(format!("{what}: {e}"));
        let key = std::fs::read(source).map_err(|e| fail(&source.display().to_string(), e))?;
        let dir = self.runtime.join(format!("{}.credentials", agent.name));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| fail("credentials directory", e))?;
        let file = dir.join("model-key");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o400)
            .open(&file)
            .map_err(|e| fail("credential", e))?;
        f.write_all(&key).map_err(|e| fail("credential", e))?;
        if let Some(id) = &self.identity {
            for p in [&file, &dir] {
                nix::unistd::chown(p, Some(id.uid), Some(id.gid))
                    .map_err(|e| DriverError(format!("chown {}: {e}", p.display())))?;
            }
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o500))
            .map_err(|e| fail("credentials directory", e))?;
        Ok(Some(dir))
    }

    fn spawn(&self, agent: &Agent) -> Result<Running, DriverError> {
        let log = File::options()
            .create(true)
            .append(true)
            .mode(0o640)
            .open(self.log_path(&agent.name))
            .map_err(|e| DriverError(format!("log: {e}")))?;
        let err_log = log.try_clone().map_err(|e| DriverError(e.to_string()))?;
        let mut cmd = Command::new(&agent.command[0]);
        cmd.args(&agent.command[1..])
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", "/")
            .env("AIRLOCK_AGENT", &agent.name)
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err_log);
        for (k, v) in &self.base_env {
            cmd.env(k, v);
        }
        for name in &agent.environment {
            if let Some(v) = std::env::var_os(name) {
                cmd.env(name, v);
            }
        }
        if let Some(dir) = self.credentials(agent)? {
            cmd.env("CREDENTIALS_DIRECTORY", dir);
        }
        let memory = u64::from(agent.memory_max_mib) * 1024 * 1024;
        let tasks = u64::from(agent.tasks_max);
        let identity = self.identity.clone();
        let parent = nix::unistd::getpid();
        // The agent's cgroup, and its cgroup.procs open for the child to
        // join (the descriptor is closed on exec).
        let cgroup = match &self.cgroups {
            Some(tree) => Some(
                tree.agent(&agent.name)
                    .map_err(|e| DriverError(format!("the agent's cgroup: {e}")))?,
            ),
            None => None,
        };
        let procs = cgroup
            .as_ref()
            .map(Cgroup::procs_for_child)
            .transpose()
            .map_err(|e| DriverError(format!("the agent's cgroup: {e}")))?;
        let join = procs.as_ref().map(|fd| fd.as_raw_fd());
        // SAFETY: the closure runs in the forked child before exec and only
        // makes async-signal-safe system calls (write, setsid, setrlimit,
        // setgroups, setresgid, setresuid, prctl, getppid) on values
        // computed before the fork; it allocates nothing (an error return
        // allocates only on the already failing path). `join` is a
        // descriptor `procs` keeps open until spawn returns.
        unsafe {
            cmd.pre_exec(move || {
                use nix::sys::resource::{Resource, setrlimit};
                // Into the agent's cgroup first ("0": this process), as
                // root still: everything it starts is born inside.
                if let Some(fd) = join {
                    nix::unistd::write(std::os::fd::BorrowedFd::borrow_raw(fd), b"0")?;
                }
                // A session of its own (and so a process group): no
                // process of another agent can join its group, and the
                // session id names the agent to the supervisor.
                nix::unistd::setsid()?;
                setrlimit(Resource::RLIMIT_AS, memory, memory)?;
                setrlimit(Resource::RLIMIT_NPROC, tasks, tasks)?;
                setrlimit(Resource::RLIMIT_CORE, 0, 0)?;
                if let Some(id) = &identity {
                    nix::unistd::setgroups(&id.groups)?;
                    nix::unistd::setresgid(id.gid, id.gid, id.gid)?;
                    nix::unistd::setresuid(id.uid, id.uid, id.uid)?;
                }
                // After the uid changes, which clears a parent-death
                // signal set before it (prctl(2)). A parent gone before
                // this point would never send it: then start nothing.
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
                if nix::unistd::getppid() != parent {
                    return Err(std::io::Error::other("the agent host exited"));
                }
                Ok(())
            });
        }
        let spawned = cmd.spawn();
        drop(procs);
        let child = match spawned {
            Ok(child) => child,
            Err(e) => {
                if let Some(c) = &cgroup {
                    let _ = c.remove();
                }
                return Err(DriverError(format!("{}: {e}", agent.command[0])));
            }
        };
        let pid = rustix::process::Pid::from_raw(child.id() as i32)
            .ok_or_else(|| DriverError("pid 0".into()))?;
        let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
            .map_err(|e| DriverError(format!("pidfd_open: {e}")))?;
        Ok(Running {
            child,
            pidfd,
            cgroup,
        })
    }

    fn exited(running: &Running) -> Result<Option<Exit>, DriverError> {
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        match waitid(Id::PIDFd(running.pidfd.as_fd()), flags) {
            Ok(WaitStatus::Exited(_, code)) => Ok(Some(Exit {
                code: Some(code),
                signal: None,
                reason: String::new(),
            })),
            Ok(WaitStatus::Signaled(_, sig, _)) => Ok(Some(Exit {
                code: None,
                signal: Some(sig as i32),
                reason: String::new(),
            })),
            Ok(_) => Ok(None),
            Err(e) => Err(DriverError(format!("waitid: {e}"))),
        }
    }

    async fn terminate(&self, mut running: Running) {
        let group = Pid::from_raw(running.child.id() as i32);
        let _ = killpg(group, Signal::SIGTERM);
        if let Some(c) = &running.cgroup {
            let _ = c.signal_all(rustix::process::Signal::TERM);
        }
        let deadline = tokio::time::Instant::now() + self.grace;
        while tokio::time::Instant::now() < deadline {
            let leader_gone = matches!(Self::exited(&running), Ok(Some(_)) | Err(_));
            let cgroup_empty = running
                .cgroup
                .as_ref()
                .is_none_or(|c| c.pids().map_or(true, |p| p.is_empty()));
            if leader_gone && cgroup_empty {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The leader is not reaped yet, so the group id is still ours.
        let _ = killpg(group, Signal::SIGKILL);
        if let Some(c) = &running.cgroup {
            // Whatever left the group (setsid) is still in the cgroup.
            if let Err(e) = c.kill_all(Duration::from_secs(10)).await {
                tracing::error!(cgroup = %c.path().display(), "stopping an agent: {e}");
            }
        }
        let _ = running.child.wait();
        if let Some(c) = &running.cgroup {
            if let Err(e) = c.remove() {
                tracing::warn!(cgroup = %c.path().display(), "removing an agent's cgroup: {e}");
            }
        }
    }
}

impl Driver for ProcessDriver {
    async fn start(&self, agent: &Agent) -> Result<Option<u32>, DriverError> {
        let old = self
            .running
            .lock()
            .map_err(|_| DriverError("poisoned".into()))?
            .remove(&agent.name);
        if let Some(old) = old {
            self.terminate(old).await;
        }
        let running = self.spawn(agent)?;
        let leader = running.child.id();
        self.running
            .lock()
            .map_err(|_| DriverError("poisoned".into()))?
            .insert(agent.name.clone(), running);
        Ok(Some(leader))
    }

    async fn probe(&self, name: &str) -> Result<Liveness, DriverError> {
        let running = self
            .running
            .lock()
            .map_err(|_| DriverError("poisoned".into()))?;
        let Some(r) = running.get(name) else {
            return Ok(Liveness::Gone(Exit {
                reason: "not started".into(),
                ..Exit::default()
            }));
        };
        Ok(match Self::exited(r)? {
            Some(exit) => Liveness::Gone(exit),
            None => Liveness::Alive,
        })
    }

    async fn stop(&self, name: &str) -> Result<(), DriverError> {
        let running = self
            .running
            .lock()
            .map_err(|_| DriverError("poisoned".into()))?
            .remove(name);
        if let Some(r) = running {
            self.terminate(r).await;
        }
        Ok(())
    }
}

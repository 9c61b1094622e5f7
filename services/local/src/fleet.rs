//! Starting the components as separate processes, each as its own uid,
//! and stopping them all.

use crate::layout::{Id, Ids};
use nix::sys::signal::{Signal, kill};
use nix::unistd::{Gid, Pid, Uid};
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A started component.
#[derive(Debug)]
pub struct Member {
    pub name: &'static str,
    pub child: Child,
    pub log: PathBuf,
    pub spec: Spec,
}

/// Every component started so far; stopped in reverse order when dropped.
#[derive(Debug, Default)]
pub struct Fleet {
    pub members: Vec<Member>,
}

/// How to start one component.
#[derive(Debug, Clone)]
pub struct Spec {
    pub name: &'static str,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub id: Id,
    /// Run in a fresh network namespace (the executor: only `lo` exists).
    pub new_netns: bool,
    /// Join this network namespace (`/run/netns/NAME`) first (root only):
    /// the stack's own "host".
    pub netns: Option<PathBuf>,
}

impl Fleet {
    /// Starts `spec` with a clean environment, its own ids and groups, and
    /// stdout/stderr appended to `<logs>/<name>.log`.
    pub fn start(&mut self, spec: Spec, ids: &Ids, logs: &Path) -> std::io::Result<()> {
        let log = logs.join(format!("{}.log", spec.name));
        let out = File::options().create(true).append(true).open(&log)?;
        let mut cmd = if spec.new_netns && !ids.separated {
            // Unprivileged: a user namespace that maps the caller to itself, and a network namespace in it.
            let mut c = Command::new("unshare");
            c.args(["--user", "--map-current-user", "--net", "--"])
                .arg(&spec.program);
            c
        } else {
            Command::new(&spec.program)
        };
        cmd.args(&spec.args)
            .env_clear()
            .env("PATH", "/usr/bin:/bin:/usr/sbin:/sbin")
            .env("LC_ALL", "C.UTF-8")
            .env(
                "AIRLOCK_LOG",
                std::env::var("AIRLOCK_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        for (k, v) in &spec.env {
            cmd.env(k, v);
        }
        if spec.netns.is_some() && !ids.separated {
            return Err(std::io::Error::other(
                "joining a network namespace needs root",
            ));
        }
        if ids.separated {
            // Opened before the fork: the child only calls setns(2) on it.
            let host_netns = match &spec.netns {
                Some(path) => Some(File::open(path)?),
                None => None,
            };
            let groups: Vec<Gid> = std::iter::once(spec.id.gid)
                .chain(ids.groups(spec.id))
                .map(Gid::from_raw)
                .collect();
            let (uid, gid) = (Uid::from_raw(spec.id.uid), Gid::from_raw(spec.id.gid));
            let netns = spec.new_netns;
            // SAFETY: the closure runs in the forked child before exec and
            // only makes system calls (setns, unshare, setgroups, setresgid,
            // setresuid, prctl) on values prepared before the fork; it
            // allocates nothing and takes no lock.
            unsafe {
                cmd.pre_exec(move || {
                    if let Some(ns) = &host_netns {
                        nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET)?;
                    }
                    if netns {
                        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)?;
                    }
                    nix::unistd::setgroups(&groups)?;
                    nix::unistd::setresgid(gid, gid, gid)?;
                    nix::unistd::setresuid(uid, uid, uid)?;
                    nix::sys::prctl::set_pdeathsig(Signal::SIGTERM)?;
                    Ok(())
                });
            }
        } else {
            // SAFETY: prctl is a single system call with no allocation.
            unsafe {
                cmd.pre_exec(|| {
                    nix::sys::prctl::set_pdeathsig(Signal::SIGTERM)?;
                    Ok(())
                });
            }
        }
        let child = cmd.spawn().map_err(|e| {
            std::io::Error::other(format!("starting {}: {e}", spec.program.display()))
        })?;
        self.members.push(Member {
            name: spec.name,
            child,
            log,
            spec,
        });
        Ok(())
    }

    fn position(&self, name: &str) -> Option<usize> {
        self.members.iter().position(|m| m.name == name)
    }

    /// The pid of a running member.
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.position(name).map(|i| self.members[i].child.id())
    }

    /// SIGKILLs a member and reaps it. True when it was still running (a
    /// kill that landed), false when it had already exited.
    pub fn kill(&mut self, name: &str) -> bool {
        let Some(i) = self.position(name) else {
            return false;
        };
        let m = &mut self.members[i];
        let alive = matches!(m.child.try_wait(), Ok(None));
        let _ = m.child.kill();
        let _ = m.child.wait();
        alive
    }

    /// Waits up to `timeout` for a member to exit by itself; returns its
    /// status, or `None` if it is still running.
    pub fn wait_exit(&mut self, name: &str, timeout: Duration) -> Option<std::process::ExitStatus> {
        let i = self.position(name)?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.members[i].child.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts a member again with the same spec plus `extra_env`, after it
    /// was killed or exited; the new process takes its place.
    pub fn restart(
        &mut self,
        name: &str,
        extra_env: &[(&str, &str)],
        ids: &Ids,
        logs: &Path,
    ) -> std::io::Result<()> {
        let i = self
            .position(name)
            .ok_or_else(|| std::io::Error::other(format!("no member {name}")))?;
        let mut old = self.members.remove(i);
        let _ = old.child.kill();
        let _ = old.child.wait();
        let mut spec = old.spec;
        spec.env.retain(|(k, _)| {
            !extra_env.iter().any(|(e, _)| e == k) && !k.starts_with("AIRLOCK_FAULT_")
        });
        for (k, v) in extra_env {
            spec.env.push(((*k).to_owned(), (*v).to_owned()));
        }
        self.start(spec, ids, logs)?;
        let new = self
            .members
            .pop()
            .ok_or_else(|| std::io::Error::other("start did not add a member"))?;
        self.members.insert(i, new);
        Ok(())
    }

    /// Fails when a member has exited, naming it and the end of its log.
    pub fn check_alive(&mut self) -> Result<(), String> {
        for m in &mut self.members {
            if let Ok(Some(status)) = m.child.try_wait() {
                return Err(format!(
                    "{} exited ({status}); last lines of {}:\n{}",
                    m.name,
                    m.log.display(),
                    tail(&m.log, 15)
                ));
            }
        }
        Ok(())
    }

    /// SIGTERM to every member, newest first; SIGKILL after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        while let Some(mut m) = self.members.pop() {
            // A member already reaped (check_alive, an earlier kill) has
            // given its pid back to the system: signalling that pid could
            // reach an unrelated process. Only a member not yet reaped (a
            // zombie still holds its pid) is signalled.
            if !matches!(m.child.try_wait(), Ok(None)) {
                continue;
            }
            let pid = Pid::from_raw(m.child.id() as i32);
            let _ = kill(pid, Signal::SIGTERM);
            let deadline = Instant::now() + grace;
            loop {
                match m.child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() >= deadline => {
                        let _ = m.child.kill();
                        let _ = m.child.wait();
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(10));
    }
}

/// The last `n` lines of a log.
pub fn tail(path: &Path, n: usize) -> String {
    let lines: Vec<String> = File::open(path)
        .map(|f| BufReader::new(f).lines().map_while(Result::ok).collect())
        .unwrap_or_default();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Waits until a log contains `needle`; returns the rest of that line.
pub fn wait_for_log(path: &Path, needle: &str, timeout: Duration) -> Option<String> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Ok(text) = std::fs::read_to_string(path) {
            if let Some(line) = text.lines().find(|l| l.contains(needle)) {
                return line.split(needle).nth(1).map(|s| s.trim().to_owned());
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

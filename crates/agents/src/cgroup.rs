//! A cgroup of its own per agent under airlock-local (the process driver):
//! what an agent's processes cannot leave, so a child that starts a
//! session of its own (`setsid`) is still recognised as the agent and
//! still stopped with it. (Under systemd each agent's unit is its cgroup
//! already, and this module is not used.)
//!
//! - **Which hierarchy** ([`Tree::create`]): cgroup v2 when
//!   `/sys/fs/cgroup` is cgroup2 (Debian 12 and 13), or when a hybrid
//!   system's unified hierarchy (`/sys/fs/cgroup/unified`) takes a new
//!   cgroup; else cgroup v1's `pids` hierarchy. Below airlock-local's own
//!   cgroup there, the stack's `airlock-agents.PID.N` holds one
//!   `airlock-agent@NAME` per agent. A stack's directory whose process is
//!   gone (airlock-local killed) is emptied and removed by the next start
//!   that runs agents.
//! - **Joining**: the agent's first process writes itself to its cgroup's
//!   `cgroup.procs` in the forked child, before it changes uid or runs
//!   anything (the file is opened before the fork), so everything it ever
//!   starts is born inside. The files are root's: an agent (another uid)
//!   can neither move a process out nor move one in.
//! - **Stopping** ([`Cgroup::kill_all`]): `cgroup.kill` where the kernel
//!   has it (v2, Linux 5.14); else, v1 first setting `pids.max` to 0 so
//!   no fork outruns the loop, every pid `cgroup.procs` lists is sent
//!   SIGKILL through a pidfd once that very process is seen inside the
//!   cgroup (a listed pid may have been reused since), until the list is
//!   empty. Then the cgroup is removed.
//! - **Recognising** (the supervisor, [`of_process`] and [`agent_line`]):
//!   the kernel's `/proc/PID/cgroup` of the bus peer, read while a pidfd
//!   holds that process and trusted only if it still runs after the read,
//!   compared with the line that puts the agent's first process in
//!   `airlock-agent@NAME` (docs/privsep/agents.md says why not the
//!   daemon's own peer pidfd).

use std::io::{Error, ErrorKind};
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rustix::process::{Pid, PidfdFlags, Signal};

/// Where the kernel's cgroup hierarchies are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The name of agent `name`'s cgroup (as systemd names its unit).
pub fn agent_leaf(name: &str) -> String {
    format!("airlock-agent@{name}")
}

/// The prefix of a stack's directory, before `PID.N`.
const STACK_PREFIX: &str = "airlock-agents.";

/// One hierarchy: where it is mounted, and whether it is v1's `pids`.
#[derive(Clone, Debug)]
struct Hierarchy {
    mount: PathBuf,
    v1: bool,
}

impl Hierarchy {
    /// Whether a `/proc/PID/cgroup` line (`ID:CONTROLLERS:PATH`) is this
    /// hierarchy's; its path if so.
    fn path_in<'t>(&self, line: &'t str) -> Option<&'t str> {
        let mut parts = line.splitn(3, ':');
        let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let ours = if self.v1 {
            controllers.split(',').any(|c| c == "pids")
        } else {
            id == "0" && controllers.is_empty()
        };
        ours.then_some(path)
    }

    /// This process's own cgroup in the hierarchy, as a directory.
    fn own_dir(&self) -> std::io::Result<PathBuf> {
        let text = std::fs::read_to_string("/proc/self/cgroup")?;
        let path = text
            .lines()
            .find_map(|l| self.path_in(l))
            .ok_or_else(|| Error::other("this process is in no cgroup of the hierarchy"))?;
        Ok(self.mount.join(path.trim_start_matches('/')))
    }
}

fn fs_type(path: &str) -> Option<nix::sys::statfs::FsType> {
    nix::sys::statfs::statfs(path)
        .ok()
        .map(|s| s.filesystem_type())
}

/// The hierarchies to try, best first (module doc).
fn candidates() -> Vec<Hierarchy> {
    use nix::sys::statfs::{CGROUP_SUPER_MAGIC, CGROUP2_SUPER_MAGIC};
    let mut out = Vec::new();
    let unified = format!("{CGROUP_ROOT}/unified");
    let pids = format!("{CGROUP_ROOT}/pids");
    for (path, v1) in [
        (CGROUP_ROOT, false),
        (unified.as_str(), false),
        (pids.as_str(), true),
    ] {
        let want = if v1 {
            CGROUP_SUPER_MAGIC
        } else {
            CGROUP2_SUPER_MAGIC
        };
        if fs_type(path) == Some(want) {
            out.push(Hierarchy {
                mount: PathBuf::from(path),
                v1,
            });
        }
    }
    out
}

/// A stack's agent cgroups: `…/airlock-agents.PID.N`, removed (with every
/// process left in it killed) by [`Tree::remove`] or when dropped.
#[derive(Debug)]
pub struct Tree {
    dir: PathBuf,
    hierarchy: Hierarchy,
}

impl Tree {
    /// Makes the stack's directory in the first hierarchy that takes it
    /// (module doc), after emptying and removing the directories of
    /// stacks whose airlock-local is gone.
    pub fn create() -> std::io::Result<Tree> {
        Tree::create_in(candidates())
    }

    /// [`Tree::create`] in cgroup v1's `pids` hierarchy even where v2 is
    /// usable: what a system without cgroup v2 gets (tests of that path).
    pub fn create_v1_pids() -> std::io::Result<Tree> {
        Tree::create_in(candidates().into_iter().filter(|h| h.v1).collect())
    }

    fn create_in(candidates: Vec<Hierarchy>) -> std::io::Result<Tree> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let mut refused = Vec::new();
        for hierarchy in candidates {
            let parent = match hierarchy.own_dir() {
                Ok(p) => p,
                Err(e) => {
                    refused.push(format!("{}: {e}", hierarchy.mount.display()));
                    continue;
                }
            };
            sweep_stale(&parent, &hierarchy);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let dir = parent.join(format!("{STACK_PREFIX}{}.{n}", std::process::id()));
            match std::fs::create_dir(&dir) {
                Ok(()) => return Ok(Tree { dir, hierarchy }),
                Err(e) => refused.push(format!("{}: {e}", dir.display())),
            }
        }
        Err(Error::other(format!(
            "no cgroup hierarchy takes the agents' cgroups (cgroup v2, or v1's pids): {}",
            if refused.is_empty() {
                "none is mounted under /sys/fs/cgroup".to_owned()
            } else {
                refused.join("; ")
            }
        )))
    }

    /// The stack's directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Whether this is cgroup v1's `pids` hierarchy.
    pub fn is_v1(&self) -> bool {
        self.hierarchy.v1
    }

    /// A new, empty cgroup for agent `name` (a leftover of an earlier run
    /// of it is emptied and removed first).
    pub fn agent(&self, name: &str) -> std::io::Result<Cgroup> {
        let cgroup = Cgroup {
            dir: self.dir.join(agent_leaf(name)),
            hierarchy: self.hierarchy.clone(),
        };
        if cgroup.dir.exists() {
            cgroup.kill_all_blocking(Duration::from_secs(5))?;
            cgroup.remove()?;
        }
        std::fs::create_dir(&cgroup.dir)?;
        Ok(cgroup)
    }

    /// Kills whatever runs in any of its cgroups, and removes them all.
    pub fn remove(&self) -> std::io::Result<()> {
        remove_tree(&self.dir, &self.hierarchy)
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        if let Err(e) = self.remove() {
            tracing::warn!(cgroup = %self.dir.display(), "removing the agents' cgroups: {e}");
        }
    }
}

/// Every agent cgroup below `dir` emptied and removed, then `dir`.
fn remove_tree(dir: &Path, hierarchy: &Hierarchy) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_tree(&entry.path(), hierarchy)?;
        }
    }
    let cgroup = Cgroup {
        dir: dir.to_path_buf(),
        hierarchy: hierarchy.clone(),
    };
    cgroup.kill_all_blocking(Duration::from_secs(5))?;
    cgroup.remove()
}

/// Empties and removes the stack directories in `parent` whose
/// airlock-local (the PID in their name) is gone.
fn sweep_stale(parent: &Path, hierarchy: &Hierarchy) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(STACK_PREFIX))
            .and_then(|rest| rest.split_once('.'))
            .and_then(|(pid, _)| pid.parse::<i32>().ok())
        else {
            continue;
        };
        let gone = matches!(
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
            Err(nix::errno::Errno::ESRCH)
        );
        if gone && pid > 0 {
            match remove_tree(&entry.path(), hierarchy) {
                Ok(()) => {
                    tracing::info!(cgroup = %entry.path().display(), "removed the agents' cgroups of a stack that is gone")
                }
                Err(e) => {
                    tracing::warn!(cgroup = %entry.path().display(), "cannot remove the agents' cgroups of a stack that is gone: {e}")
                }
            }
        }
    }
}

/// One agent's cgroup.
#[derive(Debug)]
pub struct Cgroup {
    dir: PathBuf,
    hierarchy: Hierarchy,
}

impl Cgroup {
    /// Its directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Its `cgroup.procs`, open for writing, for the agent's first process
    /// to join by writing `0` (itself) before it execs.
    pub fn procs_for_child(&self) -> std::io::Result<OwnedFd> {
        std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(nix::libc::O_CLOEXEC)
            .open(self.dir.join("cgroup.procs"))
            .map(OwnedFd::from)
    }

    /// The processes in it now.
    pub fn pids(&self) -> std::io::Result<Vec<u32>> {
        match std::fs::read_to_string(self.dir.join("cgroup.procs")) {
            Ok(text) => Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    /// Whether the process `pid` is in this cgroup now.
    fn holds(&self, pid: u32) -> bool {
        let Ok(rel) = self.dir.strip_prefix(&self.hierarchy.mount) else {
            return false;
        };
        let rel = format!("/{}", rel.display());
        std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|t| {
            t.lines()
                .any(|l| self.hierarchy.path_in(l) == Some(rel.as_str()))
        })
    }

    /// Sends `signal` to every process in it, each through a pidfd taken
    /// before the process is seen inside (so a reused pid is never hit).
    pub fn signal_all(&self, signal: Signal) -> std::io::Result<()> {
        for pid in self.pids()? {
            let Some(p) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
                continue;
            };
            let Ok(fd) = rustix::process::pidfd_open(p, PidfdFlags::empty()) else {
                continue;
            };
            if self.holds(pid) {
                let _ = rustix::process::pidfd_send_signal(&fd, signal);
            }
        }
        Ok(())
    }

    /// One pass of the kill: `cgroup.kill` where there is one, else SIGKILL
    /// to each process (v1: no new process first). Whether it was empty.
    fn kill_pass(&self) -> std::io::Result<bool> {
        if self.pids()?.is_empty() {
            return Ok(true);
        }
        let kill = self.dir.join("cgroup.kill");
        if !self.hierarchy.v1 && kill.exists() {
            std::fs::write(&kill, "1")?;
        } else {
            if self.hierarchy.v1 {
                let _ = std::fs::write(self.dir.join("pids.max"), "0");
            }
            self.signal_all(Signal::KILL)?;
        }
        Ok(false)
    }

    /// Kills every process in it, until none is left or `within` passed
    /// (then `TimedOut`).
    pub async fn kill_all(&self, within: Duration) -> std::io::Result<()> {
        let deadline = Instant::now() + within;
        while !self.kill_pass()? {
            if Instant::now() >= deadline {
                return Err(self.still_running());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }

    /// [`Cgroup::kill_all`], blocking the thread.
    pub fn kill_all_blocking(&self, within: Duration) -> std::io::Result<()> {
        let deadline = Instant::now() + within;
        while !self.kill_pass()? {
            if Instant::now() >= deadline {
                return Err(self.still_running());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    fn still_running(&self) -> Error {
        Error::new(
            ErrorKind::TimedOut,
            format!(
                "{}: processes {:?} survive the kill",
                self.dir.display(),
                self.pids().unwrap_or_default()
            ),
        )
    }

    /// Removes the (empty) cgroup; one already gone is no error. The
    /// kernel may take a moment to let go of processes just killed.
    pub fn remove(&self) -> std::io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            match std::fs::remove_dir(&self.dir) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
                Err(e)
                    if e.raw_os_error() == Some(nix::libc::EBUSY) && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// `/proc/PID/cgroup` of the process `pid`, read while a pidfd holds it:
/// `None` when it is gone, or went during the read (its pid may then name
/// another process already).
pub fn of_process(pid: u32) -> Option<String> {
    let p = i32::try_from(pid).ok().and_then(Pid::from_raw)?;
    let fd = rustix::process::pidfd_open(p, PidfdFlags::empty()).ok()?;
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    // A pidfd polls readable once its process has exited.
    let mut polled = [rustix::event::PollFd::new(
        &fd,
        rustix::event::PollFlags::IN,
    )];
    let exited = rustix::event::poll(&mut polled, Some(&rustix::event::Timespec::default()))
        .map_or(true, |n| n > 0);
    (!exited).then_some(text)
}

/// The line of a `/proc/PID/cgroup` text that puts its process in agent
/// `name`'s cgroup (its path's last component is `airlock-agent@NAME`).
pub fn agent_line<'t>(text: &'t str, name: &str) -> Option<&'t str> {
    let leaf = agent_leaf(name);
    text.lines().find(|l| {
        l.splitn(3, ':')
            .nth(2)
            .and_then(|path| path.rsplit('/').next())
            == Some(leaf.as_str())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agents_line_is_found_by_its_last_component_only() {
        let text = "9:name=systemd:/\n8:pids:/airlock-agents.7.0/airlock-agent@planner\n0::/\n";
        assert_eq!(
            agent_line(text, "planner"),
            Some("8:pids:/airlock-agents.7.0/airlock-agent@planner")
        );
        assert_eq!(agent_line(text, "plan"), None);
        let v2 = "0::/x/airlock-agents.7.0/airlock-agent@b\n";
        assert_eq!(agent_line(v2, "b"), Some(v2.trim_end()));
        assert_eq!(agent_line("0::/airlock-agent@b/c\n", "b"), None);
        let v1 = Hierarchy {
            mount: "/sys/fs/cgroup/pids".into(),
            v1: true,
        };
        assert_eq!(v1.path_in("3:cpu,pids:/a"), Some("/a"));
        assert_eq!(v1.path_in("0::/a"), None);
        let v2 = Hierarchy {
            mount: "/sys/fs/cgroup".into(),
            v1: false,
        };
        assert_eq!(v2.path_in("0::/a/b"), Some("/a/b"));
        assert_eq!(v2.path_in("8:pids:/a"), None);
    }
}

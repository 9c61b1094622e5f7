//! No residency: finding and killing every process the command left
//! behind, and proving none is left.
//!
//! In a pid namespace, the init kills all of it with `kill(-1, SIGKILL)`
//! and the kernel kills the rest when the init dies. Without one, the
//! init and the supervisor are child subreapers, so every orphan of the
//! command becomes their child and is killed until none remains.

use std::fs;
use std::os::unix::fs::MetadataExt;

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, getpid};

/// Pids whose parent is `parent`, from /proc.
pub fn children_of(parent: Pid) -> Vec<Pid> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let pid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // pid (comm) state ppid ...; comm may contain spaces and parentheses.
        let rest = &stat[stat.rfind(')')? + 1..];
        let ppid: i32 = rest.split_whitespace().nth(1)?.parse().ok()?;
        (ppid == parent.as_raw()).then_some(Pid::from_raw(pid))
    })
    .collect()
}

/// Kills every process that can be reached: all of the pid namespace
/// when `namespace_init` (this process is pid 1 of the namespace it
/// created), else every child of this (subreaper) process.
pub fn kill_all(namespace_init: bool) {
    if namespace_init && getpid().as_raw() == 1 {
        // Pid 1 of its own namespace: -1 means every other process in it.
        let _ = kill(Pid::from_raw(-1), Signal::SIGKILL);
    } else {
        for child in children_of(getpid()) {
            let _ = kill(child, Signal::SIGKILL);
        }
    }
}

/// True while this process has a child that is still running; reaps a
/// child that already exited (its status is not needed here).
fn has_live_child() -> bool {
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => return true,
            Ok(_) | Err(Errno::EINTR) => continue,
            Err(_) => return false, // ECHILD: no child at all
        }
    }
}

/// Like [`kill_all`], but without scanning /proc when this process has no
/// live child: a scan for children could then find none. (Orphans are
/// reparented before their parent's exit is reported, so none is missed.)
pub fn kill_remaining(namespace_init: bool) {
    if (namespace_init && getpid().as_raw() == 1) || has_live_child() {
        kill_all(namespace_init);
    }
}

/// Kills and reaps children until there are none left (never `kill(-1)`).
pub fn kill_and_reap_all() {
    while has_live_child() {
        kill_all(false);
        match waitpid(None, None) {
            Ok(_) | Err(Errno::EINTR) => continue,
            Err(_) => break, // ECHILD: nothing left
        }
    }
}

/// Processes whose pid namespace is the one identified by `ns` (device,
/// inode of its nsfs file). Processes this one may not inspect are not
/// counted; in an unprivileged sandbox every member has the caller's uid.
pub fn pid_namespace_members(ns: (u64, u64)) -> usize {
    let Ok(dir) = fs::read_dir("/proc") else {
        return 0;
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            fs::metadata(format!("/proc/{pid}/ns/pid")).is_ok_and(|m| (m.dev(), m.ino()) == ns)
        })
        .count()
}

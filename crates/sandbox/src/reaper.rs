//! No residency: killing every process the command left behind, and
//! knowing none is left — without scanning /proc.
//!
//! In the minimal root the command's init is pid 1 of its own pid
//! namespace: when the command exits it kills everything else with
//! `kill(-1, SIGKILL)`, and the kernel completes an init's exit only after
//! every other process of its namespace is gone, so reaping the init
//! proves the namespace empty. In the host view the spawner is a child
//! subreaper: every orphan of the command becomes its child, listed in its
//! own `/proc/self/task/<tid>/children`, and is killed until `waitpid`
//! reports that it has no child at all.

use std::fs;

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, getpid};

/// This process's children: its own `children` list (one file, not a scan
/// of every process), or a /proc scan where that list is not available.
pub fn children_of_self() -> Vec<Pid> {
    let me = getpid();
    if let Ok(list) = fs::read_to_string(format!("/proc/self/task/{me}/children")) {
        return list
            .split_whitespace()
            .filter_map(|p| p.parse().ok().map(Pid::from_raw))
            .collect();
    }
    children_of(me)
}

/// Pids whose parent is `parent`, from a scan of /proc (the fallback of
/// [`children_of_self`] on kernels without CONFIG_PROC_CHILDREN).
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

/// In a pid namespace's init: kills every other process of the namespace.
pub fn kill_namespace() {
    if getpid().as_raw() == 1 {
        // Pid 1 of its own namespace: -1 means every other process in it.
        let _ = kill(Pid::from_raw(-1), Signal::SIGKILL);
    }
}

/// True while this process has a child that is still running; reaps a
/// child that already exited (its status is not needed here).
pub fn has_live_child() -> bool {
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => return true,
            Ok(_) | Err(Errno::EINTR) => continue,
            Err(_) => return false, // ECHILD: no child at all
        }
    }
}

/// Kills and reaps children until there are none left (never `kill(-1)`).
pub fn kill_and_reap_all() {
    while has_live_child() {
        for child in children_of_self() {
            let _ = kill(child, Signal::SIGKILL);
        }
        match waitpid(None, None) {
            Ok(_) | Err(Errno::EINTR) => continue,
            Err(_) => break, // ECHILD: nothing left
        }
    }
}

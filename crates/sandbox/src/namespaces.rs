//! Namespaces: a user namespace when the helper is not root, then pid,
//! ipc, uts and net in the supervising helper (pid applies to its
//! children), and a mount namespace with a fresh /proc and a private /tmp
//! in the sandbox's init. Each is used when the kernel allows it and
//! recorded in the report; none is required, because Landlock, seccomp
//! and the id switch do not depend on them.

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, unshare};

use crate::error::{Error, Result};
use crate::report::Namespaces;

/// Namespaces the supervising helper enters before it forks the init.
///
/// Unprivileged, a user namespace comes first (mapping only the caller's
/// own uid and gid onto themselves, with setgroups denied); without it
/// nothing else can be unshared. The pid namespace only affects children:
/// the next fork becomes its pid 1.
pub fn enter_supervisor(privileged: bool, uid: u32, gid: u32) -> Result<Namespaces> {
    let mut ns = Namespaces::default();
    if !privileged {
        if unshare(CloneFlags::CLONE_NEWUSER).is_err() {
            return Ok(ns);
        }
        write_map("/proc/self/setgroups", "deny")?;
        write_map("/proc/self/uid_map", &format!("{uid} {uid} 1\n"))?;
        write_map("/proc/self/gid_map", &format!("{gid} {gid} 1\n"))?;
        ns.user = true;
    }
    ns.ipc = unshare(CloneFlags::CLONE_NEWIPC).is_ok();
    ns.uts = unshare(CloneFlags::CLONE_NEWUTS).is_ok();
    ns.net = unshare(CloneFlags::CLONE_NEWNET).is_ok();
    ns.pid = unshare(CloneFlags::CLONE_NEWPID).is_ok();
    Ok(ns)
}

fn write_map(path: &str, content: &str) -> Result<()> {
    fs::write(path, content).map_err(|source| Error::IdMap {
        path: path.into(),
        source,
    })
}

/// What [`enter_mounts`] achieved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mounts {
    /// A mount namespace with private propagation.
    pub mount: bool,
    /// A fresh /proc for the current pid namespace.
    pub proc: bool,
    /// A private tmpfs on /tmp.
    pub tmp: bool,
    /// A private tmpfs on /dev/shm (POSIX shared memory and semaphores).
    pub shm: bool,
}

/// In the sandbox's init: a mount namespace whose mounts never propagate
/// back, a fresh /proc when the init is pid 1 of a new pid namespace (so
/// /proc shows no foreign process), and a size-limited private tmpfs on
/// /tmp when `tmp_size` is given. Nothing is mounted unless `/` could be
/// made private first.
pub fn enter_mounts(new_pid_ns: bool, tmp_size: Option<u64>) -> Mounts {
    let mut m = Mounts::default();
    if unshare(CloneFlags::CLONE_NEWNS).is_err() {
        return m;
    }
    m.mount = true;
    let private = mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    );
    if private.is_err() {
        return m;
    }
    let hardened = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    if new_pid_ns && nix::unistd::getpid().as_raw() == 1 {
        m.proc = mount(Some("proc"), "/proc", Some("proc"), hardened, None::<&str>).is_ok();
    }
    if let Some(size) = tmp_size {
        m.tmp = private_tmpfs("/tmp", size);
        m.shm = private_tmpfs("/dev/shm", size);
    }
    m
}

fn private_tmpfs(dir: &str, size: u64) -> bool {
    if !Path::new(dir).is_dir() {
        return false;
    }
    let opts = format!("size={size},mode=1777");
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        flags,
        Some(opts.as_str()),
    )
    .is_ok()
}

/// Sets the host name inside a new UTS namespace, so the command cannot
/// learn the real one.
pub fn set_hostname() {
    let _ = nix::unistd::sethostname("airlock-sandbox");
}

/// Identity of a namespace file such as `/proc/self/ns/pid_for_children`.
pub fn identity(path: &Path) -> io::Result<(u64, u64)> {
    let m = fs::metadata(path)?;
    Ok((m.dev(), m.ino()))
}

//! Namespaces: the user namespace a non-root spawner creates for itself
//! (mapping only its own uid and gid), and the host name inside a
//! command's UTS namespace. Which namespaces each command gets, and the
//! mount namespace's contents, are [`crate::sandbox`]'s and
//! [`crate::root`]'s.

use std::fs;

use crate::error::{Error, Result};

/// In a user namespace this process just created: maps only its own uid
/// and gid onto themselves (setgroups denied), as an unprivileged process
/// may.
pub fn write_own_maps(uid: u32, gid: u32) -> Result<()> {
    write_map("/proc/self/setgroups", "deny")?;
    write_map("/proc/self/uid_map", &format!("{uid} {uid} 1\n"))?;
    write_map("/proc/self/gid_map", &format!("{gid} {gid} 1\n"))
}

fn write_map(path: &str, content: &str) -> Result<()> {
    fs::write(path, content).map_err(|source| Error::IdMap {
        path: path.into(),
        source,
    })
}

/// Sets the host name inside a new UTS namespace, so the command cannot
/// learn the real one.
pub fn set_hostname() {
    let _ = nix::unistd::sethostname("airlock-sandbox");
}

//! Ids: when root, clear the supplementary groups and switch the real,
//! effective and saved gid, then uid (in that order: after the uid switch
//! the gid can no longer change). Unprivileged, the ids stay as they are
//! and asking for others is an error.

use nix::unistd::{Gid, Uid, getgroups, getresgid, getresuid, setgroups, setresgid, setresuid};

use crate::error::{Error, Result, errno};

/// Switches to `uid`/`gid` and verifies every id took.
pub fn switch(uid: u32, gid: u32, privileged: bool) -> Result<()> {
    if !privileged {
        let current = nix::unistd::getuid().as_raw();
        if uid != current || gid != nix::unistd::getgid().as_raw() {
            return Err(Error::IdsUnavailable { uid, gid, current });
        }
        return Ok(());
    }
    setgroups(&[]).map_err(|e| Error::Groups(errno(e)))?;
    let g = Gid::from_raw(gid);
    setresgid(g, g, g).map_err(|e| Error::Gid {
        gid,
        source: errno(e),
    })?;
    let u = Uid::from_raw(uid);
    setresuid(u, u, u).map_err(|e| Error::Uid {
        uid,
        source: errno(e),
    })?;

    let r = getresuid().map_err(|e| Error::Uid {
        uid,
        source: errno(e),
    })?;
    let rg = getresgid().map_err(|e| Error::Gid {
        gid,
        source: errno(e),
    })?;
    if [r.real, r.effective, r.saved] != [u; 3] {
        return Err(Error::Uid {
            uid,
            source: std::io::Error::other("uid did not switch"),
        });
    }
    if [rg.real, rg.effective, rg.saved] != [g; 3] {
        return Err(Error::Gid {
            gid,
            source: std::io::Error::other("gid did not switch"),
        });
    }
    let groups = getgroups().map_err(|e| Error::Groups(errno(e)))?;
    if groups.iter().any(|&x| x != g) {
        return Err(Error::Groups(std::io::Error::other(
            "supplementary groups remain",
        )));
    }
    Ok(())
}

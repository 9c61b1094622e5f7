//! no_new_privs: execve can never grant privileges again (setuid bits and
//! file capabilities are ignored). Required before an unprivileged
//! seccomp filter, and verified.

use nix::sys::prctl;

use crate::error::{Error, Result, errno};

/// Sets and verifies PR_SET_NO_NEW_PRIVS.
pub fn set() -> Result<()> {
    prctl::set_no_new_privs().map_err(|e| Error::NoNewPrivs(errno(e)))?;
    match prctl::get_no_new_privs() {
        Ok(true) => Ok(()),
        Ok(false) => Err(Error::NoNewPrivs(std::io::Error::other("flag not set"))),
        Err(e) => Err(Error::NoNewPrivs(errno(e))),
    }
}

//! Capabilities: every set is emptied — bounding, ambient, inheritable,
//! permitted, effective — and verified empty.
//!
//! The bounding set can only be shrunk while CAP_SETPCAP is held, which
//! the uid switch takes away, so [`drop_bounding`] runs before the ids
//! step and [`clear`] after it. The bounding set is walked by number up
//! to the kernel's last capability, not by the names a crate knows.

use caps::CapSet;

use crate::error::{Error, Result};

// linux/securebits.h
const SECBIT_NOROOT: libc::c_ulong = 1 << 0;
const SECBIT_NOROOT_LOCKED: libc::c_ulong = 1 << 1;
const SECBIT_KEEP_CAPS_LOCKED: libc::c_ulong = 1 << 5;
const SECBIT_NO_CAP_AMBIENT_RAISE: libc::c_ulong = 1 << 6;
const SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED: libc::c_ulong = 1 << 7;

/// Empties the bounding set and locks securebits so that uid 0 gains no
/// capability on execve and ambient capabilities cannot be raised again.
/// Without CAP_SETPCAP (an unprivileged helper without a user namespace)
/// there is nothing to give up, and nothing is done.
pub fn drop_bounding() -> Result<()> {
    if !caps::has_cap(None, CapSet::Effective, caps::Capability::CAP_SETPCAP).unwrap_or(false) {
        return Ok(());
    }
    for cap in 0..64 {
        if bounding_has(cap).is_none() {
            break;
        }
        // SAFETY: PR_CAPBSET_DROP takes a capability number and touches no memory.
        let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        if r != 0 {
            return Err(Error::Bounding(std::io::Error::last_os_error()));
        }
    }
    let bits = SECBIT_NOROOT
        | SECBIT_NOROOT_LOCKED
        | SECBIT_KEEP_CAPS_LOCKED
        | SECBIT_NO_CAP_AMBIENT_RAISE
        | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED;
    // SAFETY: PR_SET_SECUREBITS takes a bit mask and touches no memory.
    let r = unsafe { libc::prctl(libc::PR_SET_SECUREBITS, bits, 0, 0, 0) };
    if r != 0 {
        return Err(Error::Bounding(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// `Some(true)` when capability number `cap` is in the bounding set,
/// `None` when the kernel does not know it.
fn bounding_has(cap: u32) -> Option<bool> {
    // SAFETY: PR_CAPBSET_READ takes a capability number and touches no memory.
    let r = unsafe { libc::prctl(libc::PR_CAPBSET_READ, cap as libc::c_ulong, 0, 0, 0) };
    (r >= 0).then_some(r == 1)
}

/// Empties the ambient, inheritable, effective and permitted sets and
/// verifies it. Returns whether the bounding set is empty as well.
///
/// For a process whose effective uid is not 0 (in its user namespace),
/// the permitted and effective sets are left to execve(2), which empties
/// them: without ambient or inheritable capabilities, under no_new_privs
/// and with no file capability that counts in its namespace, a non-root
/// uid keeps none across execve. capset(2) is then not needed — the
/// executor's unit denies it (@privileged) — even for the command of the
/// minimal root, which holds its spawner's capabilities in the spawner's
/// user namespace until it executes.
pub fn clear() -> Result<bool> {
    let err = |e: caps::errors::CapsError| Error::Capabilities(e.to_string());
    caps::clear(None, CapSet::Ambient).map_err(err)?;
    let root = nix::unistd::geteuid().is_root();
    let sets: &[CapSet] = if root {
        &[CapSet::Inheritable, CapSet::Effective, CapSet::Permitted]
    } else {
        &[CapSet::Inheritable]
    };
    // capset(2) only for a set that holds something.
    for set in sets {
        if !caps::read(None, *set).map_err(err)?.is_empty() {
            caps::clear(None, *set).map_err(err)?;
        }
    }
    for set in [CapSet::Ambient].iter().chain(sets) {
        let left = caps::read(None, *set).map_err(err)?;
        if !left.is_empty() {
            return Err(Error::Capabilities(format!("{set:?} still holds {left:?}")));
        }
    }
    Ok((0..64).map_while(bounding_has).all(|held| !held))
}

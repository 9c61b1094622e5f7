//! Process hygiene: close every inherited file descriptor except the
//! standard streams and those the caller names (the report fd).

use std::os::fd::RawFd;

use crate::error::{Error, Result};

/// Closes every descriptor >= 3 that is not in `keep`.
pub fn close_inherited(keep: &[RawFd]) -> Result<()> {
    let mut keep: Vec<RawFd> = keep.iter().copied().filter(|&fd| fd > 2).collect();
    keep.sort_unstable();
    keep.dedup();
    let mut first: libc::c_uint = 3;
    for fd in keep
        .iter()
        .map(|&fd| fd as libc::c_uint)
        .chain([libc::c_uint::MAX])
    {
        if fd > first {
            close_range(first, fd - 1)?;
        }
        first = fd.saturating_add(1);
    }
    Ok(())
}

fn close_range(first: libc::c_uint, last: libc::c_uint) -> Result<()> {
    // SAFETY: close_range only closes descriptors; nothing in this process
    // holds the ones being closed (the helper opened none yet).
    let r = unsafe { libc::syscall(libc::SYS_close_range, first, last, 0 as libc::c_uint) };
    if r == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::ENOSYS) {
        return Err(Error::CloseFds(e));
    }
    // Kernels before 5.9: close what /proc lists.
    let dir = std::fs::read_dir("/proc/self/fd").map_err(Error::CloseFds)?;
    let fds: Vec<RawFd> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    for fd in fds {
        if (first..=last).contains(&(fd as libc::c_uint)) {
            // SAFETY: see above; a stale fd (the read_dir one) just fails with EBADF.
            unsafe { libc::close(fd) };
        }
    }
    Ok(())
}

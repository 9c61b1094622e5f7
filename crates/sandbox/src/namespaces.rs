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

/// In a command's own network namespace (which starts with only `lo`,
/// down): brings `lo` up and listens on `127.0.0.1:port`, the one address
/// a setup's package clients are given as their proxy. The listener is
/// handed to the executor, whose forwarder is the only thing behind it.
pub fn loopback_listener(port: u16) -> std::io::Result<std::net::TcpListener> {
    loopback_up()?;
    std::net::TcpListener::bind(("127.0.0.1", port))
}

fn loopback_up() -> std::io::Result<()> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: socket(2) with constant arguments; the result is checked and
    // owned at once.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by socket(2) and nothing else owns it.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain old data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads the name and writes the flags of `req`,
    // a valid ifreq that outlives the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the union's flags member is what SIOCGIFFLAGS just wrote.
    unsafe {
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
    }
    // SAFETY: SIOCSIFFLAGS reads `req`, valid for the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

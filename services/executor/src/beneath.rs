//! Path resolution that cannot leave a directory: every open below the
//! workspace root goes through openat2 with RESOLVE_BENEATH,
//! RESOLVE_NO_SYMLINKS and RESOLVE_NO_MAGICLINKS, so `..`, an absolute
//! path, a symlink (planted or not) or a /proc magic link fails in the
//! kernel instead of being followed.

use crate::error::{Error, Result};
use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::{FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

/// The resolution flags of every workspace access.
pub const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

/// openat2 beneath `root`. The errors that mean "this path tries to leave
/// or to follow a link" become [`Error::PathEscape`].
pub fn open(root: impl AsFd, rel: &str, flags: OFlags, mode: u32) -> Result<Option<OwnedFd>> {
    match rustix::fs::openat2(
        root,
        rel,
        flags | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::from_raw_mode(mode),
        RESOLVE,
    ) {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(classify(rel, e)),
    }
}

/// Maps an openat2/mkdirat error on `rel` to the executor's error.
pub fn classify(rel: &str, e: Errno) -> Error {
    match e {
        Errno::LOOP => Error::PathEscape {
            path: rel.to_owned(),
            why: "resolves through a symbolic link",
        },
        Errno::XDEV => Error::PathEscape {
            path: rel.to_owned(),
            why: "resolves outside the workspace",
        },
        Errno::ISDIR => Error::PathEscape {
            path: rel.to_owned(),
            why: "is a directory, not a regular file",
        },
        Errno::NOTDIR => Error::PathInvalid {
            path: rel.to_owned(),
            why: "a parent component is not a directory",
        },
        other => Error::Workspace {
            path: rel.to_owned(),
            source: std::io::Error::from(other),
        },
    }
}

/// Opens (creating when `create`) each directory of `rel` in turn, never
/// following a symlink; returns the descriptor of the last one.
pub fn dir(root: &OwnedFd, rel: &str, create: bool) -> Result<Option<OwnedFd>> {
    let mut cur: Option<OwnedFd> = None;
    let mut walked = String::new();
    for component in rel.split('/') {
        if !walked.is_empty() {
            walked.push('/');
        }
        walked.push_str(component);
        let base = cur.as_ref().unwrap_or(root);
        let flags = OFlags::RDONLY | OFlags::DIRECTORY;
        let fd = match open(base, component, flags, 0)? {
            Some(fd) => fd,
            None if create => {
                match rustix::fs::mkdirat(base, component, Mode::from_raw_mode(0o755)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(classify(&walked, e)),
                }
                match open(base, component, flags, 0)? {
                    Some(fd) => fd,
                    None => {
                        return Err(Error::PathInvalid {
                            path: walked,
                            why: "directory vanished while it was created",
                        });
                    }
                }
            }
            None => return Ok(None),
        };
        cur = Some(fd);
    }
    match cur {
        Some(fd) => Ok(Some(fd)),
        None => Ok(Some(rustix::io::dup(root).map_err(|e| classify(rel, e))?)),
    }
}

/// Splits `a/b/c` into (`Some("a/b")`, `"c"`).
pub fn split(rel: &str) -> (Option<&str>, &str) {
    match rel.rsplit_once('/') {
        Some((parent, name)) => (Some(parent), name),
        None => (None, rel),
    }
}

/// The type of an opened file.
pub fn file_type(fd: &OwnedFd, rel: &str) -> Result<(FileType, rustix::fs::Stat)> {
    let st = rustix::fs::fstat(fd).map_err(|e| Error::Workspace {
        path: rel.to_owned(),
        source: e.into(),
    })?;
    Ok((FileType::from_raw_mode(st.st_mode), st))
}

//! Path resolution that cannot leave a directory: every open below the
//! workspace root goes through openat2 with RESOLVE_BENEATH,
//! RESOLVE_NO_SYMLINKS and RESOLVE_NO_MAGICLINKS, so `..`, an absolute
//! path, a symlink (planted or not) or a /proc magic link fails in the
//! kernel instead of being followed — or, where openat2 is refused
//! (ENOSYS), through the same walk by hand ([`openat2_beneath`]).

use crate::error::{Error, Result};
use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::{FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use std::sync::atomic::{AtomicBool, Ordering};

/// The resolution flags of every workspace access.
pub const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

/// Set once openat2(2) answered ENOSYS: every later open walks by hand.
static NO_OPENAT2: AtomicBool = AtomicBool::new(false);

/// openat2 with [`RESOLVE`] beneath `dir`; where the kernel or a filter
/// answers ENOSYS (systemd's `RestrictSUIDSGID=` cannot inspect openat2's
/// mode argument and refuses the call), the same resolution by hand: an
/// absolute path or a `..` component fails with EXDEV, and every component
/// is opened with O_NOFOLLOW (directories with O_DIRECTORY), so a symlink
/// anywhere fails with ELOOP and nothing is ever followed.
pub fn openat2_beneath(
    dir: impl AsFd,
    rel: &str,
    flags: OFlags,
    mode: Mode,
) -> rustix::io::Result<OwnedFd> {
    if !NO_OPENAT2.load(Ordering::Relaxed) {
        match rustix::fs::openat2(&dir, rel, flags, mode, RESOLVE) {
            Err(Errno::NOSYS) => NO_OPENAT2.store(true, Ordering::Relaxed),
            other => return other,
        }
    }
    walk(dir, rel, flags, mode)
}

/// [`openat2_beneath`]'s resolution by hand.
fn walk(dir: impl AsFd, rel: &str, flags: OFlags, mode: Mode) -> rustix::io::Result<OwnedFd> {
    if rel.starts_with('/') {
        return Err(Errno::XDEV);
    }
    let parts: Vec<&str> = rel
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    if parts.contains(&"..") {
        return Err(Errno::XDEV);
    }
    let Some((last, parents)) = parts.split_last() else {
        return rustix::fs::openat(&dir, ".", flags | OFlags::NOFOLLOW, mode);
    };
    let mut cur: Option<OwnedFd> = None;
    for component in parents {
        let base: &dyn AsFd = match &cur {
            Some(fd) => fd,
            None => &dir,
        };
        let opened = rustix::fs::openat(
            base,
            *component,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        );
        cur = Some(match opened {
            // O_DIRECTORY answers ENOTDIR for a symlink: say ELOOP, as
            // RESOLVE_NO_SYMLINKS would.
            Err(Errno::NOTDIR) => {
                let st =
                    rustix::fs::statat(base, *component, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)?;
                if FileType::from_raw_mode(st.st_mode) == FileType::Symlink {
                    return Err(Errno::LOOP);
                }
                return Err(Errno::NOTDIR);
            }
            other => other?,
        });
    }
    let base: &dyn AsFd = match &cur {
        Some(fd) => fd,
        None => &dir,
    };
    rustix::fs::openat(base, *last, flags | OFlags::NOFOLLOW, mode)
}

/// openat2 beneath `root`. The errors that mean "this path tries to leave
/// or to follow a link" become [`Error::PathEscape`].
pub fn open(root: impl AsFd, rel: &str, flags: OFlags, mode: u32) -> Result<Option<OwnedFd>> {
    match openat2_beneath(
        root,
        rel,
        flags | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::from_raw_mode(mode),
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
        let opened = match open(base, component, flags, 0) {
            // O_DIRECTORY | O_NOFOLLOW answers ENOTDIR for a symlink: say
            // it is one, as for a link anywhere else on a path.
            Err(Error::PathInvalid { .. })
                if rustix::fs::statat(base, component, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
                    .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Symlink) =>
            {
                return Err(classify(&walked, Errno::LOOP));
            }
            other => other?,
        };
        let fd = match opened {
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

/// The directory holding `rel`'s last component, opened beneath `root`
/// as [`dir`] opens it (its parents created first), and that name.
pub fn parent_for_create<'r>(root: &OwnedFd, rel: &'r str) -> Result<(OwnedFd, &'r str)> {
    let (parent, name) = split(rel);
    let dir = match parent {
        Some(p) => dir(root, p, true)?.ok_or_else(|| Error::PathInvalid {
            path: rel.to_owned(),
            why: "parent directory missing",
        })?,
        None => rustix::io::dup(root).map_err(|e| classify(rel, e))?,
    };
    Ok((dir, name))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_walk_by_hand_follows_no_link_and_never_leaves() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("a/b")).unwrap();
        std::fs::write(d.path().join("a/b/f"), b"x").unwrap();
        std::os::unix::fs::symlink("/etc", d.path().join("a/link")).unwrap();
        std::os::unix::fs::symlink("b/f", d.path().join("a/flink")).unwrap();
        let root =
            rustix::fs::open(d.path(), OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
        let ro = OFlags::RDONLY | OFlags::CLOEXEC;
        assert!(walk(&root, "a/b/f", ro, Mode::empty()).is_ok());
        assert!(walk(&root, "./a//b/f", ro, Mode::empty()).is_ok());
        assert_eq!(
            walk(&root, "a/link/passwd", ro, Mode::empty()).unwrap_err(),
            Errno::LOOP
        );
        assert_eq!(
            walk(&root, "a/flink", ro, Mode::empty()).unwrap_err(),
            Errno::LOOP
        );
        assert_eq!(
            walk(&root, "a/../a/b/f", ro, Mode::empty()).unwrap_err(),
            Errno::XDEV
        );
        assert_eq!(
            walk(&root, "/etc/passwd", ro, Mode::empty()).unwrap_err(),
            Errno::XDEV
        );
        assert_eq!(
            walk(&root, "a/b/f/g", ro, Mode::empty()).unwrap_err(),
            Errno::NOTDIR
        );
    }
}

//! Publishing and reading one file in a directory held open as a descriptor.

use crate::error::{Error, Result};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags};
use rustix::io::Errno;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// Mode of every published spool file: owner read/write, group read.
pub const FILE_MODE: u32 = 0o640;

/// Prefix of temporary names; never a valid request id, so never read.
pub(crate) const TEMP_PREFIX: &str = ".tmp-";

/// What a reader demands of a file before it trusts its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expect {
    /// The uid that must own the file: the producing side.
    pub owner_uid: u32,
    /// Largest size accepted, in bytes.
    pub max_bytes: u64,
    /// When present, the SHA-256 (64 lowercase hex digits) the bytes must have.
    pub sha256: Option<String>,
}

impl Expect {
    /// A file owned by `owner_uid` of at most `max_bytes`, whatever its
    /// digest.
    pub fn owned_by(owner_uid: u32, max_bytes: u64) -> Self {
        Expect {
            owner_uid,
            max_bytes,
            sha256: None,
        }
    }
}

pub(crate) fn io(e: Errno) -> std::io::Error {
    std::io::Error::from(e)
}

/// Opens a directory without following a symlink in its last component.
pub(crate) fn open_dir(path: &Path) -> Result<OwnedFd> {
    rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| Error::OpenDir {
        path: path.to_owned(),
        source: io(e),
    })
}

fn temp_name() -> String {
    let mut bytes = [0u8; 12];
    // A failing getrandom leaves zeros; O_EXCL still refuses a collision.
    let _ = getrandom::getrandom(&mut bytes);
    format!("{TEMP_PREFIX}{}", hex::encode(bytes))
}

/// The write stages of a publication, each of which a test build can make
/// fail ([`fail_at`]): the temporary file written, synced, renamed into
/// place, and the directory synced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// The bytes are in the temporary file, and the write reports an error.
    Write,
    /// The temporary file was synced, and the sync reports an error.
    Sync,
    /// The rename into place fails (nothing is moved).
    Rename,
    /// The rename happened, and the directory's sync reports an error.
    SyncDir,
}

#[cfg(test)]
thread_local! {
    /// The stage this thread's next publications fail at.
    static FAIL_AT: std::cell::Cell<Option<Stage>> = const { std::cell::Cell::new(None) };
}

/// Test builds only: makes this thread's publications fail at `stage`
/// (`None`: at none).
#[cfg(test)]
pub(crate) fn fail_at(stage: Option<Stage>) {
    FAIL_AT.with(|f| f.set(stage));
}

/// The failure a test asked `stage` to have; nothing in other builds.
fn fault(stage: Stage) -> std::io::Result<()> {
    #[cfg(test)]
    if FAIL_AT.with(std::cell::Cell::get) == Some(stage) {
        return Err(std::io::Error::other(format!(
            "injected failure at {stage:?}"
        )));
    }
    let _ = stage;
    Ok(())
}

/// Publishes `bytes` as `name` in the directory `dir` (shown as `dir_path`):
/// a fresh temporary file (O_EXCL, O_NOFOLLOW, mode 0640) is written and
/// fsynced, renamed into place without replacing anything, and the
/// directory is fsynced. A reader therefore sees the whole file or nothing.
/// A failure before the rename removes the temporary file and leaves the
/// directory as it was; a failed directory sync after it is reported
/// (the file is in place, its durability unconfirmed).
pub(crate) fn publish_at(
    dir: BorrowedFd<'_>,
    dir_path: &Path,
    name: &str,
    bytes: &[u8],
    staged: &mut dyn FnMut(),
) -> Result<PathBuf> {
    let final_path = dir_path.join(name);
    let temp = temp_name();
    let temp_path = dir_path.join(&temp);
    let fd = rustix::fs::openat(
        dir,
        temp.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(FILE_MODE),
    )
    .map_err(|e| Error::CreateTemp {
        path: dir_path.to_owned(),
        source: io(e),
    })?;
    let cleanup = |err: Error| {
        let _ = rustix::fs::unlinkat(dir, temp.as_str(), AtFlags::empty());
        err
    };
    // The umask may have narrowed the mode; state it exactly.
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(FILE_MODE)).map_err(|e| {
        cleanup(Error::Write {
            path: temp_path.clone(),
            source: io(e),
        })
    })?;
    let mut file = File::from(fd);
    file.write_all(bytes)
        .and_then(|()| fault(Stage::Write))
        .map_err(|e| {
            cleanup(Error::Write {
                path: temp_path.clone(),
                source: e,
            })
        })?;
    file.sync_all()
        .and_then(|()| fault(Stage::Sync))
        .map_err(|e| {
            cleanup(Error::Sync {
                path: temp_path.clone(),
                source: e,
            })
        })?;
    drop(file);
    staged();
    if let Err(e) = fault(Stage::Rename) {
        return Err(cleanup(Error::Rename {
            path: final_path,
            source: e,
        }));
    }
    match rustix::fs::renameat_with(dir, temp.as_str(), dir, name, RenameFlags::NOREPLACE) {
        Ok(()) => {}
        Err(Errno::EXIST) => {
            return Err(cleanup(Error::AlreadyPublished { path: final_path }));
        }
        Err(e) => {
            return Err(cleanup(Error::Rename {
                path: final_path,
                source: io(e),
            }));
        }
    }
    rustix::fs::fsync(dir)
        .map_err(io)
        .and_then(|()| fault(Stage::SyncDir))
        .map_err(|e| Error::SyncDir {
            path: dir_path.to_owned(),
            source: e,
        })?;
    Ok(final_path)
}

pub(crate) fn kind_name(ft: FileType) -> &'static str {
    match ft {
        FileType::RegularFile => "regular file",
        FileType::Directory => "directory",
        FileType::Symlink => "symbolic link",
        FileType::Fifo => "FIFO",
        FileType::Socket => "socket",
        FileType::CharacterDevice => "character device",
        FileType::BlockDevice => "block device",
        FileType::Unknown => "unknown",
    }
}

/// Reads `name` in `dir` under the rules of [`Expect`]: opened with
/// O_NOFOLLOW (and O_NONBLOCK, so a FIFO cannot stall the reader), checked
/// on the opened descriptor to be a regular, singly-linked file of the
/// expected owner and bounded size, read with the bound enforced again
/// while reading, and digest-verified.
pub(crate) fn read_at(
    dir: BorrowedFd<'_>,
    dir_path: &Path,
    name: &str,
    expect: &Expect,
) -> Result<Vec<u8>> {
    let path = dir_path.join(name);
    let fd = match rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Err(Error::Missing { path }),
        Err(Errno::LOOP) => return Err(Error::Symlink { path }),
        Err(e) => {
            return Err(Error::Open {
                path,
                source: io(e),
            });
        }
    };
    let st = rustix::fs::fstat(&fd).map_err(|e| Error::Stat {
        path: path.clone(),
        source: io(e),
    })?;
    let ft = FileType::from_raw_mode(st.st_mode);
    if ft != FileType::RegularFile {
        return Err(Error::NotRegular {
            path,
            kind: kind_name(ft),
        });
    }
    if st.st_uid != expect.owner_uid {
        return Err(Error::WrongOwner {
            path,
            uid: st.st_uid,
            expected: expect.owner_uid,
        });
    }
    #[allow(clippy::useless_conversion)]
    let nlink = u64::from(st.st_nlink);
    if nlink != 1 {
        return Err(Error::Linked { path, nlink });
    }
    let size = u64::try_from(st.st_size).unwrap_or(u64::MAX);
    if size > expect.max_bytes {
        return Err(Error::TooLarge {
            path,
            max: expect.max_bytes,
        });
    }
    // Clear O_NONBLOCK now that the file is known to be regular.
    let _ = rustix::fs::fcntl_setfl(&fd, OFlags::empty());
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    File::from(fd)
        .take(expect.max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| Error::Read {
            path: path.clone(),
            source: e,
        })?;
    if bytes.len() as u64 > expect.max_bytes {
        return Err(Error::TooLarge {
            path,
            max: expect.max_bytes,
        });
    }
    if let Some(expected) = &expect.sha256 {
        let actual = hex::encode(Sha256::digest(&bytes));
        if &actual != expected {
            return Err(Error::DigestMismatch {
                path,
                expected: expected.clone(),
                actual,
            });
        }
    }
    Ok(bytes)
}

fn split(path: &Path) -> Result<(&Path, &str)> {
    let invalid = || Error::InvalidName {
        name: path.display().to_string(),
    };
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(invalid)?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    Ok((parent, name))
}

/// Publishes `bytes` at an arbitrary `path` with the same atomic protocol
/// as the spool (for `run-once` and tests). The parent directory is the
/// caller's choice; the final component is never followed or replaced.
pub fn publish_path(path: &Path, bytes: &[u8]) -> Result<PathBuf> {
    let (parent, name) = split(path)?;
    let dir = open_dir(parent)?;
    publish_at(dir.as_fd(), parent, name, bytes, &mut || {})
}

/// Reads an arbitrary `path` under the rules of [`Expect`] (for `run-once`
/// and tests). The final component is never followed.
pub fn read_path(path: &Path, expect: &Expect) -> Result<Vec<u8>> {
    let (parent, name) = split(path)?;
    let dir = open_dir(parent)?;
    read_at(dir.as_fd(), parent, name, expect)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Every name in `dir` with its bytes.
    fn contents(dir: &Path) -> BTreeMap<String, Vec<u8>> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.file_name().to_string_lossy().into_owned(),
                    std::fs::read(e.path()).unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn a_failure_at_each_write_stage_leaves_the_directory_byte_for_byte() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path();
        let dir = open_dir(path).unwrap();
        publish_at(dir.as_fd(), path, "req-1.json", b"the original", &mut || {}).unwrap();
        for stage in [Stage::Write, Stage::Sync, Stage::Rename] {
            // A new name, and the name already published.
            for name in ["req-2.json", "req-1.json"] {
                let before = contents(path);
                fail_at(Some(stage));
                let err =
                    publish_at(dir.as_fd(), path, name, b"the new bytes", &mut || {}).unwrap_err();
                fail_at(None);
                assert!(
                    err.to_string().contains("injected failure"),
                    "{stage:?}: {err}"
                );
                assert_eq!(
                    contents(path),
                    before,
                    "{stage:?} {name}: unchanged, no temporary"
                );
            }
        }
        // After the rename, a failed directory sync is reported; the file
        // is in place whole, and nothing else changed.
        let before = contents(path);
        fail_at(Some(Stage::SyncDir));
        let err = publish_at(
            dir.as_fd(),
            path,
            "req-3.json",
            b"the new bytes",
            &mut || {},
        )
        .unwrap_err();
        fail_at(None);
        assert!(matches!(err, Error::SyncDir { .. }), "{err}");
        let mut after = before;
        after.insert("req-3.json".into(), b"the new bytes".to_vec());
        assert_eq!(contents(path), after);
        // Without a fault it publishes.
        publish_at(dir.as_fd(), path, "req-4.json", b"four", &mut || {}).unwrap();
        assert_eq!(contents(path)["req-4.json"], b"four");
    }
}

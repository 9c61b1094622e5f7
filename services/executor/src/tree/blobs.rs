//! The blob store: every file of the tree cache, by git object id.
//!
//! ```text
//! <work>/blobs/<hex id>     a blob as a file of mode 0644
//! <work>/blobs/<hex id>.x   the same blob as an executable (0755): git keeps
//!                           the mode in the tree, a hard link carries one
//! ```
//!
//! A tree-cache entry ([`super::cache`]) is built on this store: each of
//! its regular files is a hard link to the blob of that id here, so a
//! blob is on disk once however many cached trees hold it, and a new tree
//! made from a held one shares every file that did not change.
//!
//! - **Verified on write.** A blob enters the store only as a file the
//!   executor has just written and hashed to that id itself: from an
//!   archive ([`super::extract`]) or a source delta ([`super::advance`]),
//!   or read back by a full rehash of an entry. Nothing the worker names
//!   is linked in unread.
//! - **Never writable by commands.** It lives in the executor's work root
//!   (mode 0700), which no command's view holds: in the minimal root a
//!   command sees an entry's files only as the read-only lower layer of an
//!   overlay (a write copies the file up first), in the host view a copy.
//! - **Bounded with the cache.** A blob no entry links any more (its link
//!   count is one, the store's own) is removed: at once for the blobs a
//!   source delta replaced ([`BlobStore::release`]), and by a sweep of the
//!   store after the cache evicted or removed an entry
//!   ([`BlobStore::sweep`]). A blob an entry in use links is therefore
//!   never removed.

use super::fs::{open_dir, setup_error};
use crate::error::{Error, Result};
use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// The store in a work root.
#[derive(Debug)]
pub struct BlobStore {
    dir: PathBuf,
    fd: OwnedFd,
}

/// A blob's name in the store: its hex id, `.x` for the executable copy.
pub fn name(oid: &[u8], executable: bool) -> String {
    let mut name = hex::encode(oid);
    if executable {
        name.push_str(".x");
    }
    name
}

impl BlobStore {
    /// Opens (creating, mode 0700) `<work_root>/blobs`. Reads nothing of
    /// what it holds.
    pub fn open(work_root: &Path) -> Result<BlobStore> {
        let dir = work_root.join("blobs");
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(setup_error(e, &dir)),
        }
        let fd = open_dir(&dir)?;
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o700))
            .map_err(|e| setup_error(std::io::Error::from(e), &dir))?;
        Ok(BlobStore { dir, fd })
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Makes `file` (a regular file the executor has just written, or
    /// read back, and hashed to `oid`) the store's copy of that blob: a
    /// hard link, no byte copied. When the store holds a copy already, the
    /// file becomes a link to it once that copy hashes to `oid` (else the
    /// file replaces it), so every file of the cache is its store's copy.
    /// `true` when `file` became the store's copy.
    pub fn adopt(&self, file: &Path, oid: &[u8], executable: bool) -> Result<bool> {
        let (parent, name) = match (file.parent(), file.file_name()) {
            (Some(p), Some(n)) => (p, n.to_string_lossy().into_owned()),
            _ => return Err(setup_error("not a file's path", file)),
        };
        let dir = open_dir(parent)?;
        self.adopt_at(&dir, &name, oid, executable)
    }

    /// [`BlobStore::adopt`] for the file `name` in the directory `dir`
    /// (as the extraction just wrote it, no path walked again).
    pub fn adopt_at(
        &self,
        dir: &OwnedFd,
        name: &str,
        oid: &[u8],
        executable: bool,
    ) -> Result<bool> {
        let blob = self::name(oid, executable);
        let fail = |e: Errno| setup_error(std::io::Error::from(e), &self.dir.join(&blob));
        match rustix::fs::linkat(dir, name, &self.fd, blob.as_str(), AtFlags::empty()) {
            Ok(()) => Ok(true),
            Err(Errno::EXIST) if self.same_file(dir, name, &blob) => Ok(false),
            Err(Errno::EXIST) if self.holds(&blob, oid, executable) => {
                // Ours goes: a link to the store's copy takes its place.
                let tmp = format!(".adopt-{name}");
                match rustix::fs::linkat(
                    &self.fd,
                    blob.as_str(),
                    dir,
                    tmp.as_str(),
                    AtFlags::empty(),
                ) {
                    Ok(()) => {
                        rustix::fs::renameat(dir, tmp.as_str(), dir, name).map_err(fail)?;
                        Ok(false)
                    }
                    // Linked as often as the file system allows: ours stays.
                    Err(Errno::MLINK) => Ok(false),
                    Err(e) => Err(fail(e)),
                }
            }
            Err(Errno::EXIST) => {
                // The store's copy is not that blob (a power loss took its
                // data): ours replaces it.
                rustix::fs::unlinkat(&self.fd, blob.as_str(), AtFlags::empty()).map_err(fail)?;
                rustix::fs::linkat(dir, name, &self.fd, blob.as_str(), AtFlags::empty())
                    .map_err(fail)?;
                Ok(true)
            }
            Err(Errno::MLINK) => Ok(false),
            Err(e) => Err(fail(e)),
        }
    }

    /// Whether `name` in `dir` is the store's `blob` already (one inode).
    fn same_file(&self, dir: &OwnedFd, name: &str, blob: &str) -> bool {
        let flags = AtFlags::SYMLINK_NOFOLLOW;
        match (
            rustix::fs::statat(dir, name, flags),
            rustix::fs::statat(&self.fd, blob, flags),
        ) {
            (Ok(a), Ok(b)) => (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino),
            _ => false,
        }
    }

    /// Whether the store's `name` is a regular file of the right mode that
    /// hashes to `oid` (read whole).
    fn holds(&self, name: &str, oid: &[u8], executable: bool) -> bool {
        let Ok(fd) = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) else {
            return false;
        };
        let mut file = std::fs::File::from(fd);
        let Ok(meta) = file.metadata() else {
            return false;
        };
        use std::os::unix::fs::PermissionsExt;
        if !meta.is_file() || (meta.permissions().mode() & 0o111 != 0) != executable {
            return false;
        }
        let Some(format) = airlock_proto::tree::ObjectFormat::of_id(&hex::encode(oid)) else {
            return false;
        };
        airlock_proto::tree::read_blob_id(format, meta.len(), &mut file).is_ok_and(|id| id == oid)
    }

    /// Links the store's copy of `oid` as `name` in the directory `dir`
    /// (an entry's), once it hashes to `oid`: a blob a source delta names
    /// but leaves out, the base holding it at another path. `false` when
    /// the store holds no such copy; TREE_CACHE_CORRUPT when its copy no
    /// longer hashes to its id.
    pub fn link_at(&self, oid: &[u8], executable: bool, dir: &OwnedFd, name: &str) -> Result<bool> {
        let blob = self::name(oid, executable);
        if !self.holds(&blob, oid, executable) {
            return match rustix::fs::statat(&self.fd, blob.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Err(Errno::NOENT) => Ok(false),
                _ => Err(Error::CacheCorrupt(format!(
                    "blob {blob} no longer hashes to its id"
                ))),
            };
        }
        let fail = |e: std::io::Error| setup_error(e, &self.dir.join(&blob));
        match rustix::fs::linkat(&self.fd, blob.as_str(), dir, name, AtFlags::empty()) {
            Ok(()) => Ok(true),
            Err(Errno::EXIST) => Err(Error::ArchivePath {
                path: name.to_owned(),
                why: "duplicate member",
            }),
            // Linked as often as the file system allows: a copy of its own.
            Err(Errno::MLINK) => {
                let from = rustix::fs::openat(
                    &self.fd,
                    blob.as_str(),
                    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| fail(e.into()))?;
                let to = rustix::fs::openat(
                    dir,
                    name,
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(if executable { 0o755 } else { 0o644 }),
                )
                .map_err(|e| fail(e.into()))?;
                std::io::copy(&mut std::fs::File::from(from), &mut std::fs::File::from(to))
                    .map_err(fail)?;
                Ok(true)
            }
            Err(e) => Err(fail(e.into())),
        }
    }

    /// Removes the store's copies of `blobs` that no entry links any more.
    /// Returns how many went.
    pub fn release(&self, blobs: impl IntoIterator<Item = (Vec<u8>, bool)>) -> u64 {
        blobs
            .into_iter()
            .filter(|(oid, x)| self.unlink_if_unused(&name(oid, *x)))
            .count() as u64
    }

    /// Removes every copy no entry links any more, and whatever else is
    /// not a blob's name; returns how many files and bytes went. O(the
    /// store): after an entry was evicted or removed, never at start-up.
    pub fn sweep(&self) -> (u64, u64) {
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return (0, 0);
        };
        let (mut files, mut bytes) = (0, 0);
        for entry in dir.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let size = entry.metadata().map(|m| m.len()).unwrap_or(0);
            let unused = if is_blob_name(&name) {
                self.unlink_if_unused(&name)
            } else {
                rustix::fs::unlinkat(&self.fd, name.as_str(), AtFlags::empty()).is_ok()
            };
            if unused {
                files += 1;
                bytes += size;
            }
        }
        (files, bytes)
    }

    fn unlink_if_unused(&self, name: &str) -> bool {
        match rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if st.st_nlink <= 1 => {
                rustix::fs::unlinkat(&self.fd, name, AtFlags::empty()).is_ok()
            }
            _ => false,
        }
    }

    /// How many links the store's copy of a blob has (0: not held): for
    /// tests and diagnostics.
    pub fn links(&self, oid: &[u8], executable: bool) -> u64 {
        rustix::fs::statat(
            self.fd.as_fd(),
            name(oid, executable),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map(|st| st.st_nlink)
        .unwrap_or(0)
    }
}

/// `<hex id>` or `<hex id>.x`, the id of either object format.
fn is_blob_name(name: &str) -> bool {
    let id = name.strip_suffix(".x").unwrap_or(name);
    airlock_proto::tree::ObjectFormat::of_id(id).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A blob's raw id (SHA-1).
    fn id(content: &[u8]) -> Vec<u8> {
        airlock_proto::tree::object_id(airlock_proto::tree::ObjectFormat::Sha1, "blob", content)
    }

    #[test]
    fn a_blob_is_held_once_and_goes_when_nothing_links_it() {
        let work = tempfile::tempdir().unwrap();
        let store = BlobStore::open(work.path()).unwrap();
        let oid = id(b"x");
        let ino = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
        let (a, b, c) = (
            work.path().join("a"),
            work.path().join("b"),
            work.path().join("c"),
        );
        for f in [&a, &b, &c] {
            std::fs::write(f, b"x").unwrap();
        }
        assert!(store.adopt(&a, &oid, false).unwrap());
        assert!(!store.adopt(&a, &oid, false).unwrap(), "adopted already");
        // Held already: b becomes a link to the store's copy.
        assert!(!store.adopt(&b, &oid, false).unwrap());
        assert_eq!(ino(&a), ino(&b));
        assert_eq!(store.links(&oid, false), 3);
        assert_eq!(
            std::fs::read_dir(work.path()).unwrap().count(),
            4,
            "no temporary left"
        );
        // The executable copy is another.
        assert!(store.adopt(&c, &oid, true).unwrap());
        assert_ne!(ino(&a), ino(&c));
        // Linked by an entry: kept.
        assert_eq!(store.release([(oid.clone(), false)]), 0);
        std::fs::remove_file(&a).unwrap();
        std::fs::remove_file(&b).unwrap();
        assert_eq!(store.release([(oid.clone(), false)]), 1);
        assert_eq!(store.links(&oid, false), 0);
        // A sweep takes what nothing links and what is not a blob.
        std::fs::write(store.dir().join("stray"), b"?").unwrap();
        std::fs::remove_file(&c).unwrap();
        assert_eq!(store.sweep(), (2, 2));
        assert_eq!(std::fs::read_dir(store.dir()).unwrap().count(), 0);
    }

    #[test]
    fn a_copy_that_no_longer_hashes_to_its_id_is_replaced_and_never_linked() {
        let work = tempfile::tempdir().unwrap();
        let store = BlobStore::open(work.path()).unwrap();
        let oid = id(b"x");
        let a = work.path().join("a");
        std::fs::write(&a, b"x").unwrap();
        assert!(store.adopt(&a, &oid, false).unwrap());
        // Torn behind the executor's back (a power loss, a write).
        std::fs::remove_file(&a).unwrap();
        std::fs::write(store.dir().join(name(&oid, false)), b"y").unwrap();
        let dir = rustix::fs::open(
            work.path(),
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
        )
        .unwrap();
        assert!(matches!(
            store.link_at(&oid, false, &dir, "linked"),
            Err(Error::CacheCorrupt(_))
        ));
        assert!(!work.path().join("linked").exists());
        // A fresh file of that blob takes its place.
        std::fs::write(&a, b"x").unwrap();
        assert!(store.adopt(&a, &oid, false).unwrap());
        assert!(store.link_at(&oid, false, &dir, "linked").unwrap());
        assert_eq!(std::fs::read(work.path().join("linked")).unwrap(), b"x");
        // Nothing held: no link, no error.
        let other = id(b"z");
        assert!(!store.link_at(&other, false, &dir, "none").unwrap());
    }

    #[test]
    fn a_blob_linked_as_often_as_the_file_system_allows_is_copied_instead() {
        let work = tempfile::tempdir().unwrap();
        let store = BlobStore::open(work.path()).unwrap();
        let oid = id(b"");
        let ino = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
        let first = work.path().join("first");
        std::fs::write(&first, b"").unwrap();
        assert!(store.adopt(&first, &oid, false).unwrap());
        // Link the store's copy until the file system refuses (ext4: 65,000).
        let many = work.path().join("many");
        std::fs::create_dir(&many).unwrap();
        let held = store.dir().join(name(&oid, false));
        let mut n = 0u32;
        let refused = loop {
            match std::fs::hard_link(&held, many.join(n.to_string())) {
                Ok(()) => n += 1,
                Err(e) => break e,
            }
            assert!(n < 1_000_000, "this file system has no link limit to test");
        };
        assert_eq!(refused.raw_os_error(), Some(libc::EMLINK), "{refused}");

        // A new file of that blob stays a file of its own.
        let second = work.path().join("second");
        std::fs::write(&second, b"").unwrap();
        assert!(!store.adopt(&second, &oid, false).unwrap());
        assert_ne!(ino(&second), ino(&held));
        assert_eq!(
            std::fs::read_dir(work.path()).unwrap().count(),
            4,
            "no temporary left"
        );
        // Linked from the store for a delta: a copy of the same content.
        let dir = rustix::fs::open(
            work.path(),
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
        )
        .unwrap();
        assert!(store.link_at(&oid, false, &dir, "copied").unwrap());
        let copied = work.path().join("copied");
        assert_ne!(ino(&copied), ino(&held));
        assert_eq!(std::fs::read(&copied).unwrap(), b"");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&copied).unwrap().permissions().mode() & 0o777,
            0o644
        );
    }
}

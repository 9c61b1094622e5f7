//! Safe extraction of the source archive (plain tar or tar.gz) into a
//! fresh workspace.
//!
//! The `tar` crate only parses: it yields one header at a time and this
//! module decides, then writes the file itself beneath the workspace root
//! (openat2, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
//! O_CREAT | O_EXCL). `unpack` is never used. Refusals, in the order they
//! are checked for each member:
//!
//! | check | code |
//! |---|---|
//! | more than `max_entries` members | SOURCE_ARCHIVE_LIMIT_EXCEEDED |
//! | path absolute, with `..`, `.git`, `.`, empty or control characters, duplicate | SOURCE_ARCHIVE_PATH_INVALID |
//! | hard link; a symbolic link with an empty target or one over 4 KiB | SOURCE_ARCHIVE_LINK_DENY |
//! | device, FIFO, sparse or other special member; setuid/setgid/sticky bits | SOURCE_ARCHIVE_MEMBER_DENY |
//! | a member over `max_file_bytes`, the sum over `max_total_bytes` | SOURCE_ARCHIVE_LIMIT_EXCEEDED |
//! | more decompressed bytes than `max_expansion_ratio` × archive size (1 MiB floor) | SOURCE_ARCHIVE_LIMIT_EXCEEDED |
//!
//! A symbolic link is made as the tree has it, whatever its target names:
//! it is the repository's. It is created beneath the root like a file
//! (its parent resolved with RESOLVE_NO_SYMLINKS, so no member is ever
//! written through a link), and never followed here or later by the
//! executor; what a command reaches through it is the sandbox's to govern
//! (docs/privsep/workspace.md).
//!
//! Credential-like paths (`.env`, `.ssh/`, keys, …) are withheld: they are
//! not written into the workspace, so no verification command can print
//! them into evidence that flows back to the planner, unless the policy
//! allows them.
//!
//! Every member's content is hashed as a git blob on the way (withheld ones
//! too), and the entries an archive carries as metadata only (the pax
//! global header's `airlock.tree-entry.N` records: symlinks, submodules)
//! are added, so that the git tree id of what was extracted is known at
//! the end ([`Extracted::tree`]); the tree cache accepts an archive only
//! when it is the request's.
//!
//! It is the tree wing's: what it writes into is a tree-cache entry being
//! filled ([`super::TreeCache::fill`]), each file adopted by the blob store
//! ([`super::blobs`]); a source delta's writes ([`super::advance`]) use its
//! member writers.

use super::blobs::BlobStore;
use crate::apply::CredentialPolicy;
use crate::beneath;
use crate::error::{Error, Result};
use airlock_proto::path::check_relative_path;
use airlock_proto::tree::{ObjectFormat, PAX_KEY_PREFIX, TreeBuilder, TreeEntry, blob_hasher};
use rustix::fd::OwnedFd;
use rustix::fs::OFlags;
use std::cell::Cell;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::rc::Rc;

/// Bounds on what an archive may contain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArchiveLimits {
    /// Most members (directories and pax headers included).
    pub max_entries: u64,
    /// Largest single file.
    pub max_file_bytes: u64,
    /// Largest sum of file sizes.
    pub max_total_bytes: u64,
    /// Largest ratio of decompressed bytes to archive bytes.
    pub max_expansion_ratio: u64,
}

/// Decompressed bytes always allowed, whatever the ratio, so that a tiny
/// archive's block padding is not mistaken for a bomb.
pub const EXPANSION_FLOOR: u64 = 1 << 20;

/// What an extraction wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Extracted {
    /// Regular files written.
    pub files: u64,
    /// Symbolic links made.
    pub symlinks: u64,
    /// Directories created.
    pub dirs: u64,
    /// Sum of file sizes.
    pub bytes: u64,
    /// Credential-like paths that were not written.
    pub withheld: Vec<String>,
    /// Entries of the tree not present as files: the archive's metadata
    /// records and the withheld files (to recompute the tree id later).
    pub extras: Vec<TreeEntry>,
    /// The git tree id of everything the archive holds.
    pub tree: String,
    /// Its tree objects, `(raw id, content)`.
    pub tree_objects: Vec<airlock_proto::tree::RawObject>,
}

/// Counts decompressed bytes and fails once `limit` is passed.
struct Counted<R> {
    inner: R,
    count: u64,
    limit: u64,
    tripped: Rc<Cell<bool>>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count += n as u64;
        if self.count > self.limit {
            self.tripped.set(true);
            return Err(io::Error::other("expansion limit"));
        }
        Ok(n)
    }
}

/// Extracts `archive` (in memory) beneath `root`, computing the git tree id
/// of its content in `format`; each file written is adopted by `store`
/// under its blob id, when there is one.
pub fn extract(
    archive: &[u8],
    root: &OwnedFd,
    limits: &ArchiveLimits,
    credentials: &CredentialPolicy,
    format: ObjectFormat,
    store: Option<&BlobStore>,
) -> Result<Extracted> {
    let mut x = Extraction {
        root,
        limits,
        credentials,
        format,
        store,
        tree: TreeBuilder::new(format),
        out: Extracted::default(),
        tripped: Rc::new(Cell::new(false)),
        limit: (archive.len() as u64)
            .saturating_mul(limits.max_expansion_ratio)
            .max(EXPANSION_FLOOR),
        archive_bytes: archive.len(),
    };
    let gzip = archive.starts_with(&[0x1f, 0x8b]);
    let inner: Box<dyn Read> = if gzip {
        Box::new(flate2::read::GzDecoder::new(archive))
    } else {
        Box::new(archive)
    };
    let reader = Counted {
        inner,
        count: 0,
        limit: x.limit,
        tripped: x.tripped.clone(),
    };
    let mut tar = tar::Archive::new(reader);
    let entries = tar.entries().map_err(|e| x.malformed(e))?;
    let mut seen: u64 = 0;
    for entry in entries {
        let entry = entry.map_err(|e| x.malformed(e))?;
        seen += 1;
        if seen > limits.max_entries {
            return Err(Error::ArchiveLimit(format!(
                "more than {} entries",
                limits.max_entries
            )));
        }
        x.member(entry)?;
    }
    if x.tripped.get() {
        return Err(x.bomb());
    }
    let mut out = x.out;
    (out.tree, out.tree_objects) = x.tree.finish_with_objects();
    Ok(out)
}

/// One extraction under way: where it writes, its bounds, what it has
/// written and hashed so far.
struct Extraction<'a> {
    root: &'a OwnedFd,
    limits: &'a ArchiveLimits,
    credentials: &'a CredentialPolicy,
    format: ObjectFormat,
    store: Option<&'a BlobStore>,
    tree: TreeBuilder,
    out: Extracted,
    /// Set once more than `limit` bytes were decompressed.
    tripped: Rc<Cell<bool>>,
    limit: u64,
    archive_bytes: usize,
}

impl Extraction<'_> {
    /// The archive expands beyond its bound.
    fn bomb(&self) -> Error {
        Error::ArchiveLimit(format!(
            "expands beyond {} bytes ({}x the {}-byte archive)",
            self.limit, self.limits.max_expansion_ratio, self.archive_bytes
        ))
    }

    /// A read that failed: the bound, when it tripped, else a malformed
    /// archive.
    fn malformed(&self, e: io::Error) -> Error {
        if self.tripped.get() {
            self.bomb()
        } else {
            Error::ArchiveInvalid(format!("not a readable tar archive: {e}"))
        }
    }

    /// One member, checked in the order of the module's table.
    fn member(&mut self, mut entry: tar::Entry<'_, impl Read>) -> Result<()> {
        let kind = entry.header().entry_type();
        if kind == tar::EntryType::XGlobalHeader {
            return self.records(&mut entry);
        }
        let raw = entry.path_bytes().into_owned();
        let path = member_path(&raw, kind.is_dir())?;
        match kind {
            tar::EntryType::Symlink => return self.symlink(&entry, path),
            tar::EntryType::Link => {
                return Err(Error::ArchiveLink {
                    path,
                    kind: "hard link",
                });
            }
            tar::EntryType::Regular | tar::EntryType::Directory => {}
            other => {
                return Err(Error::ArchiveMember {
                    path,
                    why: format!("{} member", type_name(other)),
                });
            }
        }
        let mode = entry.header().mode().map_err(|e| self.malformed(e))?;
        if mode & 0o7000 != 0 {
            return Err(Error::ArchiveMember {
                path,
                why: format!("mode {mode:o} has setuid, setgid or sticky bits"),
            });
        }
        if kind == tar::EntryType::Directory {
            if !self.credentials.denies(&path) {
                beneath::dir(self.root, &path, true)?;
                self.out.dirs += 1;
            }
            return Ok(());
        }
        let size = entry.header().size().map_err(|e| self.malformed(e))?;
        if self.credentials.denies(&path) {
            return self.withhold(&mut entry, path, mode, size);
        }
        self.file(&mut entry, &path, mode, size)
    }

    /// No file: the tree's entries that are not files (and git archive's
    /// commit id comment, ignored).
    fn records(&mut self, entry: &mut tar::Entry<'_, impl Read>) -> Result<()> {
        let records = entry
            .pax_extensions()
            .map_err(|e| self.malformed(e))?
            .into_iter()
            .flatten();
        for record in records {
            let record = record.map_err(|e| self.malformed(e))?;
            if record.key_bytes().starts_with(PAX_KEY_PREFIX.as_bytes()) {
                let e = TreeEntry::from_pax(record.value_bytes())
                    .map_err(|e| Error::ArchiveInvalid(e.to_string()))?;
                check_relative_path(&e.path).map_err(|_| Error::ArchivePath {
                    path: e.path.clone(),
                    why: "not a clean relative path",
                })?;
                self.tree
                    .add_entry(&e)
                    .map_err(|e| Error::ArchiveInvalid(e.to_string()))?;
                self.out.extras.push(e);
            }
        }
        Ok(())
    }

    /// A symbolic link: made as the tree has it, or withheld.
    fn symlink(&mut self, entry: &tar::Entry<'_, impl Read>, path: String) -> Result<()> {
        let target = entry
            .link_name_bytes()
            .map(|t| t.into_owned())
            .unwrap_or_default();
        if target.is_empty() || target.len() > MAX_LINK_TARGET {
            return Err(Error::ArchiveLink {
                path,
                kind: "symbolic link with an empty or over-long target",
            });
        }
        let mut h = blob_hasher(self.format, target.len() as u64);
        h.update(&target);
        let oid = h.finish();
        self.tree
            .add(&path, 0o120000, oid.clone())
            .map_err(|e| Error::ArchiveInvalid(e.to_string()))?;
        if self.credentials.denies(&path) {
            self.out.extras.push(TreeEntry {
                mode: 0o120000,
                oid: hex::encode(oid),
                path: path.clone(),
            });
            self.out.withheld.push(path);
        } else {
            make_link(self.root, &path, &target)?;
            self.out.symlinks += 1;
        }
        Ok(())
    }

    /// A credential-like file: not written, but part of the tree all the
    /// same.
    fn withhold(
        &mut self,
        entry: &mut impl Read,
        path: String,
        mode: u32,
        size: u64,
    ) -> Result<()> {
        let git_mode = if mode & 0o111 != 0 {
            0o100755
        } else {
            0o100644
        };
        let mut hasher = Hashing {
            inner: entry.take(size),
            hasher: blob_hasher(self.format, size),
        };
        io::copy(&mut hasher, &mut io::sink()).map_err(|e| self.malformed(e))?;
        let oid = hasher.hasher.finish();
        self.tree
            .add(&path, git_mode, oid.clone())
            .map_err(|e| Error::ArchiveInvalid(e.to_string()))?;
        self.out.extras.push(TreeEntry {
            mode: git_mode,
            oid: hex::encode(oid),
            path: path.clone(),
        });
        self.out.withheld.push(path);
        Ok(())
    }

    /// A regular file within the bounds: written beneath the root, hashed
    /// on the way, adopted by the blob store.
    fn file(&mut self, entry: &mut impl Read, path: &str, mode: u32, size: u64) -> Result<()> {
        if size > self.limits.max_file_bytes {
            return Err(Error::ArchiveLimit(format!(
                "{path}: {size} bytes, more than {}",
                self.limits.max_file_bytes
            )));
        }
        self.out.bytes = self.out.bytes.saturating_add(size);
        if self.out.bytes > self.limits.max_total_bytes {
            return Err(Error::ArchiveLimit(format!(
                "more than {} bytes of files",
                self.limits.max_total_bytes
            )));
        }
        let executable = mode & 0o111 != 0;
        let mut hashing = Hashing {
            inner: entry,
            hasher: blob_hasher(self.format, size),
        };
        let bomb = || self.bomb();
        let dir = write_member(
            self.root,
            path,
            mode,
            size,
            &mut hashing,
            &self.tripped,
            &bomb,
        )?;
        let oid = hashing.hasher.finish();
        if let Some(store) = self.store {
            store.adopt_at(&dir, beneath::split(path).1, &oid, executable)?;
        }
        self.tree
            .add(path, if executable { 0o100755 } else { 0o100644 }, oid)
            .map_err(|e| Error::ArchiveInvalid(e.to_string()))?;
        self.out.files += 1;
        Ok(())
    }
}

/// The longest symbolic link target an archive may carry (PATH_MAX less
/// its NUL).
pub(crate) const MAX_LINK_TARGET: usize = 4095;

/// Makes the symbolic link `path` → `target` beneath `root`, its parents
/// created as directories (never through a link).
pub(crate) fn make_link(root: &OwnedFd, path: &str, target: &[u8]) -> Result<()> {
    let (dir, name) = beneath::parent_for_create(root, path)?;
    let target = std::ffi::OsStr::from_bytes(target);
    match rustix::fs::symlinkat(target, &dir, name) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::EXIST) => Err(Error::ArchivePath {
            path: path.to_owned(),
            why: "duplicate member",
        }),
        Err(e) => Err(beneath::classify(path, e)),
    }
}

/// Passes bytes through while hashing them as a git blob.
struct Hashing<R> {
    inner: R,
    hasher: airlock_proto::tree::ObjectHasher,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// Writes the file `path` beneath `root` from `entry`; returns its
/// directory, opened.
pub(crate) fn write_member(
    root: &OwnedFd,
    path: &str,
    mode: u32,
    size: u64,
    entry: &mut impl Read,
    tripped: &Cell<bool>,
    bomb: &dyn Fn() -> Error,
) -> Result<OwnedFd> {
    let (dir, name) = beneath::parent_for_create(root, path)?;
    let file_mode = if mode & 0o111 != 0 { 0o755 } else { 0o644 };
    let fd = match beneath::openat2_beneath(
        &dir,
        name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        rustix::fs::Mode::from_raw_mode(file_mode),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::EXIST) => {
            return Err(Error::ArchivePath {
                path: path.to_owned(),
                why: "duplicate member",
            });
        }
        Err(e) => return Err(beneath::classify(path, e)),
    };
    let mut file = std::fs::File::from(fd);
    let copied = io::copy(&mut entry.take(size), &mut file).map_err(|e| {
        if tripped.get() {
            bomb()
        } else {
            Error::ArchiveInvalid(format!("{path}: {e}"))
        }
    })?;
    if copied != size {
        return Err(Error::ArchiveInvalid(format!(
            "{path}: truncated member ({copied} of {size} bytes)"
        )));
    }
    Ok(dir)
}

/// Validates a member's stored path: UTF-8, relative, no `..`, no `.git`,
/// no `.` or empty components (a directory's one trailing slash aside).
fn member_path(raw: &[u8], is_dir: bool) -> Result<String> {
    let shown = String::from_utf8_lossy(raw).into_owned();
    let bad = |why| Error::ArchivePath {
        path: shown.clone(),
        why,
    };
    let text = std::str::from_utf8(raw).map_err(|_| bad("not UTF-8"))?;
    if text.starts_with('/') {
        return Err(bad("absolute path"));
    }
    let text = if is_dir {
        text.strip_suffix('/').unwrap_or(text)
    } else {
        text
    };
    for component in text.split('/') {
        if component == ".." {
            return Err(bad("'..' component"));
        }
        if component.eq_ignore_ascii_case(".git") {
            return Err(bad("'.git' component"));
        }
    }
    check_relative_path(text).map_err(|_| bad("not a clean relative path"))?;
    Ok(text.to_owned())
}

fn type_name(kind: tar::EntryType) -> &'static str {
    match kind {
        tar::EntryType::Char => "character device",
        tar::EntryType::Block => "block device",
        tar::EntryType::Fifo => "FIFO",
        tar::EntryType::Continuous => "contiguous-file",
        tar::EntryType::GNUSparse => "sparse file",
        tar::EntryType::XHeader | tar::EntryType::GNULongName | tar::EntryType::GNULongLink => {
            "stray extension header"
        }
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_paths_are_checked_component_by_component() {
        assert_eq!(member_path(b"src/lib.rs", false).unwrap(), "src/lib.rs");
        assert_eq!(member_path(b"src/", true).unwrap(), "src");
        for (bad, why) in [
            (&b"/etc/passwd"[..], "absolute path"),
            (b"a/../../b", "'..' component"),
            (b"..", "'..' component"),
            (b"x/.git/hooks/pre-commit", "'.git' component"),
            (b".GIT/config", "'.git' component"),
            (b"./a", "not a clean relative path"),
            (b"a//b", "not a clean relative path"),
            (b"a\xffb", "not UTF-8"),
        ] {
            match member_path(bad, false) {
                Err(Error::ArchivePath { why: got, .. }) => assert_eq!(got, why, "{bad:?}"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }
}

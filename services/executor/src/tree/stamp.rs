//! How an entry is checked: its stamp (a stat of every path, no read),
//! and hashing it in full (every file read as a git blob) when the stamp
//! cannot be trusted — sealed before this boot, or by an earlier release.

use super::fs::{setup_error, walk};
use super::seal::Seal;
use crate::error::Result;
use airlock_proto::tree::{ObjectFormat, RawObject, TreeBuilder, read_blob_id};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The stamp of an entry: over `tree/` and `objects/` and every path
/// beneath them, each with its mode (type included), inode, size, owner
/// and change time; reads no file. A sum of one SHA-256 per path (mod
/// 2^256), so that a delta that changes a few paths updates it by those
/// alone ([`Stamp::sub`], [`Stamp::add`]) and it stays equal to what a
/// walk of the whole entry gives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stamp([u64; 4]);

impl Stamp {
    fn line(rel: &Path, m: &std::fs::Metadata) -> [u64; 4] {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        h.update(b"airlock.tree-cache-stamp.v3\0");
        h.update(rel.as_os_str().as_encoded_bytes());
        // A file's inode is the blob store's and other entries' too, and
        // its change time moves whenever one of them links or unlinks it:
        // a file is stamped by its modification time instead, which only
        // a write or its owner's explicit setting moves.
        let (time, nsec) = if m.is_file() {
            (m.mtime(), m.mtime_nsec())
        } else {
            (m.ctime(), m.ctime_nsec())
        };
        h.update(
            format!(
                "\0{:o} {} {} {} {} {time}.{nsec:09}",
                m.mode(),
                m.ino(),
                m.len(),
                m.uid(),
                m.gid(),
            )
            .as_bytes(),
        );
        let d = h.finalize();
        std::array::from_fn(|i| {
            u64::from_le_bytes(d[i * 8..i * 8 + 8].try_into().unwrap_or_default())
        })
    }

    /// Counts `rel` (relative to the entry) as it is.
    pub fn add(&mut self, rel: &Path, m: &std::fs::Metadata) {
        let l = Self::line(rel, m);
        let mut carry = false;
        for (x, y) in self.0.iter_mut().zip(l) {
            let (s1, c1) = x.overflowing_add(y);
            let (s2, c2) = s1.overflowing_add(u64::from(carry));
            *x = s2;
            carry = c1 || c2;
        }
    }

    /// Takes `rel` out, as it was when added.
    pub fn sub(&mut self, rel: &Path, m: &std::fs::Metadata) {
        let l = Self::line(rel, m);
        let mut borrow = false;
        for (x, y) in self.0.iter_mut().zip(l) {
            let (s1, b1) = x.overflowing_sub(y);
            let (s2, b2) = s1.overflowing_sub(u64::from(borrow));
            *x = s2;
            borrow = b1 || b2;
        }
    }

    /// The stamp of `entry` as it is now: a walk of its `tree/` and
    /// `objects/`.
    pub fn of_entry(entry: &Path) -> Result<Stamp> {
        let mut st = Stamp::default();
        for part in ["tree", "objects"] {
            let root = entry.join(part);
            let top = std::fs::symlink_metadata(&root).map_err(|e| setup_error(e, &root))?;
            st.add(Path::new(part), &top);
            walk(&root, &mut |path, meta| {
                st.add(path.strip_prefix(entry).unwrap_or(path), meta);
                Ok(())
            })?;
        }
        Ok(st)
    }

    /// Hex, for the seal.
    pub fn to_hex(self) -> String {
        self.0.iter().map(|w| format!("{w:016x}")).collect()
    }

    /// From [`Stamp::to_hex`].
    pub fn from_hex(s: &str) -> Option<Stamp> {
        if s.len() != 64 {
            return None;
        }
        let mut w = [0u64; 4];
        for (i, x) in w.iter_mut().enumerate() {
            *x = u64::from_str_radix(s.get(i * 16..i * 16 + 16)?, 16).ok()?;
        }
        Some(Stamp(w))
    }
}

/// A file of an entry: its path, whether it is executable, its blob id.
pub(super) type Blob = (PathBuf, bool, Vec<u8>);

/// Hashes the entry at `entry` again: every file as a git blob, the
/// seal's other entries as recorded; the tree id (of `format`) must be
/// `tree`, the entry's key. Returns the tree's tree objects, and each
/// file with its blob id.
pub(super) fn hash_entry(
    entry: &Path,
    tree: &str,
    format: ObjectFormat,
    seal: &Seal,
) -> Result<(Vec<RawObject>, Vec<Blob>)> {
    let mut builder = TreeBuilder::new(format);
    let root = entry.join("tree");
    let mut blobs = Vec::new();
    hash_dir(&root, &root, &mut builder, &mut blobs)?;
    let files = blobs.len() as u64;
    for extra in seal.extras() {
        builder
            .add_entry(&extra)
            .map_err(|e| setup_error(e, &root))?;
    }
    let (found, objects) = builder.finish_with_objects();
    if found != tree || files != seal.files {
        return Err(setup_error(
            format!("holds tree {found} ({files} files), not its key"),
            &root,
        ));
    }
    Ok((objects, blobs))
}

/// Hashes every regular file and symbolic link beneath `dir` into
/// `builder` (paths relative to `root`; a link's blob is its target,
/// never what it points to); anything else but directories is an error.
fn hash_dir(
    root: &Path,
    dir: &Path,
    builder: &mut TreeBuilder,
    files: &mut Vec<Blob>,
) -> Result<()> {
    for entry in std::fs::read_dir(dir).map_err(|e| setup_error(e, dir))? {
        let entry = entry.map_err(|e| setup_error(e, dir))?;
        let path = entry.path();
        let meta = std::fs::symlink_metadata(&path).map_err(|e| setup_error(e, &path))?;
        let rel = || {
            path.strip_prefix(root)
                .ok()
                .and_then(Path::to_str)
                .map(str::to_owned)
                .ok_or_else(|| setup_error("not a UTF-8 path", &path))
        };
        if meta.is_dir() {
            hash_dir(root, &path, builder, files)?;
        } else if meta.is_symlink() {
            let target = std::fs::read_link(&path).map_err(|e| setup_error(e, &path))?;
            builder
                .add_symlink(&rel()?, target.as_os_str().as_encoded_bytes())
                .map_err(|e| setup_error(e, &path))?;
        } else if meta.is_file() {
            let rel = rel()?;
            let mut f = std::fs::File::open(&path).map_err(|e| setup_error(e, &path))?;
            let oid = read_blob_id(builder.format(), meta.len(), &mut f)
                .map_err(|e| setup_error(e, &path))?;
            let executable = meta.mode() & 0o111 != 0;
            let mode = if executable { 0o100755 } else { 0o100644 };
            builder
                .add(&rel, mode, oid.clone())
                .map_err(|e| setup_error(e, &path))?;
            files.push((path, executable, oid));
        } else {
            return Err(setup_error("neither a file, a link nor a directory", &path));
        }
    }
    Ok(())
}

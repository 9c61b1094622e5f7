//! The source tree's digest: git's own tree id, recomputed from content.
//!
//! A request names its source by the git tree id of the base commit
//! (`ExecRequest::source_tree`), which the worker reads from the repository
//! without touching a blob. The executor keys its tree cache by it, and
//! whenever it fills the cache from an archive it recomputes the id from
//! what it extracted — blob ids from the bytes, tree objects from the
//! paths and modes, as git does — and refuses the archive unless the ids
//! are equal. Entries an archive does not carry as files (symbolic links,
//! submodules, other modes) travel as [`TreeEntry`] records in the
//! archive's pax global header, so that they count in the id too.
//!
//! ```
//! use airlock_proto::tree::{ObjectFormat, TreeBuilder};
//! let mut t = TreeBuilder::new(ObjectFormat::Sha1);
//! t.add_blob("README.md", false, b"hello\n").unwrap();
//! // What `git write-tree` gives for a README.md holding "hello\n":
//! assert_eq!(t.finish(), "853694aae8816094a0d875fee7ea26278dbf5d0f");
//! ```

use std::collections::BTreeMap;

use sha1::Digest as _;

use crate::error::{Code, Error, Result};

/// The pax record key prefix of a [`TreeEntry`] in the archive's global header.
pub const PAX_KEY_PREFIX: &str = "airlock.tree-entry.";

/// A repository's object format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjectFormat {
    /// SHA-1 ids (40 hex digits).
    Sha1,
    /// SHA-256 ids (64 hex digits).
    Sha256,
}

impl ObjectFormat {
    /// The format of a hex object id, by its length (lowercase hex only).
    pub fn of_id(id: &str) -> Option<ObjectFormat> {
        if !id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return None;
        }
        match id.len() {
            40 => Some(ObjectFormat::Sha1),
            64 => Some(ObjectFormat::Sha256),
            _ => None,
        }
    }

    /// A hasher of git objects in this format.
    pub fn hasher(self) -> ObjectHasher {
        match self {
            ObjectFormat::Sha1 => ObjectHasher::Sha1(sha1::Sha1::new()),
            ObjectFormat::Sha256 => ObjectHasher::Sha256(sha2::Sha256::new()),
        }
    }
}

/// Hashes one git object incrementally.
#[derive(Clone, Debug)]
pub enum ObjectHasher {
    /// SHA-1.
    Sha1(sha1::Sha1),
    /// SHA-256.
    Sha256(sha2::Sha256),
}

impl ObjectHasher {
    /// Feeds bytes.
    pub fn update(&mut self, data: &[u8]) {
        match self {
            ObjectHasher::Sha1(h) => h.update(data),
            ObjectHasher::Sha256(h) => sha2::Digest::update(h, data),
        }
    }

    /// The raw id.
    pub fn finish(self) -> Vec<u8> {
        match self {
            ObjectHasher::Sha1(h) => h.finalize().to_vec(),
            ObjectHasher::Sha256(h) => sha2::Digest::finalize(h).to_vec(),
        }
    }
}

/// A blob's hasher: `blob <size>\0` first, then the content as it streams.
pub fn blob_hasher(format: ObjectFormat, size: u64) -> ObjectHasher {
    let mut h = format.hasher();
    h.update(format!("blob {size}\0").as_bytes());
    h
}

/// The id of a blob of `size` bytes, its content read whole from
/// `content` (a header claiming another size gives another id).
pub fn read_blob_id(
    format: ObjectFormat,
    size: u64,
    content: &mut impl std::io::Read,
) -> std::io::Result<Vec<u8>> {
    let mut h = blob_hasher(format, size);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match content.read(&mut buf)? {
            0 => return Ok(h.finish()),
            n => h.update(&buf[..n]),
        }
    }
}

/// One entry of a tree that an archive does not carry as a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeEntry {
    /// Git mode, e.g. 0o120000 (symlink) or 0o160000 (submodule).
    pub mode: u32,
    /// Object id, hex.
    pub oid: String,
    /// Repository-relative path.
    pub path: String,
}

impl TreeEntry {
    /// The pax record value: `<octal mode> <oid> <path>`.
    pub fn to_pax(&self) -> String {
        format!("{:o} {} {}", self.mode, self.oid, self.path)
    }

    /// Parses a pax record value written by [`TreeEntry::to_pax`].
    pub fn from_pax(value: &[u8]) -> Result<TreeEntry> {
        let bad = || Error::with(Code::SOURCE_ARCHIVE_INVALID, "malformed tree entry record");
        let text = std::str::from_utf8(value).map_err(|_| bad())?;
        let mut parts = text.splitn(3, ' ');
        let (Some(mode), Some(oid), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(bad());
        };
        let mode = u32::from_str_radix(mode, 8).map_err(|_| bad())?;
        if ObjectFormat::of_id(oid).is_none() || path.is_empty() {
            return Err(bad());
        }
        Ok(TreeEntry {
            mode,
            oid: oid.to_owned(),
            path: path.to_owned(),
        })
    }
}

/// Builds a tree id from entries, as `git write-tree` would.
#[derive(Clone, Debug)]
pub struct TreeBuilder {
    format: ObjectFormat,
    root: Dir,
}

#[derive(Clone, Debug, Default)]
struct Dir {
    files: BTreeMap<Vec<u8>, (u32, Vec<u8>)>,
    dirs: BTreeMap<Vec<u8>, Dir>,
}

impl TreeBuilder {
    /// An empty tree.
    pub fn new(format: ObjectFormat) -> TreeBuilder {
        TreeBuilder {
            format,
            root: Dir::default(),
        }
    }

    /// The object format.
    pub fn format(&self) -> ObjectFormat {
        self.format
    }

    /// Adds a regular file from its content.
    pub fn add_blob(&mut self, path: &str, executable: bool, content: &[u8]) -> Result<()> {
        let mut h = blob_hasher(self.format, content.len() as u64);
        h.update(content);
        let mode = if executable { 0o100755 } else { 0o100644 };
        self.add(path, mode, h.finish())
    }

    /// Adds a symbolic link from its target (a link's blob is its target).
    pub fn add_symlink(&mut self, path: &str, target: &[u8]) -> Result<()> {
        let mut h = blob_hasher(self.format, target.len() as u64);
        h.update(target);
        self.add(path, 0o120000, h.finish())
    }

    /// Adds an entry by mode and raw id. A path that is both a file and a
    /// directory, or given twice, is refused.
    pub fn add(&mut self, path: &str, mode: u32, oid: Vec<u8>) -> Result<()> {
        let dup = || {
            Error::with(
                Code::SOURCE_ARCHIVE_PATH_INVALID,
                format!("{path}: given twice, or both a file and a directory"),
            )
        };
        let mut parts: Vec<&str> = path.split('/').collect();
        let Some(name) = parts.pop() else {
            return Err(dup());
        };
        let mut dir = &mut self.root;
        for p in parts {
            if dir.files.contains_key(p.as_bytes()) {
                return Err(dup());
            }
            dir = dir.dirs.entry(p.as_bytes().to_vec()).or_default();
        }
        if dir.dirs.contains_key(name.as_bytes()) || dir.files.contains_key(name.as_bytes()) {
            return Err(dup());
        }
        dir.files.insert(name.as_bytes().to_vec(), (mode, oid));
        Ok(())
    }

    /// Adds a [`TreeEntry`].
    pub fn add_entry(&mut self, e: &TreeEntry) -> Result<()> {
        let oid = hex::decode(&e.oid)
            .map_err(|_| Error::with(Code::SOURCE_ARCHIVE_INVALID, "tree entry id is not hex"))?;
        if ObjectFormat::of_id(&e.oid) != Some(self.format) {
            return Err(Error::with(
                Code::SOURCE_ARCHIVE_INVALID,
                "tree entry id of another object format",
            ));
        }
        self.add(&e.path, e.mode, oid)
    }

    /// The tree id, hex.
    pub fn finish(self) -> String {
        hex::encode(write_tree(self.format, &self.root, &mut |_, _| {}))
    }

    /// The tree id, hex, and every tree object of the tree (the root's
    /// last).
    pub fn finish_with_objects(self) -> (String, Vec<RawObject>) {
        let mut objects = Vec::new();
        let root = write_tree(self.format, &self.root, &mut |oid, body| {
            objects.push((oid.to_vec(), body.to_vec()))
        });
        (hex::encode(root), objects)
    }
}

/// A git object as `(raw id, content)`.
pub type RawObject = (Vec<u8>, Vec<u8>);

/// The raw id of a git object of `kind` ("blob", "tree") with `content`.
pub fn object_id(format: ObjectFormat, kind: &str, content: &[u8]) -> Vec<u8> {
    let mut h = format.hasher();
    h.update(format!("{kind} {}\0", content.len()).as_bytes());
    h.update(content);
    h.finish()
}

/// One entry of a tree object: its name, mode and raw id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectEntry {
    /// The entry's name (one path component).
    pub name: Vec<u8>,
    /// Git mode: 040000, 100644, 100755, 120000 or 160000.
    pub mode: u32,
    /// Raw object id.
    pub oid: Vec<u8>,
}

/// Parses a tree object's content (what follows `tree <size>\0`): each
/// entry's mode must be one git writes and its name one path component
/// (not empty, `.`, `..` or `.git` in any case, no `/` or NUL), in git's
/// order without duplicates (SOURCE_ARCHIVE_INVALID otherwise).
pub fn parse_tree_object(format: ObjectFormat, mut body: &[u8]) -> Result<Vec<ObjectEntry>> {
    let bad = |why: &str| Error::with(Code::SOURCE_ARCHIVE_INVALID, format!("tree object: {why}"));
    let len = match format {
        ObjectFormat::Sha1 => 20,
        ObjectFormat::Sha256 => 32,
    };
    let mut out: Vec<ObjectEntry> = Vec::new();
    let mut last_key: Option<Vec<u8>> = None;
    while !body.is_empty() {
        let space = body
            .iter()
            .position(|&b| b == b' ')
            .ok_or_else(|| bad("no mode"))?;
        let mode = std::str::from_utf8(&body[..space])
            .ok()
            .and_then(|m| u32::from_str_radix(m, 8).ok())
            .filter(|m| matches!(m, 0o40000 | 0o100644 | 0o100755 | 0o120000 | 0o160000))
            .ok_or_else(|| bad("a mode git does not write"))?;
        body = &body[space + 1..];
        let nul = body
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| bad("no name"))?;
        let name = body[..nul].to_vec();
        if name.is_empty()
            || name == b"."
            || name == b".."
            || name.eq_ignore_ascii_case(b".git")
            || name.contains(&b'/')
        {
            return Err(bad("a name that is not one path component"));
        }
        body = &body[nul + 1..];
        if body.len() < len {
            return Err(bad("truncated id"));
        }
        let oid = body[..len].to_vec();
        body = &body[len..];
        let mut key = name.clone();
        if mode == 0o40000 {
            key.push(b'/');
        }
        if last_key.as_ref().is_some_and(|k| *k >= key) {
            return Err(bad("entries out of order or given twice"));
        }
        last_key = Some(key);
        out.push(ObjectEntry { name, mode, oid });
    }
    Ok(out)
}

/// The content of one tree object (what follows its `tree <size>\0`
/// header) from its entries, `(name, mode, raw id)`, in any order: git's
/// order is by name, a directory's (mode 040000) compared as if it ended
/// in '/', and a mode is written in octal without leading zeros.
pub fn tree_object(mut entries: Vec<(Vec<u8>, u32, Vec<u8>)>) -> Vec<u8> {
    let key = |(name, mode, _): &(Vec<u8>, u32, Vec<u8>)| {
        let mut k = name.clone();
        if *mode == 0o40000 {
            k.push(b'/');
        }
        k
    };
    entries.sort_by_key(key);
    let mut body = Vec::new();
    for (name, mode, oid) in &entries {
        body.extend_from_slice(format!("{mode:o} ").as_bytes());
        body.extend_from_slice(name);
        body.push(0);
        body.extend_from_slice(oid);
    }
    body
}

fn write_tree(format: ObjectFormat, dir: &Dir, seen: &mut dyn FnMut(&[u8], &[u8])) -> Vec<u8> {
    let mut entries: Vec<(Vec<u8>, u32, Vec<u8>)> = Vec::new();
    for (name, (mode, oid)) in &dir.files {
        entries.push((name.clone(), *mode, oid.clone()));
    }
    for (name, sub) in &dir.dirs {
        entries.push((name.clone(), 0o40000, write_tree(format, sub, seen)));
    }
    let body = tree_object(entries);
    let oid = object_id(format, "tree", &body);
    seen(&oid, &body);
    oid
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_empty_tree_is_gits() {
        assert_eq!(
            TreeBuilder::new(ObjectFormat::Sha1).finish(),
            "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
        );
        assert_eq!(
            TreeBuilder::new(ObjectFormat::Sha256).finish(),
            "6ef19b41225c5369f1c104d45d8d85efa9b057b53b14b4b9b939dd74decc5321"
        );
    }

    #[test]
    fn directories_sort_as_if_they_ended_in_a_slash() {
        // "a.b" (file) sorts before "a/" (dir), which sorts before "a0".
        let mut t = TreeBuilder::new(ObjectFormat::Sha1);
        t.add_blob("README.md", false, b"hello\n").unwrap();
        t.add_blob("a/x", false, b"").unwrap();
        t.add_blob("a.b", false, b"").unwrap();
        t.add_blob("a0", true, b"").unwrap();
        // What `git write-tree` gives for these four (a0 executable).
        assert_eq!(t.finish(), "dafed6cebe3a832d02800701ffcb64509e34cb36");
    }

    #[test]
    fn paths_cannot_be_files_and_directories() {
        let mut t = TreeBuilder::new(ObjectFormat::Sha1);
        t.add_blob("a", false, b"").unwrap();
        assert!(t.add_blob("a/b", false, b"").is_err());
        assert!(t.add_blob("a", false, b"").is_err());
    }

    #[test]
    fn tree_objects_parse_back_and_hash_to_their_ids() {
        let mut t = TreeBuilder::new(ObjectFormat::Sha1);
        t.add_blob("a/x", false, b"").unwrap();
        t.add_blob("a.b", true, b"1").unwrap();
        t.add_symlink("l", b"a/x").unwrap();
        let (root, objects) = t.finish_with_objects();
        assert_eq!(objects.len(), 2);
        let (oid, body) = objects.last().unwrap();
        assert_eq!(hex::encode(oid), root);
        assert_eq!(object_id(ObjectFormat::Sha1, "tree", body), *oid);
        let entries = parse_tree_object(ObjectFormat::Sha1, body).unwrap();
        let names: Vec<_> = entries.iter().map(|e| (e.name.clone(), e.mode)).collect();
        assert_eq!(
            names,
            vec![
                (b"a.b".to_vec(), 0o100755),
                (b"a".to_vec(), 0o40000),
                (b"l".to_vec(), 0o120000)
            ]
        );
        // A name that is not one component, an unknown mode, a truncation.
        for bad in [
            tree_object(vec![(b".git".to_vec(), 0o40000, vec![0; 20])]),
            tree_object(vec![(b"a/b".to_vec(), 0o100644, vec![0; 20])]),
            tree_object(vec![(b"a".to_vec(), 0o100600, vec![0; 20])]),
            body[..body.len() - 1].to_vec(),
        ] {
            assert!(parse_tree_object(ObjectFormat::Sha1, &bad).is_err());
        }
        // Out of order.
        let mut swapped = tree_object(vec![(b"b".to_vec(), 0o100644, vec![0; 20])]);
        swapped.extend(tree_object(vec![(b"a".to_vec(), 0o100644, vec![0; 20])]));
        assert!(parse_tree_object(ObjectFormat::Sha1, &swapped).is_err());
    }

    #[test]
    fn pax_records_round_trip() {
        let e = TreeEntry {
            mode: 0o120000,
            oid: "a".repeat(40),
            path: "dir/link with space".into(),
        };
        assert_eq!(TreeEntry::from_pax(e.to_pax().as_bytes()).unwrap(), e);
        assert!(TreeEntry::from_pax(b"120000 zz path").is_err());
    }
}

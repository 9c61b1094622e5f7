//! The tree cache: source trees extracted once, keyed by their git tree id.
//!
//! ```text
//! <work>/trees/<tree id>/seal.json   what the entry holds (files, bytes, the
//!                                     tree's entries that are not files)
//! <work>/trees/<tree id>/tree/       the extracted files, never written again
//! <work>/trees/.fill-<tree id>-<pid>/ an entry being filled (removed at start)
//! ```
//!
//! - **Keyed and verified by content.** An entry is filled only from an
//!   archive whose recomputed git tree id is the key ([`crate::extract`]);
//!   a request names its tree, so a cached entry serves every later request
//!   of the same source without an archive crossing the spool.
//! - **Self-verifying.** At start every entry is hashed again — each file
//!   as a git blob, plus the seal's non-file entries — and removed unless
//!   the result is its key; so is a half-filled one.
//! - **Never writable by commands.** It lives in the executor's work root:
//!   in the minimal root it is only ever the read-only lower layer of a
//!   workspace overlay (overlayfs copies a file up before any change) and
//!   is not in any command's view; in the host view commands get a copy,
//!   and Landlock grants them nothing of the work root but that copy and
//!   their tmp.
//! - **Bounded.** At most `max_entries` entries and `max_bytes` bytes of
//!   files; the least recently used entries go first (use touches the seal).

use crate::apply::CredentialPolicy;
use crate::error::{Error, Result};
use crate::extract::{ArchiveLimits, extract};
use airlock_proto::tree::{ObjectFormat, TreeBuilder, TreeEntry, blob_hasher};
use serde::{Deserialize, Serialize};
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Schema of a seal.
pub const SEAL_SCHEMA: &str = "airlock.tree-cache-seal.v1";

/// Bounds on the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheLimits {
    /// Most entries kept.
    pub max_entries: u32,
    /// Most bytes of files kept (an entry larger than this alone is kept
    /// only while it is in use).
    pub max_bytes: u64,
}

/// What a sealed entry holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Seal {
    schema: String,
    tree: String,
    files: u64,
    bytes: u64,
    /// `(mode, id, path)` of the tree's entries that are not files here.
    extras: Vec<(u32, String, String)>,
}

/// A usable entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cached {
    /// The tree id.
    pub tree: String,
    /// The extracted files.
    pub path: PathBuf,
    /// How many files, and their bytes.
    pub files: u64,
    /// Sum of file sizes.
    pub bytes: u64,
    /// True when this request filled it (a miss).
    pub filled: bool,
}

/// What [`TreeCache::open`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verified {
    /// Entries whose content is their key.
    pub kept: Vec<String>,
    /// Entries removed, and why.
    pub removed: Vec<(String, String)>,
}

/// The cache in a work root.
#[derive(Debug)]
pub struct TreeCache {
    dir: PathBuf,
    limits: CacheLimits,
    owner: Option<(u32, u32)>,
}

fn setup(e: impl std::fmt::Display, p: &Path) -> Error {
    Error::Setup {
        path: p.to_owned(),
        detail: e.to_string(),
    }
}

fn is_tree_id(s: &str) -> bool {
    ObjectFormat::of_id(s).is_some()
}

impl TreeCache {
    /// Opens (creating) `<work_root>/trees` and verifies every entry,
    /// removing those that do not hash to their key. `owner`: run as root,
    /// the commands' uid and gid, which must own entries (overlayfs copies
    /// a file up as its owner, in the spawner's user namespace).
    pub fn open(
        work_root: &Path,
        limits: CacheLimits,
        owner: Option<(u32, u32)>,
    ) -> Result<(TreeCache, Verified)> {
        let dir = work_root.join("trees");
        if !dir.is_dir() {
            std::fs::DirBuilder::new()
                .mode(0o711)
                .create(&dir)
                .map_err(|e| setup(e, &dir))?;
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711))
            .map_err(|e| setup(e, &dir))?;
        let cache = TreeCache { dir, limits, owner };
        let mut verified = Verified::default();
        for entry in std::fs::read_dir(&cache.dir).map_err(|e| setup(e, &cache.dir))? {
            let entry = entry.map_err(|e| setup(e, &cache.dir))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let why = if !is_tree_id(&name) {
                Some("not an entry (an interrupted fill)".to_owned())
            } else {
                cache.verify(&name).err().map(|e| e.to_string())
            };
            match why {
                None => verified.kept.push(name),
                Some(why) => {
                    remove_tree(&entry.path());
                    verified.removed.push((name, why));
                }
            }
        }
        verified.kept.sort();
        Ok((cache, verified))
    }

    fn entry(&self, tree: &str) -> PathBuf {
        self.dir.join(tree)
    }

    fn read_seal(&self, tree: &str) -> Result<Seal> {
        let path = self.entry(tree).join("seal.json");
        let bytes = airlock_spool::read_path(
            &path,
            &airlock_spool::Expect {
                owner_uid: rustix::process::geteuid().as_raw(),
                max_bytes: 64 << 20,
                sha256: None,
            },
        )
        .map_err(|e| setup(e, &path))?;
        let seal: Seal = serde_json::from_slice(&bytes).map_err(|e| setup(e, &path))?;
        if seal.schema != SEAL_SCHEMA || seal.tree != tree {
            return Err(setup("a seal of another entry", &path));
        }
        Ok(seal)
    }

    /// Hashes an entry again: every file as a git blob, the seal's other
    /// entries as recorded; the tree id must be the entry's key.
    pub fn verify(&self, tree: &str) -> Result<()> {
        let seal = self.read_seal(tree)?;
        let format = ObjectFormat::of_id(tree).ok_or_else(|| setup("not a tree id", &self.dir))?;
        let mut builder = TreeBuilder::new(format);
        let root = self.entry(tree).join("tree");
        let mut files = 0;
        hash_dir(&root, &root, &mut builder, &mut files)?;
        for (mode, oid, path) in &seal.extras {
            builder
                .add_entry(&TreeEntry {
                    mode: *mode,
                    oid: oid.clone(),
                    path: path.clone(),
                })
                .map_err(|e| setup(e, &root))?;
        }
        let found = builder.finish();
        if found != tree || files != seal.files {
            return Err(setup(
                format!("holds tree {found} ({files} files), not its key"),
                &root,
            ));
        }
        Ok(())
    }

    /// The entry for `tree`, if cached; marks it used.
    pub fn get(&self, tree: &str) -> Option<Cached> {
        if !is_tree_id(tree) {
            return None;
        }
        let seal = self.read_seal(tree).ok()?;
        let seal_path = self.entry(tree).join("seal.json");
        let _ = std::fs::File::options()
            .append(true)
            .open(&seal_path)
            .and_then(|f| f.set_modified(SystemTime::now()));
        Some(Cached {
            tree: tree.to_owned(),
            path: self.entry(tree).join("tree"),
            files: seal.files,
            bytes: seal.bytes,
            filled: false,
        })
    }

    /// Fills the entry for `tree` from `archive`, which must hold exactly
    /// that tree (SOURCE_ARCHIVE_SHA_MISMATCH otherwise); then evicts what
    /// the bounds require, never this entry.
    pub fn fill(
        &self,
        tree: &str,
        archive: &[u8],
        limits: &ArchiveLimits,
        credentials: &CredentialPolicy,
    ) -> Result<Cached> {
        let format = ObjectFormat::of_id(tree)
            .ok_or_else(|| Error::ArchiveDigest(format!("{tree:?} is not a tree id")))?;
        let tmp = self
            .dir
            .join(format!(".fill-{tree}-{}", std::process::id()));
        remove_tree(&tmp);
        let files = tmp.join("tree");
        std::fs::DirBuilder::new()
            .mode(0o755)
            .recursive(true)
            .create(&files)
            .map_err(|e| setup(e, &files))?;
        let result = (|| {
            let root = rustix::fs::open(
                &files,
                rustix::fs::OFlags::RDONLY
                    | rustix::fs::OFlags::DIRECTORY
                    | rustix::fs::OFlags::NOFOLLOW
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .map_err(|e| setup(e, &files))?;
            let ex = extract(archive, &root, limits, credentials, format)?;
            if ex.tree != tree {
                return Err(Error::ArchiveDigest(format!(
                    "the archive holds tree {}, the request names {tree}",
                    ex.tree
                )));
            }
            let seal = Seal {
                schema: SEAL_SCHEMA.into(),
                tree: tree.to_owned(),
                files: ex.files,
                bytes: ex.bytes,
                extras: ex
                    .extras
                    .iter()
                    .map(|e| (e.mode, e.oid.clone(), e.path.clone()))
                    .collect(),
            };
            let seal_bytes = serde_json::to_vec(&seal).map_err(|e| setup(e, &tmp))?;
            std::fs::write(tmp.join("seal.json"), seal_bytes).map_err(|e| setup(e, &tmp))?;
            if let Some((uid, gid)) = self.owner {
                crate::run::chown_tree(&files, uid, gid).map_err(|e| setup(e, &files))?;
            }
            Ok(seal)
        })();
        let seal = match result {
            Ok(s) => s,
            Err(e) => {
                remove_tree(&tmp);
                return Err(e);
            }
        };
        let entry = self.entry(tree);
        if std::fs::rename(&tmp, &entry).is_err() {
            // Filled meanwhile (or left from before): keep the one there.
            remove_tree(&tmp);
        }
        self.evict(tree);
        Ok(Cached {
            tree: tree.to_owned(),
            path: entry.join("tree"),
            files: seal.files,
            bytes: seal.bytes,
            filled: true,
        })
    }

    /// Removes least recently used entries (never `keep`) until the bounds hold.
    fn evict(&self, keep: &str) {
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut entries: Vec<(SystemTime, u64, String)> = dir
            .filter_map(|e| {
                let name = e.ok()?.file_name().to_string_lossy().into_owned();
                if !is_tree_id(&name) {
                    return None;
                }
                let seal = self.read_seal(&name).ok()?;
                let used = std::fs::metadata(self.entry(&name).join("seal.json"))
                    .and_then(|m| m.modified())
                    .ok()?;
                Some((used, seal.bytes, name))
            })
            .collect();
        entries.sort();
        let mut count = entries.len() as u64;
        let mut bytes: u64 = entries.iter().map(|e| e.1).sum();
        for (_, size, name) in entries {
            if count <= u64::from(self.limits.max_entries) && bytes <= self.limits.max_bytes {
                break;
            }
            if name == keep {
                continue;
            }
            remove_tree(&self.entry(&name));
            count -= 1;
            bytes = bytes.saturating_sub(size);
        }
    }
}

/// Hashes every regular file beneath `dir` into `builder` (paths relative
/// to `root`); anything but directories and regular files is an error.
fn hash_dir(root: &Path, dir: &Path, builder: &mut TreeBuilder, files: &mut u64) -> Result<()> {
    for entry in std::fs::read_dir(dir).map_err(|e| setup(e, dir))? {
        let entry = entry.map_err(|e| setup(e, dir))?;
        let path = entry.path();
        let meta = std::fs::symlink_metadata(&path).map_err(|e| setup(e, &path))?;
        if meta.is_dir() {
            hash_dir(root, &path, builder, files)?;
        } else if meta.is_file() {
            let rel = path
                .strip_prefix(root)
                .ok()
                .and_then(Path::to_str)
                .ok_or_else(|| setup("not a UTF-8 path", &path))?
                .to_owned();
            let mut h = blob_hasher(builder.format(), meta.len());
            let mut f = std::fs::File::open(&path).map_err(|e| setup(e, &path))?;
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = f.read(&mut buf).map_err(|e| setup(e, &path))?;
                if n == 0 {
                    break;
                }
                h.update(&buf[..n]);
            }
            let mode = if meta.mode() & 0o111 != 0 {
                0o100755
            } else {
                0o100644
            };
            builder
                .add(&rel, mode, h.finish())
                .map_err(|e| setup(e, &path))?;
            *files += 1;
        } else {
            return Err(setup("neither a file nor a directory", &path));
        }
    }
    Ok(())
}

/// Removes a directory tree, making unreadable directories (overlayfs's
/// work directory) readable first; errors are ignored.
pub fn remove_tree(path: &Path) {
    if std::fs::remove_dir_all(path).is_ok() || !path.exists() {
        return;
    }
    fn open_up(p: &Path) {
        let Ok(meta) = std::fs::symlink_metadata(p) else {
            return;
        };
        if meta.is_dir() {
            let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700));
            if let Ok(rd) = std::fs::read_dir(p) {
                for e in rd.flatten() {
                    open_up(&e.path());
                }
            }
        }
    }
    open_up(path);
    let _ = std::fs::remove_dir_all(path);
}

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
//! - **Verified once, when sealed; checked on first use.** A fill hashes
//!   every file as it extracts it, and the entry is sealed only when the
//!   recomputed tree id is its key. The seal also records a stamp: a
//!   SHA-256 over every path of the entry with its inode, size, mode and
//!   change time (ctime, which the kernel sets on any write, chmod, chown,
//!   link or rename, and which no process without root can set back).
//!   Start-up reads no file of any entry (a half-filled one is removed), so
//!   it costs the same with an empty cache or a full one. The first use of
//!   an entry in a process compares the entry with its stamp (a stat of
//!   each path, no read): an entry changed behind the executor's back is
//!   removed and its source asked for again, as for any miss. An entry
//!   sealed before the machine last booted (a power loss can take unsynced
//!   data and leave metadata), or by an earlier release without a stamp,
//!   is hashed in full on its first use instead, and stamped. What the
//!   stamp cannot see is a change that leaves every inode's metadata as it
//!   was: root writing the disk underneath the file system, or the disk
//!   itself decaying (both found only after the next boot).
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
pub const SEAL_SCHEMA: &str = "airlock.tree-cache-seal.v2";

/// The schema of seals written before the stamp (hashed in full on first
/// use, then stamped).
const SEAL_SCHEMA_V1: &str = "airlock.tree-cache-seal.v1";

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
    /// [`stamp`] of `tree/` when sealed; absent in a v1 seal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    stamp: Option<String>,
    /// The kernel's boot id when stamped: after a reboot (a power loss
    /// among them) the entry is hashed in full once, since unsynced data
    /// may be gone while its metadata stayed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    boot: Option<String>,
}

static BOOT_ID: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();

/// The kernel's boot id (`/proc/sys/kernel/random/boot_id`), read once:
/// call it before the lockdown, which leaves /proc out of reach; `None`
/// when it cannot be read (every entry is then hashed on first use).
pub fn boot_id() -> Option<String> {
    BOOT_ID
        .get_or_init(|| {
            std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
                .ok()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
        })
        .clone()
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
    /// Sealed entries, each checked against its seal on first use.
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
    /// Entries checked against their seal (or filled) by this process.
    checked: std::sync::Mutex<std::collections::HashSet<String>>,
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
    /// Opens (creating) `<work_root>/trees`, removing what is not a sealed
    /// entry (an interrupted fill); no entry's files are read (each is
    /// checked on its first use, [`TreeCache::get`]). `owner`: run as root,
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
        let cache = TreeCache {
            dir,
            limits,
            owner,
            checked: std::sync::Mutex::default(),
        };
        let mut verified = Verified::default();
        for entry in std::fs::read_dir(&cache.dir).map_err(|e| setup(e, &cache.dir))? {
            let entry = entry.map_err(|e| setup(e, &cache.dir))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let why = if !is_tree_id(&name) {
                Some("not an entry (an interrupted fill)".to_owned())
            } else {
                cache.read_seal(&name).err().map(|e| e.to_string())
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
        let stamped = seal.schema == SEAL_SCHEMA && seal.stamp.is_some();
        let v1 = seal.schema == SEAL_SCHEMA_V1 && seal.stamp.is_none();
        if !(stamped || v1) || seal.tree != tree {
            return Err(setup("a seal of another entry", &path));
        }
        Ok(seal)
    }

    /// Writes `seal` for `tree` whole (a temporary file renamed over it).
    fn write_seal(&self, dir: &Path, seal: &Seal) -> Result<()> {
        let bytes = serde_json::to_vec(seal).map_err(|e| setup(e, dir))?;
        let tmp = dir.join(".seal.json.tmp");
        std::fs::write(&tmp, bytes).map_err(|e| setup(e, &tmp))?;
        std::fs::rename(&tmp, dir.join("seal.json")).map_err(|e| setup(e, dir))
    }

    /// Checks an entry on its first use in this process: against its
    /// stamp, or (a seal without one) by hashing it in full, then stamping
    /// it. Removes an entry that fails.
    fn check(&self, tree: &str, seal: &mut Seal) -> std::result::Result<(), String> {
        let root = self.entry(tree).join("tree");
        let boot = boot_id();
        let outcome = match &seal.stamp {
            Some(sealed) if boot.is_some() && seal.boot == boot => match stamp(&root) {
                Ok(now) if now == *sealed => Ok(()),
                Ok(_) => Err("changed since it was sealed (its stamp differs)".to_owned()),
                Err(e) => Err(e.to_string()),
            },
            // Sealed before stamps, or before this boot: hashed in full,
            // then stamped for this boot.
            _ => self.verify(tree).map_err(|e| e.to_string()).and_then(|()| {
                seal.schema = SEAL_SCHEMA.into();
                seal.stamp = Some(stamp(&root).map_err(|e| e.to_string())?);
                seal.boot = boot;
                self.write_seal(&self.entry(tree), seal)
                    .map_err(|e| e.to_string())
            }),
        };
        match outcome {
            Ok(()) => {
                self.checked_set().insert(tree.to_owned());
                Ok(())
            }
            Err(why) => {
                remove_tree(&self.entry(tree));
                Err(why)
            }
        }
    }

    fn checked_set(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
        self.checked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
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

    /// The entry for `tree`, if cached and intact; marks it used. Its
    /// first use in this process checks it against its seal; an entry that
    /// fails is removed (and said on standard error) and this is a miss.
    pub fn get(&self, tree: &str) -> Option<Cached> {
        if !is_tree_id(tree) {
            return None;
        }
        let mut seal = self.read_seal(tree).ok()?;
        if !self.checked_set().contains(tree)
            && let Err(why) = self.check(tree, &mut seal)
        {
            eprintln!(
                "airlock-executor: tree cache: removed {tree}: {why}; its source is asked for again"
            );
            return None;
        }
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
            if let Some((uid, gid)) = self.owner {
                crate::run::chown_tree(&files, uid, gid).map_err(|e| setup(e, &files))?;
            }
            // Stamped last: a chown changes every ctime.
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
                stamp: Some(stamp(&files)?),
                boot: boot_id(),
            };
            self.write_seal(&tmp, &seal)?;
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
        if std::fs::rename(&tmp, &entry).is_ok() {
            self.checked_set().insert(tree.to_owned());
        } else {
            // Filled meanwhile (or left from before): keep the one there,
            // checked on its first use like any other.
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
            self.checked_set().remove(&name);
            count -= 1;
            bytes = bytes.saturating_sub(size);
        }
    }
}

/// The stamp of an entry's `tree/`: SHA-256 over it and every path
/// beneath it, in the layer cache's walk order, each with its mode (type
/// included), inode, size, owner and change time. Reads no file.
pub fn stamp(root: &Path) -> Result<String> {
    use sha2::Digest;
    fn line(h: &mut sha2::Sha256, rel: &Path, m: &std::fs::Metadata) {
        h.update(rel.as_os_str().as_encoded_bytes());
        h.update(
            format!(
                "\0{:o} {} {} {} {} {}.{:09}\n",
                m.mode(),
                m.ino(),
                m.len(),
                m.uid(),
                m.gid(),
                m.ctime(),
                m.ctime_nsec()
            )
            .as_bytes(),
        );
    }
    let mut h = sha2::Sha256::new();
    h.update(b"airlock.tree-cache-stamp.v1\n");
    let top = std::fs::symlink_metadata(root).map_err(|e| setup(e, root))?;
    line(&mut h, Path::new(""), &top);
    crate::layer::walk(root, &mut |path, meta| {
        line(&mut h, path.strip_prefix(root).unwrap_or(path), meta);
        Ok(())
    })?;
    Ok(hex::encode(h.finalize()))
}

/// Hashes every regular file and symbolic link beneath `dir` into
/// `builder` (paths relative to `root`; a link's blob is its target,
/// never what it points to); anything else but directories is an error.
fn hash_dir(root: &Path, dir: &Path, builder: &mut TreeBuilder, files: &mut u64) -> Result<()> {
    for entry in std::fs::read_dir(dir).map_err(|e| setup(e, dir))? {
        let entry = entry.map_err(|e| setup(e, dir))?;
        let path = entry.path();
        let meta = std::fs::symlink_metadata(&path).map_err(|e| setup(e, &path))?;
        let rel = || {
            path.strip_prefix(root)
                .ok()
                .and_then(Path::to_str)
                .map(str::to_owned)
                .ok_or_else(|| setup("not a UTF-8 path", &path))
        };
        if meta.is_dir() {
            hash_dir(root, &path, builder, files)?;
        } else if meta.is_symlink() {
            let target = std::fs::read_link(&path).map_err(|e| setup(e, &path))?;
            builder
                .add_symlink(&rel()?, target.as_os_str().as_encoded_bytes())
                .map_err(|e| setup(e, &path))?;
        } else if meta.is_file() {
            let rel = rel()?;
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
            return Err(setup("neither a file, a link nor a directory", &path));
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

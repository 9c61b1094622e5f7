//! The tree cache: source trees held whole, keyed by their git tree id,
//! built on the blob store ([`crate::blobs`]), with the tree objects they
//! are made of.
//!
//! ```text
//! <work>/trees/<tree id>/seal.json    what the entry holds (files, bytes, the
//!                                      tree's entries that are not files, its stamp)
//! <work>/trees/<tree id>/tree/        the tree's directories and links, and its
//!                                      files as hard links to <work>/blobs/<blob id>;
//!                                      never written while a request uses them
//! <work>/trees/<tree id>/objects/<id> the tree's git tree objects, by id
//! <work>/trees/.fill-<tree id>-<pid>/ an entry being made (removed at start,
//!                                      or rolled back onto its base, below)
//! ```
//!
//! - **Keyed and verified by content.** A request names its tree. An
//!   entry is made either from a whole archive whose recomputed git tree
//!   id is the key ([`crate::extract`]), or from an entry held and a
//!   source delta ([`crate::delta`]): the executor names the trees it
//!   holds ([`TreeCache::haves`]), the worker sends only the tree objects
//!   and blobs where the request's tree differs from one of them, and the
//!   executor walks the request's tree from its root id, object by
//!   object, so what it makes is that tree by construction. A delta costs
//!   O(what changed): the held entry is moved to the new key and changed
//!   in place (made again as hard links first when another request still
//!   waits on it, [`TreeCache::set_pins`]), with a journal that undoes it
//!   when the executor dies half-way ([`crate::delta::roll_back`], at the
//!   next start).
//! - **Each blob on disk once.** Every file written (and hashed) into an
//!   entry is adopted by the blob store under its object id, as a hard
//!   link: entries made from one another share every file that did not
//!   change, and a blob leaves the store when the last entry linking it
//!   does (the blobs a delta replaced at once, the rest by a sweep after
//!   an eviction).
//! - **Verified once, when made; checked on first use.** The seal records
//!   a stamp: over every path of `tree/` and `objects/`, its inode, size,
//!   mode, owner and a time — for a directory, a link or a tree object its
//!   change time (ctime, which the kernel sets on any write, chmod, chown,
//!   link or rename, and which no process without root can set back); for
//!   a file, whose inode other entries and the store link and unlink, its
//!   modification time (which a write sets, and only root or the file's
//!   owner can set back) — summed path by path ([`Stamp`]) so that a delta
//!   updates it by the paths it changed. Start-up reads no file of any
//!   entry (a half-made one is removed), so it costs the same with an
//!   empty cache or a full one. The first use of an entry in a process
//!   compares the entry with its stamp (a stat of each path, no read): an
//!   entry changed behind the executor's back is removed
//!   (TREE_CACHE_CORRUPT in the log) and its source asked for again, as
//!   for any miss; a tree object read by a delta's walk is hashed again
//!   each time, and one that no longer hashes to its id fails that
//!   request with TREE_CACHE_CORRUPT and removes the entry. An entry
//!   sealed before the machine last booted (a power loss can take
//!   unsynced data and leave metadata), or by an earlier release, is
//!   hashed in full on its first use instead, and stamped. What the stamp
//!   cannot see is a change that leaves every inode's metadata as it was:
//!   root writing the disk underneath the file system, the disk itself
//!   decaying (both found only after the next boot), or the file's owner
//!   writing it and setting its modification time back.
//! - **Never writable by commands.** It lives in the executor's work root:
//!   in the minimal root an entry's `tree/` is only ever the read-only
//!   lower layer of a workspace overlay (overlayfs copies a file up before
//!   any change) and is not in any command's view; in the host view
//!   commands get a copy, and Landlock grants them nothing of the work
//!   root but that copy and their tmp.
//! - **Bounded.** At most `max_entries` entries and `max_bytes` bytes of
//!   files, counted per entry (a blob shared by several entries counts
//!   once for each: the bound is never below the disk used); the least
//!   recently used entries go first (use touches the seal), never one a
//!   running request uses or a worker may still send a delta against.

use crate::apply::CredentialPolicy;
use crate::blobs::BlobStore;
use crate::error::{Error, Result};
use crate::extract::{ArchiveLimits, extract};
use airlock_proto::tree::{ObjectFormat, TreeBuilder, TreeEntry, read_blob_id};
use serde::{Deserialize, Serialize};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Schema of a seal.
pub const SEAL_SCHEMA: &str = "airlock.tree-cache-seal.v4";

/// The schemas of seals written by earlier releases (v1 without a stamp,
/// v2 with a stamp over `tree/` alone and no tree objects, v3 with files
/// of their own rather than links to the blob store and a stamp over
/// their change times): hashed in full on first use, then given their
/// tree objects, linked to the blob store and stamped.
const SEAL_SCHEMAS_BEFORE: [&str; 3] = [
    "airlock.tree-cache-seal.v1",
    "airlock.tree-cache-seal.v2",
    "airlock.tree-cache-seal.v3",
];

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
    /// True when it was filled from a source delta.
    pub from_delta: bool,
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
    blobs: BlobStore,
    limits: CacheLimits,
    owner: Option<(u32, u32)>,
    /// Entries checked against their seal (or filled) by this process.
    checked: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Entries named as held to a worker whose answer is still to come:
    /// never evicted, and a delta against one copies it rather than
    /// moving it ([`TreeCache::set_pins`]).
    pins: std::sync::Mutex<std::collections::HashSet<String>>,
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
            blobs: BlobStore::open(work_root)?,
            limits,
            owner,
            checked: std::sync::Mutex::default(),
            pins: std::sync::Mutex::default(),
        };
        let mut verified = Verified::default();
        for entry in std::fs::read_dir(&cache.dir).map_err(|e| setup(e, &cache.dir))? {
            let entry = entry.map_err(|e| setup(e, &cache.dir))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !is_tree_id(&name) && entry.path().join(crate::delta::JOURNAL).is_file() {
                // A delta interrupted mid-assembly: undone, its base kept.
                match crate::delta::roll_back(&entry.path()) {
                    Ok(base) if is_tree_id(&base) && !cache.entry(&base).exists() => {
                        if std::fs::rename(entry.path(), cache.entry(&base)).is_ok() {
                            eprintln!(
                                "airlock-executor: tree cache: rolled an interrupted source delta back onto {base} (hashed in full on its first use)"
                            );
                            if cache.read_seal(&base).is_ok() {
                                verified.kept.push(base);
                            }
                            continue;
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        eprintln!("airlock-executor: tree cache: cannot roll back {name}: {e}")
                    }
                }
            }
            let why = if !is_tree_id(&name) {
                Some("not an entry (an interrupted fill)".to_owned())
            } else {
                tidy(&entry.path());
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
        verified.kept.dedup();
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
        let before = SEAL_SCHEMAS_BEFORE.contains(&seal.schema.as_str());
        if !(stamped || before) || seal.tree != tree {
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
        let entry = self.entry(tree);
        let boot = boot_id();
        let current = seal.schema == SEAL_SCHEMA;
        let outcome = match &seal.stamp {
            Some(sealed) if current && boot.is_some() && seal.boot == boot => {
                match Stamp::of_entry(&entry) {
                    Ok(now) if now.to_hex() == *sealed => Ok(()),
                    Ok(_) => Err("changed since it was sealed (its stamp differs)".to_owned()),
                    Err(e) => Err(e.to_string()),
                }
            }
            // Sealed by an earlier release, or before this boot: hashed in
            // full (its tree objects written again), then stamped.
            _ => self
                .rehash(tree)
                .and_then(|(objects, files)| {
                    write_objects(&entry, &objects)?;
                    self.adopt_all(&files)
                })
                .map_err(|e| e.to_string())
                .and_then(|()| {
                    seal.schema = SEAL_SCHEMA.into();
                    seal.stamp = Some(Stamp::of_entry(&entry).map_err(|e| e.to_string())?.to_hex());
                    seal.boot = boot;
                    self.write_seal(&entry, seal).map_err(|e| e.to_string())
                }),
        };
        match outcome {
            Ok(()) => {
                self.checked_set().insert(tree.to_owned());
                Ok(())
            }
            Err(why) => {
                self.drop_entries(&[tree]);
                Err(why)
            }
        }
    }

    /// Removes sealed entries, then the blobs no entry links any more.
    fn drop_entries(&self, trees: &[&str]) {
        for tree in trees {
            remove_tree(&self.entry(tree));
            self.checked_set().remove(*tree);
        }
        if !trees.is_empty() {
            self.blobs.sweep();
        }
    }

    fn checked_set(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
        self.checked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn pinned(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
        self.pins
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The trees named as held in source requests still unanswered (the
    /// executor's own `wants/` files of requests without a result).
    pub fn set_pins(&self, trees: std::collections::HashSet<String>) {
        *self.pinned() = trees;
    }

    /// Whether an entry is sealed and intact, checked as [`TreeCache::get`]
    /// checks it, without marking it used.
    fn usable(&self, tree: &str) -> bool {
        let Ok(mut seal) = self.read_seal(tree) else {
            return false;
        };
        if self.checked_set().contains(tree) {
            return true;
        }
        match self.check(tree, &mut seal) {
            Ok(()) => true,
            Err(why) => {
                eprintln!(
                    "airlock-executor: tree cache: removed {tree} ({}: {why}); what it held is fetched again",
                    airlock_proto::Code::TREE_CACHE_CORRUPT.as_str()
                );
                false
            }
        }
    }

    /// The trees a worker may send a delta against for a tree of `format`:
    /// intact entries, most recently used first, at most `max` (each
    /// checked against its seal on its first use in this process).
    pub fn haves(&self, format: ObjectFormat, max: usize) -> Vec<String> {
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut entries: Vec<(SystemTime, String)> = dir
            .filter_map(|e| {
                let name = e.ok()?.file_name().to_string_lossy().into_owned();
                if ObjectFormat::of_id(&name) != Some(format) {
                    return None;
                }
                let used = std::fs::metadata(self.entry(&name).join("seal.json"))
                    .and_then(|m| m.modified())
                    .ok()?;
                Some((used, name))
            })
            .collect();
        entries.sort_by(|a, b| b.cmp(a));
        entries
            .into_iter()
            .map(|(_, name)| name)
            .filter(|name| self.usable(name))
            .take(max)
            .collect()
    }

    /// Fills the entry for `tree` from what the worker sent: a source
    /// delta ([`crate::delta`]) against an entry held, or a whole archive
    /// ([`TreeCache::fill`]). `on_staged` runs once the work is under way
    /// (a fault-injection point).
    pub fn receive(
        &self,
        tree: &str,
        bytes: &[u8],
        limits: &ArchiveLimits,
        credentials: &CredentialPolicy,
        on_staged: &mut dyn FnMut(),
    ) -> Result<Cached> {
        match crate::delta::parse(bytes, tree, limits)? {
            Some(delta) => self.advance(&delta, limits, credentials, on_staged),
            None => self.fill(tree, bytes, limits, credentials),
        }
    }

    /// Makes the entry for the delta's tree from the entry of its base:
    /// the base's directory moved (or copied, when another request still
    /// waits on it) and changed where the trees differ, its stamp updated
    /// by those paths alone; O(what changed).
    pub fn advance(
        &self,
        delta: &crate::delta::Delta,
        limits: &ArchiveLimits,
        credentials: &CredentialPolicy,
        on_staged: &mut dyn FnMut(),
    ) -> Result<Cached> {
        let (base, tree) = (delta.base.as_str(), delta.tree.as_str());
        if !self.usable(base) {
            return Err(Error::ArchiveInvalid(format!(
                "the source delta's base {base} is no longer cached"
            )));
        }
        let base_entry = self.entry(base);
        let plan = match crate::delta::plan(delta, &base_entry.join("objects"), limits) {
            Ok(p) => p,
            Err(e @ Error::CacheCorrupt(_)) => {
                eprintln!(
                    "airlock-executor: tree cache: removed {base} ({}: {e})",
                    e.code().as_str()
                );
                self.drop_entries(&[base]);
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        let seal = self.read_seal(base)?;
        let tmp = self
            .dir
            .join(format!(".fill-{tree}-{}", std::process::id()));
        remove_tree(&tmp);
        let copied = self.pinned().contains(base);
        let journal = crate::delta::Journal::of(
            base,
            serde_json::to_value(&seal).map_err(|e| setup(e, &base_entry))?,
            &plan,
        );
        let mut stamp = if copied {
            let made = (|| {
                std::fs::create_dir(&tmp).map_err(|e| setup(e, &tmp))?;
                // Files as hard links to the same blobs (a file the file
                // system will not link again, copied).
                crate::request::clone_tree(
                    &base_entry.join("tree"),
                    &tmp.join("tree"),
                    &mut |src, dst| {
                        std::fs::hard_link(src, dst).or_else(|_| std::fs::copy(src, dst).map(drop))
                    },
                )?;
                crate::request::copy_tree(&base_entry.join("objects"), &tmp.join("objects"))?;
                if let Some((uid, gid)) = self.owner {
                    crate::run::chown_tree(&tmp.join("tree"), uid, gid)
                        .map_err(|e| setup(e, &tmp))?;
                }
                Stamp::of_entry(&tmp)
            })();
            match made {
                Ok(s) => s,
                Err(e) => {
                    remove_tree(&tmp);
                    return Err(e);
                }
            }
        } else {
            // The journal first, in the entry it describes: a crash from
            // here on is rolled back at the next start.
            journal.write(&base_entry)?;
            std::fs::rename(&base_entry, &tmp).map_err(|e| setup(e, &base_entry))?;
            self.checked_set().remove(base);
            seal.stamp
                .as_deref()
                .and_then(Stamp::from_hex)
                .ok_or_else(|| Error::CacheCorrupt(format!("{base}: an unreadable stamp")))?
        };
        let result = (|| {
            let site = crate::delta::Site {
                entry: &tmp,
                store: &self.blobs,
                stamp: &mut stamp,
            };
            let applied = crate::delta::apply(
                site,
                delta,
                &plan,
                seal.extras
                    .iter()
                    .map(|(mode, oid, path)| TreeEntry {
                        mode: *mode,
                        oid: oid.clone(),
                        path: path.clone(),
                    })
                    .collect(),
                credentials,
                on_staged,
            )?;
            for rel in &applied.after {
                let path = tmp.join(rel);
                if let (Some((uid, gid)), true) = (self.owner, rel.starts_with("tree")) {
                    if std::fs::symlink_metadata(&path).is_ok() {
                        std::os::unix::fs::lchown(&path, Some(uid), Some(gid))
                            .map_err(|e| setup(e, &path))?;
                    }
                }
            }
            for rel in &applied.after {
                if let Ok(meta) = std::fs::symlink_metadata(tmp.join(rel)) {
                    stamp.add(rel, &meta);
                }
            }
            let sealed = Seal {
                schema: SEAL_SCHEMA.into(),
                tree: tree.to_owned(),
                files: (seal.files + applied.files.0).saturating_sub(applied.files.1),
                bytes: (seal.bytes + applied.bytes.0).saturating_sub(applied.bytes.1),
                extras: applied
                    .extras
                    .iter()
                    .map(|e| (e.mode, e.oid.clone(), e.path.clone()))
                    .collect(),
                stamp: Some(stamp.to_hex()),
                boot: boot_id(),
            };
            self.write_seal(&tmp, &sealed)?;
            Ok(sealed)
        })();
        let sealed = match result {
            Ok(s) => s,
            Err(e) => {
                // A moved base goes back where it was (hashed in full on
                // its next use); a copy, or what cannot be undone, goes.
                let restored = !copied
                    && crate::delta::roll_back(&tmp).is_ok()
                    && std::fs::rename(&tmp, &base_entry).is_ok();
                if !restored {
                    remove_tree(&tmp);
                }
                return Err(e);
            }
        };
        let entry = self.entry(tree);
        if std::fs::rename(&tmp, &entry).is_ok() {
            self.checked_set().insert(tree.to_owned());
            tidy(&entry);
        } else {
            remove_tree(&tmp);
        }
        // What the base held where the new tree differs and no other entry
        // links (a copied base still does).
        self.blobs.release(plan.released.iter().cloned());
        eprintln!(
            "airlock-executor: tree cache: {tree} made from {base} ({} of its base): {} removed, {} written",
            if copied { "a copy" } else { "the entry" },
            plan.remove.len(),
            plan.write.len() + plan.mkdir.len()
        );
        self.evict(tree);
        Ok(Cached {
            tree: tree.to_owned(),
            path: entry.join("tree"),
            files: sealed.files,
            bytes: sealed.bytes,
            filled: true,
            from_delta: true,
        })
    }

    /// Hashes an entry again: every file as a git blob, the seal's other
    /// entries as recorded; the tree id must be the entry's key. Returns
    /// the tree's tree objects.
    pub fn verify(&self, tree: &str) -> Result<Vec<airlock_proto::tree::RawObject>> {
        self.rehash(tree).map(|(objects, _)| objects)
    }

    /// [`TreeCache::verify`], and each file with its blob id.
    fn rehash(&self, tree: &str) -> Result<(Vec<airlock_proto::tree::RawObject>, Vec<Blob>)> {
        let seal = self.read_seal(tree)?;
        let format = ObjectFormat::of_id(tree).ok_or_else(|| setup("not a tree id", &self.dir))?;
        let mut builder = TreeBuilder::new(format);
        let root = self.entry(tree).join("tree");
        let mut blobs = Vec::new();
        hash_dir(&root, &root, &mut builder, &mut blobs)?;
        let files = blobs.len() as u64;
        for (mode, oid, path) in &seal.extras {
            builder
                .add_entry(&TreeEntry {
                    mode: *mode,
                    oid: oid.clone(),
                    path: path.clone(),
                })
                .map_err(|e| setup(e, &root))?;
        }
        let (found, objects) = builder.finish_with_objects();
        if found != tree || files != seal.files {
            return Err(setup(
                format!("holds tree {found} ({files} files), not its key"),
                &root,
            ));
        }
        Ok((objects, blobs))
    }

    /// Links each of `files` (written or read back, and hashed, by this
    /// process) into the blob store.
    fn adopt_all(&self, files: &[Blob]) -> Result<()> {
        for (path, executable, oid) in files {
            self.blobs.adopt(path, oid, *executable)?;
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
            from_delta: false,
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
            let ex = extract(
                archive,
                &root,
                limits,
                credentials,
                format,
                Some(&self.blobs),
            )?;
            write_objects(&tmp, &ex.tree_objects)?;
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
                stamp: Some(Stamp::of_entry(&tmp)?.to_hex()),
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
            from_delta: false,
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
        let mut evicted = Vec::new();
        for (_, size, name) in &entries {
            if count <= u64::from(self.limits.max_entries) && bytes <= self.limits.max_bytes {
                break;
            }
            if name == keep || self.pinned().contains(name) {
                continue;
            }
            evicted.push(name.as_str());
            count -= 1;
            bytes = bytes.saturating_sub(*size);
        }
        self.drop_entries(&evicted);
    }
}

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
            let top = std::fs::symlink_metadata(&root).map_err(|e| setup(e, &root))?;
            st.add(Path::new(part), &top);
            crate::layer::walk(&root, &mut |path, meta| {
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
type Blob = (PathBuf, bool, Vec<u8>);

/// Removes what a sealed entry may still hold of the delta that made it
/// (its journal and undo directory: the delta was complete).
fn tidy(entry: &Path) {
    let _ = std::fs::remove_file(entry.join(crate::delta::JOURNAL));
    let undo = entry.join("undo");
    if undo.exists() {
        remove_tree(&undo);
    }
}

/// Writes an entry's tree objects into its `objects/` (made if missing),
/// each as `<hex id>` holding its content.
fn write_objects(entry: &Path, objects: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
    let dir = entry.join("objects");
    if !dir.is_dir() {
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| setup(e, &dir))?;
    }
    for (oid, body) in objects {
        let path = dir.join(hex::encode(oid));
        if !path.exists() {
            std::fs::write(&path, body).map_err(|e| setup(e, &path))?;
        }
    }
    Ok(())
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
            let mut f = std::fs::File::open(&path).map_err(|e| setup(e, &path))?;
            let oid =
                read_blob_id(builder.format(), meta.len(), &mut f).map_err(|e| setup(e, &path))?;
            let executable = meta.mode() & 0o111 != 0;
            let mode = if executable { 0o100755 } else { 0o100644 };
            builder
                .add(&rel, mode, oid.clone())
                .map_err(|e| setup(e, &path))?;
            files.push((path, executable, oid));
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

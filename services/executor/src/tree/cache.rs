//! The tree cache: source trees held whole, keyed by their git tree id,
//! built on the blob store ([`super::blobs`]), with the tree objects they
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
//!   id is the key ([`super::extract`]), or from an entry held and a
//!   source delta ([`super::delta`]): the executor names the trees it
//!   holds ([`TreeCache::haves`]), the worker sends only the tree objects
//!   and blobs where the request's tree differs from one of them, and the
//!   executor walks the request's tree from its root id, object by
//!   object, so what it makes is that tree by construction. A delta costs
//!   O(what changed): the held entry is moved to the new key and changed
//!   in place (made again as hard links first when another request still
//!   waits on it, [`TreeCache::set_pins`]), with a journal that undoes it
//!   when the executor dies half-way ([`super::journal::roll_back`], at the
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

use super::advance::Held;
use super::blobs::BlobStore;
use super::delta::{Delta, Plan};
use super::extract::{ArchiveLimits, extract};
use super::fs::{chown_tree, mkdir, open_dir, remove_tree, setup_error};
use super::hold::{Hold, Holds, least_recently_used};
use super::journal::{JOURNAL, roll_back, tidy};
use super::seal::{Seal, write_objects};
use super::stamp::{Blob, Stamp, hash_entry};
use crate::apply::CredentialPolicy;
use crate::error::{Error, Result};
use airlock_proto::tree::{ObjectFormat, RawObject};
use std::collections::HashSet;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

/// Bounds on the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheLimits {
    /// Most entries kept.
    pub max_entries: u32,
    /// Most bytes of files kept (an entry larger than this alone is kept
    /// only while it is in use).
    pub max_bytes: u64,
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
    checked: Mutex<HashSet<String>>,
    /// The entries running jobs use ([`TreeCache::hold`]).
    holds: Holds,
    /// Entries named as held to a worker whose answer is still to come:
    /// never evicted, and a delta against one copies it rather than
    /// moving it ([`TreeCache::set_pins`]).
    pins: Mutex<HashSet<String>>,
}

fn is_tree_id(s: &str) -> bool {
    ObjectFormat::of_id(s).is_some()
}

/// Open: the cache's directory, and what a previous process left in it.
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
            mkdir(&dir, 0o711)?;
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711))
            .map_err(|e| setup_error(e, &dir))?;
        let cache = TreeCache {
            dir,
            blobs: BlobStore::open(work_root)?,
            limits,
            owner,
            checked: Mutex::default(),
            holds: Holds::default(),
            pins: Mutex::default(),
        };
        let mut verified = Verified::default();
        for entry in std::fs::read_dir(&cache.dir).map_err(|e| setup_error(e, &cache.dir))? {
            let entry = entry.map_err(|e| setup_error(e, &cache.dir))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if !is_tree_id(&name) && entry.path().join(JOURNAL).is_file() {
                if let Some(base) = cache.recover(&name, &entry.path()) {
                    if cache.read_seal(&base).is_ok() {
                        verified.kept.push(base);
                    }
                    continue;
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

    /// A delta interrupted mid-assembly at `path`: undone, and put back as
    /// its base's entry when that is free. Returns the base then.
    fn recover(&self, name: &str, path: &Path) -> Option<String> {
        match roll_back(path) {
            Ok(base) if is_tree_id(&base) && !self.entry(&base).exists() => {
                if std::fs::rename(path, self.entry(&base)).is_ok() {
                    eprintln!(
                        "airlock-executor: tree cache: rolled an interrupted source delta back onto {base} (hashed in full on its first use)"
                    );
                    return Some(base);
                }
            }
            Ok(_) => {}
            Err(e) => {
                eprintln!("airlock-executor: tree cache: cannot roll back {name}: {e}")
            }
        }
        None
    }

    fn entry(&self, tree: &str) -> PathBuf {
        self.dir.join(tree)
    }

    fn read_seal(&self, tree: &str) -> Result<Seal> {
        Seal::read(&self.entry(tree), tree)
    }

    fn checked_set(&self) -> MutexGuard<'_, HashSet<String>> {
        self.checked.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn pinned(&self) -> MutexGuard<'_, HashSet<String>> {
        self.pins.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The trees named as held in source requests still unanswered (the
    /// executor's own `wants/` files of requests without a result).
    pub fn set_pins(&self, trees: HashSet<String>) {
        *self.pinned() = trees;
    }

    /// A running job's hold on the entry of `tree`: until it is dropped the
    /// entry is neither evicted nor moved by a delta (one made from it is
    /// made from a copy).
    pub fn hold(&self, tree: &str) -> Hold {
        self.holds.hold(tree)
    }
}

/// Use: an entry checked on its first use, then served.
impl TreeCache {
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
        Some(self.cached(tree, &seal, false, false))
    }

    /// The entry of `tree` as a request uses it.
    fn cached(&self, tree: &str, seal: &Seal, filled: bool, from_delta: bool) -> Cached {
        Cached {
            tree: tree.to_owned(),
            path: self.entry(tree).join("tree"),
            files: seal.files,
            bytes: seal.bytes,
            filled,
            from_delta,
        }
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

    /// Checks an entry on its first use in this process: against its
    /// stamp, or (a seal without one) by hashing it in full, then stamping
    /// it. Removes an entry that fails.
    fn check(&self, tree: &str, seal: &mut Seal) -> std::result::Result<(), String> {
        let entry = self.entry(tree);
        let outcome = match &seal.stamp {
            Some(sealed) if seal.stamped_this_boot() => match Stamp::of_entry(&entry) {
                Ok(now) if now.to_hex() == *sealed => Ok(()),
                Ok(_) => Err("changed since it was sealed (its stamp differs)".to_owned()),
                Err(e) => Err(e.to_string()),
            },
            // Sealed by an earlier release, or before this boot: hashed in
            // full (its tree objects written again), then stamped.
            _ => self.restamp(tree, seal).map_err(|e| e.to_string()),
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

    /// Hashes an entry in full, writes its tree objects again, links its
    /// files into the blob store, then stamps and seals it afresh.
    fn restamp(&self, tree: &str, seal: &mut Seal) -> Result<()> {
        let entry = self.entry(tree);
        let (objects, files) = self.rehash(tree)?;
        write_objects(&entry, &objects)?;
        self.adopt_all(&files)?;
        seal.restamp(Stamp::of_entry(&entry)?.to_hex());
        seal.write(&entry)
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
                Some((self.last_used(&name)?, name))
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

    /// When an entry was last used (its seal touched).
    fn last_used(&self, tree: &str) -> Option<SystemTime> {
        std::fs::metadata(self.entry(tree).join("seal.json"))
            .and_then(|m| m.modified())
            .ok()
    }

    /// Hashes an entry again: every file as a git blob, the seal's other
    /// entries as recorded; the tree id must be the entry's key. Returns
    /// the tree's tree objects.
    pub fn verify(&self, tree: &str) -> Result<Vec<RawObject>> {
        self.rehash(tree).map(|(objects, _)| objects)
    }

    /// [`TreeCache::verify`], and each file with its blob id.
    fn rehash(&self, tree: &str) -> Result<(Vec<RawObject>, Vec<Blob>)> {
        let seal = self.read_seal(tree)?;
        let format =
            ObjectFormat::of_id(tree).ok_or_else(|| setup_error("not a tree id", &self.dir))?;
        hash_entry(&self.entry(tree), tree, format, &seal)
    }

    /// Links each of `files` (written or read back, and hashed, by this
    /// process) into the blob store.
    fn adopt_all(&self, files: &[Blob]) -> Result<()> {
        for (path, executable, oid) in files {
            self.blobs.adopt(path, oid, *executable)?;
        }
        Ok(())
    }
}

/// Fill: an entry made from a whole archive, or from a held one and a
/// source delta.
impl TreeCache {
    /// Fills the entry for `tree` from what the worker sent: a source
    /// delta ([`super::delta`]) against an entry held, or a whole archive
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
        match super::delta::parse(bytes, tree, limits)? {
            Some(delta) => self.advance(&delta, limits, credentials, on_staged),
            None => self.fill(tree, bytes, limits, credentials),
        }
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
        let tmp = self.staging(tree);
        let files = tmp.join("tree");
        std::fs::DirBuilder::new()
            .mode(0o755)
            .recursive(true)
            .create(&files)
            .map_err(|e| setup_error(e, &files))?;
        let seal = match self.extract_into(&tmp, tree, format, archive, limits, credentials) {
            Ok(s) => s,
            Err(e) => {
                remove_tree(&tmp);
                return Err(e);
            }
        };
        self.install(tree, &tmp);
        self.evict(tree);
        Ok(self.cached(tree, &seal, true, false))
    }

    /// Extracts `archive` into the staging directory `tmp`, which must
    /// then hold `tree`, and seals it.
    fn extract_into(
        &self,
        tmp: &Path,
        tree: &str,
        format: ObjectFormat,
        archive: &[u8],
        limits: &ArchiveLimits,
        credentials: &CredentialPolicy,
    ) -> Result<Seal> {
        let files = tmp.join("tree");
        let root = open_dir(&files)?;
        let ex = extract(
            archive,
            &root,
            limits,
            credentials,
            format,
            Some(&self.blobs),
        )?;
        write_objects(tmp, &ex.tree_objects)?;
        if ex.tree != tree {
            return Err(Error::ArchiveDigest(format!(
                "the archive holds tree {}, the request names {tree}",
                ex.tree
            )));
        }
        if let Some((uid, gid)) = self.owner {
            chown_tree(&files, uid, gid).map_err(|e| setup_error(e, &files))?;
        }
        // Stamped last: a chown changes every ctime.
        let stamp = Stamp::of_entry(tmp)?.to_hex();
        let seal = Seal::new(tree, (ex.files, ex.bytes), &ex.extras, stamp);
        seal.write(tmp)?;
        Ok(seal)
    }

    /// Makes the entry for the delta's tree from the entry of its base
    /// ([`super::advance`]): the base's directory moved (or copied, when
    /// another request still waits on it) and changed where the trees
    /// differ, its stamp updated by those paths alone; O(what changed).
    pub fn advance(
        &self,
        delta: &Delta,
        limits: &ArchiveLimits,
        credentials: &CredentialPolicy,
        on_staged: &mut dyn FnMut(),
    ) -> Result<Cached> {
        let (base, tree) = (delta.base.as_str(), delta.tree.as_str());
        // 1. The base, intact; what the delta changes in it.
        if !self.usable(base) {
            return Err(Error::ArchiveInvalid(format!(
                "the source delta's base {base} is no longer cached"
            )));
        }
        let plan = self.plan(delta, limits)?;
        // 2. The base taken: copied while a request waits on it, else
        // moved (no longer this process's checked entry).
        let held = Held {
            delta,
            plan: &plan,
            credentials,
            entry: self.entry(base),
            seal: self.read_seal(base)?,
            staging: self.staging(tree),
            store: &self.blobs,
            owner: self.owner,
            copied: self.pinned().contains(base) || self.holds.is_held(base),
        };
        let stamp = if held.copied {
            held.copy()?
        } else {
            held.take()?;
            self.checked_set().remove(base);
            held.sealed_stamp()?
        };
        // 3. Changed and sealed (or put back), then installed.
        let sealed = held.assemble(stamp, on_staged)?;
        if self.install(tree, &held.staging) {
            tidy(&self.entry(tree));
        }
        // What the base held where the new tree differs and no other entry
        // links (a copied base still does).
        self.blobs.release(plan.released.iter().cloned());
        eprintln!(
            "airlock-executor: tree cache: {tree} made from {base} ({} of its base): {} removed, {} written",
            if held.copied { "a copy" } else { "the entry" },
            plan.remove.len(),
            plan.write.len() + plan.mkdir.len()
        );
        self.evict(tree);
        Ok(self.cached(tree, &sealed, true, true))
    }

    /// The delta's plan against its base's tree objects; a base whose
    /// objects no longer hash to their ids is removed.
    fn plan(&self, delta: &Delta, limits: &ArchiveLimits) -> Result<Plan> {
        let base = delta.base.as_str();
        match super::delta::plan(delta, &self.entry(base).join("objects"), limits) {
            Ok(p) => Ok(p),
            Err(e @ Error::CacheCorrupt(_)) => {
                eprintln!(
                    "airlock-executor: tree cache: removed {base} ({}: {e})",
                    e.code().as_str()
                );
                self.drop_entries(&[base]);
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Where an entry for `tree` is made (`.fill-<tree>-<pid>`), emptied.
    fn staging(&self, tree: &str) -> PathBuf {
        let tmp = self
            .dir
            .join(format!(".fill-{tree}-{}", std::process::id()));
        remove_tree(&tmp);
        tmp
    }

    /// Moves an entry made in `staging` to its key, checked; `false` when
    /// it was filled meanwhile (or left from before): the one there is
    /// kept, checked on its first use like any other.
    fn install(&self, tree: &str, staging: &Path) -> bool {
        if std::fs::rename(staging, self.entry(tree)).is_ok() {
            self.checked_set().insert(tree.to_owned());
            true
        } else {
            remove_tree(staging);
            false
        }
    }
}

/// Evict: the bounds kept, least recently used first.
impl TreeCache {
    /// Removes least recently used entries (never `keep`) until the bounds hold.
    fn evict(&self, keep: &str) {
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let entries: Vec<(SystemTime, u64, String)> = dir
            .filter_map(|e| {
                let name = e.ok()?.file_name().to_string_lossy().into_owned();
                if !is_tree_id(&name) {
                    return None;
                }
                let seal = self.read_seal(&name).ok()?;
                Some((self.last_used(&name)?, seal.bytes, name))
            })
            .collect();
        let evicted = least_recently_used(
            entries,
            u64::from(self.limits.max_entries),
            self.limits.max_bytes,
            |name| name == keep || self.pinned().contains(name) || self.holds.is_held(name),
        );
        let evicted: Vec<&str> = evicted.iter().map(String::as_str).collect();
        self.drop_entries(&evicted);
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
}

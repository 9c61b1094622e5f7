//! Source deltas: a new tree assembled from a cached one and only the
//! objects that differ.
//!
//! When the executor lacks a request's tree it names the trees it holds
//! (`SourceWanted::haves`); the worker answers with a delta against one of
//! them ([`airlock_proto::bundle::SourceDelta`]): the tree objects of the
//! new tree at every path where the two differ, the root's among them,
//! and the blobs at those paths. Nothing in it is trusted:
//!
//! - **Every member hashes to its id** ([`parse`]): a tree object as
//!   `tree <size>\0…`, a blob as `blob <size>\0…`; the header names the
//!   request's tree.
//! - **The walk starts at the request's tree id.** [`plan`] compares the
//!   new tree with the base object by object from the root, reading each
//!   tree object from the delta or from the base entry's own store of
//!   tree objects (hashed again on every read: one that no longer hashes
//!   to its name is TREE_CACHE_CORRUPT). Where ids are equal the subtree
//!   is the base's, which the base entry holds as sealed; where they
//!   differ the walk goes down, so what is assembled is the request's
//!   tree by construction (git's own Merkle property), whatever the worker
//!   claimed, and costs O(what changed × depth).
//! - **Written as an archive is** ([`crate::extract`]): beneath the root,
//!   never through a link, credential-like paths withheld, the same limits.

use crate::apply::CredentialPolicy;
use crate::beneath;
use crate::blobs::BlobStore;
use crate::cache::Stamp;
use crate::error::{Error, Result};
use crate::extract::{ArchiveLimits, MAX_LINK_TARGET, make_link, write_member};
use airlock_proto::bundle::{SOURCE_DELTA_HEADER, SOURCE_DELTA_SCHEMA, SourceDelta};
use airlock_proto::path::check_relative_path;
use airlock_proto::tree::{ObjectEntry, ObjectFormat, TreeEntry, object_id, parse_tree_object};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};

const DIR: u32 = 0o40000;
const LINK: u32 = 0o120000;

/// A parsed, hash-checked source delta.
#[derive(Debug)]
pub struct Delta {
    /// The tree it starts from.
    pub base: String,
    /// The tree it makes (the request's).
    pub tree: String,
    trees: HashMap<Vec<u8>, Vec<u8>>,
    blobs: HashMap<Vec<u8>, Vec<u8>>,
    /// Bytes of object content it carries.
    pub bytes: u64,
}

impl Delta {
    /// Tree objects and blobs it carries.
    pub fn objects(&self) -> (usize, usize) {
        (self.trees.len(), self.blobs.len())
    }
}

/// Parses `archive` as a source delta for `tree`, or `None` when it is a
/// whole source archive (its first member is not the delta's header).
pub fn parse(archive: &[u8], tree: &str, limits: &ArchiveLimits) -> Result<Option<Delta>> {
    let format = ObjectFormat::of_id(tree)
        .ok_or_else(|| Error::ArchiveDigest(format!("{tree:?} is not a tree id")))?;
    let invalid = |e: std::io::Error| Error::ArchiveInvalid(format!("source delta: {e}"));
    let mut tar = tar::Archive::new(archive);
    // Whatever does not begin with the header (a whole archive, gzipped
    // or not, or no archive at all) is for crate::extract to judge.
    let Ok(mut entries) = tar.entries() else {
        return Ok(None);
    };
    let Some(Ok(mut first)) = entries.next() else {
        return Ok(None);
    };
    if first.path_bytes().as_ref() != SOURCE_DELTA_HEADER.as_bytes() {
        return Ok(None);
    }
    let mut header = Vec::new();
    (&mut first)
        .take(64 * 1024)
        .read_to_end(&mut header)
        .map_err(invalid)?;
    let header: SourceDelta = serde_json::from_slice(&header)
        .map_err(|e| Error::ArchiveInvalid(format!("source delta header: {e}")))?;
    if header.schema != SOURCE_DELTA_SCHEMA
        || header.source_tree != tree
        || ObjectFormat::of_id(&header.base) != Some(format)
        || header.base == tree
    {
        return Err(Error::ArchiveDigest(format!(
            "the source delta is not one for tree {tree}"
        )));
    }
    let mut delta = Delta {
        base: header.base,
        tree: tree.to_owned(),
        trees: HashMap::new(),
        blobs: HashMap::new(),
        bytes: 0,
    };
    let mut count: u64 = 1;
    for entry in entries {
        let mut entry = entry.map_err(invalid)?;
        count += 1;
        if count > limits.max_entries {
            return Err(Error::ArchiveLimit(format!(
                "more than {} members",
                limits.max_entries
            )));
        }
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let (kind, map) = match name.split_once('/') {
            Some(("t", _)) => ("tree", &mut delta.trees),
            Some(("b", _)) => ("blob", &mut delta.blobs),
            _ => {
                return Err(Error::ArchiveMember {
                    path: name,
                    why: "not an object of a source delta".into(),
                });
            }
        };
        let id = &name[2..];
        if entry.header().entry_type() != tar::EntryType::Regular
            || ObjectFormat::of_id(id) != Some(format)
        {
            return Err(Error::ArchiveMember {
                path: name,
                why: "not an object of a source delta".into(),
            });
        }
        let size = entry.header().size().map_err(invalid)?;
        if size > limits.max_file_bytes {
            return Err(Error::ArchiveLimit(format!(
                "{name}: {size} bytes, more than {}",
                limits.max_file_bytes
            )));
        }
        delta.bytes = delta.bytes.saturating_add(size);
        if delta.bytes > limits.max_total_bytes {
            return Err(Error::ArchiveLimit(format!(
                "more than {} bytes of objects",
                limits.max_total_bytes
            )));
        }
        let mut content = Vec::with_capacity(size as usize);
        (&mut entry)
            .take(size)
            .read_to_end(&mut content)
            .map_err(invalid)?;
        let oid = object_id(format, kind, &content);
        if hex::encode(&oid) != id {
            return Err(Error::ArchiveDigest(format!(
                "{name}: the content hashes to {}",
                hex::encode(&oid)
            )));
        }
        if map.insert(oid, content).is_some() {
            return Err(Error::ArchivePath {
                path: name,
                why: "duplicate member",
            });
        }
    }
    if !delta
        .trees
        .contains_key(&hex::decode(tree).unwrap_or_default())
    {
        return Err(Error::ArchiveInvalid(format!(
            "the source delta lacks the root tree object {tree}"
        )));
    }
    Ok(Some(delta))
}

/// What turns the base's directory into the new tree's.
#[derive(Debug, Default)]
pub struct Plan {
    /// Paths of the base to remove (a directory with all it holds).
    pub remove: Vec<String>,
    /// Directories to make, parents first.
    pub mkdir: Vec<String>,
    /// Entries to write: `(path, mode, raw id)`.
    pub write: Vec<(String, u32, Vec<u8>)>,
    /// Directories whose entries change (`""` is the root).
    pub touched: BTreeSet<String>,
    /// The new tree's objects not yet in the store, `(raw id, content)`.
    pub objects: Vec<airlock_proto::tree::RawObject>,
    /// The base's blobs at the paths removed or replaced, `(raw id,
    /// executable)`: the blob store lets go of those no entry links.
    pub released: Vec<(Vec<u8>, bool)>,
}

/// Reads tree objects for [`plan`]: from the delta, else from a store
/// directory of `<hex id>` files, hashed again on every read.
struct Trees<'a> {
    format: ObjectFormat,
    delta: &'a Delta,
    store: &'a Path,
    used: BTreeMap<Vec<u8>, bool>,
}

impl Trees<'_> {
    fn get(&mut self, oid: &[u8], new: bool) -> Result<Vec<ObjectEntry>> {
        let hex_id = hex::encode(oid);
        let body = match self.delta.trees.get(oid).filter(|_| new) {
            Some(b) => {
                self.used.insert(oid.to_vec(), true);
                b.clone()
            }
            None => {
                let path = self.store.join(&hex_id);
                let body = std::fs::read(&path).map_err(|e| {
                    if e.kind() == std::io::ErrorKind::NotFound && new {
                        Error::ArchiveInvalid(format!(
                            "the source delta lacks tree object {hex_id}"
                        ))
                    } else {
                        Error::CacheCorrupt(format!("tree object {hex_id}: {e}"))
                    }
                })?;
                if object_id(self.format, "tree", &body) != oid {
                    return Err(Error::CacheCorrupt(format!(
                        "tree object {hex_id} no longer hashes to its id"
                    )));
                }
                body
            }
        };
        parse_tree_object(self.format, &body).map_err(|e| {
            if new {
                Error::ArchiveInvalid(format!("tree object {hex_id}: {e}"))
            } else {
                Error::CacheCorrupt(format!("tree object {hex_id}: {e}"))
            }
        })
    }
}

fn join(dir: &str, name: &[u8]) -> Result<String> {
    let name = std::str::from_utf8(name).map_err(|_| Error::ArchivePath {
        path: String::from_utf8_lossy(name).into_owned(),
        why: "not UTF-8",
    })?;
    let path = if dir.is_empty() {
        name.to_owned()
    } else {
        format!("{dir}/{name}")
    };
    check_relative_path(&path).map_err(|_| Error::ArchivePath {
        path: path.clone(),
        why: "not a clean relative path",
    })?;
    Ok(path)
}

/// Compares the delta's tree with its base from the root, reading the
/// base's tree objects from `store`: what to remove, make and write.
pub fn plan(delta: &Delta, store: &Path, limits: &ArchiveLimits) -> Result<Plan> {
    let format = ObjectFormat::of_id(&delta.tree)
        .ok_or_else(|| Error::ArchiveDigest("not a tree id".into()))?;
    let mut trees = Trees {
        format,
        delta,
        store,
        used: BTreeMap::new(),
    };
    let mut plan = Plan::default();
    let root = hex::decode(&delta.tree).unwrap_or_default();
    let base = hex::decode(&delta.base).unwrap_or_default();
    diff(&mut trees, &mut plan, "", &root, &base)?;
    let ops = (plan.remove.len() + plan.mkdir.len() + plan.write.len()) as u64;
    if ops > limits.max_entries {
        return Err(Error::ArchiveLimit(format!(
            "more than {} paths change",
            limits.max_entries
        )));
    }
    for (oid, _) in trees.used {
        if !store.join(hex::encode(&oid)).exists() {
            let body = delta.trees[&oid].clone();
            plan.objects.push((oid, body));
        }
    }
    Ok(plan)
}

fn diff(trees: &mut Trees<'_>, plan: &mut Plan, dir: &str, new: &[u8], old: &[u8]) -> Result<()> {
    if new == old {
        return Ok(());
    }
    let mut names: BTreeMap<Vec<u8>, (Option<ObjectEntry>, Option<ObjectEntry>)> = BTreeMap::new();
    for e in trees.get(old, false)? {
        let name = e.name.clone();
        names.entry(name).or_default().0 = Some(e);
    }
    for e in trees.get(new, true)? {
        let name = e.name.clone();
        names.entry(name).or_default().1 = Some(e);
    }
    for (name, (was, is)) in names {
        let path = join(dir, &name)?;
        match (&was, &is) {
            (Some(w), Some(i)) if w.mode == i.mode && w.oid == i.oid => {}
            (Some(w), Some(i)) if w.mode == DIR && i.mode == DIR => {
                diff(trees, plan, &path, &i.oid, &w.oid)?;
            }
            _ => {
                plan.touched.insert(dir.to_owned());
                if let Some(w) = &was {
                    plan.remove.push(path.clone());
                    gone(trees, plan, w)?;
                }
                if let Some(i) = is {
                    add(trees, plan, &path, &i)?;
                }
            }
        }
    }
    Ok(())
}

/// Counts the base's blobs at or beneath a path the new tree removes or
/// replaces into [`Plan::released`].
fn gone(trees: &mut Trees<'_>, plan: &mut Plan, e: &ObjectEntry) -> Result<()> {
    match e.mode {
        DIR => {
            for child in trees.get(&e.oid, false)? {
                gone(trees, plan, &child)?;
            }
        }
        0o100644 | 0o100755 => plan.released.push((e.oid.clone(), e.mode == 0o100755)),
        _ => {}
    }
    Ok(())
}

fn add(trees: &mut Trees<'_>, plan: &mut Plan, path: &str, e: &ObjectEntry) -> Result<()> {
    if e.mode != DIR {
        plan.write.push((path.to_owned(), e.mode, e.oid.clone()));
        return Ok(());
    }
    plan.mkdir.push(path.to_owned());
    for child in trees.get(&e.oid, true)? {
        plan.touched.insert(path.to_owned());
        let p = join(path, &child.name)?;
        add(trees, plan, &p, &child)?;
    }
    Ok(())
}

/// What [`apply`] changed.
#[derive(Debug, Default)]
pub struct Applied {
    /// Regular files written, and removed.
    pub files: (u64, u64),
    /// Bytes of files written, and removed.
    pub bytes: (u64, u64),
    /// The tree's entries not present as files now (submodules, withheld
    /// paths), after removing those beneath removed paths.
    pub extras: Vec<TreeEntry>,
    /// Paths (relative to the entry: `tree/…`, `objects/…`) made or
    /// changed, each once: the caller adds them to the entry's stamp
    /// (after any chown).
    pub after: BTreeSet<PathBuf>,
}

/// The entry [`apply`] changes: its directory (`tree/` the base's files,
/// `objects/` its tree objects), the blob store its new files join, and
/// its stamp.
#[derive(Debug)]
pub struct Site<'a> {
    /// The entry's directory.
    pub entry: &'a Path,
    /// The blob store.
    pub store: &'a BlobStore,
    /// The entry's stamp: each changed path's line as it was before is
    /// taken out (the caller adds [`Applied::after`] back).
    pub stamp: &'a mut Stamp,
}

/// Applies `plan` to the entry at `site`, which becomes the delta's tree.
/// `extras` are the base's.
pub fn apply(
    site: Site<'_>,
    delta: &Delta,
    plan: &Plan,
    extras: Vec<TreeEntry>,
    credentials: &CredentialPolicy,
    on_staged: &mut dyn FnMut(),
) -> Result<Applied> {
    let Site {
        entry,
        store,
        stamp,
    } = site;
    let tree = entry.join("tree");
    let setup = |e: std::io::Error, p: &Path| Error::Setup {
        path: p.to_owned(),
        detail: e.to_string(),
    };
    let rel = |p: &str| -> PathBuf {
        if p.is_empty() {
            PathBuf::from("tree")
        } else {
            Path::new("tree").join(p)
        }
    };
    let mut out = Applied {
        extras: extras
            .into_iter()
            .filter(|x| {
                !plan
                    .remove
                    .iter()
                    .any(|r| x.path == *r || x.path.starts_with(&format!("{r}/")))
            })
            .collect(),
        ..Applied::default()
    };
    // Before: the directories whose entries change, and each removed path
    // with everything beneath it, as they are now.
    let mut before = BTreeSet::new();
    for d in &plan.touched {
        before.insert(rel(d));
    }
    if !plan.objects.is_empty() {
        before.insert(PathBuf::from("objects"));
    }
    for r in &plan.remove {
        let path = tree.join(r);
        if let Ok(meta) = std::fs::symlink_metadata(&path) {
            if meta.is_dir() {
                crate::layer::walk(&path, &mut |p, m| {
                    if m.is_file() {
                        out.files.1 += 1;
                        out.bytes.1 += m.len();
                    }
                    before.insert(p.strip_prefix(entry).unwrap_or(p).to_owned());
                    Ok(())
                })?;
            } else if meta.is_file() {
                out.files.1 += 1;
                out.bytes.1 += meta.len();
            }
            before.insert(rel(r));
        }
    }
    for p in &before {
        if let Ok(meta) = std::fs::symlink_metadata(entry.join(p)) {
            stamp.sub(p, &meta);
        }
    }
    // Removed paths are kept under undo/ (by their index in the plan)
    // until the new tree is sealed: a crash before then is rolled back.
    let undo = entry.join("undo");
    if !plan.remove.is_empty() {
        std::fs::create_dir(&undo).map_err(|e| setup(e, &undo))?;
    }
    for (i, r) in plan.remove.iter().enumerate() {
        let path = tree.join(r);
        if std::fs::symlink_metadata(&path).is_err() {
            continue; // withheld, or a submodule: never on disk
        }
        let kept = undo.join(i.to_string());
        std::fs::rename(&path, &kept).map_err(|e| setup(e, &path))?;
    }
    on_staged();
    let root = rustix::fs::open(
        &tree,
        rustix::fs::OFlags::RDONLY
            | rustix::fs::OFlags::DIRECTORY
            | rustix::fs::OFlags::NOFOLLOW
            | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| setup(e.into(), &tree))?;
    let extra = |mode: u32, oid: &[u8], path: &str| TreeEntry {
        mode,
        oid: hex::encode(oid),
        path: path.to_owned(),
    };
    for d in &plan.mkdir {
        if !credentials.denies(d) {
            beneath::dir(&root, d, true)?;
            out.after.insert(rel(d));
        }
    }
    for (path, mode, oid) in &plan.write {
        let blob = || {
            delta.blobs.get(oid).ok_or_else(|| {
                Error::ArchiveInvalid(format!(
                    "the source delta lacks blob {} of {path}",
                    hex::encode(oid)
                ))
            })
        };
        match *mode {
            0o160000 => out.extras.push(extra(*mode, oid, path)),
            _ if credentials.denies(path) => {
                // Not written, but the tree holds it (its id is known;
                // its content, sent or not, is never needed).
                out.extras.push(extra(*mode, oid, path));
            }
            LINK => {
                let target = blob()?;
                if target.is_empty() || target.len() > MAX_LINK_TARGET || target.contains(&0) {
                    return Err(Error::ArchiveLink {
                        path: path.clone(),
                        kind: "symbolic link with an empty or over-long target",
                    });
                }
                make_link(&root, path, target)?;
                out.after.insert(rel(path));
            }
            _ if !delta.blobs.contains_key(oid) => {
                // Left out by the worker: the base holds it at another
                // path, so the blob store does (checked as it is linked).
                let executable = *mode == 0o100755;
                let (dir, name) = beneath::parent_for_create(&root, path)?;
                if !store.link_at(oid, executable, &dir, name)? {
                    blob()?;
                }
                let st = rustix::fs::statat(&dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(|e| setup(e.into(), &tree.join(path)))?;
                out.files.0 += 1;
                out.bytes.0 += st.st_size as u64;
                out.after.insert(rel(path));
            }
            _ => {
                let content = blob()?;
                let never = || Error::ArchiveInvalid("unreachable".into());
                let dir = write_member(
                    &root,
                    path,
                    if *mode == 0o100755 { 0o755 } else { 0o644 },
                    content.len() as u64,
                    &mut content.as_slice(),
                    &std::cell::Cell::new(false),
                    &never,
                )?;
                store.adopt_at(&dir, beneath::split(path).1, oid, *mode == 0o100755)?;
                out.files.0 += 1;
                out.bytes.0 += content.len() as u64;
                out.after.insert(rel(path));
            }
        }
    }
    let objects = entry.join("objects");
    for (oid, body) in &plan.objects {
        let path = objects.join(hex::encode(oid));
        std::fs::write(&path, body).map_err(|e| setup(e, &path))?;
        out.after
            .insert(Path::new("objects").join(hex::encode(oid)));
    }
    out.after.extend(before);
    Ok(out)
}

/// The record of a delta being applied to a moved entry
/// (`<entry>/advance.json`), written before anything changes: a crash
/// mid-assembly is undone from it at the next start ([`roll_back`]).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Journal {
    /// The tree the entry held.
    pub base: String,
    /// Its seal, as it was.
    pub base_seal: serde_json::Value,
    /// Paths removed, in order: each kept at `undo/<index>`.
    pub removed: Vec<String>,
    /// Paths made (directories before what they hold).
    pub created: Vec<String>,
    /// Tree objects added (hex ids).
    pub objects: Vec<String>,
}

/// The journal's file name in an entry.
pub const JOURNAL: &str = "advance.json";

impl Journal {
    /// The journal of applying `plan` to the entry of `base`.
    pub fn of(base: &str, base_seal: serde_json::Value, plan: &Plan) -> Journal {
        Journal {
            base: base.to_owned(),
            base_seal,
            removed: plan.remove.clone(),
            created: plan
                .mkdir
                .iter()
                .cloned()
                .chain(plan.write.iter().map(|(p, _, _)| p.clone()))
                .collect(),
            objects: plan.objects.iter().map(|(o, _)| hex::encode(o)).collect(),
        }
    }

    /// Writes it into `entry` (synced: it must be there before the first
    /// change is).
    pub fn write(&self, entry: &Path) -> Result<()> {
        let path = entry.join(JOURNAL);
        let bytes = serde_json::to_vec(self).map_err(|e| Error::Setup {
            path: path.clone(),
            detail: e.to_string(),
        })?;
        airlock_spool::publish_path(&path, &bytes).map_err(|e| Error::Setup {
            path: path.clone(),
            detail: e.to_string(),
        })?;
        Ok(())
    }
}

/// Undoes an interrupted [`apply`] in `entry` from its journal: what was
/// made is removed, what was removed is put back, the added tree objects
/// go, and the base's seal is written again without its boot id, so the
/// entry is hashed in full on its first use (renames changed its stamp).
/// Returns the base tree.
pub fn roll_back(entry: &Path) -> Result<String> {
    let setup = |e: &dyn std::fmt::Display, p: &Path| Error::Setup {
        path: p.to_owned(),
        detail: e.to_string(),
    };
    let path = entry.join(JOURNAL);
    let bytes = std::fs::read(&path).map_err(|e| setup(&e, &path))?;
    let journal: Journal = serde_json::from_slice(&bytes).map_err(|e| setup(&e, &path))?;
    let tree = entry.join("tree");
    for p in journal.created.iter().rev() {
        let at = tree.join(p);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.is_dir() => crate::cache::remove_tree(&at),
            Ok(_) => std::fs::remove_file(&at).map_err(|e| setup(&e, &at))?,
            Err(_) => {}
        }
    }
    for (i, p) in journal.removed.iter().enumerate() {
        let kept = entry.join("undo").join(i.to_string());
        if std::fs::symlink_metadata(&kept).is_ok() {
            let at = tree.join(p);
            std::fs::rename(&kept, &at).map_err(|e| setup(&e, &at))?;
        }
    }
    for o in &journal.objects {
        let _ = std::fs::remove_file(entry.join("objects").join(o));
    }
    let mut seal = journal.base_seal;
    if let Some(obj) = seal.as_object_mut() {
        obj.remove("boot");
    }
    let seal_path = entry.join("seal.json");
    let seal_bytes = serde_json::to_vec(&seal).map_err(|e| setup(&e, &seal_path))?;
    std::fs::write(&seal_path, seal_bytes).map_err(|e| setup(&e, &seal_path))?;
    let _ = std::fs::remove_dir_all(entry.join("undo"));
    std::fs::remove_file(&path).map_err(|e| setup(&e, &path))?;
    Ok(journal.base)
}

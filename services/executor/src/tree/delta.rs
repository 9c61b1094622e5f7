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
//! - **Written as an archive is** ([`super::advance`], with
//!   [`super::extract`]'s writers): beneath the root, never through a
//!   link, credential-like paths withheld, the same limits.
//!
//! This module reads: [`parse`] and [`plan`] write nothing. Applying the
//! plan to the held entry is [`super::advance`]'s.

use super::extract::ArchiveLimits;
use crate::error::{Error, Result};
use airlock_proto::bundle::{SOURCE_DELTA_HEADER, SOURCE_DELTA_SCHEMA, SourceDelta};
use airlock_proto::path::check_relative_path;
use airlock_proto::tree::{ObjectEntry, ObjectFormat, object_id, parse_tree_object};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Read;
use std::path::Path;

const DIR: u32 = 0o40000;

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

    /// The content of a blob it carries, by raw id.
    pub fn blob(&self, oid: &[u8]) -> Option<&[u8]> {
        self.blobs.get(oid).map(Vec::as_slice)
    }
}

/// Parses `archive` as a source delta for `tree`, or `None` when it is a
/// whole source archive (its first member is not the delta's header).
pub fn parse(archive: &[u8], tree: &str, limits: &ArchiveLimits) -> Result<Option<Delta>> {
    let format = ObjectFormat::of_id(tree)
        .ok_or_else(|| Error::ArchiveDigest(format!("{tree:?} is not a tree id")))?;
    let mut tar = tar::Archive::new(archive);
    // Whatever does not begin with the header (a whole archive, gzipped
    // or not, or no archive at all) is for super::extract to judge.
    let Ok(mut entries) = tar.entries() else {
        return Ok(None);
    };
    let Some(Ok(mut first)) = entries.next() else {
        return Ok(None);
    };
    if first.path_bytes().as_ref() != SOURCE_DELTA_HEADER.as_bytes() {
        return Ok(None);
    }
    let mut delta = Delta {
        base: read_header(&mut first, tree, format)?,
        tree: tree.to_owned(),
        trees: HashMap::new(),
        blobs: HashMap::new(),
        bytes: 0,
    };
    let mut count: u64 = 1;
    for entry in entries {
        let entry = entry.map_err(invalid)?;
        count += 1;
        if count > limits.max_entries {
            return Err(Error::ArchiveLimit(format!(
                "more than {} members",
                limits.max_entries
            )));
        }
        delta.take(entry, format, limits)?;
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

/// A source delta that cannot be read.
fn invalid(e: std::io::Error) -> Error {
    Error::ArchiveInvalid(format!("source delta: {e}"))
}

/// Reads the delta's header (its first member): it must be one for
/// `tree`, against a base of the same format. Returns the base.
fn read_header(first: &mut impl Read, tree: &str, format: ObjectFormat) -> Result<String> {
    let mut header = Vec::new();
    first
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
    Ok(header.base)
}

impl Delta {
    /// Takes one member: a tree object (`t/<id>`) or a blob (`b/<id>`)
    /// within the limits, whose content hashes to its id, once.
    fn take(
        &mut self,
        mut entry: tar::Entry<'_, &[u8]>,
        format: ObjectFormat,
        limits: &ArchiveLimits,
    ) -> Result<()> {
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let (kind, map) = match name.split_once('/') {
            Some(("t", _)) => ("tree", &mut self.trees),
            Some(("b", _)) => ("blob", &mut self.blobs),
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
        self.bytes = self.bytes.saturating_add(size);
        if self.bytes > limits.max_total_bytes {
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
        Ok(())
    }
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

//! The delta's application to a held entry: the entry of a delta's base
//! becomes the entry of the delta's tree, changed where the two differ
//! ([`super::delta::plan`]) and nowhere else, its stamp updated by those
//! paths alone; O(what changed).
//!
//! ```text
//!  <work>/trees/<base>/ ──move (journal first)──▶ .fill-<tree>-<pid>/ ──apply──▶ seal
//!                       ──copy (files as links)──▶      (another request still waits on the base)
//!  on failure: a moved base is rolled back and put back; a copy is removed
//! ```
//!
//! The cache decides (is the base usable, does a request wait on it) and
//! installs what is sealed ([`super::TreeCache::advance`]); a `Held`
//! entry only ever changes its staging directory. The member writers are
//! the extraction's ([`super::extract`]): beneath the root, never through
//! a link, credential-like paths withheld.

use super::blobs::BlobStore;
use super::delta::{Delta, Plan};
use super::extract::{MAX_LINK_TARGET, make_link, write_member};
use super::fs::{chown_tree, clone_tree, copy_tree, open_dir, remove_tree, setup_error, walk};
use super::journal::{Journal, roll_back};
use super::seal::Seal;
use super::stamp::Stamp;
use crate::apply::CredentialPolicy;
use crate::beneath;
use crate::error::{Error, Result};
use airlock_proto::tree::TreeEntry;
use rustix::fd::OwnedFd;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const LINK: u32 = 0o120000;

/// A held entry a delta is applied to, and where the new tree is made.
#[derive(Debug)]
pub(super) struct Held<'a> {
    /// The delta, parsed.
    pub(super) delta: &'a Delta,
    /// What it changes in the base ([`super::delta::plan`]).
    pub(super) plan: &'a Plan,
    /// Credential-path allowances: a path they deny is never written.
    pub(super) credentials: &'a CredentialPolicy,
    /// The base's entry.
    pub(super) entry: PathBuf,
    /// The base's seal.
    pub(super) seal: Seal,
    /// Where the new tree is made (`.fill-<tree>-<pid>`, absent).
    pub(super) staging: PathBuf,
    /// The blob store the new files join.
    pub(super) store: &'a BlobStore,
    /// Run as root, the commands' uid and gid, who own an entry's files.
    pub(super) owner: Option<(u32, u32)>,
    /// Another request still waits on the base: copied, not moved.
    pub(super) copied: bool,
}

/// What [`Held::apply`] changed.
#[derive(Debug, Default)]
pub(super) struct Applied {
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

impl Held<'_> {
    /// Copies the base into the staging directory (the base stays as it
    /// was): its files as hard links to the same blobs, its tree objects,
    /// handed to the owner. Returns the copy's stamp.
    pub(super) fn copy(&self) -> Result<Stamp> {
        let (tmp, base) = (&self.staging, &self.entry);
        let made = (|| {
            std::fs::create_dir(tmp).map_err(|e| setup_error(e, tmp))?;
            // Files as hard links to the same blobs (a file the file
            // system will not link again, copied).
            clone_tree(&base.join("tree"), &tmp.join("tree"), &mut |src, dst| {
                std::fs::hard_link(src, dst).or_else(|_| std::fs::copy(src, dst).map(drop))
            })?;
            copy_tree(&base.join("objects"), &tmp.join("objects"))?;
            if let Some((uid, gid)) = self.owner {
                chown_tree(&tmp.join("tree"), uid, gid).map_err(|e| setup_error(e, tmp))?;
            }
            Stamp::of_entry(tmp)
        })();
        if made.is_err() {
            remove_tree(tmp);
        }
        made
    }

    /// Moves the base to the staging directory, the journal of the plan
    /// written into it first.
    pub(super) fn take(&self) -> Result<()> {
        let seal = serde_json::to_value(&self.seal).map_err(|e| setup_error(e, &self.entry))?;
        // The journal first, in the entry it describes: a crash from
        // here on is rolled back at the next start.
        Journal::of(&self.delta.base, seal, self.plan).write(&self.entry)?;
        std::fs::rename(&self.entry, &self.staging).map_err(|e| setup_error(e, &self.entry))
    }

    /// The base's stamp as sealed: a moved base's, which the delta updates.
    pub(super) fn sealed_stamp(&self) -> Result<Stamp> {
        self.seal
            .stamp
            .as_deref()
            .and_then(Stamp::from_hex)
            .ok_or_else(|| Error::CacheCorrupt(format!("{}: an unreadable stamp", self.delta.base)))
    }

    /// Applies the plan in the staging directory and seals it as the
    /// delta's tree, `stamp` (the staging directory's) updated. On failure
    /// a moved base goes back where it was (hashed in full on its next
    /// use); a copy, or what cannot be undone, goes.
    pub(super) fn assemble(&self, mut stamp: Stamp, on_staged: &mut dyn FnMut()) -> Result<Seal> {
        let sealed = self.seal_applied(&mut stamp, on_staged);
        if sealed.is_err() {
            let restored = !self.copied
                && roll_back(&self.staging).is_ok()
                && std::fs::rename(&self.staging, &self.entry).is_ok();
            if !restored {
                remove_tree(&self.staging);
            }
        }
        sealed
    }

    /// [`Held::apply`], then what changed handed to the owner and added to
    /// `stamp`, and the seal written.
    fn seal_applied(&self, stamp: &mut Stamp, on_staged: &mut dyn FnMut()) -> Result<Seal> {
        let tmp = &self.staging;
        let applied = self.apply(stamp, on_staged)?;
        for rel in &applied.after {
            let path = tmp.join(rel);
            if let (Some((uid, gid)), true) = (self.owner, rel.starts_with("tree")) {
                if std::fs::symlink_metadata(&path).is_ok() {
                    std::os::unix::fs::lchown(&path, Some(uid), Some(gid))
                        .map_err(|e| setup_error(e, &path))?;
                }
            }
        }
        for rel in &applied.after {
            if let Ok(meta) = std::fs::symlink_metadata(tmp.join(rel)) {
                stamp.add(rel, &meta);
            }
        }
        let files = (self.seal.files + applied.files.0).saturating_sub(applied.files.1);
        let bytes = (self.seal.bytes + applied.bytes.0).saturating_sub(applied.bytes.1);
        let tree = &self.delta.tree;
        let sealed = Seal::new(tree, (files, bytes), &applied.extras, stamp.to_hex());
        sealed.write(tmp)?;
        Ok(sealed)
    }

    /// Applies the plan to the staging directory, which becomes the
    /// delta's tree: each changed path's line as it was before is taken
    /// out of `stamp` (the caller adds [`Applied::after`] back).
    fn apply(&self, stamp: &mut Stamp, on_staged: &mut dyn FnMut()) -> Result<Applied> {
        let (entry, plan) = (self.staging.as_path(), self.plan);
        let removed = |x: &TreeEntry| {
            plan.remove
                .iter()
                .any(|r| x.path == *r || x.path.starts_with(&format!("{r}/")))
        };
        let mut out = Applied {
            extras: self
                .seal
                .extras()
                .into_iter()
                .filter(|x| !removed(x))
                .collect(),
            ..Applied::default()
        };
        let before = before(entry, plan, &mut out)?;
        for p in &before {
            if let Ok(meta) = std::fs::symlink_metadata(entry.join(p)) {
                stamp.sub(p, &meta);
            }
        }
        set_aside(entry, plan)?;
        on_staged();
        let mut writer = Writer {
            tree: entry.join("tree"),
            root: open_dir(&entry.join("tree"))?,
            delta: self.delta,
            store: self.store,
            credentials: self.credentials,
            out,
        };
        for d in &plan.mkdir {
            writer.mkdir(d)?;
        }
        for (path, mode, oid) in &plan.write {
            writer.write(path, *mode, oid)?;
        }
        let mut out = writer.out;
        let objects = entry.join("objects");
        for (oid, body) in &plan.objects {
            let path = objects.join(hex::encode(oid));
            std::fs::write(&path, body).map_err(|e| setup_error(e, &path))?;
            out.after
                .insert(Path::new("objects").join(hex::encode(oid)));
        }
        out.after.extend(before);
        Ok(out)
    }
}

/// `tree/<p>` (`tree` for the root, `""`), relative to the entry.
fn rel(p: &str) -> PathBuf {
    if p.is_empty() {
        PathBuf::from("tree")
    } else {
        Path::new("tree").join(p)
    }
}

/// Before: the directories whose entries change, and each removed path
/// with everything beneath it, as they are now (relative to `entry`);
/// the removed files counted into `out`.
fn before(entry: &Path, plan: &Plan, out: &mut Applied) -> Result<BTreeSet<PathBuf>> {
    let tree = entry.join("tree");
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
                walk(&path, &mut |p, m| {
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
    Ok(before)
}

/// Removed paths are kept under undo/ (by their index in the plan)
/// until the new tree is sealed: a crash before then is rolled back.
fn set_aside(entry: &Path, plan: &Plan) -> Result<()> {
    let tree = entry.join("tree");
    let undo = entry.join("undo");
    if !plan.remove.is_empty() {
        std::fs::create_dir(&undo).map_err(|e| setup_error(e, &undo))?;
    }
    for (i, r) in plan.remove.iter().enumerate() {
        let path = tree.join(r);
        if std::fs::symlink_metadata(&path).is_err() {
            continue; // withheld, or a submodule: never on disk
        }
        let kept = undo.join(i.to_string());
        std::fs::rename(&path, &kept).map_err(|e| setup_error(e, &path))?;
    }
    Ok(())
}

/// Writes the delta's paths beneath an entry's `tree/`, as an archive's
/// members are written, and counts what it made into `out`.
struct Writer<'a> {
    tree: PathBuf,
    root: OwnedFd,
    delta: &'a Delta,
    store: &'a BlobStore,
    credentials: &'a CredentialPolicy,
    out: Applied,
}

impl<'a> Writer<'a> {
    /// A directory the new tree has and the base had not.
    fn mkdir(&mut self, d: &str) -> Result<()> {
        if !self.credentials.denies(d) {
            beneath::dir(&self.root, d, true)?;
            self.out.after.insert(rel(d));
        }
        Ok(())
    }

    /// The entry `path` of `mode` and id `oid`: a submodule or a withheld
    /// path is recorded, not written; a link made; a file written or
    /// linked from the blob store.
    fn write(&mut self, path: &str, mode: u32, oid: &[u8]) -> Result<()> {
        match mode {
            0o160000 => self.out.extras.push(extra(mode, oid, path)),
            _ if self.credentials.denies(path) => {
                // Not written, but the tree holds it (its id is known;
                // its content, sent or not, is never needed).
                self.out.extras.push(extra(mode, oid, path));
            }
            LINK => {
                let target = self.blob(path, oid)?;
                if target.is_empty() || target.len() > MAX_LINK_TARGET || target.contains(&0) {
                    return Err(Error::ArchiveLink {
                        path: path.to_owned(),
                        kind: "symbolic link with an empty or over-long target",
                    });
                }
                make_link(&self.root, path, target)?;
                self.out.after.insert(rel(path));
            }
            _ if self.delta.blob(oid).is_none() => self.link_held(path, mode, oid)?,
            _ => self.write_file(path, mode, oid)?,
        }
        Ok(())
    }

    /// The content of the blob `oid` at `path`, which the delta must carry.
    fn blob(&self, path: &str, oid: &[u8]) -> Result<&'a [u8]> {
        self.delta.blob(oid).ok_or_else(|| {
            Error::ArchiveInvalid(format!(
                "the source delta lacks blob {} of {path}",
                hex::encode(oid)
            ))
        })
    }

    /// A file left out by the worker: the base holds it at another path,
    /// so the blob store does (checked as it is linked).
    fn link_held(&mut self, path: &str, mode: u32, oid: &[u8]) -> Result<()> {
        let executable = mode == 0o100755;
        let (dir, name) = beneath::parent_for_create(&self.root, path)?;
        if !self.store.link_at(oid, executable, &dir, name)? {
            self.blob(path, oid)?;
        }
        let st = rustix::fs::statat(&dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| setup_error(std::io::Error::from(e), &self.tree.join(path)))?;
        self.out.files.0 += 1;
        self.out.bytes.0 += st.st_size as u64;
        self.out.after.insert(rel(path));
        Ok(())
    }

    /// A file the delta carries: written, then adopted by the blob store.
    fn write_file(&mut self, path: &str, mode: u32, oid: &[u8]) -> Result<()> {
        let content = self.blob(path, oid)?;
        let mut reader = content;
        let never = || Error::ArchiveInvalid("unreachable".into());
        let dir = write_member(
            &self.root,
            path,
            if mode == 0o100755 { 0o755 } else { 0o644 },
            content.len() as u64,
            &mut reader,
            &std::cell::Cell::new(false),
            &never,
        )?;
        self.store
            .adopt_at(&dir, beneath::split(path).1, oid, mode == 0o100755)?;
        self.out.files.0 += 1;
        self.out.bytes.0 += content.len() as u64;
        self.out.after.insert(rel(path));
        Ok(())
    }
}

/// A tree entry that is not a file here.
fn extra(mode: u32, oid: &[u8], path: &str) -> TreeEntry {
    TreeEntry {
        mode,
        oid: hex::encode(oid),
        path: path.to_owned(),
    }
}

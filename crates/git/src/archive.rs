//! Deterministic source archives built from objects, never from a checkout.

use crate::AuthorityRepo;
use crate::error::{GitError, GitResult};
use airlock_proto::path::check_relative_path;
use airlock_proto::tree::{ObjectEntry, PAX_KEY_PREFIX, TreeEntry};
use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::process::Stdio;

/// Bounds on what an archive may contain.
#[derive(Debug, Clone, Copy)]
pub struct ArchiveLimits {
    /// Most files.
    pub max_entries: usize,
    /// Largest single file.
    pub max_file_bytes: u64,
    /// Largest sum of file sizes.
    pub max_total_bytes: u64,
}

impl Default for ArchiveLimits {
    fn default() -> Self {
        ArchiveLimits {
            max_entries: 100_000,
            max_file_bytes: 64 << 20,
            max_total_bytes: 1 << 30,
        }
    }
}

/// What went into an archive.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ArchiveStats {
    /// Regular files written.
    pub files: usize,
    /// Symbolic links written (as tar symlink members, their targets the
    /// link blobs' content).
    pub symlinks: usize,
    /// Sum of the files' sizes and the links' target lengths.
    pub bytes: u64,
    /// Entries left out because they are neither files nor links
    /// (submodules); the commit keeps them, the executor never sees them.
    /// Their modes and ids travel in the archive's pax global header (see
    /// [`airlock_proto::tree`]), so that the executor can recompute the
    /// tree id.
    pub skipped: Vec<String>,
}

struct Entry {
    mode: u32,
    oid: String,
    size: u64,
    path: String,
}

/// The git mode of a symbolic link.
const SYMLINK_MODE: u32 = 0o120000;

/// The git mode of a tree.
const TREE_MODE: u32 = 0o40000;

/// `dir/name`, checked as every path an archive carries is.
fn join_path(dir: &str, name: &[u8]) -> GitResult<String> {
    let name = std::str::from_utf8(name).map_err(|_| {
        GitError::Refused(airlock_proto::Error::with(
            airlock_proto::Code::PATH_INVALID,
            format!("{dir}/{}: not UTF-8", String::from_utf8_lossy(name)),
        ))
    })?;
    let path = match dir {
        "" => name.to_owned(),
        _ => format!("{dir}/{name}"),
    };
    check_relative_path(&path).map_err(GitError::Refused)?;
    Ok(path)
}

/// The pax records (`<length> <key>=<value>\n`, the length counting
/// itself) of the entries an archive carries as metadata only.
fn pax_records(entries: &[TreeEntry]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let body = format!(" {PAX_KEY_PREFIX}{i}={}\n", e.to_pax());
        // The length field counts its own digits.
        let mut len = body.len() + 1;
        while len.to_string().len() + body.len() != len {
            len = len.to_string().len() + body.len();
        }
        out.extend_from_slice(format!("{len}{body}").as_bytes());
    }
    out
}

impl AuthorityRepo {
    /// The git tree id of `commit` (its source tree's digest).
    pub fn tree_of(&self, commit: &str) -> GitResult<String> {
        if self.resolve_commit(commit)?.as_deref() != Some(commit) {
            return Err(GitError::ObjectMissing(commit.to_owned()));
        }
        let out = self.git.output(&[
            "rev-parse",
            "--verify",
            "--end-of-options",
            &format!("{commit}^{{tree}}"),
        ])?;
        Ok(out.trim().to_owned())
    }

    /// Lists the blobs of `commit`'s tree, refusing unsafe paths and
    /// enforcing `limits`, in git's (byte-sorted) order.
    fn tree_entries(
        &self,
        commit: &str,
        limits: &ArchiveLimits,
        stats: &mut ArchiveStats,
        skipped: &mut Vec<TreeEntry>,
    ) -> GitResult<Vec<Entry>> {
        if self.resolve_commit(commit)?.as_deref() != Some(commit) {
            return Err(GitError::ObjectMissing(commit.to_owned()));
        }
        let listing = self
            .git
            .output(&["ls-tree", "-r", "-l", "-z", "--full-tree", commit])?;
        let mut entries = Vec::new();
        for record in listing.split('\0').filter(|r| !r.is_empty()) {
            let (meta, path) = record
                .split_once('\t')
                .ok_or_else(|| std::io::Error::other("malformed ls-tree output"))?;
            let mut fields = meta.split_whitespace();
            let (mode, _kind, oid, size) =
                (fields.next(), fields.next(), fields.next(), fields.next());
            let (Some(mode), Some(oid), Some(size)) = (mode, oid, size) else {
                return Err(std::io::Error::other("malformed ls-tree output").into());
            };
            let mode =
                u32::from_str_radix(mode, 8).map_err(|e| std::io::Error::other(e.to_string()))?;
            if mode != 0o100644 && mode != 0o100755 && mode != SYMLINK_MODE {
                stats.skipped.push(path.to_owned());
                skipped.push(TreeEntry {
                    mode,
                    oid: oid.to_owned(),
                    path: path.to_owned(),
                });
                continue;
            }
            check_relative_path(path).map_err(GitError::Refused)?;
            let size: u64 = size
                .parse()
                .map_err(|_| std::io::Error::other("malformed blob size"))?;
            if size > limits.max_file_bytes {
                return Err(GitError::Limit(format!(
                    "{path} has {size} bytes, at most {}",
                    limits.max_file_bytes
                )));
            }
            stats.bytes += size;
            if stats.bytes > limits.max_total_bytes {
                return Err(GitError::Limit(format!(
                    "more than {} bytes in all",
                    limits.max_total_bytes
                )));
            }
            entries.push(Entry {
                mode,
                oid: oid.to_owned(),
                size,
                path: path.to_owned(),
            });
            if entries.len() > limits.max_entries {
                return Err(GitError::Limit(format!(
                    "more than {} files",
                    limits.max_entries
                )));
            }
        }
        Ok(entries)
    }

    /// Writes a tar of `commit`'s tree to `out`: regular files (mode 0644
    /// or 0755) and symbolic links (their targets as the tree has them,
    /// whatever they point to), in path order, owner 0:0, mtime 0, so the
    /// same commit always gives the same bytes. Content comes from `git cat-file
    /// --batch`: no filter, no textconv and no attribute is applied.
    pub fn source_archive(
        &self,
        commit: &str,
        limits: &ArchiveLimits,
        out: impl Write,
    ) -> GitResult<ArchiveStats> {
        let mut stats = ArchiveStats::default();
        let mut skipped = Vec::new();
        let entries = self.tree_entries(commit, limits, &mut stats, &mut skipped)?;
        let mut builder = tar::Builder::new(out);
        builder.mode(tar::HeaderMode::Deterministic);
        if !skipped.is_empty() {
            let records = pax_records(&skipped);
            let mut header = tar::Header::new_ustar();
            header.set_entry_type(tar::EntryType::XGlobalHeader);
            header.set_size(records.len() as u64);
            header.set_mode(0o644);
            header.set_uid(0);
            header.set_gid(0);
            header.set_mtime(0);
            builder.append_data(&mut header, "pax_global_header", records.as_slice())?;
        }
        let wanted: Vec<(&str, &String)> = entries.iter().map(|e| ("blob", &e.oid)).collect();
        let mut next = entries.iter();
        self.each_object(&wanted, limits, |_, _, data| {
            let entry = next
                .next()
                .ok_or_else(|| std::io::Error::other("more objects than entries"))?;
            if data.len() as u64 != entry.size {
                return Err(std::io::Error::other(format!(
                    "{}: {} bytes, ls-tree said {}",
                    entry.path,
                    data.len(),
                    entry.size
                ))
                .into());
            }
            let mut header = tar::Header::new_gnu();
            header.set_uid(0);
            header.set_gid(0);
            header.set_mtime(0);
            if entry.mode == SYMLINK_MODE {
                if data.is_empty() || data.contains(&0) {
                    return Err(GitError::Refused(airlock_proto::Error::with(
                        airlock_proto::Code::SOURCE_ARCHIVE_INVALID,
                        format!("{}: a symbolic link with an unusable target", entry.path),
                    )));
                }
                header.set_size(0);
                header.set_mode(0o777);
                header.set_entry_type(tar::EntryType::Symlink);
                let target = std::ffi::OsStr::from_bytes(data);
                builder.append_link(&mut header, &entry.path, target)?;
                stats.symlinks += 1;
            } else {
                header.set_size(entry.size);
                header.set_mode(if entry.mode == 0o100755 { 0o755 } else { 0o644 });
                header.set_entry_type(tar::EntryType::Regular);
                builder.append_data(&mut header, &entry.path, data)?;
                stats.files += 1;
            }
            Ok(())
        })?;
        builder.into_inner()?.flush()?;
        Ok(stats)
    }
}

/// What went into a source delta.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeltaStats {
    /// Tree objects sent (the root's among them).
    pub trees: usize,
    /// Blobs sent.
    pub blobs: usize,
    /// Bytes of their content.
    pub bytes: u64,
}

/// One `git cat-file --batch` session: objects read one at a time (git
/// flushes after each), for walks that choose what to read next from what
/// they read, or a list asked for at once from another thread and read in
/// order ([`AuthorityRepo::each_object`]).
struct Batch {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    out: BufReader<std::process::ChildStdout>,
}

impl Batch {
    fn start(git: &crate::command::Git) -> GitResult<Batch> {
        let mut child = git
            .command(&["cat-file", "--batch"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| GitError::Spawn {
                program: "git".into(),
                source,
            })?;
        let none = || std::io::Error::other("cat-file has no pipes");
        let stdin = child.stdin.take().ok_or_else(none)?;
        let out = BufReader::new(child.stdout.take().ok_or_else(none)?);
        Ok(Batch {
            child,
            stdin: Some(stdin),
            out,
        })
    }

    /// The content of `oid` (hex, checked by the caller) if the repository
    /// holds it as a `kind`; `None` if it is missing or of another kind.
    /// More than `max` bytes is [`GitError::Limit`].
    fn read(&mut self, oid: &str, kind: &str, max: u64) -> GitResult<Option<Vec<u8>>> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| std::io::Error::other("cat-file's input is closed"))?;
        writeln!(stdin, "{oid}")?;
        stdin.flush()?;
        self.answer(oid, kind, max)
    }

    /// [`Batch::read`]'s answer for `oid`, asked for already.
    fn answer(&mut self, oid: &str, kind: &str, max: u64) -> GitResult<Option<Vec<u8>>> {
        let mut line = String::new();
        self.out.read_line(&mut line)?;
        let mut parts = line.split_whitespace();
        let (found, size) = match (parts.next(), parts.next(), parts.next()) {
            (Some(o), Some("missing"), None) if o == oid => return Ok(None),
            (Some(o), Some(k), Some(size)) if o == oid => (
                k == kind,
                size.parse::<u64>()
                    .map_err(|_| std::io::Error::other("malformed object size"))?,
            ),
            _ => {
                return Err(
                    std::io::Error::other(format!("unexpected cat-file header {line:?}")).into(),
                );
            }
        };
        if found && size > max {
            return Err(GitError::Limit(format!(
                "object {oid} has {size} bytes, at most {max}"
            )));
        }
        let mut data = Vec::new();
        (&mut self.out).take(size + 1).read_to_end(&mut data)?;
        if data.pop() != Some(b'\n') || data.len() as u64 != size {
            return Err(std::io::Error::other("truncated cat-file output").into());
        }
        Ok(found.then_some(data))
    }

    /// The entries of tree `oid` and its content, or `None` when the
    /// repository does not hold it as a tree.
    fn tree(&mut self, oid: &str, limits: &ArchiveLimits) -> GitResult<Option<Vec<u8>>> {
        self.read(oid, "tree", limits.max_total_bytes)
    }

    fn finish(mut self) -> GitResult<()> {
        drop(self.stdin.take());
        let status = self.child.wait()?;
        if !status.success() {
            return Err(GitError::Failed {
                args: "cat-file --batch".into(),
                status: status.to_string(),
                stderr: String::new(),
            });
        }
        Ok(())
    }
}

/// The walk of a source delta: from the two roots down every path where
/// the trees differ (as the executor walks what it receives), collecting
/// the new side's tree objects (each once) and blob ids.
struct DeltaWalk<'a> {
    batch: &'a mut Batch,
    limits: &'a ArchiveLimits,
    trees: Vec<(String, Vec<u8>)>,
    /// The new side's blobs at changed paths, with their modes.
    blobs: Vec<(String, u32)>,
    seen: HashSet<String>,
    /// Whether the executor takes a blob the base holds from its blob
    /// store, and the base's blobs (id, mode) the walk met at paths that
    /// are not credential-like: the old side of every changed directory,
    /// and everything beneath a path removed or replaced.
    by_id: bool,
    held: HashSet<(String, u32)>,
}

impl DeltaWalk<'_> {
    fn entries(&self, oid: &str, body: &[u8]) -> GitResult<Vec<ObjectEntry>> {
        let format = airlock_proto::tree::ObjectFormat::of_id(oid)
            .ok_or_else(|| std::io::Error::other(format!("{oid}: not an object id")))?;
        airlock_proto::tree::parse_tree_object(format, body)
            .map_err(|e| GitError::from(std::io::Error::other(format!("tree {oid}: {e}"))))
    }

    /// A tree object of the new side: read, kept once, and parsed.
    fn new_tree(&mut self, oid: &str) -> GitResult<Vec<ObjectEntry>> {
        let body = self
            .batch
            .tree(oid, self.limits)?
            .ok_or_else(|| GitError::ObjectMissing(oid.to_owned()))?;
        let entries = self.entries(oid, &body)?;
        if self.seen.insert(oid.to_owned()) {
            self.trees.push((oid.to_owned(), body));
        }
        self.check_count()?;
        Ok(entries)
    }

    /// A tree object of the base (raw id): read and parsed, never sent.
    fn old_tree(&mut self, oid: &[u8]) -> GitResult<Vec<ObjectEntry>> {
        let oid = hex::encode(oid);
        let body = self
            .batch
            .tree(&oid, self.limits)?
            .ok_or_else(|| GitError::ObjectMissing(oid.clone()))?;
        self.entries(&oid, &body)
    }

    fn check_count(&self) -> GitResult<()> {
        if self.trees.len() + self.blobs.len() > self.limits.max_entries {
            return Err(GitError::Limit(format!(
                "more than {} objects changed",
                self.limits.max_entries
            )));
        }
        Ok(())
    }

    /// Compares the entries of the new and old tree objects at `dir`.
    fn diff(&mut self, dir: &str, new: Vec<ObjectEntry>, old: Vec<ObjectEntry>) -> GitResult<()> {
        let mut names: BTreeMap<Vec<u8>, (Option<ObjectEntry>, Option<ObjectEntry>)> =
            BTreeMap::new();
        for e in old {
            let name = e.name.clone();
            names.entry(name).or_default().0 = Some(e);
        }
        for e in new {
            let name = e.name.clone();
            names.entry(name).or_default().1 = Some(e);
        }
        for (name, (was, is)) in names {
            if let Some(w) = &was {
                let old_path = format!("{dir}/{}", String::from_utf8_lossy(&name));
                let replaced = is.as_ref().is_none_or(|i| i.mode != TREE_MODE);
                self.count_held(old_path.trim_start_matches('/'), w, replaced)?;
            }
            // What the new tree lacks the executor removes by itself.
            let Some(is) = is else { continue };
            let path = join_path(dir, &name)?;
            match was {
                Some(w) if w.mode == is.mode && w.oid == is.oid => {}
                Some(w) if w.mode == TREE_MODE && is.mode == TREE_MODE => {
                    let old = self.old_tree(&w.oid)?;
                    let new = self.new_tree(&hex::encode(&is.oid))?;
                    self.diff(&path, new, old)?;
                }
                _ => self.add(&path, &is)?,
            }
        }
        Ok(())
    }

    /// Everything at `path` on the new side (a subtree whole).
    fn add(&mut self, path: &str, e: &ObjectEntry) -> GitResult<()> {
        let oid = hex::encode(&e.oid);
        match e.mode {
            TREE_MODE => {
                for child in self.new_tree(&oid)? {
                    self.add(&join_path(path, &child.name)?, &child)?;
                }
            }
            0o100644 | 0o100755 | SYMLINK_MODE => {
                self.blobs.push((oid, e.mode));
                self.check_count()?;
            }
            // A submodule's commit is not in this repository.
            _ => {}
        }
        Ok(())
    }

    /// Counts the base's entry `e` at `path` among what the executor holds
    /// by id (when it takes blobs so): a file at a path that is not
    /// credential-like, and, for a directory the new tree removes or
    /// replaces (`gone`), every such file beneath it. A link's blob is its
    /// target, made again from what is sent, never held by id.
    fn count_held(&mut self, path: &str, e: &ObjectEntry, gone: bool) -> GitResult<()> {
        if !self.by_id {
            return Ok(());
        }
        match e.mode {
            0o100644 | 0o100755 if !airlock_proto::path::is_credential_path(path) => {
                self.held.insert((hex::encode(&e.oid), e.mode));
            }
            TREE_MODE if gone => {
                for child in self.old_tree(&e.oid)? {
                    let child_path = format!("{path}/{}", String::from_utf8_lossy(&child.name));
                    self.count_held(&child_path, &child, true)?;
                }
            }
            _ => {}
        }
        Ok(())
    }
}
impl AuthorityRepo {
    /// Writes a source delta of `tree` (the tree of a commit the caller
    /// resolved) against `base` (a tree the executor holds) to `out`: the
    /// header ([`airlock_proto::bundle::SOURCE_DELTA_HEADER`]), then
    /// `t/<id>` for the root tree object and each tree object at a path
    /// where the two trees differ (each object once, in the order the walk
    /// meets them), then `b/<id>` for each blob (file or link) at such a
    /// path, by id; deterministic like [`AuthorityRepo::source_archive`].
    /// One `git cat-file --batch` reads both roots, walks down where their
    /// ids differ, as the executor does on receipt, and reads what is
    /// sent: the cost follows the change, not the repository. With
    /// `by_id` (the executor keeps blobs by id), a blob the base holds
    /// with the same mode at a path the walk met that is not
    /// credential-like is left out (a file moved, renamed or copied within
    /// the changed directories crosses as its tree entry alone). Paths are
    /// checked and `limits` enforced on what is sent. `Ok(None)`, with
    /// nothing written, when the repository does not hold `base` as a
    /// tree.
    pub fn source_delta(
        &self,
        base: &str,
        tree: &str,
        limits: &ArchiveLimits,
        by_id: bool,
        out: impl Write,
    ) -> GitResult<Option<DeltaStats>> {
        use airlock_proto::bundle::{SOURCE_DELTA_HEADER, SOURCE_DELTA_SCHEMA, SourceDelta};
        let format = airlock_proto::tree::ObjectFormat::of_id(tree);
        if format.is_none() || airlock_proto::tree::ObjectFormat::of_id(base) != format {
            return Ok(None);
        }
        // One cat-file session reads both roots, walks down where they
        // differ and reads what is sent: no other git runs.
        let mut batch = Batch::start(&self.git)?;
        let Some(old_root) = batch.tree(base, limits)? else {
            batch.finish()?;
            return Ok(None);
        };
        let mut walk = DeltaWalk {
            batch: &mut batch,
            limits,
            trees: Vec::new(),
            blobs: Vec::new(),
            seen: HashSet::new(),
            by_id,
            held: HashSet::new(),
        };
        let old = walk.entries(base, &old_root)?;
        let new = walk.new_tree(tree)?;
        walk.diff("", new, old)?;
        let DeltaWalk {
            trees, blobs, held, ..
        } = walk;
        let mut blobs: Vec<String> = blobs
            .into_iter()
            .filter(|b| !held.contains(b))
            .map(|(oid, _)| oid)
            .collect();
        blobs.sort();
        blobs.dedup();
        if trees.len() + blobs.len() > limits.max_entries {
            return Err(GitError::Limit(format!(
                "more than {} objects changed",
                limits.max_entries
            )));
        }
        let tree = tree.to_owned();
        let header = serde_json::to_vec(&SourceDelta {
            schema: SOURCE_DELTA_SCHEMA.into(),
            base: base.to_owned(),
            source_tree: tree,
        })
        .map_err(|e| std::io::Error::other(e.to_string()))?;
        let mut builder = tar::Builder::new(out);
        builder.mode(tar::HeaderMode::Deterministic);
        let mut append = |name: &str, data: &[u8]| -> std::io::Result<()> {
            let mut h = tar::Header::new_gnu();
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(0);
            h.set_mode(0o644);
            h.set_size(data.len() as u64);
            h.set_entry_type(tar::EntryType::Regular);
            builder.append_data(&mut h, name, data)
        };
        append(SOURCE_DELTA_HEADER, &header)?;
        let mut stats = DeltaStats::default();
        let mut add_bytes = |n: usize| {
            stats.bytes += n as u64;
            if stats.bytes > limits.max_total_bytes {
                return Err(GitError::Limit(format!(
                    "more than {} bytes in all",
                    limits.max_total_bytes
                )));
            }
            Ok(())
        };
        for (oid, body) in &trees {
            add_bytes(body.len())?;
            append(&format!("t/{oid}"), body)?;
        }
        for oid in &blobs {
            let body = batch
                .read(oid, "blob", limits.max_file_bytes)?
                .ok_or_else(|| GitError::ObjectMissing(oid.clone()))?;
            add_bytes(body.len())?;
            append(&format!("b/{oid}"), &body)?;
        }
        batch.finish()?;
        stats.trees = trees.len();
        stats.blobs = blobs.len();
        builder.into_inner()?.flush()?;
        Ok(Some(stats))
    }

    /// Reads each `(kind, id)` through one `git cat-file --batch`, checking
    /// the kind and `limits.max_file_bytes`, and hands over its content.
    fn each_object(
        &self,
        wanted: &[(&str, &String)],
        limits: &ArchiveLimits,
        mut each: impl FnMut(&str, &str, &[u8]) -> GitResult<()>,
    ) -> GitResult<()> {
        let mut batch = Batch::start(&self.git)?;
        let mut stdin = batch
            .stdin
            .take()
            .ok_or_else(|| std::io::Error::other("no stdin"))?;
        let oids: Vec<String> = wanted.iter().map(|(_, o)| (*o).clone()).collect();
        let feeder = std::thread::spawn(move || -> std::io::Result<()> {
            for oid in oids {
                writeln!(stdin, "{oid}")?;
            }
            Ok(())
        });
        for (kind, oid) in wanted {
            let data = batch
                .answer(oid, kind, limits.max_file_bytes)?
                .ok_or_else(|| GitError::ObjectMissing((*oid).clone()))?;
            each(kind, oid, &data)?;
        }
        feeder
            .join()
            .map_err(|_| std::io::Error::other("cat-file feeder panicked"))??;
        batch.finish()
    }
}

//! Deterministic governed commits.

use crate::AuthorityRepo;
use crate::error::{GitError, GitResult};
use airlock_proto::path::check_relative_path;
use airlock_proto::{Code, Error};
use std::collections::BTreeMap;

/// One file change of a governed commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileChange {
    /// Repository-relative path.
    pub path: String,
    /// New content, or `None` to delete the file.
    pub content: Option<Vec<u8>>,
    /// Executable bit of the new content.
    pub executable: bool,
    /// True when the content is a symbolic link's target (mode 120000).
    pub symlink: bool,
}

impl FileChange {
    /// A write.
    pub fn write(path: &str, content: Vec<u8>, executable: bool) -> Self {
        FileChange {
            path: path.to_owned(),
            content: Some(content),
            executable,
            symlink: false,
        }
    }

    /// A symbolic link to `target` (created, or retargeted).
    pub fn symlink(path: &str, target: Vec<u8>) -> Self {
        FileChange {
            path: path.to_owned(),
            content: Some(target),
            executable: false,
            symlink: true,
        }
    }

    /// A deletion.
    pub fn delete(path: &str) -> Self {
        FileChange {
            path: path.to_owned(),
            content: None,
            executable: false,
            symlink: false,
        }
    }
}

/// Everything a governed commit is made of. The same spec always yields
/// the same commit OID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitSpec {
    /// The commit to build on (the binding's source head).
    pub parent: String,
    /// The changes, applied in order.
    pub changes: Vec<FileChange>,
    /// The commit message.
    pub message: String,
}

/// Author and committer of every governed commit.
const IDENTITY_NAME: &str = "airlock";
const IDENTITY_EMAIL: &str = "airlock@localhost";

fn escape() -> impl Fn(&str, &str) -> GitError {
    |path: &str, why: &str| {
        GitError::Refused(Error::with(Code::PATH_ESCAPE, format!("{path}: {why}")))
    }
}

/// A tree entry's mode in `git ls-tree` form.
const TREE_MODE: &str = "040000";
/// The git mode of a symbolic link.
const SYMLINK_MODE: &str = "120000";

/// One row of a tree.
#[derive(Debug, Clone, PartialEq, Eq)]
struct TreeEntryRow {
    mode: String,
    kind: String,
    oid: String,
}

/// A tree being edited: its rows, and the subtrees on the changed paths.
#[derive(Debug, Default)]
struct TreeEdit {
    entries: BTreeMap<String, TreeEntryRow>,
    children: BTreeMap<String, TreeEdit>,
    changed: bool,
}

impl TreeEdit {
    fn loaded(entries: BTreeMap<String, TreeEntryRow>) -> TreeEdit {
        TreeEdit {
            entries,
            ..TreeEdit::default()
        }
    }
}

impl AuthorityRepo {
    /// The rows of one tree object (not recursive).
    fn read_tree(&self, oid: &str) -> GitResult<BTreeMap<String, TreeEntryRow>> {
        let listing = self.git.output(&["ls-tree", "-z", "--full-tree", oid])?;
        let mut rows = BTreeMap::new();
        for record in listing.split('\0').filter(|r| !r.is_empty()) {
            let (meta, name) = record
                .split_once('\t')
                .ok_or_else(|| std::io::Error::other("malformed ls-tree output"))?;
            let mut f = meta.split(' ');
            let (Some(mode), Some(kind), Some(oid)) = (f.next(), f.next(), f.next()) else {
                return Err(std::io::Error::other("malformed ls-tree output").into());
            };
            rows.insert(
                name.to_owned(),
                TreeEntryRow {
                    mode: mode.to_owned(),
                    kind: kind.to_owned(),
                    oid: oid.to_owned(),
                },
            );
        }
        Ok(rows)
    }

    /// Writes the edited trees bottom-up; `None` for a tree left empty.
    fn write_tree(&self, edit: &mut TreeEdit) -> GitResult<Option<String>> {
        let children = std::mem::take(&mut edit.children);
        for (name, mut child) in children {
            if !child.changed {
                continue;
            }
            match self.write_tree(&mut child)? {
                Some(oid) => {
                    edit.entries.insert(
                        name,
                        TreeEntryRow {
                            mode: TREE_MODE.to_owned(),
                            kind: "tree".to_owned(),
                            oid,
                        },
                    );
                }
                None => {
                    edit.entries.remove(&name);
                }
            }
        }
        if edit.entries.is_empty() {
            return Ok(None);
        }
        let mut entries = Vec::with_capacity(edit.entries.len());
        for (name, row) in &edit.entries {
            let bad = |what: &str| GitError::Failed {
                args: "hash-object -t tree".to_owned(),
                status: "refused".to_owned(),
                stderr: format!("{name}: {what} in the tree git listed"),
            };
            let mode = u32::from_str_radix(&row.mode, 8).map_err(|_| bad("a mode not octal"))?;
            let oid = hex::decode(&row.oid).map_err(|_| bad("an object id not hex"))?;
            entries.push((name.as_bytes().to_vec(), mode, oid));
        }
        let content = airlock_proto::tree::tree_object(entries);
        Ok(Some(self.write_object("tree", &content)?))
    }

    /// Writes an object durably and returns its id. `git hash-object -w`
    /// reads the configuration, so `core.fsync` syncs it before it gets its
    /// name (`git mktree` reads none: what it wrote could be left, after a
    /// power loss, as an empty file under the object's name). git trusts a
    /// loose object that exists and only freshens it, so an object file of
    /// that name that does not hold the object (such an empty file) is
    /// removed and the object written again.
    fn write_object(&self, kind: &str, content: &[u8]) -> GitResult<String> {
        self.written(
            kind,
            &["hash-object", "-t", kind, "-w", "--stdin"],
            content,
            &[],
        )
    }

    /// Runs the git command `args` (with `input` and `env`) that writes
    /// one object of `kind` and prints its id; syncs it, and reads the
    /// whole object back as `kind` (`git cat-file <kind>` inflates all of
    /// it, so an empty or cut-short object file fails). If that fails (an
    /// object file git only freshened), removes the file and runs the
    /// command once more.
    fn written(
        &self,
        kind: &str,
        args: &[&str],
        input: &[u8],
        env: &[(&str, &str)],
    ) -> GitResult<String> {
        for _ in 0..2 {
            let oid = self
                .git
                .output_with(args, Some(input), env)?
                .trim()
                .to_owned();
            self.git.sync_loose_object(&oid)?;
            if self
                .git
                .run(&["cat-file", kind, &oid], None, &[])?
                .status
                .success()
            {
                return Ok(oid);
            }
            self.git.remove_loose_object(&oid)?;
        }
        Err(GitError::Failed {
            args: args.join(" "),
            status: "written twice".to_owned(),
            stderr: format!("the {kind} git names is still not readable"),
        })
    }

    /// The committer timestamp of `commit`, read from the raw object.
    fn committer_time(&self, commit: &str) -> GitResult<i64> {
        let raw = self.git.output(&["cat-file", "commit", commit])?;
        raw.lines()
            .take_while(|l| !l.is_empty())
            .find_map(|l| l.strip_prefix("committer "))
            .and_then(|l| l.rsplit(' ').nth(1))
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| std::io::Error::other("commit has no committer time").into())
    }

    /// Builds the commit of `spec` and returns its OID. Nothing but objects
    /// is written: no ref moves here (see [`AuthorityRepo::cas_update`]).
    ///
    /// Author and committer are airlock, both dated one second after the
    /// parent's committer time, so the OID depends on the spec alone.
    /// A change may not pass through or replace a symlink, a submodule or a
    /// directory (PATH_ESCAPE).
    ///
    /// Only the trees on the changed paths are read (`git ls-tree` of each)
    /// and written again (`git mktree`), bottom-up: the cost follows the
    /// change, not the repository. The tree is the one `read-tree`,
    /// `update-index` and `write-tree` would give (a directory left empty
    /// disappears, as git stores no empty tree).
    pub fn governed_commit(&self, spec: &CommitSpec) -> GitResult<String> {
        self.governed_commit_signed(spec, None)
    }

    /// [`AuthorityRepo::governed_commit`], signed by `signer` when there is
    /// one: the same tree, identity and dates, and an SSH signature in its
    /// `gpgsig` header (deterministic: the same spec and key give the same
    /// OID).
    pub fn governed_commit_signed(
        &self,
        spec: &CommitSpec,
        signer: Option<&crate::Signer>,
    ) -> GitResult<String> {
        if self.resolve_commit(&spec.parent)?.as_deref() != Some(spec.parent.as_str()) {
            return Err(GitError::ObjectMissing(spec.parent.clone()));
        }
        let root_oid = self
            .git
            .output(&[
                "rev-parse",
                "--verify",
                "--end-of-options",
                &format!("{}^{{tree}}", spec.parent),
            ])?
            .trim()
            .to_owned();
        let refuse = escape();
        let mut root = TreeEdit::loaded(self.read_tree(&root_oid)?);
        for change in &spec.changes {
            let path = check_relative_path(&change.path).map_err(GitError::Refused)?;
            let (dirs, name) = match path.rsplit_once('/') {
                Some((d, n)) => (d.split('/').collect::<Vec<_>>(), n),
                None => (Vec::new(), path),
            };
            // Walk down, loading each tree on the way; a missing directory
            // is created for a write (and means nothing to delete).
            let mut dir = &mut root;
            let mut walked = String::new();
            let mut missing = false;
            for component in dirs {
                if !walked.is_empty() {
                    walked.push('/');
                }
                walked.push_str(component);
                match dir.entries.get(component) {
                    Some(e) if e.mode != TREE_MODE => {
                        return Err(refuse(path, &format!("{walked} is not a directory")));
                    }
                    Some(e) if !dir.children.contains_key(component) => {
                        let oid = e.oid.clone();
                        dir.children.insert(
                            component.to_owned(),
                            TreeEdit::loaded(self.read_tree(&oid)?),
                        );
                    }
                    Some(_) => {}
                    None => {
                        missing = true;
                        dir.children.entry(component.to_owned()).or_default();
                    }
                }
                dir.changed = true;
                dir = dir.children.get_mut(component).expect("just inserted");
            }
            match dir.entries.get(name).map(|e| e.mode.as_str()) {
                Some(TREE_MODE) => return Err(refuse(path, "is a directory")),
                None | Some("100644") | Some("100755") | Some(SYMLINK_MODE) => {}
                Some(other) => return Err(refuse(path, &format!("replaces a mode {other} entry"))),
            }
            if dir.children.contains_key(name) {
                return Err(refuse(path, "is a directory"));
            }
            match &change.content {
                Some(content) => {
                    let oid = self.written(
                        "blob",
                        &["hash-object", "-w", "--no-filters", "--stdin"],
                        content,
                        &[],
                    )?;
                    let mode = if change.symlink {
                        SYMLINK_MODE
                    } else if change.executable {
                        "100755"
                    } else {
                        "100644"
                    };
                    dir.entries.insert(
                        name.to_owned(),
                        TreeEntryRow {
                            mode: mode.to_owned(),
                            kind: "blob".to_owned(),
                            oid: oid.trim().to_owned(),
                        },
                    );
                    dir.changed = true;
                }
                None if !missing && dir.entries.remove(name).is_some() => {
                    dir.changed = true;
                }
                None => {}
            }
        }
        let tree = match self.write_tree(&mut root)? {
            Some(oid) => oid,
            // Every file deleted: git's empty tree, written as such.
            None => self.write_object("tree", b"")?,
        };
        let date = format!("{} +0000", self.committer_time(&spec.parent)? + 1);
        let identity = [
            ("GIT_AUTHOR_NAME", IDENTITY_NAME),
            ("GIT_AUTHOR_EMAIL", IDENTITY_EMAIL),
            ("GIT_AUTHOR_DATE", date.as_str()),
            ("GIT_COMMITTER_NAME", IDENTITY_NAME),
            ("GIT_COMMITTER_EMAIL", IDENTITY_EMAIL),
            ("GIT_COMMITTER_DATE", date.as_str()),
        ];
        let mut message = spec.message.trim_end().to_owned();
        message.push('\n');
        if let Some(signer) = signer {
            let identity = format!("{IDENTITY_NAME} <{IDENTITY_EMAIL}> {date}");
            let payload = format!(
                "tree {tree}\nparent {}\nauthor {identity}\ncommitter {identity}\n\n{message}",
                spec.parent
            );
            let object = signer.sign_commit(&payload).map_err(|e| {
                GitError::Refused(Error::with(Code::SIGNING_KEY_INVALID, e.to_string()))
            })?;
            return self.write_object("commit", object.as_bytes());
        }
        self.written(
            "commit",
            &["commit-tree", &tree, "-p", &spec.parent, "-F", "-"],
            message.as_bytes(),
            &identity,
        )
    }
}

//! Deterministic governed commits.

use crate::AuthorityRepo;
use crate::error::{GitError, GitResult};
use airlock_proto::path::check_relative_path;
use airlock_proto::{Code, Error};
use std::collections::HashMap;
use std::path::PathBuf;

/// One file change of a governed commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileChange {
    /// Repository-relative path.
    pub path: String,
    /// New content, or `None` to delete the file.
    pub content: Option<Vec<u8>>,
    /// Executable bit of the new content.
    pub executable: bool,
}

impl FileChange {
    /// A write.
    pub fn write(path: &str, content: Vec<u8>, executable: bool) -> Self {
        FileChange {
            path: path.to_owned(),
            content: Some(content),
            executable,
        }
    }

    /// A deletion.
    pub fn delete(path: &str) -> Self {
        FileChange {
            path: path.to_owned(),
            content: None,
            executable: false,
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

/// Removes the temporary index however the commit ends.
struct TempIndex(PathBuf);

impl Drop for TempIndex {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        let _ = std::fs::remove_file(self.0.with_extension("lock"));
    }
}

fn escape() -> impl Fn(&str, &str) -> GitError {
    |path: &str, why: &str| {
        GitError::Refused(Error::with(Code::PATH_ESCAPE, format!("{path}: {why}")))
    }
}

impl AuthorityRepo {
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
    pub fn governed_commit(&self, spec: &CommitSpec) -> GitResult<String> {
        if self.resolve_commit(&spec.parent)?.as_deref() != Some(spec.parent.as_str()) {
            return Err(GitError::ObjectMissing(spec.parent.clone()));
        }
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        // In the scratch directory `with_scratch` chose (the worker's
        // workspace; its lockdown grants no /tmp).
        let index = TempIndex(
            self.scratch
                .join(format!("airlock-index-{}-{nanos}", std::process::id())),
        );
        let index_path = index.0.to_string_lossy().into_owned();
        let env = [("GIT_INDEX_FILE", index_path.as_str())];
        self.git.output_with(
            &["read-tree", &format!("{}^{{tree}}", spec.parent)],
            None,
            &env,
        )?;
        let listing = self
            .git
            .output_with(&["ls-files", "-s", "-z"], None, &env)?;
        let mut modes: HashMap<String, String> = HashMap::new();
        for record in listing.split('\0').filter(|r| !r.is_empty()) {
            if let Some((meta, path)) = record.split_once('\t') {
                modes.insert(
                    path.to_owned(),
                    meta.split(' ').next().unwrap_or("").to_owned(),
                );
            }
        }
        let refuse = escape();
        let mut info = Vec::new();
        for change in &spec.changes {
            let path = check_relative_path(&change.path).map_err(GitError::Refused)?;
            let mut prefix = String::new();
            for component in path
                .split('/')
                .collect::<Vec<_>>()
                .split_last()
                .map(|(_, a)| a.to_vec())
                .unwrap_or_default()
            {
                if !prefix.is_empty() {
                    prefix.push('/');
                }
                prefix.push_str(component);
                if modes.contains_key(&prefix) {
                    return Err(refuse(path, &format!("{prefix} is not a directory")));
                }
            }
            match modes.get(path).map(String::as_str) {
                None | Some("100644") | Some("100755") => {}
                Some(other) => return Err(refuse(path, &format!("replaces a mode {other} entry"))),
            }
            let dir_prefix = format!("{path}/");
            if modes.keys().any(|k| k.starts_with(&dir_prefix)) {
                return Err(refuse(path, "is a directory"));
            }
            match &change.content {
                Some(content) => {
                    let oid = self.git.output_with(
                        &["hash-object", "-w", "--no-filters", "--stdin"],
                        Some(content),
                        &[],
                    )?;
                    let mode = if change.executable {
                        "100755"
                    } else {
                        "100644"
                    };
                    info.extend_from_slice(format!("{mode} {} 0\t{path}\0", oid.trim()).as_bytes());
                    modes.insert(path.to_owned(), mode.to_owned());
                }
                None => {
                    let zero = "0".repeat(spec.parent.len());
                    info.extend_from_slice(format!("0 {zero}\t{path}\0").as_bytes());
                    modes.remove(path);
                }
            }
        }
        self.git
            .output_with(&["update-index", "-z", "--index-info"], Some(&info), &env)?;
        let tree = self.git.output_with(&["write-tree"], None, &env)?;
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
        let oid = self.git.output_with(
            &["commit-tree", tree.trim(), "-p", &spec.parent, "-F", "-"],
            Some(message.as_bytes()),
            &identity,
        )?;
        Ok(oid.trim().to_owned())
    }
}

//! airlock-git: the worker's only way to touch an authority repository.
//!
//! Every operation is plumbing on a bare repository, run with the real
//! `git` under a scrubbed environment and configuration that switches off
//! everything a repository could use to run code: hooks (including the
//! reference-transaction hook), filters and textconv (file content is read
//! as objects, never checked out), signing programs, fsmonitor, and every
//! system or user configuration file.
//!
//! - [`AuthorityRepo::source_archive`] writes a deterministic tar of a
//!   commit's tree, built from `git cat-file` output (no checkout, no
//!   `.gitattributes` processing).
//! - [`AuthorityRepo::governed_commit`] builds a commit on top of a parent
//!   from a set of file changes. Author, committer, dates and message are
//!   derived from the inputs only, so the same inputs always give the same
//!   commit OID — redoing a commit after a crash converges.
//! - [`AuthorityRepo::cas_update`] moves an `agent/…` branch from an
//!   expected value to a new one, or reports that it is already there.
//! - [`remove_stale_imports`] removes what an interrupted `repo add` left
//!   in the repository root (`.NAME.git.tmp-PID` of a process gone).
//!
//! ```no_run
//! use airlock_git::{AuthorityRepo, CommitSpec, FileChange};
//! let repo = AuthorityRepo::open("/srv/git/demo.git".as_ref()).unwrap();
//! let parent = repo.resolve_commit("refs/heads/main").unwrap().unwrap();
//! let oid = repo.governed_commit(&CommitSpec {
//!     parent: parent.clone(),
//!     changes: vec![FileChange::write("README.md", b"hello\n".to_vec(), false)],
//!     message: "airlock: task-1 attempt 1".into(),
//! }).unwrap();
//! repo.cas_update("agent/task-1", &oid, None).unwrap();
//! ```

mod archive;
mod command;
mod commit;
mod error;
mod foreign;
mod leftovers;
mod refs;
mod signing;
mod upstream;

pub use airlock_proto::upstream::Scheme;
pub use archive::{ArchiveLimits, ArchiveStats, DeltaStats};
pub use commit::{CommitSpec, FileChange};
pub use error::{GitError, GitResult};
pub use leftovers::{Leftover, import_temp_name, parse_import_temp, remove_stale_imports};
pub use refs::RefUpdate;
pub use signing::{Signer, SigningError};
pub use upstream::{
    Credential, PushAnswer, RefChange, SSH_KEY_ENV, SyncReport, Upstream, check_local_upstream,
    ssh_launcher_main,
};

pub use command::{Git, default_program};
pub use foreign::{
    ForeignRepo, Imported, Ref, RefMap, import, init, mirror, sync_tree, upload_pack,
};
use std::path::{Path, PathBuf};

/// A bare repository airlock reads and, for `agent/*` refs only, writes.
#[derive(Debug, Clone)]
pub struct AuthorityRepo {
    git: Git,
    scratch: PathBuf,
}

impl AuthorityRepo {
    /// Opens a bare repository with the system's git.
    pub fn open(path: &Path) -> GitResult<Self> {
        Self::open_with(path, command::default_program())
    }

    /// Opens a bare repository with a given git program.
    pub fn open_with(path: &Path, program: PathBuf) -> GitResult<Self> {
        let git = Git::new(program, path.to_path_buf());
        let bare = git.output(&["rev-parse", "--is-bare-repository"])?;
        if bare.trim() != "true" {
            return Err(GitError::NotBare(path.to_path_buf()));
        }
        Ok(AuthorityRepo {
            git,
            scratch: std::env::temp_dir(),
        })
    }

    /// Puts temporary files (the index of a commit being built) in `dir`
    /// instead of the system temporary directory, so a crash leaves them
    /// where the owner's start-up cleanup looks.
    pub fn with_scratch(mut self, dir: PathBuf) -> Self {
        self.scratch = dir;
        self
    }

    /// The repository path.
    pub fn path(&self) -> &Path {
        self.git.repo()
    }

    /// Resolves a revision to a commit OID; `None` when it does not exist.
    pub fn resolve_commit(&self, rev: &str) -> GitResult<Option<String>> {
        if rev.starts_with('-') {
            return Ok(None);
        }
        self.git.optional(&[
            "rev-parse",
            "--verify",
            "--quiet",
            "--end-of-options",
            &format!("{rev}^{{commit}}"),
        ])
    }

    /// Whether `ancestor` is `descendant` or one of its ancestors (both
    /// commit ids; an id that is not a commit here is not an ancestor).
    pub fn is_ancestor(&self, ancestor: &str, descendant: &str) -> GitResult<bool> {
        if ancestor.starts_with('-') || descendant.starts_with('-') {
            return Ok(false);
        }
        let out = self.git.run(
            &["merge-base", "--is-ancestor", ancestor, descendant],
            None,
            &[],
        )?;
        match out.status.code() {
            Some(0) => Ok(true),
            Some(1) | Some(128) => Ok(false),
            _ => Err(GitError::Failed {
                args: format!("merge-base --is-ancestor {ancestor} {descendant}"),
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            }),
        }
    }

    /// The current value of `refs/heads/<branch>`, if the branch exists.
    pub fn branch_head(&self, branch: &str) -> GitResult<Option<String>> {
        refs::check_agent_branch(branch)?;
        self.git.optional(&[
            "rev-parse",
            "--verify",
            "--quiet",
            "--end-of-options",
            &format!("refs/heads/{branch}"),
        ])
    }
}

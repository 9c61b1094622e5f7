//! The crate's one error type.

use airlock_proto::Code;
use std::path::PathBuf;

/// Why a git operation did not happen.
#[derive(Debug, thiserror::Error)]
pub enum GitError {
    /// The path is not a bare git repository.
    #[error("{0}: not a bare git repository")]
    NotBare(PathBuf),
    /// The path is not a git repository one can read.
    #[error("{0}: not a git repository ({1})")]
    NotARepository(PathBuf, String),
    /// git could not be started.
    #[error("cannot run {program}: {source}")]
    Spawn {
        /// The git program.
        program: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// git ran and failed.
    #[error("git {args} failed ({status}): {stderr}")]
    Failed {
        /// The arguments (never secrets: airlock passes none).
        args: String,
        /// Exit status.
        status: String,
        /// Last part of stderr.
        stderr: String,
    },
    /// An object named by the caller is not in the repository.
    #[error("object {0} is not a commit in the repository")]
    ObjectMissing(String),
    /// The branch is not an agent/ branch, or is protected.
    #[error("{0}")]
    Refused(airlock_proto::Error),
    /// The ref moved: it is neither the expected value nor the new one.
    #[error("refs/heads/{branch} is at {actual}, expected {expected}")]
    CasMismatch {
        /// The branch.
        branch: String,
        /// The value the caller expected ("absent" for a new branch).
        expected: String,
        /// The value found ("absent" when missing).
        actual: String,
    },
    /// The tree has more or bigger files than allowed.
    #[error("source tree exceeds a limit: {0}")]
    Limit(String),
    /// Reading git's output failed.
    #[error("reading git output: {0}")]
    Io(#[from] std::io::Error),
}

impl GitError {
    /// The catalogue code.
    pub fn code(&self) -> Code {
        match self {
            GitError::NotBare(_)
            | GitError::Spawn { .. }
            | GitError::Failed { .. }
            | GitError::Io(_) => Code::GIT_FAILED,
            GitError::ObjectMissing(_) => Code::GIT_OBJECT_MISSING,
            GitError::NotARepository(..) => Code::REPOSITORY_SOURCE_INVALID,
            GitError::Refused(e) => e.code,
            GitError::CasMismatch { .. } => Code::REF_CAS_MISMATCH,
            GitError::Limit(_) => Code::SOURCE_ARCHIVE_LIMIT_EXCEEDED,
        }
    }
}

/// Result alias for this crate.
pub type GitResult<T> = Result<T, GitError>;

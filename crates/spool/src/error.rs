//! The spool's one error enum: one variant per failing step, each mapped
//! to a catalogue [`Code`].

use airlock_proto::Code;
use std::io;
use std::path::PathBuf;

/// Why a spool operation failed. The doc comment of each variant is its
/// meaning; [`Error::code`] is the catalogue code it is reported with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A name is not `<request_id>.<ext>` for the directory it was asked of.
    #[error("spool name {name:?} is not a request id with the directory's extension")]
    InvalidName {
        /// The offending name.
        name: String,
    },
    /// A spool directory could not be opened (missing, a symlink, not a directory).
    #[error("cannot open spool directory {path}: {source}")]
    OpenDir {
        /// The directory.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The file does not exist.
    #[error("{path}: no such file")]
    Missing {
        /// The file.
        path: PathBuf,
    },
    /// The name is a symbolic link; spool files are never followed.
    #[error("{path}: is a symbolic link")]
    Symlink {
        /// The file.
        path: PathBuf,
    },
    /// The file could not be opened for another reason.
    #[error("cannot open {path}: {source}")]
    Open {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// fstat on the opened file failed.
    #[error("cannot stat {path}: {source}")]
    Stat {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The opened file is a directory, FIFO, device or socket.
    #[error("{path}: not a regular file ({kind})")]
    NotRegular {
        /// The file.
        path: PathBuf,
        /// What it is instead.
        kind: &'static str,
    },
    /// The file is owned by another uid than its expected producer.
    #[error("{path}: owned by uid {uid}, expected uid {expected}")]
    WrongOwner {
        /// The file.
        path: PathBuf,
        /// Its owner.
        uid: u32,
        /// The expected producer.
        expected: u32,
    },
    /// The file has more than one hard link, so it was not published by rename of a fresh file.
    #[error("{path}: has {nlink} hard links")]
    Linked {
        /// The file.
        path: PathBuf,
        /// Its link count.
        nlink: u64,
    },
    /// The file is larger than the bound for its kind.
    #[error("{path}: larger than {max} bytes")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The bound.
        max: u64,
    },
    /// Reading the opened file failed.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The file's SHA-256 is not the expected one.
    #[error("{path}: sha256 {actual} differs from the expected {expected}")]
    DigestMismatch {
        /// The file.
        path: PathBuf,
        /// What the request said.
        expected: String,
        /// What the file has.
        actual: String,
    },
    /// The temporary file of a publication could not be created.
    #[error("cannot create temporary file in {path}: {source}")]
    CreateTemp {
        /// The directory.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// Writing the temporary file failed.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The temporary file.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// fsync of the temporary file failed.
    #[error("cannot fsync {path}: {source}")]
    Sync {
        /// The temporary file.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The name is already published; a spool file is published once.
    #[error("{path}: already published")]
    AlreadyPublished {
        /// The file.
        path: PathBuf,
    },
    /// Renaming the temporary file into place failed.
    #[error("cannot rename into {path}: {source}")]
    Rename {
        /// The final name.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// fsync of the directory after the rename failed.
    #[error("cannot fsync directory {path}: {source}")]
    SyncDir {
        /// The directory.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// Setting up the inotify watch failed.
    #[error("cannot watch {path}: {source}")]
    Watch {
        /// The directory.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// Waiting for or reading inotify events failed.
    #[error("cannot wait for spool events: {source}")]
    Wait {
        /// The underlying error.
        source: io::Error,
    },
    /// Listing a spool directory failed.
    #[error("cannot list {path}: {source}")]
    List {
        /// The directory.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// Removing a file during garbage collection failed.
    #[error("cannot remove {path}: {source}")]
    Remove {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
}

impl Error {
    /// The catalogue code this failure is reported with.
    pub fn code(&self) -> Code {
        match self {
            Error::InvalidName { .. }
            | Error::Missing { .. }
            | Error::Symlink { .. }
            | Error::Open { .. }
            | Error::NotRegular { .. }
            | Error::WrongOwner { .. }
            | Error::Linked { .. }
            | Error::TooLarge { .. }
            | Error::AlreadyPublished { .. } => Code::SPOOL_FILE_REJECTED,
            Error::DigestMismatch { .. } => Code::SPOOL_DIGEST_MISMATCH,
            Error::OpenDir { .. }
            | Error::Stat { .. }
            | Error::Read { .. }
            | Error::CreateTemp { .. }
            | Error::Write { .. }
            | Error::Sync { .. }
            | Error::Rename { .. }
            | Error::SyncDir { .. }
            | Error::Watch { .. }
            | Error::Wait { .. }
            | Error::List { .. }
            | Error::Remove { .. } => Code::SPOOL_UNAVAILABLE,
        }
    }

    /// The failure as a catalogue error, with this message as its detail.
    pub fn to_proto(&self) -> airlock_proto::Error {
        airlock_proto::Error::with(self.code(), self.to_string())
    }
}

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

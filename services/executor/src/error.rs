//! The executor's one error enum: one variant per failing step, each
//! mapped to a catalogue [`Code`]. A request that fails is answered with an
//! `ExecFailure` carrying [`Error::code`] and the message.

use airlock_proto::Code;
use std::io;
use std::path::PathBuf;

/// Why the executor refused to start or refused a request.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The environment's setup failed or was refused: SETUP_FAILED (a
    /// command failed; the message carries its redacted tail),
    /// SETUP_UNAVAILABLE, or the egress proxy's refusal code.
    #[error("{message}")]
    SetupRefused {
        /// The code.
        code: Code,
        /// What happened, with the failing command's redacted tail.
        message: String,
    },
    /// A start-up isolation check failed: a secret in the environment, a
    /// readable credential directory, or a network interface other than `lo`.
    #[error("{check}: {detail}")]
    NotIsolated {
        /// The failing check.
        check: &'static str,
        /// What exactly was found (names only, never values).
        detail: String,
    },
    /// The executor's own Landlock confinement could not be applied in full.
    #[error("cannot confine the executor: {0}")]
    SelfConfine(String),
    /// The configuration file is invalid.
    #[error("{0}")]
    Config(String),
    /// A local path the executor needs (work root, confine helper) is unusable.
    #[error("{path}: {detail}")]
    Setup {
        /// The path.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// A spool file could not be read or published.
    #[error(transparent)]
    Spool(#[from] airlock_spool::Error),
    /// The request is not a strict ExecRequest (unknown field, wrong type).
    #[error("request is not a valid ExecRequest: {0}")]
    RequestParse(String),
    /// The request names another id than its file, or is not derived from its envelope.
    #[error("{0}")]
    RequestInvalid(airlock_proto::Error),
    /// The envelope inside the request does not validate.
    #[error("envelope: {0}")]
    EnvelopeInvalid(airlock_proto::Error),
    /// The source archive is missing, not a regular file, the wrong size, or not a tar archive.
    #[error("source archive: {0}")]
    ArchiveInvalid(String),
    /// The source archive's SHA-256 differs from the request's.
    #[error("source archive: {0}")]
    ArchiveDigest(String),
    /// An archive member's path is absolute, has `..` or `.git`, or is otherwise malformed.
    #[error("archive member {path:?}: {why}")]
    ArchivePath {
        /// The member's path as stored.
        path: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// An archive member is a hard link, or a symbolic link without a usable target.
    #[error("archive member {path:?} is a {kind}")]
    ArchiveLink {
        /// The member's path.
        path: String,
        /// "hard link", or what is wrong with a symbolic link.
        kind: &'static str,
    },
    /// An archive member is a device, FIFO or other special file, or has setuid/setgid bits.
    #[error("archive member {path:?}: {why}")]
    ArchiveMember {
        /// The member's path.
        path: String,
        /// What is wrong with it.
        why: String,
    },
    /// The archive has too many entries or bytes, or expands like a bomb.
    #[error("source archive: {0}")]
    ArchiveLimit(String),
    /// Writing into the workspace failed (I/O, not policy).
    #[error("workspace {path}: {source}")]
    Workspace {
        /// The workspace-relative or absolute path.
        path: String,
        /// The underlying error.
        source: io::Error,
    },
    /// A path resolves through a symlink or outside the workspace, or names something not a regular file.
    #[error("{path}: {why}")]
    PathEscape {
        /// The workspace-relative path.
        path: String,
        /// How it escapes.
        why: &'static str,
    },
    /// A path is malformed or a parent component is not a directory.
    #[error("{path}: {why}")]
    PathInvalid {
        /// The workspace-relative path.
        path: String,
        /// What is wrong.
        why: &'static str,
    },
    /// A change or capture names a credential path the policy does not allow.
    #[error("{0}: credential path")]
    CredentialPath(String),
    /// A file's SHA-256 differs from its change's expected_sha256 guard.
    #[error("{path}: expected sha256 {expected}, found {found}")]
    Drift {
        /// The path.
        path: String,
        /// The guard.
        expected: String,
        /// What the file has ("absent" when missing).
        found: String,
    },
    /// replace_text found another number of occurrences than declared.
    #[error("{path}: {found} occurrences, expected {expected}")]
    ReplaceCount {
        /// The path.
        path: String,
        /// Declared count.
        expected: u32,
        /// Occurrences found.
        found: usize,
    },
    /// replace_text names a missing file.
    #[error("{0}: replace_text on a missing file")]
    ReplaceMissing(String),
    /// replace_text names a file that is not UTF-8 text.
    #[error("{0}: not UTF-8 text")]
    NotText(String),
    /// A changed or captured file is larger than allowed.
    #[error("{path}: larger than {max} bytes")]
    FileTooLarge {
        /// The path.
        path: String,
        /// The bound.
        max: u64,
    },
    /// The repository's verification environment is unusable here.
    #[error("{message}")]
    Environment {
        /// Its code.
        code: airlock_proto::Code,
        /// What is wrong.
        message: String,
    },
    /// A verification command's program is not allowlisted.
    #[error("{label}: program {program:?} is not allowlisted")]
    ProgramDenied {
        /// The command's label.
        label: String,
        /// argv[0].
        program: String,
    },
    /// python3 -m names a module that is not allowlisted, or python3 options are malformed.
    #[error("{label}: {detail}")]
    PythonModuleDenied {
        /// The command's label.
        label: String,
        /// What was refused.
        detail: String,
    },
    /// A git command is not a read-only subcommand, or uses a refused option.
    #[error("{label}: {detail}")]
    GitDenied {
        /// The command's label.
        label: String,
        /// What was refused.
        detail: String,
    },
    /// airlock-confine could not be started or waited for.
    #[error("airlock-confine: {0}")]
    ConfineSpawn(String),
    /// airlock-confine wrote no usable report, so the confinement cannot be proven.
    #[error("airlock-confine report: {0}")]
    ConfineReport(String),
    /// airlock-confine refused to run the command (a confinement step failed).
    #[error("airlock-confine refused {label}: {code}: {message}")]
    Confine {
        /// The command's label.
        label: String,
        /// The helper's refusal code.
        code: String,
        /// The helper's message.
        message: String,
    },
    /// A tree cache entry no longer holds what it was sealed with.
    #[error("tree cache: {0}")]
    CacheCorrupt(String),
    /// The result is larger than a spool message may be.
    #[error("result too large: {0} bytes")]
    ResultTooLarge(usize),
}

impl Error {
    /// The catalogue code reported for this failure.
    pub fn code(&self) -> Code {
        match self {
            Error::NotIsolated { .. } => Code::EXECUTOR_NOT_ISOLATED,
            Error::SelfConfine(_) => Code::SANDBOX_UNAVAILABLE,
            Error::Config(_) => Code::CONFIG_INVALID,
            Error::Setup { .. } => Code::INTERNAL,
            Error::Spool(e) => e.code(),
            Error::RequestParse(_) => Code::MESSAGE_INVALID,
            Error::RequestInvalid(e) | Error::EnvelopeInvalid(e) => e.code,
            Error::ArchiveInvalid(_) => Code::SOURCE_ARCHIVE_INVALID,
            Error::ArchiveDigest(_) => Code::SOURCE_ARCHIVE_SHA_MISMATCH,
            Error::ArchivePath { .. } => Code::SOURCE_ARCHIVE_PATH_INVALID,
            Error::ArchiveLink { .. } => Code::SOURCE_ARCHIVE_LINK_DENY,
            Error::ArchiveMember { .. } => Code::SOURCE_ARCHIVE_MEMBER_DENY,
            Error::ArchiveLimit(_) => Code::SOURCE_ARCHIVE_LIMIT_EXCEEDED,
            Error::Workspace { .. } => Code::INTERNAL,
            Error::PathEscape { .. } => Code::PATH_ESCAPE,
            Error::PathInvalid { .. } => Code::PATH_INVALID,
            Error::CredentialPath(_) => Code::CREDENTIAL_PATH_DENIED,
            Error::Drift { .. } => Code::SOURCE_DRIFT,
            Error::ReplaceCount { .. } => Code::REPLACE_COUNT_INVALID,
            Error::ReplaceMissing(_) => Code::REPLACE_SOURCE_MISSING,
            Error::NotText(_) => Code::CHANGE_SET_INVALID,
            Error::FileTooLarge { .. } => Code::FILE_TOO_LARGE,
            Error::ProgramDenied { .. } => Code::COMMAND_PROGRAM_DENY,
            Error::Environment { code, .. } => *code,
            Error::PythonModuleDenied { .. } => Code::PYTHON_MODULE_DENY,
            Error::GitDenied { .. } => Code::GIT_MUTATION_DENY,
            Error::ConfineSpawn(_) | Error::ConfineReport(_) => Code::SANDBOX_UNAVAILABLE,
            Error::Confine { code, .. } => {
                Code::from_name(code).unwrap_or(Code::SANDBOX_UNAVAILABLE)
            }
            Error::ResultTooLarge(_) => Code::FIELD_BOUNDS_EXCEEDED,
            Error::CacheCorrupt(_) => Code::TREE_CACHE_CORRUPT,
            Error::SetupRefused { code, .. } => *code,
        }
    }
}

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

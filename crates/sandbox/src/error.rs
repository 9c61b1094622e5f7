//! The one error enum of the crate: one variant per step that can fail.
//!
//! The doc comment of each variant is its message. [`Error::code`] maps
//! every variant to the airlock refusal code that crosses process
//! boundaries; [`Error::step`] names the confinement step for reports.

use std::io;
use std::path::PathBuf;

use airlock_proto::Code;

/// A confinement step failed. Nothing is executed after any of these.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The policy is invalid (bad path, id, limit or environment entry).
    #[error("invalid policy: {0}")]
    Policy(String),

    /// The process has more than one thread, so forking would be unsafe.
    #[error("refusing to fork: this process has {threads} threads (must be single-threaded)")]
    NotSingleThreaded {
        /// Threads counted in /proc/self/task (0 if it could not be read).
        threads: usize,
    },

    /// Inherited file descriptors could not be closed.
    #[error("cannot close inherited file descriptors: {0}")]
    CloseFds(#[source] io::Error),

    /// A user namespace id map could not be written.
    #[error("cannot write {path}: {source}")]
    IdMap {
        /// The map file (uid_map, gid_map or setgroups).
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// A pipe between the helper's processes could not be created or used.
    #[error("cannot create an internal pipe: {0}")]
    Pipe(#[source] io::Error),

    /// fork(2) failed.
    #[error("fork failed: {0}")]
    Fork(#[source] io::Error),

    /// The capability bounding set or securebits could not be locked down.
    #[error("cannot drop the capability bounding set: {0}")]
    Bounding(#[source] io::Error),

    /// The supplementary groups could not be cleared.
    #[error("setgroups failed: {0}")]
    Groups(#[source] io::Error),

    /// The group ids could not be switched.
    #[error("setresgid({gid}) failed: {source}")]
    Gid {
        /// The requested gid.
        gid: u32,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// The user ids could not be switched.
    #[error("setresuid({uid}) failed: {source}")]
    Uid {
        /// The requested uid.
        uid: u32,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// Other ids were requested but this process is not privileged to switch ids.
    #[error(
        "cannot run as uid {uid} gid {gid}: only root can switch ids (running as uid {current})"
    )]
    IdsUnavailable {
        /// Requested uid.
        uid: u32,
        /// Requested gid.
        gid: u32,
        /// The current uid.
        current: u32,
    },

    /// The capability sets could not be cleared, or a capability survived.
    #[error("cannot drop capabilities: {0}")]
    Capabilities(String),

    /// prctl(PR_SET_NO_NEW_PRIVS) failed.
    #[error("cannot set no_new_privs: {0}")]
    NoNewPrivs(#[source] io::Error),

    /// A resource limit could not be set.
    #[error("cannot set {resource}: {source}")]
    Rlimit {
        /// The limit's name (RLIMIT_NPROC, ...).
        resource: &'static str,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// A path named in a Landlock rule could not be opened.
    #[error("cannot open {path} for a Landlock rule: {source}")]
    LandlockPath {
        /// The path.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// The Landlock ruleset could not be built or enforced.
    #[error("Landlock failed: {0}")]
    Landlock(String),

    /// The Landlock ruleset is not fully enforced and degraded mode is not allowed.
    #[error("Landlock is not fully enforced ({reason}); refusing to run without --allow-degraded")]
    Degraded {
        /// Why the ruleset is not fully enforced.
        reason: String,
    },

    /// The seccomp filter could not be compiled or installed.
    #[error("seccomp failed: {0}")]
    Seccomp(String),

    /// The working directory could not be entered.
    #[error("cannot enter working directory {path}: {source}")]
    Workdir {
        /// The directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// setsid(2) failed.
    #[error("setsid failed: {0}")]
    Session(#[source] io::Error),

    /// The command was not found in the sandbox's PATH.
    #[error("command not found: {command}")]
    CommandNotFound {
        /// The command as given.
        command: String,
    },

    /// execve(2) failed.
    #[error("cannot execute {command}: {source}")]
    Exec {
        /// The resolved program path.
        command: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// Waiting for or killing the sandboxed processes failed.
    #[error("cannot supervise the sandbox: {0}")]
    Supervise(#[source] io::Error),

    /// Processes of the sandbox were still alive after it was torn down.
    #[error("{count} sandboxed processes survived teardown")]
    Survivors {
        /// How many were found.
        count: usize,
    },

    /// The report could not be written.
    #[error("cannot write the report: {0}")]
    Report(#[source] io::Error),

    /// A step of the minimal root failed (a mount, the pivot, a mount point).
    #[error("minimal root: {what} {target}: {source}")]
    Mount {
        /// The operation.
        what: &'static str,
        /// The path it acted on.
        target: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// The executor's spawner could not be started, or its channel failed.
    #[error("spawner: {0}")]
    Spawner(String),

    /// A job's cgroup could not be made, joined, limited or read.
    #[error("cgroup: {0}")]
    Cgroup(String),

    /// A setup's loopback network could not be set up or handed over.
    #[error("setup network: {0}")]
    Network(String),
}

impl Error {
    /// The refusal code for this failure.
    pub fn code(&self) -> Code {
        match self {
            Error::Policy(_) => Code::CONFIG_INVALID,
            Error::CommandNotFound { .. } | Error::Exec { .. } => Code::VERIFICATION_FAILED,
            Error::NotSingleThreaded { .. } | Error::Report(_) => Code::INTERNAL,
            _ => Code::SANDBOX_UNAVAILABLE,
        }
    }

    /// A stable snake_case name of the step that failed, for reports.
    pub fn step(&self) -> &'static str {
        match self {
            Error::Policy(_) => "policy",
            Error::NotSingleThreaded { .. } => "single_thread_check",
            Error::CloseFds(_) => "close_fds",
            Error::IdMap { .. } => "namespaces",
            Error::Pipe(_) => "pipe",
            Error::Fork(_) => "fork",
            Error::Bounding(_) => "bounding_set",
            Error::Groups(_)
            | Error::Gid { .. }
            | Error::Uid { .. }
            | Error::IdsUnavailable { .. } => "ids",
            Error::Capabilities(_) => "capabilities",
            Error::NoNewPrivs(_) => "no_new_privs",
            Error::Rlimit { .. } => "rlimits",
            Error::LandlockPath { .. } | Error::Landlock(_) | Error::Degraded { .. } => "landlock",
            Error::Seccomp(_) => "seccomp",
            Error::Workdir { .. } => "env",
            Error::Session(_) => "session",
            Error::CommandNotFound { .. } | Error::Exec { .. } => "exec",
            Error::Supervise(_) | Error::Survivors { .. } => "supervise",
            Error::Report(_) => "report",
            Error::Mount { .. } => "minimal_root",
            Error::Spawner(_) => "spawner",
            Error::Cgroup(_) => "cgroup",
            Error::Network(_) => "network",
        }
    }

    /// The helper's exit status for this failure: 127 when the command
    /// does not exist, 126 when it cannot be executed, 125 for every
    /// other failure of the helper itself (the convention of `env`,
    /// `chroot` and `timeout`; the target's own statuses pass through).
    pub fn exit_status(&self) -> i32 {
        match self {
            Error::CommandNotFound { .. } => 127,
            Error::Exec { .. } => 126,
            _ => 125,
        }
    }
}

/// Shorthand used throughout the crate.
pub type Result<T> = std::result::Result<T, Error>;

/// The last OS error as an `io::Error` (for nix errno values).
pub(crate) fn errno(e: nix::errno::Errno) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

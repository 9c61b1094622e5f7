//! What happened, as JSON: the [`Report`] `airlock-confine --report`
//! writes, so the executor can record how confined each command was.

use serde::{Deserialize, Serialize};

use crate::policy::Limits;

/// The schema name written into every report.
pub const REPORT_SCHEMA: &str = "airlock.confine.report/2";

/// Which namespaces the sandbox got. Each is used when the kernel allows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Namespaces {
    /// A user namespace (only created when the helper is not root).
    pub user: bool,
    /// A pid namespace: the command's tree is killed as a whole.
    pub pid: bool,
    /// An IPC namespace.
    pub ipc: bool,
    /// A UTS namespace.
    pub uts: bool,
    /// A network namespace holding only a down `lo`.
    pub net: bool,
    /// A mount namespace with private propagation.
    pub mount: bool,
    /// A fresh /proc showing only the sandbox's processes.
    pub proc: bool,
    /// A private tmpfs on /tmp.
    pub tmp: bool,
    /// A private tmpfs on /dev/shm (in the minimal root, /dev/shm is a
    /// link to the private /tmp).
    pub shm: bool,
    /// The minimal root: the command's whole view is its workspace, a
    /// private /tmp, its own /proc, a minimal /dev and read-only system
    /// paths ([`crate::root`]).
    pub root: bool,
}

/// Which filesystem view commands get.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ViewMode {
    /// A minimal root per command (user, mount and pid namespaces).
    MinimalRoot,
    /// The host's view, narrowed by Landlock; every metadata call by path
    /// (chmod, chown, utime, xattrs) is refused by seccomp, since Landlock
    /// does not govern them. Used where user namespaces are unavailable.
    HostView,
}

impl ViewMode {
    /// The name in reports, logs and `airlockctl doctor`.
    pub fn as_str(self) -> &'static str {
        match self {
            ViewMode::MinimalRoot => "minimal-root",
            ViewMode::HostView => "host-view",
        }
    }
}

/// How Landlock was applied.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LandlockReport {
    /// The running kernel's Landlock ABI (0 when Landlock is unavailable).
    pub kernel_abi: i32,
    /// The ABI whose access rights were requested.
    pub requested_abi: u8,
    /// The lowest ABI the policy counts as complete.
    pub min_abi: u8,
    /// `full`, `partial` or `none`.
    pub status: String,
}

/// How the sandboxed command ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Outcome {
    /// The command exited with this code.
    Exited {
        /// Exit code.
        code: i32,
    },
    /// The command was killed by this signal.
    Signaled {
        /// Signal number.
        signal: i32,
    },
    /// The wall-clock timeout passed and the sandbox was killed.
    TimedOut,
    /// The helper received SIGTERM, SIGINT or SIGHUP and killed the sandbox.
    Interrupted {
        /// The signal the helper received.
        signal: i32,
    },
    /// A confinement step failed; the command never ran.
    Failed {
        /// The step (see `Error::step`).
        step: String,
        /// The airlock refusal code (SCREAMING_SNAKE).
        code: String,
        /// Human-readable message.
        message: String,
    },
}

/// The report of one sandboxed run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Report {
    /// Always [`REPORT_SCHEMA`].
    pub schema: String,
    /// Uid the command ran as (as seen from the helper's namespace).
    pub uid: u32,
    /// Gid the command ran as.
    pub gid: u32,
    /// Namespaces obtained.
    pub namespaces: Namespaces,
    /// Landlock, when that step was reached.
    pub landlock: Option<LandlockReport>,
    /// The seccomp filter was installed.
    pub seccomp: bool,
    /// no_new_privs was set.
    pub no_new_privs: bool,
    /// Every capability set (incl. bounding and ambient) was verified empty.
    pub capabilities_dropped: bool,
    /// The limits applied.
    pub limits: Limits,
    /// The sandbox ran in degraded mode (see `warnings`).
    pub degraded: bool,
    /// Loud warnings, e.g. why the sandbox was degraded.
    pub warnings: Vec<String>,
    /// How the command ended.
    pub outcome: Outcome,
    /// The helper's own exit status.
    pub exit_status: i32,
    /// Sandboxed processes found alive after teardown (always 0 on success).
    pub survivors: usize,
    /// Wall-clock duration in milliseconds.
    pub elapsed_ms: u64,
    /// The filesystem view the command had.
    pub view: ViewMode,
    /// User + system CPU time of the command and every process it started
    /// (that was reaped), in milliseconds.
    pub cpu_ms: u64,
    /// Largest resident set of any of them, in KiB.
    pub peak_rss_kib: u64,
}

/// Messages the sandbox's inner processes send to the supervising helper
/// over a close-on-exec pipe, one JSON object per line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum Message {
    /// From the init: what the mount namespace step achieved.
    Mounts {
        /// Mount namespace entered.
        mount: bool,
        /// Fresh /proc mounted.
        proc: bool,
        /// Private /tmp mounted.
        tmp: bool,
        /// Private /dev/shm mounted.
        shm: bool,
        /// Pivoted into the minimal root.
        root: bool,
    },
    /// From the command's process, just before execve.
    Confined {
        /// Uid after the switch.
        uid: u32,
        /// Gid after the switch.
        gid: u32,
        /// Landlock result.
        landlock: LandlockReport,
        /// Degraded mode in effect.
        degraded: bool,
        /// Every capability set, bounding included, is empty.
        capabilities_dropped: bool,
        /// Warnings to record.
        warnings: Vec<String>,
    },
    /// From the command's process when a step failed.
    Failed {
        /// Step name.
        step: String,
        /// Refusal code.
        code: String,
        /// Message.
        message: String,
        /// Exit status to use.
        exit_status: i32,
    },
    /// From the init, after every process of the sandbox is gone.
    Exit {
        /// How the command ended.
        outcome: Outcome,
    },
}

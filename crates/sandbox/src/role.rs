//! Each daemon's confinement policy, as reviewed data: which paths it may
//! reach and how (Landlock grants), which denials of the command sandbox's
//! seccomp table it does not need to lift (and why it lifts the others),
//! what happens to the capability bounding set, which resource limits hold,
//! and what a kernel without Landlock means for it. [`crate::lockdown`]
//! applies a role; `docs/privsep/confinement.md` shows these tables
//! (generated from them by [`markdown`] and checked by a test).
//!
//! The seccomp policies deny, and allow everything else: the daemons run
//! tokio, zbus, SQLite and git, whose system calls vary with versions and
//! paths taken, so a default-deny allowlist would fail in production on a
//! rarely taken path. The deny-lists close the kernel interfaces a daemon
//! never needs and an attacker in it would want.

use std::path::PathBuf;

use crate::landlock::Access;
use crate::seccomp_policy::{RULES, Rule, SOCKET_UNIX_AND_IP};

/// A daemon, each its own binary and user.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// airlock-supervisor: the task database and the D-Bus service.
    Supervisor,
    /// airlock-worker: the journal, the authority repositories, git.
    Worker,
    /// airlock-executor: the spool's answers and the work root.
    Executor,
    /// The executor's spawner: starts every verification command.
    Spawner,
    /// airlock-retryd: its passed socket and the bus.
    Retryd,
    /// airlock-egress: its bound socket, name resolution and TCP out.
    Egress,
}

/// A path the daemon resolves from its configuration and hands to
/// [`crate::lockdown::lockdown`] in [`Paths`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// The directory of the task database (`supervisor.database`).
    DatabaseDir,
    /// The directory of the worker's checkpoint journal (`worker.journal`).
    JournalDir,
    /// `worker.workspace_root`.
    WorkspaceRoot,
    /// Every `[[repository]] path`.
    Repositories,
    /// `worker.repository_root`.
    RepositoryRoot,
    /// The drop-in directory beside the configuration file (`repositories.d/`).
    DropInDir,
    /// The settings drop-in directory beside the configuration file
    /// (`airlock.toml.d/`).
    SettingsDir,
    /// The configuration file itself (`--config`).
    ConfigFile,
    /// The spool's `requests/`.
    SpoolRequests,
    /// The spool's `sources/`.
    SpoolSources,
    /// The spool's `results/`.
    SpoolResults,
    /// The spool's `failed/`.
    SpoolFailed,
    /// The spool's `wants/`.
    SpoolWants,
    /// The executor's `--work` root.
    WorkRoot,
    /// The directory of the executor's `run-once --out`.
    OutputDir,
    /// The worker's credentials directory (`$CREDENTIALS_DIRECTORY`).
    Credentials,
    /// Every upstream that is a local path (`repository[].upstream.url`).
    LocalUpstreams,
    /// The worker's own executable, which git starts as its ssh.
    SshLauncher,
    /// `supervisor.metrics_directory` (the node exporter's textfile
    /// collector directory).
    MetricsDir,
}

impl Slot {
    fn describe(self) -> &'static str {
        match self {
            Slot::DatabaseDir => "directory of `supervisor.database`",
            Slot::JournalDir => "directory of `worker.journal`",
            Slot::WorkspaceRoot => "`worker.workspace_root`",
            Slot::Repositories => "each `[[repository]] path`",
            Slot::RepositoryRoot => "`worker.repository_root`",
            Slot::DropInDir => "`repositories.d/` beside `--config`",
            Slot::SettingsDir => "`airlock.toml.d/` beside `--config`",
            Slot::ConfigFile => "the `--config` file",
            Slot::SpoolRequests => "spool `requests/`",
            Slot::SpoolSources => "spool `sources/`",
            Slot::SpoolResults => "spool `results/`",
            Slot::SpoolFailed => "spool `failed/`",
            Slot::SpoolWants => "spool `wants/`",
            Slot::WorkRoot => "`--work` root",
            Slot::OutputDir => "directory of `run-once --out`",
            Slot::Credentials => "`$CREDENTIALS_DIRECTORY`",
            Slot::LocalUpstreams => "each local-path `upstream.url`",
            Slot::SshLauncher => "the worker's own executable",
            Slot::MetricsDir => "`supervisor.metrics_directory`",
        }
    }
}

/// Where a grant points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// A fixed system path, skipped when it does not exist.
    Fixed(&'static str),
    /// Paths from the configuration, each of which must exist (unless the
    /// row says `required: false`). A slot the daemon does not fill grants
    /// nothing.
    Config(Slot),
}

/// Who the grant is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Who {
    /// Always.
    Any,
    /// Only when the daemon does not run as root.
    NotRoot,
}

/// One Landlock grant, with its reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The path.
    pub place: Place,
    /// The rights.
    pub access: Access,
    /// When the grant applies.
    pub who: Who,
    /// Refuse to start when a configured path is missing.
    pub required: bool,
    /// Why (one line).
    pub reason: &'static str,
}

const fn fixed(path: &'static str, access: Access, reason: &'static str) -> Grant {
    Grant {
        place: Place::Fixed(path),
        access,
        who: Who::Any,
        required: false,
        reason,
    }
}

const fn config(slot: Slot, access: Access, reason: &'static str) -> Grant {
    Grant {
        place: Place::Config(slot),
        access,
        who: Who::Any,
        required: true,
        reason,
    }
}

/// What happens to the capability bounding set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bounding {
    /// Emptied (and securebits locked) when the daemon holds CAP_SETPCAP,
    /// i.e. runs as root; otherwise it holds no capability to give up and
    /// its bounding set is its parent's (systemd's `CapabilityBoundingSet=`
    /// empties it in the units).
    Empty,
    /// Kept, for this reason.
    Keep(&'static str),
}

/// What a kernel that cannot enforce the whole Landlock ruleset means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Degraded {
    /// Start anyway with a loud warning (recorded in the report).
    Warn,
    /// Refuse to start unless the configuration allows it.
    RefuseUnlessAllowed,
}

/// A seccomp row of the sandbox's table that the role lifts, with why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lifted {
    /// The system call's name as in [`RULES`].
    pub name: &'static str,
    /// Why the daemon needs it.
    pub reason: &'static str,
}

/// A role's whole policy.
#[derive(Clone, Copy, Debug)]
pub struct RolePolicy {
    /// Landlock grants, in groups.
    pub grants: &'static [&'static [Grant]],
    /// Rows of [`RULES`] this role does not deny.
    pub lifted: &'static [Lifted],
    /// The bounding set.
    pub bounding: Bounding,
    /// Resource limits beyond RLIMIT_CORE = 0 (which every role gets):
    /// (name, value, reason).
    pub limits: &'static [(Limit, u64, &'static str)],
    /// Without full Landlock.
    pub degraded: Degraded,
    /// Highest Landlock ABI to request, and why.
    pub max_abi: (u8, &'static str),
    /// What changes when the configuration names a server the daemon
    /// reaches over TCP ([`Paths::with_tcp_connect`]); `None`: the role
    /// never opens an IP socket.
    pub tcp: Option<TcpPolicy>,
}

/// A role's policy for a configured TCP server: IP sockets (the `socket`
/// row becomes [`SOCKET_UNIX_AND_IP`]), TCP connect(2) to the configured
/// ports only (Landlock), and these extra grants.
#[derive(Clone, Copy, Debug)]
pub struct TcpPolicy {
    /// When it applies (one line).
    pub when: &'static str,
    /// Extra Landlock grants (name resolution).
    pub grants: &'static [Grant],
}

/// A resource limit a role sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// RLIMIT_NOFILE.
    OpenFiles,
}

impl Limit {
    /// Its C name.
    pub fn name(self) -> &'static str {
        match self {
            Limit::OpenFiles => "RLIMIT_NOFILE",
        }
    }
}

/// Resolved configuration paths for a role's [`Place::Config`] grants.
#[derive(Clone, Debug, Default)]
pub struct Paths {
    entries: Vec<(Slot, PathBuf)>,
    /// The configuration allows running with degraded Landlock (only
    /// consulted by roles with [`Degraded::RefuseUnlessAllowed`]).
    pub allow_degraded: bool,
    /// TCP ports the daemon connects to (its role's [`TcpPolicy`]).
    pub tcp_connect: Vec<u16>,
}

impl Paths {
    /// No paths.
    pub fn new() -> Paths {
        Paths::default()
    }

    /// Adds `path` for `slot`.
    pub fn with(mut self, slot: Slot, path: impl Into<PathBuf>) -> Paths {
        self.entries.push((slot, path.into()));
        self
    }

    /// Adds every path of `paths` for `slot`.
    pub fn with_all<P: Into<PathBuf>>(
        mut self,
        slot: Slot,
        paths: impl IntoIterator<Item = P>,
    ) -> Paths {
        self.entries
            .extend(paths.into_iter().map(|p| (slot, p.into())));
        self
    }

    /// The daemon connects over TCP to these ports: its role's
    /// [`TcpPolicy`] applies (a role without one refuses to lock down).
    pub fn with_tcp_connect(mut self, ports: impl IntoIterator<Item = u16>) -> Paths {
        self.tcp_connect.extend(ports);
        self
    }

    /// The paths given for `slot`.
    pub fn get(&self, slot: Slot) -> impl Iterator<Item = &PathBuf> {
        self.entries
            .iter()
            .filter(move |(s, _)| *s == slot)
            .map(|(_, p)| p)
    }
}

// --- shared groups of grants ------------------------------------------------

/// Libraries, read only: the daemons load NSS modules and other shared
/// objects after start (mmap of a library needs read, not execute).
const LIBS_READ: &[Grant] = &[
    fixed(
        "/usr",
        Access::Read,
        "shared libraries and NSS modules loaded after start",
    ),
    fixed("/lib", Access::Read, "shared libraries (non-merged /usr)"),
    fixed("/lib64", Access::Read, "the dynamic linker's directory"),
];

/// Programs and libraries, read + execute.
const SYSTEM_EXEC: &[Grant] = &[
    fixed(
        "/usr",
        Access::ReadExec,
        "programs and libraries the daemon's children execute",
    ),
    fixed("/bin", Access::ReadExec, "programs (non-merged /usr)"),
    fixed("/sbin", Access::ReadExec, "programs (non-merged /usr)"),
    fixed("/lib", Access::ReadExec, "libraries (non-merged /usr)"),
    fixed("/lib32", Access::ReadExec, "libraries of other ABIs"),
    fixed("/lib64", Access::ReadExec, "the dynamic linker"),
    fixed("/libx32", Access::ReadExec, "libraries of other ABIs"),
];

/// The few files of /etc a daemon reads after start. /etc as a whole (with
/// /etc/shadow, the retry token, TLS keys) stays out of reach, even for uid 0.
const ETC_READ: &[Grant] = &[
    fixed(
        "/etc/passwd",
        Access::FileRead,
        "user and group lookups (NSS)",
    ),
    fixed(
        "/etc/group",
        Access::FileRead,
        "user and group lookups (NSS)",
    ),
    fixed("/etc/nsswitch.conf", Access::FileRead, "NSS configuration"),
    fixed(
        "/etc/ld.so.cache",
        Access::FileRead,
        "finding NSS modules to load",
    ),
    fixed("/etc/localtime", Access::FileRead, "local time in logs"),
    fixed(
        "/etc/machine-id",
        Access::FileRead,
        "D-Bus Peer.GetMachineId",
    ),
];

/// Device files.
const DEVICES: &[Grant] = &[
    fixed(
        "/dev/null",
        Access::FileReadWrite,
        "children's standard streams; git's empty global config",
    ),
    fixed(
        "/dev/urandom",
        Access::FileRead,
        "randomness where getrandom(2) is not used",
    ),
];

/// A command's devices (the executor's commands inherit its domain).
const COMMAND_DEVICES: &[Grant] = &[
    fixed(
        "/dev/zero",
        Access::FileReadWrite,
        "commands' standard devices",
    ),
    fixed(
        "/dev/full",
        Access::FileReadWrite,
        "commands' standard devices",
    ),
    fixed("/dev/random", Access::FileRead, "commands' randomness"),
];

/// Landlock from ABI 9 checks connect(2) to pathname UNIX sockets; the
/// daemons reach the bus and systemd's notify socket after lockdown.
const DAEMON_MAX_ABI: (u8, &str) = (
    8,
    "ABI 9 would check connect(2) to the bus and notify sockets, whose paths are not granted yet",
);

// --- the roles --------------------------------------------------------------

const SUPERVISOR: RolePolicy = RolePolicy {
    grants: &[
        LIBS_READ,
        &[fixed(
            "/etc",
            Access::Read,
            "names of callers for the audit log (NSS reads /etc/passwd and /etc/group, which useradd and usermod replace with new files, so a grant on the files themselves goes stale on the first new user); the secrets in /etc stay behind their modes (/etc/shadow 0640 root:shadow, the retry token 0600 root) for the airlock user",
        )],
        &[fixed(
            "/proc",
            Access::Read,
            "the cgroup of a caller's process and of each agent's leader (/proc/PID/cgroup; under airlock-local, the session in /proc/PID/stat for an agent without a cgroup), which name the planner agent a submission comes from; other users' processes show the supervisor (user airlock) only what /proc shows every user",
        )],
        DEVICES,
        &[
            config(
                Slot::DatabaseDir,
                Access::All,
                "the task database and the WAL, shared-memory and journal files SQLite creates beside it",
            ),
            Grant {
                required: false,
                ..config(
                    Slot::DropInDir,
                    Access::Read,
                    "re-reads the repository drop-ins on SIGHUP (systemctl reload)",
                )
            },
            Grant {
                required: false,
                ..config(
                    Slot::SettingsDir,
                    Access::Read,
                    "re-reads the settings drop-ins' `[[agent]]` tables on SIGHUP, with the main file's (a directory made after start needs a restart)",
                )
            },
            Grant {
                required: false,
                ..config(
                    Slot::ConfigFile,
                    Access::FileRead,
                    "re-reads airlock.toml's `[[agent]]` tables on SIGHUP (systemctl reload: agents added, removed, narrowed or changed without a restart); its other sections are read once, before lockdown",
                )
            },
            Grant {
                required: false,
                ..config(
                    Slot::MetricsDir,
                    Access::All,
                    "writes airlock.prom there (a temporary file renamed over the last, which needs the right to remove files of the directory: the modes of the other collectors' files are what keep them); only when the directory exists at start, so a node exporter installed later takes a restart",
                )
            },
        ],
    ],
    lifted: &[],
    bounding: Bounding::Empty,
    limits: &[],
    degraded: Degraded::Warn,
    max_abi: DAEMON_MAX_ABI,
    tcp: Some(TcpPolicy {
        when: "`supervisor.database` is a postgresql:// URL with a TCP host (a UNIX socket needs nothing more)",
        grants: &[
            fixed(
                "/etc/hosts",
                Access::FileRead,
                "resolving the database server's name",
            ),
            fixed(
                "/etc/resolv.conf",
                Access::FileRead,
                "resolving the database server's name (DNS)",
            ),
            fixed(
                "/etc/gai.conf",
                Access::FileRead,
                "address order when the name has several",
            ),
            fixed("/etc/host.conf", Access::FileRead, "resolver options"),
        ],
    }),
};

const WORKER: RolePolicy = RolePolicy {
    grants: &[
        SYSTEM_EXEC,
        &[fixed(
            "/etc",
            Access::Read,
            "user and group lookups by git and ssh (NSS reads /etc/passwd and /etc/group, which useradd and usermod replace with new files, so a grant on the files themselves goes stale on the first new user: a running worker's ssh then fails with 'No user exists for uid'); ssh's /etc/ssh/ssh_config; the secrets in /etc stay behind their modes (/etc/shadow 0640 root:shadow, the retry token 0600 root) for the airlock-worker user",
        )],
        DEVICES,
        &[
            config(
                Slot::JournalDir,
                Access::All,
                "the checkpoint journal (with its WAL and shared memory) and envelopes/ beside it",
            ),
            config(
                Slot::WorkspaceRoot,
                Access::All,
                "per-attempt scratch directories: git's temporary index, the archive",
            ),
            config(
                Slot::SpoolRequests,
                Access::All,
                "publishes requests (write, fsync, rename) and removes its old ones",
            ),
            config(
                Slot::SpoolSources,
                Access::All,
                "publishes source archives and removes its old ones",
            ),
            config(
                Slot::SpoolResults,
                Access::Read,
                "reads the executor's results",
            ),
            config(
                Slot::SpoolFailed,
                Access::Read,
                "reads the executor's failures",
            ),
            config(
                Slot::SpoolWants,
                Access::Read,
                "reads the executor's requests for a source archive",
            ),
            Grant {
                required: false,
                ..config(
                    Slot::Repositories,
                    Access::All,
                    "git writes objects and agent/* refs of the authority repositories (a missing one is skipped and its tasks fail)",
                )
            },
            Grant {
                required: false,
                ..config(
                    Slot::RepositoryRoot,
                    Access::All,
                    "repositories `airlockctl repo add` makes there after start are served on reload without a restart",
                )
            },
            Grant {
                required: false,
                ..config(
                    Slot::DropInDir,
                    Access::Read,
                    "re-reads the repository drop-ins on SIGHUP (systemctl reload); airlock.toml itself is read once, before lockdown",
                )
            },
            Grant {
                required: false,
                ..config(
                    Slot::Credentials,
                    Access::Read,
                    "the upstreams' deploy keys and tokens and the signing keys systemd delivers (LoadCredential=)",
                )
            },
            Grant {
                required: false,
                ..config(
                    Slot::LocalUpstreams,
                    Access::All,
                    "a local-path upstream: fetched from, and the agent branches pushed to it",
                )
            },
            Grant {
                required: false,
                ..config(
                    Slot::SshLauncher,
                    Access::ReadExec,
                    "git starts the worker's own executable as its ssh (airlock's launcher: the deploy key and pinned host keys only), when an upstream is ssh://",
                )
            },
        ],
    ],
    lifted: &[],
    bounding: Bounding::Empty,
    limits: &[],
    degraded: Degraded::Warn,
    max_abi: DAEMON_MAX_ABI,
    tcp: Some(TcpPolicy {
        when: "a repository's upstream is an ssh:// or https:// URL (its port; a local path needs nothing more)",
        grants: &[
            fixed(
                "/etc/hosts",
                Access::FileRead,
                "resolving the upstream's name",
            ),
            fixed(
                "/etc/resolv.conf",
                Access::FileRead,
                "resolving the upstream's name (DNS)",
            ),
            fixed(
                "/etc/gai.conf",
                Access::FileRead,
                "address order when the name has several",
            ),
            fixed("/etc/host.conf", Access::FileRead, "resolver options"),
            fixed(
                "/etc/ssl",
                Access::Read,
                "the system's CA certificates, for an https upstream",
            ),
        ],
    }),
};

const EXECUTOR: RolePolicy = RolePolicy {
    grants: &[
        LIBS_READ,
        ETC_READ,
        DEVICES,
        &[
            config(
                Slot::SpoolRequests,
                Access::Read,
                "reads the worker's requests",
            ),
            config(
                Slot::SpoolSources,
                Access::Read,
                "reads the worker's source archives",
            ),
            config(
                Slot::SpoolResults,
                Access::All,
                "publishes results and removes its old ones",
            ),
            config(
                Slot::SpoolFailed,
                Access::All,
                "publishes failures and removes its old ones",
            ),
            config(
                Slot::SpoolWants,
                Access::All,
                "asks for the source of a tree it lacks, and removes its old requests",
            ),
            config(
                Slot::WorkRoot,
                Access::All,
                "the tree cache and its blob store, per-request upper directories and workspaces (whiteouts are character devices 0/0)",
            ),
            config(
                Slot::OutputDir,
                Access::All,
                "run-once writes its answer there",
            ),
        ],
    ],
    lifted: &[],
    bounding: Bounding::Empty,
    limits: &[],
    degraded: Degraded::RefuseUnlessAllowed,
    max_abi: (
        crate::policy::MAX_LANDLOCK_ABI,
        "the executor makes no connection after lockdown",
    ),
    tcp: None,
};

const SPAWNER: RolePolicy = RolePolicy {
    grants: &[
        SYSTEM_EXEC,
        &[
            fixed(
                "/etc",
                Access::ReadExec,
                "commands' configuration; each command's own ruleset narrows it to a few files",
            ),
            fixed(
                "/proc",
                Access::Read,
                "its own children list (/proc/self/task/*/children): the command's orphans to kill",
            ),
        ],
        DEVICES,
        COMMAND_DEVICES,
        &[config(
            Slot::WorkRoot,
            Access::All,
            "commands' workspaces and private TMPDIRs",
        )],
    ],
    lifted: &[
        Lifted {
            name: "mount",
            reason: "each command's init mounts its workspace, /tmp and /proc",
        },
        Lifted {
            name: "umount2",
            reason: "each command's init detaches the spawner's root after pivot_root",
        },
        Lifted {
            name: "pivot_root",
            reason: "each command's init makes the minimal root its root",
        },
        Lifted {
            name: "clone",
            reason: "each command's init is cloned into new mount and pid namespaces",
        },
    ],
    bounding: Bounding::Empty,
    limits: &[],
    degraded: Degraded::RefuseUnlessAllowed,
    max_abi: (
        crate::policy::MAX_LANDLOCK_ABI,
        "the spawner makes no connection; its commands get the kernel's whole ABI",
    ),
    tcp: None,
};

const RETRYD: RolePolicy = RolePolicy {
    // retryd holds no database: it asks the supervisor over the bus.
    grants: &[LIBS_READ, ETC_READ, DEVICES],
    lifted: &[],
    bounding: Bounding::Empty,
    limits: &[(
        Limit::OpenFiles,
        4096,
        "256 connections at a time; a descriptor leak stops at this bound",
    )],
    degraded: Degraded::Warn,
    max_abi: DAEMON_MAX_ABI,
    tcp: None,
};

const EGRESS: RolePolicy = RolePolicy {
    // Its UNIX socket is bound and its users looked up before lockdown;
    // after it, it reads only what getaddrinfo(3) loads and reads (the
    // resolver's own files are its TCP grants), and connects out over TCP.
    grants: &[
        LIBS_READ,
        &[
            fixed(
                "/etc/nsswitch.conf",
                Access::FileRead,
                "which NSS modules resolve host names",
            ),
            fixed(
                "/etc/ld.so.cache",
                Access::FileRead,
                "finding the NSS modules to load",
            ),
        ],
    ],
    lifted: &[],
    bounding: Bounding::Empty,
    limits: &[(
        Limit::OpenFiles,
        4096,
        "two descriptors per tunnel, 256 clients at a time; a descriptor leak stops at this bound",
    )],
    degraded: Degraded::Warn,
    max_abi: DAEMON_MAX_ABI,
    tcp: Some(TcpPolicy {
        when: "it runs (always: it connects to the `--connect-port` ports, 443 unless given, of the hosts a setup's preamble allows, to the port of each parent proxy its routes name (`via`), and its resolver may fall back to DNS over TCP, port 53)",
        grants: RESOLVER,
    }),
};

/// Name resolution by getaddrinfo(3) after start.
const RESOLVER: &[Grant] = &[
    fixed(
        "/etc/hosts",
        Access::FileRead,
        "resolving the names of the hosts a preamble allows",
    ),
    fixed(
        "/etc/resolv.conf",
        Access::FileRead,
        "resolving the names of the hosts a preamble allows (DNS)",
    ),
    fixed(
        "/etc/gai.conf",
        Access::FileRead,
        "address order when the name has several",
    ),
    fixed("/etc/host.conf", Access::FileRead, "resolver options"),
];

impl Role {
    /// Every role.
    pub const ALL: [Role; 6] = [
        Role::Supervisor,
        Role::Worker,
        Role::Executor,
        Role::Spawner,
        Role::Retryd,
        Role::Egress,
    ];

    /// The daemon's program name.
    pub fn program(self) -> &'static str {
        match self {
            Role::Supervisor => "airlock-supervisor",
            Role::Worker => "airlock-worker",
            Role::Executor => "airlock-executor",
            Role::Spawner => "airlock-executor (spawner)",
            Role::Retryd => "airlock-retryd",
            Role::Egress => "airlock-egress",
        }
    }

    /// The role's policy.
    pub fn policy(self) -> &'static RolePolicy {
        match self {
            Role::Supervisor => &SUPERVISOR,
            Role::Worker => &WORKER,
            Role::Executor => &EXECUTOR,
            Role::Spawner => &SPAWNER,
            Role::Retryd => &RETRYD,
            Role::Egress => &EGRESS,
        }
    }

    /// Every Landlock grant, in order.
    pub fn grants(self) -> impl Iterator<Item = &'static Grant> {
        self.policy().grants.iter().flat_map(|g| g.iter())
    }

    /// The seccomp rows in force: the sandbox's [`RULES`] minus the lifted.
    pub fn seccomp_rules(self) -> Vec<&'static Rule> {
        self.seccomp_rules_for(false)
    }

    /// The seccomp rows in force, with `tcp` when the daemon connects over
    /// TCP: the `socket` row then allows IP sockets too
    /// ([`SOCKET_UNIX_AND_IP`]).
    pub fn seccomp_rules_for(self, tcp: bool) -> Vec<&'static Rule> {
        let lifted = self.policy().lifted;
        let mut rules: Vec<&'static Rule> = RULES
            .iter()
            .filter(|r| !lifted.iter().any(|l| l.name == r.name))
            .filter(|r| !(tcp && r.name == "socket"))
            .collect();
        if tcp {
            rules.insert(0, &SOCKET_UNIX_AND_IP);
        }
        rules
    }
}

/// The roles' policies as the Markdown section of `docs/privsep/confinement.md`
/// between the `role-policy` markers.
pub fn markdown() -> String {
    let mut out = String::new();
    for role in Role::ALL {
        let p = role.policy();
        out.push_str(&format!("### {}\n\n", role.program()));
        if role == Role::Spawner {
            out.push_str(
                "Forked by the executor before its own lockdown. In the minimal root its \
                 filesystem confinement is its own mount namespace, which holds only the \
                 command root's template and the work root (Landlock would forbid the mounts \
                 each command's view is made of); in the host view Landlock applies with \
                 these grants.\n\n",
            );
        }
        out.push_str("| Landlock grant | access | why |\n|---|---|---|\n");
        for g in role.grants() {
            let place = match g.place {
                Place::Fixed(path) => format!("`{path}`"),
                Place::Config(slot) => slot.describe().to_owned(),
            };
            let who = match g.who {
                Who::Any => "",
                Who::NotRoot => " (not root)",
            };
            out.push_str(&format!(
                "| {place}{who} | {} | {} |\n",
                g.access.describe(),
                g.reason
            ));
        }
        out.push('\n');
        let denied: Vec<&str> = role.seccomp_rules().iter().map(|r| r.name).collect();
        let mut names = denied.clone();
        names.dedup();
        out.push_str(&format!(
            "seccomp denies (rows of the command sandbox's table, with their reasons): {}.\n",
            names
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        for l in p.lifted {
            out.push_str(&format!("Lifted: `{}` — {}.\n", l.name, l.reason));
        }
        out.push_str(&match p.bounding {
            Bounding::Empty => "Capability bounding set: emptied when held (root).\n".to_owned(),
            Bounding::Keep(why) => format!("Capability bounding set: kept — {why}.\n"),
        });
        out.push_str("Resource limits: RLIMIT_CORE 0");
        for (limit, value, why) in p.limits {
            out.push_str(&format!("; {} {value} ({why})", limit.name()));
        }
        out.push_str(".\n");
        if let Some(tcp) = p.tcp {
            out.push_str(&format!(
                "Over TCP, when {}: the `socket` row allows AF_UNIX, AF_INET and AF_INET6 only, Landlock allows TCP connect(2) to the configured ports only, and it grants {}.\n",
                tcp.when,
                tcp.grants
                    .iter()
                    .map(|g| match g.place {
                        Place::Fixed(path) => format!("`{path}` ({})", g.reason),
                        Place::Config(slot) => format!("{} ({})", slot.describe(), g.reason),
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        out.push_str(&format!(
            "Landlock ABI at most {} ({}); without full Landlock: {}.\n\n",
            p.max_abi.0,
            p.max_abi.1,
            match p.degraded {
                Degraded::Warn => "starts with a loud warning",
                Degraded::RefuseUnlessAllowed =>
                    "refuses to start unless `executor.allow_degraded_landlock`",
            }
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_grant_and_lift_has_a_reason() {
        for role in Role::ALL {
            for g in role.grants() {
                assert!(g.reason.len() > 10, "{role:?} {:?}", g.place);
                assert!(!g.reason.contains('\n') && !g.reason.contains('|'));
            }
            for l in role.policy().lifted {
                assert!(l.reason.len() > 10, "{role:?} {}", l.name);
                assert!(RULES.iter().any(|r| r.name == l.name), "{} unknown", l.name);
            }
        }
    }

    #[test]
    fn every_role_denies_what_no_daemon_needs() {
        // What the spawner lifts to build each command's minimal root.
        let spawner_lifts = ["mount", "umount2", "pivot_root", "clone"];
        for role in Role::ALL {
            let rules = role.seccomp_rules();
            for name in [
                "ptrace",
                "process_vm_readv",
                "process_vm_writev",
                "pidfd_getfd",
                "mount",
                "umount2",
                "pivot_root",
                "chroot",
                "fsopen",
                "move_mount",
                "open_tree",
                "open_by_handle_at",
                "setns",
                "clone",
                "clone3",
                "keyctl",
                "add_key",
                "request_key",
                "bpf",
                "perf_event_open",
                "io_uring_setup",
                "io_uring_enter",
                "io_uring_register",
                "userfaultfd",
                "kexec_load",
                "kexec_file_load",
                "init_module",
                "finit_module",
                "delete_module",
                "socket",
                "ioctl",
                "unshare",
            ] {
                let lifted = role == Role::Spawner && spawner_lifts.contains(&name);
                assert_eq!(
                    rules.iter().any(|r| r.name == name),
                    !lifted,
                    "{role:?} {name}"
                );
            }
        }
    }

    #[test]
    fn role_filters_compile() {
        for role in Role::ALL {
            let programs = crate::seccomp::compile_rules(&role.seccomp_rules()).unwrap();
            assert!(programs.iter().all(|p| !p.is_empty() && p.len() < 4096));
        }
    }

    #[test]
    fn exec_for_worker_and_spawner_only_and_etc_whole_for_spawner_supervisor_and_worker_only() {
        for role in Role::ALL {
            let exec = role
                .grants()
                .any(|g| matches!(g.access, Access::ReadExec | Access::FileExec));
            assert_eq!(
                exec,
                matches!(role, Role::Spawner | Role::Worker),
                "{role:?}"
            );
            // The daemons that look names up after start (a grant on
            // /etc/passwd itself goes stale when useradd replaces it); the
            // executor and airlock-retryd keep to a few files of /etc.
            let etc = role.grants().any(|g| g.place == Place::Fixed("/etc"));
            assert_eq!(
                etc,
                matches!(role, Role::Spawner | Role::Supervisor | Role::Worker),
                "{role:?}"
            );
        }
    }
}

//! Every key of `airlock.toml`: what it accepts, its default, what it means.
//!
//! This table is the single description of the file. Errors take their
//! "expected …" from it, `docs/configuration.md` is generated from it, and
//! the tests prove it matches the structs (each default equals the
//! serialised [`Config::embedded_default`](crate::Config::embedded_default),
//! each key is accepted, each wrong value refused by name).

use airlock_proto::limits::{MAX_CAPABILITIES, MAX_CAPABILITY_LEN, MAX_OUTPUT_TAIL_BYTES};

/// What a key accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A table, `[name]`.
    Table,
    /// An array of tables, `[[name]]`.
    Tables,
    /// An integer in an inclusive range.
    Integer {
        /// Smallest accepted value.
        min: u64,
        /// Largest accepted value.
        max: u64,
    },
    /// `true` or `false`.
    Bool,
    /// An absolute path, written without `.`, `..`, empty components or a trailing `/`.
    Path,
    /// Where the task store lives: an absolute path (an SQLite file) or a
    /// `postgresql://` URL without a password.
    Database,
    /// A unix user name other than root.
    User,
    /// A unix group name.
    Group,
    /// One of a fixed set of strings.
    Choice(&'static [&'static str]),
    /// A loopback IP address with a non-zero port.
    LoopbackAddress,
    /// A repository name (`airlock_proto::binding::is_repository_name`).
    RepositoryName,
    /// An owner authorization id (`airlock_proto::binding::is_key`).
    AuthorizationId,
    /// A single line of text.
    Text {
        /// Most characters.
        max_chars: usize,
    },
    /// An agent name (`is_agent_name`): the instance of `airlock-agent@NAME.service`.
    AgentName,
    /// A command line as a list: an absolute program path, then its
    /// arguments (repeats allowed).
    Argv {
        /// Most elements, the program included.
        max: usize,
    },
    /// An upstream URL (`airlock_proto::upstream::Scheme::of`).
    UpstreamUrl,
    /// A list of distinct items.
    List {
        /// What each element is.
        item: Item,
        /// Most elements.
        max: usize,
    },
}

/// What one element of a [`Kind::List`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Item {
    /// An absolute path, as [`Kind::Path`].
    Path,
    /// A Python module name, dotted identifiers.
    PythonModule,
    /// A git subcommand that does not write (not in [`GIT_WRITING_SUBCOMMANDS`]).
    GitSubcommand,
    /// A capability name.
    Capability,
    /// A repository-relative path the credential policy would otherwise refuse.
    CredentialPath,
    /// A unix user name (root included).
    User,
    /// A known_hosts line: host patterns, a key type, a base64 key.
    HostKey,
    /// A git push option: printable text without newlines.
    PushOption,
    /// A repository name, as [`Kind::RepositoryName`].
    RepositoryName,
    /// An environment variable name an agent may receive from its driver.
    EnvironmentName,
}

impl Kind {
    /// What the key accepts, as it follows "expected" in an error.
    pub fn describe(&self) -> String {
        match self {
            Kind::Table => "a table".to_owned(),
            Kind::Tables => "an array of tables, written [[name]]".to_owned(),
            Kind::Integer { min, max } => format!("an integer in {min}..={max}"),
            Kind::Bool => "true or false".to_owned(),
            Kind::Path => Item::Path.describe(),
            Kind::Database => format!(
                "{} (an SQLite file), or a postgresql:// URL without a password",
                Item::Path.describe()
            ),
            Kind::User => {
                "a unix user name of 1 to 32 characters [a-z0-9_-], starting with a letter or '_', other than root"
                    .to_owned()
            }
            Kind::Group => {
                "a unix group name of 1 to 32 characters [a-z0-9_-], starting with a letter or '_'"
                    .to_owned()
            }
            Kind::Choice(choices) => {
                let quoted: Vec<String> = choices.iter().map(|c| format!("\"{c}\"")).collect();
                format!("one of {}", quoted.join(", "))
            }
            Kind::LoopbackAddress => {
                "a loopback address with a non-zero port, as \"127.0.0.1:8941\" or \"[::1]:8941\""
                    .to_owned()
            }
            Kind::RepositoryName => {
                "a repository name: 1 to 64 characters [A-Za-z0-9._-], starting with a letter or digit"
                    .to_owned()
            }
            Kind::AuthorizationId => {
                "an id of 8 to 160 characters [A-Za-z0-9._:-], starting with a letter or digit"
                    .to_owned()
            }
            Kind::AgentName => {
                "an agent name: 1 to 48 characters [a-z0-9_-], starting with a letter or digit"
                    .to_owned()
            }
            Kind::Argv { max } => format!(
                "a list of 1 to {max} strings: an absolute program path, then its arguments (each at most {MAX_ARGUMENT_BYTES} bytes, without control characters)"
            ),
            Kind::Text { max_chars } => {
                format!("a single line of at most {max_chars} characters, without control characters")
            }
            Kind::UpstreamUrl => {
                "an ssh://[user@]host[:port]/path or https://host[:port]/path URL (no credentials in it), or an absolute local path"
                    .to_owned()
            }
            Kind::List { item, max } => {
                format!("a list of at most {max} distinct {}", item.plural())
            }
        }
    }
}

impl Item {
    /// What one element accepts, as it follows "expected" in an error.
    pub fn describe(&self) -> String {
        match self {
            Item::Path => "an absolute path without '.', '..' or empty components".to_owned(),
            Item::PythonModule => {
                "a Python module name such as \"pytest\" or \"xml.etree\" (dotted identifiers)"
                    .to_owned()
            }
            Item::GitSubcommand => format!(
                "the name of a git subcommand that does not write (lowercase letters, digits and '-'; not one of {})",
                GIT_WRITING_SUBCOMMANDS.join(", ")
            ),
            Item::Capability => format!(
                "a capability name of 1 to {MAX_CAPABILITY_LEN} characters [a-z0-9._-], starting with a letter or digit"
            ),
            Item::CredentialPath => {
                "a repository-relative path that airlock treats as a credential, such as \".env\" or \"config/server.pem\""
                    .to_owned()
            }
            Item::User => "a unix user name".to_owned(),
            Item::HostKey => "a known_hosts line: \"HOST KEYTYPE BASE64KEY\", as ssh-keyscan prints it (HOST may be [host]:port)".to_owned(),
            Item::PushOption => "a push option of 1 to 200 printable characters".to_owned(),
            Item::RepositoryName => Kind::RepositoryName.describe(),
            Item::EnvironmentName => format!(
                "an environment variable name of 1 to 64 characters [A-Z0-9_], starting with a letter or '_', not LD_* and not one airlock sets ({})",
                RESERVED_AGENT_ENVIRONMENT.join(", ")
            ),
        }
    }

    fn plural(&self) -> &'static str {
        match self {
            Item::Path => "absolute paths",
            Item::PythonModule => "Python module names",
            Item::GitSubcommand => "read-only git subcommands",
            Item::Capability => "capability names",
            Item::CredentialPath => "credential-like repository-relative paths",
            Item::User => "unix user names",
            Item::HostKey => "known_hosts lines",
            Item::PushOption => "push options",
            Item::RepositoryName => "repository names",
            Item::EnvironmentName => "environment variable names",
        }
    }
}

/// One key of the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeySpec {
    /// Dotted key; `[]` stands for "every element" of an array of tables,
    /// e.g. `repository[].name`.
    pub key: &'static str,
    /// What it accepts.
    pub kind: Kind,
    /// Its default, as TOML, or `None` for tables, required keys and keys
    /// that are unset unless given.
    pub default: Option<&'static str>,
    /// Whether the key must be present (only inside `[[repository]]`).
    pub required: bool,
    /// What it is for.
    pub meaning: &'static str,
}

/// Longest single element of an agent's `command`, in bytes.
pub const MAX_ARGUMENT_BYTES: usize = 4096;

/// Environment variables the agent drivers set themselves; an agent's
/// `environment` allowlist may not name them.
pub const RESERVED_AGENT_ENVIRONMENT: &[&str] = &[
    "AIRLOCK_AGENT",
    "CREDENTIALS_DIRECTORY",
    "DBUS_SYSTEM_BUS_ADDRESS",
    "HOME",
    "PATH",
];

/// git subcommands that write to a repository, its refs, its index or its
/// working tree, or reach the network; never accepted in
/// `executor.git_read_only_subcommands`.
pub const GIT_WRITING_SUBCOMMANDS: &[&str] = &[
    "add",
    "am",
    "apply",
    "branch",
    "checkout",
    "cherry-pick",
    "clean",
    "clone",
    "commit",
    "commit-tree",
    "config",
    "fetch",
    "filter-branch",
    "gc",
    "hash-object",
    "init",
    "merge",
    "mv",
    "notes",
    "prune",
    "pull",
    "push",
    "read-tree",
    "rebase",
    "reflog",
    "remote",
    "repack",
    "replace",
    "reset",
    "restore",
    "revert",
    "rm",
    "stash",
    "submodule",
    "switch",
    "symbolic-ref",
    "tag",
    "update-index",
    "update-ref",
    "worktree",
    "write-tree",
];

/// Default of `executor.git_read_only_subcommands`.
pub(crate) const DEFAULT_GIT_READ_ONLY: &[&str] = &[
    "status",
    "diff",
    "log",
    "show",
    "ls-files",
    "ls-tree",
    "rev-parse",
    "rev-list",
    "grep",
    "cat-file",
    "blame",
    "describe",
    "for-each-ref",
    "show-ref",
];

const fn int(min: u64, max: u64) -> Kind {
    Kind::Integer { min, max }
}

const fn key(
    key: &'static str,
    kind: Kind,
    default: &'static str,
    meaning: &'static str,
) -> KeySpec {
    KeySpec {
        key,
        kind,
        default: Some(default),
        required: false,
        meaning,
    }
}

const fn section(key: &'static str, kind: Kind, meaning: &'static str) -> KeySpec {
    KeySpec {
        key,
        kind,
        default: None,
        required: false,
        meaning,
    }
}

const MIB: u64 = 1024 * 1024;
const GIB: u64 = 1024 * MIB;

/// Every key of `airlock.toml`, sections first, in file order.
pub const KEYS: &[KeySpec] = &[
    // ---- [supervisor] ------------------------------------------------------
    section(
        "supervisor",
        Kind::Table,
        "airlock-supervisor: owns the task queue and serves it on the D-Bus system bus.",
    ),
    key(
        "supervisor.database",
        Kind::Database,
        "\"/var/lib/airlock/tasks.sqlite3\"",
        "The task store (queue, leases, events, retry compare-and-swap). A path is an SQLite file on this host that only the supervisor opens. A postgresql:// URL (e.g. \"postgresql://airlock@%2Frun%2Fpostgresql/airlock\" over a UNIX socket, or \"postgresql://airlock@db.example/airlock?sslmode=verify-full\" over TCP with TLS and supervisor.database_ca_file) is a PostgreSQL database that the supervisors of several hosts share: one queue for every host (docs/postgresql.md). The URL never carries the password: the supervisor reads it from the systemd credential airlock-database-password (LoadCredential=), or connects without one (peer authentication on a UNIX socket).",
    ),
    KeySpec {
        key: "supervisor.database_ca_file",
        kind: Kind::Path,
        default: None,
        required: false,
        meaning: "With a postgresql:// URL over TCP: a PEM file of the CA certificates the server's certificate must chain to. Required with sslmode=verify-full (the chain and the server's name, as the URL's host, are checked) or sslmode=verify-ca (the chain only); read once at start, a file without a certificate is refused. Without sslmode=verify-full or verify-ca in the URL it must be unset. sslmode=require, prefer and allow are refused: they encrypt without authenticating the server (docs/postgresql.md).",
    },
    key(
        "supervisor.database_allow_plaintext",
        Kind::Bool,
        "false",
        "Allow a postgresql:// URL without TLS (no sslmode, or sslmode=disable) whose host is not loopback. When false such a URL is refused at start with CONFIG_INVALID: the password and every task would cross the network unencrypted, to a server nobody authenticated. UNIX sockets and loopback (127.0.0.0/8, ::1, localhost) need no TLS either way. Set it only for a network you trust end to end.",
    ),
    key(
        "supervisor.lease_seconds",
        int(10, 86_400),
        "300",
        "Lifetime of a worker's lease on a claimed task. A lease not renewed within this time expires, and the holder is fenced off by the lease epoch.",
    ),
    key(
        "supervisor.sweep_interval_seconds",
        int(1, 3_600),
        "15",
        "How often the supervisor looks for expired leases. At most supervisor.lease_seconds.",
    ),
    key(
        "supervisor.max_running_per_submitter",
        int(0, 4096),
        "0",
        "Most tasks of one submitter that may be RUNNING at once, across every host sharing the queue: each planner agent is one submitter (whichever user it runs as), and so is each user submitting outside an agent. A claim passes over the queued tasks of a submitter at its cap, so one submitter cannot take every worker slot; its tasks wait, QUEUED, until one of its running tasks ends. An agent's own agent[].max_running, when set, replaces it for that agent. 0: no cap. Whatever the caps, claims interleave submitters: among the claimable tasks the one whose submitter has the fewest tasks RUNNING goes first, then the one whose submitter was served longest ago, then the oldest.",
    ),
    key(
        "supervisor.auto_accept",
        Kind::Bool,
        "false",
        "When true, a task whose verification commands passed, every one fully confined by the executor's own measure (Landlock in full, seccomp, a known filesystem view, a uid other than root), moves to SUCCEEDED without an admin's decision; any other result waits in VERIFYING, its gaps recorded in the result event and shown by airlockctl show. When false every result waits for a decision.",
    ),
    key(
        "supervisor.worker_user",
        Kind::User,
        "\"airlock-worker\"",
        "The unix user whose calls to the worker-only D-Bus methods are accepted (the peer's uid is checked). Must differ from executor.user.",
    ),
    key(
        "supervisor.authorizer",
        Kind::Choice(&["polkit", "local", "allow-all-for-tests"]),
        "\"polkit\"",
        "Who authorises privileged D-Bus methods. \"polkit\" asks polkit and denies when it cannot be reached. \"local\", for machines without polkit (airlock-local uses it), allows exactly the users in supervisor.local_users and denies everyone else. \"allow-all-for-tests\" approves every call; only test builds of airlock-supervisor accept it, and a packaged supervisor refuses to start with CONFIG_INVALID when it is set.",
    ),
    key(
        "supervisor.local_users",
        Kind::List {
            item: Item::User,
            max: 64,
        },
        "[]",
        "With supervisor.authorizer = \"local\": the users allowed every org.airlock.Tasks2 (and Tasks1), org.airlock.Agents1 and org.airlock.Reconcile1 method (read, submit, manage, resolve). Ignored with polkit.",
    ),
    key(
        "supervisor.local_planners",
        Kind::List {
            item: Item::User,
            max: 64,
        },
        "[]",
        "With supervisor.authorizer = \"local\": the users allowed to read and submit tasks and nothing else (what polkit's rule grants airlock-agent on an installed system). airlock-local lists the agents' user here. Ignored with polkit.",
    ),
    key(
        "supervisor.agent_driver",
        Kind::Choice(&["systemd", "local-host"]),
        "\"systemd\"",
        "What runs the [[agent]]s: \"systemd\" (instances of airlock-agent@.service, which the supervisor starts and stops over org.freedesktop.systemd1 as polkit/50-airlock-supervisor.rules allows), or \"local-host\" (airlock-local's org.airlock.AgentHost1 on the suite's bus, which starts each agent as airlock-agent in its own process group; airlock-local sets it). Without agents it changes nothing.",
    ),
    key(
        "supervisor.agent_call_timeout_seconds",
        int(1, 300),
        "10",
        "How long one call of the agent driver may take (systemd's StartUnit, StopUnit and the unit's state; airlock-local's AgentHost1 Start, Probe and Stop). A call not answered by then counts as a failure of the agent, as a crash does: the restart policy backs off and holds the agent after 5 in a row, and the late answer is ignored (seed 000). It also bounds the supervisor's subscription to systemd at start. Raise it on a machine where starting a unit is slow; each start of a crash-looping agent may take this long.",
    ),
    key(
        "supervisor.metrics_directory",
        Kind::Path,
        "\"/var/lib/prometheus/node-exporter\"",
        "Where the supervisor writes airlock.prom, its metrics in the node exporter's textfile-collector format (docs/metrics.md): the directory the collector reads (Debian's prometheus-node-exporter reads this one). Written whole or not at all (a temporary file renamed over the last), mode 0644: counts, durations, state and code names and agent names, no task content. A directory that does not exist is not an error: the file is written once it does.",
    ),
    key(
        "supervisor.metrics_interval_seconds",
        int(0, 3_600),
        "15",
        "How often airlock.prom is written; 0 writes no metrics.",
    ),
    key(
        "supervisor.bus_address",
        Kind::Text { max_chars: 512 },
        "\"\"",
        "The D-Bus address of the bus the supervisor is on (e.g. \"unix:path=/run/airlock-local/bus\"), for airlockctl --config FILE: its commands reach the supervisor there unless --bus names another. Empty: the system bus (DBUS_SYSTEM_BUS_ADDRESS when set). airlock-local records its private bus here; an installed system leaves it empty. The daemons are told their bus by who starts them, not by this key.",
    ),
    // ---- [worker] ----------------------------------------------------------
    section(
        "worker",
        Kind::Table,
        "airlock-worker: the only process that writes agent/* refs; keeps the checkpoint journal and never runs task code.",
    ),
    key(
        "worker.journal",
        Kind::Path,
        "\"/var/lib/airlock-worker/checkpoints.sqlite3\"",
        "The SQLite checkpoint journal. Must differ from supervisor.database.",
    ),
    key(
        "worker.workspace_root",
        Kind::Path,
        "\"/var/lib/airlock-worker/workspaces\"",
        "Directory under which the worker makes one workspace per task, and removes stale ones at start.",
    ),
    key(
        "worker.parallel_tasks",
        int(0, 64),
        "0",
        "How many tasks the worker runs at once; 0: as many as executor.parallel_jobs resolves to, so that every task it claims has a verification job waiting for it.",
    ),
    key(
        "worker.capabilities",
        Kind::List {
            item: Item::Capability,
            max: MAX_CAPABILITIES,
        },
        "[\"git.read\", \"git.test\"]",
        "The capabilities this worker grants. A task whose envelope asks for a capability not listed here is refused with CAPABILITY_MISMATCH_DENY.",
    ),
    key(
        "worker.renew_interval_seconds",
        int(1, 43_200),
        "60",
        "How often the worker renews the lease of each task it runs. At most half of supervisor.lease_seconds, so one late renewal does not lose the lease.",
    ),
    key(
        "worker.repository_root",
        Kind::Path,
        "\"/srv/airlock\"",
        "Directory under which `airlockctl repo add` makes the authority repositories. The worker may write anywhere beneath it (its Landlock grant), so a repository added here is served after `systemctl reload airlock-worker` without a restart; a repository registered elsewhere needs a restart of the worker.",
    ),
    key(
        "worker.readers_group",
        Kind::Group,
        "\"airlock-readers\"",
        "The group that may read the authority repositories (planners such as airlock-agent, and admins added to it): `airlockctl repo add` makes each repository readable by it and writable by the worker alone.",
    ),
    // ---- [spool] -----------------------------------------------------------
    section(
        "spool",
        Kind::Table,
        "The directory through which the worker and the executor exchange requests, source archives, results and failures.",
    ),
    key(
        "spool.root",
        Kind::Path,
        "\"/var/spool/airlock\"",
        "Root of the spool; holds requests/, sources/, results/, failed/ and wants/.",
    ),
    key(
        "spool.max_file_bytes",
        int(MIB, 4 * GIB),
        "1073741824",
        "Largest file either side reads from the spool, in bytes. At least executor.limits.max_archive_bytes, since source archives cross the spool (only when the executor lacks a tree).",
    ),
    key(
        "spool.exchange_group",
        Kind::Group,
        "\"airlock-exchange\"",
        "The group that the worker and the executor share, and nobody else; spool directories belong to it.",
    ),
    // ---- [executor] --------------------------------------------------------
    section(
        "executor",
        Kind::Table,
        "airlock-executor: holds no credential, applies a plan to a throw-away copy and runs its verification commands, each in a fresh sandbox.",
    ),
    key(
        "executor.user",
        Kind::User,
        "\"airlock-exec\"",
        "The unix user the executor and its commands run as. Must differ from supervisor.worker_user.",
    ),
    key(
        "executor.allow_degraded_landlock",
        Kind::Bool,
        "false",
        "When false, the executor refuses to run (SANDBOX_UNAVAILABLE) if Landlock cannot be applied in full. When true it runs with what the kernel offers and logs that it did.",
    ),
    key(
        "executor.landlock_min_abi",
        int(1, 10),
        "1",
        "The lowest Landlock ABI the commands' sandbox accepts. A kernel offering less is refused (SANDBOX_UNAVAILABLE), or, with allow_degraded_landlock, run degraded: the result's isolation evidence then says so and auto_accept leaves it to a human. 1 accepts any Landlock; raise it to demand newer rights (ABI 3: truncate; 5: device ioctls; 6: signal and abstract-socket scoping).",
    ),
    key(
        "executor.programs",
        Kind::List {
            item: Item::Path,
            max: 64,
        },
        "[\"/usr/bin/python3\", \"/usr/bin/git\", \"/bin/true\", \"/usr/bin/true\"]",
        "The programs a verification command may start (argv[0], compared exactly); anything else is refused with COMMAND_PROGRAM_DENY. No shell by default: a shell would let a command run anything the sandbox allows, past the module and git rules below.",
    ),
    key(
        "executor.python_modules",
        Kind::List {
            item: Item::PythonModule,
            max: 64,
        },
        "[\"pytest\", \"py_compile\", \"unittest\", \"compileall\"]",
        "The modules `python3 -m` may name; any other is refused with PYTHON_MODULE_DENY.",
    ),
    key(
        "executor.git_read_only_subcommands",
        Kind::List {
            item: Item::GitSubcommand,
            max: 64,
        },
        "[\"status\", \"diff\", \"log\", \"show\", \"ls-files\", \"ls-tree\", \"rev-parse\", \"rev-list\", \"grep\", \"cat-file\", \"blame\", \"describe\", \"for-each-ref\", \"show-ref\"]",
        "The git subcommands a verification command may run; any other is refused with GIT_MUTATION_DENY. Subcommands that write (push, commit, update-ref, …) are refused here as configuration errors.",
    ),
    key(
        "executor.allow_credential_paths",
        Kind::List {
            item: Item::CredentialPath,
            max: 64,
        },
        "[]",
        "Credential-like repository paths (such as .env or *.pem) that changes and source captures may touch anyway; any other is refused with CREDENTIAL_PATH_DENIED. Each entry must be a path the credential policy would otherwise refuse, so a typo cannot pass unnoticed.",
    ),
    key(
        "executor.parallel_jobs",
        int(0, 64),
        "0",
        "How many verification jobs the executor runs at once, each with a command spawner of its own (forked at start), its own workspace and its own evidence; the tree, blob and layer caches are shared (an entry a job uses is never evicted or moved under it, and a tree is filled once). 0: the CPUs the executor may use (its CPU affinity), at most 16.",
    ),
    key(
        "executor.tree_cache_entries",
        int(1, 1_000),
        "8",
        "Most source trees the executor keeps extracted (its tree cache, keyed by git tree id, whose files are hard links to one blob store keyed by object id, so a file several trees hold is on disk once); the least recently used go first. A request whose tree is cached costs no archive and no extraction; one whose tree is a few commits from a cached one costs only the objects that differ (a source delta).",
    ),
    key(
        "executor.tree_cache_mib",
        int(64, 16 * 1_048_576),
        "8192",
        "Most MiB of files the tree cache keeps, counted per tree (a blob several cached trees share counts once for each: a bound on the disk the cache uses, never below it); a tree larger than this alone is kept only while it is used.",
    ),
    key(
        "executor.layer_cache_mib",
        int(64, 16 * 1_048_576),
        "8192",
        "Most MiB of files the dependency layer cache keeps (the sealed outputs of environments' setups, keyed by environment and inputs); the least recently used go first.",
    ),
    key(
        "executor.min_free_disk_mib",
        int(0, 16 * 1_048_576),
        "1024",
        "The host's reserve on the executor's work file system, in MiB: while a verification job writes (its written bytes growing), the executor checks the file system's free space every quarter second and has the command killed when it is below this, and its failed command ends the task with HOST_DISK_RESERVE (distinct from COMMAND_DISK_EXCEEDED: the job may be within its own quota, and a later attempt, once space is freed, may pass). A job that writes nothing is never stopped for it. 0: no reserve. Applies where the executor has per-job cgroups.",
    ),
    key(
        "executor.egress_socket",
        Kind::Path,
        "\"/run/airlock-egress/egress.sock\"",
        "The UNIX socket of airlock-egress, the only route out of a setup: the executor's forwarder connects there for each connection a setup opens.",
    ),
    // ---- [executor.limits] -------------------------------------------------
    section(
        "executor.limits",
        Kind::Table,
        "Resource limits on each verification command, and bounds on the source archive the executor unpacks.",
    ),
    key(
        "executor.limits.processes",
        int(1, 4_096),
        "64",
        "RLIMIT_NPROC: most processes the executor's user may have at once.",
    ),
    key(
        "executor.limits.address_space_mib",
        int(64, 1_048_576),
        "4096",
        "RLIMIT_AS: largest virtual address space of one process, in MiB.",
    ),
    key(
        "executor.limits.file_size_mib",
        int(1, 65_536),
        "256",
        "RLIMIT_FSIZE: largest file a command may write, in MiB.",
    ),
    key(
        "executor.limits.open_files",
        int(16, 1_048_576),
        "1024",
        "RLIMIT_NOFILE: most open file descriptors per process.",
    ),
    key(
        "executor.limits.cpu_seconds",
        int(1, 86_400),
        "600",
        "RLIMIT_CPU: most CPU seconds per process. The wall-clock timeout is each command's own timeout_seconds (1..=1800).",
    ),
    key(
        "executor.limits.max_archive_bytes",
        int(1_024, 4 * GIB),
        "1073741824",
        "Largest source archive the executor accepts, in bytes (SOURCE_ARCHIVE_INVALID beyond it). 1 GiB: an uncompressed tar spends 512 to 1024 bytes of headers per file, about 100 MiB for 100,000 files, before their content; it crosses the spool only when the executor lacks the tree.",
    ),
    key(
        "executor.limits.max_archive_entries",
        int(1, 1_000_000),
        "250000",
        "Most entries in a source archive (SOURCE_ARCHIVE_LIMIT_EXCEEDED beyond it). 250,000: a 100,000-file repository works out of the box, with room; the worker archives files only, and a cached tree costs nothing per request whatever its size.",
    ),
    key(
        "executor.limits.max_file_bytes",
        int(1, GIB),
        "4194304",
        "Largest single file extracted from the archive or produced by a change, in bytes (FILE_TOO_LARGE beyond it). At most executor.limits.max_total_bytes.",
    ),
    key(
        "executor.limits.max_total_bytes",
        int(1, 16 * GIB),
        "2147483648",
        "Largest sum of extracted file sizes, in bytes (SOURCE_ARCHIVE_LIMIT_EXCEEDED beyond it). 2 GiB, for mid-size repositories; each tree is extracted once into the cache.",
    ),
    key(
        "executor.limits.max_expansion_ratio",
        int(1, 100_000),
        "100",
        "Largest ratio of extracted bytes to archive bytes; an archive that expands more is treated as a bomb (SOURCE_ARCHIVE_LIMIT_EXCEEDED).",
    ),
    key(
        "executor.limits.output_tail_bytes",
        int(0, MAX_OUTPUT_TAIL_BYTES as u64),
        "4096",
        "How many trailing bytes of each command's stdout and stderr are kept as evidence.",
    ),
    key(
        "executor.limits.job_memory_mib",
        int(64, 1_048_576),
        "4096",
        "Each verification job's memory, in MiB: the limit of the job's own cgroup (memory.max, or v1's memory.limit_in_bytes; no swap), which holds the job's commands and its spawner and not the executor. A job that reaches it has a process killed by the job's OOM killer (on cgroup v2 the job's processes as one) and its failed command ends the task with COMMAND_MEMORY_EXCEEDED; its peak is in the command's evidence. Applies where the executor has per-job cgroups (docs/privsep/confinement.md says where).",
    ),
    key(
        "executor.limits.job_processes",
        int(8, 65_536),
        "512",
        "Each verification job's processes and threads: its cgroup's pids.max. A fork past it is refused, and a command that fails after that ends the task with COMMAND_PROCESS_LIMIT. Where the executor has per-job cgroups, this is the only process limit that matters: executor.limits.processes (RLIMIT_NPROC, counted per uid for every job at once) is raised to this times the jobs plus one, so no job's fork bomb starves another.",
    ),
    key(
        "executor.limits.job_cpu_max",
        int(0, 4096),
        "0",
        "Each verification job's CPU quota, in CPUs: its cgroup's cpu.max (v1: cpu.cfs_quota_us over cpu.cfs_period_us, a period of 100 ms); 0 sets none. Every job has an equal CPU weight whatever this is (cpu.weight 100, v1 cpu.shares 1024), so jobs running at once share the CPUs equally and an idle one's share goes to the others; a quota caps a job even on an idle machine. The CPU time each command's job used is in its evidence (wall.cpu_used_ms). Applies where the executor has per-job cgroups with the cpu controller; the executor refuses to start with a quota it cannot set.",
    ),
    key(
        "executor.limits.job_disk_mib",
        int(0, 16 * 1_048_576),
        "8192",
        "What each verification job may write, in MiB: the growth of its workspace (an overlay's upper layer, or its copy) and of its scratch directory (a host view's /tmp and HOME; the minimal root's /tmp is a tmpfs of 256 MiB in the job's memory) while a command runs, as the executor measures it every quarter second. Past it the executor has the command killed (by its spawner, through the job's cancel pipe) and the failed command ends the task with COMMAND_DISK_EXCEEDED; the peak written is in the command's evidence (wall.disk_peak_bytes). A single file stays bounded by executor.limits.file_size_mib (RLIMIT_FSIZE). 0: no quota. Applies where the executor has per-job cgroups.",
    ),
    // ---- [retry] -----------------------------------------------------------
    section(
        "retry",
        Kind::Table,
        "airlock-retryd: the owner-only HTTP API that grants a failed task exactly one more attempt.",
    ),
    key(
        "retry.user",
        Kind::User,
        "\"airlock-retry\"",
        "The unix user airlock-retryd runs as. The supervisor accepts calls to its Retry1 interface from this uid only (the peer's uid is checked), and airlock-retryd never opens the task database itself.",
    ),
    key(
        "retry.listen",
        Kind::LoopbackAddress,
        "\"127.0.0.1:8941\"",
        "Address the retry API listens on. Loopback only: the API is for the machine's owner.",
    ),
    key(
        "retry.token_file",
        Kind::Path,
        "\"/etc/airlock/retry-control.token\"",
        "File holding the bearer token the owner presents (at least 32 characters).",
    ),
    KeySpec {
        key: "retry.authorization_id",
        kind: Kind::AuthorizationId,
        default: None,
        required: false,
        meaning: "The owner authorization id every retry-extension request must carry. Unset means none is configured in this file; the service's environment variable AIRLOCK_RETRY_AUTHORIZATION_ID, when set, takes precedence over this key (applied by airlock-retryd, not by this parser).",
    },
    // ---- [[repository]] ----------------------------------------------------
    section(
        "repository",
        Kind::Tables,
        "The authority repositories tasks may name, one [[repository]] table each. There are none by default; a task naming an unregistered repository is refused with REPOSITORY_NOT_REGISTERED.",
    ),
    KeySpec {
        key: "repository[].name",
        kind: Kind::RepositoryName,
        default: None,
        required: true,
        meaning: "The name tasks use in their binding. Unique across the file.",
    },
    KeySpec {
        key: "repository[].path",
        kind: Kind::Path,
        default: None,
        required: true,
        meaning: "Absolute path of the bare authority repository. Unique across the file. Parsing does not open it; the worker does.",
    },
    KeySpec {
        key: "repository[].description",
        kind: Kind::Text { max_chars: 200 },
        default: None,
        required: false,
        meaning: "Free text for admins.",
    },
    KeySpec {
        key: "repository[].environment",
        kind: Kind::Table,
        default: None,
        required: false,
        meaning: "The repository's verification environment: read-only toolchain paths, the programs its commands may start, their variables, and a dependency setup. Every key is in [environments.md](environments.md), generated from the same crate.",
    },
    KeySpec {
        key: "repository[].upstream",
        kind: Kind::Table,
        default: None,
        required: false,
        meaning: "The team's remote for this repository (docs/upstream.md). With it the worker fetches the remote's branches and tags on a schedule, on `airlockctl repo sync` and when a task names a base it does not have yet (never writing agent/*), and publishes each governed commit's agent branch to it exactly once. Its credential is not here: `airlockctl repo add --credential` installs it where only the worker's unit reads it.",
    },
    KeySpec {
        key: "repository[].upstream.url",
        kind: Kind::UpstreamUrl,
        default: None,
        required: true,
        meaning: "Where the remote is: ssh:// (with a deploy key and pinned host keys), https:// (with a token, or none to fetch a public remote), or an absolute path on this host. scp-like host:path, git://, http:// and ext:: are refused (UPSTREAM_URL_INVALID).",
    },
    KeySpec {
        key: "repository[].upstream.publish",
        kind: Kind::Bool,
        default: Some("true"),
        required: false,
        meaning: "Push each task's agent branch to the remote after its governed commit (the publication phase). false: follow the remote only.",
    },
    KeySpec {
        key: "repository[].upstream.push_options",
        kind: Kind::List {
            item: Item::PushOption,
            max: 16,
        },
        default: Some("[]"),
        required: false,
        meaning: "git push options sent with every publication (for forges that open a review request from push options); recorded in the task's result.",
    },
    KeySpec {
        key: "repository[].upstream.host_keys",
        kind: Kind::List {
            item: Item::HostKey,
            max: 16,
        },
        default: Some("[]"),
        required: false,
        meaning: "The remote's SSH host keys, as known_hosts lines: the only keys ssh accepts for it (a changed or unlisted key is UPSTREAM_HOST_KEY_CHANGED). Required for an ssh:// URL.",
    },
    KeySpec {
        key: "repository[].upstream.user",
        kind: Kind::Text { max_chars: 64 },
        default: Some("\"git\""),
        required: false,
        meaning: "For https: the user name sent with the token (HTTP basic authentication); forges differ in what they expect.",
    },
    KeySpec {
        key: "repository[].upstream.sync_interval_seconds",
        kind: int(0, 86_400),
        default: Some("300"),
        required: false,
        meaning: "Seconds between scheduled fetches, each jittered by up to a tenth; 0: only on `airlockctl repo sync` and when a task needs a base.",
    },
    KeySpec {
        key: "repository[].upstream.timeout_seconds",
        kind: int(5, 3_600),
        default: Some("120"),
        required: false,
        meaning: "Wall time one fetch, probe or push may take; past it git and ssh are killed. A timed-out publication is tried again (UPSTREAM_UNREACHABLE), a timed-out fetch is UPSTREAM_FETCH_LIMIT.",
    },
    KeySpec {
        key: "repository[].upstream.max_fetch_mib",
        kind: int(1, 1 << 20),
        default: Some("4096"),
        required: false,
        meaning: "Largest pack one fetch may receive, in MiB (every fetch writes one pack, watched while it grows); a fetch beyond it is killed, its partial pack removed, and no ref changes (UPSTREAM_FETCH_LIMIT).",
    },
    KeySpec {
        key: "repository[].signing",
        kind: Kind::Table,
        default: None,
        required: false,
        meaning: "Sign every governed commit with an SSH signature (Ed25519, deterministic: a replay gives the same commit). The key is installed by `airlockctl repo add --signing-key`, where only the worker's unit reads it; `git verify-commit` with an allowed-signers file checks the commits.",
    },
    KeySpec {
        key: "repository[].signing.principal",
        kind: Kind::Text { max_chars: 200 },
        default: None,
        required: true,
        meaning: "The signer's name in allowed-signers files (usually an e-mail address, without spaces or commas); shown with the key's fingerprint in `airlockctl show` and the events.",
    },
    // ---- [[agent]] ---------------------------------------------------------
    section(
        "agent",
        Kind::Tables,
        "Planner agents the supervisor runs, one [[agent]] table each, none by default. Each runs as the user airlock-agent (the instance airlock-agent@NAME.service under systemd, a process of its own under airlock-local), is restarted by the supervisor's crash-loop policy (500 ms doubling to 8 s; held with AGENTOS_CRASH_LOOP after 5 consecutive failures until an operator clears the hold) and may propose only for its repositories.",
    ),
    KeySpec {
        key: "agent[].name",
        kind: Kind::AgentName,
        default: None,
        required: true,
        meaning: "The agent's name: its unit instance, and the name its tasks and events are attributed to. Unique across the file.",
    },
    KeySpec {
        key: "agent[].command",
        kind: Kind::Argv { max: 64 },
        default: None,
        required: true,
        meaning: "The program to run and its arguments, as a list (never split or run by a shell). The program must be an absolute path readable and executable by airlock-agent.",
    },
    KeySpec {
        key: "agent[].repositories",
        kind: Kind::List {
            item: Item::RepositoryName,
            max: 64,
        },
        default: None,
        required: true,
        meaning: "The repositories this agent may propose for; a submission it makes for any other is refused with AGENT_REPOSITORY_DENIED, and it reads and may replace the plan (ReplacePlan) of only the tasks it submitted itself (another's task is TASK_NOT_FOUND, as if it did not exist), in one of them (else AGENT_REPOSITORY_DENIED). Each must be registered (in this file or in repositories.d/) when the configuration is loaded.",
    },
    KeySpec {
        key: "agent[].environment",
        kind: Kind::List {
            item: Item::EnvironmentName,
            max: 64,
        },
        default: Some("[]"),
        required: false,
        meaning: "Names of environment variables passed from the driver's environment to the agent (such as HTTPS_PROXY or LANG); every other variable is cleared. Under systemd the driver's environment is the agent unit's: Environment= of a drop-in, or /etc/airlock/agents/NAME.env. The drivers themselves set AIRLOCK_AGENT (the agent's name), PATH, HOME, the bus address when it is not the default, and CREDENTIALS_DIRECTORY when a credential_file is set.",
    },
    KeySpec {
        key: "agent[].credential_file",
        kind: Kind::Path,
        default: None,
        required: false,
        meaning: "A file holding this agent's model API key, read by the driver and handed to this agent alone as the credential `model-key` in $CREDENTIALS_DIRECTORY. No two agents may name the same file. Parsing does not open it. Under the systemd driver it must be /etc/airlock/agents/NAME.key, which the unit's LoadCredential= reads (and which must exist, empty for an agent without a key).",
    },
    key(
        "agent[].memory_max_mib",
        int(16, 1024 * 1024),
        "1024",
        "Most memory the agent may use, in MiB (MemoryMax= under systemd; RLIMIT_AS of each process under the process driver).",
    ),
    key(
        "agent[].tasks_max",
        int(1, 4096),
        "64",
        "Most processes and threads the agent may have (TasksMax= under systemd; RLIMIT_NPROC of the airlock-agent user under the process driver, which counts every process of that user).",
    ),
    key(
        "agent[].max_running",
        int(0, 4096),
        "0",
        "Most of this agent's tasks that may be RUNNING at once, across every host sharing the queue; a claim passes over its queued tasks while it is at the cap. Set here, beside the agent's quotas, it replaces supervisor.max_running_per_submitter for this agent (larger or smaller): an administrator tunes one agent without touching the others. 0: supervisor.max_running_per_submitter applies. A reload applies a change at once, without restarting the agent.",
    ),
    key(
        "agent[].tasks_per_hour",
        int(0, 1_000_000),
        "0",
        "Most tasks this agent may submit in any 3,600 s of the store's clock (every host's submissions to a shared queue count). A submission over it is refused with AGENT_QUOTA_EXCEEDED naming the quota and its figures, recorded as a denial, and stores nothing; an identical replay of a task already stored is not a new submission. Replacing a queued task's plan (ReplacePlan) is not a submission and is never refused for a quota. 0: no quota. A reload applies a change at once.",
    ),
    key(
        "agent[].cpu_seconds_per_day",
        int(0, 86_400_000),
        "0",
        "Most CPU seconds the verification of this agent's tasks may use in any 86,400 s of the store's clock, every attempt of every task counted when its result is reported. While the last day's use has reached it, the agent's submissions are refused with AGENT_QUOTA_EXCEEDED naming the quota and its figures. Until the executor reports each command's CPU time, a command's CPU seconds are its wall-clock duration (duration_ms in the result), which is at least its CPU time for a single-threaded command and may be less for a parallel one. 0: no quota. A reload applies a change at once.",
    ),
    KeySpec {
        key: "agent[].description",
        kind: Kind::Text { max_chars: 200 },
        default: None,
        required: false,
        meaning: "Free text for admins.",
    },
];

/// The spec of a normalised dotted key (indices written `[]`).
pub(crate) fn spec(key: &str) -> Option<&'static KeySpec> {
    KEYS.iter().find(|s| s.key == key)
}

/// The keys directly under a normalised table key ("" is the top level).
pub(crate) fn children(table: &str) -> Vec<&'static str> {
    // The environment's keys live in their own table (docs/environments.md).
    if let Some(rest) = table
        .strip_prefix("repository[].")
        .filter(|r| r.starts_with("environment"))
    {
        let prefix = rest.to_owned();
        return crate::ENVIRONMENT_KEYS
            .iter()
            .filter_map(|k| {
                let r = k.key.strip_prefix(prefix.as_str())?.strip_prefix('.')?;
                Some(r.split('.').next().unwrap_or(r))
            })
            .fold(Vec::new(), |mut v, k| {
                if !v.contains(&k) {
                    v.push(k);
                }
                v
            });
    }
    KEYS.iter()
        .filter_map(|s| {
            let rest = if table.is_empty() {
                Some(s.key)
            } else {
                s.key.strip_prefix(table).and_then(|r| r.strip_prefix('.'))
            }?;
            (!rest.contains('.')).then_some(rest)
        })
        .collect()
}

/// What a normalised dotted key expects; list elements (`x[]`) take their
/// list's item description, `[[table]]` elements are tables.
pub(crate) fn expectation(key: &str) -> Option<String> {
    if let Some(spec) = spec(key) {
        return Some(spec.kind.describe());
    }
    let list = key.strip_suffix("[]")?;
    match spec(list)?.kind {
        Kind::List { item, .. } => Some(item.describe()),
        Kind::Tables => Some(Kind::Table.describe()),
        _ => None,
    }
}

/// `repository[3].path` → `repository[].path`.
pub(crate) fn normalise(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    let mut in_index = false;
    for c in key.chars() {
        match c {
            '[' => {
                in_index = true;
                out.push('[');
            }
            ']' => {
                in_index = false;
                out.push(']');
            }
            _ if in_index => {}
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_unique_and_sections_come_first() {
        let mut seen = std::collections::HashSet::new();
        for spec in KEYS {
            assert!(seen.insert(spec.key), "duplicate {}", spec.key);
            if let Some((parent, _)) = spec.key.rsplit_once('.') {
                let parent = parent.strip_suffix("[]").unwrap_or(parent);
                assert!(seen.contains(parent), "{} before its section", spec.key);
            }
            assert!(!spec.meaning.is_empty());
        }
    }

    #[test]
    fn normalises_indices_and_finds_children() {
        assert_eq!(normalise("repository[12].path"), "repository[].path");
        assert_eq!(normalise("executor.programs[0]"), "executor.programs[]");
        assert_eq!(
            children(""),
            [
                "supervisor",
                "worker",
                "spool",
                "executor",
                "retry",
                "repository",
                "agent"
            ]
        );
        assert_eq!(
            children("repository[]"),
            [
                "name",
                "path",
                "description",
                "environment",
                "upstream",
                "signing"
            ]
        );
        assert!(children("executor").contains(&"limits"));
        assert!(!children("executor").contains(&"processes"));
        assert_eq!(
            expectation("executor.programs[]").as_deref(),
            Some("an absolute path without '.', '..' or empty components")
        );
    }

    #[test]
    fn default_read_only_git_subcommands_do_not_write() {
        for sub in DEFAULT_GIT_READ_ONLY {
            assert!(!GIT_WRITING_SUBCOMMANDS.contains(sub), "{sub}");
        }
    }
}

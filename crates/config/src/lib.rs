//! airlock-config: the typed form of `/etc/airlock/airlock.toml`.
//!
//! Every airlock service reads the same file. Parsing happens in two stages,
//! like any other boundary in airlock:
//!
//! 1. **Shape.** The text is deserialised with [`toml::Deserializer`] wrapped
//!    in [`serde_path_to_error`]; every table refuses unknown keys, so a
//!    misspelt key is an error, never a silently ignored line.
//! 2. **Meaning.** [`Config::parse`] then checks ranges, absolute paths,
//!    names, list contents and the rules that tie keys together (a renewal
//!    interval shorter than the lease, the executor's user distinct from the
//!    worker's, repository names unique, …).
//!
//! Every refusal is a [`ConfigError`] whose message names the file, the key
//! as a dotted path (`executor.limits.processes`, `repository[1].path`), its
//! line and column when known, and what was expected and found. Every key,
//! its default and its meaning are declared once in [`KEYS`]; the reference
//! `docs/configuration.md` is generated from that table.
//!
//! Parsing reads no file but the configuration itself: whether a repository
//! path really is a bare repository, or a user really exists, is checked by
//! the service that uses it.
//!
//! # Example
//!
//! ```
//! use std::path::Path;
//! use airlock_config::Config;
//!
//! let text = r#"
//! [executor.limits]
//! processes = -3
//! "#;
//! let err = Config::parse(text, Path::new("/etc/airlock/airlock.toml")).unwrap_err();
//! assert_eq!(err.key(), Some("executor.limits.processes"));
//! assert_eq!(
//!     err.to_string(),
//!     "/etc/airlock/airlock.toml:3:13: executor.limits.processes: \
//!      expected an integer in 1..=4096, found -3"
//! );
//! assert_eq!(err.code(), airlock_proto::Code::CONFIG_INVALID);
//!
//! let ok = Config::parse(
//!     "[[repository]]\nname = \"demo\"\npath = \"/srv/git/demo.git\"\n",
//!     Path::new("inline.toml"),
//! )
//! .unwrap();
//! assert_eq!(ok.repository("demo").map(|r| r.path.as_path()), Some(Path::new("/srv/git/demo.git")));
//! assert_eq!(ok.supervisor.lease_seconds, 300);
//! ```

mod durable;
mod environment;
mod error;
mod keys;
mod layers;
pub mod routes;
mod secret;
mod source;
mod validate;

use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use durable::write_durably;
pub use environment::{
    ENVIRONMENT_KEYS, EXAMPLES as ENVIRONMENT_EXAMPLES, Environment, EnvironmentError,
    EnvironmentKey, ProgramTable, Resolved, ResolvedSetup, Setup, is_host_port, looks_secret,
    parse_environment_file, read_environment_file,
};
pub use error::{ConfigError, Location};
pub use keys::{GIT_WRITING_SUBCOMMANDS, Item, KEYS, KeySpec, Kind};
pub use layers::{Migrated, SETTINGS_DIR_NAME, files_read, migrated_settings, settings_dir};
pub use secret::{NAMES_NO_SECRET, NOT_SHOWN, SECRET_BEARING, bears_secret};
pub use validate::{RULES, is_agent_name};

/// Where the services look for their configuration.
pub const DEFAULT_PATH: &str = "/etc/airlock/airlock.toml";

/// Largest configuration file airlock reads.
pub const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

/// The whole configuration file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// `[supervisor]`: the task queue owner.
    pub supervisor: Supervisor,
    /// `[worker]`: the credentialed committer.
    pub worker: Worker,
    /// `[spool]`: the directory the worker and the executor exchange files through.
    pub spool: Spool,
    /// `[executor]`: the uncredentialed sandbox runner.
    pub executor: Executor,
    /// `[retry]`: the owner's retry-extension HTTP API.
    pub retry: Retry,
    /// `[[repository]]`: the authority repositories tasks may name. Empty by default.
    #[serde(rename = "repository")]
    pub repositories: Vec<Repository>,
    /// `[[agent]]`: the planner agents the supervisor runs. Empty by default.
    #[serde(rename = "agent")]
    pub agents: Vec<Agent>,
}

/// How privileged D-Bus methods are authorised.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Authorizer {
    /// Ask polkit; deny when polkit cannot be reached.
    #[default]
    Polkit,
    /// Allow exactly `supervisor.local_users`, deny everyone else (no polkit).
    Local,
    /// Approve every call. For test harnesses only; must be chosen
    /// explicitly, and only test builds of the supervisor accept it.
    AllowAllForTests,
}

/// `[supervisor]`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Supervisor {
    /// The SQLite task store.
    pub database: PathBuf,
    /// The CA certificates (PEM) a PostgreSQL server's certificate must
    /// chain to (`sslmode=verify-full` or `verify-ca`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub database_ca_file: Option<PathBuf>,
    /// Allow a PostgreSQL connection without TLS to a host that is not
    /// loopback.
    pub database_allow_plaintext: bool,
    /// Lifetime of a lease on a claimed task, in seconds.
    pub lease_seconds: u32,
    /// How often expired leases are swept, in seconds.
    pub sweep_interval_seconds: u32,
    /// Most RUNNING tasks per submitter (an agent, or a user outside
    /// one); 0: no cap. An agent's `max_running` replaces it.
    pub max_running_per_submitter: u32,
    /// Accept a task whose verification passed without an admin's decision.
    pub auto_accept: bool,
    /// The unix user whose calls to the worker interface are accepted.
    pub worker_user: String,
    /// Who authorises privileged D-Bus methods.
    pub authorizer: Authorizer,
    /// With the local authoriser: the users allowed every Tasks2 method.
    pub local_users: Vec<String>,
    /// With the local authoriser: the users allowed to read and submit tasks only.
    pub local_planners: Vec<String>,
    /// What runs the `[[agent]]`s.
    pub agent_driver: AgentDriver,
    /// How long one call of the agent driver may take, in seconds (seed
    /// 000's call timeout).
    pub agent_call_timeout_seconds: u32,
    /// The directory the node exporter's textfile collector reads, where
    /// the supervisor writes `airlock.prom` (docs/metrics.md).
    pub metrics_directory: PathBuf,
    /// How often `airlock.prom` is written, in seconds; 0: never.
    pub metrics_interval_seconds: u32,
    /// The bus the supervisor is on, for airlockctl and agents given this
    /// configuration; empty: the system bus.
    pub bus_address: String,
}

/// What runs the planner agents.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AgentDriver {
    /// systemd's `airlock-agent@NAME.service` instances.
    #[default]
    Systemd,
    /// airlock-local's process host (`org.airlock.AgentHost1` on its bus).
    LocalHost,
}

impl Default for Supervisor {
    fn default() -> Self {
        Supervisor {
            database: PathBuf::from("/var/lib/airlock/tasks.sqlite3"),
            database_ca_file: None,
            database_allow_plaintext: false,
            lease_seconds: 300,
            sweep_interval_seconds: 15,
            max_running_per_submitter: 0,
            auto_accept: false,
            worker_user: "airlock-worker".to_owned(),
            authorizer: Authorizer::Polkit,
            local_users: Vec::new(),
            local_planners: Vec::new(),
            agent_driver: AgentDriver::Systemd,
            agent_call_timeout_seconds: 10,
            metrics_directory: PathBuf::from("/var/lib/prometheus/node-exporter"),
            metrics_interval_seconds: 15,
            bus_address: String::new(),
        }
    }
}

/// `[worker]`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Worker {
    /// The SQLite checkpoint journal.
    pub journal: PathBuf,
    /// Directory under which per-task workspaces are made and removed.
    pub workspace_root: PathBuf,
    /// How many tasks the worker runs at once; 0: [`Config::parallel_tasks`]
    /// resolves it from the executor's jobs.
    pub parallel_tasks: u32,
    /// Capabilities this worker grants; an envelope's scope must be a subset.
    pub capabilities: Vec<String>,
    /// How often the worker renews its leases, in seconds.
    pub renew_interval_seconds: u32,
    /// Where `airlockctl repo add` makes authority repositories.
    pub repository_root: PathBuf,
    /// The group that may read the authority repositories.
    pub readers_group: String,
}

impl Default for Worker {
    fn default() -> Self {
        Worker {
            journal: PathBuf::from("/var/lib/airlock-worker/checkpoints.sqlite3"),
            workspace_root: PathBuf::from("/var/lib/airlock-worker/workspaces"),
            parallel_tasks: 0,
            capabilities: vec!["git.read".to_owned(), "git.test".to_owned()],
            renew_interval_seconds: 60,
            repository_root: PathBuf::from("/srv/airlock"),
            readers_group: "airlock-readers".to_owned(),
        }
    }
}

/// `[spool]`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Spool {
    /// Root of `requests/`, `sources/`, `results/`, `failed/` and `wants/`.
    pub root: PathBuf,
    /// Largest file either side accepts from the spool, in bytes.
    pub max_file_bytes: u64,
    /// The group shared by the worker and the executor, and nobody else.
    pub exchange_group: String,
}

impl Default for Spool {
    fn default() -> Self {
        Spool {
            root: PathBuf::from("/var/spool/airlock"),
            max_file_bytes: 1024 * 1024 * 1024,
            exchange_group: "airlock-exchange".to_owned(),
        }
    }
}

/// `[executor]`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Executor {
    /// The unix user verification commands run as.
    pub user: String,
    /// Run even when Landlock cannot be fully applied.
    pub allow_degraded_landlock: bool,
    /// The lowest Landlock ABI the commands' sandbox accepts.
    pub landlock_min_abi: u8,
    /// Absolute paths of the programs a verification command may start.
    pub programs: Vec<PathBuf>,
    /// Modules `python3 -m` may name.
    pub python_modules: Vec<String>,
    /// git subcommands a verification command may run.
    pub git_read_only_subcommands: Vec<String>,
    /// Credential-like repository paths a change or capture may touch anyway.
    pub allow_credential_paths: Vec<String>,
    /// How many verification jobs run at once; 0: [`Config::parallel_jobs`]
    /// resolves it from the CPUs the executor may use.
    pub parallel_jobs: u32,
    /// Most source trees kept extracted (the tree cache).
    pub tree_cache_entries: u32,
    /// Most MiB of files in the tree cache.
    pub tree_cache_mib: u64,
    /// Most MiB of files in the dependency layer cache.
    pub layer_cache_mib: u64,
    /// MiB of the work file system no job may take (0: no reserve).
    pub min_free_disk_mib: u64,
    /// airlock-egress's socket.
    pub egress_socket: PathBuf,
    /// `[executor.limits]`.
    pub limits: Limits,
}

impl Default for Executor {
    fn default() -> Self {
        let strings = |items: &[&str]| items.iter().map(|s| (*s).to_owned()).collect();
        Executor {
            user: "airlock-exec".to_owned(),
            allow_degraded_landlock: false,
            landlock_min_abi: 1,
            programs: [
                "/usr/bin/python3",
                "/usr/bin/git",
                "/bin/true",
                "/usr/bin/true",
            ]
            .into_iter()
            .map(PathBuf::from)
            .collect(),
            python_modules: strings(&["pytest", "py_compile", "unittest", "compileall"]),
            git_read_only_subcommands: strings(keys::DEFAULT_GIT_READ_ONLY),
            allow_credential_paths: Vec::new(),
            parallel_jobs: 0,
            tree_cache_entries: 8,
            tree_cache_mib: 8192,
            layer_cache_mib: 8192,
            min_free_disk_mib: 1024,
            egress_socket: PathBuf::from("/run/airlock-egress/egress.sock"),
            limits: Limits::default(),
        }
    }
}

/// `[executor.limits]`: rlimits per verification command and bounds on the source archive.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// RLIMIT_NPROC.
    pub processes: u32,
    /// RLIMIT_AS, in MiB.
    pub address_space_mib: u32,
    /// RLIMIT_FSIZE, in MiB.
    pub file_size_mib: u32,
    /// RLIMIT_NOFILE.
    pub open_files: u32,
    /// RLIMIT_CPU, in seconds.
    pub cpu_seconds: u32,
    /// Largest source archive, in bytes.
    pub max_archive_bytes: u64,
    /// Most entries in a source archive.
    pub max_archive_entries: u32,
    /// Largest single file extracted or changed, in bytes.
    pub max_file_bytes: u64,
    /// Largest sum of extracted file sizes, in bytes.
    pub max_total_bytes: u64,
    /// Largest ratio of extracted bytes to archive bytes.
    pub max_expansion_ratio: u32,
    /// How much of each command's stdout and stderr is kept as evidence, in bytes.
    pub output_tail_bytes: u32,
    /// Each job's memory, in MiB (its cgroup's limit, no swap).
    pub job_memory_mib: u32,
    /// Each job's processes and threads (its cgroup's `pids.max`).
    pub job_processes: u32,
    /// Each job's CPU quota, in CPUs (0: none, only the equal share).
    pub job_cpu_max: u32,
    /// What each job may write to its workspace and scratch, in MiB (0:
    /// no quota).
    pub job_disk_mib: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            processes: 64,
            address_space_mib: 4096,
            file_size_mib: 256,
            open_files: 1024,
            cpu_seconds: 600,
            max_archive_bytes: 1024 * 1024 * 1024,
            max_archive_entries: 250_000,
            max_file_bytes: airlock_proto::limits::MAX_CHANGE_CONTENT_BYTES as u64,
            max_total_bytes: 2 * 1024 * 1024 * 1024,
            max_expansion_ratio: 100,
            output_tail_bytes: airlock_proto::limits::MAX_OUTPUT_TAIL_BYTES as u32,
            job_memory_mib: 4096,
            job_processes: 512,
            job_cpu_max: 0,
            job_disk_mib: 8192,
        }
    }
}

/// `[retry]`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Retry {
    /// The unix user airlock-retryd runs as; only its calls to the
    /// supervisor's Retry1 interface are accepted.
    pub user: String,
    /// Loopback address the retry API listens on.
    pub listen: SocketAddr,
    /// File holding the bearer token the owner presents.
    pub token_file: PathBuf,
    /// The owner authorization id requests must carry, when set here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub authorization_id: Option<String>,
}

impl Default for Retry {
    fn default() -> Self {
        Retry {
            user: "airlock-retry".to_owned(),
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 8941)),
            token_file: PathBuf::from("/etc/airlock/retry-control.token"),
            authorization_id: None,
        }
    }
}

/// One `[[repository]]`: an authority repository tasks may name.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Repository {
    /// The name tasks use (`binding.repository`).
    pub name: String,
    /// Absolute path of the bare repository.
    pub path: PathBuf,
    /// Free text for admins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Its verification environment (docs/environments.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<Environment>,
    /// Its upstream, the team's remote (docs/upstream.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<Upstream>,
    /// Its commit signing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signing: Option<Signing>,
    /// The drop-in file that registered it (`repositories.d/NAME.toml`);
    /// `None` for a table in the main file.
    #[serde(skip)]
    pub drop_in: Option<PathBuf>,
}

/// `[repository.upstream]`: the team's remote.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Upstream {
    /// ssh://, https:// or an absolute path.
    pub url: String,
    /// Push agent branches to it.
    #[serde(default = "Upstream::default_publish")]
    pub publish: bool,
    /// Push options sent with every publication.
    #[serde(default)]
    pub push_options: Vec<String>,
    /// Pinned SSH host keys (known_hosts lines).
    #[serde(default)]
    pub host_keys: Vec<String>,
    /// The user name sent with an https token.
    #[serde(default = "Upstream::default_user")]
    pub user: String,
    /// Seconds between scheduled fetches (0: none).
    #[serde(default = "Upstream::default_sync_interval")]
    pub sync_interval_seconds: u32,
    /// Wall time of one transfer.
    #[serde(default = "Upstream::default_timeout")]
    pub timeout_seconds: u32,
    /// Largest pack one fetch may write, MiB.
    #[serde(default = "Upstream::default_max_fetch")]
    pub max_fetch_mib: u32,
}

impl Upstream {
    /// An upstream at `url` with every other key at its default.
    pub fn at(url: &str) -> Upstream {
        Upstream {
            url: url.to_owned(),
            publish: true,
            push_options: Vec::new(),
            host_keys: Vec::new(),
            user: Upstream::default_user(),
            sync_interval_seconds: Upstream::default_sync_interval(),
            timeout_seconds: Upstream::default_timeout(),
            max_fetch_mib: Upstream::default_max_fetch(),
        }
    }
    fn default_publish() -> bool {
        true
    }
    fn default_user() -> String {
        "git".to_owned()
    }
    fn default_sync_interval() -> u32 {
        300
    }
    fn default_timeout() -> u32 {
        120
    }
    fn default_max_fetch() -> u32 {
        4096
    }
}

/// `[repository.signing]`: SSH signatures on governed commits.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Signing {
    /// The signer's allowed-signers name.
    pub principal: String,
}

/// The file names, in the worker's credentials directory, of a
/// repository's upstream credential and signing key (systemd's
/// `$CREDENTIALS_DIRECTORY`, filled by `LoadCredential=` lines that
/// `airlockctl repo add` writes; airlock-local's own directory).
pub fn credential_names(repository: &str) -> (String, String) {
    (
        format!("upstream-{repository}"),
        format!("signing-{repository}"),
    )
}

/// One `[[agent]]`: a planner the supervisor runs, restarts and holds.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Agent {
    /// Its name: the unit instance and the name its submissions carry.
    pub name: String,
    /// The program (absolute path) and its arguments.
    pub command: Vec<String>,
    /// The repositories it may propose for.
    pub repositories: Vec<String>,
    /// Environment variables passed through from the driver's environment.
    #[serde(default)]
    pub environment: Vec<String>,
    /// Its model API key, handed to it alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_file: Option<PathBuf>,
    /// Memory limit, in MiB.
    #[serde(default = "Agent::default_memory_max_mib")]
    pub memory_max_mib: u32,
    /// Process and thread limit.
    #[serde(default = "Agent::default_tasks_max")]
    pub tasks_max: u32,
    /// Most of its tasks RUNNING at once; 0: the supervisor's
    /// `max_running_per_submitter`.
    #[serde(default)]
    pub max_running: u32,
    /// Most tasks it may submit per hour of store time; 0: no quota.
    #[serde(default)]
    pub tasks_per_hour: u32,
    /// Most CPU seconds its tasks' verification may use per day of store
    /// time; 0: no quota.
    #[serde(default)]
    pub cpu_seconds_per_day: u64,
    /// Free text for admins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

impl Agent {
    fn default_memory_max_mib() -> u32 {
        1024
    }

    fn default_tasks_max() -> u32 {
        64
    }

    /// The cap on its RUNNING tasks: its own `max_running`, else
    /// `per_submitter` (the supervisor's); 0: none.
    pub fn running_cap(&self, per_submitter: u32) -> u32 {
        if self.max_running > 0 {
            self.max_running
        } else {
            per_submitter
        }
    }

    /// Whether this agent may propose for `repository`.
    pub fn may_propose_for(&self, repository: &str) -> bool {
        self.repositories.iter().any(|r| r == repository)
    }
}

/// The most jobs `executor.parallel_jobs = 0` resolves to.
pub const AUTO_JOBS_MAX: u32 = 16;

impl Config {
    /// How many verification jobs the executor runs at once:
    /// `executor.parallel_jobs`, or for 0 the CPUs this process may run on
    /// (its affinity, which systemd's CPUAffinity= and a cpuset narrow), at
    /// most [`AUTO_JOBS_MAX`].
    pub fn parallel_jobs(&self) -> u32 {
        match self.executor.parallel_jobs {
            0 => std::thread::available_parallelism()
                .map_or(1, |n| u32::try_from(n.get()).unwrap_or(AUTO_JOBS_MAX))
                .clamp(1, AUTO_JOBS_MAX),
            n => n,
        }
    }

    /// How many tasks the worker runs at once: `worker.parallel_tasks`,
    /// or for 0 as many as [`Config::parallel_jobs`].
    pub fn parallel_tasks(&self) -> u32 {
        match self.worker.parallel_tasks {
            0 => self.parallel_jobs(),
            n => n,
        }
    }

    /// Reads and validates the configuration file at `path` (usually
    /// [`DEFAULT_PATH`]). The file must be a regular file (symlinks are
    /// followed), at most [`MAX_CONFIG_BYTES`], UTF-8, and not writable by
    /// other users.
    ///
    /// Repositories may also be registered one per file in the drop-in
    /// directory beside it ([`drop_in_dir`]): `repositories.d/NAME.toml`
    /// holding one `[[repository]]` table whose name is `NAME` and nothing
    /// else (what `airlockctl repo add` writes). Files not ending in
    /// `.toml` are ignored; each drop-in is read like the main file, and a
    /// name or path registered twice is refused naming the drop-in.
    ///
    /// Every file read (the main file and each drop-in) must be a regular
    /// file neither its group nor others may write, owned by root — or by
    /// the reader's own uid when the reader is not root
    /// ([`acceptable_owner`]) — and, once the drop-ins are read, lie
    /// outside every registered repository
    /// ([`check_outside_repositories`]); each refusal names the file and
    /// the fix.
    ///
    /// Settings drop-ins in `airlock.toml.d/` beside it ([`settings_dir`])
    /// are read in name order after it, each over the ones before (see
    /// `layers.rs`); they are read once, like the main file, and obey the
    /// same rules about owners, modes and repositories.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = read_config_file(path)?;
        let (mut config, settings) = layers::parse_layered(path, &text)?;
        config.repositories = config.repositories_now(path)?;
        check_outside_repositories(path, &settings, &config.repositories)?;
        config.check_agent_repositories(path)?;
        Ok(config)
    }

    /// Every repository an agent names is registered (in the main file or
    /// a drop-in); checked by [`Config::load`], once the drop-ins are read.
    pub fn check_agent_repositories(&self, path: &Path) -> Result<(), ConfigError> {
        for (i, agent) in self.agents.iter().enumerate() {
            for (j, repo) in agent.repositories.iter().enumerate() {
                if self.repository(repo).is_none() {
                    return Err(ConfigError::Key {
                        file: path.to_owned(),
                        at: None,
                        key: format!("agent[{i}].repositories[{j}]"),
                        problem: format!(
                            "expected a registered repository (in this file or {}), found {repo:?}",
                            drop_in_dir(path).display()
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// The configured agent called `name`.
    pub fn agent(&self, name: &str) -> Option<&Agent> {
        self.agents.iter().find(|a| a.name == name)
    }

    /// The repositories registered now: those of the main file as this
    /// configuration has them, then the drop-ins currently in the drop-in
    /// directory of `path` (what a reload re-reads; the main file itself is
    /// read once, at start).
    pub fn repositories_now(&self, path: &Path) -> Result<Vec<Repository>, ConfigError> {
        let mut repositories: Vec<Repository> = self
            .repositories
            .iter()
            .filter(|r| r.drop_in.is_none())
            .cloned()
            .collect();
        for file in drop_in_files(&drop_in_dir(path))? {
            let repo = read_drop_in(&file)?;
            let clash = repositories
                .iter()
                .find(|r| r.name == repo.name || r.path == repo.path);
            if let Some(other) = clash {
                let origin = other
                    .drop_in
                    .as_deref()
                    .unwrap_or(path)
                    .display()
                    .to_string();
                return Err(ConfigError::Unacceptable {
                    file,
                    expected: format!(
                        "a repository whose name and path no other registers ({origin} already registers {:?} at {})",
                        other.name,
                        other.path.display()
                    ),
                });
            }
            repositories.push(repo);
        }
        let drop_ins: Vec<PathBuf> = repositories
            .iter()
            .filter_map(|r| r.drop_in.clone())
            .collect();
        check_outside_repositories(path, &drop_ins, &repositories)?;
        Ok(repositories)
    }

    /// Parses and validates configuration text; `origin` names the file in
    /// errors and is not opened.
    pub fn parse(text: &str, origin: &Path) -> Result<Config, ConfigError> {
        let config = Config::parse_shape(text, origin)?;
        validate::check(&config, &source::Source::new(origin, text))?;
        Ok(config)
    }

    /// The first stage of [`Config::parse`] alone: syntax, unknown keys and
    /// types, without the rules between keys.
    fn parse_shape(text: &str, origin: &Path) -> Result<Config, ConfigError> {
        let src = source::Source::new(origin, text);
        serde_path_to_error::deserialize(toml::Deserializer::new(text))
            .map_err(|e| src.shape_error(&e))
    }

    /// The built-in defaults: every section at its documented default and no
    /// repositories. It passes the same validation as a parsed file.
    pub fn embedded_default() -> Config {
        Config::default()
    }

    /// The registered repository called `name`.
    pub fn repository(&self, name: &str) -> Option<&Repository> {
        self.repositories.iter().find(|r| r.name == name)
    }

    /// Names of the registered repositories, in file order (pass
    /// `.into_iter()` to `airlock_proto::binding::Binding::check_registered`).
    pub fn repository_names(&self) -> Vec<&str> {
        self.repositories.iter().map(|r| r.name.as_str()).collect()
    }
}

/// Name of the drop-in directory beside the configuration file.
pub const DROP_IN_DIR_NAME: &str = "repositories.d";

/// The drop-in directory of the configuration file at `config`
/// (`/etc/airlock/repositories.d` for the default).
pub fn drop_in_dir(config: &Path) -> PathBuf {
    config
        .parent()
        .unwrap_or(Path::new("."))
        .join(DROP_IN_DIR_NAME)
}

/// The drop-in files in `dir`, sorted; none when it does not exist.
pub fn drop_in_files(dir: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(ConfigError::Unreadable {
                file: dir.to_owned(),
                source,
            });
        }
    };
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| ConfigError::Unreadable {
            file: dir.to_owned(),
            source,
        })?;
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "toml") {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// Reads one drop-in: a file holding exactly one `[[repository]]` table
/// named like the file.
pub fn read_drop_in(file: &Path) -> Result<Repository, ConfigError> {
    let text = read_config_file(file)?;
    let parsed = Config::parse(&text, file)?;
    let refuse = |expected: String| ConfigError::Unacceptable {
        file: file.to_owned(),
        expected,
    };
    let only_repositories = toml::from_str::<toml::Table>(&text)
        .map(|t| t.keys().all(|k| k == "repository"))
        .unwrap_or(false);
    if !only_repositories || parsed.repositories.len() != 1 {
        return Err(refuse(
            "exactly one [[repository]] table and nothing else".to_owned(),
        ));
    }
    let mut repo = parsed
        .repositories
        .into_iter()
        .next()
        .expect("one repository");
    let stem = file.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    if repo.name != stem {
        return Err(refuse(format!(
            "a repository named like its file, {stem:?}, found {:?}",
            repo.name
        )));
    }
    repo.drop_in = Some(file.to_owned());
    Ok(repo)
}

/// The text of the drop-in registering `repo` (what `airlockctl repo add` writes).
pub fn drop_in_text(repo: &Repository) -> String {
    let mut out = String::from(
        "# Written by `airlockctl repo add`; `airlockctl repo remove` deletes it.\n\
         # The supervisor and the worker read it at start and on `systemctl reload`.\n",
    );
    out.push_str(&repository_text(repo));
    out
}

/// `repo` as one `[[repository]]` table (and its `[repository.environment]`).
pub fn repository_text(repo: &Repository) -> String {
    let mut out = String::from("[[repository]]\n");
    let quote = |s: &str| toml::Value::String(s.to_owned()).to_string();
    out.push_str(&format!("name = {}\n", quote(&repo.name)));
    out.push_str(&format!(
        "path = {}\n",
        quote(&repo.path.display().to_string())
    ));
    if let Some(d) = &repo.description {
        out.push_str(&format!("description = {}\n", quote(d)));
    }
    // Nested under the repository: [repository.environment] (and
    // .upstream, .signing) after [[repository]] belongs to that table.
    #[derive(Serialize)]
    struct Nest<'a> {
        repository: Wrap<'a>,
    }
    #[derive(Serialize)]
    struct Wrap<'a> {
        #[serde(skip_serializing_if = "Option::is_none")]
        upstream: Option<&'a Upstream>,
        #[serde(skip_serializing_if = "Option::is_none")]
        signing: Option<&'a Signing>,
        #[serde(skip_serializing_if = "Option::is_none")]
        environment: Option<&'a Environment>,
    }
    if repo.environment.is_some() || repo.upstream.is_some() || repo.signing.is_some() {
        if let Ok(text) = toml::to_string(&Nest {
            repository: Wrap {
                upstream: repo.upstream.as_ref(),
                signing: repo.signing.as_ref(),
                environment: repo.environment.as_ref(),
            },
        }) {
            out.push('\n');
            out.push_str(&text);
        }
    }
    out
}

/// Whether a configuration file owned by `file_uid` may be read by a
/// process whose effective uid is `euid`: a root-owned file always; a file
/// of the reader's own uid only when the reader is not root (airlock-local
/// run by an unprivileged developer writes its configuration as that user,
/// and everything it starts runs as that user too). Any other owner could
/// rewrite what a service trusts.
pub fn acceptable_owner(file_uid: u32, euid: u32) -> bool {
    file_uid == 0 || (euid != 0 && file_uid == euid)
}

/// Refuses a configuration file (`main`) or drop-in (`drop_ins`) whose
/// canonical path lies inside a registered repository: whoever may write
/// the repository (a planner's change, once committed) could rewrite the
/// configuration that governs it. Repository paths are canonicalized
/// where they exist, compared as written where they do not.
pub fn check_outside_repositories(
    main: &Path,
    drop_ins: &[PathBuf],
    repositories: &[Repository],
) -> Result<(), ConfigError> {
    let roots: Vec<(&Repository, PathBuf)> = repositories
        .iter()
        .map(|r| {
            (
                r,
                std::fs::canonicalize(&r.path).unwrap_or_else(|_| r.path.clone()),
            )
        })
        .collect();
    for file in std::iter::once(main).chain(drop_ins.iter().map(PathBuf::as_path)) {
        let canonical = std::fs::canonicalize(file).map_err(|source| ConfigError::Unreadable {
            file: file.to_owned(),
            source,
        })?;
        if let Some((repo, root)) = roots.iter().find(|(_, root)| canonical.starts_with(root)) {
            return Err(ConfigError::Unacceptable {
                file: file.to_owned(),
                expected: format!(
                    "a configuration file outside every registered repository, found it inside repository {:?} ({}), whose writers could rewrite it; fix: move it out of the repository",
                    repo.name,
                    root.display()
                ),
            });
        }
    }
    Ok(())
}

fn read_config_file(path: &Path) -> Result<String, ConfigError> {
    let unreadable = |source| ConfigError::Unreadable {
        file: path.to_owned(),
        source,
    };
    let refuse = |expected: String| ConfigError::Unacceptable {
        file: path.to_owned(),
        expected,
    };
    let file = std::fs::File::open(path).map_err(unreadable)?;
    let meta = file.metadata().map_err(unreadable)?;
    if !meta.is_file() {
        return Err(refuse("expected a regular file".to_owned()));
    }
    let mode = meta.permissions().mode();
    if mode & 0o022 != 0 {
        return Err(refuse(format!(
            "expected a file neither its group nor other users can write, found mode {:04o}; fix: chmod g-w,o-w {}",
            mode & 0o7777,
            path.display()
        )));
    }
    let euid = nix::unistd::geteuid().as_raw();
    if !acceptable_owner(meta.uid(), euid) {
        let reader = if euid == 0 {
            " (only a reader that is not root also accepts its own uid's)".to_owned()
        } else {
            format!(" or by uid {euid}, the user reading it")
        };
        return Err(refuse(format!(
            "expected a file owned by root{reader}, found owner uid {}; fix: chown root {}",
            meta.uid(),
            path.display()
        )));
    }
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(refuse(format!(
            "expected at most {MAX_CONFIG_BYTES} bytes, found {}",
            meta.len()
        )));
    }
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(unreadable)?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(refuse(format!(
            "expected at most {MAX_CONFIG_BYTES} bytes, found more"
        )));
    }
    String::from_utf8(bytes).map_err(|e| {
        refuse(format!(
            "expected UTF-8 text, found an invalid byte at offset {}",
            e.utf8_error().valid_up_to()
        ))
    })
}

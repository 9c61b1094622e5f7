//! The semantic pass: what the types alone cannot say. Ranges and forms come
//! from [`KEYS`](crate::KEYS); the rules that tie two keys together are
//! written out here, one block each.

use std::collections::HashMap;
use std::path::Path;

use airlock_proto::binding::{is_key, is_repository_name};
use airlock_proto::limits::MAX_CAPABILITY_LEN;
use airlock_proto::path::{check_relative_path, is_credential_path};

use crate::error::ConfigError;
use crate::keys::{self, GIT_WRITING_SUBCOMMANDS, Item, Kind};
use crate::source::Source;
use crate::{Agent, Config, Executor, Limits, Repository, Retry, Spool, Supervisor, Worker};

type Result<T = ()> = std::result::Result<T, ConfigError>;

/// Checks a deserialised configuration: first every key on its own, then
/// the rules between keys, so a value out of its own range is reported as
/// such rather than as a conflict with another key. The first refusal wins.
pub(crate) fn check(config: &Config, src: &Source<'_>) -> Result {
    let check = Check { src };
    check.supervisor(&config.supervisor)?;
    check.worker(&config.worker)?;
    check.spool(&config.spool)?;
    check.executor(&config.executor)?;
    check.retry(&config.retry)?;
    check.repositories(&config.repositories)?;
    check.agents(&config.agents)?;
    check.between_keys(config)
}

/// The rules between keys that [`Config::parse`](crate::Config::parse)
/// enforces, for `docs/configuration.md`. Each has a test in
/// `tests/config.rs`.
pub const RULES: &[&str] = &[
    "`supervisor.sweep_interval_seconds` ≤ `supervisor.lease_seconds`",
    "`worker.renew_interval_seconds` ≤ `supervisor.lease_seconds` / 2",
    "`worker.journal` ≠ `supervisor.database`",
    "`executor.user` ≠ `supervisor.worker_user`",
    "`retry.user` ≠ `supervisor.worker_user` and ≠ `executor.user`",
    "`spool.max_file_bytes` ≥ `executor.limits.max_archive_bytes`",
    "`executor.limits.max_file_bytes` ≤ `executor.limits.max_total_bytes`",
    "repository names are unique, and so are repository paths",
    "agent names are unique, and no two agents name the same `credential_file`",
    "every repository in `agent[].repositories` is registered (in the file or `repositories.d/`) when the configuration is loaded",
];

struct Check<'s, 'a> {
    src: &'s Source<'a>,
}

impl Check<'_, '_> {
    fn supervisor(&self, s: &Supervisor) -> Result {
        self.database("supervisor.database", &s.database)?;
        if let Some(file) = &s.database_ca_file {
            self.path("supervisor.database_ca_file", file)?;
        }
        self.int("supervisor.lease_seconds", s.lease_seconds)?;
        self.int(
            "supervisor.sweep_interval_seconds",
            s.sweep_interval_seconds,
        )?;
        self.int(
            "supervisor.max_running_per_submitter",
            s.max_running_per_submitter,
        )?;
        self.user("supervisor.worker_user", &s.worker_user)?;
        self.list("supervisor.local_users", &s.local_users)?;
        self.list("supervisor.local_planners", &s.local_planners)?;
        self.int(
            "supervisor.agent_call_timeout_seconds",
            s.agent_call_timeout_seconds,
        )?;
        self.path("supervisor.metrics_directory", &s.metrics_directory)?;
        self.int(
            "supervisor.metrics_interval_seconds",
            s.metrics_interval_seconds,
        )?;
        self.text("supervisor.bus_address", &s.bus_address)
    }

    /// A single line of text within its key's bound.
    fn text(&self, key: &str, text: &str) -> Result {
        let Some(Kind::Text { max_chars }) = kind(key) else {
            return Err(self.undeclared(key, "text"));
        };
        if text.chars().count() > max_chars || text.chars().any(char::is_control) {
            return Err(self
                .src
                .refuse(key, describe(key), format_args!("{text:?}")));
        }
        Ok(())
    }

    fn worker(&self, w: &Worker) -> Result {
        self.path("worker.journal", &w.journal)?;
        self.path("worker.workspace_root", &w.workspace_root)?;
        self.int("worker.parallel_tasks", w.parallel_tasks)?;
        self.list("worker.capabilities", &w.capabilities)?;
        self.int("worker.renew_interval_seconds", w.renew_interval_seconds)?;
        self.path("worker.repository_root", &w.repository_root)?;
        self.name("worker.readers_group", &w.readers_group)
    }

    fn spool(&self, sp: &Spool) -> Result {
        self.path("spool.root", &sp.root)?;
        self.int("spool.max_file_bytes", sp.max_file_bytes)?;
        self.name("spool.exchange_group", &sp.exchange_group)
    }

    fn executor(&self, e: &Executor) -> Result {
        self.user("executor.user", &e.user)?;
        let programs: Vec<String> = e
            .programs
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        self.list("executor.programs", &programs)?;
        self.list("executor.python_modules", &e.python_modules)?;
        self.list(
            "executor.git_read_only_subcommands",
            &e.git_read_only_subcommands,
        )?;
        self.list("executor.allow_credential_paths", &e.allow_credential_paths)?;
        self.int("executor.landlock_min_abi", e.landlock_min_abi)?;
        self.int("executor.parallel_jobs", e.parallel_jobs)?;
        self.int("executor.tree_cache_entries", e.tree_cache_entries)?;
        self.int("executor.tree_cache_mib", e.tree_cache_mib)?;
        self.int("executor.layer_cache_mib", e.layer_cache_mib)?;
        self.int("executor.min_free_disk_mib", e.min_free_disk_mib)?;
        self.path("executor.egress_socket", &e.egress_socket)?;
        self.limits(&e.limits)
    }

    fn limits(&self, l: &Limits) -> Result {
        self.int("executor.limits.processes", l.processes)?;
        self.int("executor.limits.address_space_mib", l.address_space_mib)?;
        self.int("executor.limits.file_size_mib", l.file_size_mib)?;
        self.int("executor.limits.open_files", l.open_files)?;
        self.int("executor.limits.cpu_seconds", l.cpu_seconds)?;
        self.int("executor.limits.max_archive_bytes", l.max_archive_bytes)?;
        self.int("executor.limits.max_archive_entries", l.max_archive_entries)?;
        self.int("executor.limits.max_file_bytes", l.max_file_bytes)?;
        self.int("executor.limits.max_total_bytes", l.max_total_bytes)?;
        self.int("executor.limits.max_expansion_ratio", l.max_expansion_ratio)?;
        self.int("executor.limits.output_tail_bytes", l.output_tail_bytes)?;
        self.int("executor.limits.job_memory_mib", l.job_memory_mib)?;
        self.int("executor.limits.job_processes", l.job_processes)?;
        self.int("executor.limits.job_cpu_max", l.job_cpu_max)?;
        self.int("executor.limits.job_disk_mib", l.job_disk_mib)
    }

    /// The rules that tie one key to another ([`RULES`]), each refused at
    /// the key an admin would change.
    fn between_keys(&self, c: &Config) -> Result {
        let (s, w) = (&c.supervisor, &c.worker);
        let limits = &c.executor.limits;
        if s.sweep_interval_seconds > s.lease_seconds {
            return Err(self.src.refuse(
                "supervisor.sweep_interval_seconds",
                format_args!(
                    "at most supervisor.lease_seconds ({}), so expired leases are noticed within a lease",
                    s.lease_seconds
                ),
                s.sweep_interval_seconds,
            ));
        }
        let half_lease = s.lease_seconds / 2;
        if w.renew_interval_seconds > half_lease {
            return Err(self.src.refuse(
                "worker.renew_interval_seconds",
                format_args!(
                    "at most half of supervisor.lease_seconds ({} / 2 = {half_lease})",
                    s.lease_seconds
                ),
                w.renew_interval_seconds,
            ));
        }
        if w.journal == s.database {
            return Err(self.src.refuse(
                "worker.journal",
                "a path other than supervisor.database",
                format_args!("{:?}", w.journal.to_string_lossy()),
            ));
        }
        if c.executor.user == s.worker_user {
            return Err(self.src.refuse(
                "executor.user",
                "a user other than supervisor.worker_user: the executor must not hold the worker's credentials",
                format_args!("{:?}", c.executor.user),
            ));
        }
        if c.retry.user == s.worker_user || c.retry.user == c.executor.user {
            return Err(self.src.refuse(
                "retry.user",
                "a user other than supervisor.worker_user and executor.user: each trust domain has its own uid",
                format_args!("{:?}", c.retry.user),
            ));
        }
        if c.spool.max_file_bytes < limits.max_archive_bytes {
            return Err(self.src.refuse(
                "spool.max_file_bytes",
                format_args!(
                    "at least executor.limits.max_archive_bytes ({}), since source archives cross the spool",
                    limits.max_archive_bytes
                ),
                c.spool.max_file_bytes,
            ));
        }
        if limits.max_file_bytes > limits.max_total_bytes {
            return Err(self.src.refuse(
                "executor.limits.max_file_bytes",
                format_args!(
                    "at most executor.limits.max_total_bytes ({})",
                    limits.max_total_bytes
                ),
                limits.max_file_bytes,
            ));
        }
        Ok(())
    }

    fn retry(&self, r: &Retry) -> Result {
        self.user("retry.user", &r.user)?;
        let key = "retry.listen";
        if !r.listen.ip().is_loopback() || r.listen.port() == 0 {
            return Err(self
                .src
                .refuse(key, describe(key), format_args!("\"{}\"", r.listen)));
        }
        self.path("retry.token_file", &r.token_file)?;
        if let Some(id) = &r.authorization_id {
            let key = "retry.authorization_id";
            if !is_key(id) {
                return Err(self.src.refuse(key, describe(key), format_args!("{id:?}")));
            }
        }
        Ok(())
    }

    fn repositories(&self, repos: &[Repository]) -> Result {
        let mut names: HashMap<&str, usize> = HashMap::new();
        let mut paths: HashMap<&Path, usize> = HashMap::new();
        for (i, repo) in repos.iter().enumerate() {
            let key = format!("repository[{i}].name");
            if !is_repository_name(&repo.name) {
                let expected = describe("repository[].name");
                return Err(self
                    .src
                    .refuse(key, expected, format_args!("{:?}", repo.name)));
            }
            if let Some(first) = names.insert(&repo.name, i) {
                return Err(self.src.refuse(
                    key,
                    format_args!(
                        "a name no other repository has (repository[{first}] is already called so)"
                    ),
                    format_args!("{:?}", repo.name),
                ));
            }
            let key = format!("repository[{i}].path");
            self.path(&key, &repo.path)?;
            if let Some(first) = paths.insert(&repo.path, i) {
                return Err(self.src.refuse(
                    key,
                    format_args!(
                        "a path no other repository has (repository[{first}] already has it)"
                    ),
                    repo.path.display(),
                ));
            }
            if let Some(text) = &repo.description {
                let key = format!("repository[{i}].description");
                let Some(Kind::Text { max_chars }) = kind("repository[].description") else {
                    return Err(self.undeclared("repository[].description", "text"));
                };
                if text.chars().count() > max_chars || text.chars().any(char::is_control) {
                    let expected = describe("repository[].description");
                    return Err(self.src.refuse(key, expected, format_args!("{text:?}")));
                }
            }
            if let Some(up) = &repo.upstream {
                self.upstream(i, up)?;
            }
            if let Some(signing) = &repo.signing {
                let key = format!("repository[{i}].signing.principal");
                let p = &signing.principal;
                if p.is_empty()
                    || p.chars().count() > 200
                    || p.chars()
                        .any(|c| c.is_control() || c.is_whitespace() || c == ',')
                {
                    return Err(self.src.refuse(
                        key,
                        format_args!(
                            "{}, without spaces or commas (such as agent@example.org)",
                            describe("repository[].signing.principal")
                        ),
                        format_args!("{p:?}"),
                    ));
                }
            }
            if let Some(env) = &repo.environment {
                env.check().map_err(|e| {
                    let key =
                        e.key
                            .replacen("environment", &format!("repository[{i}].environment"), 1);
                    self.src
                        .refuse_with(key, format!("{} [{}]", e.problem, e.code.as_str()))
                })?;
            }
        }
        Ok(())
    }

    fn upstream(&self, i: usize, up: &crate::Upstream) -> Result {
        let at = |k: &str| format!("repository[{i}].upstream.{k}");
        let scheme = airlock_proto::upstream::Scheme::of(&up.url).map_err(|e| {
            self.src.refuse(
                at("url"),
                describe("repository[].upstream.url"),
                // The detail shows the URL without its password.
                format_args!("{}", e.detail.unwrap_or_default()),
            )
        })?;
        self.list_at(
            &at("push_options"),
            "repository[].upstream.push_options",
            &up.push_options,
        )?;
        self.list_at(
            &at("host_keys"),
            "repository[].upstream.host_keys",
            &up.host_keys,
        )?;
        if scheme == airlock_proto::upstream::Scheme::Ssh && up.host_keys.is_empty() {
            return Err(self.src.refuse(
                at("host_keys"),
                "the remote's host keys (an ssh:// upstream is reached only with pinned keys; `ssh-keyscan HOST` prints them, check them out of band)",
                "[]",
            ));
        }
        if up.user.is_empty()
            || up.user.contains(':')
            || up.user.chars().count() > 64
            || up.user.chars().any(char::is_control)
        {
            return Err(self.src.refuse(
                at("user"),
                format_args!(
                    "{}, not empty and without ':'",
                    describe("repository[].upstream.user")
                ),
                format_args!("{:?}", up.user),
            ));
        }
        self.int_at(
            &at("sync_interval_seconds"),
            "repository[].upstream.sync_interval_seconds",
            up.sync_interval_seconds,
        )?;
        self.int_at(
            &at("timeout_seconds"),
            "repository[].upstream.timeout_seconds",
            up.timeout_seconds,
        )?;
        self.int_at(
            &at("max_fetch_mib"),
            "repository[].upstream.max_fetch_mib",
            up.max_fetch_mib,
        )
    }

    fn agents(&self, agents: &[Agent]) -> Result {
        let mut names: HashMap<&str, usize> = HashMap::new();
        let mut credentials: HashMap<&Path, usize> = HashMap::new();
        for (i, agent) in agents.iter().enumerate() {
            let key = format!("agent[{i}].name");
            if !is_agent_name(&agent.name) {
                let expected = describe("agent[].name");
                return Err(self
                    .src
                    .refuse(key, expected, format_args!("{:?}", agent.name)));
            }
            if let Some(first) = names.insert(&agent.name, i) {
                return Err(self.src.refuse(
                    key,
                    format_args!("a name no other agent has (agent[{first}] is already called so)"),
                    format_args!("{:?}", agent.name),
                ));
            }
            self.argv(&format!("agent[{i}].command"), &agent.command)?;
            self.list_at(
                &format!("agent[{i}].repositories"),
                "agent[].repositories",
                &agent.repositories,
            )?;
            if agent.repositories.is_empty() {
                return Err(self.src.refuse(
                    format!("agent[{i}].repositories"),
                    "at least one repository name",
                    "[]",
                ));
            }
            self.list_at(
                &format!("agent[{i}].environment"),
                "agent[].environment",
                &agent.environment,
            )?;
            if let Some(file) = &agent.credential_file {
                let key = format!("agent[{i}].credential_file");
                self.path(&key, file)?;
                if let Some(first) = credentials.insert(file, i) {
                    return Err(self.src.refuse(
                        key,
                        format_args!(
                            "a file no other agent names (agent[{first}] already does): a credential is handed to one agent only"
                        ),
                        file.display(),
                    ));
                }
            }
            self.int_at(
                &format!("agent[{i}].memory_max_mib"),
                "agent[].memory_max_mib",
                agent.memory_max_mib,
            )?;
            self.int_at(
                &format!("agent[{i}].tasks_max"),
                "agent[].tasks_max",
                agent.tasks_max,
            )?;
            self.int_at(
                &format!("agent[{i}].max_running"),
                "agent[].max_running",
                agent.max_running,
            )?;
            self.int_at(
                &format!("agent[{i}].tasks_per_hour"),
                "agent[].tasks_per_hour",
                agent.tasks_per_hour,
            )?;
            self.int_at(
                &format!("agent[{i}].cpu_seconds_per_day"),
                "agent[].cpu_seconds_per_day",
                agent.cpu_seconds_per_day,
            )?;
            if let Some(text) = &agent.description {
                let key = format!("agent[{i}].description");
                let Some(Kind::Text { max_chars }) = kind("agent[].description") else {
                    return Err(self.undeclared("agent[].description", "text"));
                };
                if text.chars().count() > max_chars || text.chars().any(char::is_control) {
                    let expected = describe("agent[].description");
                    return Err(self.src.refuse(key, expected, format_args!("{text:?}")));
                }
            }
        }
        Ok(())
    }

    fn argv(&self, key: &str, argv: &[String]) -> Result {
        let Some(Kind::Argv { max }) = kind("agent[].command") else {
            return Err(self.undeclared("agent[].command", "a command line"));
        };
        let expected = describe("agent[].command");
        if argv.is_empty() || argv.len() > max {
            return Err(self.src.refuse(
                key,
                expected,
                format_args!("a list of {} elements", argv.len()),
            ));
        }
        for (j, arg) in argv.iter().enumerate() {
            let bad = arg.len() > keys::MAX_ARGUMENT_BYTES
                || arg.chars().any(char::is_control)
                || (j == 0 && !is_clean_absolute(Path::new(arg)));
            if bad {
                return Err(self.src.refuse(
                    format!("{key}[{j}]"),
                    expected,
                    format_args!("{arg:?}"),
                ));
            }
        }
        Ok(())
    }

    /// A key this pass checks but [`KEYS`](crate::KEYS) does not declare as
    /// such: a bug in this crate, refused rather than guessed at.
    fn undeclared(&self, key: &str, what: &str) -> ConfigError {
        self.src.refuse_with(
            key,
            format!("airlock-config does not declare this key as {what} (a bug in airlock)"),
        )
    }

    // ---- one check per Kind ----------------------------------------------

    fn int(&self, key: &str, value: impl Into<u64>) -> Result {
        self.int_at(key, key, value)
    }

    /// An integer at `key` whose spec is `spec` (`agent[].tasks_max` for `agent[2].tasks_max`).
    fn int_at(&self, key: &str, spec: &str, value: impl Into<u64>) -> Result {
        let value = value.into();
        let Some(Kind::Integer { min, max }) = kind(spec) else {
            return Err(self.undeclared(spec, "an integer"));
        };
        if (min..=max).contains(&value) {
            Ok(())
        } else {
            Err(self.src.refuse(key, describe(spec), value))
        }
    }

    fn path(&self, key: &str, path: &Path) -> Result {
        if is_clean_absolute(path) {
            Ok(())
        } else {
            Err(self.src.refuse(
                key,
                Item::Path.describe(),
                format_args!("{:?}", path.to_string_lossy()),
            ))
        }
    }

    fn database(&self, key: &str, path: &Path) -> Result {
        let text = path.to_string_lossy();
        let ok = match text
            .strip_prefix("postgresql://")
            .or_else(|| text.strip_prefix("postgres://"))
        {
            // A URL: no password in the user part or the query; the full
            // parse is the supervisor's (airlock_taskdb::Location).
            Some(rest) => {
                let authority = rest.split(['/', '?']).next().unwrap_or("");
                let userinfo = authority.rsplit_once('@').map_or("", |(u, _)| u);
                !userinfo.contains(':') && !rest.contains("password=")
            }
            None => is_clean_absolute(path),
        };
        if ok {
            Ok(())
        } else if text.contains("://") {
            // Never echo a URL that may carry a password.
            Err(self.src.refuse(
                key,
                Kind::Database.describe(),
                "a URL with a password (not shown)",
            ))
        } else {
            Err(self
                .src
                .refuse(key, Kind::Database.describe(), format_args!("{text:?}")))
        }
    }

    fn user(&self, key: &str, name: &str) -> Result {
        if is_unix_name(name) && name != "root" {
            Ok(())
        } else {
            Err(self
                .src
                .refuse(key, describe(key), format_args!("{name:?}")))
        }
    }

    fn name(&self, key: &str, name: &str) -> Result {
        if is_unix_name(name) {
            Ok(())
        } else {
            Err(self
                .src
                .refuse(key, describe(key), format_args!("{name:?}")))
        }
    }

    fn list(&self, key: &str, values: &[String]) -> Result {
        self.list_at(key, key, values)
    }

    /// A list at `key` whose spec is `spec`.
    fn list_at(&self, key: &str, spec: &str, values: &[String]) -> Result {
        let Some(Kind::List { item, max }) = kind(spec) else {
            return Err(self.undeclared(spec, "a list"));
        };
        if values.len() > max {
            return Err(self.src.refuse(
                key,
                describe(spec),
                format_args!("a list of {} elements", values.len()),
            ));
        }
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for (i, value) in values.iter().enumerate() {
            let element = format!("{key}[{i}]");
            if !item_ok(item, value) {
                return Err(self
                    .src
                    .refuse(element, item.describe(), format_args!("{value:?}")));
            }
            if let Some(first) = seen.insert(value, i) {
                return Err(self.src.refuse(
                    element,
                    format_args!("a value not already listed (it is {key}[{first}])"),
                    format_args!("{value:?}"),
                ));
            }
        }
        Ok(())
    }
}

fn kind(key: &str) -> Option<Kind> {
    keys::spec(key).map(|spec| spec.kind)
}

fn describe(key: &str) -> String {
    kind(key).map_or_else(|| "a valid value".to_owned(), |k| k.describe())
}

fn item_ok(item: Item, value: &str) -> bool {
    match item {
        Item::Path => is_clean_absolute(Path::new(value)),
        Item::PythonModule => {
            value.len() <= 128
                && value.split('.').all(|part| {
                    let mut chars = part.chars();
                    chars
                        .next()
                        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
                })
        }
        Item::GitSubcommand => {
            let mut chars = value.chars();
            value.len() <= 64
                && chars.next().is_some_and(|c| c.is_ascii_lowercase())
                && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !GIT_WRITING_SUBCOMMANDS.contains(&value)
        }
        Item::Capability => {
            let mut chars = value.chars();
            value.len() <= MAX_CAPABILITY_LEN
                && chars
                    .next()
                    .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
                && chars.all(|c| {
                    c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-')
                })
        }
        Item::CredentialPath => check_relative_path(value).is_ok() && is_credential_path(value),
        Item::User => is_unix_name(value),
        Item::HostKey => {
            let fields: Vec<&str> = value.split(' ').collect();
            fields.len() >= 3
                && !fields[0].is_empty()
                && !fields[0].starts_with('@')
                && fields[1].starts_with(|c: char| c.is_ascii_lowercase())
                && fields[2].len() >= 16
                && fields[2]
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='))
                && !value.chars().any(char::is_control)
        }
        Item::PushOption => {
            !value.is_empty()
                && value.chars().count() <= 200
                && !value.chars().any(char::is_control)
        }
        Item::RepositoryName => is_repository_name(value),
        Item::EnvironmentName => {
            let mut chars = value.chars();
            value.len() <= 64
                && chars
                    .next()
                    .is_some_and(|c| c.is_ascii_uppercase() || c == '_')
                && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
                && !value.starts_with("LD_")
                && !keys::RESERVED_AGENT_ENVIRONMENT.contains(&value)
        }
    }
}

/// An agent name: `[a-z0-9][a-z0-9_-]{0,47}`, safe as a systemd unit
/// instance, a file name and a log field as it is.
pub fn is_agent_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 48
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '-'))
}

/// `/a/b`: absolute, no empty, `.` or `..` component, no trailing `/`, no
/// control characters, and not `/` itself.
fn is_clean_absolute(path: &Path) -> bool {
    let Some(text) = path.to_str() else {
        return false;
    };
    let Some(rest) = text.strip_prefix('/') else {
        return false;
    };
    text.len() <= airlock_proto::limits::MAX_PATH_LEN
        && !text.chars().any(char::is_control)
        && rest
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
}

/// A unix user or group name: `[a-z_][a-z0-9_-]{0,31}`.
fn is_unix_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 32
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_absolute_paths() {
        for good in ["/a", "/var/lib/airlock/tasks.sqlite3", "/a/.hidden/b"] {
            assert!(is_clean_absolute(Path::new(good)), "{good}");
        }
        for bad in [
            "", "/", "a/b", "./a", "/a/", "/a//b", "/a/./b", "/a/../b", "/a/..", "/a\n",
        ] {
            assert!(!is_clean_absolute(Path::new(bad)), "{bad:?}");
        }
    }

    #[test]
    fn unix_names() {
        for good in ["airlock-exec", "_svc", "a", "a1_b-c"] {
            assert!(is_unix_name(good), "{good}");
        }
        for bad in ["", "Airlock", "1abc", "-x", "a b", "a.b", &"a".repeat(33)] {
            assert!(!is_unix_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn list_items() {
        assert!(item_ok(Item::PythonModule, "xml.etree"));
        assert!(!item_ok(Item::PythonModule, "xml..etree"));
        assert!(!item_ok(Item::PythonModule, "1x"));
        assert!(!item_ok(Item::PythonModule, "os; import x"));
        assert!(item_ok(Item::GitSubcommand, "ls-files"));
        assert!(!item_ok(Item::GitSubcommand, "push"));
        assert!(!item_ok(Item::GitSubcommand, "--exec-path"));
        assert!(item_ok(Item::Capability, "git.read"));
        assert!(!item_ok(Item::Capability, "Git.Read"));
        assert!(item_ok(Item::CredentialPath, ".env"));
        assert!(item_ok(Item::CredentialPath, "deploy/server.pem"));
        assert!(!item_ok(Item::CredentialPath, "src/main.rs"));
        assert!(!item_ok(Item::CredentialPath, "../.env"));
    }
}

//! airlock-config against real files and every key of the table.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use airlock_config::{Authorizer, Config, ConfigError, KEYS, Kind, Location};
use airlock_proto::Code;

const ORIGIN: &str = "/etc/airlock/airlock.toml";

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new(ORIGIN))
}

/// Parses `text`, expects a refusal about `key`, and checks that the message
/// names the file, the key and what was expected; returns the message.
#[track_caller]
fn refused(text: &str, key: &str) -> String {
    let err = match parse(text) {
        Ok(_) => panic!("accepted, expected a refusal of {key}:\n{text}"),
        Err(err) => err,
    };
    let message = err.to_string();
    assert_eq!(err.key(), Some(key), "{message}\n---\n{text}");
    assert_eq!(err.code(), Code::CONFIG_INVALID);
    assert!(message.starts_with(ORIGIN), "{message}");
    assert!(message.contains(&format!(": {key}: ")), "{message}");
    assert!(message.contains("expected"), "no expectation in: {message}");
    message
}

fn example_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/airlock.toml")
}

/// A document that sets one (normalised) key to a TOML value; keys inside
/// `[[repository]]` get a table whose other required keys are valid.
fn doc_with(key: &str, value: &str) -> String {
    if let Some(field) = key.strip_prefix("agent[].") {
        let mut fields = vec![
            ("name", "\"a\"".to_owned()),
            ("command", "[\"/usr/bin/planner\"]".to_owned()),
            ("repositories", "[\"r\"]".to_owned()),
        ];
        fields.retain(|(name, _)| *name != field);
        fields.push((field, value.to_owned()));
        let body: Vec<String> = fields.iter().map(|(k, v)| format!("{k} = {v}")).collect();
        return format!("[[agent]]\n{}\n", body.join("\n"));
    }
    for (table, required) in [
        ("upstream", ("url", "\"/srv/git/upstream.git\"")),
        ("signing", ("principal", "\"agent@example.org\"")),
    ] {
        if let Some(field) = key
            .strip_prefix("repository[].")
            .and_then(|k| k.strip_prefix(table))
            .and_then(|k| k.strip_prefix('.'))
        {
            let mut fields = vec![(required.0, required.1.to_owned())];
            fields.retain(|(name, _)| *name != field);
            fields.push((field, value.to_owned()));
            let body: Vec<String> = fields.iter().map(|(k, v)| format!("{k} = {v}")).collect();
            return format!(
                "[[repository]]\nname = \"r\"\npath = \"/srv/git/r.git\"\n[repository.{table}]\n{}\n",
                body.join("\n")
            );
        }
    }
    if let Some(field) = key.strip_prefix("repository[].") {
        let mut fields = vec![
            ("name", "\"r\"".to_owned()),
            ("path", "\"/srv/git/r.git\"".to_owned()),
        ];
        fields.retain(|(name, _)| *name != field);
        fields.push((field, value.to_owned()));
        let body: Vec<String> = fields.iter().map(|(k, v)| format!("{k} = {v}")).collect();
        return format!("[[repository]]\n{}\n", body.join("\n"));
    }
    match key.rsplit_once('.') {
        Some((table, leaf)) => format!("[{table}]\n{leaf} = {value}\n"),
        None => format!("{key} = {value}\n"),
    }
}

/// The key as it is named in an error about `doc_with(key, _)`.
fn concrete(key: &str) -> String {
    key.replace("[]", "[0]")
}

fn leaves() -> impl Iterator<Item = &'static airlock_config::KeySpec> {
    KEYS.iter()
        .filter(|s| !matches!(s.kind, Kind::Table | Kind::Tables))
}

// ---- the example file and the defaults ---------------------------------------

#[test]
fn example_file_parses_and_equals_the_defaults_it_claims() {
    let path = example_path();
    let config = Config::load(&path).expect("packaging/airlock.toml must parse");
    assert_eq!(config.repository_names(), ["demo"]);
    let demo = config.repository("demo").expect("demo repository");
    assert_eq!(demo.path, Path::new("/srv/airlock/demo.git"));
    let mut without_repositories = config.clone();
    without_repositories.repositories.clear();
    assert_eq!(without_repositories, Config::embedded_default());
}

#[test]
fn example_file_shows_every_key() {
    let text = std::fs::read_to_string(example_path()).expect("example readable");
    for spec in leaves() {
        let leaf = spec.key.rsplit('.').next().unwrap_or(spec.key);
        let shown = text.lines().any(|line| {
            let line = line.trim_start_matches(['#', ' ']);
            line.starts_with(&format!("{leaf} ="))
        });
        assert!(shown, "packaging/airlock.toml does not show {}", spec.key);
    }
}

#[test]
fn table_defaults_are_the_embedded_defaults() {
    let value = toml::Value::try_from(Config::embedded_default()).expect("serialise defaults");
    let mut checked = 0;
    for spec in leaves() {
        if spec.key.starts_with("repository") || spec.key.starts_with("agent") {
            continue;
        }
        let mut node = &value;
        for part in spec.key.split('.') {
            node = match node.get(part) {
                Some(next) => next,
                None => {
                    assert_eq!(spec.default, None, "{} missing from the defaults", spec.key);
                    node
                }
            };
        }
        if let Some(default) = spec.default {
            assert_eq!(node.to_string(), default, "default of {}", spec.key);
            checked += 1;
        }
    }
    let in_tables = |s: &&airlock_config::KeySpec| s.key.contains("[]");
    assert_eq!(
        checked,
        leaves()
            .filter(|s| s.default.is_some() && !in_tables(s))
            .count()
    );
    // and nothing in the defaults escapes the table
    fn walk(prefix: &str, v: &toml::Value, out: &mut Vec<String>) {
        if let toml::Value::Table(t) = v {
            for (k, v) in t {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                out.push(key.clone());
                walk(&key, v, out);
            }
        }
    }
    let mut keys = Vec::new();
    walk("", &value, &mut keys);
    for key in keys {
        assert!(KEYS.iter().any(|s| s.key == key), "{key} is not in KEYS");
    }
}

#[test]
fn embedded_default_round_trips_through_the_parser() {
    let text = toml::to_string(&Config::embedded_default()).expect("serialise");
    assert_eq!(
        parse(&text).expect("defaults valid"),
        Config::embedded_default()
    );
    assert_eq!(parse("").expect("empty file"), Config::embedded_default());
    let d = Config::embedded_default();
    assert!(d.repositories.is_empty());
    assert_eq!(d.supervisor.authorizer, Authorizer::Polkit);
    assert!(!d.supervisor.auto_accept);
    assert!(!d.executor.allow_degraded_landlock);
    assert!(
        d.executor
            .programs
            .iter()
            .all(|p| !p.ends_with("sh") && !p.ends_with("bash")),
        "no shell by default"
    );
}

#[test]
fn the_task_store_may_be_a_postgresql_url_without_a_password() {
    for url in [
        "postgresql://airlock@db.example/airlock",
        "postgresql://airlock@%2Frun%2Fpostgresql/airlock",
        "postgres://airlock@10.0.0.5:5433/airlock?connect_timeout=5",
    ] {
        let c = parse(&doc_with("supervisor.database", &format!("\"{url}\""))).expect(url);
        assert_eq!(c.supervisor.database.to_str(), Some(url));
    }
}

// ---- every key: accepted at its default, refused by name when wrong ---------

#[test]
fn every_key_accepts_its_default_written_out() {
    for spec in leaves() {
        let value = match (spec.default, spec.kind) {
            (Some(d), _) => d.to_owned(),
            (None, Kind::RepositoryName) => "\"repo.name_1-x\"".to_owned(),
            (None, Kind::Path) => "\"/srv/git/x.git\"".to_owned(),
            (None, Kind::AuthorizationId) => "\"owner-2026-example\"".to_owned(),
            (None, _) if spec.key == "repository[].signing.principal" => {
                "\"agent@example.org\"".to_owned()
            }
            (None, Kind::Text { .. }) => "\"Ünïcode text is fine\"".to_owned(),
            (None, Kind::AgentName) => "\"planner-1_x\"".to_owned(),
            (None, Kind::Argv { .. }) => "[\"/usr/bin/python3\", \"-m\", \"-m\"]".to_owned(),
            (None, Kind::List { .. }) => "[\"repo.name_1-x\", \"other\"]".to_owned(),
            (None, Kind::UpstreamUrl) => "\"https://forge.example:8443/team/r.git\"".to_owned(),
            (None, other) => panic!("no sample for {} ({other:?})", spec.key),
        };
        let text = doc_with(spec.key, &value);
        if let Err(e) = parse(&text) {
            panic!("{} = {value} refused: {e}", spec.key);
        }
    }
}

/// Values of the wrong type or outside the key's form, per kind.
fn wrong_values(kind: Kind) -> Vec<String> {
    match kind {
        Kind::Integer { min, max } => {
            let mut v = vec!["\"12\"".to_owned(), "1.5".to_owned(), "true".to_owned()];
            v.push((max + 1).to_string());
            if min > 0 {
                v.push((min - 1).to_string());
            }
            v.push("-3".to_owned());
            v
        }
        Kind::Bool => vec!["\"false\"".into(), "0".into()],
        Kind::UpstreamUrl => vec![
            "\"git@host:repo.git\"".into(),
            "\"http://host/repo\"".into(),
            "\"ext::sh -c x\"".into(),
            "\"relative/repo\"".into(),
            "\"https://user:token@host/repo\"".into(),
            "7".into(),
        ],
        Kind::Path => vec![
            "\"relative/path\"".into(),
            "\"/a/../b\"".into(),
            "\"/a//b\"".into(),
            "\"/a/\"".into(),
            "\"/\"".into(),
            "\"\"".into(),
            "7".into(),
        ],
        Kind::Database => vec![
            "\"relative/tasks.sqlite3\"".into(),
            "\"/a/../b\"".into(),
            "\"\"".into(),
            "\"postgresql://airlock:secret@db.example/airlock\"".into(),
            "\"postgresql://airlock@db.example/airlock?password=secret\"".into(),
            "7".into(),
        ],
        Kind::User => vec![
            "\"root\"".into(),
            "\"Bad Name\"".into(),
            "\"\"".into(),
            "5".into(),
        ],
        Kind::Group => vec!["\"Group\"".into(), "\"1st\"".into(), "[]".into()],
        Kind::Choice(_) => vec!["\"nope\"".into(), "\"Polkit\"".into(), "true".into()],
        Kind::LoopbackAddress => vec![
            "\"0.0.0.0:8941\"".into(),
            "\"192.168.1.2:8941\"".into(),
            "\"127.0.0.1:0\"".into(),
            "\"localhost:8941\"".into(),
            "\"127.0.0.1\"".into(),
            "8941".into(),
        ],
        Kind::RepositoryName => vec![
            "\"-x\"".into(),
            "\"a/b\"".into(),
            "\"\"".into(),
            format!("\"{}\"", "a".repeat(65)),
            "1".into(),
        ],
        Kind::AgentName => vec![
            "\"Planner\"".into(),
            "\"-x\"".into(),
            "\"a.b\"".into(),
            "\"a@b\"".into(),
            "\"\"".into(),
            format!("\"{}\"", "a".repeat(49)),
            "1".into(),
        ],
        Kind::Argv { max } => vec![
            "\"/usr/bin/planner\"".into(),
            "[]".into(),
            "[\"planner\"]".into(),
            "[\"/usr/bin/../bin/planner\"]".into(),
            "[\"/usr/bin/planner\", \"two\\nlines\"]".into(),
            format!("[\"/usr/bin/planner\", \"{}\"]", "x".repeat(4097)),
            format!("[{}]", vec!["\"/x\""; max + 1].join(", ")),
            "[1]".into(),
        ],
        Kind::AuthorizationId => vec!["\"short\"".into(), "\"has space1\"".into(), "1".into()],
        Kind::Text { max_chars } => vec![
            "\"two\\nlines\"".into(),
            format!("\"{}\"", "x".repeat(max_chars + 1)),
            "1".into(),
        ],
        Kind::List { max, .. } => vec![
            "\"not-a-list\"".into(),
            "[1]".into(),
            format!("[{}]", vec!["\"x\""; max + 1].join(", ")),
        ],
        Kind::Table | Kind::Tables => vec!["3".into()],
    }
}

#[test]
fn every_key_refuses_wrong_values_by_name() {
    let mut cases = 0;
    for spec in leaves() {
        for value in wrong_values(spec.kind) {
            let text = doc_with(spec.key, &value);
            let key = concrete(spec.key);
            let err = match parse(&text) {
                Ok(_) => panic!("{} = {value} accepted", spec.key),
                Err(e) => e,
            };
            let message = err.to_string();
            let got = err.key().unwrap_or("");
            assert!(
                got == key || got.starts_with(&format!("{key}[")),
                "{} = {value}: error names {got:?}: {message}",
                spec.key
            );
            assert!(message.starts_with(ORIGIN), "{message}");
            assert!(message.contains("expected"), "{message}");
            if got == key {
                assert!(
                    message.contains(&format!("expected {}", spec.kind.describe())),
                    "{} = {value}: {message}",
                    spec.key
                );
            }
            cases += 1;
        }
    }
    assert!(cases > 100, "only {cases} cases");
}

#[test]
fn integer_errors_say_range_and_value() {
    for spec in leaves() {
        let Kind::Integer { min, max } = spec.kind else {
            continue;
        };
        let text = doc_with(spec.key, &(max + 1).to_string());
        let message = refused(&text, &concrete(spec.key));
        assert!(
            message.ends_with(&format!(
                "expected an integer in {min}..={max}, found {}",
                max + 1
            )),
            "{message}"
        );
        let line = if spec.key.starts_with("agent[]") {
            5
        } else if spec.key.starts_with("repository[].upstream.") {
            6
        } else {
            2
        };
        assert!(
            message.starts_with(&format!("{ORIGIN}:{line}:")),
            "no line:column: {message}"
        );
    }
}

#[test]
fn unknown_keys_are_refused_in_every_table() {
    for spec in KEYS {
        let text = match spec.kind {
            // A table inside an array of tables: written inline there.
            Kind::Table if spec.key.contains("[]") => doc_with(spec.key, "{ bogus_key = 1 }"),
            Kind::Table => format!("[{}]\nbogus_key = 1\n", spec.key),
            Kind::Tables => doc_with(&format!("{}[].bogus_key", spec.key), "1"),
            _ => continue,
        };
        let key = if spec.kind == Kind::Tables {
            format!("{}[0].bogus_key", spec.key)
        } else if spec.key.contains("[]") {
            format!("{}.bogus_key", spec.key.replace("[]", "[0]"))
        } else {
            format!("{}.bogus_key", spec.key)
        };
        let message = refused(&text, &key);
        assert!(
            message.contains("unknown key; expected one of: "),
            "{message}"
        );
    }
    let message = refused("[superviser]\nlease_seconds = 30\n", "superviser");
    assert_eq!(
        message,
        format!(
            "{ORIGIN}:1:2: superviser: unknown key; expected one of: supervisor, worker, spool, executor, retry, repository, agent"
        )
    );
    let message = refused(
        "[executor.limits]\nprocesess = 3\n",
        "executor.limits.procesess",
    );
    assert!(
        message.starts_with(&format!(
            "{ORIGIN}:2:1: executor.limits.procesess: unknown key; expected one of: processes, "
        )),
        "{message}"
    );
    // dotted keys at the top level are the same keys
    refused("executor.limits.bogus = 1\n", "executor.limits.bogus");
}

#[test]
fn a_section_of_the_wrong_shape_is_refused() {
    let message = refused("executor = 3\n", "executor");
    assert!(message.ends_with("expected a table, found 3"), "{message}");
    let message = refused(
        "[repository]\nname = \"r\"\npath = \"/srv/r.git\"\n",
        "repository",
    );
    assert!(
        message.contains("expected an array of tables, written [[name]]"),
        "{message}"
    );
}

// ---- repositories ------------------------------------------------------------

const TWO_REPOS: &str = r#"
[[repository]]
name = "alpha"
path = "/srv/git/alpha.git"

[[repository]]
name = "alpha"
path = "/srv/git/beta.git"
"#;

#[test]
fn duplicate_repository_names_are_refused_where_the_second_one_is() {
    let message = refused(TWO_REPOS, "repository[1].name");
    assert_eq!(
        message,
        format!(
            "{ORIGIN}:7:8: repository[1].name: expected a name no other repository has \
             (repository[0] is already called so), found \"alpha\""
        )
    );
}

#[test]
fn duplicate_repository_paths_are_refused() {
    let text = TWO_REPOS
        .replacen("name = \"alpha\"", "name = \"one\"", 1)
        .replace("beta", "alpha");
    let message = refused(&text, "repository[1].path");
    assert!(
        message.contains("(repository[0] already has it)"),
        "{message}"
    );
}

#[test]
fn repository_paths_must_be_absolute_and_present() {
    let message = refused(
        "[[repository]]\nname = \"r\"\npath = \"srv/git/r.git\"\n",
        "repository[0].path",
    );
    assert_eq!(
        message,
        format!(
            "{ORIGIN}:3:8: repository[0].path: expected an absolute path without '.', '..' or empty components, found \"srv/git/r.git\""
        )
    );
    let message = refused(
        "[[repository]]\nname = \"r\"\n\n[[repository]]\nname = \"s\"\n",
        "repository[0].path",
    );
    assert!(
        message.contains(": repository[0].path: missing; expected an absolute path"),
        "{message}"
    );
    let message = refused(
        "[[repository]]\npath = \"/srv/r.git\"\n",
        "repository[0].name",
    );
    assert!(
        message.contains("missing; expected a repository name"),
        "{message}"
    );
}

#[test]
fn repositories_are_found_by_name() {
    let text = TWO_REPOS.replacen("alpha", "one", 1);
    let config = parse(&text).expect("valid");
    assert_eq!(config.repository_names(), ["one", "alpha"]);
    assert_eq!(
        config.repository("alpha").map(|r| r.path.clone()),
        Some(PathBuf::from("/srv/git/beta.git"))
    );
    assert!(config.repository("ALPHA").is_none());
    assert!(config.repository("missing").is_none());

    // the names are what a binding is checked against
    let binding = |repository: &str| {
        airlock_proto::binding::Binding::from_value(&serde_json::json!({
            "task_id": "task-1", "job_id": "job-1", "repository": repository,
            "base_oid": "a".repeat(40), "expected_branch_oid": "a".repeat(40),
            "target_branch": "agent/task-1", "branch_mode": "CREATE_NEW",
            "generation": 1, "idempotency_key": "key-00000001",
        }))
        .expect("valid binding")
    };
    assert!(
        binding("alpha")
            .check_registered(config.repository_names().into_iter())
            .is_ok()
    );
    let err = binding("gamma")
        .check_registered(config.repository_names().into_iter())
        .expect_err("not registered");
    assert_eq!(err.code, Code::REPOSITORY_NOT_REGISTERED);
}

// ---- rules that tie keys together ----------------------------------------------

#[test]
fn sweep_interval_is_at_most_the_lease() {
    let message = refused(
        "[supervisor]\nlease_seconds = 60\nsweep_interval_seconds = 61\nworker_user = \"w\"\n[worker]\nrenew_interval_seconds = 10\n",
        "supervisor.sweep_interval_seconds",
    );
    assert!(message.ends_with("expected at most supervisor.lease_seconds (60), so expired leases are noticed within a lease, found 61"), "{message}");
}

#[test]
fn renewal_is_at_most_half_the_lease_even_when_defaulted() {
    // renew_interval_seconds is not in the file: its default (60) is too long
    // for a 100-second lease, and the message says the value is the default.
    let message = refused(
        "[supervisor]\nlease_seconds = 100\n",
        "worker.renew_interval_seconds",
    );
    assert_eq!(
        message,
        format!(
            "{ORIGIN}: worker.renew_interval_seconds: expected at most half of supervisor.lease_seconds (100 / 2 = 50), found 60 (the default)"
        )
    );
    parse("[supervisor]\nlease_seconds = 120\n").expect("60 is half of 120");
}

#[test]
fn spool_files_must_fit_a_source_archive() {
    let message = refused(
        "[spool]\nmax_file_bytes = 2097152\n",
        "spool.max_file_bytes",
    );
    assert!(
        message.contains("at least executor.limits.max_archive_bytes (1073741824)"),
        "{message}"
    );
    parse("[spool]\nmax_file_bytes = 2097152\n[executor.limits]\nmax_archive_bytes = 2097152\n")
        .expect("equal is enough");
}

#[test]
fn largest_file_is_at_most_the_total() {
    let message = refused(
        "[executor.limits]\nmax_file_bytes = 1000\nmax_total_bytes = 999\n",
        "executor.limits.max_file_bytes",
    );
    assert!(
        message.contains("at most executor.limits.max_total_bytes (999)"),
        "{message}"
    );
}

#[test]
fn executor_and_worker_are_different_users() {
    let message = refused("[executor]\nuser = \"airlock-worker\"\n", "executor.user");
    assert!(
        message.contains("other than supervisor.worker_user"),
        "{message}"
    );
    let message = refused("[executor]\nuser = \"root\"\n", "executor.user");
    assert!(message.contains("other than root"), "{message}");
}

#[test]
fn retry_runs_as_its_own_user() {
    for other in ["airlock-worker", "airlock-exec"] {
        let message = refused(&format!("[retry]\nuser = \"{other}\"\n"), "retry.user");
        assert!(
            message.contains("each trust domain has its own uid"),
            "{message}"
        );
    }
    let message = refused("[retry]\nuser = \"root\"\n", "retry.user");
    assert!(message.contains("other than root"), "{message}");
}

#[test]
fn journal_and_task_store_are_different_files() {
    refused(
        "[worker]\njournal = \"/var/lib/airlock/tasks.sqlite3\"\n",
        "worker.journal",
    );
}

// ---- lists ---------------------------------------------------------------------

#[test]
fn list_elements_are_checked_and_named_by_index() {
    let message = refused(
        "[executor]\nprograms = [\"/usr/bin/python3\", \"sh\"]\n",
        "executor.programs[1]",
    );
    assert_eq!(
        message,
        format!(
            "{ORIGIN}:2:33: executor.programs[1]: expected an absolute path without '.', '..' or empty components, found \"sh\""
        )
    );
    let message = refused(
        "[executor]\nprograms = [\"/usr/bin/git\", 3]\n",
        "executor.programs[1]",
    );
    assert!(message.ends_with("found 3"), "{message}");
    let message = refused(
        "[executor]\ngit_read_only_subcommands = [\"log\", \"push\"]\n",
        "executor.git_read_only_subcommands[1]",
    );
    assert!(message.contains("does not write"), "{message}");
    let message = refused(
        "[executor]\npython_modules = [\"pytest\", \"pytest\"]\n",
        "executor.python_modules[1]",
    );
    assert!(
        message.contains("not already listed (it is executor.python_modules[0])"),
        "{message}"
    );
    let message = refused(
        "[executor]\nallow_credential_paths = [\"src/lib.rs\"]\n",
        "executor.allow_credential_paths[0]",
    );
    assert!(message.contains("treats as a credential"), "{message}");
    let message = refused(
        "[worker]\ncapabilities = [\"git.read\", \"Git Write\"]\n",
        "worker.capabilities[1]",
    );
    assert!(message.contains("capability name"), "{message}");
}

#[test]
fn configured_lists_are_kept_in_order() {
    let config = parse(
        "[executor]\nprograms = [\"/usr/bin/make\"]\nallow_credential_paths = [\".env\", \"deploy/server.pem\"]\npython_modules = []\n",
    )
    .expect("valid");
    assert_eq!(config.executor.programs, [PathBuf::from("/usr/bin/make")]);
    assert_eq!(
        config.executor.allow_credential_paths,
        [".env", "deploy/server.pem"]
    );
    assert!(config.executor.python_modules.is_empty());
}

// ---- choices, addresses, ids -------------------------------------------------

#[test]
fn the_test_authorizer_must_be_chosen_explicitly() {
    let config = parse("[supervisor]\nauthorizer = \"allow-all-for-tests\"\n").expect("valid");
    assert_eq!(config.supervisor.authorizer, Authorizer::AllowAllForTests);
    let message = refused(
        "[supervisor]\nauthorizer = \"allow-all\"\n",
        "supervisor.authorizer",
    );
    assert_eq!(
        message,
        format!(
            "{ORIGIN}:2:14: supervisor.authorizer: expected one of \"polkit\", \"local\", \"allow-all-for-tests\", found \"allow-all\""
        )
    );
}

#[test]
fn the_local_authorizer_names_its_users() {
    let config =
        parse("[supervisor]\nauthorizer = \"local\"\nlocal_users = [\"root\", \"alice\"]\n")
            .expect("valid");
    assert_eq!(config.supervisor.authorizer, Authorizer::Local);
    assert_eq!(config.supervisor.local_users, ["root", "alice"]);
    refused(
        "[supervisor]\nlocal_users = [\"not a user\"]\n",
        "supervisor.local_users[0]",
    );
}

#[test]
fn retry_listens_on_loopback_only() {
    let config = parse("[retry]\nlisten = \"[::1]:9000\"\nauthorization_id = \"owner-0001\"\n")
        .expect("valid");
    assert_eq!(config.retry.listen.port(), 9000);
    assert_eq!(config.retry.authorization_id.as_deref(), Some("owner-0001"));
    let message = refused("[retry]\nlisten = \"0.0.0.0:8941\"\n", "retry.listen");
    assert!(message.ends_with("found \"0.0.0.0:8941\""), "{message}");
}

// ---- syntax ----------------------------------------------------------------------

#[test]
fn syntax_errors_name_the_file_and_place() {
    let err = parse("[supervisor]\nlease_seconds = \n").expect_err("invalid TOML");
    assert!(matches!(err, ConfigError::Syntax { .. }), "{err:?}");
    assert_eq!(err.key(), None);
    assert_eq!(
        err.location(),
        Some(Location {
            line: 2,
            column: 17
        })
    );
    let message = err.to_string();
    assert!(
        message.starts_with(&format!("{ORIGIN}:2:17: not valid TOML: ")),
        "{message}"
    );

    let err = parse("[supervisor]\nauto_accept = true\nauto_accept = false\n")
        .expect_err("duplicate key");
    assert!(err.to_string().contains("duplicate key"), "{err}");
    assert_eq!(err.location().map(|l| l.line), Some(3));
}

// ---- files -------------------------------------------------------------------------

fn write_file(dir: &Path, name: &str, bytes: &[u8], mode: u32) -> PathBuf {
    let path = dir.join(name);
    let mut f = std::fs::File::create(&path).expect("create");
    f.write_all(bytes).expect("write");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    path
}

#[test]
fn load_reads_a_file_and_names_it_in_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = write_file(
        dir.path(),
        "good.toml",
        b"[[repository]]\nname = \"r\"\npath = \"/srv/r.git\"\n",
        0o644,
    );
    let loaded = Config::load(&good).expect("loads");
    assert_eq!(loaded.repository_names(), ["r"]);

    let bad = write_file(
        dir.path(),
        "bad.toml",
        b"[worker]\nparallel_tasks = 65\n",
        0o640,
    );
    let err = Config::load(&bad).expect_err("out of range");
    assert_eq!(
        err.to_string(),
        format!(
            "{}:2:18: worker.parallel_tasks: expected an integer in 0..=64, found 65",
            bad.display()
        )
    );
    assert_eq!(err.file(), bad);
    let proto: airlock_proto::Error = err.into();
    assert_eq!(proto.code, Code::CONFIG_INVALID);
    assert!(proto.to_string().starts_with("CONFIG_INVALID: "), "{proto}");
}

#[test]
fn a_missing_file_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("airlock.toml");
    let err = Config::load(&missing).expect_err("missing");
    assert!(matches!(err, ConfigError::Unreadable { .. }));
    assert_eq!(err.code(), Code::CONFIG_INVALID);
    let message = err.to_string();
    assert!(
        message.starts_with(&missing.display().to_string()),
        "{message}"
    );
    assert!(message.contains("No such file"), "{message}");
    assert!(
        message.contains("expected a readable TOML file"),
        "{message}"
    );
}

#[test]
fn files_airlock_will_not_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let err = Config::load(dir.path()).expect_err("a directory");
    assert!(
        err.to_string().ends_with(": expected a regular file"),
        "{err}"
    );

    for (name, mode) in [
        ("open.toml", 0o666),
        ("group.toml", 0o664),
        ("group-only.toml", 0o620),
        ("other-only.toml", 0o602),
    ] {
        let file = write_file(dir.path(), name, b"", mode);
        let err = Config::load(&file).expect_err("writable by others");
        assert_eq!(err.code(), Code::CONFIG_INVALID);
        assert_eq!(err.file(), file);
        assert_eq!(
            err.to_string(),
            format!(
                "{f}: expected a file neither its group nor other users can write, found mode {mode:04o}; fix: chmod g-w,o-w {f}",
                f = file.display()
            )
        );
    }

    let big = vec![b'#'; 1024 * 1024 + 1];
    let big = write_file(dir.path(), "big.toml", &big, 0o644);
    let err = Config::load(&big).expect_err("too large");
    assert!(
        err.to_string().contains("expected at most 1048576 bytes"),
        "{err}"
    );

    let latin1 = write_file(dir.path(), "latin1.toml", b"# caf\xe9\n", 0o644);
    let err = Config::load(&latin1).expect_err("not UTF-8");
    assert!(
        err.to_string()
            .ends_with("expected UTF-8 text, found an invalid byte at offset 5"),
        "{err}"
    );
}

#[test]
fn only_root_or_the_non_root_reader_may_own_a_configuration_file() {
    use airlock_config::acceptable_owner;
    // Root's file: accepted by every reader.
    assert!(acceptable_owner(0, 0));
    assert!(acceptable_owner(0, 1000));
    // The reader's own file, when the reader is not root (airlock-local
    // run by a developer).
    assert!(acceptable_owner(1000, 1000));
    // Anyone else's: refused, root reading included.
    assert!(!acceptable_owner(1000, 0));
    assert!(!acceptable_owner(1000, 1001));
    assert!(!acceptable_owner(65534, 1000));
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

#[test]
fn a_root_owned_0644_file_is_read_and_another_owners_is_refused_naming_the_fix() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = b"[[repository]]\nname = \"r\"\npath = \"/srv/r.git\"\n";
    let file = write_file(dir.path(), "airlock.toml", text, 0o644);
    if !is_root() {
        // Not root: the reader's own file is what the test made; that
        // another owner's is refused needs root to chown it.
        Config::load(&file).expect("the reader's own file");
        panic!(
            "a_root_owned_0644_file_is_read_and_another_owners_is_refused_naming_the_fix needs root (it gives the file to another owner); CI runs the tests as root: run this one as root (sudo), it fails rather than pass without checking"
        );
    }
    Config::load(&file).expect("a root-owned 0644 file");
    std::os::unix::fs::chown(&file, Some(65534), None).expect("chown");
    let err = Config::load(&file).expect_err("owned by nobody");
    assert_eq!(err.code(), Code::CONFIG_INVALID);
    assert_eq!(
        err.to_string(),
        format!(
            "{f}: expected a file owned by root (only a reader that is not root also accepts its own uid's), found owner uid 65534; fix: chown root {f}",
            f = file.display()
        )
    );
    // A drop-in owned by another user is refused the same way, by its name.
    std::os::unix::fs::chown(&file, Some(0), None).expect("chown");
    let d = airlock_config::drop_in_dir(&file);
    std::fs::create_dir(&d).unwrap();
    let drop_in = write_file(
        &d,
        "calc.toml",
        b"[[repository]]\nname = \"calc\"\npath = \"/srv/calc.git\"\n",
        0o644,
    );
    Config::load(&file).expect("a root-owned drop-in");
    std::os::unix::fs::chown(&drop_in, Some(65534), None).expect("chown");
    let err = Config::load(&file).expect_err("a drop-in owned by nobody");
    assert_eq!(err.file(), drop_in);
    assert!(err.to_string().contains("fix: chown root"), "{err}");
    std::fs::set_permissions(&drop_in, std::fs::Permissions::from_mode(0o664)).unwrap();
    std::os::unix::fs::chown(&drop_in, Some(0), None).expect("chown");
    let err = Config::load(&file).expect_err("a group-writable drop-in");
    assert_eq!(err.file(), drop_in);
    assert!(err.to_string().contains("fix: chmod g-w,o-w"), "{err}");
}

#[test]
fn a_configuration_file_or_drop_in_inside_a_registered_repository_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = dir.path().join("demo.git");
    std::fs::create_dir(&repo).unwrap();
    // The main file inside the repository it registers.
    let inside = write_file(
        &repo,
        "airlock.toml",
        format!(
            "[[repository]]\nname = \"demo\"\npath = \"{}\"\n",
            repo.display()
        )
        .as_bytes(),
        0o644,
    );
    let err = Config::load(&inside).expect_err("inside the repository");
    assert_eq!(err.code(), Code::CONFIG_INVALID);
    assert_eq!(err.file(), inside);
    let msg = err.to_string();
    assert!(
        msg.contains("inside repository \"demo\"")
            && msg.ends_with("fix: move it out of the repository"),
        "{msg}"
    );

    // Reached through a symlink: the canonical path counts.
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&repo, &link).unwrap();
    let err = Config::load(&link.join("airlock.toml")).expect_err("through a symlink");
    assert!(err.to_string().contains("inside repository"), "{err}");

    // A drop-in inside a repository that another drop-in or the main file
    // registers: the main file's directory is the repository's.
    let etc = dir.path().join("etc");
    std::fs::create_dir(&etc).unwrap();
    let main = write_file(
        &etc,
        "airlock.toml",
        format!(
            "[[repository]]\nname = \"etc\"\npath = \"{}\"\n",
            etc.join("repositories.d").display()
        )
        .as_bytes(),
        0o644,
    );
    let d = airlock_config::drop_in_dir(&main);
    std::fs::create_dir(&d).unwrap();
    let drop_in = write_file(
        &d,
        "calc.toml",
        b"[[repository]]\nname = \"calc\"\npath = \"/srv/calc.git\"\n",
        0o644,
    );
    let err = Config::load(&main).expect_err("a drop-in inside a repository");
    assert_eq!(err.file(), drop_in);
    assert!(
        err.to_string().contains("inside repository \"etc\""),
        "{err}"
    );

    // Beside the repository, not in it: accepted (a repository path that
    // does not exist yet is compared as written).
    let beside = write_file(
        dir.path(),
        "airlock.toml",
        format!(
            "[[repository]]\nname = \"demo\"\npath = \"{}\"\n[[repository]]\nname = \"later\"\npath = \"{}\"\n",
            repo.display(),
            dir.path().join("later.git").display()
        )
        .as_bytes(),
        0o644,
    );
    Config::load(&beside).expect("beside the repositories");
}

// ---- repositories.d drop-ins ------------------------------------------------

fn drop_in_fixture(
    main: &str,
    drop_ins: &[(&str, &str)],
) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("airlock.toml");
    std::fs::write(&config, main).unwrap();
    let d = airlock_config::drop_in_dir(&config);
    std::fs::create_dir(&d).unwrap();
    for (name, text) in drop_ins {
        std::fs::write(d.join(name), text).unwrap();
    }
    (dir, config)
}

#[test]
fn drop_ins_register_repositories_after_the_main_file() {
    let calc = airlock_config::Repository {
        name: "calc".into(),
        path: "/srv/airlock/calc.git".into(),
        description: Some("a \"quoted\" description".into()),
        // The environment travels through the drop-in's text and back.
        environment: Some(airlock_config::Environment {
            paths: vec!["/opt/toolchain".into()],
            programs: vec!["cargo".into(), "/opt/toolchain/bin/rustc".into()],
            variables: [("PATH".to_owned(), "/opt/toolchain/bin:/usr/bin".to_owned())].into(),
            setup: Some(airlock_config::Setup {
                commands: vec![vec!["cargo".into(), "fetch".into(), "--locked".into()]],
                inputs: vec!["Cargo.toml".into(), "Cargo.lock".into()],
                outputs: vec!["~/.cargo/registry".into()],
                egress: vec!["registry.example:443".into()],
                timeout_seconds: 300,
            }),
        }),
        upstream: None,
        signing: None,
        drop_in: None,
    };
    let (_d, config) = drop_in_fixture(
        "[[repository]]\nname = \"demo\"\npath = \"/srv/airlock/demo.git\"\n",
        &[
            ("calc.toml", &airlock_config::drop_in_text(&calc)),
            ("calc.toml.dpkg-old", "garbage"),
            ("notes.txt", "garbage"),
        ],
    );
    let c = airlock_config::Config::load(&config).unwrap();
    assert_eq!(c.repository_names(), ["demo", "calc"]);
    let got = c.repository("calc").unwrap();
    assert_eq!(got.description, calc.description);
    assert_eq!(
        got.drop_in.as_deref(),
        Some(
            airlock_config::drop_in_dir(&config)
                .join("calc.toml")
                .as_path()
        )
    );
    assert_eq!(c.repository("demo").unwrap().drop_in, None);
    // Config::parse reads no other file.
    let text = std::fs::read_to_string(&config).unwrap();
    assert_eq!(
        airlock_config::Config::parse(&text, &config)
            .unwrap()
            .repository_names(),
        ["demo"]
    );
}

#[test]
fn bad_drop_ins_are_refused_naming_the_drop_in() {
    let main = "[[repository]]\nname = \"demo\"\npath = \"/srv/airlock/demo.git\"\n";
    let cases: &[(&str, &str, &str)] = &[
        (
            "other.toml",
            "[[repository]]\nname = \"calc\"\npath = \"/srv/airlock/calc.git\"\n",
            "named like its file",
        ),
        (
            "demo.toml",
            "[[repository]]\nname = \"demo\"\npath = \"/srv/airlock/demo2.git\"\n",
            "already registers \"demo\"",
        ),
        (
            "calc.toml",
            "[[repository]]\nname = \"calc\"\npath = \"/srv/airlock/demo.git\"\n",
            "already registers \"demo\"",
        ),
        (
            "calc.toml",
            "[worker]\nparallel_tasks = 4\n[[repository]]\nname = \"calc\"\npath = \"/srv/airlock/calc.git\"\n",
            "exactly one [[repository]] table and nothing else",
        ),
        (
            "calc.toml",
            "[[repository]]\nname = \"calc\"\npath = \"relative\"\n",
            "repository[0].path",
        ),
    ];
    for (file, text, says) in cases {
        let (_d, config) = drop_in_fixture(main, &[(file, text)]);
        let e = airlock_config::Config::load(&config).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains(file), "{file}: {msg}");
        assert!(msg.contains(says), "{file}: {msg}");
        assert_eq!(e.code(), airlock_proto::Code::CONFIG_INVALID);
    }
}

// ---- [[agent]] ---------------------------------------------------------------

const AGENT: &str = "[[agent]]\nname = \"planner\"\ncommand = [\"/usr/bin/python3\", \"-m\", \"planner\"]\nrepositories = [\"demo\"]\n";

#[test]
fn an_agent_takes_its_defaults_and_is_found_by_name() {
    let c = parse(AGENT).unwrap();
    let a = c.agent("planner").expect("planner");
    assert_eq!(a.command, ["/usr/bin/python3", "-m", "planner"]);
    assert_eq!(a.repositories, ["demo"]);
    assert!(a.environment.is_empty());
    assert_eq!(a.credential_file, None);
    assert_eq!((a.memory_max_mib, a.tasks_max), (1024, 64));
    assert!(a.may_propose_for("demo"));
    assert!(!a.may_propose_for("other"));
    assert!(c.agent("other").is_none());
    assert!(Config::embedded_default().agents.is_empty());
}

#[test]
fn agent_names_and_credential_files_are_unique() {
    let twice = format!("{AGENT}{AGENT}");
    let message = refused(&twice, "agent[1].name");
    assert!(
        message.contains("agent[0] is already called so"),
        "{message}"
    );
    let shared = format!(
        "{AGENT}credential_file = \"/etc/airlock/key\"\n[[agent]]\nname = \"other\"\ncommand = [\"/bin/true\"]\nrepositories = [\"demo\"]\ncredential_file = \"/etc/airlock/key\"\n"
    );
    let message = refused(&shared, "agent[1].credential_file");
    assert!(message.contains("handed to one agent only"), "{message}");
}

#[test]
fn an_agent_names_at_least_one_repository_and_only_allowed_environment() {
    let none = AGENT.replace("[\"demo\"]", "[]");
    refused(&none, "agent[0].repositories");
    for name in [
        "LD_PRELOAD",
        "PATH",
        "CREDENTIALS_DIRECTORY",
        "AIRLOCK_AGENT",
        "lang",
    ] {
        let text = format!("{AGENT}environment = [\"LANG\", \"{name}\"]\n");
        refused(&text, "agent[0].environment[1]");
    }
    let ok = parse(&format!(
        "{AGENT}environment = [\"LANG\", \"HTTPS_PROXY\"]\n"
    ))
    .unwrap();
    assert_eq!(ok.agents[0].environment, ["LANG", "HTTPS_PROXY"]);
}

#[test]
fn an_agents_repositories_must_be_registered_when_loaded() {
    // registered by a drop-in: accepted by load
    let calc = airlock_config::Repository {
        name: "demo".into(),
        path: "/srv/airlock/demo.git".into(),
        description: None,
        environment: None,
        upstream: None,
        signing: None,
        drop_in: None,
    };
    let (_d, config) = drop_in_fixture(
        AGENT,
        &[("demo.toml", &airlock_config::drop_in_text(&calc))],
    );
    let c = Config::load(&config).unwrap();
    assert_eq!(c.agents[0].repositories, ["demo"]);
    // registered nowhere: refused naming the element
    let (_d, config) = drop_in_fixture(AGENT, &[]);
    let err = Config::load(&config).unwrap_err();
    assert_eq!(err.key(), Some("agent[0].repositories[0]"));
    assert_eq!(err.code(), Code::CONFIG_INVALID);
    assert!(
        err.to_string().contains("expected a registered repository"),
        "{err}"
    );
}

// ---- airlock.toml.d settings drop-ins --------------------------------------------

fn settings_fixture(main: &str, drop_ins: &[(&str, &str)]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("airlock.toml");
    std::fs::write(&config, main).unwrap();
    let d = airlock_config::settings_dir(&config);
    std::fs::create_dir(&d).unwrap();
    for (name, text) in drop_ins {
        std::fs::write(d.join(name), text).unwrap();
    }
    (dir, config)
}

#[test]
fn settings_drop_ins_apply_over_the_main_file_in_name_order() {
    let (_d, config) = settings_fixture(
        "[supervisor]\nlease_seconds = 600\n\n[[repository]]\nname = \"demo\"\npath = \"/srv/airlock/demo.git\"\n",
        &[
            (
                "20-later.toml",
                "[supervisor]\nlease_seconds = 900\n\n[[repository]]\nname = \"calc\"\npath = \"/srv/airlock/calc.git\"\n",
            ),
            (
                "10-first.toml",
                "[supervisor]\nauto_accept = true\nlease_seconds = 700\n\n[executor.limits]\nprocesses = 77\n",
            ),
            // Not a drop-in: only *.toml is read.
            (
                "30-ignored.toml.dpkg-old",
                "[supervisor]\nlease_seconds = 5\n",
            ),
        ],
    );
    let c = Config::load(&config).unwrap();
    assert_eq!(
        c.supervisor.lease_seconds, 900,
        "the last file that sets a key wins"
    );
    assert!(
        c.supervisor.auto_accept,
        "a key only a drop-in sets applies"
    );
    assert_eq!(c.executor.limits.processes, 77, "tables merge key by key");
    let defaults = Config::embedded_default();
    assert_eq!(
        c.executor.limits.open_files, defaults.executor.limits.open_files,
        "a drop-in's table keeps the keys it does not set"
    );
    assert_eq!(
        c.repository_names(),
        ["demo", "calc"],
        "repository tables are appended"
    );
    // Config::parse reads the text it is given and no drop-in.
    let text = std::fs::read_to_string(&config).unwrap();
    assert_eq!(
        Config::parse(&text, &config)
            .unwrap()
            .supervisor
            .lease_seconds,
        600
    );
}

#[test]
fn rules_between_keys_hold_for_the_merged_settings_and_name_the_file_that_breaks_them() {
    // Alone, the drop-in would break "renewal at most half the lease"
    // (the default renewal is 60 s); with the main file's renewal it holds.
    let (_d, config) = settings_fixture(
        "[worker]\nrenew_interval_seconds = 10\n",
        &[(
            "50-short-lease.toml",
            "[supervisor]\nlease_seconds = 30\nsweep_interval_seconds = 5\n",
        )],
    );
    let c = Config::load(&config).unwrap();
    assert_eq!(
        (c.supervisor.lease_seconds, c.worker.renew_interval_seconds),
        (30, 10)
    );

    // A drop-in that sets the renewal too long is named, at its line.
    let (_d, config) = settings_fixture(
        "[supervisor]\nlease_seconds = 300\n",
        &[(
            "50-renewal.toml",
            "\n[worker]\nrenew_interval_seconds = 200\n",
        )],
    );
    let err = Config::load(&config).unwrap_err();
    let drop_in = airlock_config::settings_dir(&config).join("50-renewal.toml");
    assert_eq!(err.file(), drop_in, "{err}");
    assert_eq!(err.key(), Some("worker.renew_interval_seconds"), "{err}");
    assert!(
        err.to_string()
            .starts_with(&format!("{}:3:", drop_in.display())),
        "{err}"
    );

    // A repository table of a drop-in that clashes is named in that drop-in,
    // by its own index.
    let (_d, config) = settings_fixture(
        "[[repository]]\nname = \"demo\"\npath = \"/srv/airlock/demo.git\"\n",
        &[(
            "50-repos.toml",
            "[[repository]]\nname = \"calc\"\npath = \"/srv/airlock/calc.git\"\n\n[[repository]]\nname = \"demo\"\npath = \"/srv/airlock/other.git\"\n",
        )],
    );
    let err = Config::load(&config).unwrap_err();
    assert_eq!(
        err.file(),
        airlock_config::settings_dir(&config).join("50-repos.toml"),
        "{err}"
    );
    assert_eq!(err.key(), Some("repository[1].name"), "{err}");
}

#[test]
fn a_bad_settings_drop_in_is_refused_naming_it_and_changes_nothing() {
    // An unknown key, at its place in the drop-in.
    let (_d, config) = settings_fixture("", &[("50-typo.toml", "[supervisor]\nlease_secs = 30\n")]);
    let err = Config::load(&config).unwrap_err();
    let drop_in = airlock_config::settings_dir(&config).join("50-typo.toml");
    assert_eq!(err.key(), Some("supervisor.lease_secs"), "{err}");
    assert!(
        err.to_string()
            .starts_with(&format!("{}:2:1: ", drop_in.display())),
        "{err}"
    );
    assert_eq!(err.code(), Code::CONFIG_INVALID);

    // A drop-in others may write is refused like the main file would be.
    let (_d, config) = settings_fixture("", &[]);
    let drop_in = write_file(
        &airlock_config::settings_dir(&config),
        "50-open.toml",
        b"[supervisor]\nauto_accept = true\n",
        0o666,
    );
    let err = Config::load(&config).unwrap_err();
    assert_eq!(err.file(), drop_in);
    assert!(err.to_string().contains("chmod g-w,o-w"), "{err}");

    // An empty (comments only) main file and an empty directory are the defaults.
    let (_d, config) = settings_fixture("# only comments\n", &[]);
    assert_eq!(Config::load(&config).unwrap(), Config::embedded_default());
}

#[test]
fn an_earlier_releases_edited_file_migrates_to_its_changed_settings() {
    // What earlier releases installed: the example with every default
    // written out, here edited in two places and given a repository.
    let example = std::fs::read_to_string(example_path()).unwrap();
    let edited = example.replacen("lease_seconds = 300", "lease_seconds = 600", 1)
        + "\n[[repository]]\nname = \"calc\"\npath = \"/srv/airlock/calc.git\"\n";
    let edited = edited.replacen("parallel_tasks = 0", "parallel_tasks = 3", 1);
    let origin = Path::new("/etc/airlock/airlock.toml.dpkg-old");
    let m = airlock_config::migrated_settings(&edited, origin).unwrap();
    let table: toml::Table = m.text.parse().unwrap();
    // Exactly the changes, and the example's own repository tables.
    assert_eq!(
        table["supervisor"].as_table().unwrap().len(),
        1,
        "{}",
        m.text
    );
    assert_eq!(table["supervisor"]["lease_seconds"].as_integer(), Some(600));
    assert_eq!(table["worker"].as_table().unwrap().len(), 1, "{}", m.text);
    assert_eq!(table["worker"]["parallel_tasks"].as_integer(), Some(3));
    assert!(!table.contains_key("executor"), "{}", m.text);
    assert!(!table.contains_key("spool"), "{}", m.text);
    assert!(
        m.kept.contains(&"supervisor.lease_seconds".to_owned()),
        "{:?}",
        m.kept
    );
    assert!(m.defaults_dropped > 20, "{}", m.defaults_dropped);
    // Over the defaults, the drop-in means what the file meant.
    assert_eq!(
        Config::parse(&m.text, origin).unwrap(),
        Config::parse(&edited, origin).unwrap()
    );
    let names = Config::parse(&m.text, origin).unwrap();
    assert!(names.repository("calc").is_some());

    // A file this release refuses is refused naming it, and nothing is made.
    let err = airlock_config::migrated_settings("[supervisor]\nlease = 1\n", origin).unwrap_err();
    assert_eq!(err.file(), origin);
    assert_eq!(err.key(), Some("supervisor.lease"));
}

#[test]
fn running_caps_and_agent_quotas_are_read_and_refused_by_name_out_of_range() {
    let text = "[supervisor]\nmax_running_per_submitter = 4\n\n[[repository]]\nname = \"r\"\npath = \"/srv/git/r.git\"\n\n[[agent]]\nname = \"a\"\ncommand = [\"/usr/bin/planner\"]\nrepositories = [\"r\"]\nmax_running = 4096\ntasks_per_hour = 1000000\ncpu_seconds_per_day = 86400000\n";
    let c = parse(text).expect("at their bounds");
    assert_eq!(c.supervisor.max_running_per_submitter, 4);
    let a = &c.agents[0];
    assert_eq!(
        (a.max_running, a.tasks_per_hour, a.cpu_seconds_per_day),
        (4096, 1_000_000, 86_400_000)
    );
    assert_eq!(a.running_cap(4), 4096);
    let unset = parse(
        "[[agent]]\nname = \"b\"\ncommand = [\"/usr/bin/planner\"]\nrepositories = [\"r\"]\n",
    )
    .expect("defaults");
    let b = &unset.agents[0];
    assert_eq!(
        (b.max_running, b.tasks_per_hour, b.cpu_seconds_per_day),
        (0, 0, 0)
    );
    assert_eq!(
        b.running_cap(4),
        4,
        "the supervisor's cap when it sets none"
    );

    let m = refused(
        "[supervisor]\nmax_running_per_submitter = 4097\n",
        "supervisor.max_running_per_submitter",
    );
    assert!(
        m.ends_with("expected an integer in 0..=4096, found 4097"),
        "{m}"
    );
    for (key, value, range) in [
        ("max_running", "4097", "0..=4096"),
        ("tasks_per_hour", "1000001", "0..=1000000"),
        ("cpu_seconds_per_day", "86400001", "0..=86400000"),
        ("tasks_per_hour", "-1", "0..=1000000"),
    ] {
        let text = format!(
            "[[agent]]\nname = \"a\"\ncommand = [\"/usr/bin/planner\"]\nrepositories = [\"r\"]\n{key} = {value}\n"
        );
        let m = refused(&text, &format!("agent[0].{key}"));
        assert!(
            m.contains(&format!("expected an integer in {range}")),
            "{key} = {value}: {m}"
        );
    }
}

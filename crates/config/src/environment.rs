//! A repository's verification environment: what its commands see beyond
//! the system (read-only toolchain directories), which programs they may
//! start, the variables they get, and a setup that fetches dependencies.
//!
//! It is the administrator's, never the planner's: it lives in the
//! repository's registration (`[repository.environment]` in its
//! `repositories.d/NAME.toml`, or the `[[repository]]` table of the main
//! file), which `airlockctl repo add --environment FILE` and airlock-local's
//! `--environment NAME=FILE` write from a file holding an `[environment]`
//! table. Every key is in [`ENVIRONMENT_KEYS`], from which
//! docs/environments.md is generated.
//!
//! Two passes, as for the rest of the configuration: [`Environment::check`]
//! checks the forms (parsing opens no file), [`Environment::resolve`]
//! checks the host — each path a root-owned directory nobody else may
//! write, each bare program name found in the environment's PATH — and is
//! run by the services that act on it (the executor at start, the
//! supervisor for submissions, `airlockctl repo add` and `doctor`).

use airlock_proto::Code;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

/// Most entries of each list.
pub const MAX_ENTRIES: usize = 32;
/// Most bytes of a variable's value.
pub const MAX_VALUE_BYTES: usize = 4096;
/// The PATH commands get when the environment sets none.
pub const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// Variables an environment may not set: the sandbox sets them per
/// command, or they change what the dynamic loader loads.
pub const RESERVED_VARIABLES: &[&str] = &[
    "HOME",
    "TMPDIR",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "GIT_DIR",
    "GIT_CONFIG_GLOBAL",
    "GIT_CONFIG_NOSYSTEM",
    "GIT_CEILING_DIRECTORIES",
];

/// `[environment]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Environment {
    /// Read-only directories added to every command's view (a toolchain
    /// under /opt), at the same path.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<PathBuf>,
    /// Programs this repository's commands may start, beside
    /// `executor.programs`: absolute paths, or bare names resolved in the
    /// environment's PATH.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub programs: Vec<String>,
    /// What commands see in their environment, PATH included.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub variables: BTreeMap<String, String>,
    /// The dependency fetch, `[environment.setup]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup: Option<Setup>,
}

/// `[environment.setup]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Setup {
    /// The dependency fetches, each an argv (its program allowed as the
    /// environment's programs are).
    pub commands: Vec<Vec<String>>,
    /// Globs of the tree's files whose content keys the result (manifests
    /// and lockfiles): setup sees only these.
    pub inputs: Vec<String>,
    /// What setup produces and verification reads: workspace-relative
    /// paths, or `~/…` under the command's HOME.
    pub outputs: Vec<String>,
    /// `host:port` entries the setup may reach through the egress proxy.
    #[serde(default)]
    pub egress: Vec<String>,
    /// Wall-clock limit of each setup command, in seconds.
    #[serde(default = "default_setup_timeout")]
    pub timeout_seconds: u32,
}

fn default_setup_timeout() -> u32 {
    600
}

/// One key of an environment file, for its documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EnvironmentKey {
    /// The dotted key.
    pub key: &'static str,
    /// What it accepts.
    pub accepts: &'static str,
    /// Its default.
    pub default: &'static str,
    /// What it means.
    pub meaning: &'static str,
}

/// Every key of `[environment]`, for docs/environments.md.
pub const ENVIRONMENT_KEYS: &[EnvironmentKey] = &[
    EnvironmentKey {
        key: "environment.paths",
        accepts: "a list of at most 32 absolute directory paths",
        default: "[]",
        meaning: "Read-only directories added to every command's view at the same path (a toolchain under /opt). Each must be a directory owned by root that neither its group nor others may write, and so must every directory above it; otherwise ENVIRONMENT_PATH_UNSAFE.",
    },
    EnvironmentKey {
        key: "environment.programs",
        accepts: "a list of at most 32 absolute paths or bare program names",
        default: "[]",
        meaning: "Programs this repository's verification and setup commands may start, beside `executor.programs`. A bare name is resolved in the environment's PATH when the environment is loaded (ENVIRONMENT_PROGRAM_UNRESOLVED when absent); submissions naming any other program are refused with COMMAND_PROGRAM_DENY, and the executor refuses them again.",
    },
    EnvironmentKey {
        key: "environment.variables",
        accepts: "a table of NAME = \"value\" (names [A-Za-z_][A-Za-z0-9_]*, values one line of at most 4096 bytes)",
        default: "{}",
        meaning: "What commands see in their environment, PATH included (without one: /usr/local/bin:/usr/bin:/bin). HOME, TMPDIR, LD_* and git's own variables are the sandbox's and refused. A value or a name that looks like a secret (a token, key or password shape, or a name such as *_TOKEN) is refused with ENVIRONMENT_VARIABLE_SECRET: the environment is configuration, readable by readers; credentials never go there.",
    },
    EnvironmentKey {
        key: "environment.setup.commands",
        accepts: "a list of 1 to 16 argvs",
        default: "(required in [environment.setup])",
        meaning: "The dependency fetches (`cargo fetch --locked`, `npm ci --ignore-scripts`, `pip install --target …`), run in order in the executor's sandbox on a tree holding only the inputs, with a network path only to the egress proxy.",
    },
    EnvironmentKey {
        key: "environment.setup.inputs",
        accepts: "a list of 1 to 32 relative globs (`*`, `?`, `**`), without `..`",
        default: "(required in [environment.setup])",
        meaning: "The tree's files whose content keys the dependency layer: its manifests and lockfiles. Setup sees only these files.",
    },
    EnvironmentKey {
        key: "environment.setup.outputs",
        accepts: "a list of 1 to 32 relative paths, or `~/…` paths under the command's HOME, without `..`",
        default: "(required in [environment.setup])",
        meaning: "What setup produces and verification reads (`node_modules`, `~/.cargo/registry`): sealed as the dependency layer and shown read-only to verification.",
    },
    EnvironmentKey {
        key: "environment.setup.egress",
        accepts: "a list of at most 32 `host:port` entries (a DNS name or an IP literal, port 1–65535)",
        default: "[]",
        meaning: "The only places setup may reach, through airlock-egress. Names are resolved by the proxy, and a name resolving to a loopback, private, link-local or multicast address is refused, unless the administrator's route for that host (`/etc/airlock/egress.toml`: `addresses` of an internal mirror, or `via` a parent proxy) says otherwise; an environment cannot.",
    },
    EnvironmentKey {
        key: "environment.setup.timeout_seconds",
        accepts: "an integer in 1..=3600",
        default: "600",
        meaning: "Wall-clock limit of each setup command.",
    },
];

/// One example environment file per ecosystem, for docs/environments.md
/// (each parses; registry hosts are placeholders).
pub const EXAMPLES: &[(&str, &str)] = &[
    (
        "Python: pytest installed by the setup, per requirements file",
        r#"[environment]
programs = ["python3"]
variables = { PATH = "/usr/bin:/bin", PYTHONPATH = "/workspace/deps" }

[environment.setup]
commands = [["python3", "-m", "pip", "install", "--no-cache-dir", "--target", "deps", "-r", "requirements.txt"]]
inputs = ["requirements.txt"]
outputs = ["deps"]
# The index and the file host the package client asks for.
egress = ["pypi-index.example:443", "pypi-files.example:443"]
"#,
    ),
    (
        "Rust: a toolchain under /opt, the registry fetched by the setup",
        r#"[environment]
# rustup installed with RUSTUP_HOME=/opt/rust/rustup CARGO_HOME=/opt/rust/cargo
# (read-only to commands); the crates go to the command's HOME (/tmp).
paths = ["/opt/rust"]
programs = ["cargo"]
variables = { PATH = "/opt/rust/cargo/bin:/usr/bin:/bin", RUSTUP_HOME = "/opt/rust/rustup", CARGO_HOME = "/tmp/.cargo" }

# The setup sees only its inputs: cargo parses the manifests alone when
# they name their targets ([lib] path = "src/lib.rs", [[bin]] path = …).
[environment.setup]
commands = [["cargo", "fetch", "--locked"]]
inputs = ["Cargo.toml", "Cargo.lock", "**/Cargo.toml"]
outputs = ["~/.cargo/registry"]
egress = ["crates-index.example:443", "crates-files.example:443"]
# Verification: cargo test --offline
"#,
    ),
    (
        "Node: node_modules from the lockfile",
        r#"[environment]
programs = ["node", "npm"]
variables = { PATH = "/usr/bin:/bin" }

[environment.setup]
commands = [["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund"]]
inputs = ["package.json", "package-lock.json"]
outputs = ["node_modules"]
egress = ["npm-registry.example:443"]
# Verification: npm test
"#,
    ),
];

/// Why an environment is refused: a code, the key and what was wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {problem}")]
pub struct EnvironmentError {
    /// The catalogue code.
    pub code: Code,
    /// The dotted key (`environment.paths[0]`).
    pub key: String,
    /// What was wrong, and what is expected.
    pub problem: String,
}

/// The one way an environment is refused: a value quoted in `problem` is
/// not shown when `key` may hold a credential (`crate::secret`).
fn refuse(code: Code, key: impl Into<String>, problem: impl Into<String>) -> EnvironmentError {
    let key = key.into();
    let problem = crate::secret::scrub(&crate::keys::normalise(&key), &problem.into()).into_owned();
    EnvironmentError { code, key, problem }
}

/// An environment checked against the host: what the services use.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Resolved {
    /// The read-only directories, as configured.
    pub paths: Vec<PathBuf>,
    /// Each allowed program as an absolute path (bare names resolved).
    pub programs: Vec<PathBuf>,
    /// Bare names and what they resolved to, for the task builder.
    pub names: BTreeMap<String, PathBuf>,
    /// The variables, PATH always present.
    pub variables: BTreeMap<String, String>,
    /// The setup, its programs resolved.
    pub setup: Option<ResolvedSetup>,
    /// SHA-256 of the environment's canonical form: part of every
    /// dependency layer's key (a change to any key makes a new layer).
    pub digest: String,
}

/// A setup as the executor runs it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ResolvedSetup {
    /// Each command's argv, argv\[0\] an absolute path.
    pub commands: Vec<Vec<String>>,
    /// The inputs' globs.
    pub inputs: Vec<String>,
    /// The outputs: workspace-relative, or `~/…` under HOME.
    pub outputs: Vec<String>,
    /// The `host:port` entries the setup may reach.
    pub egress: Vec<String>,
    /// Wall-clock limit of each command, in seconds.
    pub timeout_seconds: u32,
}

fn is_normal_absolute(p: &Path) -> bool {
    p.is_absolute()
        && !p.as_os_str().as_encoded_bytes().ends_with(b"/")
        && p.components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
        && p.components().count() > 1
}

fn is_bare_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && !s.starts_with('.')
        && !s.starts_with('-')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._+-".contains(&b))
}

fn is_variable_name(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b'A'..=b'Z' | b'a'..=b'z' | b'_'))
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && s.len() <= 64
}

/// Whether a variable would carry a secret: its name says so, or its value
/// has a secret's shape (the redactor's shapes).
pub fn looks_secret(name: &str, value: &str) -> bool {
    const NAMES: &[&str] = &[
        "TOKEN",
        "SECRET",
        "PASSWORD",
        "PASSWD",
        "CREDENTIAL",
        "API_KEY",
        "APIKEY",
        "PRIVATE_KEY",
        "ACCESS_KEY",
        "AUTH",
    ];
    // A value made only of absolute paths (PATH, a toolchain's home) is
    // not a secret, however random a directory's name looks.
    let paths_only = !value.is_empty()
        && value
            .split(':')
            .all(|p| p.starts_with('/') && !p.contains("://") && !p.contains('='));
    let upper = name.to_ascii_uppercase();
    NAMES.iter().any(|n| upper.contains(n))
        || (!paths_only
            && (airlock_proto::redact::text(value) != value
                || airlock_proto::redact::text(&format!("{name}={value}"))
                    != format!("{name}={value}")))
}

/// A `host:port` egress entry: a lower-case DNS name or an IP literal
/// (IPv6 in brackets), a port in 1..=65535.
pub fn is_host_port(entry: &str) -> bool {
    let Some((host, port)) = entry.rsplit_once(':') else {
        return false;
    };
    let port_ok = !port.is_empty()
        && port.len() <= 5
        && port.bytes().all(|b| b.is_ascii_digit())
        && !port.starts_with('0')
        && port.parse::<u32>().is_ok_and(|p| (1..=65535).contains(&p));
    if !port_ok {
        return false;
    }
    if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return v6.parse::<std::net::Ipv6Addr>().is_ok();
    }
    if host.parse::<std::net::Ipv4Addr>().is_ok() {
        return true;
    }
    !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
        && host.bytes().any(|b| b.is_ascii_lowercase())
}

fn is_relative_pattern(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 256
        && !s.starts_with('/')
        && !s.contains('\\')
        && !s.chars().any(char::is_control)
        && s.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
}

fn is_output(s: &str) -> bool {
    match s.strip_prefix("~/") {
        Some(rest) => is_relative_pattern(rest) && !rest.contains(['*', '?', '[']),
        None => is_relative_pattern(s) && !s.contains(['*', '?', '[']),
    }
}

fn argv_ok(argv: &[String]) -> bool {
    !argv.is_empty()
        && argv.len() <= 64
        && argv
            .iter()
            .all(|a| a.len() <= 4096 && !a.chars().any(|c| c == '\0' || c == '\n'))
}

impl Environment {
    /// Checks the forms (no file is opened).
    pub fn check(&self) -> Result<(), EnvironmentError> {
        let invalid =
            |key: String, problem: String| refuse(Code::ENVIRONMENT_INVALID, key, problem);
        let bounded = |key: &str, n: usize| {
            if n > MAX_ENTRIES {
                Err(invalid(
                    key.to_owned(),
                    format!("expected at most {MAX_ENTRIES} entries, found {n}"),
                ))
            } else {
                Ok(())
            }
        };
        bounded("environment.paths", self.paths.len())?;
        for (i, p) in self.paths.iter().enumerate() {
            if !is_normal_absolute(p) {
                return Err(invalid(
                    format!("environment.paths[{i}]"),
                    format!(
                        "expected an absolute path without '.', '..', empty components or a trailing '/', found {:?}",
                        p.display().to_string()
                    ),
                ));
            }
        }
        bounded("environment.programs", self.programs.len())?;
        for (i, p) in self.programs.iter().enumerate() {
            if !(is_bare_name(p) || is_normal_absolute(Path::new(p))) {
                return Err(invalid(
                    format!("environment.programs[{i}]"),
                    format!("expected an absolute path or a bare program name, found {p:?}"),
                ));
            }
        }
        bounded("environment.variables", self.variables.len())?;
        for (name, value) in &self.variables {
            let key = format!("environment.variables.{name}");
            if !is_variable_name(name) {
                return Err(invalid(
                    key,
                    "expected a name of [A-Za-z_][A-Za-z0-9_]*, at most 64 characters".into(),
                ));
            }
            if RESERVED_VARIABLES.contains(&name.as_str()) || name.starts_with("LD_") {
                return Err(invalid(
                    key,
                    "the sandbox sets this variable itself; choose another".into(),
                ));
            }
            if value.len() > MAX_VALUE_BYTES || value.chars().any(char::is_control) {
                return Err(invalid(
                    key,
                    format!("expected one line of at most {MAX_VALUE_BYTES} bytes"),
                ));
            }
            if looks_secret(name, value) {
                return Err(refuse(
                    Code::ENVIRONMENT_VARIABLE_SECRET,
                    key,
                    "looks like a secret: credentials never go into an environment (it is configuration, readable by readers); the setup reaches registries through the egress proxy without one",
                ));
            }
        }
        if let Some(path) = self.variables.get("PATH") {
            for (i, dir) in path.split(':').enumerate() {
                if !is_normal_absolute(Path::new(dir)) {
                    return Err(invalid(
                        "environment.variables.PATH".into(),
                        format!("entry {i}: expected an absolute directory, found {dir:?}"),
                    ));
                }
            }
        }
        if let Some(setup) = &self.setup {
            setup.check()?;
        }
        Ok(())
    }

    /// Checks the host and resolves the programs: each path a directory
    /// owned by root that neither group nor others may write, and every
    /// directory above it likewise; each bare program found, executable,
    /// in the environment's PATH (an absolute program must exist).
    pub fn resolve(&self) -> Result<Resolved, EnvironmentError> {
        self.check()?;
        for (i, p) in self.paths.iter().enumerate() {
            safe_directory(p).map_err(|problem| {
                refuse(
                    Code::ENVIRONMENT_PATH_UNSAFE,
                    format!("environment.paths[{i}]"),
                    problem,
                )
            })?;
        }
        let mut variables = self.variables.clone();
        variables
            .entry("PATH".to_owned())
            .or_insert_with(|| DEFAULT_PATH.to_owned());
        let search = variables["PATH"].clone();
        let mut programs = Vec::new();
        let mut names = BTreeMap::new();
        for (i, p) in self.programs.iter().enumerate() {
            let key = format!("environment.programs[{i}]");
            let found = if is_bare_name(p) {
                search
                    .split(':')
                    .map(|d| Path::new(d).join(p))
                    .find(|c| is_executable(c))
                    .ok_or_else(|| {
                        refuse(
                            Code::ENVIRONMENT_PROGRAM_UNRESOLVED,
                            key.clone(),
                            format!(
                                "{p:?} is not an executable file in any PATH directory ({search})"
                            ),
                        )
                    })?
            } else if is_executable(Path::new(p)) {
                PathBuf::from(p)
            } else {
                return Err(refuse(
                    Code::ENVIRONMENT_PROGRAM_UNRESOLVED,
                    key,
                    format!("{p} is not an executable file"),
                ));
            };
            if is_bare_name(p) {
                names.insert(p.clone(), found.clone());
            }
            if !programs.contains(&found) {
                programs.push(found);
            }
        }
        let setup = match &self.setup {
            None => None,
            Some(setup) => {
                let mut commands = Vec::new();
                for (i, argv) in setup.commands.iter().enumerate() {
                    let program = names
                        .get(&argv[0])
                        .cloned()
                        .or_else(|| {
                            let p = PathBuf::from(&argv[0]);
                            programs.contains(&p).then_some(p)
                        })
                        .ok_or_else(|| {
                            refuse(
                                Code::ENVIRONMENT_PROGRAM_UNRESOLVED,
                                format!("environment.setup.commands[{i}]"),
                                format!(
                                    "{:?} is not one of environment.programs: a setup runs only the environment's own programs",
                                    argv[0]
                                ),
                            )
                        })?;
                    let mut resolved = vec![program.to_string_lossy().into_owned()];
                    resolved.extend(argv[1..].iter().cloned());
                    commands.push(resolved);
                }
                Some(ResolvedSetup {
                    commands,
                    inputs: setup.inputs.clone(),
                    outputs: setup.outputs.clone(),
                    egress: setup.egress.clone(),
                    timeout_seconds: setup.timeout_seconds,
                })
            }
        };
        let digest = airlock_proto::canonical::digest_of(self)
            .map_err(|e| refuse(Code::ENVIRONMENT_INVALID, "environment", e.to_string()))?;
        Ok(Resolved {
            paths: self.paths.clone(),
            programs,
            names,
            variables,
            setup,
            digest,
        })
    }
}

impl Setup {
    fn check(&self) -> Result<(), EnvironmentError> {
        let invalid =
            |key: String, problem: String| refuse(Code::ENVIRONMENT_INVALID, key, problem);
        if self.commands.is_empty() || self.commands.len() > 16 {
            return Err(invalid(
                "environment.setup.commands".into(),
                format!("expected 1 to 16 commands, found {}", self.commands.len()),
            ));
        }
        for (i, argv) in self.commands.iter().enumerate() {
            if !argv_ok(argv) {
                return Err(invalid(
                    format!("environment.setup.commands[{i}]"),
                    "expected a non-empty argv of at most 64 arguments, each one line".into(),
                ));
            }
        }
        for (key, list, ok) in [
            (
                "inputs",
                &self.inputs,
                is_relative_pattern as fn(&str) -> bool,
            ),
            ("outputs", &self.outputs, is_output),
        ] {
            if list.is_empty() || list.len() > MAX_ENTRIES {
                return Err(invalid(
                    format!("environment.setup.{key}"),
                    format!("expected 1 to {MAX_ENTRIES} entries, found {}", list.len()),
                ));
            }
            for (i, item) in list.iter().enumerate() {
                if !ok(item) {
                    return Err(invalid(
                        format!("environment.setup.{key}[{i}]"),
                        format!(
                            "expected a relative path without '..' (outputs: no globs; '~/' for HOME), found {item:?}"
                        ),
                    ));
                }
            }
        }
        if self.egress.len() > MAX_ENTRIES {
            return Err(invalid(
                "environment.setup.egress".into(),
                format!("expected at most {MAX_ENTRIES} entries"),
            ));
        }
        for (i, entry) in self.egress.iter().enumerate() {
            if !is_host_port(entry) {
                return Err(refuse(
                    Code::ENVIRONMENT_EGRESS_INVALID,
                    format!("environment.setup.egress[{i}]"),
                    format!(
                        "expected host:port (a lower-case DNS name or an IP literal, port 1-65535), found {entry:?}"
                    ),
                ));
            }
        }
        if !(1..=3600).contains(&self.timeout_seconds) {
            return Err(invalid(
                "environment.setup.timeout_seconds".into(),
                format!(
                    "expected an integer in 1..=3600, found {}",
                    self.timeout_seconds
                ),
            ));
        }
        Ok(())
    }
}

fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0)
}

/// A directory owned by root, not writable by group or others, and every
/// directory above it likewise (so nobody but root can swap it).
fn safe_directory(p: &Path) -> Result<(), String> {
    let meta = std::fs::metadata(p).map_err(|e| format!("{}: {e}", p.display()))?;
    if !meta.is_dir() {
        return Err(format!("{} is not a directory", p.display()));
    }
    let mut at = Some(p);
    while let Some(dir) = at {
        let m = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let m = if m.file_type().is_symlink() {
            std::fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?
        } else {
            m
        };
        if m.uid() != 0 {
            return Err(format!(
                "{} belongs to uid {}, not root: whoever owns it could change what commands run (chown root it)",
                dir.display(),
                m.uid()
            ));
        }
        // A sticky directory above (as /tmp) cannot have our directory
        // renamed away by others; the directory itself must not be writable.
        let sticky_parent = dir != p && m.mode() & 0o1000 != 0;
        if m.mode() & 0o022 != 0 && !sticky_parent {
            return Err(format!(
                "{} is writable by its group or others (mode {:04o}): chmod go-w it",
                dir.display(),
                m.mode() & 0o7777
            ));
        }
        at = dir.parent();
    }
    Ok(())
}

/// Reads an environment file: TOML with one `[environment]` table and
/// nothing else, checked for form.
pub fn read_environment_file(path: &Path) -> Result<Environment, EnvironmentError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        refuse(
            Code::ENVIRONMENT_INVALID,
            path.display().to_string(),
            e.to_string(),
        )
    })?;
    parse_environment_file(&text, path)
}

/// Parses an environment file's text (see [`read_environment_file`]).
pub fn parse_environment_file(text: &str, path: &Path) -> Result<Environment, EnvironmentError> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct File {
        environment: Environment,
    }
    let file: File = toml::from_str(text).map_err(|e| {
        refuse(
            Code::ENVIRONMENT_INVALID,
            path.display().to_string(),
            // TOML and serde quote the value they could not take: which
            // key it was is not known here, so none is shown.
            format!(
                "expected one [environment] table and nothing else: {}",
                crate::secret::without_quoted(e.message())
            ),
        )
    })?;
    file.environment.check()?;
    Ok(file.environment)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nix_is_root() -> bool {
        std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
    }

    fn env(text: &str) -> Result<Environment, EnvironmentError> {
        parse_environment_file(text, Path::new("t.toml"))
    }

    #[test]
    fn forms_are_checked_with_their_codes() {
        let e = env("[environment]\npaths = [\"opt/x\"]\n").unwrap_err();
        assert_eq!(
            (e.code, e.key.as_str()),
            (Code::ENVIRONMENT_INVALID, "environment.paths[0]")
        );
        let e = env("[environment]\nprograms = [\"../cargo\"]\n").unwrap_err();
        assert_eq!(e.code, Code::ENVIRONMENT_INVALID);
        let e = env("[environment]\nvariables = { NPM_TOKEN = \"x\" }\n").unwrap_err();
        assert_eq!(e.code, Code::ENVIRONMENT_VARIABLE_SECRET);
        let e = env(
            "[environment]\nvariables = { X = \"ghp_aB3dE5gH7jK9mN1pQ3sT5vW7yZ9bC1dE3fG5\" }\n",
        )
        .unwrap_err();
        assert_eq!(e.code, Code::ENVIRONMENT_VARIABLE_SECRET);
        // Paths are not secrets, however random a directory's name.
        assert!(env("[environment]\nvariables = { PATH = \"/var/tmp/airlock-env-aB3dE5gH7jK9/bin:/usr/bin\" }\n").is_ok());
        let e = env("[environment]\nvariables = { HOME = \"/x\" }\n").unwrap_err();
        assert_eq!(e.code, Code::ENVIRONMENT_INVALID);
        let e = env("[environment]\nvariables = { LD_FOO = \"/x\" }\n").unwrap_err();
        assert_eq!(e.code, Code::ENVIRONMENT_INVALID);
        let e = env("[environment]\nvariables = { PATH = \"bin:/usr/bin\" }\n").unwrap_err();
        assert_eq!(e.key, "environment.variables.PATH");
        let e = env("[environment]\nunknown = 1\n").unwrap_err();
        assert_eq!(e.code, Code::ENVIRONMENT_INVALID);
        let setup = |egress: &str| {
            format!(
                "[environment.setup]\ncommands = [[\"cargo\", \"fetch\"]]\ninputs = [\"Cargo.lock\"]\noutputs = [\"~/.cargo/registry\"]\negress = [{egress}]\n"
            )
        };
        assert!(env(&setup("\"registry.example:443\"")).is_ok());
        for bad in [
            "\"*.example:443\"",
            "\"x.example\"",
            "\"x.example:0\"",
            "\"u@x.example:443\"",
            "\"X.example:443\"",
            "\"x.example:443/p\"",
        ] {
            let e = env(&setup(bad)).unwrap_err();
            assert_eq!(e.code, Code::ENVIRONMENT_EGRESS_INVALID, "{bad}");
        }
        assert!(env(&setup("\"[::1]:8080\", \"192.0.2.1:443\"")).is_ok());
        let e = env("[environment.setup]\ncommands = [[\"x\"]]\ninputs = [\"../Cargo.lock\"]\noutputs = [\"o\"]\n").unwrap_err();
        assert_eq!(e.key, "environment.setup.inputs[0]");
        let e = env(
            "[environment.setup]\ncommands = [[\"x\"]]\ninputs = [\"a\"]\noutputs = [\"/abs\"]\n",
        )
        .unwrap_err();
        assert_eq!(e.key, "environment.setup.outputs[0]");
    }

    #[test]
    fn every_example_parses() {
        for (what, text) in EXAMPLES {
            env(text).unwrap_or_else(|e| panic!("{what}: {e}"));
        }
    }

    #[test]
    fn the_host_is_checked_and_bare_programs_resolved() {
        let e = Environment {
            programs: vec!["sh".into(), "/usr/bin/env".into()],
            variables: [("PATH".to_owned(), "/usr/bin:/bin".to_owned())].into(),
            paths: vec!["/usr/lib".into()],
            setup: None,
        };
        let r = e.resolve().unwrap();
        assert_eq!(r.names["sh"], PathBuf::from("/usr/bin/sh"));
        assert!(r.programs.contains(&PathBuf::from("/usr/bin/env")));
        let missing = Environment {
            programs: vec!["no-such-program-here".into()],
            ..Environment::default()
        };
        assert_eq!(
            missing.resolve().unwrap_err().code,
            Code::ENVIRONMENT_PROGRAM_UNRESOLVED
        );
        let unsafe_path = |p: PathBuf| {
            Environment {
                paths: vec![p],
                ..Environment::default()
            }
            .resolve()
            .unwrap_err()
            .code
        };
        // World-writable (sticky or not: anyone could plant a program in it).
        assert_eq!(unsafe_path("/tmp".into()), Code::ENVIRONMENT_PATH_UNSAFE);
        assert_eq!(
            unsafe_path("/no/such/dir".into()),
            Code::ENVIRONMENT_PATH_UNSAFE
        );
        if nix_is_root() {
            let dir = tempfile::tempdir().unwrap();
            std::os::unix::fs::chown(dir.path(), Some(65534), None).unwrap();
            assert_eq!(
                unsafe_path(dir.path().into()),
                Code::ENVIRONMENT_PATH_UNSAFE
            );
            std::os::unix::fs::chown(dir.path(), Some(0), None).unwrap();
            let ok = Environment {
                paths: vec![dir.path().into()],
                ..Environment::default()
            };
            assert!(
                ok.resolve().is_ok(),
                "a root-owned 0700 directory under /tmp"
            );
        }
    }
}

/// The programs each repository's commands may start: its environment's
/// (resolved) first, then `executor.programs`. What the supervisor checks
/// a submission against and the task builder resolves bare names in; the
/// executor checks the same again.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProgramTable {
    executor: Vec<PathBuf>,
    by_repository: BTreeMap<String, Result<Vec<PathBuf>, EnvironmentError>>,
}

impl ProgramTable {
    /// Resolves every registered repository's environment on this host.
    pub fn from_config(config: &crate::Config) -> ProgramTable {
        ProgramTable {
            executor: config.executor.programs.clone(),
            by_repository: config
                .repositories
                .iter()
                .filter_map(|r| {
                    let env = r.environment.as_ref()?;
                    Some((r.name.clone(), env.resolve().map(|res| res.programs)))
                })
                .collect(),
        }
    }

    /// The programs `repository`'s commands may start, or why its
    /// environment is unusable here.
    pub fn for_repository(&self, repository: &str) -> Result<Vec<PathBuf>, EnvironmentError> {
        let mut all = match self.by_repository.get(repository) {
            None => Vec::new(),
            Some(Ok(programs)) => programs.clone(),
            Some(Err(e)) => return Err(e.clone()),
        };
        for p in &self.executor {
            if !all.contains(p) {
                all.push(p.clone());
            }
        }
        Ok(all)
    }

    /// Checks that every argv[0] of `commands` may run for `repository`
    /// (compared exactly, as the executor compares): COMMAND_PROGRAM_DENY,
    /// or the environment's own code when it is unusable.
    pub fn check(
        &self,
        repository: &str,
        programs: impl IntoIterator<Item = impl AsRef<str>>,
    ) -> Result<(), airlock_proto::Error> {
        let allowed = self.for_repository(repository).map_err(|e| {
            airlock_proto::Error::with(e.code, format!("repository {repository}: {e}"))
        })?;
        for program in programs {
            let program = program.as_ref();
            if !allowed.iter().any(|p| p.as_os_str() == program) {
                return Err(airlock_proto::Error::with(
                    Code::COMMAND_PROGRAM_DENY,
                    format!(
                        "{program:?} is not one of the programs {repository}'s commands may start ({}); an administrator allows more in the repository's environment (docs/environments.md)",
                        allowed
                            .iter()
                            .map(|p| p.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }
}

//! airlock-local: the whole airlock suite on one machine, without systemd.
//!
//! `up` starts a private dbus-daemon, the supervisor, the worker, the
//! executor (in its own network namespace) and the retry API as separate
//! processes — as distinct uids when started as root, otherwise as the
//! caller with a plain warning — and runs until Ctrl-C. `demo` does the
//! same in a fresh state directory, makes a sample repository, submits a
//! task, shows its progress and the result, and exits.

use airlock_local::demo;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Run the whole airlock suite on this machine without systemd.
#[derive(Debug, Parser)]
#[command(name = "airlock-local", version, about, long_about)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start: the size of `Up`'s options costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Command {
    /// Start every component and run until Ctrl-C; prints how to reach them.
    Up {
        /// State directory (created; kept afterwards) [default: as root
        /// /var/lib/airlock-local, which every component user can reach;
        /// otherwise ./airlock-local-state].
        #[arg(long, value_name = "DIR")]
        state: Option<PathBuf>,
        /// Serve your own repository as NAME: PATH is an existing git
        /// repository (bare or not). It is imported into the state
        /// directory, where the worker is its only writer; a later `up`
        /// brings its branches and tags up to date (agent/* stays the
        /// worker's). Repeatable.
        #[arg(long = "repo", value_name = "NAME=PATH", value_parser = parse_repo)]
        repos: Vec<(String, PathBuf)>,
        /// Give repository NAME (one of --repo's) the verification
        /// environment of FILE: a TOML file with one [environment] table
        /// (toolchain paths, programs, variables; docs/environments.md),
        /// checked against this host first. Repeatable.
        #[arg(long = "environment", value_name = "NAME=FILE", value_parser = parse_repo)]
        environments: Vec<(String, PathBuf)>,
        /// Run the planner agents of FILE: `[[agent]]` tables as in
        /// airlock.toml (docs/configuration.md). Each runs as airlock-agent
        /// (as root), restarted by the supervisor's crash-loop policy;
        /// `airlockctl agent list` shows them.
        #[arg(long, value_name = "FILE")]
        agents: Option<PathBuf>,
        /// Repository NAME follows the upstream URL (ssh://, https:// or an
        /// absolute path) and publishes its agent branches to it
        /// (docs/upstream.md). NAME may also be a --repo's (imported first);
        /// otherwise it starts empty and the worker's first sync fills it.
        /// Repeatable.
        #[arg(long = "upstream", value_name = "NAME=URL", value_parser = parse_pair)]
        upstreams: Vec<(String, String)>,
        /// The worker's credential for NAME's upstream: a deploy key (ssh)
        /// or a file holding a token (https). Repeatable.
        #[arg(long = "credential", value_name = "NAME=FILE", value_parser = parse_repo)]
        credentials: Vec<(String, PathBuf)>,
        /// A known_hosts line pinning NAME's upstream host key (required
        /// for ssh://). Repeatable.
        #[arg(long = "host-key", value_name = "NAME=LINE", value_parser = parse_pair)]
        host_keys: Vec<(String, String)>,
        /// Sign NAME's governed commits with this unencrypted Ed25519 key,
        /// as --signer's principal. Repeatable.
        #[arg(long = "signing-key", value_name = "NAME=FILE", value_parser = parse_repo)]
        signing_keys: Vec<(String, PathBuf)>,
        /// The principal NAME's commits are signed as [default:
        /// airlock-local@localhost].
        #[arg(long = "signer", value_name = "NAME=PRINCIPAL", value_parser = parse_pair)]
        signers: Vec<(String, String)>,
        /// airlock-egress's routes: a TOML file of `[[route]]` tables (host,
        /// and one of direct = true, addresses = [CIDR, ...], via =
        /// "http://HOST:PORT" with credential = NAME;
        /// docs/privsep/egress.md), checked by airlock-egress as it starts.
        #[arg(long = "egress-config", value_name = "FILE")]
        egress_config: Option<PathBuf>,
        /// A credential a route names (`credential = NAME`): FILE holds
        /// `user:password` for its parent proxy, handed to airlock-egress
        /// alone as systemd's LoadCredential= would. Repeatable.
        #[arg(long = "egress-credential", value_name = "NAME=FILE", value_parser = parse_repo)]
        egress_credentials: Vec<(String, PathBuf)>,
    },
    /// Start everything in a fresh state directory, run a sample task end to end, print the result, stop.
    Demo {
        /// Print one JSON object (task_id, state, commit_oid, target_branch, verification) instead of text.
        #[arg(long)]
        json: bool,
        /// State directory [default: a new temporary directory, removed afterwards].
        #[arg(long, value_name = "DIR")]
        state: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = match args.command {
        Command::Up {
            state,
            repos,
            environments,
            agents,
            upstreams,
            credentials,
            host_keys,
            signing_keys,
            signers,
            egress_config,
            egress_credentials,
        } => read_agents(agents.as_deref()).and_then(|agents| {
            let environments = read_environments(&repos, &environments)?;
            let upstreams =
                local_upstreams(upstreams, credentials, host_keys, signing_keys, signers)?;
            let egress_routes = egress_config
                .map(|f| {
                    std::fs::read_to_string(&f)
                        .map_err(|e| format!("--egress-config {}: {e}", f.display()))
                })
                .transpose()?;
            let tuning = airlock_local::Tuning {
                repositories: repos,
                environments,
                agents,
                upstreams,
                egress_routes,
                egress_credentials,
                ..Default::default()
            };
            up(state.unwrap_or_else(default_state), tuning)
        }),
        Command::Demo { json, state } => demo::run(json, state),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("airlock-local: {e}");
            ExitCode::FAILURE
        }
    }
}

fn parse_pair(s: &str) -> Result<(String, String), String> {
    parse_repo(s).map(|(n, v)| (n, v.to_string_lossy().into_owned()))
}

/// The `--upstream` options, each NAME's with its credential, host keys
/// and signing key; an option naming no `--upstream` is refused.
fn local_upstreams(
    upstreams: Vec<(String, String)>,
    credentials: Vec<(String, PathBuf)>,
    host_keys: Vec<(String, String)>,
    signing_keys: Vec<(String, PathBuf)>,
    signers: Vec<(String, String)>,
) -> Result<Vec<airlock_local::LocalUpstream>, String> {
    let known = |flag: &str, name: &str| {
        if upstreams.iter().any(|(n, _)| n == name) {
            Ok(())
        } else {
            Err(format!("{flag} {name}=…: {name} has no --upstream"))
        }
    };
    for (n, _) in &credentials {
        known("--credential", n)?;
    }
    for (n, _) in &host_keys {
        known("--host-key", n)?;
    }
    for (n, _) in &signing_keys {
        known("--signing-key", n)?;
    }
    let mut out = Vec::new();
    for (name, url) in upstreams {
        // The refusal never shows the URL's password.
        airlock_proto::upstream::Scheme::of(&url)
            .map_err(|e| format!("--upstream {name}=…: {e}"))?;
        airlock_git::check_local_upstream(&url, &[])
            .map_err(|e| format!("--upstream {name}=…: {e}"))?;
        let mut upstream = airlock_config::Upstream::at(&url);
        upstream.host_keys = host_keys
            .iter()
            .filter(|(n, _)| *n == name)
            .map(|(_, l)| l.clone())
            .collect();
        let principal = signers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, p)| p.clone())
            .unwrap_or_else(|| "airlock-local@localhost".to_owned());
        out.push(airlock_local::LocalUpstream {
            credential: credentials
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, p)| p.clone()),
            signing: signing_keys
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, p)| (principal.clone(), p.clone())),
            name,
            upstream,
        });
    }
    Ok(out)
}

fn parse_repo(s: &str) -> Result<(String, PathBuf), String> {
    let (name, path) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected NAME=PATH"))?;
    if name.is_empty() || path.is_empty() {
        return Err(format!("{s:?}: expected NAME=PATH"));
    }
    Ok((name.to_owned(), PathBuf::from(path)))
}

/// As root, a directory every component user can reach; otherwise one
/// beside the caller.
fn default_state() -> PathBuf {
    if nix::unistd::Uid::effective().is_root() {
        PathBuf::from("/var/lib/airlock-local")
    } else {
        PathBuf::from("airlock-local-state")
    }
}

/// The `[[agent]]` tables of `file` (and nothing else).
fn read_agents(file: Option<&std::path::Path>) -> Result<Vec<airlock_config::Agent>, String> {
    let Some(file) = file else {
        return Ok(Vec::new());
    };
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let parsed = airlock_config::Config::parse(&text, file).map_err(|e| e.to_string())?;
    let only_agents = parsed.repositories.is_empty()
        && airlock_config::Config {
            agents: Vec::new(),
            ..parsed.clone()
        } == airlock_config::Config::embedded_default();
    if !only_agents || parsed.agents.is_empty() {
        return Err(format!(
            "{}: expected [[agent]] tables and nothing else",
            file.display()
        ));
    }
    Ok(parsed.agents)
}

/// Each `--environment NAME=FILE`: NAME one of the `--repo` names, FILE
/// an environment file that resolves on this host.
fn read_environments(
    repos: &[(String, PathBuf)],
    given: &[(String, PathBuf)],
) -> Result<Vec<(String, airlock_config::Environment)>, String> {
    let mut out: Vec<(String, airlock_config::Environment)> = Vec::new();
    for (name, file) in given {
        if !repos.iter().any(|(n, _)| n == name) {
            return Err(format!(
                "--environment {name}={}: {name} is not one of the --repo names",
                file.display()
            ));
        }
        if out.iter().any(|(n, _)| n == name) {
            return Err(format!("--environment {name}: given twice"));
        }
        let env = airlock_config::read_environment_file(file)
            .and_then(|e| e.resolve().map(|_| e))
            .map_err(|e| {
                format!(
                    "--environment {name}={}: {e} [{}]",
                    file.display(),
                    e.code.as_str()
                )
            })?;
        out.push((name.clone(), env));
    }
    Ok(out)
}

fn up(state: PathBuf, tuning: airlock_local::Tuning) -> Result<(), String> {
    let repos = tuning.repositories.clone();
    let mut suite = airlock_local::start_with(state, false, &tuning)?;
    println!(
        "airlock is running (state in {}).",
        suite.layout.root.display()
    );
    let config = suite.layout.config();
    println!(
        "  bus:        {} (recorded in {} as supervisor.bus_address)",
        suite.bus.address(),
        config.display()
    );
    println!(
        "  admin CLI:  airlockctl --config {} status",
        config.display()
    );
    println!(
        "  retry API:  {} (token in {})",
        suite.retry_url,
        suite.layout.token().display()
    );
    println!("  logs:       {}", suite.layout.logs().display());
    if suite.agent_host.is_some() {
        println!(
            "  agents:     airlockctl --config {} agent list   (their output in {})",
            config.display(),
            suite.layout.path("agents").display()
        );
    }
    for (name, from) in std::iter::once(("demo".to_owned(), None))
        .chain(repos.iter().map(|(n, p)| (n.clone(), Some(p))))
    {
        let at = suite.layout.repos().join(format!("{name}.git"));
        println!("  repository: {name} at {}", at.display());
        if let Some(from) = from {
            println!(
                "    propose:  airlockctl --config {} propose --repo {name} --base main --worktree {} --verify '…' --wait",
                config.display(),
                from.display()
            );
            println!(
                "    results:  airlockctl --config {} repo clone {name} DIR   (then git -C DIR fetch origin 'refs/heads/agent/*:refs/remotes/origin/agent/*')",
                config.display(),
            );
        }
    }
    println!(
        "  separation: {}",
        if suite.ids.separated {
            "on (one uid per component)"
        } else {
            "OFF (all components run as you)"
        }
    );
    println!("Ctrl-C stops everything.");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = std::sync::Arc::clone(&stop);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    std::thread::spawn(move || {
        rt.block_on(async {
            let _ = tokio::signal::ctrl_c().await;
        });
        flag.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        suite.fleet.check_alive()?;
        std::thread::sleep(Duration::from_millis(300));
    }
    println!("stopping…");
    suite.fleet.stop(Duration::from_secs(10));
    Ok(())
}

//! `airlock-supervisor`: owns `org.airlock.Supervisor1` on the system bus.

use airlock_proto::{Code, Error};
use airlock_sandbox::lockdown::lockdown;
use airlock_sandbox::role::{Paths, Role, Slot};
use airlock_service::{init_logging, load_config, uid_of};
use airlock_supervisor::authz::local::LocalAuthorizer;
#[cfg(feature = "test-authorizers")]
use airlock_supervisor::authz::testing::TestAuthorizer;
use airlock_supervisor::daemon::{self, AuthorizerChoice, Settings};
use airlock_supervisor::repositories::Listing;
use airlock_taskdb::Location;
use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// The airlock supervisor: owns the task queue and serves it on the D-Bus
/// system bus as org.airlock.Supervisor1 (interfaces org.airlock.Tasks2 for
/// planners and admins, authorised by polkit; org.airlock.Worker1 for the
/// worker and org.airlock.Retry1 for airlock-retryd, each admitted by its
/// unix uid).
///
/// Normally started by systemd (airlock-supervisor.service, Type=notify).
/// Stops in order on SIGTERM: new calls are refused, calls in flight
/// finish, then the bus name is released.
#[derive(Debug, Parser)]
#[command(
    name = "airlock-supervisor",
    version,
    max_term_width = 100,
    after_help = "Environment:\n  AIRLOCK_LOG              log filter (default: info), e.g. airlock=debug\n  DBUS_SYSTEM_BUS_ADDRESS  the system bus, when --bus-address is not given\n  CREDENTIALS_DIRECTORY    set by systemd (LoadCredential=): a PostgreSQL task store's password is read from its file airlock-database-password\n  NOTIFY_SOCKET, WATCHDOG_USEC  set by systemd: READY/STATUS/STOPPING, watchdog at half the period\n\nExit status: 0 after an orderly stop; otherwise the error catalogue's exit code (3 bad configuration, 9 bus or store unavailable, ...)."
)]
struct Args {
    /// Configuration file (the [supervisor] section is used).
    #[arg(long, value_name = "PATH", default_value = airlock_config::DEFAULT_PATH)]
    config: PathBuf,

    /// Task store to use instead of [supervisor] database: an SQLite file's
    /// absolute path, or a postgresql:// URL without a password.
    #[arg(long, value_name = "PATH|URL")]
    db: Option<String>,

    /// File holding the PostgreSQL password, instead of the systemd
    /// credential $CREDENTIALS_DIRECTORY/airlock-database-password. Never
    /// put the password in the configuration file or the URL.
    #[arg(long, value_name = "PATH")]
    database_password_file: Option<PathBuf>,

    /// Bring a PostgreSQL task store's schema up to this version and exit.
    /// Run it as the schema's owner (e.g. --db
    /// postgresql://airlock_owner@HOST/airlock) before starting upgraded
    /// supervisors whose role may not change the schema.
    #[arg(long)]
    migrate: bool,

    /// D-Bus address to serve on instead of the system bus
    /// (e.g. unix:path=/tmp/bus/socket). Without it, DBUS_SYSTEM_BUS_ADDRESS
    /// or the standard system bus socket is used.
    #[arg(long, value_name = "ADDRESS")]
    bus_address: Option<String>,

    /// Authoriser to use instead of [supervisor] authorizer: "polkit" or
    /// "local" (the users of [supervisor] local_users). Test builds also
    /// accept the test authorisers ("allow-all-for-tests", …); packaged
    /// builds refuse them.
    #[arg(long, value_name = "NAME")]
    authorizer: Option<String>,

    /// User (name or numeric uid) whose calls to org.airlock.Worker1 are
    /// accepted, instead of [supervisor] worker_user.
    #[arg(long, value_name = "USER")]
    worker_user: Option<String>,

    /// With the local authoriser: a user (name or numeric uid) allowed every
    /// org.airlock.Tasks2 method, instead of [supervisor] local_users.
    /// Repeatable.
    #[arg(long = "local-user", value_name = "USER")]
    local_users: Vec<String>,

    /// User (name or numeric uid) whose calls to org.airlock.Retry1 are
    /// accepted, instead of [retry] user.
    #[arg(long, value_name = "USER")]
    retry_user: Option<String>,

    /// Check the configuration, print the resolved settings and exit.
    #[arg(long)]
    check_config: bool,

    /// Delay every call by this many milliseconds (tests of orderly
    /// shutdown; test builds only).
    #[cfg(feature = "test-authorizers")]
    #[arg(long, value_name = "MS", hide = true)]
    debug_call_delay_ms: Option<u64>,

    /// Append every move of task state the store commits to this file, one
    /// line each: task, from, step, to, tab-separated (the contract test;
    /// test builds only).
    #[cfg(feature = "test-authorizers")]
    #[arg(long, value_name = "PATH", hide = true)]
    debug_transition_log: Option<PathBuf>,
}

/// The authoriser named `name` (from the flag or the configuration).
fn authorizer(
    name: &str,
    local_users: &[String],
    local_planners: &[String],
) -> Result<AuthorizerChoice, Error> {
    match name {
        "polkit" => Ok(AuthorizerChoice::Polkit),
        "local" => {
            let uids = local_users
                .iter()
                .map(|u| uid_of("supervisor.local_users", u))
                .collect::<Result<Vec<_>, _>>()?;
            let planners = local_planners
                .iter()
                .map(|u| uid_of("supervisor.local_planners", u))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(AuthorizerChoice::Local(
                LocalAuthorizer::new(uids).with_planners(planners),
            ))
        }
        #[cfg(feature = "test-authorizers")]
        other => match TestAuthorizer::parse(other) {
            Some(Ok(t)) => Ok(AuthorizerChoice::ForTests(t)),
            Some(Err(why)) => Err(Error::with(Code::CONFIG_INVALID, why)),
            None => Err(Error::with(
                Code::CONFIG_INVALID,
                format!(
                    "authorizer {other:?}: expected polkit, local, allow-all-for-tests, deny-all-for-tests, interactive-for-tests or allow-for-tests:ACTION,..."
                ),
            )),
        },
        #[cfg(not(feature = "test-authorizers"))]
        other => Err(Error::with(
            Code::CONFIG_INVALID,
            format!(
                "authorizer {other:?}: this airlock-supervisor is a production build and accepts only \"polkit\" or \"local\"; test authorisers exist only in test builds"
            ),
        )),
    }
}

/// The systemd credential that holds a PostgreSQL task store's password.
const PASSWORD_CREDENTIAL: &str = "airlock-database-password";

/// Where the task store is, with a PostgreSQL password read from
/// `--database-password-file` or the systemd credential (absent: no
/// password, e.g. peer authentication on a UNIX socket).
fn location(args: &Args, sup: &airlock_config::Supervisor) -> Result<Location, Error> {
    let value = match &args.db {
        Some(v) => v.clone(),
        None => sup.database.to_string_lossy().into_owned(),
    };
    let security = airlock_taskdb::tasks::PgSecurity {
        ca_file: sup.database_ca_file.clone(),
        allow_plaintext: sup.database_allow_plaintext,
    };
    let location = Location::parse_with(&value, &security)?;
    let Location::Postgres(pg) = location else {
        return Ok(location);
    };
    let file = match (
        &args.database_password_file,
        std::env::var_os("CREDENTIALS_DIRECTORY"),
    ) {
        (Some(f), _) => Some(f.clone()),
        (None, Some(dir)) => Some(PathBuf::from(dir).join(PASSWORD_CREDENTIAL)),
        (None, None) => None,
    };
    let password = match file {
        None => None,
        Some(f) => match std::fs::read(&f) {
            Ok(bytes) => Some(bytes),
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound
                    && args.database_password_file.is_none() =>
            {
                None
            }
            Err(e) => {
                return Err(Error::with(
                    Code::CONFIG_INVALID,
                    format!("reading the database password from {}: {e}", f.display()),
                ));
            }
        },
    };
    Ok(Location::Postgres(Box::new(match password {
        Some(mut bytes) => {
            while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                bytes.pop();
            }
            pg.with_password(&bytes)
        }
        None => *pg,
    })))
}

fn settings(args: &Args) -> Result<(Settings, airlock_config::Config), Error> {
    let config = load_config(&args.config)?;
    let sup = &config.supervisor;
    let configured = match sup.authorizer {
        airlock_config::Authorizer::Polkit => "polkit",
        airlock_config::Authorizer::Local => "local",
        airlock_config::Authorizer::AllowAllForTests => "allow-all-for-tests",
    };
    let local_users = if args.local_users.is_empty() {
        &sup.local_users
    } else {
        &args.local_users
    };
    let authorizer = authorizer(
        args.authorizer.as_deref().unwrap_or(configured),
        local_users,
        &sup.local_planners,
    )?;
    let worker_user = args.worker_user.as_deref().unwrap_or(&sup.worker_user);
    let retry_user = args.retry_user.as_deref().unwrap_or(&config.retry.user);
    let settings = Settings {
        database: location(args, sup)?,
        bus_address: args.bus_address.clone(),
        authorizer,
        worker_uid: uid_of("supervisor.worker_user", worker_user)?,
        retry_uid: uid_of("retry.user", retry_user)?,
        lease_seconds: sup.lease_seconds,
        sweep_interval: Duration::from_secs(u64::from(sup.sweep_interval_seconds.max(1))),
        auto_accept: sup.auto_accept,
        repositories: config.repositories.iter().map(Listing::of).collect(),
        programs: airlock_config::ProgramTable::from_config(&config),
        drain_timeout: Duration::from_secs(20),
        #[cfg(feature = "test-authorizers")]
        call_delay: args.debug_call_delay_ms.map(Duration::from_millis),
        #[cfg(not(feature = "test-authorizers"))]
        call_delay: None,
        agents: config.agents.clone(),
        agent_driver: sup.agent_driver,
        agent_options: airlock_agents::Options {
            call_timeout: Duration::from_secs(u64::from(sup.agent_call_timeout_seconds)),
            ..airlock_agents::Options::default()
        },
        max_running_per_submitter: sup.max_running_per_submitter,
        metrics: (sup.metrics_interval_seconds > 0).then(|| {
            airlock_supervisor::metrics::MetricsSettings {
                directory: sup.metrics_directory.clone(),
                interval: Duration::from_secs(u64::from(sup.metrics_interval_seconds)),
            }
        }),
    };
    Ok((settings, config))
}

/// Registers SIGTERM and SIGINT now (so a signal during start-up is not
/// fatal) and returns a future that completes on the first of them.
fn terminated() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM"),
            _ = int.recv() => tracing::info!("SIGINT"),
        }
    })
}

fn fail(e: &Error) -> ExitCode {
    tracing::error!(code = e.code.as_str(), "{e}");
    ExitCode::from(e.code.exit_code())
}

/// The supervisor's lockdown (`Role::Supervisor` in airlock_sandbox::role).
/// The store is opened, and the bus connected, after it: an SQLite
/// database's directory is granted; a PostgreSQL store over TCP gets IP
/// sockets, TCP connect to its ports and the name-resolution files; over a
/// UNIX socket nothing more (Landlock, at the ABI requested, does not check
/// connect(2) to pathname sockets, the bus's included).
fn confine(
    settings: &Settings,
    config: &std::path::Path,
    drop_ins: &std::path::Path,
) -> Result<(), Error> {
    let paths = match &settings.database {
        Location::Sqlite(path) => {
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
                _ => PathBuf::from("."),
            };
            // The store creates its directory; so must we, to grant it.
            let _ = std::fs::create_dir_all(&dir);
            Paths::new().with(Slot::DatabaseDir, dir)
        }
        Location::Postgres(pg) if pg.uses_tcp() => Paths::new().with_tcp_connect(pg.ports()),
        Location::Postgres(_) => Paths::new(),
    }
    .with(Slot::DropInDir, drop_ins.to_path_buf())
    .with(Slot::SettingsDir, airlock_config::settings_dir(config))
    .with(Slot::ConfigFile, config.to_path_buf());
    let paths = match &settings.metrics {
        Some(m) => paths.with(Slot::MetricsDir, m.directory.clone()),
        None => paths,
    };
    let report = lockdown(Role::Supervisor, &paths)
        .map_err(|e| Error::with(e.code(), format!("lockdown: {e}")))?;
    tracing::info!("{report}");
    Ok(())
}

/// `--debug-transition-log`: the store's moves to `path`, opened now
/// (before the lockdown) and written as each transaction commits.
#[cfg(feature = "test-authorizers")]
fn log_moves(path: &std::path::Path) -> Result<(), Error> {
    use std::io::Write as _;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| Error::with(Code::CONFIG_INVALID, format!("{}: {e}", path.display())))?;
    let file = std::sync::Mutex::new(file);
    airlock_taskdb::tasks::moves::observe(move |task_id, m| {
        let line = format!(
            "{task_id}\t{}\t{:?}\t{}\n",
            m.from.as_str(),
            m.step,
            m.to.as_str()
        );
        if let Ok(mut f) = file.lock() {
            let _ = f.write_all(line.as_bytes());
        }
    });
    Ok(())
}

/// `--migrate`: the PostgreSQL schema to this build's version.
fn migrate(location: &Location) -> ExitCode {
    let Location::Postgres(pg) = location else {
        return fail(&Error::with(
            Code::CONFIG_INVALID,
            "--migrate is for a PostgreSQL task store (an SQLite store migrates itself when opened)",
        ));
    };
    match airlock_taskdb::tasks::postgres::migrate_at(pg) {
        Ok(version) => {
            println!("{pg}: schema at version {version}");
            ExitCode::SUCCESS
        }
        Err(e) => fail(&airlock_supervisor::store::store_error(e)),
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    init_logging();
    let (settings, config) = match settings(&args) {
        Ok(s) => s,
        Err(e) => return fail(&e),
    };
    let drop_ins = airlock_config::drop_in_dir(&args.config);
    if !drop_ins.is_dir() {
        tracing::warn!(
            "{} does not exist: repositories registered there after start need a restart, not a reload",
            drop_ins.display()
        );
    }
    if args.check_config {
        println!("{settings:#?}");
        return ExitCode::SUCCESS;
    }
    if args.migrate {
        return migrate(&settings.database);
    }
    #[cfg(feature = "test-authorizers")]
    if let Some(Err(e)) = args.debug_transition_log.as_deref().map(log_moves) {
        return fail(&e);
    }
    // Confinement, before the runtime starts any thread: bounding set,
    // no_new_privs, rlimits, Landlock (the database's directory), seccomp.
    if let Err(e) = confine(&settings, &args.config, &drop_ins) {
        return fail(&e);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("airlock-supervisor")
        .build()
    {
        Ok(r) => r,
        Err(e) => return fail(&Error::with(Code::INTERNAL, format!("tokio runtime: {e}"))),
    };
    let served = runtime.block_on(async {
        let shutdown = terminated()
            .map_err(|e| Error::with(Code::INTERNAL, format!("installing signal handlers: {e}")))?;
        // SIGHUP (systemctl reload): the main file's repositories as read
        // at start, the drop-ins as they are at the signal, and the
        // [[agent]] tables of the main file and its settings drop-ins as
        // they are at the signal (read whole and checked as at start; the
        // other sections need a restart).
        let signals = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .map_err(|e| Error::with(Code::INTERNAL, format!("installing SIGHUP: {e}")))?;
        let path = args.config.clone();
        let reload = daemon::Reload {
            signals,
            reread: Box::new(move || {
                let invalid = |e: airlock_config::ConfigError| {
                    Error::with(Code::CONFIG_INVALID, e.to_string())
                };
                let fresh = load_config(&path)?;
                let repositories = config.repositories_now(&path).map_err(invalid)?;
                let mut now = config.clone();
                now.repositories = repositories;
                now.agents = fresh.agents;
                now.check_agent_repositories(&path).map_err(invalid)?;
                Ok(daemon::Registered {
                    repositories: now.repositories.iter().map(Listing::of).collect(),
                    programs: airlock_config::ProgramTable::from_config(&now),
                    agents: now.agents,
                })
            }),
        };
        daemon::run_with_reload(settings, shutdown, Some(reload)).await
    });
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

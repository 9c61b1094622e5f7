//! `airlock-supervisor`: owns `org.airlock.Supervisor1` on the system bus.

use airlock_config::Config;
use airlock_proto::{Code, Error};
use airlock_supervisor::authz::testing::TestAuthorizer;
use airlock_supervisor::daemon::{self, AuthorizerChoice, Settings};
use clap::Parser;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// The airlock supervisor: owns the task queue and serves it on the D-Bus
/// system bus as org.airlock.Supervisor1 (interfaces org.airlock.Tasks1 for
/// planners and admins, authorised by polkit, and org.airlock.Worker1 for
/// the worker, admitted by unix uid).
///
/// Normally started by systemd (airlock-supervisor.service, Type=notify).
/// Stops in order on SIGTERM: new calls are refused, calls in flight
/// finish, then the bus name is released.
#[derive(Debug, Parser)]
#[command(
    name = "airlock-supervisor",
    version,
    max_term_width = 100,
    after_help = "Environment:\n  AIRLOCK_LOG              log filter (default: info), e.g. airlock=debug\n  DBUS_SYSTEM_BUS_ADDRESS  the system bus, when --bus-address is not given\n  NOTIFY_SOCKET, WATCHDOG_USEC  set by systemd: READY/STATUS/STOPPING, watchdog at half the period\n\nExit status: 0 after an orderly stop; otherwise the error catalogue's exit code (3 bad configuration, 9 bus or store unavailable, ...)."
)]
struct Args {
    /// Configuration file (the [supervisor] section is used).
    #[arg(long, value_name = "PATH", default_value = airlock_config::DEFAULT_PATH)]
    config: PathBuf,

    /// Task store to use instead of [supervisor] database.
    #[arg(long, value_name = "PATH")]
    db: Option<PathBuf>,

    /// D-Bus address to serve on instead of the system bus
    /// (e.g. unix:path=/tmp/bus/socket). Without it, DBUS_SYSTEM_BUS_ADDRESS
    /// or the standard system bus socket is used.
    #[arg(long, value_name = "ADDRESS")]
    bus_address: Option<String>,

    /// Authoriser to use instead of [supervisor] authorizer: "polkit", or,
    /// for test harnesses only, "allow-all-for-tests", "deny-all-for-tests",
    /// "interactive-for-tests" (allow only callers that allowed interactive
    /// authorisation) or "allow-for-tests:ACTION,..." with ACTION one of
    /// read, submit, manage. A test authoriser is announced in the log and
    /// in the org.airlock.Tasks1.Authorizer property.
    #[arg(long, value_name = "NAME")]
    authorizer: Option<String>,

    /// User (name or numeric uid) whose calls to org.airlock.Worker1 are
    /// accepted, instead of [supervisor] worker_user.
    #[arg(long, value_name = "USER")]
    worker_user: Option<String>,

    /// Check the configuration, print the resolved settings and exit.
    #[arg(long)]
    check_config: bool,

    /// Delay every call by this many milliseconds (tests of orderly
    /// shutdown only).
    #[arg(long, value_name = "MS", hide = true)]
    debug_call_delay_ms: Option<u64>,
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("AIRLOCK_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        // A closed stderr must not take the service down with it.
        .log_internal_errors(false)
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if std::env::var_os("JOURNAL_STREAM").is_some() {
        // The journal stamps time itself and shows no colours.
        builder.without_time().with_ansi(false).init();
    } else {
        let colour = std::io::stderr().is_terminal()
            && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
        builder.with_ansi(colour).init();
    }
}

fn resolve_user(user: &str) -> Result<u32, Error> {
    if let Ok(uid) = user.parse::<u32>() {
        return Ok(uid);
    }
    match nix::unistd::User::from_name(user) {
        Ok(Some(u)) => Ok(u.uid.as_raw()),
        Ok(None) => Err(Error::with(
            Code::CONFIG_INVALID,
            format!("worker user {user:?} does not exist"),
        )),
        Err(e) => Err(Error::with(
            Code::CONFIG_INVALID,
            format!("looking up worker user {user:?}: {e}"),
        )),
    }
}

fn settings(args: &Args) -> Result<Settings, Error> {
    let config =
        Config::load(&args.config).map_err(|e| Error::with(Code::CONFIG_INVALID, e.to_string()))?;
    let sup = &config.supervisor;
    let authorizer = match args.authorizer.as_deref() {
        None => match sup.authorizer {
            airlock_config::Authorizer::Polkit => AuthorizerChoice::Polkit,
            airlock_config::Authorizer::AllowAllForTests => {
                AuthorizerChoice::ForTests(TestAuthorizer::allow_all())
            }
        },
        Some("polkit") => AuthorizerChoice::Polkit,
        Some(other) => match TestAuthorizer::parse(other) {
            Some(Ok(t)) => AuthorizerChoice::ForTests(t),
            Some(Err(why)) => return Err(Error::with(Code::CONFIG_INVALID, why)),
            None => {
                return Err(Error::with(
                    Code::CONFIG_INVALID,
                    format!(
                        "--authorizer {other:?}: expected polkit, allow-all-for-tests, deny-all-for-tests, interactive-for-tests or allow-for-tests:ACTION,..."
                    ),
                ));
            }
        },
    };
    let worker_user = args.worker_user.as_deref().unwrap_or(&sup.worker_user);
    Ok(Settings {
        database: args.db.clone().unwrap_or_else(|| sup.database.clone()),
        bus_address: args.bus_address.clone(),
        authorizer,
        worker_uid: resolve_user(worker_user)?,
        lease_seconds: sup.lease_seconds,
        sweep_interval: Duration::from_secs(u64::from(sup.sweep_interval_seconds.max(1))),
        auto_accept: sup.auto_accept,
        repositories: config.repositories.iter().map(|r| r.name.clone()).collect(),
        drain_timeout: Duration::from_secs(20),
        call_delay: args.debug_call_delay_ms.map(Duration::from_millis),
    })
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

fn main() -> ExitCode {
    let args = Args::parse();
    init_logging();
    let settings = match settings(&args) {
        Ok(s) => s,
        Err(e) => return fail(&e),
    };
    if args.check_config {
        println!("{settings:#?}");
        return ExitCode::SUCCESS;
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
        daemon::run(settings, shutdown).await
    });
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

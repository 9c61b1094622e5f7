//! airlock-retryd: the owner's one lever on an exhausted task.
//!
//! `POST /v1/tasks/{task_id}/retry-extension` raises a FAILED task's
//! `max_attempts` by exactly one, under compare-and-swap and idempotency
//! rules. retryd holds no database: it authenticates the owner, checks the
//! request's shape, and asks the supervisor over `org.airlock.Retry1`
//! (admitted by retryd's uid alone), which runs the one store transaction.
//! A compromised retryd can therefore ask for exactly what the owner could:
//! one extension step per request, under the same CAS.
//!
//! Start-up refuses to serve unless the owner authorization id
//! (AIRLOCK_RETRY_AUTHORIZATION_ID, else `[retry] authorization_id`) is
//! valid and the control token file is a regular file of at least 32
//! characters. It listens on a socket passed by systemd (LISTEN_FDS), else
//! on `--listen ADDR`, else on `[retry] listen`. Once the token and the
//! socket are open it confines itself (`Role::Retryd` of
//! airlock_sandbox::role), before its runtime starts any thread.

mod http;
mod token;

use airlock_client::Supervisor;
use airlock_config::Config;
use airlock_proto::retry::check_configured_authorization_id;
use airlock_proto::{Code, Error};
use airlock_sandbox::lockdown::lockdown;
use airlock_sandbox::role::{Paths, Role};
use airlock_service::{init_logging, load_config};
use clap::Parser;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Environment variable naming the owner authorization id.
const AUTHORIZATION_ID_ENV: &str = "AIRLOCK_RETRY_AUTHORIZATION_ID";
/// Connections served at once; more wait in the kernel backlog.
const MAX_CONNECTIONS: usize = 256;

/// Owner-controlled retry-extension API for airlock tasks.
///
/// Grants a FAILED task whose attempts are exhausted exactly one more
/// attempt, bound by compare-and-swap to the status, revision, attempts and
/// verification hash the owner saw. Requests need `Authorization: Bearer
/// <token>`; the token is read from --token-file (under systemd:
/// $CREDENTIALS_DIRECTORY/control-token). The owner authorization id comes
/// from the environment variable AIRLOCK_RETRY_AUTHORIZATION_ID, else from
/// [retry] authorization_id. The extension itself is made by the supervisor
/// (org.airlock.Retry1 on the system bus, reserved for [retry] user).
#[derive(Debug, Parser)]
#[command(
    name = "airlock-retryd",
    version,
    about,
    long_about,
    after_help = "Environment:\n  AIRLOCK_LOG                     log filter (default: info)\n  AIRLOCK_RETRY_AUTHORIZATION_ID  the owner authorization id (over [retry] authorization_id)\n  CREDENTIALS_DIRECTORY           set by systemd: the token is its control-token\n  DBUS_SYSTEM_BUS_ADDRESS         the system bus, when --bus-address is not given\n  LISTEN_FDS                      set by systemd: the listening socket"
)]
struct Args {
    /// Configuration file (the [retry] section is used).
    #[arg(long, value_name = "PATH", default_value = airlock_config::DEFAULT_PATH)]
    config: PathBuf,
    /// D-Bus address of the supervisor's bus [default: the system bus].
    #[arg(long, value_name = "ADDRESS")]
    bus_address: Option<String>,
    /// Listen on this address instead of a socket passed by systemd
    /// [default without one: [retry] listen].
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// The bearer token file [default: $CREDENTIALS_DIRECTORY/control-token,
    /// else [retry] token_file].
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Seconds a client may take to send its request headers.
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    header_timeout: u64,
    /// Seconds a client may take to send its request body.
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    body_timeout: u64,
    /// Seconds a connection may stay open in all.
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    connection_timeout: u64,
}

fn token_path(args: &Args, config: &Config) -> PathBuf {
    if let Some(p) = &args.token_file {
        return p.clone();
    }
    match std::env::var_os("CREDENTIALS_DIRECTORY") {
        Some(dir) => PathBuf::from(dir).join("control-token"),
        None => config.retry.token_file.clone(),
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    init_logging();
    // Everything is opened first, then the process confines itself, and
    // only then does the runtime start its threads.
    let opened = match open(&args) {
        Ok(o) => o,
        Err(e) => return refuse(&e),
    };
    let confined = match confine() {
        Ok(report) => report,
        Err(e) => return refuse(&e),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return refuse(&Error::with(Code::INTERNAL, e.to_string())),
    };
    match runtime.block_on(run(args, opened, confined)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => refuse(&e),
    }
}

/// What retryd opens before it confines itself.
struct Opened {
    authorization_id: String,
    token: token::ControlToken,
    listener: std::net::TcpListener,
}

fn open(args: &Args) -> Result<Opened, Error> {
    let config = load_config(&args.config)?;
    let configured_id = std::env::var(AUTHORIZATION_ID_ENV)
        .ok()
        .or_else(|| config.retry.authorization_id.clone());
    let authorization_id = check_configured_authorization_id(configured_id.as_deref())?;
    let token = token::ControlToken::load(&token_path(args, &config))?;
    let listener = listener(args, &config)?;
    Ok(Opened {
        authorization_id,
        token,
        listener,
    })
}

/// retryd's lockdown (`Role::Retryd` in airlock_sandbox::role): the token
/// and the listening socket are open; no path of the configuration stays
/// reachable. The bus is connected after it (Landlock, at the ABI
/// requested, does not check connect(2) to the bus socket).
fn confine() -> Result<String, Error> {
    let report = lockdown(Role::Retryd, &Paths::new())
        .map_err(|e| Error::with(e.code(), format!("lockdown: {e}")))?;
    Ok(report.to_string())
}

fn refuse(e: &Error) -> ExitCode {
    tracing::error!("refusing to run: {e}");
    eprintln!("airlock-retryd: {e}");
    ExitCode::from(e.code.exit_code())
}

async fn run(args: Args, opened: Opened, confined: String) -> Result<(), Error> {
    let Opened {
        authorization_id,
        token,
        listener,
    } = opened;
    let listener = TcpListener::from_std(listener)
        .map_err(|e| Error::with(Code::RUNTIME_UNAVAILABLE, e.to_string()))?;
    // The bus connection comes last: the supervisor may start after us
    // (socket activation); each request reaches it afresh by name.
    let supervisor = Supervisor::connect(args.bus_address.as_deref()).await?;
    let local = listener
        .local_addr()
        .map_err(|e| Error::with(Code::RUNTIME_UNAVAILABLE, e.to_string()))?;
    let state = Arc::new(http::State {
        supervisor,
        redactor: token.redactor(),
        token,
        authorization_id,
        body_timeout: Duration::from_secs(args.body_timeout),
    });
    // The first line stays the address (what tests and admins look for).
    tracing::info!("airlock-retryd listening on {local}");
    tracing::info!("{confined}");
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]);

    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let header_timeout = Duration::from_secs(args.header_timeout);
    let connection_timeout = Duration::from_secs(args.connection_timeout);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| Error::with(Code::INTERNAL, e.to_string()))?;
    loop {
        let permit = tokio::select! {
            p = Arc::clone(&slots).acquire_owned() => p.map_err(|e| Error::with(Code::INTERNAL, e.to_string()))?,
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    continue;
                }
            },
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
        };
        let state = Arc::clone(&state);
        tokio::spawn(async move {
            let _permit = permit;
            let service =
                hyper::service::service_fn(move |req| http::serve(req, Arc::clone(&state), peer));
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .keep_alive(true);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            if tokio::time::timeout(connection_timeout, conn)
                .await
                .is_err()
            {
                tracing::info!(%peer, "connection closed at its time limit");
            }
        });
    }
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
    tracing::info!("stopping: waiting for requests in flight");
    let all = u32::try_from(MAX_CONNECTIONS).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(Duration::from_secs(10), slots.acquire_many(all)).await;
    Ok(())
}

/// The listening socket: `--listen ADDR`, else the one systemd passed, else
/// `[retry] listen`.
fn listener(args: &Args, config: &Config) -> Result<std::net::TcpListener, Error> {
    let unavailable = |e: std::io::Error| Error::with(Code::RUNTIME_UNAVAILABLE, e.to_string());
    let listener = if let Some(addr) = args.listen {
        std::net::TcpListener::bind(addr).map_err(unavailable)?
    } else {
        let mut fds = listenfd::ListenFd::from_env();
        match fds.take_tcp_listener(0).map_err(unavailable)? {
            Some(std) => std,
            None => std::net::TcpListener::bind(config.retry.listen).map_err(|e| {
                Error::with(
                    Code::RUNTIME_UNAVAILABLE,
                    format!("[retry] listen {}: {e}", config.retry.listen),
                )
            })?,
        }
    };
    listener.set_nonblocking(true).map_err(unavailable)?;
    Ok(listener)
}

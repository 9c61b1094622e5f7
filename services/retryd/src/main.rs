//! airlock-retryd: the owner's one lever on an exhausted task.
//!
//! `POST /v1/tasks/{task_id}/retry-extension` raises a FAILED task's
//! `max_attempts` by exactly one, under compare-and-swap and idempotency
//! rules enforced in one SQLite transaction (`airlock_store`). It is the
//! only code in airlock that raises an attempt budget.
//!
//! Start-up refuses to serve unless AIRLOCK_RETRY_AUTHORIZATION_ID is a
//! valid id and the control token file is a regular file of at least 32
//! characters. It listens on a socket passed by systemd (LISTEN_FDS) or on
//! `--listen ADDR`.

mod http;
mod token;

use airlock_proto::retry::check_configured_authorization_id;
use airlock_proto::{Code, Error};
use airlock_store::tasks::TaskStore;
use clap::Parser;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
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
/// from the environment variable AIRLOCK_RETRY_AUTHORIZATION_ID.
#[derive(Debug, Parser)]
#[command(name = "airlock-retryd", version, about, long_about)]
struct Args {
    /// The supervisor's task database.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "/var/lib/airlock/tasks.sqlite3"
    )]
    db: PathBuf,
    /// Listen on this address instead of a socket passed by systemd.
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// The bearer token file [default: $CREDENTIALS_DIRECTORY/control-token,
    /// else /etc/airlock/retry-control.token].
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

fn token_path(args: &Args) -> PathBuf {
    if let Some(p) = &args.token_file {
        return p.clone();
    }
    match std::env::var_os("CREDENTIALS_DIRECTORY") {
        Some(dir) => PathBuf::from(dir).join("control-token"),
        None => PathBuf::from("/etc/airlock/retry-control.token"),
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        // A closed stderr must not take the service down with it.
        .log_internal_errors(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return refuse(&Error::with(Code::INTERNAL, e.to_string())),
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => refuse(&e),
    }
}

fn refuse(e: &Error) -> ExitCode {
    tracing::error!("refusing to run: {e}");
    eprintln!("airlock-retryd: {e}");
    ExitCode::from(e.code.exit_code())
}

async fn run(args: Args) -> Result<(), Error> {
    let authorization_id =
        check_configured_authorization_id(std::env::var(AUTHORIZATION_ID_ENV).ok().as_deref())?;
    let token = token::ControlToken::load(&token_path(&args))?;
    let store = TaskStore::open(&args.db).map_err(|e| Error::with(e.code(), e.to_string()))?;
    let listener = listener(&args).await?;
    let local = listener
        .local_addr()
        .map_err(|e| Error::with(Code::RUNTIME_UNAVAILABLE, e.to_string()))?;
    let state = Arc::new(http::State {
        store: Arc::new(Mutex::new(store)),
        token,
        authorization_id,
        body_timeout: Duration::from_secs(args.body_timeout),
    });
    tracing::info!("airlock-retryd listening on {local}");
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

async fn listener(args: &Args) -> Result<TcpListener, Error> {
    let unavailable = |e: std::io::Error| Error::with(Code::RUNTIME_UNAVAILABLE, e.to_string());
    if let Some(addr) = args.listen {
        return TcpListener::bind(addr).await.map_err(unavailable);
    }
    let mut fds = listenfd::ListenFd::from_env();
    match fds.take_tcp_listener(0).map_err(unavailable)? {
        Some(std) => {
            std.set_nonblocking(true).map_err(unavailable)?;
            TcpListener::from_std(std).map_err(unavailable)
        }
        None => Err(Error::with(
            Code::RUNTIME_UNAVAILABLE,
            "no socket passed by systemd (LISTEN_FDS) and no --listen ADDR given",
        )),
    }
}

//! airlock-egress: the allowlisting CONNECT proxy of verification
//! environments' setup phase (see the library's documentation for the
//! protocol and the trust domain).
//!
//! Open, then confine, then run: the UNIX socket is bound (mode 0660,
//! `--group` if given) and the `--allow-uid` users resolved; then the
//! process confines itself (`Role::Egress` of airlock_sandbox::role),
//! before its runtime starts any thread; then it serves.

use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use airlock_egress::server::{self, Sessions, Settings};
use airlock_proto::{Code, Error};
use airlock_sandbox::lockdown::lockdown;
use airlock_sandbox::role::{Paths, Role};
use airlock_service::init_logging;
use clap::Parser;
use tokio::net::UnixListener;
use tokio::sync::Semaphore;

/// Allowlisting egress proxy for the setup phase of airlock's verification
/// environments.
///
/// Listens on a UNIX socket. Each connection starts with one JSON preamble
/// line (session, task_id, allow: ["host:port", ...], limits), then one
/// `CONNECT host:port HTTP/1.1` request to one of the allowed entries. The
/// proxy resolves the name itself, refuses loopback, private, link-local,
/// multicast, documentation and other special-purpose addresses, connects
/// to a checked address and splices the tunnel, bounded per session in
/// bytes, seconds and connections. Plain-HTTP requests are refused (405).
/// Every decision is logged with its code (EGRESS_*).
///
/// Routes (--config, the administrator's): per host pattern, `direct`
/// (public addresses only, the default), `addresses` (the ranges the name
/// may resolve to: an internal mirror), or `via` a parent proxy, whose
/// credential is read from $CREDENTIALS_DIRECTORY (systemd's
/// LoadCredential=).
#[derive(Debug, Parser)]
#[command(
    name = "airlock-egress",
    version,
    about,
    long_about,
    after_help = "Environment:\n  AIRLOCK_LOG            log filter (default: info)\n  NOTIFY_SOCKET          set by systemd: readiness is reported there\n  CREDENTIALS_DIRECTORY  set by systemd's LoadCredential=: the parent proxies' credentials a route names"
)]
struct Args {
    /// The UNIX socket to listen on (a stale socket there is replaced).
    #[arg(long, value_name = "PATH")]
    socket: PathBuf,
    /// Group of the socket (mode 0660) [default: the daemon's own group].
    #[arg(long, value_name = "NAME")]
    group: Option<String>,
    /// A uid (or user name) whose processes may connect; repeatable, at
    /// least one.
    #[arg(long = "allow-uid", value_name = "UID", required = true)]
    allow_uid: Vec<String>,
    /// A TCP port the proxy connects to; repeatable. An allow entry on
    /// another port is refused (EGRESS_PORT_NOT_ALLOWED).
    #[arg(long = "connect-port", value_name = "PORT", default_values_t = [443u16],
          value_parser = clap::value_parser!(u16).range(1..))]
    connect_port: Vec<u16>,
    /// Seconds a client may take to send its preamble and request head.
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    head_timeout: u64,
    /// Seconds a name may take to resolve.
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    resolve_timeout: u64,
    /// Seconds each connect to an address may take.
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    connect_timeout: u64,
    /// Clients served at once; more wait in the kernel backlog.
    #[arg(long, value_name = "N", default_value_t = 256,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    max_clients: u32,
    /// The routes file (TOML, `[[route]]` tables: host, and one of
    /// direct = true, addresses = [CIDR, ...], via = "http://HOST:PORT"
    /// with credential = NAME) [default: none, every host direct].
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    init_logging();
    let opened = match open(&args) {
        Ok(o) => o,
        Err(e) => return refuse(&e),
    };
    let confined = match confine(&args, &opened) {
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

/// What the daemon opens before it confines itself.
struct Opened {
    listener: std::os::unix::net::UnixListener,
    allow_uids: Vec<u32>,
    routes: airlock_egress::route::Config,
}

fn config_error(m: String) -> Error {
    Error::with(Code::CONFIG_INVALID, m)
}

fn open(args: &Args) -> Result<Opened, Error> {
    // The routes and their credentials first: nothing is bound for a
    // configuration that does not hold.
    let mut routes = match &args.config {
        None => airlock_egress::route::Config::default(),
        Some(path) => airlock_egress::route::Config::load(path).map_err(config_error)?,
    };
    let credentials = std::env::var_os("CREDENTIALS_DIRECTORY").map(PathBuf::from);
    routes
        .load_credentials(credentials.as_deref())
        .map_err(config_error)?;
    let mut allow_uids = Vec::new();
    for u in &args.allow_uid {
        let uid = match u.parse::<u32>() {
            Ok(uid) => uid,
            Err(_) => nix::unistd::User::from_name(u)
                .map_err(|e| config_error(format!("--allow-uid {u}: {e}")))?
                .ok_or_else(|| config_error(format!("--allow-uid {u}: no such user")))?
                .uid
                .as_raw(),
        };
        allow_uids.push(uid);
    }
    let gid = match &args.group {
        None => None,
        Some(g) => Some(
            nix::unistd::Group::from_name(g)
                .map_err(|e| config_error(format!("--group {g}: {e}")))?
                .ok_or_else(|| config_error(format!("--group {g}: no such group")))?
                .gid,
        ),
    };
    let unavailable = |what: &str, e: std::io::Error| {
        Error::with(
            Code::RUNTIME_UNAVAILABLE,
            format!("{what} {}: {e}", args.socket.display()),
        )
    };
    // Replace a stale socket (never another kind of file).
    if let Ok(meta) = std::fs::symlink_metadata(&args.socket) {
        use std::os::unix::fs::FileTypeExt as _;
        if !meta.file_type().is_socket() {
            return Err(config_error(format!(
                "--socket {}: exists and is not a socket",
                args.socket.display()
            )));
        }
        std::fs::remove_file(&args.socket).map_err(|e| unavailable("removing", e))?;
    }
    // Born 0660 at most: no moment in which another user could connect.
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o117));
    let bound = std::os::unix::net::UnixListener::bind(&args.socket);
    nix::sys::stat::umask(old);
    let listener = bound.map_err(|e| unavailable("binding", e))?;
    if let Some(gid) = gid {
        std::os::unix::fs::chown(&args.socket, None, Some(gid.as_raw()))
            .map_err(|e| unavailable("chown", e))?;
    }
    std::fs::set_permissions(&args.socket, std::fs::Permissions::from_mode(0o660))
        .map_err(|e| unavailable("chmod", e))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| unavailable("listening on", e))?;
    Ok(Opened {
        listener,
        allow_uids,
        routes,
    })
}

/// Port of DNS over TCP, which the resolver falls back to for a truncated
/// answer. Landlock allows it; a CONNECT to it is still refused unless
/// `--connect-port` lists it.
const DNS_TCP_PORT: u16 = 53;

/// The lockdown (`Role::Egress`): the socket is bound; Landlock allows TCP
/// connect(2) to the `--connect-port` ports, the parent proxies' and the
/// resolver's only.
fn confine(args: &Args, opened: &Opened) -> Result<String, Error> {
    let mut ports = args.connect_port.clone();
    ports.extend(opened.routes.parent_ports());
    ports.push(DNS_TCP_PORT);
    ports.sort_unstable();
    ports.dedup();
    let paths = Paths::new().with_tcp_connect(ports);
    let report = lockdown(Role::Egress, &paths)
        .map_err(|e| Error::with(e.code(), format!("lockdown: {e}")))?;
    Ok(report.to_string())
}

fn refuse(e: &Error) -> ExitCode {
    tracing::error!("refusing to run: {e}");
    eprintln!("airlock-egress: {e}");
    ExitCode::from(e.code.exit_code())
}

async fn run(args: Args, opened: Opened, confined: String) -> Result<(), Error> {
    let internal = |e: std::io::Error| Error::with(Code::INTERNAL, e.to_string());
    let listener = UnixListener::from_std(opened.listener)
        .map_err(|e| Error::with(Code::RUNTIME_UNAVAILABLE, e.to_string()))?;
    let settings = Arc::new(Settings {
        allow_uids: opened.allow_uids,
        connect_ports: args.connect_port.clone(),
        head_timeout: Duration::from_secs(args.head_timeout),
        resolve_timeout: Duration::from_secs(args.resolve_timeout),
        connect_timeout: Duration::from_secs(args.connect_timeout),
        routes: opened.routes,
    });
    let sessions = Arc::new(Sessions::default());
    // The first line names the socket (what tests and admins look for).
    tracing::info!("airlock-egress listening on {}", args.socket.display());
    tracing::info!("{confined}");
    for r in settings.routes.routes() {
        tracing::info!("route: {}", r.label());
    }
    for w in settings.routes.warnings() {
        tracing::warn!("{w}");
    }
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]);

    let slots = Arc::new(Semaphore::new(args.max_clients as usize));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(internal)?;
    loop {
        let permit = tokio::select! {
            p = Arc::clone(&slots).acquire_owned() => p.map_err(|e| Error::with(Code::INTERNAL, e.to_string()))?,
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
        };
        let settings = Arc::clone(&settings);
        let sessions = Arc::clone(&sessions);
        tokio::spawn(async move {
            let _permit = permit;
            server::serve(stream, settings, sessions).await;
        });
    }
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
    tracing::info!("stopping: open tunnels are closed");
    Ok(())
}

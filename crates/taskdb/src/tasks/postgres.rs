//! The PostgreSQL engine: one task queue shared by the supervisors of
//! several hosts.
//!
//! What makes it safe for several writers on several machines:
//!
//! - **One clock.** Store time is the server's `clock_timestamp()` (through
//!   the schema function `airlock_clock_ms()`), never below the persisted
//!   high-water mark. No client's wall clock enters a lease; a client's
//!   monotonic clock only keeps store time moving after the server's clock
//!   is set back (the floor of [`Anchor`]: the store time of this client's
//!   last write plus the monotonic time since), so a rewind cannot extend
//!   a lease. A forward step of the server's clock is taken as it is:
//!   leases end early by at most the step (see [`airlock_sqlite::clock`]).
//! - **Claims lock their row.** `SELECT … FOR UPDATE SKIP LOCKED` finds the
//!   oldest claimable task and locks it; the rules move it and write it
//!   back fenced by its revision, in the same transaction. Concurrent
//!   claimers on any host skip each other's rows instead of waiting, and a
//!   row is claimed by exactly one.
//! - **Fenced writes.** Every write after a claim names in its `WHERE` the
//!   revision it read and, for renewals and results, the attempt, lease
//!   epoch, token hash and an unexpired lease; for decisions the attempt,
//!   epoch and VERIFYING. Zero rows changed means the lease (or the race)
//!   was lost. Rows are also locked `FOR UPDATE` when read in a write, so
//!   the refusal can name why.
//! - **A sweeper over `FOR UPDATE SKIP LOCKED` rows**, each written back
//!   fenced by its revision: several supervisors may sweep at once; each
//!   expired lease is ended once, and a row some other transaction holds (a
//!   renewal in flight) is left for the next pass.
//! - **No policy here.** This engine finds rows and persists them; which
//!   state a task moves to is decided once, by the store's one writer
//!   (`TaskRow::advance`), for both engines.
//! - **Append-only at the database level.** Triggers abort UPDATE, DELETE
//!   and TRUNCATE on `events`, `results`, `task_retry_extensions` and
//!   `task_decisions`, and
//!   the supervisor's role (a member of `airlock_supervisor`) holds only
//!   SELECT and INSERT on them.
//! - **Wake-ups across hosts.** A trigger on `tasks` sends
//!   `NOTIFY airlock_task_changed` with the task, state and revision;
//!   [`PgListener`] receives them on every host.
//!
//! A transaction runs at READ COMMITTED. A serialisation failure, a
//! deadlock or a lost insert race (two hosts submitting one idempotency key
//! at once) rolls back and runs the same closure again, at most
//! [`MAX_TRIES`] times; the loser then sees the winner's row. When the
//! server cannot be reached every call fails with `STORE_UNAVAILABLE` and
//! nothing is half-written (a transaction commits whole or not at all); the
//! next call reconnects.

use super::row::{COLUMNS, RawEvent, RawRow, TaskRow};
use super::tx::{
    Backend, ExtensionCas, Guard, NewDecision, NewEvent, NewExtension, NewResolution, NewResult,
    NewTask, StoredDecision, StoredExtension, Tx,
};
use super::{Store, TaskState};
use airlock_proto::{Code, Error};
use airlock_sqlite::clock::{Anchor, Clock, SystemClock};
use airlock_sqlite::error::{StoreError, StoreResult};
use postgres::config::Host;
use postgres::error::SqlState;
use postgres::types::ToSql;
use postgres::{Client, NoTls, Statement};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// How often a transaction that lost a race to another writer is run again.
pub const MAX_TRIES: u32 = 5;

/// The channel the task trigger notifies.
pub const CHANNEL: &str = "airlock_task_changed";

/// The group role whose members may use the store (and nothing more).
pub const SUPERVISOR_ROLE: &str = "airlock_supervisor";

/// What `airlock_schema.kind` says in an airlock task store.
const KIND: &str = "airlock-tasks";

/// Advisory lock key that serialises migrations ("AIRT").
const MIGRATION_LOCK: i64 = 0x4149_5254;

/// How the connection to PostgreSQL is secured, from configuration
/// (`supervisor.database_ca_file`, `supervisor.database_allow_plaintext`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PgSecurity {
    /// The CA certificates (PEM) a server's certificate must chain to;
    /// required with `sslmode=verify-full` or `verify-ca`, refused without.
    pub ca_file: Option<PathBuf>,
    /// Allow a connection without TLS to a host that is not loopback.
    pub allow_plaintext: bool,
}

/// What the URL's `sslmode` asks for (the modes this airlock accepts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsMode {
    /// No TLS (no `sslmode`, or `sslmode=disable`): a UNIX socket, loopback,
    /// or a network allowed by `supervisor.database_allow_plaintext`.
    Plaintext,
    /// TLS; the server's certificate must chain to the CA file (any name).
    VerifyCa,
    /// TLS; the certificate must chain to the CA file and name the host.
    VerifyFull,
}

/// The TLS side of a location: its mode, the CA file and the connector
/// made from it (at parse time: the file is read once, at start).
#[derive(Clone)]
struct Tls {
    mode: TlsMode,
    ca_file: PathBuf,
    connector: tokio_postgres_rustls::MakeRustlsConnect,
}

/// Where and as whom to connect: a `postgresql://` URL without a password
/// (the password, when one is needed, is given apart by
/// [`PgLocation::with_password`]: airlock reads it from a systemd
/// credential, never from the configuration file), and how the
/// connection is secured ([`PgSecurity`]).
#[derive(Clone)]
pub struct PgLocation {
    config: postgres::Config,
    shown: String,
    tls: Option<Tls>,
}

impl std::fmt::Debug for PgLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgLocation")
            .field("url", &self.shown)
            .field("password", &self.config.get_password().map(|_| "(set)"))
            .field("tls", &self.tls_mode())
            .field("ca_file", &self.tls.as_ref().map(|t| &t.ca_file))
            .finish()
    }
}

impl std::fmt::Display for PgLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

/// True when `s` names a PostgreSQL database rather than a file.
pub fn is_url(s: &str) -> bool {
    s.starts_with("postgresql://") || s.starts_with("postgres://")
}

/// Splits the `sslmode` parameters off a URL's query: the URL without
/// them (for the client library, which knows neither `verify-full` nor
/// `verify-ca`) and the last value given.
fn split_sslmode(url: &str) -> (String, Option<String>) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_owned(), None);
    };
    let mut mode = None;
    let kept: Vec<&str> = query
        .split('&')
        .filter(|kv| match kv.split_once('=') {
            Some(("sslmode", v)) => {
                mode = Some(v.to_owned());
                false
            }
            _ => true,
        })
        .collect();
    if kept.is_empty() {
        (base.to_owned(), mode)
    } else {
        (format!("{base}?{}", kept.join("&")), mode)
    }
}

/// True for a host name or address that never leaves this machine.
fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Reads the CA certificates of `path` (PEM) into a root store.
fn load_roots(path: &Path) -> Result<rustls::RootCertStore, Error> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let invalid = |why: String| {
        Error::with(
            Code::CONFIG_INVALID,
            format!("supervisor.database_ca_file {}: {why}", path.display()),
        )
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| invalid(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| invalid(e.to_string()))?;
    let mut roots = rustls::RootCertStore::empty();
    let (added, ignored) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(invalid(format!(
            "no usable CA certificate in it ({ignored} unparsable); it must hold PEM \"BEGIN CERTIFICATE\" blocks"
        )));
    }
    Ok(roots)
}

/// A verifier that checks the chain to the CA file and the signatures,
/// but not the server's name (`sslmode=verify-ca`). webpki checks the
/// chain before the name, so a name mismatch is reported only for a chain
/// that verified.
#[derive(Debug)]
struct ChainOnly(Arc<rustls::client::WebPkiServerVerifier>);

impl rustls::client::danger::ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &rustls::pki_types::CertificateDer<'_>,
        intermediates: &[rustls::pki_types::CertificateDer<'_>],
        server_name: &rustls::pki_types::ServerName<'_>,
        ocsp_response: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        use rustls::CertificateError;
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(rustls::client::danger::ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// The TLS client for `mode`, trusting exactly the CAs of `ca_file`.
fn tls_client(mode: TlsMode, ca_file: &Path) -> Result<Tls, Error> {
    let roots = load_roots(ca_file)?;
    let internal = |e: rustls::Error| Error::with(Code::INTERNAL, format!("TLS set-up: {e}"));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(internal)?;
    let config = match mode {
        TlsMode::VerifyCa => {
            let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .map_err(|e| Error::with(Code::INTERNAL, format!("TLS set-up: {e}")))?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(ChainOnly(inner)))
                .with_no_client_auth()
        }
        _ => builder.with_root_certificates(roots).with_no_client_auth(),
    };
    Ok(Tls {
        mode,
        ca_file: ca_file.to_owned(),
        connector: tokio_postgres_rustls::MakeRustlsConnect::new(config),
    })
}

impl PgLocation {
    /// [`PgLocation::parse_with`] with the default security: no CA file,
    /// no plaintext beyond loopback.
    pub fn parse(url: &str) -> Result<Self, Error> {
        PgLocation::parse_with(url, &PgSecurity::default())
    }

    /// Parses a `postgresql://` (or `postgres://`) URL. Refused, with
    /// `CONFIG_INVALID`, before any connection is tried: anything else, a
    /// URL that carries a password, a URL without a user or a database
    /// name; `sslmode=require`, `prefer` and `allow` (they encrypt
    /// without authenticating the server, so whoever is on the path can
    /// present any certificate); `sslmode=verify-full` or `verify-ca`
    /// without `security.ca_file`, or with a UNIX-socket host; a CA file
    /// without either mode; and a connection without TLS to a host that
    /// is not loopback unless `security.allow_plaintext`.
    pub fn parse_with(url: &str, security: &PgSecurity) -> Result<Self, Error> {
        let invalid = |why: String| Error::with(Code::CONFIG_INVALID, why);
        if !is_url(url) {
            return Err(invalid(format!("{url:?} is not a postgresql:// URL")));
        }
        let (bare, sslmode) = split_sslmode(url);
        let mut config =
            postgres::Config::from_str(&bare).map_err(|e| invalid(format!("database URL: {e}")))?;
        let shown = url.to_owned();
        if config.get_password().is_some() {
            return Err(invalid(
                "the database URL carries a password; give it as the airlock-database-password credential instead (docs/postgresql.md)".into(),
            ));
        }
        if config.get_user().is_none() {
            return Err(invalid("the database URL names no user".into()));
        }
        if config.get_dbname().is_none() {
            return Err(invalid("the database URL names no database".into()));
        }
        let mode = match sslmode.as_deref() {
            None | Some("disable") => TlsMode::Plaintext,
            Some("verify-full") => TlsMode::VerifyFull,
            Some("verify-ca") => TlsMode::VerifyCa,
            Some(m @ ("require" | "prefer" | "allow")) => {
                return Err(invalid(format!(
                    "sslmode={m} is refused: it encrypts without authenticating the server (any certificate is accepted, so whoever is on the path can answer); use sslmode=verify-full with supervisor.database_ca_file (docs/postgresql.md)"
                )));
            }
            Some(m) => {
                return Err(invalid(format!(
                    "sslmode={m:?}: expected verify-full, verify-ca or disable"
                )));
            }
        };
        if config.get_hosts().is_empty() {
            config.host_path("/run/postgresql");
        }
        let unix = config
            .get_hosts()
            .iter()
            .any(|h| matches!(h, Host::Unix(_)));
        let tls = match (mode, &security.ca_file) {
            (TlsMode::Plaintext, None) => None,
            (TlsMode::Plaintext, Some(file)) => {
                return Err(invalid(format!(
                    "supervisor.database_ca_file is set ({}) but the database URL asks for no TLS: add sslmode=verify-full (or verify-ca) to the URL, or unset the file",
                    file.display()
                )));
            }
            (_, None) => {
                return Err(invalid(format!(
                    "sslmode={} needs supervisor.database_ca_file: the CA certificates (PEM) the server's certificate must chain to",
                    sslmode.unwrap_or_default()
                )));
            }
            (_, Some(_)) if unix => {
                return Err(invalid(format!(
                    "sslmode={} with a UNIX-socket host: PostgreSQL speaks no TLS on a socket (its file's permissions guard it); drop sslmode, or name a TCP host",
                    sslmode.unwrap_or_default()
                )));
            }
            (mode, Some(file)) => Some(tls_client(mode, file)?),
        };
        if tls.is_none() && !security.allow_plaintext {
            let remote = config
                .get_hosts()
                .iter()
                .filter_map(|h| match h {
                    Host::Tcp(name) => Some(name.clone()),
                    Host::Unix(_) => None,
                })
                .chain(config.get_hostaddrs().iter().map(|a| a.to_string()))
                .find(|h| !is_loopback(h));
            if let Some(host) = remote {
                return Err(invalid(format!(
                    "the database URL reaches {host} without TLS, and {host} is not loopback: the password and every task would cross the network in the clear, to a server nobody authenticated; use sslmode=verify-full with supervisor.database_ca_file (docs/postgresql.md), or a UNIX socket, or (only on a network you trust end to end) set supervisor.database_allow_plaintext = true"
                )));
            }
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(10));
        }
        if config.get_application_name().is_none() {
            config.application_name("airlock");
        }
        config
            .keepalives_idle(Duration::from_secs(30))
            .ssl_mode(if tls.is_some() {
                // With a verifying connector: TLS or no session at all.
                postgres::config::SslMode::Require
            } else {
                postgres::config::SslMode::Disable
            })
            // Bounded calls: no statement, lock wait or idle transaction
            // holds the store for long.
            .options(
                "-c statement_timeout=30000 -c lock_timeout=30000 \
                 -c idle_in_transaction_session_timeout=60000",
            );
        Ok(PgLocation { config, shown, tls })
    }

    /// How the connection is secured.
    pub fn tls_mode(&self) -> TlsMode {
        self.tls.as_ref().map_or(TlsMode::Plaintext, |t| t.mode)
    }

    /// The same location with a password.
    pub fn with_password(mut self, password: &[u8]) -> Self {
        self.config.password(password);
        self
    }

    /// The role it connects as.
    pub fn user(&self) -> &str {
        self.config.get_user().unwrap_or_default()
    }

    /// The database name.
    pub fn dbname(&self) -> &str {
        self.config.get_dbname().unwrap_or_default()
    }

    /// True when any host is reached over TCP (IP sockets needed).
    pub fn uses_tcp(&self) -> bool {
        self.config
            .get_hosts()
            .iter()
            .any(|h| matches!(h, Host::Tcp(_)))
            || !self.config.get_hostaddrs().is_empty()
    }

    /// The TCP ports it may connect to (5432 when the URL names none).
    pub fn ports(&self) -> Vec<u16> {
        let ports = self.config.get_ports();
        if ports.is_empty() {
            vec![5432]
        } else {
            ports.to_vec()
        }
    }

    /// The UNIX socket directories it connects through.
    pub fn socket_dirs(&self) -> Vec<PathBuf> {
        self.config
            .get_hosts()
            .iter()
            .filter_map(|h| match h {
                Host::Unix(p) => Some(p.clone()),
                Host::Tcp(_) => None,
            })
            .collect()
    }

    fn connect(&self) -> StoreResult<Client> {
        let connected = match &self.tls {
            Some(tls) => self.config.connect(tls.connector.clone()),
            None => self.config.connect(NoTls),
        };
        connected.map_err(|e| {
            pg_error(
                &format!("connecting to {} as {}", self.shown, self.user()),
                e,
            )
        })
    }
}

/// A PostgreSQL error, shown with the server's own words (the client
/// library's `Display` says only "db error").
#[derive(Debug)]
struct PgFailure(postgres::Error);

impl std::fmt::Display for PgFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.as_db_error() {
            Some(db) => {
                write!(
                    f,
                    "{} {}: {}",
                    db.severity(),
                    db.code().code(),
                    db.message()
                )?;
                if let Some(detail) = db.detail() {
                    write!(f, " ({detail})")?;
                }
                Ok(())
            }
            None => {
                write!(f, "{}", self.0)?;
                let mut source = std::error::Error::source(&self.0);
                while let Some(e) = source {
                    write!(f, ": {e}")?;
                    source = e.source();
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for PgFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// Wraps a PostgreSQL error. Every failure is `STORE_UNAVAILABLE` (the
/// catalogue has no finer code that a caller could act on differently);
/// the message keeps the server's words.
fn pg_error(context: &str, e: postgres::Error) -> StoreError {
    StoreError::Engine {
        context: context.to_owned(),
        code: Code::STORE_UNAVAILABLE,
        source: Box::new(PgFailure(e)),
    }
}

/// The SQLSTATE of a wrapped PostgreSQL error.
fn sqlstate(e: &StoreError) -> Option<SqlState> {
    match e {
        StoreError::Engine { source, .. } => source
            .downcast_ref::<PgFailure>()
            .and_then(|e| e.0.code().cloned()),
        _ => None,
    }
}

/// A conflict with another writer that a fresh run of the transaction
/// resolves.
fn retryable(e: &StoreError) -> bool {
    matches!(
        sqlstate(e),
        Some(SqlState::T_R_SERIALIZATION_FAILURE)
            | Some(SqlState::T_R_DEADLOCK_DETECTED)
            | Some(SqlState::UNIQUE_VIOLATION)
    )
}

/// A live session: the client and the statements prepared on it.
struct Session {
    client: Client,
    statements: HashMap<&'static str, Statement>,
}

/// The PostgreSQL engine: a location and one session, opened on demand
/// and again after the server went away.
pub struct PgBackend {
    location: PgLocation,
    session: Mutex<Option<Session>>,
    /// Only its monotonic reading is used (the server owns wall time).
    clock: Arc<dyn Clock>,
    /// The store time of this client's last write, on the monotonic clock.
    anchor: Anchor,
}

impl std::fmt::Debug for PgBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgBackend")
            .field("location", &self.location)
            .finish_non_exhaustive()
    }
}

impl Store<PgBackend> {
    /// Connects to the task store at `location`. A schema older than this
    /// build is migrated first when the role may (it owns the schema, or
    /// the database is empty and it may create tables); otherwise the open
    /// fails with `SCHEMA_VERSION_UNSUPPORTED`, naming
    /// `airlock-supervisor --migrate`. A newer schema is
    /// `SCHEMA_VERSION_UNSUPPORTED`, a database that is not an airlock task
    /// store `STORE_UNAVAILABLE`.
    pub fn open(location: &PgLocation) -> StoreResult<Self> {
        Store::<PgBackend>::open_with_clock(location, Arc::new(SystemClock))
    }

    /// [`Store::open`] with an injected clock, of which only the monotonic
    /// reading is used (tests: time passing apart from the server's clock).
    pub fn open_with_clock(location: &PgLocation, clock: Arc<dyn Clock>) -> StoreResult<Self> {
        let mut client = location.connect()?;
        migrate(&mut client, location.user())?;
        Ok(Store {
            backend: PgBackend {
                location: location.clone(),
                session: Mutex::new(Some(Session {
                    client,
                    statements: HashMap::new(),
                })),
                clock,
                anchor: Anchor::default(),
            },
        })
    }
}

impl PgBackend {
    /// Runs `f` on a live session, connecting first when there is none.
    /// When `f` fails because the session died before anything was sent
    /// (`fresh` false: a session kept from an earlier call), it reconnects
    /// and runs `f` once more; a session that died during `f` is dropped,
    /// so the next call starts afresh.
    fn with_session<T>(&self, mut f: impl FnMut(&mut Session) -> StoreResult<T>) -> StoreResult<T> {
        let mut slot = self.session.lock().unwrap_or_else(PoisonError::into_inner);
        let mut reconnected = false;
        loop {
            if slot.as_ref().is_none_or(|s| s.client.is_closed()) {
                *slot = Some(Session {
                    client: self.location.connect()?,
                    statements: HashMap::new(),
                });
                reconnected = true;
            }
            let Some(session) = slot.as_mut() else {
                return Err(Error::with(Code::INTERNAL, "no database session").into());
            };
            let out = f(session);
            if session.client.is_closed() {
                *slot = None;
                if out.is_err() && !reconnected {
                    // The server went away since the last call (a restart,
                    // a dropped connection): the session was dead before
                    // this call, so try once on a new one.
                    reconnected = true;
                    continue;
                }
            }
            return out;
        }
    }
}

/// Prepares (once per session) and returns a statement.
fn prepared(
    client: &mut impl postgres::GenericClient,
    cache: &mut HashMap<&'static str, Statement>,
    sql: &'static str,
) -> StoreResult<Statement> {
    if let Some(s) = cache.get(sql) {
        return Ok(s.clone());
    }
    let s = client
        .prepare(sql)
        .map_err(|e| pg_error("preparing a statement", e))?;
    cache.insert(sql, s.clone());
    Ok(s)
}

/// Builds a `&'static str` SQL statement once.
macro_rules! sql {
    ($($arg:tt)*) => {{
        static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| format!($($arg)*));
        SQL.as_str()
    }};
}

fn from_row(r: &postgres::Row) -> Result<RawRow, postgres::Error> {
    Ok(RawRow {
        task_id: r.try_get(0)?,
        status: r.try_get(1)?,
        attempt: r.try_get(2)?,
        max_attempts: r.try_get(3)?,
        revision: r.try_get(4)?,
        lease_epoch: r.try_get(5)?,
        claimed_by: r.try_get(6)?,
        lease_token_hash: r.try_get(7)?,
        lease_expires_at: r.try_get(8)?,
        verification_json: r.try_get(9)?,
        result_json: r.try_get(10)?,
        binding_json: r.try_get(11)?,
        plan_json: r.try_get(12)?,
        envelope_json: r.try_get(13)?,
        execution_digest: r.try_get(14)?,
        plan_digest: r.try_get(15)?,
        idempotency_key: r.try_get(16)?,
        submission_sha256: r.try_get(17)?,
        created_at_ms: r.try_get(18)?,
        updated_at_ms: r.try_get(19)?,
    })
}

fn rows_of(what: &str, rows: Vec<postgres::Row>) -> StoreResult<Vec<RawRow>> {
    rows.iter()
        .map(|r| from_row(r).map_err(|e| pg_error(what, e)))
        .collect()
}

/// The store's time: the server's clock, never below the high-water mark
/// nor below `$1`, this client's monotonic floor ([`Anchor::floor`]).
const CLOCK_SQL: &str = "SELECT GREATEST(airlock_clock_ms(), high_water_ms, $1::bigint) \
     FROM store_clock WHERE id = 1";

/// Moves the high-water mark up to `$1` unless another transaction holds
/// it right now (it is moving it to about the same time): the mark never
/// makes writers wait for each other.
const ADVANCE_SQL: &str = "UPDATE store_clock SET high_water_ms = $1 WHERE id = \
     (SELECT id FROM store_clock WHERE id = 1 AND high_water_ms < $1 FOR UPDATE SKIP LOCKED)";

impl Backend for PgBackend {
    fn write<T>(
        &mut self,
        what: &str,
        f: &mut dyn FnMut(&mut dyn Tx) -> StoreResult<T>,
    ) -> StoreResult<T> {
        let mut tries = 0;
        loop {
            tries += 1;
            let out = self.with_session(|session| {
                let Session { client, statements } = session;
                let mut tx = client
                    .transaction()
                    .map_err(|e| pg_error(&format!("starting {what}"), e))?;
                let clock = prepared(&mut tx, statements, CLOCK_SQL)?;
                let mono = self.clock.mono_ms();
                let floor = self.anchor.floor(mono);
                let now: i64 = tx
                    .query_one(&clock, &[&floor])
                    .and_then(|r| r.try_get(0))
                    .map_err(|e| pg_error("reading the store clock", e))?;
                let advance = prepared(&mut tx, statements, ADVANCE_SQL)?;
                tx.execute(&advance, &[&now])
                    .map_err(|e| pg_error("advancing the clock high-water mark", e))?;
                let out = f(&mut PgTx {
                    tx: &mut tx,
                    statements,
                    now,
                })?;
                tx.commit()
                    .map_err(|e| pg_error(&format!("committing {what}"), e))?;
                self.anchor.observe(now, mono);
                Ok(out)
            });
            match out {
                Err(e) if tries < MAX_TRIES && retryable(&e) => continue,
                other => return other,
            }
        }
    }

    fn now_ms(&self) -> StoreResult<i64> {
        self.with_session(|s| {
            let stmt = prepared(&mut s.client, &mut s.statements, CLOCK_SQL)?;
            let floor = self.anchor.floor(self.clock.mono_ms());
            s.client
                .query_one(&stmt, &[&floor])
                .and_then(|r| r.try_get(0))
                .map_err(|e| pg_error("reading the store clock", e))
        })
    }

    fn get(&self, task_id: &str) -> StoreResult<Option<RawRow>> {
        self.with_session(|s| {
            let sql = sql!("SELECT {COLUMNS} FROM tasks WHERE task_id = $1");
            let stmt = prepared(&mut s.client, &mut s.statements, sql)?;
            let rows = s
                .client
                .query(&stmt, &[&task_id])
                .map_err(|e| pg_error("loading a task", e))?;
            Ok(rows_of("loading a task", rows)?.into_iter().next())
        })
    }

    fn list(
        &self,
        state: Option<TaskState>,
        after_task_id: Option<&str>,
        limit: u32,
    ) -> StoreResult<Vec<RawRow>> {
        self.with_session(|s| {
            // Byte order, as SQLite sorts, whatever the database's collation.
            let sql = sql!(
                "SELECT {COLUMNS} FROM tasks WHERE ($1::text IS NULL OR status = $1) \
                 AND ($2::text IS NULL OR task_id COLLATE \"C\" > $2) \
                 ORDER BY task_id COLLATE \"C\" LIMIT $3"
            );
            let stmt = prepared(&mut s.client, &mut s.statements, sql)?;
            let rows = s
                .client
                .query(
                    &stmt,
                    &[
                        &state.map(TaskState::as_str),
                        &after_task_id,
                        &i64::from(limit),
                    ],
                )
                .map_err(|e| pg_error("listing tasks", e))?;
            rows_of("listing tasks", rows)
        })
    }

    fn counts(&self) -> StoreResult<Vec<(String, i64)>> {
        self.with_session(|s| {
            let stmt = prepared(
                &mut s.client,
                &mut s.statements,
                "SELECT status, COUNT(*) FROM tasks GROUP BY status",
            )?;
            s.client
                .query(&stmt, &[])
                .and_then(|rows| {
                    rows.iter()
                        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
                        .collect()
                })
                .map_err(|e| pg_error("summarising tasks", e))
        })
    }

    fn events(
        &self,
        task_id: Option<&str>,
        after_event_id: i64,
        limit: u32,
    ) -> StoreResult<Vec<RawEvent>> {
        self.with_session(|s| {
            let stmt = prepared(
                &mut s.client,
                &mut s.statements,
                "SELECT id, task_id, at_ms, actor_kind, actor_uid, actor_name, action, outcome, \
                 code, payload_json FROM events WHERE ($1::text IS NULL OR task_id = $1) \
                 AND id > $2 ORDER BY id LIMIT $3",
            )?;
            s.client
                .query(&stmt, &[&task_id, &after_event_id, &i64::from(limit)])
                .and_then(|rows| {
                    rows.iter()
                        .map(|r| {
                            Ok(RawEvent {
                                id: r.try_get(0)?,
                                task_id: r.try_get(1)?,
                                at_ms: r.try_get(2)?,
                                actor_kind: r.try_get(3)?,
                                actor_uid: r.try_get(4)?,
                                actor_name: r.try_get(5)?,
                                action: r.try_get(6)?,
                                outcome: r.try_get(7)?,
                                code: r.try_get(8)?,
                                payload_json: r.try_get(9)?,
                            })
                        })
                        .collect()
                })
                .map_err(|e| pg_error("reading events", e))
        })
    }

    fn last_event_id(&self) -> StoreResult<i64> {
        self.with_session(|s| {
            s.client
                .query_one("SELECT COALESCE(MAX(id), 0)::bigint FROM events", &[])
                .and_then(|r| r.try_get(0))
                .map_err(|e| pg_error("reading the newest event id", e))
        })
    }

    fn integrity_check(&self) -> StoreResult<()> {
        self.with_session(|s| {
            let corrupt = |why: String| -> StoreError { Error::with(Code::STORE_CORRUPT, why).into() };
            let row = s
                .client
                .query_opt("SELECT kind, version FROM airlock_schema WHERE id = 1", &[])
                .map_err(|e| pg_error("reading the schema version", e))?
                .ok_or_else(|| corrupt("airlock_schema is empty".into()))?;
            let kind: String = row.get(0);
            let version: i64 = row.get(1);
            if kind != KIND || version != latest_version() {
                return Err(corrupt(format!(
                    "schema {kind:?} version {version}, expected {KIND:?} version {}",
                    latest_version()
                )));
            }
            let enabled: Vec<String> = s
                .client
                .query(
                    "SELECT t.tgname::text FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid \
                     WHERE NOT t.tgisinternal AND t.tgenabled <> 'D' \
                     AND c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())",
                    &[],
                )
                .map_err(|e| pg_error("listing triggers", e))?
                .iter()
                .map(|r| r.get(0))
                .collect();
            let missing: Vec<&str> = TRIGGERS
                .iter()
                .copied()
                .filter(|t| !enabled.iter().any(|e| e == t))
                .collect();
            if !missing.is_empty() {
                return Err(corrupt(format!(
                    "triggers missing or disabled: {}",
                    missing.join(", ")
                )));
            }
            Ok(())
        })
    }
}

/// A READ COMMITTED transaction at one store time.
struct PgTx<'a, 'c> {
    tx: &'a mut postgres::Transaction<'c>,
    statements: &'a mut HashMap<&'static str, Statement>,
    now: i64,
}

impl PgTx<'_, '_> {
    fn query(
        &mut self,
        what: &str,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> StoreResult<Vec<postgres::Row>> {
        let stmt = prepared(self.tx, self.statements, sql)?;
        self.tx.query(&stmt, params).map_err(|e| pg_error(what, e))
    }

    fn execute(
        &mut self,
        what: &str,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> StoreResult<u64> {
        let stmt = prepared(self.tx, self.statements, sql)?;
        self.tx
            .execute(&stmt, params)
            .map_err(|e| pg_error(what, e))
    }

    fn one_task(
        &mut self,
        what: &str,
        sql: &'static str,
        value: &str,
    ) -> StoreResult<Option<TaskRow>> {
        let rows = self.query(what, sql, &[&value])?;
        rows_of(what, rows)?
            .into_iter()
            .next()
            .map(RawRow::into_row)
            .transpose()
    }
}

fn epoch_i64(epoch: u64) -> StoreResult<i64> {
    i64::try_from(epoch).map_err(|_| Error::with(Code::INTERNAL, "lease epoch overflow").into())
}

const UPDATE_SET: &str = "UPDATE tasks SET status = $1, attempt = $2, max_attempts = $3, \
     revision = $4, lease_epoch = $5, claimed_by = $6, lease_token_hash = $7, \
     lease_expires_at = $8, verification_json = $9, result_json = $10, plan_json = $11, \
     envelope_json = $12, execution_digest = $13, plan_digest = $14, updated_at_ms = $15 \
     WHERE task_id = $16 AND revision = $17";

impl Tx for PgTx<'_, '_> {
    fn now(&self) -> i64 {
        self.now
    }

    fn load(&mut self, task_id: &str) -> StoreResult<Option<TaskRow>> {
        let sql = sql!("SELECT {COLUMNS} FROM tasks WHERE task_id = $1 FOR UPDATE");
        self.one_task("loading a task", sql, task_id)
    }

    fn load_by_key(&mut self, key: &str) -> StoreResult<Option<TaskRow>> {
        let sql = sql!("SELECT {COLUMNS} FROM tasks WHERE idempotency_key = $1 FOR UPDATE");
        self.one_task("loading a task by idempotency key", sql, key)
    }

    fn insert_task(&mut self, t: &NewTask<'_>) -> StoreResult<()> {
        let now = self.now;
        self.execute(
            "inserting a task",
            "INSERT INTO tasks (task_id, status, attempt, max_attempts, revision, lease_epoch, \
             binding_json, plan_json, envelope_json, execution_digest, plan_digest, \
             idempotency_key, submission_sha256, created_at_ms, updated_at_ms, repository) \
             VALUES ($1, $12, 0, $2, 1, 0, $3, $4, $5, $6, $7, $8, $9, $10, $10, $11)",
            &[
                &t.task_id,
                &i64::from(t.max_attempts),
                &t.binding_json,
                &t.plan_json,
                &t.envelope_json,
                &t.execution_digest,
                &t.plan_digest,
                &t.idempotency_key,
                &t.submission_sha256,
                &now,
                &t.repository,
                &t.status.as_str(),
            ],
        )?;
        Ok(())
    }

    fn update(&mut self, row: &TaskRow, read_revision: i64, guard: Guard<'_>) -> StoreResult<bool> {
        let attempt = i64::from(row.attempt);
        let max_attempts = i64::from(row.max_attempts);
        let lease_epoch = row.lease_epoch_i64()?;
        let status = row.status().as_str();
        let now = self.now;
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![
            &status,
            &attempt,
            &max_attempts,
            &row.revision,
            &lease_epoch,
            &row.claimed_by,
            &row.lease_token_hash,
            &row.lease_expires_at,
            &row.verification_json,
            &row.result_json,
            &row.plan_json,
            &row.envelope_json,
            &row.execution_digest,
            &row.plan_digest,
            &row.updated_at_ms,
            &row.task_id,
            &read_revision,
        ];
        let (guard_attempt, guard_epoch, guard_text);
        let sql: &'static str = match guard {
            Guard::Revision => UPDATE_SET,
            Guard::Lease {
                attempt,
                lease_epoch,
                token_hash,
            } => {
                guard_attempt = i64::from(attempt);
                guard_epoch = epoch_i64(lease_epoch)?;
                guard_text = token_hash.to_owned();
                params.extend([
                    &guard_attempt as &(dyn ToSql + Sync),
                    &guard_epoch,
                    &guard_text,
                    &now,
                ]);
                sql!(
                    "{UPDATE_SET} AND status = 'RUNNING' AND attempt = $18 AND lease_epoch = $19 \
                     AND lease_token_hash = $20 AND lease_expires_at > $21"
                )
            }
            Guard::Attempt {
                state,
                attempt,
                lease_epoch,
            } => {
                guard_attempt = i64::from(attempt);
                guard_epoch = epoch_i64(lease_epoch)?;
                guard_text = state.as_str().to_owned();
                params.extend([
                    &guard_text as &(dyn ToSql + Sync),
                    &guard_attempt,
                    &guard_epoch,
                ]);
                sql!("{UPDATE_SET} AND status = $18 AND attempt = $19 AND lease_epoch = $20")
            }
        };
        let changed = self.execute("updating a task", sql, &params)?;
        Ok(changed == 1)
    }

    fn next_claimable(&mut self, repositories: Option<&[String]>) -> StoreResult<Option<TaskRow>> {
        let repositories: Option<Vec<&str>> =
            repositories.map(|r| r.iter().map(String::as_str).collect());
        let sql = sql!(
            "SELECT {COLUMNS} FROM tasks WHERE status = 'QUEUED' AND attempt < max_attempts \
             AND ($1::text[] IS NULL OR repository = ANY ($1::text[])) \
             ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED"
        );
        let rows = self.query("finding a claimable task", sql, &[&repositories])?;
        rows_of("finding a claimable task", rows)?
            .into_iter()
            .next()
            .map(RawRow::into_row)
            .transpose()
    }

    fn queued(&mut self) -> StoreResult<Vec<TaskRow>> {
        let sql = sql!(
            "SELECT {COLUMNS} FROM tasks WHERE status = 'QUEUED' ORDER BY seq \
             FOR UPDATE SKIP LOCKED"
        );
        let rows = self.query("finding queued tasks", sql, &[])?;
        rows_of("finding queued tasks", rows)?
            .into_iter()
            .map(RawRow::into_row)
            .collect()
    }

    fn expired_leases(&mut self) -> StoreResult<Vec<TaskRow>> {
        let now = self.now;
        let sql = sql!(
            "SELECT {COLUMNS} FROM tasks WHERE status = 'RUNNING' \
             AND (lease_expires_at IS NULL OR lease_expires_at <= $1) \
             ORDER BY seq FOR UPDATE SKIP LOCKED"
        );
        let rows = self.query("finding expired leases", sql, &[&now])?;
        rows_of("finding expired leases", rows)?
            .into_iter()
            .map(RawRow::into_row)
            .collect()
    }

    fn result_sha256(&mut self, task_id: &str, key: &str) -> StoreResult<Option<String>> {
        let rows = self.query(
            "looking up a result",
            "SELECT result_sha256 FROM results WHERE task_id = $1 AND idempotency_key = $2",
            &[&task_id, &key],
        )?;
        rows.first()
            .map(|r| r.try_get(0))
            .transpose()
            .map_err(|e| pg_error("looking up a result", e))
    }

    fn insert_result(&mut self, r: &NewResult<'_>) -> StoreResult<()> {
        let now = self.now;
        self.execute(
            "storing a result",
            "INSERT INTO results (task_id, idempotency_key, attempt, lease_epoch, \
             result_sha256, result_json, received_at_ms) VALUES ($1, $2, $3, $4, $5, $6, $7)",
            &[
                &r.task_id,
                &r.idempotency_key,
                &i64::from(r.attempt),
                &r.lease_epoch,
                &r.result_sha256,
                &r.result_json,
                &now,
            ],
        )?;
        Ok(())
    }

    fn append_event(&mut self, e: &NewEvent<'_>) -> StoreResult<()> {
        let now = self.now;
        self.execute(
            "appending an event",
            "INSERT INTO events (task_id, at_ms, actor_kind, actor_uid, actor_name, action, \
             outcome, code, payload_json) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            &[
                &e.task_id,
                &now,
                &e.actor.kind.as_str(),
                &e.actor.uid.map(i64::from),
                &e.actor.name,
                &e.action,
                &e.outcome.as_str(),
                &e.code.map(Code::as_str),
                &e.payload_json,
            ],
        )?;
        Ok(())
    }

    fn extension(&mut self, task_id: &str, key: &str) -> StoreResult<Option<StoredExtension>> {
        let rows = self.query(
            "looking up a retry extension",
            "SELECT request_sha256, authorization_id, previous_verification_sha256, \
             next_max_attempts, applied_revision FROM task_retry_extensions \
             WHERE task_id = $1 AND idempotency_key = $2",
            &[&task_id, &key],
        )?;
        rows.first()
            .map(|r| {
                Ok(StoredExtension {
                    request_sha256: r.try_get(0)?,
                    authorization_id: r.try_get(1)?,
                    previous_verification_sha256: r.try_get(2)?,
                    next_max_attempts: r.try_get(3)?,
                    applied_revision: r.try_get(4)?,
                })
            })
            .transpose()
            .map_err(|e| pg_error("looking up a retry extension", e))
    }

    fn apply_extension(&mut self, cas: &ExtensionCas<'_>) -> StoreResult<u64> {
        let now = self.now;
        self.execute(
            "applying a retry extension",
            "UPDATE tasks SET status = $10, max_attempts = $1, revision = $2, \
             claimed_by = NULL, lease_token_hash = NULL, lease_expires_at = NULL, \
             updated_at_ms = $3 \
             WHERE task_id = $4 AND status = $5 AND revision = $6 AND attempt = $7 \
             AND max_attempts = $8 AND claimed_by IS NOT DISTINCT FROM $9 \
             AND lease_token_hash IS NULL AND lease_expires_at IS NULL",
            &[
                &cas.next_max_attempts,
                &cas.applied_revision,
                &now,
                &cas.task_id,
                &cas.expected_status,
                &cas.expected_revision,
                &cas.expected_attempt,
                &cas.expected_max_attempts,
                &cas.previous_claimed_by,
                &cas.status.as_str(),
            ],
        )
    }

    fn agent_record(&mut self, name: &str) -> StoreResult<Option<String>> {
        let rows = self.query(
            "reading an agent's record",
            "SELECT record_json FROM agents WHERE name = $1",
            &[&name],
        )?;
        rows.first()
            .map(|r| r.try_get(0))
            .transpose()
            .map_err(|e| pg_error("reading an agent's record", e))
    }

    fn put_agent_record(&mut self, name: &str, record_json: &str) -> StoreResult<()> {
        let now = self.now;
        self.execute(
            "storing an agent's record",
            "INSERT INTO agents (name, record_json, updated_at_ms) VALUES ($1, $2, $3) \
             ON CONFLICT (name) DO UPDATE SET record_json = excluded.record_json, \
             updated_at_ms = excluded.updated_at_ms",
            &[&name, &record_json, &now],
        )?;
        Ok(())
    }

    fn insert_extension(&mut self, e: &NewExtension<'_>) -> StoreResult<()> {
        let now = self.now;
        self.execute(
            "recording a retry extension",
            "INSERT INTO task_retry_extensions (task_id, idempotency_key, request_sha256, \
             authorization_id, previous_verification_sha256, previous_max_attempts, \
             next_max_attempts, expected_revision, applied_revision, created_at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            &[
                &e.task_id,
                &e.idempotency_key,
                &e.request_sha256,
                &e.authorization_id,
                &e.previous_verification_sha256,
                &e.previous_max_attempts,
                &e.next_max_attempts,
                &e.expected_revision,
                &e.applied_revision,
                &now,
            ],
        )?;
        Ok(())
    }

    fn decision(&mut self, task_id: &str, key: &str) -> StoreResult<Option<StoredDecision>> {
        let rows = self.query(
            "looking up a decision",
            "SELECT request_sha256, outcome_json FROM task_decisions \
             WHERE task_id = $1 AND idempotency_key = $2",
            &[&task_id, &key],
        )?;
        rows.first()
            .map(|r| {
                Ok(StoredDecision {
                    request_sha256: r.try_get(0)?,
                    outcome_json: r.try_get(1)?,
                })
            })
            .transpose()
            .map_err(|e| pg_error("looking up a decision", e))
    }

    fn case_json(&mut self, task_id: &str, attempt: Option<u32>) -> StoreResult<Option<String>> {
        let attempt = attempt.map(i64::from);
        let rows = self.query(
            "reading a reconciliation case",
            "SELECT case_json FROM reconciliations WHERE task_id = $1 \
             AND ($2::bigint IS NULL OR attempt = $2) ORDER BY attempt DESC LIMIT 1",
            &[&task_id, &attempt],
        )?;
        rows.first()
            .map(|r| r.try_get(0))
            .transpose()
            .map_err(|e| pg_error("reading a reconciliation case", e))
    }

    fn put_case(
        &mut self,
        task_id: &str,
        attempt: u32,
        status: &str,
        case_json: &str,
    ) -> StoreResult<()> {
        let now = self.now;
        self.execute(
            "storing a reconciliation case",
            "INSERT INTO reconciliations (task_id, attempt, status, case_json, updated_at_ms) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (task_id, attempt) DO UPDATE SET \
             status = excluded.status, case_json = excluded.case_json, \
             updated_at_ms = excluded.updated_at_ms",
            &[&task_id, &i64::from(attempt), &status, &case_json, &now],
        )?;
        Ok(())
    }

    fn cases(
        &mut self,
        status: Option<&str>,
        after_task_id: Option<&str>,
        limit: u32,
    ) -> StoreResult<Vec<String>> {
        let rows = self.query(
            "listing reconciliation cases",
            "SELECT case_json FROM reconciliations WHERE ($1::text IS NULL OR status = $1) \
             AND ($2::text IS NULL OR task_id > $2) ORDER BY task_id, attempt LIMIT $3",
            &[&status, &after_task_id, &i64::from(limit)],
        )?;
        rows.iter()
            .map(|r| r.try_get(0))
            .collect::<Result<Vec<String>, _>>()
            .map_err(|e| pg_error("listing reconciliation cases", e))
    }

    fn resolution(&mut self, task_id: &str, key: &str) -> StoreResult<Option<StoredDecision>> {
        let rows = self.query(
            "looking up a resolution",
            "SELECT request_sha256, outcome_json FROM reconciliation_resolutions \
             WHERE task_id = $1 AND idempotency_key = $2",
            &[&task_id, &key],
        )?;
        rows.first()
            .map(|r| {
                Ok(StoredDecision {
                    request_sha256: r.try_get(0)?,
                    outcome_json: r.try_get(1)?,
                })
            })
            .transpose()
            .map_err(|e| pg_error("looking up a resolution", e))
    }

    fn insert_resolution(&mut self, r: &NewResolution<'_>) -> StoreResult<()> {
        let now = self.now;
        self.execute(
            "recording a resolution",
            "INSERT INTO reconciliation_resolutions (task_id, idempotency_key, request_sha256, \
             attempt, resolution, outcome_json, actor_name, created_at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            &[
                &r.task_id,
                &r.idempotency_key,
                &r.request_sha256,
                &r.attempt,
                &r.resolution,
                &r.outcome_json,
                &r.actor_name,
                &now,
            ],
        )?;
        Ok(())
    }

    fn insert_decision(&mut self, d: &NewDecision<'_>) -> StoreResult<()> {
        let now = self.now;
        self.execute(
            "recording a decision",
            "INSERT INTO task_decisions (task_id, idempotency_key, request_sha256, decision, \
             attempt, result_sha256, applied_revision, outcome_json, actor_name, created_at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            &[
                &d.task_id,
                &d.idempotency_key,
                &d.request_sha256,
                &d.decision,
                &d.attempt,
                &d.result_sha256,
                &d.applied_revision,
                &d.outcome_json,
                &d.actor_name,
                &now,
            ],
        )?;
        Ok(())
    }
}

// --- schema -----------------------------------------------------------------

/// One schema step of the PostgreSQL store.
#[derive(Debug)]
pub struct PgMigration {
    /// `airlock_schema.version` after this step.
    pub version: i64,
    /// SQL run inside the migration transaction.
    pub sql: &'static str,
}

/// Every schema step, oldest first.
pub const MIGRATIONS: &[PgMigration] = &[
    PgMigration {
        version: 1,
        sql: V1,
    },
    PgMigration {
        version: 2,
        sql: V2,
    },
    PgMigration {
        version: 3,
        sql: V3,
    },
    PgMigration {
        version: 4,
        sql: V4,
    },
];

/// Version 4: reconciliation cases and their resolutions (the SQLite
/// store's version 5). Existing rows are unchanged; the supervisor's role
/// may rewrite a case but only read and insert resolutions.
const V4: &str = r#"
CREATE TABLE reconciliations (
    task_id       text   NOT NULL REFERENCES tasks (task_id),
    attempt       bigint NOT NULL,
    status        text   NOT NULL CHECK (status IN ('open', 'adopting', 'adopted', 'failed')),
    case_json     text   NOT NULL,
    updated_at_ms bigint NOT NULL,
    PRIMARY KEY (task_id, attempt)
);
CREATE INDEX reconciliations_by_status ON reconciliations (status, task_id);
CREATE TABLE reconciliation_resolutions (
    task_id         text   NOT NULL REFERENCES tasks (task_id),
    idempotency_key text   NOT NULL,
    request_sha256  text   NOT NULL,
    attempt         bigint NOT NULL,
    resolution      text   NOT NULL,
    outcome_json    text   NOT NULL,
    actor_name      text   NOT NULL,
    created_at_ms   bigint NOT NULL,
    PRIMARY KEY (task_id, idempotency_key)
);
CREATE TRIGGER reconciliation_resolutions_append_only BEFORE UPDATE OR DELETE
    ON reconciliation_resolutions FOR EACH ROW EXECUTE FUNCTION airlock_append_only();
CREATE TRIGGER reconciliation_resolutions_no_truncate BEFORE TRUNCATE
    ON reconciliation_resolutions FOR EACH STATEMENT EXECUTE FUNCTION airlock_append_only();
REVOKE ALL ON reconciliations, reconciliation_resolutions FROM PUBLIC;
GRANT SELECT, INSERT, UPDATE ON reconciliations TO airlock_supervisor;
GRANT SELECT, INSERT ON reconciliation_resolutions TO airlock_supervisor;
"#;

/// Version 3: the planner agents' restart-policy records (the SQLite
/// store's version 4), one row per agent name, rewritten on every change;
/// every change is also an event. Existing rows are unchanged.
const V3: &str = r#"
CREATE TABLE agents (
    name          text   PRIMARY KEY,
    record_json   text   NOT NULL,
    updated_at_ms bigint NOT NULL
);
REVOKE ALL ON agents FROM PUBLIC;
GRANT SELECT, INSERT, UPDATE ON agents TO airlock_supervisor;
"#;

/// The schema version this build expects.
pub fn latest_version() -> i64 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

/// The triggers the schema relies on (checked by `integrity_check`).
const TRIGGERS: &[&str] = &[
    "events_append_only",
    "events_no_truncate",
    "results_append_only",
    "results_no_truncate",
    "task_retry_extensions_append_only",
    "task_retry_extensions_no_truncate",
    "task_decisions_append_only",
    "task_decisions_no_truncate",
    "reconciliation_resolutions_append_only",
    "reconciliation_resolutions_no_truncate",
    "tasks_notify",
];

/// Version 2: admin decisions (Verify, CancelTask) in their own
/// append-only slot (the SQLite store's version 3). Existing rows are
/// unchanged; the supervisor's role may only read and insert decisions.
const V2: &str = r#"
CREATE TABLE task_decisions (
    task_id          text   NOT NULL REFERENCES tasks (task_id),
    idempotency_key  text   NOT NULL,
    request_sha256   text   NOT NULL,
    decision         text   NOT NULL,
    attempt          bigint NOT NULL,
    result_sha256    text,
    applied_revision bigint NOT NULL,
    outcome_json     text   NOT NULL,
    actor_name       text   NOT NULL,
    created_at_ms    bigint NOT NULL,
    PRIMARY KEY (task_id, idempotency_key)
);
CREATE TRIGGER task_decisions_append_only BEFORE UPDATE OR DELETE ON task_decisions
    FOR EACH ROW EXECUTE FUNCTION airlock_append_only();
CREATE TRIGGER task_decisions_no_truncate BEFORE TRUNCATE ON task_decisions
    FOR EACH STATEMENT EXECUTE FUNCTION airlock_append_only();
REVOKE ALL ON task_decisions FROM PUBLIC;
GRANT SELECT, INSERT ON task_decisions TO airlock_supervisor;
"#;

/// Version 1: the SQLite store's version-2 schema in PostgreSQL's types,
/// plus the server clock, the notification trigger and the grants.
///
/// Integers are `bigint` throughout. The append-only triggers fire for
/// every role, the owner included; the supervisor's role additionally has
/// no UPDATE, DELETE or TRUNCATE privilege on those tables, so even a
/// disabled trigger would not let it rewrite history.
const V1: &str = r#"
CREATE TABLE store_clock (
    id            bigint PRIMARY KEY CHECK (id = 1),
    high_water_ms bigint NOT NULL
);
INSERT INTO store_clock (id, high_water_ms) VALUES (1, 0);

-- The one clock every host's leases are judged by: the server's.
CREATE FUNCTION airlock_clock_ms() RETURNS bigint LANGUAGE sql VOLATILE
    AS $$ SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint $$;

CREATE TABLE tasks (
    seq               bigserial PRIMARY KEY,
    task_id           text   NOT NULL UNIQUE,
    status            text   NOT NULL CHECK (status IN
                          ('QUEUED', 'RUNNING', 'VERIFYING', 'SUCCEEDED', 'FAILED', 'CANCELLED')),
    attempt           bigint NOT NULL CHECK (attempt >= 0),
    max_attempts      bigint NOT NULL CHECK (max_attempts BETWEEN 1 AND 50),
    revision          bigint NOT NULL CHECK (revision >= 1),
    lease_epoch       bigint NOT NULL CHECK (lease_epoch >= 0),
    claimed_by        text,
    lease_token_hash  text,
    lease_expires_at  bigint,
    verification_json text,
    result_json       text,
    binding_json      text   NOT NULL,
    plan_json         text   NOT NULL,
    envelope_json     text   NOT NULL,
    execution_digest  text   NOT NULL,
    plan_digest       text   NOT NULL,
    idempotency_key   text   NOT NULL UNIQUE,
    submission_sha256 text   NOT NULL,
    created_at_ms     bigint NOT NULL,
    updated_at_ms     bigint NOT NULL,
    repository        text   NOT NULL,
    CHECK (attempt <= max_attempts)
);
CREATE INDEX tasks_by_status ON tasks (status, seq);
CREATE INDEX tasks_claimable ON tasks (repository, seq) WHERE status = 'QUEUED';
CREATE INDEX tasks_leased ON tasks (lease_expires_at) WHERE status = 'RUNNING';

CREATE TABLE results (
    task_id         text   NOT NULL REFERENCES tasks (task_id),
    idempotency_key text   NOT NULL,
    attempt         bigint NOT NULL,
    lease_epoch     bigint NOT NULL,
    result_sha256   text   NOT NULL,
    result_json     text   NOT NULL,
    received_at_ms  bigint NOT NULL,
    PRIMARY KEY (task_id, idempotency_key)
);

CREATE TABLE task_retry_extensions (
    task_id                      text   NOT NULL,
    idempotency_key              text   NOT NULL,
    request_sha256               text   NOT NULL,
    authorization_id             text   NOT NULL,
    previous_verification_sha256 text   NOT NULL,
    previous_max_attempts        bigint NOT NULL,
    next_max_attempts            bigint NOT NULL,
    expected_revision            bigint NOT NULL,
    applied_revision             bigint NOT NULL,
    created_at_ms                bigint NOT NULL,
    PRIMARY KEY (task_id, idempotency_key)
);

CREATE TABLE events (
    id           bigserial PRIMARY KEY,
    task_id      text,
    at_ms        bigint NOT NULL,
    actor_kind   text   NOT NULL,
    actor_uid    bigint,
    actor_name   text   NOT NULL,
    action       text   NOT NULL,
    outcome      text   NOT NULL CHECK (outcome IN ('allowed', 'denied')),
    code         text,
    payload_json text   NOT NULL,
    CHECK ((outcome = 'denied') = (code IS NOT NULL))
);
CREATE INDEX events_by_task ON events (task_id, id);

CREATE FUNCTION airlock_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only', TG_TABLE_NAME;
END
$$;
CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION airlock_append_only();
CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION airlock_append_only();
CREATE TRIGGER results_append_only BEFORE UPDATE OR DELETE ON results
    FOR EACH ROW EXECUTE FUNCTION airlock_append_only();
CREATE TRIGGER results_no_truncate BEFORE TRUNCATE ON results
    FOR EACH STATEMENT EXECUTE FUNCTION airlock_append_only();
CREATE TRIGGER task_retry_extensions_append_only BEFORE UPDATE OR DELETE ON task_retry_extensions
    FOR EACH ROW EXECUTE FUNCTION airlock_append_only();
CREATE TRIGGER task_retry_extensions_no_truncate BEFORE TRUNCATE ON task_retry_extensions
    FOR EACH STATEMENT EXECUTE FUNCTION airlock_append_only();

-- Every committed change wakes the supervisors of every host.
CREATE FUNCTION airlock_task_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('airlock_task_changed', json_build_object(
        'task_id', NEW.task_id, 'state', NEW.status, 'revision', NEW.revision,
        'repository', NEW.repository)::text);
    RETURN NULL;
END
$$;
CREATE TRIGGER tasks_notify AFTER INSERT OR UPDATE ON tasks
    FOR EACH ROW EXECUTE FUNCTION airlock_task_changed();

-- The supervisors' role: what the store does, and nothing more.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'airlock_supervisor') THEN
        CREATE ROLE airlock_supervisor NOLOGIN;
    END IF;
END
$$;
REVOKE ALL ON store_clock, tasks, results, task_retry_extensions, events, airlock_schema
    FROM PUBLIC;
GRANT SELECT ON airlock_schema TO airlock_supervisor;
GRANT SELECT, UPDATE ON store_clock TO airlock_supervisor;
GRANT SELECT, INSERT, UPDATE ON tasks TO airlock_supervisor;
GRANT SELECT, INSERT ON results, task_retry_extensions, events TO airlock_supervisor;
GRANT USAGE ON SEQUENCE tasks_seq_seq, events_id_seq TO airlock_supervisor;
"#;

/// Brings the schema to [`latest_version`], under an advisory lock so that
/// supervisors starting together migrate once. `user` names the role in
/// the error when it may not.
pub fn migrate(client: &mut Client, user: &str) -> StoreResult<()> {
    let mut tx = client
        .transaction()
        .map_err(|e| pg_error("starting the schema check", e))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .map_err(|e| pg_error("locking the schema", e))?;
    let exists: bool = tx
        .query_one("SELECT to_regclass('airlock_schema') IS NOT NULL", &[])
        .and_then(|r| r.try_get(0))
        .map_err(|e| pg_error("looking for the schema", e))?;
    let version = if exists {
        let row = tx
            .query_opt("SELECT kind, version FROM airlock_schema WHERE id = 1", &[])
            .map_err(|e| pg_error("reading the schema version", e))?;
        let (kind, version): (String, i64) = match row {
            Some(r) => (r.get(0), r.get(1)),
            None => (String::new(), -1),
        };
        if kind != KIND {
            return Err(Error::with(
                Code::STORE_UNAVAILABLE,
                format!("the database is not an airlock task store (schema kind {kind:?})"),
            )
            .into());
        }
        version
    } else {
        0
    };
    let latest = latest_version();
    if version > latest {
        return Err(Error::with(
            Code::SCHEMA_VERSION_UNSUPPORTED,
            format!("schema version {version} is newer than this airlock ({latest})"),
        )
        .into());
    }
    if version == latest {
        return tx
            .commit()
            .map_err(|e| pg_error("ending the schema check", e));
    }
    let cannot = |e: postgres::Error| -> StoreError {
        Error::with(
            Code::SCHEMA_VERSION_UNSUPPORTED,
            format!(
                "the schema is at version {version}, this airlock needs {latest}, and role {user:?} cannot migrate it ({}); run `airlock-supervisor --migrate` as the schema's owner (docs/postgresql.md)",
                PgFailure(e)
            ),
        )
        .into()
    };
    if !exists {
        tx.batch_execute(
            "CREATE TABLE airlock_schema (\
                 id integer PRIMARY KEY CHECK (id = 1), kind text NOT NULL, version bigint NOT NULL); \
             INSERT INTO airlock_schema (id, kind, version) VALUES (1, 'airlock-tasks', 0);",
        )
        .map_err(cannot)?;
    }
    for m in MIGRATIONS.iter().filter(|m| m.version > version) {
        tx.batch_execute(m.sql).map_err(cannot)?;
        tx.execute(
            "UPDATE airlock_schema SET version = $1 WHERE id = 1",
            &[&m.version],
        )
        .map_err(cannot)?;
    }
    tx.commit()
        .map_err(|e| pg_error("committing the schema migration", e))
}

/// Connects to `location` and migrates its schema (what
/// `airlock-supervisor --migrate` does, as the schema's owner).
pub fn migrate_at(location: &PgLocation) -> StoreResult<i64> {
    let mut client = location.connect()?;
    migrate(&mut client, location.user())?;
    Ok(latest_version())
}

// --- notifications ----------------------------------------------------------

/// A change to a task, as the database announced it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskChange {
    /// The task.
    pub task_id: String,
    /// Its state after the change.
    pub state: TaskState,
    /// Its revision after the change.
    pub revision: i64,
    /// Its repository.
    pub repository: String,
}

/// A session that LISTENs for task changes made by any host.
pub struct PgListener {
    location: PgLocation,
    client: Option<Client>,
}

impl std::fmt::Debug for PgListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgListener")
            .field("location", &self.location)
            .field("connected", &self.client.is_some())
            .finish()
    }
}

impl PgListener {
    /// A listener on `location`; it connects on the first [`PgListener::wait`].
    pub fn new(location: &PgLocation) -> Self {
        PgListener {
            location: location.clone(),
            client: None,
        }
    }

    /// Waits up to `timeout` for changes; returns those that arrived (none
    /// after a quiet `timeout`). Fails with `STORE_UNAVAILABLE` when the
    /// server cannot be reached; the next call reconnects (changes made
    /// while no session listened are not replayed: listeners poll too).
    pub fn wait(&mut self, timeout: Duration) -> StoreResult<Vec<TaskChange>> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            self.client = None;
            let mut client = self.location.connect()?;
            client
                .batch_execute(&format!("LISTEN {CHANNEL}"))
                .map_err(|e| pg_error("listening for task changes", e))?;
            self.client = Some(client);
        }
        let Some(mut client) = self.client.take() else {
            return Ok(Vec::new());
        };
        use postgres::fallible_iterator::FallibleIterator;
        let mut changes = Vec::new();
        let mut notifications = client.notifications();
        let first = notifications.timeout_iter(timeout).next();
        let waited: Result<(), postgres::Error> = match first {
            Ok(Some(n)) => {
                changes.extend(parse_change(n.payload()));
                // Take what is already queued without waiting again.
                let mut more = notifications.iter();
                loop {
                    match more.next() {
                        Ok(Some(n)) => changes.extend(parse_change(n.payload())),
                        Ok(None) => break Ok(()),
                        Err(e) => break Err(e),
                    }
                }
            }
            Ok(None) => Ok(()),
            Err(e) => Err(e),
        };
        drop(notifications);
        match waited {
            Ok(()) => {
                self.client = Some(client);
                Ok(changes)
            }
            Err(e) => Err(pg_error("waiting for task changes", e)),
        }
    }
}

fn parse_change(payload: &str) -> Option<TaskChange> {
    let v: serde_json::Value = serde_json::from_str(payload).ok()?;
    Some(TaskChange {
        task_id: v["task_id"].as_str()?.to_owned(),
        state: TaskState::parse(v["state"].as_str()?).ok()?,
        revision: v["revision"].as_i64()?,
        repository: v["repository"].as_str().unwrap_or_default().to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_and_passwords_refused() {
        let plaintext = PgSecurity {
            ca_file: None,
            allow_plaintext: true,
        };
        let ok =
            PgLocation::parse_with("postgresql://airlock@db.example/airlock", &plaintext).unwrap();
        assert_eq!((ok.user(), ok.dbname()), ("airlock", "airlock"));
        assert!(ok.uses_tcp());
        let unix = PgLocation::parse("postgresql://airlock@%2Frun%2Fpostgresql/airlock").unwrap();
        assert!(!unix.uses_tcp());
        assert_eq!(unix.socket_dirs(), vec![PathBuf::from("/run/postgresql")]);
        let default_socket = PgLocation::parse("postgresql:///airlock?user=airlock").unwrap();
        assert_eq!(
            default_socket.socket_dirs(),
            vec![PathBuf::from("/run/postgresql")]
        );
        for bad in [
            "postgresql://airlock:secret@db/airlock",
            "postgresql://db/airlock",
            "postgresql://airlock@db",
            "postgresql://airlock@db/airlock?sslmode=require",
            "postgresql://airlock@db/airlock?sslmode=prefer",
            "postgresql://airlock@db/airlock?sslmode=allow",
            "postgresql://airlock@db/airlock?sslmode=verify-full",
            "postgresql://airlock@db/airlock?sslmode=bogus",
            "/var/lib/airlock/tasks.sqlite3",
            "mysql://airlock@db/airlock",
        ] {
            assert_eq!(
                PgLocation::parse_with(bad, &plaintext).unwrap_err().code,
                Code::CONFIG_INVALID,
                "{bad}"
            );
        }
        let with = ok.with_password(b"s3cret");
        assert!(!format!("{with:?}").contains("s3cret"));
        assert!(!with.to_string().contains("s3cret"));
    }

    #[test]
    fn sslmode_is_split_off_and_loopback_is_known() {
        assert_eq!(
            split_sslmode("postgresql://a@h/d?sslmode=verify-full&application_name=x"),
            (
                "postgresql://a@h/d?application_name=x".to_owned(),
                Some("verify-full".to_owned())
            )
        );
        assert_eq!(
            split_sslmode("postgresql://a@h/d?sslmode=disable"),
            ("postgresql://a@h/d".to_owned(), Some("disable".to_owned()))
        );
        assert_eq!(
            split_sslmode("postgresql://a@h/d"),
            ("postgresql://a@h/d".to_owned(), None)
        );
        for host in [
            "127.0.0.1",
            "127.8.9.10",
            "::1",
            "[::1]",
            "localhost",
            "LOCALHOST",
        ] {
            assert!(is_loopback(host), "{host}");
        }
        for host in [
            "192.0.2.1",
            "db.example",
            "::ffff:192.0.2.1",
            "localhost.example",
        ] {
            assert!(!is_loopback(host), "{host}");
        }
    }

    #[test]
    fn change_payloads_parse() {
        assert_eq!(
            parse_change(r#"{"task_id":"t-1","state":"QUEUED","revision":3,"repository":"demo"}"#),
            Some(TaskChange {
                task_id: "t-1".into(),
                state: TaskState::Queued,
                revision: 3,
                repository: "demo".into()
            })
        );
        assert_eq!(
            parse_change(r#"{"task_id":"t-1","state":"NOPE","revision":3}"#),
            None
        );
        assert_eq!(parse_change("not json"), None);
    }
}

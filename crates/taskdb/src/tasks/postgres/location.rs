//! Where and as whom to connect: the `postgresql://` URL, read strictly,
//! and how the connection is secured.

use super::error::pg_error;
use super::tls::{Tls, tls_client};
use crate::error::StoreResult;
use airlock_proto::{Code, Error};
use postgres::config::Host;
use postgres::{Client, NoTls};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// How long data sent to the server may stay unacknowledged before the
/// connection is given up (`TCP_USER_TIMEOUT`).
const TCP_USER_TIMEOUT: Duration = Duration::from_secs(10);
/// A quiet connection is probed after this long ...
const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
/// ... then every this long ...
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(3);
/// ... and given up after this many unanswered probes.
const KEEPALIVE_RETRIES: u32 = 3;

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
            // A link that died (a partition, a host gone without a reset)
            // fails the call in seconds instead of at TCP's own limit
            // (about 15 minutes of retransmissions on Linux) — a wait
            // that would hold the store's one session, and with it every
            // caller of this supervisor: data unacknowledged this long
            // ends the connection, and so do keepalive probes unanswered
            // after a quiet spell (a call whose request the server
            // acknowledged before the link died). UNIX sockets ignore
            // both.
            .tcp_user_timeout(TCP_USER_TIMEOUT)
            .keepalives_idle(KEEPALIVE_IDLE)
            .keepalives_interval(KEEPALIVE_INTERVAL)
            .keepalives_retries(KEEPALIVE_RETRIES)
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

    pub(super) fn connect(&self) -> StoreResult<Client> {
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
}

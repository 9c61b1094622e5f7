//! TLS to PostgreSQL (docs/postgresql.md): a throwaway cluster with
//! `ssl=on` on 127.0.0.1, a CA and a server certificate for `localhost`
//! made here with Debian's `openssl`. `sslmode=verify-full` with the right
//! CA and name connects and the store works over TLS; a wrong name, or a
//! certificate from a CA the file does not hold, is refused; `verify-ca`
//! checks the chain only; `require` stays refused; and a plaintext URL to
//! a host that is not loopback is refused before any connection is tried.

#[path = "tasks_common.rs"]
mod common;

use airlock_pgcluster::{Cluster, StoreDatabase};
use airlock_proto::Code;
use airlock_proto::task::TaskState;
use airlock_taskdb::tasks::{PgLocation, PgSecurity, PgStore, TlsMode};
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl runs (Debian's openssl package)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A self-signed CA `name` in `dir`: `name.crt`, `name.key`.
fn make_ca(dir: &Path, name: &str) -> PathBuf {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.crt"),
            "-days",
            "2",
            "-subj",
            &format!("/CN=airlock test {name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
    dir.join(format!("{name}.crt"))
}

/// A server certificate `name` signed by CA `ca`, for `san` (e.g.
/// "DNS:localhost"): returns (certificate, key).
fn make_server(dir: &Path, ca: &str, name: &str, san: &str) -> (PathBuf, PathBuf) {
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
            "-subj",
            "/CN=localhost",
        ],
    );
    std::fs::write(
        dir.join(format!("{name}.ext")),
        format!(
            "subjectAltName={san}\nbasicConstraints=critical,CA:FALSE\n\
             keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        ),
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{ca}.crt"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-out",
            &format!("{name}.crt"),
            "-days",
            "2",
            "-extfile",
            &format!("{name}.ext"),
        ],
    );
    (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
    )
}

/// A TLS cluster whose certificate (for `localhost` only: no IP SAN)
/// chains to `ca`, with the store's database; plus a second CA that
/// signed nothing the server presents.
struct Fixture {
    dir: tempfile::TempDir,
    cluster: Cluster,
    db: StoreDatabase,
    ca: PathBuf,
    other_ca: PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let ca = make_ca(dir.path(), "ca");
    let other_ca = make_ca(dir.path(), "other-ca");
    let (cert, key) = make_server(dir.path(), "ca", "server", "DNS:localhost");
    let cluster = Cluster::start_with_tls(&cert, &key).expect("a TLS cluster");
    let db = cluster.create_store_database("airlock").unwrap();
    Fixture {
        dir,
        cluster,
        db,
        ca,
        other_ca,
    }
}

impl Fixture {
    fn url(&self, user: &str, host: &str, sslmode: &str) -> String {
        format!(
            "postgresql://{user}@{host}:{}/airlock?sslmode={sslmode}",
            self.cluster.port()
        )
    }

    fn location(&self, user: &str, host: &str, sslmode: &str, ca: &Path) -> PgLocation {
        let password = if user == self.db.role {
            &self.db.password
        } else {
            &self.db.owner_password
        };
        PgLocation::parse_with(
            &self.url(user, host, sslmode),
            &PgSecurity {
                ca_file: Some(ca.to_owned()),
                allow_plaintext: false,
            },
        )
        .expect("a valid TLS location")
        .with_password(password.as_bytes())
    }

    /// The sessions of `user` the server sees, and whether each is TLS.
    fn sessions(&self, user: &str) -> Vec<bool> {
        let mut su = self.cluster.superuser("postgres").unwrap();
        su.query(
            "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE a.usename = $1",
            &[&user],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
    }
}

fn refused_connecting(location: &PgLocation) -> String {
    let e = PgStore::open(location).expect_err("the connection must be refused");
    assert_eq!(e.code(), Code::STORE_UNAVAILABLE, "{e}");
    // The wrapped error's chain holds the TLS failure.
    let mut message = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        message.push_str(&format!(": {s}"));
        source = s.source();
    }
    message
}

#[test]
fn verify_full_with_the_right_ca_and_name_connects_and_the_store_works() {
    let f = fixture();
    let owner = format!("{}_owner", f.db.role);
    let owner_loc = f.location(&owner, "localhost", "verify-full", &f.ca);
    assert_eq!(owner_loc.tls_mode(), TlsMode::VerifyFull);
    let version = airlock_taskdb::tasks::postgres::migrate_at(&owner_loc)
        .expect("the owner migrates over TLS");
    assert!(version > 0);
    let loc = f.location(&f.db.role, "localhost", "verify-full", &f.ca);
    let mut store = PgStore::open(&loc).expect("verify-full with the right CA and name");
    store.integrity_check().unwrap();
    let submitted = store.submit(&submission("t-tls-1", 2), &planner()).unwrap();
    assert_eq!(submitted.task.state, TaskState::Queued);
    let grant = store
        .claim(&worker(), LEASE)
        .unwrap()
        .expect("the submitted task is claimable");
    assert_eq!(grant.task_id, "t-tls-1");
    // The server saw the store's session, and it is TLS.
    let sessions = f.sessions(&f.db.role);
    assert!(!sessions.is_empty(), "no session of the store's role");
    assert!(sessions.iter().all(|ssl| *ssl), "{sessions:?}");
    drop(store);
    let _ = &f.dir;
}

#[test]
fn verify_full_refuses_a_certificate_for_another_name() {
    let f = fixture();
    let owner = format!("{}_owner", f.db.role);
    // The certificate names localhost only (no IP SAN): 127.0.0.1 is
    // another name.
    let loc = f.location(&owner, "127.0.0.1", "verify-full", &f.ca);
    let message = refused_connecting(&loc);
    assert!(
        message.contains("certificate not valid for name"),
        "{message}"
    );
    // verify-ca checks the chain only: the same address connects.
    let loc = f.location(&owner, "127.0.0.1", "verify-ca", &f.ca);
    assert_eq!(loc.tls_mode(), TlsMode::VerifyCa);
    airlock_taskdb::tasks::postgres::migrate_at(&loc).expect("verify-ca ignores the name");
}

#[test]
fn a_certificate_from_an_unknown_ca_is_refused() {
    let f = fixture();
    let owner = format!("{}_owner", f.db.role);
    for mode in ["verify-full", "verify-ca"] {
        let loc = f.location(&owner, "localhost", mode, &f.other_ca);
        let message = refused_connecting(&loc);
        assert!(
            message.contains("certificate") && message.contains("UnknownIssuer"),
            "{mode}: {message}"
        );
    }
    assert!(
        f.sessions(&owner).is_empty(),
        "no session may have been opened"
    );
}

#[test]
fn plaintext_to_a_host_that_is_not_loopback_is_refused_before_connecting() {
    // 192.0.2.1 (TEST-NET-1) is never connected to: the refusal is the
    // parse's, so it returns at once, whatever the network does.
    let started = Instant::now();
    for url in [
        "postgresql://airlock@192.0.2.1:5432/airlock",
        "postgresql://airlock@192.0.2.1:5432/airlock?sslmode=disable",
        "postgresql://airlock@db.example/airlock",
        "postgresql://airlock@localhost/airlock?hostaddr=192.0.2.1",
    ] {
        let e = PgLocation::parse_with(url, &PgSecurity::default()).unwrap_err();
        assert_eq!(e.code, Code::CONFIG_INVALID, "{url}: {e}");
        let message = e.to_string();
        assert!(
            message.contains("without TLS")
                && message.contains("sslmode=verify-full")
                && message.contains("supervisor.database_allow_plaintext = true"),
            "{url}: {message}"
        );
        let e = airlock_taskdb::Location::parse_with(url, &PgSecurity::default()).unwrap_err();
        assert_eq!(e.code, Code::CONFIG_INVALID, "{url}: {e}");
    }
    assert!(started.elapsed() < Duration::from_secs(2));
    // The explicit key allows it (no connection is tried by parsing).
    let allowed = PgSecurity {
        ca_file: None,
        allow_plaintext: true,
    };
    let loc = PgLocation::parse_with("postgresql://airlock@192.0.2.1:5432/airlock", &allowed)
        .expect("allowed by supervisor.database_allow_plaintext");
    assert_eq!(loc.tls_mode(), TlsMode::Plaintext);
    // UNIX sockets and loopback need no TLS and no key.
    for url in [
        "postgresql://airlock@%2Frun%2Fpostgresql/airlock",
        "postgresql:///airlock?user=airlock",
        "postgresql://airlock@127.0.0.1:5432/airlock",
        "postgresql://airlock@[::1]:5432/airlock",
        "postgresql://airlock@localhost/airlock",
    ] {
        PgLocation::parse_with(url, &PgSecurity::default()).expect(url);
    }
}

#[test]
fn sslmode_require_prefer_and_allow_stay_refused_and_verify_needs_a_ca_file() {
    let dir = tempfile::tempdir().unwrap();
    let ca = make_ca(dir.path(), "ca");
    let with_ca = PgSecurity {
        ca_file: Some(ca.clone()),
        allow_plaintext: false,
    };
    for mode in ["require", "prefer", "allow"] {
        for security in [&PgSecurity::default(), &with_ca] {
            let url = format!("postgresql://airlock@db.example/airlock?sslmode={mode}");
            let e = PgLocation::parse_with(&url, security).unwrap_err();
            assert_eq!(e.code, Code::CONFIG_INVALID, "{url}");
            let message = e.to_string();
            assert!(
                message.contains(&format!("sslmode={mode} is refused"))
                    && message.contains("without authenticating the server"),
                "{message}"
            );
        }
    }
    // verify-* without the CA file.
    let e = PgLocation::parse_with(
        "postgresql://airlock@db.example/airlock?sslmode=verify-full",
        &PgSecurity::default(),
    )
    .unwrap_err();
    assert_eq!(e.code, Code::CONFIG_INVALID);
    assert!(e.to_string().contains("supervisor.database_ca_file"), "{e}");
    // A CA file without verify-*: TLS is asked for by the URL, not implied.
    let e = PgLocation::parse_with("postgresql://airlock@127.0.0.1/airlock", &with_ca).unwrap_err();
    assert_eq!(e.code, Code::CONFIG_INVALID);
    assert!(e.to_string().contains("sslmode=verify-full"), "{e}");
    // TLS over a UNIX socket does not exist.
    let e = PgLocation::parse_with(
        "postgresql://airlock@%2Frun%2Fpostgresql/airlock?sslmode=verify-full",
        &with_ca,
    )
    .unwrap_err();
    assert_eq!(e.code, Code::CONFIG_INVALID);
    // A CA file that holds no certificate.
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "not a certificate\n").unwrap();
    let e = PgLocation::parse_with(
        "postgresql://airlock@db.example/airlock?sslmode=verify-full",
        &PgSecurity {
            ca_file: Some(empty),
            allow_plaintext: false,
        },
    )
    .unwrap_err();
    assert_eq!(e.code, Code::CONFIG_INVALID);
    assert!(e.to_string().contains("no usable CA certificate"), "{e}");
    // With the file, both verifying modes parse (nothing is connected).
    for (mode, want) in [
        ("verify-full", TlsMode::VerifyFull),
        ("verify-ca", TlsMode::VerifyCa),
    ] {
        let url = format!("postgresql://airlock@db.example/airlock?sslmode={mode}");
        assert_eq!(
            PgLocation::parse_with(&url, &with_ca).unwrap().tls_mode(),
            want
        );
    }
}

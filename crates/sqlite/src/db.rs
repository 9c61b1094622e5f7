//! Opening a database: pragmas, file identity, versioned migrations.

use crate::error::{SqliteError, SqliteResult};
use airlock_proto::{Code, Error};
use rusqlite::{Connection, OpenFlags, TransactionBehavior};
use std::path::Path;
use std::time::Duration;

/// One schema step. `version` starts at 1 and increases by one per step.
#[derive(Debug)]
pub struct Migration {
    /// The `user_version` after this step.
    pub version: i64,
    /// SQL run inside the migration transaction.
    pub sql: &'static str,
}

/// What kind of database a file is, recorded in SQLite's `application_id`
/// so a journal is never opened as a task store or the other way round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The supervisor's task store.
    Tasks,
    /// The worker's checkpoint journal.
    Checkpoints,
}

impl Kind {
    fn application_id(self) -> i64 {
        match self {
            Kind::Tasks => 0x4149_5254,       // "AIRT"
            Kind::Checkpoints => 0x4149_5243, // "AIRC"
        }
    }
}

/// How long a writer waits for another writer before giving up.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// Opens (creating if needed) a database with WAL, synchronous=FULL, a busy
/// timeout and foreign keys, checks its identity and applies migrations.
pub fn open(path: &Path, kind: Kind, migrations: &[Migration]) -> SqliteResult<Connection> {
    create_private(path)?;
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_NOFOLLOW;
    let mut conn = Connection::open_with_flags(path, flags)
        .map_err(|e| SqliteError::sqlite(format!("opening {}", path.display()), e))?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(|e| SqliteError::sqlite("setting busy timeout", e))?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .map_err(|e| SqliteError::sqlite("enabling WAL", e))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(SqliteError::Refused(Error::with(
            Code::STORE_UNAVAILABLE,
            format!("{}: journal_mode is {mode}, WAL required", path.display()),
        )));
    }
    conn.execute_batch("PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;")
        .map_err(|e| SqliteError::sqlite("setting pragmas", e))?;
    migrate(&mut conn, kind, migrations)?;
    Ok(conn)
}

/// Creates the database file owner-only (0600) when it does not exist yet:
/// one process owns each store, and SQLite gives the `-wal` and `-shm`
/// files the database's mode. An existing file keeps its mode (the
/// package's maintainer scripts migrate the modes of older installs).
fn create_private(path: &Path) -> SqliteResult<()> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(SqliteError::Refused(Error::with(
            Code::STORE_UNAVAILABLE,
            format!("creating {}: {e}", path.display()),
        ))),
    }
}

fn migrate(conn: &mut Connection, kind: Kind, migrations: &[Migration]) -> SqliteResult<()> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| SqliteError::sqlite("starting migration", e))?;
    let app: i64 = tx
        .query_row("PRAGMA application_id", [], |r| r.get(0))
        .map_err(|e| SqliteError::sqlite("reading application_id", e))?;
    let version: i64 = tx
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(|e| SqliteError::sqlite("reading user_version", e))?;
    if app == 0 && version == 0 {
        tx.execute_batch(&format!("PRAGMA application_id={}", kind.application_id()))
            .map_err(|e| SqliteError::sqlite("setting application_id", e))?;
    } else if app != kind.application_id() {
        return Err(SqliteError::Refused(Error::with(
            Code::STORE_UNAVAILABLE,
            format!("the file is not a {kind:?} database (application_id {app:#x})"),
        )));
    }
    let latest = migrations.last().map_or(0, |m| m.version);
    if version > latest {
        return Err(SqliteError::Refused(Error::with(
            Code::SCHEMA_VERSION_UNSUPPORTED,
            format!("schema version {version} is newer than this airlock ({latest})"),
        )));
    }
    for m in migrations.iter().filter(|m| m.version > version) {
        tx.execute_batch(m.sql)
            .map_err(|e| SqliteError::sqlite(format!("migration {}", m.version), e))?;
        tx.execute_batch(&format!("PRAGMA user_version={}", m.version))
            .map_err(|e| SqliteError::sqlite("setting user_version", e))?;
    }
    tx.commit()
        .map_err(|e| SqliteError::sqlite("committing migration", e))
}

/// Runs `PRAGMA integrity_check`; anything but "ok" is STORE_CORRUPT.
pub fn integrity_check(conn: &Connection) -> SqliteResult<()> {
    let mut stmt = conn
        .prepare("PRAGMA integrity_check")
        .map_err(|e| SqliteError::sqlite("integrity_check", e))?;
    let rows: Vec<String> = stmt
        .query_map([], |r| r.get(0))
        .and_then(|rows| rows.collect())
        .map_err(|e| SqliteError::sqlite("integrity_check", e))?;
    if rows == ["ok"] {
        Ok(())
    } else {
        Err(SqliteError::Refused(Error::with(
            Code::STORE_CORRUPT,
            rows.join("; "),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: &[Migration] = &[
        Migration {
            version: 1,
            sql: "CREATE TABLE a(x INTEGER);",
        },
        Migration {
            version: 2,
            sql: "ALTER TABLE a ADD COLUMN y TEXT;",
        },
    ];

    #[test]
    fn applies_migrations_once_and_sets_pragmas() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.sqlite3");
        let c = open(&p, Kind::Tasks, M).unwrap();
        let v: i64 = c
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(v, 2);
        let sync: i64 = c.query_row("PRAGMA synchronous", [], |r| r.get(0)).unwrap();
        assert_eq!(sync, 2, "synchronous=FULL");
        drop(c);
        let c = open(&p, Kind::Tasks, M).unwrap();
        c.execute("INSERT INTO a(x, y) VALUES (1, 'z')", [])
            .unwrap();
        integrity_check(&c).unwrap();
    }

    #[test]
    fn refuses_newer_schema_and_foreign_kind() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.sqlite3");
        drop(open(&p, Kind::Tasks, M).unwrap());
        let err = open(&p, Kind::Tasks, &M[..1]).unwrap_err();
        assert_eq!(err.code(), Code::SCHEMA_VERSION_UNSUPPORTED);
        let err = open(&p, Kind::Checkpoints, M).unwrap_err();
        assert_eq!(err.code(), Code::STORE_UNAVAILABLE);
    }

    #[test]
    fn refuses_a_symlinked_database() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real.sqlite3");
        drop(open(&real, Kind::Tasks, M).unwrap());
        let link = dir.path().join("link.sqlite3");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert_eq!(
            open(&link, Kind::Tasks, M).unwrap_err().code(),
            Code::STORE_UNAVAILABLE
        );
    }
}

//! airlock-taskdb: the supervisor's task database, and only the
//! supervisor's: nothing else opens it (airlock-retryd asks the supervisor
//! over D-Bus instead).
//!
//! [`tasks::TaskStore`] is the contract: the queue, plans, leases,
//! results, verification decisions, the owner-controlled retry extension,
//! and an append-only event log that records denials as well as successes.
//! Two engines implement it with one set of rules:
//!
//! - [`tasks::SqliteStore`], the default: an embedded file, 0600
//!   airlock:airlock, opened through `airlock_sqlite::db::open` (WAL,
//!   `synchronous=FULL`, versioned migrations). One host.
//! - [`tasks::PgStore`]: a PostgreSQL database that the supervisors of
//!   several hosts share, so one queue feeds every host's worker
//!   (docs/postgresql.md).
//!
//! [`Location::parse`] reads `[supervisor] database` (a path, or a
//! `postgresql://` URL) and [`open`] opens the store it names.
//!
//! Owns: the task store: one writer of task state over the SQLite and
//! PostgreSQL engines, leases, events, reconciliation cases.
//! Never: speak to the bus, run git or commands, or decide who may call
//! what (the supervisor's authz does).

pub mod error;
pub mod tasks;

pub use airlock_sqlite::{SqliteError, clock};
pub use error::{StoreError, StoreResult};

use airlock_proto::{Code, Error};
use std::path::PathBuf;
use tasks::{PgLocation, PgSecurity, PgStore, SqliteStore, TaskStore};

/// Where the task store lives.
#[derive(Clone, Debug)]
pub enum Location {
    /// An SQLite file on this host.
    Sqlite(PathBuf),
    /// A PostgreSQL database.
    Postgres(Box<PgLocation>),
}

impl Location {
    /// [`Location::parse_with`] with the default [`PgSecurity`] (no CA
    /// file, no plaintext beyond loopback).
    pub fn parse(value: &str) -> Result<Location, Error> {
        Location::parse_with(value, &PgSecurity::default())
    }

    /// Reads `[supervisor] database`: a `postgresql://` URL, secured as
    /// `security` says (see [`PgLocation::parse_with`]), or an absolute
    /// path to an SQLite file. Anything else is `CONFIG_INVALID`.
    pub fn parse_with(value: &str, security: &PgSecurity) -> Result<Location, Error> {
        if tasks::postgres::is_url(value) {
            return PgLocation::parse_with(value, security)
                .map(|l| Location::Postgres(Box::new(l)));
        }
        if value.contains("://") {
            return Err(Error::with(
                Code::CONFIG_INVALID,
                format!("{value:?}: the task store is a file path or a postgresql:// URL"),
            ));
        }
        let path = PathBuf::from(value);
        if !path.is_absolute() {
            return Err(Error::with(
                Code::CONFIG_INVALID,
                format!("{value:?}: the task database path must be absolute"),
            ));
        }
        Ok(Location::Sqlite(path))
    }

    /// The location for logs and `--check-config` (never a password).
    pub fn describe(&self) -> String {
        match self {
            Location::Sqlite(p) => p.display().to_string(),
            Location::Postgres(l) => l.to_string(),
        }
    }
}

/// Opens the task store at `location` (creating or migrating its schema
/// when needed and allowed) and runs its integrity check.
pub fn open(location: &Location) -> StoreResult<Box<dyn TaskStore>> {
    let store: Box<dyn TaskStore> = match location {
        Location::Sqlite(path) => Box::new(SqliteStore::open(path)?),
        Location::Postgres(pg) => Box::new(PgStore::open(pg)?),
    };
    store.integrity_check()?;
    Ok(store)
}

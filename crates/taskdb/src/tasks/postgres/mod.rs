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
//!   claimable task the fair rule picks (`tasks::fair`) and locks it; the
//!   rules move it and write it back fenced by its revision, in the same
//!   transaction. Concurrent claimers on any host skip each other's rows
//!   instead of waiting, and a row is claimed by exactly one. A claim
//!   first takes its submitter class's advisory lock ([`CLASS_LOCK`])
//!   without waiting, passing over a class another claim holds, and counts
//!   the class's RUNNING tasks in the statement that locks the row, so a
//!   cap on running tasks holds across hosts.
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
//!
//! By job: `location.rs` reads the URL and how the connection is secured
//! (`tls.rs` makes the TLS client), `error.rs` says what failed in the
//! server's words, this file holds the sessions and the reads, `tx.rs`
//! the writes of one transaction, `migrate.rs` the schema and
//! `listen.rs` the notifications.

mod error;
mod listen;
mod location;
mod migrate;
mod tls;
mod tx;

use super::row::{self, COLUMNS, EVENT_COLUMNS, RawEvent, RawRow};
use super::tx::{Backend, Page, Tx};
use super::{Store, TaskState};
use crate::error::{StoreError, StoreResult};
use airlock_proto::{Code, Error};
use airlock_sqlite::clock::{Anchor, Clock, SystemClock};
use error::{pg_error, retryable};
use migrate::{KIND, TRIGGERS};
use postgres::{Client, Statement};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use tx::PgTx;

pub use error::PgError;
pub use listen::{CHANNEL, PgListener, TaskChange};
pub use location::{PgLocation, PgSecurity, TlsMode, is_url};
pub use migrate::{MIGRATIONS, PgMigration, SUPERVISOR_ROLE, latest_version, migrate, migrate_at};
pub use tx::{AGENT_LOCK, CLASS_LOCK};

/// How often a transaction that lost a race to another writer is run again.
pub const MAX_TRIES: u32 = 5;

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

fn from_row(r: &postgres::Row) -> Result<RawRow, postgres::Error> {
    Ok(row::raw_row!(r.try_get))
}

fn raw_event(r: &postgres::Row) -> Result<RawEvent, postgres::Error> {
    Ok(row::raw_event!(r.try_get))
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
        page: Page<'_, Option<&str>>,
    ) -> StoreResult<Vec<RawRow>> {
        self.with_session(|s| {
            // Byte order, as SQLite sorts, whatever the database's collation.
            let sql = sql!(
                "SELECT {COLUMNS} FROM tasks WHERE ($1::text IS NULL OR status = $1) \
                 AND ($2::text IS NULL OR task_id COLLATE \"C\" > $2) \
                 AND ($4::bigint IS NULL OR (submitter_uid = $4 \
                      AND submitter_agent IS NOT DISTINCT FROM $5::text)) \
                 ORDER BY task_id COLLATE \"C\" LIMIT $3"
            );
            let stmt = prepared(&mut s.client, &mut s.statements, sql)?;
            let rows = s
                .client
                .query(
                    &stmt,
                    &[
                        &state.map(TaskState::as_str),
                        &page.after,
                        &i64::from(page.limit),
                        &page.scope.uid(),
                        &page.scope.agent(),
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

    fn events(&self, task_id: Option<&str>, page: Page<'_, i64>) -> StoreResult<Vec<RawEvent>> {
        self.with_session(|s| {
            let stmt = prepared(
                &mut s.client,
                &mut s.statements,
                "SELECT id, task_id, at_ms, actor_kind, actor_uid, actor_name, action, outcome, \
                 code, payload_json FROM events WHERE ($1::text IS NULL OR task_id = $1) \
                 AND id > $2 \
                 AND ($4::bigint IS NULL OR task_id IN (SELECT task_id FROM tasks \
                      WHERE submitter_uid = $4 AND submitter_agent IS NOT DISTINCT FROM $5::text)) \
                 ORDER BY id LIMIT $3",
            )?;
            s.client
                .query(
                    &stmt,
                    &[
                        &task_id,
                        &page.after,
                        &i64::from(page.limit),
                        &page.scope.uid(),
                        &page.scope.agent(),
                    ],
                )
                .and_then(|rows| rows.iter().map(raw_event).collect())
                .map_err(|e| pg_error("reading events", e))
        })
    }

    fn newest_untasked(&self, actions: &[&str], key: &str) -> StoreResult<Vec<RawEvent>> {
        self.with_session(|s| {
            let sql = sql!(
                "SELECT {EVENT_COLUMNS} FROM events WHERE id IN (SELECT MAX(id) FROM events \
                 WHERE task_id IS NULL AND action = ANY($1::text[]) \
                 AND jsonb_typeof(payload_json::jsonb -> $2::text) = 'string' \
                 GROUP BY payload_json::jsonb ->> $2::text) ORDER BY id"
            );
            let stmt = prepared(&mut s.client, &mut s.statements, sql)?;
            s.client
                .query(&stmt, &[&actions, &key])
                .and_then(|rows| rows.iter().map(raw_event).collect())
                .map_err(|e| pg_error("reading the newest events about no task", e))
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

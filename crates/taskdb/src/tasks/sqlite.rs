//! The SQLite engine: the default, embedded task store of one host.
//!
//! One connection per [`SqliteBackend`]; writers serialise on
//! `BEGIN IMMEDIATE`, so a row read inside a write transaction cannot
//! change under it. Time is the host's clock, never allowed to go back
//! (the high-water mark in `store_clock`) nor to stand still after a
//! rewind (this process's monotonic [`Anchor`]): see
//! [`airlock_sqlite::clock`].

use super::fair::{CLASS_SQL, ClassHead};
use super::row::{self, COLUMNS, EVENT_COLUMNS, RawEvent, RawRow, TaskRow};
use super::schema;
use super::tx::{
    Backend, ExtensionCas, Guard, NewCase, NewDecision, NewEvent, NewExtension, NewResolution,
    NewResult, NewTask, Page, StoredDecision, StoredExtension, Tx,
};
use super::{Store, TaskState};
use crate::error::{StoreError, StoreResult};
use airlock_proto::bus::AgentUsage;
use airlock_proto::{Code, Error};
use airlock_sqlite::clock::{Anchor, Clock, SystemClock};
use airlock_sqlite::db::{self, Kind};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use std::path::Path;
use std::sync::Arc;

/// The SQLite engine: one connection and the clock it judges time by.
#[derive(Debug)]
pub struct SqliteBackend {
    conn: Connection,
    clock: Arc<dyn Clock>,
    /// The store time of this connection's last write, on the monotonic
    /// clock: after a rewind, store time goes on from it at real rate.
    anchor: Anchor,
}

impl Store<SqliteBackend> {
    /// Opens (creating and migrating if needed) the task store at `path`,
    /// judging time by the system clock. One value per connection; a
    /// second process may open the same file (writers serialise on
    /// `BEGIN IMMEDIATE`).
    pub fn open(path: &Path) -> StoreResult<Self> {
        Store::<SqliteBackend>::open_with_clock(path, Arc::new(SystemClock))
    }

    /// Opens the task store with an injected clock (tests, fault injection).
    pub fn open_with_clock(path: &Path, clock: Arc<dyn Clock>) -> StoreResult<Self> {
        let conn = db::open(path, Kind::Tasks, schema::MIGRATIONS)?;
        Ok(Store {
            backend: SqliteBackend {
                conn,
                clock,
                anchor: Anchor::default(),
            },
        })
    }
}

fn raw_event(r: &rusqlite::Row<'_>) -> rusqlite::Result<RawEvent> {
    Ok(row::raw_event!(r.get))
}

fn from_sql(r: &rusqlite::Row<'_>) -> rusqlite::Result<RawRow> {
    Ok(row::raw_row!(r.get))
}

fn load_where(conn: &Connection, column: &str, value: &str) -> StoreResult<Option<TaskRow>> {
    conn.query_row(
        &format!("SELECT {COLUMNS} FROM tasks WHERE {column} = ?1"),
        [value],
        from_sql,
    )
    .optional()
    .map_err(|e| StoreError::sqlite("loading a task", e))?
    .map(RawRow::into_row)
    .transpose()
}

/// The persisted high-water mark of store time.
fn read_high_water(conn: &Connection) -> StoreResult<i64> {
    conn.query_row(
        "SELECT high_water_ms FROM store_clock WHERE id = 1",
        [],
        |r| r.get::<_, i64>(0),
    )
    .optional()
    .map_err(|e| StoreError::sqlite("reading the clock high-water mark", e))
    .map(|hw| hw.unwrap_or(0))
}

/// Returns `max(wall, high-water)` and persists it as the new mark.
fn advance_time(conn: &Connection, wall: i64) -> StoreResult<i64> {
    let now = wall.max(read_high_water(conn)?);
    conn.execute(
        "UPDATE store_clock SET high_water_ms = ?1 WHERE id = 1 AND high_water_ms < ?1",
        [now],
    )
    .map_err(|e| StoreError::sqlite("advancing the clock high-water mark", e))?;
    Ok(now)
}

impl Backend for SqliteBackend {
    fn write<T>(
        &mut self,
        what: &str,
        f: &mut dyn FnMut(&mut dyn Tx) -> StoreResult<T>,
    ) -> StoreResult<T> {
        let mono = self.clock.mono_ms();
        let wall = self.clock.now_ms().max(self.anchor.floor(mono));
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| StoreError::sqlite(format!("starting {what}"), e))?;
        let now = advance_time(&tx, wall)?;
        let out = f(&mut SqliteTx { conn: &tx, now })?;
        tx.commit()
            .map_err(|e| StoreError::sqlite(format!("committing {what}"), e))?;
        self.anchor.observe(now, mono);
        Ok(out)
    }

    fn now_ms(&self) -> StoreResult<i64> {
        let floor = self.anchor.floor(self.clock.mono_ms());
        Ok(self
            .clock
            .now_ms()
            .max(floor)
            .max(read_high_water(&self.conn)?))
    }

    fn get(&self, task_id: &str) -> StoreResult<Option<RawRow>> {
        self.conn
            .query_row(
                &format!("SELECT {COLUMNS} FROM tasks WHERE task_id = ?1"),
                [task_id],
                from_sql,
            )
            .optional()
            .map_err(|e| StoreError::sqlite("loading a task", e))
    }

    fn list(
        &self,
        state: Option<TaskState>,
        page: Page<'_, Option<&str>>,
    ) -> StoreResult<Vec<RawRow>> {
        let sql = format!(
            "SELECT {COLUMNS} FROM tasks WHERE (?1 IS NULL OR status = ?1) \
             AND (?2 IS NULL OR task_id > ?2) \
             AND (?4 IS NULL OR (submitter_uid = ?4 AND submitter_agent IS ?5)) \
             ORDER BY task_id LIMIT ?3"
        );
        let mut stmt = self
            .conn
            .prepare(&sql)
            .map_err(|e| StoreError::sqlite("listing tasks", e))?;
        stmt.query_map(
            params![
                state.map(TaskState::as_str),
                page.after,
                page.limit,
                page.scope.uid(),
                page.scope.agent()
            ],
            from_sql,
        )
        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
        .map_err(|e| StoreError::sqlite("listing tasks", e))
    }

    fn counts(&self) -> StoreResult<Vec<(String, i64)>> {
        let mut stmt = self
            .conn
            .prepare("SELECT status, COUNT(*) FROM tasks GROUP BY status")
            .map_err(|e| StoreError::sqlite("summarising tasks", e))?;
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(|e| StoreError::sqlite("summarising tasks", e))
    }

    fn events(&self, task_id: Option<&str>, page: Page<'_, i64>) -> StoreResult<Vec<RawEvent>> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT id, task_id, at_ms, actor_kind, actor_uid, actor_name, action, outcome, \
                 code, payload_json FROM events WHERE (?1 IS NULL OR task_id = ?1) AND id > ?2 \
                 AND (?4 IS NULL OR task_id IN (SELECT task_id FROM tasks \
                      WHERE submitter_uid = ?4 AND submitter_agent IS ?5)) \
                 ORDER BY id LIMIT ?3",
            )
            .map_err(|e| StoreError::sqlite("reading events", e))?;
        let (uid, agent) = (page.scope.uid(), page.scope.agent());
        stmt.query_map(
            params![task_id, page.after, page.limit, uid, agent],
            raw_event,
        )
        .and_then(|rows| rows.collect())
        .map_err(|e| StoreError::sqlite("reading events", e))
    }

    fn newest_untasked(&self, actions: &[&str], key: &str) -> StoreResult<Vec<RawEvent>> {
        let what = "reading the newest events about no task";
        let actions = serde_json::to_string(actions)
            .map_err(|e| Error::with(Code::INTERNAL, format!("{what}: {e}")))?;
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT {EVENT_COLUMNS} FROM events WHERE id IN (SELECT MAX(id) FROM events \
                 WHERE task_id IS NULL AND action IN (SELECT value FROM json_each(?1)) \
                 AND json_type(payload_json, '$.' || ?2) = 'text' \
                 GROUP BY json_extract(payload_json, '$.' || ?2)) ORDER BY id"
            ))
            .map_err(|e| StoreError::sqlite(what, e))?;
        stmt.query_map(params![actions, key], raw_event)
            .and_then(|rows| rows.collect())
            .map_err(|e| StoreError::sqlite(what, e))
    }

    fn last_event_id(&self) -> StoreResult<i64> {
        self.conn
            .query_row("SELECT COALESCE(MAX(id), 0) FROM events", [], |r| r.get(0))
            .map_err(|e| StoreError::sqlite("reading the newest event id", e))
    }

    fn integrity_check(&self) -> StoreResult<()> {
        Ok(db::integrity_check(&self.conn)?)
    }
}

/// A `BEGIN IMMEDIATE` transaction at one store time.
struct SqliteTx<'c> {
    conn: &'c Connection,
    now: i64,
}

impl Tx for SqliteTx<'_> {
    fn now(&self) -> i64 {
        self.now
    }

    fn load(&mut self, task_id: &str) -> StoreResult<Option<TaskRow>> {
        load_where(self.conn, "task_id", task_id)
    }

    fn load_by_key(&mut self, key: &str) -> StoreResult<Option<TaskRow>> {
        load_where(self.conn, "idempotency_key", key)
    }

    fn insert_task(&mut self, t: &NewTask<'_>) -> StoreResult<()> {
        self.conn
            .execute(
                "INSERT INTO tasks (task_id, status, attempt, max_attempts, revision, lease_epoch, \
                 binding_json, plan_json, envelope_json, execution_digest, plan_digest, \
                 idempotency_key, submission_sha256, created_at_ms, updated_at_ms, repository, \
                 submitter_uid, submitter_agent) \
                 VALUES (?1, ?12, 0, ?2, 1, 0, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?10, ?11, ?13, ?14)",
                params![
                    t.task_id,
                    t.max_attempts,
                    t.binding_json,
                    t.plan_json,
                    t.envelope_json,
                    t.execution_digest,
                    t.plan_digest,
                    t.idempotency_key,
                    t.submission_sha256,
                    self.now,
                    t.repository,
                    t.status.as_str(),
                    t.submitter.uid,
                    t.submitter.agent,
                ],
            )
            .map_err(|e| StoreError::sqlite("inserting a task", e))?;
        Ok(())
    }

    fn update(&mut self, row: &TaskRow, read_revision: i64, guard: Guard<'_>) -> StoreResult<bool> {
        const SET: &str = "UPDATE tasks SET status = ?1, attempt = ?2, max_attempts = ?3, \
             revision = ?4, lease_epoch = ?5, claimed_by = ?6, lease_token_hash = ?7, \
             lease_expires_at = ?8, verification_json = ?9, result_json = ?10, plan_json = ?11, \
             envelope_json = ?12, execution_digest = ?13, plan_digest = ?14, updated_at_ms = ?15, \
             fenced_until_ms = ?16 WHERE task_id = ?17 AND revision = ?18";
        let lease_epoch = row.lease_epoch_i64()?;
        let mut values: Vec<Box<dyn rusqlite::ToSql + '_>> = vec![
            Box::new(row.status().as_str()),
            Box::new(row.attempt),
            Box::new(row.max_attempts),
            Box::new(row.revision),
            Box::new(lease_epoch),
            Box::new(row.claimed_by.as_deref()),
            Box::new(row.lease_token_hash.as_deref()),
            Box::new(row.lease_expires_at),
            Box::new(row.verification_json.as_deref()),
            Box::new(row.result_json.as_deref()),
            Box::new(row.plan_json.as_str()),
            Box::new(row.envelope_json.as_str()),
            Box::new(row.execution_digest.as_str()),
            Box::new(row.plan_digest.as_str()),
            Box::new(row.updated_at_ms),
            Box::new(row.fenced_until),
            Box::new(row.task_id.as_str()),
            Box::new(read_revision),
        ];
        let fence = match guard {
            Guard::Revision => "",
            Guard::Lease {
                attempt,
                lease_epoch,
                token_hash,
            } => {
                values.push(Box::new(attempt));
                values.push(Box::new(epoch_i64(lease_epoch)?));
                values.push(Box::new(token_hash));
                values.push(Box::new(self.now));
                " AND status = 'RUNNING' AND attempt = ?19 AND lease_epoch = ?20 \
                 AND lease_token_hash = ?21 AND lease_expires_at > ?22"
            }
            Guard::Attempt {
                state,
                attempt,
                lease_epoch,
            } => {
                values.push(Box::new(state.as_str()));
                values.push(Box::new(attempt));
                values.push(Box::new(epoch_i64(lease_epoch)?));
                " AND status = ?19 AND attempt = ?20 AND lease_epoch = ?21"
            }
        };
        let refs: Vec<&dyn rusqlite::ToSql> = values.iter().map(|v| v.as_ref()).collect();
        let changed = self
            .conn
            .execute(&format!("{SET}{fence}"), refs.as_slice())
            .map_err(|e| StoreError::sqlite("updating a task", e))?;
        Ok(changed == 1)
    }

    fn claimable_classes(
        &mut self,
        repositories: Option<&[String]>,
    ) -> StoreResult<Vec<ClassHead>> {
        let what = "finding the claimable submitters";
        let sql = sql!(
            "SELECT q.class, q.first_seq, COALESCE(r.n, 0), s.last_claimed_ms FROM \
             (SELECT {CLASS_SQL} AS class, MIN(seq) AS first_seq FROM tasks \
              WHERE status = 'QUEUED' AND attempt < max_attempts \
              AND (?1 IS NULL OR repository IN (SELECT value FROM json_each(?1))) \
              GROUP BY 1) q \
             LEFT JOIN (SELECT {CLASS_SQL} AS class, COUNT(*) AS n FROM tasks \
              WHERE status = 'RUNNING' GROUP BY 1) r ON r.class = q.class \
             LEFT JOIN claim_classes s ON s.class = q.class"
        );
        let mut stmt = self
            .conn
            .prepare_cached(sql)
            .map_err(|e| StoreError::sqlite(what, e))?;
        stmt.query_map([repository_filter(repositories)?], |r| {
            Ok(airlock_sqlite::columns!(ClassHead {
                key, first_seq, running, last_claim_ms
            } from r.get))
        })
        .and_then(|rows| rows.collect())
        .map_err(|e| StoreError::sqlite(what, e))
    }

    fn try_lock_class(&mut self, _class: &str) -> StoreResult<bool> {
        // BEGIN IMMEDIATE: no other writer runs until this one ends.
        Ok(true)
    }

    fn oldest_of_class(
        &mut self,
        class: &str,
        repositories: Option<&[String]>,
        cap: u32,
    ) -> StoreResult<Option<TaskRow>> {
        let sql = sql!(
            "SELECT {COLUMNS} FROM tasks WHERE status = 'QUEUED' AND attempt < max_attempts \
             AND (?1 IS NULL OR repository IN (SELECT value FROM json_each(?1))) \
             AND {CLASS_SQL} = ?2 \
             AND (?3 = 0 OR (SELECT COUNT(*) FROM tasks WHERE status = 'RUNNING' \
                  AND {CLASS_SQL} = ?2) < ?3) \
             ORDER BY seq LIMIT 1"
        );
        let next = self
            .conn
            .query_row(
                sql,
                params![repository_filter(repositories)?, class, cap],
                from_sql,
            )
            .optional()
            .map_err(|e| StoreError::sqlite("finding a claimable task", e))?;
        next.map(RawRow::into_row).transpose()
    }

    fn mark_served(&mut self, class: &str) -> StoreResult<()> {
        self.conn
            .execute(
                "INSERT INTO claim_classes (class, last_claimed_ms) VALUES (?1, ?2) \
                 ON CONFLICT (class) DO UPDATE SET last_claimed_ms = excluded.last_claimed_ms",
                params![class, self.now],
            )
            .map_err(|e| StoreError::sqlite("recording whom a claim served", e))?;
        Ok(())
    }

    fn lock_agent(&mut self, _agent: &str) -> StoreResult<()> {
        // BEGIN IMMEDIATE: no other writer runs until this one ends.
        Ok(())
    }

    fn agent_usage(
        &mut self,
        agent: &str,
        tasks_after_ms: i64,
        cpu_after_ms: i64,
    ) -> StoreResult<AgentUsage> {
        let what = "counting an agent's use";
        let (tasks, cpu_ms, running): (i64, i64, i64) = self
            .conn
            .query_row(
                "SELECT \
                 (SELECT COUNT(*) FROM tasks WHERE submitter_agent = ?1 AND created_at_ms > ?2), \
                 (SELECT COALESCE(SUM(r.cpu_ms), 0) FROM results r \
                  JOIN tasks t ON t.task_id = r.task_id \
                  WHERE t.submitter_agent = ?1 AND r.received_at_ms > ?3), \
                 (SELECT COUNT(*) FROM tasks WHERE submitter_agent = ?1 AND status = 'RUNNING')",
                params![agent, tasks_after_ms, cpu_after_ms],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .map_err(|e| StoreError::sqlite(what, e))?;
        let count = |n: i64| u64::try_from(n).unwrap_or(0);
        Ok(AgentUsage {
            tasks_last_hour: count(tasks),
            cpu_ms_last_day: count(cpu_ms),
            running: count(running),
        })
    }

    fn queued(&mut self) -> StoreResult<Vec<TaskRow>> {
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT {COLUMNS} FROM tasks WHERE status = 'QUEUED' ORDER BY seq"
            ))
            .map_err(|e| StoreError::sqlite("finding queued tasks", e))?;
        let rows = stmt
            .query_map([], from_sql)
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(|e| StoreError::sqlite("finding queued tasks", e))?;
        rows.into_iter().map(RawRow::into_row).collect()
    }

    fn expired_leases(&mut self) -> StoreResult<Vec<TaskRow>> {
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT {COLUMNS} FROM tasks WHERE status = 'RUNNING' \
                 AND (lease_expires_at IS NULL OR lease_expires_at <= ?1) ORDER BY seq"
            ))
            .map_err(|e| StoreError::sqlite("finding expired leases", e))?;
        let expired = stmt
            .query_map([self.now], from_sql)
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(|e| StoreError::sqlite("finding expired leases", e))?;
        expired.into_iter().map(RawRow::into_row).collect()
    }

    fn result_sha256(&mut self, task_id: &str, key: &str) -> StoreResult<Option<String>> {
        self.conn
            .query_row(
                "SELECT result_sha256 FROM results WHERE task_id = ?1 AND idempotency_key = ?2",
                params![task_id, key],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| StoreError::sqlite("looking up a result", e))
    }

    fn insert_result(&mut self, r: &NewResult<'_>) -> StoreResult<()> {
        self.conn
            .execute(
                "INSERT INTO results (task_id, idempotency_key, attempt, lease_epoch, \
                 result_sha256, result_json, received_at_ms, cpu_ms) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    r.task_id,
                    r.idempotency_key,
                    r.attempt,
                    r.lease_epoch,
                    r.result_sha256,
                    r.result_json,
                    self.now,
                    r.cpu_ms,
                ],
            )
            .map_err(|e| StoreError::sqlite("storing a result", e))?;
        Ok(())
    }

    fn append_event(&mut self, e: &NewEvent<'_>) -> StoreResult<()> {
        self.conn
            .execute(
                "INSERT INTO events (task_id, at_ms, actor_kind, actor_uid, actor_name, action, \
                 outcome, code, payload_json) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                params![
                    e.task_id,
                    self.now,
                    e.actor.kind.as_str(),
                    e.actor.uid,
                    e.actor.name,
                    e.action,
                    e.outcome.as_str(),
                    e.code.map(Code::as_str),
                    e.payload_json,
                ],
            )
            .map_err(|e| StoreError::sqlite("appending an event", e))?;
        Ok(())
    }

    fn extension(&mut self, task_id: &str, key: &str) -> StoreResult<Option<StoredExtension>> {
        self.conn
            .query_row(
                "SELECT request_sha256, authorization_id, previous_verification_sha256, \
                 next_max_attempts, applied_revision FROM task_retry_extensions \
                 WHERE task_id = ?1 AND idempotency_key = ?2",
                params![task_id, key],
                |r| {
                    Ok(airlock_sqlite::columns!(StoredExtension {
                        request_sha256, authorization_id, previous_verification_sha256,
                        next_max_attempts, applied_revision
                    } from r.get))
                },
            )
            .optional()
            .map_err(|e| StoreError::sqlite("looking up a retry extension", e))
    }

    fn apply_extension(&mut self, cas: &ExtensionCas<'_>) -> StoreResult<u64> {
        let changed = self
            .conn
            .execute(
                "UPDATE tasks SET status = ?10, max_attempts = ?1, revision = ?2, \
                 claimed_by = NULL, lease_token_hash = NULL, lease_expires_at = NULL, \
                 updated_at_ms = ?3 \
                 WHERE task_id = ?4 AND status = ?5 AND revision = ?6 AND attempt = ?7 \
                 AND max_attempts = ?8 AND claimed_by IS ?9 \
                 AND lease_token_hash IS NULL AND lease_expires_at IS NULL",
                params![
                    cas.next_max_attempts,
                    cas.applied_revision,
                    self.now,
                    cas.task_id,
                    cas.expected_status,
                    cas.expected_revision,
                    cas.expected_attempt,
                    cas.expected_max_attempts,
                    cas.previous_claimed_by,
                    cas.status.as_str(),
                ],
            )
            .map_err(|e| StoreError::sqlite("applying a retry extension", e))?;
        Ok(changed as u64)
    }

    fn agent_record(&mut self, name: &str) -> StoreResult<Option<String>> {
        self.conn
            .query_row(
                "SELECT record_json FROM agents WHERE name = ?1",
                params![name],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| StoreError::sqlite("reading an agent's record", e))
    }

    fn put_agent_record(&mut self, name: &str, record_json: &str) -> StoreResult<()> {
        self.conn
            .execute(
                "INSERT INTO agents (name, record_json, updated_at_ms) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (name) DO UPDATE SET record_json = excluded.record_json, \
                 updated_at_ms = excluded.updated_at_ms",
                params![name, record_json, self.now],
            )
            .map_err(|e| StoreError::sqlite("storing an agent's record", e))?;
        Ok(())
    }

    fn insert_extension(&mut self, e: &NewExtension<'_>) -> StoreResult<()> {
        self.conn
            .execute(
                "INSERT INTO task_retry_extensions (task_id, idempotency_key, request_sha256, \
                 authorization_id, previous_verification_sha256, previous_max_attempts, \
                 next_max_attempts, expected_revision, applied_revision, created_at_ms) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                params![
                    e.task_id,
                    e.idempotency_key,
                    e.request_sha256,
                    e.authorization_id,
                    e.previous_verification_sha256,
                    e.previous_max_attempts,
                    e.next_max_attempts,
                    e.expected_revision,
                    e.applied_revision,
                    self.now,
                ],
            )
            .map_err(|e| StoreError::sqlite("recording a retry extension", e))?;
        Ok(())
    }

    fn decision(&mut self, task_id: &str, key: &str) -> StoreResult<Option<StoredDecision>> {
        self.conn
            .query_row(
                "SELECT request_sha256, outcome_json FROM task_decisions \
                 WHERE task_id = ?1 AND idempotency_key = ?2",
                params![task_id, key],
                |r| {
                    Ok(airlock_sqlite::columns!(StoredDecision {
                        request_sha256, outcome_json
                    } from r.get))
                },
            )
            .optional()
            .map_err(|e| StoreError::sqlite("looking up a decision", e))
    }

    fn case_json(&mut self, task_id: &str, attempt: Option<u32>) -> StoreResult<Option<String>> {
        self.conn
            .query_row(
                "SELECT case_json FROM reconciliations WHERE task_id = ?1 \
                 AND (?2 IS NULL OR attempt = ?2) ORDER BY attempt DESC LIMIT 1",
                params![task_id, attempt],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| StoreError::sqlite("reading a reconciliation case", e))
    }

    fn put_case(&mut self, case: &NewCase<'_>) -> StoreResult<()> {
        self.conn
            .execute(
                "INSERT INTO reconciliations (task_id, attempt, status, case_json, updated_at_ms) \
                 VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (task_id, attempt) DO UPDATE SET \
                 status = excluded.status, case_json = excluded.case_json, \
                 updated_at_ms = excluded.updated_at_ms",
                params![
                    case.task_id,
                    case.attempt,
                    case.status,
                    case.case_json,
                    self.now
                ],
            )
            .map_err(|e| StoreError::sqlite("storing a reconciliation case", e))?;
        Ok(())
    }

    fn cases(
        &mut self,
        status: Option<&str>,
        page: Page<'_, Option<&str>>,
    ) -> StoreResult<Vec<String>> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT case_json FROM reconciliations WHERE (?1 IS NULL OR status = ?1) \
                 AND (?2 IS NULL OR task_id > ?2) \
                 AND (?4 IS NULL OR task_id IN (SELECT task_id FROM tasks \
                      WHERE submitter_uid = ?4 AND submitter_agent IS ?5)) \
                 ORDER BY task_id, attempt LIMIT ?3",
            )
            .map_err(|e| StoreError::sqlite("listing reconciliation cases", e))?;
        let (uid, agent) = (page.scope.uid(), page.scope.agent());
        let rows = stmt
            .query_map(params![status, page.after, page.limit, uid, agent], |r| {
                r.get(0)
            })
            .map_err(|e| StoreError::sqlite("listing reconciliation cases", e))?;
        rows.collect::<Result<Vec<String>, _>>()
            .map_err(|e| StoreError::sqlite("listing reconciliation cases", e))
    }

    fn resolution(&mut self, task_id: &str, key: &str) -> StoreResult<Option<StoredDecision>> {
        self.conn
            .query_row(
                "SELECT request_sha256, outcome_json FROM reconciliation_resolutions \
                 WHERE task_id = ?1 AND idempotency_key = ?2",
                params![task_id, key],
                |r| {
                    Ok(airlock_sqlite::columns!(StoredDecision {
                        request_sha256, outcome_json
                    } from r.get))
                },
            )
            .optional()
            .map_err(|e| StoreError::sqlite("looking up a resolution", e))
    }

    fn insert_resolution(&mut self, r: &NewResolution<'_>) -> StoreResult<()> {
        self.conn
            .execute(
                "INSERT INTO reconciliation_resolutions (task_id, idempotency_key, \
                 request_sha256, attempt, resolution, outcome_json, actor_name, created_at_ms) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    r.task_id,
                    r.idempotency_key,
                    r.request_sha256,
                    r.attempt,
                    r.resolution,
                    r.outcome_json,
                    r.actor_name,
                    self.now,
                ],
            )
            .map_err(|e| StoreError::sqlite("recording a resolution", e))?;
        Ok(())
    }

    fn insert_decision(&mut self, d: &NewDecision<'_>) -> StoreResult<()> {
        self.conn
            .execute(
                "INSERT INTO task_decisions (task_id, idempotency_key, request_sha256, decision, \
                 attempt, result_sha256, applied_revision, outcome_json, actor_name, \
                 created_at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                params![
                    d.task_id,
                    d.idempotency_key,
                    d.request_sha256,
                    d.decision,
                    d.attempt,
                    d.result_sha256,
                    d.applied_revision,
                    d.outcome_json,
                    d.actor_name,
                    self.now,
                ],
            )
            .map_err(|e| StoreError::sqlite("recording a decision", e))?;
        Ok(())
    }
}

/// A repository filter as SQLite's `json_each` reads it (`None`: any).
fn repository_filter(repositories: Option<&[String]>) -> StoreResult<Option<String>> {
    repositories
        .map(|r| {
            serde_json::to_string(r)
                .map_err(|e| Error::with(Code::INTERNAL, format!("repository filter: {e}")).into())
        })
        .transpose()
}

fn epoch_i64(epoch: u64) -> StoreResult<i64> {
    i64::try_from(epoch).map_err(|_| Error::with(Code::INTERNAL, "lease epoch overflow").into())
}

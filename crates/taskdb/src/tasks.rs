//! The supervisor's task store: queue, plans, leases, results, verification
//! decisions, the owner-controlled retry extension, and an append-only
//! event log.
//!
//! # Rules every method keeps
//!
//! - Every mutation runs in one `BEGIN IMMEDIATE` transaction, bumps the
//!   task's `revision`, and appends an `allowed` [`Event`] in that same
//!   transaction, so a change and its audit record commit together or not
//!   at all.
//! - Every refusal ([`StoreError::Refused`]) of a mutating method rolls its
//!   transaction back (nothing changes) and then appends a `denied` event
//!   with the refusal's [`Code`] in a transaction of its own.
//! - Idempotent replays (the same submission, plan, result or retry
//!   extension again) change nothing and append nothing.
//! - The events table is append-only: SQLite triggers abort any `UPDATE` or
//!   `DELETE` on it.
//! - Time is `max(clock, high-water mark)` and the high-water mark is
//!   persisted, so rewinding the wall clock never extends a lease.
//! - A lease is a 256-bit random token handed out once in the
//!   [`ClaimGrant`]; only its SHA-256 is stored. A lease epoch fences stale
//!   holders.
//!
//! # States
//!
//! ```text
//! submit ─▶ QUEUED ─claim─▶ RUNNING ─result passed/captured─▶ VERIFYING ─accept─▶ SUCCEEDED
//!             ▲  ▲             │  │                               │  │
//!             │  └─lease expired, attempts left (sweep)           │  └─reject─▶ FAILED
//!             │                │  └─result failed, attempts left  │
//!             └────────────────┴──────────────────────────────────┴─rework, attempts left
//!   out of attempts (result failed, rework, lease expired) ─▶ FAILED
//!   FAILED with attempt == max_attempts ─extend_retry─▶ QUEUED (max_attempts + 1)
//!   any non-terminal state ─cancel─▶ CANCELLED
//! ```
//!
//! # Example
//!
//! ```
//! use airlock_taskdb::tasks::{Actor, TaskStore};
//! let dir = tempfile::tempdir().unwrap();
//! let mut store = TaskStore::open(&dir.path().join("tasks.sqlite3")).unwrap();
//! // Nothing is queued yet, so a worker's claim finds nothing.
//! assert!(store.claim(&Actor::worker(Some(1000), "worker-1"), 60_000).unwrap().is_none());
//! assert_eq!(store.summary().unwrap().total(), 0);
//! ```

mod audit;
mod lease;
mod lifecycle;
mod retry;
mod row;
mod schema;

use airlock_proto::binding::is_task_id;
use airlock_proto::canonical::digest_of;
use airlock_proto::{Code, Error};
use airlock_sqlite::clock::{Clock, SystemClock};
use airlock_sqlite::db::{self, Kind};
use airlock_sqlite::error::{StoreError, StoreResult};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;

pub use airlock_proto::plan::{PlanRecord, PlanRequest};
pub use airlock_proto::retry::{RetryExtensionOutcome, RetryExtensionRequest};
pub use airlock_proto::task::{
    ClaimGrant, Decision, TaskResult, TaskState, TaskSubmission, TaskView,
};

/// Longest lease a claim or renewal may ask for (one day).
pub const MAX_LEASE_MS: i64 = 24 * 60 * 60 * 1000;

/// Most rows one [`TaskStore::list`] or [`TaskStore::events`] call returns;
/// larger limits are clamped to it.
pub const MAX_PAGE: u32 = 1000;

/// Longest human detail kept in a denial event, in bytes.
pub const MAX_DENIAL_DETAIL_LEN: usize = 1024;

/// The name recorded as the actor of retry extensions (the seed's
/// `owner-control`): the owner acts through airlock-retryd, not as a uid.
pub const OWNER_CONTROL_ACTOR: &str = "owner-control";

/// The name of the system actor that expires leases ([`TaskStore::sweep_expired`]).
pub const LEASE_SWEEPER: &str = "lease-sweeper";

/// Schema tag of the retry-extension event payload.
pub const RETRY_EXTENSION_EVENT_SCHEMA: &str = "airlock.task-retry-extension.event.v1";

/// Event action names. An `allowed` event with an action records that it
/// happened; a `denied` event with the same action records a refused
/// attempt, with the refusal's code.
pub mod action {
    /// A task was submitted.
    pub const TASK_SUBMITTED: &str = "TASK_SUBMITTED";
    /// A queued task's plan was replaced.
    pub const TASK_PLAN_REPLACED: &str = "TASK_PLAN_REPLACED";
    /// A worker claimed a task (a new attempt and lease).
    pub const TASK_CLAIMED: &str = "TASK_CLAIMED";
    /// A worker renewed its lease.
    pub const TASK_LEASE_RENEWED: &str = "TASK_LEASE_RENEWED";
    /// The sweeper found a lease expired and requeued or failed the task.
    pub const TASK_LEASE_EXPIRED: &str = "TASK_LEASE_EXPIRED";
    /// A worker submitted the result of its attempt.
    pub const TASK_RESULT_SUBMITTED: &str = "TASK_RESULT_SUBMITTED";
    /// An admin decided on a verifying task (accept, rework, reject).
    pub const TASK_VERIFIED: &str = "TASK_VERIFIED";
    /// An admin cancelled a task.
    pub const TASK_CANCELLED: &str = "TASK_CANCELLED";
    /// The owner raised an exhausted task's attempt budget by one (the
    /// seed's event type, kept verbatim).
    pub const TASK_RETRY_EXTENSION_AUTHORIZED: &str = "TASK_RETRY_EXTENSION_AUTHORIZED";
    /// A queued task failed because its repository is no longer registered.
    pub const TASK_REPOSITORY_UNREGISTERED: &str = "TASK_REPOSITORY_UNREGISTERED";
}

/// The name of the system actor that fails the tasks of a repository no
/// longer registered ([`TaskStore::fail_unregistered`]).
pub const REPOSITORY_REGISTRY: &str = "repository-registry";

/// Who is acting, as recorded in events.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActorKind {
    /// An administrator (airlockctl, polkit-authorised).
    Admin,
    /// The planner (AI agent) proposing tasks and plans.
    Planner,
    /// The credentialed worker holding leases.
    Worker,
    /// The owner, through airlock-retryd.
    Owner,
    /// airlock itself (the lease sweeper, migrations).
    System,
}

impl ActorKind {
    /// Every kind.
    pub const ALL: &'static [ActorKind] = &[
        ActorKind::Admin,
        ActorKind::Planner,
        ActorKind::Worker,
        ActorKind::Owner,
        ActorKind::System,
    ];

    /// The name stored in the events table.
    pub fn as_str(self) -> &'static str {
        match self {
            ActorKind::Admin => "admin",
            ActorKind::Planner => "planner",
            ActorKind::Worker => "worker",
            ActorKind::Owner => "owner",
            ActorKind::System => "system",
        }
    }

    /// Parses a stored name.
    pub fn parse(s: &str) -> Option<Self> {
        ActorKind::ALL.iter().copied().find(|k| k.as_str() == s)
    }
}

/// Who performed (or attempted) an operation.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Actor {
    /// The role.
    pub kind: ActorKind,
    /// The peer's unix uid, when the channel tells it.
    pub uid: Option<u32>,
    /// A name for humans (a D-Bus sender, a worker id, `owner-control`).
    pub name: String,
}

impl Actor {
    /// An actor of `kind`.
    pub fn new(kind: ActorKind, uid: Option<u32>, name: impl Into<String>) -> Self {
        Actor {
            kind,
            uid,
            name: name.into(),
        }
    }

    /// An administrator.
    pub fn admin(uid: Option<u32>, name: impl Into<String>) -> Self {
        Actor::new(ActorKind::Admin, uid, name)
    }

    /// The planner.
    pub fn planner(uid: Option<u32>, name: impl Into<String>) -> Self {
        Actor::new(ActorKind::Planner, uid, name)
    }

    /// A worker; `name` becomes the task's `claimed_by`.
    pub fn worker(uid: Option<u32>, name: impl Into<String>) -> Self {
        Actor::new(ActorKind::Worker, uid, name)
    }

    /// airlock itself.
    pub fn system(name: impl Into<String>) -> Self {
        Actor::new(ActorKind::System, None, name)
    }

    /// The owner acting through airlock-retryd.
    pub fn owner_control() -> Self {
        Actor::new(ActorKind::Owner, None, OWNER_CONTROL_ACTOR)
    }
}

/// Whether an event records something done or something refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventOutcome {
    /// The operation happened.
    Allowed,
    /// The operation was refused; the event carries the code.
    Denied,
}

impl EventOutcome {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            EventOutcome::Allowed => "allowed",
            EventOutcome::Denied => "denied",
        }
    }
}

/// One row of the append-only event log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Increasing id; page with `after_event_id`.
    pub id: i64,
    /// The task, when the event concerns one (and its id was well formed).
    pub task_id: Option<String>,
    /// When (store time, unix ms).
    pub at_ms: i64,
    /// Who.
    pub actor: Actor,
    /// What (see [`action`]).
    pub action: String,
    /// Done or refused.
    pub outcome: EventOutcome,
    /// The refusal code of a denied event.
    pub code: Option<Code>,
    /// Details; never a lease token or other secret.
    pub payload: Value,
}

impl Event {
    /// The event as the bus shows it (`airlock_proto::bus::EventRecord`).
    pub fn to_record(&self) -> airlock_proto::bus::EventRecord {
        airlock_proto::bus::EventRecord {
            id: self.id,
            task_id: self.task_id.clone(),
            at_ms: self.at_ms,
            actor: serde_json::to_value(&self.actor).unwrap_or(Value::Null),
            action: self.action.clone(),
            outcome: self.outcome.as_str().to_owned(),
            code: self.code.map(|c| c.as_str().to_owned()),
            payload: self.payload.clone(),
        }
    }

    /// The event as a JSON object (the code by its name), for CLIs and logs.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self.to_record()).unwrap_or(Value::Null)
    }
}

/// What [`TaskStore::submit`] returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Submitted {
    /// The task as stored now.
    pub task: TaskView,
    /// True when the submission replayed an identical earlier one.
    pub idempotent: bool,
}

/// What [`TaskStore::submit_result`] returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResultReceipt {
    /// The task as stored now.
    pub task: TaskView,
    /// True when the result replayed an identical earlier submission.
    pub idempotent: bool,
}

/// How many tasks are in each state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueSummary {
    /// QUEUED.
    pub queued: u64,
    /// RUNNING.
    pub running: u64,
    /// VERIFYING.
    pub verifying: u64,
    /// SUCCEEDED.
    pub succeeded: u64,
    /// FAILED.
    pub failed: u64,
    /// CANCELLED.
    pub cancelled: u64,
}

impl QueueSummary {
    /// The count for one state.
    pub fn count(&self, state: TaskState) -> u64 {
        match state {
            TaskState::Queued => self.queued,
            TaskState::Running => self.running,
            TaskState::Verifying => self.verifying,
            TaskState::Succeeded => self.succeeded,
            TaskState::Failed => self.failed,
            TaskState::Cancelled => self.cancelled,
        }
    }

    fn slot(&mut self, state: TaskState) -> &mut u64 {
        match state {
            TaskState::Queued => &mut self.queued,
            TaskState::Running => &mut self.running,
            TaskState::Verifying => &mut self.verifying,
            TaskState::Succeeded => &mut self.succeeded,
            TaskState::Failed => &mut self.failed,
            TaskState::Cancelled => &mut self.cancelled,
        }
    }

    /// Every task.
    pub fn total(&self) -> u64 {
        TaskState::ALL.iter().map(|s| self.count(*s)).sum()
    }
}

/// SHA-256 of the canonical JSON of a task's verification record, as the
/// owner computes it for a retry extension: no record (or an empty one)
/// hashes like `{}`; a record that is not JSON is `TASK_VERIFICATION_INVALID`.
pub fn verification_sha256(verification_json: Option<&str>) -> StoreResult<String> {
    let value = match verification_json {
        None | Some("") => Value::Object(serde_json::Map::new()),
        Some(raw) => serde_json::from_str::<Value>(raw).map_err(|e| {
            Error::with(
                Code::TASK_VERIFICATION_INVALID,
                format!("verification record: {e}"),
            )
        })?,
    };
    digest_of(&value)
        .map_err(|e| Error::with(Code::TASK_VERIFICATION_INVALID, e.to_string()).into())
}

/// The supervisor's task store. One value per connection; a second process
/// may open the same file (writers serialise on `BEGIN IMMEDIATE`).
#[derive(Debug)]
pub struct TaskStore {
    conn: Connection,
    clock: Arc<dyn Clock>,
}

impl TaskStore {
    /// Opens (creating and migrating if needed) the task store at `path`,
    /// judging time by the system clock.
    pub fn open(path: &Path) -> StoreResult<Self> {
        TaskStore::open_with_clock(path, Arc::new(SystemClock))
    }

    /// Opens the task store with an injected clock (tests, fault injection).
    pub fn open_with_clock(path: &Path, clock: Arc<dyn Clock>) -> StoreResult<Self> {
        let conn = db::open(path, Kind::Tasks, schema::MIGRATIONS)?;
        Ok(TaskStore { conn, clock })
    }

    /// The store's current time: `max(clock, persisted high-water mark)`.
    /// Reading it does not advance the mark; every mutation does.
    pub fn now_ms(&self) -> StoreResult<i64> {
        let high_water = read_high_water(&self.conn)?;
        Ok(self.clock.now_ms().max(high_water))
    }

    /// One task.
    pub fn get(&self, task_id: &str) -> StoreResult<TaskView> {
        check_task_id(task_id)?;
        row::load(&self.conn, task_id)?
            .ok_or_else(|| not_found(task_id))?
            .view()
    }

    /// Tasks ordered by task id, optionally only those in `state`, starting
    /// after `after_task_id` (exclusive). `limit` is clamped to [`MAX_PAGE`].
    pub fn list(
        &self,
        state: Option<TaskState>,
        after_task_id: Option<&str>,
        limit: u32,
    ) -> StoreResult<Vec<TaskView>> {
        let sql = format!(
            "SELECT {} FROM tasks WHERE (?1 IS NULL OR status = ?1) AND (?2 IS NULL OR task_id > ?2) \
             ORDER BY task_id LIMIT ?3",
            row::COLUMNS
        );
        let mut stmt = self
            .conn
            .prepare(&sql)
            .map_err(|e| StoreError::sqlite("listing tasks", e))?;
        let rows = stmt
            .query_map(
                params![
                    state.map(TaskState::as_str),
                    after_task_id,
                    limit.min(MAX_PAGE)
                ],
                row::RawRow::from_sql,
            )
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(|e| StoreError::sqlite("listing tasks", e))?;
        rows.into_iter()
            .map(|raw| raw.into_row().and_then(|r| r.view()))
            .collect()
    }

    /// How many tasks are in each state.
    pub fn summary(&self) -> StoreResult<QueueSummary> {
        let mut stmt = self
            .conn
            .prepare("SELECT status, COUNT(*) FROM tasks GROUP BY status")
            .map_err(|e| StoreError::sqlite("summarising tasks", e))?;
        let counts = stmt
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(|e| StoreError::sqlite("summarising tasks", e))?;
        let mut summary = QueueSummary::default();
        for (status, n) in counts {
            let state = row::parse_state(&status)?;
            *summary.slot(state) = u64::try_from(n).unwrap_or(0);
        }
        Ok(summary)
    }

    /// Events in id order after `after_event_id`, optionally only those of
    /// one task. `limit` is clamped to [`MAX_PAGE`].
    pub fn events(
        &self,
        task_id: Option<&str>,
        after_event_id: i64,
        limit: u32,
    ) -> StoreResult<Vec<Event>> {
        audit::list(&self.conn, task_id, after_event_id, limit.min(MAX_PAGE))
    }

    /// Records a refusal decided outside the store (a polkit denial, a peer
    /// uid mismatch, a malformed D-Bus message), so every denial is audited
    /// in one place. `task_id` is kept only when it is a well-formed id.
    pub fn record_denial(
        &mut self,
        task_id: Option<&str>,
        actor: &Actor,
        action: &str,
        code: Code,
        detail: &str,
    ) -> StoreResult<()> {
        let wall = self.clock.now_ms();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| StoreError::sqlite("starting a denial record", e))?;
        let now = advance_time(&tx, wall)?;
        audit::append_denial(&tx, now, task_id, actor, action, code, detail)?;
        tx.commit()
            .map_err(|e| StoreError::sqlite("committing a denial record", e))
    }

    /// `PRAGMA integrity_check`; anything but "ok" is `STORE_CORRUPT`.
    pub fn integrity_check(&self) -> StoreResult<()> {
        db::integrity_check(&self.conn)
    }

    /// Runs `f` in a `BEGIN IMMEDIATE` transaction at the store's current
    /// time, committing only when it succeeds (dropping the transaction
    /// rolls it back).
    fn write<T>(
        &mut self,
        what: &str,
        f: impl FnOnce(&Connection, i64) -> StoreResult<T>,
    ) -> StoreResult<T> {
        let wall = self.clock.now_ms();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| StoreError::sqlite(format!("starting {what}"), e))?;
        let now = advance_time(&tx, wall)?;
        let out = f(&tx, now)?;
        tx.commit()
            .map_err(|e| StoreError::sqlite(format!("committing {what}"), e))?;
        Ok(out)
    }

    /// Passes `result` through, first recording a refusal as a denied event.
    /// If recording fails the refusal is still returned: the caller's next
    /// step depends on its code, and nothing was changed either way.
    fn audited<T>(
        &mut self,
        result: StoreResult<T>,
        task_id: Option<&str>,
        actor: &Actor,
        action: &str,
    ) -> StoreResult<T> {
        if let Err(StoreError::Refused(e)) = &result {
            let detail = e.detail.as_deref().unwrap_or("");
            let _ = self.record_denial(task_id, actor, action, e.code, detail);
        }
        result
    }
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

fn check_task_id(task_id: &str) -> StoreResult<()> {
    if is_task_id(task_id) {
        Ok(())
    } else {
        Err(Error::with(Code::TASK_ID_INVALID, "not a well-formed task id").into())
    }
}

fn not_found(task_id: &str) -> StoreError {
    Error::with(Code::TASK_NOT_FOUND, task_id.to_owned()).into()
}

fn check_lease_ms(lease_ms: i64) -> StoreResult<()> {
    if (1..=MAX_LEASE_MS).contains(&lease_ms) {
        Ok(())
    } else {
        Err(Error::with(
            Code::FIELD_BOUNDS_EXCEEDED,
            format!("lease_ms {lease_ms} is outside 1..={MAX_LEASE_MS}"),
        )
        .into())
    }
}

//! A task row: reading it, checking it, writing it back under its revision.

use airlock_proto::binding::Binding;
use airlock_proto::plan::PlanRecord;
use airlock_proto::task::{TaskState, TaskView};
use airlock_proto::{Code, Error};
use airlock_sqlite::error::{StoreError, StoreResult};
use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;

/// The columns [`RawRow::from_sql`] reads, in order.
pub(super) const COLUMNS: &str = "task_id, status, attempt, max_attempts, revision, lease_epoch, \
     claimed_by, lease_token_hash, lease_expires_at, verification_json, result_json, \
     binding_json, plan_json, envelope_json, execution_digest, plan_digest, idempotency_key, \
     submission_sha256, created_at_ms, updated_at_ms";

/// A row exactly as SQLite returned it.
#[derive(Debug)]
pub(super) struct RawRow {
    task_id: String,
    status: String,
    attempt: i64,
    max_attempts: i64,
    revision: i64,
    lease_epoch: i64,
    claimed_by: Option<String>,
    lease_token_hash: Option<String>,
    lease_expires_at: Option<i64>,
    verification_json: Option<String>,
    result_json: Option<String>,
    binding_json: String,
    plan_json: String,
    envelope_json: String,
    execution_digest: String,
    plan_digest: String,
    idempotency_key: String,
    submission_sha256: String,
    created_at_ms: i64,
    updated_at_ms: i64,
}

impl RawRow {
    /// Reads the [`COLUMNS`] of one result row.
    pub(super) fn from_sql(r: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        Ok(RawRow {
            task_id: r.get(0)?,
            status: r.get(1)?,
            attempt: r.get(2)?,
            max_attempts: r.get(3)?,
            revision: r.get(4)?,
            lease_epoch: r.get(5)?,
            claimed_by: r.get(6)?,
            lease_token_hash: r.get(7)?,
            lease_expires_at: r.get(8)?,
            verification_json: r.get(9)?,
            result_json: r.get(10)?,
            binding_json: r.get(11)?,
            plan_json: r.get(12)?,
            envelope_json: r.get(13)?,
            execution_digest: r.get(14)?,
            plan_digest: r.get(15)?,
            idempotency_key: r.get(16)?,
            submission_sha256: r.get(17)?,
            created_at_ms: r.get(18)?,
            updated_at_ms: r.get(19)?,
        })
    }

    /// Checks the typed invariants; a row that breaks one is `STORE_CORRUPT`.
    pub(super) fn into_row(self) -> StoreResult<TaskRow> {
        let corrupt = |what: &str| corrupt(&self.task_id, what);
        Ok(TaskRow {
            status: parse_state(&self.status)?,
            attempt: u32::try_from(self.attempt).map_err(|_| corrupt("attempt"))?,
            max_attempts: u32::try_from(self.max_attempts).map_err(|_| corrupt("max_attempts"))?,
            revision: self.revision,
            lease_epoch: u64::try_from(self.lease_epoch).map_err(|_| corrupt("lease_epoch"))?,
            task_id: self.task_id,
            claimed_by: self.claimed_by,
            lease_token_hash: self.lease_token_hash,
            lease_expires_at: self.lease_expires_at,
            verification_json: self.verification_json,
            result_json: self.result_json,
            binding_json: self.binding_json,
            plan_json: self.plan_json,
            envelope_json: self.envelope_json,
            execution_digest: self.execution_digest,
            plan_digest: self.plan_digest,
            idempotency_key: self.idempotency_key,
            submission_sha256: self.submission_sha256,
            created_at_ms: self.created_at_ms,
            updated_at_ms: self.updated_at_ms,
        })
    }
}

/// A task row with typed state and counters.
#[derive(Clone, Debug)]
pub(super) struct TaskRow {
    pub task_id: String,
    pub status: TaskState,
    pub attempt: u32,
    pub max_attempts: u32,
    pub revision: i64,
    pub lease_epoch: u64,
    pub claimed_by: Option<String>,
    pub lease_token_hash: Option<String>,
    pub lease_expires_at: Option<i64>,
    pub verification_json: Option<String>,
    pub result_json: Option<String>,
    pub binding_json: String,
    pub plan_json: String,
    pub envelope_json: String,
    pub execution_digest: String,
    pub plan_digest: String,
    pub idempotency_key: String,
    pub submission_sha256: String,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
}

pub(super) fn corrupt(task_id: &str, what: &str) -> StoreError {
    Error::with(
        Code::STORE_CORRUPT,
        format!("task {task_id}: stored {what} is malformed"),
    )
    .into()
}

/// Parses a stored status.
pub(super) fn parse_state(s: &str) -> StoreResult<TaskState> {
    TaskState::parse(s).map_err(|_| {
        Error::with(Code::STORE_CORRUPT, format!("unknown stored status {s:?}")).into()
    })
}

/// Loads one task, or `None`.
pub(super) fn load(conn: &Connection, task_id: &str) -> StoreResult<Option<TaskRow>> {
    conn.query_row(
        &format!("SELECT {COLUMNS} FROM tasks WHERE task_id = ?1"),
        [task_id],
        RawRow::from_sql,
    )
    .optional()
    .map_err(|e| StoreError::sqlite("loading a task", e))?
    .map(RawRow::into_row)
    .transpose()
}

/// Loads the task whose binding carries `key`, or `None`.
pub(super) fn load_by_key(conn: &Connection, key: &str) -> StoreResult<Option<TaskRow>> {
    conn.query_row(
        &format!("SELECT {COLUMNS} FROM tasks WHERE idempotency_key = ?1"),
        [key],
        RawRow::from_sql,
    )
    .optional()
    .map_err(|e| StoreError::sqlite("loading a task by idempotency key", e))?
    .map(RawRow::into_row)
    .transpose()
}

impl TaskRow {
    /// The stored binding, which must name the row's own task and key.
    pub(super) fn binding(&self) -> StoreResult<Binding> {
        let value: Value = serde_json::from_str(&self.binding_json)
            .map_err(|_| corrupt(&self.task_id, "binding"))?;
        let binding = Binding::from_value(&value).map_err(|_| corrupt(&self.task_id, "binding"))?;
        if binding.task_id != self.task_id || binding.idempotency_key != self.idempotency_key {
            return Err(corrupt(&self.task_id, "binding"));
        }
        Ok(binding)
    }

    /// The stored plan record.
    pub(super) fn plan(&self) -> StoreResult<PlanRecord> {
        serde_json::from_str(&self.plan_json).map_err(|_| corrupt(&self.task_id, "plan"))
    }

    /// The stored envelope, as JSON.
    pub(super) fn envelope(&self) -> StoreResult<Value> {
        serde_json::from_str(&self.envelope_json).map_err(|_| corrupt(&self.task_id, "envelope"))
    }

    /// The task as admins and planners see it.
    pub(super) fn view(&self) -> StoreResult<TaskView> {
        let result = match &self.result_json {
            None => None,
            Some(raw) => {
                Some(serde_json::from_str(raw).map_err(|_| corrupt(&self.task_id, "result"))?)
            }
        };
        let verification = match self.verification_json.as_deref() {
            None | Some("") => None,
            Some(raw) => Some(serde_json::from_str(raw).map_err(|e| {
                Error::with(
                    Code::TASK_VERIFICATION_INVALID,
                    format!("task {}: {e}", self.task_id),
                )
            })?),
        };
        Ok(TaskView {
            task_id: self.task_id.clone(),
            state: self.status,
            attempt: self.attempt,
            max_attempts: self.max_attempts,
            revision: self.revision,
            lease_epoch: self.lease_epoch,
            lease_expires_at_ms: self.lease_expires_at,
            binding: self.binding()?,
            plan_digest: self.plan_digest.clone(),
            execution_digest: self.execution_digest.clone(),
            result,
            verification,
            created_at_ms: self.created_at_ms,
            updated_at_ms: self.updated_at_ms,
        })
    }

    /// Attempts are left for another claim.
    pub(super) fn has_attempts_left(&self) -> bool {
        self.attempt < self.max_attempts
    }

    /// Drops the lease (token hash and expiry). `claimed_by` is kept as
    /// history of who held the last attempt.
    pub(super) fn clear_lease(&mut self) {
        self.lease_token_hash = None;
        self.lease_expires_at = None;
    }

    /// Writes the mutable columns back, bumping the revision, on condition
    /// that nobody changed the row since it was read. Inside an immediate
    /// transaction a lost race is impossible, so one is an internal error.
    pub(super) fn save(&mut self, conn: &Connection, now: i64) -> StoreResult<()> {
        let read_revision = self.revision;
        self.revision = read_revision + 1;
        self.updated_at_ms = now;
        let lease_epoch = i64::try_from(self.lease_epoch)
            .map_err(|_| Error::with(Code::INTERNAL, "lease epoch overflow"))?;
        let changed = conn
            .execute(
                "UPDATE tasks SET status = ?1, attempt = ?2, max_attempts = ?3, revision = ?4, \
                 lease_epoch = ?5, claimed_by = ?6, lease_token_hash = ?7, lease_expires_at = ?8, \
                 verification_json = ?9, result_json = ?10, plan_json = ?11, envelope_json = ?12, \
                 execution_digest = ?13, plan_digest = ?14, updated_at_ms = ?15 \
                 WHERE task_id = ?16 AND revision = ?17",
                params![
                    self.status.as_str(),
                    self.attempt,
                    self.max_attempts,
                    self.revision,
                    lease_epoch,
                    self.claimed_by,
                    self.lease_token_hash,
                    self.lease_expires_at,
                    self.verification_json,
                    self.result_json,
                    self.plan_json,
                    self.envelope_json,
                    self.execution_digest,
                    self.plan_digest,
                    self.updated_at_ms,
                    self.task_id,
                    read_revision,
                ],
            )
            .map_err(|e| StoreError::sqlite("updating a task", e))?;
        if changed == 1 {
            Ok(())
        } else {
            Err(Error::with(
                Code::INTERNAL,
                format!(
                    "task {} changed under an immediate transaction",
                    self.task_id
                ),
            )
            .into())
        }
    }
}

//! A task row as the engines return it: checking it, viewing it, writing
//! it back under its revision and a guard.

use super::moves::{self, Move};
use super::tx::{Guard, Tx};
use super::{Actor, ActorKind, Event, EventOutcome};
use crate::error::{StoreError, StoreResult};
use airlock_proto::binding::Binding;
use airlock_proto::plan::PlanRecord;
use airlock_proto::states::{self, Step};
use airlock_proto::task::{Submitter, TaskState, TaskView};
use airlock_proto::{Code, Error};
use serde_json::Value;

/// The columns every engine reads into a [`RawRow`], in order.
pub(super) const COLUMNS: &str = "task_id, status, attempt, max_attempts, revision, lease_epoch, \
     claimed_by, lease_token_hash, lease_expires_at, verification_json, result_json, \
     binding_json, plan_json, envelope_json, execution_digest, plan_digest, idempotency_key, \
     submission_sha256, created_at_ms, updated_at_ms, submitter_uid, submitter_agent, \
     fenced_until_ms";

/// A [`RawRow`] read from a row of [`COLUMNS`] by the engine's reader
/// (`raw_row!(r.get)`, `raw_row!(r.try_get)`).
macro_rules! raw_row {
    ($r:ident . $get:ident) => {
        airlock_sqlite::columns!(RawRow {
            task_id, status, attempt, max_attempts, revision, lease_epoch, claimed_by,
            lease_token_hash, lease_expires_at, verification_json, result_json, binding_json,
            plan_json, envelope_json, execution_digest, plan_digest, idempotency_key,
            submission_sha256, created_at_ms, updated_at_ms, submitter_uid, submitter_agent,
            fenced_until_ms
        } from $r.$get)
    };
}
pub(super) use raw_row;

/// A row exactly as the engine returned it ([`COLUMNS`], in order).
#[derive(Debug)]
pub struct RawRow {
    pub task_id: String,
    pub status: String,
    pub attempt: i64,
    pub max_attempts: i64,
    pub revision: i64,
    pub lease_epoch: i64,
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
    pub submitter_uid: Option<i64>,
    pub submitter_agent: Option<String>,
    pub fenced_until_ms: Option<i64>,
}

impl RawRow {
    /// Checks the typed invariants; a row that breaks one is `STORE_CORRUPT`.
    pub fn into_row(self) -> StoreResult<TaskRow> {
        let corrupt = |what: &str| corrupt(&self.task_id, what);
        Ok(TaskRow {
            status: parse_state(&self.status)?,
            moving: None,
            attempt: u32::try_from(self.attempt).map_err(|_| corrupt("attempt"))?,
            max_attempts: u32::try_from(self.max_attempts).map_err(|_| corrupt("max_attempts"))?,
            revision: self.revision,
            lease_epoch: u64::try_from(self.lease_epoch).map_err(|_| corrupt("lease_epoch"))?,
            claimed_by: self.claimed_by,
            lease_token_hash: self.lease_token_hash,
            lease_expires_at: self.lease_expires_at,
            fenced_until: self.fenced_until_ms,
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
            submitter: match (self.submitter_uid, self.submitter_agent) {
                (None, None) => None,
                (uid, agent) => Some(Submitter {
                    uid: uid
                        .map(u32::try_from)
                        .transpose()
                        .map_err(|_| corrupt("submitter_uid"))?,
                    agent,
                }),
            },
            task_id: self.task_id,
        })
    }
}

/// A task row with typed state and counters. Its state is private: only
/// [`TaskRow::advance`], the one writer of task state, changes it.
#[derive(Clone, Debug)]
pub struct TaskRow {
    pub task_id: String,
    status: TaskState,
    /// The move [`TaskRow::advance`] made and no write has persisted yet.
    moving: Option<Move>,
    pub attempt: u32,
    pub max_attempts: u32,
    pub revision: i64,
    pub lease_epoch: u64,
    pub claimed_by: Option<String>,
    pub lease_token_hash: Option<String>,
    pub lease_expires_at: Option<i64>,
    /// Until when the lease holder's fence stands (`Worker1.Fence`): no
    /// cancel, no expiry before it.
    pub fenced_until: Option<i64>,
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
    /// Who submitted it; never written back.
    submitter: Option<Submitter>,
}

pub fn corrupt(task_id: &str, what: &str) -> StoreError {
    Error::with(
        Code::STORE_CORRUPT,
        format!("task {task_id}: stored {what} is malformed"),
    )
    .into()
}

/// Parses a stored status.
pub fn parse_state(s: &str) -> StoreResult<TaskState> {
    TaskState::parse(s).map_err(|_| {
        Error::with(Code::STORE_CORRUPT, format!("unknown stored status {s:?}")).into()
    })
}

impl TaskRow {
    /// The task's state.
    pub fn status(&self) -> TaskState {
        self.status
    }

    /// The one writer of task state: moves the task by `step` to the state
    /// [`states::next`] picks from `airlock_proto::states::TRANSITIONS`
    /// (the table's precondition, then the attempts rule: attempts left or
    /// not), or refuses (`TASK_STATE_INVALID` when no row fits). Returns
    /// the new state. One step per write: [`TaskRow::save`] (or the retry
    /// extension's compare-and-swap) persists it, and no row is written
    /// without one.
    pub fn advance(&mut self, step: Step) -> StoreResult<TaskState> {
        if let Some(m) = self.moving {
            return Err(Error::with(
                Code::INTERNAL,
                format!(
                    "task {}: {} after {}, in one write",
                    self.task_id,
                    step.name(),
                    m.step.name()
                ),
            )
            .into());
        }
        let from = self.status;
        let to = states::next(from, step, self.has_attempts_left())?;
        self.status = to;
        self.moving = Some(Move { from, step, to });
        Ok(to)
    }

    /// Marks the move made by [`TaskRow::advance`] as persisted (reported
    /// to the move observer when its transaction commits). A write without
    /// a move is an internal error: every write of a task row is a step.
    pub fn persisted(&mut self) -> StoreResult<()> {
        let m = self.moving.take().ok_or_else(|| {
            Error::with(
                Code::INTERNAL,
                format!("task {}: a write without a step", self.task_id),
            )
        })?;
        moves::performed(&self.task_id, m);
        Ok(())
    }

    /// The stored binding, which must name the row's own task and key.
    pub fn binding(&self) -> StoreResult<Binding> {
        let value: Value = serde_json::from_str(&self.binding_json)
            .map_err(|_| corrupt(&self.task_id, "binding"))?;
        let binding = Binding::from_value(&value).map_err(|_| corrupt(&self.task_id, "binding"))?;
        if binding.task_id != self.task_id || binding.idempotency_key != self.idempotency_key {
            return Err(corrupt(&self.task_id, "binding"));
        }
        Ok(binding)
    }

    /// The stored plan record.
    pub fn plan(&self) -> StoreResult<PlanRecord> {
        serde_json::from_str(&self.plan_json).map_err(|_| corrupt(&self.task_id, "plan"))
    }

    /// The stored envelope, as JSON.
    pub fn envelope(&self) -> StoreResult<Value> {
        serde_json::from_str(&self.envelope_json).map_err(|_| corrupt(&self.task_id, "envelope"))
    }

    /// The stored result, as shown.
    pub fn result(&self) -> StoreResult<Option<Value>> {
        match &self.result_json {
            None => Ok(None),
            Some(raw) => Ok(Some(
                serde_json::from_str(raw).map_err(|_| corrupt(&self.task_id, "result"))?,
            )),
        }
    }

    /// SHA-256 of the result as shown ([`airlock_proto::task::result_sha256`]).
    pub fn result_sha256(&self) -> StoreResult<Option<String>> {
        self.result()?
            .map(|r| {
                airlock_proto::task::result_sha256(&r).map_err(|_| corrupt(&self.task_id, "result"))
            })
            .transpose()
    }

    /// The task as admins and planners see it.
    pub fn view(&self) -> StoreResult<TaskView> {
        let result = self.result()?;
        let result_sha256 = self.result_sha256()?;
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
            result_sha256,
            verification,
            created_at_ms: self.created_at_ms,
            updated_at_ms: self.updated_at_ms,
            submitter: self.submitter.clone(),
        })
    }

    /// Who submitted the task, if that is on record.
    pub fn submitter(&self) -> Option<Submitter> {
        self.submitter.clone()
    }

    /// Attempts are left for another claim.
    pub fn has_attempts_left(&self) -> bool {
        self.attempt < self.max_attempts
    }

    /// Drops the lease (token hash, expiry and fence). `claimed_by` is
    /// kept as history of who held the last attempt.
    pub fn clear_lease(&mut self) {
        self.lease_token_hash = None;
        self.lease_expires_at = None;
        self.fenced_until = None;
    }

    /// The end of the holder's fence, when one stands at `now`.
    pub fn fence_at(&self, now: i64) -> Option<i64> {
        self.fenced_until.filter(|&until| until > now)
    }

    /// The lease epoch as the engines store it.
    pub fn lease_epoch_i64(&self) -> StoreResult<i64> {
        i64::try_from(self.lease_epoch)
            .map_err(|_| Error::with(Code::INTERNAL, "lease epoch overflow").into())
    }

    /// Writes the mutable columns back (the state as [`TaskRow::advance`]
    /// moved it), bumping the revision, on condition
    /// that the row is still at the revision it was read at and `guard`
    /// holds. Rows are read inside the writing transaction (and locked
    /// there by engines that lock rows), so a failed condition means
    /// another writer got in first: for a lease guard the lease is lost
    /// (`LEASE_EXPIRED`), for an attempt guard the state moved on
    /// (`TASK_STATE_INVALID`), otherwise it is an internal error.
    pub fn save(&mut self, tx: &mut dyn Tx, guard: Guard<'_>) -> StoreResult<()> {
        let read_revision = self.revision;
        self.revision = read_revision + 1;
        self.updated_at_ms = tx.now();
        if tx.update(self, read_revision, guard)? {
            return self.persisted();
        }
        let lost = match guard {
            Guard::Lease { .. } => Error::with(Code::LEASE_EXPIRED, "the lease was lost"),
            Guard::Attempt { .. } => Error::with(
                Code::TASK_STATE_INVALID,
                "the task moved on before the decision was written",
            ),
            Guard::Revision => Error::with(
                Code::INTERNAL,
                format!("task {} changed under its transaction", self.task_id),
            ),
        };
        Err(lost.into())
    }
}

/// The events table's columns, in [`RawEvent`]'s order.
pub(super) const EVENT_COLUMNS: &str =
    "id, task_id, at_ms, actor_kind, actor_uid, actor_name, action, outcome, code, payload_json";

/// A [`RawEvent`] read from a row of [`EVENT_COLUMNS`] by the engine's
/// reader (`raw_event!(r.get)`, `raw_event!(r.try_get)`).
macro_rules! raw_event {
    ($r:ident . $get:ident) => {
        airlock_sqlite::columns!(RawEvent {
            id, task_id, at_ms, actor_kind, actor_uid, actor_name, action, outcome, code,
            payload_json
        } from $r.$get)
    };
}
pub(super) use raw_event;

/// An event row exactly as the engine returned it ([`EVENT_COLUMNS`], in
/// order).
#[derive(Debug)]
pub struct RawEvent {
    pub id: i64,
    pub task_id: Option<String>,
    pub at_ms: i64,
    pub actor_kind: String,
    pub actor_uid: Option<i64>,
    pub actor_name: String,
    pub action: String,
    pub outcome: String,
    pub code: Option<String>,
    pub payload_json: String,
}

impl RawEvent {
    /// Checks and types the row; a bad one is `STORE_CORRUPT`.
    pub fn into_event(self) -> StoreResult<Event> {
        let id = self.id;
        let bad = |what: &str| -> StoreError {
            Error::with(Code::STORE_CORRUPT, format!("event {id}: bad {what}")).into()
        };
        let kind = ActorKind::parse(&self.actor_kind).ok_or_else(|| bad("actor kind"))?;
        let uid = match self.actor_uid {
            None => None,
            Some(u) => Some(u32::try_from(u).map_err(|_| bad("actor uid"))?),
        };
        let outcome = match self.outcome.as_str() {
            "allowed" => EventOutcome::Allowed,
            "denied" => EventOutcome::Denied,
            _ => return Err(bad("outcome")),
        };
        let code = match self.code {
            None => None,
            Some(c) => Some(Code::from_name(&c).ok_or_else(|| bad("code"))?),
        };
        let payload = serde_json::from_str(&self.payload_json).map_err(|_| bad("payload"))?;
        Ok(Event {
            id,
            task_id: self.task_id,
            at_ms: self.at_ms,
            actor: Actor {
                kind,
                uid,
                name: self.actor_name,
            },
            action: self.action,
            outcome,
            code,
            payload,
        })
    }
}

//! Submitting tasks, replacing plans, verification decisions, cancellation.

use super::row::TaskRow;
use super::tx::{Backend, Guard, NewTask};
use super::{Actor, Store, Submitted, action, audit, check_task_id, not_found};
use airlock_proto::binding::Binding;
use airlock_proto::canonical::{digest_of, to_canonical_string};
use airlock_proto::limits::MAX_ATTEMPTS_CAP;
use airlock_proto::plan::{PLAN_SCHEMA, PlanRecord, PlanRequest, register_plan};
use airlock_proto::states::{self, Op};
use airlock_proto::task::{
    Decision, TASK_SCHEMA, TaskState, TaskSubmission, TaskView, check_reason,
};
use airlock_proto::{Code, Error};
use airlock_sqlite::error::{StoreError, StoreResult};
use serde_json::{Value, json};

/// The submission in normal form: what "the same submission" compares.
fn submission_value(s: &TaskSubmission) -> Value {
    json!({
        "schema": TASK_SCHEMA,
        "binding": s.binding.to_value(),
        "plan": {
            "schema": PLAN_SCHEMA,
            "task_id": s.plan.task_id,
            "job_id": s.plan.job_id,
            "source_head_oid": s.plan.source_head_oid,
            "generation": s.plan.generation,
            "idempotency_key": s.plan.idempotency_key,
            "execution": s.plan.execution.to_value(),
            "expected_previous_plan_digest": s.plan.expected_previous_plan_digest,
        },
        "max_attempts": s.max_attempts,
    })
}

fn record_json(record: &PlanRecord) -> StoreResult<String> {
    Ok(airlock_proto::canonical::canonical_of(record)?)
}

/// The state table's verdict on `op` for this row (`docs/states.md`).
fn permitted(row: &TaskRow, op: Op) -> StoreResult<()> {
    states::check(op, row.status).map_err(StoreError::from)
}

impl<B: Backend> Store<B> {
    /// Submits a task: validates the binding, registers the plan (see
    /// [`register_plan`]) and queues the task at attempt 0.
    ///
    /// Idempotent by the binding's idempotency key: the same key with the
    /// identical submission returns the stored task with `idempotent: true`
    /// (even after the task moved on); the same key with other content, or
    /// the same task id under another key, is `TASK_IDEMPOTENCY_CONFLICT`.
    /// Validation runs before any lookup, so an invalid submission is
    /// refused with its own code whatever is stored.
    pub fn submit(&mut self, s: &TaskSubmission, actor: &Actor) -> StoreResult<Submitted> {
        let result = self.submit_inner(s, actor);
        self.audited(
            result,
            Some(&s.binding.task_id),
            actor,
            action::TASK_SUBMITTED,
        )
    }

    fn submit_inner(&mut self, s: &TaskSubmission, actor: &Actor) -> StoreResult<Submitted> {
        if !(1..=MAX_ATTEMPTS_CAP).contains(&s.max_attempts) {
            return Err(Error::with(
                Code::MAX_ATTEMPTS_INVALID,
                format!(
                    "max_attempts {} is outside 1..={MAX_ATTEMPTS_CAP}",
                    s.max_attempts
                ),
            )
            .into());
        }
        // The fields are public, so a caller may have built the binding by
        // hand: parse it again so only a valid binding is ever stored.
        let binding = Binding::from_value(&s.binding.to_value())?;
        let registration = register_plan(&binding, &s.plan, None)?;
        let submission_sha256 = digest_of(&submission_value(s))?;
        let binding_json = to_canonical_string(&binding.to_value())?;
        let plan_json = record_json(&registration.record)?;
        let envelope_json = to_canonical_string(&registration.envelope.to_value())?;
        let plan_digest = registration.record.plan_digest.clone();
        let execution_digest = registration.envelope.execution_digest.clone();
        self.backend.write("a task submission", &mut |tx| {
            if let Some(existing) = tx.load_by_key(&binding.idempotency_key)? {
                if existing.submission_sha256 == submission_sha256 {
                    return Ok(Submitted {
                        task: existing.view()?,
                        idempotent: true,
                    });
                }
                return Err(Error::with(
                    Code::TASK_IDEMPOTENCY_CONFLICT,
                    "the idempotency key was used with another submission",
                )
                .into());
            }
            if tx.load(&binding.task_id)?.is_some() {
                return Err(Error::with(
                    Code::TASK_IDEMPOTENCY_CONFLICT,
                    "the task id exists under another idempotency key",
                )
                .into());
            }
            tx.insert_task(&NewTask {
                task_id: &binding.task_id,
                repository: &binding.repository,
                max_attempts: s.max_attempts,
                binding_json: &binding_json,
                plan_json: &plan_json,
                envelope_json: &envelope_json,
                execution_digest: &execution_digest,
                plan_digest: &plan_digest,
                idempotency_key: &binding.idempotency_key,
                submission_sha256: &submission_sha256,
            })?;
            audit::append_allowed(
                tx,
                &binding.task_id,
                actor,
                action::TASK_SUBMITTED,
                json!({
                    "idempotency_key": binding.idempotency_key,
                    "max_attempts": s.max_attempts,
                    "plan_digest": plan_digest,
                    "execution_digest": execution_digest,
                    "submission_sha256": submission_sha256,
                }),
            )?;
            let task = tx
                .load(&binding.task_id)?
                .ok_or_else(|| not_found(&binding.task_id))?
                .view()?;
            Ok(Submitted {
                task,
                idempotent: false,
            })
        })
    }

    /// Replaces a queued task's plan under the rules of [`register_plan`]
    /// against the stored record: another plan key must name the stored
    /// plan's digest (`EXECUTION_PLAN_REPLACEMENT_CAS_MISMATCH`), the same
    /// key with other content is `EXECUTION_PLAN_IDEMPOTENCY_CONFLICT`.
    ///
    /// A replay of the stored plan returns the task unchanged in any state
    /// (so a planner's retry after the task was claimed still succeeds);
    /// any other request is `TASK_STATE_INVALID` unless the task is QUEUED.
    pub fn replace_plan(
        &mut self,
        task_id: &str,
        plan: &PlanRequest,
        actor: &Actor,
    ) -> StoreResult<TaskView> {
        let result = self.replace_plan_inner(task_id, plan, actor);
        self.audited(result, Some(task_id), actor, action::TASK_PLAN_REPLACED)
    }

    fn replace_plan_inner(
        &mut self,
        task_id: &str,
        plan: &PlanRequest,
        actor: &Actor,
    ) -> StoreResult<TaskView> {
        check_task_id(task_id)?;
        self.backend.write("a plan replacement", &mut |tx| {
            let mut row = tx.load(task_id)?.ok_or_else(|| not_found(task_id))?;
            let binding = row.binding()?;
            let existing = row.plan()?;
            let registration = register_plan(&binding, plan, Some(&existing));
            if let Ok(r) = &registration {
                if r.idempotent {
                    return row.view();
                }
            }
            permitted(&row, Op::ReplacePlan)?;
            let registration = registration?;
            let previous_plan_digest = std::mem::replace(
                &mut row.plan_digest,
                registration.record.plan_digest.clone(),
            );
            row.plan_json = record_json(&registration.record)?;
            row.envelope_json = to_canonical_string(&registration.envelope.to_value())?;
            row.execution_digest = registration.envelope.execution_digest.clone();
            row.save(tx, Guard::Revision)?;
            audit::append_allowed(
                tx,
                task_id,
                actor,
                action::TASK_PLAN_REPLACED,
                json!({
                    "previous_plan_digest": previous_plan_digest,
                    "plan_digest": row.plan_digest,
                    "plan_idempotency_key": registration.record.idempotency_key,
                    "execution_digest": row.execution_digest,
                    "revision": row.revision,
                }),
            )?;
            row.view()
        })
    }

    /// Decides on a VERIFYING task: accept → SUCCEEDED; rework → QUEUED
    /// while attempts remain, else FAILED; reject → FAILED. The verification
    /// record becomes `{"decision", "reason", "actor"}` (the reason checked
    /// by [`check_reason`] and trimmed).
    pub fn decide(
        &mut self,
        task_id: &str,
        decision: Decision,
        reason: &str,
        actor: &Actor,
    ) -> StoreResult<TaskView> {
        let result = self.decide_inner(task_id, decision, reason, actor);
        self.audited(result, Some(task_id), actor, action::TASK_VERIFIED)
    }

    fn decide_inner(
        &mut self,
        task_id: &str,
        decision: Decision,
        reason: &str,
        actor: &Actor,
    ) -> StoreResult<TaskView> {
        check_task_id(task_id)?;
        let reason = airlock_proto::redact::text(check_reason(reason)?).into_owned();
        self.backend.write("a verification decision", &mut |tx| {
            let mut row = tx.load(task_id)?.ok_or_else(|| not_found(task_id))?;
            let op = match decision {
                Decision::Accept => Op::Accept,
                Decision::Reject => Op::Reject,
                Decision::Rework => Op::Rework,
            };
            permitted(&row, op)?;
            let guard = Guard::Attempt {
                state: TaskState::Verifying,
                attempt: row.attempt,
                lease_epoch: row.lease_epoch,
            };
            let next = match decision {
                Decision::Accept => TaskState::Succeeded,
                Decision::Reject => TaskState::Failed,
                Decision::Rework if row.has_attempts_left() => TaskState::Queued,
                Decision::Rework => TaskState::Failed,
            };
            debug_assert!(states::may_move(op, row.status, next));
            row.status = next;
            row.verification_json = Some(to_canonical_string(&json!({
                "decision": decision.record_name(),
                "reason": reason,
                "actor": actor.name,
            }))?);
            row.save(tx, guard)?;
            audit::append_allowed(
                tx,
                task_id,
                actor,
                action::TASK_VERIFIED,
                json!({
                    "decision": decision.record_name(),
                    "reason": reason,
                    "attempt": row.attempt,
                    "state": row.status.as_str(),
                    "revision": row.revision,
                }),
            )?;
            row.view()
        })
    }

    /// Cancels a task in any non-terminal state, dropping its lease (a
    /// holder's later renew or result is then `TASK_STATE_INVALID`). A
    /// terminal task is `TASK_STATE_INVALID`. The reason goes to the event.
    pub fn cancel(&mut self, task_id: &str, reason: &str, actor: &Actor) -> StoreResult<TaskView> {
        let result = self.cancel_inner(task_id, reason, actor);
        self.audited(result, Some(task_id), actor, action::TASK_CANCELLED)
    }

    fn cancel_inner(
        &mut self,
        task_id: &str,
        reason: &str,
        actor: &Actor,
    ) -> StoreResult<TaskView> {
        check_task_id(task_id)?;
        let reason = airlock_proto::redact::text(check_reason(reason)?).into_owned();
        self.backend.write("a cancellation", &mut |tx| {
            let mut row = tx.load(task_id)?.ok_or_else(|| not_found(task_id))?;
            permitted(&row, Op::Cancel)?;
            let previous = row.status;
            row.status = TaskState::Cancelled;
            row.clear_lease();
            row.save(tx, Guard::Revision)?;
            audit::append_allowed(
                tx,
                task_id,
                actor,
                action::TASK_CANCELLED,
                json!({
                    "reason": reason,
                    "previous_state": previous.as_str(),
                    "attempt": row.attempt,
                    "revision": row.revision,
                }),
            )?;
            row.view()
        })
    }
}

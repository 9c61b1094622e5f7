//! Submitting tasks, replacing plans, verification decisions, cancellation.

use super::quota::{self, AgentQuota, QuotaExceeded};
use super::tx::{Backend, Guard, NewDecision, NewTask};
use super::{Actor, Store, Submitted, action, audit, check_task_id, not_found};
use crate::error::{StoreError, StoreResult};
use airlock_proto::binding::Binding;
use airlock_proto::canonical::{digest_of, to_canonical_string};
use airlock_proto::limits::MAX_ATTEMPTS_CAP;
use airlock_proto::plan::{PLAN_SCHEMA, PlanRecord, PlanRequest, register_plan};
use airlock_proto::states::{self, Step};
use airlock_proto::task::{
    Decision, DecisionOutcome, DecisionRequest, TASK_SCHEMA, TaskState, TaskSubmission, TaskView,
};
use airlock_proto::{Code, Error};
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

impl<B: Backend> Store<B> {
    /// Submits a task: validates the binding, registers the plan (see
    /// [`register_plan`]) and queues the task at attempt 0.
    ///
    /// Idempotent by the binding's idempotency key: the same key with the
    /// identical submission by the same submitter ([`Actor::submitter`])
    /// returns the stored task with `idempotent: true` (even after the
    /// task moved on); the same key with other content or from another
    /// submitter, or the same task id under another key, is
    /// `TASK_IDEMPOTENCY_CONFLICT`. The task records its submitter.
    /// Validation runs before any lookup, so an invalid submission is
    /// refused with its own code whatever is stored. No quota applies
    /// ([`Store::submit_within`]).
    pub fn submit(&mut self, s: &TaskSubmission, actor: &Actor) -> StoreResult<Submitted> {
        self.submit_within(s, actor, &AgentQuota::NONE)
    }

    /// [`Store::submit`] of a submission that `quota` must allow when
    /// `actor` is a planner agent ([`Actor::agent`]; an actor that is no
    /// agent has no quota): counted in the submission's own transaction
    /// (see [`super::quota`]), after an identical replay was answered (a
    /// replay stores nothing, so it is never refused for a quota). A
    /// submission over a quota is refused with `AGENT_QUOTA_EXCEEDED`
    /// naming the quota and its figures, nothing stored, and recorded as
    /// a denied `TASK_SUBMITTED` whose payload names the agent, the quota,
    /// its limit and the use.
    pub fn submit_within(
        &mut self,
        s: &TaskSubmission,
        actor: &Actor,
        quota: &AgentQuota,
    ) -> StoreResult<Submitted> {
        let mut over = None;
        let result = self.submit_inner(s, actor, quota, &mut over);
        let task_id = Some(s.binding.task_id.as_str());
        match (&result, over) {
            (Err(StoreError::Refused(e)), Some(over)) if e.code == Code::AGENT_QUOTA_EXCEEDED => {
                let detail = e.detail.clone().unwrap_or_default();
                let _ = self.write("a denial record", &mut |tx| {
                    audit::append_denial(
                        tx,
                        task_id,
                        actor,
                        action::TASK_SUBMITTED,
                        e.code,
                        &detail,
                        over.payload(),
                    )
                });
                result
            }
            _ => self.audited(result, task_id, actor, action::TASK_SUBMITTED),
        }
    }

    fn submit_inner(
        &mut self,
        s: &TaskSubmission,
        actor: &Actor,
        quota: &AgentQuota,
        over: &mut Option<QuotaExceeded>,
    ) -> StoreResult<Submitted> {
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
        let submitter = actor.submitter();
        self.write("a task submission", &mut |tx| {
            if let Some(existing) = tx.load_by_key(&binding.idempotency_key)? {
                // A replay answers the stored task: only to its submitter,
                // so another caller learns no more than that the key is
                // taken (as from a different submission).
                if existing.submission_sha256 == submission_sha256
                    && existing.submitter().as_ref() == Some(&submitter)
                {
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
            if let Err(refused) = quota::check(tx, actor, quota)? {
                let e = refused.error();
                *over = Some(refused);
                return Err(e.into());
            }
            tx.insert_task(&NewTask {
                task_id: &binding.task_id,
                status: states::SUBMITTED,
                repository: &binding.repository,
                max_attempts: s.max_attempts,
                binding_json: &binding_json,
                plan_json: &plan_json,
                envelope_json: &envelope_json,
                execution_digest: &execution_digest,
                plan_digest: &plan_digest,
                idempotency_key: &binding.idempotency_key,
                submission_sha256: &submission_sha256,
                submitter: &submitter,
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
        self.write("a plan replacement", &mut |tx| {
            let mut row = tx.load(task_id)?.ok_or_else(|| not_found(task_id))?;
            let binding = row.binding()?;
            let existing = row.plan()?;
            let registration = register_plan(&binding, plan, Some(&existing));
            if let Ok(r) = &registration {
                if r.idempotent {
                    return row.view();
                }
            }
            row.advance(Step::ReplacePlan)?;
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

    /// Decides on a task, exactly once: accept, rework or reject a
    /// VERIFYING task (accept → SUCCEEDED; rework → QUEUED while attempts
    /// remain, else FAILED; reject → FAILED), or cancel a task that is not
    /// terminal (dropping its lease: a holder's later renew or result is
    /// then `TASK_STATE_INVALID`).
    ///
    /// Checks, in order (each refusal changes nothing and is audited):
    /// 1. the request, re-parsed by [`DecisionRequest::from_value`] (its
    ///    fields are public), and `task_id` equal to the request's
    ///    (`MESSAGE_INVALID`);
    /// 2. in one transaction, the task row locked first (`TASK_NOT_FOUND`),
    ///    then the decision stored under `(task_id, idempotency_key)`: the
    ///    same request SHA-256 returns the stored answer with
    ///    `idempotent: true`, whatever the task's state now; another is
    ///    `DECISION_IDEMPOTENCY_CONFLICT`;
    /// 3. `DECISION_CAS_MISMATCH` unless the task is at the revision and
    ///    attempt the request names;
    /// 4. `DECISION_RESULT_DRIFT` unless the task's result has the SHA-256
    ///    the request names (`None`: no result);
    /// 5. the state table (`TASK_STATE_INVALID`);
    /// 6. the write, fenced by (state, attempt, lease epoch) for a verdict
    ///    and by the revision for a cancellation; the decision row (its own
    ///    slot, append-only) and the event commit with it.
    ///
    /// A verdict becomes the task's verification record `{"decision",
    /// "reason", "actor", "attempt", "result_sha256"}`; a cancellation's
    /// reason goes to the event.
    pub fn decide(
        &mut self,
        task_id: &str,
        req: &DecisionRequest,
        actor: &Actor,
    ) -> StoreResult<DecisionOutcome> {
        let what = if req.decision == Decision::Cancel {
            action::TASK_CANCELLED
        } else {
            action::TASK_VERIFIED
        };
        let result = self.decide_inner(task_id, req, actor);
        self.audited(result, Some(task_id), actor, what)
    }

    fn decide_inner(
        &mut self,
        task_id: &str,
        req: &DecisionRequest,
        actor: &Actor,
    ) -> StoreResult<DecisionOutcome> {
        check_task_id(task_id)?;
        let req = DecisionRequest::from_value(&req.to_value())?;
        if req.task_id != task_id {
            return Err(
                Error::with(Code::MESSAGE_INVALID, "the decision names another task").into(),
            );
        }
        let request_sha256 = req.request_sha256();
        let reason = airlock_proto::redact::text(&req.reason).into_owned();
        self.write("a decision", &mut |tx| {
            let mut row = tx.load(task_id)?.ok_or_else(|| not_found(task_id))?;
            if let Some(stored) = tx.decision(task_id, &req.idempotency_key)? {
                if stored.request_sha256 != request_sha256 {
                    return Err(Error::with(
                        Code::DECISION_IDEMPOTENCY_CONFLICT,
                        "the idempotency key was used on this task with another decision",
                    )
                    .into());
                }
                let mut outcome: DecisionOutcome = serde_json::from_str(&stored.outcome_json)
                    .map_err(|_| super::row::corrupt(task_id, "decision"))?;
                outcome.idempotent = true;
                return Ok(outcome);
            }
            if row.revision != req.expected_revision || row.attempt != req.expected_attempt {
                return Err(Error::with(
                    Code::DECISION_CAS_MISMATCH,
                    format!(
                        "the decision is about revision {} attempt {}; the task is {} at revision {} attempt {}",
                        req.expected_revision,
                        req.expected_attempt,
                        row.status().as_str(),
                        row.revision,
                        row.attempt
                    ),
                )
                .into());
            }
            let result_sha256 = row.result_sha256()?;
            if result_sha256 != req.expected_result_sha256 {
                return Err(Error::with(
                    Code::DECISION_RESULT_DRIFT,
                    "the task's result is not the one the decision names",
                )
                .into());
            }
            // The holder's ref move or push is under way: the cancel would
            // be acknowledged while the branch still moves.
            if let (Decision::Cancel, Some(until)) = (req.decision, row.fence_at(tx.now())) {
                if row.status() == TaskState::Running {
                    return Err(Error::with(
                        Code::TASK_COMMITTING,
                        format!(
                            "attempt {} is moving its agent branch under a fence that stands until {until} (unix ms) at the latest; cancel it again once it ends",
                            row.attempt
                        ),
                    )
                    .into());
                }
            }
            let step = match req.decision {
                Decision::Accept => Step::Accept,
                Decision::Reject => Step::Reject,
                Decision::Rework => Step::Rework,
                Decision::Cancel => Step::Cancel,
            };
            let previous = row.status();
            row.advance(step)?;
            let guard = if req.decision == Decision::Cancel {
                row.clear_lease();
                Guard::Revision
            } else {
                row.verification_json = Some(to_canonical_string(&json!({
                    "decision": req.decision.record_name(),
                    "reason": reason,
                    "actor": actor.name,
                    "attempt": row.attempt,
                    "result_sha256": result_sha256,
                }))?);
                Guard::Attempt {
                    state: TaskState::Verifying,
                    attempt: row.attempt,
                    lease_epoch: row.lease_epoch,
                }
            };
            row.save(tx, guard)?;
            let outcome = DecisionOutcome {
                task_id: task_id.to_owned(),
                decision: req.decision,
                idempotency_key: req.idempotency_key.clone(),
                attempt: row.attempt,
                result_sha256: result_sha256.clone(),
                state: row.status(),
                revision: row.revision,
                idempotent: false,
            };
            let outcome_json = airlock_proto::canonical::canonical_of(&outcome)?;
            tx.insert_decision(&NewDecision {
                task_id,
                idempotency_key: &req.idempotency_key,
                request_sha256: &request_sha256,
                decision: req.decision.as_str(),
                attempt: i64::from(row.attempt),
                result_sha256: result_sha256.as_deref(),
                applied_revision: row.revision,
                outcome_json: &outcome_json,
                actor_name: &actor.name,
            })?;
            let (what, payload) = if req.decision == Decision::Cancel {
                (
                    action::TASK_CANCELLED,
                    json!({
                        "reason": reason,
                        "previous_state": previous.as_str(),
                        "attempt": row.attempt,
                        "revision": row.revision,
                        "idempotency_key": req.idempotency_key,
                        "result_sha256": result_sha256,
                    }),
                )
            } else {
                (
                    action::TASK_VERIFIED,
                    json!({
                        "decision": req.decision.record_name(),
                        "reason": reason,
                        "attempt": row.attempt,
                        "state": row.status().as_str(),
                        "revision": row.revision,
                        "idempotency_key": req.idempotency_key,
                        "result_sha256": result_sha256,
                    }),
                )
            };
            audit::append_allowed(tx, task_id, actor, what, payload)?;
            Ok(outcome)
        })
    }
}

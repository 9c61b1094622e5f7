//! Claims, leases and results: everything a worker does.

use super::fair::{self, RunningCaps};
use super::row::TaskRow;
use super::tx::{Backend, Guard, NewResult};
use super::{
    Actor, LEASE_SWEEPER, ResultReceipt, Store, action, audit, check_lease_ms, check_task_id,
    not_found,
};
use crate::error::{StoreError, StoreResult};
use airlock_proto::binding::is_key;
use airlock_proto::bus::{FenceGrant, FenceRequest, FenceStep};
use airlock_proto::canonical::{canonical_of, sha256_hex, to_canonical_string};
use airlock_proto::limits::{MAX_FENCE_MS, MAX_RESULT_BYTES};
use airlock_proto::states::Step;
use airlock_proto::task::{ClaimGrant, Outcome, TaskResult, TaskState};
use airlock_proto::{Code, Error};
use serde_json::{Value, json};

/// A fresh 256-bit lease token, hex encoded.
fn new_token() -> StoreResult<String> {
    let mut bytes = [0u8; 32];
    getrandom::getrandom(&mut bytes).map_err(|e| {
        Error::with(
            Code::INTERNAL,
            format!("no randomness for a lease token: {e}"),
        )
    })?;
    Ok(hex::encode(bytes))
}

/// Compares two byte strings in time that depends only on their lengths.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Checks that the caller holds the task's current, unexpired lease, in a
/// fixed order: state, epoch (older is stale, newer is invalid), token,
/// expiry (expired when `expires <= now`).
fn check_lease(row: &TaskRow, lease_epoch: u64, lease_token: &str, now: i64) -> StoreResult<()> {
    airlock_proto::states::check(airlock_proto::states::Op::Renew, row.status())?;
    if lease_epoch < row.lease_epoch {
        return Err(Error::with(
            Code::LEASE_EPOCH_STALE,
            format!(
                "epoch {lease_epoch} was fenced by epoch {}",
                row.lease_epoch
            ),
        )
        .into());
    }
    if lease_epoch > row.lease_epoch {
        return Err(Error::with(Code::LEASE_INVALID, "no lease has that epoch").into());
    }
    let presented = sha256_hex(lease_token.as_bytes());
    let held = row.lease_token_hash.as_deref().unwrap_or("");
    if !constant_time_eq(held.as_bytes(), presented.as_bytes()) {
        return Err(Error::with(Code::LEASE_INVALID, "the lease token does not match").into());
    }
    match row.lease_expires_at {
        Some(expires) if expires > now => Ok(()),
        _ => Err(Error::with(Code::LEASE_EXPIRED, "the lease has expired").into()),
    }
}

/// A fence request's bounds: a hold of `1..=MAX_FENCE_MS` and a commit id
/// for a ref move or a push, neither for a release.
fn check_fence(req: &FenceRequest) -> StoreResult<()> {
    let release = req.step == FenceStep::Release;
    let hold_ok = if release {
        req.hold_ms == 0
    } else {
        (1..=MAX_FENCE_MS).contains(&req.hold_ms)
    };
    if !hold_ok {
        return Err(Error::with(
            Code::FIELD_BOUNDS_EXCEEDED,
            format!(
                "hold_ms {} is outside {} for a {} fence",
                req.hold_ms,
                if release {
                    "0..=0".to_owned()
                } else {
                    format!("1..={MAX_FENCE_MS}")
                },
                req.step.as_str()
            ),
        )
        .into());
    }
    match (&req.commit_oid, release) {
        (None, true) => Ok(()),
        (Some(oid), false) if airlock_proto::binding::is_oid(oid) => Ok(()),
        _ => Err(Error::with(
            Code::MESSAGE_INVALID,
            "a ref or push fence names its commit (an object id); a release names none",
        )
        .into()),
    }
}

/// Labels of the envelope's verification commands, in order.
fn envelope_command_labels(envelope: &Value) -> Vec<&str> {
    envelope["verification"]
        .as_array()
        .map(|cmds| cmds.iter().filter_map(|c| c["label"].as_str()).collect())
        .unwrap_or_default()
}

fn message_invalid(why: impl Into<String>) -> StoreError {
    Error::with(Code::MESSAGE_INVALID, why).into()
}

/// The verification record of a task failed by the sweeper, as canonical
/// JSON.
pub(crate) fn lease_expired_record(
    sweeper: &str,
    attempt: u32,
    lease_epoch: u64,
    expired_at: Option<i64>,
) -> StoreResult<String> {
    Ok(to_canonical_string(&json!({
        "decision": "LEASE_EXPIRED",
        "automatic": true,
        "reason": "LEASE_EXPIRED",
        "actor": sweeper,
        "attempt": attempt,
        "lease_epoch": lease_epoch,
        "lease_expired_at_ms": expired_at,
    }))?)
}

impl<B: Backend> Store<B> {
    /// Claims a QUEUED task with attempts left, fairly between submitters:
    /// of the submitter class (its agent, else its uid; a task with neither
    /// on record is a class of its own) that has the fewest tasks RUNNING
    /// now, then was served longest ago, its oldest task (submission
    /// order); see [`super::fair`]. The task gets a new attempt, a new
    /// lease epoch, RUNNING, `claimed_by` = the worker's name, and a fresh
    /// 256-bit lease token that is returned here once and stored only as
    /// its SHA-256 (of the token's hex text). `None` when nothing is
    /// claimable. `lease_ms` must be in `1..=MAX_LEASE_MS`
    /// (`FIELD_BOUNDS_EXCEEDED`). No cap applies ([`Store::claim_within`]).
    pub fn claim(&mut self, worker: &Actor, lease_ms: i64) -> StoreResult<Option<ClaimGrant>> {
        self.claim_within(worker, lease_ms, None, &RunningCaps::NONE)
    }

    /// [`Store::claim`], only among tasks whose binding names one of
    /// `repositories` (`None`: any). A host that shares its queue with
    /// others claims only tasks for the repositories it serves.
    pub fn claim_in(
        &mut self,
        worker: &Actor,
        lease_ms: i64,
        repositories: Option<&[String]>,
    ) -> StoreResult<Option<ClaimGrant>> {
        self.claim_within(worker, lease_ms, repositories, &RunningCaps::NONE)
    }

    /// [`Store::claim_in`], passing over every submitter class at its cap
    /// in `caps`: a class with as many tasks RUNNING as its cap (on every
    /// host: on PostgreSQL counted under the class's lock, in the statement
    /// that locks the row) has none claimed until one of them ends.
    pub fn claim_within(
        &mut self,
        worker: &Actor,
        lease_ms: i64,
        repositories: Option<&[String]>,
        caps: &RunningCaps,
    ) -> StoreResult<Option<ClaimGrant>> {
        let result = self.claim_inner(worker, lease_ms, repositories, caps);
        self.audited(result, None, worker, action::TASK_CLAIMED)
    }

    fn claim_inner(
        &mut self,
        worker: &Actor,
        lease_ms: i64,
        repositories: Option<&[String]>,
        caps: &RunningCaps,
    ) -> StoreResult<Option<ClaimGrant>> {
        check_lease_ms(lease_ms)?;
        let token = new_token()?;
        let token_hash = sha256_hex(token.as_bytes());
        self.write("a claim", &mut |tx| {
            let Some(mut row) = fair::next_claimable(tx, repositories, caps)? else {
                return Ok(None);
            };
            row.advance(Step::Claim)?;
            row.attempt += 1;
            row.lease_epoch += 1;
            row.claimed_by = Some(worker.name.clone());
            row.lease_token_hash = Some(token_hash.clone());
            row.lease_expires_at = Some(tx.now().saturating_add(lease_ms));
            row.save(tx, Guard::Revision)?;
            let envelope = row.envelope()?;
            let expires = row
                .lease_expires_at
                .ok_or_else(|| Error::with(Code::INTERNAL, "a claim wrote no lease expiry"))?;
            audit::append_allowed(
                tx,
                &row.task_id,
                worker,
                action::TASK_CLAIMED,
                json!({
                    "attempt": row.attempt,
                    "lease_epoch": row.lease_epoch,
                    "lease_expires_at_ms": expires,
                    "claimed_by": worker.name,
                    "execution_digest": row.execution_digest,
                    "revision": row.revision,
                }),
            )?;
            Ok(Some(ClaimGrant {
                task_id: row.task_id,
                attempt: row.attempt,
                lease_epoch: row.lease_epoch,
                lease_token: token.clone(),
                lease_expires_at_ms: expires,
                envelope,
            }))
        })
    }

    /// Extends the caller's lease to `now + lease_ms` and returns the new
    /// expiry. Refusals: `TASK_STATE_INVALID` (not RUNNING),
    /// `LEASE_EPOCH_STALE` (an older epoch), `LEASE_INVALID` (a newer epoch
    /// or the wrong token), `LEASE_EXPIRED` (expiry at or before now; an
    /// expired lease is never revived).
    pub fn renew(
        &mut self,
        task_id: &str,
        lease_epoch: u64,
        lease_token: &str,
        lease_ms: i64,
        worker: &Actor,
    ) -> StoreResult<i64> {
        let result = self.renew_inner(task_id, lease_epoch, lease_token, lease_ms, worker);
        self.audited(result, Some(task_id), worker, action::TASK_LEASE_RENEWED)
    }

    fn renew_inner(
        &mut self,
        task_id: &str,
        lease_epoch: u64,
        lease_token: &str,
        lease_ms: i64,
        worker: &Actor,
    ) -> StoreResult<i64> {
        check_task_id(task_id)?;
        check_lease_ms(lease_ms)?;
        let presented = sha256_hex(lease_token.as_bytes());
        self.write("a lease renewal", &mut |tx| {
            let now = tx.now();
            let mut row = tx.load(task_id)?.ok_or_else(|| not_found(task_id))?;
            check_lease(&row, lease_epoch, lease_token, now)?;
            // A standing fence keeps the lease at least until its end.
            let expires = now
                .saturating_add(lease_ms)
                .max(row.fence_at(now).unwrap_or(i64::MIN));
            row.advance(Step::Renew)?;
            row.lease_expires_at = Some(expires);
            let guard = Guard::Lease {
                attempt: row.attempt,
                lease_epoch,
                token_hash: &presented,
            };
            row.save(tx, guard)?;
            audit::append_allowed(
                tx,
                task_id,
                worker,
                action::TASK_LEASE_RENEWED,
                json!({
                    "attempt": row.attempt,
                    "lease_epoch": row.lease_epoch,
                    "lease_expires_at_ms": expires,
                    "revision": row.revision,
                }),
            )?;
            Ok(expires)
        })
    }

    /// Sets or releases the fence of the caller's attempt
    /// (`Worker1.Fence`), under its current lease checked as [`Store::renew`]
    /// checks it. A fence for a ref move or a push stands until `now +
    /// hold_ms` (the store's clock): until then the task is not cancelled
    /// (`TASK_COMMITTING`) and its lease does not expire (its expiry is
    /// moved to the fence's end if it was earlier), so the holder's step,
    /// begun within its start window, ends before anyone else
    /// may move the task. A release ends it at once. `hold_ms` is
    /// `1..=MAX_FENCE_MS` for a fence and 0 for a release
    /// (`FIELD_BOUNDS_EXCEEDED`); a fence names the commit its step points
    /// the branch at (`MESSAGE_INVALID` otherwise), a release none.
    pub fn fence(
        &mut self,
        task_id: &str,
        lease_epoch: u64,
        lease_token: &str,
        req: &FenceRequest,
        worker: &Actor,
    ) -> StoreResult<FenceGrant> {
        let result = self.fence_inner(task_id, lease_epoch, lease_token, req, worker);
        self.audited(result, Some(task_id), worker, action::TASK_FENCED)
    }

    fn fence_inner(
        &mut self,
        task_id: &str,
        lease_epoch: u64,
        lease_token: &str,
        req: &FenceRequest,
        worker: &Actor,
    ) -> StoreResult<FenceGrant> {
        check_task_id(task_id)?;
        check_fence(req)?;
        let presented = sha256_hex(lease_token.as_bytes());
        self.write("a fence", &mut |tx| {
            let now = tx.now();
            let mut row = tx.load(task_id)?.ok_or_else(|| not_found(task_id))?;
            check_lease(&row, lease_epoch, lease_token, now)?;
            row.advance(Step::Fence)?;
            let hold = i64::try_from(req.hold_ms).unwrap_or(i64::MAX);
            row.fenced_until = match req.step {
                FenceStep::Release => None,
                FenceStep::Ref | FenceStep::Push => Some(now.saturating_add(hold)),
            };
            let expires = row
                .lease_expires_at
                .unwrap_or(now)
                .max(row.fenced_until.unwrap_or(i64::MIN));
            row.lease_expires_at = Some(expires);
            let guard = Guard::Lease {
                attempt: row.attempt,
                lease_epoch,
                token_hash: &presented,
            };
            row.save(tx, guard)?;
            audit::append_allowed(
                tx,
                task_id,
                worker,
                action::TASK_FENCED,
                json!({
                    "attempt": row.attempt,
                    "lease_epoch": row.lease_epoch,
                    "step": req.step.as_str(),
                    "commit_oid": req.commit_oid,
                    "fenced_until_ms": row.fenced_until,
                    "lease_expires_at_ms": expires,
                    "revision": row.revision,
                }),
            )?;
            Ok(FenceGrant {
                task_id: task_id.to_owned(),
                step: req.step,
                fenced_until_ms: row.fenced_until,
                lease_expires_at_ms: expires,
            })
        })
    }

    /// Ends every RUNNING lease whose expiry is at or before now: the task
    /// goes back to QUEUED while attempts remain, else to FAILED with the
    /// verification record `{"decision": "LEASE_EXPIRED", …}`. The token
    /// hash and expiry are cleared; `claimed_by` is kept as history. A
    /// RUNNING task with no expiry at all (which no method writes) counts as
    /// expired, so it cannot hold its place forever. Returns each swept task
    /// with its new state, in queue order.
    pub fn sweep_expired(&mut self) -> StoreResult<Vec<(String, TaskState)>> {
        let sweeper = Actor::system(LEASE_SWEEPER);
        let result = self.write("a lease sweep", &mut |tx| {
            let expired = tx.expired_leases()?;
            let mut swept = Vec::with_capacity(expired.len());
            for mut row in expired {
                let expired_at = row.lease_expires_at;
                if row.advance(Step::ExpireLease)? == TaskState::Failed {
                    row.verification_json = Some(lease_expired_record(
                        &sweeper.name,
                        row.attempt,
                        row.lease_epoch,
                        expired_at,
                    )?);
                }
                row.clear_lease();
                row.save(tx, Guard::Revision)?;
                audit::append_allowed(
                    tx,
                    &row.task_id,
                    &sweeper,
                    action::TASK_LEASE_EXPIRED,
                    json!({
                        "attempt": row.attempt,
                        "lease_epoch": row.lease_epoch,
                        "lease_expired_at_ms": expired_at,
                        "claimed_by": row.claimed_by,
                        "state": row.status().as_str(),
                        "revision": row.revision,
                    }),
                )?;
                let state = row.status();
                swept.push((row.task_id, state));
            }
            Ok(swept)
        });
        self.audited(result, None, &sweeper, action::TASK_LEASE_EXPIRED)
    }

    /// Fails every QUEUED task whose repository is not in `registered`
    /// (after a reload removed it): FAILED, with the verification record
    /// `{"decision": "REPOSITORY_NOT_REGISTERED", …}` and a
    /// `TASK_REPOSITORY_UNREGISTERED` event each, in one transaction. A
    /// task never vanishes with its repository. Returns the failed tasks,
    /// in queue order. (A RUNNING task fails through its worker, which
    /// finds the repository gone; a VERIFYING one has its commit already.)
    pub fn fail_unregistered(&mut self, registered: &[String]) -> StoreResult<Vec<String>> {
        let registry = Actor::system(super::REPOSITORY_REGISTRY);
        let result = self.write("failing tasks of unregistered repositories", &mut |tx| {
            let queued = tx.queued()?;
            let mut failed = Vec::new();
            for mut row in queued {
                let repository = row.binding()?.repository;
                if registered.contains(&repository) {
                    continue;
                }
                row.advance(Step::FailUnregistered)?;
                row.verification_json = Some(to_canonical_string(&json!({
                    "decision": "REPOSITORY_NOT_REGISTERED",
                    "automatic": true,
                    "reason": Code::REPOSITORY_NOT_REGISTERED.as_str(),
                    "actor": registry.name,
                    "attempt": row.attempt,
                    "repository": repository,
                }))?);
                row.save(tx, Guard::Revision)?;
                audit::append_allowed(
                    tx,
                    &row.task_id,
                    &registry,
                    action::TASK_REPOSITORY_UNREGISTERED,
                    json!({
                        "repository": repository,
                        "code": Code::REPOSITORY_NOT_REGISTERED.as_str(),
                        "state": row.status().as_str(),
                        "revision": row.revision,
                    }),
                )?;
                failed.push(row.task_id);
            }
            Ok(failed)
        });
        self.audited(
            result,
            None,
            &registry,
            action::TASK_REPOSITORY_UNREGISTERED,
        )
    }

    /// Cancels the QUEUED tasks agent `agent` submitted, all of them
    /// (`keep` = `None`: the agent was removed, or an operator cancels a
    /// stopped agent's queue) or those whose repository is not in `keep`
    /// (its repositories were narrowed): CANCELLED through the same step
    /// as `CancelTask`, with the verification record `{"decision":
    /// "AGENT_REVOKED", …}` and a `TASK_CANCELLED` event each carrying
    /// `code: AGENT_REVOKED`, the agent and the repository, in one
    /// transaction. A RUNNING task is the worker's (its lease): it
    /// finishes or fails as it would. Returns the cancelled tasks, in
    /// queue order.
    pub fn cancel_agent_queued(
        &mut self,
        agent: &str,
        keep: Option<&[String]>,
        reason: &str,
        actor: &Actor,
    ) -> StoreResult<Vec<String>> {
        let result = self.write("cancelling an agent's queued tasks", &mut |tx| {
            let queued = tx.queued()?;
            let mut cancelled = Vec::new();
            for mut row in queued {
                let submitted_by = row.submitter().and_then(|s| s.agent);
                if submitted_by.as_deref() != Some(agent) {
                    continue;
                }
                let repository = row.binding()?.repository;
                if keep.is_some_and(|k| k.contains(&repository)) {
                    continue;
                }
                let previous = row.status();
                row.advance(Step::Cancel)?;
                row.clear_lease();
                row.verification_json = Some(to_canonical_string(&json!({
                    "decision": Code::AGENT_REVOKED.as_str(),
                    "automatic": true,
                    "reason": reason,
                    "actor": actor.name,
                    "attempt": row.attempt,
                    "agent": agent,
                    "repository": repository,
                }))?);
                row.save(tx, Guard::Revision)?;
                audit::append_allowed(
                    tx,
                    &row.task_id,
                    actor,
                    action::TASK_CANCELLED,
                    json!({
                        "reason": reason,
                        "code": Code::AGENT_REVOKED.as_str(),
                        "agent": agent,
                        "repository": repository,
                        "previous_state": previous.as_str(),
                        "attempt": row.attempt,
                        "revision": row.revision,
                    }),
                )?;
                cancelled.push(row.task_id);
            }
            Ok(cancelled)
        });
        self.audited(result, None, actor, action::TASK_CANCELLED)
    }

    /// Accepts the result of the caller's attempt.
    ///
    /// A result is first looked up by `(task_id, idempotency_key)`: the
    /// byte-identical canonical result is an idempotent replay (even after
    /// the task moved on), another result is `RESULT_IDEMPOTENCY_CONFLICT`.
    /// Otherwise the caller must hold the current, unexpired lease (see
    /// [`Store::renew`] for the codes), and the result's `task_id`,
    /// `attempt`, `execution_digest` and `target_branch` must be the task's
    /// and its outcome must fit the envelope's action (`MESSAGE_INVALID`
    /// otherwise: with the lease proven, a disagreeing result is a malformed
    /// message, not a state race).
    ///
    /// The lease is cleared. Passed or captured → VERIFYING, or SUCCEEDED at
    /// once when `auto_accept` and the summaries name exactly the envelope's
    /// commands, each exited 0 and none timed out, and the result's
    /// isolation evidence shows them fully confined (otherwise the event
    /// records why auto_accept was withheld). Failed → an automatic
    /// NEEDS_REWORK: QUEUED while attempts remain, else FAILED.
    #[allow(clippy::too_many_arguments)]
    pub fn submit_result(
        &mut self,
        task_id: &str,
        lease_epoch: u64,
        lease_token: &str,
        idempotency_key: &str,
        result: &TaskResult,
        auto_accept: bool,
        worker: &Actor,
    ) -> StoreResult<ResultReceipt> {
        let outcome = self.submit_result_inner(
            task_id,
            lease_epoch,
            lease_token,
            idempotency_key,
            result,
            auto_accept,
            worker,
        );
        self.audited(
            outcome,
            Some(task_id),
            worker,
            action::TASK_RESULT_SUBMITTED,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn submit_result_inner(
        &mut self,
        task_id: &str,
        lease_epoch: u64,
        lease_token: &str,
        idempotency_key: &str,
        result: &TaskResult,
        auto_accept: bool,
        worker: &Actor,
    ) -> StoreResult<ResultReceipt> {
        check_task_id(task_id)?;
        if !is_key(idempotency_key) {
            return Err(
                Error::with(Code::IDEMPOTENCY_KEY_INVALID, "result idempotency key").into(),
            );
        }
        result.validate()?;
        let canonical = canonical_of(result)?;
        if canonical.len() > MAX_RESULT_BYTES {
            return Err(Error::with(
                Code::FIELD_BOUNDS_EXCEEDED,
                format!(
                    "the result is {} bytes, at most {MAX_RESULT_BYTES}",
                    canonical.len()
                ),
            )
            .into());
        }
        // The digest binds the bytes the worker sent (its durable record
        // names it); what is kept and shown is the redacted form, with the
        // values airlock made for the task (its id, branch, digests,
        // commits, published ref) never taken for secrets.
        let result_sha256 = sha256_hex(canonical.as_bytes());
        let redactor = airlock_proto::redact::Redactor::new().with_result(result);
        let value = serde_json::to_value(result)
            .map_err(|e| Error::with(Code::INTERNAL, format!("a result: {e}")))?;
        let canonical = to_canonical_string(&redactor.value(&value))?;
        let presented = sha256_hex(lease_token.as_bytes());
        self.write("a result submission", &mut |tx| {
            let now = tx.now();
            if let Some(stored) = tx.result_sha256(task_id, idempotency_key)? {
                if stored != result_sha256 {
                    return Err(Error::with(
                        Code::RESULT_IDEMPOTENCY_CONFLICT,
                        "the idempotency key was used with another result",
                    )
                    .into());
                }
                let task = tx
                    .load(task_id)?
                    .ok_or_else(|| not_found(task_id))?
                    .view()?;
                return Ok(ResultReceipt {
                    task,
                    idempotent: true,
                });
            }
            let mut row = tx.load(task_id)?.ok_or_else(|| not_found(task_id))?;
            check_lease(&row, lease_epoch, lease_token, now)?;
            if result.task_id != task_id {
                return Err(message_invalid("the result names another task"));
            }
            if result.attempt != row.attempt {
                return Err(message_invalid(format!(
                    "the result is for attempt {}, the lease for attempt {}",
                    result.attempt, row.attempt
                )));
            }
            if result.execution_digest != row.execution_digest {
                return Err(message_invalid("the result names another execution digest"));
            }
            if result.target_branch != row.binding()?.target_branch {
                return Err(message_invalid("the result names another target branch"));
            }
            let envelope = row.envelope()?;
            let action_name = envelope["action"].as_str().unwrap_or("");
            let fits = match result.outcome {
                Outcome::Passed => action_name == "deterministic",
                Outcome::Captured => action_name == "source_capture",
                Outcome::Failed => true,
            };
            if !fits {
                return Err(message_invalid(format!(
                    "outcome {:?} does not fit action {action_name:?}",
                    result.outcome
                )));
            }
            tx.insert_result(&NewResult {
                task_id,
                idempotency_key,
                attempt: row.attempt,
                lease_epoch: row.lease_epoch_i64()?,
                result_sha256: &result_sha256,
                result_json: &canonical,
                cpu_ms: i64::try_from(super::quota::verification_cpu_ms(result))
                    .unwrap_or(i64::MAX),
            })?;

            let mut automatic = false;
            let mut withheld: Option<Vec<String>> = None;
            match result.outcome {
                Outcome::Passed | Outcome::Captured => {
                    let labels: Vec<&str> = result
                        .verification
                        .iter()
                        .map(|c| c.label.as_str())
                        .collect();
                    let all_passed = labels == envelope_command_labels(&envelope)
                        && result
                            .verification
                            .iter()
                            .all(|c| c.exit_code == Some(0) && !c.timed_out);
                    // A result whose commands were not all measured fully
                    // confined waits for a human, whatever auto_accept says.
                    let gaps = result
                        .isolation
                        .as_ref()
                        .map_or_else(|| vec!["isolation unmeasured".to_owned()], |i| i.gaps());
                    if auto_accept && all_passed && !gaps.is_empty() {
                        withheld = Some(gaps);
                        row.advance(Step::SubmitPassed)?;
                    } else if auto_accept && all_passed {
                        automatic = true;
                        row.advance(Step::AutoAccept)?;
                        row.verification_json = Some(to_canonical_string(&json!({
                            "decision": "ACCEPTED",
                            "automatic": true,
                            "reason": "every verification command exited 0, fully confined",
                            "actor": worker.name,
                            "attempt": row.attempt,
                            "result_sha256": result_sha256,
                        }))?);
                    } else {
                        row.advance(Step::SubmitPassed)?;
                    }
                }
                Outcome::Failed => {
                    automatic = true;
                    // Another attempt cannot help a task whose repository
                    // is gone, whose branch moved behind the worker's back
                    // (an administrator settles it: a reconciliation case),
                    // or whose plan a policy refused: it fails now, with
                    // its code (Code::ends_task).
                    let retryable = !result
                        .failure_code
                        .as_deref()
                        .and_then(Code::from_name)
                        .is_some_and(Code::ends_task);
                    row.advance(if retryable {
                        Step::SubmitFailed
                    } else {
                        Step::SubmitFinal
                    })?;
                    row.verification_json = Some(to_canonical_string(&json!({
                        "decision": "NEEDS_REWORK",
                        "automatic": true,
                        "reason": result.failure_code,
                        "actor": worker.name,
                        "attempt": row.attempt,
                        "result_sha256": result_sha256,
                    }))?);
                }
            }
            row.result_json = Some(canonical.clone());
            row.clear_lease();
            let guard = Guard::Lease {
                attempt: row.attempt,
                lease_epoch,
                token_hash: &presented,
            };
            row.save(tx, guard)?;
            audit::append_allowed(
                tx,
                task_id,
                worker,
                action::TASK_RESULT_SUBMITTED,
                json!({
                    "attempt": row.attempt,
                    "lease_epoch": row.lease_epoch,
                    "idempotency_key": idempotency_key,
                    "result_sha256": result_sha256,
                    "outcome": result.outcome,
                    "automatic_decision": automatic,
                    "auto_accept_withheld": withheld,
                    "state": row.status().as_str(),
                    "revision": row.revision,
                }),
            )?;
            if let Some(facts) = &result.reconciliation {
                super::reconcile::open_case(tx, &row, facts, worker)?;
            }
            Ok(ResultReceipt {
                task: row.view()?,
                idempotent: false,
            })
        })
    }
}

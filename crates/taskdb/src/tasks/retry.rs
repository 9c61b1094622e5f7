//! The owner-controlled retry extension: the only way a task's
//! `max_attempts` grows, by exactly one, under compare-and-swap, idempotent
//! and audited — the seed's transaction, step for step.

use super::tx::{Backend, ExtensionCas, NewExtension};
use super::{Actor, Store, action, audit, not_found, verification_sha256};
use crate::error::{StoreError, StoreResult};
use airlock_proto::binding::is_task_id;
use airlock_proto::retry::{
    RetryExtensionOutcome, RetryExtensionRequest, check_configured_authorization_id,
};
use airlock_proto::states::{self, Step};
use airlock_proto::task::TaskState;
use airlock_proto::{Code, Error};
use serde_json::json;

fn refuse(code: Code) -> StoreError {
    Error::new(code).into()
}

impl<B: Backend> Store<B> {
    /// Raises an exhausted, FAILED task's attempt budget by one and queues
    /// it again, exactly as the seed's retry-extension service does.
    ///
    /// Checks, in order (each refusal changes nothing):
    /// 1. the request itself, re-parsed by
    ///    [`RetryExtensionRequest::from_value`] (its fields are public, so
    ///    it may have been built by hand): status FAILED, integers,
    ///    exhausted, one step, cap of 50, hash, id and key shapes;
    /// 2. `task_id` shape (`TASK_ID_INVALID`), then the configured owner
    ///    authorization id (`TASK_RETRY_AUTHORIZATION_ID_MISSING`/`_INVALID`);
    /// 3. `RETRY_EXTENSION_AUTHORIZATION_ID_MISMATCH` when the request's id
    ///    is not the configured one;
    /// 4. in one transaction (SQLite: `BEGIN IMMEDIATE`; PostgreSQL: the
    ///    task row locked `FOR UPDATE`): a stored extension with the same
    ///    `(task_id, idempotency_key)` is replayed (`idempotent: true`, the
    ///    stored values) when its request SHA-256 matches, else
    ///    `RETRY_EXTENSION_IDEMPOTENCY_CONFLICT`;
    /// 5. `TASK_NOT_FOUND`;
    /// 6. `RETRY_EXTENSION_VERIFICATION_DRIFT` unless the SHA-256 of the
    ///    task's verification record ([`verification_sha256`]) is the
    ///    request's (`TASK_VERIFICATION_INVALID` if the record is not JSON);
    /// 7. `RETRY_EXTENSION_CAS_MISMATCH` unless status, revision, attempt
    ///    and max_attempts are the expected ones;
    /// 8. `RETRY_EXTENSION_ACTIVE_LEASE_DENY` if a lease token hash or
    ///    expiry is still set;
    /// 9. a conditional UPDATE (QUEUED, max_attempts + 1, revision + 1,
    ///    `claimed_by` and lease cleared — a stale claim of the finished
    ///    attempt is normalised) that must touch exactly one row, else
    ///    `RETRY_EXTENSION_CAS_MISMATCH`; then the
    ///    `TASK_RETRY_EXTENSION_AUTHORIZED` event and the extension row.
    pub fn extend_retry(
        &mut self,
        task_id: &str,
        req: &RetryExtensionRequest,
        configured_authorization_id: &str,
    ) -> StoreResult<RetryExtensionOutcome> {
        let owner = Actor::owner_control();
        let task_id = task_id.trim();
        let result = self.extend_retry_inner(task_id, req, configured_authorization_id, &owner);
        self.audited(
            result,
            Some(task_id),
            &owner,
            action::TASK_RETRY_EXTENSION_AUTHORIZED,
        )
    }

    fn extend_retry_inner(
        &mut self,
        task_id: &str,
        req: &RetryExtensionRequest,
        configured_authorization_id: &str,
        owner: &Actor,
    ) -> StoreResult<RetryExtensionOutcome> {
        let value = serde_json::to_value(req)
            .map_err(|e| Error::with(Code::REQUEST_INVALID, e.to_string()))?;
        let req = RetryExtensionRequest::from_value(&value)?;
        if !is_task_id(task_id) {
            return Err(refuse(Code::TASK_ID_INVALID));
        }
        let configured = check_configured_authorization_id(Some(configured_authorization_id))?;
        if req.authorization_id != configured {
            return Err(refuse(Code::RETRY_EXTENSION_AUTHORIZATION_ID_MISMATCH));
        }
        let request_sha256 = req.request_sha256();
        self.write("a retry extension", &mut |tx| {
            let replay = tx.extension(task_id, &req.idempotency_key)?;
            if let Some(stored) = replay {
                if stored.request_sha256 != request_sha256 {
                    return Err(refuse(Code::RETRY_EXTENSION_IDEMPOTENCY_CONFLICT));
                }
                // The state the applied extension moved the task to.
                let status = states::next(TaskState::Failed, Step::ExtendRetry, false)?;
                return Ok(RetryExtensionOutcome {
                    task_id: task_id.to_owned(),
                    status: status.as_str().to_owned(),
                    attempt: req.expected_attempt,
                    max_attempts: stored.next_max_attempts,
                    revision: stored.applied_revision,
                    idempotent: true,
                    authorization_id: stored.authorization_id,
                    previous_verification_sha256: stored.previous_verification_sha256,
                });
            }

            let mut task = tx.load(task_id)?.ok_or_else(|| not_found(task_id))?;
            let actual = verification_sha256(task.verification_json.as_deref())?;
            if actual != req.previous_verification_sha256 {
                return Err(refuse(Code::RETRY_EXTENSION_VERIFICATION_DRIFT));
            }
            if task.status().as_str() != req.expected_status
                || task.revision != req.expected_revision
                || i64::from(task.attempt) != req.expected_attempt
                || i64::from(task.max_attempts) != req.expected_max_attempts
            {
                return Err(refuse(Code::RETRY_EXTENSION_CAS_MISMATCH));
            }
            if task
                .lease_token_hash
                .as_deref()
                .is_some_and(|h| !h.is_empty())
                || task.lease_expires_at.is_some()
            {
                return Err(refuse(Code::RETRY_EXTENSION_ACTIVE_LEASE_DENY));
            }

            let previous_claimed_by = task.claimed_by.clone();
            let applied_revision = req.expected_revision + 1;
            task.advance(Step::ExtendRetry)?;
            let changed = tx.apply_extension(&ExtensionCas {
                task_id,
                status: task.status(),
                expected_status: &req.expected_status,
                expected_revision: req.expected_revision,
                expected_attempt: req.expected_attempt,
                expected_max_attempts: req.expected_max_attempts,
                previous_claimed_by: previous_claimed_by.as_deref(),
                next_max_attempts: req.next_max_attempts,
                applied_revision,
            })?;
            if changed != 1 {
                return Err(refuse(Code::RETRY_EXTENSION_CAS_MISMATCH));
            }
            task.persisted()?;

            audit::append_allowed(
                tx,
                task_id,
                owner,
                action::TASK_RETRY_EXTENSION_AUTHORIZED,
                json!({
                    "schema": super::RETRY_EXTENSION_EVENT_SCHEMA,
                    "task_id": task_id,
                    "authorization_id": req.authorization_id,
                    "idempotency_key": req.idempotency_key,
                    "previous_verification_sha256": req.previous_verification_sha256,
                    "previous_max_attempts": req.expected_max_attempts,
                    "next_max_attempts": req.next_max_attempts,
                    "previous_revision": req.expected_revision,
                    "applied_revision": applied_revision,
                    "request_sha256": request_sha256,
                    "previous_claimed_by": previous_claimed_by,
                    "stale_terminal_claim_normalized":
                        previous_claimed_by.as_deref().is_some_and(|c| !c.is_empty()),
                }),
            )?;
            tx.insert_extension(&NewExtension {
                task_id,
                idempotency_key: &req.idempotency_key,
                request_sha256: &request_sha256,
                authorization_id: &req.authorization_id,
                previous_verification_sha256: &req.previous_verification_sha256,
                previous_max_attempts: req.expected_max_attempts,
                next_max_attempts: req.next_max_attempts,
                expected_revision: req.expected_revision,
                applied_revision,
            })?;
            Ok(RetryExtensionOutcome {
                task_id: task_id.to_owned(),
                status: task.status().as_str().to_owned(),
                attempt: req.expected_attempt,
                max_attempts: req.next_max_attempts,
                revision: applied_revision,
                idempotent: false,
                authorization_id: req.authorization_id.clone(),
                previous_verification_sha256: req.previous_verification_sha256.clone(),
            })
        })
    }
}

//! The owner-controlled retry extension: the only way a task's
//! `max_attempts` grows, by exactly one, under compare-and-swap, idempotent
//! and audited — the seed's transaction, step for step.

use super::row;
use super::{Actor, TaskStore, action, audit, not_found, verification_sha256};
use airlock_proto::binding::is_task_id;
use airlock_proto::retry::{
    RetryExtensionOutcome, RetryExtensionRequest, check_configured_authorization_id,
};
use airlock_proto::{Code, Error};
use airlock_sqlite::error::{StoreError, StoreResult};
use rusqlite::{OptionalExtension, params};
use serde_json::json;

/// What a replay reads back from `task_retry_extensions`.
struct StoredExtension {
    request_sha256: String,
    authorization_id: String,
    previous_verification_sha256: String,
    next_max_attempts: i64,
    applied_revision: i64,
}

fn refuse(code: Code) -> StoreError {
    Error::new(code).into()
}

impl TaskStore {
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
    /// 4. in one immediate transaction: a stored extension with the same
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
        self.write("a retry extension", |conn, now| {
            let replay = conn
                .query_row(
                    "SELECT request_sha256, authorization_id, previous_verification_sha256, \
                     next_max_attempts, applied_revision FROM task_retry_extensions \
                     WHERE task_id = ?1 AND idempotency_key = ?2",
                    params![task_id, req.idempotency_key],
                    |r| {
                        Ok(StoredExtension {
                            request_sha256: r.get(0)?,
                            authorization_id: r.get(1)?,
                            previous_verification_sha256: r.get(2)?,
                            next_max_attempts: r.get(3)?,
                            applied_revision: r.get(4)?,
                        })
                    },
                )
                .optional()
                .map_err(|e| StoreError::sqlite("looking up a retry extension", e))?;
            if let Some(stored) = replay {
                if stored.request_sha256 != request_sha256 {
                    return Err(refuse(Code::RETRY_EXTENSION_IDEMPOTENCY_CONFLICT));
                }
                return Ok(RetryExtensionOutcome {
                    task_id: task_id.to_owned(),
                    status: "QUEUED".to_owned(),
                    attempt: req.expected_attempt,
                    max_attempts: stored.next_max_attempts,
                    revision: stored.applied_revision,
                    idempotent: true,
                    authorization_id: stored.authorization_id,
                    previous_verification_sha256: stored.previous_verification_sha256,
                });
            }

            let task = row::load(conn, task_id)?.ok_or_else(|| not_found(task_id))?;
            let actual = verification_sha256(task.verification_json.as_deref())?;
            if actual != req.previous_verification_sha256 {
                return Err(refuse(Code::RETRY_EXTENSION_VERIFICATION_DRIFT));
            }
            if task.status.as_str() != req.expected_status
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
            let changed = conn
                .execute(
                    "UPDATE tasks SET status = 'QUEUED', max_attempts = ?1, revision = ?2, \
                     claimed_by = NULL, lease_token_hash = NULL, lease_expires_at = NULL, \
                     updated_at_ms = ?3 \
                     WHERE task_id = ?4 AND status = ?5 AND revision = ?6 AND attempt = ?7 \
                     AND max_attempts = ?8 AND claimed_by IS ?9 \
                     AND lease_token_hash IS NULL AND lease_expires_at IS NULL",
                    params![
                        req.next_max_attempts,
                        applied_revision,
                        now,
                        task_id,
                        req.expected_status,
                        req.expected_revision,
                        req.expected_attempt,
                        req.expected_max_attempts,
                        previous_claimed_by,
                    ],
                )
                .map_err(|e| StoreError::sqlite("applying a retry extension", e))?;
            if changed != 1 {
                return Err(refuse(Code::RETRY_EXTENSION_CAS_MISMATCH));
            }

            audit::append_allowed(
                conn,
                now,
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
            conn.execute(
                "INSERT INTO task_retry_extensions (task_id, idempotency_key, request_sha256, \
                 authorization_id, previous_verification_sha256, previous_max_attempts, \
                 next_max_attempts, expected_revision, applied_revision, created_at_ms) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                params![
                    task_id,
                    req.idempotency_key,
                    request_sha256,
                    req.authorization_id,
                    req.previous_verification_sha256,
                    req.expected_max_attempts,
                    req.next_max_attempts,
                    req.expected_revision,
                    applied_revision,
                    now,
                ],
            )
            .map_err(|e| StoreError::sqlite("recording a retry extension", e))?;
            Ok(RetryExtensionOutcome {
                task_id: task_id.to_owned(),
                status: "QUEUED".to_owned(),
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

//! The owner-controlled retry extension: a port of every seed test
//! (`tests/test_agent_task_retry_extension.py`) plus the refusals the seed
//! implements but does not test.

#[path = "tasks_common.rs"]
#[macro_use]
mod common;

use airlock_proto::Code;
use airlock_proto::retry::RetryExtensionRequest;
use airlock_proto::task::{Outcome, TaskState};
use airlock_taskdb::tasks::{
    ActorKind, EventOutcome, OWNER_CONTROL_ACTOR, RETRY_EXTENSION_EVENT_SCHEMA, action,
    verification_sha256,
};
use common::*;
use serde_json::{Value, json};

const EXT: &str = action::TASK_RETRY_EXTENSION_AUTHORIZED;
const KEY: &str = "retry-task-a-attempt11";

/// The seed's verification record, as Python's `json.dumps` writes it.
fn seed_verification() -> Value {
    json!({"decision": "NEEDS_REWORK", "reason": "BASE_OID_BINDING_INVALID"})
}

/// `canon(v)` of the seed's tests.
fn canon(v: &Value) -> String {
    airlock_proto::canonical::digest_of(v).unwrap()
}

/// The seed's `db()` fixture: task-a FAILED at attempt 10 of 10, revision
/// 41, no claim, no lease, the seed's verification and result records. The
/// task is submitted through the API and then set to the seed's row by
/// hand, exactly as the seed's fixture writes it.
fn seed_db(backend: Backend) -> Fixture {
    let mut fx = Fixture::new(backend);
    fx.submit("task-a", 10);
    fx.exec(
        r#"UPDATE tasks SET status = 'FAILED', attempt = 10, max_attempts = 10, revision = 41,
           claimed_by = NULL, lease_token_hash = NULL, lease_expires_at = NULL,
           verification_json = '{"decision": "NEEDS_REWORK", "reason": "BASE_OID_BINDING_INVALID"}',
           result_json = '{"status": "FAILED"}' WHERE task_id = 'task-a'"#,
    )
    .unwrap();
    fx
}

fn request_json(verification: &Value) -> Value {
    json!({
        "expected_status": "FAILED", "expected_revision": 41, "expected_attempt": 10,
        "expected_max_attempts": 10, "next_max_attempts": 11,
        "previous_verification_sha256": canon(verification),
        "authorization_id": AUTH_ID, "idempotency_key": KEY,
    })
}

/// The seed's `request(v)`.
fn request(verification: &Value) -> RetryExtensionRequest {
    RetryExtensionRequest::from_value(&request_json(verification)).unwrap()
}

fn request_with(edit: impl FnOnce(&mut Value)) -> RetryExtensionRequest {
    let mut v = request_json(&seed_verification());
    edit(&mut v);
    RetryExtensionRequest::from_value(&v).unwrap()
}

type Lease = (Option<String>, Option<String>, Option<i64>);

fn claim_and_lease(fx: &Fixture) -> Lease {
    let r = fx.row(
        "SELECT claimed_by, lease_token_hash, lease_expires_at FROM tasks WHERE task_id = 'task-a'",
    );
    (
        r[0].clone(),
        r[1].clone(),
        r[2].as_deref().map(|v| v.parse().unwrap()),
    )
}

fn extension_events(fx: &Fixture) -> Vec<airlock_taskdb::tasks::Event> {
    fx.store
        .events(Some("task-a"), 0, 1000)
        .unwrap()
        .into_iter()
        .filter(|e| e.action == EXT && e.outcome == EventOutcome::Allowed)
        .collect()
}

// ---- ports of the seed's tests ------------------------------------------------

fn retry_extension_cas_and_audit(backend: Backend) {
    let mut fx = seed_db(backend);
    let out = fx
        .store
        .extend_retry("task-a", &request(&seed_verification()), AUTH_ID)
        .unwrap();
    assert_eq!(
        (out.status.as_str(), out.max_attempts, out.revision),
        ("QUEUED", 11, 42)
    );
    assert_eq!(out.attempt, 10);
    assert!(!out.idempotent);
    assert_eq!(out.authorization_id, AUTH_ID);
    assert_eq!(
        out.previous_verification_sha256,
        canon(&seed_verification())
    );
    let row = fx.row("SELECT status, attempt, max_attempts, revision FROM tasks");
    assert_eq!(row, texts(&["QUEUED", "10", "11", "42"]));
    let events = extension_events(&fx);
    assert_eq!(events.len(), 1);
    let e = &events[0];
    assert_eq!(e.action, "TASK_RETRY_EXTENSION_AUTHORIZED");
    assert_eq!(
        e.payload["authorization_id"],
        json!("owner-scheme-a-20260817")
    );
    assert_eq!(e.actor.kind, ActorKind::Owner);
    assert_eq!(e.actor.name, OWNER_CONTROL_ACTOR);
    // Every payload field of the seed's event.
    assert_eq!(
        e.payload,
        json!({
            "schema": RETRY_EXTENSION_EVENT_SCHEMA,
            "task_id": "task-a",
            "authorization_id": AUTH_ID,
            "idempotency_key": KEY,
            "previous_verification_sha256": canon(&seed_verification()),
            "previous_max_attempts": 10,
            "next_max_attempts": 11,
            "previous_revision": 41,
            "applied_revision": 42,
            // The seed's Python computes this same digest for this request.
            "request_sha256": "edb3ac0d7f70a93addd4c900ec75d1501847375edceb4117d15b76f045658902",
            "previous_claimed_by": null,
            "stale_terminal_claim_normalized": false,
        })
    );
    // The extension row.
    let ext = fx.row(
        "SELECT idempotency_key, request_sha256, authorization_id, previous_max_attempts, \
         next_max_attempts, expected_revision, applied_revision FROM task_retry_extensions",
    );
    assert_eq!(
        ext,
        texts(&[
            KEY,
            "edb3ac0d7f70a93addd4c900ec75d1501847375edceb4117d15b76f045658902",
            AUTH_ID,
            "10",
            "11",
            "41",
            "42"
        ])
    );
}

fn retry_extension_idempotent_replay(backend: Backend) {
    let mut fx = seed_db(backend);
    let req = request(&seed_verification());
    let first = fx.store.extend_retry("task-a", &req, AUTH_ID).unwrap();
    let last = fx.last_event_id();
    let second = fx.store.extend_retry("task-a", &req, AUTH_ID).unwrap();
    assert!(!first.idempotent);
    assert!(second.idempotent);
    assert_eq!(
        fx.row("SELECT COUNT(*) FROM task_retry_extensions"),
        texts(&["1"])
    );
    assert_eq!(fx.last_event_id(), last, "a replay appends nothing");
    assert_eq!(
        (second.max_attempts, second.revision, second.attempt),
        (first.max_attempts, first.revision, first.attempt)
    );
    assert_eq!(second.status, "QUEUED");

    // A replay answers with the stored values even after the task moved on.
    let g = fx.claim();
    assert_eq!(g.attempt, 11);
    let third = fx.store.extend_retry("task-a", &req, AUTH_ID).unwrap();
    assert!(third.idempotent);
    assert_eq!((third.revision, third.max_attempts), (42, 11));
    assert_eq!(fx.store.get("task-a").unwrap().state, TaskState::Running);
}

fn retry_extension_normalizes_stale_terminal_claim_without_active_lease(backend: Backend) {
    let mut fx = seed_db(backend);
    fx.exec("UPDATE tasks SET claimed_by = 'previous-worker'")
        .unwrap();
    let before = fx.last_event_id();
    let out = fx
        .store
        .extend_retry("task-a", &request(&seed_verification()), AUTH_ID)
        .unwrap();
    assert_eq!(out.status, "QUEUED");
    assert_eq!(claim_and_lease(&fx), (None, None, None));
    let events = extension_events(&fx);
    assert_eq!(
        events[0].payload["previous_claimed_by"],
        json!("previous-worker")
    );
    assert_eq!(
        events[0].payload["stale_terminal_claim_normalized"],
        json!(true)
    );
    assert_eq!(fx.last_event_id() - before, 1, "exactly one event");
}

fn retry_extension_verification_drift_denied(backend: Backend) {
    let mut fx = seed_db(backend);
    let bad = request(&json!({"decision": "NEEDS_REWORK", "reason": "other"}));
    fx.refused(
        "task-a",
        Code::RETRY_EXTENSION_VERIFICATION_DRIFT,
        EXT,
        Some("task-a"),
        |s| s.extend_retry("task-a", &bad, AUTH_ID),
    );
}

fn retry_extension_authorization_id_mismatch_rejected(backend: Backend) {
    let mut fx = seed_db(backend);
    let req = request(&seed_verification());
    fx.refused(
        "task-a",
        Code::RETRY_EXTENSION_AUTHORIZATION_ID_MISMATCH,
        EXT,
        Some("task-a"),
        |s| s.extend_retry("task-a", &req, "other-owner-id"),
    );
    assert_eq!(
        Code::RETRY_EXTENSION_AUTHORIZATION_ID_MISMATCH.http_status(),
        403
    );
    // The mismatch is checked before an idempotent replay could answer.
    fx.store.extend_retry("task-a", &req, AUTH_ID).unwrap();
    fx.refused(
        "task-a",
        Code::RETRY_EXTENSION_AUTHORIZATION_ID_MISMATCH,
        EXT,
        Some("task-a"),
        |s| s.extend_retry("task-a", &req, "other-owner-id"),
    );
}

fn retry_extension_bounded_one_step(backend: Backend) {
    let v = json!({"decision": "NEEDS_REWORK"});
    let data = json!({
        "expected_status": "FAILED", "expected_revision": 41, "expected_attempt": 10,
        "expected_max_attempts": 10, "next_max_attempts": 12,
        "previous_verification_sha256": canon(&v),
        "authorization_id": "owner-scheme-a-20260817", "idempotency_key": "retry-task-a-attempt11",
    });
    assert_eq!(
        RetryExtensionRequest::from_value(&data).unwrap_err().code,
        Code::RETRY_EXTENSION_MUST_BE_BOUNDED_ONE_STEP
    );
    // A request built by hand past the parser is checked again by the store.
    let mut fx = seed_db(backend);
    let mut req = request(&seed_verification());
    req.next_max_attempts = 12;
    fx.refused(
        "task-a",
        Code::RETRY_EXTENSION_MUST_BE_BOUNDED_ONE_STEP,
        EXT,
        Some("task-a"),
        |s| s.extend_retry("task-a", &req, AUTH_ID),
    );
}

// ---- what the seed implements but does not test ----------------------------------

fn retry_extension_cap_of_fifty(backend: Backend) {
    // 49 → 50 is allowed ...
    let mut fx = seed_db(backend);
    fx.exec("UPDATE tasks SET attempt = 49, max_attempts = 49")
        .unwrap();
    let req = request_with(|v| {
        v["expected_attempt"] = json!(49);
        v["expected_max_attempts"] = json!(49);
        v["next_max_attempts"] = json!(50);
    });
    let out = fx.store.extend_retry("task-a", &req, AUTH_ID).unwrap();
    assert_eq!(out.max_attempts, 50);
    // ... 50 → 51 never: not from the parser, not from a hand-built request.
    let mut fx = seed_db(backend);
    fx.exec("UPDATE tasks SET attempt = 50, max_attempts = 50")
        .unwrap();
    let mut v = request_json(&seed_verification());
    v["expected_attempt"] = json!(50);
    v["expected_max_attempts"] = json!(50);
    v["next_max_attempts"] = json!(51);
    assert_eq!(
        RetryExtensionRequest::from_value(&v).unwrap_err().code,
        Code::RETRY_EXTENSION_LIMIT_EXCEEDED
    );
    let mut req = request(&seed_verification());
    req.expected_attempt = 50;
    req.expected_max_attempts = 50;
    req.next_max_attempts = 51;
    fx.refused(
        "task-a",
        Code::RETRY_EXTENSION_LIMIT_EXCEEDED,
        EXT,
        Some("task-a"),
        |s| s.extend_retry("task-a", &req, AUTH_ID),
    );
}

fn retry_extension_active_lease_deny(backend: Backend) {
    // A lease token hash alone, or an expiry alone, is an active lease.
    for set in [
        "lease_token_hash = 'abc'",
        "lease_expires_at = 1",
        "lease_token_hash = 'abc', lease_expires_at = 1",
    ] {
        let mut fx = seed_db(backend);
        fx.exec(&format!("UPDATE tasks SET {set}")).unwrap();
        fx.refused(
            "task-a",
            Code::RETRY_EXTENSION_ACTIVE_LEASE_DENY,
            EXT,
            Some("task-a"),
            |s| s.extend_retry("task-a", &request(&seed_verification()), AUTH_ID),
        );
    }
    // The seed treats an empty token hash as no lease, but its conditional
    // UPDATE demands NULL, so such a row loses the compare-and-swap.
    let mut fx = seed_db(backend);
    fx.exec("UPDATE tasks SET lease_token_hash = ''").unwrap();
    fx.refused(
        "task-a",
        Code::RETRY_EXTENSION_CAS_MISMATCH,
        EXT,
        Some("task-a"),
        |s| s.extend_retry("task-a", &request(&seed_verification()), AUTH_ID),
    );
}

fn retry_extension_cas_mismatch_per_field(backend: Backend) {
    let cases: [(&str, RetryExtensionRequest); 4] = [
        // status: the task is not FAILED.
        ("status = 'QUEUED'", request(&seed_verification())),
        // revision: the owner saw another revision.
        (
            "revision = 41",
            request_with(|v| v["expected_revision"] = json!(40)),
        ),
        // attempt: the task is one attempt short of what the owner saw.
        ("attempt = 9", request(&seed_verification())),
        // max_attempts: the budget differs from what the owner saw.
        ("max_attempts = 11", request(&seed_verification())),
    ];
    for (set, req) in cases {
        let mut fx = seed_db(backend);
        fx.exec(&format!("UPDATE tasks SET {set}")).unwrap();
        fx.refused(
            "task-a",
            Code::RETRY_EXTENSION_CAS_MISMATCH,
            EXT,
            Some("task-a"),
            |s| s.extend_retry("task-a", &req, AUTH_ID),
        );
    }
}

fn retry_extension_idempotency_conflict(backend: Backend) {
    let mut fx = seed_db(backend);
    fx.store
        .extend_retry("task-a", &request(&seed_verification()), AUTH_ID)
        .unwrap();
    // The same key with another request.
    let other = request_with(|v| v["expected_revision"] = json!(42));
    fx.refused(
        "task-a",
        Code::RETRY_EXTENSION_IDEMPOTENCY_CONFLICT,
        EXT,
        Some("task-a"),
        |s| s.extend_retry("task-a", &other, AUTH_ID),
    );
}

fn retry_extension_not_found_and_malformed_ids(backend: Backend) {
    let mut fx = seed_db(backend);
    let req = request(&seed_verification());
    fx.refused("task-zz", Code::TASK_NOT_FOUND, EXT, Some("task-zz"), |s| {
        s.extend_retry("task-zz", &req, AUTH_ID)
    });
    fx.refused("task-a", Code::TASK_ID_INVALID, EXT, None, |s| {
        s.extend_retry("x", &req, AUTH_ID)
    });
    // The task id is trimmed, as the seed does.
    fx.refused("task-zz", Code::TASK_NOT_FOUND, EXT, Some("task-zz"), |s| {
        s.extend_retry(" task-zz ", &req, AUTH_ID)
    });
    // The service's own authorization id must be configured and well formed.
    fx.refused(
        "task-a",
        Code::TASK_RETRY_AUTHORIZATION_ID_MISSING,
        EXT,
        Some("task-a"),
        |s| s.extend_retry("task-a", &req, "  "),
    );
    fx.refused(
        "task-a",
        Code::TASK_RETRY_AUTHORIZATION_ID_INVALID,
        EXT,
        Some("task-a"),
        |s| s.extend_retry("task-a", &req, "bad id"),
    );
    // Hand-built requests get the parser's codes.
    let mut r = req.clone();
    r.expected_attempt = 9;
    fx.refused(
        "task-a",
        Code::RETRY_EXTENSION_NOT_EXHAUSTED,
        EXT,
        Some("task-a"),
        |s| s.extend_retry("task-a", &r, AUTH_ID),
    );
    let mut r = req.clone();
    r.expected_status = "QUEUED".into();
    fx.refused(
        "task-a",
        Code::EXPECTED_STATUS_INVALID,
        EXT,
        Some("task-a"),
        |s| s.extend_retry("task-a", &r, AUTH_ID),
    );
    let mut r = req.clone();
    r.previous_verification_sha256 = "nope".into();
    fx.refused(
        "task-a",
        Code::VERIFICATION_SHA256_INVALID,
        EXT,
        Some("task-a"),
        |s| s.extend_retry("task-a", &r, AUTH_ID),
    );
    let mut r = req.clone();
    r.idempotency_key = "k".into();
    fx.refused(
        "task-a",
        Code::IDEMPOTENCY_KEY_INVALID,
        EXT,
        Some("task-a"),
        |s| s.extend_retry("task-a", &r, AUTH_ID),
    );
    let mut r = req.clone();
    r.expected_revision = -1;
    fx.refused(
        "task-a",
        Code::RETRY_EXTENSION_INTEGER_INVALID,
        EXT,
        Some("task-a"),
        |s| s.extend_retry("task-a", &r, AUTH_ID),
    );
    // Untrimmed but otherwise equal strings are the same request.
    let mut r = req.clone();
    r.authorization_id = format!(" {AUTH_ID} ");
    assert!(
        !fx.store
            .extend_retry("task-a", &r, AUTH_ID)
            .unwrap()
            .idempotent
    );
    assert!(
        fx.store
            .extend_retry("task-a", &req, AUTH_ID)
            .unwrap()
            .idempotent
    );
}

fn retry_extension_refuses_a_verification_record_that_is_not_json(backend: Backend) {
    let mut fx = seed_db(backend);
    fx.exec("UPDATE tasks SET verification_json = '{not json'")
        .unwrap();
    fx.refused(
        "task-a",
        Code::TASK_VERIFICATION_INVALID,
        EXT,
        Some("task-a"),
        |s| s.extend_retry("task-a", &request(&seed_verification()), AUTH_ID),
    );
}

fn retry_extension_binds_a_missing_verification_record_as_empty_object(backend: Backend) {
    let mut fx = seed_db(backend);
    fx.exec("UPDATE tasks SET verification_json = NULL")
        .unwrap();
    let req = request(&json!({}));
    assert_eq!(
        req.previous_verification_sha256,
        verification_sha256(None).unwrap()
    );
    assert_eq!(
        fx.store
            .extend_retry("task-a", &req, AUTH_ID)
            .unwrap()
            .max_attempts,
        11
    );
}

fn retry_extension_through_the_real_lifecycle(backend: Backend) {
    // A task fails its attempts for real; the owner reads the view, binds
    // the request to it, and the task runs one more attempt.
    let mut fx = Fixture::new(backend);
    fx.submit("task-a", 2);
    let failed = fx.exhaust("task-a");
    assert_eq!(
        (failed.state, failed.attempt, failed.max_attempts),
        (TaskState::Failed, 2, 2)
    );
    assert!(fx.store.claim(&worker(), LEASE).unwrap().is_none());

    let owner_request = |view: &airlock_proto::task::TaskView, key: &str| {
        RetryExtensionRequest::from_value(&json!({
            "expected_status": view.state.as_str(), "expected_revision": view.revision,
            "expected_attempt": view.attempt, "expected_max_attempts": view.max_attempts,
            "next_max_attempts": view.max_attempts + 1,
            "previous_verification_sha256": canon(view.verification.as_ref().unwrap()),
            "authorization_id": AUTH_ID, "idempotency_key": key,
        }))
        .unwrap()
    };
    let out = fx
        .store
        .extend_retry(
            "task-a",
            &owner_request(&failed, "retry-task-a-attempt3"),
            AUTH_ID,
        )
        .unwrap();
    assert_eq!((out.max_attempts, out.revision), (3, failed.revision + 1));
    let queued = fx.store.get("task-a").unwrap();
    assert_eq!(
        (queued.state, queued.attempt, queued.max_attempts),
        (TaskState::Queued, 2, 3)
    );
    // The stale claim of the failed attempt was normalised.
    assert_eq!(
        extension_events(&fx)[0].payload["stale_terminal_claim_normalized"],
        json!(true)
    );
    assert_eq!(claim_and_lease(&fx), (None, None, None));
    // The verification record is kept, so the owner's binding stays checkable.
    assert_eq!(queued.verification, failed.verification);

    let g = fx.claim();
    assert_eq!((g.attempt, g.lease_epoch), (3, 3));
    let again = fx.finish(&g, Outcome::Failed, false);
    assert_eq!(again.state, TaskState::Failed);
    // A stale request, bound to what the owner saw before the third
    // attempt, is refused: the verification record changed (checked
    // first), and with a fresh record hash the old revision loses the CAS.
    let stale = owner_request(&failed, "retry-task-a-attempt4");
    let err = fx
        .store
        .extend_retry("task-a", &stale, AUTH_ID)
        .unwrap_err();
    assert_eq!(err.code(), Code::RETRY_EXTENSION_VERIFICATION_DRIFT);
    let mut half_stale = failed.clone();
    half_stale.verification = again.verification.clone();
    half_stale.max_attempts = 3;
    half_stale.attempt = 3;
    let err = fx
        .store
        .extend_retry(
            "task-a",
            &owner_request(&half_stale, "retry-task-a-attempt4"),
            AUTH_ID,
        )
        .unwrap_err();
    assert_eq!(err.code(), Code::RETRY_EXTENSION_CAS_MISMATCH);
    // ... a fresh one wins.
    let out = fx
        .store
        .extend_retry(
            "task-a",
            &owner_request(&again, "retry-task-a-attempt4"),
            AUTH_ID,
        )
        .unwrap();
    assert_eq!(out.max_attempts, 4);
    assert_eq!(fx.claim().attempt, 4);
}

fn retry_extension_refuses_tasks_that_are_not_exhausted_failures(backend: Backend) {
    // A running task has a lease but is not FAILED: the CAS on status comes first.
    let mut fx = Fixture::new(backend);
    fx.submit("task-a", 1);
    fx.claim();
    let view = fx.store.get("task-a").unwrap();
    let req = RetryExtensionRequest::from_value(&json!({
        "expected_status": "FAILED", "expected_revision": view.revision,
        "expected_attempt": 1, "expected_max_attempts": 1, "next_max_attempts": 2,
        "previous_verification_sha256": verification_sha256(None).unwrap(),
        "authorization_id": AUTH_ID, "idempotency_key": KEY,
    }))
    .unwrap();
    fx.refused(
        "task-a",
        Code::RETRY_EXTENSION_CAS_MISMATCH,
        EXT,
        Some("task-a"),
        |s| s.extend_retry("task-a", &req, AUTH_ID),
    );
}

both_backends!(
    retry_extension_cas_and_audit,
    retry_extension_idempotent_replay,
    retry_extension_normalizes_stale_terminal_claim_without_active_lease,
    retry_extension_verification_drift_denied,
    retry_extension_authorization_id_mismatch_rejected,
    retry_extension_bounded_one_step,
    retry_extension_cap_of_fifty,
    retry_extension_active_lease_deny,
    retry_extension_cas_mismatch_per_field,
    retry_extension_idempotency_conflict,
    retry_extension_not_found_and_malformed_ids,
    retry_extension_refuses_a_verification_record_that_is_not_json,
    retry_extension_binds_a_missing_verification_record_as_empty_object,
    retry_extension_through_the_real_lifecycle,
    retry_extension_refuses_tasks_that_are_not_exhausted_failures,
);

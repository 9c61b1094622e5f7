//! Admin decisions (Verify, CancelTask) are exactly-once compare-and-swaps:
//! each refusal has its own code and changes nothing; an identical replay
//! returns the stored answer even after the task moved on; a key reused
//! with other content is a conflict; 50 concurrent identical or
//! conflicting decisions apply exactly once; a delayed decision about an
//! older attempt never lands on the next one. Every test runs against
//! both engines.

#[path = "tasks_common.rs"]
#[macro_use]
mod common;

use airlock_proto::Code;
use airlock_proto::task::{Decision, DecisionOutcome, DecisionRequest, Outcome, TaskState};
use airlock_taskdb::tasks::{EventOutcome, PgStore, action};
use common::*;
use std::sync::{Arc, Barrier};

/// A VERIFYING task at attempt 1 (of `max`), and the request about it.
fn verifying(fx: &mut Fixture, task: &str, max: u32, d: Decision) -> DecisionRequest {
    fx.submit(task, max);
    let grant = fx.claim();
    fx.finish(&grant, Outcome::Passed, false);
    let view = fx.store.get(task).unwrap();
    assert_eq!(view.state, TaskState::Verifying);
    DecisionRequest::about(&view, d, "checked by hand", None)
}

fn allowed(fx: &Fixture, task: &str, what: &str) -> usize {
    fx.store
        .events(Some(task), 0, 1000)
        .unwrap()
        .iter()
        .filter(|e| e.outcome == EventOutcome::Allowed && e.action == what)
        .count()
}

fn every_refusal_has_its_own_code_and_changes_nothing(backend: Backend) {
    let mut fx = Fixture::new(backend);
    let good = verifying(&mut fx, "task-a", 2, Decision::Accept);
    let a = action::TASK_VERIFIED;
    let refuse = |fx: &mut Fixture, req: DecisionRequest, code: Code| {
        fx.refused("task-a", code, a, Some("task-a"), move |s| {
            s.decide("task-a", &req, &admin())
        });
    };
    let mut r = good.clone();
    r.expected_revision += 1;
    refuse(&mut fx, r, Code::DECISION_CAS_MISMATCH);
    let mut r = good.clone();
    r.expected_attempt = 2;
    refuse(&mut fx, r, Code::DECISION_CAS_MISMATCH);
    let mut r = good.clone();
    r.expected_result_sha256 = Some("f".repeat(64));
    refuse(&mut fx, r, Code::DECISION_RESULT_DRIFT);
    let mut r = good.clone();
    r.expected_result_sha256 = None;
    refuse(&mut fx, r, Code::DECISION_RESULT_DRIFT);
    let mut r = good.clone();
    r.idempotency_key = "short".into();
    refuse(&mut fx, r, Code::IDEMPOTENCY_KEY_INVALID);
    let mut r = good.clone();
    r.reason = " ".into();
    refuse(&mut fx, r, Code::VERIFICATION_DECISION_INVALID);
    let mut r = good.clone();
    r.expected_result_sha256 = Some("XYZ".into());
    refuse(&mut fx, r, Code::RESULT_SHA256_INVALID);
    let mut r = good.clone();
    r.schema = "airlock.task-decision.v0".into();
    refuse(&mut fx, r, Code::SCHEMA_INVALID);
    let mut r = good.clone();
    r.task_id = "task-b".into();
    refuse(&mut fx, r, Code::MESSAGE_INVALID);
    // The state table still has the last word: a QUEUED task seen as it is.
    fx.submit("task-q", 1);
    let q = fx.store.get("task-q").unwrap();
    let req = DecisionRequest::about(&q, Decision::Accept, "too early", None);
    fx.refused("task-q", Code::TASK_STATE_INVALID, a, Some("task-q"), |s| {
        s.decide("task-q", &req, &admin())
    });
    let mut missing = good.clone();
    missing.task_id = "task-zz".into();
    fx.refused("task-zz", Code::TASK_NOT_FOUND, a, Some("task-zz"), |s| {
        s.decide("task-zz", &missing, &admin())
    });

    // The good one applies; the same key with other content conflicts,
    // whatever else it says.
    let out = fx.store.decide("task-a", &good, &admin()).unwrap();
    assert_eq!((out.state, out.idempotent), (TaskState::Succeeded, false));
    for edit in [
        (|r: &mut DecisionRequest| r.decision = Decision::Reject) as fn(&mut DecisionRequest),
        |r| r.reason = "another reason".into(),
        |r| r.expected_revision += 1,
    ] {
        let mut other = good.clone();
        edit(&mut other);
        fx.refused(
            "task-a",
            Code::DECISION_IDEMPOTENCY_CONFLICT,
            a,
            Some("task-a"),
            |s| s.decide("task-a", &other, &admin()),
        );
    }
    let mut cancel = good.clone();
    cancel.decision = Decision::Cancel;
    fx.refused(
        "task-a",
        Code::DECISION_IDEMPOTENCY_CONFLICT,
        action::TASK_CANCELLED,
        Some("task-a"),
        |s| s.decide("task-a", &cancel, &admin()),
    );
}

fn an_identical_replay_returns_the_stored_answer_after_the_task_moved_on(backend: Backend) {
    let mut fx = Fixture::new(backend);
    let rework = verifying(&mut fx, "task-a", 3, Decision::Rework);
    let first = fx.store.decide("task-a", &rework, &admin()).unwrap();
    assert_eq!((first.state, first.attempt), (TaskState::Queued, 1));
    assert_eq!(first.result_sha256, rework.expected_result_sha256);
    // The task moves on: attempt 2 is claimed and submits its result.
    let grant = fx.claim();
    assert_eq!(grant.attempt, 2);
    fx.finish(&grant, Outcome::Passed, false);
    let before = fx.snapshot("task-a");
    let events = fx.last_event_id();
    let replay = fx.store.decide("task-a", &rework, &admin()).unwrap();
    assert_eq!(
        replay,
        DecisionOutcome {
            idempotent: true,
            ..first.clone()
        },
        "the replay answers what the decision answered"
    );
    assert_eq!(fx.snapshot("task-a"), before, "a replay changes nothing");
    assert_eq!(fx.last_event_id(), events, "a replay appends nothing");
    assert_eq!(
        fx.store.get("task-a").unwrap().state,
        TaskState::Verifying,
        "the rework did not land on attempt 2"
    );
    assert_eq!(allowed(&fx, "task-a", action::TASK_VERIFIED), 1);
}

fn a_delayed_decision_about_an_older_attempt_is_refused(backend: Backend) {
    let mut fx = Fixture::new(backend);
    // The admin looks at attempt 1 and decides to rework it; the answer is
    // lost and another admin's rework lands first (another key).
    let seen = verifying(&mut fx, "task-a", 3, Decision::Rework);
    let other = DecisionRequest::about(
        &fx.store.get("task-a").unwrap(),
        Decision::Rework,
        "another admin",
        Some("decide-other-admin-0001"),
    );
    fx.store.decide("task-a", &other, &admin()).unwrap();
    let grant = fx.claim();
    fx.finish(&grant, Outcome::Passed, false);
    let now = fx.store.get("task-a").unwrap();
    assert_eq!((now.state, now.attempt), (TaskState::Verifying, 2));
    // The first admin's delayed rework (about attempt 1) arrives now.
    fx.refused(
        "task-a",
        Code::DECISION_CAS_MISMATCH,
        action::TASK_VERIFIED,
        Some("task-a"),
        |s| s.decide("task-a", &seen, &admin()),
    );
    // Even naming the current revision, attempt 1's result is not attempt 2's.
    let mut forged = seen.clone();
    forged.expected_revision = now.revision;
    forged.expected_attempt = now.attempt;
    forged.idempotency_key = "decide-forged-0001".into();
    fx.refused(
        "task-a",
        Code::DECISION_RESULT_DRIFT,
        action::TASK_VERIFIED,
        Some("task-a"),
        |s| s.decide("task-a", &forged, &admin()),
    );
    assert_ne!(seen.expected_result_sha256, now.result_sha256);
    // A cancel about a view the task has left is refused alike.
    let mut cancel = seen.clone();
    cancel.decision = Decision::Cancel;
    cancel.idempotency_key = "cancel-stale-0001".into();
    fx.refused(
        "task-a",
        Code::DECISION_CAS_MISMATCH,
        action::TASK_CANCELLED,
        Some("task-a"),
        |s| s.decide("task-a", &cancel, &admin()),
    );
}

/// Runs `reqs[i]` on its own store (connection) per thread, all released
/// together; returns each result.
fn race(fx: &Fixture, reqs: Vec<DecisionRequest>) -> Vec<Result<DecisionOutcome, Code>> {
    let barrier = Arc::new(Barrier::new(reqs.len()));
    let handles: Vec<_> = reqs
        .into_iter()
        .map(|req| {
            let mut store = fx.reopen();
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                store
                    .decide(&req.task_id, &req, &admin())
                    .map_err(|e| e.code())
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

const RACERS: usize = 50;

fn fifty_identical_decisions_apply_once_and_all_answer_alike(backend: Backend) {
    let mut fx = Fixture::new(backend);
    let req = verifying(&mut fx, "task-a", 3, Decision::Rework);
    let results = race(&fx, vec![req; RACERS]);
    let outcomes: Vec<DecisionOutcome> = results
        .into_iter()
        .map(|r| r.expect("an identical decision is never refused"))
        .collect();
    let applied = outcomes.iter().filter(|o| !o.idempotent).count();
    assert_eq!(applied, 1, "exactly one applied, the rest replayed");
    for o in &outcomes {
        assert_eq!(
            (o.state, o.revision, o.attempt),
            (outcomes[0].state, outcomes[0].revision, outcomes[0].attempt)
        );
    }
    assert_eq!(allowed(&fx, "task-a", action::TASK_VERIFIED), 1);
    let view = fx.store.get("task-a").unwrap();
    assert_eq!((view.state, view.attempt), (TaskState::Queued, 1));
    assert_eq!(
        fx.row("SELECT COUNT(*) FROM task_decisions")[0].as_deref(),
        Some("1")
    );
}

fn fifty_conflicting_decisions_apply_exactly_one(backend: Backend) {
    let mut fx = Fixture::new(backend);
    let base = verifying(&mut fx, "task-a", 3, Decision::Accept);
    // Half reuse one key with different content; the other half are
    // different decisions under their own keys, all about the same view.
    let reqs: Vec<DecisionRequest> = (0..RACERS)
        .map(|i| {
            let mut r = base.clone();
            r.decision = [
                Decision::Accept,
                Decision::Reject,
                Decision::Rework,
                Decision::Cancel,
            ][i % 4];
            r.reason = format!("admin {i}");
            if i % 2 == 1 {
                r.idempotency_key = format!("decide-racer-{i:04}");
            }
            r
        })
        .collect();
    let results = race(&fx, reqs);
    let applied: Vec<&DecisionOutcome> = results
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .filter(|o| !o.idempotent)
        .collect();
    assert_eq!(
        applied.len(),
        1,
        "exactly one decision applied: {results:?}"
    );
    for r in &results {
        match r {
            Ok(o) => assert!(!o.idempotent, "no request was identical to another"),
            Err(code) => assert!(
                matches!(
                    code,
                    Code::DECISION_CAS_MISMATCH | Code::DECISION_IDEMPOTENCY_CONFLICT
                ),
                "{code:?}"
            ),
        }
    }
    let verified = allowed(&fx, "task-a", action::TASK_VERIFIED);
    let cancelled = allowed(&fx, "task-a", action::TASK_CANCELLED);
    assert_eq!(verified + cancelled, 1);
    let view = fx.store.get("task-a").unwrap();
    assert_eq!(view.state, applied[0].state);
    assert_eq!(view.revision, applied[0].revision);
    let denied = fx
        .store
        .events(Some("task-a"), 0, 1000)
        .unwrap()
        .iter()
        .filter(|e| e.outcome == EventOutcome::Denied)
        .count();
    assert_eq!(denied, RACERS - 1, "every refusal is on record");
}

fn decisions_are_append_only(backend: Backend) {
    let mut fx = Fixture::new(backend);
    let req = verifying(&mut fx, "task-a", 1, Decision::Reject);
    fx.store.decide("task-a", &req, &admin()).unwrap();
    for sql in [
        "DELETE FROM task_decisions",
        "UPDATE task_decisions SET decision = 'accept'",
    ] {
        let err = fx.exec(sql).expect_err("decisions are append-only");
        assert!(err.contains("append-only"), "{sql}: {err}");
    }
}

fn upgrading_a_store_without_the_decision_slot_keeps_its_tasks(backend: Backend) {
    // A store as the previous schema left it: tasks and events, no
    // task_decisions table, the previous version number.
    let mut fx = Fixture::new(backend);
    let req = verifying(&mut fx, "task-a", 2, Decision::Accept);
    fx.submit("task-b", 1);
    let before: Vec<_> = ["task-a", "task-b"]
        .iter()
        .map(|t| fx.store.get(t).unwrap())
        .collect();
    let events = fx.last_event_id();
    match backend {
        // (and none of the later tables either: the agents' records)
        Backend::Sqlite => {
            fx.drop_task_columns_since_submitters();
            fx.exec("DROP TABLE task_decisions").unwrap();
            fx.exec("DROP TABLE reconciliation_resolutions").unwrap();
            fx.exec("DROP TABLE reconciliations").unwrap();
            fx.exec("DROP TABLE agents").unwrap();
            fx.exec("PRAGMA user_version = 2").unwrap();
        }
        Backend::Postgres => {
            fx.drop_task_columns_since_submitters();
            fx.exec("DROP TABLE task_decisions").unwrap();
            fx.exec("DROP TABLE reconciliation_resolutions").unwrap();
            fx.exec("DROP TABLE reconciliations").unwrap();
            fx.exec("DROP TABLE agents").unwrap();
            fx.exec("UPDATE airlock_schema SET version = 1").unwrap();
        }
    }
    // Opening migrates (on PostgreSQL as the schema's owner, as
    // `airlock-supervisor --migrate` does); what the administrators had is
    // all still there.
    if let Some(pg) = &fx.pg {
        PgStore::open(&pg.owner_location()).expect("the owner migrates");
    }
    let mut store = fx.reopen();
    for v in &before {
        assert_eq!(&store.get(&v.task_id).unwrap(), v);
    }
    assert_eq!(
        store.events(None, 0, 1000).unwrap().last().map(|e| e.id),
        Some(events)
    );
    let out = store.decide("task-a", &req, &admin()).unwrap();
    assert_eq!(out.state, TaskState::Succeeded);
    assert_eq!(
        store.decide("task-a", &req, &admin()).unwrap(),
        DecisionOutcome {
            idempotent: true,
            ..out
        }
    );
}

both_backends!(
    every_refusal_has_its_own_code_and_changes_nothing,
    an_identical_replay_returns_the_stored_answer_after_the_task_moved_on,
    a_delayed_decision_about_an_older_attempt_is_refused,
    fifty_identical_decisions_apply_once_and_all_answer_alike,
    fifty_conflicting_decisions_apply_exactly_one,
    decisions_are_append_only,
    upgrading_a_store_without_the_decision_slot_keeps_its_tasks,
);

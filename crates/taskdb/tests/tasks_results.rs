//! Submitting results, verification decisions and cancellation.

#[path = "tasks_common.rs"]
#[macro_use]
mod common;

use airlock_proto::Code;
use airlock_proto::task::{CommandSummary, Decision, Isolation, Outcome, TaskResult, TaskState};
use airlock_taskdb::tasks::{EventOutcome, action, verification_sha256};
use common::*;
use serde_json::json;

fn submit_result(
    fx: &mut Fixture,
    grant: &airlock_proto::task::ClaimGrant,
    key: &str,
    result: &TaskResult,
    auto_accept: bool,
) -> airlock_taskdb::StoreResult<airlock_taskdb::tasks::ResultReceipt> {
    fx.store.submit_result(
        &grant.task_id,
        grant.lease_epoch,
        &grant.lease_token,
        key,
        result,
        auto_accept,
        &worker(),
    )
}

fn a_passed_result_goes_to_verifying_and_clears_the_lease(backend: Backend) {
    let mut fx = Fixture::new(backend);
    let t = fx.submit("task-a", 2);
    let grant = fx.claim();
    let result = result_for(&grant, Outcome::Passed);
    let r = submit_result(&mut fx, &grant, &result_key(&grant), &result, false).unwrap();
    assert!(!r.idempotent);
    let v = r.task;
    assert_eq!(v.state, TaskState::Verifying);
    assert_eq!(v.lease_expires_at_ms, None);
    assert_eq!(v.revision, t.revision + 2);
    assert_eq!(v.result, Some(serde_json::to_value(&result).unwrap()));
    assert_eq!(v.verification, None);
    let raw = fx.row("SELECT claimed_by, lease_token_hash, lease_expires_at FROM tasks");
    assert_eq!(raw, vec![Some("worker-1".into()), None, None]);
    let e = fx.store.events(Some("task-a"), 0, 10).unwrap();
    let last = e.last().unwrap();
    assert_eq!(last.action, action::TASK_RESULT_SUBMITTED);
    assert_eq!(last.payload["state"], json!("VERIFYING"));
    assert_eq!(last.payload["automatic_decision"], json!(false));
    // The result is stored once, keyed by (task, key), with its digest.
    let row = fx.row("SELECT COUNT(*), MAX(result_sha256) FROM results");
    assert_eq!(row[0].as_deref(), Some("1"));
    assert_eq!(json!(row[1]), last.payload["result_sha256"]);
}

fn auto_accept_succeeds_only_when_every_command_exited_zero(backend: Backend) {
    let mut fx = Fixture::new(backend);
    fx.submit("task-a", 1);
    let grant = fx.claim();
    let v = fx.finish(&grant, Outcome::Passed, true);
    assert_eq!(v.state, TaskState::Succeeded);
    let ver = v.verification.unwrap();
    assert_eq!(ver["decision"], json!("ACCEPTED"));
    assert_eq!(ver["automatic"], json!(true));

    // A command that timed out, exited non-zero, was killed, or is missing
    // from the evidence leaves the decision to a human.
    let edits: [fn(&mut Vec<CommandSummary>); 5] = [
        |c| c[0].timed_out = true,
        |c| c[0].exit_code = Some(2),
        |c| c[0].exit_code = None,
        |c| c.clear(),
        |c| c[0].label = "other".into(),
    ];
    for (i, edit) in edits.iter().enumerate() {
        let id = format!("task-auto-{i}");
        fx.submit(&id, 1);
        let grant = fx.claim();
        let mut result = result_for(&grant, Outcome::Passed);
        edit(&mut result.verification);
        let v = submit_result(&mut fx, &grant, &result_key(&grant), &result, true)
            .unwrap()
            .task;
        assert_eq!(v.state, TaskState::Verifying, "case {i}");
        assert_eq!(v.verification, None);
    }
}

/// auto_accept accepts only results whose commands all ran fully
/// confined: degraded Landlock, seccomp off, root, or anything unmeasured
/// leaves the task VERIFYING, and the result event says why.
fn auto_accept_is_withheld_unless_the_commands_ran_fully_confined(backend: Backend) {
    let mut fx = Fixture::new(backend);
    type Edit = fn(&mut Option<Isolation>);
    let edits: [(Edit, &str); 6] = [
        (
            |i| i.as_mut().unwrap().landlock = "degraded".into(),
            "Landlock degraded (ABI 7)",
        ),
        (
            |i| i.as_mut().unwrap().seccomp = "off".into(),
            "seccomp off",
        ),
        (
            |i| i.as_mut().unwrap().uid = Some(0),
            "commands ran as root",
        ),
        (
            |i| i.as_mut().unwrap().view = "unmeasured".into(),
            "filesystem view unmeasured",
        ),
        (
            |i| *i = Some(Isolation::unmeasured()),
            "Landlock unmeasured",
        ),
        (
            |i| i.as_mut().unwrap().namespaces = None,
            "namespaces unmeasured",
        ),
    ];
    for (n, (edit, gap)) in edits.iter().enumerate() {
        let id = format!("task-iso-{n}");
        fx.submit(&id, 1);
        let grant = fx.claim();
        let mut result = result_for(&grant, Outcome::Passed);
        edit(&mut result.isolation);
        let v = submit_result(&mut fx, &grant, &result_key(&grant), &result, true)
            .unwrap()
            .task;
        assert_eq!(v.state, TaskState::Verifying, "case {n}");
        assert_eq!(v.verification, None, "case {n}");
        let stored = &v.result.as_ref().expect("the result is kept")["isolation"];
        assert!(stored.is_object(), "case {n}: {stored}");
        let events = fx.store.events(Some(&id), 0, 100).unwrap();
        let submitted = events
            .iter()
            .find(|e| e.action == "TASK_RESULT_SUBMITTED")
            .expect("the result event");
        let withheld = submitted.payload["auto_accept_withheld"]
            .as_array()
            .unwrap_or_else(|| panic!("case {n}: {}", submitted.payload));
        assert!(
            withheld.iter().any(|g| g == gap),
            "case {n}: {withheld:?} lacks {gap:?}"
        );
    }
    // A passed result without evidence is refused and changes nothing.
    fx.submit("task-iso-none", 1);
    let grant = fx.claim();
    let mut result = result_for(&grant, Outcome::Passed);
    result.isolation = None;
    let e = submit_result(&mut fx, &grant, &result_key(&grant), &result, true).unwrap_err();
    assert_eq!(e.code(), Code::MESSAGE_INVALID, "{e}");
    assert_eq!(
        fx.store.get("task-iso-none").unwrap().state,
        TaskState::Running
    );
    // The control: the same result, fully confined, is accepted at once.
    result.isolation = result_for(&grant, Outcome::Passed).isolation;
    let v = submit_result(&mut fx, &grant, &result_key(&grant), &result, true)
        .unwrap()
        .task;
    assert_eq!(v.state, TaskState::Succeeded);
}

fn a_failed_result_is_an_automatic_rework_then_a_failure(backend: Backend) {
    let mut fx = Fixture::new(backend);
    fx.submit("task-a", 2);
    let g1 = fx.claim();
    let v = fx.finish(&g1, Outcome::Failed, true);
    assert_eq!((v.state, v.attempt), (TaskState::Queued, 1));
    let ver = v.verification.unwrap();
    assert_eq!(ver["decision"], json!("NEEDS_REWORK"));
    assert_eq!(ver["reason"], json!("VERIFICATION_FAILED"));
    assert_eq!(ver["automatic"], json!(true));
    let g2 = fx.claim();
    assert_eq!((g2.attempt, g2.lease_epoch), (2, 2));
    let v = fx.finish(&g2, Outcome::Failed, true);
    assert_eq!(
        (v.state, v.attempt, v.max_attempts),
        (TaskState::Failed, 2, 2)
    );
    assert!(fx.store.claim(&worker(), LEASE).unwrap().is_none());
}

fn an_identical_result_replays_even_after_the_task_moved_on(backend: Backend) {
    let mut fx = Fixture::new(backend);
    fx.submit("task-a", 2);
    let grant = fx.claim();
    let result = result_for(&grant, Outcome::Passed);
    let key = result_key(&grant);
    let first = submit_result(&mut fx, &grant, &key, &result, false).unwrap();
    let last = fx.last_event_id();
    let again = submit_result(&mut fx, &grant, &key, &result, false).unwrap();
    assert!(again.idempotent);
    assert_eq!(again.task, first.task);
    assert_eq!(fx.last_event_id(), last, "a replay appends nothing");
    // Moved on: accepted. The replay still answers, with the current task,
    // even though the lease is long gone.
    let accepted = fx
        .store
        .decide_now("task-a", Decision::Accept, "looks right", &admin())
        .unwrap();
    let again = fx
        .store
        .submit_result(
            "task-a",
            grant.lease_epoch,
            "not-the-token",
            &key,
            &result,
            false,
            &worker(),
        )
        .unwrap();
    assert!(again.idempotent);
    assert_eq!(again.task, accepted);
}

fn another_result_under_a_used_key_is_a_conflict(backend: Backend) {
    let mut fx = Fixture::new(backend);
    fx.submit("task-a", 2);
    let grant = fx.claim();
    let key = result_key(&grant);
    submit_result(
        &mut fx,
        &grant,
        &key,
        &result_for(&grant, Outcome::Passed),
        false,
    )
    .unwrap();
    let mut other = result_for(&grant, Outcome::Passed);
    other.commit_oid = Some("d".repeat(40));
    let g = grant.clone();
    fx.refused(
        "task-a",
        Code::RESULT_IDEMPOTENCY_CONFLICT,
        action::TASK_RESULT_SUBMITTED,
        Some("task-a"),
        |s| {
            s.submit_result(
                "task-a",
                g.lease_epoch,
                &g.lease_token,
                &key,
                &other,
                false,
                &worker(),
            )
        },
    );
}

fn result_refusals_change_nothing(backend: Backend) {
    let mut fx = Fixture::new(backend);
    fx.submit("task-a", 3);
    let grant = fx.claim();
    let a = action::TASK_RESULT_SUBMITTED;
    let key = result_key(&grant);
    let good = result_for(&grant, Outcome::Passed);
    let g = grant.clone();
    let run = |fx: &mut Fixture,
               code: Code,
               task: &str,
               epoch: u64,
               token: &str,
               key: &str,
               result: TaskResult| {
        let event_task = airlock_proto::binding::is_task_id(task).then_some(task);
        fx.refused("task-a", code, a, event_task, |s| {
            s.submit_result(task, epoch, token, key, &result, true, &worker())
        });
    };
    run(
        &mut fx,
        Code::TASK_ID_INVALID,
        "t",
        g.lease_epoch,
        &g.lease_token,
        &key,
        good.clone(),
    );
    run(
        &mut fx,
        Code::IDEMPOTENCY_KEY_INVALID,
        "task-a",
        g.lease_epoch,
        &g.lease_token,
        "short",
        good.clone(),
    );
    let mut r = good.clone();
    r.schema = "other".into();
    run(
        &mut fx,
        Code::SCHEMA_INVALID,
        "task-a",
        g.lease_epoch,
        &g.lease_token,
        &key,
        r,
    );
    let mut r = good.clone();
    r.commit_oid = None;
    run(
        &mut fx,
        Code::MESSAGE_INVALID,
        "task-a",
        g.lease_epoch,
        &g.lease_token,
        &key,
        r,
    );
    run(
        &mut fx,
        Code::TASK_NOT_FOUND,
        "task-zz",
        g.lease_epoch,
        &g.lease_token,
        &key,
        good.clone(),
    );
    run(
        &mut fx,
        Code::LEASE_EPOCH_STALE,
        "task-a",
        g.lease_epoch - 1,
        &g.lease_token,
        &key,
        good.clone(),
    );
    run(
        &mut fx,
        Code::LEASE_INVALID,
        "task-a",
        g.lease_epoch + 1,
        &g.lease_token,
        &key,
        good.clone(),
    );
    run(
        &mut fx,
        Code::LEASE_INVALID,
        "task-a",
        g.lease_epoch,
        &"0".repeat(64),
        &key,
        good.clone(),
    );
    run(
        &mut fx,
        Code::LEASE_INVALID,
        "task-a",
        g.lease_epoch,
        "",
        &key,
        good.clone(),
    );
    // With the lease proven, a result that disagrees with the task is malformed.
    let mut r = good.clone();
    r.task_id = "task-b".into();
    run(
        &mut fx,
        Code::MESSAGE_INVALID,
        "task-a",
        g.lease_epoch,
        &g.lease_token,
        &key,
        r,
    );
    let mut r = good.clone();
    r.attempt = 2;
    run(
        &mut fx,
        Code::MESSAGE_INVALID,
        "task-a",
        g.lease_epoch,
        &g.lease_token,
        &key,
        r,
    );
    let mut r = good.clone();
    r.execution_digest = "f".repeat(64);
    run(
        &mut fx,
        Code::MESSAGE_INVALID,
        "task-a",
        g.lease_epoch,
        &g.lease_token,
        &key,
        r,
    );
    let mut r = good.clone();
    r.target_branch = "agent/other".into();
    run(
        &mut fx,
        Code::MESSAGE_INVALID,
        "task-a",
        g.lease_epoch,
        &g.lease_token,
        &key,
        r,
    );
    // Bounded: a result's canonical form is at most MAX_RESULT_BYTES.
    let mut r = good.clone();
    r.verification[0].label = "l".repeat(airlock_proto::limits::MAX_RESULT_BYTES);
    run(
        &mut fx,
        Code::FIELD_BOUNDS_EXCEEDED,
        "task-a",
        g.lease_epoch,
        &g.lease_token,
        &key,
        r,
    );
    // A capture is not the outcome of a deterministic plan.
    let mut r = good.clone();
    r.outcome = Outcome::Captured;
    r.commit_oid = None;
    r.captured = Some(airlock_proto::task::Capture {
        source_tree: "b".repeat(40),
        captured_in_attempt: 1,
        source_signals: vec![],
        files: vec![],
        withheld: vec![],
    });
    assert!(
        r.validate().is_ok(),
        "well formed: refused only as not fitting the plan"
    );
    run(
        &mut fx,
        Code::MESSAGE_INVALID,
        "task-a",
        g.lease_epoch,
        &g.lease_token,
        &key,
        r,
    );
    // Expired (expiry == now counts as expired).
    fx.clock.advance(LEASE);
    run(
        &mut fx,
        Code::LEASE_EXPIRED,
        "task-a",
        g.lease_epoch,
        &g.lease_token,
        &key,
        good.clone(),
    );
    // Not RUNNING.
    fx.store.cancel("task-a", "stop", &admin()).unwrap();
    run(
        &mut fx,
        Code::TASK_STATE_INVALID,
        "task-a",
        g.lease_epoch,
        &g.lease_token,
        &key,
        good.clone(),
    );
}

fn a_fenced_holder_cannot_submit_after_a_new_claim(backend: Backend) {
    let mut fx = Fixture::new(backend);
    fx.submit("task-a", 3);
    let old = fx.claim();
    fx.clock.advance(LEASE + 1);
    fx.store.sweep_expired().unwrap();
    let new = fx.claim();
    assert_eq!((new.attempt, new.lease_epoch), (2, 2));
    let result = result_for(&old, Outcome::Passed);
    fx.refused(
        "task-a",
        Code::LEASE_EPOCH_STALE,
        action::TASK_RESULT_SUBMITTED,
        Some("task-a"),
        |s| {
            s.submit_result(
                "task-a",
                old.lease_epoch,
                &old.lease_token,
                &result_key(&old),
                &result,
                false,
                &worker(),
            )
        },
    );
    // The old token with the new epoch is not a lease either.
    let result = result_for(&new, Outcome::Passed);
    fx.refused(
        "task-a",
        Code::LEASE_INVALID,
        action::TASK_RESULT_SUBMITTED,
        Some("task-a"),
        |s| {
            s.submit_result(
                "task-a",
                new.lease_epoch,
                &old.lease_token,
                &result_key(&new),
                &result,
                false,
                &worker(),
            )
        },
    );
    assert_eq!(
        fx.finish(&new, Outcome::Passed, false).state,
        TaskState::Verifying
    );
}

fn decisions_move_a_verifying_task(backend: Backend) {
    let mut fx = Fixture::new(backend);
    let cases = [
        (Decision::Accept, 2, TaskState::Succeeded, "ACCEPTED"),
        (Decision::Reject, 2, TaskState::Failed, "REJECTED"),
        (Decision::Rework, 1, TaskState::Failed, "NEEDS_REWORK"),
        // Last, so that the fixture's claims above take the task just submitted.
        (Decision::Rework, 2, TaskState::Queued, "NEEDS_REWORK"),
    ];
    for (i, (decision, max, state, record)) in cases.into_iter().enumerate() {
        let id = format!("task-decide-{i}");
        fx.submit(&id, max);
        let grant = fx.claim();
        let verifying = fx.finish(&grant, Outcome::Passed, false);
        let v = fx
            .store
            .decide_now(&id, decision, "  checked by hand \n", &admin())
            .unwrap();
        assert_eq!(v.state, state, "{decision:?}");
        assert_eq!(v.revision, verifying.revision + 1);
        assert_eq!(
            v.verification,
            Some(json!({
                "decision": record, "reason": "checked by hand", "actor": "admin",
                "attempt": 1, "result_sha256": verifying.result_sha256,
            }))
        );
        let e = fx.store.events(Some(&id), 0, 10).unwrap();
        let last = e.last().unwrap();
        assert_eq!(
            (last.action.as_str(), last.outcome),
            (action::TASK_VERIFIED, EventOutcome::Allowed)
        );
        // The verification record's hash is what an owner would bind to.
        let raw = fx.row(&format!(
            "SELECT verification_json FROM tasks WHERE task_id = '{id}'"
        ))[0]
            .clone()
            .unwrap();
        assert_eq!(
            verification_sha256(Some(&raw)).unwrap(),
            airlock_proto::canonical::digest_of(&v.verification.unwrap()).unwrap()
        );
    }
    // A reworked task is claimable again, as the next attempt.
    let grant = fx.claim();
    assert_eq!(
        (grant.task_id.as_str(), grant.attempt),
        ("task-decide-3", 2)
    );
}

fn decision_refusals(backend: Backend) {
    let mut fx = Fixture::new(backend);
    fx.submit("task-a", 2);
    let a = action::TASK_VERIFIED;
    fx.refused("task-a", Code::TASK_STATE_INVALID, a, Some("task-a"), |s| {
        s.decide_now("task-a", Decision::Accept, "ok", &admin())
    });
    let grant = fx.claim();
    fx.refused("task-a", Code::TASK_STATE_INVALID, a, Some("task-a"), |s| {
        s.decide_now("task-a", Decision::Accept, "ok", &admin())
    });
    fx.finish(&grant, Outcome::Passed, false);
    for bad in ["", "   ", "colour\u{1b}[31m", &"r".repeat(1025)] {
        fx.refused(
            "task-a",
            Code::VERIFICATION_DECISION_INVALID,
            a,
            Some("task-a"),
            |s| s.decide_now("task-a", Decision::Reject, bad, &admin()),
        );
    }
    fx.refused("task-zz", Code::TASK_NOT_FOUND, a, Some("task-zz"), |s| {
        s.decide_now("task-zz", Decision::Accept, "ok", &admin())
    });
    fx.refused("task-a", Code::TASK_ID_INVALID, a, None, |s| {
        s.decide_now("", Decision::Accept, "ok", &admin())
    });
    fx.store
        .decide_now("task-a", Decision::Accept, "ok", &admin())
        .unwrap();
    fx.refused("task-a", Code::TASK_STATE_INVALID, a, Some("task-a"), |s| {
        s.decide_now("task-a", Decision::Reject, "changed my mind", &admin())
    });
}

fn cancel_from_every_live_state_and_never_from_a_terminal_one(backend: Backend) {
    let mut fx = Fixture::new(backend);
    // QUEUED.
    fx.submit("task-q", 2);
    let v = fx.store.cancel("task-q", "duplicate", &admin()).unwrap();
    assert_eq!((v.state, v.revision), (TaskState::Cancelled, 2));
    // RUNNING: the lease is dropped and the holder is shut out.
    fx.submit("task-r", 2);
    let grant = fx.claim();
    let v = fx
        .store
        .cancel("task-r", "operator stop", &admin())
        .unwrap();
    assert_eq!(
        (v.state, v.lease_expires_at_ms),
        (TaskState::Cancelled, None)
    );
    fx.refused(
        "task-r",
        Code::TASK_STATE_INVALID,
        action::TASK_LEASE_RENEWED,
        Some("task-r"),
        |s| {
            s.renew(
                "task-r",
                grant.lease_epoch,
                &grant.lease_token,
                LEASE,
                &worker(),
            )
        },
    );
    // VERIFYING.
    fx.submit("task-v", 2);
    let grant = fx.claim();
    fx.finish(&grant, Outcome::Passed, false);
    assert_eq!(
        fx.store
            .cancel("task-v", "superseded", &admin())
            .unwrap()
            .state,
        TaskState::Cancelled
    );
    let e = fx.store.events(Some("task-v"), 0, 10).unwrap();
    assert_eq!(
        e.last().unwrap().payload["previous_state"],
        json!("VERIFYING")
    );
    assert_eq!(e.last().unwrap().payload["reason"], json!("superseded"));

    // Terminal: CANCELLED, SUCCEEDED, FAILED.
    let a = action::TASK_CANCELLED;
    fx.refused("task-q", Code::TASK_STATE_INVALID, a, Some("task-q"), |s| {
        s.cancel("task-q", "again", &admin())
    });
    fx.submit("task-s", 1);
    let grant = fx.claim();
    fx.finish(&grant, Outcome::Passed, true);
    fx.refused("task-s", Code::TASK_STATE_INVALID, a, Some("task-s"), |s| {
        s.cancel("task-s", "late", &admin())
    });
    fx.submit("task-f", 1);
    let grant = fx.claim();
    fx.finish(&grant, Outcome::Failed, true);
    fx.refused("task-f", Code::TASK_STATE_INVALID, a, Some("task-f"), |s| {
        s.cancel("task-f", "late", &admin())
    });
    // Other refusals.
    fx.submit("task-x", 1);
    fx.refused(
        "task-x",
        Code::VERIFICATION_DECISION_INVALID,
        a,
        Some("task-x"),
        |s| s.cancel("task-x", " ", &admin()),
    );
    fx.refused("task-zz", Code::TASK_NOT_FOUND, a, Some("task-zz"), |s| {
        s.cancel("task-zz", "gone", &admin())
    });
}

fn queued_tasks_of_a_removed_repository_fail_with_repository_not_registered_and_stay(
    backend: Backend,
) {
    let mut fx = Fixture::new(backend);
    fx.submit("task-gone-1", 3);
    fx.submit("task-gone-2", 3);
    let running = fx.claim();
    assert_eq!(running.task_id, "task-gone-1");
    // "demo" is still registered: nothing happens.
    assert!(
        fx.store
            .fail_unregistered(&["demo".to_owned()])
            .unwrap()
            .is_empty()
    );
    // "demo" removed: the queued task fails; the running one is the worker's to fail.
    let failed = fx.store.fail_unregistered(&["other".to_owned()]).unwrap();
    assert_eq!(failed, ["task-gone-2"]);
    let view = fx.store.get("task-gone-2").unwrap();
    assert_eq!(view.state, TaskState::Failed);
    assert_eq!(
        view.verification.as_ref().unwrap()["reason"],
        "REPOSITORY_NOT_REGISTERED"
    );
    let events = fx.store.events(Some("task-gone-2"), 0, 100).unwrap();
    let last = events.last().unwrap();
    assert_eq!(last.action, action::TASK_REPOSITORY_UNREGISTERED);
    assert_eq!(last.outcome, EventOutcome::Allowed);
    assert_eq!(
        fx.store.get("task-gone-1").unwrap().state,
        TaskState::Running
    );
    // The worker's failed result with that code ends the task at once,
    // attempts left or not.
    let mut result = result_for(&running, Outcome::Failed);
    result.failure_code = Some("REPOSITORY_NOT_REGISTERED".into());
    let receipt = fx
        .store
        .submit_result(
            &running.task_id,
            running.lease_epoch,
            &running.lease_token,
            &result_key(&running),
            &result,
            false,
            &worker(),
        )
        .unwrap();
    assert_eq!(receipt.task.state, TaskState::Failed);
    assert_eq!(receipt.task.attempt, 1);
    assert_eq!(receipt.task.max_attempts, 3);
    // Nothing vanished.
    assert_eq!(fx.store.summary().unwrap().total(), 2);
}

fn a_policy_refusal_ends_the_task_at_once_and_a_failing_test_does_not(backend: Backend) {
    let mut fx = Fixture::new(backend);
    for (i, code) in [
        "COMMAND_PROGRAM_DENY",
        "PYTHON_MODULE_DENY",
        "GIT_MUTATION_DENY",
        "ENVIRONMENT_PATH_UNSAFE",
        // Last: it goes back to the queue, where the next claim would take it.
        "VERIFICATION_FAILED",
    ]
    .iter()
    .enumerate()
    {
        let id = format!("task-policy-{i}");
        fx.submit(&id, 3);
        let running = fx.claim();
        assert_eq!(running.task_id, id);
        let mut result = result_for(&running, Outcome::Failed);
        result.failure_code = Some((*code).into());
        let receipt = fx
            .store
            .submit_result(
                &running.task_id,
                running.lease_epoch,
                &running.lease_token,
                &result_key(&running),
                &result,
                false,
                &worker(),
            )
            .unwrap();
        let expected = if *code == "VERIFICATION_FAILED" {
            TaskState::Queued
        } else {
            TaskState::Failed
        };
        assert_eq!(receipt.task.state, expected, "{code}");
        assert_eq!(receipt.task.attempt, 1, "{code}");
    }
}

both_backends!(
    a_policy_refusal_ends_the_task_at_once_and_a_failing_test_does_not,
    a_passed_result_goes_to_verifying_and_clears_the_lease,
    auto_accept_succeeds_only_when_every_command_exited_zero,
    auto_accept_is_withheld_unless_the_commands_ran_fully_confined,
    a_failed_result_is_an_automatic_rework_then_a_failure,
    an_identical_result_replays_even_after_the_task_moved_on,
    another_result_under_a_used_key_is_a_conflict,
    result_refusals_change_nothing,
    a_fenced_holder_cannot_submit_after_a_new_claim,
    decisions_move_a_verifying_task,
    decision_refusals,
    cancel_from_every_live_state_and_never_from_a_terminal_one,
    queued_tasks_of_a_removed_repository_fail_with_repository_not_registered_and_stay,
);

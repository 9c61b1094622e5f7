//! Submitting tasks, reading them, replacing plans, and the event log.

#[path = "tasks_common.rs"]
#[macro_use]
mod common;

use airlock_proto::Code;
use airlock_proto::binding::BranchMode;
use airlock_proto::plan::PlanRequest;
use airlock_proto::task::{Outcome, TaskState};
use airlock_taskdb::tasks::{
    ActorKind, EventOutcome, PgLocation, PgStore, SqliteStore, action, verification_sha256,
};
use common::*;
use serde_json::json;

fn submit_queues_a_new_task_at_attempt_zero(backend: Backend) {
    let mut fx = Fixture::new(backend);
    let s = submission("task-a", 3);
    let out = fx.store.submit(&s, &planner()).unwrap();
    assert!(!out.idempotent);
    let t = out.task;
    assert_eq!(t.state, TaskState::Queued);
    assert_eq!(
        (t.attempt, t.max_attempts, t.revision, t.lease_epoch),
        (0, 3, 1, 0)
    );
    assert_eq!(t.lease_expires_at_ms, None);
    assert_eq!(t.binding, s.binding);
    assert_eq!(t.plan_digest.len(), 64);
    assert_eq!(t.execution_digest.len(), 64);
    assert_eq!((t.result.clone(), t.verification.clone()), (None, None));
    assert_eq!((t.created_at_ms, t.updated_at_ms), (T0, T0));
    assert_eq!(fx.store.get("task-a").unwrap(), t);

    let events = fx.store.events(Some("task-a"), 0, 10).unwrap();
    assert_eq!(events.len(), 1);
    let e = &events[0];
    assert_eq!(e.action, action::TASK_SUBMITTED);
    assert_eq!(e.outcome, EventOutcome::Allowed);
    assert_eq!(e.code, None);
    assert_eq!(e.actor.kind, ActorKind::Planner);
    assert_eq!(e.actor.uid, Some(1001));
    assert_eq!(e.at_ms, T0);
    assert_eq!(e.payload["plan_digest"], json!(t.plan_digest));
    assert_eq!(e.payload["execution_digest"], json!(t.execution_digest));
}

fn the_stored_envelope_is_the_projection_of_the_plan(backend: Backend) {
    let mut fx = Fixture::new(backend);
    let t = fx.submit("task-a", 1);
    let grant = fx.claim();
    assert_eq!(
        grant.envelope["execution_digest"],
        json!(t.execution_digest)
    );
    let env = airlock_proto::envelope::Envelope::validate(&grant.envelope, Some(&t.binding), None)
        .unwrap();
    assert_eq!(env.execution_digest, t.execution_digest);
}

fn an_identical_resubmission_is_an_idempotent_replay_even_after_the_task_moved_on(
    backend: Backend,
) {
    let mut fx = Fixture::new(backend);
    let first = fx.submit("task-a", 2);
    let last = fx.last_event_id();
    let again = fx
        .store
        .submit(&submission("task-a", 2), &planner())
        .unwrap();
    assert!(again.idempotent);
    assert_eq!(again.task, first);
    assert_eq!(fx.last_event_id(), last, "a replay appends nothing");

    let grant = fx.claim();
    let again = fx
        .store
        .submit(&submission("task-a", 2), &planner())
        .unwrap();
    assert!(again.idempotent);
    assert_eq!(again.task.state, TaskState::Running);
    assert_eq!(again.task.attempt, grant.attempt);
}

fn the_same_key_with_other_content_is_an_idempotency_conflict(backend: Backend) {
    let mut fx = Fixture::new(backend);
    fx.submit("task-a", 2);
    // Another attempt budget.
    fx.refused(
        "task-a",
        Code::TASK_IDEMPOTENCY_CONFLICT,
        action::TASK_SUBMITTED,
        Some("task-a"),
        |s| s.submit(&submission("task-a", 3), &planner()),
    );
    // Another plan.
    let mut v = submission_json("task-a", 2);
    v["plan"]["execution"]["change_set"][0]["content"] = json!("x=2\n");
    let other = airlock_proto::task::TaskSubmission::from_value(&v).unwrap();
    fx.refused(
        "task-a",
        Code::TASK_IDEMPOTENCY_CONFLICT,
        action::TASK_SUBMITTED,
        Some("task-a"),
        |s| s.submit(&other, &planner()),
    );
    // The same key on another task.
    let mut v = submission_json("task-b", 2);
    v["binding"]["idempotency_key"] = json!("submit-task-a");
    let other = airlock_proto::task::TaskSubmission::from_value(&v).unwrap();
    fx.refused(
        "task-a",
        Code::TASK_IDEMPOTENCY_CONFLICT,
        action::TASK_SUBMITTED,
        Some("task-b"),
        |s| s.submit(&other, &planner()),
    );
    assert!(fx.store.get("task-b").is_err());
}

fn the_same_task_id_under_another_key_is_an_idempotency_conflict(backend: Backend) {
    let mut fx = Fixture::new(backend);
    fx.submit("task-a", 2);
    let mut v = submission_json("task-a", 2);
    v["binding"]["idempotency_key"] = json!("another-key-for-a");
    let other = airlock_proto::task::TaskSubmission::from_value(&v).unwrap();
    fx.refused(
        "task-a",
        Code::TASK_IDEMPOTENCY_CONFLICT,
        action::TASK_SUBMITTED,
        Some("task-a"),
        |s| s.submit(&other, &planner()),
    );
}

fn invalid_submissions_are_refused_and_audited_without_a_task(backend: Backend) {
    let mut fx = Fixture::new(backend);
    type Edit = fn(&mut airlock_proto::task::TaskSubmission);
    let cases: Vec<(Code, Edit)> = vec![
        (Code::MAX_ATTEMPTS_INVALID, |s| s.max_attempts = 0),
        (Code::MAX_ATTEMPTS_INVALID, |s| s.max_attempts = 51),
        // A hand-built binding is parsed again before it is stored.
        (Code::PROTECTED_REF_DENY, |s| {
            s.binding.target_branch = "main".into()
        }),
        (Code::EXPECTED_BASE_CONFLICT, |s| {
            s.binding.branch_mode = BranchMode::CreateNew
        }),
        (Code::EXECUTION_PLAN_BINDING_CONFLICT, |s| {
            s.plan.task_id = "task-other".into()
        }),
        (Code::EXECUTION_PLAN_GENERATION_CONFLICT, |s| {
            s.plan.generation = 2
        }),
        (Code::EXECUTION_PLAN_SOURCE_HEAD_CONFLICT, |s| {
            s.plan.source_head_oid = BASE.into()
        }),
        (Code::EXECUTION_PLAN_IDEMPOTENCY_INVALID, |s| {
            s.plan.idempotency_key = "short".into()
        }),
        // A first registration may not name a previous plan.
        (Code::EXECUTION_PLAN_REPLACEMENT_CAS_MISMATCH, |s| {
            s.plan.expected_previous_plan_digest = Some("f".repeat(64))
        }),
    ];
    for (code, edit) in cases {
        let mut s = submission("task-a", 2);
        edit(&mut s);
        fx.refused(
            "task-a",
            code,
            action::TASK_SUBMITTED,
            Some("task-a"),
            |st| st.submit(&s, &planner()),
        );
    }
    assert_eq!(fx.store.summary().unwrap().total(), 0);
    // A CREATE_NEW task whose plan names the base is fine.
    let mut v = submission_json("task-new", 1);
    v["binding"]["branch_mode"] = json!("CREATE_NEW");
    v["binding"]["expected_branch_oid"] = json!(BASE);
    v["plan"]["source_head_oid"] = json!(BASE);
    let s = airlock_proto::task::TaskSubmission::from_value(&v).unwrap();
    assert!(!fx.store.submit(&s, &planner()).unwrap().idempotent);
}

fn a_garbage_task_id_is_not_recorded_as_a_task_id_in_the_denial(backend: Backend) {
    let mut fx = Fixture::new(backend);
    let mut s = submission("task-a", 2);
    s.binding.task_id = "../../etc/passwd".into();
    let last = fx.last_event_id();
    assert_eq!(
        fx.store.submit(&s, &planner()).unwrap_err().code(),
        Code::TASK_ID_INVALID
    );
    let e = &fx.store.events(None, last, 10).unwrap()[0];
    assert_eq!(e.task_id, None);
    assert_eq!(e.code, Some(Code::TASK_ID_INVALID));
}

fn get_list_and_summary(backend: Backend) {
    let mut fx = Fixture::new(backend);
    for id in ["task-c", "task-a", "task-b", "task-d"] {
        fx.submit(id, 1);
    }
    assert_eq!(
        fx.store.get("task-zz").unwrap_err().code(),
        Code::TASK_NOT_FOUND
    );
    assert_eq!(fx.store.get("x").unwrap_err().code(), Code::TASK_ID_INVALID);
    let ids = |v: Vec<airlock_proto::task::TaskView>| {
        v.into_iter().map(|t| t.task_id).collect::<Vec<_>>()
    };
    assert_eq!(
        ids(fx.store.list(None, None, 10).unwrap()),
        ["task-a", "task-b", "task-c", "task-d"]
    );
    assert_eq!(
        ids(fx.store.list(None, Some("task-a"), 2).unwrap()),
        ["task-b", "task-c"]
    );
    assert!(fx.store.list(None, None, 0).unwrap().is_empty());
    assert_eq!(fx.store.list(None, None, u32::MAX).unwrap().len(), 4);

    // The oldest submission is claimed first: task-c.
    let grant = fx.claim();
    assert_eq!(grant.task_id, "task-c");
    assert_eq!(
        ids(fx.store.list(Some(TaskState::Running), None, 10).unwrap()),
        ["task-c"]
    );
    assert_eq!(
        ids(fx.store.list(Some(TaskState::Queued), None, 10).unwrap()),
        ["task-a", "task-b", "task-d"]
    );
    fx.store.cancel("task-d", "not needed", &admin()).unwrap();
    let s = fx.store.summary().unwrap();
    assert_eq!((s.queued, s.running, s.cancelled, s.total()), (2, 1, 1, 4));
    assert_eq!(s.count(TaskState::Verifying), 0);
}

fn replacement(task_id: &str, key: &str, content: &str, previous: Option<&str>) -> PlanRequest {
    let mut v = plan_json(task_id, key, content);
    if let Some(p) = previous {
        v["expected_previous_plan_digest"] = json!(p);
    }
    PlanRequest::from_value(&v).unwrap()
}

fn replace_plan_swaps_the_plan_of_a_queued_task_under_cas(backend: Backend) {
    let mut fx = Fixture::new(backend);
    let t = fx.submit("task-a", 2);
    let p = replacement("task-a", "plan-task-a-v2", "x=2\n", Some(&t.plan_digest));
    let after = fx.store.replace_plan("task-a", &p, &planner()).unwrap();
    assert_ne!(after.plan_digest, t.plan_digest);
    assert_ne!(after.execution_digest, t.execution_digest);
    assert_eq!(after.revision, t.revision + 1);
    assert_eq!(after.state, TaskState::Queued);
    let e = fx.store.events(Some("task-a"), 0, 10).unwrap();
    assert_eq!(e.last().unwrap().action, action::TASK_PLAN_REPLACED);
    assert_eq!(
        e.last().unwrap().payload["previous_plan_digest"],
        json!(t.plan_digest)
    );

    // A replay of the stored plan returns the task unchanged and appends nothing.
    let last = fx.last_event_id();
    assert_eq!(
        fx.store.replace_plan("task-a", &p, &planner()).unwrap(),
        after
    );
    assert_eq!(fx.last_event_id(), last);

    // The claim hands out the new envelope.
    let grant = fx.claim();
    assert_eq!(
        grant.envelope["execution_digest"],
        json!(after.execution_digest)
    );
    assert_eq!(grant.envelope["change_set"][0]["content"], json!("x=2\n"));
    // ... and a replay still succeeds once the task is running.
    let running = fx.store.replace_plan("task-a", &p, &planner()).unwrap();
    assert_eq!(running.state, TaskState::Running);
    assert_eq!(running.plan_digest, after.plan_digest);
}

fn replace_plan_refusals(backend: Backend) {
    let mut fx = Fixture::new(backend);
    let t = fx.submit("task-a", 2);
    let a = action::TASK_PLAN_REPLACED;
    let v2 = |prev: Option<&str>| replacement("task-a", "plan-task-a-v2", "x=2\n", prev);

    fx.refused("task-zz", Code::TASK_NOT_FOUND, a, Some("task-zz"), |s| {
        s.replace_plan(
            "task-zz",
            &replacement("task-zz", "plan-zz-v2", "y\n", None),
            &planner(),
        )
    });
    fx.refused("task-a", Code::TASK_ID_INVALID, a, None, |s| {
        s.replace_plan("!", &v2(None), &planner())
    });
    // Another key without naming the stored digest, or naming a wrong one.
    fx.refused(
        "task-a",
        Code::EXECUTION_PLAN_REPLACEMENT_CAS_MISMATCH,
        a,
        Some("task-a"),
        |s| s.replace_plan("task-a", &v2(None), &planner()),
    );
    fx.refused(
        "task-a",
        Code::EXECUTION_PLAN_REPLACEMENT_CAS_MISMATCH,
        a,
        Some("task-a"),
        |s| s.replace_plan("task-a", &v2(Some(&"f".repeat(64))), &planner()),
    );
    // The stored key with other content.
    fx.refused(
        "task-a",
        Code::EXECUTION_PLAN_IDEMPOTENCY_CONFLICT,
        a,
        Some("task-a"),
        |s| {
            s.replace_plan(
                "task-a",
                &replacement("task-a", "plan-task-a-v1", "x=3\n", None),
                &planner(),
            )
        },
    );
    // A plan for another task, or against another source head.
    fx.refused(
        "task-a",
        Code::EXECUTION_PLAN_BINDING_CONFLICT,
        a,
        Some("task-a"),
        |s| {
            let mut p = v2(Some(&t.plan_digest));
            p.task_id = "task-b".into();
            s.replace_plan("task-a", &p, &planner())
        },
    );
    fx.refused(
        "task-a",
        Code::EXECUTION_PLAN_SOURCE_HEAD_CONFLICT,
        a,
        Some("task-a"),
        |s| {
            let mut p = v2(Some(&t.plan_digest));
            p.source_head_oid = BASE.into();
            s.replace_plan("task-a", &p, &planner())
        },
    );
    // Not QUEUED: a valid replacement is refused once the task runs.
    let grant = fx.claim();
    fx.refused("task-a", Code::TASK_STATE_INVALID, a, Some("task-a"), |s| {
        s.replace_plan("task-a", &v2(Some(&t.plan_digest)), &planner())
    });
    fx.finish(&grant, Outcome::Passed, true);
    fx.refused("task-a", Code::TASK_STATE_INVALID, a, Some("task-a"), |s| {
        s.replace_plan("task-a", &v2(Some(&t.plan_digest)), &planner())
    });
}

fn events_are_append_only(backend: Backend) {
    let mut fx = Fixture::new(backend);
    fx.submit("task-a", 1);
    // Even the database's owner (SQLite: anyone with the file) is stopped
    // by the triggers.
    let err = fx.exec("UPDATE events SET action = 'FORGED'").unwrap_err();
    assert!(err.contains("append-only"), "{err}");
    let err = fx.exec("DELETE FROM events").unwrap_err();
    assert!(err.contains("append-only"), "{err}");
    let err = fx
        .exec("UPDATE events SET outcome = 'denied', code = 'X' WHERE id = 1")
        .unwrap_err();
    assert!(err.contains("append-only"), "{err}");
    assert_eq!(fx.row("SELECT COUNT(*) FROM events"), texts(&["1"]));
    assert_eq!(
        fx.store.events(None, 0, 10).unwrap()[0].action,
        action::TASK_SUBMITTED
    );
}

fn results_and_retry_extensions_are_append_only_too(backend: Backend) {
    let mut fx = Fixture::new(backend);
    fx.submit("task-a", 1);
    let grant = fx.claim();
    fx.finish(&grant, Outcome::Passed, false);
    for bad in [
        "UPDATE results SET result_sha256 = 'x'",
        "DELETE FROM results",
    ] {
        let err = fx.exec(bad).unwrap_err();
        assert!(err.contains("append-only"), "{bad}: {err}");
    }
    fx.exec("INSERT INTO task_retry_extensions VALUES ('t', 'k', 's', 'a', 'v', 1, 2, 3, 4, 5)")
        .unwrap();
    for bad in [
        "UPDATE task_retry_extensions SET applied_revision = 9",
        "DELETE FROM task_retry_extensions",
    ] {
        let err = fx.exec(bad).unwrap_err();
        assert!(err.contains("append-only"), "{bad}: {err}");
    }
}

fn record_denial_audits_refusals_made_outside_the_store(backend: Backend) {
    let mut fx = Fixture::new(backend);
    fx.submit("task-a", 1);
    let long = "d".repeat(5000);
    fx.store
        .record_denial(
            Some("task-a"),
            &planner(),
            "Tasks2.CancelTask",
            Code::AUTHORIZATION_DENIED,
            &long,
        )
        .unwrap();
    fx.store
        .record_denial(
            Some("bad id!"),
            &planner(),
            "Worker1.Claim",
            Code::PEER_UID_DENIED,
            "",
        )
        .unwrap();
    let denied: Vec<_> = fx
        .store
        .events(None, 0, 10)
        .unwrap()
        .into_iter()
        .filter(|e| e.outcome == EventOutcome::Denied)
        .collect();
    assert_eq!(denied.len(), 2);
    assert_eq!(denied[0].task_id.as_deref(), Some("task-a"));
    assert_eq!(denied[0].code, Some(Code::AUTHORIZATION_DENIED));
    assert_eq!(denied[0].payload["detail"].as_str().unwrap().len(), 1024);
    assert_eq!(denied[1].task_id, None);
    assert_eq!(denied[1].to_value()["code"], json!("PEER_UID_DENIED"));
    // Filter and page.
    assert_eq!(fx.store.events(Some("task-a"), 0, 10).unwrap().len(), 2);
    assert_eq!(fx.store.events(None, denied[0].id, 10).unwrap().len(), 1);
    assert_eq!(fx.store.events(None, 0, 1).unwrap().len(), 1);
}

fn reopening_keeps_everything_and_passes_the_integrity_check(backend: Backend) {
    let mut fx = Fixture::new(backend);
    let t = fx.submit("task-a", 2);
    fx.store.integrity_check().unwrap();
    let reopened = fx.reopen();
    drop(std::mem::replace(&mut fx.store, reopened));
    assert_eq!(fx.store.get("task-a").unwrap(), t);
    fx.store.integrity_check().unwrap();
    if let Some((_, path)) = &fx.sqlite {
        // The system-clock constructor opens the same file.
        let other = SqliteStore::open(path).unwrap();
        assert_eq!(other.get("task-a").unwrap(), t);
        // A checkpoint journal is not a task store.
        let dir = tempfile::tempdir().unwrap();
        let journal = dir.path().join("j.sqlite3");
        airlock_sqlite::db::open(&journal, airlock_sqlite::db::Kind::Checkpoints, &[]).unwrap();
        assert_eq!(
            SqliteStore::open(&journal).unwrap_err().code(),
            Code::STORE_UNAVAILABLE
        );
    }
    if let Some(pg) = &fx.pg {
        // A database that is not an airlock task store is refused.
        let mut su = pg.cluster.superuser("postgres").unwrap();
        su.batch_execute("CREATE DATABASE other OWNER airlock_owner")
            .unwrap();
        let mut other = pg.cluster.superuser("other").unwrap();
        other
            .batch_execute(
                "CREATE TABLE airlock_schema (id integer PRIMARY KEY, kind text, version bigint); \
                 INSERT INTO airlock_schema VALUES (1, 'something-else', 1);",
            )
            .unwrap();
        let url = pg.db.owner_url.replace("/airlock", "/other");
        let loc = PgLocation::parse(&url)
            .unwrap()
            .with_password(pg.db.owner_password.as_bytes());
        assert_eq!(
            PgStore::open(&loc).unwrap_err().code(),
            Code::STORE_UNAVAILABLE
        );
    }
}

#[test]
fn verification_hash_matches_the_seed() {
    // Values computed with the seed's Python (`json.dumps(v, sort_keys=True,
    // separators=(",", ":"))` then SHA-256).
    assert_eq!(
        verification_sha256(None).unwrap(),
        "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
    );
    assert_eq!(
        verification_sha256(Some("")).unwrap(),
        verification_sha256(None).unwrap()
    );
    assert_eq!(
        verification_sha256(Some(
            r#"{"reason": "BASE_OID_BINDING_INVALID", "decision": "NEEDS_REWORK"}"#
        ))
        .unwrap(),
        "fa8478b90b2ae72f7da07a5eac8c045af00d6358bb6c6b932dafa0e21fe30f65"
    );
    for bad in ["{", "not json", "  "] {
        assert_eq!(
            verification_sha256(Some(bad)).unwrap_err().code(),
            Code::TASK_VERIFICATION_INVALID
        );
    }
}

both_backends!(
    submit_queues_a_new_task_at_attempt_zero,
    the_stored_envelope_is_the_projection_of_the_plan,
    an_identical_resubmission_is_an_idempotent_replay_even_after_the_task_moved_on,
    the_same_key_with_other_content_is_an_idempotency_conflict,
    the_same_task_id_under_another_key_is_an_idempotency_conflict,
    invalid_submissions_are_refused_and_audited_without_a_task,
    a_garbage_task_id_is_not_recorded_as_a_task_id_in_the_denial,
    get_list_and_summary,
    replace_plan_swaps_the_plan_of_a_queued_task_under_cas,
    replace_plan_refusals,
    events_are_append_only,
    results_and_retry_extensions_are_append_only_too,
    record_denial_audits_refusals_made_outside_the_store,
    reopening_keeps_everything_and_passes_the_integrity_check,
);

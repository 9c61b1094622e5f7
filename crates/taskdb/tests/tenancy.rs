//! Reads bound to the submitter: every task records who submitted it (the
//! uid, and the planner agent's name when an agent did), a read scoped to
//! one submitter sees exactly that submitter's tasks, their events and
//! their reconciliation cases, and another's task answers as one that does
//! not exist; a store older than the columns fills them from each task's
//! TASK_SUBMITTED event when it is opened. Every test runs against both
//! engines.

#[path = "tasks_common.rs"]
#[macro_use]
mod common;

use airlock_proto::Code;
use airlock_proto::reconcile::BranchFacts;
use airlock_proto::task::{Outcome, Submitter};
use airlock_taskdb::tasks::{Actor, PgStore, ReadScope};
use common::*;

/// A planner of another uid than the agents' ([`alpha`], [`beta`],
/// [`plain`]).
fn human() -> Actor {
    Actor::planner(Some(1001), "alice@:1.10")
}

fn own(uid: u32, agent: Option<&str>) -> ReadScope {
    ReadScope::Own {
        uid,
        agent: agent.map(str::to_owned),
    }
}

/// Who may read what: each actor's scope and the one task it submitted.
fn cast() -> Vec<(Actor, ReadScope, &'static str)> {
    vec![
        (alpha(), own(989, Some("alpha")), "task-alpha"),
        (beta(), own(989, Some("beta")), "task-beta"),
        (plain(), own(989, None), "task-plain"),
        (human(), own(1001, None), "task-human"),
    ]
}

/// Each actor submits its task; `task-alpha` first, so that it is the one
/// claimed and made a reconciliation case.
fn populate(fx: &mut Fixture) {
    for (actor, _, task) in cast() {
        fx.store.submit(&submission(task, 2), &actor).unwrap();
    }
    let grant = fx.claim();
    assert_eq!(grant.task_id, "task-alpha");
    let mut result = result_for(&grant, Outcome::Failed);
    result.failure_code = Some(Code::RECONCILIATION_REQUIRED.as_str().into());
    result.exec_result_sha256 = None;
    result.verification = vec![];
    result.reconciliation = Some(BranchFacts {
        commit_oid: "1".repeat(40),
        observed_head: Some("2".repeat(40)),
    });
    fx.store
        .submit_result(
            &grant.task_id,
            grant.lease_epoch,
            &grant.lease_token,
            &result_key(&grant),
            &result,
            false,
            &worker(),
        )
        .expect("the reconciliation result");
    // A refusal about a task id that names no task, and one about none.
    fx.store
        .record_denial(
            Some("task-ghost"),
            &human(),
            "TASK_READ",
            Code::AUTHORIZATION_DENIED,
            "x",
        )
        .unwrap();
    fx.store
        .record_denial(
            None,
            &human(),
            "TASKS_LISTED",
            Code::AUTHORIZATION_DENIED,
            "x",
        )
        .unwrap();
}

/// Checks every read of `store` for every scope of the cast.
fn every_read_is_bound(store: &mut dyn TaskStore) {
    let all: Vec<&str> = cast().iter().map(|(_, _, t)| *t).collect();
    for (actor, scope, mine) in cast() {
        let who = &actor.name;
        // GetTask: its own, with its submitter; every other as missing.
        let view = store.get_as(mine, &scope).unwrap();
        assert_eq!(view.submitter, Some(actor.submitter()), "{who}");
        for other in all.iter().filter(|t| **t != mine) {
            let err = store.get_as(other, &scope).unwrap_err();
            let missing = store.get_as("task-none", &scope).unwrap_err();
            assert_eq!(err.code(), Code::TASK_NOT_FOUND, "{who} reading {other}");
            assert_eq!(
                err.to_string().replace(other, "ID"),
                missing.to_string().replace("task-none", "ID"),
                "{who}: another's task answers as a missing one"
            );
        }
        // GetPlan: its own task's envelope, the digests GetTask names;
        // every other as missing, exactly as GetTask.
        let plan = store.plan_as(mine, &scope).unwrap();
        assert_eq!(
            (
                plan.task_id.as_str(),
                &plan.plan_digest,
                &plan.execution_digest
            ),
            (mine, &view.plan_digest, &view.execution_digest),
            "{who}"
        );
        assert_eq!(plan.envelope["task_id"], mine, "{who}");
        assert_eq!(
            plan.envelope["execution_digest"],
            view.execution_digest.as_str()
        );
        for other in all.iter().filter(|t| **t != mine) {
            let err = store.plan_as(other, &scope).unwrap_err();
            let missing = store.plan_as("task-none", &scope).unwrap_err();
            assert_eq!(err.code(), Code::TASK_NOT_FOUND, "{who} planning {other}");
            assert_eq!(
                err.to_string().replace(other, "ID"),
                missing.to_string().replace("task-none", "ID"),
                "{who}: another's plan answers as a missing one"
            );
            assert_eq!(
                err.to_string(),
                store.get_as(other, &scope).unwrap_err().to_string(),
                "{who}: GetPlan refuses as GetTask"
            );
        }
        // ListTasks: its own only, on a page of one as on a full page.
        let listed: Vec<String> = store
            .list_as(None, None, 100, &scope)
            .unwrap()
            .into_iter()
            .map(|t| t.task_id)
            .collect();
        assert_eq!(listed, vec![mine.to_owned()], "{who}");
        let first = store.list_as(None, None, 1, &scope).unwrap();
        assert_eq!(first.len(), 1, "{who}: a short page while its task exists");
        assert!(
            store
                .list_as(None, Some(mine), 1, &scope)
                .unwrap()
                .is_empty()
        );
        // ListEvents: those of its task only (the worker's among them),
        // none about another task, a task id of no task, or no task.
        let events = store.events_as(None, 0, 1000, &scope).unwrap();
        assert!(!events.is_empty(), "{who}");
        assert!(
            events.iter().all(|e| e.task_id.as_deref() == Some(mine)),
            "{who}: {events:?}"
        );
        for other in all.iter().filter(|t| **t != mine) {
            assert!(
                store
                    .events_as(Some(other), 0, 1000, &scope)
                    .unwrap()
                    .is_empty()
            );
        }
        assert!(
            store
                .events_as(Some("task-ghost"), 0, 1000, &scope)
                .unwrap()
                .is_empty()
        );
        // Reconciliations: alpha's case is alpha's alone.
        let cases = store.reconciliations_as(None, None, 100, &scope).unwrap();
        let case = store.reconciliation_as("task-alpha", &scope);
        if mine == "task-alpha" {
            assert_eq!(cases.len(), 1, "{who}");
            assert_eq!(case.unwrap().task_id, "task-alpha");
        } else {
            assert!(cases.is_empty(), "{who}: {cases:?}");
            let err = case.unwrap_err();
            let none = store
                .reconciliation_as("task-human", &ReadScope::All)
                .unwrap_err();
            assert_eq!(err.code(), Code::RECONCILIATION_NOT_FOUND, "{who}");
            assert_eq!(
                err.to_string().replace("task-alpha", "ID"),
                none.to_string().replace("task-human", "ID"),
                "{who}: another's case answers as none"
            );
        }
    }
    // Read-all sees everything; an unknown uid nothing.
    assert_eq!(
        store
            .list_as(None, None, 100, &ReadScope::All)
            .unwrap()
            .len(),
        4
    );
    for (_, _, task) in cast() {
        assert_eq!(store.plan_as(task, &ReadScope::All).unwrap().task_id, task);
        assert_eq!(
            store.plan_as(task, &own(4242, None)).unwrap_err().code(),
            Code::TASK_NOT_FOUND
        );
    }
    assert_eq!(
        store.plan_as("../etc", &ReadScope::All).unwrap_err().code(),
        Code::TASK_ID_INVALID
    );
    assert!(
        store
            .list_as(None, None, 100, &own(4242, None))
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .events_as(None, 0, 1000, &own(4242, None))
            .unwrap()
            .is_empty()
    );
    let everything = store.events_as(None, 0, 1000, &ReadScope::All).unwrap();
    assert!(everything.iter().any(|e| e.task_id.is_none()));
    assert!(
        everything
            .iter()
            .any(|e| e.task_id.as_deref() == Some("task-ghost"))
    );
}

fn a_scoped_read_sees_its_submitters_tasks_alone(backend: Backend) {
    let mut fx = Fixture::new(backend);
    populate(&mut fx);
    every_read_is_bound(fx.store.as_mut());
}

fn a_replay_by_another_submitter_is_a_conflict_and_the_submitter_is_fixed(backend: Backend) {
    let mut fx = Fixture::new(backend);
    let s = submission("task-a", 2);
    let first = fx.store.submit(&s, &alpha()).unwrap();
    assert!(!first.idempotent);
    assert_eq!(
        first.task.submitter,
        Some(Submitter {
            uid: Some(989),
            agent: Some("alpha".into())
        })
    );
    let events = fx.last_event_id();
    // The same agent again (another connection): the stored task.
    let again = fx
        .store
        .submit(
            &s,
            &Actor::planner(Some(989), "agent:alpha airlock-agent@:1.99"),
        )
        .unwrap();
    assert!(again.idempotent);
    // Another agent of the same user, the user outside an agent, another
    // uid: the key is taken, and nothing of the task is told.
    for other in [beta(), plain(), human()] {
        let err = fx.store.submit(&s, &other).unwrap_err();
        assert_eq!(
            err.code(),
            Code::TASK_IDEMPOTENCY_CONFLICT,
            "{}",
            other.name
        );
        assert!(!err.to_string().contains("QUEUED"), "{err}");
    }
    assert_eq!(
        fx.store.get("task-a").unwrap(),
        again.task,
        "nothing changed"
    );
    assert_eq!(fx.last_event_id(), events + 3, "three refusals on record");
    // No write may change who submitted it.
    for sql in [
        "UPDATE tasks SET submitter_uid = 1001",
        "UPDATE tasks SET submitter_agent = 'beta'",
        "UPDATE tasks SET submitter_agent = NULL",
    ] {
        let err = fx.exec(sql).expect_err("the submitter is fixed");
        assert!(err.contains("submitter never changes"), "{sql}: {err}");
    }
}

fn upgrading_fills_each_tasks_submitter_from_its_submission_event(backend: Backend) {
    let mut fx = Fixture::new(backend);
    populate(&mut fx);
    // A task whose submission is not on record (none should exist; one
    // written by hand stands for it): no submitter, read-all only.
    let before: Vec<_> = cast()
        .iter()
        .map(|(_, _, t)| fx.store.get(t).unwrap())
        .collect();
    fx.drop_task_columns_since_submitters();
    match backend {
        Backend::Sqlite => fx.exec("PRAGMA user_version = 5").unwrap(),
        Backend::Postgres => fx.exec("UPDATE airlock_schema SET version = 4").unwrap(),
    };
    fx.exec(
        "INSERT INTO tasks (task_id, status, attempt, max_attempts, revision, lease_epoch, \
         binding_json, plan_json, envelope_json, execution_digest, plan_digest, idempotency_key, \
         submission_sha256, created_at_ms, updated_at_ms, repository) \
         SELECT 'task-orphan', status, attempt, max_attempts, revision, lease_epoch, \
         replace(binding_json, 'task-human', 'task-orphan'), \
         replace(plan_json, 'task-human', 'task-orphan'), \
         replace(envelope_json, 'task-human', 'task-orphan'), execution_digest, plan_digest, \
         replace(idempotency_key, 'task-human', 'task-orphan'), \
         submission_sha256, created_at_ms, updated_at_ms, repository FROM tasks \
         WHERE task_id = 'task-human'",
    )
    .unwrap();
    // Nothing is known of the submitters before the migration.
    assert!(
        fx.exec("UPDATE tasks SET submitter_uid = 1").is_err(),
        "the columns are gone"
    );
    if let Some(pg) = &fx.pg {
        PgStore::open(&pg.owner_location()).expect("the owner migrates");
    }
    let mut store = fx.reopen();
    for v in &before {
        assert_eq!(&store.get(&v.task_id).unwrap(), v, "{}", v.task_id);
    }
    assert_eq!(
        fx.rows("SELECT task_id, submitter_uid, submitter_agent FROM tasks ORDER BY task_id"),
        [
            ["task-alpha", "989", "alpha"]
                .map(|s| Some(s.to_owned()))
                .to_vec(),
            ["task-beta", "989", "beta"]
                .map(|s| Some(s.to_owned()))
                .to_vec(),
            vec![Some("task-human".into()), Some("1001".into()), None],
            vec![Some("task-orphan".into()), None, None],
            vec![Some("task-plain".into()), Some("989".into()), None],
        ]
    );
    assert_eq!(store.get("task-orphan").unwrap().submitter, None);
    for (_, scope, _) in cast() {
        let err = store.get_as("task-orphan", &scope).unwrap_err();
        assert_eq!(err.code(), Code::TASK_NOT_FOUND);
    }
    // Every read is bound after the upgrade as before it (the orphan
    // aside, seen by read-all alone).
    let orphan_free = store.list_as(None, None, 100, &ReadScope::All).unwrap();
    assert_eq!(orphan_free.len(), 5);
    fx.exec("DELETE FROM tasks WHERE task_id = 'task-orphan'")
        .unwrap();
    every_read_is_bound(store.as_mut());
}

/// Revocation (issue 25 part 5): an agent's QUEUED tasks end CANCELLED
/// with AGENT_REVOKED in one transaction of the store's one writer; its
/// RUNNING task, other agents' and other submitters' tasks are untouched;
/// a repository kept keeps its tasks; a second call cancels nothing.
fn an_agents_queued_tasks_are_cancelled_as_revoked_and_no_others(backend: Backend) {
    use airlock_proto::task::TaskState;
    let mut fx = Fixture::new(backend);
    for (actor, task) in [
        (alpha(), "task-a1"),
        (alpha(), "task-a2"),
        (beta(), "task-b1"),
        (plain(), "task-p1"),
        (human(), "task-h1"),
    ] {
        fx.store.submit(&submission(task, 2), &actor).unwrap();
    }
    assert_eq!(fx.claim().task_id, "task-a1");
    let registry = Actor::system("agent-registry");
    // Narrowed but still holding the repository: nothing to cancel.
    let kept = fx
        .store
        .cancel_agent_queued("beta", Some(&["demo".to_owned()]), "narrowed", &registry)
        .unwrap();
    assert!(kept.is_empty(), "{kept:?}");
    let cancelled = fx
        .store
        .cancel_agent_queued("alpha", None, "removed", &registry)
        .unwrap();
    assert_eq!(cancelled, ["task-a2"]);
    let state = |fx: &mut Fixture, t: &str| fx.store.get(t).unwrap().state;
    assert_eq!(state(&mut fx, "task-a1"), TaskState::Running);
    assert_eq!(state(&mut fx, "task-a2"), TaskState::Cancelled);
    for t in ["task-b1", "task-p1", "task-h1"] {
        assert_eq!(state(&mut fx, t), TaskState::Queued, "{t}");
    }
    let events = fx.store.events(Some("task-a2"), 0, 100).unwrap();
    let cancel = events
        .iter()
        .find(|e| e.action == "TASK_CANCELLED")
        .expect("a TASK_CANCELLED event");
    assert!(
        cancel.payload.to_string().contains("AGENT_REVOKED"),
        "{:?}",
        cancel.payload
    );
    assert_eq!(cancel.actor.name, "agent-registry");
    // Narrowed to no repository: beta's queued task goes too; again: none.
    let narrowed = fx
        .store
        .cancel_agent_queued("beta", Some(&[]), "narrowed", &registry)
        .unwrap();
    assert_eq!(narrowed, ["task-b1"]);
    assert!(
        fx.store
            .cancel_agent_queued("alpha", None, "again", &registry)
            .unwrap()
            .is_empty()
    );
    assert_eq!(state(&mut fx, "task-p1"), TaskState::Queued);
}

both_backends!(
    an_agents_queued_tasks_are_cancelled_as_revoked_and_no_others,
    a_scoped_read_sees_its_submitters_tasks_alone,
    a_replay_by_another_submitter_is_a_conflict_and_the_submitter_is_fixed,
    upgrading_fills_each_tasks_submitter_from_its_submission_event,
);

//! Reconciliation cases: a worker's RECONCILIATION_REQUIRED result ends the
//! task FAILED at once and opens a case with what the worker saw; an
//! administrator resolves it exactly once (compare-and-swap on the case as
//! shown, idempotent by key), each refusal with its own code and changing
//! nothing; an adoption is settled only by the worker's check of the ref.
//! Every test runs against both engines.

#[path = "tasks_common.rs"]
#[macro_use]
mod common;

use airlock_proto::Code;
use airlock_proto::reconcile::{
    AdoptionReport, BranchFacts, CaseStatus, ReconciliationCase, Resolution, ResolveRequest,
};
use airlock_proto::task::{Outcome, TaskState};
use airlock_taskdb::tasks::{EventOutcome, PgStore, action};
use common::*;

const MADE: &str = "1111111111111111111111111111111111111111";
const MOVED: &str = "2222222222222222222222222222222222222222";
const AGAIN: &str = "3333333333333333333333333333333333333333";

/// A task (of `max` attempts) whose first attempt reported its branch at
/// `observed` instead of the commit it made.
fn reconciling(fx: &mut Fixture, task: &str, max: u32, observed: Option<&str>) {
    fx.submit(task, max);
    let grant = fx.claim();
    let mut result = result_for(&grant, Outcome::Failed);
    result.failure_code = Some(Code::RECONCILIATION_REQUIRED.as_str().into());
    result.exec_result_sha256 = None;
    result.verification = vec![];
    result.reconciliation = Some(BranchFacts {
        commit_oid: MADE.into(),
        observed_head: observed.map(str::to_owned),
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
}

fn count(fx: &Fixture, task: &str, what: &str, outcome: EventOutcome) -> usize {
    fx.store
        .events(Some(task), 0, 1000)
        .unwrap()
        .iter()
        .filter(|e| e.outcome == outcome && e.action == what)
        .count()
}

fn case(fx: &mut Fixture, task: &str) -> ReconciliationCase {
    fx.store.reconciliation(task).unwrap()
}

fn report(c: &ReconciliationCase, now: Option<&str>, descends: bool) -> AdoptionReport {
    AdoptionReport {
        task_id: c.task_id.clone(),
        attempt: c.attempt,
        checked_head: c.observed_head.clone().unwrap(),
        head_now: now.map(str::to_owned),
        descends,
    }
}

fn a_reconciliation_result_fails_the_task_at_once_and_opens_a_case(backend: Backend) {
    let mut fx = Fixture::new(backend);
    reconciling(&mut fx, "task-a", 3, Some(MOVED));
    let view = fx.store.get("task-a").unwrap();
    assert_eq!(
        (view.state, view.attempt),
        (TaskState::Failed, 1),
        "another attempt cannot settle a moved branch: FAILED with attempts left"
    );
    let c = case(&mut fx, "task-a");
    assert_eq!(c.status, CaseStatus::Open);
    assert_eq!(
        (c.attempt, c.commit_oid.as_str(), c.observed_head.as_deref()),
        (1, MADE, Some(MOVED))
    );
    assert_eq!(c.base_oid, view.binding.source_head());
    assert_eq!(c.branch, view.binding.target_branch);
    assert_eq!(c.revision, 1);
    assert_eq!(
        count(
            &fx,
            "task-a",
            action::TASK_RECONCILIATION_OPENED,
            EventOutcome::Allowed
        ),
        1
    );
    assert_eq!(
        fx.store.reconciliations(None, None, 10).unwrap(),
        vec![c.clone()]
    );
    assert_eq!(
        fx.store
            .reconciliations(Some(CaseStatus::Open), None, 10)
            .unwrap()
            .len(),
        1
    );
    assert!(
        fx.store
            .reconciliations(Some(CaseStatus::Adopted), None, 10)
            .unwrap()
            .is_empty()
    );
    assert!(
        fx.store
            .reconciliations(None, Some("task-a"), 10)
            .unwrap()
            .is_empty()
    );
    // A failure with another code opens nothing and is retried as before.
    fx.submit("task-b", 2);
    let g = fx.claim();
    assert_eq!(
        fx.finish(&g, Outcome::Failed, false).state,
        TaskState::Queued
    );
    assert_eq!(
        fx.store.reconciliation("task-b").unwrap_err().code(),
        Code::RECONCILIATION_NOT_FOUND
    );
}

fn every_refusal_has_its_own_code_and_changes_nothing(backend: Backend) {
    let mut fx = Fixture::new(backend);
    reconciling(&mut fx, "task-a", 1, Some(MOVED));
    let shown = case(&mut fx, "task-a");
    let good = ResolveRequest::about(&shown, Resolution::Fail, "gone", None);
    let a = action::TASK_RECONCILIATION_RESOLVED;
    let refuse = |fx: &mut Fixture, req: ResolveRequest, code: Code| {
        fx.refused("task-a", code, a, Some("task-a"), move |s| {
            s.resolve_reconciliation("task-a", &req, &admin())
        });
    };
    let mut r = good.clone();
    r.expected_revision += 1;
    refuse(&mut fx, r, Code::RECONCILIATION_CAS_MISMATCH);
    let mut r = good.clone();
    r.expected_attempt = 2;
    refuse(&mut fx, r, Code::RECONCILIATION_CAS_MISMATCH);
    let mut r = good.clone();
    r.expected_observed_head = Some(AGAIN.into());
    refuse(&mut fx, r, Code::RECONCILIATION_CAS_MISMATCH);
    let mut r = good.clone();
    r.expected_observed_head = None;
    refuse(&mut fx, r, Code::RECONCILIATION_CAS_MISMATCH);
    let mut r = good.clone();
    r.reason = " ".into();
    refuse(&mut fx, r, Code::RECONCILIATION_RESOLUTION_INVALID);
    let mut r = good.clone();
    r.idempotency_key = "k".into();
    refuse(&mut fx, r, Code::IDEMPOTENCY_KEY_INVALID);
    let mut r = good.clone();
    r.schema = "airlock.reconciliation-resolution.v0".into();
    refuse(&mut fx, r, Code::SCHEMA_INVALID);
    let mut r = good.clone();
    r.task_id = "task-b".into();
    refuse(&mut fx, r, Code::MESSAGE_INVALID);
    // Nothing to adopt where the branch is gone.
    reconciling(&mut fx, "task-m", 1, None);
    let gone = case(&mut fx, "task-m");
    let r = ResolveRequest::about(&gone, Resolution::Adopt, "take it", None);
    fx.refused(
        "task-m",
        Code::RECONCILIATION_HEAD_UNRELATED,
        a,
        Some("task-m"),
        |s| s.resolve_reconciliation("task-m", &r, &admin()),
    );
    // A task without a case, and a task that does not exist.
    fx.submit("task-q", 1);
    let mut r = good.clone();
    r.task_id = "task-q".into();
    fx.refused(
        "task-q",
        Code::RECONCILIATION_NOT_FOUND,
        a,
        Some("task-q"),
        |s| s.resolve_reconciliation("task-q", &r, &admin()),
    );
    let mut r = good.clone();
    r.task_id = "task-none".into();
    fx.refused("task-a", Code::TASK_NOT_FOUND, a, Some("task-none"), |s| {
        s.resolve_reconciliation("task-none", &r, &admin())
    });
    // The good one applies once; the same key with other content is a
    // conflict; another key about the closed case is RECONCILIATION_CLOSED.
    let out = fx
        .store
        .resolve_reconciliation("task-a", &good, &admin())
        .unwrap();
    assert_eq!(
        (out.status, out.task_state, out.idempotent),
        (CaseStatus::Failed, TaskState::Failed, false)
    );
    let mut r = good.clone();
    r.reason = "another reason".into();
    refuse(&mut fx, r, Code::RECONCILIATION_IDEMPOTENCY_CONFLICT);
    let mut r = good.clone();
    r.idempotency_key = "resolve-another-key".into();
    r.expected_revision = 2;
    refuse(&mut fx, r, Code::RECONCILIATION_CLOSED);
    assert_eq!(
        count(&fx, "task-a", a, EventOutcome::Allowed),
        1,
        "applied exactly once"
    );
}

fn fail_keeps_the_task_failed_with_the_reason_and_replays_alike(backend: Backend) {
    let mut fx = Fixture::new(backend);
    reconciling(&mut fx, "task-a", 2, Some(MOVED));
    let before = fx.store.get("task-a").unwrap();
    let c = case(&mut fx, "task-a");
    let req = ResolveRequest::about(&c, Resolution::Fail, "someone force-pushed", None);
    let out = fx
        .store
        .resolve_reconciliation("task-a", &req, &admin())
        .unwrap();
    let after = fx.store.get("task-a").unwrap();
    assert_eq!(after.state, TaskState::Failed);
    assert_eq!(after.revision, before.revision + 1);
    assert_eq!(
        after.result.as_ref().unwrap()["failure_code"],
        "RECONCILIATION_REQUIRED"
    );
    let v = after.verification.unwrap();
    assert_eq!(v["decision"], "RECONCILIATION_FAILED");
    assert_eq!(v["reason"], "someone force-pushed");
    assert_eq!(v["actor"], "admin");
    let c = case(&mut fx, "task-a");
    assert_eq!((c.status, c.revision), (CaseStatus::Failed, 2));
    assert_eq!(c.resolution.as_ref().unwrap()["resolution"], "fail");
    let again = fx
        .store
        .resolve_reconciliation("task-a", &req, &admin())
        .unwrap();
    assert!(again.idempotent);
    assert_eq!(
        again,
        airlock_proto::reconcile::ResolveOutcome {
            idempotent: true,
            ..out
        }
    );
    assert_eq!(
        fx.store.get("task-a").unwrap(),
        fx.store.get("task-a").unwrap()
    );
    assert_eq!(fx.store.get("task-a").unwrap().revision, after.revision);
}

fn adopt_is_settled_only_by_the_workers_check_of_the_ref(backend: Backend) {
    let mut fx = Fixture::new(backend);
    reconciling(&mut fx, "task-a", 1, Some(MOVED));
    assert_eq!(fx.store.take_adoption().unwrap(), None, "nothing adopting");
    let c = case(&mut fx, "task-a");
    let req = ResolveRequest::about(&c, Resolution::Adopt, "the new head is fine", None);
    let out = fx
        .store
        .resolve_reconciliation("task-a", &req, &admin())
        .unwrap();
    assert_eq!(
        (out.status, out.task_state),
        (CaseStatus::Adopting, TaskState::Failed),
        "the task waits for the worker's check"
    );
    let check = fx.store.take_adoption().unwrap().expect("a case to check");
    assert_eq!(
        (check.task_id.as_str(), check.observed_head.as_str()),
        ("task-a", MOVED)
    );
    // The branch moved again: the case opens with the new head, the refusal
    // on record, the task still FAILED.
    let adopting = case(&mut fx, "task-a");
    let now = fx
        .store
        .settle_adoption(&report(&adopting, Some(AGAIN), true), &worker())
        .unwrap();
    assert_eq!(now.status, CaseStatus::Open);
    assert_eq!(now.observed_head.as_deref(), Some(AGAIN));
    assert_eq!(
        now.last_refusal.as_deref(),
        Some(Code::RECONCILIATION_HEAD_MOVED.as_str())
    );
    assert_eq!(fx.store.get("task-a").unwrap().state, TaskState::Failed);
    let denied: Vec<_> = fx
        .store
        .events(Some("task-a"), 0, 1000)
        .unwrap()
        .into_iter()
        .filter(|e| e.action == action::TASK_RECONCILIATION_ADOPTED)
        .collect();
    assert_eq!(denied.len(), 1);
    assert_eq!(denied[0].code, Some(Code::RECONCILIATION_HEAD_MOVED));
    // A late report about the old head changes nothing.
    assert_eq!(
        fx.store
            .settle_adoption(&report(&adopting, Some(MOVED), true), &worker())
            .unwrap(),
        now
    );
    // The admin's earlier request replays its stored answer; a request
    // about what it saw then is a CAS mismatch now.
    assert!(
        fx.store
            .resolve_reconciliation("task-a", &req, &admin())
            .unwrap()
            .idempotent
    );
    let mut stale = req.clone();
    stale.idempotency_key = "resolve-stale-view-1".into();
    fx.refused(
        "task-a",
        Code::RECONCILIATION_CAS_MISMATCH,
        action::TASK_RECONCILIATION_RESOLVED,
        Some("task-a"),
        |s| s.resolve_reconciliation("task-a", &stale, &admin()),
    );
    // Adopting a head that does not descend from the base is refused too.
    let req2 = ResolveRequest::about(&now, Resolution::Adopt, "this one then", None);
    fx.store
        .resolve_reconciliation("task-a", &req2, &admin())
        .unwrap();
    let adopting = case(&mut fx, "task-a");
    let now = fx
        .store
        .settle_adoption(&report(&adopting, Some(AGAIN), false), &worker())
        .unwrap();
    assert_eq!(
        (now.status, now.last_refusal.as_deref()),
        (
            CaseStatus::Open,
            Some(Code::RECONCILIATION_HEAD_UNRELATED.as_str())
        )
    );
    // Finally the ref holds the head and it descends: adopted, SUCCEEDED.
    let req3 = ResolveRequest::about(&now, Resolution::Adopt, "checked the history", None);
    fx.store
        .resolve_reconciliation("task-a", &req3, &admin())
        .unwrap();
    let adopting = case(&mut fx, "task-a");
    let done = fx
        .store
        .settle_adoption(&report(&adopting, Some(AGAIN), true), &worker())
        .unwrap();
    assert_eq!(done.status, CaseStatus::Adopted);
    let view = fx.store.get("task-a").unwrap();
    assert_eq!(view.state, TaskState::Succeeded);
    let v = view.verification.unwrap();
    assert_eq!(
        (
            v["decision"].as_str(),
            v["commit_oid"].as_str(),
            v["reason"].as_str()
        ),
        (Some("ADOPTED"), Some(AGAIN), Some("checked the history"))
    );
    assert_eq!(
        count(
            &fx,
            "task-a",
            action::TASK_RECONCILIATION_ADOPTED,
            EventOutcome::Allowed
        ),
        1
    );
    // Settled: a second report (another worker's) changes nothing, and no
    // adoption waits any more.
    let revision = view.revision;
    assert_eq!(
        fx.store
            .settle_adoption(&report(&adopting, Some(AGAIN), true), &worker())
            .unwrap(),
        done
    );
    assert_eq!(fx.store.get("task-a").unwrap().revision, revision);
    assert_eq!(fx.store.take_adoption().unwrap(), None);
    assert_eq!(
        count(
            &fx,
            "task-a",
            action::TASK_RECONCILIATION_ADOPTED,
            EventOutcome::Allowed
        ),
        1,
        "adopted exactly once"
    );
}

fn resolutions_are_append_only(backend: Backend) {
    let mut fx = Fixture::new(backend);
    reconciling(&mut fx, "task-a", 1, Some(MOVED));
    let c = case(&mut fx, "task-a");
    let req = ResolveRequest::about(&c, Resolution::Fail, "no", None);
    fx.store
        .resolve_reconciliation("task-a", &req, &admin())
        .unwrap();
    for sql in [
        "DELETE FROM reconciliation_resolutions",
        "UPDATE reconciliation_resolutions SET resolution = 'adopt'",
    ] {
        let err = fx.exec(sql).expect_err("resolutions are append-only");
        assert!(err.contains("append-only"), "{sql}: {err}");
    }
}

fn upgrading_a_store_without_the_reconciliation_tables_keeps_its_tasks(backend: Backend) {
    let mut fx = Fixture::new(backend);
    fx.submit("task-a", 2);
    let g = fx.claim();
    fx.finish(&g, Outcome::Passed, false);
    let before = fx.store.get("task-a").unwrap();
    let events = fx.last_event_id();
    fx.drop_task_columns_since_submitters();
    fx.exec("DROP TABLE reconciliation_resolutions").unwrap();
    fx.exec("DROP TABLE reconciliations").unwrap();
    match backend {
        Backend::Sqlite => fx.exec("PRAGMA user_version = 4").unwrap(),
        Backend::Postgres => fx.exec("UPDATE airlock_schema SET version = 3").unwrap(),
    };
    if let Some(pg) = &fx.pg {
        PgStore::open(&pg.owner_location()).expect("the owner migrates");
    }
    let mut store = fx.reopen();
    assert_eq!(store.get("task-a").unwrap(), before);
    assert_eq!(
        store.events(None, 0, 1000).unwrap().last().map(|e| e.id),
        Some(events)
    );
    assert!(store.reconciliations(None, None, 10).unwrap().is_empty());
    fx.store = store;
    reconciling(&mut fx, "task-b", 1, Some(MOVED));
    assert_eq!(case(&mut fx, "task-b").status, CaseStatus::Open);
}

both_backends!(
    a_reconciliation_result_fails_the_task_at_once_and_opens_a_case,
    every_refusal_has_its_own_code_and_changes_nothing,
    fail_keeps_the_task_failed_with_the_reason_and_replays_alike,
    adopt_is_settled_only_by_the_workers_check_of_the_ref,
    resolutions_are_append_only,
    upgrading_a_store_without_the_reconciliation_tables_keeps_its_tasks,
);

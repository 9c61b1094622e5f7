//! Fair claims and planner agents' quotas: a claim interleaves submitters
//! (an agent is one, so is a uid outside an agent), fewest running first,
//! then the one served longest ago, so one submitter's fifty queued tasks
//! do not starve another's one; caps on running tasks are passed over, on
//! several hosts at once too; an agent's submissions over its quotas are
//! refused with AGENT_QUOTA_EXCEEDED, counted by the store's clock; a store
//! older than the quotas fills what each result used when it is opened.
//! Every test runs against both engines, except those of several hosts
//! (PostgreSQL only).

#[path = "tasks_common.rs"]
#[macro_use]
mod common;

use airlock_proto::Code;
use airlock_proto::task::{ClaimGrant, Outcome, TaskState};
use airlock_taskdb::tasks::postgres::CLASS_LOCK;
use airlock_taskdb::tasks::quota::{DAY_MS, HOUR_MS};
use airlock_taskdb::tasks::{Actor, AgentQuota, EventOutcome, PgStore, RunningCaps, action};
use common::*;
use std::collections::BTreeMap;
use std::sync::{Arc, Barrier};

fn alice() -> Actor {
    Actor::planner(Some(1001), "alice@:1.10")
}
fn bob() -> Actor {
    Actor::planner(Some(1003), "bob@:1.11")
}
fn carol() -> Actor {
    Actor::planner(Some(1004), "carol@:1.12")
}

fn submit_as(fx: &mut Fixture, actor: &Actor, task: &str) {
    fx.store
        .submit(&submission(task, 3), actor)
        .unwrap_or_else(|e| panic!("{task}: {e}"));
}

fn claim_with(store: &mut dyn TaskStore, caps: &RunningCaps) -> Option<ClaimGrant> {
    store
        .claim_within(&worker(), LEASE, None, caps)
        .expect("claim")
}

fn claimed(fx: &mut Fixture, caps: &RunningCaps) -> String {
    claim_with(fx.store.as_mut(), caps)
        .expect("something to claim")
        .task_id
}

fn cap_of_one() -> RunningCaps {
    RunningCaps {
        per_submitter: 1,
        per_agent: BTreeMap::new(),
    }
}

/// A failed result of `grant` whose one command ran `duration_ms`.
fn fail_after(fx: &mut Fixture, grant: &ClaimGrant, duration_ms: u64) -> TaskState {
    let mut result = result_for(grant, Outcome::Failed);
    result.verification[0].duration_ms = duration_ms;
    fx.store
        .submit_result(
            &grant.task_id,
            grant.lease_epoch,
            &grant.lease_token,
            &result_key(grant),
            &result,
            false,
            &worker(),
        )
        .expect("result")
        .task
        .state
}

fn one_submitter_of_fifty_does_not_starve_a_submitter_of_one(backend: Backend) {
    let mut fx = Fixture::new(backend);
    for i in 0..50 {
        submit_as(&mut fx, &alice(), &format!("task-a-{i:02}"));
    }
    submit_as(&mut fx, &bob(), "task-b");
    // The oldest first; while it runs, the single task is next.
    assert_eq!(fx.claim().task_id, "task-a-00");
    assert_eq!(fx.claim().task_id, "task-b");
    assert_eq!(fx.claim().task_id, "task-a-01");
}

fn one_slot_at_a_time_still_takes_turns(backend: Backend) {
    let mut fx = Fixture::new(backend);
    for t in ["a-1", "a-2", "a-3"] {
        submit_as(&mut fx, &alice(), &format!("task-{t}"));
    }
    for t in ["b-1", "b-2"] {
        submit_as(&mut fx, &bob(), &format!("task-{t}"));
    }
    submit_as(&mut fx, &carol(), "task-c-1");
    // Each task ends before the next claim, so nobody is running at any
    // claim: the submitter served longest ago goes first.
    let mut order = Vec::new();
    for _ in 0..6 {
        let grant = fx.claim();
        fx.finish(&grant, Outcome::Passed, false);
        order.push(grant.task_id);
        fx.clock.elapse(1_000);
    }
    assert_eq!(
        order,
        [
            "task-a-1", "task-b-1", "task-c-1", "task-a-2", "task-b-2", "task-a-3"
        ]
    );
    assert!(fx.store.claim(&worker(), LEASE).unwrap().is_none());
}

fn each_agent_is_a_submitter_of_its_own_whatever_its_user(backend: Backend) {
    let mut fx = Fixture::new(backend);
    for t in ["alpha-1", "alpha-2", "alpha-3"] {
        submit_as(&mut fx, &alpha(), &format!("task-{t}"));
    }
    submit_as(&mut fx, &beta(), "task-beta-1");
    submit_as(&mut fx, &plain(), "task-plain-1");
    // Three submitters of one uid: two agents and the user outside them.
    let order: Vec<String> = (0..4).map(|_| fx.claim().task_id).collect();
    assert_eq!(
        order,
        [
            "task-alpha-1",
            "task-beta-1",
            "task-plain-1",
            "task-alpha-2"
        ]
    );
}

fn a_submitter_at_its_cap_is_passed_over_until_one_of_its_tasks_ends(backend: Backend) {
    let mut fx = Fixture::new(backend);
    for t in ["alice-1", "alice-2", "alice-3"] {
        submit_as(&mut fx, &alice(), &format!("task-{t}"));
    }
    for t in ["alpha-1", "alpha-2", "alpha-3"] {
        submit_as(&mut fx, &alpha(), &format!("task-{t}"));
    }
    // Every submitter at most one running, but agent alpha two.
    let caps = RunningCaps {
        per_submitter: 1,
        per_agent: BTreeMap::from([("alpha".to_owned(), 2)]),
    };
    assert_eq!(claimed(&mut fx, &caps), "task-alice-1");
    let alpha_1 = claim_with(fx.store.as_mut(), &caps).expect("alpha's first");
    assert_eq!(alpha_1.task_id, "task-alpha-1");
    assert_eq!(claimed(&mut fx, &caps), "task-alpha-2");
    assert!(
        claim_with(fx.store.as_mut(), &caps).is_none(),
        "both at their caps: nothing is claimable"
    );
    let events = fx.last_event_id();
    assert!(claim_with(fx.store.as_mut(), &caps).is_none());
    assert_eq!(
        fx.last_event_id(),
        events,
        "finding nothing records nothing"
    );
    // One of alpha's ends: alpha's next is claimable, alice's still not.
    fx.finish(&alpha_1, Outcome::Passed, false);
    assert_eq!(claimed(&mut fx, &caps), "task-alpha-3");
    assert!(claim_with(fx.store.as_mut(), &caps).is_none());
    // The caps are the claim's: without them alice's next goes.
    assert_eq!(claimed(&mut fx, &RunningCaps::NONE), "task-alice-2");
    assert_eq!(fx.store.summary().unwrap().running, 4);
}

fn an_agents_tasks_per_hour_are_counted_by_the_store_clock(backend: Backend) {
    let mut fx = Fixture::new(backend);
    let quota = AgentQuota {
        tasks_per_hour: 2,
        cpu_seconds_per_day: 0,
    };
    for t in ["task-1", "task-2"] {
        fx.store
            .submit_within(&submission(t, 3), &alpha(), &quota)
            .expect("within the quota");
    }
    fx.clock.advance(HOUR_MS - 1);
    fx.refused(
        "task-3",
        Code::AGENT_QUOTA_EXCEEDED,
        action::TASK_SUBMITTED,
        Some("task-3"),
        |s| s.submit_within(&submission("task-3", 3), &alpha(), &quota),
    );
    let err = fx
        .store
        .submit_within(&submission("task-3", 3), &alpha(), &quota)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "AGENT_QUOTA_EXCEEDED: agent \"alpha\" submitted 2 tasks in the last 3600 s; its quota tasks_per_hour is 2"
    );
    let denied = fx.store.events(Some("task-3"), 0, 10).unwrap();
    let e = denied.last().unwrap();
    assert_eq!(e.outcome, EventOutcome::Denied);
    assert_eq!(e.actor, alpha());
    assert_eq!(e.payload["quota"], "tasks_per_hour");
    assert_eq!(e.payload["agent"], "alpha");
    assert_eq!(
        (e.payload["limit"].as_u64(), e.payload["used"].as_u64()),
        (Some(2), Some(2))
    );
    assert!(
        e.payload["detail"]
            .as_str()
            .unwrap()
            .contains("tasks_per_hour is 2")
    );
    assert_eq!(
        fx.store.get("task-3").unwrap_err().code(),
        Code::TASK_NOT_FOUND,
        "nothing stored"
    );
    // A replay stores nothing and is answered; another agent, and a user
    // outside any agent, are not this agent.
    let replay = fx
        .store
        .submit_within(&submission("task-1", 3), &alpha(), &quota)
        .unwrap();
    assert!(replay.idempotent);
    for (actor, task) in [(beta(), "task-beta"), (plain(), "task-plain")] {
        fx.store
            .submit_within(&submission(task, 3), &actor, &quota)
            .expect("another submitter");
    }
    let usage = fx.store.agent_usage("alpha").unwrap();
    assert_eq!((usage.tasks_last_hour, usage.running), (2, 0));
    // An hour of store time after the first two, they no longer count.
    fx.clock.advance(1);
    fx.store
        .submit_within(&submission("task-3", 3), &alpha(), &quota)
        .expect("the window moved on");
    assert_eq!(fx.store.agent_usage("alpha").unwrap().tasks_last_hour, 1);
}

fn an_agents_cpu_seconds_count_the_verification_of_every_attempt(backend: Backend) {
    let mut fx = Fixture::new(backend);
    let quota = AgentQuota {
        tasks_per_hour: 0,
        cpu_seconds_per_day: 1,
    };
    fx.store
        .submit_within(&submission("task-x", 3), &alpha(), &quota)
        .unwrap();
    let grant = fx.claim();
    assert_eq!(fail_after(&mut fx, &grant, 600), TaskState::Queued);
    let grant = fx.claim();
    assert_eq!(fx.store.agent_usage("alpha").unwrap().running, 1);
    fail_after(&mut fx, &grant, 600);
    let usage = fx.store.agent_usage("alpha").unwrap();
    assert_eq!((usage.cpu_ms_last_day, usage.running), (1200, 0));
    fx.clock.advance(DAY_MS - 1);
    fx.refused(
        "task-y",
        Code::AGENT_QUOTA_EXCEEDED,
        action::TASK_SUBMITTED,
        Some("task-y"),
        |s| s.submit_within(&submission("task-y", 3), &alpha(), &quota),
    );
    let e = fx.store.events(Some("task-y"), 0, 10).unwrap().remove(0);
    assert_eq!(e.payload["quota"], "cpu_seconds_per_day");
    assert_eq!(
        (e.payload["limit"].as_u64(), e.payload["used"].as_u64()),
        (Some(1), Some(1))
    );
    assert!(
        e.payload["detail"]
            .as_str()
            .unwrap()
            .contains("used 1 CPU seconds (their verification commands' wall-clock time)"),
        "{e:?}"
    );
    // Another agent's use is its own.
    fx.store
        .submit_within(&submission("task-beta", 3), &beta(), &quota)
        .expect("beta used nothing");
    fx.clock.advance(1);
    fx.store
        .submit_within(&submission("task-y", 3), &alpha(), &quota)
        .expect("a day after the results");
}

fn upgrading_fills_what_each_result_used(backend: Backend) {
    let mut fx = Fixture::new(backend);
    submit_as(&mut fx, &alpha(), "task-old");
    let grant = fx.claim();
    fail_after(&mut fx, &grant, 600);
    let grant = fx.claim();
    fail_after(&mut fx, &grant, 12);
    fx.drop_fairness();
    match backend {
        Backend::Sqlite => fx.exec("PRAGMA user_version = 7").unwrap(),
        Backend::Postgres => fx.exec("UPDATE airlock_schema SET version = 6").unwrap(),
    };
    if let Some(pg) = &fx.pg {
        PgStore::open(&pg.owner_location()).expect("the owner migrates");
    }
    let mut store = fx.reopen();
    store.integrity_check().unwrap();
    assert_eq!(
        fx.rows("SELECT attempt, cpu_ms FROM results ORDER BY attempt"),
        [texts(&["1", "600"]), texts(&["2", "12"])]
    );
    let err = fx
        .exec("UPDATE results SET cpu_ms = 0")
        .expect_err("results stay append-only");
    assert!(err.contains("append-only"), "{err}");
    assert_eq!(store.agent_usage("alpha").unwrap().cpu_ms_last_day, 612);
    // Claims take turns on the upgraded store.
    assert_eq!(
        store.claim(&worker(), LEASE).unwrap().unwrap().task_id,
        "task-old"
    );
}

both_backends!(
    one_submitter_of_fifty_does_not_starve_a_submitter_of_one,
    one_slot_at_a_time_still_takes_turns,
    each_agent_is_a_submitter_of_its_own_whatever_its_user,
    a_submitter_at_its_cap_is_passed_over_until_one_of_its_tasks_ends,
    an_agents_tasks_per_hour_are_counted_by_the_store_clock,
    an_agents_cpu_seconds_count_the_verification_of_every_attempt,
    upgrading_fills_what_each_result_used,
);

/// A claim in flight on another host holds its submitter's class: this
/// host's claim passes over that submitter at once, without waiting, and
/// takes the next one's task.
#[test]
fn a_claim_passes_over_a_submitter_another_host_is_claiming_for() {
    let mut fx = Fixture::new(Backend::Postgres);
    submit_as(&mut fx, &alice(), "task-alice");
    submit_as(&mut fx, &bob(), "task-bob");
    let su = Arc::clone(&fx.pg.as_ref().unwrap().superuser);
    let mut session = su.lock().unwrap();
    let mut other = session.0.transaction().unwrap();
    other
        .execute(
            "SELECT pg_advisory_xact_lock($1::int4, hashtext($2::text))",
            &[&CLASS_LOCK, &"uid:1001"],
        )
        .unwrap();
    let started = std::time::Instant::now();
    assert_eq!(fx.claim().task_id, "task-bob");
    assert!(
        claim_with(fx.store.as_mut(), &RunningCaps::NONE).is_none(),
        "alice's class is held elsewhere"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    other.rollback().unwrap();
    drop(session);
    assert_eq!(fx.claim().task_id, "task-alice");
}

/// Two hosts claiming at the same moment with a cap of one running task
/// per submitter never both take the same submitter's task: in every round
/// each takes one task, of different submitters, and no submitter ever has
/// two running.
#[test]
fn two_hosts_claiming_at_once_keep_the_cap_of_each_submitter() {
    let mut fx = Fixture::new(Backend::Postgres);
    const ROUNDS: usize = 8;
    for i in 0..ROUNDS {
        submit_as(&mut fx, &alice(), &format!("task-alice-{i}"));
        submit_as(&mut fx, &bob(), &format!("task-bob-{i}"));
    }
    let mut hosts = [fx.reopen(), fx.reopen()];
    let caps = cap_of_one();
    for round in 0..ROUNDS {
        let barrier = Barrier::new(2);
        let grants: Vec<Option<ClaimGrant>> = std::thread::scope(|scope| {
            let handles: Vec<_> = hosts
                .iter_mut()
                .map(|host| {
                    let (barrier, caps) = (&barrier, &caps);
                    scope.spawn(move || {
                        barrier.wait();
                        claim_with(host.as_mut(), caps)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut owners: Vec<String> = grants
            .iter()
            .map(|g| {
                let g = g
                    .as_ref()
                    .unwrap_or_else(|| panic!("round {round}: {grants:?}"));
                g.task_id.split('-').nth(1).unwrap().to_owned()
            })
            .collect();
        owners.sort();
        assert_eq!(owners, ["alice", "bob"], "round {round}");
        assert!(
            claim_with(fx.store.as_mut(), &caps).is_none(),
            "round {round}: both at their cap"
        );
        for g in grants.into_iter().flatten() {
            fx.finish(&g, Outcome::Passed, false);
        }
    }
    assert_eq!(fx.store.summary().unwrap().verifying, 2 * ROUNDS as u64);
}

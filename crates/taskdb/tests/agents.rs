//! The planner agents' restart-policy records: stored by name, replaced on
//! every change, each change an AGENT_CHANGED event, kept across a reopen
//! (so a restarted supervisor cannot bypass a hold), on both engines.

#[path = "tasks_common.rs"]
#[macro_use]
mod common;

use airlock_taskdb::tasks::{Actor, EventOutcome, action};
use common::*;
use serde_json::json;

fn policy() -> Actor {
    Actor::system("agent-policy")
}

fn held() -> serde_json::Value {
    json!({"status": "HELD", "consecutive_failures": 5, "hold_reason": "AGENTOS_CRASH_LOOP: 5 consecutive failures"})
}

fn a_record_is_stored_replaced_and_audited(backend: Backend) {
    let mut fx = Fixture::new(backend);
    assert_eq!(fx.store.agent_record("planner").unwrap(), None);
    let running = json!({"status": "RUNNING", "consecutive_failures": 0});
    fx.store
        .save_agent_record("planner", &running, &policy())
        .unwrap();
    assert_eq!(
        fx.store.agent_record("planner").unwrap(),
        Some(running.clone())
    );
    fx.store
        .save_agent_record("planner", &held(), &policy())
        .unwrap();
    assert_eq!(fx.store.agent_record("planner").unwrap(), Some(held()));
    assert_eq!(fx.store.agent_record("other").unwrap(), None);
    let events = fx.store.events(None, 0, 100).unwrap();
    let changes: Vec<_> = events
        .iter()
        .filter(|e| e.action == action::AGENT_CHANGED)
        .collect();
    assert_eq!(changes.len(), 2);
    for (e, record) in changes.iter().zip([&running, &held()]) {
        assert_eq!(e.task_id, None);
        assert_eq!(e.outcome, EventOutcome::Allowed);
        assert_eq!(e.actor.name, "agent-policy");
        assert_eq!(e.payload["agent"], "planner");
        assert_eq!(&e.payload["record"], record);
    }
    // one row per agent
    let rows = fx.rows("SELECT name FROM agents");
    assert_eq!(rows, vec![texts(&["planner"])]);
}

fn a_hold_survives_reopening_the_store(backend: Backend) {
    let mut fx = Fixture::new(backend);
    fx.submit("task-a", 2);
    fx.store
        .save_agent_record("planner", &held(), &policy())
        .unwrap();
    // a second store on the same file or database: a restarted supervisor
    let mut again = fx.reopen();
    assert_eq!(again.agent_record("planner").unwrap(), Some(held()));
    // and the tasks beside it are untouched
    assert_eq!(again.get("task-a").unwrap().task_id, "task-a");
}

fn a_corrupt_record_is_store_corrupt(backend: Backend) {
    let mut fx = Fixture::new(backend);
    fx.store
        .save_agent_record("planner", &held(), &policy())
        .unwrap();
    fx.exec("UPDATE agents SET record_json = 'not json'")
        .unwrap();
    let err = fx.store.agent_record("planner").unwrap_err();
    assert_eq!(err.code(), airlock_proto::Code::STORE_CORRUPT, "{err}");
}

both_backends!(
    a_record_is_stored_replaced_and_audited,
    a_hold_survives_reopening_the_store,
    a_corrupt_record_is_store_corrupt,
);

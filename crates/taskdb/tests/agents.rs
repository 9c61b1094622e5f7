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

fn upgrading_a_store_without_the_agents_table_keeps_its_tasks(backend: Backend) {
    // A store as the previous schema left it: no agents table.
    let mut fx = Fixture::new(backend);
    fx.submit("task-a", 2);
    let before = fx.store.get("task-a").unwrap();
    match backend {
        Backend::Sqlite => {
            fx.drop_task_columns_since_submitters();
            fx.exec("DROP TABLE reconciliation_resolutions").unwrap();
            fx.exec("DROP TABLE reconciliations").unwrap();
            fx.exec("DROP TABLE agents").unwrap();
            fx.exec("PRAGMA user_version = 3").unwrap();
        }
        Backend::Postgres => {
            fx.drop_task_columns_since_submitters();
            fx.exec("DROP TABLE reconciliation_resolutions").unwrap();
            fx.exec("DROP TABLE reconciliations").unwrap();
            fx.exec("DROP TABLE agents").unwrap();
            fx.exec("UPDATE airlock_schema SET version = 2").unwrap();
        }
    }
    if let Some(pg) = &fx.pg {
        airlock_taskdb::tasks::PgStore::open(&pg.owner_location()).expect("the owner migrates");
    }
    let mut store = fx.reopen();
    assert_eq!(store.get("task-a").unwrap(), before);
    assert_eq!(store.agent_record("planner").unwrap(), None);
    store
        .save_agent_record("planner", &held(), &policy())
        .unwrap();
    assert_eq!(store.agent_record("planner").unwrap(), Some(held()));
}

both_backends!(
    upgrading_a_store_without_the_agents_table_keeps_its_tasks,
    a_record_is_stored_replaced_and_audited,
    a_hold_survives_reopening_the_store,
    a_corrupt_record_is_store_corrupt,
);

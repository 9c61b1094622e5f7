//! The task shape the demo, the crash matrix and the end-to-end benchmark
//! submit. They talk to the supervisor through the one client,
//! [`airlock_client::blocking::Supervisor`] (re-exported here).

pub use airlock_client::blocking::Supervisor;
use serde_json::{Value, json};

/// A task on the demo repository that creates `agent/<task_id>` from
/// `base`, applies `change` and runs `verification`.
pub fn task_on_demo(
    task_id: &str,
    base: &str,
    max_attempts: u32,
    change: Value,
    verification: Value,
) -> Value {
    json!({
        "schema": "airlock.task.v1",
        "max_attempts": max_attempts,
        "binding": {
            "task_id": task_id, "job_id": format!("job-{task_id}"), "repository": "demo",
            "base_oid": base, "expected_branch_oid": base, "target_branch": format!("agent/{task_id}"),
            "branch_mode": "CREATE_NEW", "generation": 1, "idempotency_key": format!("submit-{task_id}"),
        },
        "plan": {
            "schema": "airlock.plan.v1", "task_id": task_id, "job_id": format!("job-{task_id}"),
            "source_head_oid": base, "generation": 1, "idempotency_key": format!("plan-{task_id}"),
            "execution": {
                "action": "deterministic",
                "capability_scope": ["git.read", "git.test"],
                "change_set": [change],
                "verification": verification,
            },
        },
    })
}

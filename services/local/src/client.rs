//! A small blocking client for org.airlock.Tasks1, and the task shape the
//! demo, the crash matrix and the end-to-end benchmark submit.

use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// One connection to the bus, driven from ordinary threads.
#[derive(Debug)]
pub struct TasksClient {
    rt: tokio::runtime::Runtime,
    conn: zbus::Connection,
}

impl TasksClient {
    /// Connects to the bus at `address`.
    pub fn connect(address: &str) -> Result<TasksClient, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let conn = rt
            .block_on(async { zbus::connection::Builder::address(address)?.build().await })
            .map_err(|e| format!("connecting to {address}: {e}"))?;
        Ok(TasksClient { rt, conn })
    }

    /// Calls a Tasks1 method that takes one string and answers JSON.
    pub fn call(&self, method: &str, arg: &str) -> Result<Value, String> {
        self.rt.block_on(async {
            let reply = self
                .conn
                .call_method(
                    Some("org.airlock.Supervisor1"),
                    "/org/airlock/Supervisor1",
                    Some("org.airlock.Tasks1"),
                    method,
                    &(arg,),
                )
                .await
                .map_err(|e| format!("{method}: {e}"))?;
            let text: String = reply.body().deserialize().map_err(|e| e.to_string())?;
            serde_json::from_str(&text).map_err(|e| e.to_string())
        })
    }

    /// Like [`TasksClient::call`], retrying for up to `patience` while the
    /// supervisor is away (restarting).
    pub fn call_retry(&self, method: &str, arg: &str, patience: Duration) -> Result<Value, String> {
        let deadline = Instant::now() + patience;
        loop {
            match self.call(method, arg) {
                Ok(v) => return Ok(v),
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100))
                }
                Err(e) => return Err(e),
            }
        }
    }
}

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

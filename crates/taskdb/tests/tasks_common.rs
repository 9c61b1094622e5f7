//! Fixtures shared by the task-store integration tests. Each test binary
//! includes this file with `#[path = "tasks_common.rs"] mod common;`; built
//! on its own it is an empty test binary.
#![allow(dead_code)]

use airlock_proto::Code;
use airlock_proto::task::{
    ClaimGrant, CommandSummary, Outcome, RESULT_SCHEMA, TaskResult, TaskSubmission, TaskView,
};
use airlock_taskdb::StoreResult;
use airlock_taskdb::clock::ManualClock;
use airlock_taskdb::tasks::{Actor, EventOutcome, TaskStore};
use rusqlite::Connection;
use rusqlite::types::ValueRef;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::Arc;

/// The seed's base and branch-head commits.
pub const BASE: &str = "a642b045775b9154a00ae78543037fbef4fb447b";
pub const HEAD: &str = "71523aef6e48b1e2fa516c456ca189b7a039104b";
/// The seed's owner authorization id.
pub const AUTH_ID: &str = "owner-scheme-a-20260817";
/// Where the manual clock starts (2026-01-01T00:00:00Z).
pub const T0: i64 = 1_767_225_600_000;
/// A lease long enough that no test trips over it by accident.
pub const LEASE: i64 = 60_000;

/// A deterministic execution request: one file write, one verification command.
pub fn execution(content: &str) -> Value {
    json!({
        "action": "deterministic",
        "change_set": [{"path": "x.py", "operation": "write_file", "content": content}],
        "verification": [{"label": "compile", "argv": ["/usr/bin/python3", "-m", "py_compile", "x.py"]}],
        "capability_scope": ["git.read", "git.test"],
    })
}

/// A plan for `task_id` (CONTINUE_EXISTING, so its source head is HEAD).
pub fn plan_json(task_id: &str, key: &str, content: &str) -> Value {
    json!({
        "schema": "airlock.plan.v1", "task_id": task_id, "job_id": format!("job-{task_id}"),
        "source_head_oid": HEAD, "generation": 1, "idempotency_key": key,
        "execution": execution(content),
    })
}

/// A valid submission as JSON.
pub fn submission_json(task_id: &str, max_attempts: u32) -> Value {
    json!({
        "schema": "airlock.task.v1",
        "binding": {
            "task_id": task_id, "job_id": format!("job-{task_id}"), "repository": "demo",
            "base_oid": BASE, "expected_branch_oid": HEAD,
            "target_branch": format!("agent/{task_id}"), "branch_mode": "CONTINUE_EXISTING",
            "generation": 1, "idempotency_key": format!("submit-{task_id}"),
        },
        "plan": plan_json(task_id, &format!("plan-{task_id}-v1"), "x=1\n"),
        "max_attempts": max_attempts,
    })
}

/// A valid submission.
pub fn submission(task_id: &str, max_attempts: u32) -> TaskSubmission {
    TaskSubmission::from_value(&submission_json(task_id, max_attempts)).expect("valid fixture")
}

pub fn planner() -> Actor {
    Actor::planner(Some(1001), "planner")
}

pub fn admin() -> Actor {
    Actor::admin(Some(0), "admin")
}

pub fn worker() -> Actor {
    Actor::worker(Some(1002), "worker-1")
}

/// A result for a grant: passed (with a commit), failed (with a code) or captured.
pub fn result_for(grant: &ClaimGrant, outcome: Outcome) -> TaskResult {
    TaskResult {
        schema: RESULT_SCHEMA.into(),
        task_id: grant.task_id.clone(),
        attempt: grant.attempt,
        execution_digest: grant.envelope["execution_digest"]
            .as_str()
            .expect("digest")
            .into(),
        outcome,
        commit_oid: (outcome == Outcome::Passed).then(|| "c".repeat(40)),
        target_branch: grant.envelope["target_branch"]
            .as_str()
            .expect("branch")
            .into(),
        exec_result_sha256: Some("e".repeat(64)),
        failure_code: (outcome == Outcome::Failed).then(|| "VERIFICATION_FAILED".into()),
        verification: vec![CommandSummary {
            label: "compile".into(),
            exit_code: Some(if outcome == Outcome::Failed { 1 } else { 0 }),
            timed_out: false,
            duration_ms: 12,
            stdout_tail: None,
            stderr_tail: None,
        }],
    }
}

/// The worker's idempotency key for a grant's result.
pub fn result_key(grant: &ClaimGrant) -> String {
    format!("result-{}-{}", grant.task_id, grant.attempt)
}

/// A store on a fresh file with a manual clock at [`T0`].
#[derive(Debug)]
pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub path: PathBuf,
    pub clock: ManualClock,
    pub store: TaskStore,
}

impl Default for Fixture {
    fn default() -> Self {
        Fixture::new()
    }
}

impl Fixture {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("tasks.sqlite3");
        let clock = ManualClock::at(T0);
        let store = TaskStore::open_with_clock(&path, Arc::new(clock.clone())).expect("open");
        Fixture {
            dir,
            path,
            clock,
            store,
        }
    }

    /// A second store on the same file and clock.
    pub fn reopen(&self) -> TaskStore {
        TaskStore::open_with_clock(&self.path, Arc::new(self.clock.clone())).expect("reopen")
    }

    /// A raw SQLite connection, for what the API must not allow and for
    /// setting up the seed's hand-made rows.
    pub fn raw(&self) -> Connection {
        let c = Connection::open(&self.path).expect("raw open");
        c.busy_timeout(std::time::Duration::from_secs(30))
            .expect("busy timeout");
        c
    }

    /// Submits `task_id` with `max_attempts`.
    pub fn submit(&mut self, task_id: &str, max_attempts: u32) -> TaskView {
        let s = submission(task_id, max_attempts);
        self.store.submit(&s, &planner()).expect("submit").task
    }

    /// Claims (expecting a task) with the default worker and lease.
    pub fn claim(&mut self) -> ClaimGrant {
        self.store
            .claim(&worker(), LEASE)
            .expect("claim")
            .expect("something to claim")
    }

    /// Submits a result of `outcome` for `grant`.
    pub fn finish(&mut self, grant: &ClaimGrant, outcome: Outcome, auto_accept: bool) -> TaskView {
        self.store
            .submit_result(
                &grant.task_id,
                grant.lease_epoch,
                &grant.lease_token,
                &result_key(grant),
                &result_for(grant, outcome),
                auto_accept,
                &worker(),
            )
            .expect("submit result")
            .task
    }

    /// Claims and fails the (only) task until it is FAILED with its
    /// attempts exhausted; returns its final view.
    pub fn exhaust(&mut self, task_id: &str) -> TaskView {
        loop {
            let grant = self.claim();
            assert_eq!(grant.task_id, task_id);
            let view = self.finish(&grant, Outcome::Failed, false);
            if view.state == airlock_proto::task::TaskState::Failed {
                return view;
            }
        }
    }

    /// Every column of the task's row, rendered, plus the sizes of the
    /// append-only side tables: what "changed nothing" compares.
    pub fn snapshot(&self, task_id: &str) -> Vec<String> {
        let c = self.raw();
        let mut out = Vec::new();
        let mut stmt = c
            .prepare("SELECT * FROM tasks WHERE task_id = ?1")
            .expect("prepare");
        let n = stmt.column_count();
        let mut rows = stmt.query([task_id]).expect("query");
        while let Some(row) = rows.next().expect("row") {
            for i in 0..n {
                out.push(match row.get_ref(i).expect("col") {
                    ValueRef::Null => "NULL".to_owned(),
                    ValueRef::Integer(v) => v.to_string(),
                    ValueRef::Real(v) => v.to_string(),
                    ValueRef::Text(t) => String::from_utf8_lossy(t).into_owned(),
                    ValueRef::Blob(b) => format!("{b:?}"),
                });
            }
        }
        for table in ["tasks", "results", "task_retry_extensions"] {
            let count: i64 = c
                .query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0))
                .expect("count");
            out.push(format!("{table}={count}"));
        }
        out
    }

    /// Highest event id so far (0 when none).
    pub fn last_event_id(&self) -> i64 {
        self.store
            .events(None, 0, u32::MAX)
            .expect("events")
            .last()
            .map_or(0, |e| e.id)
    }

    /// Runs `op`, which must be refused with `code`; asserts it changed
    /// nothing in the task's row or the side tables, and appended exactly one
    /// denied event with that code and `action`, about `event_task`.
    pub fn refused<T: std::fmt::Debug>(
        &mut self,
        task_id: &str,
        code: Code,
        action: &str,
        event_task: Option<&str>,
        op: impl FnOnce(&mut TaskStore) -> StoreResult<T>,
    ) {
        let before = self.snapshot(task_id);
        let view_before = self.store.get(task_id).ok();
        let last = self.last_event_id();
        let err = op(&mut self.store).expect_err("must be refused");
        assert_eq!(err.code(), code, "{err}");
        assert_eq!(self.snapshot(task_id), before, "a refusal changed the task");
        assert_eq!(self.store.get(task_id).ok(), view_before);
        let new = self.store.events(None, last, 100).expect("events");
        assert_eq!(new.len(), 1, "exactly one denial event: {new:?}");
        let e = &new[0];
        assert_eq!(e.outcome, EventOutcome::Denied);
        assert_eq!(e.code, Some(code));
        assert_eq!(e.action, action);
        assert_eq!(e.task_id.as_deref(), event_task);
    }
}

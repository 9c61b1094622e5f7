//! airlock-proto: every message that crosses an airlock process boundary.
//!
//! This crate does no I/O. It declares each message, parses it strictly
//! (unknown fields refused, every string, list and size bounded), puts it
//! in canonical JSON for digests, and owns the one error-code catalogue
//! ([`Code`]) that every other crate refuses with.
//!
//! # Messages, who sends them, and when
//!
//! | message | from → to | channel | allowed when |
//! |---|---|---|---|
//! | [`task::TaskSubmission`] | planner/admin → supervisor | D-Bus `Tasks2.SubmitTask` | always (polkit `tasks.submit`) |
//! | [`plan::PlanRequest`] (replacement) | planner/admin → supervisor | D-Bus `Tasks2.ReplacePlan` | task QUEUED (polkit `tasks.submit`) |
//! | [`task::TaskView`] | supervisor → admin/planner | D-Bus `Tasks2.GetTask`/`ListTasks` | always (polkit `tasks.read`) |
//! | [`task::Decision`] + reason | admin → supervisor | D-Bus `Tasks2.Verify` | task VERIFYING (polkit `tasks.manage`) |
//! | cancel + reason | admin → supervisor | D-Bus `Tasks2.CancelTask` | task not terminal (polkit `tasks.manage`) |
//! | [`task::ClaimGrant`] | supervisor → worker | D-Bus `Worker1.Claim` | a task QUEUED with attempts left; caller uid = worker |
//! | renew (token, epoch) | worker → supervisor | D-Bus `Worker1.Renew` | task RUNNING under that lease |
//! | [`task::TaskResult`] | worker → supervisor | D-Bus `Worker1.SubmitResult` | task RUNNING under that lease, or an identical replay |
//! | [`bundle::ExecRequest`] + source archive | worker → executor | spool `requests/`, `sources/` | after checkpoint `claimed` |
//! | [`bundle::ExecResult`] | executor → worker | spool `results/` | once per request |
//! | [`bundle::ExecFailure`] | executor → worker | spool `failed/` | once per request, instead of a result |
//! | [`reconcile::ResolveRequest`] | admin → supervisor | D-Bus `Reconcile1.ResolveReconciliation` | case open (polkit `reconcile.manage`) |
//! | [`reconcile::AdoptionCheck`] / [`reconcile::AdoptionReport`] | supervisor ↔ worker | D-Bus `Worker1.TakeAdoption`/`SettleAdoption` | a case adopting; caller uid = worker |
//! | [`retry::RetryExtensionRequest`] | owner → retryd | HTTP `POST /v1/tasks/{id}/retry-extension` | task FAILED, attempts exhausted, no lease |
//! | [`checkpoint::CheckpointBinding`] + [`checkpoint::Phase`] | worker → its own future self | checkpoint journal | phases monotonic within an attempt |
//!
//! # Example
//!
//! ```
//! use airlock_proto::{binding::Binding, Code};
//! let v = serde_json::json!({
//!     "task_id": "task-1", "job_id": "job-1", "repository": "demo",
//!     "base_oid": "a".repeat(40), "expected_branch_oid": "a".repeat(40),
//!     "target_branch": "main", "branch_mode": "CREATE_NEW",
//!     "generation": 1, "idempotency_key": "key-00000001",
//! });
//! let err = Binding::from_value(&v).unwrap_err();
//! assert_eq!(err.code, Code::PROTECTED_REF_DENY);
//! assert_eq!(err.code.http_status(), 403);
//! ```

pub mod binding;
pub mod bundle;
pub mod bus;
pub mod canonical;
pub mod checkpoint;
pub mod egress;
pub mod envelope;
pub mod error;
pub mod fields;
pub mod limits;
pub mod path;
pub mod plan;
pub mod reconcile;
pub mod redact;
pub mod retry;
pub mod states;
pub mod task;
pub mod tree;
pub mod upstream;

pub use error::{Class, Code, Error, Result};

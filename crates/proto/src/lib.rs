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
//! | [`bundle::ExecRequest`] + source archive | worker → executor | spool `requests/`, `sources/` | after checkpoint `claimed` |
//! | [`bundle::ExecResult`] | executor → worker | spool `results/` | once per request |
//! | [`bundle::ExecFailure`] | executor → worker | spool `failed/` | once per request, instead of a result |
//! | [`retry::RetryExtensionRequest`] | owner → retryd | HTTP `POST /v1/tasks/{id}/retry-extension` | task FAILED, attempts exhausted, no lease |
//! | [`checkpoint::CheckpointBinding`] + [`checkpoint::Phase`] | worker → its own future self | checkpoint journal | phases monotonic within an attempt |
//! | [`upstream::SyncRequest`] / [`upstream::SyncState`] | root's `airlockctl repo sync` → worker, and back to `repo show` | `<worker state>/upstream/NAME.request`, `NAME.json` | a request names only an id; the worker records each sync's outcome |
//!
//! Every method of the bus, one row each of the table in [`bus`] (the
//! requests travel as JSON strings: [`task::TaskSubmission`],
//! [`plan::PlanRequest`], [`task::DecisionRequest`], [`task::TaskResult`],
//! [`reconcile::ResolveRequest`], …; each row's doc says which and when
//! it is allowed):
//!
//! <!-- bus-methods:begin (generated from crates/proto/src/bus.rs: UPDATE_DOCS=1 cargo test -p airlock-proto --test docs) -->
//! | method | who may call | in → out (reply) |
//! |---|---|---|
//! | [`Tasks2.SubmitTask`](bus::tasks::SUBMIT_TASK) | planner, admin (polkit `org.airlock.tasks.submit`) | `s` → `s` (`SubmitReply`) |
//! | [`Tasks2.ReplacePlan`](bus::tasks::REPLACE_PLAN) | planner, admin (polkit `org.airlock.tasks.submit`) | `ss` → `s` (`TaskView`) |
//! | [`Tasks2.GetTask`](bus::tasks::GET_TASK) | admin, planner (polkit `org.airlock.tasks.read`) | `s` → `s` (`TaskView`) |
//! | [`Tasks2.GetPlan`](bus::tasks::GET_PLAN) | admin, planner (polkit `org.airlock.tasks.read`) | `s` → `s` (`TaskPlan`) |
//! | [`Tasks2.ListTasks`](bus::tasks::LIST_TASKS) | admin, planner (polkit `org.airlock.tasks.read`) | `ssu` → `s` (`TaskPage`) |
//! | [`Tasks2.ListEvents`](bus::tasks::LIST_EVENTS) | admin, planner (polkit `org.airlock.tasks.read`) | `sxu` → `s` (`EventPage`) |
//! | [`Tasks2.CountEvents`](bus::tasks::COUNT_EVENTS) | admin, planner (polkit `org.airlock.tasks.read`) | `s` → `s` (`EventCount`) |
//! | [`Tasks2.ListRepositories`](bus::tasks::LIST_REPOSITORIES) | admin, planner (polkit `org.airlock.tasks.read`) | - → `s` (`RepositoryList`) |
//! | [`Tasks2.CancelTask`](bus::tasks::CANCEL_TASK) | admin (polkit `org.airlock.tasks.manage`) | `ss` → `s` (`DecisionOutcome`) |
//! | [`Tasks2.Verify`](bus::tasks::VERIFY) | admin (polkit `org.airlock.tasks.manage`) | `ss` → `s` (`DecisionOutcome`) |
//! | [`Tasks1.*`](bus::tasks_v1) | as on `Tasks2` | `org.airlock.Tasks2`'s methods `SubmitTask`, `ReplacePlan`, `GetTask`, `ListTasks`, `ListEvents`, `CancelTask`, `Verify` under the old name, deprecated, kept for one release; `Verify(sss)` of airlock bus protocol before 3.0 (task id, decision, reason) is refused with `PROTOCOL_VERSION_MISMATCH` naming `org.airlock.Tasks2.Verify` |
//! | [`Worker1.Claim`](bus::worker::CLAIM) | the worker (peer uid `supervisor.worker_user`) | - → `s` (`Option<ClaimGrant>`) |
//! | [`Worker1.Renew`](bus::worker::RENEW) | the worker (peer uid `supervisor.worker_user`) | `sts` → `x` (`i64`) |
//! | [`Worker1.SubmitResult`](bus::worker::SUBMIT_RESULT) | the worker (peer uid `supervisor.worker_user`) | `stsss` → `s` (`ResultReceipt`) |
//! | [`Worker1.TakeAdoption`](bus::worker::TAKE_ADOPTION) | the worker (peer uid `supervisor.worker_user`) | - → `s` (`Option<AdoptionCheck>`) |
//! | [`Worker1.Fence`](bus::worker::FENCE) | the worker (peer uid `supervisor.worker_user`) | `stss` → `s` (`FenceGrant`) |
//! | [`Worker1.SettleAdoption`](bus::worker::SETTLE_ADOPTION) | the worker (peer uid `supervisor.worker_user`) | `s` → `s` (`ReconciliationCase`) |
//! | [`Worker1.ReportUpstream`](bus::worker::REPORT_UPSTREAM) | the worker (peer uid `supervisor.worker_user`) | `s` → - (`()`) |
//! | [`Retry1.ExtendRetry`](bus::retry::EXTEND_RETRY) | airlock-retryd (peer uid `retry.user`) | `sss` → `s` (`RetryExtensionOutcome`) |
//! | [`Agents1.ListAgents`](bus::agents::LIST_AGENTS) | admin (polkit `org.airlock.agents.read`) | - → `s` (`AgentList`) |
//! | [`Agents1.GetAgent`](bus::agents::GET_AGENT) | admin (polkit `org.airlock.agents.read`) | `s` → `s` (`AgentView`) |
//! | [`Agents1.GetAgentLimits`](bus::agents::GET_AGENT_LIMITS) | admin (polkit `org.airlock.agents.read`) | `s` → `s` (`AgentLimits`) |
//! | [`Agents1.StartAgent`](bus::agents::START_AGENT) | admin (polkit `org.airlock.agents.manage`) | `s` → `s` (`AgentView`) |
//! | [`Agents1.StopAgent`](bus::agents::STOP_AGENT) | admin (polkit `org.airlock.agents.manage`) | `s` → `s` (`AgentView`) |
//! | [`Agents1.ClearHold`](bus::agents::CLEAR_HOLD) | admin (polkit `org.airlock.agents.manage`) | `s` → `s` (`AgentView`) |
//! | [`Agents1.CancelQueued`](bus::agents::CANCEL_QUEUED) | admin (polkit `org.airlock.agents.manage`) | `ss` → `s` (`AgentQueueCancelled`) |
//! | [`Reconcile1.ListReconciliations`](bus::reconcile::LIST_RECONCILIATIONS) | admin, planner (polkit `org.airlock.tasks.read`) | `ssu` → `s` (`ReconciliationPage`) |
//! | [`Reconcile1.GetReconciliation`](bus::reconcile::GET_RECONCILIATION) | admin, planner (polkit `org.airlock.tasks.read`) | `s` → `s` (`ReconciliationCase`) |
//! | [`Reconcile1.ResolveReconciliation`](bus::reconcile::RESOLVE_RECONCILIATION) | admin (polkit `org.airlock.reconcile.manage`) | `ss` → `s` (`ResolveOutcome`) |
//! | [`AgentHost1.Start`](bus::agent_host::START) | the supervisor (its peer uid) | `s` → `u` (`u32`) |
//! | [`AgentHost1.Probe`](bus::agent_host::PROBE) | the supervisor (its peer uid) | `s` → `s` (`AgentLiveness`) |
//! | [`AgentHost1.Stop`](bus::agent_host::STOP) | the supervisor (its peer uid) | `s` → - (`()`) |
//! <!-- bus-methods:end -->
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
pub mod shown;
pub mod states;
pub mod task;
pub mod tree;
pub mod upstream;

pub use error::{Class, Code, Error, Result};

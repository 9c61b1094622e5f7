//! Tasks as the supervisor keeps them, and the messages about them.//!
//! This file is the table of those messages: every type and schema tag
//! that crosses a boundary, declared in one place (the protocol lock,
//! `tests/protocol.rs`, reads them here). What each family does lives
//! beside it: `task/state.rs` (the states), `task/decision.rs` (an
//! admin's decision and its checks), `task/submission.rs` (a planner's
//! submission), `task/result.rs` (a worker's result and its
//! constructors), `task/capture.rs` (a source capture) and
//! `task/isolation.rs` (the isolation evidence).

mod capture;
mod decision;
mod isolation;
mod result;
mod state;
mod submission;

use crate::binding::Binding;
use crate::plan::PlanRequest;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use decision::{check_reason, result_sha256};
pub use result::tail_of;

/// Schema tag of a task submission.
pub const TASK_SCHEMA: &str = "airlock.task.v1";

/// The state of a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TaskState {
    /// Waiting to be claimed.
    Queued,
    /// Claimed under a lease.
    Running,
    /// A result was submitted and awaits a verification decision.
    Verifying,
    /// Accepted. Terminal.
    Succeeded,
    /// Rejected, or out of attempts. Terminal unless the owner extends it.
    Failed,
    /// Cancelled by an admin. Terminal.
    Cancelled,
}

/// A verification decision on a submitted result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// The result is good: SUCCEEDED.
    Accept,
    /// NEEDS_REWORK: back to QUEUED while attempts remain, else FAILED.
    Rework,
    /// FAILED.
    Reject,
    /// CANCELLED (Tasks2.CancelTask only).
    Cancel,
}

/// Schema tag of an admin's decision (`Tasks2.Verify`, `Tasks2.CancelTask`).
pub const DECISION_SCHEMA: &str = "airlock.task-decision.v1";

/// The fields of a [`DecisionRequest`], every one required.
pub const DECISION_FIELDS: &[&str] = &[
    "schema",
    "task_id",
    "decision",
    "reason",
    "idempotency_key",
    "expected_revision",
    "expected_attempt",
    "expected_result_sha256",
];

/// An admin's decision on a task, bound by compare-and-swap to what the
/// admin saw: the task's revision, its attempt and the SHA-256 of the
/// result shown ([`TaskView::result_sha256`], `null` when none was shown).
/// The idempotency key makes it exactly-once: the same key and the same
/// request again returns the stored answer; the same key with another
/// request is `DECISION_IDEMPOTENCY_CONFLICT`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecisionRequest {
    /// Always [`DECISION_SCHEMA`].
    pub schema: String,
    /// The task.
    pub task_id: String,
    /// accept, rework or reject (Verify); cancel (CancelTask).
    pub decision: Decision,
    /// Why, checked by [`check_reason`] and trimmed.
    pub reason: String,
    /// Makes the decision exactly-once (the key form of the binding's).
    pub idempotency_key: String,
    /// The task revision the admin saw.
    pub expected_revision: i64,
    /// The attempt the admin saw.
    pub expected_attempt: u32,
    /// SHA-256 of the result the admin saw; `None` when none was shown.
    pub expected_result_sha256: Option<String>,
}

/// The answer to a decision, stored with it: an identical replay returns
/// it again (with `idempotent: true`), even after the task moved on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecisionOutcome {
    /// The task.
    pub task_id: String,
    /// What was decided.
    pub decision: Decision,
    /// The request's idempotency key.
    pub idempotency_key: String,
    /// The attempt it was about.
    pub attempt: u32,
    /// SHA-256 of the result it was about (`None`: no result yet).
    pub result_sha256: Option<String>,
    /// The task's state right after the decision.
    pub state: TaskState,
    /// The task's revision right after the decision.
    pub revision: i64,
    /// True when this answer is a replay of the stored one.
    pub idempotent: bool,
}

/// A planner's task submission.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskSubmission {
    /// The coordinates.
    pub binding: Binding,
    /// The plan.
    pub plan: PlanRequest,
    /// Attempt budget, 1..=50.
    pub max_attempts: u32,
}

/// What a worker receives from a successful claim.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimGrant {
    /// The task.
    pub task_id: String,
    /// The attempt this claim starts (1-based).
    pub attempt: u32,
    /// Fencing epoch; every later call of this holder names it.
    pub lease_epoch: u64,
    /// The bearer secret of the lease, returned once; only its SHA-256 is stored.
    pub lease_token: String,
    /// When the lease expires (unix ms) unless renewed.
    pub lease_expires_at_ms: i64,
    /// The execution envelope, already validated by the supervisor.
    pub envelope: Value,
}

/// The outcome a worker reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Every verification command passed and the commit is on the branch.
    Passed,
    /// A verification command failed, or the executor refused the request.
    Failed,
    /// A source capture finished.
    Captured,
}

/// Evidence summary of one verification command, as the supervisor keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandSummary {
    /// The command's label.
    pub label: String,
    /// Exit status, if it exited.
    pub exit_code: Option<i32>,
    /// True when it was killed at its timeout.
    pub timed_out: bool,
    /// Wall-clock duration.
    pub duration_ms: u64,
    /// For a command that failed: the last bytes of its stdout (at most
    /// [`MAX_SUMMARY_TAIL_BYTES`](crate::limits::MAX_SUMMARY_TAIL_BYTES)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout_tail: Option<String>,
    /// For a command that failed: the last bytes of its stderr.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_tail: Option<String>,
    /// Its job's walls: limits and peaks (an executor with per-job
    /// cgroups).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall: Option<crate::bundle::WallEvidence>,
}

/// Schema tag of a task result.
pub const RESULT_SCHEMA: &str = "airlock.task-result.v1";

/// The result a worker submits for one attempt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskResult {
    /// Always [`RESULT_SCHEMA`].
    pub schema: String,
    /// The task.
    pub task_id: String,
    /// The attempt.
    pub attempt: u32,
    /// The envelope's digest.
    pub execution_digest: String,
    /// What happened.
    pub outcome: Outcome,
    /// The governed commit (passed only).
    pub commit_oid: Option<String>,
    /// The branch it was committed to.
    pub target_branch: String,
    /// SHA-256 of the executor's result bundle, when there was one.
    pub exec_result_sha256: Option<String>,
    /// The refusal code when the outcome is failed.
    pub failure_code: Option<String>,
    /// One entry per verification command.
    pub verification: Vec<CommandSummary>,
    /// How the verification commands were isolated, as the executor
    /// measured it: required on a passed or captured result, present on a
    /// failed one whose commands ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<Isolation>,
    /// What a source capture returned: present exactly on a captured
    /// result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub captured: Option<Capture>,
    /// What the worker saw of a branch that moved behind its back: required
    /// on a failed result with `RECONCILIATION_REQUIRED`, absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconciliation: Option<crate::reconcile::BranchFacts>,
    /// Where the governed commit was published: present on a passed
    /// result of a repository whose upstream publishes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publication: Option<Publication>,
    /// Who signed the governed commit: present on a passed result of a
    /// repository that signs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<Signature>,
}

/// The publication of a governed commit to the repository's upstream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Publication {
    /// The upstream's URL (never with a credential in it).
    pub url: String,
    /// The ref pushed, `refs/heads/agent/…`.
    pub remote_ref: String,
    /// The commit it is at.
    pub commit_oid: String,
    /// Whether this attempt sent it (false: the upstream already had the
    /// branch at the commit, as after a crash between push and record).
    pub pushed: bool,
    /// The upstream's answer (git's porcelain line).
    pub answer: String,
    /// The push options sent.
    pub push_options: Vec<String>,
}

/// The SSH signature of a governed commit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Signature {
    /// The signer's principal (allowed-signers name).
    pub principal: String,
    /// The public key's SHA-256 fingerprint in hex, `sha256:…`.
    pub fingerprint: String,
}

/// What a source capture returns to the planner: the files its plan asked
/// for, read from the task's source commit, and the plan's signals.
/// Credential-like paths (`.env`, `*.pem`, `id_rsa`, … unless
/// `executor.allow_credential_paths` names them) are withheld: the
/// executor's copy of the source never holds them, and such a path is
/// listed in `withheld`, without content.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Capture {
    /// The git tree id the files were read from.
    pub source_tree: String,
    /// The attempt that ran the capture: this result's, or an earlier
    /// attempt of the identical execution and binding whose capture was
    /// reused.
    pub captured_in_attempt: u32,
    /// The planner's normalised signals, as the envelope carried them.
    pub source_signals: Vec<String>,
    /// One entry per requested path that was not withheld, in path order.
    pub files: Vec<CapturedFile>,
    /// Requested credential-like paths, not captured, in path order.
    pub withheld: Vec<String>,
}

/// One captured path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapturedFile {
    /// Repository-relative path.
    pub path: String,
    /// False when the source commit has no file at this path.
    pub present: bool,
    /// SHA-256 of the content (present files only).
    pub sha256: Option<String>,
    /// Whether the file is executable.
    pub executable: bool,
    /// The content, base64 (present files only); a link's target.
    pub content_b64: Option<String>,
    /// True when the path is a symbolic link (captured as itself, never
    /// followed).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub symlink: bool,
}

/// The isolation evidence of one attempt's verification commands, from
/// the executor's confinement report (the weakest of its commands: every
/// command of a request runs under the same prepared confinement, and a
/// report that differs per command is reduced to what held for all).
///
/// Every property is recorded as measured or as `unmeasured`, never
/// assumed: [`Isolation::gaps`] names each property that was not measured
/// at full strength, and only a result without gaps counts as fully
/// confined (the one kind `auto_accept` may accept without a human).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Isolation {
    /// The Landlock ABI the commands' ruleset used; `None`: unmeasured.
    pub landlock_abi: Option<u32>,
    /// `full`, `degraded` (allowed by `executor.allow_degraded_landlock`)
    /// or `unmeasured`.
    pub landlock: String,
    /// `enforced`, `off` or `unmeasured`.
    pub seccomp: String,
    /// The namespaces the commands were given; `None`: unmeasured.
    pub namespaces: Option<Vec<String>>,
    /// The commands' filesystem view: `minimal-root`, `host-view` or
    /// `unmeasured`.
    pub view: String,
    /// The uid the commands ran as (outside any user namespace); `None`:
    /// unmeasured.
    pub uid: Option<u32>,
    /// The dependency layer the commands read (its key and digest,
    /// whether it was fetched or reused, the setup's egress), when the
    /// repository's environment has a setup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer: Option<crate::bundle::LayerEvidence>,
}

/// The word for a property nobody measured.
pub const UNMEASURED: &str = "unmeasured";

/// A task as shown to admins and planners.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskView {
    /// The task.
    pub task_id: String,
    /// Its state.
    pub state: TaskState,
    /// Attempts started so far.
    pub attempt: u32,
    /// Attempt budget.
    pub max_attempts: u32,
    /// Bumped by every change; the retry CAS names it.
    pub revision: i64,
    /// Current lease epoch.
    pub lease_epoch: u64,
    /// When the current lease expires (unix ms), if leased.
    pub lease_expires_at_ms: Option<i64>,
    /// The coordinates.
    pub binding: Binding,
    /// Digest of the current plan.
    pub plan_digest: String,
    /// Digest of the current envelope.
    pub execution_digest: String,
    /// The accepted or latest submitted result.
    pub result: Option<Value>,
    /// SHA-256 of `result` in canonical JSON ([`result_sha256`]); a
    /// decision names it as `expected_result_sha256`.
    pub result_sha256: Option<String>,
    /// The latest verification record.
    pub verification: Option<Value>,
    /// Creation time (unix ms).
    pub created_at_ms: i64,
    /// Last change (unix ms).
    pub updated_at_ms: i64,
    /// Who submitted it (the reads of a caller without
    /// `org.airlock.tasks.read-all` are bound to it); `None` for a task
    /// whose submission is not on record.
    #[serde(default)]
    pub submitter: Option<Submitter>,
}

/// What a task will change and run, as `GetPlan` shows it (since protocol
/// 9.1): the digests [`TaskView`] names, and the execution envelope they
/// bind, exactly as the store keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskPlan {
    /// The task.
    pub task_id: String,
    /// Digest of the current plan (as in [`TaskView::plan_digest`]).
    pub plan_digest: String,
    /// Digest of the current envelope (as in
    /// [`TaskView::execution_digest`]).
    pub execution_digest: String,
    /// The current `airlock.execution.v1` envelope as the store keeps it
    /// (the canonical JSON of [`crate::envelope::Envelope::to_value`]): the
    /// binding's fields, `schema`, `action`, `capability_scope`,
    /// `change_set`, `verification` (the commands), `source_signals`,
    /// `capture_paths`, `governance` and `execution_digest`.
    pub envelope: Value,
}

/// Who submitted a task: the uid the bus daemon reported for the caller,
/// and the planner agent's name when the supervisor recognised the caller
/// as one of its agents. Fixed when the task is created.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Submitter {
    /// The caller's unix uid.
    pub uid: Option<u32>,
    /// The planner agent (`[[agent]] name`), when an agent submitted it.
    pub agent: Option<String>,
}

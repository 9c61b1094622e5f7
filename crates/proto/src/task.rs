//! Tasks as the supervisor keeps them, and the messages about them.

use crate::binding::Binding;
use crate::canonical::is_sha256_hex;
use crate::envelope::Envelope;
use crate::error::{Code, Error, Result};
use crate::fields::Obj;
use crate::limits::{DEFAULT_MAX_ATTEMPTS, MAX_ATTEMPTS_CAP, MAX_REASON_LEN};
use crate::plan::PlanRequest;
use serde::{Deserialize, Serialize};
use serde_json::Value;

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

impl TaskState {
    /// Every state.
    pub const ALL: &'static [TaskState] = &[
        TaskState::Queued,
        TaskState::Running,
        TaskState::Verifying,
        TaskState::Succeeded,
        TaskState::Failed,
        TaskState::Cancelled,
    ];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Queued => "QUEUED",
            TaskState::Running => "RUNNING",
            TaskState::Verifying => "VERIFYING",
            TaskState::Succeeded => "SUCCEEDED",
            TaskState::Failed => "FAILED",
            TaskState::Cancelled => "CANCELLED",
        }
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Result<Self> {
        TaskState::ALL
            .iter()
            .copied()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| Error::with(Code::MESSAGE_INVALID, format!("unknown task state {s:?}")))
    }

    /// No further transition happens on its own.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Succeeded | TaskState::Failed | TaskState::Cancelled
        )
    }
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

impl Decision {
    /// Parses `accept`, `rework`, `reject` or `cancel`.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "accept" => Ok(Decision::Accept),
            "rework" => Ok(Decision::Rework),
            "reject" => Ok(Decision::Reject),
            "cancel" => Ok(Decision::Cancel),
            _ => Err(Error::with(Code::VERIFICATION_DECISION_INVALID, s)),
        }
    }

    /// The wire name (`accept`, `rework`, `reject`, `cancel`).
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Accept => "accept",
            Decision::Rework => "rework",
            Decision::Reject => "reject",
            Decision::Cancel => "cancel",
        }
    }

    /// The name recorded in the task's verification record.
    pub fn record_name(self) -> &'static str {
        match self {
            Decision::Accept => "ACCEPTED",
            Decision::Rework => "NEEDS_REWORK",
            Decision::Reject => "REJECTED",
            Decision::Cancel => "CANCELLED",
        }
    }
}

/// Checks a human reason: non-blank, bounded, no control characters but newlines.
pub fn check_reason(reason: &str) -> Result<&str> {
    let r = reason.trim();
    if r.is_empty() || r.len() > MAX_REASON_LEN || r.chars().any(|c| c.is_control() && c != '\n') {
        return Err(Error::with(
            Code::VERIFICATION_DECISION_INVALID,
            format!("a reason is 1..={MAX_REASON_LEN} bytes of text"),
        ));
    }
    Ok(r)
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

impl DecisionRequest {
    /// Parses a decision strictly: the exact field set, the schema tag,
    /// then each field with its own code (`TASK_ID_INVALID`,
    /// `VERIFICATION_DECISION_INVALID`, `IDEMPOTENCY_KEY_INVALID`,
    /// `MESSAGE_INVALID` for the counters, `RESULT_SHA256_INVALID`).
    pub fn from_value(value: &Value) -> Result<Self> {
        let o = Obj::new(value, "decision", Code::MESSAGE_INVALID)?;
        o.only(DECISION_FIELDS)?;
        if let Some(missing) = DECISION_FIELDS.iter().find(|f| !o.has(f)) {
            return Err(Error::with(
                Code::MESSAGE_INVALID,
                format!("decision.{missing} is missing"),
            ));
        }
        if o.get("schema").and_then(Value::as_str) != Some(DECISION_SCHEMA) {
            return Err(Error::with(
                Code::SCHEMA_INVALID,
                format!("decision schema is not {DECISION_SCHEMA}"),
            ));
        }
        let task_id = o.get("task_id").and_then(Value::as_str).unwrap_or("");
        if !crate::binding::is_task_id(task_id) {
            return Err(Error::with(Code::TASK_ID_INVALID, "decision.task_id"));
        }
        let decision = match o.get("decision") {
            Some(Value::String(s)) => Decision::parse(s)?,
            _ => {
                return Err(Error::with(
                    Code::VERIFICATION_DECISION_INVALID,
                    "decision.decision must be a string",
                ));
            }
        };
        let reason = match o.get("reason") {
            Some(Value::String(s)) => check_reason(s)?,
            _ => {
                return Err(Error::with(
                    Code::VERIFICATION_DECISION_INVALID,
                    "decision.reason must be a string",
                ));
            }
        };
        let key = o
            .get("idempotency_key")
            .and_then(Value::as_str)
            .unwrap_or("");
        if !crate::binding::is_key(key) {
            return Err(Error::with(
                Code::IDEMPOTENCY_KEY_INVALID,
                "decision.idempotency_key",
            ));
        }
        let expected_revision = o.int("expected_revision", Code::MESSAGE_INVALID, 1..=i64::MAX)?;
        let expected_attempt = o.int(
            "expected_attempt",
            Code::MESSAGE_INVALID,
            0..=i64::from(MAX_ATTEMPTS_CAP),
        )? as u32;
        let expected_result_sha256 = match o.get("expected_result_sha256") {
            Some(Value::Null) => None,
            Some(Value::String(s)) if is_sha256_hex(s) => Some(s.clone()),
            _ => {
                return Err(Error::with(
                    Code::RESULT_SHA256_INVALID,
                    "decision.expected_result_sha256",
                ));
            }
        };
        Ok(DecisionRequest {
            schema: DECISION_SCHEMA.to_owned(),
            task_id: task_id.to_owned(),
            decision,
            reason: reason.to_owned(),
            idempotency_key: key.to_owned(),
            expected_revision,
            expected_attempt,
            expected_result_sha256,
        })
    }

    /// A decision about `view` exactly as shown: its revision, attempt and
    /// result SHA-256. Without `key`, the idempotency key is derived from
    /// the task, the revision, the decision and the reason, so the same
    /// command about the same view asks once.
    pub fn about(view: &TaskView, decision: Decision, reason: &str, key: Option<&str>) -> Self {
        let key = match key {
            Some(k) => k.to_owned(),
            None => {
                let tag = crate::canonical::sha256_hex(
                    format!(
                        "{}\0{}\0{}\0{}",
                        view.task_id,
                        view.revision,
                        decision.as_str(),
                        reason.trim()
                    )
                    .as_bytes(),
                );
                format!("decide-{}-r{}", &tag[..32], view.revision)
            }
        };
        DecisionRequest {
            schema: DECISION_SCHEMA.to_owned(),
            task_id: view.task_id.clone(),
            decision,
            reason: reason.trim().to_owned(),
            idempotency_key: key,
            expected_revision: view.revision,
            expected_attempt: view.attempt,
            expected_result_sha256: view.result_sha256.clone(),
        }
    }

    /// The request as JSON.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("a decision request serialises")
    }

    /// SHA-256 of the canonical request (as parsed: the reason trimmed):
    /// what an idempotent replay compares.
    pub fn request_sha256(&self) -> String {
        crate::canonical::digest_of(self).expect("a decision request is always canonical")
    }
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

/// SHA-256 of a stored result as it is shown ([`TaskView::result`], in
/// canonical JSON): what a decision's `expected_result_sha256` names.
pub fn result_sha256(result: &Value) -> Result<String> {
    crate::canonical::digest_of(result)
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

impl TaskSubmission {
    /// Parses `{"schema": "airlock.task.v1", "binding": {…}, "plan": {…}, "max_attempts": n}`.
    pub fn from_value(value: &Value) -> Result<Self> {
        let o = Obj::new(value, "task", Code::MESSAGE_INVALID)?;
        if o.get("schema").and_then(Value::as_str) != Some(TASK_SCHEMA) {
            return Err(Error::with(
                Code::SCHEMA_INVALID,
                "task schema is not airlock.task.v1",
            ));
        }
        o.only(&["schema", "binding", "plan", "max_attempts"])?;
        let binding = Binding::from_value(
            o.get("binding")
                .ok_or(Error::with(Code::MESSAGE_INVALID, "binding is missing"))?,
        )?;
        let plan = PlanRequest::from_value(
            o.get("plan")
                .ok_or(Error::with(Code::MESSAGE_INVALID, "plan is missing"))?,
        )?;
        let max_attempts = if o.has("max_attempts") {
            o.int(
                "max_attempts",
                Code::MAX_ATTEMPTS_INVALID,
                1..=i64::from(MAX_ATTEMPTS_CAP),
            )? as u32
        } else {
            DEFAULT_MAX_ATTEMPTS
        };
        Ok(TaskSubmission {
            binding,
            plan,
            max_attempts,
        })
    }
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
}

impl CommandSummary {
    /// True when the command exited 0 within its time.
    pub fn passed(&self) -> bool {
        self.exit_code == Some(0) && !self.timed_out
    }
}

/// The last at most `max` bytes of `text`, cut at a character boundary.
pub fn tail_of(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
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
    /// The content, base64 (present files only).
    pub content_b64: Option<String>,
}

impl Capture {
    /// Bounds and consistency: a tree id, at most
    /// [`MAX_CAPTURE_PATHS`](crate::limits::MAX_CAPTURE_PATHS) valid paths
    /// in strict path order, a present file's content hashing to its
    /// digest, an absent one carrying none, and at most
    /// [`MAX_CAPTURE_BYTES`](crate::limits::MAX_CAPTURE_BYTES) of content
    /// in all (`FILE_TOO_LARGE` beyond).
    pub fn validate(&self) -> Result<()> {
        use base64::Engine;
        let bad = |why: String| Err(Error::with(Code::MESSAGE_INVALID, why));
        if !crate::binding::is_oid(&self.source_tree) {
            return bad("capture source_tree".into());
        }
        if self.captured_in_attempt == 0 {
            return bad("captured_in_attempt starts at 1".into());
        }
        for w in &self.withheld {
            crate::path::check_relative_path(w)?;
        }
        if self.withheld.windows(2).any(|w| w[0] >= w[1])
            || self.files.iter().any(|f| self.withheld.contains(&f.path))
        {
            return bad("withheld paths are unordered or also captured".into());
        }
        if self.files.len() + self.withheld.len() > crate::limits::MAX_CAPTURE_PATHS
            || self.source_signals.len() > crate::limits::MAX_SOURCE_SIGNALS
        {
            return Err(Error::with(Code::FIELD_BOUNDS_EXCEEDED, "capture"));
        }
        let mut total = 0usize;
        let mut previous: Option<&str> = None;
        for f in &self.files {
            crate::path::check_relative_path(&f.path)?;
            if previous.is_some_and(|p| p >= f.path.as_str()) {
                return bad("captured files are not in strict path order".into());
            }
            previous = Some(&f.path);
            match (f.present, &f.sha256, &f.content_b64) {
                (true, Some(sha), Some(b64)) => {
                    let bytes = base64::engine::general_purpose::STANDARD
                        .decode(b64)
                        .map_err(|e| {
                            Error::with(Code::MESSAGE_INVALID, format!("{}: {e}", f.path))
                        })?;
                    if crate::canonical::sha256_hex(&bytes) != *sha {
                        return bad(format!("{}: content does not match its digest", f.path));
                    }
                    total += bytes.len();
                }
                (false, None, None) if !f.executable => {}
                _ => return bad(format!("{}: present, digest and content disagree", f.path)),
            }
        }
        if total > crate::limits::MAX_CAPTURE_BYTES {
            return Err(Error::with(
                Code::FILE_TOO_LARGE,
                format!(
                    "captured files hold {total} bytes, limit {}",
                    crate::limits::MAX_CAPTURE_BYTES
                ),
            ));
        }
        Ok(())
    }
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
}

/// The word for a property nobody measured.
pub const UNMEASURED: &str = "unmeasured";

impl Isolation {
    /// Nothing measured (no executor report).
    pub fn unmeasured() -> Self {
        Isolation {
            landlock_abi: None,
            landlock: UNMEASURED.into(),
            seccomp: UNMEASURED.into(),
            namespaces: None,
            view: UNMEASURED.into(),
            uid: None,
        }
    }

    /// The evidence in an executor's confinement report. A report of no
    /// command (`view` `none`) measured nothing about commands.
    pub fn from_report(r: &crate::bundle::ConfinementReport) -> Self {
        if r.view == "none" {
            return Isolation {
                uid: r.uid,
                ..Isolation::unmeasured()
            };
        }
        let landlock = match r.landlock.as_str() {
            "full" | "degraded" => r.landlock.clone(),
            _ => UNMEASURED.to_owned(),
        };
        let view = match r.view.as_str() {
            "minimal-root" | "host-view" => r.view.clone(),
            _ => UNMEASURED.to_owned(),
        };
        Isolation {
            landlock_abi: (r.landlock_abi > 0).then_some(r.landlock_abi),
            landlock,
            seccomp: if r.seccomp { "enforced" } else { "off" }.into(),
            namespaces: Some(r.namespaces.clone()),
            view,
            uid: r.uid,
        }
    }

    /// Why the commands were not fully confined; empty when they were.
    /// Fully confined: Landlock fully enforced at a known ABI, seccomp
    /// enforced, a known filesystem view (the minimal root, or the
    /// host view with every path-based metadata call refused, where user
    /// namespaces are unavailable), and a known uid other than root.
    pub fn gaps(&self) -> Vec<String> {
        let mut gaps = Vec::new();
        match (self.landlock.as_str(), self.landlock_abi) {
            ("full", Some(_)) => {}
            ("degraded", abi) => gaps.push(format!(
                "Landlock degraded (ABI {})",
                abi.map_or_else(|| UNMEASURED.to_owned(), |a| a.to_string())
            )),
            _ => gaps.push("Landlock unmeasured".to_owned()),
        }
        match self.seccomp.as_str() {
            "enforced" => {}
            "off" => gaps.push("seccomp off".to_owned()),
            _ => gaps.push("seccomp unmeasured".to_owned()),
        }
        match self.view.as_str() {
            "minimal-root" | "host-view" => {}
            _ => gaps.push("filesystem view unmeasured".to_owned()),
        }
        if self.namespaces.is_none() {
            gaps.push("namespaces unmeasured".to_owned());
        }
        match self.uid {
            Some(0) => gaps.push("commands ran as root".to_owned()),
            Some(_) => {}
            None => gaps.push("uid unmeasured".to_owned()),
        }
        gaps
    }

    /// True when [`Isolation::gaps`] is empty.
    pub fn fully_confined(&self) -> bool {
        self.gaps().is_empty()
    }

    /// Structural bounds (the values are the executor's words).
    fn validate(&self) -> Result<()> {
        let word = |s: &str, allowed: &[&str]| allowed.contains(&s);
        let ok = word(&self.landlock, &["full", "degraded", UNMEASURED])
            && word(&self.seccomp, &["enforced", "off", UNMEASURED])
            && word(&self.view, &["minimal-root", "host-view", UNMEASURED])
            && self
                .namespaces
                .as_ref()
                .is_none_or(|n| n.len() <= 16 && n.iter().all(|s| !s.is_empty() && s.len() <= 16));
        if ok {
            Ok(())
        } else {
            Err(Error::with(Code::MESSAGE_INVALID, "isolation"))
        }
    }
}

impl TaskResult {
    fn of(
        task_id: &str,
        attempt: u32,
        execution_digest: &str,
        target_branch: &str,
        outcome: Outcome,
    ) -> Self {
        TaskResult {
            schema: RESULT_SCHEMA.into(),
            task_id: task_id.to_owned(),
            attempt,
            execution_digest: execution_digest.to_owned(),
            outcome,
            commit_oid: None,
            target_branch: target_branch.to_owned(),
            exec_result_sha256: None,
            failure_code: None,
            verification: vec![],
            isolation: None,
            captured: None,
            reconciliation: None,
        }
    }

    fn of_envelope(envelope: &Envelope, attempt: u32, outcome: Outcome) -> Self {
        let b = &envelope.binding;
        Self::of(
            &b.task_id,
            attempt,
            &envelope.execution_digest,
            &b.target_branch,
            outcome,
        )
    }

    /// `attempt` passed: the governed commit on the branch, the digest of
    /// the executor's result it was made from, and that result's evidence.
    pub fn passed(
        envelope: &Envelope,
        attempt: u32,
        commit_oid: String,
        exec_result_sha256: String,
        verification: Vec<CommandSummary>,
        isolation: Isolation,
    ) -> Self {
        TaskResult {
            commit_oid: Some(commit_oid),
            exec_result_sha256: Some(exec_result_sha256),
            verification,
            isolation: Some(isolation),
            ..Self::of_envelope(envelope, attempt, Outcome::Passed)
        }
    }

    /// `attempt` captured: what its source capture returned.
    pub fn captured(
        envelope: &Envelope,
        attempt: u32,
        exec_result_sha256: String,
        capture: Capture,
        isolation: Isolation,
    ) -> Self {
        TaskResult {
            exec_result_sha256: Some(exec_result_sha256),
            captured: Some(capture),
            isolation: Some(isolation),
            ..Self::of_envelope(envelope, attempt, Outcome::Captured)
        }
    }

    /// `attempt` failed with `code`; [`TaskResult::with_evidence`] adds
    /// what its commands left.
    pub fn failed(envelope: &Envelope, attempt: u32, code: Code) -> Self {
        Self::of_envelope(envelope, attempt, Outcome::Failed).failing_with(code)
    }

    /// The failed result of a claim whose envelope the worker refuses
    /// (`code`), derived from the claim alone; `None` when the envelope
    /// names no execution digest or target branch.
    pub fn refused_claim(claim: &ClaimGrant, code: Code) -> Option<Self> {
        let digest = claim.envelope["execution_digest"].as_str()?;
        let branch = claim.envelope["target_branch"].as_str()?;
        let result = Self::of(
            &claim.task_id,
            claim.attempt,
            digest,
            branch,
            Outcome::Failed,
        );
        Some(result.failing_with(code))
    }

    /// `attempt` failed with `RECONCILIATION_REQUIRED`, carrying what the
    /// worker saw of the branch.
    pub fn reconciliation_required(
        envelope: &Envelope,
        attempt: u32,
        facts: crate::reconcile::BranchFacts,
    ) -> Self {
        TaskResult {
            reconciliation: Some(facts),
            ..Self::failed(envelope, attempt, Code::RECONCILIATION_REQUIRED)
        }
    }

    /// This result with its commands' summaries and how they were isolated.
    pub fn with_evidence(self, verification: Vec<CommandSummary>, isolation: Isolation) -> Self {
        TaskResult {
            verification,
            isolation: Some(isolation),
            ..self
        }
    }

    fn failing_with(self, code: Code) -> Self {
        TaskResult {
            failure_code: Some(code.as_str().to_owned()),
            ..self
        }
    }

    /// Structural checks the supervisor applies before storing a result.
    pub fn validate(&self) -> Result<()> {
        let bad = |why: &str| Err(Error::with(Code::MESSAGE_INVALID, why.to_owned()));
        if self.schema != RESULT_SCHEMA {
            return Err(Error::new(Code::SCHEMA_INVALID));
        }
        if !is_sha256_hex(&self.execution_digest) {
            return bad("execution_digest");
        }
        if let Some(oid) = &self.commit_oid {
            if !crate::binding::is_oid(oid) {
                return bad("commit_oid");
            }
        }
        if (self.outcome == Outcome::Passed) != self.commit_oid.is_some() {
            return bad("a passed result carries a commit, and only it");
        }
        if (self.outcome == Outcome::Failed) != self.failure_code.is_some() {
            return bad("a failed result carries a failure code, and only it");
        }
        if (self.outcome == Outcome::Captured) != self.captured.is_some() {
            return bad("a captured result carries its capture, and only it");
        }
        if let Some(c) = &self.captured {
            c.validate()?;
        }
        if let Some(code) = &self.failure_code {
            if Code::from_name(code).is_none() {
                return bad("failure_code is not a catalogue code");
            }
        }
        let reconciling =
            self.failure_code.as_deref() == Some(Code::RECONCILIATION_REQUIRED.as_str());
        match &self.reconciliation {
            Some(facts) if reconciling => facts.validate()?,
            None if !reconciling => {}
            _ => {
                return bad(
                    "a RECONCILIATION_REQUIRED result carries what the worker saw of the branch, and only it",
                );
            }
        }
        if self
            .exec_result_sha256
            .as_deref()
            .is_some_and(|s| !is_sha256_hex(s))
        {
            return bad("exec_result_sha256");
        }
        if self.verification.len() > crate::limits::MAX_COMMANDS {
            return Err(Error::new(Code::FIELD_BOUNDS_EXCEEDED));
        }
        match (&self.isolation, self.outcome) {
            (None, Outcome::Passed | Outcome::Captured) => {
                return bad("a passed or captured result carries its isolation evidence");
            }
            (Some(i), _) => i.validate()?,
            (None, Outcome::Failed) => {}
        }
        for c in &self.verification {
            let tails = [&c.stdout_tail, &c.stderr_tail];
            if tails.iter().any(|t| t.is_some()) && c.passed() {
                return bad("only a failed command carries output tails");
            }
            if tails
                .iter()
                .flat_map(|t| t.as_deref())
                .any(|t| t.len() > crate::limits::MAX_SUMMARY_TAIL_BYTES)
            {
                return Err(Error::with(Code::FIELD_BOUNDS_EXCEEDED, "output tail"));
            }
        }
        Ok(())
    }
}

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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binding::tests::binding_json;
    use crate::plan::tests::plan_json;
    use serde_json::json;

    fn submission() -> Value {
        json!({"schema": TASK_SCHEMA, "binding": binding_json(), "plan": plan_json(), "max_attempts": 2})
    }

    #[test]
    fn submission_parses_with_default_attempts() {
        let s = TaskSubmission::from_value(&submission()).unwrap();
        assert_eq!(s.max_attempts, 2);
        let mut v = submission();
        v.as_object_mut().unwrap().remove("max_attempts");
        assert_eq!(
            TaskSubmission::from_value(&v).unwrap().max_attempts,
            DEFAULT_MAX_ATTEMPTS
        );
    }

    #[test]
    fn submission_refusals() {
        let code = |edit: fn(&mut Value)| {
            let mut v = submission();
            edit(&mut v);
            TaskSubmission::from_value(&v).unwrap_err().code
        };
        assert_eq!(
            code(|v| v["max_attempts"] = json!(51)),
            Code::MAX_ATTEMPTS_INVALID
        );
        assert_eq!(
            code(|v| v["max_attempts"] = json!(0)),
            Code::MAX_ATTEMPTS_INVALID
        );
        assert_eq!(code(|v| v["schema"] = json!("x")), Code::SCHEMA_INVALID);
        assert_eq!(code(|v| v["note"] = json!("hi")), Code::MESSAGE_INVALID);
        assert_eq!(
            code(|v| v["binding"]["target_branch"] = json!("main")),
            Code::PROTECTED_REF_DENY
        );
    }

    fn confined() -> Isolation {
        Isolation::from_report(&crate::bundle::ConfinementReport {
            landlock_abi: 7,
            landlock: "full".into(),
            seccomp: true,
            namespaces: vec!["user".into(), "mnt".into(), "pid".into()],
            uid: Some(992),
            view: "minimal-root".into(),
        })
    }

    #[test]
    fn isolation_is_full_only_when_every_property_was_measured_at_full_strength() {
        let full = confined();
        assert!(full.fully_confined(), "{:?}", full.gaps());
        let report = |f: &dyn Fn(&mut crate::bundle::ConfinementReport)| {
            let mut r = crate::bundle::ConfinementReport {
                landlock_abi: 7,
                landlock: "full".into(),
                seccomp: true,
                namespaces: vec![],
                uid: Some(992),
                view: "host-view".into(),
            };
            f(&mut r);
            Isolation::from_report(&r)
        };
        assert!(
            report(&|_| {}).fully_confined(),
            "the host view is a confined mode"
        );
        let gaps = |f: &dyn Fn(&mut crate::bundle::ConfinementReport)| report(f).gaps();
        assert_eq!(
            gaps(&|r| r.landlock = "degraded".into()),
            ["Landlock degraded (ABI 7)"]
        );
        assert_eq!(
            gaps(&|r| r.landlock = "none".into()),
            ["Landlock unmeasured"]
        );
        assert_eq!(gaps(&|r| r.landlock_abi = 0), ["Landlock unmeasured"]);
        assert_eq!(gaps(&|r| r.seccomp = false), ["seccomp off"]);
        assert_eq!(gaps(&|r| r.uid = Some(0)), ["commands ran as root"]);
        assert_eq!(gaps(&|r| r.uid = None), ["uid unmeasured"]);
        assert_eq!(
            gaps(&|r| r.view = "something-new".into()),
            ["filesystem view unmeasured"]
        );
        // No command ran: nothing about commands was measured.
        let none = report(&|r| r.view = "none".into());
        assert!(!none.fully_confined());
        assert_eq!(none.landlock, UNMEASURED);
        assert_eq!(none.seccomp, UNMEASURED);
        // Nothing measured at all is never confined.
        assert_eq!(Isolation::unmeasured().gaps().len(), 5);
    }

    fn envelope() -> Envelope {
        let base = "a".repeat(40);
        let binding = Binding::from_value(&json!({
            "task_id": "task-a", "job_id": "job-a", "repository": "demo", "base_oid": base,
            "expected_branch_oid": base, "target_branch": "agent/task-a", "branch_mode": "CREATE_NEW",
            "generation": 1, "idempotency_key": "key-task-a",
        }))
        .unwrap();
        let request = crate::envelope::ExecutionRequest::from_value(&json!({
            "action": "deterministic",
            "change_set": [{"operation": "write_file", "path": "a.txt", "content": "a\n"}],
        }))
        .unwrap();
        Envelope::project(&binding, &request).unwrap()
    }

    #[test]
    fn each_outcomes_constructor_builds_a_valid_result() {
        let env = envelope();
        let passed =
            TaskResult::passed(&env, 2, "c".repeat(40), "e".repeat(64), vec![], confined());
        let capture = Capture {
            source_tree: "f".repeat(40),
            captured_in_attempt: 1,
            source_signals: vec![],
            files: vec![],
            withheld: vec![],
        };
        let captured = TaskResult::captured(&env, 2, "e".repeat(64), capture, confined());
        let failed = TaskResult::failed(&env, 2, Code::VERIFICATION_FAILED);
        assert_eq!(failed.failure_code.as_deref(), Some("VERIFICATION_FAILED"));
        let with_evidence = failed.clone().with_evidence(vec![], confined());
        let facts = crate::reconcile::BranchFacts {
            commit_oid: "c".repeat(40),
            observed_head: None,
        };
        let reconciling = TaskResult::reconciliation_required(&env, 2, facts);
        let claim = ClaimGrant {
            task_id: "task-a".into(),
            attempt: 2,
            lease_epoch: 1,
            lease_token: "t".repeat(43),
            lease_expires_at_ms: 0,
            envelope: env.to_value(),
        };
        let refused =
            TaskResult::refused_claim(&claim, Code::EXECUTION_ACTION_UNSUPPORTED).unwrap();
        for r in [
            passed,
            captured,
            failed,
            with_evidence,
            reconciling,
            refused,
        ] {
            assert!(r.validate().is_ok(), "{r:?}");
            assert_eq!(r.schema, RESULT_SCHEMA);
            assert_eq!((r.task_id.as_str(), r.attempt), ("task-a", 2));
            assert_eq!(r.execution_digest, env.execution_digest);
            assert_eq!(r.target_branch, "agent/task-a");
        }
        let nameless = ClaimGrant {
            envelope: json!({}),
            ..claim
        };
        assert_eq!(TaskResult::refused_claim(&nameless, Code::INTERNAL), None);
    }

    #[test]
    fn result_validation() {
        let mut r = TaskResult {
            schema: RESULT_SCHEMA.into(),
            task_id: "task-a".into(),
            attempt: 1,
            execution_digest: "d".repeat(64),
            outcome: Outcome::Passed,
            commit_oid: Some("c".repeat(40)),
            target_branch: "agent/x".into(),
            exec_result_sha256: Some("e".repeat(64)),
            failure_code: None,
            verification: vec![],
            reconciliation: None,
            isolation: None,
            captured: None,
        };
        assert_eq!(
            r.validate().unwrap_err().code,
            Code::MESSAGE_INVALID,
            "a passed result without isolation evidence"
        );
        r.isolation = Some(confined());
        assert!(r.validate().is_ok());
        r.isolation.as_mut().unwrap().view = "chroot".into();
        assert_eq!(r.validate().unwrap_err().code, Code::MESSAGE_INVALID);
        r.isolation = Some(confined());
        r.commit_oid = None;
        assert!(r.validate().is_err());
        r.outcome = Outcome::Failed;
        r.failure_code = Some("NOT_A_CODE".into());
        assert!(r.validate().is_err());
        r.failure_code = Some("VERIFICATION_FAILED".into());
        assert!(r.validate().is_ok());
        r.failure_code = Some("RECONCILIATION_REQUIRED".into());
        assert!(r.validate().is_err(), "without what the worker saw");
        r.reconciliation = Some(crate::reconcile::BranchFacts {
            commit_oid: "c".repeat(40),
            observed_head: None,
        });
        assert!(r.validate().is_ok());
        r.failure_code = Some("VERIFICATION_FAILED".into());
        assert!(r.validate().is_err(), "facts on another failure");
        r.reconciliation = None;
        let mut failed = CommandSummary {
            label: "tests".into(),
            exit_code: Some(1),
            timed_out: false,
            duration_ms: 5,
            stdout_tail: None,
            stderr_tail: Some("FAIL: test_adds".into()),
        };
        r.verification = vec![failed.clone()];
        assert!(r.validate().is_ok(), "a failed command keeps its tail");
        let old = serde_json::to_value(&failed).unwrap();
        failed.stderr_tail = Some("x".repeat(crate::limits::MAX_SUMMARY_TAIL_BYTES + 1));
        r.verification = vec![failed.clone()];
        assert_eq!(r.validate().unwrap_err().code, Code::FIELD_BOUNDS_EXCEEDED);
        failed.exit_code = Some(0);
        failed.stderr_tail = Some("ok".into());
        r.verification = vec![failed];
        assert_eq!(r.validate().unwrap_err().code, Code::MESSAGE_INVALID);
        // A summary without tails (an older worker's) still reads.
        let mut older = old;
        older.as_object_mut().unwrap().remove("stderr_tail");
        assert!(serde_json::from_value::<CommandSummary>(older).is_ok());
        assert_eq!(tail_of("aé", 1), "");
        assert_eq!(tail_of("abc", 2), "bc");
        r.verification = vec![];
        let v = serde_json::to_value(&r).unwrap();
        let mut extra = v.clone();
        extra["x"] = json!(1);
        assert!(serde_json::from_value::<TaskResult>(extra).is_err());
    }

    #[test]
    fn decisions_and_reasons() {
        assert_eq!(
            Decision::parse("rework").unwrap().record_name(),
            "NEEDS_REWORK"
        );
        assert_eq!(
            Decision::parse("maybe").unwrap_err().code,
            Code::VERIFICATION_DECISION_INVALID
        );
        assert!(check_reason("  ").is_err());
        assert!(check_reason("bad\u{1b}[31m").is_err());
        assert_eq!(check_reason(" ok \n").unwrap(), "ok");
        for s in TaskState::ALL {
            assert_eq!(TaskState::parse(s.as_str()).unwrap(), *s);
        }
    }
}

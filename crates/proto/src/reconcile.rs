//! Reconciliation cases: an attempt whose branch moved behind the worker's
//! back, and what an administrator decides about it.
//!
//! The worker reports such an attempt failed with `RECONCILIATION_REQUIRED`
//! and the [`BranchFacts`] it observed (the commit it made, the head it
//! found). The supervisor ends the task FAILED at once (another attempt
//! cannot settle a moved branch) and opens a [`ReconciliationCase`]. An
//! administrator resolves it once ([`ResolveRequest`], compare-and-swap on
//! the case as shown, idempotent):
//!
//! - `fail`: the case closes `failed`; the task stays FAILED with
//!   `RECONCILIATION_REQUIRED`, the admin's reason in its verification record.
//! - `adopt`: the case becomes `adopting`. The supervisor holds no git
//!   access, so the credentialed worker checks the ref
//!   ([`AdoptionCheck`] → [`AdoptionReport`]): only if the branch still
//!   holds the observed head, and that head descends from (or is) the
//!   commit the task started from, does the case close `adopted` and the
//!   task become SUCCEEDED with the observed head as its commit. Otherwise
//!   the case opens again with what the worker found
//!   (`RECONCILIATION_HEAD_MOVED`, `RECONCILIATION_HEAD_UNRELATED`).
//!
//! ```text
//! open ─resolve fail─▶ failed
//!  │ ▲
//!  │ └─worker: head moved / unrelated (new head recorded)
//!  └─resolve adopt─▶ adopting ─worker: head unchanged, descends─▶ adopted
//! ```

use crate::binding::{is_key, is_oid, is_task_id};
use crate::fields::Obj;
use crate::limits::MAX_ATTEMPTS_CAP;
use crate::task::{TaskState, check_reason};
use crate::{Code, Error, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What the worker saw of the branch when it stopped an attempt: the
/// commit the attempt made and the head the branch held instead.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BranchFacts {
    /// The attempt's governed commit.
    pub commit_oid: String,
    /// The branch's head when the worker looked (`None`: the branch is gone).
    pub observed_head: Option<String>,
}

impl BranchFacts {
    /// Both object ids well formed, and the head another commit.
    pub fn validate(&self) -> Result<()> {
        let ok = is_oid(&self.commit_oid)
            && self.observed_head.as_deref().is_none_or(is_oid)
            && self.observed_head.as_deref() != Some(self.commit_oid.as_str());
        if ok {
            Ok(())
        } else {
            Err(Error::with(Code::MESSAGE_INVALID, "reconciliation"))
        }
    }
}

/// Where a case stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CaseStatus {
    /// Waiting for an administrator.
    Open,
    /// An administrator chose adopt; waiting for the worker's check of the ref.
    Adopting,
    /// Adopted: the task SUCCEEDED with the observed head as its commit.
    Adopted,
    /// Failed by an administrator: the task stays FAILED.
    Failed,
}

impl CaseStatus {
    /// Every status.
    pub const ALL: &'static [CaseStatus] = &[
        CaseStatus::Open,
        CaseStatus::Adopting,
        CaseStatus::Adopted,
        CaseStatus::Failed,
    ];

    /// The stored and shown name.
    pub fn as_str(self) -> &'static str {
        match self {
            CaseStatus::Open => "open",
            CaseStatus::Adopting => "adopting",
            CaseStatus::Adopted => "adopted",
            CaseStatus::Failed => "failed",
        }
    }

    /// Parses a stored name.
    pub fn parse(s: &str) -> Option<CaseStatus> {
        CaseStatus::ALL.iter().copied().find(|c| c.as_str() == s)
    }

    /// Adopted or failed: nothing changes it any more.
    pub fn is_closed(self) -> bool {
        matches!(self, CaseStatus::Adopted | CaseStatus::Failed)
    }
}

/// What each operation does to a case, by the case's status (rendered in
/// `docs/states.md`): `(operation, from, outcome)`. Every refusal changes
/// nothing; every change is one transaction with its event.
pub const CASE_TABLE: &[(&str, &str, &str)] = &[
    (
        "Worker1.SubmitResult (failed, RECONCILIATION_REQUIRED)",
        "(no case for the attempt)",
        "→ open; the task FAILED at once, whatever attempts are left",
    ),
    (
        "Reconcile1.ResolveReconciliation (fail)",
        "open",
        "→ failed; the task stays FAILED, its verification record RECONCILIATION_FAILED with the reason",
    ),
    (
        "Reconcile1.ResolveReconciliation (adopt)",
        "open",
        "→ adopting; the task stays FAILED until the worker's check; RECONCILIATION_HEAD_UNRELATED when the branch was missing",
    ),
    (
        "Reconcile1.ResolveReconciliation",
        "open, but another attempt, revision or head than the request's",
        "RECONCILIATION_CAS_MISMATCH",
    ),
    (
        "Reconcile1.ResolveReconciliation",
        "adopting, adopted, failed",
        "RECONCILIATION_CLOSED (an identical replay answers the stored outcome)",
    ),
    (
        "Worker1.SettleAdoption (the branch at the head, which descends from the base)",
        "adopting",
        "→ adopted; the task FAILED → SUCCEEDED, the head its commit (verification record ADOPTED)",
    ),
    (
        "Worker1.SettleAdoption (another head, or no branch)",
        "adopting",
        "→ open with the head found; RECONCILIATION_HEAD_MOVED recorded",
    ),
    (
        "Worker1.SettleAdoption (the head does not descend from the base)",
        "adopting",
        "→ open; RECONCILIATION_HEAD_UNRELATED recorded",
    ),
    (
        "Worker1.SettleAdoption (the task is no longer FAILED)",
        "adopting",
        "→ open; TASK_STATE_INVALID recorded",
    ),
    (
        "Worker1.SettleAdoption",
        "open, adopted, failed, or adopting another head",
        "nothing changes (a late or second report)",
    ),
];

/// What an administrator decides about a case.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Resolution {
    /// Make the observed head the task's commit (checked by the worker).
    Adopt,
    /// End the task FAILED with RECONCILIATION_REQUIRED and the reason.
    Fail,
}

impl Resolution {
    /// Parses `adopt` or `fail`.
    pub fn parse(s: &str) -> Result<Resolution> {
        match s {
            "adopt" => Ok(Resolution::Adopt),
            "fail" => Ok(Resolution::Fail),
            _ => Err(Error::with(
                Code::RECONCILIATION_RESOLUTION_INVALID,
                format!("{s:?} is not adopt or fail"),
            )),
        }
    }

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Resolution::Adopt => "adopt",
            Resolution::Fail => "fail",
        }
    }
}

/// One reconciliation case, as `Reconcile1` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReconciliationCase {
    /// The task.
    pub task_id: String,
    /// The attempt whose branch moved.
    pub attempt: u32,
    /// The task's repository.
    pub repository: String,
    /// The task's branch.
    pub branch: String,
    /// The commit the attempt made (what the branch should hold).
    pub commit_oid: String,
    /// The head the worker found last (`None`: the branch is missing).
    pub observed_head: Option<String>,
    /// The commit the task started from: an adopted head must descend from it.
    pub base_oid: String,
    /// Where it stands.
    pub status: CaseStatus,
    /// The administrator's resolution, once made: `{"resolution",
    /// "reason", "actor", "idempotency_key", "observed_head"}`.
    pub resolution: Option<Value>,
    /// The code of the worker's last refusal of an adoption
    /// (`RECONCILIATION_HEAD_MOVED`, `RECONCILIATION_HEAD_UNRELATED`).
    pub last_refusal: Option<String>,
    /// Bumped by every change; a resolution names it.
    pub revision: i64,
    /// When the worker's report opened it (unix ms).
    pub opened_at_ms: i64,
    /// Last change (unix ms).
    pub updated_at_ms: i64,
}

/// `ListReconciliations`'s reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReconciliationPage {
    /// Cases ordered by task id, then attempt.
    pub cases: Vec<ReconciliationCase>,
    /// Pass back as `after_task_id` for the next page (`None`: no more).
    pub next_after: Option<String>,
}

/// Schema tag of an administrator's resolution.
pub const RESOLVE_SCHEMA: &str = "airlock.reconciliation-resolution.v1";

/// The fields of a [`ResolveRequest`], every one required.
pub const RESOLVE_FIELDS: &[&str] = &[
    "schema",
    "task_id",
    "resolution",
    "reason",
    "idempotency_key",
    "expected_attempt",
    "expected_revision",
    "expected_observed_head",
];

/// An administrator's resolution of a case, bound by compare-and-swap to
/// the case as shown (its attempt, revision and observed head) and made
/// exactly-once by its idempotency key, like a task decision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResolveRequest {
    /// Always [`RESOLVE_SCHEMA`].
    pub schema: String,
    /// The task.
    pub task_id: String,
    /// adopt or fail.
    pub resolution: Resolution,
    /// Why (1..=1024 bytes of text, trimmed).
    pub reason: String,
    /// Makes the resolution exactly-once.
    pub idempotency_key: String,
    /// The case's attempt as shown.
    pub expected_attempt: u32,
    /// The case's revision as shown.
    pub expected_revision: i64,
    /// The observed head as shown (`None`: the branch was missing).
    pub expected_observed_head: Option<String>,
}

impl ResolveRequest {
    /// Parses a resolution strictly: the exact field set, the schema tag,
    /// each field with its code (`TASK_ID_INVALID`,
    /// `RECONCILIATION_RESOLUTION_INVALID` for the resolution, its reason
    /// and the head, `IDEMPOTENCY_KEY_INVALID`, `MESSAGE_INVALID` for the
    /// counters).
    pub fn from_value(value: &Value) -> Result<Self> {
        let o = Obj::new(value, "resolution", Code::MESSAGE_INVALID)?;
        o.only(RESOLVE_FIELDS)?;
        if let Some(missing) = RESOLVE_FIELDS.iter().find(|f| !o.has(f)) {
            return Err(Error::with(
                Code::MESSAGE_INVALID,
                format!("resolution.{missing} is missing"),
            ));
        }
        if o.get("schema").and_then(Value::as_str) != Some(RESOLVE_SCHEMA) {
            return Err(Error::with(
                Code::SCHEMA_INVALID,
                format!("resolution schema is not {RESOLVE_SCHEMA}"),
            ));
        }
        let task_id = o.get("task_id").and_then(Value::as_str).unwrap_or("");
        if !is_task_id(task_id) {
            return Err(Error::with(Code::TASK_ID_INVALID, "resolution.task_id"));
        }
        let resolution = match o.get("resolution") {
            Some(Value::String(s)) => Resolution::parse(s)?,
            _ => {
                return Err(Error::with(
                    Code::RECONCILIATION_RESOLUTION_INVALID,
                    "resolution.resolution must be a string",
                ));
            }
        };
        let reason = match o.get("reason") {
            Some(Value::String(s)) => check_reason(s).map_err(|e| {
                Error::with(
                    Code::RECONCILIATION_RESOLUTION_INVALID,
                    e.detail.unwrap_or_default(),
                )
            })?,
            _ => {
                return Err(Error::with(
                    Code::RECONCILIATION_RESOLUTION_INVALID,
                    "resolution.reason must be a string",
                ));
            }
        };
        let key = o
            .get("idempotency_key")
            .and_then(Value::as_str)
            .unwrap_or("");
        if !is_key(key) {
            return Err(Error::with(
                Code::IDEMPOTENCY_KEY_INVALID,
                "resolution.idempotency_key",
            ));
        }
        let expected_attempt = o.int(
            "expected_attempt",
            Code::MESSAGE_INVALID,
            1..=i64::from(MAX_ATTEMPTS_CAP),
        )? as u32;
        let expected_revision = o.int("expected_revision", Code::MESSAGE_INVALID, 1..=i64::MAX)?;
        let expected_observed_head = match o.get("expected_observed_head") {
            Some(Value::Null) => None,
            Some(Value::String(s)) if is_oid(s) => Some(s.clone()),
            _ => {
                return Err(Error::with(
                    Code::RECONCILIATION_RESOLUTION_INVALID,
                    "resolution.expected_observed_head is null or a commit id",
                ));
            }
        };
        Ok(ResolveRequest {
            schema: RESOLVE_SCHEMA.to_owned(),
            task_id: task_id.to_owned(),
            resolution,
            reason: reason.to_owned(),
            idempotency_key: key.to_owned(),
            expected_attempt,
            expected_revision,
            expected_observed_head,
        })
    }

    /// A resolution about `case` exactly as shown. Without `key`, the key
    /// is derived from the case, its revision, the resolution and the
    /// reason, so the same command about the same view asks once.
    pub fn about(
        case: &ReconciliationCase,
        resolution: Resolution,
        reason: &str,
        key: Option<&str>,
    ) -> Self {
        let key = match key {
            Some(k) => k.to_owned(),
            None => {
                let tag = crate::canonical::sha256_hex(
                    format!(
                        "{}\0{}\0{}\0{}\0{}",
                        case.task_id,
                        case.attempt,
                        case.revision,
                        resolution.as_str(),
                        reason.trim()
                    )
                    .as_bytes(),
                );
                format!("resolve-{}-r{}", &tag[..32], case.revision)
            }
        };
        ResolveRequest {
            schema: RESOLVE_SCHEMA.to_owned(),
            task_id: case.task_id.clone(),
            resolution,
            reason: reason.trim().to_owned(),
            idempotency_key: key,
            expected_attempt: case.attempt,
            expected_revision: case.revision,
            expected_observed_head: case.observed_head.clone(),
        }
    }

    /// The request as JSON.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("a resolution serialises")
    }

    /// SHA-256 of the canonical request: what an idempotent replay compares.
    pub fn request_sha256(&self) -> String {
        crate::canonical::digest_of(self).expect("a resolution is always canonical")
    }
}

/// The answer to a resolution, stored with it: an identical replay returns
/// it again (with `idempotent: true`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResolveOutcome {
    /// The task.
    pub task_id: String,
    /// The attempt of the case.
    pub attempt: u32,
    /// What was decided.
    pub resolution: Resolution,
    /// The request's idempotency key.
    pub idempotency_key: String,
    /// The case right after the resolution (`adopting` or `failed`).
    pub status: CaseStatus,
    /// The case's revision right after it.
    pub revision: i64,
    /// The task's state right after it.
    pub task_state: TaskState,
    /// True when this answer is a replay of the stored one.
    pub idempotent: bool,
}

/// `Worker1.TakeAdoption`'s reply: a case an administrator chose to adopt,
/// for the worker to check against the ref.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdoptionCheck {
    /// The task.
    pub task_id: String,
    /// The attempt of the case.
    pub attempt: u32,
    /// The repository.
    pub repository: String,
    /// The branch.
    pub branch: String,
    /// The head the administrator chose to adopt.
    pub observed_head: String,
    /// The head must descend from (or be) this commit.
    pub base_oid: String,
}

/// `Worker1.SettleAdoption`'s request: what the worker found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdoptionReport {
    /// The task.
    pub task_id: String,
    /// The attempt of the case.
    pub attempt: u32,
    /// The head the check was about ([`AdoptionCheck::observed_head`]).
    pub checked_head: String,
    /// The branch's head now (`None`: missing).
    pub head_now: Option<String>,
    /// Whether `head_now` descends from (or is) the base.
    pub descends: bool,
}

impl AdoptionReport {
    /// Well-formed ids.
    pub fn validate(&self) -> Result<()> {
        let ok = is_task_id(&self.task_id)
            && is_oid(&self.checked_head)
            && self.head_now.as_deref().is_none_or(is_oid);
        if ok {
            Ok(())
        } else {
            Err(Error::with(Code::MESSAGE_INVALID, "adoption report"))
        }
    }

    /// The refusal this report means, if any: another head (or none) is
    /// `RECONCILIATION_HEAD_MOVED`; the same head not descending from the
    /// base is `RECONCILIATION_HEAD_UNRELATED`.
    pub fn refusal(&self) -> Option<Code> {
        if self.head_now.as_deref() != Some(self.checked_head.as_str()) {
            Some(Code::RECONCILIATION_HEAD_MOVED)
        } else if !self.descends {
            Some(Code::RECONCILIATION_HEAD_UNRELATED)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request() -> Value {
        json!({
            "schema": RESOLVE_SCHEMA, "task_id": "task-1", "resolution": "adopt",
            "reason": " looked at it ", "idempotency_key": "key-00000001",
            "expected_attempt": 1, "expected_revision": 4,
            "expected_observed_head": "b".repeat(40),
        })
    }

    #[test]
    fn a_resolution_parses_strictly_each_field_with_its_code() {
        let r = ResolveRequest::from_value(&request()).unwrap();
        assert_eq!(r.reason, "looked at it");
        assert_eq!(r.resolution, Resolution::Adopt);
        let code = |edit: &dyn Fn(&mut Value)| {
            let mut v = request();
            edit(&mut v);
            ResolveRequest::from_value(&v).unwrap_err().code
        };
        assert_eq!(code(&|v| v["x"] = json!(1)), Code::MESSAGE_INVALID);
        assert_eq!(
            code(&|v| {
                v.as_object_mut().unwrap().remove("expected_observed_head");
            }),
            Code::MESSAGE_INVALID
        );
        assert_eq!(code(&|v| v["schema"] = json!("x")), Code::SCHEMA_INVALID);
        assert_eq!(code(&|v| v["task_id"] = json!("/")), Code::TASK_ID_INVALID);
        assert_eq!(
            code(&|v| v["resolution"] = json!("merge")),
            Code::RECONCILIATION_RESOLUTION_INVALID
        );
        assert_eq!(
            code(&|v| v["reason"] = json!(" ")),
            Code::RECONCILIATION_RESOLUTION_INVALID
        );
        assert_eq!(
            code(&|v| v["idempotency_key"] = json!("k")),
            Code::IDEMPOTENCY_KEY_INVALID
        );
        assert_eq!(
            code(&|v| v["expected_attempt"] = json!(0)),
            Code::MESSAGE_INVALID
        );
        assert_eq!(
            code(&|v| v["expected_observed_head"] = json!("nope")),
            Code::RECONCILIATION_RESOLUTION_INVALID
        );
        let mut v = request();
        v["expected_observed_head"] = Value::Null;
        assert_eq!(
            ResolveRequest::from_value(&v)
                .unwrap()
                .expected_observed_head,
            None
        );
    }

    #[test]
    fn an_adoption_report_names_its_refusal() {
        let r = |now: Option<&str>, descends| AdoptionReport {
            task_id: "task-1".into(),
            attempt: 1,
            checked_head: "b".repeat(40),
            head_now: now.map(str::to_owned),
            descends,
        };
        let b = "b".repeat(40);
        let c = "c".repeat(40);
        assert_eq!(r(Some(&b), true).refusal(), None);
        assert_eq!(
            r(Some(&c), true).refusal(),
            Some(Code::RECONCILIATION_HEAD_MOVED)
        );
        assert_eq!(
            r(None, false).refusal(),
            Some(Code::RECONCILIATION_HEAD_MOVED)
        );
        assert_eq!(
            r(Some(&b), false).refusal(),
            Some(Code::RECONCILIATION_HEAD_UNRELATED)
        );
        let facts = BranchFacts {
            commit_oid: b.clone(),
            observed_head: Some(b),
        };
        assert!(
            facts.validate().is_err(),
            "a moved branch holds another head"
        );
    }
}

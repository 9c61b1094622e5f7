//! An admin's decision (`Tasks2.Verify`, `Tasks2.CancelTask`): its words,
//! its reason, and the strict parse of the request.

use super::{DECISION_FIELDS, DECISION_SCHEMA, Decision, DecisionRequest, TaskView};
use crate::canonical::is_sha256_hex;
use crate::error::{Code, Error, Result};
use crate::fields::Obj;
use crate::limits::{MAX_ATTEMPTS_CAP, MAX_REASON_LEN};
use serde_json::Value;

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

/// SHA-256 of a stored result as it is shown ([`TaskView::result`], in
/// canonical JSON): what a decision's `expected_result_sha256` names.
pub fn result_sha256(result: &Value) -> Result<String> {
    crate::canonical::digest_of(result)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::TaskState;

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

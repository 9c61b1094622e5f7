//! The owner's retry-extension request: one more attempt for an exhausted,
//! failed task, bound by compare-and-swap to what the owner saw.

use crate::binding::is_key;
use crate::canonical::{digest_of, is_sha256_hex};
use crate::error::{Code, Error, Result};
use crate::limits::MAX_ATTEMPTS_CAP;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Exactly these fields, no more and no fewer.
pub const RETRY_EXTENSION_FIELDS: &[&str] = &[
    "expected_status",
    "expected_revision",
    "expected_attempt",
    "expected_max_attempts",
    "next_max_attempts",
    "previous_verification_sha256",
    "authorization_id",
    "idempotency_key",
];

/// A validated retry-extension request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryExtensionRequest {
    /// Always "FAILED".
    pub expected_status: String,
    /// The task revision the owner saw.
    pub expected_revision: i64,
    /// The attempt the owner saw (equal to expected_max_attempts).
    pub expected_attempt: i64,
    /// The attempt budget the owner saw.
    pub expected_max_attempts: i64,
    /// Exactly expected_max_attempts + 1, at most 50.
    pub next_max_attempts: i64,
    /// SHA-256 of the canonical verification record the owner saw.
    pub previous_verification_sha256: String,
    /// The owner's authorization id; must equal the service's.
    pub authorization_id: String,
    /// Makes the request idempotent.
    pub idempotency_key: String,
}

fn trimmed(value: &Value, code: Code) -> Result<&str> {
    match value {
        Value::String(s) if !s.trim().is_empty() => Ok(s.trim()),
        _ => Err(Error::new(code)),
    }
}

impl RetryExtensionRequest {
    /// Parses with the seed's checks in the seed's order: exact field set,
    /// status, integers, exhausted, one step, cap, verification hash,
    /// authorization id, idempotency key. Strings are trimmed first.
    pub fn from_value(value: &Value) -> Result<Self> {
        let Value::Object(map) = value else {
            return Err(Error::new(Code::REQUEST_INVALID));
        };
        let mut keys: Vec<&str> = map.keys().map(String::as_str).collect();
        keys.sort_unstable();
        let mut want = RETRY_EXTENSION_FIELDS.to_vec();
        want.sort_unstable();
        if keys != want {
            return Err(Error::new(Code::RETRY_EXTENSION_FIELDS_INVALID));
        }
        let status = trimmed(&map["expected_status"], Code::EXPECTED_STATUS_INVALID)?;
        if status != "FAILED" {
            return Err(Error::new(Code::EXPECTED_STATUS_INVALID));
        }
        let int = |k: &str| -> Result<i64> {
            match &map[k] {
                Value::Number(n) if n.is_i64() || n.is_u64() => n
                    .as_i64()
                    .filter(|n| *n >= 0)
                    .ok_or(Error::new(Code::RETRY_EXTENSION_INTEGER_INVALID)),
                _ => Err(Error::new(Code::RETRY_EXTENSION_INTEGER_INVALID)),
            }
        };
        let expected_revision = int("expected_revision")?;
        let expected_attempt = int("expected_attempt")?;
        let expected_max_attempts = int("expected_max_attempts")?;
        let next_max_attempts = int("next_max_attempts")?;
        if expected_attempt != expected_max_attempts {
            return Err(Error::new(Code::RETRY_EXTENSION_NOT_EXHAUSTED));
        }
        if next_max_attempts != expected_max_attempts + 1 {
            return Err(Error::new(Code::RETRY_EXTENSION_MUST_BE_BOUNDED_ONE_STEP));
        }
        if next_max_attempts > i64::from(MAX_ATTEMPTS_CAP) {
            return Err(Error::new(Code::RETRY_EXTENSION_LIMIT_EXCEEDED));
        }
        let verification = trimmed(
            &map["previous_verification_sha256"],
            Code::VERIFICATION_SHA256_INVALID,
        )?;
        if !is_sha256_hex(verification) {
            return Err(Error::new(Code::VERIFICATION_SHA256_INVALID));
        }
        let authorization = trimmed(&map["authorization_id"], Code::AUTHORIZATION_ID_INVALID)?;
        if !is_key(authorization) {
            return Err(Error::new(Code::AUTHORIZATION_ID_INVALID));
        }
        let key = trimmed(&map["idempotency_key"], Code::IDEMPOTENCY_KEY_INVALID)?;
        if !is_key(key) {
            return Err(Error::new(Code::IDEMPOTENCY_KEY_INVALID));
        }
        Ok(RetryExtensionRequest {
            expected_status: status.to_owned(),
            expected_revision,
            expected_attempt,
            expected_max_attempts,
            next_max_attempts,
            previous_verification_sha256: verification.to_owned(),
            authorization_id: authorization.to_owned(),
            idempotency_key: key.to_owned(),
        })
    }

    /// SHA-256 of the canonical (trimmed) request: what idempotency compares.
    pub fn request_sha256(&self) -> String {
        digest_of(self).expect("a retry request is always canonical")
    }
}

/// Checks the service's configured owner authorization id.
pub fn check_configured_authorization_id(value: Option<&str>) -> Result<String> {
    let value = value.map(str::trim).unwrap_or("");
    if value.is_empty() {
        return Err(Error::new(Code::TASK_RETRY_AUTHORIZATION_ID_MISSING));
    }
    if !is_key(value) {
        return Err(Error::new(Code::TASK_RETRY_AUTHORIZATION_ID_INVALID));
    }
    Ok(value.to_owned())
}

/// What the retry service answers on success (201) or replay (200).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryExtensionOutcome {
    /// The task.
    pub task_id: String,
    /// Always QUEUED.
    pub status: String,
    /// The attempt counter (unchanged by the extension).
    pub attempt: i64,
    /// The new attempt budget.
    pub max_attempts: i64,
    /// The task revision after the extension.
    pub revision: i64,
    /// True on a replay of an applied request.
    pub idempotent: bool,
    /// The owner's authorization id.
    pub authorization_id: String,
    /// The verification hash the extension was bound to.
    pub previous_verification_sha256: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    pub fn request() -> Value {
        json!({
            "expected_status": "FAILED", "expected_revision": 41, "expected_attempt": 10,
            "expected_max_attempts": 10, "next_max_attempts": 11,
            "previous_verification_sha256": "a".repeat(64),
            "authorization_id": "owner-scheme-a-20260817", "idempotency_key": "retry-task-a-attempt11",
        })
    }

    fn code(edit: impl FnOnce(&mut Value)) -> Code {
        let mut v = request();
        edit(&mut v);
        RetryExtensionRequest::from_value(&v).unwrap_err().code
    }

    #[test]
    fn valid_request_parses_and_trims() {
        let mut v = request();
        v["expected_status"] = json!(" FAILED ");
        let r = RetryExtensionRequest::from_value(&v).unwrap();
        assert_eq!(r.expected_status, "FAILED");
        assert_eq!(
            r.request_sha256(),
            RetryExtensionRequest::from_value(&request())
                .unwrap()
                .request_sha256()
        );
    }

    #[test]
    fn every_refusal_has_the_seed_code() {
        assert_eq!(
            code(|v| {
                v.as_object_mut().unwrap().remove("idempotency_key");
            }),
            Code::RETRY_EXTENSION_FIELDS_INVALID
        );
        // One field set to a value it may not have, and the code that names it.
        let wrong = [
            ("extra", json!(1), Code::RETRY_EXTENSION_FIELDS_INVALID),
            (
                "expected_status",
                json!("QUEUED"),
                Code::EXPECTED_STATUS_INVALID,
            ),
            ("expected_status", json!(1), Code::EXPECTED_STATUS_INVALID),
            (
                "expected_revision",
                json!(-1),
                Code::RETRY_EXTENSION_INTEGER_INVALID,
            ),
            (
                "expected_revision",
                json!(true),
                Code::RETRY_EXTENSION_INTEGER_INVALID,
            ),
            (
                "expected_revision",
                json!(1.0),
                Code::RETRY_EXTENSION_INTEGER_INVALID,
            ),
            (
                "expected_revision",
                json!("41"),
                Code::RETRY_EXTENSION_INTEGER_INVALID,
            ),
            (
                "expected_attempt",
                json!(9),
                Code::RETRY_EXTENSION_NOT_EXHAUSTED,
            ),
            (
                "next_max_attempts",
                json!(12),
                Code::RETRY_EXTENSION_MUST_BE_BOUNDED_ONE_STEP,
            ),
        ];
        for (field, value, want) in wrong {
            assert_eq!(
                code(|v| v[field] = value.clone()),
                want,
                "{field} = {value}"
            );
        }
        assert_eq!(
            code(|v| {
                v["expected_attempt"] = json!(50);
                v["expected_max_attempts"] = json!(50);
                v["next_max_attempts"] = json!(51);
            }),
            Code::RETRY_EXTENSION_LIMIT_EXCEEDED
        );
        assert_eq!(
            code(|v| v["previous_verification_sha256"] = json!("A".repeat(64))),
            Code::VERIFICATION_SHA256_INVALID
        );
        assert_eq!(
            code(|v| v["authorization_id"] = json!("short")),
            Code::AUTHORIZATION_ID_INVALID
        );
        assert_eq!(
            code(|v| v["idempotency_key"] = json!("")),
            Code::IDEMPOTENCY_KEY_INVALID
        );
        assert_eq!(
            RetryExtensionRequest::from_value(&json!([]))
                .unwrap_err()
                .code,
            Code::REQUEST_INVALID
        );
    }

    #[test]
    fn configured_authorization_id() {
        assert_eq!(
            check_configured_authorization_id(None).unwrap_err().code,
            Code::TASK_RETRY_AUTHORIZATION_ID_MISSING
        );
        assert_eq!(
            check_configured_authorization_id(Some("  "))
                .unwrap_err()
                .code,
            Code::TASK_RETRY_AUTHORIZATION_ID_MISSING
        );
        assert_eq!(
            check_configured_authorization_id(Some("bad id"))
                .unwrap_err()
                .code,
            Code::TASK_RETRY_AUTHORIZATION_ID_INVALID
        );
        assert_eq!(
            check_configured_authorization_id(Some("owner-scheme-a-1")).unwrap(),
            "owner-scheme-a-1"
        );
    }
}

//! Plan registration: idempotent by key, replaced only by compare-and-swap.
//!
//! This module holds the rules; `airlock-taskdb` holds the records and calls
//! [`register_plan`] inside its transaction, so the rules cannot drift
//! between the store and anything else that checks a plan.

use crate::binding::{Binding, is_key};
use crate::canonical::{digest_of, is_sha256_hex};
use crate::envelope::{Action, Envelope, ExecutionRequest};
use crate::error::{Code, Error, Result};
use crate::fields::Obj;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Schema tag of a plan.
pub const PLAN_SCHEMA: &str = "airlock.plan.v1";

/// A planner's plan for one task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanRequest {
    /// Must equal the binding's task id.
    pub task_id: String,
    /// Must equal the binding's job id.
    pub job_id: String,
    /// Must equal the binding's source head (branch head or base).
    pub source_head_oid: String,
    /// Must equal the binding's generation.
    pub generation: i64,
    /// The plan's own idempotency key.
    pub idempotency_key: String,
    /// What to execute.
    pub execution: ExecutionRequest,
    /// For a replacement: the digest of the plan being replaced.
    pub expected_previous_plan_digest: Option<String>,
}

impl PlanRequest {
    /// Parses a plan. Coordinates are only read here; [`register_plan`]
    /// compares them with the binding, in the seed's order.
    pub fn from_value(value: &Value) -> Result<Self> {
        let o = Obj::new(value, "plan", Code::EXECUTION_PLAN_SCHEMA_INVALID)?;
        if o.get("schema").and_then(Value::as_str) != Some(PLAN_SCHEMA) {
            return Err(Error::new(Code::EXECUTION_PLAN_SCHEMA_INVALID));
        }
        o.only(&[
            "schema",
            "task_id",
            "job_id",
            "source_head_oid",
            "generation",
            "idempotency_key",
            "execution",
            "expected_previous_plan_digest",
        ])?;
        let text = |k: &str| -> Result<String> {
            Ok(o.opt_str(k, Code::EXECUTION_PLAN_BINDING_CONFLICT, 4096)?
                .unwrap_or_default()
                .to_owned())
        };
        let previous = match o.get("expected_previous_plan_digest") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s.is_empty() => None,
            Some(Value::String(s)) if is_sha256_hex(s) => Some(s.clone()),
            Some(_) => return Err(Error::new(Code::EXECUTION_PLAN_REPLACEMENT_CAS_MISMATCH)),
        };
        let execution = o
            .get("execution")
            .ok_or(Error::new(Code::EXECUTION_PLAN_DETERMINISTIC_REQUIRED))?;
        Ok(PlanRequest {
            task_id: text("task_id")?,
            job_id: text("job_id")?,
            source_head_oid: o
                .opt_str(
                    "source_head_oid",
                    Code::EXECUTION_PLAN_SOURCE_HEAD_CONFLICT,
                    64,
                )?
                .unwrap_or_default()
                .to_owned(),
            generation: o.int(
                "generation",
                Code::EXECUTION_PLAN_GENERATION_CONFLICT,
                0..=i64::from(u32::MAX),
            )?,
            idempotency_key: o
                .opt_str(
                    "idempotency_key",
                    Code::EXECUTION_PLAN_IDEMPOTENCY_INVALID,
                    4096,
                )?
                .unwrap_or_default()
                .to_owned(),
            execution: ExecutionRequest::from_value(execution)?,
            expected_previous_plan_digest: previous,
        })
    }
}

/// A registered plan, as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanRecord {
    /// The task.
    pub task_id: String,
    /// The job.
    pub job_id: String,
    /// The source head the plan was made against.
    pub source_head_oid: String,
    /// The binding generation.
    pub generation: u32,
    /// The plan's idempotency key.
    pub idempotency_key: String,
    /// SHA-256 of the canonical plan material.
    pub plan_digest: String,
    /// The execution request in normal form.
    pub execution: Value,
}

/// The outcome of a registration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanRegistration {
    /// The record to keep (unchanged on a replay).
    pub record: PlanRecord,
    /// True when this was a replay of the stored plan.
    pub idempotent: bool,
    /// The envelope the plan projects to.
    pub envelope: Envelope,
}

/// Applies the registration rules: coordinates equal the binding; the plan
/// is a deterministic change or a source capture of at least one path and
/// projects to a valid envelope; the same key with the
/// same content replays, with other content conflicts; another key is a
/// replacement and must name the stored plan's digest and source head.
pub fn register_plan(
    binding: &Binding,
    request: &PlanRequest,
    existing: Option<&PlanRecord>,
) -> Result<PlanRegistration> {
    if request.task_id != binding.task_id || request.job_id != binding.job_id {
        return Err(Error::new(Code::EXECUTION_PLAN_BINDING_CONFLICT));
    }
    if request.generation != i64::from(binding.generation) {
        return Err(Error::new(Code::EXECUTION_PLAN_GENERATION_CONFLICT));
    }
    if request.source_head_oid != binding.source_head() {
        return Err(Error::new(Code::EXECUTION_PLAN_SOURCE_HEAD_CONFLICT));
    }
    if !is_key(&request.idempotency_key) {
        return Err(Error::new(Code::EXECUTION_PLAN_IDEMPOTENCY_INVALID));
    }
    if request.execution.action == Action::SourceCapture
        && request.execution.capture_paths.is_empty()
    {
        return Err(Error::with(
            Code::EXECUTION_OPERATIONS_INVALID,
            "a source capture names at least one path (capture_paths)",
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    if let Some(twice) = request
        .execution
        .capture_paths
        .iter()
        .find(|p| !seen.insert(p.as_str()))
    {
        return Err(Error::with(
            Code::EXECUTION_OPERATIONS_INVALID,
            format!("{twice}: captured twice"),
        ));
    }
    let envelope = Envelope::project(binding, &request.execution)?;
    let execution = request.execution.to_value();
    let plan_digest = digest_of(&json!({
        "task_id": binding.task_id,
        "job_id": binding.job_id,
        "source_head_oid": request.source_head_oid,
        "generation": binding.generation,
        "idempotency_key": request.idempotency_key,
        "execution": execution,
    }))?;
    if let Some(existing) = existing {
        if existing.idempotency_key == request.idempotency_key {
            if existing.plan_digest != plan_digest {
                return Err(Error::new(Code::EXECUTION_PLAN_IDEMPOTENCY_CONFLICT));
            }
            return Ok(PlanRegistration {
                record: existing.clone(),
                idempotent: true,
                envelope,
            });
        }
        if request.expected_previous_plan_digest.as_deref() != Some(existing.plan_digest.as_str()) {
            return Err(Error::new(Code::EXECUTION_PLAN_REPLACEMENT_CAS_MISMATCH));
        }
        if existing.source_head_oid != request.source_head_oid {
            return Err(Error::new(Code::EXECUTION_PLAN_STALE_REPLACEMENT_DENY));
        }
    } else if request.expected_previous_plan_digest.is_some() {
        return Err(Error::new(Code::EXECUTION_PLAN_REPLACEMENT_CAS_MISMATCH));
    }
    let record = PlanRecord {
        task_id: binding.task_id.clone(),
        job_id: binding.job_id.clone(),
        source_head_oid: request.source_head_oid.clone(),
        generation: binding.generation,
        idempotency_key: request.idempotency_key.clone(),
        plan_digest,
        execution,
    };
    Ok(PlanRegistration {
        record,
        idempotent: false,
        envelope,
    })
}

/// Re-derives the envelope of a stored plan, refusing when the record no
/// longer matches the binding (another task, job or generation) or the
/// source head has drifted.
pub fn resolve_plan(binding: &Binding, record: &PlanRecord) -> Result<Envelope> {
    if record.task_id != binding.task_id
        || record.job_id != binding.job_id
        || record.generation != binding.generation
    {
        return Err(Error::new(Code::EXECUTION_PLAN_BINDING_CONFLICT));
    }
    if record.source_head_oid != binding.source_head() {
        return Err(Error::new(Code::EXECUTION_PLAN_SOURCE_HEAD_DRIFT));
    }
    let request = ExecutionRequest::from_value(&record.execution)
        .map_err(|e| Error::with(Code::EXECUTION_PLAN_RECORD_INVALID, e.to_string()))?;
    Envelope::project(binding, &request)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::binding::tests::{HEAD, binding_json};
    use crate::envelope::tests::deterministic_request;

    fn binding() -> Binding {
        Binding::from_value(&binding_json()).unwrap()
    }

    pub fn plan_json() -> Value {
        json!({
            "schema": PLAN_SCHEMA, "task_id": "task-plan-a", "job_id": "job-plan-a",
            "source_head_oid": HEAD, "generation": 1, "idempotency_key": "plan-task-a-v1",
            "execution": deterministic_request(),
        })
    }

    fn register(v: &Value, existing: Option<&PlanRecord>) -> Result<PlanRegistration> {
        register_plan(&binding(), &PlanRequest::from_value(v)?, existing)
    }

    #[test]
    fn register_and_resolve() {
        let created = register(&plan_json(), None).unwrap();
        assert!(!created.idempotent);
        let env = resolve_plan(&binding(), &created.record).unwrap();
        assert_eq!(env, created.envelope);
        assert_eq!(env.action, Action::Deterministic);
    }

    #[test]
    fn same_key_same_content_is_an_idempotent_replay() {
        let first = register(&plan_json(), None).unwrap();
        let second = register(&plan_json(), Some(&first.record)).unwrap();
        assert!(second.idempotent);
        assert_eq!(second.record.plan_digest, first.record.plan_digest);
    }

    #[test]
    fn same_key_other_content_is_an_idempotency_conflict() {
        let first = register(&plan_json(), None).unwrap();
        let mut v = plan_json();
        v["execution"]["change_set"][0]["content"] = json!("x=2\n");
        assert_eq!(
            register(&v, Some(&first.record)).unwrap_err().code,
            Code::EXECUTION_PLAN_IDEMPOTENCY_CONFLICT
        );
    }

    #[test]
    fn replacement_requires_cas_on_previous_digest() {
        let first = register(&plan_json(), None).unwrap();
        let mut v = plan_json();
        v["idempotency_key"] = json!("plan-task-a-v2");
        v["execution"]["change_set"][0]["content"] = json!("x=2\n");
        assert_eq!(
            register(&v, Some(&first.record)).unwrap_err().code,
            Code::EXECUTION_PLAN_REPLACEMENT_CAS_MISMATCH
        );
        v["expected_previous_plan_digest"] = json!("f".repeat(64));
        assert_eq!(
            register(&v, Some(&first.record)).unwrap_err().code,
            Code::EXECUTION_PLAN_REPLACEMENT_CAS_MISMATCH
        );
        v["expected_previous_plan_digest"] = json!(first.record.plan_digest);
        let second = register(&v, Some(&first.record)).unwrap();
        assert_ne!(second.record.plan_digest, first.record.plan_digest);
        // A first registration that names a previous digest is refused too.
        assert_eq!(
            register(&v, None).unwrap_err().code,
            Code::EXECUTION_PLAN_REPLACEMENT_CAS_MISMATCH
        );
    }

    #[test]
    fn stale_replacement_is_denied() {
        let first = register(&plan_json(), None).unwrap();
        let mut stale = first.record.clone();
        stale.source_head_oid = "e".repeat(40);
        let mut v = plan_json();
        v["idempotency_key"] = json!("plan-task-a-v2");
        v["expected_previous_plan_digest"] = json!(stale.plan_digest);
        assert_eq!(
            register(&v, Some(&stale)).unwrap_err().code,
            Code::EXECUTION_PLAN_STALE_REPLACEMENT_DENY
        );
    }

    #[test]
    fn source_head_drift_is_denied_on_resolve() {
        let first = register(&plan_json(), None).unwrap();
        let mut moved = binding_json();
        moved["expected_branch_oid"] = json!("b".repeat(40));
        let moved = Binding::from_value(&moved).unwrap();
        assert_eq!(
            resolve_plan(&moved, &first.record).unwrap_err().code,
            Code::EXECUTION_PLAN_SOURCE_HEAD_DRIFT
        );
        let mut other_gen = binding_json();
        other_gen["generation"] = json!(2);
        let other_gen = Binding::from_value(&other_gen).unwrap();
        assert_eq!(
            resolve_plan(&other_gen, &first.record).unwrap_err().code,
            Code::EXECUTION_PLAN_BINDING_CONFLICT
        );
    }

    #[test]
    fn plan_coordinates_are_checked_in_order() {
        let code = |edit: fn(&mut Value)| {
            let mut v = plan_json();
            edit(&mut v);
            register(&v, None).unwrap_err().code
        };
        assert_eq!(
            code(|v| v["schema"] = json!("x")),
            Code::EXECUTION_PLAN_SCHEMA_INVALID
        );
        assert_eq!(
            code(|v| v["task_id"] = json!("task-other")),
            Code::EXECUTION_PLAN_BINDING_CONFLICT
        );
        assert_eq!(
            code(|v| v["job_id"] = json!("job-other")),
            Code::EXECUTION_PLAN_BINDING_CONFLICT
        );
        assert_eq!(
            code(|v| v["generation"] = json!(2)),
            Code::EXECUTION_PLAN_GENERATION_CONFLICT
        );
        assert_eq!(
            code(|v| v["source_head_oid"] = json!("a".repeat(40))),
            Code::EXECUTION_PLAN_SOURCE_HEAD_CONFLICT
        );
        assert_eq!(
            code(|v| v["idempotency_key"] = json!("short")),
            Code::EXECUTION_PLAN_IDEMPOTENCY_INVALID
        );
        assert_eq!(
            code(|v| v["execution"] = json!({"action": "source_capture"})),
            Code::EXECUTION_OPERATIONS_INVALID,
            "a capture of nothing"
        );
        assert_eq!(
            code(|v| {
                v.as_object_mut().unwrap().remove("execution");
            }),
            Code::EXECUTION_PLAN_DETERMINISTIC_REQUIRED
        );
        assert_eq!(
            code(
                |v| v["execution"] = json!({"action": "source_capture", "capture_paths": ["a.py"], "change_set": [{"operation": "delete_file", "path": "a.py"}]})
            ),
            Code::SOURCE_CAPTURE_MUTATION_DENY
        );
        let capture = register(
            &{
                let mut v = plan_json();
                v["execution"] = json!({"action": "source_capture", "capture_paths": ["src/b.py", "a.py"], "source_signals": ["look  at a"]});
                v
            },
            None,
        )
        .unwrap();
        assert_eq!(capture.envelope.action, Action::SourceCapture);
        assert!(!capture.envelope.action.mutates());
        assert_eq!(capture.envelope.source_signals, ["look at a"]);
        assert_eq!(code(|v| v["extra"] = json!(1)), Code::MESSAGE_INVALID);
    }
}

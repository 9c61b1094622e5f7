//! A planner's submission, parsed strictly.

use super::{TASK_SCHEMA, TaskSubmission};
use crate::binding::Binding;
use crate::error::{Code, Error, Result};
use crate::fields::Obj;
use crate::limits::{DEFAULT_MAX_ATTEMPTS, MAX_ATTEMPTS_CAP};
use crate::plan::PlanRequest;
use serde_json::Value;

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
}

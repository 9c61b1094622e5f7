//! The replies' free-form parts, as types.
//!
//! Every reply airlockctl gets is a typed struct of
//! [`airlock_proto::bus`] (its row's reply type), rendered from its
//! fields. A few fields are JSON the store keeps as it was written — a
//! task's stored result, its verification record, an event's actor and
//! payload, a reconciliation case's resolution — and are decoded here
//! with serde into the types they are (a [`TaskResult`]) or into the few
//! fields airlockctl shows of them, never read by string key.

use airlock_proto::task::{TaskResult, TaskView};
use serde::Deserialize;
use serde_json::Value;

/// A task's stored result, as the worker sent it (`None`: no result yet;
/// `Err`: a result this airlockctl cannot read).
pub fn result(t: &TaskView) -> Option<Result<TaskResult, String>> {
    t.result
        .as_ref()
        .filter(|r| !r.is_null())
        .map(|r| TaskResult::deserialize(r).map_err(|e| e.to_string()))
}

/// What airlockctl shows of a verification record (an admin's decision,
/// or the store's own: a lease that expired, an adopted head).
#[derive(Debug, Default, Deserialize)]
pub struct Verification {
    /// `ACCEPTED`, `REWORK`, `LEASE_EXPIRED`, …
    #[serde(default)]
    pub decision: Option<Value>,
    /// Why.
    #[serde(default)]
    pub reason: Option<Value>,
    /// Who (an admin's decision).
    #[serde(default)]
    pub actor: Option<Value>,
    /// The commit of an adopted head.
    #[serde(default)]
    pub commit_oid: Option<Value>,
}

/// A task's verification record (`None`: none yet, or not an object).
pub fn verification(t: &TaskView) -> Option<Verification> {
    t.verification
        .as_ref()
        .filter(|v| v.is_object())
        .map(|v| Verification::deserialize(v).unwrap_or_default())
}

/// Who acted, as an event records it.
#[derive(Debug, Default, Deserialize)]
pub struct Actor {
    /// `admin`, `planner`, `worker`, `owner`, `system`.
    #[serde(default)]
    pub kind: Option<Value>,
    /// `user@:1.42`, `agent:NAME …`, a system actor's name.
    #[serde(default)]
    pub name: Option<Value>,
}

impl Actor {
    /// An event's actor.
    pub fn of(v: &Value) -> Actor {
        Actor::deserialize(v).unwrap_or_default()
    }
}

/// What airlockctl shows of an event's payload. A field present as
/// `null` is kept as such (it is shown as `-`, and hides the next one).
#[derive(Debug, Default, Deserialize)]
pub struct Payload {
    /// A refusal's detail.
    #[serde(default, deserialize_with = "present")]
    pub detail: Option<Value>,
    /// A decision's reason.
    #[serde(default, deserialize_with = "present")]
    pub reason: Option<Value>,
    /// The state a change ended in.
    #[serde(default, deserialize_with = "present")]
    pub state: Option<Value>,
}

/// A field that is there, `null` included.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

impl Payload {
    /// An event's payload.
    pub fn of(v: &Value) -> Payload {
        Payload::deserialize(v).unwrap_or_default()
    }
}

/// An administrator's resolution of a reconciliation case.
#[derive(Debug, Default, Deserialize)]
pub struct Resolution {
    /// `adopt` or `fail`.
    #[serde(default)]
    pub resolution: Option<Value>,
    /// Who.
    #[serde(default)]
    pub actor: Option<Value>,
    /// Why.
    #[serde(default)]
    pub reason: Option<Value>,
}

/// A case's resolution (`None`: not resolved, or not an object).
pub fn resolution(v: Option<&Value>) -> Option<Resolution> {
    v.filter(|v| v.is_object())
        .map(|v| Resolution::deserialize(v).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn free_form_parts_decode_to_what_is_shown() {
        let a = Actor::of(&json!({"kind": "admin", "uid": 0, "name": "root@:1.4"}));
        assert_eq!(a.kind, Some(json!("admin")));
        assert_eq!(a.name, Some(json!("root@:1.4")));
        let p = Payload::of(&json!({"detail": "why", "other": 1}));
        assert_eq!(p.detail, Some(json!("why")));
        assert!(p.reason.is_none() && p.state.is_none());
        let p = Payload::of(&json!({"detail": null, "reason": "r"}));
        assert_eq!(p.detail, Some(Value::Null), "a null detail is there");
        // Not an object: nothing to show, not an error.
        assert!(Payload::of(&json!(null)).detail.is_none());
        let r = resolution(Some(
            &json!({"resolution": "adopt", "actor": "root", "reason": "ok"}),
        ))
        .unwrap();
        assert_eq!(r.resolution, Some(json!("adopt")));
        assert!(resolution(Some(&json!(null))).is_none());
    }
}

//! The append-only event log: writing allowed and denied events.

use super::tx::{NewEvent, Tx};
use super::{Actor, EventOutcome, MAX_DENIAL_DETAIL_LEN};
use crate::error::StoreResult;
use airlock_proto::Code;
use airlock_proto::binding::is_task_id;
use airlock_proto::canonical::to_canonical_string;
use serde_json::Value;

/// An event's outcome and, for a denial, its code.
type Verdict = (EventOutcome, Option<Code>);

const ALLOWED: Verdict = (EventOutcome::Allowed, None);

/// Appends an `allowed` event inside the caller's transaction.
pub(super) fn append_allowed(
    tx: &mut dyn Tx,
    task_id: &str,
    actor: &Actor,
    action: &str,
    payload: Value,
) -> StoreResult<()> {
    insert(tx, Some(task_id), actor, action, ALLOWED, &payload)
}

/// Appends an `allowed` event about no task (a planner agent's change).
pub(super) fn append_allowed_untasked(
    tx: &mut dyn Tx,
    actor: &Actor,
    action: &str,
    payload: Value,
) -> StoreResult<()> {
    insert(tx, None, actor, action, ALLOWED, &payload)
}

/// Appends a `denied` event. The task id is kept only when well formed (a
/// refusal may be about a garbage id) and the detail is bounded. `extra`
/// (an object, or `Value::Null` for none) adds more facts to the payload
/// beside the detail; a `detail` key in it is ignored.
pub(super) fn append_denial(
    tx: &mut dyn Tx,
    task_id: Option<&str>,
    actor: &Actor,
    action: &str,
    code: Code,
    detail: &str,
    extra: Value,
) -> StoreResult<()> {
    let task_id = task_id.filter(|t| is_task_id(t));
    let mut payload = match extra {
        Value::Object(map) => map,
        _ => serde_json::Map::new(),
    };
    payload.insert(
        "detail".to_owned(),
        Value::String(bounded(detail, MAX_DENIAL_DETAIL_LEN).to_owned()),
    );
    let denied = (EventOutcome::Denied, Some(code));
    insert(tx, task_id, actor, action, denied, &Value::Object(payload))
}

pub(super) fn bounded(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn insert(
    tx: &mut dyn Tx,
    task_id: Option<&str>,
    actor: &Actor,
    action: &str,
    (outcome, code): Verdict,
    payload: &Value,
) -> StoreResult<()> {
    // Every event passes here, so every event is redacted here: reasons,
    // denial details and anything else a caller's words reach — but never
    // the task's own id (nor a ref that is that id under a prefix, such as
    // a publication's `refs/heads/agent/…`).
    let redactor = airlock_proto::redact::Redactor::new().with_known_all(task_id);
    let payload_json = to_canonical_string(&redactor.value(payload))?;
    let actor = Actor {
        kind: actor.kind,
        uid: actor.uid,
        name: bounded(&actor.name, 256).to_owned(),
    };
    tx.append_event(&NewEvent {
        task_id,
        actor: &actor,
        action: bounded(action, 128),
        outcome,
        code,
        payload_json: &payload_json,
    })
}

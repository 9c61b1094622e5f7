//! The append-only event log: writing allowed and denied events, reading them.

use super::{Actor, ActorKind, Event, EventOutcome, MAX_DENIAL_DETAIL_LEN};
use airlock_proto::binding::is_task_id;
use airlock_proto::canonical::to_canonical_string;
use airlock_proto::{Code, Error};
use airlock_sqlite::error::{StoreError, StoreResult};
use rusqlite::{Connection, params};
use serde_json::{Value, json};

/// Appends an `allowed` event inside the caller's transaction.
pub(super) fn append_allowed(
    conn: &Connection,
    now: i64,
    task_id: &str,
    actor: &Actor,
    action: &str,
    payload: Value,
) -> StoreResult<()> {
    insert(
        conn,
        now,
        Some(task_id),
        actor,
        action,
        EventOutcome::Allowed,
        None,
        &payload,
    )
}

/// Appends a `denied` event. The task id is kept only when well formed (a
/// refusal may be about a garbage id) and the detail is bounded.
pub(super) fn append_denial(
    conn: &Connection,
    now: i64,
    task_id: Option<&str>,
    actor: &Actor,
    action: &str,
    code: Code,
    detail: &str,
) -> StoreResult<()> {
    let task_id = task_id.filter(|t| is_task_id(t));
    let payload = json!({ "detail": bounded(detail, MAX_DENIAL_DETAIL_LEN) });
    insert(
        conn,
        now,
        task_id,
        actor,
        action,
        EventOutcome::Denied,
        Some(code),
        &payload,
    )
}

fn bounded(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[allow(clippy::too_many_arguments)]
fn insert(
    conn: &Connection,
    now: i64,
    task_id: Option<&str>,
    actor: &Actor,
    action: &str,
    outcome: EventOutcome,
    code: Option<Code>,
    payload: &Value,
) -> StoreResult<()> {
    // Every event passes here, so every event is redacted here: reasons,
    // denial details and anything else a caller's words reach.
    let payload = to_canonical_string(&airlock_proto::redact::value(payload))?;
    conn.execute(
        "INSERT INTO events (task_id, at_ms, actor_kind, actor_uid, actor_name, action, outcome, \
         code, payload_json) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        params![
            task_id,
            now,
            actor.kind.as_str(),
            actor.uid,
            bounded(&actor.name, 256),
            bounded(action, 128),
            outcome.as_str(),
            code.map(Code::as_str),
            payload,
        ],
    )
    .map_err(|e| StoreError::sqlite("appending an event", e))?;
    Ok(())
}

/// Reads events in id order.
pub(super) fn list(
    conn: &Connection,
    task_id: Option<&str>,
    after_event_id: i64,
    limit: u32,
) -> StoreResult<Vec<Event>> {
    type Raw = (
        i64,
        Option<String>,
        i64,
        String,
        Option<u32>,
        String,
        String,
        String,
        Option<String>,
        String,
    );
    let mut stmt = conn
        .prepare(
            "SELECT id, task_id, at_ms, actor_kind, actor_uid, actor_name, action, outcome, code, \
             payload_json FROM events WHERE (?1 IS NULL OR task_id = ?1) AND id > ?2 \
             ORDER BY id LIMIT ?3",
        )
        .map_err(|e| StoreError::sqlite("reading events", e))?;
    let rows: Vec<Raw> = stmt
        .query_map(params![task_id, after_event_id, limit], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
                r.get(6)?,
                r.get(7)?,
                r.get(8)?,
                r.get(9)?,
            ))
        })
        .and_then(|rows| rows.collect())
        .map_err(|e| StoreError::sqlite("reading events", e))?;
    rows.into_iter()
        .map(
            |(id, task_id, at_ms, kind, uid, name, action, outcome, code, payload)| {
                let bad = |what: &str| -> StoreError {
                    Error::with(Code::STORE_CORRUPT, format!("event {id}: bad {what}")).into()
                };
                let kind = ActorKind::parse(&kind).ok_or_else(|| bad("actor kind"))?;
                let outcome = match outcome.as_str() {
                    "allowed" => EventOutcome::Allowed,
                    "denied" => EventOutcome::Denied,
                    _ => return Err(bad("outcome")),
                };
                let code = match code {
                    None => None,
                    Some(c) => Some(Code::from_name(&c).ok_or_else(|| bad("code"))?),
                };
                let payload = serde_json::from_str(&payload).map_err(|_| bad("payload"))?;
                Ok(Event {
                    id,
                    task_id,
                    at_ms,
                    actor: Actor { kind, uid, name },
                    action,
                    outcome,
                    code,
                    payload,
                })
            },
        )
        .collect()
}

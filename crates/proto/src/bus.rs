//! The D-Bus contract of `org.airlock.Supervisor1`, declared once.
//!
//! Every bus name, object path, interface and method name that the
//! supervisor serves and its clients call is a constant here, and every
//! reply that is not a plain value is a typed struct, so a server handler
//! and its client stub agree by construction: both name the same constant
//! and (de)serialise the same struct. `services/supervisor/tests/contract.rs`
//! introspects the running supervisor and checks it against [`INTERFACES`].
//!
//! | interface | method | in | out | admitted by |
//! |---|---|---|---|---|
//! | [`tasks::INTERFACE`] | `SubmitTask` | `s` submission JSON | `s` [`SubmitReply`] | polkit `tasks.submit` |
//! | | `ReplacePlan` | `s` task id, `s` plan JSON | `s` [`TaskView`] | polkit `tasks.submit` |
//! | | `GetTask` | `s` task id | `s` [`TaskView`] | polkit `tasks.read` |
//! | | `ListTasks` | `s` state or `""`, `s` after task id or `""`, `u` limit | `s` [`TaskPage`] | polkit `tasks.read` |
//! | | `ListEvents` | `s` task id or `""`, `x` after event id, `u` limit | `s` [`EventPage`] | polkit `tasks.read` |
//! | | `CancelTask` | `s` task id, `s` [`DecisionRequest`] JSON (`cancel`) | `s` [`DecisionOutcome`] | polkit `tasks.manage` |
//! | | `Verify` | `s` task id, `s` [`DecisionRequest`] JSON (`accept`, `rework`, `reject`) | `s` [`DecisionOutcome`] | polkit `tasks.manage` |
//! | [`worker::INTERFACE`] | `Claim` | | `s` [`ClaimGrant`] or `null` | peer uid = `supervisor.worker_user` |
//! | | `Renew` | [`LeaseRef`] as `s` `t` `s` | `x` new expiry (unix ms) | peer uid = `supervisor.worker_user` |
//! | | `SubmitResult` | [`LeaseRef`] as `s` `t` `s`, `s` key, `s` result JSON | `s` [`ResultReceipt`] | peer uid = `supervisor.worker_user` |
//! | | `TakeAdoption` | | `s` [`AdoptionCheck`] or `null` | peer uid = `supervisor.worker_user` |
//! | | `SettleAdoption` | `s` [`AdoptionReport`] JSON | `s` [`ReconciliationCase`] | peer uid = `supervisor.worker_user` |
//! | [`reconcile::INTERFACE`] | `ListReconciliations` | `s` status or `""`, `s` after task id or `""`, `u` limit | `s` [`ReconciliationPage`] | polkit `tasks.read` |
//! | | `GetReconciliation` | `s` task id | `s` [`ReconciliationCase`] (the task's latest) | polkit `tasks.read` |
//! | | `ResolveReconciliation` | `s` task id, `s` [`ResolveRequest`] JSON | `s` [`ResolveOutcome`] | polkit `reconcile.manage` |
//! | [`retry::INTERFACE`] | `ExtendRetry` | `s` task id, `s` request JSON, `s` owner id | `s` [`RetryExtensionOutcome`] | peer uid = `retry.user` |
//! | [`agents::INTERFACE`] | `ListAgents` | | `s` [`AgentList`] | polkit `agents.read` |
//! | | `GetAgent` | `s` name | `s` [`AgentView`] | polkit `agents.read` |
//! | | `StartAgent` | `s` name | `s` [`AgentView`] | polkit `agents.manage` |
//! | | `StopAgent` | `s` name | `s` [`AgentView`] | polkit `agents.manage` |
//! | | `ClearHold` | `s` name | `s` [`AgentView`] | polkit `agents.manage` |
//!
//! airlock-local serves [`agent_host`] to the supervisor alone (peer uid):
//! `Start` (`u` the agent's session id), `Probe` (`s` [`AgentLiveness`])
//! and `Stop`, each taking `s` name.
//!
//! [`DecisionRequest`]: crate::task::DecisionRequest
//! [`AdoptionCheck`]: crate::reconcile::AdoptionCheck
//! [`AdoptionReport`]: crate::reconcile::AdoptionReport
//! [`ReconciliationCase`]: crate::reconcile::ReconciliationCase
//! [`ReconciliationPage`]: crate::reconcile::ReconciliationPage
//! [`ResolveRequest`]: crate::reconcile::ResolveRequest
//! [`ResolveOutcome`]: crate::reconcile::ResolveOutcome
//! [`DecisionOutcome`]: crate::task::DecisionOutcome
//!
//! A refusal is a D-Bus error named by [`Code::dbus_error_name`], with the
//! human detail as its message; [`Code::from_dbus_error_name`] maps it back.

use crate::retry::RetryExtensionOutcome;
use crate::task::{ClaimGrant, TaskView};
use crate::{Code, Error};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The protocol this build speaks, `(major, minor)`; see
/// `docs/protocol.md` for what bumps which. The supervisor shows it as the
/// `Tasks1.ProtocolVersion` property (`"major.minor"`); clients check it
/// before their first call ([`check_protocol`]).
pub const PROTOCOL_VERSION: (u32, u32) = (6, 2);

/// `"major.minor"`.
pub fn protocol_string(v: (u32, u32)) -> String {
    format!("{}.{}", v.0, v.1)
}

/// Whether a client speaking `client` may talk to a supervisor speaking
/// `server` (`"major.minor"`): the majors must be equal; any minor works
/// (a client one minor behind uses a subset; one ahead must not use what
/// the supervisor lacks, and the newer minor's additions are optional by
/// the bump rules). A different major, or a version that does not parse,
/// is `PROTOCOL_VERSION_MISMATCH` naming both.
pub fn check_protocol(client: (u32, u32), server: &str) -> Result<(), Error> {
    let parsed = server
        .split_once('.')
        .and_then(|(a, b)| Some((a.parse::<u32>().ok()?, b.parse::<u32>().ok()?)));
    match parsed {
        Some((major, _)) if major == client.0 => Ok(()),
        _ => Err(Error::with(
            Code::PROTOCOL_VERSION_MISMATCH,
            format!(
                "this client speaks airlock bus protocol {}, the supervisor speaks {server:?}; use an airlockctl or library of the supervisor's major version",
                protocol_string(client)
            ),
        )),
    }
}

/// The supervisor's well-known name.
pub const BUS_NAME: &str = "org.airlock.Supervisor1";
/// Its one object.
pub const OBJECT_PATH: &str = "/org/airlock/Supervisor1";
/// Page size when a caller passes a limit of 0.
pub const DEFAULT_PAGE: u32 = 100;

/// `org.airlock.Tasks1`: admins and planners, authorised by polkit.
pub mod tasks {
    /// The interface.
    pub const INTERFACE: &str = "org.airlock.Tasks1";
    /// Submit a task.
    pub const SUBMIT_TASK: &str = "SubmitTask";
    /// Replace a queued task's plan (CAS on the previous plan's digest).
    pub const REPLACE_PLAN: &str = "ReplacePlan";
    /// Read one task.
    pub const GET_TASK: &str = "GetTask";
    /// Page through tasks.
    pub const LIST_TASKS: &str = "ListTasks";
    /// Page through the event log.
    pub const LIST_EVENTS: &str = "ListEvents";
    /// Cancel a task that is not terminal.
    pub const CANCEL_TASK: &str = "CancelTask";
    /// Decide on a VERIFYING task.
    pub const VERIFY: &str = "Verify";
    /// Signal: `s` task id, `s` state, `x` revision.
    pub const TASK_CHANGED: &str = "TaskChanged";
    /// Property: the protocol the supervisor speaks, `"major.minor"`.
    pub const PROTOCOL_VERSION: &str = "ProtocolVersion";
    /// Methods, in declaration order.
    pub const METHODS: &[&str] = &[
        SUBMIT_TASK,
        REPLACE_PLAN,
        GET_TASK,
        LIST_TASKS,
        LIST_EVENTS,
        CANCEL_TASK,
        VERIFY,
    ];
}

/// `org.airlock.Worker1`: the worker only, admitted by its peer uid.
pub mod worker {
    /// The interface.
    pub const INTERFACE: &str = "org.airlock.Worker1";
    /// Claim the next task under a fresh lease.
    pub const CLAIM: &str = "Claim";
    /// Extend a lease.
    pub const RENEW: &str = "Renew";
    /// Submit an attempt's result.
    pub const SUBMIT_RESULT: &str = "SubmitResult";
    /// Take a reconciliation case an administrator chose to adopt, to
    /// check the ref (`null` when none waits).
    pub const TAKE_ADOPTION: &str = "TakeAdoption";
    /// Report what the ref holds for an adoption taken.
    pub const SETTLE_ADOPTION: &str = "SettleAdoption";
    /// Methods, in declaration order.
    pub const METHODS: &[&str] = &[CLAIM, RENEW, SUBMIT_RESULT, TAKE_ADOPTION, SETTLE_ADOPTION];
}

/// `org.airlock.Reconcile1`: reconciliation cases (an attempt whose branch
/// moved behind the worker's back); admins, authorised by polkit.
pub mod reconcile {
    /// The interface.
    pub const INTERFACE: &str = "org.airlock.Reconcile1";
    /// Page through cases.
    pub const LIST_RECONCILIATIONS: &str = "ListReconciliations";
    /// A task's latest case.
    pub const GET_RECONCILIATION: &str = "GetReconciliation";
    /// Adopt the observed head or fail the task, exactly once.
    pub const RESOLVE_RECONCILIATION: &str = "ResolveReconciliation";
    /// Methods, in declaration order.
    pub const METHODS: &[&str] = &[
        LIST_RECONCILIATIONS,
        GET_RECONCILIATION,
        RESOLVE_RECONCILIATION,
    ];
}

/// `org.airlock.Retry1`: airlock-retryd only, admitted by its peer uid.
pub mod retry {
    /// The interface.
    pub const INTERFACE: &str = "org.airlock.Retry1";
    /// Grant a FAILED, exhausted task one more attempt (the store's
    /// compare-and-swap transaction).
    pub const EXTEND_RETRY: &str = "ExtendRetry";
    /// Methods, in declaration order.
    pub const METHODS: &[&str] = &[EXTEND_RETRY];
}

/// `org.airlock.Agents1`: the planner agents the supervisor runs;
/// admins, authorised by polkit.
pub mod agents {
    /// The interface.
    pub const INTERFACE: &str = "org.airlock.Agents1";
    /// Every configured agent with its state.
    pub const LIST_AGENTS: &str = "ListAgents";
    /// One agent with its state.
    pub const GET_AGENT: &str = "GetAgent";
    /// Start a stopped agent (refused while held: AGENTOS_CRASH_LOOP).
    pub const START_AGENT: &str = "StartAgent";
    /// Stop an agent (never counted as a failure).
    pub const STOP_AGENT: &str = "StopAgent";
    /// Clear a hold: the count resets and the agent starts.
    pub const CLEAR_HOLD: &str = "ClearHold";
    /// Signal: `s` agent name, `s` state, `u` consecutive failures.
    pub const AGENT_CHANGED: &str = "AgentChanged";
    /// Methods, in declaration order.
    pub const METHODS: &[&str] = &[LIST_AGENTS, GET_AGENT, START_AGENT, STOP_AGENT, CLEAR_HOLD];
}

/// `org.airlock.AgentHost1`: served by airlock-local (root) for the
/// supervisor where there is no systemd; starts, probes and stops agent
/// processes by name (the process driver). Admitted by the caller's uid:
/// the supervisor's only. Not part of `INTERFACES` (another process
/// serves it, under its own name).
pub mod agent_host {
    /// The well-known name.
    pub const BUS_NAME: &str = "org.airlock.AgentHost1";
    /// The object.
    pub const OBJECT_PATH: &str = "/org/airlock/AgentHost1";
    /// The interface.
    pub const INTERFACE: &str = "org.airlock.AgentHost1";
    /// `s` name → `u` the session the agent leads (its leader's pid; 0:
    /// none): start the configured agent.
    pub const START: &str = "Start";
    /// `s` name → `s` [`super::AgentLiveness`].
    pub const PROBE: &str = "Probe";
    /// `s` name → nothing: stop it and its process group.
    pub const STOP: &str = "Stop";
    /// Methods, in declaration order.
    pub const METHODS: &[&str] = &[START, PROBE, STOP];
}

/// Every interface the supervisor serves with its methods.
pub const INTERFACES: &[(&str, &[&str])] = &[
    (tasks::INTERFACE, tasks::METHODS),
    (worker::INTERFACE, worker::METHODS),
    (retry::INTERFACE, retry::METHODS),
    (agents::INTERFACE, agents::METHODS),
    (reconcile::INTERFACE, reconcile::METHODS),
];

/// One planner agent as `GetAgent` and `ListAgents` show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentView {
    /// Its name (`[[agent]] name`).
    pub name: String,
    /// `STOPPED`, `STARTING`, `RUNNING`, `BACKOFF` or `HELD`.
    pub state: String,
    /// Consecutive failures since the last reset.
    pub consecutive_failures: u32,
    /// With `BACKOFF`: when it starts again (unix ms).
    pub next_start_at_ms: Option<u64>,
    /// With `RUNNING`: since when (unix ms).
    pub running_since_ms: Option<u64>,
    /// The last failure's exit status, when it exited.
    pub last_exit_status: Option<i32>,
    /// The last failure's signal, when a signal ended it.
    pub last_exit_signal: Option<i32>,
    /// The last failure's reason (a failed start, a timed-out call).
    pub last_failure: Option<String>,
    /// With `HELD`: why.
    pub hold_reason: Option<String>,
    /// The repositories it may propose for.
    pub repositories: Vec<String>,
    /// When its record last changed (unix ms).
    pub updated_at_ms: u64,
}

/// `ListAgents`'s reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentList {
    /// Every configured agent, by name.
    pub agents: Vec<AgentView>,
}

/// `AgentHost1.Probe`'s reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentLiveness {
    /// Whether it runs.
    pub alive: bool,
    /// Its exit status, when it exited.
    pub exit_status: Option<i32>,
    /// The signal that ended it.
    pub exit_signal: Option<i32>,
    /// What else is known.
    pub reason: String,
}

/// The lease a worker holds on one attempt: every call after a claim names
/// it, and the supervisor fences on all three parts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseRef {
    /// The task.
    pub task_id: String,
    /// The fencing epoch the claim returned.
    pub lease_epoch: u64,
    /// The bearer secret the claim returned (only its SHA-256 is stored).
    pub lease_token: String,
}

impl LeaseRef {
    /// The lease a claim granted.
    pub fn of(grant: &ClaimGrant) -> Self {
        LeaseRef {
            task_id: grant.task_id.clone(),
            lease_epoch: grant.lease_epoch,
            lease_token: grant.lease_token.clone(),
        }
    }
}

impl std::fmt::Display for LeaseRef {
    /// Never shows the token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (epoch {})", self.task_id, self.lease_epoch)
    }
}

/// `SubmitTask`'s reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitReply {
    /// The task as stored.
    pub task: TaskView,
    /// True when an identical submission had been made before.
    pub idempotent: bool,
}

/// `SubmitResult`'s reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResultReceipt {
    /// The task after the result.
    pub task: TaskView,
    /// True when this exact result had been accepted before (a replay).
    pub idempotent: bool,
}

/// `ListTasks`'s reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskPage {
    /// Up to `limit` tasks, ordered by task id.
    pub tasks: Vec<TaskView>,
    /// Pass as `after` for the next page; `None` when this one was short.
    pub next_after: Option<String>,
}

/// One entry of the event log as the bus shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventRecord {
    /// Increasing id.
    pub id: i64,
    /// The task, when the event concerns one.
    pub task_id: Option<String>,
    /// When (store time, unix ms).
    pub at_ms: i64,
    /// Who: `kind` (admin, planner, worker, owner, system), `uid`, `name`.
    pub actor: Value,
    /// What (an action name).
    pub action: String,
    /// `allowed` or `denied`.
    pub outcome: String,
    /// The refusal code of a denied event.
    pub code: Option<String>,
    /// Details; never a secret.
    pub payload: Value,
}

/// `ListEvents`'s reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventPage {
    /// Up to `limit` events, oldest first.
    pub events: Vec<EventRecord>,
    /// Pass as `after` for the next page.
    pub next_after: i64,
}

/// Serialises a reply for the wire.
pub fn encode<T: Serialize>(reply: &T) -> Result<String, Error> {
    serde_json::to_string(reply)
        .map_err(|e| Error::with(Code::INTERNAL, format!("serialising a reply: {e}")))
}

/// Parses a reply from the wire: a missing or unknown field is a
/// `MESSAGE_INVALID` error, never a default.
pub fn decode<T: serde::de::DeserializeOwned>(method: &str, text: &str) -> Result<T, Error> {
    serde_json::from_str(text).map_err(|e| {
        Error::with(
            Code::MESSAGE_INVALID,
            format!("the supervisor's {method} reply does not parse: {e}"),
        )
    })
}

/// The reply type of `ExtendRetry`.
pub type RetryReply = RetryExtensionOutcome;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_well_formed() {
        let mut seen = std::collections::BTreeSet::new();
        for (iface, methods) in INTERFACES {
            assert!(iface.starts_with("org.airlock.") && iface.ends_with('1'));
            for m in *methods {
                assert!(m.chars().next().unwrap().is_ascii_uppercase(), "{m}");
                assert!(m.chars().all(|c| c.is_ascii_alphanumeric()), "{m}");
                assert!(seen.insert((*iface, *m)), "{iface}.{m} twice");
            }
        }
    }

    #[test]
    fn a_missing_field_is_a_decode_error_not_a_default() {
        let e = decode::<EventPage>("ListEvents", r#"{"events": []}"#).unwrap_err();
        assert_eq!(e.code, Code::MESSAGE_INVALID);
        let e = decode::<EventPage>("ListEvents", r#"{"events": [], "next_after": 1, "x": 1}"#)
            .unwrap_err();
        assert_eq!(e.code, Code::MESSAGE_INVALID);
        let ok: EventPage = decode("ListEvents", r#"{"events": [], "next_after": 7}"#).unwrap();
        assert_eq!(ok.next_after, 7);
    }

    #[test]
    fn only_the_major_version_must_agree() {
        assert!(check_protocol((1, 0), "1.1").is_ok());
        assert!(check_protocol((1, 1), "1.0").is_ok());
        for server in ["2.0", "0.9", "1", "x.y", ""] {
            let e = check_protocol((1, 1), server).unwrap_err();
            assert_eq!(e.code, Code::PROTOCOL_VERSION_MISMATCH);
            let text = e.to_string();
            assert!(text.contains("1.1") && text.contains(server), "{text}");
        }
    }

    #[test]
    fn a_lease_never_shows_its_token() {
        let l = LeaseRef {
            task_id: "t".into(),
            lease_epoch: 3,
            lease_token: "secret-token".into(),
        };
        assert!(!l.to_string().contains("secret"));
    }
}

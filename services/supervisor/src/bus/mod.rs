//! The D-Bus face of the supervisor: `org.airlock.Supervisor1` at
//! `/org/airlock/Supervisor1` with three interfaces — `Tasks1` (people,
//! polkit), `Worker1` (the worker's uid) and `Retry1` (airlock-retryd's
//! uid). The contract — names, arguments, reply types and who may call —
//! is declared once in [`airlock_proto::bus`]; the handlers here serve it.
//!
//! Every refusal is a D-Bus error named by the code's `dbus_error_name()`
//! with the human detail as its message ([`error::BusError`]).

pub mod agents;
pub mod caller;
pub mod error;
pub mod inflight;
pub mod reconcile;
pub mod retry;
pub mod tasks;
pub mod worker;

use crate::authz::{Caller, Gatekeeper};
use crate::ops::Ops;
use airlock_proto::limits::MAX_MESSAGE_BYTES;
use airlock_proto::{Code, Error};
use caller::CallerResolver;
use error::BusError;
use inflight::{CallGuard, InFlight};
use serde_json::Value;
use std::time::Duration;
use zbus::Connection;
use zbus::message::Header;

pub use airlock_proto::bus::{BUS_NAME, DEFAULT_PAGE, OBJECT_PATH};

/// Names of operations in the event log. Mutations use the store's action
/// names; reads, which the store does not log when allowed, have their own
/// so that a refused read is still on record.
pub mod event {
    pub use airlock_taskdb::tasks::action::*;
    /// GetTask.
    pub const TASK_READ: &str = "TASK_READ";
    /// ListTasks.
    pub const TASKS_LISTED: &str = "TASKS_LISTED";
    /// ListEvents.
    pub const EVENTS_READ: &str = "EVENTS_READ";
    /// ListReconciliations, GetReconciliation.
    pub const RECONCILIATIONS_READ: &str = "RECONCILIATIONS_READ";
    /// Worker1.TakeAdoption.
    pub const ADOPTION_TAKEN: &str = "ADOPTION_TAKEN";
}

/// Facts the properties report.
#[derive(Clone, Debug)]
pub struct Info {
    /// The authoriser's name.
    pub authorizer: String,
    /// `[supervisor] auto_accept`.
    pub auto_accept: bool,
    /// `[supervisor] lease_seconds`.
    pub lease_seconds: u32,
    /// The uid Worker1 is reserved for.
    pub worker_uid: u32,
}

/// State shared by both interfaces.
#[derive(Debug)]
pub struct Shared {
    pub(crate) ops: Ops,
    pub(crate) gate: Gatekeeper,
    pub(crate) inflight: InFlight,
    pub(crate) info: Info,
    repositories: std::sync::RwLock<Vec<String>>,
    programs: std::sync::RwLock<airlock_config::ProgramTable>,
    agents: std::sync::OnceLock<std::sync::Arc<crate::agents::Agents>>,
    resolver: CallerResolver,
    call_delay: Option<Duration>,
}

impl Shared {
    /// Shared state. `repositories` are the names submissions may use.
    /// `call_delay` slows every admitted call down (tests of
    /// orderly shutdown only).
    pub fn new(
        ops: Ops,
        gate: Gatekeeper,
        info: Info,
        repositories: Vec<String>,
        call_delay: Option<Duration>,
    ) -> Self {
        Shared {
            ops,
            gate,
            inflight: InFlight::default(),
            info,
            repositories: std::sync::RwLock::new(repositories),
            programs: std::sync::RwLock::new(airlock_config::ProgramTable::from_config(
                &airlock_config::Config::default(),
            )),
            agents: std::sync::OnceLock::new(),
            resolver: CallerResolver::default(),
            call_delay,
        }
    }

    /// The repository names submissions may use now.
    pub fn repositories(&self) -> Vec<String> {
        self.repositories
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The agent runners, once started.
    pub fn set_agents(&self, agents: std::sync::Arc<crate::agents::Agents>) {
        let _ = self.agents.set(agents);
    }

    /// The planner agent `caller` is a process of, from the caller's pid
    /// as the bus daemon reported it. Under systemd: the agent whose unit
    /// (`airlock-agent@NAME.service`) systemd says the process runs in; a
    /// process cannot leave its unit's cgroup, and only root can move it
    /// into one. Under airlock-local: the running agent whose session the
    /// process is in; a session cannot be joined from outside it, so
    /// another process of the same user cannot pass for the agent, and an
    /// agent's process that left its session (`setsid`) is no longer
    /// recognised as the agent.
    pub async fn agent_of(&self, caller: &crate::authz::Caller) -> Option<airlock_config::Agent> {
        let agents = self.agents.get()?;
        agents.attribute(caller.pid()?).await.cloned()
    }

    /// Replaces the programs each repository's commands may start (at
    /// start, and on a reload).
    pub fn set_programs(&self, programs: airlock_config::ProgramTable) {
        *self
            .programs
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = programs;
    }

    /// Refuses a submission whose commands name a program its
    /// repository's commands may not start (COMMAND_PROGRAM_DENY), at
    /// submission rather than in every attempt.
    pub fn check_programs(
        &self,
        repository: &str,
        commands: &[airlock_proto::envelope::Command],
    ) -> Result<(), airlock_proto::Error> {
        self.programs
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .check(
                repository,
                commands
                    .iter()
                    .map(|c| c.argv.first().map(String::as_str).unwrap_or("")),
            )
    }

    /// Replaces the registered names (a reload).
    pub fn set_repositories(&self, names: Vec<String>) {
        *self
            .repositories
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = names;
    }

    /// Admits one call: counts it in flight (refused once shutdown began)
    /// and identifies its sender from bus-verified facts. A sender the bus
    /// does not vouch for is refused and the refusal recorded.
    pub(crate) async fn admit(
        &self,
        conn: &Connection,
        hdr: &Header<'_>,
        event: &'static str,
        task_id: Option<&str>,
    ) -> Result<(CallGuard<'_>, Caller), BusError> {
        let guard = self.inflight.enter()?;
        if let Some(d) = self.call_delay {
            tokio::time::sleep(d).await;
        }
        match self.resolver.resolve(conn, hdr).await {
            Ok(caller) => Ok((guard, caller)),
            Err(e) => {
                let sender = caller::sender_of(hdr).unwrap_or_default();
                self.gate
                    .refuse_unidentified(&sender, event, task_id, &e)
                    .await;
                Err(e.into())
            }
        }
    }
}

impl Shared {
    /// Passes `r` through, recording a refusal in the event log first.
    pub(crate) async fn checked<T, P: crate::authz::Permission>(
        &self,
        auth: &crate::authz::Authorized<P>,
        event: &'static str,
        task_id: Option<&str>,
        r: Result<T, Error>,
    ) -> Result<T, Error> {
        if let Err(e) = &r {
            self.gate.record_refusal(auth, event, task_id, e).await;
        }
        r
    }
}

/// Parses a JSON argument, refusing anything that is not JSON.
pub(crate) fn parse_json(text: &str, what: &str) -> Result<Value, Error> {
    if text.len() > MAX_MESSAGE_BYTES {
        return Err(Error::with(
            Code::FIELD_BOUNDS_EXCEEDED,
            format!("{what} is larger than {MAX_MESSAGE_BYTES} bytes"),
        ));
    }
    serde_json::from_str(text)
        .map_err(|e| Error::with(Code::MESSAGE_INVALID, format!("{what} is not JSON: {e}")))
}

/// Serialises a reply.
pub(crate) fn to_json<T: serde::Serialize>(v: &T) -> Result<String, Error> {
    serde_json::to_string(v)
        .map_err(|e| Error::with(Code::INTERNAL, format!("serialising a reply: {e}")))
}

/// `""` means none.
pub(crate) fn non_empty(s: String) -> Option<String> {
    if s.is_empty() { None } else { Some(s) }
}

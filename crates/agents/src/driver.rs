//! The driver port: what the policy needs from whatever runs agents
//! (systemd on an installed system, [`crate::process::ProcessDriver`]
//! under airlock-local, a scripted fake in tests). Three calls, each of
//! which the runner races against its call timeout and whose late answer it
//! never looks at.

use std::future::Future;

use airlock_config::Agent;

use crate::policy::Exit;

/// Why a driver call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DriverError(pub String);

/// What a liveness probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Liveness {
    /// The agent is running.
    Alive,
    /// The agent is gone, and how it ended when known.
    Gone(Exit),
    /// The agent is gone because the system is stopping the whole suite
    /// (systemd stops the agents before the supervisor, whose drain
    /// follows): no failure of the agent.
    Drained,
}

/// Start, probe and stop agents by name.
pub trait Driver: Send + Sync + 'static {
    /// Starts `agent`. Returns once it runs (or the driver knows it failed
    /// to start), with the id of the session the agent leads when the
    /// driver gives it one (the process driver: the leader's pid), by which
    /// the supervisor recognises the agent's processes as callers.
    fn start(&self, agent: &Agent)
    -> impl Future<Output = Result<Option<u32>, DriverError>> + Send;

    /// Whether the agent called `name` still runs.
    fn probe(&self, name: &str) -> impl Future<Output = Result<Liveness, DriverError>> + Send;

    /// Stops the agent called `name` and everything it started. Best
    /// effort: the runner logs a failure and goes on.
    fn stop(&self, name: &str) -> impl Future<Output = Result<(), DriverError>> + Send;
}

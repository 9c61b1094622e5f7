//! `org.airlock.Agents1`: the planner agents, for admins, authorised by
//! polkit (`org.airlock.agents.read`, `org.airlock.agents.manage`).
//!
//! Each method: enter with its row, act on the agent's runner; an
//! operator's command is recorded as an event, and the policy's resulting
//! change as another (AGENT_CHANGED), announced with `AgentChanged`.

use super::Shared;
use super::error::BusError;
use crate::agents::{AgentChange, Agents};
use crate::authz::{AgentsManage, AgentsRead};
use airlock_agents::Command;
use airlock_proto::bus::agents as rows;
use airlock_proto::bus::{AgentView, Call};
use std::sync::Arc;
use zbus::message::Header;
use zbus::object_server::SignalEmitter;
use zbus::{Connection, interface};

/// The Agents1 interface object.
#[derive(Debug)]
pub struct AgentsIface {
    shared: Arc<Shared>,
    agents: Arc<Agents>,
}

impl AgentsIface {
    /// The interface over `shared` and the runners of `agents`.
    pub fn new(shared: Arc<Shared>, agents: Arc<Agents>) -> Self {
        AgentsIface { shared, agents }
    }

    async fn command<M: Call<Reply = AgentView>>(
        &self,
        hdr: Header<'_>,
        conn: &Connection,
        name: String,
        command: Command,
    ) -> Result<String, BusError> {
        let call = self
            .shared
            .enter::<M, AgentsManage>(conn, &hdr, None)
            .await?;
        let known = self.agents.knows(&name);
        call.checked(known).await?;
        let event = call.event();
        self.shared
            .ops
            .record_agent_command(&call.auth, event, name.clone())
            .await?;
        let out = self.agents.command(&call.auth, &name, command).await;
        let view = call.checked(out).await?;
        call.reply(&view)
    }
}

#[interface(name = "org.airlock.Agents1")]
impl AgentsIface {
    /// Every configured agent with its state, as `{"agents": [...]}`.
    /// Needs `org.airlock.agents.read`.
    async fn list_agents(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<String, BusError> {
        let call = self
            .shared
            .enter::<rows::ListAgents, AgentsRead>(conn, &hdr, None)
            .await?;
        call.reply(&self.agents.list(&call.auth))
    }

    /// One agent: its state (STOPPED, STARTING, RUNNING, BACKOFF, HELD),
    /// consecutive failures, next start, last exit status and signal, the
    /// hold's reason. Needs `org.airlock.agents.read`.
    async fn get_agent(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        name: String,
    ) -> Result<String, BusError> {
        let call = self
            .shared
            .enter::<rows::GetAgent, AgentsRead>(conn, &hdr, None)
            .await?;
        let view = self.agents.view(&call.auth, &name);
        let view = call.checked(view).await?;
        call.reply(&view)
    }

    /// One agent's quotas (`tasks_per_hour`, `cpu_seconds_per_day`) and
    /// cap on running tasks (its `max_running`, else
    /// `supervisor.max_running_per_submitter`), with its use of them now
    /// as the task store counts it (on every host sharing it). Needs
    /// `org.airlock.agents.read`.
    async fn get_agent_limits(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        name: String,
    ) -> Result<String, BusError> {
        let call = self
            .shared
            .enter::<rows::GetAgentLimits, AgentsRead>(conn, &hdr, None)
            .await?;
        let known = self.agents.knows(&name);
        call.checked(known).await?;
        let out = self.shared.ops.agent_limits(&call.auth, name).await;
        let limits = call.checked(out).await?;
        call.reply(&limits)
    }

    /// Starts a stopped agent (the failure count resets); refused while
    /// held with AGENTOS_CRASH_LOOP. Needs `org.airlock.agents.manage`.
    async fn start_agent(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        name: String,
    ) -> Result<String, BusError> {
        self.command::<rows::StartAgent>(hdr, conn, name, Command::Start)
            .await
    }

    /// Stops an agent; never counted as a failure, and it stays stopped
    /// (across supervisor restarts too) until started. Needs
    /// `org.airlock.agents.manage`.
    async fn stop_agent(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        name: String,
    ) -> Result<String, BusError> {
        self.command::<rows::StopAgent>(hdr, conn, name, Command::Stop)
            .await
    }

    /// Clears a hold: the count resets and the agent starts (a no-op for
    /// an agent that is not held). Needs `org.airlock.agents.manage`.
    async fn clear_hold(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        name: String,
    ) -> Result<String, BusError> {
        self.command::<rows::ClearHold>(hdr, conn, name, Command::ClearHold)
            .await
    }

    /// Cancels the QUEUED tasks the agent `name` submitted, each CANCELLED
    /// with AGENT_REVOKED and a TASK_CANCELLED event carrying `reason`;
    /// refused with AGENT_RUNNING unless the agent is STOPPED or HELD (a
    /// name no longer configured runs nothing and is accepted: its tasks
    /// left from before a restart). A RUNNING task is the worker's and
    /// finishes or fails as it would. Needs `org.airlock.agents.manage`.
    async fn cancel_queued(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        name: String,
        reason: String,
    ) -> Result<String, BusError> {
        let call = self
            .shared
            .enter::<rows::CancelQueued, AgentsManage>(conn, &hdr, None)
            .await?;
        let checked = airlock_config::is_agent_name(&name)
            .then_some(())
            .ok_or_else(|| {
                airlock_proto::Error::with(
                    airlock_proto::Code::AGENT_NOT_FOUND,
                    format!("{name:?} is not an agent name"),
                )
            })
            .and_then(|()| {
                if self.agents.running(&name) {
                    Err(airlock_proto::Error::with(
                        airlock_proto::Code::AGENT_RUNNING,
                        format!(
                            "agent {name:?} is running: stop it first (airlockctl agent stop {name}), so that it queues no more"
                        ),
                    ))
                } else {
                    Ok(())
                }
            })
            .and_then(|()| airlock_proto::task::check_reason(&reason).map(|_| ()));
        call.checked(checked).await?;
        let out = self
            .shared
            .ops
            .cancel_agent_queued(
                name.clone(),
                None,
                reason.clone(),
                call.auth.actor().clone(),
            )
            .await;
        let cancelled = call.checked(out).await?;
        let event = call.event();
        self.shared
            .ops
            .record_agent_queue_cancelled(
                &call.auth,
                event,
                name.clone(),
                reason,
                cancelled.clone(),
            )
            .await?;
        call.reply(&airlock_proto::bus::AgentQueueCancelled { name, cancelled })
    }

    /// An agent's state changed: its name, state and consecutive failures.
    #[zbus(signal)]
    pub async fn agent_changed(
        emitter: &SignalEmitter<'_>,
        name: &str,
        state: &str,
        consecutive_failures: u32,
    ) -> zbus::Result<()>;
}

/// Announces each change the agent runners send as `AgentChanged`, until
/// every sender is gone or `stop` turns true; then what is already queued
/// (the drain's own changes) is announced and it returns. A signal that
/// cannot be emitted is logged: the change is already stored.
pub async fn announce(
    mut changes: tokio::sync::mpsc::UnboundedReceiver<AgentChange>,
    emitter: SignalEmitter<'static>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let emit = |c: AgentChange| {
        let emitter = emitter.clone();
        async move {
            let sent =
                AgentsIface::agent_changed(&emitter, &c.name, c.state, c.consecutive_failures)
                    .await;
            if let Err(e) = sent {
                tracing::warn!("could not emit AgentChanged for {}: {e}", c.name);
            }
        }
    };
    loop {
        tokio::select! {
            c = changes.recv() => match c {
                Some(c) => emit(c).await,
                None => return,
            },
            changed = stop.changed() => {
                let stopping = changed.is_err() || *stop.borrow();
                if stopping {
                    break;
                }
            }
        }
    }
    while let Ok(c) = changes.try_recv() {
        emit(c).await;
    }
}

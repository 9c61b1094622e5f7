//! `org.airlock.Agents1`: the planner agents, for admins, authorised by
//! polkit (`org.airlock.agents.read`, `org.airlock.agents.manage`).
//!
//! Each method: admit the call, identify the sender, authorise (a token
//! or a recorded refusal), act on the agent's runner; an operator's
//! command is recorded as an event, and the policy's resulting change as
//! another (AGENT_CHANGED), announced with `AgentChanged`.

use super::error::BusError;
use super::{Shared, to_json};
use crate::agents::Agents;
use crate::authz::{AgentsManage, AgentsRead};
use airlock_agents::Command;
use std::sync::Arc;
use zbus::message::Header;
use zbus::object_server::SignalEmitter;
use zbus::{Connection, interface};

/// Names of agent operations in the event log.
pub mod event {
    pub use airlock_taskdb::tasks::action::{
        AGENT_CHANGED, AGENT_HOLD_CLEARED, AGENT_START_REQUESTED, AGENT_STOP_REQUESTED,
    };
    /// ListAgents, GetAgent.
    pub const AGENTS_READ: &str = "AGENTS_READ";
}

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

    async fn command(
        &self,
        hdr: Header<'_>,
        conn: &Connection,
        name: String,
        command: Command,
        ev: &'static str,
    ) -> Result<String, BusError> {
        let (_call, caller) = self.shared.admit(conn, &hdr, ev, None).await?;
        let auth = self
            .shared
            .gate
            .authorize::<AgentsManage>(&caller, ev, None)
            .await?;
        let known = self.agents.knows(&name);
        self.shared.checked(&auth, ev, None, known).await?;
        self.shared
            .ops
            .record_agent_command(&auth, ev, name.clone())
            .await?;
        let out = self.agents.command(&auth, &name, command).await;
        let view = self.shared.checked(&auth, ev, None, out).await?;
        Ok(to_json(&view)?)
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
        let ev = event::AGENTS_READ;
        let (_call, caller) = self.shared.admit(conn, &hdr, ev, None).await?;
        let auth = self
            .shared
            .gate
            .authorize::<AgentsRead>(&caller, ev, None)
            .await?;
        Ok(to_json(&self.agents.list(&auth))?)
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
        let ev = event::AGENTS_READ;
        let (_call, caller) = self.shared.admit(conn, &hdr, ev, None).await?;
        let auth = self
            .shared
            .gate
            .authorize::<AgentsRead>(&caller, ev, None)
            .await?;
        let view = self.agents.view(&auth, &name);
        let view = self.shared.checked(&auth, ev, None, view).await?;
        Ok(to_json(&view)?)
    }

    /// Starts a stopped agent (the failure count resets); refused while
    /// held with AGENTOS_CRASH_LOOP. Needs `org.airlock.agents.manage`.
    async fn start_agent(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        name: String,
    ) -> Result<String, BusError> {
        self.command(
            hdr,
            conn,
            name,
            Command::Start,
            event::AGENT_START_REQUESTED,
        )
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
        self.command(hdr, conn, name, Command::Stop, event::AGENT_STOP_REQUESTED)
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
        self.command(
            hdr,
            conn,
            name,
            Command::ClearHold,
            event::AGENT_HOLD_CLEARED,
        )
        .await
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

//! `org.airlock.AgentHost1`: the process driver behind the bus.
//!
//! The supervisor confines itself (Landlock without execute rights,
//! no capabilities) and so cannot start an agent as another user itself.
//! Where there is no systemd, airlock-local (root) serves this interface
//! on the suite's bus and the supervisor drives it exactly as it drives
//! systemd elsewhere: start, probe and stop by agent name. The host knows
//! the agents from the same configuration, so a caller can only name a
//! configured agent, never a command; and only the supervisor's uid may
//! call (the bus daemon's credentials of the sender).
//!
//! [`HostDriver`] is the supervisor's side: a [`Driver`] whose calls are
//! those three methods.

use std::collections::HashMap;
use std::sync::Arc;

use airlock_config::Agent;
use airlock_proto::bus::{AgentLiveness, agent_host};
use zbus::message::Header;
use zbus::{Connection, interface};

use crate::driver::{Driver, DriverError, Liveness};
use crate::policy::Exit;
use crate::process::ProcessDriver;

/// The served object.
#[derive(Debug)]
pub struct AgentHost {
    driver: Arc<ProcessDriver>,
    agents: HashMap<String, Agent>,
    supervisor_uid: u32,
}

impl AgentHost {
    /// Serves `agents` through `driver`, to callers of uid `supervisor_uid`.
    pub fn new(driver: Arc<ProcessDriver>, agents: Vec<Agent>, supervisor_uid: u32) -> AgentHost {
        AgentHost {
            driver,
            agents: agents.into_iter().map(|a| (a.name.clone(), a)).collect(),
            supervisor_uid,
        }
    }

    /// Admits the supervisor's uid alone, as the bus daemon reports the
    /// sender ([`airlock_client::peer`], the supervisor's own lookup).
    async fn admit(&self, conn: &Connection, hdr: &Header<'_>) -> zbus::fdo::Result<()> {
        let creds = airlock_client::peer::of_message(conn, hdr)
            .await
            .map_err(|e| zbus::fdo::Error::AccessDenied(e.to_string()))?;
        let (uid, sender) = (creds.uid, creds.sender);
        if uid != self.supervisor_uid {
            tracing::warn!(
                uid,
                sender,
                "AgentHost1 call refused: not the supervisor's uid"
            );
            return Err(zbus::fdo::Error::AccessDenied(format!(
                "PEER_UID_DENIED: {} is reserved for uid {}",
                agent_host::INTERFACE,
                self.supervisor_uid
            )));
        }
        Ok(())
    }

    fn agent(&self, name: &str) -> zbus::fdo::Result<&Agent> {
        self.agents
            .get(name)
            .ok_or_else(|| zbus::fdo::Error::InvalidArgs(format!("AGENT_NOT_FOUND: {name:?}")))
    }
}

#[interface(name = "org.airlock.AgentHost1")]
impl AgentHost {
    /// Starts the configured agent `name` (stopping a previous run first);
    /// returns the session it leads (its leader's pid).
    async fn start(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        name: String,
    ) -> zbus::fdo::Result<u32> {
        self.admit(conn, &hdr).await?;
        let agent = self.agent(&name)?;
        self.driver
            .start(agent)
            .await
            .map(|s| s.unwrap_or(0))
            .map_err(|e| zbus::fdo::Error::Failed(e.0))
    }

    /// Whether the agent `name` runs, as [`AgentLiveness`] JSON.
    async fn probe(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        name: String,
    ) -> zbus::fdo::Result<String> {
        self.admit(conn, &hdr).await?;
        self.agent(&name)?;
        let live = self
            .driver
            .probe(&name)
            .await
            .map_err(|e| zbus::fdo::Error::Failed(e.0))?;
        let reply = match live {
            Liveness::Alive => AgentLiveness {
                alive: true,
                exit_status: None,
                exit_signal: None,
                reason: String::new(),
            },
            // The process driver never reports a drain.
            Liveness::Drained => AgentLiveness {
                alive: false,
                exit_status: None,
                exit_signal: None,
                reason: "drained".into(),
            },
            Liveness::Gone(exit) => AgentLiveness {
                alive: false,
                exit_status: exit.code,
                exit_signal: exit.signal,
                reason: exit.reason,
            },
        };
        serde_json::to_string(&reply).map_err(|e| zbus::fdo::Error::Failed(e.to_string()))
    }

    /// Stops the agent `name` and its process group.
    async fn stop(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        name: String,
    ) -> zbus::fdo::Result<()> {
        self.admit(conn, &hdr).await?;
        self.agent(&name)?;
        self.driver
            .stop(&name)
            .await
            .map_err(|e| zbus::fdo::Error::Failed(e.0))
    }
}

/// The bus policy of the host: `host_user` may own its name, and only
/// `supervisor_user` may call it (the host checks the caller's uid as well).
pub fn bus_policy(host_user: &str, supervisor_user: &str) -> String {
    format!(
        r#"<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<!-- airlock-local's agent host: the process driver behind the bus. -->
<busconfig>
  <policy user="{host_user}">
    <allow own="{name}"/>
  </policy>
  <policy user="{supervisor_user}">
    <allow send_destination="{name}" send_interface="{name}"/>
  </policy>
</busconfig>
"#,
        name = agent_host::BUS_NAME
    )
}

/// Exports the host on `conn` and takes its well-known name.
pub async fn serve(conn: &Connection, host: AgentHost) -> zbus::Result<()> {
    conn.object_server()
        .at(agent_host::OBJECT_PATH, host)
        .await?;
    conn.request_name(agent_host::BUS_NAME).await?;
    Ok(())
}

/// The supervisor's driver when airlock-local hosts the agents.
#[derive(Debug, Clone)]
pub struct HostDriver {
    conn: Connection,
}

impl HostDriver {
    /// Calls the host over `conn`.
    pub fn new(conn: Connection) -> HostDriver {
        HostDriver { conn }
    }

    async fn call(&self, method: &str, name: &str) -> Result<zbus::Message, DriverError> {
        self.conn
            .call_method(
                Some(agent_host::BUS_NAME),
                agent_host::OBJECT_PATH,
                Some(agent_host::INTERFACE),
                method,
                &(name,),
            )
            .await
            .map_err(|e| DriverError(format!("{}.{method}: {e}", agent_host::INTERFACE)))
    }
}

impl Driver for HostDriver {
    async fn start(&self, agent: &Agent) -> Result<Option<u32>, DriverError> {
        let reply = self.call(agent_host::START, &agent.name).await?;
        let session: u32 = reply
            .body()
            .deserialize()
            .map_err(|e| DriverError(format!("Start reply: {e}")))?;
        Ok((session != 0).then_some(session))
    }

    async fn probe(&self, name: &str) -> Result<Liveness, DriverError> {
        let reply = self.call(agent_host::PROBE, name).await?;
        let text: String = reply
            .body()
            .deserialize()
            .map_err(|e| DriverError(format!("Probe reply: {e}")))?;
        let live: AgentLiveness = airlock_proto::bus::decode(agent_host::PROBE, &text)
            .map_err(|e| DriverError(e.to_string()))?;
        Ok(if live.alive {
            Liveness::Alive
        } else {
            Liveness::Gone(Exit {
                code: live.exit_status,
                signal: live.exit_signal,
                reason: live.reason,
            })
        })
    }

    async fn stop(&self, name: &str) -> Result<(), DriverError> {
        self.call(agent_host::STOP, name).await.map(|_| ())
    }
}

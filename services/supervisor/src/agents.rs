//! The planner agents: one restart-policy runner per `[[agent]]`
//! ([`airlock_agents::runner`]), its record stored in the task store after
//! every change (so a restarted supervisor resumes a hold as a hold), each
//! change recorded as an `AGENT_CHANGED` event and sent on a channel
//! ([`AgentChange`]) that the bus layer drains into `AgentChanged` signals
//! ([`crate::bus::agents::announce`]): the runners never call the bus. Stopping the supervisor drains them: every agent is stopped
//! (best effort, bounded by the call timeout) without recording an
//! operator's stop, so the next supervisor resumes them.

use std::collections::BTreeMap;
use std::sync::Arc;

use airlock_agents::runner::{self, OnChange};
use airlock_agents::{AgentHandle, AgentRecord, Command, Driver, Options, RecordStore, StoreError};
use airlock_config::Agent;
use airlock_proto::bus::{AgentList, AgentView};
use airlock_proto::{Code, Error};
use airlock_taskdb::tasks::Actor;
use tokio::sync::mpsc;

use crate::authz::{AgentsManage, AgentsRead, Authorized};
use crate::store::Store;

/// One agent's change, as the `AgentChanged` signal carries it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentChange {
    /// The agent's name.
    pub name: String,
    /// Its state now (`RUNNING`, `BACKOFF`, …).
    pub state: &'static str,
    /// Its consecutive failures.
    pub consecutive_failures: u32,
}

/// Where the runners send their changes. Unbounded: a change follows a
/// start, an exit or an operator's command, never a loop, and none is
/// dropped.
pub type Changes = mpsc::UnboundedSender<AgentChange>;

/// The system actor the policy's changes are recorded under.
pub const POLICY_ACTOR: &str = "agent-policy";

/// The records, in the supervisor's task store.
#[derive(Debug, Clone)]
pub struct StoreRecords {
    store: Store,
}

impl StoreRecords {
    /// Records in `store`.
    pub fn new(store: Store) -> StoreRecords {
        StoreRecords { store }
    }
}

impl RecordStore for StoreRecords {
    fn load(&self, name: &str) -> Result<Option<AgentRecord>, StoreError> {
        let value = self
            .store
            .blocking(|s| s.agent_record(name))
            .map_err(|e| StoreError(e.to_string()))?;
        value
            .map(|v| {
                serde_json::from_value(v).map_err(|e| StoreError(format!("agent {name:?}: {e}")))
            })
            .transpose()
    }

    fn save(&self, name: &str, record: &AgentRecord) -> Result<(), StoreError> {
        let value = serde_json::to_value(record).map_err(|e| StoreError(e.to_string()))?;
        self.store
            .blocking(|s| s.save_agent_record(name, &value, &Actor::system(POLICY_ACTOR)))
            .map_err(|e| StoreError(e.to_string()))
    }
}

/// Every configured agent's runner.
#[derive(Debug, Default)]
pub struct Agents {
    agents: BTreeMap<String, (Agent, AgentHandle)>,
    /// Under the systemd driver: systemd names the unit of a caller's
    /// process (attribution by unit instead of by session).
    units: Option<airlock_agents::systemd::SystemdDriver>,
}

/// The view `GetAgent` shows of `agent` with `record`.
pub fn view(agent: &Agent, record: &AgentRecord) -> AgentView {
    let last = record.last_exit.as_ref();
    AgentView {
        name: agent.name.clone(),
        state: record.status.as_str().to_owned(),
        consecutive_failures: record.consecutive_failures,
        next_start_at_ms: record.next_start_at_ms,
        running_since_ms: record.running_since_ms,
        last_exit_status: last.and_then(|e| e.code),
        last_exit_signal: last.and_then(|e| e.signal),
        last_failure: last.map(airlock_agents::policy::describe_exit),
        hold_reason: record.hold_reason.clone(),
        repositories: agent.repositories.clone(),
        updated_at_ms: record.updated_at_ms,
    }
}

impl Agents {
    /// Starts a runner per agent on `driver`, its records in `store`, its
    /// changes sent on `changes`.
    pub fn start<D: Driver>(
        agents: Vec<Agent>,
        driver: Arc<D>,
        store: Store,
        changes: Changes,
        options: Options,
    ) -> Result<Agents, Error> {
        let records = Arc::new(StoreRecords::new(store));
        let mut out = Agents::default();
        for agent in agents {
            let changes = changes.clone();
            let on_change: OnChange = Arc::new(move |name: &str, r: &AgentRecord| {
                let change = AgentChange {
                    name: name.to_owned(),
                    state: r.status.as_str(),
                    consecutive_failures: r.consecutive_failures,
                };
                // Closed only once the bus layer stopped listening (shutdown).
                if changes.send(change).is_err() {
                    tracing::debug!(agent = name, "no one announces agent changes any more");
                }
            });
            let handle = runner::spawn(
                agent.clone(),
                Arc::clone(&driver),
                Arc::clone(&records),
                Arc::new(airlock_agents::SystemClock),
                options,
                on_change,
            )
            .map_err(|e| Error::with(Code::STORE_UNAVAILABLE, e.to_string()))?;
            tracing::info!(agent = %agent.name, "agent runner started");
            out.agents.insert(agent.name.clone(), (agent, handle));
        }
        Ok(out)
    }

    fn get(&self, name: &str) -> Result<&(Agent, AgentHandle), Error> {
        self.agents.get(name).ok_or_else(|| {
            Error::with(
                Code::AGENT_NOT_FOUND,
                format!("no agent {name:?} is configured"),
            )
        })
    }

    /// One agent.
    pub fn view(&self, _auth: &Authorized<AgentsRead>, name: &str) -> Result<AgentView, Error> {
        self.view_of(name)
    }

    fn view_of(&self, name: &str) -> Result<AgentView, Error> {
        let (agent, handle) = self.get(name)?;
        Ok(view(agent, &handle.record()))
    }

    /// Every agent, by name.
    pub fn list(&self, _auth: &Authorized<AgentsRead>) -> AgentList {
        AgentList {
            agents: self
                .agents
                .values()
                .map(|(a, h)| view(a, &h.record()))
                .collect(),
        }
    }

    /// An operator's command; the agent after it, or its refusal.
    pub async fn command(
        &self,
        _auth: &Authorized<AgentsManage>,
        name: &str,
        command: Command,
    ) -> Result<AgentView, Error> {
        let (agent, handle) = self.get(name)?;
        match handle.command(command).await {
            Ok(record) => Ok(view(agent, &record)),
            Err(Code::AGENTOS_CRASH_LOOP) => Err(Error::with(
                Code::AGENTOS_CRASH_LOOP,
                format!(
                    "agent {name:?} is held ({}); clear the hold first",
                    handle.record().hold_reason.unwrap_or_default()
                ),
            )),
            Err(code) => Err(Error::with(code, format!("agent {name:?}"))),
        }
    }

    /// Attributes callers by the systemd unit of their process
    /// (`airlock-agent@NAME.service`), as `units` reports it.
    pub fn with_units(mut self, units: airlock_agents::systemd::SystemdDriver) -> Agents {
        self.units = Some(units);
        self
    }

    /// The configured agent the process `pid` belongs to: under systemd,
    /// the agent whose unit `GetUnitByPID` names (whatever its record says:
    /// every process of an agent's unit is that agent); otherwise the
    /// running agent whose session the process is in, once no start is
    /// awaiting its session (so a process of an agent that calls before
    /// its start was answered is still recognised).
    pub async fn attribute(&self, pid: u32) -> Option<&Agent> {
        match &self.units {
            Some(units) => {
                let name = units.agent_of_pid(pid).await?;
                self.config(&name)
            }
            None => {
                let session = session_of(pid)?;
                if let Some(agent) = self.by_session(session) {
                    return Some(agent);
                }
                // The caller may be a process of an agent whose start has
                // not been answered yet (the driver spawns, then answers
                // with the session): wait for the starts in flight, then
                // look again.
                futures_util::future::join_all(
                    self.agents.values().map(|(_, h)| h.start_settled()),
                )
                .await;
                self.by_session(session)
            }
        }
    }

    /// The running agent whose session is `session`, if any.
    pub fn by_session(&self, session: u32) -> Option<&Agent> {
        self.agents
            .values()
            .find(|(_, h)| h.session() == Some(session))
            .map(|(a, _)| a)
    }

    /// Whether `name` is a configured agent.
    pub fn knows(&self, name: &str) -> Result<(), Error> {
        self.get(name).map(|_| ())
    }

    /// The agent configured as `name`.
    pub fn config(&self, name: &str) -> Option<&Agent> {
        self.agents.get(name).map(|(a, _)| a)
    }

    /// Stops every agent (the drain) and ends the runners.
    pub async fn drain(&self) {
        let drains = self.agents.values().map(|(a, h)| async move {
            h.drain().await;
            tracing::info!(agent = %a.name, "agent drained");
        });
        futures_util::future::join_all(drains).await;
    }
}

/// The session id of process `pid` (field 6 of `/proc/PID/stat`), if it
/// still exists.
pub fn session_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold anything.
    let rest = stat.rsplit_once(')')?.1;
    rest.split_whitespace().nth(3)?.parse().ok()
}

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

/// Starts one agent's runner (on the driver the supervisor started with).
type Spawner = Arc<dyn Fn(Agent) -> Result<AgentHandle, Error> + Send + Sync>;

/// One configured agent: its table as applied, and its runner.
type Entry = (Agent, Arc<AgentHandle>);

/// Every configured agent's runner. The set changes on a reload
/// ([`Agents::apply`]); every other caller reads it.
#[derive(Default)]
pub struct Agents {
    agents: std::sync::RwLock<BTreeMap<String, Entry>>,
    /// Starts a runner for an agent added or changed by a reload; `None`
    /// when the supervisor started without agents (no driver to start
    /// them on: adding the first agent needs a restart).
    spawner: Option<Spawner>,
    /// Under the systemd driver: systemd names the unit of a caller's
    /// process (attribution by unit instead of by session).
    units: Option<airlock_agents::systemd::SystemdDriver>,
}

impl std::fmt::Debug for Agents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agents")
            .field("agents", &self.snapshot().keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// What a reload changed in the set of agents ([`Agents::apply`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Agents that started (new tables).
    pub added: Vec<String>,
    /// Agents that stopped (tables gone); their queued tasks are cancelled.
    pub removed: Vec<String>,
    /// Agents restarted alone (command, environment, credential or a limit changed).
    pub restarted: Vec<String>,
    /// Agents kept, with the repositories they lost (their queued tasks
    /// for those are cancelled); submissions are refused at once.
    pub narrowed: Vec<(String, Vec<String>)>,
}

/// Whether `old` and `new` run the same way: everything but the
/// repositories (applied at once to submissions), the cap on running tasks
/// and the quotas (applied at once to claims and submissions:
/// [`crate::ops::Limits`]) and the description.
fn same_run(old: &Agent, new: &Agent) -> bool {
    let strip = |a: &Agent| Agent {
        repositories: Vec::new(),
        description: None,
        max_running: 0,
        tasks_per_hour: 0,
        cpu_seconds_per_day: 0,
        ..a.clone()
    };
    strip(old) == strip(new)
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
        let spawner: Spawner = Arc::new(move |agent: Agent| {
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
            Ok(handle)
        });
        let mut map = BTreeMap::new();
        for agent in agents {
            let handle = spawner(agent.clone())?;
            map.insert(agent.name.clone(), (agent, Arc::new(handle)));
        }
        Ok(Agents {
            agents: std::sync::RwLock::new(map),
            spawner: Some(spawner),
            units: None,
        })
    }

    fn snapshot(&self) -> BTreeMap<String, Entry> {
        self.agents
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn get(&self, name: &str) -> Result<Entry, Error> {
        self.agents
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(name)
            .cloned()
            .ok_or_else(|| {
                Error::with(
                    Code::AGENT_NOT_FOUND,
                    format!("no agent {name:?} is configured"),
                )
            })
    }

    /// Applies a reload's `[[agent]]` tables: an agent whose table is
    /// unchanged keeps running untouched; a new one starts; one whose
    /// table is gone is drained (stopped, never counted as a failure, no
    /// operator's stop recorded); one whose command, environment,
    /// credential or limits changed is drained and started again alone;
    /// narrowed repositories take effect at once for submissions. The
    /// caller cancels the queued tasks the result names. Refused
    /// (`CONFIG_INVALID`, nothing changed) when agents are added to a
    /// supervisor that started without any: it has no driver to run them.
    pub async fn apply(&self, tables: Vec<Agent>) -> Result<Applied, Error> {
        self.check_apply(&tables)?;
        let Some(spawner) = self.spawner.clone() else {
            return Ok(Applied::default());
        };
        let before = self.snapshot();
        let mut applied = Applied::default();
        let mut drain = Vec::new();
        let mut start = Vec::new();
        {
            let mut map = self
                .agents
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            for name in before.keys() {
                if !tables.iter().any(|a| &a.name == name) {
                    if let Some((_, handle)) = map.remove(name) {
                        drain.push(handle);
                    }
                    applied.removed.push(name.clone());
                }
            }
            for agent in &tables {
                match before.get(&agent.name) {
                    None => {
                        applied.added.push(agent.name.clone());
                        start.push(agent.clone());
                    }
                    Some((old, handle)) => {
                        let lost: Vec<String> = old
                            .repositories
                            .iter()
                            .filter(|r| !agent.may_propose_for(r))
                            .cloned()
                            .collect();
                        if !lost.is_empty() {
                            applied.narrowed.push((agent.name.clone(), lost));
                        }
                        if same_run(old, agent) {
                            map.insert(agent.name.clone(), (agent.clone(), Arc::clone(handle)));
                        } else {
                            if let Some((_, handle)) = map.remove(&agent.name) {
                                drain.push(handle);
                            }
                            applied.restarted.push(agent.name.clone());
                            start.push(agent.clone());
                        }
                    }
                }
            }
        }
        let drains = drain.iter().map(|h| async move {
            h.drain().await;
            tracing::info!(agent = %h.name(), "agent drained (reload)");
        });
        futures_util::future::join_all(drains).await;
        for agent in start {
            match spawner(agent.clone()) {
                Ok(handle) => {
                    self.agents
                        .write()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .insert(agent.name.clone(), (agent, Arc::new(handle)));
                }
                Err(e) => tracing::error!(agent = %agent.name, "not started after the reload: {e}"),
            }
        }
        Ok(applied)
    }

    /// Whether [`Agents::apply`] would take `tables`: refused
    /// (`CONFIG_INVALID`) when agents are added to a supervisor that
    /// started without any (no driver runs them).
    pub fn check_apply(&self, tables: &[Agent]) -> Result<(), Error> {
        if self.spawner.is_none() && !tables.is_empty() {
            return Err(Error::with(
                Code::CONFIG_INVALID,
                "the supervisor started without [[agent]] tables, so no agent driver runs: adding the first agent needs a restart (systemctl restart airlock-supervisor)",
            ));
        }
        Ok(())
    }

    /// One agent.
    pub fn view(&self, _auth: &Authorized<AgentsRead>, name: &str) -> Result<AgentView, Error> {
        self.view_of(name)
    }

    fn view_of(&self, name: &str) -> Result<AgentView, Error> {
        let (agent, handle) = self.get(name)?;
        Ok(view(&agent, &handle.record()))
    }

    /// Every agent, by name.
    pub fn list(&self, _auth: &Authorized<AgentsRead>) -> AgentList {
        AgentList {
            agents: self
                .snapshot()
                .values()
                .map(|(a, h)| view(a, &h.record()))
                .collect(),
        }
    }

    /// Every agent's view, for the metrics file (states, failure counts
    /// and names only are written; no authorisation, as for the queue
    /// summary).
    pub fn views(&self) -> Vec<AgentView> {
        self.snapshot()
            .values()
            .map(|(a, h)| view(a, &h.record()))
            .collect()
    }

    /// Whether the agent `name` runs or is about to (it is neither
    /// STOPPED nor HELD); a name not configured does not run.
    pub fn running(&self, name: &str) -> bool {
        self.get(name).is_ok_and(|(_, h)| {
            !matches!(
                h.record().status,
                airlock_agents::Status::Stopped | airlock_agents::Status::Held
            )
        })
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
            Ok(record) => Ok(view(&agent, &record)),
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
    /// every process of an agent's unit is that agent); otherwise (the
    /// process driver under airlock-local) the running agent whose cgroup
    /// the process is in, else whose session it is in (an agent without a
    /// cgroup: airlock-local not run as root), once no start is awaiting
    /// its session (so a process of an agent that calls before its start
    /// was answered is still recognised).
    ///
    /// The cgroup is the kernel's `/proc/PID/cgroup`, read while a pidfd
    /// holds the process and trusted only if it still runs after the read
    /// ([`airlock_agents::cgroup::of_process`]), during the call (so while
    /// the caller's connection is up). It must hold the very line that
    /// puts the agent's first process (the session leader the host
    /// answered with, kept unreaped by the host while the agent runs) in
    /// `airlock-agent@NAME`: a cgroup of that name made elsewhere is not
    /// the agent's. A process cannot leave its cgroup, and only root moves
    /// one into another, so an agent's child that left its session
    /// (`setsid`) is still the agent, and no other process passes for it.
    pub async fn attribute(&self, pid: u32) -> Option<Agent> {
        match &self.units {
            Some(units) => {
                let name = units.agent_of_pid(pid).await?;
                self.config(&name)
            }
            None => {
                let cgroup = airlock_agents::cgroup::of_process(pid);
                let session = session_of(pid);
                if let Some(agent) = self.by_process(cgroup.as_deref(), session) {
                    return Some(agent);
                }
                // The caller may be a process of an agent whose start has
                // not been answered yet (the driver spawns, then answers
                // with the session): wait for the starts in flight, then
                // look again.
                let handles: Vec<Arc<AgentHandle>> =
                    self.snapshot().into_values().map(|(_, h)| h).collect();
                futures_util::future::join_all(handles.iter().map(|h| h.start_settled())).await;
                self.by_process(cgroup.as_deref(), session)
            }
        }
    }

    /// The running agent a process is of: the one whose cgroup holds it
    /// (`cgroup`: its `/proc/PID/cgroup`), else the one whose session is
    /// `session`, if any.
    pub fn by_process(&self, cgroup: Option<&str>, session: Option<u32>) -> Option<Agent> {
        let running: Vec<(Agent, u32)> = self
            .snapshot()
            .into_values()
            .filter_map(|(a, h)| Some((a, h.session()?)))
            .collect();
        if let Some(cgroup) = cgroup {
            for (agent, leader) in &running {
                let Ok(text) = std::fs::read_to_string(format!("/proc/{leader}/cgroup")) else {
                    continue;
                };
                if let Some(line) = airlock_agents::cgroup::agent_line(&text, &agent.name) {
                    if cgroup.lines().any(|l| l == line) {
                        return Some(agent.clone());
                    }
                }
            }
        }
        let session = session?;
        running
            .into_iter()
            .find(|(_, leader)| *leader == session)
            .map(|(a, _)| a)
    }

    /// Whether `name` is a configured agent.
    pub fn knows(&self, name: &str) -> Result<(), Error> {
        self.get(name).map(|_| ())
    }

    /// The agent configured as `name`.
    pub fn config(&self, name: &str) -> Option<Agent> {
        self.get(name).ok().map(|(a, _)| a)
    }

    /// Stops every agent (the drain) and ends the runners.
    pub async fn drain(&self) {
        let all = self.snapshot();
        let drains = all.values().map(|(a, h)| async move {
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

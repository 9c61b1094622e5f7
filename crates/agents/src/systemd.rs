//! The systemd driver: each agent the instance `airlock-agent@NAME.service`
//! of the packaged template unit, driven over `org.freedesktop.systemd1`
//! on the system bus.
//!
//! - [`SystemdDriver::connect`] calls `Subscribe` and installs its match
//!   rules (`JobRemoved` of the manager, `PropertiesChanged` under
//!   `/org/freedesktop/systemd1/unit`) before any start, and reads them on
//!   a task of its own.
//! - start: `ResetFailedUnit` (a failed instance starts afresh), then
//!   `StartUnit(unit, "fail")` (a job that would replace another is
//!   refused, not queued); the call waits for the job's `JobRemoved` and
//!   then re-reads the unit's `ActiveState`: only "active" (or
//!   "activating", "reloading") is a start. The signal says a job ended;
//!   what the unit is comes from its properties, read again.
//! - probe: the unit's `ActiveState`, `SubState`, `Result`,
//!   `ExecMainCode` and `ExecMainStatus`, read on every probe. A unit that
//!   is gone while a stop of the supervisor's own unit is queued or running
//!   is [`Liveness::Drained`]: the suite is being stopped, the drain
//!   follows, and that is no failure of the agent.
//! - stop: `StopUnit(unit, "replace")` and its `JobRemoved`; systemd kills
//!   the unit's whole control group, so nothing an agent started survives
//!   it (a process that left the agent's session included).
//! - [`SystemdDriver::reconcile`]: after a supervisor (re)start, every
//!   agent instance `ListUnitsByPatterns` finds active is stopped and every
//!   failed one reset, before the runners start the agents whose stored
//!   records say they run.
//! - [`SystemdDriver::agent_of_pid`]: which agent a process belongs to,
//!   by systemd's `GetUnitByPID` (the caller's pid as the bus daemon
//!   reported it) and the unit's `Id`.
//!
//! The supervisor runs as user airlock: polkit decides each `StartUnit`,
//! `StopUnit` and `ResetFailedUnit` (action
//! `org.freedesktop.systemd1.manage-units`, details `unit` and `verb`);
//! the packaged rule `polkit/50-airlock-supervisor.rules` allows exactly the
//! verbs start, stop and reset-failed on `airlock-agent@<agent name>.service`.

use airlock_config::Agent;
use futures_util::StreamExt;
use tokio::sync::broadcast;
use zbus::Connection;
use zbus::zvariant::{OwnedObjectPath, OwnedValue};

use crate::driver::{Driver, DriverError, Liveness};
use crate::policy::Exit;

const DEST: &str = "org.freedesktop.systemd1";
const PATH: &str = "/org/freedesktop/systemd1";
const MANAGER: &str = "org.freedesktop.systemd1.Manager";
const UNIT: &str = "org.freedesktop.systemd1.Unit";
const SERVICE: &str = "org.freedesktop.systemd1.Service";
const PROPERTIES: &str = "org.freedesktop.DBus.Properties";

/// The template's unit-name prefix and suffix.
pub const UNIT_PREFIX: &str = "airlock-agent@";
/// See [`UNIT_PREFIX`].
pub const UNIT_SUFFIX: &str = ".service";

/// The unit that runs the agent `name`.
pub fn unit_name(name: &str) -> String {
    format!("{UNIT_PREFIX}{name}{UNIT_SUFFIX}")
}

/// The agent whose instance `unit` is, if it is one.
pub fn agent_of_unit(unit: &str) -> Option<&str> {
    let name = unit.strip_prefix(UNIT_PREFIX)?.strip_suffix(UNIT_SUFFIX)?;
    airlock_config::is_agent_name(name).then_some(name)
}

/// A job that ended, as `JobRemoved` announced it.
#[derive(Clone, Debug)]
struct JobRemoved {
    job: OwnedObjectPath,
    unit: String,
    result: String,
}

/// Drives agents as instances of `airlock-agent@.service`.
#[derive(Clone, Debug)]
pub struct SystemdDriver {
    conn: Connection,
    jobs: broadcast::Sender<JobRemoved>,
}

/// What the unit's properties said.
#[derive(Clone, Debug, PartialEq, Eq)]
struct UnitState {
    active: String,
    sub: String,
    result: String,
    exec_main_code: i32,
    exec_main_status: i32,
}

fn failed(what: &str, e: impl std::fmt::Display) -> DriverError {
    DriverError(format!("systemd1 {what}: {e}"))
}

impl SystemdDriver {
    /// Subscribes to the manager's signals and installs the match rules
    /// (both before this returns, so before any start), then reads them on
    /// a task of its own for as long as `conn` lives.
    pub async fn connect(conn: Connection) -> Result<SystemdDriver, DriverError> {
        let jobs_rule = zbus::MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .sender(DEST)
            .and_then(|b| b.interface(MANAGER))
            .and_then(|b| b.member("JobRemoved"))
            .map_err(|e| failed("match rule", e))?
            .build();
        let props_rule = zbus::MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .sender(DEST)
            .and_then(|b| b.interface(PROPERTIES))
            .and_then(|b| b.member("PropertiesChanged"))
            .and_then(|b| b.path_namespace("/org/freedesktop/systemd1/unit"))
            .map_err(|e| failed("match rule", e))?
            .build();
        let mut jobs_stream = zbus::MessageStream::for_match_rule(jobs_rule, &conn, Some(256))
            .await
            .map_err(|e| failed("AddMatch JobRemoved", e))?;
        let mut props_stream = zbus::MessageStream::for_match_rule(props_rule, &conn, Some(256))
            .await
            .map_err(|e| failed("AddMatch PropertiesChanged", e))?;
        conn.call_method(Some(DEST), PATH, Some(MANAGER), "Subscribe", &())
            .await
            .map_err(|e| failed("Subscribe", e))?;
        let (jobs, _) = broadcast::channel(256);
        let tx = jobs.clone();
        tokio::spawn(async move {
            while let Some(msg) = jobs_stream.next().await {
                let Ok(msg) = msg else { continue };
                let body = msg.body();
                let Ok((_id, job, unit, result)) =
                    body.deserialize::<(u32, OwnedObjectPath, String, String)>()
                else {
                    continue;
                };
                if agent_of_unit(&unit).is_some() {
                    tracing::debug!(unit, result, job = %job.as_str(), "JobRemoved");
                    let _ = tx.send(JobRemoved { job, unit, result });
                }
            }
        });
        tokio::spawn(async move {
            // Observed, never trusted: a change is logged, and every
            // decision re-reads the properties it needs.
            while let Some(msg) = props_stream.next().await {
                let Ok(msg) = msg else { continue };
                let header = msg.header();
                let Some(path) = header.path() else { continue };
                if path.as_str().contains("airlock_2dagent_40") {
                    tracing::debug!(path = %path.as_str(), "PropertiesChanged of an agent unit");
                }
            }
        });
        Ok(SystemdDriver { conn, jobs })
    }

    async fn manager(
        &self,
        method: &str,
        body: &(impl serde::Serialize + zbus::zvariant::DynamicType),
    ) -> Result<zbus::Message, DriverError> {
        self.conn
            .call_method(Some(DEST), PATH, Some(MANAGER), method, body)
            .await
            .map_err(|e| failed(method, e))
    }

    /// The property `iface.name` of the object at `path`, as a `T`.
    async fn property<T>(
        &self,
        path: &OwnedObjectPath,
        iface: &str,
        name: &str,
    ) -> Result<T, DriverError>
    where
        T: TryFrom<OwnedValue>,
        T::Error: std::fmt::Display,
    {
        let reply = self
            .conn
            .call_method(
                Some(DEST),
                path.as_str(),
                Some(PROPERTIES),
                "Get",
                &(iface, name),
            )
            .await
            .map_err(|e| failed(&format!("Get {name}"), e))?;
        let body = reply.body();
        let value: OwnedValue = body
            .deserialize()
            .map_err(|e| failed(&format!("Get {name} reply"), e))?;
        T::try_from(value).map_err(|e| failed(name, e))
    }

    /// The loaded unit `unit`'s object path; `None` when systemd has no
    /// such unit loaded.
    async fn unit_path(&self, unit: &str) -> Result<Option<OwnedObjectPath>, DriverError> {
        match self
            .conn
            .call_method(Some(DEST), PATH, Some(MANAGER), "GetUnit", &(unit,))
            .await
        {
            Ok(reply) => {
                let body = reply.body();
                let path: OwnedObjectPath =
                    body.deserialize().map_err(|e| failed("GetUnit reply", e))?;
                Ok(Some(path))
            }
            Err(zbus::Error::MethodError(name, _, _))
                if name.as_str() == "org.freedesktop.systemd1.NoSuchUnit" =>
            {
                Ok(None)
            }
            Err(e) => Err(failed("GetUnit", e)),
        }
    }

    async fn state(&self, path: &OwnedObjectPath) -> Result<UnitState, DriverError> {
        Ok(UnitState {
            active: self.property::<String>(path, UNIT, "ActiveState").await?,
            sub: self.property::<String>(path, UNIT, "SubState").await?,
            result: self.property::<String>(path, SERVICE, "Result").await?,
            exec_main_code: self.property::<i32>(path, SERVICE, "ExecMainCode").await?,
            exec_main_status: self
                .property::<i32>(path, SERVICE, "ExecMainStatus")
                .await?,
        })
    }

    /// Calls `method` (StartUnit or StopUnit) on `unit` and waits for its
    /// job's `JobRemoved`; returns the job's result ("done", "failed", …).
    async fn job(&self, method: &str, unit: &str, mode: &str) -> Result<String, DriverError> {
        // Subscribed before the call: the job may end before its reply is read.
        let mut removed = self.jobs.subscribe();
        let reply = self.manager(method, &(unit, mode)).await?;
        let body = reply.body();
        let job: OwnedObjectPath = body
            .deserialize()
            .map_err(|e| failed(&format!("{method} reply"), e))?;
        loop {
            match removed.recv().await {
                Ok(r) if r.job == job => return Ok(r.result),
                Ok(r) => tracing::trace!(unit = r.unit, "another job ended"),
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    // Signals were lost to the queue's bound: the job may
                    // have ended among them; its unit's state says.
                    tracing::warn!(unit, "missed {n} JobRemoved signals");
                    return Ok("unknown".into());
                }
                Err(broadcast::error::RecvError::Closed) => {
                    return Err(failed(method, "the signal stream ended"));
                }
            }
        }
    }

    /// Whether a stop of the unit this process runs in is queued or running
    /// (`systemctl stop airlock.target`, or of the supervisor): the agents,
    /// ordered after it, are stopped first, and the drain follows. Asked of
    /// systemd each time: the unit of this process (`GetUnitByPID`), its
    /// `ActiveState`, and the manager's job queue (`ListJobs`).
    async fn suite_stopping(&self) -> bool {
        let own = match self
            .manager("GetUnitByPID", &(std::process::id(),))
            .await
            .and_then(|reply| {
                reply
                    .body()
                    .deserialize::<OwnedObjectPath>()
                    .map_err(|e| failed("GetUnitByPID reply", e))
            }) {
            Ok(path) => path,
            Err(e) => {
                tracing::warn!("cannot tell whether the suite is stopping: {e}");
                return false;
            }
        };
        if let Ok(active) = self.property::<String>(&own, UNIT, "ActiveState").await
            && active == "deactivating"
        {
            return true;
        }
        type Job = (
            u32,
            String,
            String,
            String,
            OwnedObjectPath,
            OwnedObjectPath,
        );
        let jobs: Vec<Job> = match self.manager("ListJobs", &()).await.and_then(|reply| {
            reply
                .body()
                .deserialize::<Vec<Job>>()
                .map_err(|e| failed("ListJobs reply", e))
        }) {
            Ok(jobs) => jobs,
            Err(e) => {
                tracing::warn!("cannot tell whether the suite is stopping: {e}");
                return false;
            }
        };
        jobs.iter().any(|(_, _, kind, _, _, unit)| {
            *unit == own && matches!(kind.as_str(), "stop" | "restart")
        })
    }

    /// After a supervisor (re)start, before any runner: stops every active
    /// agent instance and resets every failed one, so that only the
    /// runners (from the stored records) decide what runs. Returns the
    /// units stopped.
    pub async fn reconcile(&self) -> Result<Vec<String>, DriverError> {
        let pattern = format!("{UNIT_PREFIX}*{UNIT_SUFFIX}");
        let reply = self
            .manager(
                "ListUnitsByPatterns",
                &(Vec::<String>::new(), vec![pattern.as_str()]),
            )
            .await?;
        type Row = (
            String,
            String,
            String,
            String,
            String,
            String,
            OwnedObjectPath,
            u32,
            String,
            OwnedObjectPath,
        );
        let body = reply.body();
        let rows: Vec<Row> = body
            .deserialize()
            .map_err(|e| failed("ListUnitsByPatterns reply", e))?;
        let mut stopped = Vec::new();
        for (unit, _, _, active, ..) in rows {
            if agent_of_unit(&unit).is_none() {
                continue;
            }
            match active.as_str() {
                "inactive" => {}
                "failed" => {
                    let _ = self.manager("ResetFailedUnit", &(unit.as_str(),)).await;
                }
                _ => {
                    tracing::info!(
                        unit,
                        active,
                        "reconcile: stopping an agent unit found running"
                    );
                    self.job("StopUnit", &unit, "replace").await?;
                    stopped.push(unit);
                }
            }
        }
        Ok(stopped)
    }

    /// The agent whose unit the process `pid` runs in, by systemd's
    /// `GetUnitByPID`: `None` for a process in any other unit.
    pub async fn agent_of_pid(&self, pid: u32) -> Option<String> {
        let reply = self.manager("GetUnitByPID", &(pid,)).await.ok()?;
        let path: OwnedObjectPath = reply.body().deserialize().ok()?;
        let id = self.property::<String>(&path, UNIT, "Id").await.ok()?;
        agent_of_unit(&id).map(str::to_owned)
    }
}

fn exit_of(state: &UnitState) -> Exit {
    // ExecMainCode is a si_code: CLD_EXITED 1, CLD_KILLED 2, CLD_DUMPED 3.
    let (code, signal) = match state.exec_main_code {
        1 => (Some(state.exec_main_status), None),
        2 | 3 => (None, Some(state.exec_main_status)),
        _ => (None, None),
    };
    Exit {
        code,
        signal,
        reason: format!(
            "unit {}/{}, result {}",
            state.active, state.sub, state.result
        ),
    }
}

impl Driver for SystemdDriver {
    async fn start(&self, agent: &Agent) -> Result<Option<u32>, DriverError> {
        let unit = unit_name(&agent.name);
        // A failed instance keeps its state until reset; unknown is fine.
        if self.unit_path(&unit).await?.is_some() {
            let _ = self.manager("ResetFailedUnit", &(unit.as_str(),)).await;
        }
        let result = self.job("StartUnit", &unit, "fail").await?;
        let path = self.unit_path(&unit).await?.ok_or_else(|| {
            DriverError(format!("{unit} not loaded after its start job ({result})"))
        })?;
        let state = self.state(&path).await?;
        match state.active.as_str() {
            "active" | "activating" | "reloading" => Ok(None),
            _ => Err(DriverError(format!(
                "{unit}: start job {result}; {}",
                crate::policy::describe_exit(&exit_of(&state))
            ))),
        }
    }

    async fn probe(&self, name: &str) -> Result<Liveness, DriverError> {
        let unit = unit_name(name);
        let gone = match self.unit_path(&unit).await? {
            None => Exit {
                reason: format!("{unit} is not loaded"),
                ..Exit::default()
            },
            Some(path) => {
                let state = self.state(&path).await?;
                if matches!(state.active.as_str(), "active" | "activating" | "reloading") {
                    return Ok(Liveness::Alive);
                }
                exit_of(&state)
            }
        };
        if self.suite_stopping().await {
            return Ok(Liveness::Drained);
        }
        Ok(Liveness::Gone(gone))
    }

    async fn stop(&self, name: &str) -> Result<(), DriverError> {
        let unit = unit_name(name);
        if self.unit_path(&unit).await?.is_none() {
            return Ok(());
        }
        let result = self.job("StopUnit", &unit, "replace").await?;
        if let Some(path) = self.unit_path(&unit).await? {
            let active = self.property::<String>(&path, UNIT, "ActiveState").await?;
            if !matches!(active.as_str(), "inactive" | "failed") {
                return Err(DriverError(format!(
                    "{unit} is {active} after its stop job ({result})"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_names_map_to_agents_and_back() {
        assert_eq!(unit_name("planner"), "airlock-agent@planner.service");
        assert_eq!(
            agent_of_unit("airlock-agent@planner.service"),
            Some("planner")
        );
        for other in [
            "airlock-agent@.service",
            "airlock-agent@Planner.service",
            "airlock-agent@a.b.service",
            "airlock-worker.service",
            "ssh.service",
            "airlock-agent@planner.socket",
        ] {
            assert_eq!(agent_of_unit(other), None, "{other}");
        }
    }

    #[test]
    fn exits_come_from_the_si_code() {
        let s = |code, status| UnitState {
            active: "failed".into(),
            sub: "failed".into(),
            result: "exit-code".into(),
            exec_main_code: code,
            exec_main_status: status,
        };
        assert_eq!(exit_of(&s(1, 3)).code, Some(3));
        assert_eq!(exit_of(&s(2, 9)).signal, Some(9));
        assert_eq!(
            exit_of(&s(0, 0)),
            Exit {
                code: None,
                signal: None,
                reason: "unit failed/failed, result exit-code".into()
            }
        );
    }
}

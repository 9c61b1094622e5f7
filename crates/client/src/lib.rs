//! airlock-client: the one client of `org.airlock.Supervisor1`.
//!
//! Every process that talks to the supervisor — airlockctl, the worker,
//! airlock-retryd, airlock-local and the benchmarks — calls it through
//! [`Supervisor`]: one zbus proxy per interface, built from the names in
//! [`airlock_proto::bus`], typed replies decoded strictly (a missing field
//! is an error, never a default), and every D-Bus error mapped back to its
//! catalogue [`Code`]. The server handlers name the same constants, so a
//! client call and its handler pair by name.
//!
//! Calls are bounded: each one is raced against [`Supervisor::timeout`]
//! (30 s unless changed) and a late answer is dropped with its future.
//!
//! [`peer`] is the other side of the same bus: the one lookup of a
//! sender's credentials from the bus daemon, for the services that serve
//! methods (the supervisor, airlock-local's agent host).
//!
//! Before its first call a client reads the supervisor's
//! `ProtocolVersion` and refuses a different major version with
//! `PROTOCOL_VERSION_MISMATCH`, naming both (`docs/protocol.md`).
//!
//! ```no_run
//! # async fn demo() -> Result<(), airlock_proto::Error> {
//! let sup = airlock_client::Supervisor::connect(None).await?;
//! let task = sup.get_task("task-1").await?;
//! println!("{} is {}", task.task_id, task.state.as_str());
//! # Ok(()) }
//! ```

pub mod blocking;
mod error;
pub mod peer;

pub use error::{from_zbus, is_unreachable};

use airlock_proto::bus::{
    self, BUS_NAME, Call, EventPage, LeaseRef, OBJECT_PATH, ResultReceipt, SubmitReply, TaskPage,
    agents, reconcile, retry, tasks, worker,
};
use airlock_proto::reconcile::{
    AdoptionCheck, AdoptionReport, ReconciliationCase, ReconciliationPage, ResolveOutcome,
    ResolveRequest,
};
use airlock_proto::retry::{RetryExtensionOutcome, RetryExtensionRequest};
use airlock_proto::task::{
    ClaimGrant, DecisionOutcome, DecisionRequest, TaskPlan, TaskResult, TaskView,
};
use airlock_proto::{Code, Error};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::OnceCell;
use zbus::proxy::{CacheProperties, MethodFlags};
use zbus::zvariant::{DynamicType, OwnedValue};

/// Whether `e` says the supervisor serves no such interface or property
/// (a supervisor of an older protocol).
fn names_no_such_interface(e: &zbus::Error) -> bool {
    let name = match e {
        zbus::Error::MethodError(name, _, _) => name.to_string(),
        zbus::Error::FDO(fdo) => zbus::DBusError::name(fdo.as_ref()).to_string(),
        _ => return false,
    };
    [
        "org.freedesktop.DBus.Error.UnknownInterface",
        "org.freedesktop.DBus.Error.UnknownProperty",
        "org.freedesktop.DBus.Error.InvalidArgs",
    ]
    .contains(&name.as_str())
}

/// How long a call may take unless [`Supervisor::with_timeout`] says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// A connection to the supervisor, with a proxy per interface.
#[derive(Debug, Clone)]
pub struct Supervisor {
    conn: zbus::Connection,
    tasks: zbus::Proxy<'static>,
    worker: zbus::Proxy<'static>,
    retry: zbus::Proxy<'static>,
    agents: zbus::Proxy<'static>,
    reconcile: zbus::Proxy<'static>,
    interactive: bool,
    timeout: Duration,
    /// The protocol this client speaks, and whether the supervisor's was
    /// found compatible (checked once, before the first call).
    protocol: (u32, u32),
    checked: Arc<OnceCell<()>>,
}

/// Connects to the bus at `address`, or to the system bus
/// (`DBUS_SYSTEM_BUS_ADDRESS` when set) when `None`. This is the one way
/// every airlock process names its bus.
pub async fn connect_bus(address: Option<&str>) -> Result<zbus::Connection, Error> {
    let conn = match address {
        Some(a) => match zbus::connection::Builder::address(a) {
            Ok(b) => b.build().await,
            Err(e) => Err(e),
        },
        None => zbus::Connection::system().await,
    };
    conn.map_err(|e| {
        Error::with(
            Code::RUNTIME_UNAVAILABLE,
            format!(
                "cannot connect to the bus {}: {e}",
                address.unwrap_or("(system)")
            ),
        )
    })
}

async fn proxy(
    conn: &zbus::Connection,
    interface: &'static str,
) -> Result<zbus::Proxy<'static>, Error> {
    zbus::proxy::Builder::new(conn)
        .destination(BUS_NAME)
        .and_then(|b| b.path(OBJECT_PATH))
        .and_then(|b| b.interface(interface))
        .map(|b| b.cache_properties(CacheProperties::No))
        .map_err(from_zbus)?
        .build()
        .await
        .map_err(from_zbus)
}

impl Supervisor {
    /// Connects to the supervisor on the bus at `address` (see [`connect_bus`]).
    pub async fn connect(address: Option<&str>) -> Result<Supervisor, Error> {
        Supervisor::on(connect_bus(address).await?).await
    }

    /// The supervisor on an existing connection.
    pub async fn on(conn: zbus::Connection) -> Result<Supervisor, Error> {
        Ok(Supervisor {
            tasks: proxy(&conn, bus::tasks::INTERFACE).await?,
            worker: proxy(&conn, bus::worker::INTERFACE).await?,
            retry: proxy(&conn, bus::retry::INTERFACE).await?,
            agents: proxy(&conn, bus::agents::INTERFACE).await?,
            reconcile: proxy(&conn, bus::reconcile::INTERFACE).await?,
            conn,
            interactive: false,
            timeout: DEFAULT_TIMEOUT,
            protocol: bus::PROTOCOL_VERSION,
            checked: Arc::new(OnceCell::new()),
        })
    }

    /// Declares the protocol this client speaks (normally this build's,
    /// [`bus::PROTOCOL_VERSION`]); an embedding built against an older
    /// airlock states its own so the check compares the right versions.
    pub fn speaking(mut self, protocol: (u32, u32)) -> Self {
        self.protocol = protocol;
        self.checked = Arc::new(OnceCell::new());
        self
    }

    /// Reads the supervisor's `ProtocolVersion` and refuses another major
    /// version (once; later calls reuse the answer). A supervisor older
    /// than 7.0 serves no `Tasks2`: its version is read from `Tasks1`, and
    /// the refusal names both.
    pub async fn check_protocol(&self) -> Result<(), Error> {
        self.checked
            .get_or_try_init(|| async {
                let no_answer = |_| {
                    Error::with(
                        Code::RUNTIME_UNAVAILABLE,
                        "ProtocolVersion: no answer in time",
                    )
                };
                let read = self
                    .tasks
                    .get_property::<String>(bus::tasks::PROTOCOL_VERSION);
                let server = match tokio::time::timeout(self.timeout, read)
                    .await
                    .map_err(no_answer)?
                {
                    Ok(v) => v,
                    Err(e) if names_no_such_interface(&e) => {
                        let old = tokio::time::timeout(self.timeout, self.v1_protocol())
                            .await
                            .map_err(no_answer)??;
                        bus::check_protocol(self.protocol, &old)?;
                        return Err(Error::with(
                            Code::PROTOCOL_VERSION_MISMATCH,
                            format!(
                                "the supervisor serves {} only (protocol {old:?}), this client speaks protocol {} over {}",
                                bus::tasks_v1::INTERFACE,
                                bus::protocol_string(self.protocol),
                                bus::tasks::INTERFACE
                            ),
                        ));
                    }
                    Err(e) => return Err(from_zbus(e)),
                };
                bus::check_protocol(self.protocol, &server)
            })
            .await
            .map(|_| ())
    }

    /// The `ProtocolVersion` a supervisor of before 7.0 shows on `Tasks1`.
    async fn v1_protocol(&self) -> Result<String, Error> {
        let reply = self
            .conn
            .call_method(
                Some(BUS_NAME),
                OBJECT_PATH,
                Some("org.freedesktop.DBus.Properties"),
                "Get",
                &(bus::tasks_v1::INTERFACE, bus::tasks::PROTOCOL_VERSION),
            )
            .await
            .map_err(from_zbus)?;
        let value: OwnedValue = reply.body().deserialize().map_err(from_zbus)?;
        String::try_from(value).map_err(|e| from_zbus(e.into()))
    }

    /// Calls from now on carry ALLOW_INTERACTIVE_AUTHORIZATION when
    /// `interactive` (a human can answer polkit's challenge).
    pub fn interactive(mut self, interactive: bool) -> Self {
        self.interactive = interactive;
        self
    }

    /// Bounds every call by `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The bound on each call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Whether calls allow interactive authorisation.
    pub fn is_interactive(&self) -> bool {
        self.interactive
    }

    /// The connection, for signal subscriptions and the bus daemon.
    pub fn connection(&self) -> &zbus::Connection {
        &self.conn
    }

    async fn bounded<T>(
        &self,
        method: &str,
        call: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        self.check_protocol().await?;
        match tokio::time::timeout(self.timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(Error::with(
                Code::RUNTIME_UNAVAILABLE,
                format!("{method}: no answer within {:?}", self.timeout),
            )),
        }
    }

    async fn raw<B, R>(
        &self,
        proxy: &zbus::Proxy<'static>,
        method: &'static str,
        body: &B,
    ) -> Result<R, Error>
    where
        B: serde::Serialize + DynamicType,
        R: for<'d> zbus::zvariant::DynamicDeserialize<'d>,
    {
        let flags = if self.interactive {
            MethodFlags::AllowInteractiveAuth.into()
        } else {
            Default::default()
        };
        self.bounded(method, async {
            proxy
                .call_with_flags::<_, B, R>(method, flags, body)
                .await
                .map_err(from_zbus)?
                .ok_or_else(|| {
                    Error::with(Code::MESSAGE_INVALID, format!("{method} returned no reply"))
                })
        })
        .await
    }

    /// The proxy of `interface`.
    fn proxy_of(&self, interface: &str) -> Result<&zbus::Proxy<'static>, Error> {
        [
            &self.tasks,
            &self.worker,
            &self.retry,
            &self.agents,
            &self.reconcile,
        ]
        .into_iter()
        .find(|p| p.interface().as_str() == interface)
        .ok_or_else(|| {
            Error::with(
                Code::INTERNAL,
                format!("{interface} is not an interface of the supervisor"),
            )
        })
    }

    /// Calls the method of row `M` with `body`, and decodes its reply
    /// type from the JSON it answers.
    async fn call<M: Call, B>(&self, body: &B) -> Result<M::Reply, Error>
    where
        B: serde::Serialize + DynamicType,
    {
        let row = M::METHOD;
        let text: String = self
            .raw(self.proxy_of(row.interface)?, row.name, body)
            .await?;
        bus::decode(row.name, &text)
    }

    // ---- org.airlock.Tasks2 --------------------------------------------

    /// `SubmitTask`: `submission` is an `airlock.task.v1` document.
    pub async fn submit_task(&self, submission: &serde_json::Value) -> Result<SubmitReply, Error> {
        self.call::<tasks::SubmitTask, _>(&(submission.to_string(),))
            .await
    }

    /// `ReplacePlan`.
    pub async fn replace_plan(
        &self,
        task_id: &str,
        plan: &serde_json::Value,
    ) -> Result<TaskView, Error> {
        self.call::<tasks::ReplacePlan, _>(&(task_id, plan.to_string()))
            .await
    }

    /// `GetTask`.
    pub async fn get_task(&self, task_id: &str) -> Result<TaskView, Error> {
        self.call::<tasks::GetTask, _>(&(task_id,)).await
    }

    /// `GetPlan`: what the task will change and run (its digests and
    /// stored envelope), bound to the caller as `GetTask`. A supervisor
    /// older than protocol 9.1 does not serve it.
    pub async fn get_plan(&self, task_id: &str) -> Result<TaskPlan, Error> {
        self.call::<tasks::GetPlan, _>(&(task_id,)).await
    }

    /// `ListTasks`: `state` and `after` empty for none; `limit` 0 for the default page.
    pub async fn list_tasks(
        &self,
        state: &str,
        after: &str,
        limit: u32,
    ) -> Result<TaskPage, Error> {
        self.call::<tasks::ListTasks, _>(&(state, after, limit))
            .await
    }

    /// `ListEvents`: `task_id` empty for every task.
    pub async fn list_events(
        &self,
        task_id: &str,
        after: i64,
        limit: u32,
    ) -> Result<EventPage, Error> {
        self.call::<tasks::ListEvents, _>(&(task_id, after, limit))
            .await
    }

    /// `ListRepositories`: the registered repositories (an agent: those it
    /// may propose for), by name, with no credential. A supervisor older
    /// than protocol 9.2 does not serve it.
    pub async fn list_repositories(&self) -> Result<bus::RepositoryList, Error> {
        self.call::<tasks::ListRepositories, _>(&()).await
    }

    // ---- org.airlock.Agents1 -------------------------------------------

    /// `ListAgents`.
    pub async fn list_agents(&self) -> Result<bus::AgentList, Error> {
        self.call::<agents::ListAgents, _>(&()).await
    }

    /// `GetAgent`.
    pub async fn get_agent(&self, name: &str) -> Result<bus::AgentView, Error> {
        self.call::<agents::GetAgent, _>(&(name,)).await
    }

    /// `StartAgent` (refused while held: `AGENTOS_CRASH_LOOP`).
    pub async fn start_agent(&self, name: &str) -> Result<bus::AgentView, Error> {
        self.call::<agents::StartAgent, _>(&(name,)).await
    }

    /// `StopAgent`.
    pub async fn stop_agent(&self, name: &str) -> Result<bus::AgentView, Error> {
        self.call::<agents::StopAgent, _>(&(name,)).await
    }

    /// `ClearHold`.
    pub async fn clear_hold(&self, name: &str) -> Result<bus::AgentView, Error> {
        self.call::<agents::ClearHold, _>(&(name,)).await
    }

    /// `CancelQueued`: the stopped agent `name`'s queued tasks CANCELLED
    /// with AGENT_REVOKED (refused while it runs: `AGENT_RUNNING`).
    pub async fn cancel_agent_queued(
        &self,
        name: &str,
        reason: &str,
    ) -> Result<bus::AgentQueueCancelled, Error> {
        self.call::<agents::CancelQueued, _>(&(name, reason)).await
    }

    // ---- org.airlock.Reconcile1 ----------------------------------------

    /// `ListReconciliations`: `status` and `after` empty for none; `limit`
    /// 0 for the default page.
    pub async fn list_reconciliations(
        &self,
        status: &str,
        after: &str,
        limit: u32,
    ) -> Result<ReconciliationPage, Error> {
        self.call::<reconcile::ListReconciliations, _>(&(status, after, limit))
            .await
    }

    /// `GetReconciliation`: the task's latest case.
    pub async fn get_reconciliation(&self, task_id: &str) -> Result<ReconciliationCase, Error> {
        self.call::<reconcile::GetReconciliation, _>(&(task_id,))
            .await
    }

    /// `ResolveReconciliation`.
    pub async fn resolve_reconciliation(
        &self,
        req: &ResolveRequest,
    ) -> Result<ResolveOutcome, Error> {
        let body = req.to_value().to_string();
        self.call::<reconcile::ResolveReconciliation, _>(&(req.task_id.as_str(), body.as_str()))
            .await
    }

    /// `CancelTask`: `req.decision` is cancel.
    pub async fn cancel_task(&self, req: &DecisionRequest) -> Result<DecisionOutcome, Error> {
        let body = req.to_value().to_string();
        self.call::<tasks::CancelTask, _>(&(req.task_id.as_str(), body.as_str()))
            .await
    }

    /// `Verify`: `req.decision` is accept, rework or reject.
    pub async fn verify(&self, req: &DecisionRequest) -> Result<DecisionOutcome, Error> {
        let body = req.to_value().to_string();
        self.call::<tasks::Verify, _>(&(req.task_id.as_str(), body.as_str()))
            .await
    }

    /// Reads a Tasks2 property.
    pub async fn property<T>(&self, name: &str) -> Result<T, Error>
    where
        T: TryFrom<OwnedValue>,
        T::Error: Into<zbus::Error>,
    {
        self.bounded(name, async {
            self.tasks.get_property::<T>(name).await.map_err(from_zbus)
        })
        .await
    }

    /// The unique name owning the supervisor's name, if any.
    pub async fn owner(&self) -> Result<Option<String>, Error> {
        let dbus = zbus::fdo::DBusProxy::new(&self.conn)
            .await
            .map_err(from_zbus)?;
        let name = zbus::names::BusName::try_from(BUS_NAME).map_err(|e| from_zbus(e.into()))?;
        match dbus.get_name_owner(name).await {
            Ok(owner) => Ok(Some(owner.to_string())),
            Err(zbus::fdo::Error::NameHasNoOwner(_)) => Ok(None),
            Err(e) => Err(from_zbus(e.into())),
        }
    }

    /// A stream of `TaskChanged` signals: (task id, state, revision).
    pub async fn task_changes(
        &self,
    ) -> Result<impl futures_util::Stream<Item = (String, String, i64)> + use<>, Error> {
        use futures_util::StreamExt;
        let rule = zbus::MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .sender(BUS_NAME)
            .and_then(|b| b.interface(bus::tasks::INTERFACE))
            .and_then(|b| b.member(bus::tasks::TASK_CHANGED))
            .map(|b| b.build())
            .map_err(from_zbus)?;
        let stream = zbus::MessageStream::for_match_rule(rule, &self.conn, Some(256))
            .await
            .map_err(from_zbus)?;
        Ok(stream.filter_map(|m| async move {
            let m = m.ok()?;
            m.body().deserialize::<(String, String, i64)>().ok()
        }))
    }

    // ---- org.airlock.Worker1 -------------------------------------------

    /// `Claim`: the next task under a fresh lease, or `None`.
    pub async fn claim(&self) -> Result<Option<ClaimGrant>, Error> {
        self.call::<worker::Claim, _>(&()).await
    }

    /// `Renew`: the lease's new expiry (unix ms).
    pub async fn renew(&self, lease: &LeaseRef) -> Result<i64, Error> {
        self.raw(
            &self.worker,
            bus::worker::RENEW,
            &(
                lease.task_id.as_str(),
                lease.lease_epoch,
                lease.lease_token.as_str(),
            ),
        )
        .await
    }

    /// `SubmitResult` under `key`.
    pub async fn submit_result(
        &self,
        lease: &LeaseRef,
        key: &str,
        result: &TaskResult,
    ) -> Result<ResultReceipt, Error> {
        let json = bus::encode(result)?;
        self.call::<worker::SubmitResult, _>(&(
            lease.task_id.as_str(),
            lease.lease_epoch,
            lease.lease_token.as_str(),
            key,
            json.as_str(),
        ))
        .await
    }

    /// `TakeAdoption`: a case an administrator chose to adopt, or `None`.
    pub async fn take_adoption(&self) -> Result<Option<AdoptionCheck>, Error> {
        self.call::<worker::TakeAdoption, _>(&()).await
    }

    /// `ReportUpstream`: an upstream fact for the event log.
    pub async fn report_upstream(
        &self,
        report: &airlock_proto::upstream::UpstreamReport,
    ) -> Result<(), Error> {
        let json = bus::encode(report)?;
        self.call::<worker::ReportUpstream, _>(&(json.as_str(),))
            .await
    }

    /// `SettleAdoption`: what the ref holds; the case as it is now.
    pub async fn settle_adoption(
        &self,
        report: &AdoptionReport,
    ) -> Result<ReconciliationCase, Error> {
        let json = bus::encode(report)?;
        self.call::<worker::SettleAdoption, _>(&(json.as_str(),))
            .await
    }

    // ---- org.airlock.Retry1 --------------------------------------------

    /// `ExtendRetry`: one more attempt for a FAILED, exhausted task, for
    /// the owner `authorization_id`.
    pub async fn extend_retry(
        &self,
        task_id: &str,
        request: &RetryExtensionRequest,
        authorization_id: &str,
    ) -> Result<RetryExtensionOutcome, Error> {
        let json = bus::encode(request)?;
        self.call::<retry::ExtendRetry, _>(&(task_id, json.as_str(), authorization_id))
            .await
    }
}

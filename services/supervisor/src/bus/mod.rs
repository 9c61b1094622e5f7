//! The D-Bus face of the supervisor: `org.airlock.Supervisor1` at
//! `/org/airlock/Supervisor1` with its interfaces — `Tasks2` (and
//! `Tasks1` beside it for one release), `Agents1` and `Reconcile1`
//! (people, polkit), `Worker1` (the worker's uid) and
//! `Retry1` (airlock-retryd's uid). The contract — names, signatures, who
//! may call, the audited event and the reply type — is one row per method
//! in [`airlock_proto::bus`]; the handlers here serve it.
//!
//! Every handler opens with [`Shared::enter`], naming its row and the
//! permission it needs: the call is admitted (shutdown refuses new ones),
//! its sender identified from bus facts and authorised by the row's
//! permission, and the handler gets an [`Entered`] call — the caller and
//! its `Authorized<P>` token, bound to the row — or the refusal goes back
//! on record. Then it parses its arguments strictly, acts through
//! [`crate::ops`], and answers the row's reply type through the call
//! ([`Entered::reply`]): a handler names its row once.
//!
//! Every refusal is a D-Bus error named by the code's `dbus_error_name()`
//! with the human detail as its message ([`error::BusError`]). A call
//! whose arguments are not its row's never reaches its handler: every
//! interface object is exported wrapped in [`strict::Strict`], which
//! refuses it with `MESSAGE_INVALID` first.
//!
//! A planner agent never decides on a task it submitted:
//! `Shared::not_own_decision` refuses its `Verify`, `CancelTask` and
//! `ResolveReconciliation` of such a task with `SELF_APPROVAL_FORBIDDEN`,
//! whatever polkit lets its user do.

pub mod agents;
pub mod caller;
pub mod error;
pub mod inflight;
pub mod reconcile;
pub mod retry;
pub mod strict;
pub mod tasks;
pub mod tasks_v1;
pub mod watchers;
pub mod worker;

use crate::authz::{Authorized, Caller, Gatekeeper, Permission, Read, Scope};
use crate::ops::Ops;
use crate::repositories::Listing;
use airlock_proto::bus::{Call, Method};
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
    /// The connections `TaskChanged` is sent to ([`watchers`]).
    pub(crate) watchers: std::sync::Arc<watchers::Watchers>,
    repositories: std::sync::RwLock<Vec<Listing>>,
    programs: std::sync::RwLock<airlock_config::ProgramTable>,
    agents: std::sync::OnceLock<std::sync::Arc<crate::agents::Agents>>,
    resolver: CallerResolver,
    call_delay: Option<Duration>,
}

impl Shared {
    /// Shared state. `repositories` are the registered repositories,
    /// whose names submissions may use. `call_delay` slows every admitted
    /// call down (tests of orderly shutdown only).
    pub fn new(
        ops: Ops,
        gate: Gatekeeper,
        info: Info,
        repositories: Vec<Listing>,
        call_delay: Option<Duration>,
    ) -> Self {
        Shared {
            ops,
            gate,
            inflight: InFlight::default(),
            info,
            watchers: std::sync::Arc::default(),
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
        self.listings()
            .iter()
            .map(|l| l.name().to_owned())
            .collect()
    }

    /// The registered repositories now, as ListRepositories lists them.
    pub fn listings(&self) -> Vec<Listing> {
        self.repositories
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The agent runners, once started.
    pub fn agents(&self) -> Option<std::sync::Arc<crate::agents::Agents>> {
        self.agents.get().cloned()
    }

    /// Sets the agent runners, once started.
    pub fn set_agents(&self, agents: std::sync::Arc<crate::agents::Agents>) {
        let _ = self.agents.set(agents);
    }

    /// The planner agent `caller` is a process of, from the caller's pid
    /// as the bus daemon reported it. Under systemd: the agent whose unit
    /// (`airlock-agent@NAME.service`) systemd says the process runs in; a
    /// process cannot leave its unit's cgroup, and only root can move it
    /// into one. Under airlock-local: the running agent whose cgroup
    /// (`airlock-agent@NAME`, made by airlock-local) the process is in, by
    /// the same rule, so an agent's process that left its session
    /// (`setsid`) is still the agent ([`crate::agents::Agents::attribute`]).
    pub async fn agent_of(&self, caller: &crate::authz::Caller) -> Option<airlock_config::Agent> {
        let agents = self.agents.get()?;
        agents.attribute(caller.pid()?).await
    }

    /// Which tasks the authorised read `call` sees ([`Gatekeeper::read_scope`]:
    /// every task with `org.airlock.tasks.read-all`, else the caller's
    /// own, an agent's own always); the caller is remembered with it, to
    /// hear `TaskChanged` of those tasks ([`watchers`]).
    pub(crate) async fn read_scope<M: Call>(&self, call: &Entered<'_, M, Read>) -> Scope {
        let agent = self.agent_of(&call.caller).await;
        let scope = self
            .gate
            .read_scope(
                &call.auth,
                &call.caller,
                agent.as_ref().map(|a| a.name.as_str()),
            )
            .await;
        self.watchers.watch(call.caller.sender(), scope.clone());
        scope
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

    /// Replaces the registered repositories (a reload).
    pub fn set_repositories(&self, repositories: Vec<Listing>) {
        *self
            .repositories
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = repositories;
    }

    /// The one entry of every handler: admits a call of the method `M`
    /// (counted in flight, refused once shutdown began), identifies its
    /// sender from bus-verified facts, and authorises it by `M`'s row.
    /// `P` must be the row's permission: a handler asking for another
    /// does not compile. `task_id` is the task the call concerns, for the
    /// audit record. A refusal is recorded under the row's event.
    pub(crate) async fn enter<M: Call, P: Permission>(
        &self,
        conn: &Connection,
        hdr: &Header<'_>,
        task_id: Option<&str>,
    ) -> Result<Entered<'_, M, P>, BusError> {
        const {
            assert!(
                M::METHOD.permission.same(P::RULE),
                "the handler asks for another permission than its row's"
            );
            assert!(M::METHOD.event.is_some(), "every supervisor row is audited");
        }
        let row = &M::METHOD;
        let event = row.event.unwrap_or("UNAUDITED");
        let guard = self.inflight.enter()?;
        if let Some(d) = self.call_delay {
            tokio::time::sleep(d).await;
        }
        let caller = match self.resolver.resolve(conn, hdr).await {
            Ok(caller) => caller,
            Err(e) => {
                let sender = caller::sender_of(hdr).unwrap_or_default();
                self.gate
                    .refuse_unidentified(&sender, event, task_id, &e)
                    .await;
                return Err(e.into());
            }
        };
        let auth = self.gate.authorize::<P>(&caller, row, task_id).await?;
        Ok(Entered {
            caller,
            auth,
            shared: self,
            event,
            task_id: task_id.map(str::to_owned),
            _guard: guard,
            _row: std::marker::PhantomData,
        })
    }
}

impl Shared {
    /// Records the refusal of a call of row `row` whose arguments are not
    /// the row's ([`strict`]): its sender identified from bus facts as any
    /// caller's is, nothing asked of the authoriser, nothing read. Counted
    /// in flight while it records; once shutdown began, the refusal is
    /// answered and not recorded.
    pub(crate) async fn refuse_misshapen(
        &self,
        conn: &Connection,
        hdr: &Header<'_>,
        row: &Method,
        err: &Error,
    ) {
        let Ok(_guard) = self.inflight.enter() else {
            return;
        };
        match self.resolver.resolve(conn, hdr).await {
            Ok(caller) => self.gate.refuse_call(&caller, row, None, err).await,
            Err(_) => {
                let sender = caller::sender_of(hdr).unwrap_or_default();
                let event = row.event.unwrap_or("UNAUDITED");
                self.gate
                    .refuse_unidentified(&sender, event, None, err)
                    .await;
            }
        }
    }

    /// Refuses a decision on task `task_id` (Verify, CancelTask,
    /// ResolveReconciliation) by the planner agent that submitted it, with
    /// `SELF_APPROVAL_FORBIDDEN`, whatever the authoriser said: what an
    /// agent proposes is decided by someone else. The caller is an agent
    /// when the supervisor recognises its process as one (as for a
    /// submission, [`Shared::agent_of`]); its decisions are attributed to
    /// the agent from here on, so this refusal is recorded under the
    /// agent's name, as the submission was. The task's submitter is fixed
    /// when the task is created, so the answer cannot go stale before the
    /// decision. A task that does not exist is left to the decision to
    /// refuse.
    pub(crate) async fn not_own_decision<M: Call, P: Permission>(
        &self,
        call: &mut Entered<'_, M, P>,
        task_id: &str,
    ) -> Result<(), Error> {
        let Some(agent) = self.agent_of(&call.caller).await else {
            return Ok(());
        };
        call.auth.attribute_to_agent(&agent.name);
        let own = call.auth.actor().submitter();
        let submitter = self
            .ops
            .submitter_of(task_id.to_owned())
            .await
            .ok()
            .flatten();
        let r = if submitter.as_ref() == Some(&own) {
            Err(Error::with(
                Code::SELF_APPROVAL_FORBIDDEN,
                format!(
                    "agent {:?} submitted task {task_id}: another must decide on it",
                    agent.name
                ),
            ))
        } else {
            Ok(())
        };
        call.checked(r).await
    }
}

/// One admitted and authorised call of the method of row `M`, as
/// [`Shared::enter`] hands it to its handler: who called, and the token of
/// the row's permission. In flight until dropped.
#[derive(Debug)]
pub(crate) struct Entered<'a, M: Call, P: Permission> {
    /// The sender, from bus facts.
    pub caller: Caller,
    /// The token of the row's permission.
    pub auth: Authorized<P>,
    shared: &'a Shared,
    event: &'static str,
    task_id: Option<String>,
    _guard: CallGuard<'a>,
    _row: std::marker::PhantomData<fn() -> M>,
}

impl<M: Call, P: Permission> Entered<'_, M, P> {
    /// The event the row's calls are audited under.
    pub(crate) fn event(&self) -> &'static str {
        self.event
    }

    /// The reply of the call: the JSON of the row's reply type.
    pub(crate) fn reply(&self, v: &M::Reply) -> Result<String, BusError> {
        Ok(airlock_proto::bus::encode(v)?)
    }

    /// Passes `r` through, recording a refusal (a malformed argument, an
    /// unregistered repository) under the row's event first.
    pub(crate) async fn checked<T>(&self, r: Result<T, Error>) -> Result<T, Error> {
        if let Err(e) = &r {
            self.shared
                .gate
                .record_refusal(&self.auth, self.event, self.task_id.as_deref(), e)
                .await;
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

/// `""` means none.
pub(crate) fn non_empty(s: String) -> Option<String> {
    if s.is_empty() { None } else { Some(s) }
}

//! Authorisation: the one place an [`Authorized`] token is made.
//!
//! # Contract
//!
//! Every D-Bus handler enters through [`crate::bus::Shared::enter`], which
//! calls [`Gatekeeper::authorize`] with the method's row of
//! [`airlock_proto::bus`] **before** the handler reads or changes any state
//! for the caller. The operations in [`crate::ops`] take the token by
//! reference, so a handler that forgets the check does not compile; and a
//! handler whose token is not its row's permission does not compile either.
//!
//! - The caller is what the bus daemon stamped on the message: the sender's
//!   unique name, and the uid the daemon reports for that name
//!   (`GetConnectionCredentials`). A caller whose credentials the bus does
//!   not report is refused ([`crate::bus::caller`]).
//! - A row whose permission is a polkit action asks the configured
//!   [`Authorizer`] about that [`Action`]. With polkit the subject is
//!   `system-bus-name` with the sender's unique name — never the daemon's
//!   own pid — and
//!   `AllowUserInteraction` is set only when the caller's message carried
//!   `ALLOW_INTERACTIVE_AUTHORIZATION`.
//! - Anything but a clear yes is a refusal: not authorised →
//!   `AUTHORIZATION_DENIED`; authorised only after authenticating →
//!   `INTERACTIVE_AUTHORIZATION_REQUIRED`; polkit unreachable, erroring,
//!   slow or answering nonsense → `AUTHORITY_UNAVAILABLE`.
//! - A row reserved for a peer uid (Worker1: the worker's; Retry1:
//!   airlock-retryd's) admits that uid alone; any other is
//!   `PEER_UID_DENIED`. No polkit is involved: these are components, not
//!   people.
//! - Every decision goes to the journal; every refusal also goes to the
//!   task event log ([`airlock_taskdb::tasks::TaskStore::record_denial`]).
//!   Allowed mutations are recorded by the store itself, in the same
//!   transaction as the change. What the caller sent (a task id, the
//!   detail of a refusal that quotes an argument) reaches both only as
//!   [`airlock_proto::shown`] shows it: bounded, escaped, redacted. The
//!   journal line of a refusal is rate-limited per caller
//!   ([`throttle`]); its record in the event log is not.

pub mod local;
pub mod polkit;
#[cfg(any(test, feature = "test-authorizers"))]
pub mod testing;
pub mod throttle;

use crate::store::Store;
use airlock_proto::bus::{Method, Peer, Permission as BusPermission, action};
use airlock_proto::shown::{shown, shown_within};
use airlock_proto::{Code, Error};
use airlock_taskdb::tasks::{Actor, ActorKind, ReadScope};
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;
use throttle::{Throttle, Who};

/// The most bytes of a refusal's detail the journal and the event log
/// show ([`shown_within`]).
pub const MAX_DETAIL_SHOWN: usize = 512;

/// A boxed future, for object-safe async trait methods.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The polkit actions airlock declares (`polkit/org.airlock.policy`).
/// Which methods need which is each method's row in `airlock_proto::bus`
/// (listed in `docs/privsep/messages.md`, rendered from the rows).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Action {
    /// `org.airlock.tasks.read`: the reads of tasks, their plans, events
    /// and reconciliation cases, and of the repositories — the caller's
    /// own tasks.
    Read,
    /// `org.airlock.tasks.read-all`: those reads of every task
    /// ([`Gatekeeper::read_scope`]); no method requires it.
    ReadAll,
    /// `org.airlock.tasks.submit`: submitting a task, replacing its plan.
    Submit,
    /// `org.airlock.tasks.manage`: cancelling and deciding on a task.
    Manage,
    /// `org.airlock.agents.read`: reading the planner agents.
    AgentsRead,
    /// `org.airlock.agents.manage`: starting and stopping an agent,
    /// clearing its hold, cancelling its queue.
    AgentsManage,
    /// `org.airlock.reconcile.manage`: resolving a reconciliation case.
    ReconcileManage,
}

impl Action {
    /// Every action.
    pub const ALL: &'static [Action] = &[
        Action::Read,
        Action::ReadAll,
        Action::Submit,
        Action::Manage,
        Action::AgentsRead,
        Action::AgentsManage,
        Action::ReconcileManage,
    ];

    /// The polkit action id.
    pub const fn polkit_id(self) -> &'static str {
        match self {
            Action::Read => action::TASKS_READ,
            Action::ReadAll => action::TASKS_READ_ALL,
            Action::Submit => action::TASKS_SUBMIT,
            Action::Manage => action::TASKS_MANAGE,
            Action::AgentsRead => action::AGENTS_READ,
            Action::AgentsManage => action::AGENTS_MANAGE,
            Action::ReconcileManage => action::RECONCILE_MANAGE,
        }
    }

    /// The action of a polkit action id of the contract's rows.
    pub fn from_polkit_id(id: &str) -> Option<Action> {
        Action::ALL.iter().copied().find(|a| a.polkit_id() == id)
    }

    /// The short name (`read`, `submit`, `manage`) used by test authorisers.
    pub fn short_name(self) -> &'static str {
        match self {
            Action::Read => "read",
            Action::ReadAll => "read-all",
            Action::Submit => "submit",
            Action::Manage => "manage",
            Action::AgentsRead => "agents-read",
            Action::AgentsManage => "agents-manage",
            Action::ReconcileManage => "reconcile-manage",
        }
    }

    /// Parses a short name.
    pub fn from_short_name(s: &str) -> Option<Action> {
        Action::ALL.iter().copied().find(|a| a.short_name() == s)
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.polkit_id())
    }
}

/// The peer that sent one method call, as the bus daemon reported it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    sender: String,
    uid: u32,
    pid: Option<u32>,
    user: Option<String>,
    interactive: bool,
}

impl Caller {
    /// A caller from bus-verified facts only: `sender` is the unique name
    /// the daemon stamped on the message, `uid` what the daemon reports
    /// for it, `interactive` the message's ALLOW_INTERACTIVE_AUTHORIZATION
    /// header flag. Made by [`crate::bus::caller`] (and by tests).
    pub fn from_bus(sender: &str, uid: u32, user: Option<String>, interactive: bool) -> Self {
        Caller {
            sender: sender.to_owned(),
            uid,
            pid: None,
            user,
            interactive,
        }
    }

    /// With the process id the bus daemon reported for the sender.
    pub fn with_pid(mut self, pid: Option<u32>) -> Self {
        self.pid = pid;
        self
    }

    /// The sender's process id, as the bus daemon reported it.
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// The sender's unique bus name (`:1.42`).
    pub fn sender(&self) -> &str {
        &self.sender
    }

    /// The sender's unix uid.
    pub fn uid(&self) -> u32 {
        self.uid
    }

    /// Whether the caller allowed interactive authorisation.
    pub fn interactive(&self) -> bool {
        self.interactive
    }

    /// The same caller, as if its message had not allowed interactive
    /// authorisation.
    pub fn without_interaction(&self) -> Caller {
        Caller {
            interactive: false,
            ..self.clone()
        }
    }

    /// The audit identity: `user@:1.42` (or `uid:N@:1.42`).
    pub fn actor(&self, kind: ActorKind) -> Actor {
        let who = match &self.user {
            Some(u) => u.clone(),
            None => format!("uid:{}", self.uid),
        };
        Actor::new(kind, Some(self.uid), format!("{who}@{}", self.sender))
    }
}

/// What an [`Authorizer`] answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Go ahead.
    Allow,
    /// Refuse with this code and detail.
    Deny(Error),
}

/// Decides whether a caller may perform a polkit action. Implementations
/// return a [`Verdict`]; only the [`Gatekeeper`] turns it into a token.
pub trait Authorizer: Send + Sync + fmt::Debug {
    /// The name announced at start-up and in the `Authorizer` property
    /// (`polkit`, `allow-all-for-tests`, …).
    fn name(&self) -> String;

    /// True for the test authorisers, which are never chosen implicitly.
    fn is_for_tests(&self) -> bool;

    /// Asks about one action for one caller. Never panics, never hangs
    /// forever: an implementation bounds its own waiting.
    fn check<'a>(&'a self, action: Action, caller: &'a Caller) -> BoxFuture<'a, Verdict>;
}

mod sealed {
    pub trait Sealed {}
}

/// A permission an [`Authorized`] token can carry: one
/// [`airlock_proto::bus::Permission`] of the contract's rows, as a type.
pub trait Permission: sealed::Sealed + Send + Sync + 'static {
    /// For logs.
    const NAME: &'static str;
    /// The rule it stands for; the entry function
    /// ([`crate::bus::Shared::enter`]) refuses to compile a handler whose
    /// row says another.
    const RULE: BusPermission;
    /// How the actor is recorded in the event log.
    const ACTOR_KIND: ActorKind;
}

macro_rules! permission {
    ($(#[doc = $doc:literal])* $name:ident, $rule:expr, $kind:expr) => {
        $(#[doc = $doc])*
        #[derive(Debug)]
        pub enum $name {}
        impl sealed::Sealed for $name {}
        impl Permission for $name {
            const NAME: &'static str = stringify!($name);
            const RULE: BusPermission = $rule;
            const ACTOR_KIND: ActorKind = $kind;
        }
    };
}

permission!(
    /// `org.airlock.tasks.read`.
    Read,
    BusPermission::Polkit(action::TASKS_READ),
    ActorKind::Admin
);
permission!(
    /// `org.airlock.tasks.submit` (the planner's action; admins may too).
    Submit,
    BusPermission::Polkit(action::TASKS_SUBMIT),
    ActorKind::Planner
);
permission!(
    /// `org.airlock.tasks.manage`.
    Manage,
    BusPermission::Polkit(action::TASKS_MANAGE),
    ActorKind::Admin
);
permission!(
    /// `org.airlock.agents.read`.
    AgentsRead,
    BusPermission::Polkit(action::AGENTS_READ),
    ActorKind::Admin
);
permission!(
    /// `org.airlock.agents.manage`.
    AgentsManage,
    BusPermission::Polkit(action::AGENTS_MANAGE),
    ActorKind::Admin
);
permission!(
    /// `org.airlock.reconcile.manage`.
    ReconcileManage,
    BusPermission::Polkit(action::RECONCILE_MANAGE),
    ActorKind::Admin
);
permission!(
    /// Worker1: the caller's uid is the configured worker's.
    Worker,
    BusPermission::PeerUid(Peer::Worker),
    ActorKind::Worker
);
permission!(
    /// Retry1: the caller's uid is airlock-retryd's.
    Retry,
    BusPermission::PeerUid(Peer::Retry),
    ActorKind::Owner
);

/// How the caller of a method with the rule `rule` is recorded: the
/// [`Permission::ACTOR_KIND`] of the permission type standing for it
/// (for a refusal made before any token: a call whose arguments are not
/// its row's).
pub fn actor_kind_of(rule: BusPermission) -> ActorKind {
    match rule {
        BusPermission::Polkit(action::TASKS_SUBMIT) => Submit::ACTOR_KIND,
        BusPermission::Polkit(_) => Read::ACTOR_KIND,
        BusPermission::PeerUid(Peer::Worker) => Worker::ACTOR_KIND,
        BusPermission::PeerUid(Peer::Retry) => Retry::ACTOR_KIND,
        BusPermission::PeerUid(Peer::Supervisor) => ActorKind::System,
    }
}

/// The uids the component interfaces are reserved for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerUids {
    /// `supervisor.worker_user`: Worker1.
    pub worker: u32,
    /// `retry.user`: Retry1.
    pub retry: u32,
}

impl PeerUids {
    /// The uid `peer` is, if the supervisor admits it at all (it serves
    /// nothing reserved for itself).
    pub fn of(&self, peer: Peer) -> Option<u32> {
        match peer {
            Peer::Worker => Some(self.worker),
            Peer::Retry => Some(self.retry),
            Peer::Supervisor => None,
        }
    }
}

/// Proof that one caller was authorised for permission `P`. Only this
/// module can make one; it is neither `Clone` nor constructible elsewhere.
#[must_use]
pub struct Authorized<P: Permission> {
    actor: Actor,
    _permission: PhantomData<P>,
}

impl<P: Permission> Authorized<P> {
    fn grant(actor: Actor) -> Self {
        Authorized {
            actor,
            _permission: PhantomData,
        }
    }

    /// Who was authorised, as recorded in events.
    pub fn actor(&self) -> &Actor {
        &self.actor
    }
}

impl<P: Permission> Authorized<P> {
    /// The same permission, its actor named as the planner agent `agent`
    /// it was recognised as (`agent:NAME uid-name@:1.42`): what it does
    /// (a submission, a decision) and its refusals are attributed to the
    /// agent.
    pub fn attributed_to_agent(mut self, agent: &str) -> Self {
        self.attribute_to_agent(agent);
        self
    }

    /// [`Self::attributed_to_agent`] in place.
    pub fn attribute_to_agent(&mut self, agent: &str) {
        self.actor.name = format!("agent:{agent} {}", self.actor.name);
    }
}

/// The planner agent a recorded actor was attributed to by
/// [`Authorized::attributed_to_agent`], if any ([`Actor::agent`]: no
/// other actor's name starts with `agent:`).
pub fn attributed_agent(actor: &Actor) -> Option<&str> {
    actor.agent()
}

/// Which tasks one authorised read sees: made by
/// [`Gatekeeper::read_scope`] only, and taken by every read of
/// [`crate::ops`] beside its [`Authorized<Read>`] token, so a read cannot
/// pick its own scope.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scope(ReadScope);

impl Scope {
    /// What the store filters by.
    pub fn read_scope(&self) -> &ReadScope {
        &self.0
    }

    /// Whether it is every task.
    pub fn is_all(&self) -> bool {
        self.0 == ReadScope::All
    }

    /// Every task, for the worker (Worker1: it claims any task, and is
    /// told of every change so it can claim at once).
    pub fn of_worker(_auth: &Authorized<Worker>) -> Scope {
        Scope(ReadScope::All)
    }

    /// The submitter's own tasks, for a caller that submitted (SubmitTask,
    /// ReplacePlan) and so follows what it submitted.
    pub fn of_submitter(auth: &Authorized<Submit>) -> Option<Scope> {
        let s = auth.actor().submitter();
        Some(Scope(ReadScope::Own {
            uid: s.uid?,
            agent: s.agent,
        }))
    }
}

impl<P: Permission> fmt::Debug for Authorized<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Authorized")
            .field("permission", &P::NAME)
            .field("actor", &self.actor)
            .finish()
    }
}

/// Runs the authoriser, audits the decision, and makes the tokens.
#[derive(Clone, Debug)]
pub struct Gatekeeper {
    authorizer: Arc<dyn Authorizer>,
    peers: PeerUids,
    store: Store,
    throttle: Arc<Throttle>,
}

impl Gatekeeper {
    /// A gatekeeper asking `authorizer`, reserving Worker1 and Retry1 for
    /// the `peers` uids, and recording refusals in `store`.
    pub fn new(authorizer: Arc<dyn Authorizer>, peers: PeerUids, store: Store) -> Self {
        Gatekeeper {
            authorizer,
            peers,
            store,
            throttle: Arc::default(),
        }
    }

    /// The authoriser's name.
    pub fn authorizer_name(&self) -> String {
        self.authorizer.name()
    }

    /// The uid Worker1 is reserved for.
    pub fn worker_uid(&self) -> u32 {
        self.peers.worker
    }

    /// Authorises `caller` for the method of row `row` by the row's
    /// permission: a polkit action goes to the authoriser, a peer uid is
    /// compared with the uid the bus daemon reported. The row's event
    /// names the operation in the event log; `task_id` is the task it
    /// concerns, if any (kept by the store only when well formed). A token
    /// of `P` is made only when `P` is the row's permission (the entry
    /// function checks that at compile time; this is the same check for
    /// any other caller).
    pub async fn authorize<P: Permission>(
        &self,
        caller: &Caller,
        row: &Method,
        task_id: Option<&str>,
    ) -> Result<Authorized<P>, Error> {
        let actor = caller.actor(P::ACTOR_KIND);
        let event = row.event.unwrap_or("UNAUDITED");
        if !P::RULE.same(row.permission) {
            let err = Error::with(
                Code::INTERNAL,
                format!(
                    "{} is served with the permission {} but its row says {:?}",
                    row.path(),
                    P::NAME,
                    row.permission
                ),
            );
            self.refuse(&actor, event, task_id, &err, "row").await;
            return Err(err);
        }
        match row.permission {
            BusPermission::Polkit(id) => {
                let Some(action) = Action::from_polkit_id(id) else {
                    let err = Error::with(
                        Code::INTERNAL,
                        format!("{}: {id} is not a declared polkit action", row.path()),
                    );
                    self.refuse(&actor, event, task_id, &err, "row").await;
                    return Err(err);
                };
                self.ask(action, caller, actor, event, task_id).await
            }
            BusPermission::PeerUid(peer) => self.peer(peer, caller, actor, row, task_id).await,
        }
    }

    async fn ask<P: Permission>(
        &self,
        action: Action,
        caller: &Caller,
        actor: Actor,
        event: &'static str,
        task_id: Option<&str>,
    ) -> Result<Authorized<P>, Error> {
        match self.authorizer.check(action, caller).await {
            Verdict::Allow => {
                tracing::info!(
                    target: "airlock::authz",
                    action = action.polkit_id(),
                    sender = caller.sender(),
                    uid = caller.uid(),
                    interactive = caller.interactive(),
                    task_id = task_id.map(shown),
                    operation = event,
                    authorizer = %self.authorizer.name(),
                    "authorised"
                );
                Ok(Authorized::grant(actor))
            }
            Verdict::Deny(err) => {
                self.refuse(&actor, event, task_id, &err, action.polkit_id())
                    .await;
                Err(err)
            }
        }
    }

    /// Admits only the uid `peer` is reserved for (Worker1: the worker;
    /// Retry1: airlock-retryd), as the bus daemon reports the caller. No
    /// polkit is involved: these are components, not people.
    async fn peer<P: Permission>(
        &self,
        peer: Peer,
        caller: &Caller,
        actor: Actor,
        row: &Method,
        task_id: Option<&str>,
    ) -> Result<Authorized<P>, Error> {
        let event = row.event.unwrap_or("UNAUDITED");
        let reserved = self.peers.of(peer);
        if reserved == Some(caller.uid()) {
            tracing::debug!(
                target: "airlock::authz",
                sender = caller.sender(),
                uid = caller.uid(),
                task_id = task_id.map(shown),
                operation = event,
                interface = row.interface,
                "component peer admitted"
            );
            return Ok(Authorized::grant(actor));
        }
        let err = Error::with(
            Code::PEER_UID_DENIED,
            match reserved {
                Some(uid) => format!(
                    "uid {} may not call {} (reserved for uid {uid})",
                    caller.uid(),
                    row.path(),
                ),
                None => format!("{} is not served here", row.path()),
            },
        );
        self.refuse(&actor, event, task_id, &err, "peer-uid").await;
        Err(err)
    }

    /// Which tasks the read `auth` of `caller` sees: every task when the
    /// caller holds `org.airlock.tasks.read-all`, otherwise the tasks it
    /// submitted (its uid, and `agent`: the planner agent the supervisor
    /// recognised it as, or none). A recognised agent is never asked
    /// about: an agent reads its own tasks only, whatever polkit would say
    /// of its user.
    ///
    /// The question is asked without interaction, whatever the caller's
    /// message allowed: a read never prompts for an administrator's
    /// password, and a caller polkit would only challenge reads its own
    /// tasks. Any answer but a clear yes (no, a challenge, polkit
    /// unreachable) is the narrower scope; it is no refusal and is logged
    /// to the journal, not the event log.
    pub async fn read_scope(
        &self,
        auth: &Authorized<Read>,
        caller: &Caller,
        agent: Option<&str>,
    ) -> Scope {
        let own = Scope(ReadScope::Own {
            uid: caller.uid(),
            agent: agent.map(str::to_owned),
        });
        if agent.is_none() && self.may_read_all(caller).await {
            tracing::debug!(
                target: "airlock::authz",
                sender = caller.sender(),
                actor = %auth.actor().name,
                "reads of every task"
            );
            Scope(ReadScope::All)
        } else {
            own
        }
    }

    /// Whether `caller` holds `org.airlock.tasks.read-all`, asked without
    /// interaction ([`Self::read_scope`]); anything but a clear yes is no.
    pub async fn may_read_all(&self, caller: &Caller) -> bool {
        match self
            .authorizer
            .check(Action::ReadAll, &caller.without_interaction())
            .await
        {
            Verdict::Allow => true,
            Verdict::Deny(e) => {
                tracing::debug!(
                    target: "airlock::authz",
                    action = Action::ReadAll.polkit_id(),
                    sender = caller.sender(),
                    uid = caller.uid(),
                    code = e.code.as_str(),
                    "bound to the caller's own tasks"
                );
                false
            }
        }
    }

    /// Records a refusal decided after authorisation but outside the store
    /// (a malformed argument, an unregistered repository): the store logs
    /// its own refusals, this logs the rest.
    pub async fn record_refusal<P: Permission>(
        &self,
        auth: &Authorized<P>,
        event: &'static str,
        task_id: Option<&str>,
        err: &Error,
    ) {
        self.refuse(&auth.actor, event, task_id, err, "request")
            .await;
    }

    /// Records the refusal of a call of the method of row `row` by
    /// `caller` made before it was authorised: its arguments are not the
    /// row's (nothing was read, nothing asked). Recorded as the row's
    /// permission records its caller, under the row's event.
    pub async fn refuse_call(
        &self,
        caller: &Caller,
        row: &Method,
        task_id: Option<&str>,
        err: &Error,
    ) {
        let actor = caller.actor(actor_kind_of(row.permission));
        let event = row.event.unwrap_or("UNAUDITED");
        self.refuse(&actor, event, task_id, err, "arguments").await;
    }

    /// Logs, once per caller whose window of refusals is over, how many
    /// of its refusals were not logged ([`throttle`]); called now and then
    /// (each sweep), so that a caller that stopped is summed up too.
    pub fn log_refusals_not_logged(&self) {
        self.summarise(self.throttle.ended(Instant::now()));
    }

    fn summarise(&self, summaries: Vec<throttle::Summary>) {
        for s in summaries {
            tracing::warn!(
                target: "airlock::authz",
                "{} more refusals from {} not logged in the last {} s (each was answered, and recorded in the event log)",
                s.not_logged,
                s.who,
                self.throttle.window().as_secs()
            );
        }
    }

    /// Records a refusal that happened before authorisation could be asked
    /// (the bus did not report the caller's credentials).
    pub async fn refuse_unidentified(
        &self,
        sender: &str,
        event: &'static str,
        task_id: Option<&str>,
        err: &Error,
    ) {
        let actor = Actor::new(ActorKind::Admin, None, format!("unidentified@{sender}"));
        self.refuse(&actor, event, task_id, err, "caller-credentials")
            .await;
    }

    /// Logs (rate-limited per caller) and records one refusal. What the
    /// caller sent reaches both only as [`shown`] shows it: a task id
    /// bounded to [`airlock_proto::shown::MAX_SHOWN`] bytes, the detail to
    /// [`MAX_DETAIL_SHOWN`], escaped and redacted.
    async fn refuse(
        &self,
        actor: &Actor,
        event: &'static str,
        task_id: Option<&str>,
        err: &Error,
        check: &str,
    ) {
        let task = task_id.map(shown);
        let detail = shown_within(err.detail.as_deref().unwrap_or_default(), MAX_DETAIL_SHOWN);
        let who = match actor.uid {
            Some(uid) => Who::Uid(uid),
            None => Who::Sender(actor.name.clone()),
        };
        let noted = self.throttle.note(who.clone(), Instant::now());
        self.summarise(noted.summaries);
        if noted.log {
            tracing::warn!(
                target: "airlock::authz",
                check,
                code = err.code.as_str(),
                actor = %shown(&actor.name),
                uid = actor.uid,
                task_id = task.as_deref(),
                operation = event,
                authorizer = %self.authorizer.name(),
                "refused: {detail}"
            );
        } else if noted.quiet_from_now {
            tracing::warn!(
                target: "airlock::authz",
                "{who}: more than {} refusals within {} s; its next ones in that time are not logged (each is still answered, and recorded in the event log)",
                throttle::BURST,
                self.throttle.window().as_secs()
            );
        }
        let (actor, code) = (actor.clone(), err.code);
        let recorded = self
            .store
            .run(move |s| s.record_denial(task.as_deref(), &actor, event, code, &detail))
            .await;
        if let Err(e) = recorded.and_then(|r| r.map_err(|e| Error::with(e.code(), e.to_string()))) {
            tracing::error!(target: "airlock::authz", "could not record a denial in the event log: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::TestAuthorizer;
    use super::*;
    use airlock_proto::bus::{Call, retry, tasks, worker};
    use airlock_taskdb::tasks::EventOutcome;

    const CANCEL: &Method = &<tasks::CancelTask as Call>::METHOD;
    const SUBMIT: &Method = &<tasks::SubmitTask as Call>::METHOD;
    const CLAIM: &Method = &<worker::Claim as Call>::METHOD;
    const EXTEND: &Method = &<retry::ExtendRetry as Call>::METHOD;

    #[test]
    fn an_attributed_actor_names_its_agent_and_no_other_does() {
        let planner = Actor::new(ActorKind::Planner, Some(989), "airlock-agent@:1.4");
        assert_eq!(attributed_agent(&planner), None);
        let uid_only = Actor::new(ActorKind::Planner, Some(989), "uid:989@:1.4");
        assert_eq!(attributed_agent(&uid_only), None);
        let token = Authorized::<Submit>::grant(planner).attributed_to_agent("replacer");
        assert_eq!(attributed_agent(token.actor()), Some("replacer"));
    }

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&airlock_taskdb::Location::Sqlite(
            dir.path().join("t.sqlite3"),
        ))
        .unwrap();
        (dir, store)
    }

    const PEERS: PeerUids = PeerUids {
        worker: 4242,
        retry: 4343,
    };

    fn caller(uid: u32) -> Caller {
        Caller::from_bus(":1.7", uid, Some("alice".into()), false)
    }

    #[tokio::test]
    async fn allowed_action_yields_a_token_with_the_callers_identity() {
        let (_d, store) = store();
        let gate = Gatekeeper::new(Arc::new(TestAuthorizer::allow_all()), PEERS, store);
        let token: Authorized<Manage> = gate
            .authorize(&caller(1000), CANCEL, Some("task-a"))
            .await
            .unwrap();
        assert_eq!(token.actor().uid, Some(1000));
        assert_eq!(token.actor().name, "alice@:1.7");
        assert_eq!(token.actor().kind, ActorKind::Admin);
    }

    #[tokio::test]
    async fn denial_is_returned_and_recorded() {
        let (_d, store) = store();
        let gate = Gatekeeper::new(Arc::new(TestAuthorizer::deny_all()), PEERS, store.clone());
        let err = gate
            .authorize::<Submit>(&caller(1000), SUBMIT, Some("task-a"))
            .await
            .unwrap_err();
        assert_eq!(err.code, Code::AUTHORIZATION_DENIED);
        let events = store.run(|s| s.events(None, 0, 10)).await.unwrap().unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].outcome, EventOutcome::Denied);
        assert_eq!(events[0].code, Some(Code::AUTHORIZATION_DENIED));
        assert_eq!(events[0].action, "TASK_SUBMITTED");
        assert_eq!(events[0].task_id.as_deref(), Some("task-a"));
        assert_eq!(events[0].actor.uid, Some(1000));
    }

    #[tokio::test]
    async fn worker_methods_are_reserved_for_one_uid() {
        let (_d, store) = store();
        let gate = Gatekeeper::new(Arc::new(TestAuthorizer::allow_all()), PEERS, store.clone());
        assert!(
            gate.authorize::<Worker>(&caller(4242), CLAIM, None)
                .await
                .is_ok()
        );
        let err = gate
            .authorize::<Worker>(&caller(0), CLAIM, None)
            .await
            .unwrap_err();
        assert_eq!(err.code, Code::PEER_UID_DENIED);
        let events = store.run(|s| s.events(None, 0, 10)).await.unwrap().unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].code, Some(Code::PEER_UID_DENIED));
        assert_eq!(events[0].actor.kind, ActorKind::Worker);
    }

    #[tokio::test]
    async fn retry_methods_are_reserved_for_retryd_alone() {
        let (_d, store) = store();
        let gate = Gatekeeper::new(Arc::new(TestAuthorizer::allow_all()), PEERS, store.clone());
        let token = gate
            .authorize::<Retry>(&caller(4343), EXTEND, None)
            .await
            .unwrap();
        assert_eq!(token.actor().kind, ActorKind::Owner);
        // Not the worker, not root, not an admin polkit would allow.
        for uid in [4242, 0, 1000] {
            let err = gate
                .authorize::<Retry>(&caller(uid), EXTEND, Some("task-a"))
                .await
                .unwrap_err();
            assert_eq!(err.code, Code::PEER_UID_DENIED);
        }
        // Nor may retryd call Worker1.
        let err = gate
            .authorize::<Worker>(&caller(4343), CLAIM, None)
            .await
            .unwrap_err();
        assert_eq!(err.code, Code::PEER_UID_DENIED);
        let events = store.run(|s| s.events(None, 0, 10)).await.unwrap().unwrap();
        assert_eq!(events.len(), 4);
        assert!(events.iter().all(|e| e.code == Some(Code::PEER_UID_DENIED)));
    }

    #[tokio::test]
    async fn a_token_is_made_only_for_the_rows_permission() {
        let (_d, store) = store();
        let gate = Gatekeeper::new(Arc::new(TestAuthorizer::allow_all()), PEERS, store.clone());
        // Allowed by everyone, yet Read is not CancelTask's permission.
        let err = gate
            .authorize::<Read>(&caller(1000), CANCEL, Some("task-a"))
            .await
            .unwrap_err();
        assert_eq!(err.code, Code::INTERNAL, "{err}");
        let err = gate
            .authorize::<Worker>(&caller(4242), EXTEND, None)
            .await
            .unwrap_err();
        assert_eq!(err.code, Code::INTERNAL, "{err}");
        let events = store.run(|s| s.events(None, 0, 10)).await.unwrap().unwrap();
        assert_eq!(events.len(), 2, "each refusal is on record");
    }

    #[tokio::test]
    async fn a_refusal_records_a_bounded_escaped_excerpt_of_what_was_sent() {
        let (_d, store) = store();
        let huge = format!("task\n{}", "x".repeat(1 << 20));
        let gate = Gatekeeper::new(Arc::new(TestAuthorizer::deny_all()), PEERS, store.clone());
        gate.authorize::<Submit>(&caller(1000), SUBMIT, Some(&huge))
            .await
            .unwrap_err();
        let gate = Gatekeeper::new(Arc::new(TestAuthorizer::allow_all()), PEERS, store.clone());
        let token: Authorized<Submit> = gate.authorize(&caller(1000), SUBMIT, None).await.unwrap();
        let quoted = Error::with(Code::TASK_ID_INVALID, format!("{huge:?} is no task id"));
        gate.record_refusal(&token, "TASK_SUBMITTED", Some(&huge), &quoted)
            .await;
        let events = store.run(|s| s.events(None, 0, 10)).await.unwrap().unwrap();
        assert_eq!(events.len(), 2);
        for e in &events {
            assert_eq!(e.task_id, None, "an ill-formed id is not kept");
            let detail = e.payload["detail"].as_str().unwrap();
            assert!(detail.len() <= MAX_DETAIL_SHOWN + 32, "{}", detail.len());
            assert!(!detail.contains('\n'), "{detail}");
        }
        let detail = events[1].payload["detail"].as_str().unwrap();
        assert!(
            detail.starts_with("\"task\\\\nxxx") && detail.ends_with(" bytes cut]"),
            "{detail}"
        );
    }

    #[test]
    fn a_refusal_before_the_token_records_the_caller_as_the_token_would() {
        fn kind<P: Permission>() -> (BusPermission, ActorKind) {
            (P::RULE, P::ACTOR_KIND)
        }
        let kinds = [
            kind::<Read>(),
            kind::<Submit>(),
            kind::<Manage>(),
            kind::<AgentsRead>(),
            kind::<AgentsManage>(),
            kind::<ReconcileManage>(),
            kind::<Worker>(),
            kind::<Retry>(),
        ];
        for m in airlock_proto::bus::ROWS.iter().flat_map(|r| r.iter()) {
            let (_, k) = kinds
                .iter()
                .find(|(rule, _)| rule.same(m.permission))
                .unwrap_or_else(|| panic!("{}: no permission type", m.path()));
            assert_eq!(actor_kind_of(m.permission), *k, "{}", m.path());
        }
    }

    #[test]
    fn every_rows_polkit_action_is_declared() {
        for m in airlock_proto::bus::every_row() {
            if let BusPermission::Polkit(id) = m.permission {
                assert!(Action::from_polkit_id(id).is_some(), "{}: {id}", m.path());
            }
        }
        assert_eq!(Action::ALL.len(), action::ALL.len());
    }

    #[test]
    fn action_names() {
        for a in Action::ALL {
            assert_eq!(Action::from_short_name(a.short_name()), Some(*a));
            let id = a.polkit_id();
            assert!(
                [
                    "org.airlock.tasks.",
                    "org.airlock.agents.",
                    "org.airlock.reconcile."
                ]
                .iter()
                .any(|p| id.starts_with(p)),
                "{id}"
            );
            let policy = include_str!("../../../../polkit/org.airlock.policy");
            assert!(
                policy.contains(&format!("<action id=\"{id}\">")),
                "{id} is not in polkit/org.airlock.policy"
            );
        }
    }
}

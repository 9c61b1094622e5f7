//! Authorisation: the one place an [`Authorized`] token is made.
//!
//! # Contract
//!
//! Every D-Bus handler calls [`Gatekeeper::authorize`] (Tasks1) or
//! [`Gatekeeper::authorize_peer`] (Worker1, Retry1) **before** it reads or changes
//! any state for the caller. The operations in [`crate::ops`] take the token
//! by reference, so a handler that forgets the check does not compile.
//!
//! - The caller is what the bus daemon stamped on the message: the sender's
//!   unique name, and the uid the daemon reports for that name
//!   (`GetConnectionCredentials`). A caller whose credentials the bus does
//!   not report is refused ([`crate::bus::caller`]).
//! - Tasks1 methods ask the configured [`Authorizer`] about one polkit
//!   [`Action`]. With polkit the subject is `system-bus-name` with the
//!   sender's unique name — never the daemon's own pid — and
//!   `AllowUserInteraction` is set only when the caller's message carried
//!   `ALLOW_INTERACTIVE_AUTHORIZATION`.
//! - Anything but a clear yes is a refusal: not authorised →
//!   `AUTHORIZATION_DENIED`; authorised only after authenticating →
//!   `INTERACTIVE_AUTHORIZATION_REQUIRED`; polkit unreachable, erroring,
//!   slow or answering nonsense → `AUTHORITY_UNAVAILABLE`.
//! - Worker1 methods are reserved for the worker's unix uid and Retry1's
//!   for airlock-retryd's; any other is `PEER_UID_DENIED`. No polkit is
//!   involved: these are components, not people.
//! - Every decision goes to the journal; every refusal also goes to the
//!   task event log ([`airlock_taskdb::tasks::TaskStore::record_denial`]).
//!   Allowed mutations are recorded by the store itself, in the same
//!   transaction as the change.

pub mod local;
pub mod polkit;
#[cfg(any(test, feature = "test-authorizers"))]
pub mod testing;

use crate::ops::Store;
use airlock_proto::{Code, Error};
use airlock_taskdb::tasks::{Actor, ActorKind};
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;

/// A boxed future, for object-safe async trait methods.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The polkit actions airlock declares (`polkit/org.airlock.policy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Action {
    /// `org.airlock.tasks.read`: GetTask, ListTasks, ListEvents.
    Read,
    /// `org.airlock.tasks.submit`: SubmitTask, ReplacePlan.
    Submit,
    /// `org.airlock.tasks.manage`: CancelTask, Verify.
    Manage,
    /// `org.airlock.agents.read`: ListAgents, GetAgent.
    AgentsRead,
    /// `org.airlock.agents.manage`: StartAgent, StopAgent, ClearHold.
    AgentsManage,
    /// `org.airlock.reconcile.manage`: ResolveReconciliation.
    ReconcileManage,
}

impl Action {
    /// Every action.
    pub const ALL: &'static [Action] = &[
        Action::Read,
        Action::Submit,
        Action::Manage,
        Action::AgentsRead,
        Action::AgentsManage,
        Action::ReconcileManage,
    ];

    /// The polkit action id.
    pub fn polkit_id(self) -> &'static str {
        match self {
            Action::Read => "org.airlock.tasks.read",
            Action::Submit => "org.airlock.tasks.submit",
            Action::Manage => "org.airlock.tasks.manage",
            Action::AgentsRead => "org.airlock.agents.read",
            Action::AgentsManage => "org.airlock.agents.manage",
            Action::ReconcileManage => "org.airlock.reconcile.manage",
        }
    }

    /// The short name (`read`, `submit`, `manage`) used by test authorisers.
    pub fn short_name(self) -> &'static str {
        match self {
            Action::Read => "read",
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

/// A permission an [`Authorized`] token can carry.
pub trait Permission: sealed::Sealed + Send + Sync + 'static {
    /// For logs.
    const NAME: &'static str;
}

/// A permission decided by the [`Authorizer`] (polkit).
pub trait PolkitPermission: Permission {
    /// The action asked about.
    const ACTION: Action;
    /// How the actor is recorded in the event log.
    const ACTOR_KIND: ActorKind;
}

macro_rules! permission {
    ($(#[doc = $doc:literal])* $name:ident, $action:expr, $kind:expr) => {
        $(#[doc = $doc])*
        #[derive(Debug)]
        pub enum $name {}
        impl sealed::Sealed for $name {}
        impl Permission for $name {
            const NAME: &'static str = stringify!($name);
        }
        impl PolkitPermission for $name {
            const ACTION: Action = $action;
            const ACTOR_KIND: ActorKind = $kind;
        }
    };
}

permission!(
    /// `org.airlock.tasks.read`.
    Read,
    Action::Read,
    ActorKind::Admin
);
permission!(
    /// `org.airlock.tasks.submit` (the planner's action; admins may too).
    Submit,
    Action::Submit,
    ActorKind::Planner
);
permission!(
    /// `org.airlock.tasks.manage`.
    Manage,
    Action::Manage,
    ActorKind::Admin
);

permission!(
    /// `org.airlock.agents.read`.
    AgentsRead,
    Action::AgentsRead,
    ActorKind::Admin
);
permission!(
    /// `org.airlock.agents.manage`.
    AgentsManage,
    Action::AgentsManage,
    ActorKind::Admin
);
permission!(
    /// `org.airlock.reconcile.manage`.
    ReconcileManage,
    Action::ReconcileManage,
    ActorKind::Admin
);

/// A permission reserved for one peer uid (a component, not a person).
pub trait PeerPermission: Permission {
    /// The interface the uid is reserved for, for refusal messages.
    const INTERFACE: &'static str;
    /// How the actor is recorded in the event log.
    const ACTOR_KIND: ActorKind;
    /// The reserved uid among the gatekeeper's.
    fn uid(uids: &PeerUids) -> u32;
}

/// The Worker1 permission: the caller's uid is the configured worker's.
#[derive(Debug)]
pub enum Worker {}
impl sealed::Sealed for Worker {}
impl Permission for Worker {
    const NAME: &'static str = "Worker";
}
impl PeerPermission for Worker {
    const INTERFACE: &'static str = airlock_proto::bus::worker::INTERFACE;
    const ACTOR_KIND: ActorKind = ActorKind::Worker;
    fn uid(uids: &PeerUids) -> u32 {
        uids.worker
    }
}

/// The Retry1 permission: the caller's uid is airlock-retryd's.
#[derive(Debug)]
pub enum Retry {}
impl sealed::Sealed for Retry {}
impl Permission for Retry {
    const NAME: &'static str = "Retry";
}
impl PeerPermission for Retry {
    const INTERFACE: &'static str = airlock_proto::bus::retry::INTERFACE;
    const ACTOR_KIND: ActorKind = ActorKind::Owner;
    fn uid(uids: &PeerUids) -> u32 {
        uids.retry
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

impl Authorized<Submit> {
    /// The same permission, its actor named as the planner agent `agent`
    /// it was recognised as (`agent:NAME uid-name@:1.42`): the submission
    /// and its events are attributed to the agent.
    pub fn attributed_to_agent(mut self, agent: &str) -> Self {
        self.actor.name = format!("agent:{agent} {}", self.actor.name);
        self
    }
}

/// The planner agent a recorded actor was attributed to by
/// [`Authorized::attributed_to_agent`], if any. No other actor's name
/// starts with `agent:`: a bus caller is named `user@:1.42` or
/// `uid:N@:1.42`, and a user name cannot contain `:`.
pub fn attributed_agent(actor: &Actor) -> Option<&str> {
    actor
        .name
        .strip_prefix("agent:")?
        .split_once(' ')
        .map(|(a, _)| a)
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
}

impl Gatekeeper {
    /// A gatekeeper asking `authorizer`, reserving Worker1 and Retry1 for
    /// the `peers` uids, and recording refusals in `store`.
    pub fn new(authorizer: Arc<dyn Authorizer>, peers: PeerUids, store: Store) -> Self {
        Gatekeeper {
            authorizer,
            peers,
            store,
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

    /// Asks the authoriser about `P::ACTION` for `caller`. `event` names
    /// the operation in the event log; `task_id` is the task it concerns,
    /// if any (kept by the store only when well formed).
    pub async fn authorize<P: PolkitPermission>(
        &self,
        caller: &Caller,
        event: &'static str,
        task_id: Option<&str>,
    ) -> Result<Authorized<P>, Error> {
        let actor = caller.actor(P::ACTOR_KIND);
        match self.authorizer.check(P::ACTION, caller).await {
            Verdict::Allow => {
                tracing::info!(
                    target: "airlock::authz",
                    action = P::ACTION.polkit_id(),
                    sender = caller.sender(),
                    uid = caller.uid(),
                    interactive = caller.interactive(),
                    task_id,
                    operation = event,
                    authorizer = %self.authorizer.name(),
                    "authorised"
                );
                Ok(Authorized::grant(actor))
            }
            Verdict::Deny(err) => {
                tracing::debug!(
                    target: "airlock::authz",
                    action = P::ACTION.polkit_id(),
                    sender = caller.sender(),
                    interactive = caller.interactive(),
                    "the authoriser said no"
                );
                self.refuse(&actor, event, task_id, &err, P::ACTION.polkit_id())
                    .await;
                Err(err)
            }
        }
    }

    /// Admits only the uid `P` is reserved for (Worker1: the worker;
    /// Retry1: airlock-retryd), as the bus daemon reports the peer.
    pub async fn authorize_peer<P: PeerPermission>(
        &self,
        caller: &Caller,
        event: &'static str,
        task_id: Option<&str>,
    ) -> Result<Authorized<P>, Error> {
        let actor = caller.actor(P::ACTOR_KIND);
        let reserved = P::uid(&self.peers);
        if caller.uid() == reserved {
            tracing::debug!(
                target: "airlock::authz",
                sender = caller.sender(),
                uid = caller.uid(),
                task_id,
                operation = event,
                interface = P::INTERFACE,
                "component peer admitted"
            );
            return Ok(Authorized::grant(actor));
        }
        let err = Error::with(
            Code::PEER_UID_DENIED,
            format!(
                "uid {} may not call {} (reserved for uid {reserved})",
                caller.uid(),
                P::INTERFACE,
            ),
        );
        self.refuse(&actor, event, task_id, &err, "peer-uid").await;
        Err(err)
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

    async fn refuse(
        &self,
        actor: &Actor,
        event: &'static str,
        task_id: Option<&str>,
        err: &Error,
        check: &str,
    ) {
        let detail =
            airlock_proto::redact::text(err.detail.as_deref().unwrap_or_default()).into_owned();
        tracing::warn!(
            target: "airlock::authz",
            check,
            code = err.code.as_str(),
            actor = %actor.name,
            uid = actor.uid,
            task_id,
            operation = event,
            authorizer = %self.authorizer.name(),
            "refused: {detail}"
        );
        let (actor, task, code) = (actor.clone(), task_id.map(str::to_owned), err.code);
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
    use airlock_taskdb::tasks::EventOutcome;

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
            .authorize(&caller(1000), "TASK_CANCELLED", Some("task-a"))
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
            .authorize::<Submit>(&caller(1000), "TASK_SUBMITTED", Some("task-a"))
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
            gate.authorize_peer::<Worker>(&caller(4242), "TASK_CLAIMED", None)
                .await
                .is_ok()
        );
        let err = gate
            .authorize_peer::<Worker>(&caller(0), "TASK_CLAIMED", None)
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
            .authorize_peer::<Retry>(&caller(4343), "TASK_RETRY_EXTENSION_AUTHORIZED", None)
            .await
            .unwrap();
        assert_eq!(token.actor().kind, ActorKind::Owner);
        // Not the worker, not root, not an admin polkit would allow.
        for uid in [4242, 0, 1000] {
            let err = gate
                .authorize_peer::<Retry>(
                    &caller(uid),
                    "TASK_RETRY_EXTENSION_AUTHORIZED",
                    Some("task-a"),
                )
                .await
                .unwrap_err();
            assert_eq!(err.code, Code::PEER_UID_DENIED);
        }
        // Nor may retryd call Worker1.
        let err = gate
            .authorize_peer::<Worker>(&caller(4343), "TASK_CLAIMED", None)
            .await
            .unwrap_err();
        assert_eq!(err.code, Code::PEER_UID_DENIED);
        let events = store.run(|s| s.events(None, 0, 10)).await.unwrap().unwrap();
        assert_eq!(events.len(), 4);
        assert!(events.iter().all(|e| e.code == Some(Code::PEER_UID_DENIED)));
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

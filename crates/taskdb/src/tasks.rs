//! The supervisor's task store: queue, plans, leases, results, verification
//! decisions, the owner-controlled retry extension, and an append-only
//! event log.
//!
//! One contract, [`TaskStore`], two engines: [`SqliteStore`] (the default,
//! embedded, one host) and [`PgStore`] (PostgreSQL, one queue shared by
//! several hosts). The rules below are written once, against a
//! transaction seam (`tx`), and each engine supplies only its SQL; the
//! same test suites run against both.
//!
//! # Rules every method keeps
//!
//! - Every mutation runs in one transaction (SQLite: `BEGIN IMMEDIATE`;
//!   PostgreSQL: READ COMMITTED with the task's row locked `FOR UPDATE`),
//!   bumps the task's `revision`, and appends an `allowed` [`Event`] in
//!   that same transaction, so a change and its audit record commit
//!   together or not at all.
//! - Every write after a claim is fenced in its `UPDATE … WHERE`: a renewal
//!   or a result by (task, attempt, lease epoch, token hash, unexpired), a
//!   verification decision by (task, VERIFYING, attempt, lease epoch), and
//!   every write by the revision it read. Zero rows changed means the
//!   caller lost the race, never that it won it twice.
//! - Every refusal ([`StoreError::Refused`]) of a mutating method rolls its
//!   transaction back (nothing changes) and then appends a `denied` event
//!   with the refusal's [`Code`] in a transaction of its own.
//! - Idempotent replays (the same submission, plan, result, decision or
//!   retry extension again) change nothing and append nothing.
//! - The events table is append-only: triggers abort any `UPDATE` or
//!   `DELETE` on it (on PostgreSQL also `TRUNCATE`, and the supervisor's
//!   role holds no UPDATE or DELETE privilege on it).
//! - Time is `max(clock, high-water mark)` and the high-water mark is
//!   persisted, so rewinding a clock never extends a lease. The clock is
//!   the database's: SQLite's is this host's (the store is embedded);
//!   PostgreSQL's is the server's `clock_timestamp()`, so every host's
//!   leases are judged by one clock and no client clock enters a lease.
//! - A lease is a 256-bit random token handed out once in the
//!   [`ClaimGrant`]; only its SHA-256 is stored. A lease epoch fences stale
//!   holders.
//! - A claim is fair between submitters and keeps the caps on running
//!   tasks it is given ([`fair`]); a planner agent's submission fits its
//!   quotas ([`quota`]). Both count in the transaction that claims or
//!   inserts, from the store, so they hold on every host sharing it.
//!
//! # States
//!
//! One function moves a task: `TaskRow::advance` (`tasks/row.rs`; the
//! row's state is private to it) asks [`airlock_proto::states::next`] for the row of
//! [`airlock_proto::states::TRANSITIONS`] that fits — the state table's
//! precondition, then the attempts rule — and sets the state; every write
//! of a task row persists one such step. The engines find candidate rows
//! and persist what it decided; [`moves`] reports each committed move to an
//! observer. The moves, as `docs/states.md` shows them:
//!
//! ```text
//! submit ─▶ QUEUED ─claim─▶ RUNNING ─result passed/captured─▶ VERIFYING ─accept─▶ SUCCEEDED
//!             ▲  ▲             │  │                               │  │
//!             │  └─lease expired, attempts left (sweep)           │  └─reject─▶ FAILED
//!             │                │  └─result failed, attempts left  │
//!             └────────────────┴──────────────────────────────────┴─rework, attempts left
//!   out of attempts (result failed, rework, lease expired) ─▶ FAILED
//!   result failed with RECONCILIATION_REQUIRED ─▶ FAILED at once, a reconciliation case opened
//!   FAILED with an adopting case ─worker: head unchanged, descends from the base─▶ SUCCEEDED
//!   FAILED with attempt == max_attempts ─extend_retry─▶ QUEUED (max_attempts + 1)
//!   any non-terminal state ─cancel─▶ CANCELLED
//! ```
//!
//! # Example
//!
//! ```
//! use airlock_taskdb::tasks::{Actor, SqliteStore, TaskStore};
//! let dir = tempfile::tempdir().unwrap();
//! let mut store = SqliteStore::open(&dir.path().join("tasks.sqlite3")).unwrap();
//! // Nothing is queued yet, so a worker's claim finds nothing.
//! assert!(store.claim(&Actor::worker(Some(1000), "worker-1"), 60_000).unwrap().is_none());
//! assert_eq!(store.summary().unwrap().total(), 0);
//! ```

/// Builds a `&'static str` SQL statement once, for the engines'
/// statements that splice in shared fragments (`row::COLUMNS`,
/// `fair::CLASS_SQL`).
macro_rules! sql {
    ($($arg:tt)*) => {{
        static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| format!($($arg)*));
        SQL.as_str()
    }};
}

mod audit;
pub mod fair;
mod lease;
mod lifecycle;
pub mod moves;
pub mod postgres;
pub mod quota;
mod reconcile;
mod retry;
mod row;
mod schema;
pub mod sqlite;
mod tx;

use crate::error::{StoreError, StoreResult};
use airlock_proto::binding::is_task_id;
use airlock_proto::bus::{FenceGrant, FenceRequest};
use airlock_proto::canonical::digest_of;
use airlock_proto::{Code, Error};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use tx::{Backend, Page};

pub use fair::RunningCaps;
pub use postgres::{PgBackend, PgError, PgLocation, PgSecurity, TlsMode};
pub use quota::AgentQuota;
pub use sqlite::SqliteBackend;

pub use airlock_proto::plan::{PlanRecord, PlanRequest};
pub use airlock_proto::reconcile::{
    AdoptionCheck, AdoptionReport, CaseStatus, ReconciliationCase, ResolveOutcome, ResolveRequest,
};
pub use airlock_proto::retry::{RetryExtensionOutcome, RetryExtensionRequest};
pub use airlock_proto::task::{
    ClaimGrant, DECISION_SCHEMA, Decision, DecisionOutcome, DecisionRequest, Submitter, TaskPlan,
    TaskResult, TaskState, TaskSubmission, TaskView,
};

/// Longest lease a claim or renewal may ask for (one day).
pub const MAX_LEASE_MS: i64 = 24 * 60 * 60 * 1000;

/// Most rows one [`TaskStore::list`] or [`TaskStore::events`] call returns;
/// larger limits are clamped to it.
pub const MAX_PAGE: u32 = 1000;

/// Longest human detail kept in a denial event, in bytes.
pub const MAX_DENIAL_DETAIL_LEN: usize = 1024;

/// The name recorded as the actor of retry extensions (the seed's
/// `owner-control`): the owner acts through airlock-retryd, not as a uid.
pub const OWNER_CONTROL_ACTOR: &str = "owner-control";

/// The name of the system actor that expires leases ([`TaskStore::sweep_expired`]).
pub const LEASE_SWEEPER: &str = "lease-sweeper";

/// Schema tag of the retry-extension event payload.
pub const RETRY_EXTENSION_EVENT_SCHEMA: &str = "airlock.task-retry-extension.event.v1";

/// Event action names. An `allowed` event with an action records that it
/// happened; a `denied` event with the same action records a refused
/// attempt, with the refusal's code.
pub mod action {
    /// A task was submitted.
    pub const TASK_SUBMITTED: &str = "TASK_SUBMITTED";
    /// A queued task's plan was replaced.
    pub const TASK_PLAN_REPLACED: &str = "TASK_PLAN_REPLACED";
    /// A worker claimed a task (a new attempt and lease).
    pub const TASK_CLAIMED: &str = "TASK_CLAIMED";
    /// A worker renewed its lease.
    pub const TASK_LEASE_RENEWED: &str = "TASK_LEASE_RENEWED";
    /// A worker set or released the fence of its attempt (a ref move or a
    /// push under way: no cancel, no expiry until it ends).
    pub const TASK_FENCED: &str = "TASK_FENCED";
    /// The sweeper found a lease expired and requeued or failed the task.
    pub const TASK_LEASE_EXPIRED: &str = "TASK_LEASE_EXPIRED";
    /// A worker submitted the result of its attempt.
    pub const TASK_RESULT_SUBMITTED: &str = "TASK_RESULT_SUBMITTED";
    /// An admin decided on a verifying task (accept, rework, reject).
    pub const TASK_VERIFIED: &str = "TASK_VERIFIED";
    /// An admin cancelled a task.
    pub const TASK_CANCELLED: &str = "TASK_CANCELLED";
    /// The owner raised an exhausted task's attempt budget by one (the
    /// seed's event type, kept verbatim).
    pub const TASK_RETRY_EXTENSION_AUTHORIZED: &str = "TASK_RETRY_EXTENSION_AUTHORIZED";
    /// A queued task failed because its repository is no longer registered.
    pub const TASK_REPOSITORY_UNREGISTERED: &str = "TASK_REPOSITORY_UNREGISTERED";
    /// A planner agent's restart-policy record changed (started, failed,
    /// held, stopped, cleared); the payload is the record.
    pub const AGENT_CHANGED: &str = "AGENT_CHANGED";
    /// An operator's StartAgent.
    pub const AGENT_START_REQUESTED: &str = "AGENT_START_REQUESTED";
    /// An operator's StopAgent.
    pub const AGENT_STOP_REQUESTED: &str = "AGENT_STOP_REQUESTED";
    /// An operator's ClearHold.
    pub const AGENT_HOLD_CLEARED: &str = "AGENT_HOLD_CLEARED";
    /// An operator's CancelQueued: a stopped agent's queued tasks cancelled
    /// (each with its own TASK_CANCELLED, code AGENT_REVOKED).
    pub const AGENT_QUEUE_CANCELLED: &str = "AGENT_QUEUE_CANCELLED";
    /// A worker reported an attempt whose branch moved behind its back
    /// (RECONCILIATION_REQUIRED): a reconciliation case opened.
    pub const TASK_RECONCILIATION_OPENED: &str = "TASK_RECONCILIATION_OPENED";
    /// An admin resolved a reconciliation case (adopt or fail).
    pub const TASK_RECONCILIATION_RESOLVED: &str = "TASK_RECONCILIATION_RESOLVED";
    /// The worker's check of an adoption: allowed when the head was adopted
    /// (the task SUCCEEDED), denied with the code that reopened the case.
    pub const TASK_RECONCILIATION_ADOPTED: &str = "TASK_RECONCILIATION_ADOPTED";

    /// Every action above, in the order declared. The journal catalogue and
    /// other tables keyed by action are checked against it; a test keeps it
    /// complete.
    pub const ALL: &[&str] = &[
        TASK_SUBMITTED,
        TASK_PLAN_REPLACED,
        TASK_CLAIMED,
        TASK_LEASE_RENEWED,
        TASK_FENCED,
        TASK_LEASE_EXPIRED,
        TASK_RESULT_SUBMITTED,
        TASK_VERIFIED,
        TASK_CANCELLED,
        TASK_RETRY_EXTENSION_AUTHORIZED,
        TASK_REPOSITORY_UNREGISTERED,
        AGENT_CHANGED,
        AGENT_START_REQUESTED,
        AGENT_STOP_REQUESTED,
        AGENT_HOLD_CLEARED,
        AGENT_QUEUE_CANCELLED,
        TASK_RECONCILIATION_OPENED,
        TASK_RECONCILIATION_RESOLVED,
        TASK_RECONCILIATION_ADOPTED,
    ];

    #[cfg(test)]
    mod tests {
        /// Every `pub const NAME: &str` declared in this module is in
        /// [`super::ALL`], so a new action cannot miss the tables keyed by it.
        #[test]
        fn all_lists_every_action_declared() {
            let source = include_str!("tasks.rs");
            let start = source.find("pub mod action {").expect("the action module");
            let body = &source[start..];
            let body = &body[..body.find("pub const ALL").expect("ALL")];
            let declared: Vec<&str> = body
                .lines()
                .filter_map(|l| l.trim().strip_prefix("pub const "))
                .filter_map(|l| l.split(':').next())
                .collect();
            assert!(declared.len() >= 10, "{declared:?}");
            let all: Vec<&str> = super::ALL.to_vec();
            assert_eq!(
                declared, all,
                "action::ALL must list every action, in order"
            );
        }
    }
}

/// The name of the system actor that fails the tasks of a repository no
/// longer registered ([`TaskStore::fail_unregistered`]).
pub const REPOSITORY_REGISTRY: &str = "repository-registry";

/// Who is acting, as recorded in events.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActorKind {
    /// An administrator (airlockctl, polkit-authorised).
    Admin,
    /// The planner (AI agent) proposing tasks and plans.
    Planner,
    /// The credentialed worker holding leases.
    Worker,
    /// The owner, through airlock-retryd.
    Owner,
    /// airlock itself (the lease sweeper, migrations).
    System,
}

impl ActorKind {
    /// Every kind.
    pub const ALL: &'static [ActorKind] = &[
        ActorKind::Admin,
        ActorKind::Planner,
        ActorKind::Worker,
        ActorKind::Owner,
        ActorKind::System,
    ];

    /// The name stored in the events table.
    pub fn as_str(self) -> &'static str {
        match self {
            ActorKind::Admin => "admin",
            ActorKind::Planner => "planner",
            ActorKind::Worker => "worker",
            ActorKind::Owner => "owner",
            ActorKind::System => "system",
        }
    }

    /// Parses a stored name.
    pub fn parse(s: &str) -> Option<Self> {
        ActorKind::ALL.iter().copied().find(|k| k.as_str() == s)
    }
}

/// Who performed (or attempted) an operation.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Actor {
    /// The role.
    pub kind: ActorKind,
    /// The peer's unix uid, when the channel tells it.
    pub uid: Option<u32>,
    /// A name for humans (a D-Bus sender, a worker id, `owner-control`).
    pub name: String,
}

impl Actor {
    /// An actor of `kind`.
    pub fn new(kind: ActorKind, uid: Option<u32>, name: impl Into<String>) -> Self {
        Actor {
            kind,
            uid,
            name: name.into(),
        }
    }

    /// An administrator.
    pub fn admin(uid: Option<u32>, name: impl Into<String>) -> Self {
        Actor::new(ActorKind::Admin, uid, name)
    }

    /// The planner.
    pub fn planner(uid: Option<u32>, name: impl Into<String>) -> Self {
        Actor::new(ActorKind::Planner, uid, name)
    }

    /// A worker; `name` becomes the task's `claimed_by`.
    pub fn worker(uid: Option<u32>, name: impl Into<String>) -> Self {
        Actor::new(ActorKind::Worker, uid, name)
    }

    /// airlock itself.
    pub fn system(name: impl Into<String>) -> Self {
        Actor::new(ActorKind::System, None, name)
    }

    /// The owner acting through airlock-retryd.
    pub fn owner_control() -> Self {
        Actor::new(ActorKind::Owner, None, OWNER_CONTROL_ACTOR)
    }

    /// The planner agent this actor was attributed to, if any: the
    /// supervisor names a call it recognised as one of its agents'
    /// `agent:NAME user@:1.42`. No other actor's name starts with
    /// `agent:` (a bus caller is `user@:1.42` or `uid:N@:1.42`, and a user
    /// name cannot contain `:`). The schema migration that fills a task's
    /// submitter from its `TASK_SUBMITTED` event parses the same shape.
    pub fn agent(&self) -> Option<&str> {
        self.name
            .strip_prefix(AGENT_PREFIX)?
            .split_once(' ')
            .map(|(a, _)| a)
            .filter(|a| !a.is_empty())
    }

    /// The submitter a task submitted by this actor records.
    pub fn submitter(&self) -> Submitter {
        Submitter {
            uid: self.uid,
            agent: self.agent().map(str::to_owned),
        }
    }
}

/// How the name of an actor attributed to a planner agent starts
/// ([`Actor::agent`]).
pub const AGENT_PREFIX: &str = "agent:";

/// Which tasks a read may see: every task, or those of one submitter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadScope {
    /// Every task (a caller holding `org.airlock.tasks.read-all`, and
    /// airlock itself).
    All,
    /// Only the tasks this caller submitted: the same uid, and the same
    /// planner agent — or none, for a caller that is no agent — so two
    /// agents running as one user see only their own tasks each, and
    /// neither sees what that user submitted outside an agent.
    Own {
        /// The caller's uid.
        uid: u32,
        /// The planner agent the caller was recognised as, if any.
        agent: Option<String>,
    },
}

impl ReadScope {
    /// Whether a task submitted by `submitter` is in the scope. A task
    /// whose submitter is not on record is seen by [`ReadScope::All`] only.
    pub fn sees(&self, submitter: Option<&Submitter>) -> bool {
        match self {
            ReadScope::All => true,
            ReadScope::Own { uid, agent } => submitter
                .is_some_and(|s| s.uid == Some(*uid) && s.agent.as_deref() == agent.as_deref()),
        }
    }

    /// The uid an engine filters on (`None`: no filter).
    pub(crate) fn uid(&self) -> Option<i64> {
        match self {
            ReadScope::All => None,
            ReadScope::Own { uid, .. } => Some(i64::from(*uid)),
        }
    }

    /// The agent an engine filters on, with [`Self::uid`].
    pub(crate) fn agent(&self) -> Option<&str> {
        match self {
            ReadScope::All => None,
            ReadScope::Own { agent, .. } => agent.as_deref(),
        }
    }
}

/// Whether an event records something done or something refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventOutcome {
    /// The operation happened.
    Allowed,
    /// The operation was refused; the event carries the code.
    Denied,
}

impl EventOutcome {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            EventOutcome::Allowed => "allowed",
            EventOutcome::Denied => "denied",
        }
    }
}

/// One row of the append-only event log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Increasing id; page with `after_event_id`.
    pub id: i64,
    /// The task, when the event concerns one (and its id was well formed).
    pub task_id: Option<String>,
    /// When (store time, unix ms).
    pub at_ms: i64,
    /// Who.
    pub actor: Actor,
    /// What (see [`action`]).
    pub action: String,
    /// Done or refused.
    pub outcome: EventOutcome,
    /// The refusal code of a denied event.
    pub code: Option<Code>,
    /// Details; never a lease token or other secret.
    pub payload: Value,
}

impl Event {
    /// The event as the bus shows it (`airlock_proto::bus::EventRecord`).
    pub fn to_record(&self) -> airlock_proto::bus::EventRecord {
        airlock_proto::bus::EventRecord {
            id: self.id,
            task_id: self.task_id.clone(),
            at_ms: self.at_ms,
            actor: serde_json::to_value(&self.actor).unwrap_or(Value::Null),
            action: self.action.clone(),
            outcome: self.outcome.as_str().to_owned(),
            code: self.code.map(|c| c.as_str().to_owned()),
            payload: self.payload.clone(),
        }
    }

    /// The event as a JSON object (the code by its name), for CLIs and logs.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self.to_record()).unwrap_or(Value::Null)
    }
}

/// What [`TaskStore::submit`] returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Submitted {
    /// The task as stored now.
    pub task: TaskView,
    /// True when the submission replayed an identical earlier one.
    pub idempotent: bool,
}

/// What [`TaskStore::submit_result`] returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResultReceipt {
    /// The task as stored now.
    pub task: TaskView,
    /// True when the result replayed an identical earlier submission.
    pub idempotent: bool,
}

/// How many tasks are in each state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueSummary {
    /// QUEUED.
    pub queued: u64,
    /// RUNNING.
    pub running: u64,
    /// VERIFYING.
    pub verifying: u64,
    /// SUCCEEDED.
    pub succeeded: u64,
    /// FAILED.
    pub failed: u64,
    /// CANCELLED.
    pub cancelled: u64,
}

impl QueueSummary {
    /// The count for one state.
    pub fn count(&self, state: TaskState) -> u64 {
        match state {
            TaskState::Queued => self.queued,
            TaskState::Running => self.running,
            TaskState::Verifying => self.verifying,
            TaskState::Succeeded => self.succeeded,
            TaskState::Failed => self.failed,
            TaskState::Cancelled => self.cancelled,
        }
    }

    fn slot(&mut self, state: TaskState) -> &mut u64 {
        match state {
            TaskState::Queued => &mut self.queued,
            TaskState::Running => &mut self.running,
            TaskState::Verifying => &mut self.verifying,
            TaskState::Succeeded => &mut self.succeeded,
            TaskState::Failed => &mut self.failed,
            TaskState::Cancelled => &mut self.cancelled,
        }
    }

    /// Every task.
    pub fn total(&self) -> u64 {
        TaskState::ALL.iter().map(|s| self.count(*s)).sum()
    }
}

/// SHA-256 of the canonical JSON of a task's verification record, as the
/// owner computes it for a retry extension: no record (or an empty one)
/// hashes like `{}`; a record that is not JSON is `TASK_VERIFICATION_INVALID`.
pub fn verification_sha256(verification_json: Option<&str>) -> StoreResult<String> {
    let value = match verification_json {
        None | Some("") => Value::Object(serde_json::Map::new()),
        Some(raw) => serde_json::from_str::<Value>(raw).map_err(|e| {
            Error::with(
                Code::TASK_VERIFICATION_INVALID,
                format!("verification record: {e}"),
            )
        })?,
    };
    digest_of(&value)
        .map_err(|e| Error::with(Code::TASK_VERIFICATION_INVALID, e.to_string()).into())
}

/// Declares [`TaskStore`] and its implementation by [`Store`] from one list
/// of signatures: each method is written once, and forwards to the
/// [`Store`] method of the same name, where it is documented.
macro_rules! task_store {
    (
        &self {
            $( $(#[$ra:meta])* fn $r:ident($($ra_name:ident: $ra_ty:ty),* $(,)?) -> $rr:ty; )*
        }
        &mut self {
            $( $(#[$ma:meta])* fn $m:ident($($ma_name:ident: $ma_ty:ty),* $(,)?) -> $mr:ty; )*
        }
    ) => {
        /// The supervisor's task store: every operation the supervisor
        /// performs on it. [`SqliteStore`] and [`PgStore`] implement it with
        /// the same rules; [`crate::open`] picks one from
        /// `[supervisor] database`.
        ///
        /// Each method is documented on [`Store`], which implements them
        /// once for both engines.
        pub trait TaskStore: Send + std::fmt::Debug {
            $(
                #[doc = concat!("See [`Store::", stringify!($r), "`].")]
                $(#[$ra])*
                fn $r(&self, $($ra_name: $ra_ty),*) -> $rr;
            )*
            $(
                #[doc = concat!("See [`Store::", stringify!($m), "`].")]
                $(#[$ma])*
                fn $m(&mut self, $($ma_name: $ma_ty),*) -> $mr;
            )*
        }

        impl<B: Backend> TaskStore for Store<B> {
            $(
                $(#[$ra])*
                fn $r(&self, $($ra_name: $ra_ty),*) -> $rr {
                    Store::$r(self, $($ra_name),*)
                }
            )*
            $(
                $(#[$ma])*
                fn $m(&mut self, $($ma_name: $ma_ty),*) -> $mr {
                    Store::$m(self, $($ma_name),*)
                }
            )*
        }
    };
}

task_store! {
    &self {
        fn now_ms() -> StoreResult<i64>;
        fn get(task_id: &str) -> StoreResult<TaskView>;
        fn list(
            state: Option<TaskState>,
            after_task_id: Option<&str>,
            limit: u32,
        ) -> StoreResult<Vec<TaskView>>;
        fn summary() -> StoreResult<QueueSummary>;
        fn last_event_id() -> StoreResult<i64>;
        fn events(
            task_id: Option<&str>,
            after_event_id: i64,
            limit: u32,
        ) -> StoreResult<Vec<Event>>;
        fn get_as(task_id: &str, scope: &ReadScope) -> StoreResult<TaskView>;
        fn plan_as(task_id: &str, scope: &ReadScope) -> StoreResult<TaskPlan>;
        fn list_as(
            state: Option<TaskState>,
            after_task_id: Option<&str>,
            limit: u32,
            scope: &ReadScope,
        ) -> StoreResult<Vec<TaskView>>;
        fn events_as(
            task_id: Option<&str>,
            after_event_id: i64,
            limit: u32,
            scope: &ReadScope,
        ) -> StoreResult<Vec<Event>>;
        fn last_repository_events(actions: &[&str]) -> StoreResult<BTreeMap<String, Event>>;
        fn integrity_check() -> StoreResult<()>;
    }
    &mut self {
        fn record_denial(
            task_id: Option<&str>,
            actor: &Actor,
            action: &str,
            code: Code,
            detail: &str,
        ) -> StoreResult<()>;
        fn submit(s: &TaskSubmission, actor: &Actor) -> StoreResult<Submitted>;
        fn submit_within(
            s: &TaskSubmission,
            actor: &Actor,
            quota: &AgentQuota,
        ) -> StoreResult<Submitted>;
        fn replace_plan(task_id: &str, plan: &PlanRequest, actor: &Actor) -> StoreResult<TaskView>;
        fn decide(
            task_id: &str,
            req: &DecisionRequest,
            actor: &Actor,
        ) -> StoreResult<DecisionOutcome>;
        fn claim(worker: &Actor, lease_ms: i64) -> StoreResult<Option<ClaimGrant>>;
        fn claim_in(
            worker: &Actor,
            lease_ms: i64,
            repositories: Option<&[String]>,
        ) -> StoreResult<Option<ClaimGrant>>;
        fn claim_within(
            worker: &Actor,
            lease_ms: i64,
            repositories: Option<&[String]>,
            caps: &RunningCaps,
        ) -> StoreResult<Option<ClaimGrant>>;
        fn renew(
            task_id: &str,
            lease_epoch: u64,
            lease_token: &str,
            lease_ms: i64,
            worker: &Actor,
        ) -> StoreResult<i64>;
        fn fence(
            task_id: &str,
            lease_epoch: u64,
            lease_token: &str,
            req: &FenceRequest,
            worker: &Actor,
        ) -> StoreResult<FenceGrant>;
        fn sweep_expired() -> StoreResult<Vec<(String, TaskState)>>;
        fn fail_unregistered(registered: &[String]) -> StoreResult<Vec<String>>;
        fn cancel_agent_queued(
            agent: &str,
            keep: Option<&[String]>,
            reason: &str,
            actor: &Actor,
        ) -> StoreResult<Vec<String>>;
        #[allow(clippy::too_many_arguments)]
        fn submit_result(
            task_id: &str,
            lease_epoch: u64,
            lease_token: &str,
            idempotency_key: &str,
            result: &TaskResult,
            auto_accept: bool,
            worker: &Actor,
        ) -> StoreResult<ResultReceipt>;
        fn extend_retry(
            task_id: &str,
            req: &RetryExtensionRequest,
            configured_authorization_id: &str,
        ) -> StoreResult<RetryExtensionOutcome>;
        fn agent_record(name: &str) -> StoreResult<Option<Value>>;
        fn agent_usage(agent: &str) -> StoreResult<airlock_proto::bus::AgentUsage>;
        fn save_agent_record(name: &str, record: &Value, actor: &Actor) -> StoreResult<()>;
        fn record_allowed(actor: &Actor, action: &str, payload: &Value) -> StoreResult<()>;
        fn record_upstream(
            actor: &Actor,
            report: &airlock_proto::upstream::UpstreamReport,
        ) -> StoreResult<()>;
        fn reconciliations(
            status: Option<CaseStatus>,
            after_task_id: Option<&str>,
            limit: u32,
        ) -> StoreResult<Vec<ReconciliationCase>>;
        fn reconciliation(task_id: &str) -> StoreResult<ReconciliationCase>;
        fn reconciliations_as(
            status: Option<CaseStatus>,
            after_task_id: Option<&str>,
            limit: u32,
            scope: &ReadScope,
        ) -> StoreResult<Vec<ReconciliationCase>>;
        fn reconciliation_as(task_id: &str, scope: &ReadScope) -> StoreResult<ReconciliationCase>;
        fn resolve_reconciliation(
            task_id: &str,
            req: &ResolveRequest,
            actor: &Actor,
        ) -> StoreResult<ResolveOutcome>;
        fn take_adoption() -> StoreResult<Option<AdoptionCheck>>;
        fn settle_adoption(
            report: &AdoptionReport,
            worker: &Actor,
        ) -> StoreResult<ReconciliationCase>;
    }
}

/// The store's rules over one engine `B`. Use it through [`TaskStore`]
/// (the supervisor holds a `Box<dyn TaskStore>`), or as [`SqliteStore`] /
/// [`PgStore`] where the engine matters (tests, benchmarks).
#[derive(Debug)]
pub struct Store<B> {
    backend: B,
}

/// The embedded SQLite task store.
pub type SqliteStore = Store<SqliteBackend>;

/// The PostgreSQL task store.
pub type PgStore = Store<PgBackend>;

impl<B: Backend> Store<B> {
    /// The store's current time: `max(clock, persisted high-water mark)`.
    /// Reading it does not advance the mark; every mutation does.
    pub fn now_ms(&self) -> StoreResult<i64> {
        self.backend.now_ms()
    }

    /// One task.
    pub fn get(&self, task_id: &str) -> StoreResult<TaskView> {
        self.get_as(task_id, &ReadScope::All)
    }

    /// One task, if `scope` sees it: a task outside the scope is
    /// `TASK_NOT_FOUND` with the same detail as a task that does not
    /// exist, so a reader learns nothing of another submitter's tasks.
    pub fn get_as(&self, task_id: &str, scope: &ReadScope) -> StoreResult<TaskView> {
        check_task_id(task_id)?;
        let view = self
            .backend
            .get(task_id)?
            .ok_or_else(|| not_found(task_id))?
            .into_row()?
            .view()?;
        if scope.sees(view.submitter.as_ref()) {
            Ok(view)
        } else {
            Err(not_found(task_id))
        }
    }

    /// What one task will change and run, if `scope` sees it: its plan and
    /// execution digests and its envelope as stored. Bound as
    /// [`Self::get_as`]: a task outside the scope is `TASK_NOT_FOUND`, the
    /// same answer as a task that does not exist.
    pub fn plan_as(&self, task_id: &str, scope: &ReadScope) -> StoreResult<TaskPlan> {
        check_task_id(task_id)?;
        let row = self
            .backend
            .get(task_id)?
            .ok_or_else(|| not_found(task_id))?
            .into_row()?;
        if !scope.sees(row.submitter().as_ref()) {
            return Err(not_found(task_id));
        }
        Ok(TaskPlan {
            envelope: row.envelope()?,
            task_id: row.task_id,
            plan_digest: row.plan_digest,
            execution_digest: row.execution_digest,
        })
    }

    /// Tasks ordered by task id, optionally only those in `state`, starting
    /// after `after_task_id` (exclusive). `limit` is clamped to [`MAX_PAGE`].
    pub fn list(
        &self,
        state: Option<TaskState>,
        after_task_id: Option<&str>,
        limit: u32,
    ) -> StoreResult<Vec<TaskView>> {
        self.list_as(state, after_task_id, limit, &ReadScope::All)
    }

    /// [`Self::list`] of the tasks `scope` sees only (filtered by the
    /// engine, so a page is full whenever more such tasks exist).
    pub fn list_as(
        &self,
        state: Option<TaskState>,
        after_task_id: Option<&str>,
        limit: u32,
        scope: &ReadScope,
    ) -> StoreResult<Vec<TaskView>> {
        self.backend
            .list(state, Page::new(after_task_id, limit, scope))?
            .into_iter()
            .map(|raw| raw.into_row().and_then(|r| r.view()))
            .collect()
    }

    /// How many tasks are in each state.
    pub fn summary(&self) -> StoreResult<QueueSummary> {
        let mut summary = QueueSummary::default();
        for (status, n) in self.backend.counts()? {
            let state = row::parse_state(&status)?;
            *summary.slot(state) = u64::try_from(n).unwrap_or(0);
        }
        Ok(summary)
    }

    /// Events in id order after `after_event_id`, optionally only those of
    /// one task. `limit` is clamped to [`MAX_PAGE`].
    pub fn events(
        &self,
        task_id: Option<&str>,
        after_event_id: i64,
        limit: u32,
    ) -> StoreResult<Vec<Event>> {
        self.events_as(task_id, after_event_id, limit, &ReadScope::All)
    }

    /// [`Self::events`] that `scope` sees: with [`ReadScope::Own`], only
    /// the events of tasks it sees (whoever acted on them: the worker's,
    /// an administrator's); no event about no task, and none about a task
    /// id of another submitter's or of no task at all.
    pub fn events_as(
        &self,
        task_id: Option<&str>,
        after_event_id: i64,
        limit: u32,
        scope: &ReadScope,
    ) -> StoreResult<Vec<Event>> {
        self.backend
            .events(task_id, Page::new(after_event_id, limit, scope))?
            .into_iter()
            .map(row::RawEvent::into_event)
            .collect()
    }

    /// The newest event about no task among `actions`, per repository
    /// its payload names (`{"repository": NAME, …}`, as
    /// [`Self::record_upstream`] writes a sync's report): repository name
    /// to event. A repository with no such event is absent. Never an
    /// event about a task, so it tells nothing of anyone's tasks.
    pub fn last_repository_events(&self, actions: &[&str]) -> StoreResult<BTreeMap<String, Event>> {
        let mut out = BTreeMap::new();
        for raw in self.backend.newest_untasked(actions, "repository")? {
            let event = raw.into_event()?;
            if let Some(name) = event.payload["repository"].as_str() {
                out.insert(name.to_owned(), event);
            }
        }
        Ok(out)
    }

    /// The id of the newest event, 0 when the log is empty: where a reader
    /// that wants only what comes next starts.
    pub fn last_event_id(&self) -> StoreResult<i64> {
        self.backend.last_event_id()
    }

    /// Records a refusal decided outside the store (a polkit denial, a peer
    /// uid mismatch, a malformed D-Bus message), so every denial is audited
    /// in one place. `task_id` is kept only when it is a well-formed id.
    pub fn record_denial(
        &mut self,
        task_id: Option<&str>,
        actor: &Actor,
        action: &str,
        code: Code,
        detail: &str,
    ) -> StoreResult<()> {
        self.write("a denial record", &mut |tx| {
            audit::append_denial(tx, task_id, actor, action, code, detail, Value::Null)
        })
    }

    /// The engine's consistency check (SQLite: `PRAGMA integrity_check`;
    /// PostgreSQL: the schema is airlock's at the version this build
    /// expects, with its append-only triggers in place and enabled).
    /// Anything wrong is `STORE_CORRUPT`.
    pub fn integrity_check(&self) -> StoreResult<()> {
        self.backend.integrity_check()
    }

    /// What the planner agent `agent` has used of its quotas now (see
    /// [`quota`]): the tasks it submitted in the last hour of store time,
    /// the CPU its tasks' verification used in the last day, and its
    /// tasks RUNNING now (on every host), read in one transaction.
    pub fn agent_usage(&mut self, agent: &str) -> StoreResult<airlock_proto::bus::AgentUsage> {
        self.write("reading an agent's usage", &mut |tx| {
            quota::usage(tx, agent)
        })
    }

    /// The stored restart-policy record of the planner agent `name`
    /// (`airlock_agents::AgentRecord` as JSON; the store keeps it opaque).
    pub fn agent_record(&mut self, name: &str) -> StoreResult<Option<Value>> {
        let text = self.write("reading an agent's record", &mut |tx| tx.agent_record(name))?;
        text.map(|t| {
            serde_json::from_str(&t).map_err(|e| {
                StoreError::from(airlock_proto::Error::with(
                    Code::STORE_CORRUPT,
                    format!("agent {name:?}: its stored record is not JSON: {e}"),
                ))
            })
        })
        .transpose()
    }

    /// Stores the restart-policy record of the agent `name` and appends an
    /// `AGENT_CHANGED` event carrying it, in one transaction: the record a
    /// restarted supervisor resumes from, and its history.
    pub fn save_agent_record(
        &mut self,
        name: &str,
        record: &Value,
        actor: &Actor,
    ) -> StoreResult<()> {
        let json = airlock_proto::canonical::to_canonical_string(record)?;
        let payload = serde_json::json!({ "agent": name, "record": record });
        self.write("storing an agent's record", &mut |tx| {
            tx.put_agent_record(name, &json)?;
            audit::append_allowed_untasked(tx, actor, action::AGENT_CHANGED, payload.clone())
        })
    }

    /// Records an allowed decision about no task (an operator's command to
    /// a planner agent), so that who asked is on record beside what the
    /// policy then did.
    pub fn record_allowed(
        &mut self,
        actor: &Actor,
        action: &str,
        payload: &Value,
    ) -> StoreResult<()> {
        self.write("an event", &mut |tx| {
            audit::append_allowed_untasked(tx, actor, action, payload.clone())
        })
    }

    /// Records the worker's upstream fact as the event its kind names:
    /// under its task for a publication (a task that does not exist is
    /// TASK_NOT_FOUND), about no task for a sync.
    pub fn record_upstream(
        &mut self,
        actor: &Actor,
        report: &airlock_proto::upstream::UpstreamReport,
    ) -> StoreResult<()> {
        let action = report.event.action();
        let payload = serde_json::json!({
            "repository": report.repository,
            "detail": report.detail,
        });
        match &report.task_id {
            None => self.record_allowed(actor, action, &payload),
            Some(task) => {
                // TASK_NOT_FOUND when there is no such task.
                self.get(task)?;
                self.write("an event", &mut |tx| {
                    audit::append_allowed(tx, task, actor, action, payload.clone())
                })
            }
        }
    }

    /// Runs `f` in one transaction of the engine, and reports the moves of
    /// task state it made ([`moves`]) once it committed.
    fn write<T>(
        &mut self,
        what: &str,
        f: &mut dyn FnMut(&mut dyn tx::Tx) -> StoreResult<T>,
    ) -> StoreResult<T> {
        let out = self.backend.write(what, &mut |tx| {
            moves::begin();
            f(tx)
        });
        moves::ended(out.is_ok());
        out
    }

    /// Passes `result` through, first recording a refusal as a denied event.
    /// If recording fails the refusal is still returned: the caller's next
    /// step depends on its code, and nothing was changed either way.
    fn audited<T>(
        &mut self,
        result: StoreResult<T>,
        task_id: Option<&str>,
        actor: &Actor,
        action: &str,
    ) -> StoreResult<T> {
        if let Err(StoreError::Refused(e)) = &result {
            let detail = e.detail.as_deref().unwrap_or("");
            let _ = self.record_denial(task_id, actor, action, e.code, detail);
        }
        result
    }
}

fn check_task_id(task_id: &str) -> StoreResult<()> {
    if is_task_id(task_id) {
        Ok(())
    } else {
        Err(Error::with(Code::TASK_ID_INVALID, "not a well-formed task id").into())
    }
}

fn not_found(task_id: &str) -> StoreError {
    Error::with(Code::TASK_NOT_FOUND, task_id.to_owned()).into()
}

fn check_lease_ms(lease_ms: i64) -> StoreResult<()> {
    if (1..=MAX_LEASE_MS).contains(&lease_ms) {
        Ok(())
    } else {
        Err(Error::with(
            Code::FIELD_BOUNDS_EXCEEDED,
            format!("lease_ms {lease_ms} is outside 1..={MAX_LEASE_MS}"),
        )
        .into())
    }
}

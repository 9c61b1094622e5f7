//! The D-Bus contract of `org.airlock.Supervisor1`, declared once, as rows.
//!
//! Every method the supervisor serves (and the one interface airlock-local
//! serves it, [`agent_host`]) is one row of the [`rows!`](crate::rows)
//! table below: its interface, its name, its D-Bus signature in and out,
//! who may call it (a polkit action or one component's peer uid,
//! [`Permission`]), the event its calls are audited under, its reply type,
//! and the client method that calls it with its arguments. The table makes,
//! per method, a constant with its name and a type implementing [`Call`], so
//!
//! - the supervisor's handlers enter through one function that looks the
//!   row up, admits the caller and authorises it by the row's permission
//!   (a handler asking for another permission than its row's does not
//!   compile), and answer the row's reply type through the call it got;
//! - `airlock-client`'s methods and their blocking stubs are made from the
//!   rows (`crates/client/src/stubs.rs`), each decoding [`Call::Reply`] of
//!   its row;
//! - the lists of methods in `dbus/README.md`, `docs/privsep/messages.md`
//!   and this crate's doc are rendered from the rows by
//!   `crates/proto/tests/docs.rs`, which fails on a stale copy;
//! - `services/supervisor/tests/contract.rs` introspects the running
//!   supervisor and checks every exported method against its row — name,
//!   signature, and that a caller without the row's permission is refused
//!   with the row's code;
//! - `crates/proto/tests/protocol.rs` keeps `crates/proto/bus.lock`, the
//!   signature of every row: a signature that changes under the same
//!   interface name fails there (an incompatible change is a new
//!   interface version, `Tasks2` beside `Tasks1`).
//!
//! A request whose argument is `s` carries JSON ([`crate::task::DecisionRequest`],
//! [`crate::reconcile::ResolveRequest`], …); a reply `s` is the JSON of the
//! row's reply type. A refusal is a D-Bus error named by
//! [`Code::dbus_error_name`], with the human detail as its message;
//! [`Code::from_dbus_error_name`] maps it back. A call whose arguments
//! are not its row's (one missing, one too many, one of another type) is
//! refused too, with `MESSAGE_INVALID` ([`Method::wrong_arguments`]),
//! never with the bus library's bare signature error.

use crate::reconcile::{AdoptionCheck, ReconciliationCase, ReconciliationPage, ResolveOutcome};
use crate::retry::RetryExtensionOutcome;
use crate::task::{ClaimGrant, DecisionOutcome, TaskPlan, TaskView};
use crate::{Code, Error};
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use method::{Call, Method, Peer, Permission};

/// The protocol this build speaks, `(major, minor)`; see
/// `docs/protocol.md` for what bumps which. The supervisor shows it as the
/// `Tasks2.ProtocolVersion` property (`"major.minor"`); clients check it
/// before their first call ([`check_protocol`]).
pub const PROTOCOL_VERSION: (u32, u32) = (13, 0);

/// `"major.minor"`.
pub fn protocol_string(v: (u32, u32)) -> String {
    format!("{}.{}", v.0, v.1)
}

/// Whether a client speaking `client` may talk to a supervisor speaking
/// `server` (`"major.minor"`). As seed 002 puts it, a client may lag the
/// supervisor by one minor, never a major: the majors must be equal, and
/// the client's minor at most one behind the supervisor's (one means one:
/// two minors of additions is more than a client was promised to live
/// without). A client ahead works: it must not use what the supervisor
/// lacks, and a newer minor's additions are optional by the bump rules
/// (`crates/proto/tests/protocol.rs`). Anything else, or a version that
/// does not parse, is `PROTOCOL_VERSION_MISMATCH` naming both.
pub fn check_protocol(client: (u32, u32), server: &str) -> Result<(), Error> {
    let parsed = server
        .split_once('.')
        .and_then(|(a, b)| Some((a.parse::<u32>().ok()?, b.parse::<u32>().ok()?)));
    let refuse = |what: &str| {
        Err(Error::with(
            Code::PROTOCOL_VERSION_MISMATCH,
            format!(
                "this client speaks airlock bus protocol {}, the supervisor speaks {server:?}; {what}",
                protocol_string(client)
            ),
        ))
    };
    match parsed {
        Some((major, minor)) if major == client.0 && minor <= client.1.saturating_add(1) => Ok(()),
        Some((major, minor)) if major == client.0 => refuse(&format!(
            "a client may be one minor version behind the supervisor, and this one is {} behind: use an airlockctl or library of {major}.{} or later",
            minor - client.1,
            minor - 1
        )),
        _ => refuse("use an airlockctl or library of the supervisor's major version"),
    }
}

/// The supervisor's well-known name.
pub const BUS_NAME: &str = "org.airlock.Supervisor1";
/// Its one object.
pub const OBJECT_PATH: &str = "/org/airlock/Supervisor1";
/// Page size when a caller passes a limit of 0.
pub const DEFAULT_PAGE: u32 = 100;

/// The polkit actions airlock declares (`polkit/org.airlock.policy`).
pub mod action {
    /// Read tasks, their events and reconciliation cases: a caller's own
    /// (the tasks it submitted) unless it also holds [`TASKS_READ_ALL`].
    pub const TASKS_READ: &str = "org.airlock.tasks.read";
    /// Read every task, whoever submitted it (administrators). Asked for
    /// on every read beside [`TASKS_READ`]; no row requires it.
    pub const TASKS_READ_ALL: &str = "org.airlock.tasks.read-all";
    /// Submit a task, replace a queued task's plan.
    pub const TASKS_SUBMIT: &str = "org.airlock.tasks.submit";
    /// Decide on or cancel a task.
    pub const TASKS_MANAGE: &str = "org.airlock.tasks.manage";
    /// Read the planner agents.
    pub const AGENTS_READ: &str = "org.airlock.agents.read";
    /// Start, stop and clear the hold of a planner agent.
    pub const AGENTS_MANAGE: &str = "org.airlock.agents.manage";
    /// Resolve a reconciliation case.
    pub const RECONCILE_MANAGE: &str = "org.airlock.reconcile.manage";
    /// Every action, in declaration order.
    pub const ALL: &[&str] = &[
        TASKS_READ,
        TASKS_READ_ALL,
        TASKS_SUBMIT,
        TASKS_MANAGE,
        AGENTS_READ,
        AGENTS_MANAGE,
        RECONCILE_MANAGE,
    ];
}

/// The events of reads, which the store does not log when allowed: they
/// have their own names so that a refused read is still on record. Every
/// other row's event is the store's action name for its change.
pub mod event {
    /// GetTask, GetPlan.
    pub const TASK_READ: &str = "TASK_READ";
    /// ListTasks.
    pub const TASKS_LISTED: &str = "TASKS_LISTED";
    /// ListEvents, CountEvents.
    pub const EVENTS_READ: &str = "EVENTS_READ";
    /// ListReconciliations, GetReconciliation.
    pub const RECONCILIATIONS_READ: &str = "RECONCILIATIONS_READ";
    /// Worker1.TakeAdoption.
    pub const ADOPTION_TAKEN: &str = "ADOPTION_TAKEN";
    /// ListAgents, GetAgent.
    pub const AGENTS_READ: &str = "AGENTS_READ";
    /// ListRepositories.
    pub const REPOSITORIES_READ: &str = "REPOSITORIES_READ";
    /// Every read event.
    pub const READS: &[&str] = &[
        TASK_READ,
        TASKS_LISTED,
        EVENTS_READ,
        RECONCILIATIONS_READ,
        ADOPTION_TAKEN,
        AGENTS_READ,
        REPOSITORIES_READ,
    ];
}

/// What a row is.
pub mod method {
    use serde::Serialize;
    use serde::de::DeserializeOwned;

    /// Who may call a method.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Permission {
        /// Whoever polkit authorises for this action (an id of
        /// [`super::action`]); refused with `AUTHORIZATION_DENIED`,
        /// `INTERACTIVE_AUTHORIZATION_REQUIRED` or `AUTHORITY_UNAVAILABLE`.
        Polkit(&'static str),
        /// One component, by the uid the bus daemon reports for the
        /// caller; anyone else is refused with `PEER_UID_DENIED`.
        PeerUid(Peer),
    }

    /// The components a method may be reserved for.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Peer {
        /// The worker: `supervisor.worker_user`.
        Worker,
        /// airlock-retryd: `retry.user`.
        Retry,
        /// The supervisor (airlock-local's agent host serves it alone).
        Supervisor,
    }

    impl Permission {
        /// The refusal a caller without the permission gets, when it is
        /// decided without asking anyone (polkit may also answer
        /// `INTERACTIVE_AUTHORIZATION_REQUIRED` or be unavailable).
        pub const fn refusal(self) -> crate::Code {
            match self {
                Permission::Polkit(_) => crate::Code::AUTHORIZATION_DENIED,
                Permission::PeerUid(_) => crate::Code::PEER_UID_DENIED,
            }
        }

        /// Equality usable in constant context (the supervisor's entry
        /// function checks at compile time that a handler asks for its
        /// row's permission).
        pub const fn same(self, other: Permission) -> bool {
            match (self, other) {
                (Permission::Polkit(a), Permission::Polkit(b)) => const_str_eq(a, b),
                (Permission::PeerUid(a), Permission::PeerUid(b)) => a as u8 == b as u8,
                _ => false,
            }
        }
    }

    const fn const_str_eq(a: &str, b: &str) -> bool {
        let (a, b) = (a.as_bytes(), b.as_bytes());
        if a.len() != b.len() {
            return false;
        }
        let mut i = 0;
        while i < a.len() {
            if a[i] != b[i] {
                return false;
            }
            i += 1;
        }
        true
    }

    /// One method: one row of the contract.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Method {
        /// Its interface (`org.airlock.Tasks1`).
        pub interface: &'static str,
        /// Its member name (`Verify`).
        pub name: &'static str,
        /// The D-Bus signature of its arguments (`ss`).
        pub input: &'static str,
        /// The D-Bus signature of its reply (`s`; empty for none).
        pub output: &'static str,
        /// Who may call it.
        pub permission: Permission,
        /// The event its calls are audited under (allowed changes by the
        /// store, every refusal by the supervisor); `None`: not audited in
        /// the task event log (the agent host's, which logs to the journal).
        pub event: Option<&'static str>,
        /// Its reply type, by name (the JSON in a reply `s`).
        pub reply: &'static str,
    }

    impl Method {
        /// `interface.name`.
        pub fn path(&self) -> String {
            format!("{}.{}", self.interface, self.name)
        }

        /// The refusal of a call of this method whose arguments have the
        /// D-Bus signature `sent`, not the row's (one missing, one too
        /// many, one of another type): `MESSAGE_INVALID`, naming both.
        pub fn wrong_arguments(&self, sent: &str) -> crate::Error {
            crate::Error::with(
                crate::Code::MESSAGE_INVALID,
                format!(
                    "{} takes the arguments ({}) and answers ({}); this call's arguments are ({})",
                    self.path(),
                    self.input,
                    self.output,
                    crate::shown::shown(sent)
                ),
            )
        }
    }

    /// A method as a type: its row and its reply type. Made by the table.
    pub trait Call {
        /// The row.
        const METHOD: Method;
        /// What a successful call answers (decoded from the JSON of a
        /// reply `s`, or the plain value of any other reply).
        type Reply: Serialize + DeserializeOwned;
    }
}

macro_rules! permission {
    (polkit $action:ident) => {
        $crate::bus::Permission::Polkit($crate::bus::action::$action)
    };
    (peer $peer:ident) => {
        $crate::bus::Permission::PeerUid($crate::bus::Peer::$peer)
    };
}

macro_rules! audited {
    () => {
        None
    };
    ($event:ident) => {
        Some(stringify!($event))
    };
}

/// Makes the items of the table: per interface a module with
/// `INTERFACE`, its extra constants (`also`), and per method a name
/// constant, a type implementing [`Call`], and the module's `METHODS`
/// (names) and `ROWS`. A row's `client` part is the client's
/// (`crates/client/src/stubs.rs`); nothing here reads it.
macro_rules! declare {
    ($(
        $(#[doc = $idoc:literal])+
        mod $module:ident = $iface:literal {
            also { $($also:item)* }
            $(
                $(#[doc = $doc:literal])+
                $konst:ident = $name:ident ( $input:literal ) -> $output:literal $reply:ty,
                    $pkind:ident $pwhich:ident $(, audited $event:ident)?
                    $(, client $fn:ident ( $($arg:ident : $aty:ty),* ) = $wire:expr)?;
            )+
        }
    )+) => {
        $(
            $(#[doc = $idoc])+
            pub mod $module {
                #[allow(unused_imports)]
                use super::*;
                /// The interface.
                pub const INTERFACE: &str = $iface;
                $($also)*
                $(
                    $(#[doc = $doc])+
                    pub const $konst: &str = stringify!($name);

                    #[doc = concat!("`", $iface, ".", stringify!($name), "` as a type: its row and reply.")]
                    #[derive(Debug)]
                    pub enum $name {}

                    impl Call for $name {
                        const METHOD: Method = Method {
                            interface: INTERFACE,
                            name: $konst,
                            input: $input,
                            output: $output,
                            permission: permission!($pkind $pwhich),
                            event: audited!($($event)?),
                            reply: stringify!($reply),
                        };
                        type Reply = $reply;
                    }
                )+
                /// Methods, in declaration order.
                pub const METHODS: &[&str] = &[$($konst),+];
                /// Their rows, in the same order.
                pub const ROWS: &[Method] = &[$(<$name as Call>::METHOD),+];
            }
        )+
    };
}

/// The table: every method of the contract, one row each, handed as
/// tokens to the macro `$then`, which makes of it what it needs —
/// `declare` here (the modules, constants and [`Call`] types), the
/// client's methods and their blocking stubs in `airlock-client`, the
/// method lists of the documents in `crates/proto/tests/docs.rs`.
///
/// A row: `CONST = Name("in") -> "out" ReplyType, permission, audited
/// EVENT, client method(args) = (the D-Bus arguments);` — its doc
/// comment says what the method does and when it is allowed; the docs
/// and the client's method show it. A row without `client` has no method
/// in `airlock-client` (the agent host's, which the supervisor calls).
/// Paths in a `client` part start at `$crate` (or name a crate the
/// client depends on): they are resolved where `$then` expands.
#[macro_export]
macro_rules! rows {
    ($then:ident) => {
        $then! {
            /// `org.airlock.Tasks2`: admins and planners, authorised by polkit.
            /// (Protocol 7.0 named it anew: Verify's and CancelTask's arguments had
            /// changed under the name `Tasks1` in 3.0; [`tasks_v1`] stays for one
            /// release.)
            mod tasks = "org.airlock.Tasks2" {
                also {
                    /// Signal: `s` task id, `s` state, `x` revision. Never
                    /// broadcast (protocol 8.0): sent to each connection that may
                    /// read the task, once it has made an authorised call
                    /// (docs/protocol.md, "Who hears TaskChanged").
                    pub const TASK_CHANGED: &str = "TaskChanged";
                    /// Property: the protocol the supervisor speaks, `"major.minor"`.
                    pub const PROTOCOL_VERSION: &str = "ProtocolVersion";
                }
                /// Submit a task: `s` an `airlock.task.v1` submission
                /// (`TaskSubmission`) for a registered repository (from a
                /// planner agent, one of its repositories). The same
                /// submission again is an idempotent replay; by another
                /// submitter, `TASK_IDEMPOTENCY_CONFLICT`.
                SUBMIT_TASK = SubmitTask("s") -> "s" SubmitReply,
                    polkit TASKS_SUBMIT, audited TASK_SUBMITTED,
                    client submit_task(submission: &serde_json::Value) = (submission.to_string(),);
                /// Replace a QUEUED task's plan (CAS on the previous plan's
                /// digest): `s` task id, `s` an `airlock.plan.v1` plan
                /// (`PlanRequest`). Only of a task the caller submitted (or
                /// any, with `org.airlock.tasks.read-all`; never for an
                /// agent), else `TASK_NOT_FOUND` as for no task; from a
                /// planner agent, in one of its repositories
                /// (`AGENT_REPOSITORY_DENIED`).
                REPLACE_PLAN = ReplacePlan("ss") -> "s" TaskView,
                    polkit TASKS_SUBMIT, audited TASK_PLAN_REPLACED,
                    client replace_plan(task_id: &str, plan: &serde_json::Value) = (task_id, plan.to_string());
                /// Read one task (its result and captured files inside): `s`
                /// task id. The caller's own; every task with
                /// `org.airlock.tasks.read-all` (another's is
                /// `TASK_NOT_FOUND`, as a task that does not exist).
                GET_TASK = GetTask("s") -> "s" TaskView,
                    polkit TASKS_READ, audited TASK_READ,
                    client get_task(task_id: &str) = (task_id,);
                /// What one task will change and run: `s` task id; its digests
                /// and its stored execution envelope. Bound to the caller as
                /// GetTask. Since 9.1; not on Tasks1 (`tasks_v1`).
                GET_PLAN = GetPlan("s") -> "s" TaskPlan,
                    polkit TASKS_READ, audited TASK_READ,
                    client get_plan(task_id: &str) = (task_id,);
                /// Page through tasks: `s` state or `""`, `s` after task id or
                /// `""`, `u` limit (0: the default page). The caller's own;
                /// every task with `org.airlock.tasks.read-all`.
                LIST_TASKS = ListTasks("ssu") -> "s" TaskPage,
                    polkit TASKS_READ, audited TASKS_LISTED,
                    client list_tasks(state: &str, after: &str, limit: u32) = (state, after, limit);
                /// Page through the event log: `s` task id or `""`, `x` after
                /// event id, `u` limit. The events of the caller's own tasks;
                /// every event with `org.airlock.tasks.read-all`.
                LIST_EVENTS = ListEvents("sxu") -> "s" EventPage,
                    polkit TASKS_READ, audited EVENTS_READ,
                    client list_events(task_id: &str, after: i64, limit: u32) = (task_id, after, limit);
                /// How many events of one task the caller may read, allowed
                /// and denied, and how many of each action: `s` task id.
                /// Bound to the caller as ListEvents: another's task counts
                /// none, as one that does not exist. Since 12.0; not on
                /// Tasks1 (`tasks_v1`).
                COUNT_EVENTS = CountEvents("s") -> "s" EventCount,
                    polkit TASKS_READ, audited EVENTS_READ,
                    client count_events(task_id: &str) = (task_id,);
                /// The registered repositories, by name: each one's description,
                /// environment, upstream (its URL without a password), signing
                /// principal and newest sync event; never a credential. An agent
                /// sees the repositories it may propose for. Since 9.2; not on
                /// Tasks1 (`tasks_v1`).
                LIST_REPOSITORIES = ListRepositories("") -> "s" RepositoryList,
                    polkit TASKS_READ, audited REPOSITORIES_READ,
                    client list_repositories() = ();
                /// Cancel a task that is not terminal: `s` task id, `s` an
                /// `airlock.task-decision.v1` request (`DecisionRequest`,
                /// `cancel`). Not from the planner agent that submitted the
                /// task (`SELF_APPROVAL_FORBIDDEN`, whatever polkit says,
                /// checked before the request is read and recorded under
                /// the agent's name); CAS on the revision, attempt and result SHA-256 the admin
                /// saw; exactly once by its idempotency key (a replay answers
                /// the stored outcome); refused while the worker holds a
                /// fence (`TASK_COMMITTING`).
                CANCEL_TASK = CancelTask("ss") -> "s" DecisionOutcome,
                    polkit TASKS_MANAGE, audited TASK_CANCELLED,
                    client cancel_task(req: &$crate::task::DecisionRequest) = (req.task_id.as_str(), req.to_value().to_string());
                /// Decide on a VERIFYING task: `s` task id, `s` an
                /// `airlock.task-decision.v1` request (`DecisionRequest`:
                /// `accept`, `rework`, `reject`). Not from the planner agent
                /// that submitted the task (`SELF_APPROVAL_FORBIDDEN`, as for
                /// CancelTask); CAS on the revision, attempt and result
                /// SHA-256 the admin saw; exactly once by its idempotency key.
                VERIFY = Verify("ss") -> "s" DecisionOutcome,
                    polkit TASKS_MANAGE, audited TASK_VERIFIED,
                    client verify(req: &$crate::task::DecisionRequest) = (req.task_id.as_str(), req.to_value().to_string());
            }

            /// `org.airlock.Worker1`: the worker only, admitted by its peer uid.
            mod worker = "org.airlock.Worker1" {
                also {}
                /// Claim the oldest QUEUED task with attempts left under a
                /// fresh lease (`null` when none is claimable).
                CLAIM = Claim("") -> "s" Option<ClaimGrant>,
                    peer Worker, audited TASK_CLAIMED,
                    client claim() = ();
                /// Extend a lease: `LeaseRef` as `s` `t` `s`; the new expiry
                /// (unix ms). The task RUNNING under that lease and epoch.
                RENEW = Renew("sts") -> "x" i64,
                    peer Worker, audited TASK_LEASE_RENEWED,
                    client renew(lease: &$crate::bus::LeaseRef) = (lease.task_id.as_str(), lease.lease_epoch, lease.lease_token.as_str());
                /// Submit an attempt's result: `LeaseRef` as `s` `t` `s`, `s`
                /// idempotency key, `s` an `airlock.task-result.v1` result
                /// (`TaskResult`). The task RUNNING under that lease, or a
                /// byte-identical replay; a `RECONCILIATION_REQUIRED` result
                /// carries what the worker saw of the branch (the commit
                /// made, the head found) and opens a reconciliation case.
                SUBMIT_RESULT = SubmitResult("stsss") -> "s" ResultReceipt,
                    peer Worker, audited TASK_RESULT_SUBMITTED,
                    client submit_result(lease: &$crate::bus::LeaseRef, key: &str, result: &$crate::task::TaskResult) = (
                        lease.task_id.as_str(),
                        lease.lease_epoch,
                        lease.lease_token.as_str(),
                        key,
                        $crate::bus::encode(result)?,
                    );
                /// Take a reconciliation case an administrator chose to adopt, to
                /// check the ref (`null` when none waits). Reading it
                /// changes nothing.
                TAKE_ADOPTION = TakeAdoption("") -> "s" Option<AdoptionCheck>,
                    peer Worker, audited ADOPTION_TAKEN,
                    client take_adoption() = ();
                /// Fence a ref move (or a push) of the attempt the lease belongs
                /// to, or release the fence: `LeaseRef` as `s` `t` `s`, `s` a
                /// `FenceRequest` (a hold within `1..=MAX_FENCE_MS` naming
                /// the commit; 0 for a release). The task RUNNING under that
                /// lease and epoch. While a fence stands, the task cannot be
                /// cancelled (`TASK_COMMITTING`) and its lease does not expire, so
                /// no ref moves for an attempt whose task was cancelled or whose
                /// lease was taken. Since 11.0.
                FENCE = Fence("stss") -> "s" FenceGrant,
                    peer Worker, audited TASK_FENCED,
                    client fence(lease: &$crate::bus::LeaseRef, req: &$crate::bus::FenceRequest) = (
                        lease.task_id.as_str(),
                        lease.lease_epoch,
                        lease.lease_token.as_str(),
                        $crate::bus::encode(req)?,
                    );
                /// Report what the ref holds for an adoption taken: `s` an
                /// `AdoptionReport`, about a case still adopting that head
                /// (else nothing changes).
                SETTLE_ADOPTION = SettleAdoption("s") -> "s" ReconciliationCase,
                    peer Worker, audited TASK_RECONCILIATION_ADOPTED,
                    client settle_adoption(report: &$crate::reconcile::AdoptionReport) = ($crate::bus::encode(report)?,);
                /// Record what happened with an upstream: `s` an
                /// `UpstreamReport` (recorded as the event its kind names).
                REPORT_UPSTREAM = ReportUpstream("s") -> "" (),
                    peer Worker, audited UPSTREAM_REPORTED,
                    client report_upstream(report: &$crate::upstream::UpstreamReport) = ($crate::bus::encode(report)?,);
            }

            /// `org.airlock.Retry1`: airlock-retryd only, admitted by its peer uid.
            mod retry = "org.airlock.Retry1" {
                also {}
                /// Grant a FAILED, exhausted task one more attempt (the store's
                /// compare-and-swap transaction: one step, idempotent,
                /// audited): `s` task id, `s` the owner's
                /// `RetryExtensionRequest`, `s` the owner id.
                EXTEND_RETRY = ExtendRetry("sss") -> "s" RetryExtensionOutcome,
                    peer Retry, audited TASK_RETRY_EXTENSION_AUTHORIZED,
                    client extend_retry(task_id: &str, request: &$crate::retry::RetryExtensionRequest, authorization_id: &str) = (
                        task_id,
                        $crate::bus::encode(request)?,
                        authorization_id,
                    );
            }

            /// `org.airlock.Agents1`: the planner agents the supervisor runs;
            /// admins, authorised by polkit.
            mod agents = "org.airlock.Agents1" {
                also {
                    /// Signal: `s` agent name, `s` state, `u` consecutive failures.
                    pub const AGENT_CHANGED: &str = "AgentChanged";
                }
                /// Every configured agent with its state.
                LIST_AGENTS = ListAgents("") -> "s" AgentList,
                    polkit AGENTS_READ, audited AGENTS_READ,
                    client list_agents() = ();
                /// One agent with its state: `s` name.
                GET_AGENT = GetAgent("s") -> "s" AgentView,
                    polkit AGENTS_READ, audited AGENTS_READ,
                    client get_agent(name: &str) = (name,);
                /// One agent's quotas and cap on running tasks with its use
                /// of them now (counted by the task store, on every host):
                /// `s` name, a configured agent. Since 12.0.
                GET_AGENT_LIMITS = GetAgentLimits("s") -> "s" AgentLimits,
                    polkit AGENTS_READ, audited AGENTS_READ,
                    client get_agent_limits(name: &str) = (name,);
                /// Start a stopped agent: `s` name, a configured agent
                /// (refused while held: `AGENTOS_CRASH_LOOP`).
                START_AGENT = StartAgent("s") -> "s" AgentView,
                    polkit AGENTS_MANAGE, audited AGENT_START_REQUESTED,
                    client start_agent(name: &str) = (name,);
                /// Stop an agent (never counted as a failure): `s` name.
                STOP_AGENT = StopAgent("s") -> "s" AgentView,
                    polkit AGENTS_MANAGE, audited AGENT_STOP_REQUESTED,
                    client stop_agent(name: &str) = (name,);
                /// Clear a hold: the count resets and the agent starts: `s` name.
                CLEAR_HOLD = ClearHold("s") -> "s" AgentView,
                    polkit AGENTS_MANAGE, audited AGENT_HOLD_CLEARED,
                    client clear_hold(name: &str) = (name,);
                /// Cancel the QUEUED tasks an agent submitted, with AGENT_REVOKED:
                /// `s` name, `s` reason. Refused with AGENT_RUNNING unless the agent
                /// is stopped or held (or no longer configured). Since 8.1.
                CANCEL_QUEUED = CancelQueued("ss") -> "s" AgentQueueCancelled,
                    polkit AGENTS_MANAGE, audited AGENT_QUEUE_CANCELLED,
                    client cancel_agent_queued(name: &str, reason: &str) = (name, reason);
            }

            /// `org.airlock.Reconcile1`: reconciliation cases (an attempt whose
            /// branch moved behind the worker's back); admins, authorised by polkit.
            mod reconcile = "org.airlock.Reconcile1" {
                also {}
                /// Page through cases: `s` status or `""`, `s` after task id or
                /// `""`, `u` limit. The cases of the caller's own tasks;
                /// every case with `org.airlock.tasks.read-all`.
                LIST_RECONCILIATIONS = ListReconciliations("ssu") -> "s" ReconciliationPage,
                    polkit TASKS_READ, audited RECONCILIATIONS_READ,
                    client list_reconciliations(status: &str, after: &str, limit: u32) = (status, after, limit);
                /// A task's latest case: `s` task id (another's is
                /// `RECONCILIATION_NOT_FOUND`, as for a task with none).
                GET_RECONCILIATION = GetReconciliation("s") -> "s" ReconciliationCase,
                    polkit TASKS_READ, audited RECONCILIATIONS_READ,
                    client get_reconciliation(task_id: &str) = (task_id,);
                /// Adopt the observed head or fail the task, exactly once: `s`
                /// task id, `s` an `airlock.reconciliation-resolution.v1`
                /// request (`ResolveRequest`). Not from the planner agent
                /// that submitted the task (`SELF_APPROVAL_FORBIDDEN`); CAS on
                /// the case's attempt, revision and observed head the admin
                /// saw; exactly once by its idempotency key; the case open
                /// and the task FAILED.
                RESOLVE_RECONCILIATION = ResolveReconciliation("ss") -> "s" ResolveOutcome,
                    polkit RECONCILE_MANAGE, audited TASK_RECONCILIATION_RESOLVED,
                    client resolve_reconciliation(req: &$crate::reconcile::ResolveRequest) = (req.task_id.as_str(), req.to_value().to_string());
            }

            /// `org.airlock.AgentHost1`: served by airlock-local (root) for the
            /// supervisor where there is no systemd; starts, probes and stops agent
            /// processes by name (the process driver). Admitted by the caller's
            /// uid: the supervisor's only. Not part of [`INTERFACES`] (another
            /// process serves it, under its own name).
            mod agent_host = "org.airlock.AgentHost1" {
                also {
                    /// The well-known name.
                    pub const BUS_NAME: &str = "org.airlock.AgentHost1";
                    /// The object.
                    pub const OBJECT_PATH: &str = "/org/airlock/AgentHost1";
                }
                /// Start the configured agent `s` name; the session it leads (its
                /// leader's pid; 0: none).
                START = Start("s") -> "u" u32,
                    peer Supervisor;
                /// Whether the configured agent `s` name runs.
                PROBE = Probe("s") -> "s" AgentLiveness,
                    peer Supervisor;
                /// Stop the configured agent `s` name and its process group.
                STOP = Stop("s") -> "" (),
                    peer Supervisor;
            }
        }
    };
}

rows!(declare);

/// A call shape an interface no longer takes: answered with
/// `PROTOCOL_VERSION_MISMATCH` naming the interface and method to call
/// instead, never with the bus library's bare signature error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retired {
    /// The method.
    pub name: &'static str,
    /// The argument signature it took.
    pub input: &'static str,
    /// What those arguments were, and until which protocol.
    pub was: &'static str,
    /// The row to call instead.
    pub instead: Method,
}

impl Retired {
    /// The refusal of a call of this shape on `interface`.
    pub fn refusal(&self, interface: &str) -> Error {
        Error::with(
            Code::PROTOCOL_VERSION_MISMATCH,
            format!(
                "{interface}.{} ({}) is the call of {}; since then it takes ({}): call {} ({}) -> {}. {interface} is kept for one release beside {}",
                self.name,
                self.input,
                self.was,
                self.instead.input,
                self.instead.path(),
                self.instead.input,
                self.instead.output,
                self.instead.interface,
            ),
        )
    }
}

/// `rows` under the name `interface`.
const fn renamed<const N: usize>(mut rows: [Method; N], interface: &'static str) -> [Method; N] {
    let mut i = 0;
    while i < N {
        rows[i] = Method {
            interface,
            ..rows[i]
        };
        i += 1;
    }
    rows
}

/// The names of `rows`, in their order.
const fn names<const N: usize>(rows: [Method; N]) -> [&'static str; N] {
    let mut out = [""; N];
    let mut i = 0;
    while i < N {
        out[i] = rows[i].name;
        i += 1;
    }
    out
}

/// `org.airlock.Tasks1`, kept for one release beside [`tasks`]
/// (`Tasks2`): the methods it had in protocol 3.0 to 6.1, with the
/// signatures they had then, served by the same handlers, its
/// `TaskChanged` emitted as well; introspection marks it deprecated. A
/// method `Tasks2` gained since (`GetPlan`, 9.1; `ListRepositories`, 9.2;
/// `CountEvents`, 12.0) is not served under the old name. Verify's call of before 3.0 (three strings) is refused by
/// name ([`tasks_v1::RETIRED`]). Its pre-3.0 `CancelTask (task id,
/// reason)` has today's signature and is refused as a decision that is
/// not JSON (`MESSAGE_INVALID`).
pub mod tasks_v1 {
    use super::*;
    /// The interface.
    pub const INTERFACE: &str = "org.airlock.Tasks1";
    /// The interface that replaces it.
    pub const SUCCESSOR: &str = tasks::INTERFACE;
    /// The Tasks2 rows it serves under its own name: exactly the methods
    /// it had (`crates/proto/bus.lock`), never one Tasks2 gained later.
    const SERVED: [Method; 7] = [
        <tasks::SubmitTask as Call>::METHOD,
        <tasks::ReplacePlan as Call>::METHOD,
        <tasks::GetTask as Call>::METHOD,
        <tasks::ListTasks as Call>::METHOD,
        <tasks::ListEvents as Call>::METHOD,
        <tasks::CancelTask as Call>::METHOD,
        <tasks::Verify as Call>::METHOD,
    ];
    /// Methods, in declaration order (Tasks2's, without those added
    /// since 7.0).
    pub const METHODS: &[&str] = &names(SERVED);
    /// Its rows: those Tasks2 rows, under this name.
    pub const ROWS: &[Method] = &renamed(SERVED, INTERFACE);
    /// The call shapes it no longer takes.
    pub const RETIRED: &[Retired] = &[Retired {
        name: tasks::VERIFY,
        input: "sss",
        was: "airlock bus protocol before 3.0 (task id, decision, reason)",
        instead: <tasks::Verify as Call>::METHOD,
    }];
}

/// Every interface the supervisor serves with its methods.
pub const INTERFACES: &[(&str, &[&str])] = &[
    (tasks::INTERFACE, tasks::METHODS),
    (tasks_v1::INTERFACE, tasks_v1::METHODS),
    (worker::INTERFACE, worker::METHODS),
    (retry::INTERFACE, retry::METHODS),
    (agents::INTERFACE, agents::METHODS),
    (reconcile::INTERFACE, reconcile::METHODS),
];

/// Every row the supervisor serves, interface by interface.
pub const ROWS: &[&[Method]] = &[
    tasks::ROWS,
    tasks_v1::ROWS,
    worker::ROWS,
    retry::ROWS,
    agents::ROWS,
    reconcile::ROWS,
];

/// Every row of the contract: the supervisor's and the agent host's.
pub fn every_row() -> impl Iterator<Item = &'static Method> {
    ROWS.iter()
        .copied()
        .chain([agent_host::ROWS])
        .flat_map(|rows| rows.iter())
}

/// The row of `interface.name`, if the contract has one.
pub fn row(interface: &str, name: &str) -> Option<&'static Method> {
    every_row().find(|m| m.interface == interface && m.name == name)
}

/// One planner agent as `GetAgent` and `ListAgents` show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentView {
    /// Its name (`[[agent]] name`).
    pub name: String,
    /// `STOPPED`, `STARTING`, `RUNNING`, `BACKOFF` or `HELD`.
    pub state: String,
    /// Consecutive failures since the last reset.
    pub consecutive_failures: u32,
    /// With `BACKOFF`: when it starts again (unix ms).
    pub next_start_at_ms: Option<u64>,
    /// With `RUNNING`: since when (unix ms).
    pub running_since_ms: Option<u64>,
    /// The last failure's exit status, when it exited.
    pub last_exit_status: Option<i32>,
    /// The last failure's signal, when a signal ended it.
    pub last_exit_signal: Option<i32>,
    /// The last failure's reason (a failed start, a timed-out call).
    pub last_failure: Option<String>,
    /// With `HELD`: why.
    pub hold_reason: Option<String>,
    /// The repositories it may propose for.
    pub repositories: Vec<String>,
    /// When its record last changed (unix ms).
    pub updated_at_ms: u64,
}

/// `GetAgentLimits`'s reply (since protocol 12.0): a planner agent's
/// quotas and cap on running tasks (its `[[agent]]` table's, and the
/// supervisor's `max_running_per_submitter`), and its use of them now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentLimits {
    /// The agent (`[[agent]] name`).
    pub name: String,
    /// `tasks_per_hour`: most tasks submitted in any 3,600 s of store
    /// time; 0: none.
    pub tasks_per_hour: u32,
    /// `cpu_seconds_per_day`: most CPU seconds its tasks' verification may
    /// use in any 86,400 s of store time; 0: none.
    pub cpu_seconds_per_day: u64,
    /// Most of its tasks RUNNING at once (its `max_running`, else the
    /// supervisor's `max_running_per_submitter`); 0: none.
    pub max_running: u32,
    /// Its use now, counted by the task store.
    pub usage: AgentUsage,
}

/// What a planner agent has used of its quotas, counted by the task store
/// at one store time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentUsage {
    /// Tasks it submitted in the last 3,600 s.
    pub tasks_last_hour: u64,
    /// CPU milliseconds its tasks' verification used in the last 86,400 s
    /// (the commands' wall-clock time until results carry CPU time).
    pub cpu_ms_last_day: u64,
    /// Its tasks RUNNING now, on every host.
    pub running: u64,
}

/// `CancelQueued`'s reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentQueueCancelled {
    /// The agent (`[[agent]] name`).
    pub name: String,
    /// The tasks that were QUEUED and are CANCELLED now, in queue order.
    pub cancelled: Vec<String>,
}

/// `ListAgents`'s reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentList {
    /// Every configured agent, by name.
    pub agents: Vec<AgentView>,
}

/// `AgentHost1.Probe`'s reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentLiveness {
    /// Whether it runs.
    pub alive: bool,
    /// Its exit status, when it exited.
    pub exit_status: Option<i32>,
    /// The signal that ended it.
    pub exit_signal: Option<i32>,
    /// What else is known.
    pub reason: String,
}

/// The lease a worker holds on one attempt: every call after a claim names
/// it, and the supervisor fences on all three parts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseRef {
    /// The task.
    pub task_id: String,
    /// The fencing epoch the claim returned.
    pub lease_epoch: u64,
    /// The bearer secret the claim returned (only its SHA-256 is stored).
    pub lease_token: String,
}

impl LeaseRef {
    /// The lease a claim granted.
    pub fn of(grant: &ClaimGrant) -> Self {
        LeaseRef {
            task_id: grant.task_id.clone(),
            lease_epoch: grant.lease_epoch,
            lease_token: grant.lease_token.clone(),
        }
    }
}

impl std::fmt::Display for LeaseRef {
    /// Never shows the token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (epoch {})", self.task_id, self.lease_epoch)
    }
}

/// What a fence is for ([`FenceRequest::step`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FenceStep {
    /// The compare-and-swap of the task's agent branch in the authority
    /// repository.
    Ref,
    /// The push of the agent branch to the repository's upstream.
    Push,
    /// The step is over: the fence is released.
    Release,
}

impl FenceStep {
    /// The name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            FenceStep::Ref => "ref",
            FenceStep::Push => "push",
            FenceStep::Release => "release",
        }
    }
}

/// `Worker1.Fence`'s request: the side effect the lease holder is about to
/// take, and how long the supervisor must hold off every move of the task
/// for it (a cancel, the lease's expiry). The holder asks for the step's
/// bound plus a start window, starts the step only within the window, by
/// its own monotonic clock counted from before it asked, and so ends it
/// within the hold (a push is bounded by its timeout).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FenceRequest {
    /// What the fence is for.
    pub step: FenceStep,
    /// The commit the ref or the push will point at (`None` to release).
    pub commit_oid: Option<String>,
    /// How long to hold, in ms, within `1..=MAX_FENCE_MS` (0 to release).
    pub hold_ms: u64,
}

/// `Worker1.Fence`'s reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FenceGrant {
    /// The task.
    pub task_id: String,
    /// What the fence is for (`release`: none stands any more).
    pub step: FenceStep,
    /// Until when (unix ms, the store's clock) the fence stands; `None`
    /// once released.
    pub fenced_until_ms: Option<i64>,
    /// The lease's expiry now (never before the fence's end).
    pub lease_expires_at_ms: i64,
}

/// `SubmitTask`'s reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitReply {
    /// The task as stored.
    pub task: TaskView,
    /// True when an identical submission had been made before.
    pub idempotent: bool,
}

/// `SubmitResult`'s reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResultReceipt {
    /// The task after the result.
    pub task: TaskView,
    /// True when this exact result had been accepted before (a replay).
    pub idempotent: bool,
}

/// `ListTasks`'s reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskPage {
    /// Up to `limit` tasks, ordered by task id.
    pub tasks: Vec<TaskView>,
    /// Pass as `after` for the next page; `None` when this one was short.
    pub next_after: Option<String>,
}

/// One entry of the event log as the bus shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventRecord {
    /// Increasing id.
    pub id: i64,
    /// The task, when the event concerns one.
    pub task_id: Option<String>,
    /// When (store time, unix ms).
    pub at_ms: i64,
    /// Who: `kind` (admin, planner, worker, owner, system), `uid`, `name`.
    pub actor: Value,
    /// What (an action name).
    pub action: String,
    /// `allowed` or `denied`.
    pub outcome: String,
    /// The refusal code of a denied event.
    pub code: Option<String>,
    /// Details; never a secret.
    pub payload: Value,
}

/// `ListEvents`'s reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventPage {
    /// Up to `limit` events, oldest first.
    pub events: Vec<EventRecord>,
    /// Pass as `after` for the next page.
    pub next_after: i64,
}

/// `CountEvents`'s reply (since protocol 12.0): the events of one task
/// the caller may read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventCount {
    /// The task.
    pub task_id: String,
    /// Its events, allowed and denied.
    pub events: u64,
    /// Of those, the denied ones.
    pub denied: u64,
    /// How many of each action, by action name.
    pub by_action: std::collections::BTreeMap<String, u64>,
}

/// `ListRepositories`'s reply (since protocol 9.2).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RepositoryList {
    /// The registered repositories the caller may see, by name.
    pub repositories: Vec<RepositoryView>,
}

/// One registered repository as `ListRepositories` shows it: what
/// `airlockctl repo show --json` says of it that is no credential, and not
/// where it is kept on the host. Its upstream's URL is shown without a
/// password ([`crate::upstream::without_password`]); its credential
/// files, the upstream's user, push options and host keys are not shown
/// at all.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RepositoryView {
    /// The name tasks use (`[[repository]] name`).
    pub name: String,
    /// Free text for admins.
    pub description: Option<String>,
    /// Its verification environment; `None`: system programs only.
    pub environment: Option<RepositoryEnvironment>,
    /// Its upstream; `None`: none.
    pub upstream: Option<RepositoryUpstream>,
    /// Its commit signing; `None`: commits are not signed.
    pub signing: Option<RepositorySigning>,
    /// The newest sync event of its upstream in the event log
    /// (`UPSTREAM_SYNCED`, `UPSTREAM_SYNC_FAILED`,
    /// `UPSTREAM_REF_REWRITTEN`); `None`: none recorded.
    pub last_upstream_event: Option<UpstreamEventView>,
}

/// A repository's environment as configured, and what the supervisor
/// resolved it to when it last read the configuration (the resolution it
/// checks submissions against), as `airlockctl repo show --json` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RepositoryEnvironment {
    /// `[repository.environment]` as configured.
    pub configured: Value,
    /// Its resolution on the supervisor's host; `None` with a problem.
    pub resolved: Option<Value>,
    /// Why it is unusable there; `None` when it resolved.
    pub problem: Option<EnvironmentProblem>,
}

/// Why an environment is unusable.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvironmentProblem {
    /// The catalogue code (`ENVIRONMENT_PATH_UNSAFE`, …).
    pub code: String,
    /// The dotted key (`environment.paths[0]`).
    pub key: String,
    /// What was wrong, and what is expected.
    pub message: String,
}

/// A repository's upstream, without anything that authenticates to it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RepositoryUpstream {
    /// The remote's URL, without a password in its userinfo.
    pub url: String,
    /// Whether agent branches are pushed to it.
    pub publish: bool,
    /// Seconds between scheduled fetches (0: none).
    pub sync_interval_seconds: u32,
}

/// A repository's commit signing: its signer, never its key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RepositorySigning {
    /// The signer's allowed-signers name.
    pub principal: String,
}

/// One sync event of an upstream, from the event log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamEventView {
    /// The event's id (as `ListEvents` pages).
    pub id: i64,
    /// `UPSTREAM_SYNCED`, `UPSTREAM_SYNC_FAILED` or `UPSTREAM_REF_REWRITTEN`.
    pub action: String,
    /// `allowed` (the worker's reports are never refused once recorded).
    pub outcome: String,
    /// When (store time, unix ms).
    pub at_ms: i64,
    /// What the worker reported (its `detail`: the refs changed, the
    /// code and detail of a failure).
    pub detail: Value,
}

/// Serialises a reply for the wire.
pub fn encode<T: Serialize>(reply: &T) -> Result<String, Error> {
    serde_json::to_string(reply)
        .map_err(|e| Error::with(Code::INTERNAL, format!("serialising a reply: {e}")))
}

/// Parses a reply from the wire: a missing or unknown field is a
/// `MESSAGE_INVALID` error, never a default.
pub fn decode<T: serde::de::DeserializeOwned>(method: &str, text: &str) -> Result<T, Error> {
    serde_json::from_str(text).map_err(|e| {
        Error::with(
            Code::MESSAGE_INVALID,
            format!("the supervisor's {method} reply does not parse: {e}"),
        )
    })
}

/// The reply type of `ExtendRetry`.
pub type RetryReply = RetryExtensionOutcome;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_well_formed() {
        let mut seen = std::collections::BTreeSet::new();
        for (iface, methods) in INTERFACES {
            assert!(iface.starts_with("org.airlock."), "{iface}");
            assert!(iface.ends_with(|c: char| c.is_ascii_digit()), "{iface}");
            for m in *methods {
                assert!(m.chars().next().unwrap().is_ascii_uppercase(), "{m}");
                assert!(m.chars().all(|c| c.is_ascii_alphanumeric()), "{m}");
                assert!(seen.insert((*iface, *m)), "{iface}.{m} twice");
            }
        }
    }

    #[test]
    fn every_row_is_well_formed() {
        let mut seen = std::collections::BTreeSet::new();
        for m in every_row() {
            assert!(seen.insert((m.interface, m.name)), "{} twice", m.path());
            for sig in [m.input, m.output] {
                assert!(
                    sig.chars().all(|c| "sutxib".contains(c)),
                    "{}: {sig:?}",
                    m.path()
                );
            }
            if let Permission::Polkit(id) = m.permission {
                assert!(action::ALL.contains(&id), "{}: {id}", m.path());
            }
            // The agent host alone logs to the journal only.
            assert_eq!(
                m.event.is_none(),
                m.interface == agent_host::INTERFACE,
                "{}",
                m.path()
            );
            if m.output == "s" {
                assert!(!m.reply.is_empty(), "{}", m.path());
            }
        }
        // INTERFACES and ROWS say the same.
        for ((iface, names), rows) in INTERFACES.iter().zip(ROWS) {
            let from_rows: Vec<&str> = rows.iter().map(|m| m.name).collect();
            assert_eq!(&from_rows, names, "{iface}");
            assert!(rows.iter().all(|m| m.interface == *iface));
        }
        assert_eq!(row(tasks::INTERFACE, tasks::VERIFY).unwrap().input, "ss");
        assert_eq!(row(tasks_v1::INTERFACE, tasks::VERIFY).unwrap().input, "ss");
        // Tasks1 is Tasks2's rows of 7.0 under the old name, and no more.
        assert_eq!(
            tasks_v1::METHODS,
            [
                "SubmitTask",
                "ReplacePlan",
                "GetTask",
                "ListTasks",
                "ListEvents",
                "CancelTask",
                "Verify"
            ]
        );
        for v1 in tasks_v1::ROWS {
            let v2 = row(tasks::INTERFACE, v1.name).unwrap();
            assert_eq!(
                Method {
                    interface: v2.interface,
                    ..*v1
                },
                *v2
            );
        }
        for gained in [
            tasks::GET_PLAN,
            tasks::LIST_REPOSITORIES,
            tasks::COUNT_EVENTS,
        ] {
            assert!(row(tasks::INTERFACE, gained).is_some(), "{gained}");
            assert!(row(tasks_v1::INTERFACE, gained).is_none(), "{gained}");
        }
        assert!(row(tasks::INTERFACE, "Nope").is_none());
    }

    #[test]
    fn a_call_with_other_arguments_than_its_rows_is_message_invalid_naming_both() {
        let e = <tasks::Verify as Call>::METHOD.wrong_arguments("sss");
        assert_eq!(e.code, Code::MESSAGE_INVALID);
        assert_eq!(
            e.to_string(),
            "MESSAGE_INVALID: org.airlock.Tasks2.Verify takes the arguments (ss) and answers (s); this call's arguments are (sss)"
        );
    }

    #[test]
    fn a_retired_call_is_refused_naming_what_to_call() {
        let r = &tasks_v1::RETIRED[0];
        assert_ne!(r.input, r.instead.input, "a retired shape is not today's");
        let e = r.refusal(tasks_v1::INTERFACE);
        assert_eq!(e.code, Code::PROTOCOL_VERSION_MISMATCH);
        let text = e.to_string();
        assert!(
            text.contains("org.airlock.Tasks1.Verify (sss)")
                && text.contains("org.airlock.Tasks2.Verify (ss)"),
            "{text}"
        );
    }

    #[test]
    fn a_permission_compares_in_constant_context() {
        const A: Permission = Permission::Polkit(action::TASKS_READ);
        const SAME: bool = A.same(Permission::Polkit("org.airlock.tasks.read"));
        const OTHER: bool = A.same(Permission::Polkit(action::TASKS_MANAGE));
        const PEER: bool = A.same(Permission::PeerUid(Peer::Worker));
        const { assert!(SAME && !OTHER && !PEER) };
        assert!(Permission::PeerUid(Peer::Retry).same(Permission::PeerUid(Peer::Retry)));
        assert!(!Permission::PeerUid(Peer::Retry).same(Permission::PeerUid(Peer::Worker)));
    }

    #[test]
    fn a_missing_field_is_a_decode_error_not_a_default() {
        let e = decode::<EventPage>("ListEvents", r#"{"events": []}"#).unwrap_err();
        assert_eq!(e.code, Code::MESSAGE_INVALID);
        let e = decode::<EventPage>("ListEvents", r#"{"events": [], "next_after": 1, "x": 1}"#)
            .unwrap_err();
        assert_eq!(e.code, Code::MESSAGE_INVALID);
        let ok: EventPage = decode("ListEvents", r#"{"events": [], "next_after": 7}"#).unwrap();
        assert_eq!(ok.next_after, 7);
    }

    #[test]
    fn a_client_may_lag_one_minor_and_no_major() {
        assert!(check_protocol((1, 1), "1.1").is_ok());
        assert!(check_protocol((1, 0), "1.1").is_ok(), "one minor behind");
        assert!(check_protocol((1, 3), "1.0").is_ok(), "ahead");
        for (client, server) in [((1, 0), "1.2"), ((1, 1), "1.9")] {
            let e = check_protocol(client, server).unwrap_err();
            assert_eq!(e.code, Code::PROTOCOL_VERSION_MISMATCH);
            let text = e.to_string();
            assert!(
                text.contains(&protocol_string(client))
                    && text.contains(server)
                    && text.contains("one minor version behind"),
                "{text}"
            );
        }
        for server in ["2.0", "0.9", "1", "x.y", ""] {
            let e = check_protocol((1, 1), server).unwrap_err();
            assert_eq!(e.code, Code::PROTOCOL_VERSION_MISMATCH);
            let text = e.to_string();
            assert!(text.contains("1.1") && text.contains(server), "{text}");
        }
    }

    #[test]
    fn a_lease_never_shows_its_token() {
        let l = LeaseRef {
            task_id: "t".into(),
            lease_epoch: 3,
            lease_token: "secret-token".into(),
        };
        assert!(!l.to_string().contains("secret"));
    }
}

//! airlock-supervisor: the task queue's owner on the D-Bus system bus.
//!
//! ```text
//!  planner / airlockctl ──Tasks2──▶ ┌──────────────────────────────┐
//!      (polkit decides)             │ airlock-supervisor (airlock) │──▶ task store (SQLite)
//!  airlock-worker ───────Worker1──▶ │  org.airlock.Supervisor1     │
//!  airlock-retryd ────────Retry1──▶ │                              │   (or PostgreSQL,
//!      (peer uid decides)           └──────────────────────────────┘    shared by hosts)
//! ```
//!
//! Modules, in the order a call meets them:
//!
//! - [`bus`]: the interfaces (their contract is one row per method in
//!   [`airlock_proto::bus`]), the one entry function of every handler,
//!   the in-flight counter, the caller's bus-verified identity, the
//!   mapping of refusals to D-Bus errors, and the signals (the agents'
//!   changes reach it through a channel);
//! - [`authz`]: the [`authz::Authorizer`] trait (polkit, the local
//!   authoriser for machines without polkit, and — only in builds with the
//!   `test-authorizers` feature, which packages never enable — test
//!   authorisers), the Worker1 and Retry1 uid checks, and the
//!   [`authz::Authorized`] tokens only it can make;
//! - [`ops`]: what each method does to the task store, each operation
//!   demanding the token of its permission;
//! - [`repositories`]: the registered repositories as ListRepositories
//!   shows them, without a credential;
//! - [`agents`]: the planner agents' runners, their changes sent on a
//!   channel (the domain never calls the bus);
//! - [`store`]: the task store itself, below all of them (authz records
//!   refusals in it without knowing the operations);
//! - [`sweeper`]: expired leases back to the queue, or failed;
//! - [`follow`]: with a PostgreSQL store, other hosts' changes as
//!   `TaskChanged` on this bus;
//! - [`journal`]: the audit trail in the journal, one `MESSAGE_ID` per
//!   action with its catalogue entry;
//! - [`metrics`]: `airlock.prom` for the node exporter's textfile
//!   collector, from the queue summary and the event log;
//! - [`notify`]: READY, STATUS, STOPPING, WATCHDOG;
//! - [`daemon`]: start-up and orderly shutdown.

pub mod agents;
pub mod authz;
pub mod bus;
pub mod daemon;
pub mod follow;
pub mod journal;
pub mod metrics;
pub mod notify;
pub mod ops;
pub mod repositories;
pub mod store;
pub mod sweeper;

//! airlock-supervisor: the task queue's owner on the D-Bus system bus.
//!
//! ```text
//!  planner / airlockctl ──Tasks1──▶ ┌──────────────────────────────┐
//!      (polkit decides)             │ airlock-supervisor (airlock) │──▶ task store (SQLite)
//!  airlock-worker ───────Worker1──▶ │  org.airlock.Supervisor1     │
//!      (peer uid decides)           └──────────────────────────────┘
//! ```
//!
//! Modules, in the order a call meets them:
//!
//! - [`bus`]: the two interfaces, the in-flight counter, the caller's
//!   bus-verified identity, and the mapping of refusals to D-Bus errors;
//! - [`authz`]: the [`authz::Authorizer`] trait (polkit, or an explicitly
//!   chosen test authoriser), the Worker1 uid check, and the
//!   [`authz::Authorized`] tokens only it can make;
//! - [`ops`]: what each method does to the task store, each operation
//!   demanding the token of its permission;
//! - [`sweeper`]: expired leases back to the queue, or failed;
//! - [`notify`]: READY, STATUS, STOPPING, WATCHDOG;
//! - [`daemon`]: start-up and orderly shutdown;
//! - [`testbus`]: a private system-like dbus-daemon for tests and benches.

pub mod authz;
pub mod bus;
pub mod daemon;
pub mod notify;
pub mod ops;
pub mod sweeper;
pub mod testbus;

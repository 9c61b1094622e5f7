//! airlock-store: SQLite persistence for airlock.
//!
//! Two databases, each owned by one privilege domain:
//!
//! - the **task store** ([`tasks::TaskStore`]), owned by the supervisor:
//!   the queue, plans, leases, results, verification decisions, the
//!   owner-controlled retry extension, and an append-only event log that
//!   records denials as well as successes;
//! - the **checkpoint journal** ([`checkpoint::CheckpointJournal`]), owned by
//!   the worker: append-only, phase-monotonic evidence of each attempt,
//!   used to resume after a crash without repeating a side effect.
//!
//! Both run in WAL mode with `synchronous=FULL`, a busy timeout, and
//! versioned migrations ([`db::open`]).

pub mod checkpoint;
pub mod clock;
pub mod db;
pub mod error;
pub mod tasks;

pub use error::{StoreError, StoreResult};

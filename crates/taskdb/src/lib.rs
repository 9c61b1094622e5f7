//! airlock-taskdb: the supervisor's task database, and only the
//! supervisor's: nothing else opens it (the file is 0600 airlock:airlock;
//! airlock-retryd asks the supervisor over D-Bus instead).
//!
//! [`tasks::TaskStore`] holds the queue, plans, leases, results,
//! verification decisions, the owner-controlled retry extension, and an
//! append-only event log that records denials as well as successes. It
//! opens through `airlock_sqlite::db::open` (WAL, `synchronous=FULL`,
//! versioned migrations).

pub mod tasks;

pub use airlock_sqlite::{StoreError, StoreResult, clock};

//! airlock-journal: the worker's checkpoint journal, and only the worker's.
//!
//! [`checkpoint::CheckpointJournal`] is append-only and phase-monotonic
//! within an attempt; every row is bound to the attempt's binding digest, so
//! a checkpoint from another repository, branch or generation is never
//! reused. The worker resumes from it after a crash without repeating a side
//! effect. It opens through `airlock_sqlite::db::open` (WAL,
//! `synchronous=FULL`, versioned migrations). One journal is shared by all
//! of the worker's attempts; appends that arrive during a commit are
//! group-committed into the next one, each acknowledged only after its
//! commit's fsync.

pub mod checkpoint;
mod file;

pub use airlock_sqlite::{SqliteError, SqliteResult, clock};

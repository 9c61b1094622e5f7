//! airlock-worker: the only process that writes `agent/*` refs.
//!
//! For each claimed attempt it walks the checkpoint phases of DESIGN.md §3,
//! appending a durable checkpoint after each one, so that a crash or
//! `kill -9` anywhere resumes without repeating a side effect:
//!
//! ```text
//! claimed ─▶ workspace_prepared ─▶ verification_passed ─▶ commit_done ─▶ [published] ─▶ result_pending ─▶ result_submitted
//!   │ publish archive + request     │ result verified        │ commit + CAS   │ leased push       │ result hash + key recorded
//!   └── replayed from clean ────────┘ (no side effect yet)   └ deterministic OID, CAS and push converge on redo
//! ```
//!
//! `published` is reached only in a repository whose upstream publishes
//! (see [`upstream`] for the sync that follows it).
//!
//! The worker never runs task code: the executor does, on the other side of
//! the spool. The worker verifies every digest of what comes back.

pub mod adopt;
pub mod attempt;
pub mod bus;
#[cfg(feature = "fault-injection")]
pub mod fault;
pub mod progress;
pub mod recover;
pub mod upstream;

pub use attempt::{Finish, Grant, Worker, WorkerSettings};

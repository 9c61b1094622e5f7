//! airlock-executor: the uncredentialed side of the spool.
//!
//! It holds no credential and no network, checks that at start
//! ([`selfcheck`]), forks its spawner (which prepares every command's
//! sandbox: a minimal root where user namespaces are allowed), confines
//! itself with Landlock and seccomp ([`lockdown`]; it executes nothing from
//! then on), and then, for each request the worker publishes, applies the
//! plan to a throw-away copy of the source and has the spawner run the
//! plan's verification commands, each in a fresh sandbox with one fork and
//! one exec ([`run`]). It answers with a result bound by digests to the
//! request, or a failure with a catalogue code.
//!
//! ```text
//!  worker ──requests/<id>.json, sources/<id>.tar──▶ executor
//!         ◀──results/<id>.json | failed/<id>.json──
//!
//!  request: parse ─▶ validate ─▶ program policy ─▶ archive digest
//!           ─▶ extract (tree/extract.rs) ─▶ apply change set (apply.rs)
//!           ─▶ read changed files back ─▶ for each command:
//!              spawner: init (own pid ns, minimal root) ─▶ argv   (run.rs)
//!           ─▶ ExecResult | ExecFailure   (result.rs)
//! ```
//!
//! The library holds every step so tests can drive each on its own; the
//! binary (`main.rs`) is the CLI and the serve loop.
//!
//! Owns: applying a plan to a throw-away workspace, running its commands
//! confined, the tree and dependency layer caches, the setup's forwarder.
//! Never: link bus, database, HTTP-server or git code, hold a credential,
//! or reach the network but through airlock-egress's socket for a setup
//! (services/executor/tests/closure.rs).

pub mod apply;
pub mod beneath;
pub mod environment;
pub mod error;
pub mod forward;
pub mod layer;
pub mod lockdown;
pub mod policy;
pub mod request;
pub mod result;
pub mod run;
pub mod selfcheck;
pub mod setup;
pub mod tree;

pub use error::{Error, Result};

//! airlock-mcp: a Model Context Protocol tool server that lets coding
//! agents (Claude Code, Codex CLI, Goose, Cline, OpenHands, …) read the
//! repositories airlock serves and change them only through airlock tasks.
//!
//! It runs as the agent's own user, started by the agent's client over
//! stdio, and holds no credential: it reads the registered repositories
//! the way `airlockctl propose` does (group read, git read-only commands)
//! and asks the supervisor for everything else over the bus, where the
//! supervisor's authoriser (polkit) decides what this uid may do. Every
//! change becomes a task that is verified in the sandbox and committed
//! only to an `agent/` branch; no tool pushes, merges, runs a command on
//! the host, or takes a filesystem path.
//!
//! - [`tools`]: the catalogue (names, descriptions, schemas, annotations);
//! - [`input`]: strict argument parsing, paths and refs;
//! - [`server`]: the rmcp handler and each tool;
//! - [`text`]: control characters out, sizes bounded;
//! - [`limits`]: every bound in one place.
//!
//! stdout carries protocol messages only; logs go to stderr. The process
//! ends when its client closes stdin. It speaks the current MCP revision
//! (per-request metadata, no handshake) and the older handshake-based
//! ones (rmcp negotiates).
//!
//! Owns: airlock-mcp: the tools a coding agent calls over MCP (stdio), as
//! the agent's own uid.
//! Never: hold any right the agent's uid lacks or bypass the supervisor:
//! every decision is the supervisor's, over the bus.

pub mod input;
pub mod limits;
pub mod server;
pub mod text;
pub mod tools;

pub use server::{AirlockMcp, Settings};

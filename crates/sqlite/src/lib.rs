//! airlock-sqlite: how every airlock database is opened, and nothing else.
//!
//! Two databases exist, each owned by one privilege domain and each in its
//! own crate: the supervisor's task database (`airlock-taskdb`) and the
//! worker's checkpoint journal (`airlock-journal`). Both open through
//! [`db::open`]: created owner-only (0600), WAL mode, `synchronous=FULL`, a
//! busy timeout, an `application_id` that names the kind of file, and
//! versioned migrations that refuse a newer schema. They share the error
//! type ([`SqliteError`]) and the clock ([`clock`]).
//!
//! Owns: SQLite as airlock's durable engine: opening, durability settings,
//! transactions, migrations, its own error type.
//! Never: decide policy (which task moves where is crates/proto's states
//! table and crates/taskdb's one writer).

pub mod clock;
pub mod db;
pub mod error;

pub use error::{SqliteError, SqliteResult};

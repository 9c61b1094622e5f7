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
//! transactions, migrations, its own error type, and reading a row's
//! columns into a struct ([`columns!`]).
//! Never: decide policy (which task moves where is crates/proto's states
//! table and crates/taskdb's one writer).

pub mod clock;
pub mod db;
pub mod error;

pub use error::{SqliteError, SqliteResult};

/// A struct read from a row's columns in the order the query names them:
/// `columns!(Head { attempt, sequence } from r.get)` is
/// `Head { attempt: r.get(0)?, sequence: r.get(1)? }`. The row's reader is
/// named (rusqlite's `get`, or `try_get` for taskdb's PostgreSQL rows), so
/// one form serves both engines, and a column added to a query and its
/// struct takes the next index without a number to keep in step.
#[macro_export]
macro_rules! columns {
    ($ty:ident { $($field:ident),+ $(,)? } from $row:ident . $get:ident) => {{
        // The column indices 0, 1, …: struct fields are read in order.
        let mut column = 0usize..;
        $ty {
            $($field: $row.$get(column.next().unwrap_or_default())?,)+
        }
    }};
}

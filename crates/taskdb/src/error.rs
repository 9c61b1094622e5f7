//! The task store's error: a refusal, or the failure of the engine
//! underneath, each engine with its own error type ([`SqliteError`],
//! [`PgError`]).

use crate::tasks::PgError;
use airlock_proto::{Code, Error};
use airlock_sqlite::SqliteError;

/// Why a task-store operation did not happen.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A rule refused the operation; nothing was changed.
    #[error("{0}")]
    Refused(Error),
    /// The SQLite engine failed (a refusal it made arrives as
    /// [`StoreError::Refused`]).
    #[error(transparent)]
    Sqlite(SqliteError),
    /// The PostgreSQL engine failed.
    #[error(transparent)]
    Postgres(#[from] PgError),
}

impl StoreError {
    /// Wraps a SQLite error with what the store was doing.
    pub fn sqlite(context: impl Into<String>, source: rusqlite::Error) -> Self {
        StoreError::Sqlite(SqliteError::sqlite(context, source))
    }

    /// The catalogue code of this error.
    pub fn code(&self) -> Code {
        match self {
            StoreError::Refused(e) => e.code,
            StoreError::Sqlite(e) => e.code(),
            StoreError::Postgres(e) => e.code(),
        }
    }

    /// The refusal, if this is one.
    pub fn refusal(&self) -> Option<&Error> {
        match self {
            StoreError::Refused(e) => Some(e),
            StoreError::Sqlite(e) => e.refusal(),
            StoreError::Postgres(_) => None,
        }
    }
}

impl From<SqliteError> for StoreError {
    fn from(e: SqliteError) -> Self {
        match e {
            SqliteError::Refused(e) => StoreError::Refused(e),
            other => StoreError::Sqlite(other),
        }
    }
}

impl From<Error> for StoreError {
    fn from(e: Error) -> Self {
        StoreError::Refused(e)
    }
}

impl From<Code> for StoreError {
    fn from(c: Code) -> Self {
        StoreError::Refused(Error::new(c))
    }
}

/// Result alias for the task store.
pub type StoreResult<T> = Result<T, StoreError>;

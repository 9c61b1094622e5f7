//! The store's one error type.

use airlock_proto::{Code, Error};

/// Why a store operation did not happen.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A rule refused the operation; nothing was changed.
    #[error("{0}")]
    Refused(Error),
    /// SQLite failed while doing `context`.
    #[error("database error while {context}: {source}")]
    Sqlite {
        /// What the store was doing.
        context: String,
        /// The underlying error.
        #[source]
        source: rusqlite::Error,
    },
    /// Another database engine (the task store's PostgreSQL backend) failed
    /// while doing `context`; `code` is the catalogue code it maps to
    /// (`STORE_UNAVAILABLE` when the server cannot be reached).
    #[error("database error while {context}: {source}")]
    Engine {
        /// What the store was doing.
        context: String,
        /// The catalogue code of the failure.
        code: Code,
        /// The underlying error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl StoreError {
    /// Wraps a SQLite error with what the store was doing.
    pub fn sqlite(context: impl Into<String>, source: rusqlite::Error) -> Self {
        StoreError::Sqlite {
            context: context.into(),
            source,
        }
    }

    /// The catalogue code of this error.
    pub fn code(&self) -> Code {
        match self {
            StoreError::Refused(e) => e.code,
            StoreError::Sqlite { source, .. } => match source.sqlite_error_code() {
                Some(rusqlite::ErrorCode::DatabaseCorrupt)
                | Some(rusqlite::ErrorCode::NotADatabase) => Code::STORE_CORRUPT,
                _ => Code::STORE_UNAVAILABLE,
            },
            StoreError::Engine { code, .. } => *code,
        }
    }

    /// The refusal, if this is one.
    pub fn refusal(&self) -> Option<&Error> {
        match self {
            StoreError::Refused(e) => Some(e),
            StoreError::Sqlite { .. } | StoreError::Engine { .. } => None,
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

/// Result alias for the store.
pub type StoreResult<T> = Result<T, StoreError>;

//! The SQLite engine's error type.

use airlock_proto::{Code, Error};

/// Why an operation on an SQLite database did not happen.
#[derive(Debug, thiserror::Error)]
pub enum SqliteError {
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
}

impl SqliteError {
    /// Wraps a SQLite error with what the store was doing.
    pub fn sqlite(context: impl Into<String>, source: rusqlite::Error) -> Self {
        SqliteError::Sqlite {
            context: context.into(),
            source,
        }
    }

    /// The catalogue code of this error.
    pub fn code(&self) -> Code {
        match self {
            SqliteError::Refused(e) => e.code,
            SqliteError::Sqlite { source, .. } => match source.sqlite_error_code() {
                Some(rusqlite::ErrorCode::DatabaseCorrupt)
                | Some(rusqlite::ErrorCode::NotADatabase) => Code::STORE_CORRUPT,
                _ => Code::STORE_UNAVAILABLE,
            },
        }
    }

    /// The refusal, if this is one.
    pub fn refusal(&self) -> Option<&Error> {
        match self {
            SqliteError::Refused(e) => Some(e),
            SqliteError::Sqlite { .. } => None,
        }
    }
}

impl From<Error> for SqliteError {
    fn from(e: Error) -> Self {
        SqliteError::Refused(e)
    }
}

impl From<Code> for SqliteError {
    fn from(c: Code) -> Self {
        SqliteError::Refused(Error::new(c))
    }
}

/// Result alias for an SQLite database.
pub type SqliteResult<T> = Result<T, SqliteError>;

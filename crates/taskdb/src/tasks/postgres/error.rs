//! What failed in PostgreSQL, in the server's own words.

use crate::error::StoreError;
use airlock_proto::Code;
use postgres::error::SqlState;

/// Why an operation on the PostgreSQL store failed: what it was doing and
/// the client library's error. Every failure is `STORE_UNAVAILABLE` (the
/// catalogue has no finer code that a caller could act on differently);
/// the message keeps the server's words.
#[derive(Debug)]
pub struct PgError {
    context: String,
    source: postgres::Error,
}

impl PgError {
    /// The catalogue code of this error.
    pub fn code(&self) -> Code {
        Code::STORE_UNAVAILABLE
    }

    /// The SQLSTATE the server gave, if it answered.
    pub fn sqlstate(&self) -> Option<&SqlState> {
        self.source.code()
    }
}

impl std::fmt::Display for PgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "database error while {}: {}",
            self.context,
            ServerWords(&self.source)
        )
    }
}

impl std::error::Error for PgError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// A PostgreSQL error, shown with the server's own words (the client
/// library's `Display` says only "db error").
pub(super) struct ServerWords<'a>(pub(super) &'a postgres::Error);

impl std::fmt::Display for ServerWords<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.as_db_error() {
            Some(db) => {
                write!(
                    f,
                    "{} {}: {}",
                    db.severity(),
                    db.code().code(),
                    db.message()
                )?;
                if let Some(detail) = db.detail() {
                    write!(f, " ({detail})")?;
                }
                Ok(())
            }
            None => {
                write!(f, "{}", self.0)?;
                let mut source = std::error::Error::source(self.0);
                while let Some(e) = source {
                    write!(f, ": {e}")?;
                    source = e.source();
                }
                Ok(())
            }
        }
    }
}

/// Wraps a PostgreSQL error with what the store was doing.
pub(super) fn pg_error(context: &str, e: postgres::Error) -> StoreError {
    StoreError::Postgres(PgError {
        context: context.to_owned(),
        source: e,
    })
}

/// A conflict with another writer that a fresh run of the transaction
/// resolves.
pub(super) fn retryable(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::Postgres(e) if matches!(
            e.sqlstate(),
            Some(&SqlState::T_R_SERIALIZATION_FAILURE)
                | Some(&SqlState::T_R_DEADLOCK_DETECTED)
                | Some(&SqlState::UNIQUE_VIOLATION)
        )
    )
}

//! What failed in PostgreSQL, in the server's own words.

use airlock_proto::Code;
use airlock_sqlite::error::StoreError;
use postgres::error::SqlState;

/// A PostgreSQL error, shown with the server's own words (the client
/// library's `Display` says only "db error").
#[derive(Debug)]
pub(super) struct PgFailure(pub(super) postgres::Error);

impl std::fmt::Display for PgFailure {
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
                let mut source = std::error::Error::source(&self.0);
                while let Some(e) = source {
                    write!(f, ": {e}")?;
                    source = e.source();
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for PgFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// Wraps a PostgreSQL error. Every failure is `STORE_UNAVAILABLE` (the
/// catalogue has no finer code that a caller could act on differently);
/// the message keeps the server's words.
pub(super) fn pg_error(context: &str, e: postgres::Error) -> StoreError {
    StoreError::Engine {
        context: context.to_owned(),
        code: Code::STORE_UNAVAILABLE,
        source: Box::new(PgFailure(e)),
    }
}

/// The SQLSTATE of a wrapped PostgreSQL error.
fn sqlstate(e: &StoreError) -> Option<SqlState> {
    match e {
        StoreError::Engine { source, .. } => source
            .downcast_ref::<PgFailure>()
            .and_then(|e| e.0.code().cloned()),
        _ => None,
    }
}

/// A conflict with another writer that a fresh run of the transaction
/// resolves.
pub(super) fn retryable(e: &StoreError) -> bool {
    matches!(
        sqlstate(e),
        Some(SqlState::T_R_SERIALIZATION_FAILURE)
            | Some(SqlState::T_R_DEADLOCK_DETECTED)
            | Some(SqlState::UNIQUE_VIOLATION)
    )
}

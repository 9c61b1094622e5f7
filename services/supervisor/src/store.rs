//! The task store, shared by the operations, the gatekeeper (which records
//! refusals) and the agent runners (which keep their records in it).
//!
//! The store ([`airlock_taskdb::tasks::TaskStore`]: SQLite, or PostgreSQL
//! shared with other hosts) is synchronous; it runs on the blocking pool
//! behind one mutex, one short transaction at a time. It knows nothing of
//! the bus, of authorisation or of the operations: each of those imports
//! it, never the other way round.
//!
//! When the store is unreachable (PostgreSQL down, or this host cut off
//! from it), each call waits out a connect timeout with the mutex held.
//! Calls that queued behind a call which found the store unreachable fail
//! at once with its error instead of each trying again in turn: otherwise
//! a partition makes the queue grow by every renewal, claim and read while
//! it drains by one call per timeout, the supervisor answers nobody in
//! time, and after the heal it works through calls whose callers gave up
//! long ago (a claim granted to nobody holds its task for a lease). A
//! call made after that failure tries again itself.

use airlock_proto::{Code, Error};
use airlock_taskdb::tasks::TaskStore;
use airlock_taskdb::{Location, StoreError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

/// Converts a store error to the catalogue error that crosses the bus.
pub fn store_error(e: StoreError) -> Error {
    match e {
        StoreError::Refused(e) => e,
        other => Error::with(other.code(), other.to_string()),
    }
}

/// The task store, shared by every handler.
#[derive(Clone, Debug)]
pub struct Store {
    inner: Arc<Mutex<Box<dyn TaskStore>>>,
    /// When the last call that found the store unreachable ended, and its
    /// error; cleared by a call the store answered. Written with `inner`
    /// held.
    unreachable: Arc<Mutex<Option<(Instant, Error)>>>,
}

impl Store {
    /// Opens the store at `location` and checks its integrity.
    pub fn open(location: &Location) -> Result<Self, Error> {
        let store = airlock_taskdb::open(location).map_err(store_error)?;
        Ok(Store {
            inner: Arc::new(Mutex::new(store)),
            unreachable: Arc::default(),
        })
    }

    /// Runs `f` on the blocking pool with the store locked. A panic inside
    /// `f` leaves the store usable: its transaction rolled back on unwind.
    pub(crate) async fn run<T, F>(&self, f: F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: FnOnce(&mut dyn TaskStore) -> T + Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || {
            let mut store = inner.lock().unwrap_or_else(PoisonError::into_inner);
            f(store.as_mut())
        })
        .await
        .map_err(|e| Error::with(Code::INTERNAL, format!("store task failed: {e}")))
    }

    /// Runs `f` with the store locked on the calling thread: for the agent
    /// runners, whose few small writes may wait on a task call's
    /// transaction but never hold the lock across an await.
    pub(crate) fn blocking<T>(&self, f: impl FnOnce(&mut dyn TaskStore) -> T) -> T {
        let mut store = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        f(store.as_mut())
    }

    /// Runs `f` like [`Store::run`], its error as the bus carries it; a
    /// call that waited while another found the store unreachable fails
    /// with that error, without trying (see the module docs).
    pub(crate) async fn call<T, F>(&self, f: F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: FnOnce(&mut dyn TaskStore) -> Result<T, StoreError> + Send + 'static,
    {
        let arrived = Instant::now();
        let unreachable = Arc::clone(&self.unreachable);
        self.run(move |store| {
            let mut last = unreachable.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some((failed, e)) = last.as_ref()
                && arrived < *failed
            {
                return Err(Error::with(
                    e.code,
                    format!(
                        "{} (found by a call made while this one waited; not tried again)",
                        e.detail
                            .as_deref()
                            .unwrap_or("the task store is unreachable")
                    ),
                ));
            }
            drop(last);
            let out = f(store).map_err(store_error);
            last = unreachable.lock().unwrap_or_else(PoisonError::into_inner);
            *last = match &out {
                Err(e) if e.code == Code::STORE_UNAVAILABLE => Some((Instant::now(), e.clone())),
                _ => None,
            };
            out
        })
        .await?
    }
}

//! The same client for ordinary threads: each call is driven to completion
//! on a tokio runtime the caller owns or lends. Its methods are the async
//! client's, one stub per row of the contract (`stubs.rs`).

use crate::Supervisor as Async;
use airlock_proto::Error;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::{Handle, Runtime};

#[derive(Debug)]
enum Rt {
    Owned(Runtime),
    Lent(Handle),
}

/// A blocking connection to the supervisor. Clones share the connection.
#[derive(Debug, Clone)]
pub struct Supervisor {
    rt: Arc<Rt>,
    inner: Async,
}

impl Supervisor {
    /// Connects on a runtime of its own (current-thread).
    pub fn connect(address: Option<&str>) -> Result<Supervisor, Error> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::with(airlock_proto::Code::INTERNAL, e.to_string()))?;
        let inner = rt.block_on(Async::connect(address))?;
        Ok(Supervisor {
            rt: Arc::new(Rt::Owned(rt)),
            inner,
        })
    }

    /// Connects on the runtime behind `handle` (a multi-thread runtime
    /// that keeps driving the connection between calls).
    pub fn connect_on(handle: Handle, address: Option<&str>) -> Result<Supervisor, Error> {
        let inner = handle.block_on(Async::connect(address))?;
        Ok(Supervisor {
            rt: Arc::new(Rt::Lent(handle)),
            inner,
        })
    }

    /// Bounds every call by `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.inner = self.inner.with_timeout(timeout);
        self
    }

    /// The async client underneath.
    pub fn inner(&self) -> &Async {
        &self.inner
    }

    /// Runs `f` to completion.
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        match &*self.rt {
            Rt::Owned(rt) => rt.block_on(f),
            Rt::Lent(h) => h.block_on(f),
        }
    }

    /// The runtime handle, to spawn signal followers on.
    pub fn handle(&self) -> Handle {
        match &*self.rt {
            Rt::Owned(rt) => rt.handle().clone(),
            Rt::Lent(h) => h.clone(),
        }
    }

    /// Repeats `call` while the supervisor is unreachable (restarting), for
    /// up to `patience`; a refusal is returned at once.
    pub fn patiently<T>(
        &self,
        patience: Duration,
        mut call: impl FnMut(&Self) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let deadline = Instant::now() + patience;
        loop {
            match call(self) {
                Err(e)
                    if e.code == airlock_proto::Code::RUNTIME_UNAVAILABLE
                        && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(100))
                }
                other => return other,
            }
        }
    }
}

// A stub per method of the async client: `crates/client/src/stubs.rs`.
airlock_proto::rows!(blocking_methods);

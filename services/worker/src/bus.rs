//! The worker's side of the bus: the shared client (`airlock-client`, whose
//! `Worker1` calls the worker makes from its blocking threads on the
//! daemon's tokio runtime), which refusals are worth retrying, and the
//! wake-up that lets an idle claim loop react to `TaskChanged` at once.

use airlock_proto::Code;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

pub use airlock_client::blocking::Supervisor;

/// True for refusals that may go away by themselves (retry later): the
/// catalogue's attribute ([`Code::transient`], docs/errors.md).
pub fn is_transient(code: Code) -> bool {
    code.transient()
}

/// Wakes claim loops when the supervisor announces a QUEUED task, so an
/// idle worker claims at once instead of at its next poll.
#[derive(Debug, Default)]
pub struct Wakeup {
    generation: Mutex<u64>,
    ready: Condvar,
}

impl Wakeup {
    /// Marks that work may be waiting and wakes every waiter.
    pub fn notify(&self) {
        if let Ok(mut g) = self.generation.lock() {
            *g = g.wrapping_add(1);
            self.ready.notify_all();
        }
    }

    /// The current generation, to wait past.
    pub fn generation(&self) -> u64 {
        self.generation.lock().map(|g| *g).unwrap_or(0)
    }

    /// Waits until a notification after `seen`, or `timeout`.
    /// Waits until the generation moves past `seen` or `timeout` passes;
    /// true when it moved.
    pub fn wait_past(&self, seen: u64, timeout: Duration) -> bool {
        match self.generation.lock() {
            Ok(g) => match self.ready.wait_timeout_while(g, timeout, |g| *g == seen) {
                Ok((g, _)) => *g != seen,
                Err(_) => true,
            },
            Err(_) => true,
        }
    }
}

/// Follows `TaskChanged` and notifies `wakeup` for every task that becomes
/// QUEUED. Polling remains the fallback, so a lost signal only costs one
/// poll interval.
pub fn follow_queued(bus: &Supervisor, wakeup: Arc<Wakeup>) -> Result<(), airlock_proto::Error> {
    use futures_util::StreamExt;
    let changes = bus.block_on(bus.inner().task_changes())?;
    bus.handle().spawn(async move {
        let mut changes = std::pin::pin!(changes);
        while let Some((_, state, _)) = changes.next().await {
            if state == "QUEUED" {
                wakeup.notify();
            }
        }
    });
    Ok(())
}

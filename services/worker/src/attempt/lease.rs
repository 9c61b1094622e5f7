//! Lease renewal: a thread renews the attempt's lease while the attempt is
//! driven, and keeps the code of a renewal the supervisor refused (the
//! lease is lost) for the phases to check.

use super::Grant;
use crate::bus::{Supervisor, is_transient};
use airlock_proto::Code;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// The renewer of one attempt's lease.
pub(super) struct Lease {
    lost: Arc<Mutex<Option<Code>>>,
    done: Arc<AtomicBool>,
    renewer: JoinHandle<()>,
}

impl Lease {
    /// Starts renewing `grant`'s lease every `every`.
    pub(super) fn renew(bus: &Supervisor, grant: &Grant, every: Duration) -> Lease {
        let lost = Arc::new(Mutex::new(None::<Code>));
        let done = Arc::new(AtomicBool::new(false));
        let bus = bus.clone();
        let task = grant.envelope.binding.task_id.clone();
        let lease = grant.lease.clone();
        let renewer = {
            let (lost, done) = (Arc::clone(&lost), Arc::clone(&done));
            std::thread::spawn(move || {
                loop {
                    // A relative wait on the monotonic clock (futex on
                    // CLOCK_MONOTONIC): a wall-clock step neither delays
                    // nor hurries a renewal. An early wake-up renews early,
                    // which is harmless.
                    std::thread::park_timeout(every);
                    if done.load(Ordering::SeqCst) {
                        return;
                    }
                    match bus.renew(&lease) {
                        Ok(_) => {}
                        Err(e) if is_transient(e.code) => {
                            tracing::warn!(%task, "lease renewal failed, will retry: {e}")
                        }
                        Err(e) => {
                            tracing::warn!(%task, "lease lost: {e}");
                            if let Ok(mut l) = lost.lock() {
                                *l = Some(e.code);
                            }
                            return;
                        }
                    }
                }
            })
        };
        Lease {
            lost,
            done,
            renewer,
        }
    }

    /// The code the supervisor refused a renewal with, once it has.
    pub(super) fn lost(&self) -> Option<Code> {
        self.lost.lock().ok().and_then(|l| *l)
    }

    /// Stops renewing (the attempt ended) and waits for the renewer.
    pub(super) fn release(self) {
        self.done.store(true, Ordering::SeqCst);
        self.renewer.thread().unpark();
        let _ = self.renewer.join();
    }
}

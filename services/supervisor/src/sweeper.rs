//! The lease sweeper: every `sweep_interval_seconds`, expired leases go
//! back to the queue (attempts left) or fail (attempts exhausted). A sweep
//! counts as a call in flight, so shutdown waits for it.

use crate::bus::Shared;
use crate::bus::tasks::announce;
use crate::notify;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use zbus::object_server::SignalEmitter;

/// One pass: sweep, announce each swept task, refresh the status line.
pub async fn sweep_once(shared: &Shared, emitter: &SignalEmitter<'_>) {
    let Ok(_guard) = shared.inflight.enter() else {
        return;
    };
    match shared.ops.sweep().await {
        Ok(swept) => {
            for (task_id, state) in swept {
                tracing::info!(task_id, state = state.as_str(), "lease expired");
                if let Ok((state, revision)) = shared.ops.signal_facts(task_id.clone()).await {
                    announce(shared, emitter, &task_id, state, revision).await;
                }
            }
        }
        Err(e) => tracing::error!("lease sweep failed: {e}"),
    }
    // Callers whose refusals were not all logged, their window over.
    shared.gate.log_refusals_not_logged();
    if let Ok(s) = shared.ops.summary().await {
        notify::status(&status_line(
            s.queued,
            s.running,
            s.verifying,
            &shared.info.authorizer,
        ));
    }
}

/// The STATUS= line.
pub fn status_line(queued: u64, running: u64, verifying: u64, authorizer: &str) -> String {
    format!("{queued} queued, {running} running, {verifying} verifying; authorizer {authorizer}")
}

/// Sweeps every `every` until `stop` turns true.
pub async fn run(
    shared: Arc<Shared>,
    emitter: SignalEmitter<'static>,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) {
    // tokio's timers are monotonic: a wall-clock step neither delays nor
    // hurries a sweep. Expiry itself is judged on store time
    // (airlock_sqlite::clock).
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => sweep_once(&shared, &emitter).await,
            _ = async { drop(stop.wait_for(|s| *s).await) } => return,
        }
    }
}

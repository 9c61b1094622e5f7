//! Changes made by other hosts: with a PostgreSQL task store, every
//! committed change to a task is announced by the database
//! (`NOTIFY airlock_task_changed`, from a trigger), whichever host's
//! supervisor made it. This supervisor LISTENs on its own session and
//! re-emits each change as `TaskChanged` on its own bus, so the worker on
//! this host wakes for a task another host queued or requeued.
//!
//! A change this supervisor made itself is signalled twice (once as it
//! makes it, once when the database announces it); `TaskChanged` carries
//! the revision, so a listener drops the repeat. While the database is
//! unreachable nothing is announced and the listener retries every second;
//! changes made meanwhile are not replayed (the worker polls as well).

use crate::bus::Shared;
use crate::bus::tasks::announce;
use airlock_taskdb::tasks::PgLocation;
use airlock_taskdb::tasks::postgres::PgListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use zbus::object_server::SignalEmitter;

/// How long one wait for notifications lasts (also how soon a stop is seen).
const POLL: Duration = Duration::from_secs(1);

/// How long start-up waits for the first LISTEN.
const FIRST_LISTEN: Duration = Duration::from_secs(10);

/// Starts following the database's task changes until `stop` turns true.
/// Returns once this supervisor LISTENs (or after [`FIRST_LISTEN`], with a
/// warning), so that a change made after READY=1 is never missed.
pub async fn start(
    location: PgLocation,
    shared: Arc<Shared>,
    emitter: SignalEmitter<'static>,
    stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let (listening_tx, listening) = tokio::sync::oneshot::channel();
    let handle = tokio::spawn(run(location, shared, emitter, stop, listening_tx));
    match tokio::time::timeout(FIRST_LISTEN, listening).await {
        Ok(Ok(())) => tracing::info!("following task changes in the database (LISTEN)"),
        _ => tracing::warn!(
            "not yet following task changes in the database; still trying (TaskChanged from other hosts may be missed until then)"
        ),
    }
    handle
}

async fn run(
    location: PgLocation,
    shared: Arc<Shared>,
    emitter: SignalEmitter<'static>,
    mut stop: watch::Receiver<bool>,
    listening: tokio::sync::oneshot::Sender<()>,
) {
    let (tx, mut rx) = mpsc::channel(1024);
    let stopped = Arc::new(AtomicBool::new(false));
    let listener_stopped = Arc::clone(&stopped);
    let listener = tokio::task::spawn_blocking(move || {
        let mut listener = PgListener::new(&location);
        let mut listening = Some(listening);
        let mut down = false;
        while !listener_stopped.load(Ordering::Relaxed) {
            match listener.wait(POLL) {
                Ok(changes) => {
                    if let Some(l) = listening.take() {
                        let _ = l.send(());
                    }
                    if down {
                        tracing::info!("following task changes in the database again");
                        down = false;
                    }
                    for change in changes {
                        tracing::debug!(
                            task_id = change.task_id,
                            state = change.state.as_str(),
                            revision = change.revision,
                            "the database announced a change"
                        );
                        if tx.blocking_send(change).is_err() {
                            return;
                        }
                    }
                }
                Err(e) => {
                    if !down {
                        tracing::warn!("cannot follow task changes in the database: {e}");
                        down = true;
                    }
                    std::thread::sleep(POLL);
                }
            }
        }
    });
    loop {
        tokio::select! {
            change = rx.recv() => match change {
                Some(c) => announce(&shared, &emitter, &c.task_id, c.state, c.revision).await,
                None => break,
            },
            _ = async { drop(stop.wait_for(|s| *s).await) } => break,
        }
    }
    stopped.store(true, Ordering::Relaxed);
    drop(rx);
    let _ = listener.await;
}

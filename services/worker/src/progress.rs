//! Progress of the worker's threads, for the systemd watchdog.
//!
//! Every thread that claims or drives attempts beats ([`Progress::beat`])
//! whenever it moves: a claim loop at each poll, an attempt at each
//! checkpoint, at each second it waits for the executor, at each retry.
//! The daemon pings systemd's watchdog only while no thread has been
//! silent longer than the watchdog interval ([`Progress::stalled`]), so a
//! wedged attempt thread (blocked in a call that never returns) stops the
//! pings and systemd restarts the worker (`WatchdogSec=`,
//! `Restart=on-failure`); the journal resumes its attempts. The lease
//! renewer is not a beating thread: it keeps renewing while an attempt is
//! wedged, which is exactly what must not keep the worker alive.

use std::collections::HashMap;
use std::sync::Mutex;
use std::thread::ThreadId;
use std::time::{Duration, Instant};

/// Last beat per thread.
#[derive(Debug, Default)]
pub struct Progress {
    beats: Mutex<HashMap<ThreadId, (String, Instant)>>,
}

impl Progress {
    /// The calling thread moved (registering it on its first beat).
    pub fn beat(&self) {
        let me = std::thread::current();
        let name = me.name().unwrap_or("worker").to_owned();
        if let Ok(mut b) = self.beats.lock() {
            b.insert(me.id(), (name, Instant::now()));
        }
    }

    /// The calling thread is done: it no longer counts.
    pub fn retire(&self) {
        if let Ok(mut b) = self.beats.lock() {
            b.remove(&std::thread::current().id());
        }
    }

    /// The thread silent the longest, when silent for more than `limit`.
    pub fn stalled(&self, limit: Duration) -> Option<(String, Duration)> {
        let b = self.beats.lock().ok()?;
        b.values()
            .map(|(name, at)| (name.clone(), at.elapsed()))
            .filter(|(_, silent)| *silent > limit)
            .max_by_key(|(_, silent)| *silent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silent_thread_is_named_and_a_retired_one_is_forgotten() {
        let p = std::sync::Arc::new(Progress::default());
        p.beat();
        assert!(p.stalled(Duration::from_secs(1)).is_none());
        let q = std::sync::Arc::clone(&p);
        std::thread::Builder::new()
            .name("attempt-x".into())
            .spawn(move || q.beat())
            .unwrap()
            .join()
            .unwrap();
        std::thread::sleep(Duration::from_millis(30));
        p.beat();
        let (name, silent) = p.stalled(Duration::from_millis(10)).expect("stalled");
        assert_eq!(name, "attempt-x");
        assert!(silent >= Duration::from_millis(30));
        p.retire();
        assert!(p.stalled(Duration::from_secs(1)).is_none());
    }
}

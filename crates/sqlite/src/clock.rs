//! Time as the store sees it.
//!
//! Leases are judged against store time: wall-clock milliseconds (the
//! host's for SQLite, the server's for PostgreSQL) that never go back and
//! never stall (issue 24). Store time is
//!
//! ```text
//! max(wall, high_water, last + (mono − mono_at_last))
//! ```
//!
//! - `high_water` is the highest store time any write persisted, so
//!   rewinding the wall clock cannot take store time back, for this store
//!   or for one opened later on the same file or database;
//! - `last` is the store time this process's last write used and
//!   `mono_at_last` the monotonic reading then ([`Anchor`]), so after a
//!   rewind store time keeps moving at the monotonic clock's rate instead
//!   of standing still until the wall catches up: a lease still ends after
//!   its duration of real time, and a rewind cannot extend it;
//! - a forward step of the wall is taken as it is (wall-clock timestamps
//!   in a shared database cannot tell a step from a true clock): leases
//!   then end early by at most the step, and never by more.
//!
//! Tests inject a [`ManualClock`] to step the wall and let (monotonic)
//! time pass on their own.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// A source of unix-millisecond wall time and of monotonic time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Milliseconds since the unix epoch (wall clock: may be stepped).
    fn now_ms(&self) -> i64;
    /// Milliseconds from an origin fixed for the process, on a clock no
    /// step moves (intervals only; meaningless to another process).
    fn mono_ms(&self) -> i64;
}

/// The system's clocks: `SystemTime`, and `Instant` (Linux's
/// `CLOCK_MONOTONIC`) for the monotonic reading.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0)
    }

    fn mono_ms(&self) -> i64 {
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        ORIGIN.get_or_init(Instant::now).elapsed().as_millis() as i64
    }
}

/// A clock tests set by hand (fault injection: skew, rewind, expiry).
/// [`ManualClock::set`] and [`ManualClock::advance`] step the wall only, as
/// an operator or NTP would; [`ManualClock::elapse`] lets real time pass
/// (both readings move).
#[derive(Debug, Default, Clone)]
pub struct ManualClock {
    wall: Arc<AtomicI64>,
    mono: Arc<AtomicI64>,
}

impl ManualClock {
    /// A clock whose wall reads `ms` (monotonic: 0).
    pub fn at(ms: i64) -> Self {
        ManualClock {
            wall: Arc::new(AtomicI64::new(ms)),
            mono: Arc::new(AtomicI64::new(0)),
        }
    }
    /// Sets the wall reading.
    pub fn set(&self, ms: i64) {
        self.wall.store(ms, Ordering::SeqCst);
    }
    /// Steps the wall reading by `delta` (negative rewinds).
    pub fn advance(&self, delta: i64) {
        self.wall.fetch_add(delta, Ordering::SeqCst);
    }
    /// Lets `ms` of real time pass: both readings move by `ms`.
    pub fn elapse(&self, ms: i64) {
        let ms = ms.max(0);
        self.mono.fetch_add(ms, Ordering::SeqCst);
        self.wall.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.wall.load(Ordering::SeqCst)
    }

    fn mono_ms(&self) -> i64 {
        self.mono.load(Ordering::SeqCst)
    }
}

/// The store time a process's last write used, with the monotonic reading
/// then: the floor below which this process never lets store time fall
/// (see the module doc). In memory only: a monotonic reading means nothing
/// to another process, and a fresh one starts from the persisted mark.
#[derive(Debug, Default)]
pub struct Anchor(Mutex<Option<(i64, i64)>>);

impl Anchor {
    /// The floor at monotonic reading `mono`: the last store time plus
    /// the monotonic time since (0 before any write).
    pub fn floor(&self, mono: i64) -> i64 {
        match *self.0.lock().unwrap_or_else(PoisonError::into_inner) {
            Some((at, mono_at)) => at.saturating_add(mono.saturating_sub(mono_at).max(0)),
            None => 0,
        }
    }

    /// Records that a write used store time `now` at monotonic `mono`.
    pub fn observe(&self, now: i64, mono: i64) {
        let mut last = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let floor = match *last {
            Some((at, mono_at)) => at.saturating_add(mono.saturating_sub(mono_at).max(0)),
            None => i64::MIN,
        };
        if now >= floor {
            *last = Some((now, mono));
        }
    }
}

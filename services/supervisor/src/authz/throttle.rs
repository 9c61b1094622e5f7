//! How often one caller's refusals reach the log.
//!
//! Every refusal is answered with its code and recorded in the event log
//! (and from there in the audit trail); the line the gatekeeper logs for
//! it is rate-limited per caller, so that no caller can fill the log by
//! being refused. A caller is its uid, or its unique bus name while the
//! bus has not told its uid. In each [`WINDOW`] the first [`BURST`]
//! refusals of a caller are logged; the first one past them says that the
//! caller's refusals are not logged for the rest of the window, and once
//! the window is over one line says how many were not ("N more refusals
//! from uid U not logged in the last 60 s"). At most [`MAX_CALLERS`]
//! callers are followed at a time; refusals of callers beyond them share
//! one allowance.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Refusals of one caller logged per window.
pub const BURST: u32 = 10;
/// The window.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Callers followed at a time.
pub const MAX_CALLERS: usize = 1024;

/// Whose refusals are counted together.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Who {
    /// A caller the bus told the uid of.
    Uid(u32),
    /// A caller the bus did not (its unique name, as the bus stamped it).
    Sender(String),
    /// Every caller beyond [`MAX_CALLERS`].
    Others,
}

impl fmt::Display for Who {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Who::Uid(uid) => write!(f, "uid {uid}"),
            Who::Sender(name) => write!(f, "sender {}", airlock_proto::shown::shown(name)),
            Who::Others => f.write_str("further callers"),
        }
    }
}

/// What to log for one refusal.
#[derive(Debug, PartialEq, Eq)]
pub struct Noted {
    /// Log this refusal's line.
    pub log: bool,
    /// This refusal is the first of its caller's window not logged: say
    /// so, once.
    pub quiet_from_now: bool,
    /// Whose window ended with refusals not logged, and how many.
    pub summaries: Vec<Summary>,
}

/// The refusals of one caller not logged in a window that is over.
#[derive(Debug, PartialEq, Eq)]
pub struct Summary {
    /// The caller.
    pub who: Who,
    /// How many were not logged.
    pub not_logged: u64,
}

#[derive(Debug)]
struct Window {
    started: Instant,
    logged: u32,
    not_logged: u64,
}

/// The per-caller allowance of logged refusals.
#[derive(Debug)]
pub struct Throttle {
    burst: u32,
    window: Duration,
    max_callers: usize,
    callers: Mutex<HashMap<Who, Window>>,
}

impl Default for Throttle {
    fn default() -> Self {
        Throttle::new(BURST, WINDOW, MAX_CALLERS)
    }
}

impl Throttle {
    /// `burst` lines per caller in each `window`, `max_callers` callers
    /// followed at a time.
    pub fn new(burst: u32, window: Duration, max_callers: usize) -> Self {
        Throttle {
            burst,
            window,
            max_callers,
            callers: Mutex::new(HashMap::new()),
        }
    }

    /// The window's length.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Counts one refusal of `who` at `now`; says what to log.
    pub fn note(&self, who: Who, now: Instant) -> Noted {
        let mut callers = self.callers.lock().unwrap_or_else(PoisonError::into_inner);
        let summaries = self.over(&mut callers, now);
        let who = if callers.contains_key(&who) || callers.len() < self.max_callers {
            who
        } else {
            Who::Others
        };
        let w = callers.entry(who).or_insert(Window {
            started: now,
            logged: 0,
            not_logged: 0,
        });
        let (log, quiet_from_now) = if w.logged < self.burst {
            w.logged += 1;
            (true, false)
        } else {
            w.not_logged += 1;
            (false, w.not_logged == 1)
        };
        Noted {
            log,
            quiet_from_now,
            summaries,
        }
    }

    /// Ends every window that is over at `now`: the callers whose
    /// refusals were not all logged, and how many were not.
    pub fn ended(&self, now: Instant) -> Vec<Summary> {
        let mut callers = self.callers.lock().unwrap_or_else(PoisonError::into_inner);
        self.over(&mut callers, now)
    }

    fn over(&self, callers: &mut HashMap<Who, Window>, now: Instant) -> Vec<Summary> {
        let mut out = Vec::new();
        callers.retain(|who, w| {
            if now.saturating_duration_since(w.started) < self.window {
                return true;
            }
            if w.not_logged > 0 {
                out.push(Summary {
                    who: who.clone(),
                    not_logged: w.not_logged,
                });
            }
            false
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_refusals_of_a_window_are_logged_and_the_rest_summed_up_after_it() {
        let t = Throttle::new(3, Duration::from_secs(60), 16);
        let start = Instant::now();
        let who = Who::Uid(65534);
        let logged: Vec<bool> = (0..3)
            .map(|i| t.note(who.clone(), start + Duration::from_secs(i)).log)
            .collect();
        assert_eq!(logged, [true; 3]);
        let first_quiet = t.note(who.clone(), start + Duration::from_secs(4));
        assert!(!first_quiet.log && first_quiet.quiet_from_now);
        for i in 0..100 {
            let n = t.note(who.clone(), start + Duration::from_millis(5000 + i));
            assert!(!n.log && !n.quiet_from_now && n.summaries.is_empty());
        }
        // Another caller has its own allowance.
        assert!(t.note(Who::Uid(1), start + Duration::from_secs(10)).log);
        // The window over, the next refusal is logged again, and the
        // summary of the one before comes with it.
        let next = t.note(who.clone(), start + Duration::from_secs(61));
        assert!(next.log);
        assert_eq!(
            next.summaries,
            [Summary {
                who: who.clone(),
                not_logged: 101
            }]
        );
        // Said once.
        assert!(t.ended(start + Duration::from_secs(200)).is_empty());
    }

    #[test]
    fn a_window_over_is_summed_up_without_another_refusal() {
        let t = Throttle::new(1, Duration::from_secs(60), 16);
        let start = Instant::now();
        t.note(Who::Uid(7), start);
        t.note(Who::Uid(7), start);
        assert!(t.ended(start + Duration::from_secs(59)).is_empty());
        assert_eq!(
            t.ended(start + Duration::from_secs(60)),
            [Summary {
                who: Who::Uid(7),
                not_logged: 1
            }]
        );
    }

    #[test]
    fn callers_beyond_the_bound_share_one_allowance() {
        let t = Throttle::new(2, Duration::from_secs(60), 4);
        let now = Instant::now();
        for n in 0..4 {
            assert!(t.note(Who::Sender(format!(":1.{n}")), now).log);
        }
        let logged = (4..100)
            .filter(|n| t.note(Who::Sender(format!(":1.{n}")), now).log)
            .count();
        assert_eq!(logged, 2, "the others share one allowance");
        let summary = t.ended(now + Duration::from_secs(60));
        assert!(summary.contains(&Summary {
            who: Who::Others,
            not_logged: 94
        }));
    }

    #[test]
    fn a_sender_is_shown_bounded() {
        let who = Who::Sender(format!(":1.1\n{}", "x".repeat(10_000)));
        let s = who.to_string();
        assert!(s.len() < 400 && !s.contains('\n'), "{s}");
    }
}

//! The restart policy as a pure state machine: no clock, no I/O, no
//! randomness of its own. Every input carries the time (a [`Now`]: the
//! supervisor's wall clock and its monotonic clock, in milliseconds) and,
//! where a delay is chosen, the jitter draw; every output is an [`Action`]
//! for the runner to carry out. The whole state is one [`AgentRecord`],
//! which the supervisor stores after every change, so a restarted
//! supervisor resumes where it stopped (a hold stays a hold).
//!
//! Two clocks, one job each (issue 24):
//! - every interval the policy measures — the backoff until the next
//!   start, and the time alive before the count resets — is judged on the
//!   **monotonic** clock ([`Now::mono_ms`]), so stepping the wall clock
//!   neither stalls a backoff nor ends the stable window early;
//! - the **wall** clock ([`Now::wall_ms`]) only stamps what is shown or
//!   stored: `next_start_at_ms`, `running_since_ms`, `updated_at_ms`.
//!
//! The monotonic readings mean nothing to another process, so they are
//! not stored (`#[serde(skip)]`). What is stored keeps its meaning across
//! a restart of the supervisor: a hold is the status, and stays; a backoff
//! is re-derived conservatively on [`Input::Resume`] — the full bound of
//! its failure count, counted from the resume on the new monotonic clock —
//! so a restart never starts an agent earlier than its deadline, whatever
//! the wall clock did meanwhile, and delays it by at most 8 s.
//!
//! The rules (seed 000's D-59):
//! - a crash (the agent exited, or did not answer a liveness probe in
//!   time) or a failed start (refused, or not answered in time) is one
//!   failure;
//! - each failure stops the agent best effort and waits
//!   `min(500 ms · 2^(failures−1), 8 s)`, jittered into `[0.8, 1.0]` of
//!   that bound, before starting it again;
//! - the 5th consecutive failure holds the agent with
//!   `AGENTOS_CRASH_LOOP`; nothing starts it again until an operator
//!   clears the hold (an operator's start is refused meanwhile);
//! - the count resets only after 60 s of continuous running; a crash
//!   inside that window keeps it;
//! - an operator's start or clear resets the count; an operator's stop, or
//!   a drain, is never a failure.

use airlock_proto::Code;
use serde::{Deserialize, Serialize};

/// The policy's constants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Delay after the first failure, in ms.
    pub base_ms: u64,
    /// Longest delay, in ms.
    pub cap_ms: u64,
    /// The consecutive failure that holds the agent.
    pub hold_after: u32,
    /// Continuous running after which the failure count resets, in ms.
    pub stable_ms: u64,
}

impl Policy {
    /// Seed 000's numbers: 500 ms doubling to 8 s, hold on the 5th
    /// consecutive failure, reset after 60 s alive.
    pub const SEED: Policy = Policy {
        base_ms: 500,
        cap_ms: 8_000,
        hold_after: 5,
        stable_ms: 60_000,
    };

    /// The bound of the wait after the `failures`-th consecutive failure
    /// (from 1): `min(base · 2^(failures−1), cap)`.
    pub fn bound_ms(&self, failures: u32) -> u64 {
        let exponent = failures.saturating_sub(1).min(32);
        self.base_ms
            .saturating_mul(1u64 << exponent)
            .min(self.cap_ms)
    }

    /// The wait after the `failures`-th consecutive failure, with the jitter
    /// draw `r` in `[0, 1)`: `bound · (0.8 + 0.2 · r)`, so never above the
    /// bound and never below four fifths of it (agents that failed together
    /// do not restart in lockstep).
    pub fn delay_ms(&self, failures: u32, r: f64) -> u64 {
        let r = if r.is_finite() {
            r.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let bound = self.bound_ms(failures);
        let low = bound - bound / 5;
        low + ((bound - low) as f64 * r) as u64
    }
}

/// A reading of both clocks, in milliseconds: the wall clock (since the
/// epoch; shown and stored) and the monotonic clock (from any origin fixed
/// for the process; every interval is measured on it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Now {
    /// Wall-clock time, ms since the epoch: stamps only.
    pub wall_ms: u64,
    /// Monotonic time, ms from the process's origin: intervals only.
    pub mono_ms: u64,
}

impl From<u64> for Now {
    /// Both clocks reading `ms`: a wall clock that is never stepped.
    fn from(ms: u64) -> Now {
        Now {
            wall_ms: ms,
            mono_ms: ms,
        }
    }
}

/// Where an agent is, as `GetAgent` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Status {
    /// Not running, and not to be started (an operator stopped it, or a drain).
    Stopped,
    /// A driver start call is in flight.
    Starting,
    /// Started and, at the last probe, alive.
    Running,
    /// Failed; waiting until `next_start_at_ms` to start again.
    Backoff,
    /// Failed `hold_after` times in a row: held until an operator clears it.
    Held,
}

impl Status {
    /// The SCREAMING_SNAKE name.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Stopped => "STOPPED",
            Status::Starting => "STARTING",
            Status::Running => "RUNNING",
            Status::Backoff => "BACKOFF",
            Status::Held => "HELD",
        }
    }

    /// Parses [`Status::as_str`].
    pub fn from_name(name: &str) -> Option<Status> {
        [
            Status::Stopped,
            Status::Starting,
            Status::Running,
            Status::Backoff,
            Status::Held,
        ]
        .into_iter()
        .find(|s| s.as_str() == name)
    }
}

/// How an agent's process ended, as far as the driver could tell.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Exit {
    /// Exit status, when it exited.
    pub code: Option<i32>,
    /// Signal number, when a signal ended it.
    pub signal: Option<i32>,
    /// What else is known (a failed start's reason, a timed-out call).
    pub reason: String,
}

/// Everything the policy knows about one agent; stored after every change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentRecord {
    /// Where it is.
    pub status: Status,
    /// Consecutive failures since the last reset.
    pub consecutive_failures: u32,
    /// With [`Status::Backoff`]: when it starts again (ms since the epoch;
    /// shown, never judged: see `next_start_mono_ms`).
    pub next_start_at_ms: Option<u64>,
    /// With [`Status::Running`]: since when (ms since the epoch; shown,
    /// never judged: see `running_since_mono_ms`).
    pub running_since_ms: Option<u64>,
    /// The last failure's exit status, signal and reason.
    pub last_exit: Option<Exit>,
    /// With [`Status::Held`]: why.
    pub hold_reason: Option<String>,
    /// When this record last changed (ms since the epoch).
    pub updated_at_ms: u64,
    /// With [`Status::Backoff`]: the deadline on the monotonic clock, the
    /// one the policy judges. Not stored (see the module doc).
    #[serde(skip)]
    pub next_start_mono_ms: Option<u64>,
    /// With [`Status::Running`]: the start on the monotonic clock, from
    /// which the stable window is measured. Not stored.
    #[serde(skip)]
    pub running_since_mono_ms: Option<u64>,
}

impl AgentRecord {
    /// A configured agent never seen before: stopped, no failures (the
    /// runner starts it at once unless an operator stopped it earlier).
    pub fn new(now_ms: u64) -> AgentRecord {
        AgentRecord {
            status: Status::Stopped,
            consecutive_failures: 0,
            next_start_at_ms: None,
            running_since_ms: None,
            last_exit: None,
            hold_reason: None,
            updated_at_ms: now_ms,
            next_start_mono_ms: None,
            running_since_mono_ms: None,
        }
    }
}

/// What happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    /// An operator's StartAgent.
    OperatorStart,
    /// An operator's StopAgent, or a drain.
    OperatorStop,
    /// An operator's ClearHold.
    ClearHold,
    /// The supervisor (re)started with this record: resume it.
    Resume,
    /// The driver's start call answered: started.
    Started,
    /// The driver's start call failed or was not answered in time.
    StartFailed(Exit),
    /// A liveness probe answered: alive.
    Alive,
    /// A liveness probe found the agent gone, or was not answered in time.
    Crashed(Exit),
    /// Time passed (a backoff may be over, the stable window may be reached).
    Tick,
}

/// What the runner must do, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Call the driver's start (raced against the call timeout).
    Start,
    /// Call the driver's stop, best effort: its failure changes nothing.
    Stop,
}

/// The answer to one input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// What the runner must do now.
    pub actions: Vec<Action>,
    /// Whether the record changed (store it, announce it).
    pub changed: bool,
    /// The refusal of an operator's request, if refused (nothing changed then).
    pub refused: Option<Code>,
}

impl Step {
    fn none() -> Step {
        Step {
            actions: Vec::new(),
            changed: false,
            refused: None,
        }
    }

    fn changed(actions: Vec<Action>) -> Step {
        Step {
            actions,
            changed: true,
            refused: None,
        }
    }

    fn refused(code: Code) -> Step {
        Step {
            actions: Vec::new(),
            changed: false,
            refused: Some(code),
        }
    }
}

/// The reason recorded with a hold.
pub fn hold_reason(policy: &Policy, last: &Exit) -> String {
    format!(
        "{}: {} consecutive failures, the last: {}",
        Code::AGENTOS_CRASH_LOOP,
        policy.hold_after,
        describe_exit(last)
    )
}

/// A human line for an exit.
pub fn describe_exit(exit: &Exit) -> String {
    match (exit.code, exit.signal) {
        (Some(code), _) => format!("exited with status {code}{}", suffix(&exit.reason)),
        (None, Some(sig)) => format!("killed by signal {sig}{}", suffix(&exit.reason)),
        (None, None) => exit.reason.clone(),
    }
}

fn suffix(reason: &str) -> String {
    if reason.is_empty() {
        String::new()
    } else {
        format!(" ({reason})")
    }
}

/// Applies `input` at `now` to `record`; `jitter` is the draw in
/// `[0, 1)` used if a delay is chosen. Pure: the same arguments always give
/// the same record and step. A bare `u64` is both clocks at that reading.
pub fn step(
    policy: &Policy,
    record: &mut AgentRecord,
    input: Input,
    now: impl Into<Now>,
    jitter: f64,
) -> Step {
    let now = now.into();
    let out = transition(policy, record, input, now, jitter);
    if out.changed {
        record.updated_at_ms = now.wall_ms;
    }
    out
}

fn transition(policy: &Policy, r: &mut AgentRecord, input: Input, now: Now, jitter: f64) -> Step {
    match input {
        Input::OperatorStart => match r.status {
            Status::Held => Step::refused(Code::AGENTOS_CRASH_LOOP),
            Status::Starting | Status::Running => Step::none(),
            Status::Stopped | Status::Backoff => {
                r.consecutive_failures = 0;
                start(r)
            }
        },
        Input::ClearHold => match r.status {
            Status::Held => {
                r.consecutive_failures = 0;
                r.hold_reason = None;
                start(r)
            }
            _ => Step::none(),
        },
        Input::OperatorStop => match r.status {
            // A hold outlives a stop: the agent is not running anyway, and
            // only ClearHold lets it run again.
            Status::Held => Step::changed(vec![Action::Stop]),
            Status::Stopped => Step::changed(vec![Action::Stop]),
            _ => {
                r.status = Status::Stopped;
                clear_times(r);
                Step::changed(vec![Action::Stop])
            }
        },
        Input::Resume => match r.status {
            Status::Held | Status::Stopped => Step::none(),
            // Whatever ran before the supervisor restarted is stopped and
            // started afresh; a restart of the supervisor is no failure of
            // the agent. A backoff keeps its count and waits the full bound
            // of it from now: the stored deadline is wall-clock time, which
            // may have been stepped since, and the old process's monotonic
            // deadline died with it. The full bound is never shorter than
            // what was left.
            Status::Backoff => {
                let wait = policy.bound_ms(r.consecutive_failures.max(1));
                r.next_start_at_ms = Some(now.wall_ms.saturating_add(wait));
                r.next_start_mono_ms = Some(now.mono_ms.saturating_add(wait));
                Step::changed(vec![Action::Stop])
            }
            Status::Starting | Status::Running => {
                let mut s = start(r);
                s.actions.insert(0, Action::Stop);
                s
            }
        },
        Input::Started => match r.status {
            Status::Starting => {
                r.status = Status::Running;
                clear_times(r);
                r.running_since_ms = Some(now.wall_ms);
                r.running_since_mono_ms = Some(now.mono_ms);
                Step::changed(Vec::new())
            }
            // A late answer to a call the runner already gave up on.
            _ => Step::none(),
        },
        Input::StartFailed(exit) => match r.status {
            Status::Starting => failure(policy, r, exit, now, jitter),
            _ => Step::none(),
        },
        Input::Alive => match r.status {
            Status::Running => stable(policy, r, now),
            _ => Step::none(),
        },
        Input::Crashed(exit) => match r.status {
            Status::Running => {
                // A run longer than the stable window reset the count first.
                let _ = stable(policy, r, now);
                failure(policy, r, exit, now, jitter)
            }
            _ => Step::none(),
        },
        Input::Tick => match r.status {
            Status::Backoff if r.next_start_mono_ms.is_none_or(|at| now.mono_ms >= at) => start(r),
            Status::Running => stable(policy, r, now),
            _ => Step::none(),
        },
    }
}

fn start(r: &mut AgentRecord) -> Step {
    r.status = Status::Starting;
    clear_times(r);
    Step::changed(vec![Action::Start])
}

fn clear_times(r: &mut AgentRecord) {
    r.next_start_at_ms = None;
    r.running_since_ms = None;
    r.next_start_mono_ms = None;
    r.running_since_mono_ms = None;
}

fn stable(policy: &Policy, r: &mut AgentRecord, now: Now) -> Step {
    // Running without a monotonic start (a record from elsewhere): the
    // window starts now, never earlier.
    let since = *r.running_since_mono_ms.get_or_insert(now.mono_ms);
    if r.consecutive_failures > 0 && now.mono_ms.saturating_sub(since) >= policy.stable_ms {
        r.consecutive_failures = 0;
        return Step::changed(Vec::new());
    }
    Step::none()
}

fn failure(policy: &Policy, r: &mut AgentRecord, exit: Exit, now: Now, jitter: f64) -> Step {
    r.consecutive_failures = r.consecutive_failures.saturating_add(1);
    clear_times(r);
    if r.consecutive_failures >= policy.hold_after {
        r.status = Status::Held;
        r.hold_reason = Some(hold_reason(policy, &exit));
    } else {
        r.status = Status::Backoff;
        let wait = policy.delay_ms(r.consecutive_failures, jitter);
        r.next_start_at_ms = Some(now.wall_ms.saturating_add(wait));
        r.next_start_mono_ms = Some(now.mono_ms.saturating_add(wait));
    }
    r.last_exit = Some(exit);
    Step::changed(vec![Action::Stop])
}

/// When, on the monotonic clock, the runner must next feed a
/// [`Input::Tick`] (a backoff's end, or the end of the stable window), if
/// ever.
pub fn next_deadline(policy: &Policy, r: &AgentRecord) -> Option<u64> {
    match r.status {
        Status::Backoff => r.next_start_mono_ms,
        Status::Running if r.consecutive_failures > 0 => r
            .running_since_mono_ms
            .map(|since| since.saturating_add(policy.stable_ms)),
        _ => None,
    }
}

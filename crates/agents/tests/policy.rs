//! The crash-loop policy on its own: a table of inputs at given times, and
//! the record and actions each must produce. Run alone with
//! `cargo test -p airlock-agents crash_loop_`.

use airlock_agents::policy::{self, Action, AgentRecord, Exit, Input, Now, Policy, Status, Step};
use airlock_proto::Code;

const P: Policy = Policy::SEED;
const HOUR: u64 = 3_600_000;

fn crash(code: i32) -> Input {
    Input::Crashed(Exit {
        code: Some(code),
        signal: None,
        reason: String::new(),
    })
}

fn refused() -> Input {
    Input::StartFailed(Exit {
        reason: "start failed: refused".into(),
        ..Exit::default()
    })
}

/// One row: at `at_ms`, feed `input` with jitter `r`; expect `status`,
/// `failures` and `actions` (and `refusal`).
struct Row {
    at_ms: u64,
    input: Input,
    r: f64,
    status: Status,
    failures: u32,
    actions: &'static [Action],
    refusal: Option<Code>,
}

fn row(at_ms: u64, input: Input, status: Status, failures: u32, actions: &'static [Action]) -> Row {
    Row {
        at_ms,
        input,
        r: 0.0,
        status,
        failures,
        actions,
        refusal: None,
    }
}

#[track_caller]
fn run(record: &mut AgentRecord, rows: Vec<Row>) -> Vec<Step> {
    let mut steps = Vec::new();
    for (i, row) in rows.into_iter().enumerate() {
        let input = format!("{:?}", row.input);
        let step = policy::step(&P, record, row.input, row.at_ms, row.r);
        assert_eq!(
            record.status, row.status,
            "row {i} ({input} at {})",
            row.at_ms
        );
        assert_eq!(
            record.consecutive_failures, row.failures,
            "row {i} ({input} at {}): failures",
            row.at_ms
        );
        assert_eq!(step.actions, row.actions, "row {i} ({input}): actions");
        assert_eq!(step.refused, row.refusal, "row {i} ({input}): refusal");
        steps.push(step);
    }
    steps
}

/// Starts a fresh agent at t=0 and crashes it at once `n` times, each
/// restart exactly at its backoff's end; returns the record (in BACKOFF, or
/// HELD after the 5th) and the `n` start times.
fn fail_times(n: u32, r: f64) -> (AgentRecord, Vec<u64>) {
    let mut rec = AgentRecord::new(0);
    policy::step(&P, &mut rec, Input::OperatorStart, 0, r);
    let mut starts = vec![0];
    let mut now = 0;
    for i in 0..n {
        if i > 0 {
            now = rec.next_start_at_ms.expect("a backoff deadline");
            let s = policy::step(&P, &mut rec, Input::Tick, now, r);
            assert_eq!(s.actions, [Action::Start]);
            starts.push(now);
        }
        policy::step(&P, &mut rec, Input::Started, now, r);
        policy::step(&P, &mut rec, crash(1), now, r);
    }
    (rec, starts)
}

/// `fail_times(n)`, then restarted at the backoff's end and running.
fn running_after(n: u32, r: f64) -> (AgentRecord, u64) {
    let (mut rec, _) = fail_times(n, r);
    let t = rec.next_start_at_ms.expect("in backoff");
    policy::step(&P, &mut rec, Input::Tick, t, r);
    policy::step(&P, &mut rec, Input::Started, t, r);
    assert_eq!(rec.status, Status::Running);
    (rec, t)
}

#[test]
fn crash_loop_backoff_doubles_from_500_ms_to_the_8_s_cap() {
    let bounds: Vec<u64> = (1..=8).map(|n| P.bound_ms(n)).collect();
    assert_eq!(bounds, [500, 1000, 2000, 4000, 8000, 8000, 8000, 8000]);
    assert_eq!(P.bound_ms(u32::MAX), 8000);
    // the jitter keeps every delay within [4/5 of the bound, the bound]
    for n in 1..=8 {
        let bound = P.bound_ms(n);
        assert_eq!(P.delay_ms(n, 0.0), bound - bound / 5);
        assert!(P.delay_ms(n, 0.999_999) <= bound);
        assert!(P.delay_ms(n, 0.999_999) >= bound - 1);
        assert_eq!(P.delay_ms(n, f64::NAN), bound - bound / 5);
        assert_eq!(P.delay_ms(n, 7.0), bound, "a draw above 1 is clamped");
    }
    // the waits between consecutive starts of a crash-looping agent
    let (_, starts) = fail_times(5, 1.0);
    let waits: Vec<u64> = starts.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(waits, [500, 1000, 2000, 4000]);
    let (_, starts) = fail_times(5, 0.0);
    let waits: Vec<u64> = starts.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(waits, [400, 800, 1600, 3200]);
}

#[test]
fn crash_loop_holds_on_the_fifth_consecutive_failure() {
    let (rec, starts) = fail_times(5, 1.0);
    assert_eq!(starts.len(), 5, "five starts, no sixth");
    assert_eq!(rec.status, Status::Held);
    assert_eq!(rec.consecutive_failures, 5);
    assert_eq!(rec.next_start_at_ms, None);
    let reason = rec.hold_reason.as_deref().unwrap();
    assert!(
        reason.starts_with("AGENTOS_CRASH_LOOP: 5 consecutive failures"),
        "{reason}"
    );
    assert!(reason.contains("exited with status 1"), "{reason}");
    assert_eq!(rec.last_exit.as_ref().and_then(|e| e.code), Some(1));
    assert!(Code::AGENTOS_CRASH_LOOP.retryable());
    assert_eq!(
        policy::next_deadline(&P, &rec),
        None,
        "nothing wakes a held agent"
    );
}

#[test]
fn crash_loop_a_failed_start_is_a_failure_and_stops_best_effort() {
    let mut rec = AgentRecord::new(0);
    run(
        &mut rec,
        vec![
            row(
                0,
                Input::OperatorStart,
                Status::Starting,
                0,
                &[Action::Start],
            ),
            row(5, refused(), Status::Backoff, 1, &[Action::Stop]),
            row(300, Input::Tick, Status::Backoff, 1, &[]),
            row(505, Input::Tick, Status::Starting, 1, &[Action::Start]),
            row(510, Input::Started, Status::Running, 1, &[]),
        ],
    );
    assert_eq!(
        rec.last_exit.as_ref().map(|e| e.reason.as_str()),
        Some("start failed: refused")
    );
}

#[test]
fn crash_loop_refuses_an_operator_start_while_held_and_changes_nothing() {
    let (mut rec, _) = fail_times(5, 0.5);
    let before = rec.clone();
    for input in [
        Input::OperatorStart,
        Input::Tick,
        Input::Resume,
        Input::Started,
    ] {
        let step = policy::step(&P, &mut rec, input.clone(), 1_000_000, 0.5);
        assert!(step.actions.is_empty(), "{input:?}: {:?}", step.actions);
        assert!(!step.changed, "{input:?}");
        assert_eq!(rec, before, "{input:?}");
    }
    let step = policy::step(&P, &mut rec, Input::OperatorStart, 1_000_000, 0.5);
    assert_eq!(step.refused, Some(Code::AGENTOS_CRASH_LOOP));
    // a stop keeps the hold
    policy::step(&P, &mut rec, Input::OperatorStop, 1_000_001, 0.5);
    assert_eq!(rec.status, Status::Held);
}

#[test]
fn crash_loop_clear_hold_resets_the_count_and_starts() {
    let (mut rec, _) = fail_times(5, 0.5);
    run(
        &mut rec,
        vec![
            row(
                900_000,
                Input::ClearHold,
                Status::Starting,
                0,
                &[Action::Start],
            ),
            row(900_010, Input::Started, Status::Running, 0, &[]),
            // clearing an agent that is not held is a no-op
            row(900_020, Input::ClearHold, Status::Running, 0, &[]),
            row(900_030, crash(3), Status::Backoff, 1, &[Action::Stop]),
        ],
    );
    assert_eq!(rec.hold_reason, None);
    assert_eq!(
        rec.next_start_at_ms,
        Some(900_030 + 400),
        "the first delay again"
    );
}

#[test]
fn crash_loop_resets_after_60_s_of_continuous_running() {
    let (mut rec, t) = running_after(3, 1.0);
    run(
        &mut rec,
        vec![
            row(t + 30_000, Input::Alive, Status::Running, 3, &[]),
            row(t + 59_999, Input::Tick, Status::Running, 3, &[]),
            row(t + 60_000, Input::Alive, Status::Running, 0, &[]),
            // the next crash is the first again: 500 ms
            row(t + 70_000, crash(1), Status::Backoff, 1, &[Action::Stop]),
        ],
    );
    assert_eq!(rec.next_start_at_ms, Some(t + 70_000 + 400));
    // the deadline the runner sleeps to is the end of the window
    let (rec, t) = running_after(1, 1.0);
    assert_eq!(policy::next_deadline(&P, &rec), Some(t + 60_000));
}

#[test]
fn crash_loop_a_crash_inside_the_window_keeps_the_count() {
    let (mut rec, t) = running_after(4, 1.0);
    run(
        &mut rec,
        vec![
            row(t + 59_999, Input::Alive, Status::Running, 4, &[]),
            row(t + 59_999, crash(1), Status::Held, 5, &[Action::Stop]),
        ],
    );
    // and a crash after a run longer than the window counts from one
    let (mut rec, t) = running_after(4, 1.0);
    run(
        &mut rec,
        vec![row(
            t + 60_000,
            crash(1),
            Status::Backoff,
            1,
            &[Action::Stop],
        )],
    );
}

#[test]
fn crash_loop_a_late_answer_is_ignored() {
    // The runner gave up on a start (StartFailed) and is in backoff; the
    // start's answer arriving now must not make the agent RUNNING.
    let mut rec = AgentRecord::new(0);
    run(
        &mut rec,
        vec![
            row(
                0,
                Input::OperatorStart,
                Status::Starting,
                0,
                &[Action::Start],
            ),
            row(10_000, refused(), Status::Backoff, 1, &[Action::Stop]),
            row(10_001, Input::Started, Status::Backoff, 1, &[]),
            row(10_002, crash(9), Status::Backoff, 1, &[]),
            row(10_003, Input::Alive, Status::Backoff, 1, &[]),
        ],
    );
}

#[test]
fn crash_loop_an_operator_stop_is_never_a_failure() {
    let mut rec = AgentRecord::new(0);
    run(
        &mut rec,
        vec![
            row(
                0,
                Input::OperatorStart,
                Status::Starting,
                0,
                &[Action::Start],
            ),
            row(1, Input::Started, Status::Running, 0, &[]),
            row(2, Input::OperatorStop, Status::Stopped, 0, &[Action::Stop]),
            // the agent's exit after the stop is no crash
            row(3, crash(143), Status::Stopped, 0, &[]),
            row(100_000, Input::Tick, Status::Stopped, 0, &[]),
            // a resume after a supervisor restart keeps it stopped
            row(100_001, Input::Resume, Status::Stopped, 0, &[]),
            row(
                100_002,
                Input::OperatorStart,
                Status::Starting,
                0,
                &[Action::Start],
            ),
        ],
    );
    // a stop in backoff cancels the restart, and a start resets the count
    let (mut rec, _) = fail_times(2, 1.0);
    let now = rec.next_start_at_ms.unwrap() - 1;
    run(
        &mut rec,
        vec![
            row(
                now,
                Input::OperatorStop,
                Status::Stopped,
                2,
                &[Action::Stop],
            ),
            row(now + 10_000, Input::Tick, Status::Stopped, 2, &[]),
            row(
                now + 10_001,
                Input::OperatorStart,
                Status::Starting,
                0,
                &[Action::Start],
            ),
        ],
    );
}

#[test]
fn crash_loop_a_stored_record_resumes_as_it_was() {
    // What a restarted supervisor does with each stored status: a hold
    // stays, a stop stays, a backoff keeps its deadline, a running agent
    // is stopped and started afresh without counting a failure.
    let (held, _) = fail_times(5, 1.0);
    let json = serde_json::to_string(&held).unwrap();
    let mut back: AgentRecord = serde_json::from_str(&json).unwrap();
    assert_eq!(back, held);
    let step = policy::step(&P, &mut back, Input::Resume, 10_000_000, 0.0);
    assert!(step.actions.is_empty());
    assert_eq!(back.status, Status::Held);

    // A backoff keeps its count; its deadline is re-derived as the full
    // bound of that count from the resume (the old process's monotonic
    // deadline is gone, and its wall deadline may lie), so a restart never
    // starts it earlier than it was due, whatever the wall clock did.
    let (backoff, _) = fail_times(2, 1.0);
    let json = serde_json::to_string(&backoff).unwrap();
    assert!(!json.contains("mono"), "monotonic readings are not stored");
    let mut backoff: AgentRecord = serde_json::from_str(&json).unwrap();
    let due = backoff.next_start_at_ms.unwrap();
    // the wall was stepped 3 h ahead meanwhile: the stored deadline looks
    // long past, and still the agent waits its bound
    let resumed = Now {
        wall_ms: due + 3 * HOUR,
        mono_ms: 7,
    };
    let step = policy::step(&P, &mut backoff, Input::Resume, resumed, 0.0);
    assert_eq!(step.actions, [Action::Stop]);
    assert_eq!(
        (
            backoff.status,
            backoff.consecutive_failures,
            backoff.next_start_at_ms
        ),
        (Status::Backoff, 2, Some(due + 3 * HOUR + 1000))
    );
    assert_eq!(policy::next_deadline(&P, &backoff), Some(7 + 1000));
    let early = Now {
        wall_ms: due + 6 * HOUR,
        mono_ms: 7 + 999,
    };
    policy::step(&P, &mut backoff, Input::Tick, early, 0.0);
    assert_eq!(backoff.status, Status::Backoff, "not before its bound");

    let (mut running, t) = running_after(2, 1.0);
    let step = policy::step(&P, &mut running, Input::Resume, t + 5, 0.0);
    assert_eq!(step.actions, [Action::Stop, Action::Start]);
    assert_eq!(
        (running.status, running.consecutive_failures),
        (Status::Starting, 2)
    );

    // unknown fields in a stored record are refused, not dropped
    let mut v: serde_json::Value = serde_json::from_str(&json).unwrap();
    v["surprise"] = serde_json::json!(1);
    assert!(serde_json::from_value::<AgentRecord>(v).is_err());
}

/// Issue 24: every interval is judged on the monotonic clock. The wall
/// clock is stepped 3 h forward or back before every event; the backoff
/// sequence, the hold on the 5th failure and the 60 s reset are exactly
/// those of an unstepped clock, and only the shown stamps follow the wall.
#[test]
fn crash_loop_wall_clock_steps_change_no_interval() {
    // The wall reads 3 h ahead of, then 3 h behind, the monotonic clock
    // (from a far epoch), alternating at every event.
    let epoch = 1_800_000_000_000;
    let mut flip = false;
    let mut at = |mono_ms: u64| {
        flip = !flip;
        let wall_ms = if flip {
            epoch + mono_ms + 3 * HOUR
        } else {
            epoch + mono_ms - 3 * HOUR
        };
        Now { wall_ms, mono_ms }
    };

    // Five failed starts, each restart exactly when the policy allows.
    let mut rec = AgentRecord::new(epoch);
    policy::step(&P, &mut rec, Input::OperatorStart, at(0), 1.0);
    let mut starts = vec![0];
    let mut mono = 0;
    for i in 0..5 {
        if i > 0 {
            let due = policy::next_deadline(&P, &rec).expect("a monotonic deadline");
            // one ms early is early, whatever the wall says
            let s = policy::step(&P, &mut rec, Input::Tick, at(due - 1), 1.0);
            assert!(s.actions.is_empty(), "started before {due}: {rec:?}");
            let s = policy::step(&P, &mut rec, Input::Tick, at(due), 1.0);
            assert_eq!(s.actions, [Action::Start], "not started at {due}");
            mono = due;
            starts.push(due);
        }
        let now = at(mono);
        let s = policy::step(&P, &mut rec, refused(), now, 1.0);
        assert_eq!(s.actions, [Action::Stop]);
        if i < 4 {
            // the shown deadline is the wall reading plus the same delay
            let wait = P.delay_ms(i + 1, 1.0);
            assert_eq!(rec.next_start_at_ms, Some(now.wall_ms + wait));
        }
    }
    let waits: Vec<u64> = starts.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(waits, [500, 1000, 2000, 4000]);
    assert_eq!((rec.status, rec.consecutive_failures), (Status::Held, 5));
    // a held agent stays held across any number of steps
    for t in [10_000, 20_000, 30_000] {
        policy::step(&P, &mut rec, Input::Tick, at(mono + t), 1.0);
        assert_eq!(rec.status, Status::Held);
    }

    // Cleared, four more failures, then running: the count resets after
    // exactly 60 s alive on the monotonic clock.
    let mut t = mono + 100_000;
    policy::step(&P, &mut rec, Input::ClearHold, at(t), 1.0);
    for _ in 0..4 {
        policy::step(&P, &mut rec, refused(), at(t), 1.0);
        t = policy::next_deadline(&P, &rec).unwrap();
        policy::step(&P, &mut rec, Input::Tick, at(t), 1.0);
    }
    assert_eq!(rec.status, Status::Starting);
    let began = t;
    assert_eq!(began, mono + 100_000 + 500 + 1000 + 2000 + 4000);
    policy::step(&P, &mut rec, Input::Started, at(began), 1.0);
    assert_eq!((rec.status, rec.consecutive_failures), (Status::Running, 4));
    assert_eq!(policy::next_deadline(&P, &rec), Some(began + 60_000));
    // the wall jumps 3 h ahead: not yet 60 s alive
    policy::step(&P, &mut rec, Input::Alive, at(began + 30_000), 1.0);
    policy::step(&P, &mut rec, Input::Alive, at(began + 59_999), 1.0);
    assert_eq!(rec.consecutive_failures, 4, "reset early");
    policy::step(&P, &mut rec, Input::Alive, at(began + 60_000), 1.0);
    assert_eq!(rec.consecutive_failures, 0, "not reset after 60 s alive");
    // the next crash waits the first delay again
    let now = at(began + 70_000);
    policy::step(&P, &mut rec, crash(1), now, 1.0);
    assert_eq!(policy::next_deadline(&P, &rec), Some(began + 70_000 + 500));
    assert_eq!(rec.next_start_at_ms, Some(now.wall_ms + 500));
}

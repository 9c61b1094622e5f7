//! The runner with a scripted fake driver (ok / reject / hang per call, as
//! seed 000's fake) on tokio's paused clock: the policy's timing, its
//! timeouts, and a hold that survives a restart of the supervisor. Run
//! with the policy's table: `cargo test -p airlock-agents crash_loop_`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use airlock_agents::runner::{self, OnChange, TokioClock};
use airlock_agents::{
    Command, Driver, DriverError, Exit, Liveness, MemoryStore, Options, Policy, RecordStore, Status,
};
use airlock_config::Agent;
use airlock_proto::Code;

#[derive(Clone, Copy, Debug)]
enum Outcome {
    Ok,
    Reject,
    Hang,
    /// For probes: the agent is gone with this exit status.
    Gone(i32),
    /// For probes: the agent is gone because the suite is stopping.
    Drained,
}

const EPOCH: u64 = 1_800_000_000_000;
const HANG: Duration = Duration::from_secs(3600);

#[derive(Debug, Default)]
struct Fake {
    starts: Mutex<VecDeque<Outcome>>,
    probes: Mutex<VecDeque<Outcome>>,
    stops: Mutex<VecDeque<Outcome>>,
    /// (call, ms since the test's start)
    log: Mutex<Vec<(String, u64)>>,
    began: Mutex<Option<tokio::time::Instant>>,
}

impl Fake {
    fn new() -> Arc<Fake> {
        let f = Fake::default();
        *f.began.lock().unwrap() = Some(tokio::time::Instant::now());
        Arc::new(f)
    }

    fn script(queue: &Mutex<VecDeque<Outcome>>, outcomes: &[Outcome]) {
        queue.lock().unwrap().extend(outcomes.iter().cloned());
    }

    fn note(&self, what: &str) {
        let began = self.began.lock().unwrap().expect("began");
        self.log
            .lock()
            .unwrap()
            .push((what.to_owned(), began.elapsed().as_millis() as u64));
    }

    fn calls(&self, what: &str) -> Vec<u64> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|(w, _)| w == what)
            .map(|(_, t)| *t)
            .collect()
    }

    async fn answer(
        &self,
        what: &str,
        queue: &Mutex<VecDeque<Outcome>>,
        default: Outcome,
    ) -> Result<Liveness, DriverError> {
        self.note(what);
        let outcome = queue.lock().unwrap().pop_front().unwrap_or(default);
        match outcome {
            Outcome::Ok => Ok(Liveness::Alive),
            Outcome::Reject => Err(DriverError(format!("{what} rejected"))),
            Outcome::Gone(code) => Ok(Liveness::Gone(Exit {
                code: Some(code),
                signal: None,
                reason: String::new(),
            })),
            Outcome::Drained => Ok(Liveness::Drained),
            Outcome::Hang => {
                tokio::time::sleep(HANG).await;
                // Only reached if someone waited: the runner must not.
                self.note(&format!("{what}-late-answer"));
                Ok(Liveness::Alive)
            }
        }
    }
}

impl Driver for Fake {
    async fn start(&self, _agent: &Agent) -> Result<Option<u32>, DriverError> {
        self.answer("start", &self.starts, Outcome::Ok)
            .await
            .map(|_| None)
    }

    async fn probe(&self, _name: &str) -> Result<Liveness, DriverError> {
        self.answer("probe", &self.probes, Outcome::Ok).await
    }

    async fn stop(&self, _name: &str) -> Result<(), DriverError> {
        self.answer("stop", &self.stops, Outcome::Ok)
            .await
            .map(|_| ())
    }
}

fn agent() -> Agent {
    airlock_config::Config::parse(
        "[[agent]]\nname = \"planner\"\ncommand = [\"/bin/true\"]\nrepositories = [\"demo\"]\n",
        std::path::Path::new("test.toml"),
    )
    .unwrap()
    .agents
    .remove(0)
}

fn options() -> Options {
    Options {
        policy: Policy::SEED,
        call_timeout: Duration::from_secs(2),
        probe_interval: Duration::from_millis(500),
    }
}

fn quiet() -> OnChange {
    Arc::new(|_, _| {})
}

async fn until(
    handle: &airlock_agents::AgentHandle,
    status: Status,
) -> airlock_agents::AgentRecord {
    let mut rx = handle.watch();
    let reached = tokio::time::timeout(
        Duration::from_secs(600),
        rx.wait_for(|r| r.status == status),
    )
    .await;
    match reached {
        Ok(Ok(r)) => r.clone(),
        _ => panic!("never reached {status:?}: {:?}", handle.record()),
    }
}

#[tokio::test(start_paused = true)]
async fn crash_loop_five_rejected_starts_hold_with_the_policys_delays() {
    let fake = Fake::new();
    Fake::script(&fake.starts, &[Outcome::Reject; 7]);
    let store = Arc::new(MemoryStore::default());
    let changes = Arc::new(Mutex::new(Vec::new()));
    let seen = changes.clone();
    let on_change: OnChange = Arc::new(move |name: &str, r: &airlock_agents::AgentRecord| {
        seen.lock().unwrap().push((name.to_owned(), r.status));
    });
    let h = runner::spawn(
        agent(),
        fake.clone(),
        store.clone(),
        Arc::new(TokioClock::new(EPOCH)),
        options(),
        on_change,
    )
    .unwrap();
    let held = until(&h, Status::Held).await;
    assert_eq!(held.consecutive_failures, 5);
    let starts = fake.calls("start");
    assert_eq!(starts.len(), 5, "{starts:?}");
    let waits: Vec<u64> = starts.windows(2).map(|w| w[1] - w[0]).collect();
    for (i, wait) in waits.iter().enumerate() {
        let bound = Policy::SEED.bound_ms(i as u32 + 1);
        assert!(
            (bound - bound / 5..=bound).contains(wait),
            "wait {i}: {wait} ms, bound {bound}"
        );
    }
    // every failure stopped best effort
    assert_eq!(fake.calls("stop").len(), 5);
    // nothing restarts it
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(fake.calls("start").len(), 5);
    assert_eq!(
        h.command(Command::Start).await,
        Err(Code::AGENTOS_CRASH_LOOP)
    );
    assert_eq!(fake.calls("start").len(), 5);
    // stored and announced
    assert_eq!(store.load("planner").unwrap().unwrap(), held);
    assert!(
        changes
            .lock()
            .unwrap()
            .iter()
            .any(|(n, s)| n == "planner" && *s == Status::Held)
    );
    // ClearHold resets the count and starts it (the 6th scripted start is refused again)
    let r = h.command(Command::ClearHold).await.unwrap();
    assert_eq!(fake.calls("start").len(), 6);
    assert_eq!((r.status, r.consecutive_failures), (Status::Backoff, 1));
    h.drain().await;
}

#[tokio::test(start_paused = true)]
async fn crash_loop_a_hung_start_times_out_and_its_late_answer_is_ignored() {
    let fake = Fake::new();
    Fake::script(&fake.starts, &[Outcome::Hang]);
    let store = Arc::new(MemoryStore::default());
    let h = runner::spawn(
        agent(),
        fake.clone(),
        store,
        Arc::new(TokioClock::new(EPOCH)),
        options(),
        quiet(),
    )
    .unwrap();
    let backoff = until(&h, Status::Backoff).await;
    assert_eq!(backoff.consecutive_failures, 1);
    let reason = &backoff.last_exit.as_ref().unwrap().reason;
    assert_eq!(reason, "start not answered within 2000 ms");
    assert_eq!(fake.calls("start"), [0]);
    assert_eq!(fake.calls("stop"), [2000], "stopped at the timeout");
    // the second start answers; the agent runs
    let running = until(&h, Status::Running).await;
    assert_eq!(running.consecutive_failures, 1);
    // long after the hung call would have answered, nothing took its answer
    tokio::time::sleep(HANG * 2).await;
    assert!(fake.calls("start-late-answer").is_empty());
    let now = h.record();
    assert_eq!(now.status, Status::Running);
    assert_eq!(now.consecutive_failures, 0, "reset after 60 s alive");
    h.drain().await;
}

#[tokio::test(start_paused = true)]
async fn crash_loop_a_hung_or_failing_probe_is_a_crash() {
    let fake = Fake::new();
    Fake::script(
        &fake.probes,
        &[
            Outcome::Ok,
            Outcome::Hang,
            Outcome::Reject,
            Outcome::Gone(3),
        ],
    );
    let store = Arc::new(MemoryStore::default());
    let h = runner::spawn(
        agent(),
        fake.clone(),
        store,
        Arc::new(TokioClock::new(EPOCH)),
        options(),
        quiet(),
    )
    .unwrap();
    let mut rx = h.watch();
    let r = rx
        .wait_for(|r| r.consecutive_failures == 3 && r.status == Status::Backoff)
        .await
        .unwrap()
        .clone();
    assert_eq!(r.last_exit.as_ref().and_then(|e| e.code), Some(3));
    assert_eq!(fake.calls("start").len(), 3);
    assert!(fake.calls("probe-late-answer").is_empty());
    h.drain().await;
}

#[tokio::test(start_paused = true)]
async fn crash_loop_an_agent_stopped_with_the_suite_is_no_failure() {
    // systemd stops the agent units before the supervisor (BindsTo=,
    // After=): probes that find it gone then are a drain, not a crash;
    // once the suite is no longer stopping, a gone agent is a crash again.
    let fake = Fake::new();
    Fake::script(
        &fake.probes,
        &[
            Outcome::Ok,
            Outcome::Drained,
            Outcome::Drained,
            Outcome::Drained,
            Outcome::Gone(1),
        ],
    );
    let store = Arc::new(MemoryStore::default());
    let h = runner::spawn(
        agent(),
        fake.clone(),
        store,
        Arc::new(TokioClock::new(EPOCH)),
        options(),
        quiet(),
    )
    .unwrap();
    let mut rx = h.watch();
    let r = rx
        .wait_for(|r| r.consecutive_failures == 1)
        .await
        .unwrap()
        .clone();
    // Four probes before the crash, one failure only: the crash's.
    assert_eq!(fake.calls("probe").len(), 5);
    assert_eq!(r.status, Status::Backoff);
    assert_eq!(r.last_exit.as_ref().and_then(|e| e.code), Some(1));
    assert_eq!(fake.calls("start").len(), 1);
    h.drain().await;
}

#[tokio::test(start_paused = true)]
async fn crash_loop_a_hung_stop_does_not_block_teardown() {
    let fake = Fake::new();
    Fake::script(&fake.stops, &[Outcome::Hang]);
    let store = Arc::new(MemoryStore::default());
    let h = runner::spawn(
        agent(),
        fake.clone(),
        store.clone(),
        Arc::new(TokioClock::new(EPOCH)),
        options(),
        quiet(),
    )
    .unwrap();
    until(&h, Status::Running).await;
    let t0 = tokio::time::Instant::now();
    h.drain().await;
    assert_eq!(
        t0.elapsed(),
        Duration::from_secs(2),
        "the drain waited one call timeout, no more"
    );
    // a drain is not an operator's stop: the stored record still says RUNNING
    assert_eq!(
        store.load("planner").unwrap().unwrap().status,
        Status::Running
    );
}

#[tokio::test(start_paused = true)]
async fn crash_loop_a_hold_survives_a_restart_of_the_supervisor() {
    let fake = Fake::new();
    Fake::script(&fake.starts, &[Outcome::Reject; 5]);
    let store = Arc::new(MemoryStore::default());
    let clock = Arc::new(TokioClock::new(EPOCH));
    let h = runner::spawn(
        agent(),
        fake.clone(),
        store.clone(),
        clock.clone(),
        options(),
        quiet(),
    )
    .unwrap();
    until(&h, Status::Held).await;
    h.drain().await;
    // a new supervisor on the same store
    let h = runner::spawn(
        agent(),
        fake.clone(),
        store.clone(),
        clock.clone(),
        options(),
        quiet(),
    )
    .unwrap();
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(fake.calls("start").len(), 5, "the restart did not start it");
    assert_eq!(h.record().status, Status::Held);
    assert_eq!(
        h.command(Command::Start).await,
        Err(Code::AGENTOS_CRASH_LOOP)
    );
    let r = h.command(Command::ClearHold).await.unwrap();
    assert_eq!((r.status, r.consecutive_failures), (Status::Running, 0));
    // an operator's stop is stored, and a restart keeps it stopped
    let r = h.command(Command::Stop).await.unwrap();
    assert_eq!(r.status, Status::Stopped);
    h.drain().await;
    let starts = fake.calls("start").len();
    let h = runner::spawn(agent(), fake.clone(), store, clock, options(), quiet()).unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(h.record().status, Status::Stopped);
    assert_eq!(fake.calls("start").len(), starts);
    h.drain().await;
}

/// A driver whose start answers the session 4242 only once the gate
/// opens, as the process driver answers only after it spawned the agent:
/// meanwhile the agent may already be calling the supervisor.
struct Gated {
    gate: tokio::sync::watch::Receiver<bool>,
}

impl Driver for Gated {
    async fn start(&self, _agent: &Agent) -> Result<Option<u32>, DriverError> {
        let mut gate = self.gate.clone();
        let _ = gate.wait_for(|open| *open).await;
        Ok(Some(4242))
    }

    async fn probe(&self, _name: &str) -> Result<Liveness, DriverError> {
        Ok(Liveness::Alive)
    }

    async fn stop(&self, _name: &str) -> Result<(), DriverError> {
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn start_settled_waits_for_a_start_in_flight_until_its_session_is_known() {
    let (open, gate) = tokio::sync::watch::channel(false);
    let h = runner::spawn(
        agent(),
        Arc::new(Gated { gate }),
        Arc::new(MemoryStore::default()),
        Arc::new(TokioClock::new(EPOCH)),
        options(),
        quiet(),
    )
    .unwrap();
    // the start is in flight: the agent may run, its session is not known
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(h.session(), None);
    let opener = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        open.send_replace(true);
    });
    // what the supervisor does for a caller it does not recognise
    h.start_settled().await;
    assert_eq!(h.session(), Some(4242));
    opener.await.unwrap();
    assert_eq!(until(&h, Status::Running).await.status, Status::Running);
}

#[tokio::test(start_paused = true)]
async fn start_settled_waits_for_a_hung_start_until_the_runner_gives_it_up() {
    let (_never, gate) = tokio::sync::watch::channel(false);
    let h = runner::spawn(
        agent(),
        Arc::new(Gated { gate }),
        Arc::new(MemoryStore::default()),
        Arc::new(TokioClock::new(EPOCH)),
        options(),
        quiet(),
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let began = tokio::time::Instant::now();
    h.start_settled().await;
    // it waited for the start in flight, until the runner gave it up
    let waited = began.elapsed();
    assert!(waited >= Duration::from_millis(1500), "{waited:?}");
    assert!(waited <= options().call_timeout, "{waited:?}");
    assert_eq!(h.session(), None);
}

/// Steps `clock`'s wall 3 h forward, then back, every 250 ms (between any
/// two events of the runner), until aborted.
fn step_the_wall_every_250_ms(clock: &TokioClock) -> tokio::task::JoinHandle<()> {
    const HOURS_3: i64 = 3 * 3_600_000;
    let clock = clock.clone();
    tokio::spawn(async move {
        let mut ahead = false;
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            clock.step_wall(if ahead { -2 * HOURS_3 } else { 2 * HOURS_3 });
            ahead = !ahead;
        }
    })
}

/// Issue 24: with the wall clock stepped ±3 h every 250 ms, the runner's
/// backoffs keep the policy's delays (none stalls), the 5th failure holds,
/// and the count resets after 60 s alive, not earlier or later.
#[tokio::test(start_paused = true)]
async fn crash_loop_wall_clock_steps_stall_no_backoff_and_hurry_no_reset() {
    let fake = Fake::new();
    Fake::script(&fake.starts, &[Outcome::Reject; 5]);
    let clock = TokioClock::new(EPOCH);
    let stepper = step_the_wall_every_250_ms(&clock);
    let store = Arc::new(MemoryStore::default());
    let h = runner::spawn(
        agent(),
        fake.clone(),
        store.clone(),
        Arc::new(clock.clone()),
        options(),
        quiet(),
    )
    .unwrap();
    let held = until(&h, Status::Held).await;
    assert_eq!(held.consecutive_failures, 5);
    let starts = fake.calls("start");
    let waits: Vec<u64> = starts.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(waits.len(), 4, "{starts:?}");
    for (i, wait) in waits.iter().enumerate() {
        let bound = Policy::SEED.bound_ms(i as u32 + 1);
        assert!(
            (bound - bound / 5..=bound).contains(wait),
            "wait {i}: {wait} ms, bound {bound} (500 ms, 1 s, 2 s, 4 s)"
        );
    }
    // held through hours of wall steps
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(fake.calls("start").len(), 5);
    assert_eq!(h.record().status, Status::Held);

    // Cleared: two more refused starts, then it runs with a count of 2.
    Fake::script(
        &fake.starts,
        &[Outcome::Reject, Outcome::Reject, Outcome::Ok],
    );
    h.command(Command::ClearHold).await.unwrap();
    let running = until(&h, Status::Running).await;
    assert_eq!(running.consecutive_failures, 2);
    let began = *fake.calls("start").last().unwrap();
    let since_start = |ms: u64| {
        let now = fake.began.lock().unwrap().unwrap().elapsed().as_millis() as u64;
        Duration::from_millis((began + ms).saturating_sub(now))
    };
    tokio::time::sleep(since_start(59_000)).await;
    assert_eq!(
        h.record().consecutive_failures,
        2,
        "reset before 60 s alive"
    );
    tokio::time::sleep(since_start(60_600)).await;
    let r = h.record();
    assert_eq!((r.status, r.consecutive_failures), (Status::Running, 0));
    stepper.abort();
    h.drain().await;
}

//! One task per agent that feeds the policy ([`crate::policy`]) with the
//! clock, the operator's commands and the driver's answers, carries out its
//! actions, and stores the record after every change.
//!
//! Every driver call is raced against `call_timeout`: a call that does not
//! answer in time counts as a failure of that call and its future is
//! dropped, so its late answer is never seen. A stop is best effort: its
//! failure or silence is logged and changes nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use airlock_config::Agent;
use airlock_proto::Code;
use tokio::sync::{mpsc, oneshot, watch};

use crate::driver::{Driver, Liveness};
use crate::policy::{self, Action, AgentRecord, Exit, Input, Now, Policy, Status};

/// Why the store could not be read or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("agent store: {0}")]
pub struct StoreError(pub String);

/// Where the records live (the supervisor's task store; memory in tests).
pub trait RecordStore: Send + Sync + 'static {
    /// The stored record of the agent called `name`, if any.
    fn load(&self, name: &str) -> Result<Option<AgentRecord>, StoreError>;
    /// Stores the record of the agent called `name`.
    fn save(&self, name: &str, record: &AgentRecord) -> Result<(), StoreError>;
}

/// Both clocks the policy reads ([`policy::Now`]). Injected so that tests
/// run on tokio's paused clock and can step the wall clock at will.
pub trait Clock: Send + Sync + 'static {
    /// Wall-clock time, in ms since the epoch: only stamps what is shown
    /// or stored.
    fn wall_ms(&self) -> u64;
    /// Monotonic time, in ms from an origin fixed for the process: every
    /// interval (backoff, stable window, probe period) is measured on it.
    fn mono_ms(&self) -> u64;
    /// Both readings.
    fn now(&self) -> Now {
        Now {
            wall_ms: self.wall_ms(),
            mono_ms: self.mono_ms(),
        }
    }
}

/// The system's clocks: `SystemTime` for the wall, `Instant` (Linux's
/// `CLOCK_MONOTONIC`, which no clock step moves) for intervals.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn wall_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }

    fn mono_ms(&self) -> u64 {
        static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        ORIGIN
            .get_or_init(std::time::Instant::now)
            .elapsed()
            .as_millis() as u64
    }
}

/// tokio's clock from a fixed epoch, deterministic under
/// `tokio::time::pause`, whose wall reading a test may step
/// ([`TokioClock::step_wall`]) without moving the monotonic one.
#[derive(Debug, Clone)]
pub struct TokioClock {
    epoch_ms: u64,
    start: tokio::time::Instant,
    wall_step_ms: Arc<AtomicI64>,
}

impl TokioClock {
    /// A clock whose wall reads `epoch_ms` now.
    pub fn new(epoch_ms: u64) -> TokioClock {
        TokioClock {
            epoch_ms,
            start: tokio::time::Instant::now(),
            wall_step_ms: Arc::new(AtomicI64::new(0)),
        }
    }

    /// Steps the wall clock by `delta_ms` (negative: back), as an operator
    /// or NTP would; the monotonic clock does not move. Every clone sees it.
    pub fn step_wall(&self, delta_ms: i64) {
        self.wall_step_ms.fetch_add(delta_ms, Ordering::SeqCst);
    }
}

impl Clock for TokioClock {
    fn wall_ms(&self) -> u64 {
        let wall = self.epoch_ms + self.mono_ms();
        wall.saturating_add_signed(self.wall_step_ms.load(Ordering::SeqCst))
    }

    fn mono_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }
}

/// Told after every change of a record (audit, the AgentChanged signal).
pub type OnChange = Arc<dyn Fn(&str, &AgentRecord) + Send + Sync>;

/// How the runner drives its agent.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// The policy's constants.
    pub policy: Policy,
    /// How long a driver call may take (the supervisor's
    /// `supervisor.agent_call_timeout_seconds`; 10 s by default).
    pub call_timeout: Duration,
    /// How often a running agent is probed.
    pub probe_interval: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            policy: Policy::SEED,
            call_timeout: Duration::from_secs(10),
            probe_interval: Duration::from_millis(500),
        }
    }
}

/// An operator's request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// StartAgent.
    Start,
    /// StopAgent.
    Stop,
    /// ClearHold.
    ClearHold,
}

type Request = (Command, oneshot::Sender<Result<AgentRecord, Code>>);

/// The handle of a running agent task.
#[derive(Debug)]
pub struct AgentHandle {
    name: String,
    tx: mpsc::Sender<Request>,
    record: watch::Receiver<AgentRecord>,
    session: watch::Receiver<Option<u32>>,
    starting: watch::Receiver<bool>,
    call_timeout: Duration,
    shutdown: watch::Sender<bool>,
    task: tokio::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl AgentHandle {
    /// The agent's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The record as it is now.
    pub fn record(&self) -> AgentRecord {
        self.record.borrow().clone()
    }

    /// The session the running agent leads, when its driver gave one
    /// (`None` unless it is STARTING or RUNNING).
    pub fn session(&self) -> Option<u32> {
        *self.session.borrow()
    }

    /// Waits until no start of the agent awaits its driver's answer (at
    /// most the call timeout, which ends such a start anyway). The driver
    /// spawns the agent before it answers with the session, so a process
    /// of a starting agent can call before [`Self::session`] knows it;
    /// once this returns, every start begun earlier has set its session.
    pub async fn start_settled(&self) {
        let mut starting = self.starting.clone();
        let settled = starting.wait_for(|s| !*s);
        let _ = tokio::time::timeout(self.call_timeout, settled).await;
    }

    /// A receiver that sees every stored change.
    pub fn watch(&self) -> watch::Receiver<AgentRecord> {
        self.record.clone()
    }

    /// Sends an operator's request and waits for the record after it, or
    /// its refusal (`AGENTOS_CRASH_LOOP` for a start while held).
    pub async fn command(&self, command: Command) -> Result<AgentRecord, Code> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send((command, tx))
            .await
            .map_err(|_| Code::INTERNAL)?;
        rx.await.map_err(|_| Code::INTERNAL)?
    }

    /// Drains: stops the agent (best effort, within the call timeout)
    /// without recording an operator's stop, so the next supervisor resumes
    /// it, and waits for the task to end.
    pub async fn drain(&self) {
        self.shutdown.send_replace(true);
        let task = self.task.lock().await.take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

/// Starts the task that runs `agent`: resumes its stored record (a hold
/// stays a hold; an agent never seen before is started).
pub fn spawn<D: Driver, S: RecordStore>(
    agent: Agent,
    driver: Arc<D>,
    store: Arc<S>,
    clock: Arc<dyn Clock>,
    options: Options,
    on_change: OnChange,
) -> Result<AgentHandle, StoreError> {
    let now = clock.wall_ms();
    let (record, first) = match store.load(&agent.name)? {
        Some(r) => (r, Input::Resume),
        None => (AgentRecord::new(now), Input::OperatorStart),
    };
    let (watch_tx, watch_rx) = watch::channel(record.clone());
    let (tx, rx) = mpsc::channel(16);
    let (shutdown, shutdown_rx) = watch::channel(false);
    let (session_tx, session_rx) = watch::channel(None);
    let (starting_tx, starting_rx) = watch::channel(false);
    let name = agent.name.clone();
    let call_timeout = options.call_timeout;
    let mut runner = Runner {
        agent,
        driver,
        store,
        clock,
        options,
        on_change,
        record,
        watch: watch_tx,
        session: session_tx,
        starting: starting_tx,
    };
    let task = tokio::spawn(async move {
        runner.apply(first).await;
        runner.run(rx, shutdown_rx).await;
    });
    Ok(AgentHandle {
        name,
        tx,
        record: watch_rx,
        session: session_rx,
        starting: starting_rx,
        call_timeout,
        shutdown,
        task: tokio::sync::Mutex::new(Some(task)),
    })
}

struct Runner<D, S> {
    agent: Agent,
    driver: Arc<D>,
    store: Arc<S>,
    clock: Arc<dyn Clock>,
    options: Options,
    on_change: OnChange,
    record: AgentRecord,
    watch: watch::Sender<AgentRecord>,
    session: watch::Sender<Option<u32>>,
    /// True while a start awaits the driver's answer.
    starting: watch::Sender<bool>,
}

impl<D: Driver, S: RecordStore> Runner<D, S> {
    async fn run(&mut self, mut rx: mpsc::Receiver<Request>, mut shutdown: watch::Receiver<bool>) {
        loop {
            if *shutdown.borrow_and_update() {
                self.drain().await;
                return;
            }
            // Deadlines and the sleep to them are monotonic: a wall-clock
            // step neither stalls a backoff nor hurries the stable window.
            let now = self.clock.mono_ms();
            let deadline = policy::next_deadline(&self.options.policy, &self.record);
            let probe = (self.record.status == Status::Running)
                .then(|| now + self.options.probe_interval.as_millis() as u64);
            let wake = match (deadline, probe) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let sleep = async {
                match wake {
                    Some(at) => {
                        tokio::time::sleep(Duration::from_millis(at.saturating_sub(now))).await
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                changed = shutdown.changed() => {
                    if changed.is_err() {
                        self.drain().await;
                        return;
                    }
                    continue;
                }
                request = rx.recv() => {
                    let Some((command, reply)) = request else {
                        self.drain().await;
                        return;
                    };
                    let input = match command {
                        Command::Start => Input::OperatorStart,
                        Command::Stop => Input::OperatorStop,
                        Command::ClearHold => Input::ClearHold,
                    };
                    let answer = match self.apply(input).await {
                        Some(code) => Err(code),
                        None => Ok(self.record.clone()),
                    };
                    let _ = reply.send(answer);
                }
                () = sleep => {
                    if self.record.status == Status::Running {
                        let input = self.probe().await;
                        self.apply(input).await;
                    }
                    self.apply(Input::Tick).await;
                }
            }
        }
    }

    /// Feeds `input` and every input its actions produce; returns the
    /// refusal of an operator's request, if any.
    async fn apply(&mut self, input: Input) -> Option<Code> {
        let mut queue = vec![input];
        let mut refusal = None;
        while let Some(input) = queue.pop() {
            let now = self.clock.now();
            let step = policy::step(
                &self.options.policy,
                &mut self.record,
                input,
                now,
                rand::random::<f64>(),
            );
            if let Some(code) = step.refused {
                refusal.get_or_insert(code);
            }
            if step.changed {
                self.store_record();
            }
            if !matches!(self.record.status, Status::Starting | Status::Running) {
                self.session.send_replace(None);
            }
            for action in step.actions {
                match action {
                    Action::Stop => self.stop().await,
                    Action::Start => queue.push(self.start().await),
                }
            }
        }
        refusal
    }

    fn store_record(&mut self) {
        if let Err(e) = self.store.save(&self.agent.name, &self.record) {
            // The policy goes on from memory; the next change tries again.
            tracing::error!(agent = %self.agent.name, "cannot store the agent's record: {e}");
        }
        tracing::info!(
            agent = %self.agent.name,
            status = self.record.status.as_str(),
            failures = self.record.consecutive_failures,
            next_start_at_ms = ?self.record.next_start_at_ms,
            "agent changed"
        );
        (self.on_change)(&self.agent.name, &self.record);
        self.watch.send_replace(self.record.clone());
    }

    async fn start(&self) -> Input {
        let timeout = self.options.call_timeout;
        // Raised before the driver spawns anything, lowered only after the
        // session is known: see AgentHandle::start_settled.
        self.starting.send_replace(true);
        let answer = tokio::time::timeout(timeout, self.driver.start(&self.agent)).await;
        if let Ok(Ok(session)) = &answer {
            self.session.send_replace(*session);
        }
        self.starting.send_replace(false);
        match answer {
            Ok(Ok(_)) => Input::Started,
            Ok(Err(e)) => Input::StartFailed(Exit {
                reason: format!("start failed: {e}"),
                ..Exit::default()
            }),
            Err(_) => Input::StartFailed(Exit {
                reason: format!("start not answered within {} ms", timeout.as_millis()),
                ..Exit::default()
            }),
        }
    }

    async fn probe(&self) -> Input {
        let timeout = self.options.call_timeout;
        match tokio::time::timeout(timeout, self.driver.probe(&self.agent.name)).await {
            Ok(Ok(Liveness::Alive)) => Input::Alive,
            Ok(Ok(Liveness::Gone(exit))) => Input::Crashed(exit),
            // Not a failure; the supervisor's own stop (and drain) follows.
            Ok(Ok(Liveness::Drained)) => Input::Tick,
            Ok(Err(e)) => Input::Crashed(Exit {
                reason: format!("probe failed: {e}"),
                ..Exit::default()
            }),
            Err(_) => Input::Crashed(Exit {
                reason: format!("probe not answered within {} ms", timeout.as_millis()),
                ..Exit::default()
            }),
        }
    }

    async fn stop(&self) {
        let timeout = self.options.call_timeout;
        match tokio::time::timeout(timeout, self.driver.stop(&self.agent.name)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(agent = %self.agent.name, "stop failed (ignored): {e}"),
            Err(_) => tracing::warn!(
                agent = %self.agent.name,
                "stop not answered within {} ms (ignored)",
                timeout.as_millis()
            ),
        }
    }

    /// The supervisor is going away: stop the agent, record nothing (the
    /// next supervisor resumes it; a drain is not a failure).
    async fn drain(&self) {
        self.stop().await;
    }
}

//! Metrics for Prometheus without a listener of airlock's own: every
//! `metrics_interval_seconds` the supervisor writes [`FILE_NAME`] in the
//! node exporter's textfile-collector format into `metrics_directory`
//! (Debian's prometheus-node-exporter reads
//! `/var/lib/prometheus/node-exporter`), atomically: a temporary file in
//! the same directory, renamed over the last one, so a scrape sees one
//! whole pass or the one before. docs/metrics.md lists every series.
//!
//! What a pass reads, in one visit to the task store: the count of tasks
//! per state, the queued tasks' ages, and the event log from where the
//! last pass stopped. The counters and histograms follow the event log
//! from the moment the supervisor started (Prometheus counters start at
//! zero with their process; `rate()` and `increase()` handle the reset):
//! tasks submitted, tasks finished by state and code, lease expiries,
//! attempt and verification-command durations, dependency layers reused
//! or built (from the results' evidence), agent starts, agents'
//! submissions refused for a quota. The file
//! holds counts, durations, state and code names and agent names; no task
//! content, no repository, no submitter.

use crate::agents::Agents;
use crate::bus::Shared;
use airlock_proto::Code;
use airlock_proto::task::{TaskResult, TaskState};
use airlock_taskdb::StoreResult;
use airlock_taskdb::tasks::{Event, EventOutcome, MAX_PAGE, TaskStore, action};
use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};
use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// The file the node exporter reads (its textfile collector takes
/// `*.prom`; the temporary file of a write is named otherwise).
pub const FILE_NAME: &str = "airlock.prom";

/// Most events one pass reads; the rest wait for the next pass.
const EVENTS_PER_PASS: usize = 20 * MAX_PAGE as usize;

/// Upper bounds of the attempt-duration buckets, in seconds (a claim to
/// its result or its lease's expiry).
const ATTEMPT_BUCKETS: &[f64] = &[
    1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
];

/// Upper bounds of the verification-command buckets, in seconds.
const COMMAND_BUCKETS: &[f64] = &[0.1, 0.5, 1.0, 5.0, 15.0, 30.0, 60.0, 300.0, 900.0];

/// Where and how often.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetricsSettings {
    /// The directory the node exporter's textfile collector reads.
    pub directory: PathBuf,
    /// Time between passes.
    pub interval: Duration,
}

/// The series, registered in a registry of their own.
struct Series {
    registry: Registry,
    tasks: IntGaugeVec,
    oldest_queued: IntGauge,
    submitted: IntCounter,
    finished: IntCounterVec,
    lease_expiries: IntCounter,
    attempt_seconds: Histogram,
    command_seconds: Histogram,
    layers: IntCounterVec,
    agents: IntGaugeVec,
    agent_failures: IntGaugeVec,
    agent_starts: IntCounterVec,
    quota_refusals: IntCounterVec,
    last_pass: IntGauge,
}

fn register<T: prometheus::core::Collector + Clone + 'static>(registry: &Registry, c: T) -> T {
    registry
        .register(Box::new(c.clone()))
        .expect("each series is registered once, with a valid name");
    c
}

impl Series {
    fn new() -> Series {
        let r = Registry::new();
        let gauge = |name: &str, help: &str| {
            register(&r, IntGauge::with_opts(Opts::new(name, help)).expect(name))
        };
        let gauge_vec = |name: &str, help: &str, labels: &[&str]| {
            register(
                &r,
                IntGaugeVec::new(Opts::new(name, help), labels).expect(name),
            )
        };
        let counter = |name: &str, help: &str| {
            register(
                &r,
                IntCounter::with_opts(Opts::new(name, help)).expect(name),
            )
        };
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            register(
                &r,
                IntCounterVec::new(Opts::new(name, help), labels).expect(name),
            )
        };
        let histogram = |name: &str, help: &str, buckets: &[f64]| {
            register(
                &r,
                Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))
                    .expect(name),
            )
        };
        Series {
            tasks: gauge_vec("airlock_tasks", "Tasks in the store, by state.", &["state"]),
            oldest_queued: gauge(
                "airlock_queue_oldest_task_age_seconds",
                "Age of the oldest queued task since its submission; 0 when none is queued.",
            ),
            submitted: counter(
                "airlock_tasks_submitted_total",
                "Tasks submitted since the supervisor started (replays of a submission not counted).",
            ),
            finished: counter_vec(
                "airlock_tasks_finished_total",
                "Tasks that reached SUCCEEDED, FAILED or CANCELLED since the supervisor started, by state and code (empty when none applies).",
                &["state", "code"],
            ),
            lease_expiries: counter(
                "airlock_lease_expiries_total",
                "Leases that expired before their worker reported, since the supervisor started.",
            ),
            attempt_seconds: histogram(
                "airlock_attempt_duration_seconds",
                "Attempts from their claim to their result or their lease's expiry.",
                ATTEMPT_BUCKETS,
            ),
            command_seconds: histogram(
                "airlock_verification_command_duration_seconds",
                "Verification commands, each as the executor timed it.",
                COMMAND_BUCKETS,
            ),
            layers: counter_vec(
                "airlock_environment_layers_total",
                "Dependency layers the verifications of reported results read since the supervisor started, by source: reused from the executor's layer cache, or built by the environment's setup.",
                &["source"],
            ),
            agents: gauge_vec(
                "airlock_agents",
                "Configured planner agents, by restart-policy state.",
                &["state"],
            ),
            agent_failures: gauge_vec(
                "airlock_agent_consecutive_failures",
                "Each planner agent's failed runs since its last good one.",
                &["agent"],
            ),
            agent_starts: counter_vec(
                "airlock_agent_starts_total",
                "Planner agent starts since the supervisor started, restarts included.",
                &["agent"],
            ),
            quota_refusals: counter_vec(
                "airlock_agent_quota_refusals_total",
                "Planner agents' submissions refused with AGENT_QUOTA_EXCEEDED since the supervisor started, by agent and quota (tasks_per_hour, cpu_seconds_per_day).",
                &["agent", "quota"],
            ),
            last_pass: gauge(
                "airlock_metrics_pass_timestamp_seconds",
                "When this file was written (store time, unix seconds).",
            ),
            registry: r,
        }
    }
}

/// What one pass read from the store.
#[derive(Debug, Default)]
pub struct Reading {
    now_ms: i64,
    by_state: Vec<(TaskState, u64)>,
    oldest_queued_ms: Option<i64>,
    events: Vec<Event>,
    /// The tasks the events touched, as they are now: id, state, attempt,
    /// last change, the code of how it ended, its result.
    tasks: HashMap<String, TaskFacts>,
}

#[derive(Debug)]
struct TaskFacts {
    state: TaskState,
    attempt: u32,
    updated_at_ms: i64,
    code: String,
    result: Option<TaskResult>,
}

/// The code of how a finished task ended: the first of its verification
/// record's `reason`, `code` and `decision` that is a catalogue code (a
/// failure code or LEASE_EXPIRED as the reason, RECONCILIATION_REQUIRED as
/// the code beside an administrator's words, AGENT_REVOKED as the
/// decision), else empty (an acceptance, an administrator's rejection or
/// cancellation, whose reasons are words).
fn end_code(verification: Option<&serde_json::Value>) -> String {
    let Some(v) = verification else {
        return String::new();
    };
    ["reason", "code", "decision"]
        .iter()
        .filter_map(|k| v[*k].as_str())
        .find(|r| Code::from_name(r).is_some())
        .unwrap_or_default()
        .to_owned()
}

/// Reads what a pass needs, the events from after `cursor`.
pub fn read(store: &dyn TaskStore, cursor: i64) -> StoreResult<Reading> {
    let now_ms = store.now_ms()?;
    let summary = store.summary()?;
    let by_state = TaskState::ALL
        .iter()
        .map(|s| (*s, summary.count(*s)))
        .collect();
    let mut oldest_queued_ms = None;
    let mut after: Option<String> = None;
    loop {
        let page = store.list(Some(TaskState::Queued), after.as_deref(), MAX_PAGE)?;
        for t in &page {
            oldest_queued_ms =
                Some(oldest_queued_ms.map_or(t.created_at_ms, |o: i64| o.min(t.created_at_ms)));
        }
        if page.len() < MAX_PAGE as usize {
            break;
        }
        after = page.last().map(|t| t.task_id.clone());
    }
    let mut events = Vec::new();
    let mut from = cursor;
    while events.len() < EVENTS_PER_PASS {
        let page = store.events(None, from, MAX_PAGE)?;
        let full = page.len() == MAX_PAGE as usize;
        from = page.last().map_or(from, |e| e.id);
        events.extend(page);
        if !full {
            break;
        }
    }
    let touched: BTreeSet<&str> = events
        .iter()
        .filter(|e| e.outcome == EventOutcome::Allowed)
        .filter_map(|e| e.task_id.as_deref())
        .collect();
    let mut tasks = HashMap::new();
    for id in touched {
        let Ok(t) = store.get(id) else { continue };
        let result = t
            .result
            .as_ref()
            .and_then(|r| serde_json::from_value::<TaskResult>(r.clone()).ok());
        tasks.insert(
            id.to_owned(),
            TaskFacts {
                state: t.state,
                attempt: t.attempt,
                updated_at_ms: t.updated_at_ms,
                code: end_code(t.verification.as_ref()),
                result,
            },
        );
    }
    Ok(Reading {
        now_ms,
        by_state,
        oldest_queued_ms,
        events,
        tasks,
    })
}

/// The counters' memory between passes.
pub struct Tally {
    series: Series,
    /// The last event applied.
    cursor: i64,
    /// When the supervisor started (store time): a task last changed
    /// before it finished before it, and is not counted.
    started_ms: i64,
    /// The attempt and state each finished task was counted at.
    counted: HashMap<String, (u32, TaskState)>,
    /// When each running attempt was claimed.
    claimed: HashMap<(String, u32), i64>,
    /// Each agent's running-since of its last counted start.
    running_since: HashMap<String, u64>,
}

impl std::fmt::Debug for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tally")
            .field("cursor", &self.cursor)
            .field("started_ms", &self.started_ms)
            .finish_non_exhaustive()
    }
}

fn attempt_of(e: &Event) -> Option<u32> {
    e.payload
        .get("attempt")
        .and_then(serde_json::Value::as_u64)
        .and_then(|a| u32::try_from(a).ok())
}

impl Tally {
    /// Counting from after event `cursor` (the log's end when the
    /// supervisor started), at store time `started_ms`.
    pub fn new(cursor: i64, started_ms: i64) -> Tally {
        Tally {
            series: Series::new(),
            cursor,
            started_ms,
            counted: HashMap::new(),
            claimed: HashMap::new(),
            running_since: HashMap::new(),
        }
    }

    /// The last event applied.
    pub fn cursor(&self) -> i64 {
        self.cursor
    }

    /// Applies a reading and the agents as they are now.
    pub fn apply(&mut self, reading: Reading, agents: &[airlock_proto::bus::AgentView]) {
        let s = &self.series;
        for (state, n) in &reading.by_state {
            s.tasks
                .with_label_values(&[state.as_str()])
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
        s.oldest_queued.set(
            reading
                .oldest_queued_ms
                .map_or(0, |at| (reading.now_ms - at).max(0) / 1000),
        );
        for e in &reading.events {
            self.cursor = self.cursor.max(e.id);
            if e.outcome != EventOutcome::Allowed {
                // A quota refusal names its agent and quota in its payload
                // (the store writes it: tasks::quota).
                if e.code == Some(Code::AGENT_QUOTA_EXCEEDED)
                    && let (Some(agent), Some(quota)) =
                        (e.payload["agent"].as_str(), e.payload["quota"].as_str())
                {
                    s.quota_refusals.with_label_values(&[agent, quota]).inc();
                }
                continue;
            }
            let task = e.task_id.clone().unwrap_or_default();
            match e.action.as_str() {
                action::TASK_SUBMITTED => s.submitted.inc(),
                action::TASK_CLAIMED => {
                    if let Some(a) = attempt_of(e) {
                        self.claimed.insert((task, a), e.at_ms);
                    }
                }
                action::TASK_RESULT_SUBMITTED | action::TASK_LEASE_EXPIRED => {
                    if e.action == action::TASK_LEASE_EXPIRED {
                        s.lease_expiries.inc();
                    }
                    let Some(a) = attempt_of(e) else { continue };
                    if let Some(at) = self.claimed.remove(&(task.clone(), a)) {
                        s.attempt_seconds
                            .observe((e.at_ms - at).max(0) as f64 / 1000.0);
                    }
                    if e.action == action::TASK_RESULT_SUBMITTED
                        && let Some(r) = reading.tasks.get(&task).and_then(|t| t.result.as_ref())
                        && r.attempt == a
                    {
                        for c in &r.verification {
                            s.command_seconds.observe(c.duration_ms as f64 / 1000.0);
                        }
                        if let Some(layer) = r.isolation.as_ref().and_then(|i| i.layer.as_ref()) {
                            let source = if layer.reused { "reused" } else { "built" };
                            s.layers.with_label_values(&[source]).inc();
                        }
                    }
                }
                // A start is a record that turned RUNNING with a new
                // running-since (the policy saves a running agent's
                // record again when its stable window resets it).
                action::AGENT_CHANGED => {
                    let record = &e.payload["record"];
                    let (Some(name), Some("RUNNING"), Some(since)) = (
                        e.payload["agent"].as_str(),
                        record["status"].as_str(),
                        record["running_since_ms"].as_u64(),
                    ) else {
                        continue;
                    };
                    if self.running_since.insert(name.to_owned(), since) != Some(since) {
                        s.agent_starts.with_label_values(&[name]).inc();
                    }
                }
                _ => {}
            }
        }
        for (id, t) in &reading.tasks {
            if !t.state.is_terminal() || t.updated_at_ms < self.started_ms {
                continue;
            }
            if self.counted.get(id) == Some(&(t.attempt, t.state)) {
                continue;
            }
            self.counted.insert(id.clone(), (t.attempt, t.state));
            s.finished
                .with_label_values(&[t.state.as_str(), &t.code])
                .inc();
        }
        s.agents.reset();
        s.agent_failures.reset();
        for a in agents {
            s.agents.with_label_values(&[&a.state]).inc();
            s.agent_failures
                .with_label_values(&[&a.name])
                .set(i64::from(a.consecutive_failures));
        }
        s.last_pass.set(reading.now_ms / 1000);
    }

    /// The file's text.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.series.registry.gather(), &mut out)
            .expect("encoding to memory");
        String::from_utf8(out).expect("the text format is UTF-8")
    }
}

/// Every `settings.interval` until `stop`: read, apply, write. A missing
/// directory (no node exporter installed) is said once, as is a write
/// that keeps failing the same way; each pass tries again.
pub async fn run(
    shared: Arc<Shared>,
    agents: Arc<Agents>,
    settings: MetricsSettings,
    mut stop: watch::Receiver<bool>,
) {
    let store = shared.ops.store();
    let start = store.call(|s| Ok((s.last_event_id()?, s.now_ms()?))).await;
    let (cursor, started_ms) = match start {
        Ok(v) => v,
        Err(e) => {
            tracing::error!(
                "metrics: cannot read the task store ({e}); airlock.prom is not written"
            );
            return;
        }
    };
    let mut tally = Tally::new(cursor, started_ms);
    let mut last_error: Option<String> = None;
    let mut tick = tokio::time::interval(settings.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = async { drop(stop.wait_for(|s| *s).await) } => return,
        }
        let cursor = tally.cursor();
        let outcome = match store.call(move |s| read(s, cursor)).await {
            Ok(reading) => {
                tally.apply(reading, &agents.views());
                // Whole or not at all; its temporary file's name does not
                // end in .prom, so the collector never reads it.
                let path = settings.directory.join(FILE_NAME);
                airlock_config::write_durably(&path, tally.render().as_bytes(), 0o644, None)
                    .map_err(|e| format!("writing {}: {e}", path.display()))
            }
            Err(e) => Err(format!("reading the task store: {e}")),
        };
        match outcome {
            Ok(()) => {
                if last_error.take().is_some() {
                    tracing::info!(
                        "metrics: {}/{FILE_NAME} written again",
                        settings.directory.display()
                    );
                }
            }
            Err(e) if last_error.as_deref() != Some(e.as_str()) => {
                if settings.directory.is_dir() {
                    tracing::warn!(
                        "metrics: {e} (trying again every {} s)",
                        settings.interval.as_secs()
                    );
                } else {
                    // No node exporter here: not a fault.
                    tracing::info!(
                        "metrics: {} does not exist, so airlock.prom is not written (supervisor.metrics_directory; the supervisor's lockdown grants the directory only when it exists at start: restart the supervisor once it does)",
                        settings.directory.display()
                    );
                }
                last_error = Some(e);
            }
            Err(_) => {}
        }
    }
}

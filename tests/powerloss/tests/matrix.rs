//! The power-loss matrix: the whole suite on airlock-local with every
//! piece of its state on airlock's power-loss file system
//! ([`airlock_powerloss::PowerFs`], in its strictest mode unless
//! `AIRLOCK_POWERFS_MODE` names another) — the authority repositories,
//! the worker's journal and workspaces, the spool, the executor's work
//! root and tree cache, the supervisor's task database and event log, the
//! logs — cut off again and again: every airlock process SIGKILLed at a
//! chosen point, then the file system drops every write not yet synced,
//! every directory operation whose directory was not synced after it, and
//! tears unsynced writes at 4 KiB (a power loss: what SIGKILL alone never
//! does), then the suite starts again from what the disk kept.
//!
//! The points, each counted only when it is shown to have been reached:
//!
//! - **after each worker step** ([`worker_points`]): the worker is started
//!   with `AIRLOCK_FAULT_KILL_AFTER=<point>` and counts for the point only
//!   when it died of SIGKILL having logged `fault injection: SIGKILL at
//!   <point>` since that start. The points come from the worker's own
//!   table (`FaultPoint::all`, those an attempt that commits passes): every
//!   checkpoint phase, and the side-effect windows: `commit_written` (the
//!   commit's objects written, its ref not yet moved: mid-commit),
//!   `ref_updated` (the ref moved, `commit_done` not yet recorded: the
//!   ref update's other side), `spool_staged` (a request or source archive
//!   written to its temporary name, not yet renamed: mid-spool-publish)
//!   and `result_accepted` (the supervisor took the result, the journal
//!   not yet told);
//! - **after a submission was acknowledged**: SubmitTask returned, then
//!   the power goes at once;
//! - **mid-cache-fill**: the executor's tree cache is being filled (its
//!   `.fill-*` directory exists, before and still after the kill) — the
//!   tasks run on a repository of [`BULK_FILES`] files so a fill takes a
//!   while;
//! - **mid-layer-fill**: the repository's environment has a setup (no
//!   network) that writes `vendor/` from the task's `power/*.txt`, so
//!   every task fills a dependency layer of its own, and every task's
//!   verification needs it; the power goes while a layer's `.fill-*`
//!   directory exists;
//! - **right after `airlockctl repo add` returned**: the repository it
//!   imported and registered must be whole after the cut;
//! - **during concurrent submissions**: three clients submit at once and
//!   the power goes among their calls;
//! - **right after an acknowledged decision**: a task submitted and then
//!   cancelled (`CancelTask` answered), the power gone at once: it must be
//!   CANCELLED after the cut, with its decision audited;
//! - **at random instants**.
//!
//! The rest of the suite is killed right after the point was reached;
//! the bus daemon (a test fixture holding no state) keeps running.
//!
//! After every power loss, before anything starts again, the test reads
//! what the disk kept and requires: the task database and the worker's
//! journal pass their integrity checks; every submission acknowledged to
//! a client exists; every authority repository passes `git fsck --full`;
//! every SUCCEEDED task's commit exists, its agent/ branch points at it,
//! one commit on top of the base, with the file its plan wrote; no task
//! seen SUCCEEDED after an earlier cut has gone back (to RUNNING, to
//! another commit); every repository `repo add` acknowledged is registered
//! and whole; no result was accepted twice (the store's allowed
//! `TASK_RESULT_SUBMITTED` events). At the end the suite runs unharmed until every acknowledged
//! task is SUCCEEDED, FAILED or CANCELLED — a FAILED or CANCELLED task
//! with its code — and the same checks hold. The summary is printed from
//! the values asserted, before the assertions.

use airlock_journal::checkpoint::CheckpointJournal;
use airlock_local::client::{Supervisor, task_on_demo};
use airlock_local::{Suite, Tuning, start_with};
use airlock_powerloss::PowerFs;
use airlock_proto::Code;
use airlock_proto::task::{Decision, DecisionRequest, TaskState};
use airlock_taskdb::tasks::{EventOutcome, SqliteStore};
use airlock_testkit::{self as testkit, file_len, git_dir_or_empty, log_since};
use airlock_worker::fault::{Attempt, FaultPoint};
use rand::Rng;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

/// Power losses in a run, at least.
const MIN_LOSSES: usize = 100;
/// Power losses at each worker point, at least.
const MIN_PER_POINT: usize = 5;
/// Power losses right after an acknowledged submission, at least.
const MIN_AFTER_SUBMIT: usize = 8;
/// Power losses proven mid-cache-fill, at least.
const MIN_CACHE_FILL: usize = 4;
/// Power losses at random instants, at least.
const MIN_RANDOM: usize = 10;
/// Power losses right after an acknowledged `repo add`, at least.
const MIN_REPO_ADD: usize = 4;
/// Power losses among concurrent submissions, at least.
const MIN_CONCURRENT: usize = 4;
/// Power losses right after an acknowledged decision, at least.
const MIN_DECISION: usize = 4;
/// Clients submitting at once in a concurrent round, and how many tasks
/// each submits at most.
const CONCURRENT_CLIENTS: usize = 3;
const CONCURRENT_EACH: usize = 3;
/// Files in the repository the tasks change.
const BULK_FILES: usize = 150;
const MAX_ATTEMPTS: u32 = 8;
/// How long a worker armed with a point gets to reach it.
const PATIENCE: Duration = Duration::from_secs(15);
/// Every process of the suite, in the order they are started again.
const MEMBERS: &[&str] = &["supervisor", "egress", "executor", "worker", "retryd"];
/// Power losses proven mid-layer-fill, at least.
const MIN_LAYER_FILL: usize = 4;
/// Files a setup writes into its layer.
const LAYER_FILES: usize = 80;

/// The setup of the bulk repository's environment: `vendor/` made from
/// the task's `power/*.txt` (its inputs), so each task's layer differs.
/// One line: an argv's arguments are single lines.
fn layer_setup() -> String {
    format!(
        "import glob, os; os.makedirs('vendor', exist_ok=True); \
         names = repr(sorted(glob.glob('power/*.txt'))) * 40; \
         [open(f'vendor/dep{{i:03}}.txt', 'w').write(names) for i in range({LAYER_FILES})]; \
         open('vendor/marker', 'w').write('ok')"
    )
}

/// The bulk repository's environment: the setup above and nothing from
/// the network.
fn environment() -> airlock_config::Environment {
    airlock_config::Environment {
        paths: Vec::new(),
        programs: vec!["/usr/bin/python3".into()],
        variables: BTreeMap::from([("PATH".to_owned(), "/usr/bin:/bin".to_owned())]),
        setup: Some(airlock_config::Setup {
            commands: vec![vec!["/usr/bin/python3".into(), "-c".into(), layer_setup()]],
            inputs: vec!["power/*.txt".into()],
            outputs: vec!["vendor".into()],
            egress: Vec::new(),
            timeout_seconds: 120,
        }),
    }
}
/// How long the file system gets, after the kills, to release what they
/// held.
const SETTLE: Duration = Duration::from_millis(150);

/// The worker points an attempt that commits passes, from the worker's
/// own table (every checkpoint phase and the side-effect windows between
/// them).
fn worker_points() -> Vec<&'static str> {
    FaultPoint::all()
        .into_iter()
        .filter(|p| p.passed_by(Attempt::Commit))
        .map(FaultPoint::as_str)
        .collect()
}

/// `git fsck --full` of a bare repository any uid owns.
fn fsck(repo: &Path) -> std::process::Output {
    Command::new("git")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .args(["-c", "safe.directory=*", "--git-dir"])
        .arg(repo)
        .args(["fsck", "--full", "--no-dangling"])
        .output()
        .expect("git runs")
}

/// A source repository of `files` small files (on an ordinary file system).
fn bulk_source(dir: &Path, files: usize) {
    std::fs::create_dir_all(dir).unwrap();
    for i in 0..files {
        let sub = dir.join(format!("src/d{:02}", i % 40));
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::write(sub.join(format!("f{i:04}.txt")), format!("file {i}\n")).unwrap();
    }
    testkit::git(dir, &["init", "-q", "-b", "main"]);
    testkit::git(dir, &["add", "-A"]);
    testkit::git(dir, &["commit", "-q", "-m", "bulk"]);
}

fn submission(task: &str, base: &str) -> serde_json::Value {
    let mut s = task_on_demo(
        task,
        base,
        MAX_ATTEMPTS,
        json!({"operation": "write_file", "path": format!("power/{task}.txt"), "content": format!("{task}\n")}),
        // The task's layer must be in its view.
        json!([{"label": "check", "argv": ["/usr/bin/python3", "-c", "import os, sys; sys.exit(0 if os.path.isfile('vendor/marker') else 3)"], "timeout_seconds": 30}]),
    );
    s["binding"]["repository"] = json!("bulk");
    s
}

/// `open` retried for up to ten seconds (see [`Matrix::kill_all`]).
fn patiently<T, E: std::fmt::Display>(what: &str, mut open: impl FnMut() -> Result<T, E>) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match open() {
            Ok(v) => return v,
            Err(e) if Instant::now() >= deadline => panic!("{what}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Fills in progress (their `.fill-*` directories) in the executor's
/// cache `cache` (`trees` or `layers`).
fn fills(work: &Path, cache: &str) -> BTreeSet<String> {
    std::fs::read_dir(work.join(cache))
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(".fill-"))
                .collect()
        })
        .unwrap_or_default()
}

#[derive(Default, Debug)]
struct Losses {
    at_point: BTreeMap<&'static str, usize>,
    /// Armed workers that did not reach their point in time (the power
    /// went anyway, at whatever instant that was).
    point_not_reached: usize,
    after_submit: usize,
    cache_fill: usize,
    /// Cache-fill rounds where no fill was seen in flight.
    cache_fill_missed: usize,
    layer_fill: usize,
    /// Layer-fill rounds where no fill was seen in flight.
    layer_fill_missed: usize,
    after_repo_add: usize,
    concurrent: usize,
    after_decision: usize,
    random: usize,
}

impl Losses {
    fn total(&self) -> usize {
        self.at_point.values().sum::<usize>()
            + self.point_not_reached
            + self.after_submit
            + self.cache_fill
            + self.cache_fill_missed
            + self.layer_fill
            + self.layer_fill_missed
            + self.after_repo_add
            + self.concurrent
            + self.after_decision
            + self.random
    }

    fn at(&self, p: &str) -> usize {
        self.at_point.get(p).copied().unwrap_or(0)
    }

    fn done(&self, points: &[&'static str]) -> bool {
        points.iter().all(|p| self.at(p) >= MIN_PER_POINT)
            && self.after_submit >= MIN_AFTER_SUBMIT
            && self.cache_fill >= MIN_CACHE_FILL
            && self.layer_fill >= MIN_LAYER_FILL
            && self.random >= MIN_RANDOM
            && self.after_repo_add >= MIN_REPO_ADD
            && self.concurrent >= MIN_CONCURRENT
            && self.after_decision >= MIN_DECISION
            && self.total() >= MIN_LOSSES
    }
}

/// What the disk kept, read with every airlock process down.
#[derive(Default, Debug)]
struct Findings {
    missing_acknowledged: Vec<String>,
    fsck: Vec<String>,
    commits: Vec<String>,
    accepted_twice: Vec<String>,
    /// Tasks seen SUCCEEDED after an earlier cut that are no longer, or
    /// hold another commit.
    went_back: Vec<String>,
    /// Repositories `repo add` acknowledged that are not whole.
    repositories: Vec<String>,
    /// Acknowledged cancels not CANCELLED after the cut, or not audited.
    decisions: Vec<String>,
    succeeded: usize,
}

impl Findings {
    fn clean(&self) -> bool {
        self.missing_acknowledged.is_empty()
            && self.fsck.is_empty()
            && self.commits.is_empty()
            && self.accepted_twice.is_empty()
            && self.went_back.is_empty()
            && self.repositories.is_empty()
            && self.decisions.is_empty()
    }
}

struct Matrix {
    fs: PowerFs,
    suite: Suite,
    client: Supervisor,
    /// The source the bulk repository was imported from (an ordinary file
    /// system), imported again by the `repo add` rounds.
    source: PathBuf,
    repo: PathBuf,
    base: String,
    acknowledged: Vec<String>,
    /// Tasks the disk held SUCCEEDED at a check, with their commit: a
    /// later cut must not take one back.
    succeeded: BTreeMap<String, String>,
    /// Repositories `repo add` acknowledged.
    added: Vec<String>,
    /// Tasks whose cancel was acknowledged.
    cancelled: Vec<String>,
    next: usize,
    losses: Losses,
    rounds_checked: usize,
    /// Starts that failed on a database not yet openable and were
    /// retried, each with its member and reason.
    restarts_on_failure: Vec<String>,
    /// Where each member's log stood when it was last started.
    started_at: BTreeMap<&'static str, u64>,
    /// Members revived since the last power-on (`revived`).
    revivals: usize,
}

impl Matrix {
    fn log(&self, name: &str) -> PathBuf {
        self.suite.layout.logs().join(format!("{name}.log"))
    }

    fn start(&mut self, name: &'static str, env: &[(&str, &str)]) {
        let ids = self.suite.ids;
        let logs = self.suite.layout.logs();
        for starts in 1.. {
            let offset = file_len(&self.log(name));
            self.started_at.insert(name, offset);
            self.suite
                .fleet
                .restart(name, env, &ids, &logs)
                .unwrap_or_else(|e| panic!("starting {name}: {e}"));
            if name != "supervisor" {
                return;
            }
            // Up once it holds its name; given up on at once when it exits.
            let deadline = Instant::now() + Duration::from_secs(30);
            let up = loop {
                let up = airlock_local::demo::wait_for_name(
                    self.suite.bus.address(),
                    Duration::from_secs(1),
                );
                if up.is_ok()
                    || Instant::now() >= deadline
                    || self.suite.fleet.wait_exit(name, Duration::ZERO).is_some()
                {
                    break up;
                }
            };
            let text = log_since(&self.log(name), offset);
            match up {
                Ok(()) => return,
                // Its database not yet openable (see `settle`): systemd's
                // Restart=on-failure starts it again two seconds later, and
                // so does this harness, counting it.
                Err(_) if starts < 3 && text.contains("STORE_UNAVAILABLE") => {
                    self.note_restart(name, &text);
                    std::thread::sleep(Duration::from_secs(2));
                }
                Err(e) => panic!("the supervisor after a power loss: {e}\n{text}"),
            }
        }
    }

    fn note_restart(&mut self, name: &str, text: &str) {
        self.restarts_on_failure.push(format!(
            "{name}: {}",
            text.lines()
                .find(|l| l.contains("STORE_UNAVAILABLE"))
                .unwrap_or_default()
        ));
    }

    /// Whether `name` ended, since its last start, on a database that was
    /// not yet openable (see `kill_all`): under systemd,
    /// Restart=on-failure starts it again two seconds later; so does this
    /// harness, with `env`, at most three times per power-on, counting it.
    /// False when it is running, died of a signal, or failed otherwise.
    fn revived(&mut self, name: &'static str, status: ExitStatus, env: &[(&str, &str)]) -> bool {
        let text = log_since(
            &self.log(name),
            self.started_at.get(name).copied().unwrap_or(0),
        );
        if status.code().is_none()
            || self.revivals >= 3
            || !(text.contains("STORE_UNAVAILABLE") && text.contains("disk I/O error"))
        {
            return false;
        }
        self.revivals += 1;
        self.note_restart(name, &text);
        std::thread::sleep(Duration::from_secs(2));
        self.start(name, env);
        true
    }

    /// Starts every process again; the worker with `worker_env`.
    fn power_on(&mut self, worker_env: &[(&str, &str)]) {
        self.revivals = 0;
        for name in MEMBERS {
            let env = if *name == "worker" { worker_env } else { &[] };
            self.start(name, env);
        }
    }

    /// SIGKILL to every process, then the power loss.
    fn power_off(&mut self) {
        self.kill_all();
        self.fs.power_loss();
    }

    /// SIGKILL to every process. A closed file is released to FUSE
    /// asynchronously, and SQLite opening its database meanwhile has been
    /// seen to fail (`disk I/O error` opening the `-shm`, gone a moment
    /// later), so the harness lets the file system settle after the kills and after
    /// its own reads; a real power loss has no such survivors.
    fn kill_all(&mut self) {
        for name in MEMBERS {
            self.suite.fleet.kill(name);
        }
        std::thread::sleep(SETTLE);
    }

    /// The task database, opened by the harness (every process down).
    fn store(&self) -> SqliteStore {
        patiently("the task database after a power loss", || {
            SqliteStore::open(&self.suite.layout.tasks_db())
        })
    }

    /// Submits a task; true when the supervisor acknowledged it.
    fn submit(&mut self) -> bool {
        let task = format!("power-{:03}", self.next);
        self.next += 1;
        let s = submission(&task, &self.base);
        match self
            .client
            .patiently(Duration::from_secs(30), |c| c.submit_task(&s))
        {
            Ok(_) => {
                self.acknowledged.push(task);
                true
            }
            Err(e) => panic!("SubmitTask {task}: {e}"),
        }
    }

    fn open_tasks(&self) -> usize {
        let store = self.store();
        self.acknowledged
            .iter()
            .filter(|t| store.get(t).is_ok_and(|v| !v.state.is_terminal()))
            .count()
    }

    /// A worker armed with `point`: true when it died there.
    fn point_round(&mut self, point: &'static str) -> bool {
        let log = self.log("worker");
        let offset = file_len(&log);
        let env = [("AIRLOCK_FAULT_KILL_AFTER", point)];
        self.power_on(&env);
        let deadline = Instant::now() + PATIENCE;
        let reached = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.suite.fleet.wait_exit("worker", left) {
                Some(status) if status.signal() == Some(9) => {
                    let text = log_since(&log, offset);
                    assert!(
                        text.contains(&format!("fault injection: SIGKILL at {point} task ")),
                        "the worker died of SIGKILL without naming {point}:\n{text}"
                    );
                    break true;
                }
                Some(status) if self.revived("worker", status, &env) => {}
                Some(status) => panic!(
                    "the worker armed with {point} exited by itself ({status}):\n{}",
                    log_since(&log, offset)
                ),
                None => break false,
            }
        };
        self.power_off();
        if reached {
            *self.losses.at_point.entry(point).or_default() += 1;
        } else {
            self.losses.point_not_reached += 1;
        }
        reached
    }

    fn after_submit_round(&mut self) {
        self.power_on(&[]);
        self.submit();
        self.power_off();
        self.losses.after_submit += 1;
    }

    /// The power goes while the executor fills its cache `cache` (`trees`
    /// or `layers`); true when a fill was seen before and after the kill.
    fn fill_round(&mut self, cache: &str) -> bool {
        let work = self.suite.layout.path("exec/work");
        self.power_on(&[]);
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut before = fills(&work, cache);
        while before.is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
            before = fills(&work, cache);
        }
        for name in MEMBERS {
            self.suite.fleet.kill(name);
        }
        let after = fills(&work, cache);
        std::thread::sleep(SETTLE);
        self.fs.power_loss();
        !before.is_empty() && before.iter().any(|f| after.contains(f))
    }

    /// The power goes while the executor fills its tree cache.
    fn cache_fill_round(&mut self) {
        if self.fill_round("trees") {
            self.losses.cache_fill += 1;
        } else {
            self.losses.cache_fill_missed += 1;
        }
    }

    /// The power goes while the executor fills a dependency layer.
    fn layer_fill_round(&mut self) {
        if self.fill_round("layers") {
            self.losses.layer_fill += 1;
        } else {
            self.losses.layer_fill_missed += 1;
        }
    }

    /// `airlockctl repo add` imports and registers a repository while the
    /// suite runs; the power goes as soon as it returned.
    fn repo_add_round(&mut self) {
        let name = format!("added{:02}", self.added.len());
        self.power_on(&[]);
        let ctl = airlock_local::sibling("airlockctl").expect("airlockctl beside the test");
        let out = Command::new(ctl)
            .arg("repo")
            .arg("--config")
            .arg(self.suite.layout.config())
            .args(["add", &name, "--from"])
            .arg(&self.source)
            .arg("--no-reload")
            .output()
            .expect("airlockctl runs");
        assert!(
            out.status.success(),
            "repo add {name}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        self.added.push(name);
        self.power_off();
        self.losses.after_repo_add += 1;
    }

    /// Three clients submit at once; the power goes among their calls.
    /// What a client was told was accepted must survive; a call cut off
    /// unanswered promises nothing.
    fn concurrent_round(&mut self, rng: &mut impl Rng) {
        self.power_on(&[]);
        let address = self.suite.bus.address().to_owned();
        let first = self.next;
        self.next += CONCURRENT_CLIENTS * CONCURRENT_EACH;
        let clients: Vec<_> = (0..CONCURRENT_CLIENTS)
            .map(|c| {
                let address = address.clone();
                let base = self.base.clone();
                std::thread::spawn(move || {
                    let Ok(client) = Supervisor::connect(Some(&address)) else {
                        return Vec::new();
                    };
                    let mut acknowledged = Vec::new();
                    for i in 0..CONCURRENT_EACH {
                        let task = format!("power-{:03}", first + c * CONCURRENT_EACH + i);
                        match client.submit_task(&submission(&task, &base)) {
                            Ok(_) => acknowledged.push(task),
                            Err(_) => break,
                        }
                    }
                    acknowledged
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(rng.gen_range(5..150)));
        self.kill_all();
        for c in clients {
            self.acknowledged
                .extend(c.join().expect("a submitting client"));
        }
        self.fs.power_loss();
        self.losses.concurrent += 1;
    }

    /// A task submitted, then cancelled; the power goes as soon as the
    /// supervisor answered the cancel.
    fn decision_round(&mut self) {
        self.power_on(&[]);
        let task = format!("power-{:03}", self.next);
        self.next += 1;
        let s = submission(&task, &self.base);
        self.client
            .patiently(Duration::from_secs(30), |c| c.submit_task(&s))
            .unwrap_or_else(|e| panic!("SubmitTask {task}: {e}"));
        self.acknowledged.push(task.clone());
        // A fenced step (the worker moving the branch) refuses a cancel
        // for a moment, a task that moved on since it was read refuses a
        // decision about the old revision, and a task that already ended
        // cannot be cancelled: the decision is asked again about the task
        // as it is now, or the round counts nothing.
        let deadline = Instant::now() + Duration::from_secs(30);
        let cancelled = loop {
            let view = self
                .client
                .patiently(Duration::from_secs(30), |c| c.get_task(&task))
                .unwrap_or_else(|e| panic!("GetTask {task}: {e}"));
            if view.state.is_terminal() {
                break false;
            }
            let req = DecisionRequest::about(&view, Decision::Cancel, "power-loss matrix", None);
            match self.client.cancel_task(&req) {
                Ok(_) => break true,
                Err(e)
                    if matches!(e.code, Code::TASK_COMMITTING | Code::DECISION_CAS_MISMATCH)
                        && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) if e.code == Code::TASK_STATE_INVALID => break false,
                Err(e) => panic!("CancelTask {task}: {e}"),
            }
        };
        self.power_off();
        if cancelled {
            self.cancelled.push(task);
            self.losses.after_decision += 1;
        }
    }

    fn random_round(&mut self, rng: &mut impl Rng) {
        self.power_on(&[]);
        std::thread::sleep(Duration::from_millis(rng.gen_range(0..1000)));
        self.power_off();
        self.losses.random += 1;
    }

    /// Reads what the disk kept (every process down) and checks it.
    fn check(&mut self) -> Findings {
        self.rounds_checked += 1;
        let mut f = Findings::default();
        let store = self.store();
        store
            .integrity_check()
            .unwrap_or_else(|e| panic!("the task database after a power loss: {e}"));
        let journal_path = self.suite.layout.path("worker/checkpoints.sqlite3");
        if journal_path.exists() {
            patiently("the worker's journal after a power loss", || {
                CheckpointJournal::open(&journal_path).and_then(|j| j.integrity_check())
            });
        }
        for repo in [&self.repo, &self.suite.layout.repos().join("demo.git")] {
            let out = fsck(repo);
            if !out.status.success() || !out.stderr.is_empty() {
                f.fsck.push(format!(
                    "{}: {}{}",
                    repo.display(),
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
        let mut accepted: BTreeMap<String, usize> = BTreeMap::new();
        let mut after = 0;
        loop {
            let page = store.events(None, after, 1000).unwrap();
            let Some(last) = page.last() else { break };
            after = last.id;
            for e in &page {
                if e.action == "TASK_RESULT_SUBMITTED" && e.outcome == EventOutcome::Allowed {
                    *accepted
                        .entry(e.task_id.clone().unwrap_or_default())
                        .or_default() += 1;
                }
            }
        }
        f.accepted_twice = accepted
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(t, n)| format!("{t}: accepted {n} times"))
            .collect();
        for (task, commit) in &self.succeeded {
            match store.get(task) {
                Ok(v) if v.state == TaskState::Succeeded => {
                    let now = v
                        .result
                        .as_ref()
                        .and_then(|r| r["commit_oid"].as_str())
                        .unwrap_or_default();
                    if now != commit {
                        f.went_back
                            .push(format!("{task}: SUCCEEDED with {commit}, now with {now:?}"));
                    }
                }
                Ok(v) => f
                    .went_back
                    .push(format!("{task}: was SUCCEEDED, now {}", v.state.as_str())),
                Err(e) => f.went_back.push(format!("{task}: was SUCCEEDED, now {e}")),
            }
        }
        for name in &self.added {
            f.repositories.extend(self.added_problem(name));
        }
        for task in &self.cancelled {
            let state = store.get(task).map(|v| v.state);
            let audited =
                store.events(Some(task), 0, 1000).unwrap().iter().any(|e| {
                    e.action.starts_with("TASK_CANCEL") && e.outcome == EventOutcome::Allowed
                });
            if state.as_ref().ok() != Some(&TaskState::Cancelled) || !audited {
                f.decisions.push(format!(
                    "{task}: cancel acknowledged, now {state:?}, audited {audited}"
                ));
            }
        }
        for task in &self.acknowledged {
            let v = match store.get(task) {
                Ok(v) => v,
                Err(e) => {
                    f.missing_acknowledged.push(format!("{task}: {e}"));
                    continue;
                }
            };
            let branch = format!("refs/heads/agent/{task}");
            let head = git_dir_or_empty(&self.repo, &["rev-parse", "--verify", "--quiet", &branch]);
            if v.state != TaskState::Succeeded {
                continue;
            }
            f.succeeded += 1;
            let reported = v
                .result
                .as_ref()
                .and_then(|r| r["commit_oid"].as_str())
                .unwrap_or_default()
                .to_owned();
            self.succeeded
                .entry(task.clone())
                .or_insert_with(|| reported.clone());
            if head != reported {
                f.commits.push(format!(
                    "{task}: SUCCEEDED with commit {reported:?}, its branch at {head:?}"
                ));
                continue;
            }
            let count = git_dir_or_empty(
                &self.repo,
                &["rev-list", "--count", &format!("{}..{head}", self.base)],
            );
            if count != "1" {
                f.commits
                    .push(format!("{task}: {count:?} commits on top of the base"));
            }
            let content =
                git_dir_or_empty(&self.repo, &["show", &format!("{head}:power/{task}.txt")]);
            if content != *task {
                f.commits
                    .push(format!("{task}: its commit holds {content:?}"));
            }
        }
        drop(store);
        std::thread::sleep(SETTLE);
        f
    }

    /// What is wrong with the repository `repo add` acknowledged as
    /// `name`: its registration must parse and name it, its authority
    /// repository pass `git fsck --full` with `main` at the source's head.
    fn added_problem(&self, name: &str) -> Option<String> {
        let config = self.suite.layout.config();
        let registration = config
            .parent()
            .unwrap()
            .join(format!("repositories.d/{name}.toml"));
        let text = match std::fs::read_to_string(&registration) {
            Ok(t) => t,
            Err(e) => return Some(format!("{}: {e}", registration.display())),
        };
        if !text.contains(&format!("\"{name}\"")) {
            return Some(format!("{}: {text:?}", registration.display()));
        }
        let repo = self.suite.layout.repos().join(format!("{name}.git"));
        let out = fsck(&repo);
        if !out.status.success() || !out.stderr.is_empty() {
            return Some(format!(
                "{}: {}{}",
                repo.display(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let main = git_dir_or_empty(&repo, &["rev-parse", "refs/heads/main"]);
        (main != self.base).then(|| format!("{}: main at {main:?}", repo.display()))
    }
}

#[test]
fn power_loss_matrix_keeps_every_acknowledged_fact() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the power-loss matrix needs root (FUSE with allow_other, the suite's own uids): run it as root"
    );
    let src = tempfile::tempdir().unwrap();
    bulk_source(src.path(), BULK_FILES);
    let tuning = Tuning {
        lease_seconds: 10,
        parallel_tasks: 2,
        repositories: vec![("bulk".to_owned(), src.path().to_owned())],
        environments: vec![("bulk".to_owned(), environment())],
        ..Default::default()
    };
    // The first start on a fresh file system can meet the `disk I/O error`
    // that `kill_all` describes (a file the import just closed is released
    // to FUSE asynchronously; the daemon opening its database meanwhile
    // fails). Under systemd Restart=on-failure starts it again; here the
    // whole suite is started again on a new file system, at most twice more,
    // and only for that failure: no power loss has happened yet, so
    // nothing acknowledged is at stake, and each such start is counted
    // among the restarts on failure the matrix prints.
    let mut restarts_on_failure = Vec::new();
    let (fs, suite) = loop {
        let fs = airlock_powerloss::mount();
        match start_with(fs.path().join("state"), true, &tuning) {
            Ok(suite) => break (fs, suite),
            Err(e)
                if restarts_on_failure.len() < 2
                    && e.contains("STORE_UNAVAILABLE")
                    && e.contains("disk I/O error") =>
            {
                eprintln!("the first start failed, started again: {e}");
                restarts_on_failure.push(format!(
                    "first start: {}",
                    e.lines()
                        .find(|l| l.contains("STORE_UNAVAILABLE"))
                        .unwrap_or_default()
                ));
                drop(fs);
                std::thread::sleep(SETTLE);
            }
            Err(e) => panic!("starting the suite on {fs:?}: {e}"),
        }
    };
    let repo = suite.layout.repos().join("bulk.git");
    let base = git_dir_or_empty(&repo, &["rev-parse", "refs/heads/main"]);
    assert_eq!(base.len(), 40, "bulk.git has a main branch");
    let client = Supervisor::connect(Some(suite.bus.address())).expect("bus connection");
    let mut m = Matrix {
        fs,
        suite,
        client,
        source: src.path().to_owned(),
        repo,
        base,
        acknowledged: Vec::new(),
        succeeded: BTreeMap::new(),
        added: Vec::new(),
        cancelled: Vec::new(),
        next: 0,
        losses: Losses::default(),
        rounds_checked: 0,
        restarts_on_failure,
        started_at: BTreeMap::new(),
        revivals: 0,
    };
    for _ in 0..6 {
        m.submit();
    }
    // The first power loss: right after the suite came up with work queued.
    m.power_off();
    let first = m.check();
    assert!(first.clean(), "after the first power loss: {first:#?}");

    let points = worker_points();
    let mut rng = rand::thread_rng();
    let started = Instant::now();
    let mut problems = Vec::new();
    let mut round = 0usize;
    while !m.losses.done(&points) {
        assert!(
            started.elapsed() < Duration::from_secs(1200),
            "the power-loss rounds took too long: {:?}",
            m.losses
        );
        // Keep work queued, or the armed worker has nothing to stop in.
        if m.open_tasks() < 3 {
            m.power_on(&[]);
            for _ in 0..4 {
                m.submit();
            }
            m.kill_all();
        }
        match round % 6 {
            0..=2 => {
                let point = points
                    .iter()
                    .copied()
                    .min_by_key(|p| m.losses.at(p))
                    .unwrap();
                m.point_round(point);
            }
            3 => {
                if m.losses.after_decision < MIN_DECISION && round % 12 == 9 {
                    m.decision_round();
                } else {
                    m.after_submit_round();
                }
            }
            4 => {
                if m.losses.cache_fill < MIN_CACHE_FILL {
                    m.cache_fill_round();
                } else if m.losses.layer_fill < MIN_LAYER_FILL {
                    m.layer_fill_round();
                } else if m.losses.after_repo_add < MIN_REPO_ADD {
                    m.repo_add_round();
                } else {
                    m.random_round(&mut rng);
                }
            }
            _ => {
                if m.losses.concurrent < MIN_CONCURRENT {
                    m.concurrent_round(&mut rng);
                } else {
                    m.random_round(&mut rng);
                }
            }
        }
        let f = m.check();
        eprintln!(
            "power loss {} ({:.1?} in): {:?}",
            m.losses.total(),
            started.elapsed(),
            m.losses
        );
        if !f.clean() {
            problems.push(format!("after power loss {}: {f:#?}", m.losses.total()));
        }
        round += 1;
    }
    let loss_phase = started.elapsed();

    // Then the suite runs unharmed until every acknowledged task ends.
    m.power_on(&[]);
    let deadline = Instant::now() + Duration::from_secs(300);
    let finals = loop {
        for name in MEMBERS {
            if let Some(status) = m.suite.fleet.wait_exit(name, Duration::ZERO) {
                m.revived(name, status, &[]);
            }
        }
        if let Err(e) = m.suite.fleet.check_alive() {
            panic!("{e}");
        }
        let views: BTreeMap<String, _> = m
            .acknowledged
            .iter()
            .map(|t| {
                let v = m
                    .client
                    .patiently(Duration::from_secs(30), |c| c.get_task(t))
                    .unwrap_or_else(|e| panic!("GetTask {t}: {e}"));
                (t.clone(), v)
            })
            .collect();
        if views.values().all(|v| v.state.is_terminal()) {
            break views;
        }
        assert!(
            Instant::now() < deadline,
            "tasks not terminal 300 s after the last power loss: {:?}",
            views
                .iter()
                .filter(|(_, v)| !v.state.is_terminal())
                .map(|(t, v)| (t.clone(), v.state.as_str()))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    m.kill_all();
    let last = m.check();
    let mut by_state: BTreeMap<&str, usize> = BTreeMap::new();
    let mut without_reason = Vec::new();
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    let store = m.store();
    for (task, v) in &finals {
        *by_state.entry(v.state.as_str()).or_default() += 1;
        let code = match v.state {
            // Its result's code, or the sweeper's reason (a lease that
            // expired with no attempt left).
            TaskState::Failed => v
                .result
                .as_ref()
                .and_then(|r| r["failure_code"].as_str())
                .or_else(|| v.verification.as_ref().and_then(|r| r["reason"].as_str()))
                .map(str::to_owned),
            TaskState::Cancelled => store
                .events(Some(task), 0, 1000)
                .unwrap()
                .iter()
                .find(|e| e.action.starts_with("TASK_CANCEL"))
                .map(|e| e.action.clone()),
            _ => Some(String::new()),
        };
        match code {
            None => without_reason.push(format!("{task}: {} without its reason", v.state.as_str())),
            Some(c) if !c.is_empty() => *reasons.entry(c).or_default() += 1,
            Some(_) => {}
        }
    }
    drop(store);
    let l = &m.losses;
    println!(
        "power-loss matrix ({:?} mode): {} power losses in {:.0?}: worker at points {:?} (+{} armed, not reached: lost at that instant), {} right after an acknowledged submission, {} among concurrent submissions, {} right after an acknowledged repo add, {} right after an acknowledged cancel, {} mid-cache-fill (+{} with no fill seen), {} mid-layer-fill (+{} with no fill seen), {} at random instants; every one followed by the checks ({} rounds checked)",
        m.fs.mode(),
        l.total(),
        loss_phase,
        l.at_point,
        l.point_not_reached,
        l.after_submit,
        l.concurrent,
        l.after_repo_add,
        l.after_decision,
        l.cache_fill,
        l.cache_fill_missed,
        l.layer_fill,
        l.layer_fill_missed,
        l.random,
        m.rounds_checked,
    );
    println!(
        "power-loss matrix: what the cuts dropped: {:?}",
        m.fs.totals()
    );
    println!(
        "power-loss matrix: starts that failed on a database not yet openable and were retried (Restart=on-failure): {} {:?}",
        m.restarts_on_failure.len(),
        m.restarts_on_failure
    );
    println!(
        "power-loss matrix: {} acknowledged submissions, {} lost; final states {by_state:?} (reasons {reasons:?}); {} SUCCEEDED with their commit, {} commit problems, {} SUCCEEDED gone back, {} results accepted twice, {} fsck failures, {} of {} added repositories not whole, {} rounds with a problem; integrity ok",
        m.acknowledged.len(),
        last.missing_acknowledged.len(),
        last.succeeded,
        last.commits.len(),
        last.went_back.len(),
        last.accepted_twice.len(),
        last.fsck.len(),
        last.repositories.len(),
        m.added.len(),
        problems.len(),
    );
    for p in &points {
        assert!(
            l.at(p) >= MIN_PER_POINT,
            "only {} power losses at {p}",
            l.at(p)
        );
    }
    assert!(l.after_submit >= MIN_AFTER_SUBMIT);
    assert!(
        l.cache_fill >= MIN_CACHE_FILL,
        "only {} power losses proven mid-cache-fill",
        l.cache_fill
    );
    assert!(l.random >= MIN_RANDOM);
    assert!(
        l.layer_fill >= MIN_LAYER_FILL,
        "only {} power losses proven mid-layer-fill",
        l.layer_fill
    );
    assert!(l.after_repo_add >= MIN_REPO_ADD);
    assert!(l.concurrent >= MIN_CONCURRENT);
    assert!(l.after_decision >= MIN_DECISION);
    let totals = m.fs.totals();
    assert!(
        totals.files_reverted + totals.dir_ops_dropped + totals.writes_torn > 0,
        "the cuts dropped nothing: the matrix proved nothing ({totals:?})"
    );
    assert!(l.total() >= MIN_LOSSES);
    assert!(problems.is_empty(), "{problems:#?}");
    assert!(last.clean(), "after the last run: {last:#?}");
    assert!(without_reason.is_empty(), "{without_reason:#?}");
    assert_eq!(
        by_state.get("SUCCEEDED").copied().unwrap_or(0),
        last.succeeded
    );
    assert_eq!(finals.len(), m.acknowledged.len());
}

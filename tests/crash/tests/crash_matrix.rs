//! Crash matrix (DESIGN.md §3): the whole suite on real processes, killed
//! with SIGKILL over and over, then left to finish. The worker binary is
//! built with the `fault-injection` feature (this crate's dependency turns
//! it on), so it can SIGKILL itself at a named point.
//!
//! What is killed, and how each kind is shown to have landed where claimed:
//!
//! - **The worker at each fault point** ([`fault_points`]): right after each
//!   checkpoint phase, and inside the two side-effect windows —
//!   `ref_updated` (the CAS moved the agent/ branch, `commit_done` not yet
//!   appended) and `result_accepted` (SubmitResult returned OK,
//!   `result_submitted` not yet appended). The worker is restarted with
//!   `AIRLOCK_FAULT_KILL_AFTER=<point>`; a kill counts for that point only
//!   when the worker died of SIGKILL *and* its log, since that restart,
//!   holds `fault injection: SIGKILL at <point> task <task>` (written just
//!   before it raises the signal). A point not reached in time is counted
//!   apart, never for the point. For `ref_updated` the harness also sees
//!   the task's branch exist right after the kill, and for
//!   `result_accepted` it sees the supervisor holding the task's result:
//!   the side effect really happened before the checkpoint that records
//!   it. Every point must land [`MIN_PER_POINT`] times.
//! - **The worker at random instants.**
//! - **The executor mid-command**: every third task's verification command
//!   writes `crash-start` (a nonce) into its workspace, sleeps, then writes
//!   `crash-end`. The workspace's new files land in the executor's
//!   per-request directory (`exec/work/<request>/upper`, the overlay's
//!   upper directory in the minimal root; `exec/work/<request>/src` in the
//!   host view): the sandbox may write there and the harness (the same
//!   uid, or root) may read it; the result carries only the change set. The stdout of a killed run is lost with it, so files are
//!   the evidence. Before the kill the harness waits for a command with
//!   `crash-start` and no `crash-end`, kills the executor, and reads the
//!   directory again: the same nonce and still no `crash-end` means the
//!   command started before the kill and had not ended at it (the sandbox
//!   writes `crash-end` before it exits, and nothing removes files between
//!   the executor's death and the check). Only such kills count as
//!   mid-command; at least [`MIN_MID_COMMAND`] must.
//! - **The supervisor.**
//!
//! Afterwards, asserted:
//!
//! - every task is SUCCEEDED: nothing here makes a plan fail (the command
//!   is `/bin/true` or a short sleep, and a killed attempt resumes or is
//!   retried within [`MAX_ATTEMPTS`]), so any other end is a bug and the
//!   failure message names each such task with its state, attempt and
//!   failure code;
//! - every SUCCEEDED task's branch holds exactly one commit on top of the
//!   base, at the OID its result reports; every other task has no branch;
//! - the tasks with an accepted result (`TASK_RESULT_SUBMITTED` allowed, in
//!   the store's events) are exactly the SUCCEEDED tasks, each accepted
//!   once;
//! - stale workspaces: the kill phase ends with a `ref_updated` kill, which
//!   leaves its workspace behind; *before the last worker starts* the
//!   harness lists the workspace root and must find it (the check can see a
//!   stale workspace), and once the last worker has finished every task and
//!   stopped, the root must be empty;
//! - both databases pass their integrity checks.
//!
//! The summary printed at the end is built from the same values the
//! assertions check, and printed before them.
//!
//! A second test here, on its own stack, kills the worker after a
//! *permanent failure* is recorded (issue 14): an error injected at one of
//! three steps (`AIRLOCK_FAULT_ERROR_AT`), then a SIGKILL at
//! `result_pending`, `result_accepted` or `result_submitted`; each task
//! must end FAILED with that code in its one attempt, accepted once, no
//! lease expired, no branch, one `result_submitted` in the journal
//! (`a_kill_after_a_permanent_failure_is_recorded_ends_the_task_with_its_code_once`).

use airlock_crash_matrix::{Stack, file_len, git, in_flight, log_since, marked_sleep};
use airlock_journal::checkpoint::CheckpointJournal;
use airlock_local::Tuning;
use airlock_local::client::task_on_demo;
use airlock_proto::bundle::request_id_for;
use airlock_proto::task::{TaskState, TaskView};
use airlock_taskdb::tasks::{EventOutcome, SqliteStore};
use airlock_worker::fault::Attempt;
use rand::Rng;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where the worker kills itself, in the order an attempt passes them:
/// every point a committing attempt passes, from the worker's own table
/// ([`airlock_worker::fault::FaultPoint::all`]), so a new phase is killed
/// at without a change here.
fn fault_points() -> Vec<&'static str> {
    airlock_crash_matrix::fault_points(Attempt::Commit)
}
/// Kills that must land at each fault point.
const MIN_PER_POINT: usize = 10;
/// Executor kills that must be proven mid-command.
const MIN_MID_COMMAND: usize = 10;
/// Supervisor kills that must land.
const MIN_SUPERVISOR: usize = 10;
/// Kills in all.
const MIN_KILLS: usize = 200;
const FIRST_BATCH: usize = 50;
const MAX_ATTEMPTS: u32 = 6;
/// How long a worker armed with a fault point gets to reach it.
const FAULT_PATIENCE: Duration = Duration::from_secs(8);
fn submission(i: usize, base: &str) -> Value {
    let task = format!("crash-{i:03}");
    // Every third task sleeps in its verification command, leaving the
    // start and end markers the executor kills are checked against.
    let argv = if i % 3 == 0 {
        marked_sleep(0.5)
    } else {
        json!(["/bin/true"])
    };
    task_on_demo(
        &task,
        base,
        MAX_ATTEMPTS,
        json!({"operation": "write_file", "path": format!("crash/{task}.txt"), "content": format!("{task}\n")}),
        json!([{"label": "check", "argv": argv, "timeout_seconds": 30}]),
    )
}

#[derive(Default, Debug)]
struct Kills {
    /// Worker kills proven at each fault point.
    at_point: BTreeMap<&'static str, usize>,
    /// Workers armed with a point that did not reach it in time, killed by
    /// the harness at whatever instant that was.
    point_not_reached: BTreeMap<&'static str, usize>,
    worker_random: usize,
    /// Executor kills proven mid-command.
    executor_mid_command: usize,
    /// Executor kills with no command proven in flight.
    executor_other: usize,
    supervisor: usize,
}

impl Kills {
    fn total(&self) -> usize {
        self.at_point.values().sum::<usize>()
            + self.point_not_reached.values().sum::<usize>()
            + self.worker_random
            + self.executor_mid_command
            + self.executor_other
            + self.supervisor
    }

    fn at(&self, point: &str) -> usize {
        self.at_point.get(point).copied().unwrap_or(0)
    }

    fn done(&self) -> bool {
        fault_points().iter().all(|p| self.at(p) >= MIN_PER_POINT)
            && self.executor_mid_command >= MIN_MID_COMMAND
            && self.supervisor >= MIN_SUPERVISOR
            && self.total() >= MIN_KILLS
    }

    /// The fault point furthest below its minimum (ties: the earliest).
    fn neediest_point(&self) -> &'static str {
        let points = fault_points();
        points
            .iter()
            .copied()
            .min_by_key(|p| self.at(p))
            .unwrap_or(points[0])
    }
}

fn states(client: &Stack, tasks: &[String]) -> BTreeMap<String, TaskView> {
    tasks.iter().map(|t| (t.clone(), client.get(t))).collect()
}

fn list_dir(path: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(path)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The shared stack plus what the kill rounds count.
struct Harness {
    stack: Stack,
    kills: Kills,
}

impl Harness {
    fn restart(&mut self, name: &str, env: &[(&str, &str)]) {
        self.stack.restart(name, env);
    }

    /// Restarts the worker armed with `point` and waits for it to kill
    /// itself there. Returns the task it died in when it did; otherwise
    /// the harness kills it and counts the point as not reached. Leaves
    /// the worker dead.
    fn fault_round(&mut self, point: &'static str) -> Option<String> {
        let log = self.stack.worker_log();
        let offset = file_len(&log);
        self.restart("worker", &[("AIRLOCK_FAULT_KILL_AFTER", point)]);
        match self.stack.suite.fleet.wait_exit("worker", FAULT_PATIENCE) {
            Some(status) if status.signal() == Some(9) => {
                let text = log_since(&log, offset);
                let needle = format!("fault injection: SIGKILL at {point} task ");
                let task = text
                    .lines()
                    .find_map(|l| l.split_once(&needle).map(|(_, t)| t.trim().to_owned()))
                    .unwrap_or_else(|| {
                        panic!("the worker died of SIGKILL without naming {point}:\n{text}")
                    });
                match point {
                    "ref_updated" => {
                        let head = git(
                            &self.stack.repo(),
                            &[
                                "rev-parse",
                                "--verify",
                                "--quiet",
                                &format!("refs/heads/agent/{task}"),
                            ],
                        );
                        assert!(
                            !head.is_empty(),
                            "{task}: killed at ref_updated but its branch does not exist"
                        );
                    }
                    "result_accepted" => {
                        let v = self.stack.get(&task);
                        assert!(
                            v.result.as_ref().is_some_and(Value::is_object),
                            "{task}: killed at result_accepted but the supervisor holds no result: {v:?}"
                        );
                    }
                    _ => {}
                }
                *self.kills.at_point.entry(point).or_default() += 1;
                Some(task)
            }
            Some(status) => panic!(
                "worker armed with {point} exited by itself ({status}):\n{}",
                log_since(&log, offset)
            ),
            None => {
                if self.stack.suite.fleet.kill("worker") {
                    *self.kills.point_not_reached.entry(point).or_default() += 1;
                }
                None
            }
        }
    }

    /// Kills the executor, preferably while a command runs; true when the
    /// kill is proven mid-command.
    fn executor_round(&mut self) -> bool {
        let work = self.stack.suite.layout.path("exec/work");
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut before = in_flight(&work);
        while before.is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
            before = in_flight(&work);
        }
        let landed = self.stack.suite.fleet.kill("executor");
        let after: BTreeSet<(PathBuf, String)> = in_flight(&work).into_iter().collect();
        let proven = landed && before.iter().any(|m| after.contains(m));
        if proven {
            self.kills.executor_mid_command += 1;
        } else if landed {
            self.kills.executor_other += 1;
        }
        self.restart("executor", &[]);
        proven
    }
}

#[test]
fn crash_matrix_converges_without_duplicate_side_effects() {
    let stack = Stack::with(
        "crash",
        Tuning {
            lease_seconds: 10,
            parallel_tasks: 2,
            ..Default::default()
        },
    );
    let repo = stack.repo();
    let base = stack.base.clone();
    let mut h = Harness {
        stack,
        kills: Kills::default(),
    };
    let mut tasks = Vec::new();
    let submit = |client: &Stack, n: usize, tasks: &mut Vec<String>| {
        let start = tasks.len();
        for i in start..start + n {
            let s = submission(i, &base);
            client.submit(&s);
            tasks.push(format!("crash-{i:03}"));
        }
    };
    // Tasks not yet seen terminal; terminal states are final here.
    let open = |client: &Stack, tasks: &[String], finished: &mut BTreeSet<String>| {
        for t in tasks {
            if !finished.contains(t) && client.get(t).state.is_terminal() {
                finished.insert(t.clone());
            }
        }
        tasks.len() - finished.len()
    };
    let mut finished = BTreeSet::new();
    submit(&h.stack, FIRST_BATCH, &mut tasks);

    let mut rng = rand::thread_rng();
    let started = Instant::now();
    let mut round = 0usize;
    while !h.kills.done() {
        assert!(
            started.elapsed() < Duration::from_secs(900),
            "kill phase took too long (is the worker built with the fault-injection feature?): {:?}",
            h.kills
        );
        // Keep work queued, or the armed workers have nothing to die in.
        if round % 8 == 0 && open(&h.stack, &tasks, &mut finished) < 10 {
            submit(&h.stack, 10, &mut tasks);
        }
        match round % 8 {
            0..=3 => {
                let point = h.kills.neediest_point();
                h.fault_round(point);
                h.restart("worker", &[]);
            }
            4 | 5 => {
                std::thread::sleep(Duration::from_millis(rng.gen_range(20..500)));
                if h.stack.suite.fleet.kill("worker") {
                    h.kills.worker_random += 1;
                }
                h.restart("worker", &[]);
            }
            6 => {
                h.executor_round();
            }
            _ => {
                std::thread::sleep(Duration::from_millis(rng.gen_range(0..300)));
                if h.stack.suite.fleet.kill("supervisor") {
                    h.kills.supervisor += 1;
                }
                h.restart("supervisor", &[]);
                airlock_local::demo::wait_for_name(
                    h.stack.suite.bus.address(),
                    Duration::from_secs(20),
                )
                .unwrap();
            }
        }
        round += 1;
    }
    // The last kill: inside the ref_updated window, which leaves that
    // attempt's workspace behind. Tasks are added if too few are open.
    if open(&h.stack, &tasks, &mut finished) < 4 {
        submit(&h.stack, 4, &mut tasks);
    }
    let last_task = (0..5)
        .find_map(|_| h.fault_round("ref_updated"))
        .expect("the final ref_updated kill never landed");
    let kill_phase = started.elapsed();
    // Before the last worker starts: the killed attempt's workspace is there.
    let last = h.stack.get(&last_task);
    let last_workspace = format!(
        "task-{}",
        request_id_for(&last_task, last.attempt, &last.execution_digest)
    );
    let workspace_root = h.stack.suite.layout.path("worker/workspaces");
    let stale_before = list_dir(&workspace_root);
    h.restart("worker", &[]);

    // Let everything finish, unharmed.
    let deadline = Instant::now() + Duration::from_secs(300);
    let finals = loop {
        if let Err(e) = h.stack.suite.fleet.check_alive() {
            panic!("{e}");
        }
        let s = states(&h.stack, &tasks);
        if s.values().all(|v| v.state.is_terminal()) {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "tasks not terminal after 300 s: {:?}",
            s.iter()
                .filter(|(_, v)| !v.state.is_terminal())
                .map(|(k, v)| (k.clone(), v.state.as_str()))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    // SIGTERM: the worker finishes what it holds and exits; nothing starts
    // after this, so what is left now stays.
    h.stack.suite.fleet.stop(Duration::from_secs(10));
    let stale_after = list_dir(&workspace_root);

    // Outcomes.
    let mut by_state: BTreeMap<String, usize> = BTreeMap::new();
    for v in finals.values() {
        *by_state.entry(v.state.as_str().to_owned()).or_default() += 1;
    }
    let not_succeeded: Vec<String> = finals
        .iter()
        .filter(|(_, v)| v.state != TaskState::Succeeded)
        .map(|(task, v)| {
            format!(
                "{task}: {} at attempt {}, failure {:?}",
                v.state.as_str(),
                v.attempt,
                v.result.as_ref().map(|r| r["failure_code"].clone())
            )
        })
        .collect();
    let succeeded: BTreeSet<String> = finals
        .iter()
        .filter(|(_, v)| v.state == TaskState::Succeeded)
        .map(|(t, _)| t.clone())
        .collect();
    // Commits: one per SUCCEEDED task at its reported OID, none elsewhere.
    let mut commits = 0;
    let mut commit_errors = Vec::new();
    for (task, v) in &finals {
        let branch = format!("refs/heads/agent/{task}");
        let head = git(&repo, &["rev-parse", "--verify", "--quiet", &branch]);
        let count: usize = if head.is_empty() {
            0
        } else {
            git(&repo, &["rev-list", "--count", &format!("{base}..{head}")])
                .parse()
                .unwrap()
        };
        commits += count;
        if succeeded.contains(task) {
            if count != 1 {
                commit_errors.push(format!("{task}: SUCCEEDED with {count} commits"));
            }
            let reported = v.result.as_ref().and_then(|r| r["commit_oid"].as_str());
            if reported != Some(head.as_str()) {
                commit_errors.push(format!(
                    "{task}: branch at {head:?}, result reports {reported:?}"
                ));
            }
        } else if !head.is_empty() {
            commit_errors.push(format!("{task}: {} but has a branch", v.state.as_str()));
        }
    }
    // Accepted results, from the store's events.
    let store = SqliteStore::open(&h.stack.suite.layout.tasks_db()).unwrap();
    store.integrity_check().unwrap();
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
    let accepted_tasks: BTreeSet<String> = accepted.keys().cloned().collect();
    let accepted_twice: Vec<_> = accepted.iter().filter(|(_, n)| **n > 1).collect();
    let journal =
        CheckpointJournal::open(&h.stack.suite.layout.path("worker/checkpoints.sqlite3")).unwrap();
    journal.integrity_check().unwrap();

    let k = &h.kills;
    println!(
        "crash matrix: {} kills in {:.0?}: worker at fault points {:?} (+{:?} not reached, killed anyway), {} worker at random instants, {} executor mid-command (+{} not proven mid-command), {} supervisor",
        k.total(),
        kill_phase,
        k.at_point,
        k.point_not_reached,
        k.worker_random,
        k.executor_mid_command,
        k.executor_other,
        k.supervisor,
    );
    println!(
        "crash matrix: {} tasks, final states {by_state:?}; {commits} commits on agent/ branches; {} tasks with an accepted result, {} accepted twice; stale workspaces before the last worker {:?}, after it {:?}; integrity ok",
        tasks.len(),
        accepted_tasks.len(),
        accepted_twice.len(),
        stale_before,
        stale_after,
    );

    for point in fault_points() {
        assert!(
            k.at(point) >= MIN_PER_POINT,
            "only {} kills at {point}",
            k.at(point)
        );
    }
    assert!(
        k.executor_mid_command >= MIN_MID_COMMAND,
        "only {} executor kills proven mid-command",
        k.executor_mid_command
    );
    assert!(k.supervisor >= MIN_SUPERVISOR);
    assert!(k.total() >= MIN_KILLS);
    assert!(
        not_succeeded.is_empty(),
        "tasks that did not succeed: {not_succeeded:#?}"
    );
    assert!(commit_errors.is_empty(), "{commit_errors:#?}");
    assert_eq!(commits, succeeded.len());
    assert!(
        accepted_twice.is_empty(),
        "accepted twice: {accepted_twice:?}"
    );
    assert_eq!(
        accepted_tasks, succeeded,
        "accepted results are not the SUCCEEDED tasks"
    );
    assert!(
        stale_before.contains(&last_workspace),
        "{last_workspace} of {last_task}, killed at ref_updated, is not among {stale_before:?}"
    );
    assert!(
        stale_after.is_empty(),
        "stale workspaces after the last worker: {stale_after:?}"
    );
    drop(h);
}

/// Issue 14's path "a kill after a permanent failure is recorded": the
/// worker meets a permanent error (injected with `AIRLOCK_FAULT_ERROR_AT`,
/// standing in for a git or executor failure at that step), records the
/// failed result, and is SIGKILLed right after it was recorded
/// (`result_pending`), after the supervisor accepted it (`result_accepted`,
/// `result_submitted` not yet appended) or after `result_submitted`. The
/// restarted worker resumes from its journal: every task ends FAILED in its
/// one attempt with the injected code, its result accepted exactly once,
/// never `LEASE_EXPIRED`, no branch, one `result_submitted` in the journal.
#[test]
fn a_kill_after_a_permanent_failure_is_recorded_ends_the_task_with_its_code_once() {
    use airlock_proto::Code;
    use airlock_proto::checkpoint::Phase;
    let stack = Stack::start("crash-perm");
    let logs = stack.logs();
    let repo = stack.repo();
    let base = stack.base.clone();
    let mut h = Harness {
        stack,
        kills: Kills::default(),
    };
    // (the step after this phase fails with this code, the kill point)
    let errors = [
        ("claimed", Code::GIT_FAILED),
        ("workspace_prepared", Code::CHANGED_PATHS_MISMATCH),
        ("verification_passed", Code::REF_CAS_MISMATCH),
    ];
    let points = ["result_pending", "result_accepted", "result_submitted"];
    let mut cases = Vec::new();
    for (i, ((phase, code), point)) in errors
        .iter()
        .flat_map(|e| points.iter().map(move |p| (*e, *p)))
        .enumerate()
    {
        let task = format!("perm-{i:02}");
        let log = logs.join("worker.log");
        let offset = file_len(&log);
        let armed = format!("{phase}:{}", code.as_str());
        h.restart(
            "worker",
            &[
                ("AIRLOCK_FAULT_ERROR_AT", &armed),
                ("AIRLOCK_FAULT_KILL_AFTER", point),
            ],
        );
        let mut s = submission(i * 3 + 1, &base);
        s["binding"]["task_id"] = json!(task);
        s["binding"]["job_id"] = json!(format!("job-{task}"));
        s["binding"]["target_branch"] = json!(format!("agent/{task}"));
        s["binding"]["idempotency_key"] = json!(format!("submit-{task}"));
        s["plan"]["task_id"] = json!(task);
        s["plan"]["job_id"] = json!(format!("job-{task}"));
        s["plan"]["idempotency_key"] = json!(format!("plan-{task}"));
        s["max_attempts"] = json!(1);
        h.stack.submit(&s);
        let status = h
            .stack
            .suite
            .fleet
            .wait_exit("worker", Duration::from_secs(20));
        let text = log_since(&log, offset);
        assert_eq!(
            status.and_then(|s| s.signal()),
            Some(9),
            "{task}: the worker was to die at {point}:\n{text}"
        );
        assert!(
            text.contains(&format!(
                "fault injection: {} after {phase} task {task}",
                code.as_str()
            )) && text.contains(&format!("fault injection: SIGKILL at {point} task {task}")),
            "{task}: the error and the kill landed where armed:\n{text}"
        );
        *h.kills.at_point.entry(point).or_default() += 1;
        if point != "result_pending" {
            assert!(
                h.stack.get(&task).result.is_some(),
                "{task}: killed at {point}, the supervisor holds the result"
            );
        }
        // A worker without faults resumes the attempt from its journal;
        // the task settles before the next case arms another worker.
        let resumed = file_len(&log);
        h.restart("worker", &[]);
        let deadline = Instant::now() + Duration::from_secs(30);
        // Settled: terminal, and the worker's journal at result_submitted
        // (already there when the kill came after it).
        let recorded = format!("checkpoint task={task} attempt=1 phase=\"result_submitted\"");
        while !(h.stack.get(&task).state.is_terminal()
            && (point == "result_submitted" || log_since(&log, resumed).contains(&recorded)))
        {
            assert!(
                Instant::now() < deadline,
                "{task}: not terminal 30 s after the restart:\n{}",
                airlock_local::fleet::tail(&log, 20)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        cases.push((task, code, point));
    }
    // Every task settles without another kill.
    let deadline = Instant::now() + Duration::from_secs(60);
    let finals = loop {
        let tasks: Vec<String> = cases.iter().map(|c| c.0.clone()).collect();
        let s = states(&h.stack, &tasks);
        if s.values().all(|v| v.state.is_terminal()) {
            break s;
        }
        assert!(Instant::now() < deadline, "not terminal: {s:?}");
        std::thread::sleep(Duration::from_millis(200));
    };
    h.stack.suite.fleet.stop(Duration::from_secs(10));
    let store = SqliteStore::open(&h.stack.suite.layout.tasks_db()).unwrap();
    store.integrity_check().unwrap();
    let journal =
        CheckpointJournal::open(&h.stack.suite.layout.path("worker/checkpoints.sqlite3")).unwrap();
    journal.integrity_check().unwrap();
    let (mut lost, mut duplicated, mut problems) = (0, 0, Vec::new());
    for (task, code, point) in &cases {
        let v = &finals[task];
        let failure = v.result.as_ref().and_then(|r| r["failure_code"].as_str());
        if (v.state, v.attempt, failure) != (TaskState::Failed, 1, Some(code.as_str())) {
            lost += 1;
            problems.push(format!(
                "{task} ({point}): {} at attempt {}, failure {failure:?}",
                v.state.as_str(),
                v.attempt
            ));
        }
        let events = store.events(Some(task), 0, 1000).unwrap();
        let accepted = events
            .iter()
            .filter(|e| e.action == "TASK_RESULT_SUBMITTED" && e.outcome == EventOutcome::Allowed)
            .count();
        if accepted != 1 {
            duplicated += usize::from(accepted > 1);
            problems.push(format!(
                "{task} ({point}): result accepted {accepted} times"
            ));
        }
        if events.iter().any(|e| e.action == "TASK_LEASE_EXPIRED") {
            problems.push(format!("{task} ({point}): its lease expired"));
        }
        let submitted = journal
            .history(task)
            .unwrap()
            .iter()
            .filter(|c| c.phase == Phase::ResultSubmitted)
            .count();
        if submitted != 1 {
            problems.push(format!(
                "{task} ({point}): {submitted} result_submitted checkpoints"
            ));
        }
        let branch = git(
            &repo,
            &[
                "rev-parse",
                "--verify",
                "--quiet",
                &format!("refs/heads/agent/{task}"),
            ],
        );
        if !branch.is_empty() {
            duplicated += 1;
            problems.push(format!("{task} ({point}): a failed task has a branch"));
        }
    }
    println!(
        "crash matrix, permanent failures: {} kills after the failure was recorded {:?}; {} tasks, {lost} lost, {duplicated} duplicated",
        h.kills.total(),
        h.kills.at_point,
        cases.len(),
    );
    assert!(problems.is_empty(), "{problems:#?}");
    assert_eq!((lost, duplicated), (0, 0));
    drop(h);
}

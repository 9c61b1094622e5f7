//! Crash matrix (DESIGN.md §3): the whole suite on real processes, killed
//! with SIGKILL over and over — the worker right after each checkpoint
//! phase and at random instants, the executor mid-command, the supervisor
//! — then left to finish. Afterwards:
//!
//! - every task is in a terminal state;
//! - every agent/ branch holds at most one commit on top of its base, and a
//!   SUCCEEDED task's branch holds exactly its reported commit;
//! - no attempt's result was accepted twice (from the store's events);
//! - no stale worker workspace remains;
//! - both databases pass their integrity checks.

use airlock_local::client::{TasksClient, task_on_demo};
use airlock_local::{Suite, Tuning, start_with};
use airlock_store::checkpoint::CheckpointJournal;
use airlock_store::tasks::{EventOutcome, TaskStore};
use rand::Rng;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const PHASES: &[&str] = &[
    "claimed",
    "workspace_prepared",
    "verification_passed",
    "commit_done",
    "result_pending",
    "result_submitted",
];
const MIN_KILLS: usize = 200;
const FIRST_BATCH: usize = 50;

fn git(repo: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .args(["-c", "safe.directory=*", "--git-dir"])
        .arg(repo)
        .args(args)
        .output()
        .expect("git runs");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn submission(i: usize, base: &str) -> Value {
    let task = format!("crash-{i:03}");
    // Every fifth task sleeps in its verification command, so executor
    // kills land mid-command.
    let argv = if i % 5 == 0 {
        json!(["/usr/bin/python3", "-c", "import time; time.sleep(0.3)"])
    } else {
        json!(["/bin/true"])
    };
    task_on_demo(
        &task,
        base,
        6,
        json!({"operation": "write_file", "path": format!("crash/{task}.txt"), "content": format!("{task}\n")}),
        json!([{"label": "check", "argv": argv, "timeout_seconds": 30}]),
    )
}

/// The suite's task client, patient while the supervisor restarts.
struct Client(TasksClient);

impl Client {
    fn new(address: &str) -> Client {
        Client(TasksClient::connect(address).expect("bus connection"))
    }

    fn call_retry(&self, method: &str, arg: &str) -> Value {
        self.0
            .call_retry(method, arg, Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("{method}: {e}"))
    }
}

#[derive(Default, Debug)]
struct Kills {
    worker_at_phase: BTreeMap<&'static str, usize>,
    worker_random: usize,
    executor: usize,
    supervisor: usize,
}

impl Kills {
    fn total(&self) -> usize {
        self.worker_at_phase.values().sum::<usize>()
            + self.worker_random
            + self.executor
            + self.supervisor
    }
}

fn terminal(state: &str) -> bool {
    matches!(state, "SUCCEEDED" | "FAILED" | "CANCELLED")
}

fn states(client: &Client, tasks: &[String]) -> BTreeMap<String, Value> {
    tasks
        .iter()
        .map(|t| (t.clone(), client.call_retry("GetTask", t)))
        .collect()
}

#[test]
fn crash_matrix_converges_without_duplicate_side_effects() {
    let state = std::env::temp_dir().join(format!("airlock-crash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&state);
    let mut suite: Suite = start_with(
        state.clone(),
        true,
        &Tuning {
            lease_seconds: 10,
            parallel_tasks: 2,
        },
    )
    .unwrap_or_else(|e| panic!("starting the suite: {e}"));
    let logs = suite.layout.logs();
    let repo = suite.layout.repos().join("demo.git");
    let base = git(&repo, &["rev-parse", "refs/heads/main"]);
    let client = Client::new(suite.bus.address());
    let mut tasks = Vec::new();
    let submit = |n: usize, tasks: &mut Vec<String>| {
        let start = tasks.len();
        for i in start..start + n {
            let s = submission(i, &base);
            client.call_retry("SubmitTask", &s.to_string());
            tasks.push(format!("crash-{i:03}"));
        }
    };
    submit(FIRST_BATCH, &mut tasks);

    let mut kills = Kills::default();
    let mut rng = rand::thread_rng();
    let started = Instant::now();
    let mut round = 0usize;
    while kills.total() < MIN_KILLS {
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "kill phase took too long: {kills:?}"
        );
        if round % 25 == 24 {
            let open = states(&client, &tasks)
                .values()
                .filter(|v| !terminal(v["state"].as_str().unwrap_or("")))
                .count();
            if open < 10 {
                submit(10, &mut tasks);
            }
        }
        match round % 8 {
            0..=3 => {
                let phase = PHASES[(round / 8 * 4 + round % 8) % PHASES.len()];
                suite
                    .fleet
                    .restart(
                        "worker",
                        &[("AIRLOCK_FAULT_KILL_AFTER", phase)],
                        &suite.ids,
                        &logs,
                    )
                    .unwrap();
                match suite.fleet.wait_exit("worker", Duration::from_secs(5)) {
                    Some(status) if status.signal() == Some(9) => {
                        *kills.worker_at_phase.entry(phase).or_default() += 1
                    }
                    Some(status) => panic!(
                        "worker exited by itself ({status}):\n{}",
                        airlock_local::fleet::tail(&logs.join("worker.log"), 30)
                    ),
                    None => {
                        if suite.fleet.kill("worker") {
                            kills.worker_random += 1;
                        }
                    }
                }
                suite
                    .fleet
                    .restart("worker", &[], &suite.ids, &logs)
                    .unwrap();
            }
            4 | 5 => {
                std::thread::sleep(Duration::from_millis(rng.gen_range(20..500)));
                if suite.fleet.kill("worker") {
                    kills.worker_random += 1;
                }
                suite
                    .fleet
                    .restart("worker", &[], &suite.ids, &logs)
                    .unwrap();
            }
            6 => {
                std::thread::sleep(Duration::from_millis(rng.gen_range(0..400)));
                if suite.fleet.kill("executor") {
                    kills.executor += 1;
                }
                suite
                    .fleet
                    .restart("executor", &[], &suite.ids, &logs)
                    .unwrap();
            }
            _ => {
                std::thread::sleep(Duration::from_millis(rng.gen_range(0..300)));
                if suite.fleet.kill("supervisor") {
                    kills.supervisor += 1;
                }
                suite
                    .fleet
                    .restart("supervisor", &[], &suite.ids, &logs)
                    .unwrap();
                airlock_local::demo::wait_for_name(suite.bus.address(), Duration::from_secs(20))
                    .unwrap();
            }
        }
        round += 1;
    }
    let kill_phase = started.elapsed();

    // Let everything finish, unharmed.
    let deadline = Instant::now() + Duration::from_secs(300);
    let finals = loop {
        if let Err(e) = suite.fleet.check_alive() {
            panic!("{e}");
        }
        let s = states(&client, &tasks);
        if s.values()
            .all(|v| terminal(v["state"].as_str().unwrap_or("")))
        {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "tasks not terminal after 300 s: {:?}",
            s.iter()
                .filter(|(_, v)| !terminal(v["state"].as_str().unwrap_or("")))
                .map(|(k, v)| (k.clone(), v["state"].clone()))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    // The worker finishes each attempt's bookkeeping right after its result.
    std::thread::sleep(Duration::from_secs(2));
    let workspaces: Vec<_> = std::fs::read_dir(suite.layout.path("worker/workspaces"))
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .collect();
    suite.fleet.stop(Duration::from_secs(10));

    // 1. Every task terminal; count outcomes.
    let mut by_state: BTreeMap<String, usize> = BTreeMap::new();
    for v in finals.values() {
        *by_state
            .entry(v["state"].as_str().unwrap_or("?").to_owned())
            .or_default() += 1;
    }
    // 2. At most one commit per branch; SUCCEEDED ⇒ exactly the reported one.
    let mut commits = 0;
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
        assert!(count <= 1, "{task}: {count} commits on its branch");
        commits += count;
        if v["state"] == "SUCCEEDED" {
            assert_eq!(count, 1, "{task} SUCCEEDED without its commit");
            assert_eq!(
                v["result"]["commit_oid"].as_str(),
                Some(head.as_str()),
                "{task}: branch is not at the reported commit"
            );
        }
    }
    // 3. No attempt's result accepted twice.
    let store = TaskStore::open(&suite.layout.tasks_db()).unwrap();
    store.integrity_check().unwrap();
    let mut accepted: BTreeMap<(String, i64), usize> = BTreeMap::new();
    let mut after = 0;
    loop {
        let page = store.events(None, after, 1000).unwrap();
        let Some(last) = page.last() else { break };
        after = last.id;
        for e in &page {
            if e.action == "TASK_RESULT_SUBMITTED" && e.outcome == EventOutcome::Allowed {
                let attempt = e.payload["attempt"].as_i64().unwrap_or(-1);
                *accepted
                    .entry((e.task_id.clone().unwrap_or_default(), attempt))
                    .or_default() += 1;
            }
        }
    }
    let dup: Vec<_> = accepted.iter().filter(|(_, n)| **n > 1).collect();
    assert!(dup.is_empty(), "results accepted twice: {dup:?}");
    // 4. No stale workspace.
    assert!(workspaces.is_empty(), "stale workspaces: {workspaces:?}");
    // 5. The journal is intact.
    let journal =
        CheckpointJournal::open(&suite.layout.path("worker/checkpoints.sqlite3")).unwrap();
    journal.integrity_check().unwrap();

    println!(
        "crash matrix: {} kills in {:.0?} ({} worker at a checkpoint boundary {:?}, {} worker at random instants, {} executor, {} supervisor) over {} tasks",
        kills.total(),
        kill_phase,
        kills.worker_at_phase.values().sum::<usize>(),
        kills.worker_at_phase,
        kills.worker_random,
        kills.executor,
        kills.supervisor,
        tasks.len()
    );
    println!(
        "crash matrix: final states {by_state:?}; {commits} commits on {} branches; {} results accepted, none twice; integrity ok; no stale workspace",
        tasks.len(),
        accepted.len()
    );
    assert!(tasks.len() >= FIRST_BATCH && kills.total() >= MIN_KILLS);
    let _ = std::fs::remove_dir_all(&state);
}

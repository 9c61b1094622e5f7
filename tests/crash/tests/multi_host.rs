//! The crash matrix across hosts (docs/postgresql.md): three full stacks on
//! this machine — each in its own network namespace with its own private
//! bus, supervisor, worker, executor and retry API — sharing one
//! PostgreSQL task store (a throwaway cluster from Debian's postgresql,
//! reached through its UNIX socket) and one directory of authority
//! repositories. While tasks submitted on every host run:
//!
//! - supervisors and workers are SIGKILLed on different stacks, round
//!   after round, and restarted;
//! - one worker is armed to SIGSTOP itself right after it recorded a
//!   result as pending (`result_pending`: committed, not yet reported) and
//!   stays stopped past its lease, until another host has taken the task
//!   over; then it gets SIGCONT, reports its result, and the result must be
//!   refused (the store's denied `TASK_RESULT_SUBMITTED` event for that
//!   task and attempt, with a lease or state code, is the evidence);
//! - PostgreSQL itself is killed (SIGQUIT: no checkpoint, crash recovery on
//!   restart) and restarted mid-run.
//!
//! Then everything finishes unharmed, and the test requires: every task
//! SUCCEEDED (0 lost), every accepted result accepted once (0 accepted
//! twice) and exactly the SUCCEEDED tasks accepted, one commit per task's
//! branch at the OID its result reports, and the store's integrity check.
//! The summary lines are printed from the values asserted.
//!
//! Needs root (network namespaces, the stacks' own uids); elsewhere it says
//! so and passes without running.

use airlock_crash_matrix::git;
use airlock_local::client::{Supervisor, task_on_demo};
use airlock_local::layout::Ids;
use airlock_local::{SharedStore, Suite, Tuning, start_with};
use airlock_pgcluster::Cluster;
use airlock_proto::Code;
use airlock_proto::task::TaskView;
use airlock_taskdb::tasks::{EventOutcome, PgLocation, PgStore};
use rand::Rng;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const STACKS: usize = 3;
/// Tasks submitted at the start, and before each round.
const FIRST_BATCH: usize = 12;
const BATCH: usize = 6;
const MAX_ATTEMPTS: u32 = 8;
/// The shortest lease the configuration allows.
const LEASE_SECONDS: u32 = 10;
/// Kill rounds (each kills one supervisor and one worker).
const ROUNDS: usize = 6;

fn run(cmd: &[&str]) {
    let out = Command::new(cmd[0]).args(&cmd[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A named network namespace with `lo` up, deleted when dropped.
struct Netns(String);

impl Netns {
    fn new(name: String) -> Netns {
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        run(&["ip", "netns", "add", &name]);
        run(&[
            "ip", "netns", "exec", &name, "ip", "link", "set", "lo", "up",
        ]);
        Netns(name)
    }

    fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.0)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

fn submission(i: usize, base: &str) -> Value {
    let task = format!("mh-{i:03}");
    // Every fourth task works for a while, so kills land mid-attempt.
    let argv = if i % 4 == 0 {
        json!(["/usr/bin/python3", "-c", "import time; time.sleep(1.5)"])
    } else {
        json!(["/bin/true"])
    };
    task_on_demo(
        &task,
        base,
        MAX_ATTEMPTS,
        json!({"operation": "write_file", "path": format!("mh/{task}.txt"), "content": format!("{task}\n")}),
        json!([{"label": "check", "argv": argv, "timeout_seconds": 30}]),
    )
}

fn terminal(state: &str) -> bool {
    matches!(state, "SUCCEEDED" | "FAILED" | "CANCELLED")
}

struct Stack {
    suite: Suite,
    client: Supervisor,
    logs: PathBuf,
}

/// Repeats `call` while this host's supervisor restarts or the database is
/// away (both are expected here), for up to a minute.
fn patient<T>(what: &str, mut call: impl FnMut() -> Result<T, airlock_proto::Error>) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match call() {
            Ok(v) => return v,
            Err(e)
                if matches!(e.code, Code::RUNTIME_UNAVAILABLE | Code::STORE_UNAVAILABLE)
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(100))
            }
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

impl Stack {
    fn get(&self, task: &str) -> TaskView {
        patient(&format!("GetTask {task}"), || self.client.get_task(task))
    }

    fn submit(&self, submission: &Value) {
        patient("SubmitTask", || self.client.submit_task(submission));
    }

    fn restart(&mut self, name: &str, env: &[(&str, &str)]) {
        let ids = self.suite.ids;
        self.suite
            .fleet
            .restart(name, env, &ids, &self.logs)
            .unwrap_or_else(|e| panic!("restarting {name}: {e}"));
    }
}

fn log_since(path: &Path, offset: usize) -> String {
    let bytes = std::fs::read(path).unwrap_or_default();
    String::from_utf8_lossy(&bytes[offset.min(bytes.len())..]).into_owned()
}

fn file_len(path: &Path) -> usize {
    std::fs::metadata(path).map_or(0, |m| m.len() as usize)
}

/// Every event of the store, paged.
fn all_events(store: &PgStore) -> Vec<airlock_taskdb::tasks::Event> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let page = store.events(None, after, 1000).expect("events");
        let Some(last) = page.last() else { break };
        after = last.id;
        out.extend(page);
    }
    out
}

#[derive(Debug, Default)]
struct Kills {
    supervisor: [usize; STACKS],
    worker: [usize; STACKS],
    worker_stopped_past_lease: usize,
    postgres_restarts: usize,
}

#[test]
fn three_hosts_share_one_postgresql_queue_under_faults() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!(
            "SKIPPED: the multi-host simulation needs root (network namespaces, the stacks' uids)"
        );
        return;
    }
    let started = Instant::now();
    let root = std::env::temp_dir().join(format!("airlock-multihost-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();

    // One PostgreSQL, its schema migrated by its owner.
    let mut cluster = Cluster::start().expect("a throwaway PostgreSQL cluster");
    let db = cluster.create_store_database("airlock").unwrap();
    let owner = PgLocation::parse(&db.owner_url)
        .unwrap()
        .with_password(db.owner_password.as_bytes());
    airlock_taskdb::tasks::postgres::migrate_at(&owner).unwrap();
    let runtime = PgLocation::parse(&db.url)
        .unwrap()
        .with_password(db.password.as_bytes());

    // One directory of authority repositories, the worker's on every host.
    let ids = Ids::for_caller().unwrap();
    let repos = root.join("shared-repos");
    std::fs::create_dir_all(&repos).unwrap();
    airlock_local::layout::chown_tree(&repos, ids.worker, &ids).unwrap();

    let netns: Vec<Netns> = (0..STACKS)
        .map(|n| Netns::new(format!("airlock-mh-{}-{n}", std::process::id())))
        .collect();
    let mut stacks: Vec<Stack> = netns
        .iter()
        .enumerate()
        .map(|(n, ns)| {
            let suite = start_with(
                root.join(format!("host-{n}")),
                true,
                &Tuning {
                    lease_seconds: LEASE_SECONDS,
                    parallel_tasks: 2,
                    shared_store: Some(SharedStore {
                        url: db.url.clone(),
                        password: db.password.clone(),
                    }),
                    repos: Some(repos.clone()),
                    netns: Some(ns.path()),
                    ..Tuning::default()
                },
            )
            .unwrap_or_else(|e| panic!("starting host {n}: {e}"));
            let client = Supervisor::connect(Some(suite.bus.address())).expect("bus");
            let logs = suite.layout.logs();
            Stack {
                suite,
                client,
                logs,
            }
        })
        .collect();
    let repo = repos.join("demo.git");
    let base = git(&repo, &["rev-parse", "refs/heads/main"]);

    // Tasks submitted on every host, round robin, a batch before each
    // round so that every fault lands on a busy system.
    let mut tasks: Vec<String> = Vec::new();
    let submit = |stacks: &[Stack], tasks: &mut Vec<String>, n: usize| {
        for _ in 0..n {
            let i = tasks.len();
            stacks[i % STACKS].submit(&submission(i, &base));
            tasks.push(format!("mh-{i:03}"));
        }
    };
    submit(&stacks, &mut tasks, FIRST_BATCH);

    let mut kills = Kills::default();
    let mut rng = rand::thread_rng();
    let mut late: Option<(usize, String, u64)> = None;
    for round in 0..ROUNDS {
        submit(&stacks, &mut tasks, BATCH);
        // A supervisor on one host ...
        let s = round % STACKS;
        std::thread::sleep(Duration::from_millis(rng.gen_range(50..600)));
        if stacks[s].suite.fleet.kill("supervisor") {
            kills.supervisor[s] += 1;
        }
        stacks[s].restart("supervisor", &[]);
        airlock_local::demo::wait_for_name(stacks[s].suite.bus.address(), Duration::from_secs(30))
            .unwrap();
        // ... and a worker on another.
        let w = (round + 1) % STACKS;
        std::thread::sleep(Duration::from_millis(rng.gen_range(50..600)));
        if stacks[w].suite.fleet.kill("worker") {
            kills.worker[w] += 1;
        }
        stacks[w].restart("worker", &[]);

        if round == 1 {
            // PostgreSQL dies and comes back while every host works.
            cluster.crash();
            std::thread::sleep(Duration::from_millis(1500));
            cluster.start_again().expect("PostgreSQL restarts");
            kills.postgres_restarts += 1;
        }

        if round == 0 {
            // A worker paused past its lease, holding a committed result.
            let h = (round + 2) % STACKS;
            let log = stacks[h].logs.join("worker.log");
            let offset = file_len(&log);
            stacks[h].restart("worker", &[("AIRLOCK_FAULT_STOP_AT", "result_pending")]);
            let deadline = Instant::now() + Duration::from_secs(60);
            // The other hosts may have claimed every queued task by the
            // time the armed worker polls: one more task every 2 s gives it
            // work to claim (each is followed to its end like the others).
            let mut next_feed = Instant::now() + Duration::from_secs(2);
            let task = loop {
                if Instant::now() >= next_feed {
                    submit(&stacks, &mut tasks, 1);
                    next_feed = Instant::now() + Duration::from_secs(2);
                }
                let text = log_since(&log, offset);
                if let Some(t) = text.lines().find_map(|l| {
                    l.split_once("fault injection: SIGSTOP at result_pending task ")
                        .map(|(_, t)| t.trim().to_owned())
                }) {
                    break t;
                }
                assert!(
                    Instant::now() < deadline,
                    "the armed worker never reached result_pending:\n{text}"
                );
                std::thread::sleep(Duration::from_millis(50));
            };
            // The stop holds the whole process (its renewals included).
            let pid = stacks[h].suite.fleet.pid("worker").unwrap();
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
            assert!(stat.contains(") T "), "worker not stopped: {stat}");
            let attempt = u64::from(stacks[h].get(&task).attempt);
            // Wait until another host has taken the task over: swept after
            // the lease, claimed again as a later attempt (or finished).
            let deadline = Instant::now() + Duration::from_secs(90);
            loop {
                let v = stacks[(h + 1) % STACKS].get(&task);
                if u64::from(v.attempt) > attempt || v.state.as_str() == "SUCCEEDED" {
                    break;
                }
                assert!(Instant::now() < deadline, "{task} never moved on: {v:?}");
                std::thread::sleep(Duration::from_millis(200));
            }
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGCONT,
            )
            .unwrap();
            kills.worker_stopped_past_lease += 1;
            late = Some((h, task, attempt));
        }
    }

    // Everything finishes, unharmed.
    let deadline = Instant::now() + Duration::from_secs(240);
    let finals: BTreeMap<String, Value> = loop {
        for s in stacks.iter_mut() {
            if let Err(e) = s.suite.fleet.check_alive() {
                panic!("{e}");
            }
        }
        let states: BTreeMap<String, Value> = tasks
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let v = stacks[i % STACKS].get(t);
                (
                    t.clone(),
                    serde_json::to_value(v).expect("a task view as JSON"),
                )
            })
            .collect();
        if states
            .values()
            .all(|v| terminal(v["state"].as_str().unwrap_or("")))
        {
            break states;
        }
        assert!(
            Instant::now() < deadline,
            "tasks not terminal after 240 s: {:?}",
            states
                .iter()
                .filter(|(_, v)| !terminal(v["state"].as_str().unwrap_or("")))
                .map(|(k, v)| (k.clone(), v["state"].clone(), v["attempt"].clone()))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    for s in stacks.iter_mut() {
        s.suite.fleet.stop(Duration::from_secs(10));
    }

    // Outcomes.
    let mut by_state: BTreeMap<String, usize> = BTreeMap::new();
    for v in finals.values() {
        *by_state
            .entry(v["state"].as_str().unwrap_or("?").to_owned())
            .or_default() += 1;
    }
    let succeeded: BTreeSet<String> = finals
        .iter()
        .filter(|(_, v)| v["state"] == "SUCCEEDED")
        .map(|(t, _)| t.clone())
        .collect();
    let mut commits_per_branch: BTreeMap<usize, usize> = BTreeMap::new();
    let mut commit_errors = Vec::new();
    for (task, v) in &finals {
        let head = git(
            &repo,
            &[
                "rev-parse",
                "--verify",
                "--quiet",
                &format!("refs/heads/agent/{task}"),
            ],
        );
        let count: usize = if head.is_empty() {
            0
        } else {
            git(&repo, &["rev-list", "--count", &format!("{base}..{head}")])
                .parse()
                .unwrap()
        };
        *commits_per_branch.entry(count).or_default() += 1;
        if count != 1 {
            commit_errors.push(format!("{task}: {count} commits on its branch"));
        }
        if v["result"]["commit_oid"].as_str() != Some(head.as_str()) {
            commit_errors.push(format!(
                "{task}: branch at {head:?}, result reports {}",
                v["result"]["commit_oid"]
            ));
        }
    }
    let store = PgStore::open(&runtime).unwrap();
    store.integrity_check().unwrap();
    let events = all_events(&store);
    let mut accepted: BTreeMap<String, usize> = BTreeMap::new();
    let mut history: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut claims = 0usize;
    for e in &events {
        let task = e.task_id.clone().unwrap_or_default();
        history.entry(task.clone()).or_default().push(format!(
            "{} {} {} {}",
            e.action,
            e.outcome.as_str(),
            e.code.map(|c| c.as_str()).unwrap_or(""),
            e.payload
        ));
        if e.outcome != EventOutcome::Allowed {
            continue;
        }
        match e.action.as_str() {
            "TASK_RESULT_SUBMITTED" => *accepted.entry(task).or_default() += 1,
            "TASK_CLAIMED" => claims += 1,
            _ => {}
        }
    }
    for (task, v) in &finals {
        if v["state"] != "SUCCEEDED" || accepted.get(task).copied().unwrap_or(0) != 1 {
            eprintln!(
                "{task}: {} {}\n  {}",
                v["state"],
                v["result"],
                history[task].join("\n  ")
            );
        }
    }
    let accepted_twice: Vec<_> = accepted.iter().filter(|(_, n)| **n > 1).collect();
    let accepted_tasks: BTreeSet<String> = accepted.keys().cloned().collect();
    // The late result: refused, by the store, for the stopped attempt.
    let (late_host, late_task, late_attempt) = late.expect("the stop round ran");
    let refusal = events.iter().find(|e| {
        e.outcome == EventOutcome::Denied
            && e.action == "TASK_RESULT_SUBMITTED"
            && e.task_id.as_deref() == Some(late_task.as_str())
            && e.payload["detail"].as_str().is_some_and(|d| !d.is_empty())
    });
    let late_log = std::fs::read_to_string(stacks[late_host].logs.join("worker.log")).unwrap();
    let resumed = late_log.contains(&format!(
        "fault injection: resumed after SIGSTOP at result_pending task {late_task}"
    ));
    let reconciled = late_log
        .lines()
        .any(|l| l.contains("reconciliation required") && l.contains(late_task.as_str()));

    println!(
        "multi-host matrix: {STACKS} hosts, {} tasks, {} claims, in {:.0?}; kills: supervisor per host {:?}, worker per host {:?}, {} worker stopped past its lease, {} PostgreSQL restarts",
        tasks.len(),
        claims,
        started.elapsed(),
        kills.supervisor,
        kills.worker,
        kills.worker_stopped_past_lease,
        kills.postgres_restarts,
    );
    println!(
        "multi-host matrix: final states {by_state:?}; tasks by commits on their branch {commits_per_branch:?}; {} results accepted ({} tasks), {} accepted twice; late result of {late_task} attempt {late_attempt} after SIGCONT: {}",
        accepted.values().sum::<usize>(),
        accepted_tasks.len(),
        accepted_twice.len(),
        match refusal {
            Some(e) => format!("refused with {}", e.code.map(|c| c.as_str()).unwrap_or("?")),
            None => "NOT refused".to_owned(),
        }
    );

    assert_eq!(
        by_state.get("SUCCEEDED"),
        Some(&tasks.len()),
        "0 lost: {by_state:?}"
    );
    assert!(commit_errors.is_empty(), "{commit_errors:#?}");
    assert!(
        accepted_twice.is_empty(),
        "accepted twice: {accepted_twice:?}"
    );
    assert_eq!(accepted_tasks, succeeded);
    assert!(resumed, "the stopped worker never resumed:\n{late_log}");
    assert!(
        reconciled,
        "the resumed worker did not record its refused result:\n{late_log}"
    );
    let refusal = refusal.expect("the late result was refused by the store");
    assert!(
        matches!(
            refusal.code.map(|c| c.as_str()),
            Some("LEASE_EXPIRED" | "LEASE_EPOCH_STALE" | "TASK_STATE_INVALID")
        ),
        "{refusal:?}"
    );
    assert!(kills.supervisor.iter().sum::<usize>() >= ROUNDS - 1);
    assert!(kills.worker.iter().sum::<usize>() >= ROUNDS - 1);
    assert_eq!(kills.postgres_restarts, 1);
    drop(stacks);
    drop(netns);
    drop(cluster);
    let _ = std::fs::remove_dir_all(&root);
}

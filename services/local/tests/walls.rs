//! Walls between jobs (issue 44, item 2): each job's commands run in a
//! cgroup of its own below the executor's (here the cgroup v1 hierarchies
//! airlock-local delegates, as systemd's `Delegate=yes` does on an
//! installed system), with a memory and a process limit. Hostile
//! neighbours run beside a normal task: a fork bomb and a memory hog each
//! end with their own code and their figures in the evidence, the normal
//! task SUCCEEDED, and the supervisor, the worker and the executor keep
//! their PIDs.
//!
//! Real processes and real cgroups; needs root and the v1 memory and pids
//! hierarchies (this machine's, and CI's).

use airlock_local::client::{Supervisor, task_on_demo};
use airlock_local::{Tuning, start_with};
use airlock_proto::task::TaskView;
use airlock_testkit::git_dir_or_empty;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const MEMORY_MIB: u32 = 192;
const PROCESSES: u32 = 48;

fn wall(view: &TaskView) -> Value {
    view.result
        .as_ref()
        .map(|r| r["verification"][0]["wall"].clone())
        .unwrap_or(Value::Null)
}

fn failure_code(view: &TaskView) -> String {
    view.result
        .as_ref()
        .and_then(|r| r["failure_code"].as_str())
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn a_fork_bomb_and_a_memory_hog_end_with_their_codes_beside_a_normal_task() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root (cgroups, airlock-local's own uids): run it as root"
    );
    let state = tempfile::tempdir().unwrap();
    let mut suite = start_with(
        state.path().join("state"),
        true,
        &Tuning {
            parallel_tasks: 3,
            parallel_jobs: 3,
            job_walls: Some((MEMORY_MIB, PROCESSES)),
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("starting airlock-local: {e}"));
    assert!(
        suite.walls.is_some(),
        "airlock-local delegated no cgroup: the v1 memory and pids hierarchies are needed"
    );
    let pids: Vec<Option<u32>> = ["supervisor", "worker", "executor"]
        .iter()
        .map(|n| suite.fleet.pid(n))
        .collect();
    let client = Supervisor::connect(Some(suite.bus.address())).unwrap();
    let base = git_dir_or_empty(
        &suite.layout.repos().join("demo.git"),
        &["rev-parse", "refs/heads/main"],
    );
    let submit = |task: &str, argv: Value| {
        let s = task_on_demo(
            task,
            &base,
            1,
            json!({"operation": "write_file", "path": format!("{task}.txt"), "content": "x\n"}),
            json!([{"label": "check", "argv": argv, "timeout_seconds": 30}]),
        );
        client
            .patiently(Duration::from_secs(30), |c| c.submit_task(&s))
            .unwrap_or_else(|e| panic!("SubmitTask {task}: {e}"));
    };
    // Forks until refused, then keeps trying: only its timeout or its
    // children's failures end it.
    submit(
        "bomb",
        json!([
            "/usr/bin/python3",
            "-c",
            "import os, time\nkids = 0\nfor _ in range(10000):\n    try:\n        if os.fork() == 0:\n            time.sleep(30)\n            os._exit(0)\n        kids += 1\n    except OSError:\n        break\nraise SystemExit(f'forked {kids} then refused')"
        ]),
    );
    // Allocates and touches memory until killed.
    submit(
        "hog",
        json!([
            "/usr/bin/python3",
            "-c",
            "chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))"
        ]),
    );
    submit("normal", json!(["/bin/true"]));
    let deadline = Instant::now() + Duration::from_secs(180);
    let views = loop {
        let views: Vec<TaskView> = ["bomb", "hog", "normal"]
            .iter()
            .map(|t| {
                client
                    .patiently(Duration::from_secs(30), |c| c.get_task(t))
                    .unwrap()
            })
            .collect();
        if views.iter().all(|v| v.state.is_terminal()) {
            break views;
        }
        assert!(
            Instant::now() < deadline,
            "not terminal: {:?}",
            views
                .iter()
                .map(|v| (&v.task_id, v.state))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let (bomb, hog, normal) = (&views[0], &views[1], &views[2]);
    println!(
        "walls: bomb {} {} {}; hog {} {} {}; normal {} {}",
        bomb.state.as_str(),
        failure_code(bomb),
        wall(bomb),
        hog.state.as_str(),
        failure_code(hog),
        wall(hog),
        normal.state.as_str(),
        wall(normal)
    );
    assert_eq!(normal.state.as_str(), "SUCCEEDED", "{normal:?}");
    assert_eq!(wall(normal)["cgroup"], "v1");
    assert_eq!(
        wall(normal)["memory_limit_bytes"],
        u64::from(MEMORY_MIB) << 20
    );
    assert_eq!(wall(normal)["processes_limit"], u64::from(PROCESSES));

    assert_eq!(bomb.state.as_str(), "FAILED");
    assert_eq!(failure_code(bomb), "COMMAND_PROCESS_LIMIT", "{bomb:?}");
    assert!(wall(bomb)["fork_refusals"].as_u64().unwrap_or(0) > 0);

    assert_eq!(hog.state.as_str(), "FAILED");
    assert_eq!(failure_code(hog), "COMMAND_MEMORY_EXCEEDED", "{hog:?}");
    assert!(wall(hog)["oom_kills"].as_u64().unwrap_or(0) > 0);
    let peak = wall(hog)["memory_peak_bytes"].as_u64().unwrap_or(0);
    assert!(
        peak > (u64::from(MEMORY_MIB) << 20) / 2,
        "the hog's peak {peak} is not near its limit"
    );

    let after: Vec<Option<u32>> = ["supervisor", "worker", "executor"]
        .iter()
        .map(|n| suite.fleet.pid(n))
        .collect();
    assert_eq!(pids, after, "a component was restarted");
    suite
        .fleet
        .check_alive()
        .unwrap_or_else(|e| panic!("after the hogs: {e}"));
    let log = std::fs::read_to_string(suite.layout.logs().join("executor.log")).unwrap();
    assert!(
        log.contains("walls: a cgroup (v1) per job"),
        "the executor did not make its walls:\n{log}"
    );
}

//! Walls between jobs (issue 44, item 2): each job's commands run in a
//! cgroup of its own below the executor's (here the cgroup v1 hierarchies
//! airlock-local delegates, as systemd's `Delegate=yes` does on an
//! installed system), with a memory and a process limit, an equal CPU
//! weight and their CPU time counted. Hostile neighbours run beside a
//! normal task: a fork bomb, a memory hog and a disk filler each end with
//! their own code and their figures in the evidence, CPU spinners on twice the cores
//! have all their CPU time (their processes' together) in theirs, the
//! normal task SUCCEEDED, and the supervisor, the worker and the executor
//! keep their PIDs.
//!
//! Real processes and real cgroups; needs root and the v1 memory, pids,
//! cpu and cpuacct hierarchies (this machine's, and CI's).

use airlock_local::client::{Supervisor, task_on_demo};
use airlock_local::{Tuning, start_with};
use airlock_proto::task::TaskView;
use airlock_testkit::git_dir_or_empty;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const MEMORY_MIB: u32 = 192;
const PROCESSES: u32 = 48;
const DISK_MIB: u32 = 48;

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
            parallel_tasks: 5,
            parallel_jobs: 5,
            job_walls: Some((MEMORY_MIB, PROCESSES)),
            job_disk_mib: Some(DISK_MIB),
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
    // Twice the cores' worth of processes, each spinning one CPU second
    // (of its own CPU time, however loaded the machine is), then done.
    let spinners = 2 * std::thread::available_parallelism().map_or(2, |n| n.get());
    submit(
        "spinner",
        json!([
            "/usr/bin/python3",
            "-c",
            format!(
                "import os, time\nfor _ in range({spinners}):\n    if os.fork() == 0:\n        while time.process_time() < 1.0:\n            pass\n        os._exit(0)\nfor _ in range({spinners}):\n    os.wait()"
            )
        ]),
    );
    // Writes file after file to its workspace, each well under
    // RLIMIT_FSIZE, up to eight times its job's quota, then stops
    // (exit 0): only the disk watch fails it.
    submit(
        "filler",
        json!([
            "/usr/bin/python3",
            "-c",
            format!(
                "import os\nchunk = b'x' * (1 << 20)\nfor i in range({}):\n    with open(f'fill-{{i}}', 'wb') as f:\n        f.write(chunk)\n        f.flush()\n        os.fsync(f.fileno())",
                DISK_MIB * 8
            )
        ]),
    );
    submit("normal", json!(["/bin/true"]));
    let deadline = Instant::now() + Duration::from_secs(180);
    let views = loop {
        let views: Vec<TaskView> = ["bomb", "hog", "normal", "spinner", "filler"]
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
    let (bomb, hog, normal, spinner, filler) =
        (&views[0], &views[1], &views[2], &views[3], &views[4]);
    println!(
        "walls: bomb {} {} {}; hog {} {} {}; normal {} {}; spinner {} {}; filler {} {} {}",
        bomb.state.as_str(),
        failure_code(bomb),
        wall(bomb),
        hog.state.as_str(),
        failure_code(hog),
        wall(hog),
        normal.state.as_str(),
        wall(normal),
        spinner.state.as_str(),
        wall(spinner),
        filler.state.as_str(),
        failure_code(filler),
        wall(filler)
    );
    assert_eq!(normal.state.as_str(), "SUCCEEDED", "{normal:?}");
    assert_eq!(wall(normal)["cgroup"], "v1");
    assert_eq!(
        wall(normal)["memory_limit_bytes"],
        u64::from(MEMORY_MIB) << 20
    );
    assert_eq!(wall(normal)["processes_limit"], u64::from(PROCESSES));
    // An equal CPU weight (v1's default shares), no quota configured, and
    // this kernel's v1 blkio has weights only where its scheduler does.
    assert_eq!(wall(normal)["cpu_weight"], 1024);
    assert_eq!(wall(normal)["cpu_max_millis"], Value::Null);
    assert!(wall(normal)["cpu_used_ms"].is_u64(), "{}", wall(normal));
    let io_weights = std::path::Path::new("/sys/fs/cgroup/blkio/blkio.weight").exists()
        || std::path::Path::new("/sys/fs/cgroup/blkio/blkio.bfq.weight").exists();
    assert_eq!(wall(normal)["io_weight"].is_u64(), io_weights);

    assert_eq!(wall(normal)["disk_limit_bytes"], u64::from(DISK_MIB) << 20);

    assert_eq!(filler.state.as_str(), "FAILED");
    assert_eq!(failure_code(filler), "COMMAND_DISK_EXCEEDED", "{filler:?}");
    assert_eq!(wall(filler)["disk_exceeded"], true);
    let written = wall(filler)["disk_peak_bytes"].as_u64().unwrap_or(0);
    assert!(
        written > u64::from(DISK_MIB) << 20 && written < u64::from(DISK_MIB * 8) << 20,
        "the filler's peak {written} is not past its quota and short of its end"
    );

    assert_eq!(spinner.state.as_str(), "SUCCEEDED", "{spinner:?}");
    let used = wall(spinner)["cpu_used_ms"].as_u64().unwrap_or(0);
    assert!(
        used >= 900 * spinners as u64,
        "the spinners' {spinners} CPU seconds are not in the job's {used} ms"
    );

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

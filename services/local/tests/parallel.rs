//! Verification in parallel (issue 44, item 1): the executor runs up to
//! `executor.parallel_jobs` jobs at once, each with a spawner of its own,
//! so a task whose verification runs for seconds does not hold up a task
//! submitted after it. The control runs the same two tasks with one job:
//! the short task then waits for the long one (so the first case shows
//! parallelism, not a fast machine).
//!
//! Real processes: a private dbus-daemon, the supervisor, the worker and
//! the executor of airlock-local, a real git repository.

use airlock_local::client::{Supervisor, task_on_demo};
use airlock_local::{Tuning, start_with};
use airlock_proto::task::TaskState;
use airlock_testkit::git_dir_or_empty;
use serde_json::json;
use std::time::{Duration, Instant};

/// How long the long task's command sleeps.
const LONG: Duration = Duration::from_secs(12);

/// Starts a stack with `jobs` verification jobs, submits a long task, then
/// (once it runs) a short one; returns whether the short one was SUCCEEDED
/// while the long one was still running, after both ended SUCCEEDED.
fn short_finishes_first(jobs: u32) -> bool {
    let state = tempfile::tempdir().unwrap();
    let suite = start_with(
        state.path().join("state"),
        true,
        &Tuning {
            parallel_tasks: 2,
            parallel_jobs: jobs,
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("starting airlock-local: {e}"));
    let log = std::fs::read_to_string(suite.layout.logs().join("executor.log")).unwrap_or_default();
    let client = Supervisor::connect(Some(suite.bus.address())).unwrap();
    let base = git_dir_or_empty(
        &suite.layout.repos().join("demo.git"),
        &["rev-parse", "refs/heads/main"],
    );
    let submit = |task: &str, argv: serde_json::Value| {
        let s = task_on_demo(
            task,
            &base,
            1,
            json!({"operation": "write_file", "path": format!("{task}.txt"), "content": "x\n"}),
            json!([{"label": "check", "argv": argv, "timeout_seconds": 120}]),
        );
        client
            .patiently(Duration::from_secs(30), |c| c.submit_task(&s))
            .unwrap_or_else(|e| panic!("SubmitTask {task}: {e}"));
    };
    let state_of = |task: &str| {
        client
            .patiently(Duration::from_secs(30), |c| c.get_task(task))
            .unwrap_or_else(|e| panic!("GetTask {task}: {e}"))
            .state
    };
    let sleep = format!("import time; time.sleep({})", LONG.as_secs());
    submit("long", json!(["/usr/bin/python3", "-c", sleep]));
    // The long task is running (its command started) before the short one
    // is submitted.
    let deadline = Instant::now() + Duration::from_secs(60);
    while state_of("long") != TaskState::Running {
        assert!(Instant::now() < deadline, "the long task never ran");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(1));
    submit("short", json!(["/bin/true"]));
    let deadline = Instant::now() + LONG * 4;
    let mut first = None;
    loop {
        let (long, short) = (state_of("long"), state_of("short"));
        if first.is_none() && short.is_terminal() {
            first = Some(!long.is_terminal());
        }
        if long.is_terminal() && short.is_terminal() {
            assert_eq!(long, TaskState::Succeeded);
            assert_eq!(short, TaskState::Succeeded);
            break;
        }
        assert!(Instant::now() < deadline, "long {long:?}, short {short:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = std::fs::read_to_string(suite.layout.logs().join("executor.log")).unwrap_or(log);
    assert!(
        log.contains(&format!("; {jobs} spawner(s), ")),
        "the executor did not start {jobs} spawner(s):\n{log}"
    );
    first.unwrap()
}

#[test]
fn a_short_task_finishes_while_a_long_one_still_runs_with_two_jobs() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root (airlock-local's own uids per component): run it as root"
    );
    assert!(
        short_finishes_first(2),
        "with two jobs, the short task waited for the long one"
    );
}

#[test]
fn control_with_one_job_the_short_task_waits_for_the_long_one() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root (airlock-local's own uids per component): run it as root"
    );
    assert!(
        !short_finishes_first(1),
        "with one job, the short task finished first: the other test shows nothing"
    );
}

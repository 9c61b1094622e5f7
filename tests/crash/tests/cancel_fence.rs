//! A cancelled task never gets its branch (issue 41, item 1): the worker
//! is stopped (SIGSTOP, a worker paused mid-attempt) or killed (SIGKILL,
//! and restarted after the cancel) at every fault point of a publishing
//! attempt, from the worker's own table, and the task is cancelled there.
//!
//! At each point the harness notes the agent branch in the authority
//! repository and on the upstream while nothing can move it (the worker is
//! stopped or dead), cancels, lets the worker go on, and waits until it has
//! ended the attempt. Asserted:
//!
//! - an acknowledged cancel leaves both branches exactly as they were when
//!   it was sent: no ref moves and no push happens afterwards, whatever
//!   the worker had done before (before the fence, no branch at all);
//! - a cancel is refused (`TASK_COMMITTING`) only at the points where the
//!   worker holds its fence (`ref_fenced`, `push_fenced`), and the step
//!   then completes;
//! - after the cancel, the worker is granted no fence (the task's events
//!   hold no allowed `TASK_FENCED` setting one after `TASK_CANCELLED`).

use airlock_crash_matrix::{Publishing, fault_points, git, log_since, publishing_stack};
use airlock_local::client::task_on_demo;
use airlock_proto::Code;
use airlock_proto::task::{Decision, DecisionRequest, TaskState};
use airlock_testkit::poll;
use airlock_worker::fault::Attempt;
use std::path::Path;
use std::time::Duration;

const PATIENCE: Duration = Duration::from_secs(30);

/// How the worker is caught at a point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Caught {
    /// SIGSTOP there; SIGCONT after the cancel.
    Stopped,
    /// SIGKILL there; restarted (unarmed) after the cancel.
    Killed,
}

/// The agent branch in the authority repository and on the upstream.
fn branches(p: &Publishing, task: &str) -> (String, String) {
    let branch = format!("refs/heads/agent/{task}");
    let at = |repo: &Path| git(repo, &["rev-parse", "--verify", "--quiet", &branch]);
    (at(&p.authority), at(&p.upstream))
}

fn state_of(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

/// Restarts the worker to stop itself at `point` for `task`, and waits
/// until it has.
fn stop_at(p: &mut Publishing, point: &str, task: &str) {
    let log = p.stack.worker_log();
    let offset = airlock_testkit::file_len(&log);
    p.stack.restart_worker(&[("AIRLOCK_FAULT_STOP_AT", point)]);
    let pid = p.stack.suite.fleet.pid("worker").unwrap();
    let needle = format!("fault injection: SIGSTOP at {point} task {task}");
    poll(PATIENCE, Duration::from_millis(20), || {
        if log_since(&log, offset).contains(&needle) && state_of(pid) == Some('T') {
            Ok(())
        } else {
            Err(format!("the worker did not stop at {point} for {task}"))
        }
    });
}

/// Waits until the worker has ended `task`'s attempt (its log since
/// `offset` says so).
fn ended(p: &Publishing, task: &str, offset: u64) {
    let log = p.stack.worker_log();
    poll(PATIENCE, Duration::from_millis(50), || {
        let text = log_since(&log, offset);
        let done = text.lines().any(|l| {
            l.contains(&format!("task={task}"))
                && (l.contains("attempt finished") || l.contains("attempt interrupted"))
        });
        if done {
            Ok(())
        } else {
            Err(format!("the worker never ended {task}'s attempt:\n{text}"))
        }
    });
}

#[test]
fn a_cancelled_task_never_gets_its_branch_at_any_point_stopped_or_killed() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = publishing_stack(dir.path(), None);
    let fenced = ["ref_fenced", "push_fenced"];
    let (mut acknowledged, mut refused, mut terminal) = (0, 0, 0);
    for caught in [Caught::Stopped, Caught::Killed] {
        for (i, point) in fault_points(Attempt::Publication).into_iter().enumerate() {
            let task = format!("cancel-{caught:?}-{i:02}").to_lowercase();
            let mut submission = task_on_demo(
                &task,
                &p.base,
                2,
                serde_json::json!({"operation": "write_file", "path": format!("c/{i}.txt"), "content": "x\n"}),
                serde_json::json!([{"label": "check", "argv": ["/bin/true"], "timeout_seconds": 30}]),
            );
            submission["binding"]["repository"] = "pub".into();
            // The worker stays down while the task is queued, so the first
            // armed worker claims it.
            p.stack.suite.fleet.kill("worker");
            p.stack.submit(&submission);
            match caught {
                Caught::Stopped => stop_at(&mut p, point, &task),
                Caught::Killed => assert!(
                    p.stack.kill_at(point, &task, PATIENCE),
                    "the worker never reached {point} for {task}"
                ),
            }
            // Nothing can move a branch now: the worker is stopped or dead.
            let before = branches(&p, &task);
            let view = p.stack.get(&task);
            let req = DecisionRequest::about(&view, Decision::Cancel, "stop it", None);
            let answer = p.stack.client.cancel_task(&req);
            let log_offset = airlock_testkit::file_len(&p.stack.worker_log());
            match caught {
                Caught::Stopped => {
                    let pid = p.stack.suite.fleet.pid("worker").unwrap();
                    nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid as i32),
                        nix::sys::signal::Signal::SIGCONT,
                    )
                    .unwrap();
                }
                Caught::Killed => p.stack.restart_worker(&[]),
            }
            // A worker killed after its last checkpoint has nothing to resume.
            // The next case's worker must not find this attempt to resume.
            if !(caught == Caught::Killed && point == "result_submitted") {
                ended(&p, &task, log_offset);
            }
            match answer {
                Ok(out) => {
                    acknowledged += 1;
                    assert_eq!(out.state, TaskState::Cancelled, "{task} at {point}");
                    assert_eq!(
                        branches(&p, &task),
                        before,
                        "{task}: a branch moved after the cancel at {point} was acknowledged"
                    );
                    if !fenced.contains(&point) && point_before_ref(point) {
                        assert_eq!(before, (String::new(), String::new()), "{task} at {point}");
                    }
                    assert_eq!(p.stack.get(&task).state, TaskState::Cancelled);
                    assert_no_fence_after_cancel(&p, &task);
                }
                Err(e) if e.code == Code::TASK_COMMITTING => {
                    refused += 1;
                    assert!(
                        fenced.contains(&point),
                        "{task}: cancel refused at {point}, where no fence stands: {e}"
                    );
                    assert_eq!(view.state, TaskState::Running);
                    let v = p.stack.settled(&task, PATIENCE);
                    assert_eq!(v.state, TaskState::Succeeded, "{task} at {point}");
                }
                Err(e) if e.code == Code::TASK_STATE_INVALID => {
                    terminal += 1;
                    assert!(view.state.is_terminal(), "{task} at {point}: {e}");
                }
                Err(e) => panic!("{task}: cancel at {point}: {e}"),
            }
        }
    }
    println!(
        "cancel matrix: {acknowledged} cancels acknowledged (0 branches moved after them), {refused} refused under a fence, {terminal} after the task ended"
    );
    assert_eq!(refused, 2 * fenced.len(), "a fence at each fenced point");
    assert!(acknowledged >= 2 * 10, "only {acknowledged} cancels landed");
}

/// Whether the branch cannot have moved yet at `point` (before the
/// compare-and-swap's fence).
fn point_before_ref(point: &str) -> bool {
    let all = fault_points(Attempt::Publication);
    let at = |p: &str| all.iter().position(|q| *q == p).unwrap();
    at(point) < at("ref_fenced")
}

/// No fence was granted (set, not released) after the task was cancelled.
fn assert_no_fence_after_cancel(p: &Publishing, task: &str) {
    let events = p.stack.client.list_events(task, 0, 1000).unwrap().events;
    let cancelled = events
        .iter()
        .position(|e| e.action == "TASK_CANCELLED" && e.outcome == "allowed")
        .unwrap_or_else(|| panic!("{task}: no TASK_CANCELLED"));
    for e in &events[cancelled..] {
        let sets = e.payload["step"].as_str().is_some_and(|s| s != "release");
        assert!(
            !(e.action == "TASK_FENCED" && e.outcome == "allowed" && sets),
            "{task}: a fence granted after the cancel: {e:?}"
        );
    }
}

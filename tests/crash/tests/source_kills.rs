//! Kills while a source crosses the spool (issue 29): the base moves one
//! commit ahead before every task, so the executor lacks each task's tree
//! and the worker answers with a source delta against the tree it holds.
//!
//! - **Mid transfer**: the worker SIGKILLs itself with the delta written
//!   to its temporary name in `sources/`, not yet renamed
//!   (`source_staged`); it counts only when the worker died of SIGKILL and
//!   its log names the point and the task.
//! - **Mid assembly**: the executor aborts once the base entry is moved
//!   aside and the paths the delta removes are set aside, before anything
//!   new is written (`AIRLOCK_FAULT_EXECUTOR_AT=assembly`, a
//!   `fault-injection` build); it counts only when its log says so and it
//!   died of a signal. At its next start it must roll the entry back onto
//!   its base (its log says so once per kill).
//!
//! Afterwards, asserted: every task SUCCEEDED with exactly one commit on
//! top of its own base at the commit its result reports (0 lost, 0
//! duplicated), each accepted once; and the sources the worker sent after
//! the first task were deltas, never a whole archive again.

use airlock_crash_matrix::{Converged, Stack, count_in as count};
use airlock_local::client::task_on_demo;
use airlock_proto::task::TaskState;
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

const ROUNDS: usize = 10;
const PATIENCE: Duration = Duration::from_secs(30);

fn submission(task: &str, base: &str) -> serde_json::Value {
    task_on_demo(
        task,
        base,
        3,
        serde_json::json!({"operation": "write_file", "path": format!("out/{task}.txt"), "content": "x\n"}),
        serde_json::json!([{"label": "check", "argv": ["/bin/true"], "timeout_seconds": 30}]),
    )
}

#[test]
fn kills_mid_transfer_and_mid_assembly_lose_and_duplicate_nothing() {
    let mut s = Stack::start("source-kills");
    let executor_log = s.logs().join("executor.log");
    // The first task fills the executor's cache with a whole archive.
    let mut tasks = vec![("task-src-first".to_owned(), s.base.clone())];
    s.submit(&submission("task-src-first", &s.base));
    assert_eq!(
        s.settled("task-src-first", PATIENCE).state,
        TaskState::Succeeded
    );
    let archives = count(&s.worker_log(), "source archive sent");
    assert_eq!(archives, 1);

    let (mut transfer_kills, mut assembly_kills) = (0, 0);
    for round in 0..ROUNDS {
        // Mid transfer: the worker dies with the delta staged.
        let base = s.advance_main(round * 2);
        let task = format!("task-src-transfer-{round}");
        s.suite.fleet.kill("worker");
        s.submit(&submission(&task, &base));
        if s.kill_at("source_staged", &task, PATIENCE) {
            transfer_kills += 1;
        }
        s.restart_worker(&[]);
        // Settled before the next kill, so that each lands on its own task.
        s.settled(&task, PATIENCE);
        tasks.push((task, base));

        // Mid assembly: the executor dies with the entry half-moved.
        let base = s.advance_main(round * 2 + 1);
        let task = format!("task-src-assembly-{round}");
        let before = count(&executor_log, "fault injection: killed at assembly");
        s.restart("executor", &[("AIRLOCK_FAULT_EXECUTOR_AT", "assembly")]);
        s.submit(&submission(&task, &base));
        match s.suite.fleet.wait_exit("executor", PATIENCE) {
            Some(status)
                if status.signal().is_some()
                    && count(&executor_log, "fault injection: killed at assembly") > before =>
            {
                assembly_kills += 1;
            }
            Some(status) => panic!(
                "the armed executor ended otherwise ({status}):\n{}",
                airlock_local::fleet::tail(&executor_log, 30)
            ),
            None => panic!(
                "the armed executor never reached the assembly:\n{}",
                airlock_local::fleet::tail(&executor_log, 30)
            ),
        }
        s.restart("executor", &[]);
        s.settled(&task, PATIENCE);
        tasks.push((task, base));
    }

    let converged = s.converged(&tasks, Duration::from_secs(90));
    let rolled_back = count(&executor_log, "rolled an interrupted source delta back");
    let deltas = count(&s.worker_log(), "source delta sent");
    let archives = count(&s.worker_log(), "source archive sent");
    println!(
        "source kills: {transfer_kills} mid transfer, {assembly_kills} mid assembly ({rolled_back} rolled back at the next start); {} tasks SUCCEEDED; {} lost, {} duplicated, {} accepted other than once; {deltas} deltas and {archives} whole archive(s) sent",
        converged.succeeded,
        converged.lost,
        converged.duplicated,
        converged.accepted_other_than_once
    );
    assert_eq!(transfer_kills, ROUNDS, "every transfer kill lands");
    assert_eq!(assembly_kills, ROUNDS, "every assembly kill lands");
    assert_eq!(
        converged,
        Converged {
            succeeded: tasks.len(),
            ..Converged::default()
        }
    );
    assert_eq!(
        rolled_back, assembly_kills,
        "each interrupted assembly is rolled back"
    );
    assert_eq!(
        archives, 1,
        "after the first task only deltas cross the spool"
    );
    assert!(deltas >= 2 * ROUNDS, "{deltas} deltas");
}

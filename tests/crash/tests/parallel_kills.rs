//! Kills with several verification jobs in flight (issue 44, item 1): the
//! stack runs two jobs at once (`executor.parallel_jobs = 2`, the worker
//! two tasks), and the executor is killed
//!
//! - **mid-command in two jobs**: two tasks' commands each write a start
//!   marker, sleep, then an end marker ([`marked_sleep`]); the harness
//!   waits until both have started and neither has ended, SIGKILLs the
//!   executor, and looks again: both nonces still there without an end
//!   marker proves both jobs were mid-command at the kill;
//! - **mid-fill beside a running job**: one task's command runs (proven by
//!   its marker, as above) when the base moves one commit ahead and a
//!   second task is proposed on it: the executor receives a source delta
//!   against the tree the running job holds, so it copies that entry
//!   rather than move it, and aborts once the copy is staged
//!   (`AIRLOCK_FAULT_EXECUTOR_AT=assembly`, a `fault-injection` build).
//!   It counts when the executor died of a signal, its log says where,
//!   and the first job's command was still running.
//!
//! Afterwards, asserted ([`Stack::converged`]): every task SUCCEEDED with
//! exactly one commit on top of its own base at the commit its result
//! reports (0 lost, 0 duplicated), each accepted once; and no half-made
//! tree was used: a task whose tree was torn would have made a different
//! commit, or failed its check, which reads the file the moved base added.

use airlock_crash_matrix::{Converged, Stack, count_in as count, in_flight, marked_sleep};
use airlock_local::Tuning;
use airlock_local::client::task_on_demo;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Kills of each kind that must be proven.
const ROUNDS: usize = 4;
/// Tries per round before it counts as not proven.
const TRIES: usize = 3;
const SETTLE: Duration = Duration::from_secs(120);

fn submission(task: &str, base: &str, argv: Value) -> Value {
    task_on_demo(
        task,
        base,
        6,
        json!({"operation": "write_file", "path": format!("out/{task}.txt"), "content": format!("{task}\n")}),
        json!([{"label": "check", "argv": argv, "timeout_seconds": 60}]),
    )
}

/// A check that passes only on a tree where `moving/round.txt` says
/// `round {round}`: a torn or stale tree fails it.
fn reads_round(round: usize) -> Value {
    let script =
        format!("import sys; sys.exit(open('moving/round.txt').read() != 'round {round}\\n')");
    json!(["/usr/bin/python3", "-c", script])
}

/// Waits up to `within` for at least `n` marked commands in flight, in
/// distinct jobs (request directories).
fn wait_in_flight(work: &Path, n: usize, within: Duration) -> Vec<(PathBuf, String)> {
    let deadline = Instant::now() + within;
    loop {
        let now = in_flight(work);
        let jobs: BTreeSet<_> = now
            .iter()
            .filter_map(|(d, _)| d.parent().map(Path::to_path_buf))
            .collect();
        if jobs.len() >= n || Instant::now() >= deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn kills_with_two_jobs_in_flight_lose_and_duplicate_nothing() {
    let mut s = Stack::with(
        "parallel-kills",
        Tuning {
            lease_seconds: 30,
            parallel_tasks: 2,
            parallel_jobs: 2,
            ..Default::default()
        },
    );
    let work = s.suite.layout.path("exec/work");
    let executor_log = s.logs().join("executor.log");
    let mut tasks: Vec<(String, String)> = Vec::new();
    // The first task fills the cache with the base's tree.
    let mut base = s.base.clone();
    s.submit(&submission("par-first", &base, json!(["/bin/true"])));
    s.converged(&[("par-first".to_owned(), base.clone())], SETTLE);
    tasks.push(("par-first".to_owned(), base.clone()));

    let (mut two_mid_command, mut fill_beside_job) = (0, 0);
    let mut tries = 0;
    // Two jobs mid-command.
    while two_mid_command < ROUNDS && tries < ROUNDS * TRIES {
        tries += 1;
        let pair: Vec<String> = (0..2).map(|j| format!("par-cmd-{tries}-{j}")).collect();
        for t in &pair {
            s.submit(&submission(t, &base, marked_sleep(3.0)));
        }
        let before = wait_in_flight(&work, 2, Duration::from_secs(30));
        let landed = s.suite.fleet.kill("executor");
        let after: BTreeSet<_> = in_flight(&work).into_iter().collect();
        let jobs: BTreeSet<_> = before
            .iter()
            .filter(|m| after.contains(*m))
            .filter_map(|(d, _)| d.parent().map(Path::to_path_buf))
            .collect();
        if landed && jobs.len() >= 2 {
            two_mid_command += 1;
        }
        s.restart("executor", &[]);
        for t in pair {
            s.settled(&t, SETTLE);
            tasks.push((t, base.clone()));
        }
    }

    // A fill (a source delta's assembly) beside a running job.
    let command_tries = tries;
    let mut round = 0;
    tries = 0;
    while fill_beside_job < ROUNDS && tries < ROUNDS * TRIES {
        tries += 1;
        s.restart("executor", &[("AIRLOCK_FAULT_EXECUTOR_AT", "assembly")]);
        let running = format!("par-run-{tries}");
        s.submit(&submission(&running, &base, marked_sleep(4.0)));
        let before = wait_in_flight(&work, 1, Duration::from_secs(30));
        round += 1;
        let moved = s.advance_main(round);
        let filling = format!("par-fill-{tries}");
        let killed_before = count(&executor_log, "fault injection: killed at assembly");
        s.submit(&submission(&filling, &moved, reads_round(round)));
        let status = s.suite.fleet.wait_exit("executor", Duration::from_secs(30));
        let after: BTreeSet<_> = in_flight(&work).into_iter().collect();
        let job_ran = !before.is_empty() && before.iter().all(|m| after.contains(m));
        let at_assembly =
            count(&executor_log, "fault injection: killed at assembly") > killed_before;
        match status {
            Some(st) if st.signal().is_some() && at_assembly && job_ran => fill_beside_job += 1,
            Some(_) => {}
            None => {
                // Not reached in time: killed anyway, not counted.
                s.suite.fleet.kill("executor");
            }
        }
        s.restart("executor", &[]);
        s.settled(&running, SETTLE);
        s.settled(&filling, SETTLE);
        tasks.push((running, base.clone()));
        tasks.push((filling, moved.clone()));
        base = moved;
    }

    let converged = s.converged(&tasks, SETTLE);
    println!(
        "parallel kills: {two_mid_command} with two jobs mid-command, {fill_beside_job} mid-fill beside a running job ({command_tries} and {tries} tries); {} tasks SUCCEEDED; {} lost, {} duplicated, {} accepted other than once",
        converged.succeeded,
        converged.lost,
        converged.duplicated,
        converged.accepted_other_than_once
    );
    assert_eq!(
        two_mid_command, ROUNDS,
        "kills with two jobs proven mid-command"
    );
    assert_eq!(
        fill_beside_job, ROUNDS,
        "kills mid-fill proven beside a running job"
    );
    assert_eq!(
        converged,
        Converged {
            succeeded: tasks.len(),
            ..Converged::default()
        }
    );
}

//! Publication under kills (issue 23): a repository whose upstream
//! publishes, with signed commits; the worker SIGKILLed around the push —
//! before it (`before_push`), after the upstream took it but before the
//! `published` checkpoint (`after_push`), and right after `published` —
//! on every task, then left to finish.
//!
//! Each kill counts only when the worker died of SIGKILL and its log names
//! the point and the task (as in the crash matrix). At `after_push` the
//! harness also sees the upstream's branch at the task's commit before the
//! worker is restarted: the push really happened before the checkpoint
//! that records it.
//!
//! Afterwards, asserted: every task SUCCEEDED; its branch is on the
//! upstream at the commit its result reports, which is the authority
//! repository's, signed (`git verify-commit` with the allowed signers);
//! the upstream's reflog of each agent branch holds exactly one update
//! (0 lost, 0 duplicated publications: a replay after `after_push` finds
//! the commit there and sends nothing); each task's result records
//! `pushed: false` exactly when its push happened before a kill.

use airlock_crash_matrix::{Publishing, fault_points, git, publishing_stack};
use airlock_local::client::task_on_demo;
use airlock_proto::task::TaskState;
use airlock_worker::fault::Attempt;
use std::time::Duration;

/// Where the worker is killed, in the order an attempt passes them: the
/// points only a publishing attempt passes (before_push, after_push,
/// published), from the worker's own table.
fn points() -> Vec<&'static str> {
    let plain = fault_points(Attempt::Commit);
    fault_points(Attempt::Publication)
        .into_iter()
        .filter(|p| !plain.contains(p))
        .collect()
}

/// Tasks; each is killed at every point.
const TASKS: usize = 18;
const PATIENCE: Duration = Duration::from_secs(20);

#[test]
fn publications_happen_exactly_once_across_kills_around_the_push() {
    let dir = tempfile::tempdir().unwrap();
    let signing = dir.path().join("signing");
    airlock_testkit::ssh_keygen(&signing);
    let Publishing {
        stack: mut s,
        upstream,
        authority,
        base,
    } = publishing_stack(dir.path(), Some(signing.clone()));

    let mut kills = std::collections::BTreeMap::<&str, usize>::new();
    let mut pushed_before_kill = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..TASKS {
        let task = format!("task-pub-{i:02}");
        let mut submission = task_on_demo(
            &task,
            &base,
            3,
            serde_json::json!({"operation": "write_file", "path": format!("pub/f{i}.txt"), "content": format!("{i}\n")}),
            serde_json::json!([{"label": "check", "argv": ["/bin/true"], "timeout_seconds": 30}]),
        );
        submission["binding"]["repository"] = "pub".into();
        // The worker stays down while the task is queued, so the first
        // armed worker claims it.
        s.suite.fleet.kill("worker");
        s.submit(&submission);
        for point in points() {
            if s.kill_at(point, &task, PATIENCE) {
                *kills.entry(point).or_default() += 1;
                if point == "after_push" {
                    let remote = git(
                        &upstream,
                        &[
                            "rev-parse",
                            "--verify",
                            "--quiet",
                            &format!("refs/heads/agent/{task}"),
                        ],
                    );
                    assert!(
                        !remote.is_empty(),
                        "{task}: killed after the push, but the upstream has no branch"
                    );
                    pushed_before_kill.push(task.clone());
                }
            }
        }
        s.restart_worker(&[]);
        tasks.push(task);
    }

    // Everything settles; then the upstream is checked task by task.
    let signer = airlock_git::Signer::load(&signing, "agent@example.org").unwrap();
    let allowed = signer.allowed_signers_line();
    let scratch = s.suite.layout.path("");
    let (mut lost, mut duplicated, mut unsigned, mut replays) = (0, 0, 0, 0);
    for task in &tasks {
        let v = s.settled(task, Duration::from_secs(60));
        assert_eq!(v.state, TaskState::Succeeded, "{task}: {:?}", v.result);
        let result = v.result.unwrap();
        let commit = result["commit_oid"].as_str().unwrap().to_owned();
        let branch = format!("refs/heads/agent/{task}");
        let remote = git(&upstream, &["rev-parse", "--verify", "--quiet", &branch]);
        let local = git(&authority, &["rev-parse", "--verify", "--quiet", &branch]);
        if remote != commit || local != commit {
            lost += 1;
        }
        let updates = git(&upstream, &["reflog", "show", "--format=%H", &branch]);
        if updates.lines().count() != 1 {
            duplicated += 1;
        }
        let out = airlock_testkit::verify_commit(&upstream, &scratch, &allowed, &commit);
        if !out.status.success() {
            unsigned += 1;
        }
        let pushed = result["publication"]["pushed"].as_bool();
        if pushed == Some(false) {
            replays += 1;
            assert!(
                pushed_before_kill.contains(task),
                "{task}: a replay without a push before a kill"
            );
        }
    }
    let total: usize = kills.values().sum();
    println!(
        "publication kills: {total} ({kills:?}); {} tasks SUCCEEDED; {lost} lost, {duplicated} duplicated, {unsigned} unsigned; {replays} replays found the commit already published",
        tasks.len()
    );
    assert!(total >= 50, "only {total} kills landed: {kills:?}");
    assert_eq!((lost, duplicated, unsigned), (0, 0, 0));
    assert_eq!(
        replays,
        pushed_before_kill.len(),
        "each push before a kill is a replay"
    );
}

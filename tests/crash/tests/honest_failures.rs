//! Honest failures (issue 14): when the worker meets a permanent error
//! while it drives an attempt, the attempt ends with a failed result that
//! carries the error's own code, and the task ends with that code — never
//! as an expired lease after attempts churned. A transient error is tried
//! again in place and the task still succeeds in its first attempt.
//!
//! The whole suite on real processes (airlock-local: supervisor, worker,
//! executor on a private bus, a real git repository). The worker is built
//! with `fault-injection`; `AIRLOCK_FAULT_ERROR_AT=<phase>:<CODE>` makes
//! the step after `<phase>` fail once with `CODE`, standing in for a git,
//! spool or journal failure at that step. Two cases need no injection:
//! an envelope the worker refuses at claim time (a capability it does not
//! offer) and a source commit missing from the repository. Also here: a
//! resume at commit_done whose branch moved needs reconciliation, and a
//! call the supervisor does not answer is bounded.

use airlock_crash_matrix::{Stack, git};
use airlock_local::client::task_on_demo;
use airlock_proto::Code;
use airlock_proto::reconcile::{CaseStatus, ReconciliationCase, Resolution, ResolveRequest};
use airlock_proto::task::TaskState;
use airlock_testkit::poll;
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};

/// How long a task gets to end: well within its 30 s lease.
const SETTLE: Duration = Duration::from_secs(25);

/// What these tests check on the shared [`Stack`].
trait Honest {
    fn ends_with(&self, task: &str, submission: &Value, code: Code);
    fn failed_with(&self, task: &str, code: Code);
    fn case_settled(&self, task: &str) -> ReconciliationCase;
}

impl Honest for Stack {
    /// Submits `submission` (max_attempts 1) and checks the task failed in
    /// its one attempt with `code` as its result's failure code.
    fn ends_with(&self, task: &str, submission: &Value, code: Code) {
        self.submit(submission);
        self.failed_with(task, code);
    }

    /// Checks `task` failed in its one attempt with `code`, reported by
    /// the worker, not by a lease expiring.
    fn failed_with(&self, task: &str, code: Code) {
        let v = self.settled(task, SETTLE);
        let failure = v
            .result
            .as_ref()
            .and_then(|r| r["failure_code"].as_str())
            .map(str::to_owned);
        assert_eq!(
            (v.state, v.attempt, failure.as_deref()),
            (TaskState::Failed, 1, Some(code.as_str())),
            "{task}: {:?}",
            v.result
        );
        let actions = self.actions(task);
        assert!(
            !actions.iter().any(|a| a.starts_with("TASK_LEASE_EXPIRED")),
            "{task} must not end by lease expiry: {actions:?}"
        );
        assert!(
            actions.contains(&"TASK_RESULT_SUBMITTED:allowed".to_owned()),
            "{task}: the worker reported the failure: {actions:?}"
        );
    }

    /// Waits for the worker's check of an adoption (it looks when idle,
    /// every poll interval).
    fn case_settled(&self, task: &str) -> ReconciliationCase {
        poll(Duration::from_secs(20), Duration::from_millis(100), || {
            let case = self.client.get_reconciliation(task).unwrap();
            if case.status != CaseStatus::Adopting {
                Ok(case)
            } else {
                Err(format!(
                    "the adoption of {task} is still unchecked after 20 s; the worker's log ends:\n{}",
                    airlock_local::fleet::tail(&self.worker_log(), 30)
                ))
            }
        })
    }
}

fn task(name: &str, base: &str) -> Value {
    task_on_demo(
        name,
        base,
        1,
        json!({"operation": "write_file", "path": format!("honest/{name}.txt"), "content": "x\n"}),
        json!([{"label": "check", "argv": ["/bin/true"], "timeout_seconds": 30}]),
    )
}

#[test]
fn each_permanent_error_class_ends_the_task_with_its_own_code() {
    let mut s = Stack::start("honest-permanent");
    // (the step after this phase, the code it fails with): a corrupt
    // journal record, a git failure while archiving the source, the
    // executor returning other paths than the change set's, a spool file
    // of the wrong owner, the branch moved under the compare-and-swap.
    let cases = [
        ("start", Code::STORE_CORRUPT),
        ("claimed", Code::GIT_FAILED),
        ("workspace_prepared", Code::CHANGED_PATHS_MISMATCH),
        ("workspace_prepared", Code::SPOOL_FILE_REJECTED),
        ("verification_passed", Code::REF_CAS_MISMATCH),
    ];
    for (i, (phase, code)) in cases.into_iter().enumerate() {
        let armed = format!("{phase}:{}", code.as_str());
        s.restart_worker(&[("AIRLOCK_FAULT_ERROR_AT", &armed)]);
        let name = format!("honest-{i}");
        s.ends_with(&name, &task(&name, &s.base), code);
        let log = std::fs::read_to_string(s.suite.layout.logs().join("worker.log")).unwrap();
        assert!(
            log.contains(&format!(
                "fault injection: {} after {phase} task {name}",
                code.as_str()
            )),
            "the injected fault fired where armed"
        );
    }
    // No injection: an envelope the worker refuses at claim time (it does
    // not offer the capability), and a source commit the repository lacks.
    s.restart_worker(&[]);
    let mut wants_more = task("honest-capability", &s.base);
    wants_more["plan"]["execution"]["capability_scope"] =
        json!(["git.read", "git.test", "net.fetch"]);
    s.ends_with(
        "honest-capability",
        &wants_more,
        Code::CAPABILITY_MISMATCH_DENY,
    );
    let missing = "0123456789abcdef0123456789abcdef01234567";
    s.ends_with(
        "honest-missing",
        &task("honest-missing", missing),
        Code::GIT_OBJECT_MISSING,
    );
    // Nothing reached a branch.
    let repo = s.suite.layout.repos().join("demo.git");
    assert_eq!(git(&repo, &["for-each-ref", "refs/heads/agent/"]), "");
}

/// Rewrites the payload of `task`'s `phase` checkpoint in the worker's
/// journal (a stopped worker's), with digests that match, as damage or a
/// hand edit that kept the file consistent would: only the payload's type
/// can tell. The append-only triggers are dropped for the edit and put
/// back as they were.
fn edit_payload(journal: &Path, task: &str, phase: &str, edit: impl Fn(&mut Value)) {
    use airlock_proto::canonical::{sha256_hex, to_canonical_string};
    let db = rusqlite::Connection::open(journal).unwrap();
    let (payload, sequence): (String, i64) = db
        .query_row(
            "SELECT payload_json, sequence FROM checkpoints WHERE task_id = ?1 AND phase = ?2",
            [task, phase],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    let mut value: Value = serde_json::from_str(&payload).unwrap();
    edit(&mut value);
    let text = to_canonical_string(&value).unwrap();
    let sha = sha256_hex(text.as_bytes());
    let triggers: Vec<String> = db
        .prepare(
            "SELECT sql FROM sqlite_master WHERE type = 'trigger'
              AND name IN ('checkpoints_no_update', 'checkpoint_heads_forward_only')",
        )
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(triggers.len(), 2);
    db.execute_batch(
        "DROP TRIGGER checkpoints_no_update; DROP TRIGGER checkpoint_heads_forward_only;",
    )
    .unwrap();
    db.execute(
        "UPDATE checkpoints SET payload_json = ?1, payload_sha256 = ?2
          WHERE task_id = ?3 AND sequence = ?4 AND phase = ?5",
        rusqlite::params![text, sha, task, sequence, phase],
    )
    .unwrap();
    db.execute(
        "UPDATE checkpoint_heads SET payload_sha256 = ?1 WHERE task_id = ?2 AND sequence = ?3",
        rusqlite::params![sha, task, sequence],
    )
    .unwrap();
    for t in &triggers {
        db.execute_batch(t).unwrap();
    }
    drop(db);
    // Whatever SQLite made beside the journal as root goes back to the
    // journal's owner.
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(journal).unwrap();
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let f = format!("{}{suffix}", journal.display());
        if Path::new(&f).exists() {
            std::os::unix::fs::chown(&f, Some(meta.uid()), Some(meta.gid())).unwrap();
        }
    }
}

#[test]
fn a_checkpoint_payload_that_does_not_decode_ends_the_task_with_store_corrupt() {
    let mut s = Stack::start("honest-corrupt");
    let journal = s.suite.layout.path("worker/checkpoints.sqlite3");
    let repo = s.suite.layout.repos().join("demo.git");
    // The worker dies right after `phase`; its payload is then edited and
    // the restarted worker resumes from it.
    type Edit = fn(&mut Value);
    let cases: [(&str, &str, Edit); 3] = [
        ("workspace_prepared", "a missing field", |v| {
            v.as_object_mut().unwrap().remove("request_sha256");
        }),
        ("verification_passed", "a wrong type", |v| {
            v["exec_result_sha256"] = json!(42);
        }),
        ("verification_passed", "an empty digest", |v| {
            v["exec_result_sha256"] = json!("");
        }),
    ];
    for (i, (phase, what, edit)) in cases.into_iter().enumerate() {
        s.restart_worker(&[("AIRLOCK_FAULT_KILL_AFTER", phase)]);
        let name = format!("corrupt-{i}");
        s.submit(&task(&name, &s.base));
        assert!(
            s.suite
                .fleet
                .wait_exit("worker", Duration::from_secs(20))
                .is_some(),
            "the worker was to kill itself after {phase}"
        );
        edit_payload(&journal, &name, phase, edit);
        s.restart_worker(&[]);
        s.failed_with(&name, Code::STORE_CORRUPT);
        let log = std::fs::read_to_string(s.suite.layout.logs().join("worker.log")).unwrap();
        assert!(
            log.lines().any(|l| l.contains(&name)
                && l.contains("STORE_CORRUPT")
                && l.contains(&format!("{phase} checkpoint payload"))),
            "{what}: the worker names the damaged checkpoint:\n{}",
            airlock_local::fleet::tail(&s.suite.layout.logs().join("worker.log"), 20)
        );
        assert_eq!(
            git(
                &repo,
                &["for-each-ref", &format!("refs/heads/agent/{name}")]
            ),
            "",
            "{what}: nothing was committed from a damaged record"
        );
    }
}

#[test]
fn a_transient_error_is_tried_again_and_the_first_attempt_succeeds() {
    let mut s = Stack::start("honest-transient");
    for (i, phase) in ["claimed", "workspace_prepared", "verification_passed"]
        .into_iter()
        .enumerate()
    {
        s.restart_worker(&[(
            "AIRLOCK_FAULT_ERROR_AT",
            &format!("{phase}:{}", Code::SPOOL_UNAVAILABLE.as_str()),
        )]);
        let name = format!("transient-{i}");
        s.submit(&task(&name, &s.base));
        let v = s.settled(&name, SETTLE);
        assert_eq!((v.state, v.attempt), (TaskState::Succeeded, 1), "{name}");
        let log = std::fs::read_to_string(s.suite.layout.logs().join("worker.log")).unwrap();
        assert!(log.contains(&format!(
            "fault injection: SPOOL_UNAVAILABLE after {phase} task {name}"
        )));
        assert!(log.contains("transient failure, trying the step again"));
    }
}

#[test]
fn a_branch_moved_behind_the_workers_back_needs_reconciliation() {
    let mut s = Stack::start("honest-moved");
    let repo = s.suite.layout.repos().join("demo.git");
    // The worker dies right after commit_done: the commit is on the branch,
    // the result not yet reported.
    s.restart_worker(&[("AIRLOCK_FAULT_KILL_AFTER", "commit_done")]);
    s.submit(&task("moved-ref", &s.base));
    let status = s.suite.fleet.wait_exit("worker", Duration::from_secs(20));
    assert!(
        status.is_some(),
        "the worker was to kill itself at commit_done"
    );
    let made = git(&repo, &["rev-parse", "refs/heads/agent/moved-ref"]);
    assert_ne!(made, s.base, "the governed commit is on the branch");
    // Someone moves the branch behind the worker's back.
    let other = git(&repo, &["rev-parse", "refs/heads/main"]);
    move_ref(&repo, "agent/moved-ref", &other, &made);
    // The restarted worker resumes at commit_done, sees another head and
    // reports the attempt as needing reconciliation instead of success.
    s.restart_worker(&[]);
    let v = s.settled("moved-ref", SETTLE);
    let failure = v.result.as_ref().and_then(|r| r["failure_code"].as_str());
    assert_eq!(
        (v.state, failure),
        (
            TaskState::Failed,
            Some(Code::RECONCILIATION_REQUIRED.as_str())
        ),
        "{:?}",
        v.result
    );
    assert!(
        !s.actions("moved-ref")
            .iter()
            .any(|a| a.starts_with("TASK_LEASE_EXPIRED"))
    );
    let log = std::fs::read_to_string(s.suite.layout.logs().join("worker.log")).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains("reconciliation required: the branch moved"))
        .expect("the worker logs the reconciliation");
    assert!(
        line.contains(&other) && line.contains(&made),
        "it names the observed head and its commit: {line}"
    );
    assert_eq!(
        git(&repo, &["rev-parse", "refs/heads/agent/moved-ref"]),
        other,
        "the worker does not move the branch back"
    );

    // The supervisor holds the case: the commit made and the head seen.
    let case = s.client.get_reconciliation("moved-ref").unwrap();
    assert_eq!(
        (
            case.status,
            case.commit_oid.as_str(),
            case.observed_head.as_deref()
        ),
        (CaseStatus::Open, made.as_str(), Some(other.as_str()))
    );
    let listed = s.client.list_reconciliations("open", "", 0).unwrap();
    assert_eq!(listed.cases, vec![case.clone()]);

    // The branch moves again before the administrator's adoption is
    // checked: the worker finds another head, and the case opens again
    // with it (RECONCILIATION_HEAD_MOVED); the task stays FAILED.
    move_ref(&repo, "agent/moved-ref", &made, &other);
    let req = ResolveRequest::about(&case, Resolution::Adopt, "main is fine", None);
    let out = s.client.resolve_reconciliation(&req).unwrap();
    assert_eq!(out.status, CaseStatus::Adopting);
    let case = s.case_settled("moved-ref");
    assert_eq!(
        (
            case.status,
            case.observed_head.as_deref(),
            case.last_refusal.as_deref()
        ),
        (
            CaseStatus::Open,
            Some(made.as_str()),
            Some(Code::RECONCILIATION_HEAD_MOVED.as_str())
        )
    );
    assert_eq!(
        s.client.get_task("moved-ref").unwrap().state,
        TaskState::Failed
    );
    // The administrator's earlier request is answered from its slot, and
    // the same view cannot be resolved again (the case changed).
    assert!(s.client.resolve_reconciliation(&req).unwrap().idempotent);
    // Adopting the head now seen: the worker finds the branch still there
    // and descending from the task's base; the task SUCCEEDED with it.
    let req = ResolveRequest::about(&case, Resolution::Adopt, "the attempt's own commit", None);
    s.client.resolve_reconciliation(&req).unwrap();
    let case = s.case_settled("moved-ref");
    assert_eq!(case.status, CaseStatus::Adopted);
    let v = s.client.get_task("moved-ref").unwrap();
    assert_eq!(v.state, TaskState::Succeeded);
    let record = v.verification.unwrap();
    assert_eq!(
        (record["decision"].as_str(), record["commit_oid"].as_str()),
        (Some("ADOPTED"), Some(made.as_str()))
    );
    let actions = s.actions("moved-ref");
    for (action, times) in [
        ("TASK_RECONCILIATION_OPENED:allowed", 1),
        ("TASK_RECONCILIATION_RESOLVED:allowed", 2),
        ("TASK_RECONCILIATION_ADOPTED:denied", 1),
        ("TASK_RECONCILIATION_ADOPTED:allowed", 1),
        ("TASK_RESULT_SUBMITTED:allowed", 1),
    ] {
        assert_eq!(
            actions.iter().filter(|a| *a == action).count(),
            times,
            "{action}: {actions:?}"
        );
    }
    assert_eq!(
        git(&repo, &["rev-parse", "refs/heads/agent/moved-ref"]),
        made,
        "adoption never moves the ref"
    );
}

/// Moves `branch` from `from` to `to` behind the worker's back.
fn move_ref(repo: &Path, branch: &str, to: &str, from: &str) {
    airlock_testkit::git_dir(
        repo,
        &["update-ref", &format!("refs/heads/{branch}"), to, from],
    );
}

#[test]
fn a_call_the_supervisor_does_not_answer_is_bounded_and_the_worker_carries_on() {
    // lease 30 s: the worker renews every 10 s and bounds each call by that.
    let s = Stack::start("honest-late");
    let log = s.suite.layout.logs().join("worker.log");
    let pid = s
        .suite
        .fleet
        .pid("supervisor")
        .expect("the supervisor runs");
    let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap());
    // The supervisor stops answering (a frozen process: the bus queues the
    // worker's calls, nothing replies).
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let t = Instant::now();
    let mut seen = false;
    while t.elapsed() < Duration::from_secs(20) {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("Claim: no answer within 10s") {
            seen = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let waited = t.elapsed();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    assert!(
        seen,
        "the worker's claim must fail after its bound, not hang:\n{}",
        airlock_local::fleet::tail(&log, 20)
    );
    assert!(waited >= Duration::from_secs(9), "{waited:?}");
    // The late answers are dropped; the worker goes on claiming, and a
    // task submitted now runs to its end in its first attempt.
    s.submit(&task("late-1", &s.base));
    let v = s.settled("late-1", SETTLE);
    assert_eq!((v.state, v.attempt), (TaskState::Succeeded, 1));
}

//! Crash matrix, issue 14's paths: kills around reconciliation and
//! decisions, over real processes.
//!
//! - **A ref moved during a kill.** The worker SIGKILLs itself at
//!   `ref_updated` (the CAS moved the `agent/` branch, `commit_done` not yet
//!   appended) or at `commit_done`; while it is dead the harness moves the
//!   branch back to the base; the restarted worker resumes the attempt from
//!   its journal. The task must end FAILED with `RECONCILIATION_REQUIRED`
//!   in its one attempt (never SUCCEEDED, never retried into another
//!   commit), its case listed by the supervisor with the commit made and
//!   the head seen, the branch left where the harness put it, and one
//!   result accepted. Control tasks killed at the same points without a
//!   moved ref SUCCEED with exactly one commit.
//! - **A kill between a decision and its audit.** The store writes a
//!   decision, its slot and its audit event in one transaction. The
//!   harness sends Verify (accept) to a real supervisor process and
//!   SIGKILLs it at a random instant around the call, restarts it, and
//!   checks before anything else that the task's state, its decision and
//!   its `TASK_VERIFIED` event agree (all there or none); then resends the
//!   same request, which is applied now or answered from the slot
//!   (`idempotent`) — exactly once either way, audited once.
//!
//! Each test prints a summary line built from the values it asserts,
//! including the lost and duplicated counts (both must be 0).

use airlock_crash_matrix::{Stack, git};
use airlock_local::client::{Supervisor, task_on_demo};
use airlock_localbus::{PrivateBus, SupervisorProcess, sibling_binary};
use airlock_proto::Code;
use airlock_proto::bus::LeaseRef;
use airlock_proto::reconcile::CaseStatus;
use airlock_proto::task::{
    CommandSummary, Decision, DecisionRequest, Isolation, Outcome, RESULT_SCHEMA, TaskResult,
    TaskState, TaskView,
};
use rand::Rng;
use serde_json::{Value, json};
use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::time::Duration;

fn task(name: &str, base: &str) -> Value {
    task_on_demo(
        name,
        base,
        3,
        json!({"operation": "write_file", "path": format!("moved/{name}.txt"), "content": "x\n"}),
        json!([{"label": "check", "argv": ["/bin/true"], "timeout_seconds": 30}]),
    )
}

#[test]
fn a_ref_moved_during_a_kill_ends_in_reconciliation_with_its_case_listed() {
    const ROUNDS: usize = 3;
    let mut s = Stack::start("moved-kill");
    let repo = s.suite.layout.repos().join("demo.git");
    let base = git(&repo, &["rev-parse", "refs/heads/main"]);
    let log = s.suite.layout.logs().join("worker.log");

    let mut kills: std::collections::BTreeMap<&str, usize> = Default::default();
    let (mut reconciled, mut succeeded, mut lost, mut duplicated) = (0, 0, 0, 0);
    let mut tasks = 0;
    for round in 0..ROUNDS {
        for point in ["ref_updated", "commit_done"] {
            for moved in [true, false] {
                let name = format!(
                    "mk-{point}-{round}-{}",
                    if moved { "moved" } else { "kept" }
                );
                tasks += 1;
                let offset = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
                s.restart_worker(&[("AIRLOCK_FAULT_KILL_AFTER", point)]);
                s.client
                    .patiently(Duration::from_secs(30), |c| {
                        c.submit_task(&task(&name, &base))
                    })
                    .unwrap();
                let status = s
                    .suite
                    .fleet
                    .wait_exit("worker", Duration::from_secs(20))
                    .unwrap_or_else(|| panic!("{name}: the worker did not reach {point}"));
                assert_eq!(status.signal(), Some(9), "{name}: {status}");
                let text = std::fs::read(&log).unwrap_or_default();
                let text = String::from_utf8_lossy(&text[offset as usize..]).into_owned();
                assert!(
                    text.contains(&format!("fault injection: SIGKILL at {point} task {name}")),
                    "{name}: the kill landed elsewhere:\n{text}"
                );
                *kills.entry(point).or_default() += 1;
                let branch = format!("refs/heads/agent/{name}");
                let made = git(&repo, &["rev-parse", &branch]);
                assert_ne!(made, base, "{name}: the commit is on the branch at {point}");
                if moved {
                    let out = Command::new("git")
                        .args(["-c", "safe.directory=*", "--git-dir"])
                        .arg(&repo)
                        .args(["update-ref", &branch, &base, &made])
                        .output()
                        .unwrap();
                    assert!(out.status.success(), "{out:?}");
                }
                s.restart_worker(&[]);
                let v = s.settled(&name, Duration::from_secs(25));
                let head = git(&repo, &["rev-parse", &branch]);
                let commits: usize =
                    git(&repo, &["rev-list", "--count", &format!("{base}..{head}")])
                        .parse()
                        .unwrap();
                let accepted = s
                    .actions(&name)
                    .iter()
                    .filter(|a| *a == "TASK_RESULT_SUBMITTED:allowed")
                    .count();
                if accepted != 1 {
                    duplicated += accepted.saturating_sub(1);
                    lost += usize::from(accepted == 0);
                }
                if moved {
                    let failure = v.result.as_ref().and_then(|r| r["failure_code"].as_str());
                    assert_eq!(
                        (v.state, v.attempt, failure),
                        (
                            TaskState::Failed,
                            1,
                            Some(Code::RECONCILIATION_REQUIRED.as_str())
                        ),
                        "{name}: {:?}",
                        v.result
                    );
                    assert_eq!(head, base, "{name}: the worker left the branch as found");
                    duplicated += commits;
                    let case = s.client.get_reconciliation(&name).unwrap();
                    assert_eq!(
                        (
                            case.status,
                            case.attempt,
                            case.commit_oid.as_str(),
                            case.observed_head.as_deref()
                        ),
                        (CaseStatus::Open, 1, made.as_str(), Some(base.as_str())),
                        "{name}"
                    );
                    reconciled += 1;
                } else {
                    assert_eq!(v.state, TaskState::Succeeded, "{name}: {:?}", v.result);
                    assert_eq!(commits, 1, "{name}");
                    assert_eq!(
                        v.result.as_ref().and_then(|r| r["commit_oid"].as_str()),
                        Some(made.as_str())
                    );
                    duplicated += commits - 1;
                    succeeded += 1;
                }
            }
        }
    }
    let open = s.client.list_reconciliations("open", "", 0).unwrap();
    println!(
        "reconciliation kills: {} worker kills {kills:?}; {tasks} tasks: {reconciled} RECONCILIATION_REQUIRED with their case listed ({} open cases), {succeeded} SUCCEEDED; {lost} lost, {duplicated} duplicated",
        kills.values().sum::<usize>(),
        open.cases.len(),
    );
    assert_eq!(open.cases.len(), reconciled);
    assert_eq!(reconciled + succeeded, tasks);
    assert_eq!((lost, duplicated), (0, 0));
}

/// The test as the worker: a task brought to VERIFYING with a passed result.
fn verifying(client: &Supervisor, task: &str) -> TaskView {
    let base = "a642b045775b9154a00ae78543037fbef4fb447b";
    client
        .submit_task(&task_on_demo(
            task,
            base,
            1,
            json!({"operation": "write_file", "path": "a.txt", "content": "a\n"}),
            json!([{"label": "check", "argv": ["/bin/true"]}]),
        ))
        .unwrap();
    let grant = client.claim().unwrap().expect("a task to claim");
    assert_eq!(grant.task_id, task);
    let result = TaskResult {
        schema: RESULT_SCHEMA.into(),
        task_id: task.into(),
        attempt: grant.attempt,
        execution_digest: grant.envelope["execution_digest"].as_str().unwrap().into(),
        outcome: Outcome::Passed,
        commit_oid: Some("c".repeat(40)),
        target_branch: format!("agent/{task}"),
        exec_result_sha256: Some("e".repeat(64)),
        failure_code: None,
        verification: vec![CommandSummary {
            label: "check".into(),
            exit_code: Some(0),
            timed_out: false,
            duration_ms: 1,
            stdout_tail: None,
            stderr_tail: None,
            wall: None,
        }],
        isolation: Some(Isolation::unmeasured()),
        captured: None,
        reconciliation: None,
        publication: None,
        signature: None,
    };
    let receipt = client
        .submit_result(&LeaseRef::of(&grant), &format!("result-{task}-1"), &result)
        .unwrap();
    assert_eq!(receipt.task.state, TaskState::Verifying);
    receipt.task
}

fn verified_events(client: &Supervisor, task: &str) -> usize {
    client
        .list_events(task, 0, 1000)
        .unwrap()
        .events
        .iter()
        .filter(|e| e.action == "TASK_VERIFIED" && e.outcome == "allowed")
        .count()
}

#[test]
fn a_kill_around_a_decision_applies_and_audits_it_exactly_once() {
    const KILLS: usize = 24;
    let dir = tempfile::tempdir().unwrap();
    let bus = PrivateBus::start().expect("dbus-daemon");
    let config = dir.path().join("airlock.toml");
    std::fs::write(
        &config,
        "[[repository]]\nname = \"demo\"\npath = \"/srv/airlock/demo.git\"\n",
    )
    .unwrap();
    let db = dir.path().join("tasks.sqlite3");
    let binary = sibling_binary("airlock-supervisor").unwrap();
    let start = || SupervisorProcess::start(&binary, &bus, &config, &db, &[]).expect("starts");
    let mut sup = start();
    let mut rng = rand::thread_rng();
    let (mut before, mut after, mut lost, mut duplicated, mut torn) = (0, 0, 0, 0, 0);
    for i in 0..KILLS {
        let client = Supervisor::connect(Some(bus.address())).expect("bus");
        let name = format!("decide-{i:02}");
        let view = verifying(&client, &name);
        let req = DecisionRequest::about(&view, Decision::Accept, "looks right", None);
        // Verify from another connection while the supervisor is killed
        // at a random instant around it.
        let verifier = Supervisor::connect(Some(bus.address())).expect("bus");
        verifier.get_task(&name).unwrap();
        let sent = req.clone();
        let call = std::thread::spawn(move || verifier.verify(&sent));
        std::thread::sleep(Duration::from_micros(rng.gen_range(0..12_000)));
        drop(sup); // SIGKILL, then reaped
        let answered = call.join().unwrap();
        sup = start();
        let client = Supervisor::connect(Some(bus.address())).expect("bus");
        // Before anything is resent: the state, the decision and its
        // audit record agree.
        let now = client.get_task(&name).unwrap();
        let audited = verified_events(&client, &name);
        let applied = now.state == TaskState::Succeeded;
        if applied != (audited == 1) || audited > 1 {
            torn += 1;
        }
        if applied {
            after += 1;
        } else {
            assert_eq!(now.state, TaskState::Verifying, "{name}");
            before += 1;
        }
        if let Ok(out) = &answered {
            assert!(applied, "{name}: answered {out:?} but not applied");
        }
        // The same request again: answered from the slot if it applied
        // before the kill, applied now otherwise.
        let out = client.verify(&req).unwrap();
        assert_eq!(out.idempotent, applied, "{name}");
        let end = client.get_task(&name).unwrap();
        let audited = verified_events(&client, &name);
        lost += usize::from(end.state != TaskState::Succeeded);
        duplicated += audited.saturating_sub(1);
        lost += usize::from(audited == 0);
    }
    println!(
        "decision kills: {KILLS} supervisor kills around Verify: {before} before the decision committed, {after} after; {torn} torn (state, decision and audit disagreeing); {lost} lost, {duplicated} duplicated"
    );
    assert_eq!(torn, 0);
    assert_eq!((lost, duplicated), (0, 0));
    assert_eq!(before + after, KILLS);
}

//! Source capture end to end (issue 14, part 5; seed 001's
//! `source_capture`): a planner submits a capture plan with `airlockctl
//! capture` (the client's builder) to a real stack (supervisor, worker,
//! executor on a private dbus-daemon, a real git repository) and reads the
//! files back through `GetTask` (and `airlockctl show`, `--file`). A credential-like file the plan names is withheld:
//! listed, its content nowhere in the task. Nothing is committed.
//!
//! A capture is reused by a later attempt only when the execution and its
//! binding are identical (seed 001's `verify_latest_binding`): an admin's
//! rework gives attempt 2, which reports attempt 1's capture without
//! running the executor again; a replaced plan (another execution digest)
//! gives attempt 3, which captures afresh.

use airlock_builder::{Proposal, SourceRepo};
use airlock_local::client::Supervisor;
use airlock_local::{Suite, Tuning, start_with};
use airlock_proto::Code;
use airlock_proto::task::{
    Capture, DECISION_SCHEMA, Decision, DecisionRequest, TaskState, TaskView,
};
use airlock_testkit::{git_dir, git_dir_input};
use base64::Engine;
use serde_json::{Value, json};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const SECRET: &str = "AIRLOCK_TEST_TOKEN=hunter2-d14";

/// Adds `.env` (a credential-like path) to the demo repository's main,
/// as its owner would have committed it; returns the new main.
fn add_credential_file(repo: &Path) -> String {
    let blob = git_dir_input(
        repo,
        &["hash-object", "-w", "--stdin"],
        &format!("{SECRET}\n"),
    );
    let mut tree = git_dir(repo, &["ls-tree", "refs/heads/main"]);
    tree.push_str(&format!("\n100644 blob {blob}\t.env\n"));
    let tree = git_dir_input(repo, &["mktree"], &tree);
    let parent = git_dir(repo, &["rev-parse", "refs/heads/main"]);
    let commit = git_dir(repo, &["commit-tree", &tree, "-p", &parent, "-m", "config"]);
    git_dir(repo, &["update-ref", "refs/heads/main", &commit, &parent]);
    // What git made as root goes back to the repository's owner.
    let meta = std::fs::metadata(repo).unwrap();
    let status = Command::new("chown")
        .arg("-R")
        .arg(format!("{}:{}", meta.uid(), meta.gid()))
        .arg(repo)
        .status()
        .unwrap();
    assert!(status.success());
    commit
}

struct Stack {
    suite: Suite,
    client: Supervisor,
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.suite.fleet.stop(Duration::from_secs(5));
        let _ = std::fs::remove_dir_all(&self.suite.layout.root);
    }
}

impl Stack {
    /// Waits until `task` leaves QUEUED and RUNNING with `attempt` started.
    fn settled(&self, task: &str, attempt: u32) -> TaskView {
        let t = Instant::now();
        loop {
            let v = self
                .client
                .patiently(Duration::from_secs(30), |c| c.get_task(task))
                .unwrap();
            if v.attempt >= attempt && !matches!(v.state, TaskState::Queued | TaskState::Running) {
                return v;
            }
            assert!(
                t.elapsed() < Duration::from_secs(90),
                "{task} is still {:?} (attempt {}); the worker's log ends:\n{}",
                v.state,
                v.attempt,
                airlock_local::fleet::tail(&self.suite.layout.logs().join("worker.log"), 30)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs airlockctl on this stack's bus.
    fn ctl(&self, args: &[&str]) -> std::process::Output {
        let ctl = airlock_local::sibling("airlockctl").unwrap();
        airlock_testkit::airlockctl(&ctl, self.suite.bus.address(), args)
    }

    fn rework(&self, v: &TaskView, key: &str) {
        let req = DecisionRequest {
            schema: DECISION_SCHEMA.into(),
            task_id: v.task_id.clone(),
            decision: Decision::Rework,
            reason: "capture more".into(),
            idempotency_key: key.into(),
            expected_revision: v.revision,
            expected_attempt: v.attempt,
            expected_result_sha256: v.result_sha256.clone(),
        };
        self.client
            .patiently(Duration::from_secs(30), |c| c.verify(&req))
            .unwrap_or_else(|e| panic!("rework: {e}"));
    }
}

fn capture_of(v: &TaskView) -> Capture {
    let r = v.result.as_ref().expect("a result");
    assert_eq!(r["outcome"], "captured", "{r}");
    assert!(
        r["commit_oid"].is_null() && r["failure_code"].is_null(),
        "{r}"
    );
    serde_json::from_value(r["captured"].clone()).expect("a capture")
}

fn content(c: &Capture, path: &str) -> Option<String> {
    let f = c.files.iter().find(|f| f.path == path)?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(f.content_b64.as_deref()?)
        .unwrap();
    Some(String::from_utf8(bytes).unwrap())
}

#[test]
fn a_capture_plan_returns_its_files_through_get_task_withholds_credentials_and_is_reused_only_for_an_identical_binding()
 {
    let state = std::env::temp_dir().join(format!("airlock-capture-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&state);
    let suite = start_with(
        state,
        true,
        &Tuning {
            lease_seconds: 30,
            parallel_tasks: 1,
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("starting the suite: {e}"));
    let client = Supervisor::connect(Some(suite.bus.address())).expect("bus");
    let mut s = Stack { suite, client };
    let repo = s.suite.layout.repos().join("demo.git");
    let base = add_credential_file(&repo);
    let calc = git_dir(&repo, &["show", &format!("{base}:calc.py")]);

    // The planner's side: the client's builder, as airlockctl capture uses it.
    let source = SourceRepo::open(&repo).unwrap();
    let mut proposal = Proposal::new("demo", "main");
    proposal.task_id = Some("cap-1".into());
    proposal.max_attempts = 3;
    let built = proposal
        .capture(
            &source,
            &["calc.py".into(), ".env".into(), "nothing/here.txt".into()],
            &["  why does   add subtract? ".into(), "".into()],
        )
        .unwrap();
    assert_eq!(built.base_oid, base);
    // airlockctl capture builds the same task with the same builder, and
    // submits it; --wait shows the capture once it is there.
    let cfg = s.suite.layout.config();
    let capture_args = [
        "capture",
        "--config",
        cfg.to_str().unwrap(),
        "--repo",
        "demo",
        "--base",
        "main",
        "--task-id",
        "cap-1",
        "--max-attempts",
        "3",
        "--signal",
        "  why does   add subtract? ",
        "--signal",
        "",
        "calc.py",
        ".env",
        "nothing/here.txt",
    ];
    let dry = s.ctl(&[&capture_args[..], &["--dry-run", "--json"]].concat());
    assert!(
        dry.status.success(),
        "{}",
        String::from_utf8_lossy(&dry.stderr)
    );
    let dry: Value = serde_json::from_slice(&dry.stdout).unwrap();
    assert_eq!(dry, built.task, "airlockctl capture and the builder agree");
    let out = s.ctl(&[&capture_args[..], &["--wait"]].concat());
    let shown = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{shown}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "Result: captured",
        "Captured: 2 file(s)",
        "File: calc.py  ",
        "File: nothing/here.txt  (no such file at the source commit)",
        "Withheld: .env (credential-like: never read)",
        "Signals: why does add subtract?",
    ] {
        assert!(shown.contains(line), "{line:?} in:\n{shown}");
    }
    let file = s.ctl(&["show", "cap-1", "--file", "calc.py"]);
    assert!(file.status.success());
    assert_eq!(String::from_utf8_lossy(&file.stdout), format!("{calc}\n"));
    let file = s.ctl(&["show", "cap-1", "--file", ".env"]);
    assert_eq!(
        file.status.code(),
        Some(i32::from(Code::CREDENTIAL_PATH_DENIED.exit_code())),
        "{}",
        String::from_utf8_lossy(&file.stderr)
    );
    assert!(file.stdout.is_empty());

    // Attempt 1 captured; the result reaches the planner through GetTask.
    let v = s.settled("cap-1", 1);
    let c = capture_of(&v);
    assert_eq!((v.attempt, c.captured_in_attempt), (1, 1), "{:?}", v.result);
    assert_eq!(
        content(&c, "calc.py").as_deref(),
        Some(format!("{calc}\n").as_str())
    );
    let missing = c
        .files
        .iter()
        .find(|f| f.path == "nothing/here.txt")
        .unwrap();
    assert!(!missing.present && missing.content_b64.is_none());
    assert_eq!(c.withheld, [".env"], "the credential path is withheld");
    assert!(c.files.iter().all(|f| f.path != ".env"));
    assert_eq!(c.source_signals, ["why does add subtract?"]);
    let whole = serde_json::to_string(&v).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD.encode(format!("{SECRET}\n"));
    assert!(
        !whole.contains("hunter2") && !whole.contains(&b64),
        "the credential's content is nowhere in the task"
    );
    assert_eq!(
        git_dir(&repo, &["for-each-ref", "refs/heads/agent/"]),
        "",
        "a capture commits nothing"
    );
    assert_eq!(
        v.state,
        TaskState::Verifying,
        "a capture's result waits for a decision"
    );

    // Identical execution and binding: attempt 2 reuses attempt 1's capture.
    s.rework(&v, "rework-cap-1-a1");
    let v2 = s.settled("cap-1", 2);
    let c2 = capture_of(&v2);
    assert_eq!(v2.attempt, 2);
    assert_eq!(
        c2.captured_in_attempt, 1,
        "attempt 2 reused attempt 1's capture"
    );
    assert_eq!(
        (c2.files.clone(), c2.withheld.clone()),
        (c.files.clone(), c.withheld.clone())
    );
    let log = s.suite.layout.logs().join("worker.log");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.lines()
            .any(|l| l.contains("reusing the capture of attempt 1") && l.contains("cap-1")),
        "{}",
        airlock_local::fleet::tail(&log, 20)
    );

    // A replaced plan is another execution: attempt 3 captures afresh. The
    // worker is stopped so the plan can be replaced while QUEUED.
    assert!(s.suite.fleet.kill("worker"));
    s.rework(&v2, "rework-cap-1-a2");
    let queued = s.client.get_task("cap-1").unwrap();
    assert_eq!(queued.state, TaskState::Queued);
    let mut plan: Value = built.task["plan"].clone();
    plan["idempotency_key"] = json!("plan-cap-1-2");
    plan["execution"]["capture_paths"] = json!(["test_calc.py"]);
    plan["expected_previous_plan_digest"] = json!(queued.plan_digest);
    s.client
        .patiently(Duration::from_secs(30), |c| c.replace_plan("cap-1", &plan))
        .unwrap_or_else(|e| panic!("ReplacePlan: {e}"));
    let ids = s.suite.ids;
    let logs = s.suite.layout.logs();
    s.suite.fleet.restart("worker", &[], &ids, &logs).unwrap();
    let v3 = s.settled("cap-1", 3);
    assert_ne!(v3.execution_digest, v2.execution_digest);
    let c3 = capture_of(&v3);
    assert_eq!(
        (v3.attempt, c3.captured_in_attempt),
        (3, 3),
        "another execution digest: no reuse"
    );
    let test_calc = git_dir(&repo, &["show", &format!("{base}:test_calc.py")]);
    assert_eq!(
        content(&c3, "test_calc.py").as_deref(),
        Some(format!("{test_calc}\n").as_str())
    );
    assert!(c3.withheld.is_empty() && c3.files.len() == 1);
}

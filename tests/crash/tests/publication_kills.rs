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

use airlock_crash_matrix::{file_len, git, log_since};
use airlock_local::client::{Supervisor, task_on_demo};
use airlock_local::{LocalUpstream, Suite, Tuning, start_with};
use airlock_proto::task::{TaskState, TaskView};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Where the worker is killed, in the order an attempt passes them.
const POINTS: &[&str] = &["before_push", "after_push", "published"];
/// Tasks; each is killed at every point.
const TASKS: usize = 18;
const PATIENCE: Duration = Duration::from_secs(20);

struct Stack {
    suite: Suite,
    client: Supervisor,
    upstream: PathBuf,
    _dir: tempfile::TempDir,
}

impl Stack {
    fn restart(&mut self, env: &[(&str, &str)]) {
        let ids = self.suite.ids;
        let logs = self.suite.layout.logs();
        self.suite
            .fleet
            .restart("worker", env, &ids, &logs)
            .unwrap_or_else(|e| panic!("restarting the worker: {e}"));
    }

    /// The worker armed with `point`; true when it died there for `task`.
    fn kill_at(&mut self, point: &str, task: &str) -> bool {
        let log = self.suite.layout.logs().join("worker.log");
        let offset = file_len(&log);
        self.restart(&[("AIRLOCK_FAULT_KILL_AFTER", point)]);
        match self.suite.fleet.wait_exit("worker", PATIENCE) {
            Some(status) if status.signal() == Some(9) => {
                let text = log_since(&log, offset);
                let needle = format!("fault injection: SIGKILL at {point} task {task}");
                assert!(
                    text.contains(&needle),
                    "killed, but not at {point} for {task}:\n{text}"
                );
                true
            }
            Some(status) => panic!(
                "the worker armed with {point} exited by itself ({status}):\n{}",
                log_since(&log, offset)
            ),
            None => {
                self.suite.fleet.kill("worker");
                false
            }
        }
    }

    fn settled(&self, task: &str) -> TaskView {
        let t = Instant::now();
        loop {
            let v = self
                .client
                .patiently(Duration::from_secs(30), |c| c.get_task(task))
                .unwrap();
            if v.state.is_terminal() {
                return v;
            }
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "{task} is still {:?}:\n{}",
                v.state,
                airlock_local::fleet::tail(&self.suite.layout.logs().join("worker.log"), 30)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn publications_happen_exactly_once_across_kills_around_the_push() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let ids = airlock_local::layout::Ids::for_caller().unwrap();
    // The team's upstream: one commit on main, every ref update logged.
    let upstream = dir.path().join("upstream.git");
    let work = dir.path().join("work");
    let run = |cwd: &Path, args: &[&str]| {
        airlock_testkit::git(cwd, args);
    };
    run(
        dir.path(),
        &["init", "-q", "--bare", "-b", "main", "upstream.git"],
    );
    run(dir.path(), &["init", "-q", "-b", "main", "work"]);
    std::fs::write(work.join("README.md"), "hello\n").unwrap();
    run(&work, &["add", "-A"]);
    run(&work, &["commit", "-q", "-m", "base"]);
    run(&work, &["push", "-q", upstream.to_str().unwrap(), "main"]);
    git(&upstream, &["config", "core.logAllRefUpdates", "always"]);
    let st = Command::new("chown")
        .arg("-R")
        .arg(format!("{}:{}", ids.worker.uid, ids.worker.gid))
        .arg(&upstream)
        .status()
        .unwrap();
    assert!(st.success());
    let signing = dir.path().join("signing");
    airlock_testkit::ssh_keygen(&signing);

    let suite = start_with(
        dir.path().join("state"),
        true,
        &Tuning {
            lease_seconds: 30,
            parallel_tasks: 1,
            upstreams: vec![LocalUpstream {
                name: "pub".into(),
                upstream: airlock_config::Upstream {
                    sync_interval_seconds: 0,
                    ..airlock_config::Upstream::at(upstream.to_str().unwrap())
                },
                credential: None,
                signing: Some(("agent@example.org".into(), signing.clone())),
            }],
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("starting the suite: {e}"));
    let client = Supervisor::connect(Some(suite.bus.address())).expect("bus");
    let authority = suite.layout.repos().join("pub.git");
    let mut s = Stack {
        suite,
        client,
        upstream: upstream.clone(),
        _dir: dir,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let base = loop {
        let b = git(
            &authority,
            &["rev-parse", "--verify", "--quiet", "refs/heads/main"],
        );
        if !b.is_empty() {
            break b;
        }
        assert!(Instant::now() < deadline, "the first sync never came");
        std::thread::sleep(Duration::from_millis(100));
    };

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
        s.client
            .patiently(Duration::from_secs(30), |c| c.submit_task(&submission))
            .unwrap_or_else(|e| panic!("SubmitTask: {e}"));
        for point in POINTS {
            if s.kill_at(point, &task) {
                *kills.entry(point).or_default() += 1;
                if *point == "after_push" {
                    let remote = git(
                        &s.upstream,
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
        s.restart(&[]);
        tasks.push(task);
    }

    // Everything settles; then the upstream is checked task by task.
    let signer = airlock_git::Signer::load(&signing, "agent@example.org").unwrap();
    let allowed = signer.allowed_signers_line();
    let scratch = s.suite.layout.path("");
    let (mut lost, mut duplicated, mut unsigned, mut replays) = (0, 0, 0, 0);
    for task in &tasks {
        let v = s.settled(task);
        assert_eq!(v.state, TaskState::Succeeded, "{task}: {:?}", v.result);
        let result = v.result.unwrap();
        let commit = result["commit_oid"].as_str().unwrap().to_owned();
        let branch = format!("refs/heads/agent/{task}");
        let remote = git(&s.upstream, &["rev-parse", "--verify", "--quiet", &branch]);
        let local = git(&authority, &["rev-parse", "--verify", "--quiet", &branch]);
        if remote != commit || local != commit {
            lost += 1;
        }
        let updates = git(&s.upstream, &["reflog", "show", "--format=%H", &branch]);
        if updates.lines().count() != 1 {
            duplicated += 1;
        }
        let out = airlock_testkit::verify_commit(&s.upstream, &scratch, &allowed, &commit);
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

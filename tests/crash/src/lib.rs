//! The crash tests live in `tests/`; this library holds what they share:
//! the full stack they kill components of ([`Stack`]), the fault points
//! the worker's own table names ([`fault_points`]), git on a repository
//! another uid owns, the part of a log written since an offset, the
//! markers that prove a command was running when the executor died
//! ([`marked_sleep`], [`in_flight`]), and the check that tasks converged
//! with nothing lost or duplicated ([`Stack::converged`]).
//!
//! The stack lives here rather than in tests/kit: it restarts the
//! worker armed with a fault, which needs the worker built with its
//! `fault-injection` feature — a feature this crate turns on for the
//! whole workspace build, and one no other suite should depend on.
//! (tests/crash/tests/multi_host.rs keeps its own three-host helpers.)

use airlock_local::client::Supervisor;
use airlock_local::{Suite, Tuning, start_with};
use airlock_proto::task::TaskState;
use airlock_proto::task::TaskView;
use airlock_testkit::poll;
use airlock_worker::fault::{Attempt, FaultPoint};
use serde_json::{Value, json};
use std::io::Write as _;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The fault points an attempt of this kind passes, in order, from the
/// worker's own table ([`FaultPoint::all`]): a new phase is killed at
/// without a change here.
pub fn fault_points(attempt: Attempt) -> Vec<&'static str> {
    FaultPoint::all()
        .into_iter()
        .filter(|p| p.passed_by(attempt))
        .map(FaultPoint::as_str)
        .collect()
}

/// How long a call waits for a supervisor that is being restarted.
const PATIENCE: Duration = Duration::from_secs(30);

/// airlock-local's whole suite as real processes, with a task client; its
/// components stopped and its state removed when dropped.
pub struct Stack {
    /// The running suite.
    pub suite: Suite,
    /// A task client on the suite's bus.
    pub client: Supervisor,
    /// The demo repository's main at start.
    pub base: String,
}

impl Stack {
    /// The suite with a 30 s lease and one task at a time, its state in a
    /// fresh temporary directory named for the test.
    pub fn start(name: &str) -> Stack {
        Stack::with(
            name,
            Tuning {
                lease_seconds: 30,
                parallel_tasks: 1,
                ..Default::default()
            },
        )
    }

    /// [`Stack::start`] with this tuning.
    pub fn with(name: &str, tuning: Tuning) -> Stack {
        let state = std::env::temp_dir().join(format!("airlock-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&state);
        Stack::at(state, &tuning)
    }

    /// The suite with its state at `state` (removed when dropped).
    pub fn at(state: PathBuf, tuning: &Tuning) -> Stack {
        let suite =
            start_with(state, true, tuning).unwrap_or_else(|e| panic!("starting the suite: {e}"));
        let base = git(
            &suite.layout.repos().join("demo.git"),
            &["rev-parse", "refs/heads/main"],
        );
        let client = Supervisor::connect(Some(suite.bus.address())).expect("bus connection");
        Stack {
            suite,
            client,
            base,
        }
    }

    /// The suite's logs directory.
    pub fn logs(&self) -> PathBuf {
        self.suite.layout.logs()
    }

    /// The worker's log.
    pub fn worker_log(&self) -> PathBuf {
        self.logs().join("worker.log")
    }

    /// The demo repository.
    pub fn repo(&self) -> PathBuf {
        self.suite.layout.repos().join("demo.git")
    }

    /// Restarts component `name` with `env` (an armed fault, or nothing).
    pub fn restart(&mut self, name: &str, env: &[(&str, &str)]) {
        let ids = self.suite.ids;
        let logs = self.logs();
        self.suite
            .fleet
            .restart(name, env, &ids, &logs)
            .unwrap_or_else(|e| panic!("restarting {name}: {e}"));
    }

    /// Restarts the worker with `env`.
    pub fn restart_worker(&mut self, env: &[(&str, &str)]) {
        self.restart("worker", env);
    }

    /// Submits `submission`, waiting out a supervisor restart.
    pub fn submit(&self, submission: &Value) {
        self.client
            .patiently(PATIENCE, |c| c.submit_task(submission))
            .unwrap_or_else(|e| panic!("SubmitTask: {e}"));
    }

    /// The task now, waiting out a supervisor restart.
    pub fn get(&self, task: &str) -> TaskView {
        self.client
            .patiently(PATIENCE, |c| c.get_task(task))
            .unwrap_or_else(|e| panic!("GetTask {task}: {e}"))
    }

    /// Waits for `task` to be terminal, at most `within`; the failure
    /// names its state, attempt and the worker's last log lines.
    pub fn settled(&self, task: &str, within: Duration) -> TaskView {
        poll(within, Duration::from_millis(100), || {
            let v = self.get(task);
            if v.state.is_terminal() {
                Ok(v)
            } else {
                Err(format!(
                    "{task} is still {:?} (attempt {}) after {within:?}; the worker's log ends:\n{}",
                    v.state,
                    v.attempt,
                    airlock_local::fleet::tail(&self.worker_log(), 30)
                ))
            }
        })
    }

    /// The task's events as `ACTION:outcome`.
    pub fn actions(&self, task: &str) -> Vec<String> {
        self.client
            .list_events(task, 0, 1000)
            .unwrap()
            .events
            .into_iter()
            .map(|e| format!("{}:{}", e.action, e.outcome))
            .collect()
    }

    /// Restarts the worker armed to SIGKILL itself at `point` and waits
    /// `patience` for it to. True when it died of SIGKILL there for
    /// `task` (its log since the restart says so); false when it did not
    /// reach the point in time (the harness then kills it). An exit of
    /// its own is a failure.
    pub fn kill_at(&mut self, point: &str, task: &str, patience: Duration) -> bool {
        let log = self.worker_log();
        let offset = file_len(&log);
        self.restart_worker(&[("AIRLOCK_FAULT_KILL_AFTER", point)]);
        match self.suite.fleet.wait_exit("worker", patience) {
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
}

/// A stack whose repository `pub` follows a local bare upstream that
/// publishes (`agent/*` pushed there after each commit), made in `dir`:
/// one commit on the upstream's main, every ref update logged, owned by the
/// worker; `signing`, when given, the repository's signer. Returns the
/// stack once the first sync brought main into the authority repository.
pub fn publishing_stack(dir: &std::path::Path, signing: Option<PathBuf>) -> Publishing {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let ids = airlock_local::layout::Ids::for_caller().unwrap();
    let upstream = dir.join("upstream.git");
    let work = dir.join("work");
    airlock_testkit::git(dir, &["init", "-q", "--bare", "-b", "main", "upstream.git"]);
    airlock_testkit::git(dir, &["init", "-q", "-b", "main", "work"]);
    std::fs::write(work.join("README.md"), "hello\n").unwrap();
    airlock_testkit::git(&work, &["add", "-A"]);
    airlock_testkit::git(&work, &["commit", "-q", "-m", "base"]);
    airlock_testkit::git(&work, &["push", "-q", upstream.to_str().unwrap(), "main"]);
    git(&upstream, &["config", "core.logAllRefUpdates", "always"]);
    let st = std::process::Command::new("chown")
        .arg("-R")
        .arg(format!("{}:{}", ids.worker.uid, ids.worker.gid))
        .arg(&upstream)
        .status()
        .unwrap();
    assert!(st.success());
    let stack = Stack::at(
        dir.join("state"),
        &Tuning {
            lease_seconds: 30,
            parallel_tasks: 1,
            upstreams: vec![airlock_local::LocalUpstream {
                name: "pub".into(),
                upstream: airlock_config::Upstream {
                    sync_interval_seconds: 0,
                    ..airlock_config::Upstream::at(upstream.to_str().unwrap())
                },
                credential: None,
                signing: signing.map(|key| ("agent@example.org".into(), key)),
            }],
            ..Default::default()
        },
    );
    let authority = stack.suite.layout.repos().join("pub.git");
    let base = poll(Duration::from_secs(30), Duration::from_millis(100), || {
        let b = git(
            &authority,
            &["rev-parse", "--verify", "--quiet", "refs/heads/main"],
        );
        if b.is_empty() {
            Err("the first sync never came".to_owned())
        } else {
            Ok(b)
        }
    });
    Publishing {
        stack,
        upstream,
        authority,
        base,
    }
}

/// What [`publishing_stack`] makes.
#[derive(Debug)]
pub struct Publishing {
    /// The stack.
    pub stack: Stack,
    /// The upstream (a bare repository on this host).
    pub upstream: PathBuf,
    /// The authority repository of `pub`.
    pub authority: PathBuf,
    /// main, as the first sync brought it.
    pub base: String,
}

impl std::fmt::Debug for Stack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stack")
            .field("root", &self.suite.layout.root)
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

/// How the tasks a kill test ran ended: each counted once, by what went
/// wrong with it.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Converged {
    /// Tasks that SUCCEEDED.
    pub succeeded: usize,
    /// Tasks whose branch is not at the commit their result reports.
    pub lost: usize,
    /// Tasks whose commit is not exactly one on top of their base.
    pub duplicated: usize,
    /// Tasks whose result was accepted other than once.
    pub accepted_other_than_once: usize,
}

impl Stack {
    /// Waits for each (task, base) to settle, at most `within` each, and
    /// asserts it SUCCEEDED; then counts what is wrong with each: its
    /// `agent/<task>` branch at the commit its result reports, that commit
    /// exactly one on top of its base, its result accepted once.
    pub fn converged(&self, tasks: &[(String, String)], within: Duration) -> Converged {
        let repo = self.repo();
        let mut c = Converged::default();
        for (task, base) in tasks {
            let v = self.settled(task, within);
            assert_eq!(v.state, TaskState::Succeeded, "{task}: {:?}", v.result);
            c.succeeded += 1;
            let commit = v.result.unwrap()["commit_oid"].as_str().unwrap().to_owned();
            let branch = format!("refs/heads/agent/{task}");
            if git(&repo, &["rev-parse", "--verify", "--quiet", &branch]) != commit {
                c.lost += 1;
            }
            let on_top = git(
                &repo,
                &["rev-list", "--count", &format!("{base}..{commit}")],
            );
            if on_top != "1" {
                c.duplicated += 1;
            }
            let accepted = self
                .actions(task)
                .iter()
                .filter(|a| a.as_str() == "TASK_RESULT_SUBMITTED:allowed")
                .count();
            if accepted != 1 {
                c.accepted_other_than_once += 1;
            }
        }
        c
    }

    /// Moves the repository's main one commit ahead (a file of its own,
    /// `moving/round.txt`, says `round`), as the repository's owner;
    /// returns the new head.
    pub fn advance_main(&self, round: usize) -> String {
        use std::os::unix::fs::MetadataExt;
        let repo = self.repo();
        let head = git(&repo, &["rev-parse", "refs/heads/main"]);
        let message = format!("move the base, round {round}\n");
        let content = format!("round {round}\n");
        let mut stream = Vec::new();
        write!(
            stream,
            "commit refs/heads/main\ncommitter t <t@airlock.invalid> {} +0000\ndata {}\n{message}from {head}\nM 100644 inline moving/round.txt\ndata {}\n{content}\n",
            1_700_000_000 + round,
            message.len(),
            content.len()
        )
        .unwrap();
        airlock_testkit::fast_import(&repo, &stream);
        let meta = std::fs::metadata(&repo).unwrap();
        let st = std::process::Command::new("chown")
            .arg("-R")
            .arg(format!("{}:{}", meta.uid(), meta.gid()))
            .arg(&repo)
            .status()
            .unwrap();
        assert!(st.success());
        git(&repo, &["rev-parse", "refs/heads/main"])
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.suite.fleet.stop(Duration::from_secs(5));
        let _ = std::fs::remove_dir_all(&self.suite.layout.root);
    }
}

/// git on a bare repository any uid owns, empty when git fails
/// ([`airlock_testkit::git_dir_or_empty`]).
pub use airlock_testkit::git_dir_or_empty as git;

/// A log's length and what was appended since (shared with the power-loss
/// matrix: [`airlock_testkit::file_len`], [`airlock_testkit::log_since`]).
pub use airlock_testkit::{file_len, log_since};

/// How often `needle` stands in the file at `path` (0 when it cannot be
/// read): a component's log lines of one kind.
pub fn count_in(path: &Path, needle: &str) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .matches(needle)
        .count()
}

/// What a marked command writes into its workspace when it starts (a
/// nonce: the time in ns).
pub const START_MARKER: &str = "crash-start";
/// What a marked command writes into its workspace just before it exits.
pub const END_MARKER: &str = "crash-end";

/// A verification command's argv that writes [`START_MARKER`] into its
/// workspace, sleeps `seconds`, then writes [`END_MARKER`]. A workspace's
/// new files land in the executor's per-request directory
/// (`exec/work/<request>/…`), where the harness (root) reads them: a kill
/// that finds the same start nonce and still no end marker before and
/// after it landed while the command ran.
pub fn marked_sleep(seconds: f64) -> Value {
    let script = format!(
        "import os, time\n\
         d = os.getcwd()\n\
         open(os.path.join(d, '{START_MARKER}'), 'w').write(str(time.time_ns()))\n\
         time.sleep({seconds})\n\
         open(os.path.join(d, '{END_MARKER}'), 'w').write('done')\n"
    );
    json!(["/usr/bin/python3", "-c", script])
}

/// Every command directory under the executor's work root `work` that
/// holds a start marker: (directory, start nonce, end marker present).
pub fn markers(work: &Path) -> Vec<(PathBuf, String, bool)> {
    let mut found = Vec::new();
    let Ok(requests) = std::fs::read_dir(work) else {
        return found;
    };
    for request in requests.filter_map(Result::ok) {
        let Ok(dirs) = std::fs::read_dir(request.path()) else {
            continue;
        };
        for dir in dirs.filter_map(Result::ok) {
            let dir = dir.path();
            if let Ok(nonce) = std::fs::read_to_string(dir.join(START_MARKER)) {
                let ended = dir.join(END_MARKER).exists();
                found.push((dir, nonce, ended));
            }
        }
    }
    found
}

/// The marked commands that had started and not ended when looked at:
/// (directory, start nonce).
pub fn in_flight(work: &Path) -> Vec<(PathBuf, String)> {
    markers(work)
        .into_iter()
        .filter(|(_, nonce, ended)| !ended && !nonce.is_empty())
        .map(|(dir, nonce, _)| (dir, nonce))
        .collect()
}

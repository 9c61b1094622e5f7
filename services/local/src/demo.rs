//! The demo: a sample repository with a bug, a plan that fixes it, and the
//! whole pipeline carrying it to a verified commit on an agent/ branch.

use crate::client::{Supervisor, task_on_demo};
use crate::layout::{self, Ids, Layout};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const CALC_PY: &str = "def add(a, b):\n    return a - b\n";
const TEST_PY: &str = "import unittest\n\nfrom calc import add\n\n\nclass AddTest(unittest.TestCase):\n    def test_adds(self):\n        self.assertEqual(add(2, 3), 5)\n\n\nif __name__ == \"__main__\":\n    unittest.main()\n";

/// Makes `repos/demo.git` (once): a tiny Python project whose `add` subtracts.
pub fn create_repository(layout: &Layout, ids: &Ids) -> Result<(), String> {
    create_repository_at(&layout.repos(), ids)
}

/// Makes the demo repository `demo.git` in `repos` unless it exists.
pub fn create_repository_at(repos: &std::path::Path, ids: &Ids) -> Result<(), String> {
    let bare = repos.join("demo.git");
    if bare.exists() {
        return Ok(());
    }
    // Plumbing on a new bare repository, through crates/git: two blobs, a
    // tree, one commit on main. Made under a temporary name and renamed,
    // so an interrupted demo leaves no half-made demo.git.
    let tmp = repos.join(".demo.git.tmp");
    let _ = std::fs::remove_dir_all(&tmp);
    let fail = |e: airlock_git::GitError| format!("making the demo repository: {e}");
    let git =
        airlock_git::init(airlock_git::default_program(), &tmp, true, "sha1").map_err(fail)?;
    let blob = |text: &str| {
        git.output_with(
            &["hash-object", "-w", "--stdin"],
            Some(text.as_bytes()),
            &[],
        )
        .map(|o| o.trim().to_owned())
        .map_err(fail)
    };
    let tree_text = format!(
        "100644 blob {}\tcalc.py\n100644 blob {}\ttest_calc.py\n",
        blob(CALC_PY)?,
        blob(TEST_PY)?
    );
    let tree = git
        .output_with(&["mktree"], Some(tree_text.as_bytes()), &[])
        .map_err(fail)?;
    let who = [
        ("GIT_AUTHOR_NAME", "airlock demo"),
        ("GIT_AUTHOR_EMAIL", "demo@airlock.invalid"),
        ("GIT_COMMITTER_NAME", "airlock demo"),
        ("GIT_COMMITTER_EMAIL", "demo@airlock.invalid"),
    ];
    let commit = git
        .output_with(
            &["commit-tree", "-m", "calc: add two numbers", tree.trim()],
            None,
            &who,
        )
        .map_err(fail)?;
    git.output(&["update-ref", "refs/heads/main", commit.trim()])
        .map_err(fail)?;
    git.output(&["symbolic-ref", "HEAD", "refs/heads/main"])
        .map_err(fail)?;
    airlock_git::sync_tree(&tmp).map_err(|e| e.to_string())?;
    std::fs::rename(&tmp, &bare).map_err(|e| format!("{}: {e}", bare.display()))?;
    layout::chown_tree(&bare, ids.worker, ids)
        .map_err(|e| format!("giving {} to the worker: {e}", bare.display()))
}

async fn connect(address: &str) -> zbus::Result<zbus::Connection> {
    zbus::connection::Builder::address(address)?.build().await
}

/// Waits until the supervisor owns its name on the bus.
pub fn wait_for_name(address: &str, timeout: Duration) -> Result<(), String> {
    let rt = runtime()?;
    rt.block_on(async {
        let conn = connect(address).await.map_err(|e| e.to_string())?;
        let dbus = zbus::fdo::DBusProxy::new(&conn)
            .await
            .map_err(|e| e.to_string())?;
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            let name = zbus::names::BusName::try_from("org.airlock.Supervisor1")
                .map_err(|e| e.to_string())?;
            if dbus.name_has_owner(name).await.unwrap_or(false) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err("the supervisor did not take org.airlock.Supervisor1 in time".to_owned())
    })
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
}

fn submission(task_id: &str, base: &str) -> Value {
    let sha = airlock_proto::canonical::sha256_hex(CALC_PY.as_bytes());
    task_on_demo(
        task_id,
        base,
        2,
        json!({"operation": "replace_text", "path": "calc.py", "old": "return a - b",
               "new": "return a + b", "count": 1, "expected_sha256": sha}),
        json!([
            {"label": "compile", "argv": ["/usr/bin/python3", "-m", "py_compile", "calc.py"], "timeout_seconds": 60},
            {"label": "unit tests", "argv": ["/usr/bin/python3", "-m", "unittest", "-v", "test_calc"], "timeout_seconds": 120},
        ]),
    )
}

/// Runs the demo end to end.
pub fn run(json_out: bool, state: Option<std::path::PathBuf>) -> Result<(), String> {
    let temporary = state.is_none();
    let state = state.unwrap_or_else(|| {
        let mut r = [0u8; 6];
        let _ = getrandom::getrandom(&mut r);
        std::env::temp_dir().join(format!("airlock-demo-{}", hex::encode(r)))
    });
    let say = |s: &str| {
        if !json_out {
            println!("{s}");
        }
    };
    say("airlock demo: starting the supervisor, worker, executor and retry API…");
    let outcome = (|| {
        let suite = crate::start(state.clone(), json_out)?;
        say(&format!(
            "  started ({}); logs in {}",
            if suite.ids.separated {
                "one uid per component"
            } else {
                "privilege separation OFF: not root"
            },
            suite.layout.logs().display()
        ));
        let bare = suite.layout.repos().join("demo.git");
        // Read as the repository it now is: the worker's.
        let demo = airlock_git::Git::new(airlock_git::default_program(), bare);
        let git = |args: &[&str]| {
            demo.output(args)
                .map(|o| o.trim().to_owned())
                .map_err(|e| e.to_string())
        };
        let base = git(&["rev-parse", "refs/heads/main"])?;
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let task_id = format!("demo-{stamp}");
        let client = Supervisor::connect(Some(suite.bus.address())).map_err(|e| e.to_string())?;
        client
            .submit_task(&submission(&task_id, &base))
            .map_err(|e| e.to_string())?;
        say(&format!(
            "  submitted {task_id}: fix calc.add, verify with py_compile and unittest"
        ));
        let (view, transitions) = {
            let mut last = String::new();
            let mut transitions = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(180);
            loop {
                let view = client.get_task(&task_id).map_err(|e| e.to_string())?;
                let state = view.state.as_str().to_owned();
                if state != last {
                    say(&format!(
                        "  {:>9}  attempt {}/{}",
                        state, view.attempt, view.max_attempts
                    ));
                    transitions.push(state.clone());
                    last = state.clone();
                }
                if matches!(state.as_str(), "SUCCEEDED" | "FAILED" | "CANCELLED") {
                    break (view, transitions);
                }
                if Instant::now() > deadline {
                    return Err(format!("{task_id} still {state} after 180 s"));
                }
                std::thread::sleep(Duration::from_millis(150));
            }
        };
        let result = view.result.clone().unwrap_or_default();
        let commit = result["commit_oid"].as_str().map(str::to_owned);
        let branch = view.binding.target_branch.clone();
        let diffstat = match &commit {
            Some(c) => git(&["diff", "--stat", &base, c])?,
            None => String::new(),
        };
        let branch_head = git(&["rev-parse", &format!("refs/heads/{branch}")]).ok();
        if json_out {
            println!(
                "{}",
                json!({
                    "task_id": task_id, "state": view.state.as_str(), "commit_oid": commit, "target_branch": branch,
                    "branch_head": branch_head, "base_oid": base, "diffstat": diffstat,
                    "verification": result["verification"], "isolation": result["isolation"],
                    "transitions": transitions,
                    "privilege_separation": suite.ids.separated,
                })
            );
        } else {
            println!();
            println!("task      {task_id}: {}", view.state.as_str());
            if let Some(c) = &commit {
                println!(
                    "commit    {c} on {branch} (branch head {})",
                    branch_head.as_deref().unwrap_or("?")
                );
                println!("diff      {}", diffstat.replace('\n', "\n          "));
            }
            println!("evidence");
            for c in result["verification"].as_array().into_iter().flatten() {
                println!(
                    "          {:<12} exit {}  {} ms{}",
                    c["label"].as_str().unwrap_or(""),
                    c["exit_code"],
                    c["duration_ms"],
                    if c["timed_out"] == true {
                        "  TIMED OUT"
                    } else {
                        ""
                    }
                );
            }
            if let Some(code) = result["failure_code"].as_str() {
                println!("failure   {code}");
            }
        }
        drop(suite);
        if view.state == airlock_proto::task::TaskState::Succeeded {
            Ok(())
        } else {
            Err(format!("the demo task ended {}", view.state.as_str()))
        }
    })();
    if temporary {
        if outcome.is_ok() {
            let _ = std::fs::remove_dir_all(&state);
        } else {
            eprintln!(
                "airlock-local: state kept for inspection in {}",
                state.display()
            );
        }
    }
    outcome
}

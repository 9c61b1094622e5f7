//! End to end on airlock-local (the real supervisor, worker, executor and
//! sandbox as separate processes, separate uids as root): a scripted MCP
//! client built on rmcp's own client plays a coding agent. It reads the
//! repository through airlock-mcp, proposes a fix that the project's own
//! tests verify in the sandbox, and the verified commit lands on agent/*;
//! then a change whose test fails, printing terminal escapes, FAILS with
//! no branch and a clean log.
//!
//! Needs the workspace's binaries built (`cargo build --workspace --bins`,
//! which ./scripts/test does first).

use airlock_testkit::git;
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::transport::TokioChildProcess;
use serde_json::{Map, Value, json};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// A small Python project whose test fails on main (add subtracts).
fn project(dir: &Path) -> std::path::PathBuf {
    let src = dir.join("calc-src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("calc.py"), "def add(a, b):\n    return a - b\n").unwrap();
    std::fs::write(
        src.join("test_calc.py"),
        "import unittest\n\nimport calc\n\n\nclass AddTest(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(calc.add(2, 3), 5)\n\n\nif __name__ == \"__main__\":\n    unittest.main()\n",
    )
    .unwrap();
    git(&src, &["init", "-q", "-b", "main"]);
    git(&src, &["add", "-A"]);
    git(&src, &["commit", "-q", "-m", "calc"]);
    src
}

fn args(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => panic!("arguments are an object"),
    }
}

/// The structured result, after checking the text mirrors it.
fn structured(r: &CallToolResult) -> (bool, Value) {
    let s = r.structured_content.clone().expect("structuredContent");
    let text = r.content[0].as_text().expect("text content").text.clone();
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), s);
    (r.is_error == Some(true), s)
}

#[test]
fn a_scripted_agent_lands_a_verified_commit_on_an_agent_branch_through_airlock_mcp() {
    let scratch = tempfile::tempdir().unwrap();
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let src = project(scratch.path());
    let suite = airlock_local::start_with(
        scratch.path().join("state"),
        true,
        &airlock_local::Tuning {
            repositories: vec![("calc".into(), src.clone())],
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("starting airlock-local: {e}"));
    let authority = suite.layout.repos().join("calc.git");
    let branch_head = |branch: &str| {
        Command::new("git")
            .arg(format!("--git-dir={}", authority.display()))
            .args([
                "rev-parse",
                "--verify",
                "--quiet",
                &format!("refs/heads/{branch}"),
            ])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(agent(scratch.path(), &suite, &authority, &branch_head));
    let mut suite = suite;
    suite.fleet.stop(Duration::from_secs(10));
}

async fn agent(
    scratch: &Path,
    suite: &airlock_local::Suite,
    authority: &Path,
    branch_head: &dyn Fn(&str) -> Option<String>,
) {
    // The agent's client starts airlock-mcp the way .mcp.json says.
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_airlock-mcp"));
    cmd.arg("--config")
        .arg(suite.layout.config())
        .arg("--presets")
        .arg(scratch.join("no-presets.toml"))
        .env("DBUS_SYSTEM_BUS_ADDRESS", suite.bus.address());
    let stderr = scratch.join("airlock-mcp.stderr");
    let (transport, _) = TokioChildProcess::builder(cmd)
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let agent = ().serve(transport).await.expect("the MCP session starts");
    let info = agent.peer_info().expect("the server's info").clone();
    assert_eq!(
        info.server_info.as_ref().map(|i| i.name.as_str()),
        Some("airlock-mcp")
    );
    let tools = agent.list_all_tools().await.unwrap();
    assert_eq!(tools.len(), 10);
    let call = |name: &'static str, a: Value| {
        let agent = &agent;
        async move {
            let r = agent
                .call_tool(CallToolRequestParams::new(name).with_arguments(args(a)))
                .await
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            structured(&r)
        }
    };

    // Read like an agent: which repositories, the file, the base commit.
    let (_, repos) = call("list_repositories", json!({})).await;
    let ids: Vec<&str> = repos["repositories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert!(ids.contains(&"calc"), "{repos}");
    let (_, base) = call("resolve_ref", json!({"repository": "calc", "ref": "main"})).await;
    let base = base["commit"].as_str().unwrap().to_owned();
    let (_, file) = call(
        "read_file",
        json!({"repository": "calc", "revision": base, "path": "calc.py"}),
    )
    .await;
    assert_eq!(file["content"], "def add(a, b):\n    return a - b\n");

    // Propose the fix as a unified diff, verified by the project's tests.
    let fix = "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n";
    let (err, p) = call(
        "propose_change",
        json!({"repository": "calc", "base": base, "patch": fix, "max_attempts": 1,
               "verification": [{"argv": ["python3", "-m", "unittest", "-q"], "timeout_seconds": 120}],
               "idempotency_token": "fix-calc-add-1"}),
    )
    .await;
    assert!(!err, "{p}");
    let id = p["task_id"].as_str().unwrap().to_owned();
    let mut done = Value::Null;
    for _ in 0..8 {
        let (err, w) = call(
            "wait_for_task",
            json!({"task_id": id, "timeout_seconds": 30}),
        )
        .await;
        assert!(!err, "{w}");
        if w["finished"] == true {
            done = w["task"].clone();
            break;
        }
    }
    assert_eq!(
        done["state"],
        "SUCCEEDED",
        "{done}\n{}",
        std::fs::read_to_string(&stderr).unwrap_or_default()
    );
    let commit = done["commit"].as_str().expect("a commit").to_owned();
    assert_eq!(
        branch_head(&format!("agent/{id}")).as_deref(),
        Some(commit.as_str())
    );
    assert_eq!(done["commands"][0]["passed"], true);
    // The verified commit holds the fix; main did not move.
    let blob = Command::new("git")
        .arg(format!("--git-dir={}", authority.display()))
        .args(["show", &format!("{commit}:calc.py")])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&blob.stdout),
        "def add(a, b):\n    return a + b\n"
    );
    assert_eq!(branch_head("main").as_deref(), Some(base.as_str()));

    // A change whose test fails noisily: FAILED, no branch, a clean log.
    let noisy = "import sys\nimport unittest\n\nimport calc\n\n\nclass AddTest(unittest.TestCase):\n    def test_add_negative(self):\n        sys.stderr.write(\"\\x1b[31mRED\\x1b[0m \\x07bell \\x1b]0;title\\x07done\\n\")\n        self.assertEqual(calc.add(-2, -3), 99)\n";
    let (err, p) = call(
        "propose_change",
        json!({"repository": "calc", "base": "main", "max_attempts": 1,
               "files": [{"path": "test_calc.py", "content": noisy}],
               "verification": [{"argv": ["python3", "-m", "unittest", "-q"]}]}),
    )
    .await;
    assert!(!err, "{p}");
    let bad = p["task_id"].as_str().unwrap().to_owned();
    let mut done = Value::Null;
    for _ in 0..8 {
        let (_, w) = call(
            "wait_for_task",
            json!({"task_id": bad, "timeout_seconds": 30}),
        )
        .await;
        if w["finished"] == true {
            done = w["task"].clone();
            break;
        }
    }
    assert_eq!(done["state"], "FAILED", "{done}");
    assert_eq!(done["commit"], Value::Null);
    assert_eq!(branch_head(&format!("agent/{bad}")), None);
    let (_, log) = call("get_task_log", json!({"task_id": bad})).await;
    assert_eq!(log["untrusted"], true);
    let tail = log["commands"][0]["stderr_tail"].as_str().expect("stderr");
    assert!(tail.contains("test_add_negative"), "{tail}");
    assert!(tail.contains("RED bell done"), "{tail}");
    assert!(
        !tail
            .chars()
            .any(|c| c.is_control() && c != '\n' && c != '\t'),
        "{tail:?}"
    );

    // The session ends when the client goes; so does airlock-mcp.
    agent.cancel().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let log = std::fs::read_to_string(&stderr).unwrap();
    assert!(log.contains("session ended"), "{log}");
}

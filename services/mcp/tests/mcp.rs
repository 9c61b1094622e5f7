//! airlock-mcp as a child process, driven over stdio by a raw JSON-RPC
//! client, against a real supervisor on a private bus and a real git
//! repository. The test plays the worker (Worker1 Claim/SubmitResult), so
//! a task's outcome is the test's choice; `local.rs` runs the whole suite.

mod common;

use airlock_supervisor::authz::Action;
use airlock_supervisor::authz::testing::TestAuthorizer;
use common::{CURRENT, HANDSHAKE, Mcp, OLDEST, Options, Sup};
use serde_json::{Value, json};
use std::time::Duration;

const READ_TOOLS: &[&str] = &[
    "list_repositories",
    "resolve_ref",
    "list_files",
    "read_file",
    "task_status",
    "wait_for_task",
    "get_task_log",
    "list_tasks",
];
const ORDER: &[&str] = &[
    "list_repositories",
    "resolve_ref",
    "list_files",
    "read_file",
    "propose_change",
    "task_status",
    "wait_for_task",
    "get_task_log",
    "list_tasks",
    "cancel_task",
];

struct World {
    sup: Sup,
    dir: tempfile::TempDir,
    config: std::path::PathBuf,
    presets: std::path::PathBuf,
}

impl World {
    async fn new(authorizer: TestAuthorizer) -> World {
        let sup = Sup::start(authorizer).await;
        let dir = tempfile::tempdir().unwrap();
        let (config, presets) = common::repository(dir.path());
        World {
            sup,
            dir,
            config,
            presets,
        }
    }

    async fn mcp(&self, revision: &'static str) -> Mcp {
        self.mcp_as(revision, None, "mcp").await
    }

    async fn mcp_as(&self, revision: &'static str, uid: Option<u32>, name: &str) -> Mcp {
        Mcp::start(
            Options {
                bus: self.sup.bus.address(),
                config: &self.config,
                presets: &self.presets,
                uid,
                stderr: self.dir.path().join(format!("{name}.stderr")),
            },
            revision,
        )
        .await
    }
}

const FIX: &str = "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n";

fn proposal(extra: Value) -> Value {
    let mut v = json!({
        "repository": "demo", "base": "main", "patch": FIX,
        "verification": [{"argv": ["python3", "-m", "unittest", "-q"]}],
    });
    for (k, x) in extra.as_object().unwrap() {
        if x.is_null() {
            v.as_object_mut().unwrap().remove(k);
        } else {
            v[k] = x.clone();
        }
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_are_listed_in_a_fixed_order_with_schemas_and_annotations_on_current_and_older_revisions()
 {
    let w = World::new(TestAuthorizer::allow_all()).await;
    let mut seen = Vec::new();
    for revision in [CURRENT, HANDSHAKE, OLDEST] {
        let mut mcp = w.mcp(revision).await;
        let r = mcp.request("tools/list", json!({})).await;
        let tools = r["result"]["tools"].as_array().expect("tools").clone();
        let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
        assert_eq!(names, ORDER, "{revision}");
        for t in &tools {
            let name = t["name"].as_str().unwrap();
            assert!(t["description"].as_str().unwrap().len() > 40, "{name}");
            assert_eq!(t["inputSchema"]["type"], "object", "{name}");
            assert_eq!(t["inputSchema"]["additionalProperties"], false, "{name}");
            assert_eq!(t["outputSchema"]["type"], "object", "{name}");
            let a = &t["annotations"];
            assert_eq!(a["openWorldHint"], false, "{name}");
            assert_eq!(
                a["readOnlyHint"],
                json!(READ_TOOLS.contains(&name)),
                "{name}"
            );
        }
        assert_eq!(
            tools[9]["annotations"]["destructiveHint"], true,
            "cancel_task ends a task"
        );
        // A tool answers on this revision too.
        let v = mcp.ok("list_repositories", json!({})).await;
        assert_eq!(v["repositories"][0]["id"], "demo");
        seen.push(tools);
        assert!(mcp.close().await.success());
    }
    // Static: the same catalogue every time, whatever the revision.
    assert_eq!(seen[0], seen[1]);
    assert_eq!(seen[1], seen[2]);
    w.sup.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdout_carries_only_protocol_messages_logs_go_to_stderr_and_it_exits_when_stdin_closes() {
    let w = World::new(TestAuthorizer::allow_all()).await;
    let mut mcp = w.mcp(HANDSHAKE).await;
    mcp.ok("list_repositories", json!({})).await;
    mcp.refused("resolve_ref", json!({"repository": "demo", "ref": "-x"}))
        .await;
    let lines = mcp.stdout.clone();
    let log_path = mcp.stderr.clone();
    let status = mcp.close().await;
    assert!(status.success(), "{status}");
    // Every stdout line was a JSON-RPC message (next_message checks), and
    // there were exactly the replies: initialize, two calls.
    assert_eq!(lines.len(), 3, "{lines:#?}");
    let log = std::fs::read_to_string(log_path).unwrap();
    assert!(log.contains("list_repositories"), "{log}");
    assert!(log.contains("REVISION_NOT_FOUND"), "{log}");
    assert!(log.contains("session ended"), "{log}");
    w.sup.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_list_repositories_resolve_refs_and_page_through_files_and_their_content() {
    let w = World::new(TestAuthorizer::allow_all()).await;
    let mut mcp = w.mcp(CURRENT).await;
    let head = common::git(&w.dir.path().join("demo"), &["rev-parse", "HEAD"]);

    let repos = mcp.ok("list_repositories", json!({})).await;
    assert_eq!(
        repos["repositories"],
        json!([{"id": "demo", "description": "the test repository", "head_commit": head, "readable": true}])
    );
    assert_eq!(repos["presets"][0]["name"], "unit");
    assert_eq!(repos["truncated"], false);

    let r = mcp
        .ok("resolve_ref", json!({"repository": "demo", "ref": "main"}))
        .await;
    assert_eq!(r["commit"], head);
    let short = &head[..8];
    let r = mcp
        .ok("resolve_ref", json!({"repository": "demo", "ref": short}))
        .await;
    assert_eq!(
        r["commit"], head,
        "an abbreviated id resolves to the full one"
    );

    // Two pages of two under src/, then the rest.
    let p1 = mcp
        .ok(
            "list_files",
            json!({"repository": "demo", "revision": "main", "prefix": "src", "limit": 2}),
        )
        .await;
    assert_eq!(p1["commit"], head);
    assert_eq!(
        p1["files"],
        json!([{"path": "src/a.txt", "kind": "file"}, {"path": "src/b.txt", "kind": "file"}])
    );
    assert_eq!(
        (p1["truncated"].clone(), p1["next_cursor"].clone()),
        (json!(true), json!("src/b.txt"))
    );
    let p2 = mcp
        .ok(
            "list_files",
            json!({"repository": "demo", "revision": head, "prefix": "src/", "limit": 2, "cursor": "src/b.txt"}),
        )
        .await;
    assert_eq!(p2["files"], json!([{"path": "src/c.txt", "kind": "file"}]));
    assert_eq!(
        (p2["truncated"].clone(), p2["next_cursor"].clone()),
        (json!(false), Value::Null)
    );
    let all = mcp
        .ok(
            "list_files",
            json!({"repository": "demo", "revision": "main"}),
        )
        .await;
    assert_eq!(all["files"].as_array().unwrap().len(), 6);

    // A file in two reads, cut at a character boundary.
    let text = "# demo\n\nA calculator: é.\n";
    let r1 = mcp
        .ok(
            "read_file",
            json!({"repository": "demo", "revision": "main", "path": "README.md", "length": 23}),
        )
        .await;
    assert_eq!(r1["size"], text.len());
    assert_eq!(r1["truncated"], true);
    let first = r1["content"].as_str().unwrap();
    assert!(text.starts_with(first) && first.len() <= 23, "{first:?}");
    let r2 = mcp
        .ok(
            "read_file",
            json!({"repository": "demo", "revision": "main", "path": "README.md", "offset": r1["next_offset"]}),
        )
        .await;
    assert_eq!(format!("{first}{}", r2["content"].as_str().unwrap()), text);
    assert_eq!(
        (r2["truncated"].clone(), r2["next_offset"].clone()),
        (json!(false), Value::Null)
    );
    assert_eq!(
        r2["sha256"],
        airlock_proto::canonical::sha256_hex(text.as_bytes())
    );

    // A binary file is reported, not returned.
    let b = mcp
        .ok(
            "read_file",
            json!({"repository": "demo", "revision": "main", "path": "logo.bin"}),
        )
        .await;
    assert_eq!(
        (b["binary"].clone(), b["content"].clone(), b["size"].clone()),
        (json!(true), Value::Null, json!(5))
    );
    assert!(mcp.close().await.success());
    w.sup.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passing_and_a_failing_proposal_are_followed_to_the_end_with_progress() {
    let w = World::new(TestAuthorizer::allow_all()).await;
    let mut mcp = w.mcp(HANDSHAKE).await;
    let head = common::git(&w.dir.path().join("demo"), &["rev-parse", "HEAD"]);

    // A patch that passes.
    let p = mcp.ok("propose_change", proposal(json!({}))).await;
    let id = p["task_id"].as_str().unwrap().to_owned();
    assert_eq!(p["state"], "QUEUED");
    assert_eq!(p["base_commit"], head);
    assert_eq!(p["target_branch"], format!("agent/{id}"));
    assert_eq!(p["changes"], json!([{"path": "calc.py", "change": "edit"}]));
    let s = mcp.ok("task_status", json!({"task_id": id})).await;
    assert_eq!(
        (s["state"].clone(), s["final"].clone()),
        (json!("QUEUED"), json!(false))
    );

    // Wait with a progress token while the "worker" reports after 2 s.
    let wait = mcp
        .start_request(
            "tools/call",
            json!({"name": "wait_for_task", "arguments": {"task_id": id, "timeout_seconds": 30},
                   "_meta": {"progressToken": "tok-1"}}),
        )
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let grant = w.sup.work_one(true, "").await;
    assert_eq!(grant["task_id"], id.as_str());
    let r = mcp.response(wait).await;
    let (err, v) = common::unpack(&r);
    assert!(!err, "{v}");
    assert_eq!(v["finished"], true, "{v}\n{}", mcp.log());
    assert_eq!(v["task"]["state"], "SUCCEEDED");
    assert_eq!(v["task"]["commit"], "c".repeat(40));
    assert_eq!(v["task"]["commands"][0]["passed"], true);
    assert!(v["waited_ms"].as_u64().unwrap() >= 1500, "{v}");
    let progress: Vec<&Value> = mcp
        .notifications
        .iter()
        .filter(|n| n["method"] == "notifications/progress")
        .collect();
    assert!(!progress.is_empty(), "no progress: {:?}", mcp.notifications);
    for n in &progress {
        assert_eq!(n["params"]["progressToken"], "tok-1");
        assert_eq!(n["params"]["total"], 30.0);
        let m = n["params"]["message"].as_str().unwrap();
        assert!(
            ["QUEUED", "RUNNING"].iter().any(|s| m.starts_with(s)),
            "{m}"
        );
    }
    assert!(
        progress[0]["params"]["message"]
            .as_str()
            .unwrap()
            .starts_with("QUEUED (attempt 0/3)")
    );

    // Whole files that fail; the evidence has terminal escapes and
    // control characters, which the log strips.
    let p = mcp
        .ok(
            "propose_change",
            proposal(json!({"patch": null, "files": [{"path": "calc.py", "content": "def add(a, b):\n    return a * b\n"}],
                            "delete": ["src/c.txt"], "verification": null, "presets": ["unit"], "max_attempts": 1})),
        )
        .await;
    let id2 = p["task_id"].as_str().unwrap().to_owned();
    assert_eq!(
        p["changes"],
        json!([{"path": "calc.py", "change": "edit"}, {"path": "src/c.txt", "change": "delete"}])
    );
    w.sup
        .work_one(
            false,
            "\u{1b}[31mFAIL: test_add\u{1b}[0m\r\nAssertionError\u{7}\u{0}\u{8} 6 != 5\n",
        )
        .await;
    let v = mcp
        .ok(
            "wait_for_task",
            json!({"task_id": id2, "timeout_seconds": 5}),
        )
        .await;
    assert_eq!(v["task"]["state"], "FAILED");
    assert_eq!(v["task"]["failure_code"], "VERIFICATION_FAILED");
    assert_eq!(v["task"]["commit"], Value::Null);
    let log = mcp.ok("get_task_log", json!({"task_id": id2})).await;
    assert_eq!(log["untrusted"], true);
    assert_eq!(
        log["commands"][0]["stderr_tail"],
        "FAIL: test_add\nAssertionError 6 != 5\n"
    );
    assert_eq!(log["commands"][0]["stdout_tail"], "Ran 1 test\n");

    // The plan the supervisor holds is what was proposed.
    let stored = w.sup.client().await.get_task(&id2).await.unwrap();
    assert_eq!(stored.binding.base_oid, head);

    // list_tasks: both, in id order.
    let l = mcp.ok("list_tasks", json!({})).await;
    let mut ids = vec![id.clone(), id2.clone()];
    ids.sort();
    let listed: Vec<&str> = l["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["task_id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, ids);
    let l = mcp.ok("list_tasks", json!({"state": "FAILED"})).await;
    assert_eq!(l["tasks"].as_array().unwrap().len(), 1);

    // A link, carried as one: the envelope the worker is granted holds it.
    let l = mcp
        .ok(
            "propose_change",
            proposal(json!({"patch": null, "symlinks": [{"path": "docs/calc", "target": "../calc.py"}], "max_attempts": 1})),
        )
        .await;
    assert_eq!(
        l["changes"],
        json!([{"path": "docs/calc", "change": "add"}])
    );
    let grant = w.sup.work_one(true, "").await;
    assert_eq!(grant["task_id"], l["task_id"]);
    assert_eq!(
        grant["envelope"]["change_set"],
        json!([{"operation": "write_symlink", "path": "docs/calc", "target": "../calc.py"}])
    );
    assert!(mcp.close().await.success());
    w.sup.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_task_is_bounded_and_stops_when_the_client_cancels() {
    let w = World::new(TestAuthorizer::allow_all()).await;
    let mut mcp = w.mcp(HANDSHAKE).await;
    let p = mcp.ok("propose_change", proposal(json!({}))).await;
    let id = p["task_id"].as_str().unwrap().to_owned();
    // Bounded: nothing happens, it returns at its timeout, not final.
    let t = std::time::Instant::now();
    let v = mcp
        .ok(
            "wait_for_task",
            json!({"task_id": id, "timeout_seconds": 2}),
        )
        .await;
    assert_eq!(
        (v["finished"].clone(), v["task"]["state"].clone()),
        (json!(false), json!("QUEUED"))
    );
    assert!(t.elapsed() < Duration::from_secs(10));
    assert_eq!(
        mcp.refused(
            "wait_for_task",
            json!({"task_id": id, "timeout_seconds": 46})
        )
        .await,
        "FIELD_BOUNDS_EXCEEDED"
    );
    // Cancelled by the client: the server stops waiting at once and
    // answers the next request.
    let req = mcp
        .start_request(
            "tools/call",
            json!({"name": "wait_for_task", "arguments": {"task_id": id, "timeout_seconds": 45}}),
        )
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    mcp.notify(
        "notifications/cancelled",
        json!({"requestId": req, "reason": "the user pressed Esc"}),
    )
    .await;
    let t = std::time::Instant::now();
    let s = mcp.ok("task_status", json!({"task_id": id})).await;
    assert_eq!(s["state"], "QUEUED");
    assert!(t.elapsed() < Duration::from_secs(5));
    // Drain: no response to the cancelled request arrives later than a
    // moment (rmcp drops it), and the session still closes cleanly.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let log = mcp.log();
    assert!(
        log.contains("tool=wait_for_task") && log.matches("tool=wait_for_task").count() >= 3,
        "the cancelled wait did not end early: {log}"
    );
    assert!(mcp.close().await.success());
    w.sup.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_is_allowed_where_the_authoriser_allows_it_and_refused_otherwise() {
    // Allowed (an administrator's rights): CANCELLED.
    let w = World::new(TestAuthorizer::allow_all()).await;
    let mut mcp = w.mcp(CURRENT).await;
    let p = mcp.ok("propose_change", proposal(json!({}))).await;
    let id = p["task_id"].as_str().unwrap().to_owned();
    let c = mcp
        .ok(
            "cancel_task",
            json!({"task_id": id, "reason": "changed my mind"}),
        )
        .await;
    assert_eq!(
        (c["state"].clone(), c["final"].clone()),
        (json!("CANCELLED"), json!(true))
    );
    assert_eq!(
        mcp.refused("cancel_task", json!({"task_id": id})).await,
        "TASK_STATE_INVALID"
    );
    assert!(mcp.close().await.success());
    w.sup.stop().await;

    // The planner's polkit rule (read and submit, not manage): refused,
    // and the task stays queued.
    let w = World::new(TestAuthorizer::allowing([Action::Read, Action::Submit])).await;
    let mut mcp = w.mcp(CURRENT).await;
    let p = mcp.ok("propose_change", proposal(json!({}))).await;
    let id = p["task_id"].as_str().unwrap().to_owned();
    assert_eq!(
        mcp.refused("cancel_task", json!({"task_id": id})).await,
        "AUTHORIZATION_DENIED"
    );
    let s = mcp.ok("task_status", json!({"task_id": id})).await;
    assert_eq!(s["state"], "QUEUED");
    assert!(mcp.close().await.success());
    w.sup.stop().await;

    // Nothing allowed: every bus tool says so with the code.
    let w = World::new(TestAuthorizer::deny_all()).await;
    let mut mcp = w.mcp(CURRENT).await;
    assert_eq!(
        mcp.refused("propose_change", proposal(json!({}))).await,
        "AUTHORIZATION_DENIED"
    );
    assert_eq!(
        mcp.refused("list_tasks", json!({})).await,
        "AUTHORIZATION_DENIED"
    );
    assert!(mcp.close().await.success());
    w.sup.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_idempotency_token_returns_the_same_task_and_other_arguments_conflict() {
    let w = World::new(TestAuthorizer::allow_all()).await;
    let mut mcp = w.mcp(HANDSHAKE).await;
    let a = mcp
        .ok(
            "propose_change",
            proposal(json!({"idempotency_token": "fix-add-0001"})),
        )
        .await;
    assert_eq!(a["idempotent"], false);
    let b = mcp
        .ok(
            "propose_change",
            proposal(json!({"idempotency_token": "fix-add-0001"})),
        )
        .await;
    assert_eq!(b["task_id"], a["task_id"]);
    assert_eq!(b["idempotent"], true);
    assert_eq!(
        mcp.refused(
            "propose_change",
            proposal(json!({"idempotency_token": "fix-add-0001", "max_attempts": 1}))
        )
        .await,
        "TASK_IDEMPOTENCY_CONFLICT"
    );
    assert_eq!(w.sup.all_tasks().await.len(), 1);
    assert!(mcp.close().await.success());
    w.sup.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refusal_is_a_tool_error_with_its_catalogue_code_and_changes_nothing() {
    let w = World::new(TestAuthorizer::allow_all()).await;
    let mut mcp = w.mcp(HANDSHAKE).await;
    // One real task, to name in the task refusals.
    let real = mcp.ok("propose_change", proposal(json!({}))).await;
    let real = real["task_id"].as_str().unwrap().to_owned();
    let before = w.sup.all_tasks().await;
    let demo = |extra: Value| {
        let mut v = json!({"repository": "demo", "revision": "main"});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    };
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "list_repositories",
            json!({"verbose": true}),
            "MESSAGE_INVALID",
        ),
        (
            "resolve_ref",
            json!({"repository": "demo"}),
            "MESSAGE_INVALID",
        ),
        (
            "resolve_ref",
            json!({"repository": "demo", "ref": 7}),
            "MESSAGE_INVALID",
        ),
        (
            "resolve_ref",
            json!({"repository": "../demo", "ref": "main"}),
            "REPOSITORY_INVALID",
        ),
        (
            "resolve_ref",
            json!({"repository": "/srv/airlock/demo.git", "ref": "main"}),
            "REPOSITORY_INVALID",
        ),
        (
            "resolve_ref",
            json!({"repository": "other", "ref": "main"}),
            "REPOSITORY_NOT_REGISTERED",
        ),
        (
            "resolve_ref",
            json!({"repository": "demo", "ref": "--output=/tmp/x"}),
            "REVISION_NOT_FOUND",
        ),
        (
            "resolve_ref",
            json!({"repository": "demo", "ref": "no-such-branch"}),
            "REVISION_NOT_FOUND",
        ),
        (
            "resolve_ref",
            json!({"repository": "demo", "ref": "main:calc.py"}),
            "REVISION_NOT_FOUND",
        ),
        (
            "list_files",
            demo(json!({"limit": 0})),
            "FIELD_BOUNDS_EXCEEDED",
        ),
        (
            "list_files",
            demo(json!({"limit": 501})),
            "FIELD_BOUNDS_EXCEEDED",
        ),
        ("list_files", demo(json!({"prefix": "../"})), "PATH_ESCAPE"),
        (
            "read_file",
            demo(json!({"path": "../../etc/passwd"})),
            "PATH_ESCAPE",
        ),
        (
            "read_file",
            demo(json!({"path": "/etc/passwd"})),
            "PATH_ESCAPE",
        ),
        (
            "read_file",
            demo(json!({"path": "-calc.py"})),
            "PATH_INVALID",
        ),
        (
            "read_file",
            demo(json!({"path": ".git/config"})),
            "PATH_INVALID",
        ),
        (
            "read_file",
            demo(json!({"path": "missing.py"})),
            "PATH_INVALID",
        ),
        ("read_file", demo(json!({"path": "src"})), "PATH_INVALID"),
        (
            "read_file",
            demo(json!({"path": "calc.py", "length": 32769})),
            "FIELD_BOUNDS_EXCEEDED",
        ),
        (
            "read_file",
            demo(json!({"path": "calc.py", "offset": 1000})),
            "FIELD_BOUNDS_EXCEEDED",
        ),
        (
            "propose_change",
            proposal(json!({"files": [{"path": "x", "content": "x"}]})),
            "MESSAGE_INVALID",
        ),
        (
            "propose_change",
            proposal(json!({"patch": null})),
            "MESSAGE_INVALID",
        ),
        (
            "propose_change",
            proposal(json!({"verification": null})),
            "COMMAND_INVALID",
        ),
        (
            "propose_change",
            proposal(json!({"verification": [{"argv": ["bash", "-c", "id"]}]})),
            "COMMAND_PROGRAM_DENY",
        ),
        (
            "propose_change",
            proposal(json!({"verification": [{"argv": ["-x"]}]})),
            "COMMAND_INVALID",
        ),
        (
            "propose_change",
            proposal(json!({"verification": [{"argv": ["true"], "timeout_seconds": 0}]})),
            "COMMAND_TIMEOUT_INVALID",
        ),
        (
            "propose_change",
            proposal(json!({"verification": null, "presets": ["nope"]})),
            "COMMAND_INVALID",
        ),
        (
            "propose_change",
            proposal(
                json!({"patch": "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def sub(a, b):\n-    return a - b\n+    return a + b\n"}),
            ),
            "PATCH_HUNK_FAILED",
        ),
        (
            "propose_change",
            proposal(json!({"patch": "this is not a diff"})),
            "PATCH_INVALID",
        ),
        (
            "propose_change",
            proposal(json!({"branch": "main"})),
            "PROTECTED_REF_DENY",
        ),
        (
            "propose_change",
            proposal(json!({"branch": "feature/x"})),
            "TARGET_BRANCH_INVALID",
        ),
        (
            "propose_change",
            proposal(json!({"base": "no-such-branch"})),
            "REVISION_NOT_FOUND",
        ),
        (
            "propose_change",
            proposal(json!({"max_attempts": 99})),
            "MAX_ATTEMPTS_INVALID",
        ),
        (
            "propose_change",
            proposal(json!({"idempotency_token": "short"})),
            "IDEMPOTENCY_KEY_INVALID",
        ),
        (
            "propose_change",
            proposal(json!({"idempotency_token": "-leading-dash"})),
            "IDEMPOTENCY_KEY_INVALID",
        ),
        (
            "propose_change",
            proposal(
                json!({"patch": null, "files": [{"path": "calc.py", "content": "def add(a, b):\n    return a - b\n"}]}),
            ),
            "PROPOSAL_EMPTY",
        ),
        (
            "propose_change",
            proposal(json!({"patch": null, "delete": ["nothing.py"]})),
            "PATCH_HUNK_FAILED",
        ),
        (
            "propose_change",
            proposal(
                json!({"patch": null, "files": [{"path": "a", "content": "x"}, {"path": "a", "content": "y"}]}),
            ),
            "CHANGE_SET_INVALID",
        ),
        (
            "propose_change",
            proposal(json!({"patch": null, "files": [{"path": "z.bin", "content": "a\u{0}b"}]})),
            "PROPOSAL_BINARY_CHANGE",
        ),
        (
            "propose_change",
            proposal(json!({"patch": null, "files": [{"path": ".env", "content": "KEY=1\n"}]})),
            "CREDENTIAL_PATH_DENIED",
        ),
        (
            "propose_change",
            proposal(
                json!({"patch": null, "symlinks": [{"path": "leak", "target": "/etc/passwd"}]}),
            ),
            "SYMLINK_TARGET_INVALID",
        ),
        (
            "propose_change",
            proposal(
                json!({"patch": null, "symlinks": [{"path": "src/up", "target": "../../outside"}]}),
            ),
            "SYMLINK_TARGET_INVALID",
        ),
        (
            "propose_change",
            proposal(
                json!({"patch": null, "symlinks": [{"path": "calc.py", "target": "src/c.txt"}]}),
            ),
            "PROPOSAL_SYMLINK_CHANGE",
        ),
        (
            "propose_change",
            proposal(json!({"symlinks": [{"path": "l", "target": "calc.py"}]})),
            "MESSAGE_INVALID",
        ),
        (
            "propose_change",
            proposal(
                json!({"patch": null, "symlinks": [{"path": "l", "target": "calc.py", "mode": 1}]}),
            ),
            "MESSAGE_INVALID",
        ),
        ("task_status", json!({"task_id": "x"}), "TASK_ID_INVALID"),
        (
            "task_status",
            json!({"task_id": "no-such-task"}),
            "TASK_NOT_FOUND",
        ),
        (
            "task_status",
            json!({"task_id": real, "extra": 1}),
            "MESSAGE_INVALID",
        ),
        (
            "get_task_log",
            json!({"task_id": "no-such-task"}),
            "TASK_NOT_FOUND",
        ),
        (
            "wait_for_task",
            json!({"task_id": real, "timeout_seconds": 0}),
            "FIELD_BOUNDS_EXCEEDED",
        ),
        ("list_tasks", json!({"state": "DONE"}), "MESSAGE_INVALID"),
        ("list_tasks", json!({"limit": 51}), "FIELD_BOUNDS_EXCEEDED"),
        (
            "cancel_task",
            json!({"task_id": "no-such-task"}),
            "TASK_NOT_FOUND",
        ),
        (
            "cancel_task",
            json!({"task_id": real, "reason": "x".repeat(1025)}),
            "FIELD_BOUNDS_EXCEEDED",
        ),
    ];
    let mut wrong = Vec::new();
    for (tool, args, expected) in &cases {
        let code = mcp.refused(tool, args.clone()).await;
        if code != *expected {
            wrong.push(format!("{tool}({args}): {code}, expected {expected}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // An unknown tool is a protocol error, not a tool result.
    let r = mcp
        .request("tools/call", json!({"name": "push", "arguments": {}}))
        .await;
    assert!(r["error"]["code"].is_i64(), "{r}");
    // Nothing changed: the same tasks, the real one still queued.
    assert_eq!(w.sup.all_tasks().await, before);
    let s = mcp.ok("task_status", json!({"task_id": real})).await;
    assert_eq!(s["state"], "QUEUED");
    assert!(mcp.close().await.success());
    w.sup.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_inputs_are_refused_and_change_nothing() {
    let w = World::new(TestAuthorizer::allow_all()).await;
    let mut mcp = w.mcp(HANDSHAKE).await;
    let before = w.sup.all_tasks().await;
    // A patch that reaches out of the repository.
    let escape = "--- a/../outside.py\n+++ b/../outside.py\n@@ -1 +1 @@\n-x\n+y\n";
    assert_eq!(
        mcp.refused("propose_change", proposal(json!({"patch": escape})))
            .await,
        "PATH_ESCAPE"
    );
    let create = "--- /dev/null\n+++ b/../../etc/cron.d/x\n@@ -0,0 +1 @@\n+* * * * * root id\n";
    assert_eq!(
        mcp.refused("propose_change", proposal(json!({"patch": create})))
            .await,
        "PATH_ESCAPE"
    );
    // A ref that git would take for an option.
    for bad in ["-h", "--upload-pack=touch /tmp/pwned", "-"] {
        assert_eq!(
            mcp.refused("resolve_ref", json!({"repository": "demo", "ref": bad}))
                .await,
            "REVISION_NOT_FOUND"
        );
        assert_eq!(
            mcp.refused("propose_change", proposal(json!({"base": bad})))
                .await,
            "REVISION_NOT_FOUND"
        );
    }
    // A 10 MiB file.
    let big = "x".repeat(10 * 1024 * 1024);
    assert_eq!(
        mcp.refused(
            "propose_change",
            proposal(json!({"patch": null, "files": [{"path": "big.txt", "content": big}]}))
        )
        .await,
        "FILE_TOO_LARGE"
    );
    assert_eq!(w.sup.all_tasks().await, before);
    // A message longer than the bound ends the session (no unbounded buffer).
    let huge = vec![b'x'; airlock_mcp::limits::MAX_MESSAGE_BYTES + 1024];
    let _ = mcp.send_raw(&huge).await;
    let status = tokio::time::timeout(Duration::from_secs(10), mcp.child.wait())
        .await
        .expect("a session fed an endless line did not end")
        .unwrap();
    let _ = status;
    w.sup.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_user_sees_and_touches_only_their_own_tasks() {
    assert!(
        nix::unistd::getuid().is_root(),
        "each_user_sees_and_touches_only_their_own_tasks needs root (it runs a second airlock-mcp as uid 65534); CI runs the tests as root: run this one as root (sudo), it fails rather than pass without checking"
    );
    // Two planners (root alone is an administrator, reading every task):
    // what each sees is what the supervisor answers it, with no filter
    // of airlock-mcp's own.
    let w = World::new(TestAuthorizer::root_admin()).await;
    let mut mine = w.mcp_as(HANDSHAKE, Some(2), "bin").await;
    let mut theirs = w.mcp_as(HANDSHAKE, Some(65534), "nobody").await;
    let a = mine
        .ok(
            "propose_change",
            proposal(json!({"idempotency_token": "same-token-1"})),
        )
        .await;
    let b = theirs
        .ok(
            "propose_change",
            proposal(json!({"idempotency_token": "same-token-1"})),
        )
        .await;
    let (a, b) = (
        a["task_id"].as_str().unwrap().to_owned(),
        b["task_id"].as_str().unwrap().to_owned(),
    );
    assert_ne!(a, b, "a token is the user's own");
    let ids = |v: &Value| -> Vec<String> {
        v["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["task_id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        ids(&mine.ok("list_tasks", json!({})).await),
        vec![a.clone()]
    );
    assert_eq!(
        ids(&theirs.ok("list_tasks", json!({})).await),
        vec![b.clone()]
    );
    for tool in ["task_status", "get_task_log", "cancel_task"] {
        assert_eq!(
            mine.refused(tool, json!({"task_id": b})).await,
            "TASK_NOT_FOUND",
            "{tool}"
        );
        assert_eq!(
            theirs.refused(tool, json!({"task_id": a})).await,
            "TASK_NOT_FOUND",
            "{tool}"
        );
    }
    assert_eq!(
        theirs
            .refused("wait_for_task", json!({"task_id": a, "timeout_seconds": 1}))
            .await,
        "TASK_NOT_FOUND"
    );
    let sup = w.sup.client().await;
    assert_eq!(sup.get_task(&a).await.unwrap().state.as_str(), "QUEUED");
    assert_eq!(sup.get_task(&b).await.unwrap().state.as_str(), "QUEUED");
    assert!(mine.close().await.success());
    assert!(theirs.close().await.success(), "{}", "nobody's session");
    w.sup.stop().await;
}

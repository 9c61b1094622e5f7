//! What the MCP tests share: a real supervisor on a private bus, a real
//! git repository registered in a real configuration file, and airlock-mcp
//! as a child process driven over its stdio by a raw JSON-RPC client.

#![allow(dead_code)]

use airlock_supervisor::authz::testing::TestAuthorizer;
use airlock_supervisor::daemon::AuthorizerChoice;
use airlock_testkit::InProcess;
pub use airlock_testkit::git;
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin};
use tokio::sync::mpsc;

/// The revisions the tests speak: the current one (no handshake) and the
/// handshake-based ones clients use today.
pub const CURRENT: &str = "2026-07-28";
pub const HANDSHAKE: &str = "2025-06-18";
pub const OLDEST: &str = "2024-11-05";

/// A supervisor running inside the test, on its own bus
/// ([`InProcess`], accepting passed results itself), with what these
/// tests do with it.
pub struct Sup(InProcess);

impl std::ops::Deref for Sup {
    type Target = InProcess;
    fn deref(&self) -> &InProcess {
        &self.0
    }
}

/// A repository `demo` with a few files on main, and the configuration
/// registering it (everything world-readable, for a second uid).
pub fn repository(dir: &Path) -> (PathBuf, PathBuf) {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let work = dir.join("demo");
    std::fs::create_dir_all(work.join("src")).unwrap();
    std::fs::write(work.join("calc.py"), "def add(a, b):\n    return a - b\n").unwrap();
    std::fs::write(work.join("README.md"), "# demo\n\nA calculator: é.\n").unwrap();
    std::fs::write(work.join("src/a.txt"), "a\n").unwrap();
    std::fs::write(work.join("src/b.txt"), "b\n").unwrap();
    std::fs::write(work.join("src/c.txt"), "c\n").unwrap();
    std::fs::write(work.join("logo.bin"), [0u8, 1, 2, 255, 0]).unwrap();
    git(&work, &["init", "-q", "-b", "main"]);
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "-q", "-m", "demo"]);
    let bare = dir.join("demo.git");
    git(
        dir,
        &[
            "clone",
            "-q",
            "--bare",
            work.to_str().unwrap(),
            bare.to_str().unwrap(),
        ],
    );
    let _ = std::process::Command::new("chmod")
        .args(["-R", "a+rX"])
        .arg(dir)
        .status();
    let config = dir.join("airlock.toml");
    std::fs::write(
        &config,
        format!(
            "[[repository]]\nname = \"demo\"\npath = \"{}\"\ndescription = \"the test repository\"\n",
            bare.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();
    let presets = dir.join("mcp.toml");
    std::fs::write(
        &presets,
        "[preset.unit]\ncommands = [\"python3 -m unittest -q\"]\ntimeout_seconds = 120\ndescription = \"the unit tests\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&presets, std::fs::Permissions::from_mode(0o644)).unwrap();
    (config, presets)
}

impl Sup {
    pub async fn start(authorizer: TestAuthorizer) -> Sup {
        Sup(InProcess::builder(AuthorizerChoice::ForTests(authorizer))
            .auto_accept()
            .start()
            .await)
    }

    pub async fn stop(self) {
        self.0.stop().await;
    }

    /// Every task id in the store (any submitter).
    pub async fn all_tasks(&self) -> Vec<String> {
        let page = self.client().await.list_tasks("", "", 1000).await.unwrap();
        page.tasks.into_iter().map(|t| t.task_id).collect()
    }

    /// Plays the worker: claims the next task and reports `outcome`
    /// (passed with a commit, or failed with these output tails).
    pub async fn work_one(&self, passed: bool, stderr_tail: &str) -> Value {
        let conn = self.bus.connect().await.unwrap();
        let reply = conn
            .call_method(
                Some("org.airlock.Supervisor1"),
                "/org/airlock/Supervisor1",
                Some("org.airlock.Worker1"),
                "Claim",
                &(),
            )
            .await
            .unwrap();
        let grant: Value =
            serde_json::from_str(&reply.body().deserialize::<String>().unwrap()).unwrap();
        assert!(!grant.is_null(), "nothing to claim");
        // One summary per command of the envelope, under its label.
        let commands: Vec<Value> = grant["envelope"]["verification"]
            .as_array()
            .expect("the envelope's commands")
            .iter()
            .map(|c| {
                if passed {
                    json!({"label": c["label"], "exit_code": 0, "timed_out": false, "duration_ms": 3})
                } else {
                    json!({"label": c["label"], "exit_code": 1, "timed_out": false, "duration_ms": 3,
                           "stdout_tail": "Ran 1 test\n", "stderr_tail": stderr_tail})
                }
            })
            .collect();
        let result = json!({
            "schema": "airlock.task-result.v1",
            "task_id": grant["task_id"], "attempt": grant["attempt"],
            "execution_digest": grant["envelope"]["execution_digest"],
            "outcome": if passed { "passed" } else { "failed" },
            "commit_oid": if passed { json!("c".repeat(40)) } else { Value::Null },
            "target_branch": grant["envelope"]["target_branch"],
            "exec_result_sha256": "e".repeat(64),
            "failure_code": if passed { Value::Null } else { json!("VERIFICATION_FAILED") },
            "verification": commands,
            "isolation": {"landlock_abi": 7, "landlock": "full", "seccomp": "enforced", "namespaces": ["user", "mnt", "pid"], "view": "minimal-root", "uid": 992},
        });
        conn.call_method(
            Some("org.airlock.Supervisor1"),
            "/org/airlock/Supervisor1",
            Some("org.airlock.Worker1"),
            "SubmitResult",
            &(
                grant["task_id"].as_str().unwrap(),
                grant["lease_epoch"].as_u64().unwrap(),
                grant["lease_token"].as_str().unwrap(),
                format!("result-key-{}", grant["task_id"].as_str().unwrap()),
                result.to_string(),
            ),
        )
        .await
        .unwrap();
        grant
    }
}

/// airlock-mcp as a child process, and a JSON-RPC client on its stdio.
pub struct Mcp {
    pub child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::UnboundedReceiver<String>,
    /// Every line stdout carried, in order.
    pub stdout: Vec<String>,
    /// Notifications received so far.
    pub notifications: Vec<Value>,
    next_id: i64,
    /// The revision spoken; the current one puts it in every request.
    pub revision: &'static str,
    pub stderr: PathBuf,
}

pub struct Options<'a> {
    pub bus: &'a str,
    pub config: &'a Path,
    pub presets: &'a Path,
    pub uid: Option<u32>,
    pub stderr: PathBuf,
}

impl Mcp {
    /// Starts airlock-mcp and, on a handshake revision, initializes.
    pub async fn start(o: Options<'_>, revision: &'static str) -> Mcp {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_airlock-mcp"));
        cmd.arg("--config")
            .arg(o.config)
            .arg("--presets")
            .arg(o.presets)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("DBUS_SYSTEM_BUS_ADDRESS", o.bus)
            .env("AIRLOCK_LOG", "debug")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&o.stderr).unwrap())
            .kill_on_drop(true);
        if let Some(uid) = o.uid {
            cmd.uid(uid).gid(uid);
        }
        let mut child = cmd.spawn().unwrap();
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut r = BufReader::new(stdout).lines();
            while let Ok(Some(l)) = r.next_line().await {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let mut mcp = Mcp {
            child,
            stdin,
            lines,
            stdout: Vec::new(),
            notifications: Vec::new(),
            next_id: 1,
            revision,
            stderr: o.stderr,
        };
        if revision != CURRENT {
            let init = mcp
                .request(
                    "initialize",
                    json!({"protocolVersion": revision, "capabilities": {},
                           "clientInfo": {"name": "airlock-mcp-tests", "version": "1"}}),
                )
                .await;
            assert_eq!(init["result"]["protocolVersion"], revision, "{init}");
            assert_eq!(init["result"]["serverInfo"]["name"], "airlock-mcp");
            mcp.notify("notifications/initialized", json!({})).await;
        }
        mcp
    }

    pub async fn send(&mut self, message: &Value) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin
            .write_all(format!("{message}\n").as_bytes())
            .await
            .unwrap();
        stdin.flush().await.unwrap();
    }

    pub async fn send_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(bytes).await?;
        stdin.flush().await
    }

    pub async fn notify(&mut self, method: &str, params: Value) {
        self.send(&json!({"jsonrpc": "2.0", "method": method, "params": params}))
            .await;
    }

    fn params(&self, mut params: Value) -> Value {
        if self.revision == CURRENT {
            let meta = params
                .as_object_mut()
                .unwrap()
                .entry("_meta")
                .or_insert_with(|| json!({}));
            meta["io.modelcontextprotocol/protocolVersion"] = json!(CURRENT);
            meta["io.modelcontextprotocol/clientCapabilities"] = json!({});
            meta["io.modelcontextprotocol/clientInfo"] =
                json!({"name": "airlock-mcp-tests", "version": "1"});
        }
        params
    }

    /// Sends a request and returns its response (notifications that come
    /// first are kept in `notifications`).
    pub async fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let params = if method == "initialize" {
            params
        } else {
            self.params(params)
        };
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        self.response(id).await
    }

    /// Starts a request without waiting; [`Mcp::response`] collects it.
    pub async fn start_request(&mut self, method: &str, params: Value) -> i64 {
        let id = self.next_id;
        self.next_id += 1;
        let params = self.params(params);
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        id
    }

    /// The next message, or None when stdout closed or `within` passed.
    pub async fn next_message(&mut self, within: Duration) -> Option<Value> {
        let line = tokio::time::timeout(within, self.lines.recv())
            .await
            .ok()??;
        self.stdout.push(line.clone());
        let v: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("stdout carried a line that is not JSON ({e}): {line:?}"));
        assert_eq!(v["jsonrpc"], "2.0", "not JSON-RPC 2.0: {line}");
        Some(v)
    }

    pub async fn response(&mut self, id: i64) -> Value {
        loop {
            let v = self
                .next_message(Duration::from_secs(60))
                .await
                .unwrap_or_else(|| panic!("no response to request {id}"));
            if v.get("id") == Some(&json!(id)) && v.get("method").is_none() {
                return v;
            }
            if v.get("method").is_some() && v.get("id").is_none() {
                self.notifications.push(v);
            }
        }
    }

    /// Calls a tool: (is_error, structuredContent), after checking that
    /// the text content mirrors the structured content exactly.
    pub async fn call(&mut self, tool: &str, args: Value) -> (bool, Value) {
        let r = self
            .request("tools/call", json!({"name": tool, "arguments": args}))
            .await;
        unpack(&r)
    }

    pub async fn ok(&mut self, tool: &str, args: Value) -> Value {
        let (err, v) = self.call(tool, args.clone()).await;
        assert!(!err, "{tool}({args}) refused: {v}");
        v
    }

    /// Calls a tool that must refuse; returns the catalogue code.
    pub async fn refused(&mut self, tool: &str, args: Value) -> String {
        let (err, v) = self.call(tool, args.clone()).await;
        assert!(err, "{tool}({args}) was not refused: {v}");
        let code = v["error"]["code"].as_str().expect("a code").to_owned();
        assert!(
            airlock_proto::Code::from_name(&code).is_some(),
            "{code} is not in the catalogue"
        );
        assert!(v["error"]["message"].is_string() && v["error"]["retryable"].is_boolean());
        code
    }

    /// Closes stdin and waits for the exit status.
    pub async fn close(mut self) -> std::process::ExitStatus {
        drop(self.stdin.take());
        tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .expect("airlock-mcp did not exit after stdin closed")
            .unwrap()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

/// A tools/call response: (isError, structuredContent), with the mirror
/// checked.
pub fn unpack(r: &Value) -> (bool, Value) {
    let result = &r["result"];
    assert!(result.is_object(), "not a result: {r}");
    let structured = result["structuredContent"].clone();
    assert!(structured.is_object(), "no structuredContent: {r}");
    let text = result["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text content: {r}"));
    let mirrored: Value = serde_json::from_str(text).expect("the text is JSON");
    assert_eq!(
        mirrored, structured,
        "the text does not mirror structuredContent"
    );
    (result["isError"] == json!(true), structured)
}

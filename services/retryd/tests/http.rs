//! airlock-retryd at the HTTP level: the real binary on loopback, a real
//! supervisor owning a real task database on a private bus (retryd reaches
//! it over Retry1 only), raw HTTP/1.1 so malformed requests are really
//! malformed.

use airlock_localbus::{PrivateBus, SupervisorProcess, sibling_binary};
use airlock_proto::canonical::digest_of;
use airlock_proto::task::{Outcome, RESULT_SCHEMA, TaskResult, TaskState, TaskSubmission};
use airlock_taskdb::tasks::{Actor, ActorKind, SqliteStore};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const AUTH_ID: &str = "owner-scheme-a-20260817";

struct Server {
    child: Child,
    /// Dropping it kills the supervisor.
    supervisor: Option<SupervisorProcess>,
    _bus: PrivateBus,
    addr: SocketAddr,
    db: PathBuf,
    token: String,
    log: Arc<Mutex<String>>,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn actor() -> Actor {
    Actor {
        kind: ActorKind::Admin,
        uid: None,
        name: "test-admin".into(),
    }
}

fn submission(task: &str) -> TaskSubmission {
    let head = "a642b045775b9154a00ae78543037fbef4fb447b";
    TaskSubmission::from_value(&json!({
        "schema": "airlock.task.v1",
        "max_attempts": 1,
        "binding": {
            "task_id": task, "job_id": format!("job-{task}"), "repository": "demo",
            "base_oid": head, "expected_branch_oid": head, "target_branch": format!("agent/{task}"),
            "branch_mode": "CREATE_NEW", "generation": 1, "idempotency_key": format!("key-{task}"),
        },
        "plan": {
            "schema": "airlock.plan.v1", "task_id": task, "job_id": format!("job-{task}"),
            "source_head_oid": head, "generation": 1, "idempotency_key": format!("plan-{task}"),
            "execution": {"action": "deterministic",
                          "change_set": [{"operation": "write_file", "path": "a.txt", "content": "a\n"}],
                          "verification": [{"label": "true", "argv": ["/bin/true"]}]},
        },
    }))
    .unwrap()
}

/// Drives a task to FAILED with its single attempt used.
fn exhausted_task(store: &mut SqliteStore, task: &str) {
    store.submit(&submission(task), &actor()).unwrap();
    let worker = Actor {
        kind: ActorKind::Worker,
        uid: None,
        name: "worker-1".into(),
    };
    let grant = store.claim(&worker, 60_000).unwrap().expect("claimable");
    assert_eq!(grant.task_id, task);
    let result = TaskResult {
        schema: RESULT_SCHEMA.into(),
        task_id: task.into(),
        attempt: grant.attempt,
        execution_digest: grant.envelope["execution_digest"].as_str().unwrap().into(),
        outcome: Outcome::Failed,
        commit_oid: None,
        target_branch: format!("agent/{task}"),
        exec_result_sha256: None,
        failure_code: Some("VERIFICATION_FAILED".into()),
        verification: vec![],
        reconciliation: None,
        publication: None,
        signature: None,
        isolation: None,
        captured: None,
    };
    store
        .submit_result(
            task,
            grant.lease_epoch,
            &grant.lease_token,
            "a1-result-key-0001",
            &result,
            false,
            &worker,
        )
        .unwrap();
    assert_eq!(store.get(task).unwrap().state, TaskState::Failed);
}

fn start_with(
    auth_id: Option<&str>,
    token: &str,
    prepare: impl FnOnce(&mut SqliteStore),
) -> Result<Server, String> {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tasks.sqlite3");
    let mut store = SqliteStore::open(&db).unwrap();
    prepare(&mut store);
    drop(store);
    let config = dir.path().join("airlock.toml");
    std::fs::write(&config, "").unwrap();
    let bus = PrivateBus::start().expect("dbus-daemon");
    let supervisor = SupervisorProcess::start(
        &sibling_binary("airlock-supervisor").unwrap(),
        &bus,
        &config,
        &db,
        &[],
    )
    .expect("the supervisor starts");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, token).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_airlock-retryd"));
    cmd.args([
        "--config",
        config.to_str().unwrap(),
        "--bus-address",
        bus.address(),
        "--listen",
        "127.0.0.1:0",
        "--token-file",
        token_file.to_str().unwrap(),
    ])
    .args(["--header-timeout", "1", "--body-timeout", "1"])
    .env_remove("AIRLOCK_RETRY_AUTHORIZATION_ID")
    .env("AIRLOCK_LOG", "info")
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    if let Some(id) = auth_id {
        cmd.env("AIRLOCK_RETRY_AUTHORIZATION_ID", id);
    }
    let mut child = cmd.spawn().unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let log = Arc::new(Mutex::new(String::new()));
    let mut addr = None;
    for line in lines.by_ref() {
        let line = line.unwrap();
        log.lock().unwrap().push_str(&line);
        log.lock().unwrap().push('\n');
        if let Some(rest) = line.split("listening on ").nth(1) {
            addr = Some(rest.trim().parse().unwrap());
            break;
        }
    }
    let Some(addr) = addr else {
        let status = child.wait().unwrap();
        return Err(format!("exited {status}: {}", log.lock().unwrap()));
    };
    let sink = Arc::clone(&log);
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            let mut l = sink.lock().unwrap();
            l.push_str(&line);
            l.push('\n');
        }
    });
    Ok(Server {
        child,
        supervisor: Some(supervisor),
        _bus: bus,
        addr,
        db,
        token: token.to_owned(),
        log,
        _dir: dir,
    })
}

fn start() -> Server {
    start_with(Some(AUTH_ID), &"t".repeat(48), |s| {
        exhausted_task(s, "task-a")
    })
    .unwrap()
}

/// Sends raw bytes, half-closes when asked, and parses the response.
fn exchange(addr: SocketAddr, bytes: &[u8], half_close: bool) -> (u16, Value) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(bytes).unwrap();
    if half_close {
        s.shutdown(Shutdown::Write).unwrap();
    }
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    parse_response(&out)
}

fn parse_response(out: &[u8]) -> (u16, Value) {
    let text = String::from_utf8_lossy(out);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("");
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

fn post(server: &Server, path: &str, auth: Option<&str>, body: &[u8]) -> (u16, Value) {
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(a) = auth {
        req.push_str(&format!("Authorization: {a}\r\n"));
    }
    req.push_str("\r\n");
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    exchange(server.addr, &bytes, false)
}

fn bearer(server: &Server) -> String {
    format!("Bearer {}", server.token)
}

fn verification_sha(server: &Server, task: &str) -> String {
    let store = SqliteStore::open(&server.db).unwrap();
    digest_of(&store.get(task).unwrap().verification.unwrap_or(json!({}))).unwrap()
}

fn request(server: &Server, task: &str, key: &str) -> Value {
    let store = SqliteStore::open(&server.db).unwrap();
    let t = store.get(task).unwrap();
    json!({
        "expected_status": "FAILED", "expected_revision": t.revision, "expected_attempt": t.attempt,
        "expected_max_attempts": t.max_attempts, "next_max_attempts": t.max_attempts + 1,
        "previous_verification_sha256": verification_sha(server, task),
        "authorization_id": AUTH_ID, "idempotency_key": key,
    })
}

fn extend(server: &Server, task: &str, body: &Value) -> (u16, Value) {
    post(
        server,
        &format!("/v1/tasks/{task}/retry-extension"),
        Some(&bearer(server)),
        body.to_string().as_bytes(),
    )
}

fn extension_events(server: &Server, task: &str) -> Vec<Value> {
    let store = SqliteStore::open(&server.db).unwrap();
    store
        .events(Some(task), 0, 1000)
        .unwrap()
        .into_iter()
        .filter(|e| {
            e.action == "TASK_RETRY_EXTENSION_AUTHORIZED"
                && e.outcome == airlock_taskdb::tasks::EventOutcome::Allowed
        })
        .map(|e| e.payload)
        .collect()
}

#[test]
fn a_closed_log_stream_does_not_break_requests() {
    // Regression: tracing's internal-error path panicked on EPIPE, so every
    // request died once stderr (the journal stream) was gone.
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "t".repeat(48)).unwrap();
    let config = dir.path().join("airlock.toml");
    std::fs::write(&config, "").unwrap();
    let bus = PrivateBus::start().expect("dbus-daemon");
    let mut child = Command::new(env!("CARGO_BIN_EXE_airlock-retryd"))
        .args(["--config", config.to_str().unwrap()])
        .args(["--bus-address", bus.address(), "--listen", "127.0.0.1:0"])
        .args(["--token-file", token.to_str().unwrap()])
        .env("AIRLOCK_RETRY_AUTHORIZATION_ID", AUTH_ID)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stderr.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let addr: SocketAddr = first
        .split("listening on ")
        .nth(1)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The reader (and with it the pipe) is gone now.
    for _ in 0..3 {
        let (status, body) = exchange(
            addr,
            b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            false,
        );
        assert_eq!((status, body["status"].as_str()), (200, Some("ok")));
    }
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn health_answers_without_a_token() {
    let s = start();
    let (status, body) = exchange(
        s.addr,
        b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        false,
    );
    assert_eq!(status, 200);
    assert_eq!(body["status"], "ok");
}

#[test]
fn extension_is_applied_under_cas_and_audited() {
    let s = start();
    let body = request(&s, "task-a", "retry-task-a-attempt2");
    let (status, out) = extend(&s, "task-a", &body);
    assert_eq!(status, 201, "{out}");
    assert_eq!(out["status"], "QUEUED");
    assert_eq!(out["max_attempts"], 2);
    assert_eq!(out["idempotent"], false);
    let t = SqliteStore::open(&s.db).unwrap().get("task-a").unwrap();
    assert_eq!(
        (t.state, t.attempt, t.max_attempts),
        (TaskState::Queued, 1, 2)
    );
    let events = extension_events(&s, "task-a");
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["authorization_id"], AUTH_ID);
    // The failed attempt's worker name is still on the task: normalised and recorded.
    assert_eq!(events[0]["previous_claimed_by"], "worker-1");
    assert_eq!(events[0]["stale_terminal_claim_normalized"], true);
    assert!(
        !s.log.lock().unwrap().contains(&s.token),
        "the token must never be logged"
    );
}

#[test]
fn a_request_while_the_supervisor_is_down_is_503_runtime_unavailable() {
    let mut s = start();
    let body = request(&s, "task-a", "retry-task-a-down-01");
    let before = SqliteStore::open(&s.db).unwrap().get("task-a").unwrap();
    drop(s.supervisor.take()); // killed and reaped: nobody owns its name
    for _ in 0..2 {
        let started = std::time::Instant::now();
        let (status, out) = extend(&s, "task-a", &body);
        assert_eq!(
            (status, out.clone()),
            (503, json!({"error": "RUNTIME_UNAVAILABLE"})),
            "seed 001 answers 503 RUNTIME_UNAVAILABLE"
        );
        assert!(started.elapsed() < Duration::from_secs(10), "at once");
    }
    assert_eq!(
        SqliteStore::open(&s.db).unwrap().get("task-a").unwrap(),
        before
    );
    assert!(extension_events(&s, "task-a").is_empty());
    let logged = || {
        s.log
            .lock()
            .unwrap()
            .contains("the supervisor did not answer")
    };
    for _ in 0..50 {
        if logged() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(logged(), "{}", s.log.lock().unwrap());
}

#[test]
fn identical_replay_gets_200_and_changes_nothing() {
    let s = start();
    let body = request(&s, "task-a", "retry-task-a-attempt2");
    assert_eq!(extend(&s, "task-a", &body).0, 201);
    let before = SqliteStore::open(&s.db).unwrap().get("task-a").unwrap();
    let (status, out) = extend(&s, "task-a", &body);
    assert_eq!(status, 200);
    assert_eq!(out["idempotent"], true);
    assert_eq!(
        SqliteStore::open(&s.db).unwrap().get("task-a").unwrap(),
        before
    );
    assert_eq!(extension_events(&s, "task-a").len(), 1);
}

#[test]
fn refusals_carry_the_seed_codes_and_change_nothing() {
    let s = start();
    let base = request(&s, "task-a", "retry-task-a-attempt2");
    let before = SqliteStore::open(&s.db).unwrap().get("task-a").unwrap();
    let cases: Vec<(Value, u16, &str)> = vec![
        (
            json!({"expected_status": "FAILED"}),
            400,
            "RETRY_EXTENSION_FIELDS_INVALID",
        ),
        (
            {
                let mut v = base.clone();
                v["next_max_attempts"] = json!(3);
                v
            },
            400,
            "RETRY_EXTENSION_MUST_BE_BOUNDED_ONE_STEP",
        ),
        (
            {
                let mut v = base.clone();
                v["expected_status"] = json!("QUEUED");
                v
            },
            400,
            "EXPECTED_STATUS_INVALID",
        ),
        (
            {
                let mut v = base.clone();
                v["expected_revision"] = json!("1");
                v
            },
            400,
            "RETRY_EXTENSION_INTEGER_INVALID",
        ),
        (
            {
                let mut v = base.clone();
                v["expected_attempt"] = json!(0);
                v
            },
            409,
            "RETRY_EXTENSION_NOT_EXHAUSTED",
        ),
        (
            {
                let mut v = base.clone();
                v["previous_verification_sha256"] = json!("0".repeat(64));
                v
            },
            409,
            "RETRY_EXTENSION_VERIFICATION_DRIFT",
        ),
        (
            {
                let mut v = base.clone();
                v["expected_revision"] = json!(999);
                v
            },
            409,
            "RETRY_EXTENSION_CAS_MISMATCH",
        ),
        (
            {
                let mut v = base.clone();
                v["authorization_id"] = json!("other-owner-id");
                v
            },
            403,
            "RETRY_EXTENSION_AUTHORIZATION_ID_MISMATCH",
        ),
        (
            {
                let mut v = base.clone();
                v["idempotency_key"] = json!("bad key");
                v
            },
            400,
            "IDEMPOTENCY_KEY_INVALID",
        ),
    ];
    for (body, want_status, want_code) in cases {
        let (status, out) = extend(&s, "task-a", &body);
        assert_eq!(
            (status, out["error"].as_str().unwrap_or("")),
            (want_status, want_code),
            "{body}"
        );
    }
    let (status, out) = extend(&s, "task-missing", &base);
    assert_eq!(
        (status, out["error"].as_str().unwrap()),
        (404, "TASK_NOT_FOUND")
    );
    assert_eq!(
        SqliteStore::open(&s.db).unwrap().get("task-a").unwrap(),
        before
    );
    assert!(extension_events(&s, "task-a").is_empty());
}

#[test]
fn same_key_with_other_content_is_an_idempotency_conflict() {
    let s = start();
    let body = request(&s, "task-a", "retry-task-a-attempt2");
    assert_eq!(extend(&s, "task-a", &body).0, 201);
    let mut other = body.clone();
    other["expected_revision"] = json!(body["expected_revision"].as_i64().unwrap() + 7);
    let (status, out) = extend(&s, "task-a", &other);
    assert_eq!(
        (status, out["error"].as_str().unwrap()),
        (409, "RETRY_EXTENSION_IDEMPOTENCY_CONFLICT")
    );
}

#[test]
fn authentication_is_required_and_exact() {
    let s = start();
    let body = request(&s, "task-a", "retry-task-a-attempt2").to_string();
    let path = "/v1/tasks/task-a/retry-extension";
    for auth in [
        None,
        Some("Bearer wrong-token-wrong-token-wrong-token"),
        Some(format!("Basic {}", s.token).as_str()),
        Some(format!("bearer {}", s.token).as_str()),
        Some(format!("Bearer {}x", s.token).as_str()),
    ] {
        let (status, out) = post(&s, path, auth, body.as_bytes());
        assert_eq!(
            (status, out["error"].as_str().unwrap_or("")),
            (401, "UNAUTHORIZED"),
            "{auth:?}"
        );
    }
    assert!(extension_events(&s, "task-a").is_empty());
}

#[test]
fn malformed_bodies_are_refused() {
    let s = start();
    let path = "/v1/tasks/task-a/retry-extension";
    let auth = bearer(&s);
    let (status, out) = post(&s, path, Some(&auth), b"{not json");
    assert_eq!(
        (status, out["error"].as_str().unwrap()),
        (400, "REQUEST_INVALID")
    );
    let (status, out) = post(&s, path, Some(&auth), b"[1,2]");
    assert_eq!(
        (status, out["error"].as_str().unwrap()),
        (400, "REQUEST_INVALID")
    );
    let (status, out) = post(&s, path, Some(&auth), b"{\"a\":\"\xff\xfe\"}");
    assert_eq!(
        (status, out["error"].as_str().unwrap()),
        (400, "REQUEST_INVALID"),
        "non-UTF-8"
    );
    let (status, out) = post(&s, path, Some(&auth), b"");
    assert_eq!(
        (status, out["error"].as_str().unwrap()),
        (413, "REQUEST_SIZE_INVALID"),
        "empty"
    );
}

#[test]
fn huge_body_is_refused_before_it_is_sent() {
    let s = start();
    let head = format!(
        "POST /v1/tasks/task-a/retry-extension HTTP/1.1\r\nHost: x\r\nAuthorization: {}\r\nContent-Length: {}\r\n\r\n",
        bearer(&s),
        64 * 1024 + 1
    );
    // Only the headers are sent: the answer must come without the body.
    let (status, out) = exchange(s.addr, head.as_bytes(), false);
    assert_eq!(
        (status, out["error"].as_str().unwrap()),
        (413, "REQUEST_SIZE_INVALID")
    );
}

#[test]
fn bad_content_lengths_are_refused() {
    let s = start();
    let auth = bearer(&s);
    let mk = |cl: &str, body: &[u8]| {
        let mut b = format!("POST /v1/tasks/task-a/retry-extension HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: {auth}\r\nContent-Length: {cl}\r\n\r\n").into_bytes();
        b.extend_from_slice(body);
        b
    };
    let body = request(&s, "task-a", "retry-task-a-attempt2").to_string();
    // Shorter than the body: the JSON is cut and does not parse.
    let (status, out) = exchange(s.addr, &mk("10", body.as_bytes()), false);
    assert_eq!(
        (status, out["error"].as_str().unwrap_or("")),
        (400, "REQUEST_INVALID")
    );
    // Longer than what arrives before the client stops: truncated body.
    let (status, out) = exchange(s.addr, &mk("500", &body.as_bytes()[..20]), true);
    assert_eq!(
        (status, out["error"].as_str().unwrap_or("")),
        (400, "REQUEST_INVALID"),
        "truncated body"
    );
    // Longer than what arrives, connection held open: the body deadline answers.
    let (status, out) = exchange(s.addr, &mk("500", &body.as_bytes()[..20]), false);
    assert_eq!(
        (status, out["error"].as_str().unwrap_or("")),
        (400, "REQUEST_INVALID")
    );
    assert!(extension_events(&s, "task-a").is_empty());
}

#[test]
fn unknown_routes_and_methods_are_404() {
    let s = start();
    for req in [
        "GET /v1/tasks/task-a/retry-extension HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        "GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        "POST /v1/tasks/task-a/other HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
        "DELETE /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    ] {
        let (status, out) = exchange(s.addr, req.as_bytes(), false);
        assert_eq!(
            (status, out["error"].as_str().unwrap_or("")),
            (404, "NOT_FOUND"),
            "{req}"
        );
    }
}

#[test]
fn stalled_clients_are_disconnected() {
    let s = start();
    let mut c = TcpStream::connect(s.addr).unwrap();
    c.write_all(b"POST /v1/tasks/task-a/retry-extension HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let started = std::time::Instant::now();
    let mut buf = Vec::new();
    let _ = c.read_to_end(&mut buf);
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "a stalled client must be cut off by the header timeout"
    );
}

#[test]
fn refuses_to_start_without_a_valid_authorization_id_or_token() {
    let err = start_with(None, &"t".repeat(48), |_| {}).err().unwrap();
    assert!(err.contains("TASK_RETRY_AUTHORIZATION_ID_MISSING"), "{err}");
    let err = start_with(Some("bad id"), &"t".repeat(48), |_| {})
        .err()
        .unwrap();
    assert!(err.contains("TASK_RETRY_AUTHORIZATION_ID_INVALID"), "{err}");
    let err = start_with(Some(AUTH_ID), "too-short", |_| {})
        .err()
        .unwrap();
    assert!(
        err.contains("TASK_RETRY_CONTROL_CREDENTIAL_INVALID"),
        "{err}"
    );
}

#[test]
fn fifty_concurrent_requests_apply_exactly_one_extension() {
    let s = start();
    let shared = request(&s, "task-a", "retry-shared-key-01");
    let mut bodies: Vec<Value> = (0..10).map(|_| shared.clone()).collect();
    for i in 0..40 {
        bodies.push(request(&s, "task-a", &format!("retry-other-key-{i:02}")));
    }
    let addr = s.addr;
    let auth = bearer(&s);
    let barrier = Arc::new(std::sync::Barrier::new(bodies.len()));
    let handles: Vec<_> = bodies
        .into_iter()
        .map(|body| {
            let auth = auth.clone();
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                let body = body.to_string();
                let req = format!(
                    "POST /v1/tasks/task-a/retry-extension HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: {auth}\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                barrier.wait();
                let key = serde_json::from_str::<Value>(&body).unwrap()["idempotency_key"].as_str().unwrap().to_owned();
                (key, exchange(addr, req.as_bytes(), false))
            })
        })
        .collect();
    let results: Vec<(String, (u16, Value))> =
        handles.into_iter().map(|h| h.join().unwrap()).collect();
    let created: Vec<&String> = results
        .iter()
        .filter(|r| r.1.0 == 201)
        .map(|r| &r.0)
        .collect();
    assert_eq!(
        created.len(),
        1,
        "exactly one extension is applied: {results:?}"
    );
    let winner = created[0];
    for (key, (status, body)) in &results {
        match status {
            201 => {}
            200 => assert_eq!(key, winner, "only identical replays of the winner get 200"),
            409 => assert_ne!(key, winner, "{body}"),
            other => panic!("unexpected {other}: {body}"),
        }
    }
    let replays = results.iter().filter(|r| r.1.0 == 200).count();
    let conflicts = results.iter().filter(|r| r.1.0 == 409).count();
    println!("50 concurrent: 1 applied, {replays} replays (200), {conflicts} conflicts (409)");
    assert_eq!(1 + replays + conflicts, 50);
    assert_eq!(extension_events(&s, "task-a").len(), 1);
    let t = SqliteStore::open(&s.db).unwrap().get("task-a").unwrap();
    assert_eq!(t.max_attempts, 2);
}

//! bench-retryd: requests/s and p50/p99 latency of airlock-retryd (release
//! binary, real task database) at 1 and 16 concurrent keep-alive
//! connections, for `GET /health` and for an idempotent replay of an
//! applied retry extension (the full path: token check, body bounds, JSON,
//! SQLite transaction, 200). Prints figures; asserts nothing.

use airlock_proto::canonical::digest_of;
use airlock_proto::task::{Outcome, RESULT_SCHEMA, TaskResult, TaskSubmission};
use airlock_taskdb::tasks::{Actor, SqliteStore};
use serde_json::json;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const AUTH_ID: &str = "owner-bench-0001";

fn failed_task(db: &std::path::Path) -> serde_json::Value {
    let mut store = SqliteStore::open(db).expect("store");
    let base = "a".repeat(40);
    let sub = TaskSubmission::from_value(&json!({
        "schema": "airlock.task.v1", "max_attempts": 1,
        "binding": {"task_id": "task-bench", "job_id": "job-bench", "repository": "demo", "base_oid": base,
                    "expected_branch_oid": base, "target_branch": "agent/bench", "branch_mode": "CREATE_NEW",
                    "generation": 1, "idempotency_key": "submit-bench"},
        "plan": {"schema": "airlock.plan.v1", "task_id": "task-bench", "job_id": "job-bench", "source_head_oid": base,
                 "generation": 1, "idempotency_key": "plan-bench",
                 "execution": {"action": "deterministic",
                               "change_set": [{"operation": "write_file", "path": "a", "content": "a"}]}},
    }))
    .expect("submission");
    store
        .submit(&sub, &Actor::admin(None, "bench"))
        .expect("submit");
    let worker = Actor::worker(None, "bench-worker");
    let g = store
        .claim(&worker, 60_000)
        .expect("claim")
        .expect("a task");
    let result = TaskResult {
        schema: RESULT_SCHEMA.into(),
        task_id: g.task_id.clone(),
        attempt: g.attempt,
        execution_digest: g.envelope["execution_digest"]
            .as_str()
            .unwrap_or_default()
            .into(),
        outcome: Outcome::Failed,
        commit_oid: None,
        target_branch: "agent/bench".into(),
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
            &g.task_id,
            g.lease_epoch,
            &g.lease_token,
            "a1-result-bench-01",
            &result,
            false,
            &worker,
        )
        .expect("result");
    let t = store.get("task-bench").expect("task");
    json!({
        "expected_status": "FAILED", "expected_revision": t.revision, "expected_attempt": t.attempt,
        "expected_max_attempts": t.max_attempts, "next_max_attempts": t.max_attempts + 1,
        "previous_verification_sha256": digest_of(&t.verification.unwrap_or(json!({}))).expect("digest"),
        "authorization_id": AUTH_ID, "idempotency_key": "retry-bench-000001",
    })
}

/// One keep-alive request; returns the status.
fn request(stream: &mut BufReader<TcpStream>, raw: &[u8]) -> u16 {
    stream.get_mut().write_all(raw).expect("send");
    let mut line = String::new();
    stream.read_line(&mut line).expect("status line");
    let status = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut length = 0usize;
    loop {
        line.clear();
        stream.read_line(&mut line).expect("header");
        if line == "\r\n" {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).expect("body");
    status
}

fn load(
    addr: SocketAddr,
    raw: &[u8],
    connections: usize,
    seconds: f64,
    want: u16,
) -> (f64, f64, f64) {
    let started = Instant::now();
    let threads: Vec<_> = (0..connections)
        .map(|_| {
            let raw = raw.to_vec();
            std::thread::spawn(move || {
                let mut s = BufReader::new(TcpStream::connect(addr).expect("connect"));
                s.get_ref().set_nodelay(true).ok();
                let mut lat = Vec::new();
                while started.elapsed().as_secs_f64() < seconds {
                    let t = Instant::now();
                    let status = request(&mut s, &raw);
                    assert_eq!(status, want, "unexpected status");
                    lat.push(t.elapsed());
                }
                lat
            })
        })
        .collect();
    let mut all: Vec<Duration> = threads
        .into_iter()
        .flat_map(|t| t.join().expect("client"))
        .collect();
    let elapsed = started.elapsed().as_secs_f64();
    all.sort();
    let p = |q: f64| all[((all.len() as f64 - 1.0) * q).round() as usize].as_secs_f64() * 1000.0;
    (all.len() as f64 / elapsed, p(0.5), p(0.99))
}

fn main() {
    let dir = std::env::temp_dir().join(format!("airlock-bench-retryd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let db = dir.join("tasks.sqlite3");
    let body = failed_task(&db).to_string();
    let token = "b".repeat(48);
    std::fs::write(dir.join("token"), &token).expect("token");
    // retryd holds no database: a real supervisor on a private bus owns it.
    let config = dir.join("airlock.toml");
    std::fs::write(&config, "").expect("config");
    let bus = airlock_localbus::PrivateBus::start().expect("dbus-daemon");
    let _supervisor = airlock_localbus::SupervisorProcess::start(
        &airlock_local::sibling("airlock-supervisor")
            .expect("airlock-supervisor next to this binary"),
        &bus,
        &config,
        &db,
        &[],
    )
    .expect("supervisor");
    let bin = airlock_local::sibling("airlock-retryd").expect("airlock-retryd next to this binary");
    let mut child = Command::new(bin)
        .arg("--config")
        .arg(&config)
        .args([
            "--bus-address",
            bus.address(),
            "--listen",
            "127.0.0.1:0",
            "--token-file",
        ])
        .arg(dir.join("token"))
        .env("AIRLOCK_RETRY_AUTHORIZATION_ID", AUTH_ID)
        .env("AIRLOCK_LOG", "warn,airlock_retryd=info")
        .stderr(Stdio::piped())
        .spawn()
        .expect("retryd");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let addr: SocketAddr = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|l| {
            l.split("listening on ")
                .nth(1)
                .map(|a| a.trim().parse().expect("address"))
        })
        .expect("retryd started");
    std::thread::spawn(move || lines.for_each(drop));
    let health = b"GET /health HTTP/1.1\r\nHost: bench\r\n\r\n".to_vec();
    let post = format!(
        "POST /v1/tasks/task-bench/retry-extension HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes();
    let mut first = BufReader::new(TcpStream::connect(addr).expect("connect"));
    assert_eq!(
        request(&mut first, &post),
        201,
        "the extension applies once"
    );
    println!("airlock-retryd (release), 3 s per row, keep-alive connections");
    println!(
        "{:<28} {:>5} {:>10} {:>9} {:>9}",
        "request", "conns", "req/s", "p50 ms", "p99 ms"
    );
    for (name, raw, want) in [
        ("GET /health", &health, 200u16),
        ("POST retry-extension replay", &post, 200),
    ] {
        for conns in [1usize, 16] {
            let (rate, p50, p99) = load(addr, raw, conns, 3.0, want);
            println!("{name:<28} {conns:>5} {rate:>10.0} {p50:>9.3} {p99:>9.3}");
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

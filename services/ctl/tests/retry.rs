//! `airlockctl retry extend` against the real services: a supervisor (the
//! task database's one owner) and an airlock-retryd (which reaches it over
//! Retry1) as child processes on a private bus.

use airlock_localbus::{PrivateBus, SupervisorProcess, sibling_binary};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

const BASE: &str = "a642b045775b9154a00ae78543037fbef4fb447b";
const AUTH_ID: &str = "owner-scheme-a-20261129";

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn call(
    bus: &PrivateBus,
    iface: &str,
    method: &str,
    body: impl serde::Serialize + zbus::zvariant::DynamicType,
) -> Value {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let conn = bus.connect().await.unwrap();
        let reply = conn
            .call_method(
                Some("org.airlock.Supervisor1"),
                "/org/airlock/Supervisor1",
                Some(iface),
                method,
                &body,
            )
            .await
            .unwrap_or_else(|e| panic!("{method}: {e}"));
        serde_json::from_str(&reply.body().deserialize::<String>().unwrap()).unwrap()
    })
}

fn ctl(bus: &PrivateBus, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_airlockctl"))
        .args(args)
        .env("DBUS_SYSTEM_BUS_ADDRESS", bus.address())
        .env_remove("AIRLOCK_RETRY_AUTHORIZATION_ID")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn failed_exhausted_task(bus: &PrivateBus) {
    let task = json!({
        "schema": "airlock.task.v1", "max_attempts": 1,
        "binding": {"task_id": "task-r", "job_id": "job-r", "repository": "demo", "base_oid": BASE,
                    "expected_branch_oid": BASE, "target_branch": "agent/task-r", "branch_mode": "CREATE_NEW",
                    "generation": 1, "idempotency_key": "submit-task-r"},
        "plan": {"schema": "airlock.plan.v1", "task_id": "task-r", "job_id": "job-r", "source_head_oid": BASE,
                 "generation": 1, "idempotency_key": "plan-task-r",
                 "execution": {"action": "deterministic",
                               "change_set": [{"operation": "write_file", "path": "a.txt", "content": "a\n"}],
                               "verification": [{"label": "true", "argv": ["/bin/true"]}]}},
    });
    call(bus, "org.airlock.Tasks2", "SubmitTask", (task.to_string(),));
    let grant = call(bus, "org.airlock.Worker1", "Claim", ());
    let result = json!({
        "schema": "airlock.task-result.v1", "task_id": "task-r", "attempt": grant["attempt"],
        "execution_digest": grant["envelope"]["execution_digest"], "outcome": "failed", "commit_oid": null,
        "target_branch": "agent/task-r", "exec_result_sha256": null, "failure_code": "VERIFICATION_FAILED",
        "verification": [{"label": "true", "exit_code": 1, "timed_out": false, "duration_ms": 1}],
    });
    call(
        bus,
        "org.airlock.Worker1",
        "SubmitResult",
        (
            "task-r",
            grant["lease_epoch"].as_u64().unwrap(),
            grant["lease_token"].as_str().unwrap(),
            "a1-result-task-r",
            result.to_string(),
        ),
    );
}

fn start(dir: &Path, bus: &PrivateBus) -> (SupervisorProcess, Kill, String, PathBuf) {
    let db = dir.join("tasks.sqlite3");
    let config = dir.join("airlock.toml");
    std::fs::write(
        &config,
        "[[repository]]\nname = \"demo\"\npath = \"/srv/airlock/demo.git\"\n",
    )
    .unwrap();
    let sup = SupervisorProcess::start(
        &sibling_binary("airlock-supervisor").unwrap(),
        bus,
        &config,
        &db,
        &[],
    )
    .expect("the supervisor starts");
    failed_exhausted_task(bus);
    let token = dir.join("token");
    std::fs::write(&token, "k".repeat(48)).unwrap();
    let mut retryd = Command::new(sibling_binary("airlock-retryd").unwrap())
        .args([
            "--config",
            config.to_str().unwrap(),
            "--bus-address",
            bus.address(),
            "--listen",
            "127.0.0.1:0",
            "--token-file",
            token.to_str().unwrap(),
        ])
        .env("AIRLOCK_RETRY_AUTHORIZATION_ID", AUTH_ID)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut url = String::new();
    let mut lines = BufReader::new(retryd.stderr.take().unwrap()).lines();
    for line in lines.by_ref() {
        let line = line.unwrap();
        if let Some(addr) = line.split("listening on ").nth(1) {
            url = format!("http://{}", addr.trim());
            break;
        }
    }
    // Keep draining its log so the service never writes into a closed pipe.
    std::thread::spawn(move || lines.for_each(drop));
    assert!(!url.is_empty(), "retryd did not start");
    (sup, Kill(retryd), url, token)
}

#[test]
fn retry_extend_fills_the_cas_from_the_task_and_applies_once() {
    let dir = tempfile::tempdir().unwrap();
    let bus = PrivateBus::start().unwrap();
    let (_sup, _retryd, url, token) = start(dir.path(), &bus);
    let token = token.to_str().unwrap();
    let before = call(&bus, "org.airlock.Tasks2", "GetTask", ("task-r",));
    assert_eq!(
        (
            before["state"].as_str(),
            before["attempt"].as_i64(),
            before["max_attempts"].as_i64()
        ),
        (Some("FAILED"), Some(1), Some(1))
    );

    // A wrong token is refused with the Unauthenticated exit code and changes nothing.
    let bad = dir.path().join("bad-token");
    std::fs::write(&bad, "x".repeat(48)).unwrap();
    let (code, _, err) = ctl(
        &bus,
        &[
            "retry",
            "extend",
            "task-r",
            "--url",
            &url,
            "--token-file",
            bad.to_str().unwrap(),
            "--authorization-id",
            AUTH_ID,
        ],
    );
    assert_eq!(
        code,
        i32::from(airlock_proto::Code::UNAUTHORIZED.exit_code()),
        "{err}"
    );
    // A wrong owner id is refused by the service (403).
    let (code, _, err) = ctl(
        &bus,
        &[
            "retry",
            "extend",
            "task-r",
            "--url",
            &url,
            "--token-file",
            token,
            "--authorization-id",
            "someone-else-01",
        ],
    );
    assert_eq!(
        code,
        i32::from(airlock_proto::Code::RETRY_EXTENSION_AUTHORIZATION_ID_MISMATCH.exit_code()),
        "{err}"
    );
    assert_eq!(
        call(&bus, "org.airlock.Tasks2", "GetTask", ("task-r",))["revision"],
        before["revision"]
    );

    let (code, out, err) = ctl(
        &bus,
        &[
            "retry",
            "extend",
            "task-r",
            "--url",
            &url,
            "--token-file",
            token,
            "--authorization-id",
            AUTH_ID,
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("Extended task-r: max_attempts 1 → 2, state FAILED → QUEUED"),
        "{out}"
    );
    let after = call(&bus, "org.airlock.Tasks2", "GetTask", ("task-r",));
    assert_eq!(
        (after["state"].as_str(), after["max_attempts"].as_i64()),
        (Some("QUEUED"), Some(2))
    );

    // Asking again is refused: the task is no longer FAILED and exhausted.
    let (code, _, err) = ctl(
        &bus,
        &[
            "--json",
            "retry",
            "extend",
            "task-r",
            "--url",
            &url,
            "--token-file",
            token,
            "--authorization-id",
            AUTH_ID,
        ],
    );
    assert_eq!(
        code,
        i32::from(airlock_proto::Code::RETRY_EXTENSION_CAS_MISMATCH.exit_code()),
        "{err}"
    );
    assert!(err.contains("RETRY_EXTENSION_CAS_MISMATCH"), "{err}");
    let events = call(
        &bus,
        "org.airlock.Tasks2",
        "ListEvents",
        ("task-r", 0i64, 0u32),
    );
    let applied = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "TASK_RETRY_EXTENSION_AUTHORIZED" && e["outcome"] == "allowed")
        .count();
    assert_eq!(applied, 1);
}

//! airlockctl against a real supervisor on a real (private) bus: the real
//! binary as a child process with DBUS_SYSTEM_BUS_ADDRESS pointing at the
//! test bus, the supervisor in-process with a test authoriser.

use airlock_localbus::PrivateBus;
use airlock_proto::Code;
use airlock_supervisor::authz::testing::TestAuthorizer;
use airlock_supervisor::daemon::AuthorizerChoice;
use airlock_testkit::InProcess;
use serde_json::{Value, json};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};

const BASE: &str = "a642b045775b9154a00ae78543037fbef4fb447b";
const HEAD: &str = "71523aef6e48b1e2fa516c456ca189b7a039104b";

/// A supervisor running inside the test, on its own bus
/// ([`InProcess`]), with what these tests do with it.
struct Sup(InProcess);

impl std::ops::Deref for Sup {
    type Target = InProcess;
    fn deref(&self) -> &InProcess {
        &self.0
    }
}

impl Sup {
    async fn start(authorizer: TestAuthorizer) -> Sup {
        Sup(InProcess::builder(AuthorizerChoice::ForTests(authorizer))
            .start()
            .await)
    }

    async fn stop(self) {
        self.0.stop().await;
    }

    fn file(&self, name: &str, v: &Value) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, v.to_string()).unwrap();
        p
    }

    /// airlockctl with stdin not a terminal.
    async fn ctl(&self, args: &[&str]) -> Output {
        ctl_at(self.bus.address(), args, Stdio::null()).await
    }

    /// Acts as the worker: claim, then submit a passed result.
    async fn work_one(&self) -> Value {
        let conn = self.bus.connect().await.unwrap();
        let call = |method: &'static str| (conn.clone(), method);
        let (c, m) = call("Claim");
        let reply = c
            .call_method(
                Some("org.airlock.Supervisor1"),
                "/org/airlock/Supervisor1",
                Some("org.airlock.Worker1"),
                m,
                &(),
            )
            .await
            .unwrap();
        let grant: Value =
            serde_json::from_str(&reply.body().deserialize::<String>().unwrap()).unwrap();
        let result = json!({
            "schema": "airlock.task-result.v1",
            "task_id": grant["task_id"], "attempt": grant["attempt"],
            "execution_digest": grant["envelope"]["execution_digest"],
            "outcome": "passed", "commit_oid": "c".repeat(40),
            "target_branch": grant["envelope"]["target_branch"],
            "exec_result_sha256": "e".repeat(64), "failure_code": null,
            "verification": [{"label": "compile", "exit_code": 0, "timed_out": false, "duration_ms": 3}],
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
                "result-key-0001",
                result.to_string(),
            ),
        )
        .await
        .unwrap();
        grant
    }
}

fn ctl_command(address: &str, args: &[&str], stdin: Stdio) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_airlockctl"));
    cmd.args(args)
        .env("DBUS_SYSTEM_BUS_ADDRESS", address)
        .env_remove("NO_COLOR")
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

async fn ctl_at(address: &str, args: &[&str], stdin: Stdio) -> Output {
    tokio::time::timeout(
        Duration::from_secs(30),
        ctl_command(address, args, stdin).output(),
    )
    .await
    .expect("airlockctl finished")
    .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("exited")
}

fn exit_of(c: Code) -> i32 {
    i32::from(c.exit_code())
}

fn submission(task_id: &str, plan_version: u32) -> Value {
    json!({
        "schema": "airlock.task.v1",
        "binding": {
            "task_id": task_id, "job_id": format!("job-{task_id}"), "repository": "demo",
            "base_oid": BASE, "expected_branch_oid": HEAD, "target_branch": format!("agent/{task_id}"),
            "branch_mode": "CONTINUE_EXISTING", "generation": 1, "idempotency_key": format!("key-{task_id}-0001"),
        },
        "plan": plan(task_id, plan_version, None),
        "max_attempts": 3,
    })
}

fn plan(task_id: &str, version: u32, previous: Option<&str>) -> Value {
    let mut p = json!({
        "schema": "airlock.plan.v1", "task_id": task_id, "job_id": format!("job-{task_id}"),
        "source_head_oid": HEAD, "generation": 1, "idempotency_key": format!("plan-{task_id}-v{version}"),
        "execution": {
            "action": "deterministic",
            "change_set": [{"path": "x.py", "operation": "write_file", "content": format!("x = {version}\n")}],
            "verification": [{"label": "compile", "argv": ["/usr/bin/python3", "-m", "py_compile", "x.py"]}],
            "capability_scope": ["git.test"],
        },
    });
    if let Some(d) = previous {
        p["expected_previous_plan_digest"] = json!(d);
    }
    p
}

#[test]
fn man_page_is_up_to_date() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("airlockctl.1");
    let fresh = airlockctl::cli::man_page();
    if std::env::var_os("AIRLOCK_UPDATE_MAN").is_some() {
        std::fs::write(&path, &fresh).unwrap();
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == fresh,
        "services/ctl/airlockctl.1 is stale: run `AIRLOCK_UPDATE_MAN=1 cargo test -p airlockctl --test ctl man_page` and commit it"
    );
    let text = String::from_utf8(fresh).unwrap();
    for word in [
        "airlockctl",
        "submit",
        "verify",
        "replan",
        "events",
        "Exit status",
        "NO_COLOR",
    ] {
        assert!(text.contains(word), "{word} missing from the man page");
    }
}

/// docs/doctor.md's table of checks is generated from doctor's own table
/// of families, as are `doctor --help` and the man page's list.
#[test]
fn doctor_checks_are_listed_from_its_table() {
    use airlockctl::commands::doctor::{FAMILIES, families_markdown};
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/doctor.md");
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let (begin, end) = (
        "<!-- doctor-checks:begin -->\n",
        "<!-- doctor-checks:end -->",
    );
    let (Some(a), Some(b)) = (text.find(begin), text.find(end)) else {
        panic!("docs/doctor.md has no doctor-checks markers");
    };
    let fresh = format!("{}{begin}{}{}", &text[..a], families_markdown(), &text[b..]);
    if std::env::var_os("UPDATE_DOCS").is_some() {
        std::fs::write(&path, &fresh).unwrap();
    }
    assert!(
        std::fs::read_to_string(&path).unwrap() == fresh,
        "docs/doctor.md is stale: run `UPDATE_DOCS=1 cargo test -p airlockctl --test ctl doctor_checks` and commit it"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_airlockctl"))
        .args(["doctor", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    let man = String::from_utf8(airlockctl::cli::man_page()).unwrap();
    for f in FAMILIES {
        assert!(
            help.contains(f.name),
            "doctor --help does not list {}",
            f.name
        );
        assert!(
            man.contains(f.name),
            "the man page does not list {}",
            f.name
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_are_generated_for_each_shell() {
    for (shell, marker) in [
        ("bash", "_airlockctl()"),
        ("zsh", "#compdef airlockctl"),
        ("fish", "complete -c airlockctl"),
    ] {
        let o = ctl_at(
            "unix:path=/nonexistent",
            &["completions", shell],
            Stdio::null(),
        )
        .await;
        assert_eq!(code(&o), 0, "{shell}: {}", stderr(&o));
        assert!(stdout(&o).contains(marker), "{shell}");
        assert!(stdout(&o).contains("replan"), "{shell}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_commands_end_to_end_with_tables_and_json() {
    let sup = Sup::start(TestAuthorizer::allow_all()).await;
    let file = sup.file("task.json", &submission("task-cli", 1));

    let o = sup.ctl(&["submit", file.to_str().unwrap()]).await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        stdout(&o).starts_with("Submitted task-cli (QUEUED, attempt 0/3)"),
        "{}",
        stdout(&o)
    );
    assert!(!stdout(&o).contains('\x1b'), "no colour off a terminal");
    let o = sup.ctl(&["submit", "--json", file.to_str().unwrap()]).await;
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["idempotent"], true);

    let o = sup.ctl(&["list"]).await;
    assert_eq!(code(&o), 0);
    let text = stdout(&o);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("TASK"), "{lines:?}");
    assert!(lines[1].starts_with("task-cli  QUEUED"), "{lines:?}");
    let o = sup.ctl(&["list", "--json", "--state", "running"]).await;
    assert_eq!(
        serde_json::from_str::<Value>(&stdout(&o)).unwrap(),
        json!([])
    );
    let o = sup.ctl(&["list", "--state", "DONE"]).await;
    assert_eq!(code(&o), 2, "a usage error");

    let o = sup.ctl(&["show", "task-cli"]).await;
    assert!(stdout(&o).contains("State: QUEUED"), "{}", stdout(&o));
    assert!(stdout(&o).contains("Target branch: agent/task-cli (CONTINUE_EXISTING)"));
    let o = sup.ctl(&["show", "--json", "task-cli"]).await;
    let task: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let digest = task["plan_digest"].as_str().unwrap().to_owned();

    // replan: a stale digest is a conflict, the right one replaces.
    let stale = sup.file("stale.json", &plan("task-cli", 2, Some(&"0".repeat(64))));
    let o = sup
        .ctl(&["replan", "task-cli", stale.to_str().unwrap()])
        .await;
    assert_eq!(
        code(&o),
        exit_of(Code::EXECUTION_PLAN_REPLACEMENT_CAS_MISMATCH)
    );
    assert!(
        stderr(&o).contains("EXECUTION_PLAN_REPLACEMENT_CAS_MISMATCH"),
        "{}",
        stderr(&o)
    );
    let good = sup.file("good.json", &plan("task-cli", 2, Some(&digest)));
    let o = sup
        .ctl(&["replan", "task-cli", good.to_str().unwrap()])
        .await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).contains("Replanned task-cli"));

    // verify needs a VERIFYING task.
    let o = sup
        .ctl(&["verify", "task-cli", "accept", "--reason", "early"])
        .await;
    assert_eq!(code(&o), exit_of(Code::TASK_STATE_INVALID));
    sup.work_one().await;
    let o = sup
        .ctl(&[
            "verify",
            "task-cli",
            "accept",
            "--reason",
            "checked by hand",
        ])
        .await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        stdout(&o).contains("Decided task-cli (SUCCEEDED, attempt 1, revision"),
        "{}",
        stdout(&o)
    );
    // It showed what it decided on, and the key an exact replay names.
    let shown_sha = stdout(&o)
        .lines()
        .find_map(|l| l.strip_prefix("Deciding accept on task-cli: VERIFYING at revision "))
        .and_then(|l| l.split("result ").nth(1))
        .expect("the decision shows what it is about")
        .to_owned();
    let key = stdout(&o)
        .split("key ")
        .nth(1)
        .unwrap()
        .trim_end_matches(|c: char| c == ')' || c.is_whitespace())
        .to_owned();
    let done = sup.ctl(&["--json", "show", "task-cli"]).await;
    let done: Value = serde_json::from_str(&stdout(&done)).unwrap();
    assert_eq!(done["result_sha256"], json!(shown_sha));
    // The same decision about the same view again: the stored answer.
    let rev = (done["revision"].as_i64().unwrap() - 1).to_string();
    let replay_args = [
        "verify",
        "task-cli",
        "accept",
        "--reason",
        "checked by hand",
        "--expect-revision",
        &rev,
        "--expect-attempt",
        "1",
        "--expect-result-sha256",
        &shown_sha,
        "--idempotency-key",
        &key,
    ];
    let o = sup.ctl(&replay_args).await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        stdout(&o).contains("Already decided task-cli (SUCCEEDED"),
        "{}",
        stdout(&o)
    );
    // The same key for another decision is a conflict; a stale view is refused.
    let mut conflict = replay_args.to_vec();
    conflict[2] = "reject";
    let o = sup.ctl(&conflict).await;
    assert_eq!(code(&o), exit_of(Code::DECISION_IDEMPOTENCY_CONFLICT));
    assert!(
        stderr(&o).contains("DECISION_IDEMPOTENCY_CONFLICT"),
        "{}",
        stderr(&o)
    );
    let o = sup
        .ctl(&[
            "verify",
            "task-cli",
            "reject",
            "--reason",
            "stale",
            "--expect-revision",
            &rev,
        ])
        .await;
    assert!(
        stderr(&o).contains("DECISION_CAS_MISMATCH"),
        "{}",
        stderr(&o)
    );
    let o = sup
        .ctl(&[
            "verify",
            "task-cli",
            "reject",
            "--reason",
            "bad hash",
            "--expect-result-sha256",
            "zz",
        ])
        .await;
    assert_eq!(code(&o), exit_of(Code::RESULT_SHA256_INVALID));
    let o = sup.ctl(&["show", "task-cli"]).await;
    assert!(
        stdout(&o).contains("Verification: ACCEPTED: checked by hand"),
        "{}",
        stdout(&o)
    );

    // cancel: a finished task cannot be cancelled; a queued one can.
    let o = sup.ctl(&["cancel", "task-cli", "--reason", "late"]).await;
    assert_eq!(code(&o), exit_of(Code::TASK_STATE_INVALID));
    let other = sup.file("other.json", &submission("task-cli-2", 1));
    sup.ctl(&["submit", other.to_str().unwrap()]).await;
    let o = sup
        .ctl(&["cancel", "task-cli-2", "--reason", "not needed"])
        .await;
    assert_eq!(code(&o), 0);
    assert!(stdout(&o).contains("Cancelled task-cli-2 (CANCELLED"));

    // events: table and JSON lines.
    let o = sup.ctl(&["events", "task-cli"]).await;
    let text = stdout(&o);
    assert!(text.starts_with("ID"), "{text}");
    for action in [
        "TASK_SUBMITTED",
        "TASK_PLAN_REPLACED",
        "TASK_CLAIMED",
        "TASK_RESULT_SUBMITTED",
        "TASK_VERIFIED",
    ] {
        assert!(text.contains(action), "{action} missing:\n{text}");
    }
    assert!(
        text.contains("denied"),
        "the refused replan and verify are on record:\n{text}"
    );
    let o = sup.ctl(&["events", "--json", "--limit", "2"]).await;
    let lines: Vec<Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["action"], "TASK_SUBMITTED");
    assert!(
        lines[0]["at"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z') && t.contains('T')),
        "every JSON line carries its RFC 3339 time: {}",
        lines[0]
    );
    // --since: everything recorded in the last hour, nothing from the future.
    let all = stdout(&sup.ctl(&["events", "--json"]).await)
        .lines()
        .count();
    let recent = stdout(&sup.ctl(&["events", "--json", "--since", "1h"]).await)
        .lines()
        .count();
    assert_eq!(recent, all);
    assert!(all > 5, "{all}");
    let later = stdout(
        &sup.ctl(&["events", "--json", "--since", "2999-01-01T00:00:00Z"])
            .await,
    );
    assert_eq!(later.lines().count(), 0, "{later}");
    let o = sup.ctl(&["events", "--since", "yesterday-ish"]).await;
    assert_eq!(code(&o), 2, "a bad --since is a usage error");
    // events --count: the task's events by action, as the log lists them.
    let listed: Vec<Value> = stdout(&sup.ctl(&["events", "task-cli", "--json"]).await)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let denied = listed.iter().filter(|e| e["outcome"] == "denied").count();
    assert!(denied > 0);
    let o = sup.ctl(&["events", "task-cli", "--count", "--json"]).await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let counted: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(counted["task_id"], "task-cli");
    assert_eq!(counted["events"], listed.len());
    assert_eq!(counted["denied"], denied);
    let by_action = counted["by_action"].as_object().unwrap();
    assert_eq!(
        by_action.values().map(|n| n.as_u64().unwrap()).sum::<u64>(),
        listed.len() as u64
    );
    assert_eq!(counted["by_action"]["TASK_SUBMITTED"], 1);
    let o = sup.ctl(&["events", "task-cli", "--count"]).await;
    let text = stdout(&o);
    assert!(
        text.starts_with(&format!(
            "task-cli: {} event(s), {denied} denied\nACTION",
            listed.len()
        )),
        "{text}"
    );
    assert!(text.contains("TASK_VERIFIED"), "{text}");
    let o = sup.ctl(&["events", "--count"]).await;
    assert_eq!(code(&o), 2, "--count needs a task");

    // status
    let o = sup.ctl(&["status"]).await;
    let text = stdout(&o);
    assert!(
        text.contains("Authorizer: allow-all-for-tests (TEST AUTHORISER: no polkit)"),
        "{text}"
    );
    assert!(
        text.contains(
            "Tasks: 0 queued, 0 running, 0 verifying, 1 succeeded, 0 failed, 1 cancelled"
        ),
        "{text}"
    );
    assert!(stderr(&o).contains("warning:"));
    let o = sup.ctl(&["status", "--json"]).await;
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["tasks"]["succeeded"], 1);
    assert_eq!(v["authorizer"], "allow-all-for-tests");
    sup.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_wait_follows_the_task_to_its_end() {
    let sup = Sup::start(TestAuthorizer::allow_all()).await;
    let file = sup.file("task.json", &submission("task-wait", 1));
    let mut child = ctl_command(
        sup.bus.address(),
        &["submit", "--wait", file.to_str().unwrap()],
        Stdio::null(),
    )
    .spawn()
    .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(first.starts_with("Submitted task-wait (QUEUED"), "{first}");
    sup.work_one().await;
    let o = sup
        .ctl(&["verify", "task-wait", "reject", "--reason", "wrong change"])
        .await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let status = tokio::time::timeout(Duration::from_secs(15), child.wait())
        .await
        .unwrap()
        .unwrap();
    let mut rest = Vec::new();
    while let Ok(Some(l)) = lines.next_line().await {
        rest.push(l);
    }
    assert_eq!(
        status.code(),
        Some(1),
        "a rejected task ends FAILED: {rest:?}"
    );
    let joined = rest.join("\n");
    for state in ["RUNNING", "VERIFYING", "FAILED"] {
        assert!(joined.contains(state), "{state} not shown: {joined}");
    }

    // --json --wait: one JSON line per change, exit 0 on SUCCEEDED.
    let file = sup.file("task2.json", &submission("task-wait-2", 1));
    let child = ctl_command(
        sup.bus.address(),
        &["submit", "--wait", "--json", file.to_str().unwrap()],
        Stdio::null(),
    )
    .spawn()
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    sup.work_one().await;
    sup.ctl(&["verify", "task-wait-2", "accept", "--reason", "fine"])
        .await;
    let o = tokio::time::timeout(Duration::from_secs(15), child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let states: Vec<String> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .map(|v| {
            v.get("task").unwrap_or(&v)["state"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(states.first().map(String::as_str), Some("QUEUED"));
    assert_eq!(states.last().map(String::as_str), Some("SUCCEEDED"));
    sup.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_follow_prints_new_events_as_they_happen() {
    let sup = Sup::start(TestAuthorizer::allow_all()).await;
    let mut child = ctl_command(
        sup.bus.address(),
        &["events", "--follow", "--json"],
        Stdio::null(),
    )
    .spawn()
    .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let file = sup.file("task.json", &submission("task-follow", 1));
    sup.ctl(&["submit", file.to_str().unwrap()]).await;
    sup.ctl(&["cancel", "task-follow", "--reason", "stop"])
        .await;
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await
            .expect("an event line")
            .unwrap()
            .unwrap();
        let v: Value = serde_json::from_str(&line).unwrap();
        seen.push(v["action"].as_str().unwrap().to_owned());
    }
    assert_eq!(seen, ["TASK_SUBMITTED", "TASK_CANCELLED"]);
    child.kill().await.unwrap();
    sup.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_come_from_the_error_catalogue() {
    let sup = Sup::start(TestAuthorizer::allow_all()).await;
    let o = sup.ctl(&["show", "task-none"]).await;
    assert_eq!(code(&o), exit_of(Code::TASK_NOT_FOUND));
    assert!(
        stderr(&o).starts_with("error: TASK_NOT_FOUND: task-none"),
        "{}",
        stderr(&o)
    );
    let o = sup.ctl(&["show", "--json", "task-none"]).await;
    let e: Value = serde_json::from_str(&stderr(&o)).unwrap();
    assert_eq!(e["error"]["code"], "TASK_NOT_FOUND");
    assert_eq!(e["error"]["dbus_error"], "org.airlock.Error.TASK_NOT_FOUND");
    assert_eq!(e["error"]["exit_code"], exit_of(Code::TASK_NOT_FOUND));

    let bad = sup.dir.path().join("bad.json");
    std::fs::write(&bad, "{").unwrap();
    let o = sup.ctl(&["submit", bad.to_str().unwrap()]).await;
    assert_eq!(code(&o), exit_of(Code::MESSAGE_INVALID));
    let mut protected = submission("task-main", 1);
    protected["binding"]["target_branch"] = json!("main");
    let f = sup.file("main.json", &protected);
    let o = sup.ctl(&["submit", f.to_str().unwrap()]).await;
    assert_eq!(code(&o), exit_of(Code::PROTECTED_REF_DENY));
    let o = sup.ctl(&["submit", "/nonexistent/task.json"]).await;
    assert_eq!(code(&o), 1);
    let o = sup.ctl(&["verify", "x", "maybe", "--reason", "r"]).await;
    assert_eq!(code(&o), 2, "clap refuses the decision");
    let o = sup.ctl(&["cancel", "task-none"]).await;
    assert_eq!(code(&o), 2, "--reason is required");
    sup.stop().await;

    // Nobody owns the name: unavailable.
    let bus = PrivateBus::start().unwrap();
    let o = ctl_at(bus.address(), &["list"], Stdio::null()).await;
    assert_eq!(code(&o), 9, "{}", stderr(&o));
    let o = ctl_at(bus.address(), &["status"], Stdio::null()).await;
    assert_eq!(code(&o), 9, "{}", stderr(&o));
    // No bus at all.
    let o = ctl_at("unix:path=/nonexistent/socket", &["list"], Stdio::null()).await;
    assert_eq!(code(&o), 9, "{}", stderr(&o));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_caller_gets_access_denied_and_its_exit_code() {
    let sup = Sup::start(TestAuthorizer::deny_all()).await;
    let file = sup.file("task.json", &submission("task-no", 1));
    for args in [
        vec!["submit", file.to_str().unwrap()],
        vec!["list"],
        vec!["show", "task-no"],
        vec!["cancel", "task-no", "--reason", "x"],
        vec!["verify", "task-no", "accept", "--reason", "x"],
        vec!["events"],
        vec!["events", "task-no", "--count"],
    ] {
        let o = sup.ctl(&args).await;
        assert_eq!(code(&o), exit_of(Code::AUTHORIZATION_DENIED), "{args:?}");
        assert!(
            stderr(&o).starts_with("error: AUTHORIZATION_DENIED:"),
            "{args:?}: {}",
            stderr(&o)
        );
    }
    sup.stop().await;
}

/// A pseudo-terminal pair; the child gets the slave as stdin.
fn pty_stdin() -> (OwnedFd, Stdio) {
    let pty = nix::pty::openpty(None, None).unwrap();
    (pty.master, Stdio::from(pty.slave))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interactive_authorization_is_allowed_only_from_a_terminal() {
    let sup = Sup::start(TestAuthorizer::interactive()).await;
    // Not a terminal: the supervisor demands interaction the caller did not allow.
    let o = sup.ctl(&["list"]).await;
    assert_eq!(code(&o), exit_of(Code::INTERACTIVE_AUTHORIZATION_REQUIRED));
    assert!(
        stderr(&o).contains("INTERACTIVE_AUTHORIZATION_REQUIRED"),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("hint:"), "{}", stderr(&o));
    // A terminal on stdin: the call carries ALLOW_INTERACTIVE_AUTHORIZATION.
    let (_master, stdin) = pty_stdin();
    let o = ctl_at(sup.bus.address(), &["list"], stdin).await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), "No tasks.");
    // Unless the user says not to ask.
    let (_master, stdin) = pty_stdin();
    let o = ctl_at(sup.bus.address(), &["list", "--no-ask-password"], stdin).await;
    assert_eq!(code(&o), exit_of(Code::INTERACTIVE_AUTHORIZATION_REQUIRED));
    sup.stop().await;
}

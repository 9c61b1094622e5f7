//! `airlockctl reconcile list|show|resolve` against a real supervisor on a
//! real (private) bus: the real binary as a child process, the supervisor
//! in-process with a test authoriser, the test process playing the worker
//! (a RECONCILIATION_REQUIRED result, then the adoption checks). Each
//! refusal exits with its catalogue code and changes nothing.

use airlock_proto::Code;
use airlock_supervisor::authz::Action;
use airlock_supervisor::authz::testing::TestAuthorizer;
use airlock_supervisor::daemon::AuthorizerChoice;
use airlock_testkit::InProcess;
use serde_json::{Value, json};
use std::process::{Output, Stdio};
use std::time::Duration;

const BASE: &str = "a642b045775b9154a00ae78543037fbef4fb447b";
const MADE: &str = "1111111111111111111111111111111111111111";
const MOVED: &str = "2222222222222222222222222222222222222222";
const AGAIN: &str = "3333333333333333333333333333333333333333";

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

    async fn call(
        &self,
        iface: &str,
        method: &str,
        body: &(impl serde::Serialize + zbus::zvariant::DynamicType),
    ) -> Value {
        let conn = self.bus.connect().await.unwrap();
        let reply = conn
            .call_method(
                Some("org.airlock.Supervisor1"),
                "/org/airlock/Supervisor1",
                Some(iface),
                method,
                body,
            )
            .await
            .unwrap_or_else(|e| panic!("{method}: {e}"));
        serde_json::from_str(&reply.body().deserialize::<String>().unwrap()).unwrap()
    }

    /// Submits `task` and, as the worker, reports its first attempt's
    /// branch at `observed` instead of the commit it made.
    async fn reconciling(&self, task: &str, observed: Option<&str>) {
        let submission = json!({
            "schema": "airlock.task.v1", "max_attempts": 3,
            "binding": {"task_id": task, "job_id": format!("job-{task}"), "repository": "demo", "base_oid": BASE,
                        "expected_branch_oid": BASE, "target_branch": format!("agent/{task}"), "branch_mode": "CREATE_NEW",
                        "generation": 1, "idempotency_key": format!("submit-{task}")},
            "plan": {"schema": "airlock.plan.v1", "task_id": task, "job_id": format!("job-{task}"), "source_head_oid": BASE,
                     "generation": 1, "idempotency_key": format!("plan-{task}"),
                     "execution": {"action": "deterministic",
                                   "change_set": [{"operation": "write_file", "path": "a.txt", "content": "a\n"}],
                                   "verification": [{"label": "true", "argv": ["/bin/true"]}]}},
        });
        self.call(
            "org.airlock.Tasks2",
            "SubmitTask",
            &(submission.to_string(),),
        )
        .await;
        let grant = self.call("org.airlock.Worker1", "Claim", &()).await;
        assert_eq!(grant["task_id"], task);
        let result = json!({
            "schema": "airlock.task-result.v1", "task_id": task, "attempt": grant["attempt"],
            "execution_digest": grant["envelope"]["execution_digest"], "outcome": "failed", "commit_oid": null,
            "target_branch": format!("agent/{task}"), "exec_result_sha256": null,
            "failure_code": "RECONCILIATION_REQUIRED", "verification": [],
            "reconciliation": {"commit_oid": MADE, "observed_head": observed},
        });
        self.call(
            "org.airlock.Worker1",
            "SubmitResult",
            &(
                task,
                grant["lease_epoch"].as_u64().unwrap(),
                grant["lease_token"].as_str().unwrap(),
                format!("result-{task}-1"),
                result.to_string(),
            ),
        )
        .await;
    }

    /// As the worker: takes the adoption waiting and reports `now`.
    async fn settle(&self, now: Option<&str>, descends: bool) -> Value {
        let check = self.call("org.airlock.Worker1", "TakeAdoption", &()).await;
        assert!(check.is_object(), "an adoption waits: {check}");
        let report = json!({
            "task_id": check["task_id"], "attempt": check["attempt"],
            "checked_head": check["observed_head"], "head_now": now, "descends": descends,
        });
        self.call(
            "org.airlock.Worker1",
            "SettleAdoption",
            &(report.to_string(),),
        )
        .await
    }

    async fn ctl(&self, args: &[&str]) -> Output {
        tokio::time::timeout(
            Duration::from_secs(60),
            tokio::process::Command::new(env!("CARGO_BIN_EXE_airlockctl"))
                .args(args)
                .env("DBUS_SYSTEM_BUS_ADDRESS", self.bus.address())
                .env("NO_COLOR", "1")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .output(),
        )
        .await
        .expect("airlockctl finished")
        .unwrap()
    }

    /// `--json events TASK`: one event per line.
    async fn events(&self, task: &str) -> Vec<Value> {
        let o = self.ctl(&["--json", "events", task]).await;
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        stdout(&o)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    async fn json(&self, args: &[&str]) -> Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let o = self.ctl(&all).await;
        assert_eq!(code(&o), 0, "{args:?}: {}", stderr(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    }

    /// `args` must exit with `c`'s exit code and name `c` on stderr, and
    /// leave the case and the task as they were.
    async fn refused(&self, task: &str, args: &[&str], c: Code) {
        let case = self.json(&["reconcile", "show", task]).await;
        let view = self.json(&["show", task]).await;
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let o = self.ctl(&all).await;
        assert_eq!(
            code(&o),
            i32::from(c.exit_code()),
            "{args:?}: {}",
            stderr(&o)
        );
        let err: Value = serde_json::from_slice(&o.stderr)
            .unwrap_or_else(|_| panic!("{args:?}: {}", stderr(&o)));
        assert_eq!(err["error"]["code"], c.as_str(), "{args:?}: {err}");
        assert_eq!(
            self.json(&["reconcile", "show", task]).await,
            case,
            "{args:?}"
        );
        assert_eq!(self.json(&["show", task]).await, view, "{args:?}");
    }
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("exited")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_show_and_resolve_fail_with_every_refusal() {
    let sup = Sup::start(TestAuthorizer::allow_all()).await;
    sup.reconciling("task-f", Some(MOVED)).await;
    // The task ended FAILED at once (attempts left), its case open.
    let view = sup.json(&["show", "task-f"]).await;
    assert_eq!(view["state"], "FAILED");
    assert_eq!(view["result"]["failure_code"], "RECONCILIATION_REQUIRED");
    let list = sup.json(&["reconcile", "list"]).await;
    assert_eq!(list["cases"].as_array().unwrap().len(), 1, "{list}");
    assert_eq!(list["cases"][0]["status"], "open");
    let open = sup.json(&["reconcile", "list", "--status", "open"]).await;
    assert_eq!(open, list);
    let adopted = sup
        .json(&["reconcile", "list", "--status", "adopted"])
        .await;
    assert_eq!(adopted["cases"], json!([]));
    let o = sup.ctl(&["reconcile", "list"]).await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        stdout(&o).contains("task-f") && stdout(&o).contains("open"),
        "{}",
        stdout(&o)
    );
    let case = sup.json(&["reconcile", "show", "task-f"]).await;
    assert_eq!(
        (
            &case["commit_oid"],
            &case["observed_head"],
            &case["base_oid"],
            &case["revision"]
        ),
        (&json!(MADE), &json!(MOVED), &json!(BASE), &json!(1))
    );
    let o = sup.ctl(&["reconcile", "show", "task-f"]).await;
    assert!(
        stdout(&o).contains(&format!("Observed head:  {MOVED}")),
        "{}",
        stdout(&o)
    );

    // Refusals, each with its code; nothing changes.
    sup.submit_plain("task-none-case").await;
    sup.refused(
        "task-f",
        &[
            "reconcile",
            "resolve",
            "task-none-case",
            "fail",
            "--reason",
            "x",
        ],
        Code::RECONCILIATION_NOT_FOUND,
    )
    .await;
    sup.refused(
        "task-f",
        &[
            "reconcile",
            "resolve",
            "task-f",
            "fail",
            "--reason",
            "x",
            "--expect-head",
            AGAIN,
        ],
        Code::RECONCILIATION_CAS_MISMATCH,
    )
    .await;
    sup.refused(
        "task-f",
        &[
            "reconcile",
            "resolve",
            "task-f",
            "fail",
            "--reason",
            "x",
            "--expect-revision",
            "7",
        ],
        Code::RECONCILIATION_CAS_MISMATCH,
    )
    .await;
    // Bad input: refused before anything is sent, or by the supervisor.
    sup.refused(
        "task-f",
        &[
            "reconcile",
            "resolve",
            "task-f",
            "fail",
            "--reason",
            "x",
            "--expect-head",
            "HEAD",
        ],
        Code::RECONCILIATION_RESOLUTION_INVALID,
    )
    .await;
    sup.refused(
        "task-f",
        &["reconcile", "resolve", "task-f", "fail", "--reason", " "],
        Code::RECONCILIATION_RESOLUTION_INVALID,
    )
    .await;
    sup.refused(
        "task-f",
        &[
            "reconcile",
            "resolve",
            "task-f",
            "fail",
            "--reason",
            "x",
            "--idempotency-key",
            "k",
        ],
        Code::IDEMPOTENCY_KEY_INVALID,
    )
    .await;
    let o = sup
        .ctl(&["reconcile", "resolve", "task-f", "merge", "--reason", "x"])
        .await;
    assert_eq!(code(&o), 2, "a usage error: {}", stderr(&o));

    // fail: applied once; the same request again is a replay; the same key
    // with another reason is a conflict; any other request finds it closed.
    let key = "resolve-task-f-0001";
    let out = sup
        .json(&[
            "reconcile",
            "resolve",
            "task-f",
            "fail",
            "--reason",
            "force-pushed by hand",
            "--idempotency-key",
            key,
        ])
        .await;
    assert_eq!(out["outcome"]["status"], "failed");
    assert_eq!(out["outcome"]["task_state"], "FAILED");
    assert_eq!(out["outcome"]["idempotent"], false);
    assert_eq!(out["request"]["expected_observed_head"], MOVED);
    let view = sup.json(&["show", "task-f"]).await;
    assert_eq!(view["verification"]["decision"], "RECONCILIATION_FAILED");
    assert_eq!(view["verification"]["reason"], "force-pushed by hand");
    let again = sup
        .json(&[
            "reconcile",
            "resolve",
            "task-f",
            "fail",
            "--reason",
            "force-pushed by hand",
            "--idempotency-key",
            key,
            "--expect-revision",
            "1",
        ])
        .await;
    assert_eq!(again["outcome"]["idempotent"], true);
    let o = sup
        .ctl(&[
            "reconcile",
            "resolve",
            "task-f",
            "fail",
            "--reason",
            "force-pushed by hand",
            "--idempotency-key",
            key,
            "--expect-revision",
            "1",
        ])
        .await;
    assert!(
        stdout(&o).contains("Already resolved task-f"),
        "{}",
        stdout(&o)
    );
    sup.refused(
        "task-f",
        &[
            "reconcile",
            "resolve",
            "task-f",
            "fail",
            "--reason",
            "another",
            "--idempotency-key",
            key,
            "--expect-revision",
            "1",
        ],
        Code::RECONCILIATION_IDEMPOTENCY_CONFLICT,
    )
    .await;
    sup.refused(
        "task-f",
        &[
            "reconcile",
            "resolve",
            "task-f",
            "adopt",
            "--reason",
            "changed my mind",
        ],
        Code::RECONCILIATION_CLOSED,
    )
    .await;
    // Every resolution, refusals included, is in the event log.
    let events = sup.events("task-f").await;
    let resolved: Vec<&Value> = events
        .iter()
        .filter(|e| e["action"] == "TASK_RECONCILIATION_RESOLVED")
        .collect();
    assert_eq!(
        resolved
            .iter()
            .filter(|e| e["outcome"] == "allowed")
            .count(),
        1,
        "{resolved:?}"
    );
    assert!(
        resolved
            .iter()
            .any(|e| e["code"] == "RECONCILIATION_CAS_MISMATCH")
    );
    sup.stop().await;
}

impl Sup {
    async fn submit_plain(&self, task: &str) {
        let submission = json!({
            "schema": "airlock.task.v1", "max_attempts": 1,
            "binding": {"task_id": task, "job_id": format!("job-{task}"), "repository": "demo", "base_oid": BASE,
                        "expected_branch_oid": BASE, "target_branch": format!("agent/{task}"), "branch_mode": "CREATE_NEW",
                        "generation": 1, "idempotency_key": format!("submit-{task}")},
            "plan": {"schema": "airlock.plan.v1", "task_id": task, "job_id": format!("job-{task}"), "source_head_oid": BASE,
                     "generation": 1, "idempotency_key": format!("plan-{task}"),
                     "execution": {"action": "deterministic",
                                   "change_set": [{"operation": "write_file", "path": "a.txt", "content": "a\n"}],
                                   "verification": [{"label": "true", "argv": ["/bin/true"]}]}},
        });
        self.call(
            "org.airlock.Tasks2",
            "SubmitTask",
            &(submission.to_string(),),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopt_waits_for_the_workers_check_and_exits_with_its_refusal() {
    let sup = Sup::start(TestAuthorizer::allow_all()).await;
    sup.reconciling("task-a", Some(MOVED)).await;
    // adopt, without waiting: the case waits for the worker.
    let out = sup
        .json(&[
            "reconcile",
            "resolve",
            "task-a",
            "adopt",
            "--reason",
            "looks right",
            "--wait",
            "0",
        ])
        .await;
    assert_eq!(out["outcome"]["status"], "adopting");
    assert_eq!(out["outcome"]["task_state"], "FAILED");
    // The worker finds the branch moved again: the case opens with the new
    // head and the refusal.
    let case = sup.settle(Some(AGAIN), true).await;
    assert_eq!(case["status"], "open");
    let shown = sup.json(&["reconcile", "show", "task-a"]).await;
    assert_eq!(
        (&shown["observed_head"], &shown["last_refusal"]),
        (&json!(AGAIN), &json!("RECONCILIATION_HEAD_MOVED"))
    );
    assert_eq!(sup.json(&["show", "task-a"]).await["state"], "FAILED");
    // adopt again, waiting: the worker (this test) refuses once more, and
    // airlockctl exits with that refusal's code.
    let waiting = {
        let address = sup.bus.address().to_owned();
        tokio::spawn(async move {
            tokio::process::Command::new(env!("CARGO_BIN_EXE_airlockctl"))
                .args([
                    "reconcile",
                    "resolve",
                    "task-a",
                    "adopt",
                    "--reason",
                    "the new one",
                    "--wait",
                    "20",
                ])
                .env("DBUS_SYSTEM_BUS_ADDRESS", address)
                .stdin(Stdio::null())
                .output()
                .await
                .unwrap()
        })
    };
    let mut settled = Value::Null;
    for _ in 0..100 {
        let check = sup.call("org.airlock.Worker1", "TakeAdoption", &()).await;
        if check.is_object() {
            settled = sup.settle(Some(AGAIN), false).await;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(settled["last_refusal"], "RECONCILIATION_HEAD_UNRELATED");
    let o = waiting.await.unwrap();
    assert_eq!(
        code(&o),
        i32::from(Code::RECONCILIATION_HEAD_UNRELATED.exit_code()),
        "{}{}",
        stdout(&o),
        stderr(&o)
    );
    assert!(
        stdout(&o).contains("The worker refused the adoption (RECONCILIATION_HEAD_UNRELATED)"),
        "{}",
        stdout(&o)
    );
    // Finally the check passes: adopted, the task SUCCEEDED with that head.
    sup.json(&[
        "reconcile",
        "resolve",
        "task-a",
        "adopt",
        "--reason",
        "checked the history",
        "--wait",
        "0",
    ])
    .await;
    let case = sup.settle(Some(AGAIN), true).await;
    assert_eq!(case["status"], "adopted");
    let view = sup.json(&["show", "task-a"]).await;
    assert_eq!(view["state"], "SUCCEEDED");
    assert_eq!(view["verification"]["decision"], "ADOPTED");
    assert_eq!(view["verification"]["commit_oid"], AGAIN);
    let o = sup.ctl(&["show", "task-a"]).await;
    assert!(
        stdout(&o).contains("ADOPTED: checked the history")
            && stdout(&o).contains(&format!("commit {AGAIN}")),
        "{}",
        stdout(&o)
    );
    assert_eq!(
        sup.call("org.airlock.Worker1", "TakeAdoption", &()).await,
        Value::Null,
        "nothing waits any more"
    );
    // No head to adopt where the branch is gone.
    sup.reconciling("task-g", None).await;
    sup.refused(
        "task-g",
        &[
            "reconcile",
            "resolve",
            "task-g",
            "adopt",
            "--reason",
            "x",
            "--wait",
            "0",
        ],
        Code::RECONCILIATION_HEAD_UNRELATED,
    )
    .await;
    let o = sup.ctl(&["reconcile", "show", "task-g"]).await;
    assert!(stdout(&o).contains("(branch missing)"), "{}", stdout(&o));
    sup.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolving_needs_reconcile_manage_and_reading_tasks_read() {
    let sup = Sup::start(TestAuthorizer::allowing([
        Action::Read,
        Action::Submit,
        Action::Manage,
    ]))
    .await;
    sup.reconciling("task-n", Some(MOVED)).await;
    // tasks.read lists and shows; tasks.manage is not enough to resolve.
    assert_eq!(
        sup.json(&["reconcile", "list"]).await["cases"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    sup.refused(
        "task-n",
        &["reconcile", "resolve", "task-n", "fail", "--reason", "x"],
        Code::AUTHORIZATION_DENIED,
    )
    .await;
    let events = sup.events("task-n").await;
    assert!(
        events
            .iter()
            .any(|e| e["action"] == "TASK_RECONCILIATION_RESOLVED"
                && e["code"] == "AUTHORIZATION_DENIED"),
        "the denial is audited: {events:?}"
    );
    sup.stop().await;
    let sup = Sup::start(TestAuthorizer::deny_all()).await;
    for args in [
        vec!["reconcile", "list"],
        vec!["reconcile", "show", "task-n"],
        vec!["reconcile", "resolve", "task-n", "fail", "--reason", "x"],
    ] {
        let o = sup.ctl(&args).await;
        assert_eq!(
            code(&o),
            i32::from(Code::AUTHORIZATION_DENIED.exit_code()),
            "{args:?}"
        );
    }
    let o = sup.ctl(&["reconcile", "--help"]).await;
    assert_eq!(code(&o), 0);
    for word in ["list", "show", "resolve"] {
        assert!(stdout(&o).contains(word), "{}", stdout(&o));
    }
    sup.stop().await;
}

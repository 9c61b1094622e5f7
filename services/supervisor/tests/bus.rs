//! The supervisor over a real bus: every method's happy path and its
//! refusals, the worker uid check, denials on record, the shipped bus
//! policy, restart after SIGKILL, orderly shutdown, sd_notify.

mod common;

use airlock_proto::Code;
use airlock_proto::task::{Decision, DecisionRequest, TaskView};
use airlock_taskdb::tasks::EventOutcome;
use common::*;
use futures_util::StreamExt;
use serde_json::{Value, json};
use std::time::Duration;

async fn signal_stream(conn: &zbus::Connection) -> zbus::MessageStream {
    let rule = zbus::MatchRule::builder()
        .msg_type(zbus::message::Type::Signal)
        .interface(TASKS)
        .unwrap()
        .member("TaskChanged")
        .unwrap()
        .build();
    zbus::MessageStream::for_match_rule(rule, conn, None)
        .await
        .unwrap()
}

async fn next_change(stream: &mut zbus::MessageStream) -> (String, String, i64) {
    next_change_within(stream, Duration::from_secs(10)).await
}

async fn next_change_within(
    stream: &mut zbus::MessageStream,
    timeout: Duration,
) -> (String, String, i64) {
    let msg = tokio::time::timeout(timeout, stream.next())
        .await
        .expect("a TaskChanged signal")
        .unwrap()
        .unwrap();
    msg.body().deserialize().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_task_lifecycle_over_the_bus() {
    let sup = Supervisor::start(Opts::default());
    let conn = sup.client().await;
    let mut changes = signal_stream(&conn).await;

    assert_eq!(
        property::<String>(&conn, "Authorizer").await,
        "allow-all-for-tests"
    );
    assert!(!property::<bool>(&conn, "AutoAccept").await);
    assert_eq!(property::<u32>(&conn, "WorkerUid").await, WORKER_UID);
    assert_eq!(property::<u64>(&conn, "Queued").await, 0);

    // SubmitTask, and its idempotent replay.
    let out = submit(&conn, "task-life").await;
    assert_eq!(out["idempotent"], false);
    assert_eq!(out["task"]["state"], "QUEUED");
    assert_eq!(next_change(&mut changes).await.1, "QUEUED");
    let again = submit(&conn, "task-life").await;
    assert_eq!(again["idempotent"], true);
    assert_eq!(property::<u64>(&conn, "Queued").await, 1);

    // GetTask and ListTasks (filter, paging).
    let view = call_json(&conn, TASKS, "GetTask", &("task-life",))
        .await
        .unwrap();
    assert_eq!(view["task_id"], "task-life");
    let first_plan_digest = view["plan_digest"].as_str().unwrap().to_owned();
    submit(&conn, "task-other").await;
    next_change(&mut changes).await;
    let page = call_json(&conn, TASKS, "ListTasks", &("", "", 1u32))
        .await
        .unwrap();
    assert_eq!(page["tasks"].as_array().unwrap().len(), 1);
    assert_eq!(page["tasks"][0]["task_id"], "task-life");
    let after = page["next_after"].as_str().unwrap().to_owned();
    let page2 = call_json(&conn, TASKS, "ListTasks", &("", after.as_str(), 1u32))
        .await
        .unwrap();
    assert_eq!(page2["tasks"][0]["task_id"], "task-other");
    let queued = call_json(&conn, TASKS, "ListTasks", &("QUEUED", "", 0u32))
        .await
        .unwrap();
    assert_eq!(queued["tasks"].as_array().unwrap().len(), 2);
    assert_eq!(queued["next_after"], Value::Null);
    let running = call_json(&conn, TASKS, "ListTasks", &("RUNNING", "", 0u32))
        .await
        .unwrap();
    assert!(running["tasks"].as_array().unwrap().is_empty());

    // ReplacePlan with compare-and-swap on the previous digest.
    let stale = call_json(
        &conn,
        TASKS,
        "ReplacePlan",
        &(
            "task-life",
            plan("task-life", 2, Some(&"0".repeat(64))).to_string(),
        ),
    )
    .await
    .unwrap_err();
    assert_eq!(
        stale.code(),
        Some(Code::EXECUTION_PLAN_REPLACEMENT_CAS_MISMATCH)
    );
    let replaced = call_json(
        &conn,
        TASKS,
        "ReplacePlan",
        &(
            "task-life",
            plan("task-life", 2, Some(&first_plan_digest)).to_string(),
        ),
    )
    .await
    .unwrap();
    assert_ne!(replaced["plan_digest"], json!(first_plan_digest));
    next_change(&mut changes).await;

    // Worker1 as the worker uid, through plain busctl.
    let grant = worker_claim(&sup);
    assert_eq!(grant["task_id"], "task-life");
    assert_eq!(grant["attempt"], 1);
    assert_eq!(grant["lease_epoch"], 1);
    assert_eq!(
        grant["envelope"]["execution_digest"],
        replaced["execution_digest"]
    );
    assert_eq!(
        next_change(&mut changes).await,
        (
            "task-life".into(),
            "RUNNING".into(),
            grant_revision(&conn, "task-life").await
        )
    );
    let expiry = worker_renew(&sup, WORKER_UID, &grant, 1).unwrap();
    assert!(expiry >= grant["lease_expires_at_ms"].as_i64().unwrap());
    let receipt = worker_submit(&sup, WORKER_UID, &grant, 1, &passed_result(&grant)).unwrap();
    assert_eq!(receipt["task"]["state"], "VERIFYING", "auto_accept is off");
    assert_eq!(receipt["idempotent"], false);
    let replay = worker_submit(&sup, WORKER_UID, &grant, 1, &passed_result(&grant)).unwrap();
    assert_eq!(replay["idempotent"], true);
    assert_eq!(next_change(&mut changes).await.1, "VERIFYING");

    // Verify: bad decision, then accept.
    let mut maybe: Value =
        serde_json::from_str(&decision_about(&conn, "task-life", "accept", "hmm").await).unwrap();
    maybe["decision"] = json!("maybe");
    let bad = call_json(&conn, TASKS, "Verify", &("task-life", maybe.to_string()))
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Some(Code::VERIFICATION_DECISION_INVALID));
    let accept = decision_about(&conn, "task-life", "accept", "looks right").await;
    let done = call_json(&conn, TASKS, "Verify", &("task-life", accept.as_str()))
        .await
        .unwrap();
    assert_eq!(done["state"], "SUCCEEDED");
    assert_eq!(done["idempotent"], false);
    assert_eq!(next_change(&mut changes).await.1, "SUCCEEDED");

    // CancelTask on the other one; a second cancel is a state conflict.
    let cancel = decision_about(&conn, "task-other", "cancel", "not needed").await;
    let cancelled = call_json(&conn, TASKS, "CancelTask", &("task-other", cancel.as_str()))
        .await
        .unwrap();
    assert_eq!(cancelled["state"], "CANCELLED");
    let cancel = decision_about(&conn, "task-other", "cancel", "again").await;
    let again = call_json(&conn, TASKS, "CancelTask", &("task-other", cancel.as_str()))
        .await
        .unwrap_err();
    assert_eq!(again.code(), Some(Code::TASK_STATE_INVALID));
    assert_eq!(again.name, "org.airlock.Error.TASK_STATE_INVALID");
    assert!(again.message.contains("CANCELLED"), "{}", again.message);

    // ListEvents: the whole story of task-life, in order.
    let events = call_json(&conn, TASKS, "ListEvents", &("task-life", 0i64, 0u32))
        .await
        .unwrap();
    let actions: Vec<&str> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["outcome"] == "allowed")
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        [
            "TASK_SUBMITTED",
            "TASK_PLAN_REPLACED",
            "TASK_CLAIMED",
            "TASK_LEASE_RENEWED",
            "TASK_RESULT_SUBMITTED",
            "TASK_VERIFIED"
        ]
    );
    let claimed = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["action"] == "TASK_CLAIMED")
        .unwrap();
    assert_eq!(claimed["actor"]["uid"], WORKER_UID);
    assert_eq!(claimed["actor"]["kind"], "worker");
    let next = events["next_after"].as_i64().unwrap();
    let none = call_json(&conn, TASKS, "ListEvents", &("task-life", next, 0u32))
        .await
        .unwrap();
    assert!(none["events"].as_array().unwrap().is_empty());
    assert_eq!(property::<u64>(&conn, "Succeeded").await, 1);
    assert_eq!(property::<u64>(&conn, "Cancelled").await, 1);
}

async fn grant_revision(conn: &zbus::Connection, id: &str) -> i64 {
    call_json(conn, TASKS, "GetTask", &(id,)).await.unwrap()["revision"]
        .as_i64()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_accept_succeeds_a_result_whose_commands_all_passed() {
    let sup = Supervisor::start(Opts {
        auto_accept: true,
        ..Opts::default()
    });
    let conn = sup.client().await;
    assert!(property::<bool>(&conn, "AutoAccept").await);
    submit(&conn, "task-auto").await;
    let grant = worker_claim(&sup);
    let receipt = worker_submit(&sup, WORKER_UID, &grant, 1, &passed_result(&grant)).unwrap();
    assert_eq!(receipt["task"]["state"], "SUCCEEDED");

    // A failed command is never auto-accepted: the task is reworked.
    submit(&conn, "task-auto-fail").await;
    let grant = worker_claim(&sup);
    let mut result = passed_result(&grant);
    result["verification"][0]["exit_code"] = json!(1);
    let receipt = worker_submit(&sup, WORKER_UID, &grant, 1, &result).unwrap();
    assert_eq!(receipt["task"]["state"], "VERIFYING");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_carry_the_catalogue_error_name_and_the_detail() {
    let sup = Supervisor::start(Opts::default());
    let conn = sup.client().await;
    let code = |r: Result<Value, BusErr>| r.unwrap_err().code();

    assert_eq!(
        code(call_json(&conn, TASKS, "GetTask", &("task-missing",)).await),
        Some(Code::TASK_NOT_FOUND)
    );
    assert_eq!(
        code(call_json(&conn, TASKS, "GetTask", &("../etc",)).await),
        Some(Code::TASK_ID_INVALID)
    );
    assert_eq!(
        code(call_json(&conn, TASKS, "SubmitTask", &("{not json",)).await),
        Some(Code::MESSAGE_INVALID)
    );
    let mut other_repo = submission("task-repo");
    other_repo["binding"]["repository"] = json!("elsewhere");
    let err = call_json(&conn, TASKS, "SubmitTask", &(other_repo.to_string(),))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(Code::REPOSITORY_NOT_REGISTERED));
    assert_eq!(err.message, "elsewhere");
    let mut main = submission("task-main");
    main["binding"]["target_branch"] = json!("main");
    assert_eq!(
        code(call_json(&conn, TASKS, "SubmitTask", &(main.to_string(),)).await),
        Some(Code::PROTECTED_REF_DENY)
    );
    assert_eq!(
        code(call_json(&conn, TASKS, "ListTasks", &("DONE", "", 0u32)).await),
        Some(Code::MESSAGE_INVALID)
    );
    submit(&conn, "task-r").await;
    let early = decision_about(&conn, "task-r", "accept", "too early").await;
    assert_eq!(
        code(call_json(&conn, TASKS, "Verify", &("task-r", early.as_str())).await),
        Some(Code::TASK_STATE_INVALID)
    );
    let mut blank: Value =
        serde_json::from_str(&decision_about(&conn, "task-r", "cancel", "x").await).unwrap();
    blank["reason"] = json!("   ");
    assert_eq!(
        code(call_json(&conn, TASKS, "CancelTask", &("task-r", blank.to_string())).await),
        Some(Code::VERIFICATION_DECISION_INVALID)
    );
    assert_eq!(
        code(call_json(&conn, TASKS, "CancelTask", &("task-r", "{not json")).await),
        Some(Code::MESSAGE_INVALID)
    );
    assert_eq!(
        code(call_json(&conn, TASKS, "ReplacePlan", &("task-r", "[]")).await),
        Some(Code::EXECUTION_PLAN_SCHEMA_INVALID)
    );
    let mut conflicting = submission("task-r");
    conflicting["max_attempts"] = json!(3);
    assert_eq!(
        code(call_json(&conn, TASKS, "SubmitTask", &(conflicting.to_string(),)).await),
        Some(Code::TASK_IDEMPOTENCY_CONFLICT)
    );

    // Worker-side refusals, as the worker: lease fencing and bad results.
    let grant = worker_claim(&sup);
    let mut forged = grant.clone();
    forged["lease_token"] = json!("0".repeat(64));
    assert!(
        worker_renew(&sup, WORKER_UID, &forged, 1)
            .unwrap_err()
            .contains("lease token")
    );
    let wrong_epoch = dbus_send(
        &sup,
        WORKER_UID,
        "org.airlock.Worker1.Renew",
        &[
            "string:task-r",
            "uint64:7",
            &format!("string:{}", grant["lease_token"].as_str().unwrap()),
        ],
    )
    .unwrap_err();
    assert_eq!(wrong_epoch.code(), Some(Code::LEASE_INVALID));
    let bad_result = dbus_send(
        &sup,
        WORKER_UID,
        "org.airlock.Worker1.SubmitResult",
        &[
            "string:task-r",
            "uint64:1",
            &format!("string:{}", grant["lease_token"].as_str().unwrap()),
            "string:result-key-0001",
            "string:{\"schema\": \"x\"}",
        ],
    )
    .unwrap_err();
    assert_eq!(bad_result.code(), Some(Code::MESSAGE_INVALID));
    assert_eq!(worker_claim(&sup), Value::Null, "nothing else is claimable");

    // Every refusal is on record, with its code.
    let store = sup.store();
    let denied: Vec<Code> = store
        .events(None, 0, 1000)
        .unwrap()
        .into_iter()
        .filter(|e| e.outcome == EventOutcome::Denied)
        .filter_map(|e| e.code)
        .collect();
    for expected in [
        Code::MESSAGE_INVALID,
        Code::REPOSITORY_NOT_REGISTERED,
        Code::TASK_STATE_INVALID,
        Code::LEASE_INVALID,
        Code::TASK_IDEMPOTENCY_CONFLICT,
    ] {
        assert!(denied.contains(&expected), "{expected} not in {denied:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_interface_is_reserved_for_the_worker_uid() {
    let sup = Supervisor::start(Opts::default());
    let conn = sup.client().await;
    submit(&conn, "task-w").await;

    // root is not the worker.
    let err = call_json(&conn, WORKER, "Claim", &()).await.unwrap_err();
    assert_eq!(err.code(), Some(Code::PEER_UID_DENIED));
    assert_eq!(err.name, "org.airlock.Error.PEER_UID_DENIED");
    assert!(err.message.contains("uid 0"), "{}", err.message);

    // Another unprivileged uid is not the worker either, for every method.
    for (method, args) in [
        ("org.airlock.Worker1.Claim", vec![]),
        (
            "org.airlock.Worker1.Renew",
            vec!["string:task-w", "uint64:1", "string:x"],
        ),
        (
            "org.airlock.Worker1.SubmitResult",
            vec![
                "string:task-w",
                "uint64:1",
                "string:x",
                "string:key-00000001",
                "string:{}",
            ],
        ),
        ("org.airlock.Worker1.TakeAdoption", vec![]),
        (
            "org.airlock.Worker1.SettleAdoption",
            vec!["string:{\"task_id\":\"task-w\"}"],
        ),
    ] {
        let err = dbus_send(&sup, STRANGER_UID, method, &args).unwrap_err();
        assert_eq!(err.code(), Some(Code::PEER_UID_DENIED), "{method}: {err:?}");
    }

    // The worker uid may; the task was not claimed by the refused calls.
    let grant = worker_claim(&sup);
    assert_eq!(grant["task_id"], "task-w");
    assert_eq!(grant["attempt"], 1);
    // Its lease is useless to anybody else.
    let stolen = worker_renew(&sup, STRANGER_UID, &grant, 1).unwrap_err();
    assert!(stolen.contains("uid 1 "), "{stolen}");

    let denied: Vec<_> = sup
        .store()
        .events(None, 0, 1000)
        .unwrap()
        .into_iter()
        .filter(|e| e.code == Some(Code::PEER_UID_DENIED))
        .collect();
    assert_eq!(denied.len(), 7);
    assert!(denied.iter().any(|e| e.actor.uid == Some(0)));
    assert!(denied.iter().any(|e| e.actor.uid == Some(STRANGER_UID)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_caller_is_refused_everywhere_and_every_denial_is_recorded() {
    let sup = Supervisor::start(Opts {
        authorizer: "deny-all-for-tests".into(),
        ..Opts::default()
    });
    let conn = sup.client().await;
    assert_eq!(
        property::<String>(&conn, "Authorizer").await,
        "deny-all-for-tests"
    );
    let sub = submission("task-d").to_string();
    let plan = plan("task-d", 2, None).to_string();
    let calls: Vec<(&str, Result<Value, BusErr>)> = vec![
        (
            "SubmitTask",
            call_json(&conn, TASKS, "SubmitTask", &(sub.as_str(),)).await,
        ),
        (
            "ReplacePlan",
            call_json(&conn, TASKS, "ReplacePlan", &("task-d", plan.as_str())).await,
        ),
        (
            "GetTask",
            call_json(&conn, TASKS, "GetTask", &("task-d",)).await,
        ),
        (
            "ListTasks",
            call_json(&conn, TASKS, "ListTasks", &("", "", 0u32)).await,
        ),
        (
            "ListEvents",
            call_json(&conn, TASKS, "ListEvents", &("", 0i64, 0u32)).await,
        ),
        (
            "CancelTask",
            call_json(&conn, TASKS, "CancelTask", &("task-d", "{}")).await,
        ),
        (
            "Verify",
            call_json(&conn, TASKS, "Verify", &("task-d", "{}")).await,
        ),
    ];
    for (method, r) in &calls {
        let err = r.as_ref().unwrap_err();
        assert_eq!(err.code(), Some(Code::AUTHORIZATION_DENIED), "{method}");
        assert_eq!(
            err.name, "org.freedesktop.DBus.Error.AccessDenied",
            "{method}"
        );
    }
    // Unprivileged callers too (the shipped bus policy lets them ask).
    let err = dbus_send(
        &sup,
        STRANGER_UID,
        "org.airlock.Tasks2.GetTask",
        &["string:task-d"],
    )
    .unwrap_err();
    assert_eq!(err.name, "org.freedesktop.DBus.Error.AccessDenied");

    let store = sup.store();
    assert_eq!(store.summary().unwrap().total(), 0, "nothing was created");
    let events = store.events(None, 0, 1000).unwrap();
    assert_eq!(events.len(), calls.len() + 1);
    assert!(
        events.iter().all(
            |e| e.outcome == EventOutcome::Denied && e.code == Some(Code::AUTHORIZATION_DENIED)
        )
    );
    let actions: Vec<&str> = events.iter().map(|e| e.action.as_str()).collect();
    assert_eq!(
        actions,
        [
            "TASK_SUBMITTED",
            "TASK_PLAN_REPLACED",
            "TASK_READ",
            "TASKS_LISTED",
            "EVENTS_READ",
            "TASK_CANCELLED",
            "TASK_VERIFIED",
            "TASK_READ"
        ]
    );
    assert_eq!(
        events[0].task_id.as_deref(),
        Some("task-d"),
        "the submission's task is named"
    );
    assert_eq!(events[7].actor.uid, Some(STRANGER_UID));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_list_authorizer_decides_per_action() {
    let sup = Supervisor::start(Opts {
        authorizer: "allow-for-tests:read,submit".into(),
        ..Opts::default()
    });
    let conn = sup.client().await;
    submit(&conn, "task-p").await;
    call_json(&conn, TASKS, "GetTask", &("task-p",))
        .await
        .unwrap();
    let err = call_json(&conn, TASKS, "CancelTask", &("task-p", "no"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(Code::AUTHORIZATION_DENIED));
    assert!(
        err.message.contains("org.airlock.tasks.manage"),
        "{}",
        err.message
    );
    assert_eq!(
        call_json(&conn, TASKS, "GetTask", &("task-p",))
            .await
            .unwrap()["state"],
        "QUEUED"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polkit_authorizer_denies_when_polkit_is_not_on_the_bus() {
    let sup = Supervisor::start(Opts {
        authorizer: "polkit".into(),
        ..Opts::default()
    });
    let conn = sup.client().await;
    assert_eq!(property::<String>(&conn, "Authorizer").await, "polkit");
    let err = call_json(&conn, TASKS, "GetTask", &("task-x",))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(Code::AUTHORITY_UNAVAILABLE));
    assert_eq!(err.name, "org.airlock.Error.AUTHORITY_UNAVAILABLE");
    let err = call_json(
        &conn,
        TASKS,
        "SubmitTask",
        &(submission("task-x").to_string(),),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Some(Code::AUTHORITY_UNAVAILABLE));
    let events = sup.store().events(None, 0, 100).unwrap();
    assert_eq!(events.len(), 2);
    assert!(
        events
            .iter()
            .all(|e| e.code == Some(Code::AUTHORITY_UNAVAILABLE))
    );
    // Worker1 does not involve polkit.
    assert_eq!(worker_claim(&sup), Value::Null);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shipped_bus_policy_lets_anyone_call_but_only_the_service_user_own_the_name() {
    let sup = Supervisor::start(Opts::default());
    // Plain busctl, as an unprivileged uid: introspect and read properties.
    let address = format!("--address={}", sup.bus.address());
    let out = run_as(
        STRANGER_UID,
        "/usr/bin/busctl",
        &[&address, "introspect", NAME, PATH],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for member in [
        ".SubmitTask",
        ".GetTask",
        ".ListTasks",
        ".ListEvents",
        ".CancelTask",
        ".Verify",
        ".ReplacePlan",
        ".TaskChanged",
        ".Authorizer",
        ".Queued",
        ".Claim",
        ".Renew",
        ".SubmitResult",
    ] {
        assert!(
            text.contains(member),
            "{member} missing from introspection:\n{text}"
        );
    }
    let out = run_as(
        STRANGER_UID,
        "/usr/bin/busctl",
        &[&address, "get-property", NAME, PATH, TASKS, "Authorizer"],
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "s \"allow-all-for-tests\""
    );

    // Nobody but the owner user may take the name.
    let out = run_as(
        STRANGER_UID,
        "/usr/bin/dbus-send",
        &[
            &format!("--bus={}", sup.bus.address()),
            "--print-reply",
            "--dest=org.freedesktop.DBus",
            "/org/freedesktop/DBus",
            "org.freedesktop.DBus.RequestName",
            "string:org.airlock.Supervisor1",
            "uint32:4",
        ],
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("AccessDenied"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A second supervisor cannot take the name from the first.
    let second = std::process::Command::new(env!("CARGO_BIN_EXE_airlock-supervisor"))
        .args(["--config", sup.config.to_str().unwrap()])
        .args(["--db", sup.dir().join("second.sqlite3").to_str().unwrap()])
        .args([
            "--bus-address",
            sup.bus.address(),
            "--authorizer",
            "allow-all-for-tests",
        ])
        .output()
        .unwrap();
    assert_eq!(
        second.status.code(),
        Some(i32::from(Code::RUNTIME_UNAVAILABLE.exit_code()))
    );
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(stderr.contains("owned by another process"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_after_sigkill_loses_no_task_and_no_lease() {
    let mut sup = Supervisor::start(Opts::default());
    let conn = sup.client().await;
    for id in ["task-k1", "task-k2", "task-k3"] {
        submit(&conn, id).await;
    }
    let grant = worker_claim(&sup);
    assert_eq!(grant["task_id"], "task-k1");
    drop(conn);

    sup.kill9();
    sup.spawn();

    let conn = sup.client().await;
    let all = call_json(&conn, TASKS, "ListTasks", &("", "", 0u32))
        .await
        .unwrap();
    let states: Vec<(String, String)> = all["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["task_id"].as_str().unwrap().into(),
                t["state"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        states,
        [
            ("task-k1".into(), "RUNNING".into()),
            ("task-k2".into(), "QUEUED".into()),
            ("task-k3".into(), "QUEUED".into())
        ]
    );
    // The lease survived: the holder renews and submits with its token.
    worker_renew(&sup, WORKER_UID, &grant, 1).unwrap();
    let receipt = worker_submit(&sup, WORKER_UID, &grant, 1, &passed_result(&grant)).unwrap();
    assert_eq!(receipt["task"]["state"], "VERIFYING");
    // And the queue goes on where it was.
    assert_eq!(worker_claim(&sup)["task_id"], "task-k2");
    sup.store().integrity_check().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweeper_requeues_an_expired_lease_and_fences_the_old_holder() {
    let sup = Supervisor::start(Opts {
        lease_seconds: 10,
        sweep_interval_seconds: 1,
        ..Opts::default()
    });
    let conn = sup.client().await;
    let mut changes = signal_stream(&conn).await;
    submit(&conn, "task-e").await;
    assert_eq!(next_change(&mut changes).await.1, "QUEUED");
    let first = worker_claim(&sup);
    assert_eq!(next_change(&mut changes).await.1, "RUNNING");

    // Not renewed: within lease + sweep interval it is back in the queue.
    let back = next_change_within(&mut changes, Duration::from_secs(20)).await;
    assert_eq!(back.0, "task-e");
    assert_eq!(back.1, "QUEUED");
    let second = worker_claim(&sup);
    assert_eq!(second["attempt"], 2);
    assert_eq!(second["lease_epoch"], 2);

    // The first holder is fenced by its epoch.
    let stale = dbus_send(
        &sup,
        WORKER_UID,
        "org.airlock.Worker1.SubmitResult",
        &[
            "string:task-e",
            "uint64:1",
            &format!("string:{}", first["lease_token"].as_str().unwrap()),
            "string:result-task-e-1",
            &format!("string:{}", passed_result(&first)),
        ],
    )
    .unwrap_err();
    assert_eq!(stale.code(), Some(Code::LEASE_EPOCH_STALE));
    let expired: Vec<_> = sup
        .store()
        .events(Some("task-e"), 0, 100)
        .unwrap()
        .into_iter()
        .filter(|e| e.action == "TASK_LEASE_EXPIRED")
        .collect();
    assert_eq!(expired.len(), 1);
    assert_eq!(
        expired[0].actor.kind,
        airlock_taskdb::tasks::ActorKind::System
    );
    // The current holder is not disturbed.
    worker_submit(&sup, WORKER_UID, &second, 2, &passed_result(&second)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_calls_in_flight_refuses_new_ones_then_releases_the_name() {
    let mut sup = Supervisor::start(Opts {
        extra_args: vec!["--debug-call-delay-ms".into(), "1500".into()],
        ..Opts::default()
    });
    let conn = sup.client().await;
    let slow = {
        let conn = conn.clone();
        tokio::spawn(async move {
            call_json(
                &conn,
                TASKS,
                "SubmitTask",
                &(submission("task-t").to_string(),),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    sup.sigterm();
    sup.wait_notification("STOPPING=1", Duration::from_secs(5));
    // A call arriving now is answered, with a retryable refusal.
    let late = call_json(&conn, TASKS, "GetTask", &("task-t",))
        .await
        .unwrap_err();
    assert_eq!(late.code(), Some(Code::RUNTIME_UNAVAILABLE), "{late:?}");
    // The call in flight completes normally.
    let done = slow.await.unwrap().expect("in-flight call answered");
    assert_eq!(done["task"]["state"], "QUEUED");
    let status = sup.wait_exit(Duration::from_secs(10));
    assert!(status.success(), "{status}");
    // The name is gone, and the task is durable.
    let dbus = zbus::fdo::DBusProxy::new(&conn).await.unwrap();
    assert!(!dbus.name_has_owner(NAME.try_into().unwrap()).await.unwrap());
    assert_eq!(sup.store().get("task-t").unwrap().state.as_str(), "QUEUED");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sd_notify_ready_status_and_watchdog() {
    let mut sup = Supervisor::start(Opts {
        env: vec![("WATCHDOG_USEC".into(), "300000".into())],
        ..Opts::default()
    });
    let ready = sup.wait_notification("READY=1", Duration::from_secs(1));
    assert!(
        ready.contains("STATUS=0 queued, 0 running, 0 verifying; authorizer allow-all-for-tests"),
        "{ready}"
    );
    sup.wait_notification("WATCHDOG=1", Duration::from_secs(3));
    sup.sigterm();
    sup.wait_notification("STOPPING=1", Duration::from_secs(5));
    assert!(sup.wait_exit(Duration::from_secs(10)).success());
}

/// A decision request about `task` as GetTask shows it now, as JSON text.
async fn decision_about(
    conn: &zbus::Connection,
    task: &str,
    decision: &str,
    reason: &str,
) -> String {
    let view: TaskView =
        serde_json::from_value(call_json(conn, TASKS, "GetTask", &(task,)).await.unwrap()).unwrap();
    let d = Decision::parse(decision).unwrap();
    DecisionRequest::about(&view, d, reason, None)
        .to_value()
        .to_string()
}

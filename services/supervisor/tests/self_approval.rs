//! Issue 41, item 5: a planner agent never decides on a task it
//! submitted, whatever polkit lets its user do.
//!
//! A real planner agent (a process of `airlock-agent`, run by a real
//! AgentHost1) submits three tasks with dbus-send from its session; the
//! worker takes one to VERIFYING and reports another's branch moved (a
//! reconciliation case); the third stays QUEUED. The authoriser allows
//! every action to everyone — a site's polkit rule granting the agent's
//! user `org.airlock.tasks.manage` and `org.airlock.reconcile.manage` —
//! and the agent, from its session, calls `Verify` (accept), `CancelTask`
//! and `ResolveReconciliation` (adopt) about its own tasks. Each is
//! refused with `SELF_APPROVAL_FORBIDDEN`, recorded as a denial under the
//! method's event and attributed to the agent, and nothing changes: the
//! tasks and the case are as they were. The very same requests made by
//! an administrator then succeed.

mod common;

use airlock_proto::reconcile::{ReconciliationCase, Resolution, ResolveRequest};
use airlock_proto::task::{Decision, DecisionRequest, TaskView};
use common::*;
use serde_json::{Value, json};

const AGENT: &str = "alpha";
/// Submitted in this order: the worker claims the oldest first.
const OWN: [&str; 3] = ["self-verify", "self-case", "self-cancel"];

/// The agent: submit its tasks, say so, wait for the test's go, then make
/// every call listed in `calls` with dbus-send, writing each reply.
fn agent_script(dir: &std::path::Path) -> String {
    format!(
        "set -f; d={dir}; \
         for t in {tasks}; do body=$(cat $d/$t.json); \
           dbus-send --system --print-reply --dest=org.airlock.Supervisor1 /org/airlock/Supervisor1 \
             org.airlock.Tasks2.SubmitTask \"string:$body\" > $d/$t.submit.out 2>&1; \
           echo $? > $d/$t.submit.rc; done; \
         touch $d/submitted; \
         while [ ! -e $d/go ]; do sleep 0.1; done; \
         i=0; while IFS= read -r line; do set -- $line; \
           dbus-send --system --print-reply --dest=org.airlock.Supervisor1 /org/airlock/Supervisor1 \"$@\" > $d/call.$i.out 2>&1; \
           echo $? > $d/call.$i.rc; i=$((i+1)); \
         done < $d/calls; touch $d/done; exec sleep 600",
        dir = dir.display(),
        tasks = OWN.join(" "),
    )
}

async fn view(conn: &zbus::Connection, task: &str) -> TaskView {
    serde_json::from_value(
        call_json(conn, TASKS, "GetTask", &(task,))
            .await
            .expect("the administrator reads every task"),
    )
    .unwrap()
}

async fn case(conn: &zbus::Connection, task: &str) -> ReconciliationCase {
    serde_json::from_value(
        call_json(
            conn,
            "org.airlock.Reconcile1",
            "GetReconciliation",
            &(task,),
        )
        .await
        .expect("the case"),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_cannot_decide_on_its_own_task_whatever_polkit_allows() {
    let dir = scratch_dir("airlock-self-approval-");
    for t in OWN {
        std::fs::write(
            dir.path().join(format!("{t}.json")),
            submission(t).to_string(),
        )
        .unwrap();
    }
    let agents = format!(
        "\n[[agent]]\nname = \"{AGENT}\"\ncommand = [\"/bin/sh\", \"-c\", {:?}]\nrepositories = [\"demo\"]\n",
        agent_script(dir.path())
    );
    // Every action allowed to every caller: the agent's user holds
    // tasks.manage and reconcile.manage as a permissive site rule grants.
    let opts = Opts {
        authorizer: "allow-all-for-tests".into(),
        ..Opts::default()
    };
    let s = Stack::start(opts, &agents, "").await;
    let sup = &s.sup;
    let admin = sup.client().await;
    wait_file(&dir.path().join("submitted")).await;
    for t in OWN {
        let rc = std::fs::read_to_string(dir.path().join(format!("{t}.submit.rc"))).unwrap();
        let out = std::fs::read_to_string(dir.path().join(format!("{t}.submit.out"))).unwrap();
        assert_eq!(rc.trim(), "0", "{t}: {out}");
        let v = view(&admin, t).await;
        assert_eq!(v.submitter.unwrap().agent.as_deref(), Some(AGENT), "{t}");
    }

    // The worker takes the first to VERIFYING and reports the second's
    // branch moved; the third stays QUEUED.
    let grant = worker_claim(sup);
    assert_eq!(grant["task_id"], OWN[0]);
    let epoch = grant["lease_epoch"].as_u64().unwrap();
    worker_submit(sup, WORKER_UID, &grant, epoch, &passed_result(&grant)).unwrap();
    let grant = worker_claim(sup);
    assert_eq!(grant["task_id"], OWN[1]);
    let mut moved = passed_result(&grant);
    moved["outcome"] = json!("failed");
    moved["commit_oid"] = Value::Null;
    moved["exec_result_sha256"] = Value::Null;
    moved["verification"] = json!([]);
    moved["failure_code"] = json!("RECONCILIATION_REQUIRED");
    moved["reconciliation"] =
        json!({"commit_oid": "1".repeat(40), "observed_head": "2".repeat(40)});
    let epoch = grant["lease_epoch"].as_u64().unwrap();
    worker_submit(sup, WORKER_UID, &grant, epoch, &moved).unwrap();

    // The decisions, as an administrator would make them about each task
    // as it is shown now (no spaces: the script splits lines on them).
    let before: Vec<TaskView> = {
        let mut v = Vec::new();
        for t in OWN {
            v.push(view(&admin, t).await);
        }
        v
    };
    let case_before = case(&admin, OWN[1]).await;
    let verify = DecisionRequest::about(&before[0], Decision::Accept, "self-approval", None);
    let resolve = ResolveRequest::about(&case_before, Resolution::Adopt, "self-approval", None);
    let cancel = DecisionRequest::about(&before[2], Decision::Cancel, "self-approval", None);
    let calls = [
        (
            "org.airlock.Tasks2.Verify",
            OWN[0],
            verify.to_value().to_string(),
            "TASK_VERIFIED",
        ),
        (
            "org.airlock.Reconcile1.ResolveReconciliation",
            OWN[1],
            resolve.to_value().to_string(),
            "TASK_RECONCILIATION_RESOLVED",
        ),
        (
            "org.airlock.Tasks2.CancelTask",
            OWN[2],
            cancel.to_value().to_string(),
            "TASK_CANCELLED",
        ),
    ];
    let list: String = calls
        .iter()
        .map(|(method, task, body, _)| {
            assert!(!body.contains(' '), "{body}");
            format!("{method} string:{task} string:{body}\n")
        })
        .collect();
    std::fs::write(dir.path().join("calls"), list).unwrap();
    std::fs::write(dir.path().join("go"), "").unwrap();
    wait_file(&dir.path().join("done")).await;

    // Each refused with its own code, from the agent's session.
    for (i, (method, task, _, _)) in calls.iter().enumerate() {
        let rc = std::fs::read_to_string(dir.path().join(format!("call.{i}.rc"))).unwrap();
        let out = std::fs::read_to_string(dir.path().join(format!("call.{i}.out"))).unwrap();
        assert_ne!(rc.trim(), "0", "{method} {task}: the agent decided: {out}");
        assert!(
            out.contains("org.airlock.Error.SELF_APPROVAL_FORBIDDEN"),
            "{method} {task}: {out}"
        );
    }
    // Nothing changed.
    for (t, was) in OWN.iter().zip(&before) {
        let now = view(&admin, t).await;
        assert_eq!(
            (now.state, now.revision),
            (was.state, was.revision),
            "{t} changed"
        );
    }
    let case_now = case(&admin, OWN[1]).await;
    assert_eq!(
        (case_now.status, case_now.revision),
        (case_before.status, case_before.revision)
    );
    // Each refusal is on record, under its method's event, by the agent.
    let page = call_json(&admin, TASKS, "ListEvents", &("", 0i64, 1000u32))
        .await
        .unwrap();
    for (method, task, _, event) in &calls {
        let found = page["events"].as_array().unwrap().iter().find(|e| {
            e["task_id"] == *task
                && e["action"] == *event
                && e["outcome"] == "denied"
                && e["code"] == "SELF_APPROVAL_FORBIDDEN"
        });
        let e = found.unwrap_or_else(|| panic!("{method} {task}: no denial on record"));
        let actor = e["actor"]["name"].as_str().unwrap();
        assert!(actor.starts_with(&format!("agent:{AGENT} ")), "{actor}");
    }

    // The same requests, made by an administrator, are decided.
    let out = call_json(
        &admin,
        TASKS,
        "Verify",
        &(OWN[0], verify.to_value().to_string()),
    )
    .await
    .expect("the administrator accepts");
    assert_eq!(out["state"], "SUCCEEDED");
    let out = call_json(
        &admin,
        "org.airlock.Reconcile1",
        "ResolveReconciliation",
        &(OWN[1], resolve.to_value().to_string()),
    )
    .await
    .expect("the administrator adopts");
    assert_eq!(out["status"], "adopting", "{out}");
    let out = call_json(
        &admin,
        TASKS,
        "CancelTask",
        &(OWN[2], cancel.to_value().to_string()),
    )
    .await
    .expect("the administrator cancels");
    assert_eq!(out["state"], "CANCELLED");
}

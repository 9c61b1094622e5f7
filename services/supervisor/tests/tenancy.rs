//! Reads bound to the caller, over a real bus with the real supervisor:
//! two planner agents (real processes of one user, airlock-agent, run by a
//! real AgentHost1, calling with dbus-send from their sessions), a planner
//! user (`bin`), the agents' user outside any agent, and an administrator
//! (root, who alone holds `org.airlock.tasks.read-all` under the
//! `root-admin-for-tests` authoriser, as under the shipped policy) each
//! call every read method of the contract — every row whose permission is
//! `org.airlock.tasks.read`, on every interface — about every task, and
//! see exactly their own (the administrator: all); another's task answers
//! exactly as a task that does not exist; the reads change nothing. Then
//! `TaskChanged`: an administrator's connection hears every change, a
//! planner's its own tasks' only, a connection that made no call none.
//! The same checks run under real polkit in `tests/polkit.rs` and in the
//! systemd testbed.

mod common;

use airlock_proto::bus::{self, Permission, action};
use common::*;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::Duration;
use zbus::Connection;

/// The planner user (`bin`).
const PLANNER_UID: u32 = 2;
/// The agents' user, outside any agent, when airlock-agent exists.
fn agent_uid() -> u32 {
    nix::unistd::User::from_name("airlock-agent")
        .ok()
        .flatten()
        .map_or(65534, |u| u.uid.as_raw())
}

const TASKS: [&str; 4] = ["t-alpha", "t-beta", "t-planner", "t-admin"];
/// The repositories the matrix registers.
const REPOSITORIES: [&str; 2] = ["demo", "other"];
/// No task has this id.
const NONE: &str = "t-nothing";

/// One read call as dbus-send takes it: `interface.member` and typed
/// arguments, and the task it is about (`None`: a listing).
#[derive(Clone, Debug)]
struct Read {
    method: String,
    args: Vec<String>,
    about: Option<&'static str>,
}

/// Every read of the matrix: per read row of the contract, the call about
/// each task and about none, or the listing. A read row the matrix does
/// not know fails here.
fn reads() -> Vec<Read> {
    let mut out = Vec::new();
    let mut covered = 0;
    for rows in bus::ROWS {
        for row in rows.iter() {
            if row.permission != Permission::Polkit(action::TASKS_READ) {
                continue;
            }
            covered += 1;
            let method = row.path();
            let per_task = |args: fn(&str) -> Vec<String>| {
                TASKS
                    .iter()
                    .chain([&NONE])
                    .map(|t| Read {
                        method: method.clone(),
                        args: args(t),
                        about: Some(*t),
                    })
                    .collect::<Vec<_>>()
            };
            match (row.name, row.input) {
                ("GetTask", "s")
                | ("GetPlan", "s")
                | ("CountEvents", "s")
                | ("GetReconciliation", "s") => {
                    out.extend(per_task(|t| vec![format!("string:{t}")]));
                }
                ("ListEvents", "sxu") => {
                    out.extend(per_task(|t| {
                        vec![format!("string:{t}"), "int64:0".into(), "uint32:0".into()]
                    }));
                    out.push(Read {
                        method: method.clone(),
                        args: vec!["string:".into(), "int64:0".into(), "uint32:0".into()],
                        about: None,
                    });
                }
                ("ListTasks", "ssu") | ("ListReconciliations", "ssu") => out.push(Read {
                    method: method.clone(),
                    args: vec!["string:".into(), "string:".into(), "uint32:0".into()],
                    about: None,
                }),
                ("ListRepositories", "") => out.push(Read {
                    method: method.clone(),
                    args: vec![],
                    about: None,
                }),
                other => panic!("{method}: a read row the matrix does not cover: {other:?}"),
            }
        }
    }
    // Tasks2: six (GetPlan since 9.1, ListRepositories since 9.2,
    // CountEvents since 12.0); Tasks1: three; Reconcile1: two.
    assert_eq!(covered, 11, "every read row is in the matrix");
    out
}

/// What one reader got for one read: Ok(reply text) or Err((error name,
/// message)).
type Got = Result<String, (String, String)>;

/// Parses `dbus-send --print-reply` output written by an agent (`rc` its
/// exit status).
fn parse_dbus_send(rc: &str, out: &str) -> Got {
    if rc.trim() == "0" {
        Ok(out.to_owned())
    } else {
        let line = out.lines().find(|l| l.starts_with("Error ")).unwrap_or(out);
        let rest = line.trim_start_matches("Error ");
        let (name, message) = rest.split_once(": ").unwrap_or((rest, ""));
        Err((name.trim().to_owned(), message.trim().to_owned()))
    }
}

/// A dbus-send reply without its header line (times, serials).
fn body(reply: &str) -> String {
    reply
        .lines()
        .filter(|l| !l.starts_with("method return"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Checks that `reader`, seeing `visible`, got exactly what it should
/// for each read: its tasks' content, and for every other task what a
/// task that does not exist gets (the task id aside); of the registered
/// repositories, exactly `repositories`.
fn check_reader(
    reader: &str,
    visible: &[&str],
    repositories: &[&str],
    case_of: &str,
    got: &[(Read, Got)],
) {
    let invisible: Vec<&str> = TASKS
        .iter()
        .copied()
        .filter(|t| !visible.contains(t))
        .collect();
    let answer_of = |r: &Read, about: &str| -> Got {
        got.iter()
            .find(|(g, _)| g.method == r.method && g.about == Some(about))
            .map(|(_, a)| a.clone())
            .unwrap_or_else(|| panic!("{reader}: no {} about {about}", r.method))
    };
    let mut checked = 0;
    for (read, answer) in got {
        let what = format!("{reader}: {} {:?}", read.method, read.args);
        // No answer names a task the reader may not see.
        let text = match answer {
            Ok(t) => t.clone(),
            Err((n, m)) => format!("{n} {m}"),
        };
        for t in &invisible {
            if read.about == Some(t) {
                continue; // an error may repeat the id it was asked about
            }
            assert!(!text.contains(t), "{what} names {t}: {text}");
        }
        match read.about {
            None if read.method.ends_with("ListRepositories") => {
                // Not about tasks: the repositories it may see, by name.
                let answer = answer.as_ref().unwrap_or_else(|e| panic!("{what}: {e:?}"));
                for r in REPOSITORIES {
                    let named = answer.contains(&format!("\"name\":\"{r}\""));
                    assert_eq!(named, repositories.contains(&r), "{what} and {r}: {answer}");
                }
            }
            None => {
                // A listing: every visible task (with a case: the case's).
                let expect: Vec<&str> = if read.method.ends_with("ListReconciliations") {
                    visible.iter().copied().filter(|t| *t == case_of).collect()
                } else {
                    visible.to_vec()
                };
                let answer = answer.as_ref().unwrap_or_else(|e| panic!("{what}: {e:?}"));
                for t in expect {
                    assert!(answer.contains(t), "{what} lacks {t}: {answer}");
                }
            }
            Some(t) => {
                let mine = visible.contains(&t);
                let has = read.method.ends_with("GetReconciliation") && t != case_of;
                if mine && !has {
                    let answer = answer.as_ref().unwrap_or_else(|e| panic!("{what}: {e:?}"));
                    assert!(answer.contains(t), "{what}: {answer}");
                } else if t != NONE {
                    // Another's task (or one of its own without a case)
                    // answers as the task that does not exist.
                    let missing = answer_of(read, NONE);
                    let same = |a: &Got| match a {
                        Ok(text) => Ok(body(text).replace(t, "ID").replace(NONE, "ID")),
                        Err((n, m)) => Err((n.clone(), m.replace(t, "ID").replace(NONE, "ID"))),
                    };
                    assert_eq!(same(answer), same(&missing), "{what}");
                    if !mine {
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(
        invisible.is_empty() || checked > 0,
        "{reader}: no cross read was checked"
    );
}

/// The one agent script: submit its task, wait for the test's go, then
/// make every call listed in `calls` with dbus-send, writing each reply.
fn agent_script(dir: &std::path::Path, name: &str) -> String {
    format!(
        "set -f; d={dir}; \
         body=$(cat $d/{name}.json); \
         dbus-send --system --print-reply --dest=org.airlock.Supervisor1 /org/airlock/Supervisor1 \
           org.airlock.Tasks2.SubmitTask \"string:$body\" > $d/{name}.submit.out 2>&1; \
         echo $? > $d/{name}.submit.rc; \
         while [ ! -e $d/go ]; do sleep 0.1; done; \
         i=0; while IFS= read -r line; do set -- $line; \
           dbus-send --system --print-reply --dest=org.airlock.Supervisor1 /org/airlock/Supervisor1 \"$@\" > $d/{name}.$i.out 2>&1; \
           echo $? > $d/{name}.$i.rc; i=$((i+1)); \
         done < $d/calls; touch $d/{name}.done; exec sleep 600",
        dir = dir.display()
    )
}

/// TaskChanged signals as `conn` receives them.
async fn changes(conn: &Connection) -> zbus::MessageStream {
    let rule = zbus::MatchRule::builder()
        .msg_type(zbus::message::Type::Signal)
        .interface(TASKS_IFACE)
        .unwrap()
        .member("TaskChanged")
        .unwrap()
        .build();
    zbus::MessageStream::for_match_rule(rule, conn, None)
        .await
        .unwrap()
}

const TASKS_IFACE: &str = "org.airlock.Tasks2";

/// The task ids of the TaskChanged signals `stream` receives within `d`.
async fn heard(stream: &mut zbus::MessageStream, d: Duration) -> Vec<String> {
    use futures_util::StreamExt;
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + d;
    while let Ok(Some(Ok(m))) = tokio::time::timeout_at(deadline, stream.next()).await {
        if let Ok((t, _, _)) = m.body().deserialize::<(String, String, i64)>() {
            out.push(t);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_caller_reads_exactly_its_own_tasks_and_hears_only_of_them() {
    let dir = scratch_dir("airlock-tenancy-");
    let reads = reads();
    let calls: String = reads
        .iter()
        .map(|r| format!("{} {}\n", r.method, r.args.join(" ")))
        .collect();
    std::fs::write(dir.path().join("calls"), calls).unwrap();
    let mut agents = String::new();
    for name in ["alpha", "beta"] {
        std::fs::write(
            dir.path().join(format!("{name}.json")),
            submission(&format!("t-{name}")).to_string(),
        )
        .unwrap();
        agents.push_str(&format!(
            "\n[[agent]]\nname = \"{name}\"\ncommand = [\"/bin/sh\", \"-c\", {:?}]\nrepositories = [\"demo\"]\n",
            agent_script(dir.path(), name)
        ));
    }
    let opts = Opts {
        authorizer: "root-admin-for-tests".into(),
        ..Opts::default()
    };
    // A second repository, which neither agent may propose for.
    let other = "\n[[repository]]\nname = \"other\"\npath = \"/srv/git/other.git\"\n";
    let s = Stack::start(opts, &agents, other).await;
    let sup = &s.sup;
    let admin = sup.client().await;
    for name in ["alpha", "beta"] {
        let rc = dir.path().join(format!("{name}.submit.rc"));
        wait_file(&rc).await;
        let out = std::fs::read_to_string(dir.path().join(format!("{name}.submit.out"))).unwrap();
        assert_eq!(std::fs::read_to_string(&rc).unwrap().trim(), "0", "{out}");
    }
    // The planner user and the administrator submit theirs.
    dbus_send(
        sup,
        PLANNER_UID,
        "org.airlock.Tasks2.SubmitTask",
        &[&format!("string:{}", submission("t-planner"))],
    )
    .expect("the planner submits");
    submit(&admin, "t-admin").await;
    // The worker claims the oldest (an agent's) and reports its branch
    // moved: a reconciliation case, and a result, of that task.
    let grant = worker_claim(sup);
    let case_of: &'static str = TASKS
        .iter()
        .copied()
        .find(|t| grant["task_id"] == *t)
        .expect("a task of the matrix");
    assert!(case_of == "t-alpha" || case_of == "t-beta", "{case_of}");
    let mut result = passed_result(&grant);
    result["outcome"] = json!("failed");
    result["commit_oid"] = Value::Null;
    result["exec_result_sha256"] = Value::Null;
    result["verification"] = json!([]);
    result["failure_code"] = json!("RECONCILIATION_REQUIRED");
    result["reconciliation"] =
        json!({"commit_oid": "1".repeat(40), "observed_head": "2".repeat(40)});
    let epoch = grant["lease_epoch"].as_u64().unwrap();
    worker_submit(sup, WORKER_UID, &grant, epoch, &result).expect("the reconciliation result");

    // What each task is before the reads, and the event log.
    let snapshot = |conn: &Connection| {
        let conn = conn.clone();
        async move {
            let mut views = BTreeMap::new();
            for t in TASKS {
                views.insert(
                    t,
                    call_json(&conn, TASKS_IFACE, "GetTask", &(t,))
                        .await
                        .unwrap(),
                );
            }
            // (the tasks' events: an agent's own record may change meanwhile)
            let page = call_json(&conn, TASKS_IFACE, "ListEvents", &("", 0i64, 1000u32))
                .await
                .unwrap();
            let events: Vec<Value> = page["events"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|e| !e["task_id"].is_null())
                .cloned()
                .collect();
            (views, events)
        }
    };
    let before = snapshot(&admin).await;
    assert_eq!(
        before.0[case_of]["submitter"]["agent"],
        case_of.trim_start_matches("t-")
    );
    assert_eq!(
        before.0["t-planner"]["submitter"],
        json!({"uid": PLANNER_UID, "agent": null})
    );

    // The agents read, from their sessions; the others with dbus-send.
    std::fs::write(dir.path().join("go"), "").unwrap();
    let mut got: BTreeMap<&str, Vec<(Read, Got)>> = BTreeMap::new();
    for (who, uid) in [
        ("planner", PLANNER_UID),
        ("agents' user", agent_uid()),
        ("admin", 0),
    ] {
        let answers = reads
            .iter()
            .map(|r| {
                let args: Vec<&str> = r.args.iter().map(String::as_str).collect();
                let a = dbus_send(sup, uid, &r.method, &args).map_err(|e| (e.name, e.message));
                (r.clone(), a)
            })
            .collect();
        got.insert(who, answers);
    }
    for name in ["alpha", "beta"] {
        wait_file(&dir.path().join(format!("{name}.done"))).await;
        let answers = reads
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let read = |ext: &str| {
                    std::fs::read_to_string(dir.path().join(format!("{name}.{i}.{ext}"))).unwrap()
                };
                (r.clone(), parse_dbus_send(&read("rc"), &read("out")))
            })
            .collect();
        got.insert(name, answers);
    }
    // An agent lists the repositories it may propose for; anyone else
    // every registered one.
    let own = ["demo"];
    check_reader("alpha", &["t-alpha"], &own, case_of, &got["alpha"]);
    check_reader("beta", &["t-beta"], &own, case_of, &got["beta"]);
    check_reader(
        "planner",
        &["t-planner"],
        &REPOSITORIES,
        case_of,
        &got["planner"],
    );
    check_reader(
        "agents' user",
        &[],
        &REPOSITORIES,
        case_of,
        &got["agents' user"],
    );
    check_reader("admin", &TASKS, &REPOSITORIES, case_of, &got["admin"]);
    // Its own result is the agent's to read: the case's task shows its
    // failure code to its agent.
    let owner = case_of.trim_start_matches("t-");
    let own_get = got[owner]
        .iter()
        .find(|(r, _)| r.method == "org.airlock.Tasks2.GetTask" && r.about == Some(case_of))
        .unwrap();
    assert!(
        own_get
            .1
            .as_ref()
            .unwrap()
            .contains("RECONCILIATION_REQUIRED")
    );
    // The reads changed nothing, and none is an event.
    assert_eq!(snapshot(&admin).await, before, "the reads changed nothing");

    // TaskChanged: the administrator's connection (after a read), the
    // planner's (after reading its task), and one that made no call.
    let admin_conn = sup.client().await;
    let planner_conn = connect_as(sup.bus.address(), PLANNER_UID).await;
    let silent = sup.client().await;
    let mut admin_hears = changes(&admin_conn).await;
    let mut planner_hears = changes(&planner_conn).await;
    let mut silent_hears = changes(&silent).await;
    call_json(&admin_conn, TASKS_IFACE, "ListTasks", &("", "", 0u32))
        .await
        .unwrap();
    let mine = call_json(&planner_conn, TASKS_IFACE, "GetTask", &("t-planner",))
        .await
        .unwrap();
    assert_eq!(mine["task_id"], "t-planner");
    let err = call_json(&planner_conn, TASKS_IFACE, "GetTask", &("t-admin",))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(airlock_proto::Code::TASK_NOT_FOUND));
    // The administrator cancels the administrator's task, then the planner's.
    for t in ["t-admin", "t-planner"] {
        let view = call_json(&admin, TASKS_IFACE, "GetTask", &(t,))
            .await
            .unwrap();
        let req = json!({
            "schema": "airlock.task-decision.v1", "task_id": t, "decision": "cancel",
            "reason": "tenancy test", "idempotency_key": format!("cancel-{t}-0001"),
            "expected_revision": view["revision"], "expected_attempt": view["attempt"],
            "expected_result_sha256": null,
        });
        call_json(&admin, TASKS_IFACE, "CancelTask", &(t, req.to_string()))
            .await
            .unwrap();
    }
    let wait = Duration::from_secs(3);
    assert_eq!(
        heard(&mut admin_hears, wait).await,
        ["t-admin", "t-planner"]
    );
    assert_eq!(heard(&mut planner_hears, wait).await, ["t-planner"]);
    assert_eq!(heard(&mut silent_hears, wait).await, Vec::<String>::new());
    for name in ["alpha", "beta"] {
        call_json(&admin, "org.airlock.Agents1", "StopAgent", &(name,))
            .await
            .unwrap();
    }
}

/// Another planner user (`daemon`), who submits nothing.
const OTHER_PLANNER_UID: u32 = 1;

/// A submission whose plan names two changes and two commands, every
/// field of each given (so the stored envelope shows them as sent).
fn planned_submission(task_id: &str) -> Value {
    let mut s = submission(task_id);
    s["plan"]["execution"] = json!({
        "action": "deterministic",
        "change_set": [
            {"path": "x.py", "operation": "write_file", "content": "x = 41\n"},
            {"path": "lib/y.py", "operation": "write_file", "content": "y = 1\n"},
        ],
        "verification": [
            {"label": "compile", "argv": ["/usr/bin/python3", "-m", "py_compile", "x.py"],
             "cwd": ".", "timeout_seconds": 60},
            {"label": "compile lib", "argv": ["/usr/bin/python3", "-m", "py_compile", "y.py"],
             "cwd": "lib", "timeout_seconds": 30},
        ],
        "capability_scope": ["git.test", "git.read"],
    });
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_plan_shows_what_a_task_will_change_and_run_to_its_readers_alone() {
    let sup = Supervisor::start(Opts {
        authorizer: "root-admin-for-tests".into(),
        ..Opts::default()
    });
    // root: read-all; the planner and another planner: read and submit.
    let admin = sup.client().await;
    let planner = connect_as(sup.bus.address(), PLANNER_UID).await;
    let other = connect_as(sup.bus.address(), OTHER_PLANNER_UID).await;
    let sent = planned_submission("t-plan");
    call_json(&planner, TASKS_IFACE, "SubmitTask", &(sent.to_string(),))
        .await
        .expect("the planner submits");
    let view = call_json(&planner, TASKS_IFACE, "GetTask", &("t-plan",))
        .await
        .unwrap();
    let execution = &sent["plan"]["execution"];
    let events = |conn: &Connection| {
        let conn = conn.clone();
        async move {
            call_json(&conn, TASKS_IFACE, "ListEvents", &("", 0i64, 1000u32))
                .await
                .unwrap()
        }
    };
    let log_before = events(&admin).await;

    // The submitter and a read-all administrator: the change set and the
    // commands as submitted, under the digests GetTask names.
    let mut shown = Vec::new();
    for (who, conn) in [("the submitter", &planner), ("the administrator", &admin)] {
        let text = call_s(conn, TASKS_IFACE, "GetPlan", &("t-plan",))
            .await
            .unwrap_or_else(|e| panic!("{who}: {e:?}"));
        let plan: Value = serde_json::from_str(&text).unwrap();
        let mut keys: Vec<&str> = plan
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            ["envelope", "execution_digest", "plan_digest", "task_id"],
            "{who}"
        );
        let typed: airlock_proto::task::TaskPlan = serde_json::from_str(&text).unwrap();
        assert_eq!(typed.task_id, "t-plan", "{who}");
        assert_eq!(typed.plan_digest, view["plan_digest"].as_str().unwrap());
        assert_eq!(
            typed.execution_digest,
            view["execution_digest"].as_str().unwrap()
        );
        let envelope = &plan["envelope"];
        assert_eq!(envelope["schema"], "airlock.execution.v1", "{who}");
        assert_eq!(envelope["task_id"], "t-plan");
        assert_eq!(envelope["execution_digest"], view["execution_digest"]);
        assert_eq!(envelope["action"], "deterministic");
        assert_eq!(envelope["change_set"], execution["change_set"], "{who}");
        assert_eq!(envelope["verification"], execution["verification"], "{who}");
        assert_eq!(envelope["target_branch"], "agent/t-plan");
        shown.push(plan);
    }
    assert_eq!(shown[0], shown[1], "both see the one stored envelope");

    // Another planner: TASK_NOT_FOUND, exactly as for a task that does not
    // exist and as its GetTask of the task.
    let theirs = call_s(&other, TASKS_IFACE, "GetPlan", &("t-plan",))
        .await
        .unwrap_err();
    assert_eq!(theirs.code(), Some(airlock_proto::Code::TASK_NOT_FOUND));
    assert!(!theirs.message.contains("x = 41"), "{theirs:?}");
    let missing = call_s(&other, TASKS_IFACE, "GetPlan", &(NONE,))
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Some(airlock_proto::Code::TASK_NOT_FOUND));
    assert_eq!(
        (theirs.name.clone(), theirs.message.replace("t-plan", "ID")),
        (missing.name.clone(), missing.message.replace(NONE, "ID")),
        "another's task answers as one that does not exist"
    );
    let get = call_s(&other, TASKS_IFACE, "GetTask", &("t-plan",))
        .await
        .unwrap_err();
    assert_eq!(get, theirs, "GetPlan refuses as GetTask");
    // An unknown id, for the submitter and the administrator too.
    for conn in [&planner, &admin] {
        let e = call_s(conn, TASKS_IFACE, "GetPlan", &(NONE,))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some(airlock_proto::Code::TASK_NOT_FOUND), "{e:?}");
    }
    // A malformed task id is refused with its code, whoever asks.
    for conn in [&planner, &other, &admin] {
        let e = call_s(conn, TASKS_IFACE, "GetPlan", &("../etc",))
            .await
            .unwrap_err();
        assert_eq!(
            e.code(),
            Some(airlock_proto::Code::TASK_ID_INVALID),
            "{e:?}"
        );
    }
    // Tasks1 keeps its methods: it does not serve GetPlan.
    let v1 = call_s(&admin, bus::tasks_v1::INTERFACE, "GetPlan", &("t-plan",))
        .await
        .unwrap_err();
    assert_eq!(
        v1.name, "org.freedesktop.DBus.Error.UnknownMethod",
        "{v1:?}"
    );

    // The reads changed nothing and none is an event.
    assert_eq!(
        call_json(&admin, TASKS_IFACE, "GetTask", &("t-plan",))
            .await
            .unwrap(),
        view
    );
    assert_eq!(events(&admin).await, log_before, "the reads are not events");

    // Another planner, no agent, may not replace its plan either, with
    // the very plan its submitter will: TASK_NOT_FOUND, as for a task that
    // does not exist, and nothing changes.
    let digest = view["plan_digest"].as_str().unwrap();
    let replacement = plan("t-plan", 2, Some(digest));
    let refused = call_s(
        &other,
        TASKS_IFACE,
        "ReplacePlan",
        &("t-plan", replacement.to_string()),
    )
    .await
    .unwrap_err();
    assert_eq!(
        refused.code(),
        Some(airlock_proto::Code::TASK_NOT_FOUND),
        "{refused:?}"
    );
    assert_eq!(
        call_json(&admin, TASKS_IFACE, "GetTask", &("t-plan",))
            .await
            .unwrap(),
        view
    );

    // A replaced plan: GetPlan shows the stored one, now the new plan's.
    call_json(
        &planner,
        TASKS_IFACE,
        "ReplacePlan",
        &("t-plan", replacement.to_string()),
    )
    .await
    .expect("the planner replaces its plan");
    let now = call_json(&planner, TASKS_IFACE, "GetTask", &("t-plan",))
        .await
        .unwrap();
    let replanned = call_json(&planner, TASKS_IFACE, "GetPlan", &("t-plan",))
        .await
        .unwrap();
    assert_ne!(replanned["plan_digest"], view["plan_digest"]);
    assert_eq!(replanned["plan_digest"], now["plan_digest"]);
    assert_eq!(replanned["execution_digest"], now["execution_digest"]);
    assert_eq!(
        replanned["envelope"]["change_set"],
        replacement["execution"]["change_set"]
    );
}

/// A secret of the `demo` repository's upstream: in a push option, and in
/// the URL a failed sync's report quotes (the configuration refuses a URL
/// holding a password, `UPSTREAM_URL_INVALID`).
const SECRET: &str = "hunter2secret";

/// Three repositories, in this order in the file: `demo` with a
/// description, an ssh upstream, pinned host keys, push options (one
/// holding a secret) and signing; `zeta` with an https upstream; `alpha`
/// with an environment this host cannot resolve.
fn registered_repositories() -> String {
    format!(
        r#"description = "the demo repository"
[repository.upstream]
url = "ssh://git@git.example.org:2222/team/demo.git"
publish = false
sync_interval_seconds = 60
host_keys = ["git.example.org ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHostKeyOfTheTest"]
push_options = ["ci.token=pushoption{SECRET}"]
[repository.signing]
principal = "agent@example.org"

[[repository]]
name = "zeta"
path = "/srv/git/zeta.git"
[repository.upstream]
url = "https://git.example.org/team/zeta.git"

[[repository]]
name = "alpha"
path = "/srv/git/alpha.git"
[repository.environment]
programs = ["/nonexistent/airlock-test-tool"]
"#
    )
}

/// The worker's report of an upstream event, as Worker1 takes it.
fn report_upstream(sup: &Supervisor, repository: &str, event: &str, detail: Value) {
    let report =
        json!({"repository": repository, "event": event, "task_id": null, "detail": detail});
    report_as_worker(sup, &report);
}

/// `Worker1.ReportUpstream` of `report`, as the worker's uid.
fn report_as_worker(sup: &Supervisor, report: &Value) {
    dbus_send(
        sup,
        WORKER_UID,
        "org.airlock.Worker1.ReportUpstream",
        &[&format!("string:{report}")],
    )
    .unwrap_or_else(|e| panic!("ReportUpstream {report}: {e:?}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_repositories_shows_each_registered_repository_and_no_credential() {
    let sup = Supervisor::start(Opts {
        authorizer: "root-admin-for-tests".into(),
        config_extra: registered_repositories(),
        ..Opts::default()
    });
    let admin = sup.client().await;
    let planner = connect_as(sup.bus.address(), PLANNER_UID).await;
    // The worker's sync reports: demo synced, then failed (naming the
    // URL as a git error would); zeta's upstream rewrote a branch; a
    // publication of a task is not a sync event.
    report_upstream(&sup, "demo", "synced", json!({"changes": 3}));
    report_upstream(
        &sup,
        "zeta",
        "ref_rewritten",
        json!({"ref": "refs/heads/main", "old": "1".repeat(40), "new": "2".repeat(40)}),
    );
    report_upstream(
        &sup,
        "demo",
        "sync_failed",
        json!({"code": "UPSTREAM_AUTH_FAILED",
               "detail": format!("ssh://git:{SECRET}@git.example.org:2222/team/demo.git: denied")}),
    );
    submit(&admin, "t-published").await;
    let publication = json!({"repository": "demo", "event": "published",
                             "task_id": "t-published", "detail": {"ref": "agent/t-published"}});
    report_as_worker(&sup, &publication);
    let log = call_json(&admin, TASKS_IFACE, "ListEvents", &("", 0i64, 1000u32))
        .await
        .unwrap();
    let event_id = |action: &str| {
        log["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["action"] == action)
            .unwrap_or_else(|| panic!("no {action} in {log}"))["id"]
            .clone()
    };

    let mut replies = Vec::new();
    for (who, conn) in [("the administrator", &admin), ("a planner", &planner)] {
        let text = call_s(conn, TASKS_IFACE, "ListRepositories", &())
            .await
            .unwrap_or_else(|e| panic!("{who}: {e:?}"));
        // No secret, no credential, no credential's path or name.
        for never in [
            SECRET,
            "pushoption",
            "AAAAC3NzaC1lZDI1NTE5",
            "upstream-demo",
            "signing-demo",
            "credential",
            "/etc/airlock",
            "/srv/git",
            ".key",
        ] {
            assert!(!text.contains(never), "{who}: {never:?} in {text}");
        }
        let typed: bus::RepositoryList = serde_json::from_str(&text).unwrap();
        let names: Vec<&str> = typed.repositories.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["alpha", "demo", "zeta"], "{who}: by name");
        let v: Value = serde_json::from_str(&text).unwrap();
        let demo = &v["repositories"][1];
        let mut keys: Vec<&str> = demo
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "description",
                "environment",
                "last_upstream_event",
                "name",
                "signing",
                "upstream"
            ],
            "{who}"
        );
        assert_eq!(demo["description"], "the demo repository");
        assert_eq!(
            demo["upstream"],
            json!({"url": "ssh://git@git.example.org:2222/team/demo.git",
                   "publish": false, "sync_interval_seconds": 60}),
            "{who}: the URL, no credential"
        );
        assert_eq!(demo["signing"], json!({"principal": "agent@example.org"}));
        assert_eq!(demo["environment"], Value::Null);
        // The newest sync event, its detail redacted of the password.
        let last = &demo["last_upstream_event"];
        assert_eq!(last["action"], "UPSTREAM_SYNC_FAILED", "{who}: {last}");
        assert_eq!(last["outcome"], "allowed");
        assert_eq!(last["id"], event_id("UPSTREAM_SYNC_FAILED"));
        assert!(last["at_ms"].as_i64().unwrap() > 0);
        assert_eq!(last["detail"]["code"], "UPSTREAM_AUTH_FAILED");
        assert_eq!(
            last["detail"]["detail"],
            "ssh://git:[REDACTED:url-password]@git.example.org:2222/team/demo.git: denied"
        );
        let zeta = &v["repositories"][2];
        assert_eq!(zeta["description"], Value::Null);
        assert_eq!(
            zeta["upstream"],
            json!({"url": "https://git.example.org/team/zeta.git",
                   "publish": true, "sync_interval_seconds": 300})
        );
        assert_eq!(zeta["signing"], Value::Null);
        assert_eq!(
            zeta["last_upstream_event"]["action"],
            "UPSTREAM_REF_REWRITTEN"
        );
        assert_eq!(
            zeta["last_upstream_event"]["detail"]["ref"],
            "refs/heads/main"
        );
        let alpha = &v["repositories"][0];
        assert_eq!(alpha["upstream"], Value::Null);
        assert_eq!(alpha["last_upstream_event"], Value::Null);
        assert_eq!(
            alpha["environment"]["configured"],
            json!({"programs": ["/nonexistent/airlock-test-tool"]})
        );
        assert_eq!(alpha["environment"]["resolved"], Value::Null);
        assert_eq!(
            alpha["environment"]["problem"]["code"], "ENVIRONMENT_PROGRAM_UNRESOLVED",
            "{who}: {alpha}"
        );
        assert_eq!(
            alpha["environment"]["problem"]["key"],
            "environment.programs[0]"
        );
        replies.push(text);
    }
    assert_eq!(replies[0], replies[1], "every reader lists the same");

    // Tasks1 keeps its methods: it does not serve ListRepositories.
    let v1 = call_s(&admin, bus::tasks_v1::INTERFACE, "ListRepositories", &())
        .await
        .unwrap_err();
    assert_eq!(
        v1.name, "org.freedesktop.DBus.Error.UnknownMethod",
        "{v1:?}"
    );
    // The reads are not events.
    assert_eq!(
        call_json(&admin, TASKS_IFACE, "ListEvents", &("", 0i64, 1000u32))
            .await
            .unwrap(),
        log,
        "the reads are not events"
    );
    drop(sup);

    // A caller polkit refuses gets the refusal and nothing of the
    // repositories; the refusal is on record as REPOSITORIES_READ.
    let denied = Supervisor::start(Opts {
        authorizer: "deny-all-for-tests".into(),
        config_extra: registered_repositories(),
        ..Opts::default()
    });
    let conn = denied.client().await;
    let e = call_s(&conn, TASKS_IFACE, "ListRepositories", &())
        .await
        .unwrap_err();
    assert_eq!(
        e.code(),
        Some(airlock_proto::Code::AUTHORIZATION_DENIED),
        "{e:?}"
    );
    assert_eq!(e.name, "org.freedesktop.DBus.Error.AccessDenied");
    let stranger = dbus_send(
        &denied,
        STRANGER_UID,
        "org.airlock.Tasks2.ListRepositories",
        &[],
    )
    .unwrap_err();
    assert_eq!(stranger.name, "org.freedesktop.DBus.Error.AccessDenied");
    for refusal in [&e, &stranger] {
        for never in ["demo", "zeta", "alpha", "git.example.org", SECRET] {
            assert!(!refusal.message.contains(never), "{refusal:?}");
        }
    }
    let events = denied.store().events(None, 0, 1000).unwrap();
    assert_eq!(events.len(), 2, "{events:?}");
    for ev in &events {
        assert_eq!(ev.action, bus::event::REPOSITORIES_READ);
        assert_eq!(ev.outcome, airlock_taskdb::tasks::EventOutcome::Denied);
        assert_eq!(ev.code, Some(airlock_proto::Code::AUTHORIZATION_DENIED));
        assert_eq!(ev.task_id, None);
    }
    assert_eq!(events[1].actor.uid, Some(STRANGER_UID));
}

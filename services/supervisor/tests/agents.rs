//! Agents1 on a real bus with the real supervisor binary, its agents run by
//! a real AgentHost1 (the process driver, served here as airlock-local
//! serves it) as real processes: a crash-looping agent is held after 5
//! failures and a restarted supervisor keeps the hold; StartAgent is
//! refused while held, ClearHold restarts; StopAgent is no failure; the
//! host refuses any caller but the supervisor's uid; every decision is in
//! the event log.

mod common;

use std::os::unix::process::CommandExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_agents::host::AgentHost;
use airlock_agents::process::{Identity, ProcessDriver};
use airlock_proto::Code;
use airlock_proto::bus::{AgentList, AgentView, agent_host};
use common::*;
use serde_json::Value;
use zbus::Connection;

const AGENTS: &str = "org.airlock.Agents1";

fn agent_table(name: &str, script: &str) -> String {
    format!(
        "\n[[agent]]\nname = \"{name}\"\ncommand = [\"/bin/sh\", \"-c\", {script:?}]\nrepositories = [\"demo\"]\n"
    )
}

async fn stack(agents: &str) -> Stack {
    stack_with(agents, "").await
}

async fn stack_with(agents: &str, more_config: &str) -> Stack {
    Stack::start(Opts::default(), agents, more_config).await
}

async fn get(conn: &Connection, name: &str) -> AgentView {
    let text = call_s(conn, AGENTS, "GetAgent", &(name,)).await.unwrap();
    airlock_proto::bus::decode("GetAgent", &text).unwrap()
}

async fn wait_state(conn: &Connection, name: &str, state: &str, within: Duration) -> AgentView {
    let deadline = Instant::now() + within;
    loop {
        let v = get(conn, name).await;
        if v.state == state {
            return v;
        }
        assert!(Instant::now() < deadline, "{name} never {state}: {v:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn events(conn: &Connection) -> Vec<Value> {
    let page = call_json(conn, TASKS, "ListEvents", &("", 0i64, 1000u32))
        .await
        .unwrap();
    page["events"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_looping_agent_is_held_and_a_restarted_supervisor_keeps_the_hold() {
    let mut s = stack(&format!(
        "{}{}",
        agent_table("exits", "exit 1"),
        agent_table("sleeper", "exec sleep 600")
    ))
    .await;
    let conn = s.sup.client().await;
    let held = wait_state(&conn, "exits", "HELD", Duration::from_secs(30)).await;
    assert_eq!(held.consecutive_failures, 5);
    assert_eq!(held.last_exit_status, Some(1));
    assert!(
        held.hold_reason
            .as_deref()
            .unwrap()
            .starts_with("AGENTOS_CRASH_LOOP: 5 consecutive failures"),
        "{held:?}"
    );
    assert_eq!(held.repositories, ["demo"]);
    let sleeper = wait_state(&conn, "sleeper", "RUNNING", Duration::from_secs(10)).await;
    assert_eq!(sleeper.consecutive_failures, 0);

    let list: AgentList = airlock_proto::bus::decode(
        "ListAgents",
        &call_s(&conn, AGENTS, "ListAgents", &()).await.unwrap(),
    )
    .unwrap();
    let names: Vec<&str> = list.agents.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, ["exits", "sleeper"]);

    // held: a start is refused and changes nothing
    let err = call_s(&conn, AGENTS, "StartAgent", &("exits",))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(Code::AGENTOS_CRASH_LOOP), "{err:?}");
    assert!(err.message.contains("clear the hold"), "{err:?}");
    let err = call_s(&conn, AGENTS, "GetAgent", &("nope",))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(Code::AGENT_NOT_FOUND), "{err:?}");

    // a restarted supervisor does not bypass the hold
    s.sup.sigterm();
    s.sup.wait_exit(Duration::from_secs(20));
    s.sup.spawn();
    let conn = s.sup.client().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let again = get(&conn, "exits").await;
    assert_eq!(
        (again.state.as_str(), again.consecutive_failures),
        ("HELD", 5)
    );
    let starts_before = events(&conn)
        .await
        .iter()
        .filter(|e| e["action"] == "AGENT_CHANGED" && e["payload"]["agent"] == "exits")
        .count();
    // and the sleeper, drained by the stop, runs again
    wait_state(&conn, "sleeper", "RUNNING", Duration::from_secs(10)).await;

    // ClearHold restarts it (and it fails again: BACKOFF, one failure),
    // each change announced as AgentChanged (the runners send it on a
    // channel; the bus layer emits it).
    let rule = zbus::MatchRule::builder()
        .msg_type(zbus::message::Type::Signal)
        .interface(AGENTS)
        .unwrap()
        .member("AgentChanged")
        .unwrap()
        .build();
    let mut signals = zbus::MessageStream::for_match_rule(rule, &conn, Some(64))
        .await
        .unwrap();
    let cleared = call_json(&conn, AGENTS, "ClearHold", &("exits",))
        .await
        .unwrap();
    assert!(
        ["STARTING", "RUNNING", "BACKOFF"].contains(&cleared["state"].as_str().unwrap()),
        "{cleared}"
    );
    assert!(
        cleared["consecutive_failures"].as_u64().unwrap() <= 1,
        "{cleared}"
    );
    let heard: (String, String, u32) = tokio::time::timeout(Duration::from_secs(10), async {
        use futures_util::StreamExt;
        loop {
            let m = signals.next().await.unwrap().unwrap();
            let body: (String, String, u32) = m.body().deserialize().unwrap();
            if body.0 == "exits" {
                return body;
            }
        }
    })
    .await
    .expect("AgentChanged for the cleared agent");
    assert!(
        ["STARTING", "RUNNING", "BACKOFF"].contains(&heard.1.as_str()),
        "{heard:?}"
    );
    assert!(heard.2 <= 1, "{heard:?}");
    let log = events(&conn).await;
    let changes = log
        .iter()
        .filter(|e| e["action"] == "AGENT_CHANGED" && e["payload"]["agent"] == "exits")
        .count();
    assert!(
        changes > starts_before,
        "the clear and its start are recorded"
    );
    assert!(log.iter().any(|e| e["action"] == "AGENT_HOLD_CLEARED"
        && e["outcome"] == "allowed"
        && e["payload"]["agent"] == "exits"));
    assert!(log.iter().any(|e| e["action"] == "AGENT_START_REQUESTED"
        && e["outcome"] == "denied"
        && e["code"] == "AGENTOS_CRASH_LOOP"));

    // an operator's stop is no failure, and stays across a restart
    let stopped = call_json(&conn, AGENTS, "StopAgent", &("sleeper",))
        .await
        .unwrap();
    assert_eq!(stopped["state"], "STOPPED");
    assert_eq!(stopped["consecutive_failures"], 0);
    s.sup.sigterm();
    s.sup.wait_exit(Duration::from_secs(20));
    s.sup.spawn();
    let conn = s.sup.client().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(get(&conn, "sleeper").await.state, "STOPPED");
    let started = call_json(&conn, AGENTS, "StartAgent", &("sleeper",))
        .await
        .unwrap();
    assert!(
        ["STARTING", "RUNNING"].contains(&started["state"].as_str().unwrap()),
        "{started}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_host_answers_the_supervisors_uid_only() {
    let s = stack(&agent_table("sleeper", "exec sleep 600")).await;
    // a stranger (uid 1) asking the host to stop an agent: the bus policy
    // refuses it, and the host would too
    let out = std::process::Command::new("dbus-send")
        .args([
            "--system",
            "--print-reply",
            &format!("--dest={}", agent_host::BUS_NAME),
            agent_host::OBJECT_PATH,
            &format!("{}.Stop", agent_host::INTERFACE),
            "string:sleeper",
        ])
        .env("DBUS_SYSTEM_BUS_ADDRESS", s.sup.bus.address())
        .uid(STRANGER_UID)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("AccessDenied"), "{err}");
    let conn = s.sup.client().await;
    wait_state(&conn, "sleeper", "RUNNING", Duration::from_secs(10)).await;
    // the host's own check, past the bus policy: a host reserved for
    // another uid refuses this root caller and stops nothing
    let other = AgentHost::new(
        Arc::new(
            ProcessDriver::new(None, s.sup.dir().join("other"), Vec::new()).unwrap_or_else(|_| {
                ProcessDriver::new(
                    Some(Identity::lookup("nobody").unwrap()),
                    s.sup.dir().join("other"),
                    Vec::new(),
                )
                .unwrap()
            }),
        ),
        Vec::new(),
        4242,
    );
    let path = "/org/airlock/AgentHost1/reserved";
    s.host.object_server().at(path, other).await.unwrap();
    let err = conn
        .call_method(
            Some(agent_host::BUS_NAME),
            path,
            Some(agent_host::INTERFACE),
            "Stop",
            &("sleeper",),
        )
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("AccessDenied") && text.contains("PEER_UID_DENIED"),
        "{text}"
    );
    assert_eq!(get(&conn, "sleeper").await.state, "RUNNING");
    stop_agent(&conn, "sleeper").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_submission_is_attributed_to_it_and_limited_to_its_repositories() {
    let out = scratch_dir("airlock-agent-out-");
    let mine = submission("agent-task-demo").to_string();
    let mut other = submission("agent-task-other");
    other["binding"]["repository"] = "other".into();
    let other = other.to_string();
    // the agent submits twice with dbus-send (a child in its session),
    // writing each reply or error, then waits
    let script = format!(
        "for t in mine other; do \
           body=$(cat {dir}/$t.json); \
           dbus-send --system --print-reply --dest=org.airlock.Supervisor1 /org/airlock/Supervisor1 \
             org.airlock.Tasks2.SubmitTask \"string:$body\" > {dir}/$t.out 2>&1; \
           echo $? > {dir}/$t.rc; \
         done; exec sleep 600",
        dir = out.path().display()
    );
    let agents = format!(
        "\n[[agent]]\nname = \"submitter\"\ncommand = [\"/bin/sh\", \"-c\", {script:?}]\nrepositories = [\"demo\"]\n"
    );
    std::fs::write(out.path().join("mine.json"), &mine).unwrap();
    std::fs::write(out.path().join("other.json"), &other).unwrap();
    let s = stack_with(
        &agents,
        "\n[[repository]]\nname = \"other\"\npath = \"/srv/git/other.git\"\n",
    )
    .await;
    let conn = s.sup.client().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !out.path().join("other.rc").exists() {
        assert!(Instant::now() < deadline, "the agent never submitted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let read = |n: &str| std::fs::read_to_string(out.path().join(n)).unwrap();
    assert_eq!(read("mine.rc").trim(), "0", "{}", read("mine.out"));
    assert_ne!(read("other.rc").trim(), "0");
    assert!(
        read("other.out").contains("AGENT_REPOSITORY_DENIED"),
        "{}",
        read("other.out")
    );

    let log = events(&conn).await;
    let submitted: Vec<&Value> = log
        .iter()
        .filter(|e| e["action"] == "TASK_SUBMITTED" && e["outcome"] == "allowed")
        .collect();
    assert_eq!(submitted.len(), 1, "{log:?}");
    assert_eq!(submitted[0]["task_id"], "agent-task-demo");
    let actor = submitted[0]["actor"]["name"].as_str().unwrap();
    assert!(actor.starts_with("agent:submitter "), "{actor}");
    let denied: Vec<&Value> = log
        .iter()
        .filter(|e| e["code"] == "AGENT_REPOSITORY_DENIED")
        .collect();
    assert_eq!(denied.len(), 1, "{log:?}");
    assert!(
        denied[0]["actor"]["name"]
            .as_str()
            .unwrap()
            .starts_with("agent:submitter ")
    );
    // nothing of the other repository was queued
    let err = call_s(&conn, TASKS, "GetTask", &("agent-task-other",))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(Code::TASK_NOT_FOUND));

    // the same user outside the agent's session is not the agent: a plain
    // planner, neither named as the agent nor limited to its repositories
    let mut plain = submission("plain-task-other");
    plain["binding"]["repository"] = "other".into();
    let uid = nix::unistd::User::from_name("airlock-agent")
        .ok()
        .flatten()
        .map_or(65534, |u| u.uid.as_raw());
    let o = std::process::Command::new("dbus-send")
        .args([
            "--system",
            "--print-reply",
            "--dest=org.airlock.Supervisor1",
            "/org/airlock/Supervisor1",
            "org.airlock.Tasks2.SubmitTask",
            &format!("string:{plain}"),
        ])
        .env("DBUS_SYSTEM_BUS_ADDRESS", s.sup.bus.address())
        .uid(uid)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let log = events(&conn).await;
    let e = log
        .iter()
        .find(|e| e["action"] == "TASK_SUBMITTED" && e["task_id"] == "plain-task-other")
        .unwrap();
    assert!(
        !e["actor"]["name"].as_str().unwrap().starts_with("agent:"),
        "{e}"
    );
    // the agent's process ends with the test (agents under this host
    // outlive a killed supervisor and count against RLIMIT_NPROC)
    stop_agent(&conn, "submitter").await;
}

/// Stops `name` (its process group killed by the process driver).
async fn stop_agent(conn: &Connection, name: &str) {
    let stopped = call_json(conn, AGENTS, "StopAgent", &(name,))
        .await
        .unwrap();
    assert_eq!(stopped["state"], "STOPPED");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_replaces_only_the_plans_of_its_own_tasks_in_its_repositories() {
    let out = scratch_dir("airlock-agent-out-");
    let ours = "agent-task-demo";
    let theirs_elsewhere = "human-task-other";
    let theirs_here = "human-task-demo";
    // the agent submits its task, waits for the test's go, then replaces
    // the plan of each task in turn with dbus-send (a child in its
    // session), writing each reply or error
    let script = format!(
        "body=$(cat {dir}/submission.json); \
         dbus-send --system --print-reply --dest=org.airlock.Supervisor1 /org/airlock/Supervisor1 \
           org.airlock.Tasks2.SubmitTask \"string:$body\" > {dir}/submit.out 2>&1; \
         echo $? > {dir}/submit.rc; \
         while [ ! -e {dir}/go ]; do sleep 0.1; done; \
         for t in {ours} {theirs_elsewhere} {theirs_here}; do \
           body=$(cat {dir}/$t.plan); \
           dbus-send --system --print-reply --dest=org.airlock.Supervisor1 /org/airlock/Supervisor1 \
             org.airlock.Tasks2.ReplacePlan \"string:$t\" \"string:$body\" > {dir}/$t.out 2>&1; \
           echo $? > {dir}/$t.rc; \
         done; exec sleep 600",
        dir = out.path().display()
    );
    let agents = format!(
        "\n[[agent]]\nname = \"replacer\"\ncommand = [\"/bin/sh\", \"-c\", {script:?}]\nrepositories = [\"demo\"]\n"
    );
    std::fs::write(
        out.path().join("submission.json"),
        submission(ours).to_string(),
    )
    .unwrap();
    let s = stack_with(
        &agents,
        "\n[[repository]]\nname = \"other\"\npath = \"/srv/git/other.git\"\n",
    )
    .await;
    let conn = s.sup.client().await;
    // a human (not the agent) submits one task in each repository
    let mut elsewhere = submission(theirs_elsewhere);
    elsewhere["binding"]["repository"] = "other".into();
    for sub in [elsewhere, submission(theirs_here)] {
        call_json(&conn, TASKS, "SubmitTask", &(sub.to_string(),))
            .await
            .unwrap();
    }
    let read = |n: &str| std::fs::read_to_string(out.path().join(n)).unwrap();
    let wait_for = |n: &str| {
        let path = out.path().join(n);
        async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            while !path.exists() {
                assert!(Instant::now() < deadline, "the agent never wrote {path:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    wait_for("submit.rc").await;
    assert_eq!(read("submit.rc").trim(), "0", "{}", read("submit.out"));

    // each replacement names the stored plan's digest: only the owner
    // check can refuse it
    let mut before = std::collections::HashMap::new();
    for t in [ours, theirs_elsewhere, theirs_here] {
        let view = call_json(&conn, TASKS, "GetTask", &(t,)).await.unwrap();
        let digest = view["plan_digest"].as_str().unwrap().to_owned();
        std::fs::write(
            out.path().join(format!("{t}.plan")),
            plan(t, 2, Some(&digest)).to_string(),
        )
        .unwrap();
        before.insert(t, view);
    }
    std::fs::write(out.path().join("go"), "").unwrap();
    wait_for(&format!("{theirs_here}.rc")).await;

    // (a) its own task: replaced, attributed to the agent
    assert_eq!(
        read(&format!("{ours}.rc")).trim(),
        "0",
        "{}",
        read(&format!("{ours}.out"))
    );
    let view = call_json(&conn, TASKS, "GetTask", &(ours,)).await.unwrap();
    assert_ne!(view["plan_digest"], before[ours]["plan_digest"]);
    let log = events(&conn).await;
    let replaced: Vec<&Value> = log
        .iter()
        .filter(|e| e["action"] == "TASK_PLAN_REPLACED" && e["outcome"] == "allowed")
        .collect();
    assert_eq!(replaced.len(), 1, "{log:?}");
    assert_eq!(replaced[0]["task_id"], ours);
    let actor = replaced[0]["actor"]["name"].as_str().unwrap();
    assert!(actor.starts_with("agent:replacer "), "{actor}");

    // (b) a human's task of a repository not its own, (c) a human's task
    // of its repository: neither is the agent's to read, so each answers
    // as a task that does not exist, recorded as the agent's, nothing
    // changed
    for (t, code) in [
        (theirs_elsewhere, "TASK_NOT_FOUND"),
        (theirs_here, "TASK_NOT_FOUND"),
    ] {
        let rc = read(&format!("{t}.rc"));
        let o = read(&format!("{t}.out"));
        assert_ne!(rc.trim(), "0", "{o}");
        assert!(o.contains(code), "{t}: {o}");
        let denied: Vec<&Value> = log
            .iter()
            .filter(|e| e["task_id"] == t && e["action"] == "TASK_PLAN_REPLACED")
            .collect();
        assert_eq!(denied.len(), 1, "{log:?}");
        assert_eq!(denied[0]["outcome"], "denied");
        assert_eq!(denied[0]["code"], code);
        let actor = denied[0]["actor"]["name"].as_str().unwrap();
        assert!(actor.starts_with("agent:replacer "), "{actor}");
        let view = call_json(&conn, TASKS, "GetTask", &(t,)).await.unwrap();
        assert_eq!(view["plan_digest"], before[t]["plan_digest"], "{t}");
        assert_eq!(view["revision"], before[t]["revision"], "{t}");
    }
    // the human who submitted it still replaces it, with the same plan the
    // agent was refused (its compare-and-swap digest still current)
    let replaced = call_json(
        &conn,
        TASKS,
        "ReplacePlan",
        &(theirs_here, read(&format!("{theirs_here}.plan"))),
    )
    .await
    .unwrap();
    assert_ne!(replaced["plan_digest"], before[theirs_here]["plan_digest"]);
    stop_agent(&conn, "replacer").await;
}

//! An agent's quotas and cap over the real bus, with the real supervisor
//! binary and its agent run by a real AgentHost1 as a real process: its
//! submission over `tasks_per_hour` is refused with AGENT_QUOTA_EXCEEDED
//! naming the quota, nothing is stored, the refusal is a denied event
//! naming the agent and the quota and is counted in airlock.prom;
//! GetAgentLimits shows the quotas and their use; the worker's claims keep
//! the agent's `max_running`.

mod common;

use std::time::{Duration, Instant};

use airlock_proto::Code;
use airlock_proto::bus::AgentLimits;
use common::*;
use serde_json::Value;

const AGENTS: &str = "org.airlock.Agents1";

async fn agent_limits(conn: &zbus::Connection, name: &str) -> AgentLimits {
    let text = call_s(conn, AGENTS, "GetAgentLimits", &(name,))
        .await
        .unwrap();
    airlock_proto::bus::decode("GetAgentLimits", &text).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_submission_over_its_quota_is_refused_recorded_counted_and_shown() {
    let out = scratch_dir("airlock-quota-out-");
    let tasks = ["quota-task-1", "quota-task-2", "quota-task-3"];
    for t in tasks {
        std::fs::write(
            out.path().join(format!("{t}.json")),
            submission(t).to_string(),
        )
        .unwrap();
    }
    // The agent submits three tasks with dbus-send (a child in its
    // session), writing each reply or error, then waits.
    let script = format!(
        "for t in {list}; do \
           body=$(cat {dir}/$t.json); \
           dbus-send --system --print-reply --dest=org.airlock.Supervisor1 /org/airlock/Supervisor1 \
             org.airlock.Tasks2.SubmitTask \"string:$body\" > {dir}/$t.out 2>&1; \
           echo $? > {dir}/$t.rc; \
         done; exec sleep 600",
        list = tasks.join(" "),
        dir = out.path().display()
    );
    let agents = format!(
        "\n[[agent]]\nname = \"quick\"\ncommand = [\"/bin/sh\", \"-c\", {script:?}]\nrepositories = [\"demo\"]\ntasks_per_hour = 2\nmax_running = 1\n"
    );
    let textfiles = tempfile::tempdir().unwrap();
    let opts = Opts {
        supervisor_extra: format!(
            "metrics_directory = {:?}\nmetrics_interval_seconds = 1\n",
            textfiles.path().display().to_string()
        ),
        ..Opts::default()
    };
    let s = Stack::start(opts, &agents, "").await;
    let conn = s.sup.client().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !out.path().join("quota-task-3.rc").exists() {
        assert!(Instant::now() < deadline, "the agent never submitted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let read = |n: &str| std::fs::read_to_string(out.path().join(n)).unwrap();
    for t in ["quota-task-1", "quota-task-2"] {
        assert_eq!(
            read(&format!("{t}.rc")).trim(),
            "0",
            "{}",
            read(&format!("{t}.out"))
        );
    }
    assert_ne!(read("quota-task-3.rc").trim(), "0");
    let refusal = read("quota-task-3.out");
    assert!(
        refusal.contains("org.airlock.Error.AGENT_QUOTA_EXCEEDED")
            && refusal.contains(
                "agent \"quick\" submitted 2 tasks in the last 3600 s; its quota tasks_per_hour is 2"
            ),
        "{refusal}"
    );

    // Nothing stored; one denied event naming the agent and the quota.
    let err = call_s(&conn, TASKS, "GetTask", &("quota-task-3",))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(Code::TASK_NOT_FOUND));
    let page = call_json(&conn, TASKS, "ListEvents", &("", 0i64, 1000u32))
        .await
        .unwrap();
    let denied: Vec<&Value> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["code"] == "AGENT_QUOTA_EXCEEDED")
        .collect();
    assert_eq!(denied.len(), 1, "{page}");
    let e = denied[0];
    assert_eq!(e["action"], "TASK_SUBMITTED");
    assert_eq!(e["outcome"], "denied");
    assert_eq!(e["task_id"], "quota-task-3");
    assert!(
        e["actor"]["name"]
            .as_str()
            .unwrap()
            .starts_with("agent:quick "),
        "{e}"
    );
    assert_eq!(e["payload"]["quota"], "tasks_per_hour");
    assert_eq!(e["payload"]["agent"], "quick");
    assert_eq!(
        (
            e["payload"]["limit"].as_u64(),
            e["payload"]["used"].as_u64()
        ),
        (Some(2), Some(2))
    );

    // GetAgentLimits shows the quotas and their use; an agent not
    // configured has none to show.
    let limits = agent_limits(&conn, "quick").await;
    assert_eq!(
        (
            limits.tasks_per_hour,
            limits.cpu_seconds_per_day,
            limits.max_running
        ),
        (2, 0, 1)
    );
    assert_eq!((limits.usage.tasks_last_hour, limits.usage.running), (2, 0));
    let err = call_s(&conn, AGENTS, "GetAgentLimits", &("nope",))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(Code::AGENT_NOT_FOUND));

    // The worker's claims keep the agent's cap of one running task.
    let first = worker_claim(&s.sup);
    assert_eq!(first["task_id"], "quota-task-1");
    assert_eq!(worker_claim(&s.sup), Value::Null, "the agent is at its cap");
    assert_eq!(agent_limits(&conn, "quick").await.usage.running, 1);

    // Counted in airlock.prom, by agent and quota.
    let series = "airlock_agent_quota_refusals_total{agent=\"quick\",quota=\"tasks_per_hour\"} 1";
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text =
            std::fs::read_to_string(textfiles.path().join("airlock.prom")).unwrap_or_default();
        if text.lines().any(|l| l == series) {
            break;
        }
        assert!(Instant::now() < deadline, "no {series} in:\n{text}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The agent's process ends with the test.
    let stopped = call_json(&conn, AGENTS, "StopAgent", &("quick",))
        .await
        .unwrap();
    assert_eq!(stopped["state"], "STOPPED");
}

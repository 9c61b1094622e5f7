//! airlock.prom: the real supervisor binary writes its metrics into a
//! textfile-collector directory; the series follow what happened to the
//! tasks (a success, a lease expiry, one still queued), Prometheus's own
//! promtool accepts the file, and a directory that appears later is
//! written into once it exists.

mod common;

use common::*;
use serde_json::json;
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// The file's samples, `name{labels}` to value (labels as written).
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_owned(), v.parse().ok()?))
        })
        .collect()
}

/// Waits until `dir/airlock.prom` satisfies `ok`; its text.
fn wait_for(dir: &Path, what: &str, ok: impl Fn(&BTreeMap<String, f64>) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = String::new();
    while Instant::now() < deadline {
        if let Ok(text) = std::fs::read_to_string(dir.join("airlock.prom")) {
            if ok(&samples(&text)) {
                return text;
            }
            last = text;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("airlock.prom never showed {what}; last:\n{last}");
}

fn promtool_accepts(text: &str) {
    use std::io::Write;
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus package, in scripts/deps.sh)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics refused airlock.prom: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_file_follows_the_tasks_and_promtool_accepts_it() {
    let textfiles = tempfile::tempdir().unwrap();
    let dir = textfiles.path().join("node-exporter");
    std::fs::create_dir(&dir).unwrap();
    // Sweeps every 2 s: each sends a STATUS= notification, which the
    // harness reads only when asked (a socket queue holds ten).
    let sup = Supervisor::start(Opts {
        lease_seconds: 10,
        sweep_interval_seconds: 2,
        supervisor_extra: format!(
            "metrics_directory = {:?}\nmetrics_interval_seconds = 1\n",
            dir.display().to_string()
        ),
        ..Opts::default()
    });
    let conn = sup.client().await;

    wait_for(&dir, "the empty queue", |s| {
        s.get("airlock_tasks{state=\"QUEUED\"}") == Some(&0.0)
    });

    // One task succeeds, one's lease expires on its only attempt, one waits.
    submit(&conn, "task-done").await;
    let mut once = submission("task-expire");
    once["max_attempts"] = json!(1);
    call_json(&conn, TASKS, "SubmitTask", &(once.to_string(),))
        .await
        .unwrap();
    submit(&conn, "task-waiting").await;
    // A replay of an identical submission is not a new task.
    assert_eq!(submit(&conn, "task-done").await["idempotent"], true);
    let grant = worker_claim(&sup);
    assert_eq!(grant["task_id"], "task-done");
    // Its verification read a dependency layer from the executor's cache.
    let mut result = passed_result(&grant);
    result["isolation"]["layer"] = json!({
        "key": "a".repeat(64), "digest": "b".repeat(64), "bytes": 4096,
        "reused": true, "setup": [], "egress": [],
    });
    worker_submit(&sup, WORKER_UID, &grant, 1, &result).unwrap();
    let view: airlock_proto::task::TaskView = serde_json::from_value(
        call_json(&conn, TASKS, "GetTask", &("task-done",))
            .await
            .unwrap(),
    )
    .unwrap();
    let accept = airlock_proto::task::DecisionRequest::about(
        &view,
        airlock_proto::task::Decision::Accept,
        "fine",
        None,
    )
    .to_value()
    .to_string();
    call_json(&conn, TASKS, "Verify", &("task-done", accept.as_str()))
        .await
        .unwrap();
    assert_eq!(worker_claim(&sup)["task_id"], "task-expire");

    let text = wait_for(&dir, "the lease expiry and the success", |s| {
        s.get("airlock_lease_expiries_total") == Some(&1.0)
            && s.get("airlock_tasks_finished_total{code=\"\",state=\"SUCCEEDED\"}") == Some(&1.0)
    });
    let s = samples(&text);
    let at = |k: &str| {
        *s.get(k)
            .unwrap_or_else(|| panic!("{k} missing from:\n{text}"))
    };
    assert_eq!(at("airlock_tasks{state=\"QUEUED\"}"), 1.0);
    assert_eq!(at("airlock_tasks{state=\"SUCCEEDED\"}"), 1.0);
    assert_eq!(at("airlock_tasks{state=\"FAILED\"}"), 1.0);
    assert_eq!(at("airlock_tasks{state=\"RUNNING\"}"), 0.0);
    assert_eq!(at("airlock_tasks_submitted_total"), 3.0);
    assert_eq!(
        at("airlock_tasks_finished_total{code=\"LEASE_EXPIRED\",state=\"FAILED\"}"),
        1.0
    );
    assert_eq!(
        s.keys()
            .filter(|k| k.starts_with("airlock_tasks_finished_total"))
            .count(),
        2,
        "no other finished series: {text}"
    );
    // Two attempts ended (a result, an expiry); the one command took 12 ms.
    assert_eq!(at("airlock_attempt_duration_seconds_count"), 2.0);
    assert!(at("airlock_attempt_duration_seconds_sum") >= 10.0, "{text}");
    assert_eq!(
        at("airlock_verification_command_duration_seconds_count"),
        1.0
    );
    assert_eq!(
        at("airlock_verification_command_duration_seconds_sum"),
        0.012
    );
    assert_eq!(
        at("airlock_verification_command_duration_seconds_bucket{le=\"0.1\"}"),
        1.0
    );
    // The one layer, reused; no layer was built.
    assert_eq!(
        at("airlock_environment_layers_total{source=\"reused\"}"),
        1.0
    );
    assert!(
        !s.contains_key("airlock_environment_layers_total{source=\"built\"}"),
        "{text}"
    );
    assert!(
        at("airlock_queue_oldest_task_age_seconds") >= 10.0,
        "{text}"
    );
    assert!(text.contains("# TYPE airlock_attempt_duration_seconds histogram"));
    assert!(text.contains("# TYPE airlock_tasks_submitted_total counter"));
    assert!(
        !text.contains("task-") && !text.contains("demo"),
        "no task id or repository in the file: {text}"
    );
    promtool_accepts(&text);

    // Written whole, readable by the collector, no temporary file left.
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["airlock.prom"]);
    let mode = std::fs::metadata(dir.join("airlock.prom"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o644);

    // A restarted supervisor counts from its start: the store's states
    // stay, what finished before it is not counted again.
    drop(conn);
    let mut sup = sup;
    sup.sigterm();
    sup.wait_notification("STOPPING=1", Duration::from_secs(5));
    assert!(sup.wait_exit(Duration::from_secs(20)).success());
    std::fs::remove_file(dir.join("airlock.prom")).unwrap();
    sup.spawn();
    let text = wait_for(&dir, "the store after a restart", |s| {
        s.get("airlock_tasks{state=\"SUCCEEDED\"}") == Some(&1.0)
    });
    let s = samples(&text);
    assert_eq!(s.get("airlock_tasks{state=\"FAILED\"}"), Some(&1.0));
    assert_eq!(s.get("airlock_tasks_submitted_total"), Some(&0.0));
    assert_eq!(s.get("airlock_lease_expiries_total"), Some(&0.0));
    assert!(
        !s.keys()
            .any(|k| k.starts_with("airlock_tasks_finished_total")),
        "{text}"
    );
    promtool_accepts(&text);
}

#[test]
fn a_missing_directory_is_said_and_not_made() {
    let textfiles = tempfile::tempdir().unwrap();
    let dir = textfiles.path().join("node-exporter");
    let sup = Supervisor::start(Opts {
        supervisor_extra: format!(
            "metrics_directory = {:?}\nmetrics_interval_seconds = 1\n",
            dir.display().to_string()
        ),
        ..Opts::default()
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let log = std::fs::read_to_string(sup.log_path()).unwrap_or_default();
        if log.contains("does not exist, so airlock.prom is not written") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the missing directory is never said:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!dir.exists(), "the supervisor does not make the directory");
    assert_eq!(std::fs::read_dir(textfiles.path()).unwrap().count(), 0);
}

#[test]
fn an_interval_of_zero_writes_nothing() {
    let textfiles = tempfile::tempdir().unwrap();
    let sup = Supervisor::start(Opts {
        supervisor_extra: format!(
            "metrics_directory = {:?}\nmetrics_interval_seconds = 0\n",
            textfiles.path().display().to_string()
        ),
        ..Opts::default()
    });
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(std::fs::read_dir(textfiles.path()).unwrap().count(), 0);
    drop(sup);
}

/// The series a supervisor with agents writes, from a real task store:
/// a task revoked with its agent counts as CANCELLED with AGENT_REVOKED,
/// an agent's starts are its records turning RUNNING with a new
/// running-since (a record saved again while it runs is not a start), and
/// the agents' states and failures are as their views say, a submission
/// refused for a quota counts by agent and quota; promtool accepts the
/// file.
#[test]
fn revocations_and_agent_starts_are_counted_from_the_store() {
    use airlock_agents::{AgentRecord, Status};
    use airlock_supervisor::metrics::{Tally, read};
    use airlock_taskdb::tasks::Actor;
    let dir = tempfile::tempdir().unwrap();
    let mut store = airlock_taskdb::open(&airlock_taskdb::Location::Sqlite(
        dir.path().join("tasks.sqlite3"),
    ))
    .unwrap();
    let mut tally = Tally::new(store.last_event_id().unwrap(), store.now_ms().unwrap());
    let alpha = Actor::planner(Some(989), "agent:alpha airlock-agent@:1.7");
    let task = airlock_proto::task::TaskSubmission::from_value(&submission("task-alpha")).unwrap();
    store.submit(&task, &alpha).unwrap();
    // Its next submission is over its quota of one task an hour.
    let quota = airlock_taskdb::tasks::AgentQuota {
        tasks_per_hour: 1,
        cpu_seconds_per_day: 0,
    };
    let more = airlock_proto::task::TaskSubmission::from_value(&submission("task-more")).unwrap();
    let refused = store.submit_within(&more, &alpha, &quota).unwrap_err();
    assert_eq!(refused.code(), airlock_proto::Code::AGENT_QUOTA_EXCEEDED);
    let registry = Actor::system("agent-registry");
    assert_eq!(
        store
            .cancel_agent_queued("alpha", None, "removed", &registry)
            .unwrap(),
        ["task-alpha"]
    );
    let policy = Actor::system("agent-policy");
    let running = |since: u64| {
        let mut r = AgentRecord::new(since);
        r.status = Status::Running;
        r.running_since_ms = Some(since);
        serde_json::to_value(r).unwrap()
    };
    for record in [running(1000), running(1000), running(5000)] {
        store.save_agent_record("alpha", &record, &policy).unwrap();
    }
    let views = [airlock_proto::bus::AgentView {
        name: "alpha".into(),
        state: "HELD".into(),
        consecutive_failures: 5,
        next_start_at_ms: None,
        running_since_ms: None,
        last_exit_status: Some(1),
        last_exit_signal: None,
        last_failure: Some("exit status 1".into()),
        hold_reason: Some("crash loop".into()),
        repositories: vec!["demo".into()],
        updated_at_ms: 6000,
    }];
    let reading = read(store.as_ref(), tally.cursor()).unwrap();
    tally.apply(reading, &views);
    let text = tally.render();
    let s = samples(&text);
    let at = |k: &str| {
        *s.get(k)
            .unwrap_or_else(|| panic!("{k} missing from:\n{text}"))
    };
    assert_eq!(
        at("airlock_tasks_finished_total{code=\"AGENT_REVOKED\",state=\"CANCELLED\"}"),
        1.0
    );
    assert_eq!(at("airlock_tasks{state=\"CANCELLED\"}"), 1.0);
    assert_eq!(at("airlock_tasks_submitted_total"), 1.0);
    assert_eq!(at("airlock_agent_starts_total{agent=\"alpha\"}"), 2.0);
    assert_eq!(
        at("airlock_agent_quota_refusals_total{agent=\"alpha\",quota=\"tasks_per_hour\"}"),
        1.0
    );
    assert_eq!(at("airlock_agents{state=\"HELD\"}"), 1.0);
    assert_eq!(
        at("airlock_agent_consecutive_failures{agent=\"alpha\"}"),
        5.0
    );
    promtool_accepts(&text);

    // A second pass over no new events counts nothing again.
    let reading = read(store.as_ref(), tally.cursor()).unwrap();
    tally.apply(reading, &views);
    let again = samples(&tally.render());
    assert_eq!(
        again.get("airlock_tasks_finished_total{code=\"AGENT_REVOKED\",state=\"CANCELLED\"}"),
        Some(&1.0)
    );
    assert_eq!(
        again.get("airlock_agent_starts_total{agent=\"alpha\"}"),
        Some(&2.0)
    );
}

/// The two failure codes the store gives without a worker's failure code
/// of that name: a queued task of a repository a reload removed
/// (`REPOSITORY_NOT_REGISTERED`), and a worker's reconciliation result
/// (`RECONCILIATION_REQUIRED`, the task failed at once and its case
/// opened), counted once each also after the case is resolved as failed.
#[test]
fn orphaned_and_reconciled_failures_are_counted_by_their_codes() {
    use airlock_proto::reconcile::{Resolution, ResolveRequest};
    use airlock_supervisor::metrics::{Tally, read};
    use airlock_taskdb::tasks::Actor;
    let dir = tempfile::tempdir().unwrap();
    let mut store = airlock_taskdb::open(&airlock_taskdb::Location::Sqlite(
        dir.path().join("tasks.sqlite3"),
    ))
    .unwrap();
    let mut tally = Tally::new(store.last_event_id().unwrap(), store.now_ms().unwrap());
    let admin = Actor::admin(Some(0), "root");
    let worker = Actor::worker(Some(WORKER_UID), "worker-1");
    let submit = |store: &mut Box<dyn airlock_taskdb::tasks::TaskStore>, id: &str| {
        let task = airlock_proto::task::TaskSubmission::from_value(&submission(id)).unwrap();
        store.submit(&task, &admin).unwrap();
    };

    // Reconciliation: the first attempt saw its branch moved.
    submit(&mut store, "task-moved");
    let grant = store
        .claim(&worker, 60_000)
        .unwrap()
        .expect("a task to claim");
    let result: airlock_proto::task::TaskResult = serde_json::from_value(json!({
        "schema": "airlock.task-result.v1",
        "task_id": grant.task_id,
        "attempt": grant.attempt,
        "execution_digest": grant.envelope["execution_digest"],
        "outcome": "failed",
        "commit_oid": null,
        "target_branch": grant.envelope["target_branch"],
        "exec_result_sha256": null,
        "failure_code": "RECONCILIATION_REQUIRED",
        "verification": [],
        "reconciliation": {"commit_oid": "1".repeat(40), "observed_head": "2".repeat(40)},
    }))
    .unwrap();
    store
        .submit_result(
            &grant.task_id,
            grant.lease_epoch,
            &grant.lease_token,
            "result-task-moved-1",
            &result,
            false,
            &worker,
        )
        .unwrap();
    // Orphaned: its repository is no longer registered.
    submit(&mut store, "task-orphan");
    assert_eq!(store.fail_unregistered(&[]).unwrap(), ["task-orphan"]);

    let finished = |tally: &Tally| {
        let s = samples(&tally.render());
        s.into_iter()
            .filter(|(k, _)| k.starts_with("airlock_tasks_finished_total"))
            .collect::<BTreeMap<_, _>>()
    };
    let reading = read(store.as_ref(), tally.cursor()).unwrap();
    tally.apply(reading, &[]);
    let expected: BTreeMap<String, f64> = [
        (
            "airlock_tasks_finished_total{code=\"RECONCILIATION_REQUIRED\",state=\"FAILED\"}"
                .to_owned(),
            1.0,
        ),
        (
            "airlock_tasks_finished_total{code=\"REPOSITORY_NOT_REGISTERED\",state=\"FAILED\"}"
                .to_owned(),
            1.0,
        ),
    ]
    .into();
    assert_eq!(finished(&tally), expected, "{}", tally.render());

    // The case resolved as failed: the task stays FAILED, counted once.
    let case = store.reconciliation("task-moved").unwrap();
    let resolve = ResolveRequest::about(
        &case,
        Resolution::Fail,
        "the branch is someone else's",
        None,
    );
    store
        .resolve_reconciliation("task-moved", &resolve, &admin)
        .unwrap();
    let reading = read(store.as_ref(), tally.cursor()).unwrap();
    tally.apply(reading, &[]);
    assert_eq!(finished(&tally), expected, "{}", tally.render());
}

//! Revocation without a restart (issue 25, part 5), with the real
//! supervisor and real agent processes (a real AgentHost1, the process
//! driver): agents submit tasks that stay QUEUED (no worker runs), then
//! `systemctl reload` (SIGHUP) applies a changed `[[agent]]` set. A
//! refused file changes nothing; an accepted one stops the removed agent
//! and cancels its queued tasks with AGENT_REVOKED, cancels a narrowed
//! agent's tasks for the repository it lost (its others stay QUEUED, and
//! its next submission there is AGENT_REPOSITORY_DENIED), starts the added
//! agent, restarts the agent whose limit changed alone and leaves the
//! untouched one running (same pid). Then an operator stops an agent and
//! cancels its queue with one call (CancelQueued); refused without
//! `org.airlock.agents.manage` and while the agent runs, each with its
//! code and nothing changed.

mod common;

use airlock_proto::Code;
use common::*;
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};

const AGENTS: &str = "org.airlock.Agents1";

fn sighup(sup: &Supervisor) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(sup.pid() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
}

fn wait_for_log(sup: &Supervisor, needle: &str, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let log = std::fs::read_to_string(sup.log_path()).unwrap_or_default();
        if log.matches(needle).count() >= count {
            return;
        }
        assert!(Instant::now() < deadline, "no {needle:?} in:\n{log}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ok() {
        assert!(Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// An agent script: records its pid at each start (`NAME.pids`), submits
/// each task file `NAME.N.json` once, then (when `NAME.again` appears)
/// submits `NAME.again.json`, and sleeps in the same process.
fn script(dir: &Path, name: &str) -> String {
    format!(
        "d={dir}; echo $$ >> $d/{name}.pids; \
         if [ ! -e $d/{name}.submitted ]; then \
           for f in $d/{name}.[0-9].json; do [ -e \"$f\" ] || continue; body=$(cat \"$f\"); \
             dbus-send --system --print-reply --dest=org.airlock.Supervisor1 /org/airlock/Supervisor1 \
               org.airlock.Tasks2.SubmitTask \"string:$body\" >> $d/{name}.submit.out 2>&1 || echo fail >> $d/{name}.submit.out; \
           done; touch $d/{name}.submitted; fi; \
         while [ ! -e $d/{name}.again ]; do sleep 0.1; done; \
         body=$(cat $d/{name}.again.json); \
         dbus-send --system --print-reply --dest=org.airlock.Supervisor1 /org/airlock/Supervisor1 \
           org.airlock.Tasks2.SubmitTask \"string:$body\" > $d/{name}.again.out 2>&1; \
         echo $? > $d/{name}.again.rc; exec sleep 600",
        dir = dir.display()
    )
}

fn table(dir: &Path, name: &str, repositories: &str, extra: &str) -> String {
    format!(
        "\n[[agent]]\nname = \"{name}\"\ncommand = [\"/bin/sh\", \"-c\", {:?}]\nrepositories = [{repositories}]\n{extra}",
        script(dir, name)
    )
}

fn task_for(id: &str, repository: &str) -> Value {
    let mut s = submission(id);
    s["binding"]["repository"] = repository.into();
    s
}

fn pids(dir: &Path, name: &str) -> Vec<i32> {
    std::fs::read_to_string(dir.join(format!("{name}.pids")))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

fn alive(pid: i32) -> bool {
    // A zombie is gone for our purposes: its /proc state is Z.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| r.trim_start().starts_with('Z'))
        })
        .is_some_and(|zombie| !zombie)
}

async fn task(conn: &zbus::Connection, id: &str) -> Value {
    call_json(conn, TASKS, "GetTask", &(id,))
        .await
        .unwrap_or_else(|e| panic!("GetTask {id}: {e:?}"))
}

fn state_of(v: &Value) -> String {
    v.get("state")
        .or_else(|| v.get("task").and_then(|t| t.get("state")))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

async fn agent_names(conn: &zbus::Connection) -> Vec<String> {
    let list: Value = call_json(conn, AGENTS, "ListAgents", &()).await.unwrap();
    list["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_revokes_agents_without_restarting_the_others_and_an_operator_cancels_a_stopped_agents_queue()
 {
    let dir = scratch_dir("airlock-revoke-");
    let d = dir.path();
    let tasks: &[(&str, &str, &str)] = &[
        ("keep", "t-keep-1", "demo"),
        ("gone", "t-gone-1", "demo"),
        ("gone", "t-gone-2", "calc"),
        ("narrow", "t-narrow-demo", "demo"),
        ("narrow", "t-narrow-calc", "calc"),
    ];
    for (i, (agent, id, repo)) in tasks.iter().enumerate() {
        std::fs::write(
            d.join(format!("{agent}.{i}.json")),
            task_for(id, repo).to_string(),
        )
        .unwrap();
    }
    std::fs::write(
        d.join("narrow.again.json"),
        task_for("t-narrow-calc-again", "calc").to_string(),
    )
    .unwrap();
    let calc = "\n[[repository]]\nname = \"calc\"\npath = \"/srv/git/calc.git\"\n";
    let both = "\"demo\", \"calc\"";
    let before = [
        table(d, "keep", both, ""),
        table(d, "gone", both, ""),
        table(d, "narrow", both, ""),
        table(d, "limit", "\"demo\"", ""),
    ]
    .concat();
    let fresh = table(d, "fresh", "\"demo\"", "");
    let opts = Opts {
        authorizer: "root-admin-for-tests".into(),
        ..Opts::default()
    };
    let s = Stack::start_with_host(opts, &before, &fresh, calc).await;
    let sup = &s.sup;
    let admin = sup.client().await;
    for name in ["keep", "gone", "narrow", "limit"] {
        wait_until(&format!("{name} submitted"), || {
            d.join(format!("{name}.submitted")).exists()
        });
    }
    for (agent, id, _) in tasks {
        let out =
            std::fs::read_to_string(d.join(format!("{agent}.submit.out"))).unwrap_or_default();
        let t = call_json(&admin, TASKS, "GetTask", &(id,)).await;
        let t = t.unwrap_or_else(|e| panic!("{agent}'s {id}: {e:?}; it submitted: {out}"));
        assert_eq!(state_of(&t), "QUEUED", "{agent}'s {id}: {t}");
    }
    let first: Vec<(String, Vec<i32>)> = ["keep", "gone", "narrow", "limit"]
        .iter()
        .map(|n| (n.to_string(), pids(d, n)))
        .collect();
    for (n, p) in &first {
        assert_eq!(p.len(), 1, "{n} started once: {p:?}");
    }
    let pid_of = |name: &str| first.iter().find(|(n, _)| n == name).unwrap().1[0];

    // A refused file (an agent naming an unregistered repository): the
    // reload is refused and nothing changes.
    let text = std::fs::read_to_string(&sup.config).unwrap();
    let head = &text[..text.find("\n[[agent]]").expect("the agent tables")];
    let after = [
        table(d, "keep", both, ""),
        table(d, "narrow", "\"demo\"", ""),
        table(d, "limit", "\"demo\"", "tasks_max = 32\n"),
        fresh.clone(),
    ]
    .concat();
    std::fs::write(
        &sup.config,
        format!("{head}{after}{}", table(d, "bad", "\"nope\"", "")),
    )
    .unwrap();
    sighup(sup);
    wait_for_log(sup, "reload refused", 1);
    std::thread::sleep(Duration::from_millis(500));
    for (agent, id, _) in tasks {
        assert_eq!(
            state_of(&task(&admin, id).await),
            "QUEUED",
            "{agent}'s {id}"
        );
    }
    assert_eq!(
        agent_names(&admin).await,
        ["gone", "keep", "limit", "narrow"]
    );
    for (n, p) in &first {
        assert_eq!(&pids(d, n), p, "{n} untouched by a refused reload");
    }

    // The accepted file: gone removed, narrow narrowed to demo, limit's
    // tasks_max changed, fresh added, keep as it was.
    std::fs::write(&sup.config, format!("{head}{after}")).unwrap();
    sighup(sup);
    wait_for_log(sup, "reloaded the agents", 1);
    assert_eq!(
        agent_names(&admin).await,
        ["fresh", "keep", "limit", "narrow"]
    );
    for (id, cancelled) in [
        ("t-gone-1", true),
        ("t-gone-2", true),
        ("t-narrow-calc", true),
        ("t-narrow-demo", false),
        ("t-keep-1", false),
    ] {
        let t = task(&admin, id).await;
        if cancelled {
            assert_eq!(state_of(&t), "CANCELLED", "{id}: {t}");
            assert!(t.to_string().contains("AGENT_REVOKED"), "{id}: {t}");
        } else {
            assert_eq!(state_of(&t), "QUEUED", "{id}: {t}");
        }
    }
    wait_until("gone stopped", || !alive(pid_of("gone")));
    wait_until("fresh started", || pids(d, "fresh").len() == 1);
    wait_until("limit restarted", || pids(d, "limit").len() == 2);
    assert_eq!(pids(d, "keep"), [pid_of("keep")], "keep not restarted");
    assert!(alive(pid_of("keep")), "keep still runs");
    assert_eq!(
        pids(d, "narrow"),
        [pid_of("narrow")],
        "narrow not restarted"
    );
    assert!(alive(pid_of("narrow")), "narrow still runs");
    assert!(!alive(pid_of("limit")), "limit's first run stopped");
    assert_eq!(pids(d, "gone").len(), 1, "gone not started again");
    // The narrowed agent's next submission for the lost repository.
    std::fs::write(d.join("narrow.again"), "").unwrap();
    wait_until("narrow submitted again", || {
        d.join("narrow.again.rc").exists()
    });
    let out = std::fs::read_to_string(d.join("narrow.again.out")).unwrap();
    assert!(out.contains("AGENT_REPOSITORY_DENIED"), "{out}");
    // The events say who cancelled and why.
    let events: Value = call_json(&admin, TASKS, "ListEvents", &("t-gone-1", 0i64, 100u32))
        .await
        .unwrap();
    let text = events.to_string();
    assert!(
        text.contains("TASK_CANCELLED") && text.contains("agent-registry"),
        "{text}"
    );

    // An operator's cancel: refused without agents.manage (a planner uid)
    // and while the agent runs, each with its code and nothing changed.
    let refused = dbus_send(
        sup,
        STRANGER_UID,
        "org.airlock.Agents1.CancelQueued",
        &["string:keep", "string:off"],
    )
    .unwrap_err();
    assert_eq!(
        refused.code(),
        Some(Code::AUTHORIZATION_DENIED),
        "{refused:?}"
    );
    let running = call_json(&admin, AGENTS, "CancelQueued", &("keep", "off"))
        .await
        .unwrap_err();
    assert_eq!(running.code(), Some(Code::AGENT_RUNNING), "{running:?}");
    assert_eq!(state_of(&task(&admin, "t-keep-1").await), "QUEUED");
    call_json(&admin, AGENTS, "StopAgent", &("keep",))
        .await
        .unwrap();
    wait_until("keep stopped", || !alive(pid_of("keep")));
    let out: Value = call_json(&admin, AGENTS, "CancelQueued", &("keep", "keep is retired"))
        .await
        .unwrap();
    assert_eq!(out["cancelled"], serde_json::json!(["t-keep-1"]), "{out}");
    let t = task(&admin, "t-keep-1").await;
    assert_eq!(state_of(&t), "CANCELLED", "{t}");
    assert!(t.to_string().contains("AGENT_REVOKED"), "{t}");
    // The narrowed agent's other task is still queued, and a second
    // cancel finds nothing left.
    assert_eq!(state_of(&task(&admin, "t-narrow-demo").await), "QUEUED");
    let again: Value = call_json(&admin, AGENTS, "CancelQueued", &("keep", "again"))
        .await
        .unwrap();
    assert_eq!(again["cancelled"], serde_json::json!([]));
}

/// Agents in a settings drop-in (`airlock.toml.d/`): started with the
/// main file's, and on `systemctl reload` (SIGHUP) read again through the
/// supervisor's lockdown, which grants the directory: removing the
/// drop-in stops its agent, putting it back starts it again, and the main
/// file's agent is never restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_in_a_settings_drop_in_are_started_and_reloaded_through_the_lockdown() {
    let dir = scratch_dir("airlock-revoke-dropin-");
    let d = dir.path();
    let main = table(d, "main", "\"demo\"", "");
    let dropped = table(d, "dropped", "\"demo\"", "");
    // The task database elsewhere: its directory's grant must not cover
    // the configuration's.
    let store = tempfile::tempdir().unwrap();
    let opts = Opts {
        authorizer: "root-admin-for-tests".into(),
        database: Some(store.path().join("tasks.sqlite3").display().to_string()),
        ..Opts::default()
    };
    let mut s = Stack::start_with_host(opts, &main, &dropped, "").await;
    // The first start's agent up before the restart below (on a loaded
    // machine the supervisor could otherwise be stopped before it started
    // it, and the main agent would be seen starting once, not twice).
    wait_until("the main agent started", || pids(d, "main").len() == 1);
    // Started again with the drop-in directory in place, as an
    // administrator's airlock.toml.d/ is before the service starts.
    let settings = airlock_config::settings_dir(&s.sup.config);
    std::fs::create_dir(&settings).unwrap();
    let drop_in = settings.join("50-dropped.toml");
    std::fs::write(&drop_in, &dropped).unwrap();
    s.sup.sigterm();
    s.sup.wait_exit(Duration::from_secs(20));
    s.sup.spawn();
    let sup = &s.sup;
    let admin = sup.client().await;
    wait_until("both agents started", || {
        pids(d, "main").len() == 2 && pids(d, "dropped").len() == 1
    });
    assert_eq!(agent_names(&admin).await, ["dropped", "main"]);
    let main_pid = *pids(d, "main").last().unwrap();
    let dropped_pid = pids(d, "dropped")[0];

    // The drop-in removed: its agent stops, the other runs on.
    std::fs::remove_file(&drop_in).unwrap();
    sighup(sup);
    wait_for_log(sup, "reloaded the agents", 1);
    assert_eq!(agent_names(&admin).await, ["main"]);
    wait_until("dropped stopped", || !alive(dropped_pid));
    // Back again: read through the lockdown, it starts.
    std::fs::write(&drop_in, &dropped).unwrap();
    sighup(sup);
    wait_for_log(sup, "reloaded the agents", 2);
    assert_eq!(agent_names(&admin).await, ["dropped", "main"]);
    wait_until("dropped started again", || pids(d, "dropped").len() == 2);
    assert_eq!(
        *pids(d, "main").last().unwrap(),
        main_pid,
        "main not restarted"
    );
    assert!(alive(main_pid), "main still runs");
    let log = std::fs::read_to_string(sup.log_path()).unwrap_or_default();
    assert!(!log.contains("reload refused"), "{log}");
}

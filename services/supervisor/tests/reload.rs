//! Repositories registered and removed while the supervisor runs: SIGHUP
//! (`systemctl reload`) re-reads `repositories.d/`; a queued task of a
//! removed repository fails with REPOSITORY_NOT_REGISTERED and stays.

mod common;

use airlock_proto::Code;
use common::*;
use serde_json::Value;
use std::time::{Duration, Instant};

fn sighup(sup: &Supervisor) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(sup.pid() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
}

fn on_calc(task_id: &str) -> Value {
    let mut s = submission(task_id);
    s["binding"]["repository"] = "calc".into();
    s
}

async fn submit_json(conn: &zbus::Connection, task: &Value) -> Result<Value, BusErr> {
    call_json(conn, TASKS, "SubmitTask", &(task.to_string(),)).await
}

fn wait_for_log(sup: &Supervisor, needle: &str, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = std::fs::read_to_string(sup.log_path()).unwrap_or_default();
        if log.matches(needle).count() >= count {
            return;
        }
        assert!(Instant::now() < deadline, "no {needle:?} in:\n{log}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reload_registers_and_removes_repositories_and_fails_the_orphaned_tasks() {
    let sup = Supervisor::start(Opts::default());
    let conn = sup.client().await;
    let drop_ins = airlock_config::drop_in_dir(&sup.config);
    std::fs::create_dir_all(&drop_ins).unwrap();
    let calc = airlock_config::Repository {
        name: "calc".into(),
        path: "/srv/airlock/calc.git".into(),
        description: None,
        environment: None,
        upstream: None,
        signing: None,
        drop_in: None,
    };

    // Not registered yet.
    let e = submit_json(&conn, &on_calc("task-reload-0"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::REPOSITORY_NOT_REGISTERED));

    // repo add writes the drop-in; a reload registers it.
    std::fs::write(
        drop_ins.join("calc.toml"),
        airlock_config::drop_in_text(&calc),
    )
    .unwrap();
    sighup(&sup);
    wait_for_log(&sup, "reloaded the registered repositories", 1);
    let ok = submit_json(&conn, &on_calc("task-reload-1")).await.unwrap();
    assert_eq!(ok["task"]["state"], "QUEUED");
    // The main file's repository is unaffected.
    submit(&conn, "task-reload-demo").await;

    // A broken drop-in: the reload is refused and nothing changes.
    std::fs::write(
        drop_ins.join("bad.toml"),
        "[[repository]]\nname = \"other\"\n",
    )
    .unwrap();
    sighup(&sup);
    wait_for_log(&sup, "reload refused, repositories unchanged", 1);
    assert_eq!(
        sup.store().get("task-reload-1").unwrap().state,
        airlock_proto::task::TaskState::Queued
    );
    std::fs::remove_file(drop_ins.join("bad.toml")).unwrap();

    // repo remove: the queued task fails with its code and stays listed.
    std::fs::remove_file(drop_ins.join("calc.toml")).unwrap();
    sighup(&sup);
    wait_for_log(&sup, "reloaded the registered repositories", 2);
    let deadline = Instant::now() + Duration::from_secs(10);
    let view = loop {
        let v = sup.store().get("task-reload-1").unwrap();
        if v.state != airlock_proto::task::TaskState::Queued || Instant::now() > deadline {
            break v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(view.state, airlock_proto::task::TaskState::Failed);
    assert_eq!(
        view.verification.unwrap()["reason"],
        Code::REPOSITORY_NOT_REGISTERED.as_str()
    );
    let shown: Value = call_json(&conn, TASKS, "GetTask", &("task-reload-1",))
        .await
        .unwrap();
    assert_eq!(shown["state"], "FAILED");
    // The other repository's task is untouched, and new tasks are refused.
    assert_eq!(
        sup.store().get("task-reload-demo").unwrap().state,
        airlock_proto::task::TaskState::Queued
    );
    let e = submit_json(&conn, &on_calc("task-reload-2"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::REPOSITORY_NOT_REGISTERED));
    // Still the same process: a reload is not a restart.
    assert!(
        std::fs::read_to_string(sup.log_path())
            .unwrap()
            .matches("ready:")
            .count()
            == 1
    );
}

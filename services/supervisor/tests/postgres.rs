//! The supervisor on a PostgreSQL task store (a throwaway cluster from
//! Debian's postgresql package): the password through the systemd
//! credential, the schema migrated by its owner, two supervisors on two
//! buses sharing one queue (one over the UNIX socket, one over TCP under
//! its lockdown), each turning the database's notifications into
//! TaskChanged on its own bus, and calls that fail closed while the
//! server is down and work again when it returns.

mod common;

use airlock_pgcluster::{Cluster, Options, StoreDatabase};
use airlock_proto::Code;
use common::*;
use futures_util::StreamExt;
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A directory laid out as systemd's `LoadCredential=` makes
/// `$CREDENTIALS_DIRECTORY`, holding the supervisors' password.
fn credentials(dir: &Path, password: &str) -> PathBuf {
    let creds = dir.join("credentials");
    std::fs::create_dir_all(&creds).unwrap();
    let file = creds.join("airlock-database-password");
    std::fs::write(&file, format!("{password}\n")).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o400)).unwrap();
    creds
}

fn opts(url: &str, creds: &Path) -> Opts {
    Opts {
        database: Some(url.to_owned()),
        env: vec![("CREDENTIALS_DIRECTORY".into(), creds.display().to_string())],
        ..Opts::default()
    }
}

/// Runs the supervisor binary with `args` and a minimal configuration
/// whose database is `url`; returns its exit code and output.
fn run_supervisor(dir: &Path, url: &str, args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let config = dir.join("once.toml");
    std::fs::write(
        &config,
        format!(
            "[supervisor]\ndatabase = \"{url}\"\nworker_user = \"nobody\"\n\n[worker]\nrenew_interval_seconds = 5\n"
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_airlock-supervisor"))
        .arg("--config")
        .arg(&config)
        .args(["--bus-address", "unix:path=/nonexistent/bus"])
        .args(args)
        .envs(env.iter().copied())
        .env("AIRLOCK_LOG", "info")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Migrates as the schema's owner with `airlock-supervisor --migrate`.
fn migrate(dir: &Path, db: &StoreDatabase) {
    let pw = dir.join("owner-password");
    std::fs::write(&pw, &db.owner_password).unwrap();
    let (code, out) = run_supervisor(
        dir,
        &db.owner_url,
        &[
            "--migrate",
            "--database-password-file",
            pw.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}");
    let latest = airlock_taskdb::tasks::postgres::latest_version();
    assert!(
        out.contains(&format!("schema at version {latest}")),
        "{out}"
    );
}

async fn changes(conn: &zbus::Connection) -> zbus::MessageStream {
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

/// Waits for TaskChanged(task, state, _) on `stream`.
async fn wait_change(stream: &mut zbus::MessageStream, task: &str, state: &str) -> i64 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let msg = tokio::time::timeout_at(deadline, stream.next())
            .await
            .unwrap_or_else(|_| panic!("no TaskChanged({task}, {state})"))
            .unwrap()
            .unwrap();
        let (t, s, rev): (String, String, i64) = msg.body().deserialize().unwrap();
        if t == task && s == state {
            return rev;
        }
    }
}

async fn get(conn: &zbus::Connection, task: &str) -> Result<Value, BusErr> {
    call_json(conn, TASKS, "GetTask", &(task,)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_supervisors_share_one_queue_on_postgresql() {
    // The harness's PostgreSQL client blocks: off the async runtime.
    let (cluster, db) = tokio::task::block_in_place(|| {
        let cluster = Cluster::start_with(Options { tcp: true }).unwrap();
        let db = cluster.create_store_database("airlock").unwrap();
        (cluster, db)
    });
    let dir = tempfile::tempdir().unwrap();
    let creds = credentials(dir.path(), &db.password);

    // Before the owner migrates, the supervisors' role may not create the
    // schema: the supervisor refuses to start, and says what to run.
    let (code, out) = run_supervisor(
        dir.path(),
        &db.url,
        &[],
        &[("CREDENTIALS_DIRECTORY", creds.to_str().unwrap())],
    );
    assert_eq!(
        code,
        i32::from(Code::SCHEMA_VERSION_UNSUPPORTED.exit_code()),
        "{out}"
    );
    assert!(
        out.contains("SCHEMA_VERSION_UNSUPPORTED") && out.contains("--migrate"),
        "{out}"
    );
    migrate(dir.path(), &db);

    // Host A over the UNIX socket, host B over TCP (its lockdown allows IP
    // sockets and TCP connect to the database's port only).
    let a = Supervisor::start(opts(&db.url, &creds));
    let b = Supervisor::start(opts(&cluster.tcp_url(&db.role, &db.name), &creds));
    let b_log = std::fs::read_to_string(b.log_path()).unwrap();
    assert!(
        b_log.contains(&format!("TCP connect to ports [{}]", cluster.port())),
        "{b_log}"
    );
    let ca = a.client().await;
    let cb = b.client().await;
    let mut on_a = changes(&ca).await;
    let mut on_b = changes(&cb).await;
    // TaskChanged goes to connections that read (it is never broadcast):
    // each listener reads once, as a client following tasks does.
    for c in [&ca, &cb] {
        call_json(c, TASKS, "ListTasks", &("", "", 0u32))
            .await
            .unwrap();
    }

    // Submitted on A: B's bus hears of it (the database's NOTIFY), and B's
    // worker claims it.
    submit(&ca, "pg-a").await;
    if std::env::var_os("AIRLOCK_TEST_SHOW_LOGS").is_some() {
        tokio::time::sleep(Duration::from_secs(3)).await;
        eprintln!("{}", std::fs::read_to_string(b.log_path()).unwrap());
    }
    assert_eq!(wait_change(&mut on_b, "pg-a", "QUEUED").await, 1);
    let grant = worker_claim(&b);
    assert_eq!(grant["task_id"], "pg-a");
    assert_eq!(get(&ca, "pg-a").await.unwrap()["state"], "RUNNING");
    assert_eq!(wait_change(&mut on_a, "pg-a", "RUNNING").await, 2);
    // Nothing else to claim on either host.
    assert!(worker_claim(&a).is_null());

    // B's worker reports; A sees the result and decides.
    let result = passed_result(&grant);
    let receipt = worker_submit(&b, WORKER_UID, &grant, 1, &result).unwrap();
    assert_eq!(receipt["task"]["state"], "VERIFYING");
    wait_change(&mut on_a, "pg-a", "VERIFYING").await;
    let v = get(&ca, "pg-a").await.unwrap();
    assert_eq!(v["result"], result);

    // The same lease presented again through the other host is the same
    // idempotent result; a fenced-off epoch is refused with its code.
    let again = worker_submit(&a, WORKER_UID, &grant, 1, &result).unwrap();
    assert_eq!(again["idempotent"], true);
    // (busctl shows the message of TASK_STATE_INVALID, not its name.)
    let stale = worker_renew(&a, WORKER_UID, &grant, 1).unwrap_err();
    assert!(
        stale.contains("not allowed while the task is VERIFYING"),
        "{stale}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_fail_closed_while_postgresql_is_down_and_work_resumes() {
    let (mut cluster, db) = tokio::task::block_in_place(|| {
        let cluster = Cluster::start().unwrap();
        let db = cluster.create_store_database("airlock").unwrap();
        (cluster, db)
    });
    let dir = tempfile::tempdir().unwrap();
    let creds = credentials(dir.path(), &db.password);
    migrate(dir.path(), &db);
    let a = Supervisor::start(opts(&db.url, &creds));
    let conn = a.client().await;
    submit(&conn, "before").await;

    tokio::task::block_in_place(|| cluster.crash());
    // Every call fails with the store-unavailable code; nothing is written.
    for (method, arg) in [
        ("GetTask", "before".to_owned()),
        ("SubmitTask", submission("during").to_string()),
    ] {
        let err = call_json(&conn, TASKS, method, &(arg,)).await.unwrap_err();
        assert_eq!(
            err.code(),
            Some(Code::STORE_UNAVAILABLE),
            "{method}: {err:?}"
        );
    }
    // (busctl shows the message of STORE_UNAVAILABLE, not its name.)
    let claim = busctl_call(&a, WORKER_UID, WORKER, "Claim", &[]).unwrap_err();
    assert!(claim.contains("error connecting to server"), "{claim}");

    // The server returns: the same supervisor serves again, without a
    // restart; the refused submission did not happen; the queue is whole.
    tokio::task::block_in_place(|| cluster.start_again()).unwrap();
    let v = match get(&conn, "before").await {
        Ok(v) => v,
        Err(e) => panic!(
            "{e:?}\n{:?}\n{}",
            std::fs::read_dir(cluster.socket_dir())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect::<Vec<_>>(),
            cluster.log_tail(30)
        ),
    };
    assert_eq!(v["state"], "QUEUED");
    assert_eq!(
        get(&conn, "during").await.unwrap_err().code(),
        Some(Code::TASK_NOT_FOUND)
    );
    submit(&conn, "during").await;
    let grant = worker_claim(&a);
    assert_eq!(grant["task_id"], "before");
}

#[test]
fn plaintext_beyond_loopback_and_a_missing_ca_file_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    // 192.0.2.1 (TEST-NET-1) is never connected to: the refusal comes first.
    let started = std::time::Instant::now();
    let (code, out) = run_supervisor(
        dir.path(),
        "postgresql://airlock@192.0.2.1:5432/airlock",
        &["--check-config"],
        &[],
    );
    assert_eq!(code, i32::from(Code::CONFIG_INVALID.exit_code()), "{out}");
    assert!(
        out.contains("without TLS") && out.contains("supervisor.database_allow_plaintext = true"),
        "{out}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    // verify-full reads the configured CA file at start.
    let config = dir.path().join("tls.toml");
    std::fs::write(
        &config,
        format!(
            "[supervisor]\ndatabase = \"postgresql://airlock@localhost:1/airlock?sslmode=verify-full\"\n\
             database_ca_file = \"{}/missing-ca.pem\"\nworker_user = \"nobody\"\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_airlock-supervisor"))
        .arg("--config")
        .arg(&config)
        .args([
            "--bus-address",
            "unix:path=/nonexistent/bus",
            "--check-config",
        ])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        out.status.code(),
        Some(i32::from(Code::CONFIG_INVALID.exit_code())),
        "{text}"
    );
    assert!(text.contains("missing-ca.pem"), "{text}");
}

#[test]
fn a_password_in_the_url_and_an_unreachable_database_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let (code, out) = run_supervisor(
        dir.path(),
        "postgresql://airlock:secret@127.0.0.1:1/airlock",
        &[],
        &[],
    );
    assert_eq!(code, i32::from(Code::CONFIG_INVALID.exit_code()), "{out}");
    assert!(
        !out.contains("secret"),
        "the password must not be echoed: {out}"
    );
    let (code, out) = run_supervisor(
        dir.path(),
        "postgresql://airlock@127.0.0.1:1/airlock",
        &[],
        &[],
    );
    assert_eq!(
        code,
        i32::from(Code::STORE_UNAVAILABLE.exit_code()),
        "{out}"
    );
    assert!(out.contains("STORE_UNAVAILABLE"), "{out}");
}

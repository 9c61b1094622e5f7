//! The client library against a real bus on which the supervisor is not
//! there, or not the version it speaks.
//!
//! - With no supervisor on the bus (never started, or killed after the
//!   client connected), every call answers `RUNTIME_UNAVAILABLE` — seed
//!   001's 503, exit status 9 in airlockctl — at once, not after the call's
//!   time limit, and never a bus library error.
//! - A supervisor more than one minor version ahead of the client is
//!   refused with `PROTOCOL_VERSION_MISMATCH` naming both versions (seed
//!   002: a client may lag one minor, never a major); one minor ahead is
//!   accepted. No supervisor of another version can be built here, so a
//!   stand-in owns the supervisor's name and shows only the
//!   `ProtocolVersion` property: the injected fault is the version.

use airlock_client::Supervisor;
use airlock_localbus::{PrivateBus, SupervisorProcess, sibling_binary};
use airlock_proto::Code;
use airlock_proto::bus::{BUS_NAME, OBJECT_PATH, PROTOCOL_VERSION, protocol_string};
use std::time::{Duration, Instant};

/// Calls of every kind a client makes: a read, a listing, a property
/// (the protocol check, made once per client, is asked apart).
async fn every_kind_of_call(sup: &Supervisor) -> Vec<(&'static str, airlock_proto::Error)> {
    vec![
        (
            "GetTask",
            sup.get_task("task-1").await.expect_err("no supervisor"),
        ),
        (
            "ListTasks",
            sup.list_tasks("", "", 1).await.expect_err("no supervisor"),
        ),
        (
            "Version",
            sup.property::<String>("Version")
                .await
                .expect_err("no supervisor"),
        ),
    ]
}

fn all_unavailable(calls: &[(&str, airlock_proto::Error)]) {
    for (what, e) in calls {
        assert_eq!(e.code, Code::RUNTIME_UNAVAILABLE, "{what}: {e}");
        assert_eq!(e.code.http_status(), 503, "seed 001's status");
    }
}

#[tokio::test]
async fn a_call_with_no_supervisor_on_the_bus_is_runtime_unavailable() {
    let bus = PrivateBus::start().expect("dbus-daemon");
    // Connecting reaches the bus, not the supervisor: it works.
    let sup = Supervisor::connect(Some(bus.address()))
        .await
        .expect("the bus answers")
        .with_timeout(Duration::from_secs(20));
    let started = Instant::now();
    let mut calls = every_kind_of_call(&sup).await;
    calls.push((
        "the protocol check",
        sup.check_protocol().await.expect_err("no supervisor"),
    ));
    all_unavailable(&calls);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "refused at once, not at the time limit: {:?}",
        started.elapsed()
    );
    assert_eq!(sup.owner().await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_after_the_supervisor_died_is_runtime_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("airlock.toml");
    std::fs::write(&config, "").unwrap();
    let bus = PrivateBus::start().expect("dbus-daemon");
    let binary = sibling_binary("airlock-supervisor")
        .expect("airlock-supervisor beside the test binary: cargo build --workspace --bins first");
    let db = dir.path().join("tasks.sqlite3");
    // It waits for its name on a runtime of its own: off this one.
    let process = std::thread::scope(|s| {
        s.spawn(|| SupervisorProcess::start(&binary, &bus, &config, &db, &[]))
            .join()
            .unwrap()
    })
    .expect("the supervisor starts");
    let sup = Supervisor::connect(Some(bus.address()))
        .await
        .unwrap()
        .with_timeout(Duration::from_secs(20));
    // It answers while it runs (the protocol check passes, once).
    assert!(sup.list_tasks("", "", 1).await.is_ok());
    drop(process); // SIGKILL, then reaped
    let started = Instant::now();
    all_unavailable(&every_kind_of_call(&sup).await);
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// A stand-in that owns the supervisor's name and shows one property.
struct Version(String);

#[zbus::interface(name = "org.airlock.Tasks2")]
impl Version {
    #[zbus(property)]
    fn protocol_version(&self) -> String {
        self.0.clone()
    }
}

async fn stand_in(bus: &PrivateBus, version: (u32, u32)) -> zbus::Connection {
    zbus::connection::Builder::address(bus.address())
        .unwrap()
        .name(BUS_NAME)
        .unwrap()
        .serve_at(OBJECT_PATH, Version(protocol_string(version)))
        .unwrap()
        .build()
        .await
        .expect("the stand-in takes the supervisor's name")
}

#[tokio::test]
async fn a_client_more_than_one_minor_behind_is_refused_naming_both() {
    let (major, minor) = PROTOCOL_VERSION;
    // One minor ahead of the client: accepted.
    {
        let bus = PrivateBus::start().expect("dbus-daemon");
        let _server = stand_in(&bus, (major, minor + 1)).await;
        let sup = Supervisor::connect(Some(bus.address())).await.unwrap();
        sup.check_protocol()
            .await
            .expect("a client one minor behind works");
    }
    // Two and five minors ahead, and the next major: refused by name.
    for server in [(major, minor + 2), (major, minor + 5), (major + 1, 0)] {
        let bus = PrivateBus::start().expect("dbus-daemon");
        let _server = stand_in(&bus, server).await;
        let sup = Supervisor::connect(Some(bus.address())).await.unwrap();
        let e = sup.check_protocol().await.unwrap_err();
        assert_eq!(e.code, Code::PROTOCOL_VERSION_MISMATCH, "{e}");
        let text = e.to_string();
        assert!(
            text.contains(&protocol_string(PROTOCOL_VERSION))
                && text.contains(&protocol_string(server)),
            "{text}"
        );
        // A call is refused the same way, before it is sent.
        let e = sup.get_task("task-1").await.unwrap_err();
        assert_eq!(e.code, Code::PROTOCOL_VERSION_MISMATCH, "{e}");
    }
}

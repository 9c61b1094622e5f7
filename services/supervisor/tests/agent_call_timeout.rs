//! The agent driver's call timeout comes from the configuration
//! (`supervisor.agent_call_timeout_seconds`; seed 000: every driver call is
//! raced against the call timeout, and one not answered in time is a
//! failure whose late answer is ignored).
//!
//! The real supervisor binary reads a configuration with a 2 s timeout and
//! one agent driven through `org.airlock.AgentHost1` (the driver airlock-local
//! serves), on a private bus where a stand-in host takes every `Start` and
//! never answers it: the injected fault is the hang. The agent's record
//! must show the failure as the configured timeout names it, about 2 s after
//! the first start (the default, 10 s, would take five times as long).

use airlock_localbus::{PrivateBus, SupervisorProcess, sibling_binary};
use airlock_proto::bus::agent_host;
use std::time::{Duration, Instant};

/// An agent host whose `Start` never answers.
struct Hanging;

#[zbus::interface(name = "org.airlock.AgentHost1")]
impl Hanging {
    async fn start(&self, _name: String) -> u32 {
        std::future::pending::<u32>().await
    }

    async fn probe(&self, _name: String) -> String {
        std::future::pending::<String>().await
    }

    async fn stop(&self, _name: String) {}
}

const CONFIG: &str = r#"
[supervisor]
agent_driver = "local-host"
agent_call_timeout_seconds = 2

[[repository]]
name = "r"
path = "/srv/git/r.git"

[[agent]]
name = "planner"
command = ["/usr/bin/true"]
repositories = ["r"]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_call_is_bounded_by_the_configured_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("agent-host.conf");
    std::fs::write(&policy, airlock_agents::host::bus_policy("root", "root")).unwrap();
    let bus = PrivateBus::start_with("root", &[policy.as_path()]).expect("dbus-daemon");
    let _host = zbus::connection::Builder::address(bus.address())
        .unwrap()
        .name(agent_host::BUS_NAME)
        .unwrap()
        .serve_at(agent_host::OBJECT_PATH, Hanging)
        .unwrap()
        .build()
        .await
        .expect("the stand-in host takes its name");
    let config = dir.path().join("airlock.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let started = Instant::now();
    let binary =
        sibling_binary("airlock-supervisor").expect("cargo build --workspace --bins first");
    let db = dir.path().join("tasks.sqlite3");
    // It waits for its name on a runtime of its own: off this one.
    let _supervisor = std::thread::scope(|s| {
        s.spawn(|| SupervisorProcess::start(&binary, &bus, &config, &db, &[]))
            .join()
            .unwrap()
    })
    .expect("the supervisor starts with the key");
    let sup = airlock_client::Supervisor::connect(Some(bus.address()))
        .await
        .unwrap();
    let mut seen = None;
    let failure = loop {
        let agent = sup.get_agent("planner").await.unwrap();
        if let Some(f) = agent
            .last_failure
            .clone()
            .filter(|_| agent.consecutive_failures >= 1)
        {
            break f;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "no failure within 15 s: {seen:?}"
        );
        seen = Some(agent);
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let took = started.elapsed();
    assert_eq!(failure, "start not answered within 2000 ms");
    assert!(
        took < Duration::from_secs(8),
        "the first start failed after {took:?}: the configured 2 s bound it"
    );
    println!(
        "a hung Start failed at the configured 2 s bound ({took:?} after the supervisor started)"
    );
}

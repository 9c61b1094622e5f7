//! `airlockctl agent …` against a real supervisor (in-process) whose agents
//! a real AgentHost1 runs as real processes, on a private bus: list, show,
//! stop, start, clear-hold, with tables and `--json`; a held agent's start
//! is refused with AGENTOS_CRASH_LOOP's exit code; an admin without
//! org.airlock.agents.manage is refused.

use std::process::{Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use airlock_agents::host::{AgentHost, bus_policy, serve};
use airlock_agents::process::{Identity, ProcessDriver};
use airlock_localbus::PrivateBus;
use airlock_proto::Code;
use airlock_supervisor::authz::Action;
use airlock_supervisor::authz::testing::TestAuthorizer;
use airlock_supervisor::daemon::AuthorizerChoice;
use airlock_testkit::{InProcess, poll_async};
use serde_json::Value;

const AGENTS: &str = r#"
[[repository]]
name = "demo"
path = "/srv/git/demo.git"

[[agent]]
name = "exits"
command = ["/bin/sh", "-c", "exit 1"]
repositories = ["demo"]

[[agent]]
name = "sleeper"
command = ["/bin/sh", "-c", "exec sleep 600"]
repositories = ["demo"]
"#;

async fn ctl(address: &str, args: &[&str]) -> Output {
    tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_airlockctl"))
            .args(args)
            .env("DBUS_SYSTEM_BUS_ADDRESS", address)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .output(),
    )
    .await
    .expect("airlockctl finished")
    .unwrap()
}

fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)))
}

async fn state(address: &str, name: &str) -> Value {
    let o = ctl(address, &["agent", "show", name, "--json"]).await;
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    json(&o)
}

async fn wait_for(address: &str, name: &str, wanted: &str) -> Value {
    poll_async(
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            let v = state(address, name).await;
            if v["state"] == wanted {
                Ok(v)
            } else {
                Err(format!("{name} never {wanted}: {v}"))
            }
        },
    )
    .await
}

/// The supervisor in-process on `bus`, running [`AGENTS`] through
/// whatever agent host serves there.
async fn supervisor(bus: PrivateBus, authorizer: TestAuthorizer) -> InProcess {
    let config = airlock_config::Config::parse(AGENTS, std::path::Path::new("t.toml")).unwrap();
    InProcess::builder(AuthorizerChoice::ForTests(authorizer))
        .worker_uid(65534)
        .retry_uid(65534)
        .sweep_interval(Duration::from_secs(5))
        .agents(
            config.agents,
            airlock_agents::Options {
                probe_interval: Duration::from_millis(50),
                ..airlock_agents::Options::default()
            },
        )
        .start_on(bus)
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_commands_end_to_end_with_tables_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("org.airlock.AgentHost1.conf");
    std::fs::write(&policy, bus_policy("root", "root")).unwrap();
    let bus = PrivateBus::start_with("root", &[policy.as_path()]).unwrap();
    let config = airlock_config::Config::parse(AGENTS, std::path::Path::new("t.toml")).unwrap();
    let host = bus.connect().await.unwrap();
    let identity = Identity::lookup("airlock-agent")
        .or_else(|_| Identity::lookup("nobody"))
        .unwrap();
    let driver = ProcessDriver::new(Some(identity), dir.path().join("agents"), Vec::new())
        .unwrap()
        .with_grace(Duration::from_millis(300));
    serve(&host, AgentHost::new(Arc::new(driver), config.agents, 0))
        .await
        .unwrap();
    let sup = supervisor(bus, TestAuthorizer::allow_all()).await;
    let addr = sup.address();

    let held = wait_for(addr, "exits", "HELD").await;
    assert_eq!(held["consecutive_failures"], 5);
    assert_eq!(held["last_exit_status"], 1);
    wait_for(addr, "sleeper", "RUNNING").await;

    let o = ctl(addr, &["agent", "list"]).await;
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success());
    assert!(out.starts_with("NAME"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("exits") && l.contains("HELD") && l.contains("demo")),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("sleeper") && l.contains("RUNNING")),
        "{out}"
    );
    let list = json(&ctl(addr, &["agent", "list", "--json"]).await);
    assert_eq!(list["agents"].as_array().unwrap().len(), 2);

    let o = ctl(addr, &["agent", "show", "exits"]).await;
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("HELD") && out.contains("AGENTOS_CRASH_LOOP") && out.contains("exit status 1"),
        "{out}"
    );

    // a held agent's start: refused, with the code's exit status
    let o = ctl(addr, &["agent", "start", "exits"]).await;
    assert_eq!(
        o.status.code(),
        Some(i32::from(Code::AGENTOS_CRASH_LOOP.exit_code()))
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("AGENTOS_CRASH_LOOP"));
    let o = ctl(addr, &["agent", "show", "nope"]).await;
    assert_eq!(
        o.status.code(),
        Some(i32::from(Code::AGENT_NOT_FOUND.exit_code()))
    );

    // stop; its queue cancelled with one command (nothing queued here);
    // then start, and a running agent's queue is not cancelled
    let o = ctl(addr, &["agent", "stop", "sleeper", "--json"]).await;
    assert_eq!(json(&o)["state"], "STOPPED");
    let o = ctl(
        addr,
        &[
            "agent",
            "cancel-queued",
            "sleeper",
            "--reason",
            "testing",
            "--json",
        ],
    )
    .await;
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let cancelled = json(&o);
    assert_eq!(cancelled["name"], "sleeper");
    assert_eq!(cancelled["cancelled"], serde_json::json!([]));
    let o = ctl(addr, &["agent", "start", "sleeper"]).await;
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("Started: sleeper"));
    wait_for(addr, "sleeper", "RUNNING").await;
    let o = ctl(
        addr,
        &["agent", "cancel-queued", "sleeper", "--reason", "testing"],
    )
    .await;
    assert_eq!(
        o.status.code(),
        Some(i32::from(Code::AGENT_RUNNING.exit_code())),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("AGENT_RUNNING"));

    // clear-hold: the count resets and it starts (and fails again)
    let o = ctl(addr, &["agent", "clear-hold", "exits", "--json"]).await;
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(json(&o)["consecutive_failures"].as_u64().unwrap() <= 1);

    sup.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn managing_agents_needs_its_own_permission() {
    let bus = PrivateBus::start().unwrap();
    // may read tasks and agents, manage tasks, but not manage agents
    let authorizer = TestAuthorizer::allowing([Action::Read, Action::Manage, Action::AgentsRead]);
    // no host: agents only in the configuration, driver calls fail
    let sup = supervisor(bus, authorizer).await;
    let addr = sup.address();
    let o = ctl(addr, &["agent", "list", "--json"]).await;
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for verb in ["start", "stop", "clear-hold"] {
        let o = ctl(addr, &["--no-ask-password", "agent", verb, "sleeper"]).await;
        assert_eq!(
            o.status.code(),
            Some(i32::from(Code::AUTHORIZATION_DENIED.exit_code())),
            "{verb}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    sup.stop().await;
}

//! Planner agents under airlock-local, the whole suite as separate
//! processes: a healthy example agent (`examples/propose-once.sh`) proposes
//! a change through the front door (`airlockctl propose`) and it ends
//! SUCCEEDED, attributed to the agent; a crash-looping agent is held after
//! 5 failures; stopping the suite leaves no agent process behind.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

const FIX: &str = "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n";

fn agent(name: &str, command: &[String]) -> airlock_config::Agent {
    let argv: Vec<String> = command.iter().map(|a| format!("{a:?}")).collect();
    let text = format!(
        "[[agent]]\nname = \"{name}\"\ncommand = [{}]\nrepositories = [\"demo\"]\n",
        argv.join(", ")
    );
    airlock_config::Config::parse(&text, Path::new("agents.toml"))
        .unwrap()
        .agents
        .remove(0)
}

/// Processes whose command line contains `needle`, with their pids.
fn processes_with(needle: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let zombie = stat
            .rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('Z'));
        if !zombie && String::from_utf8_lossy(&cmdline).contains(needle) {
            out.push(pid);
        }
    }
    out
}

fn ctl(bus: &str, args: &[&str]) -> std::process::Output {
    airlock_testkit::airlockctl(&airlock_local::sibling("airlockctl").unwrap(), bus, args)
}

fn agent_state(bus: &str, name: &str) -> Value {
    let o = ctl(bus, &["--json", "agent", "show", name]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn a_healthy_agent_proposes_through_the_front_door_and_a_crash_loop_is_held() {
    // Files every component user can read: the agent script, the patch.
    let scratch = tempfile::Builder::new()
        .prefix("airlock-agents-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(scratch.path(), PermissionsExt::from_mode(0o755)).unwrap();
    let script = scratch.path().join("propose-once.sh");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/propose-once.sh"),
        &script,
    )
    .unwrap();
    std::fs::set_permissions(&script, PermissionsExt::from_mode(0o755)).unwrap();
    let patch = scratch.path().join("fix.patch");
    std::fs::write(&patch, FIX).unwrap();
    std::fs::set_permissions(&patch, PermissionsExt::from_mode(0o644)).unwrap();

    let state = tempfile::Builder::new()
        .prefix("airlock-local-agents-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(state.path(), PermissionsExt::from_mode(0o755)).unwrap();
    let root: PathBuf = state.path().join("state");
    let config = root.join("airlock.toml");
    let ctl_bin = airlock_local::sibling("airlockctl").unwrap();
    let s = |p: &Path| p.display().to_string();
    let marker = format!("{}-crasher", std::process::id());
    let tuning = airlock_local::Tuning {
        agents: vec![
            agent(
                "planner",
                &[
                    "/bin/sh".into(),
                    s(&script),
                    s(&ctl_bin),
                    s(&config),
                    "demo".into(),
                    s(&patch),
                    "python3 -m py_compile calc.py".into(),
                ],
            ),
            agent(
                "crasher",
                &[
                    "/bin/sh".into(),
                    "-c".into(),
                    format!("echo {marker}; exit 1"),
                ],
            ),
        ],
        ..Default::default()
    };
    let suite = airlock_local::start_with(root.clone(), true, &tuning).expect("the suite starts");
    let bus = suite.bus.address().to_owned();

    // The planner's proposal ends SUCCEEDED (its JSON is in its log).
    let log = root.join("agents/planner.log");
    let deadline = Instant::now() + Duration::from_secs(180);
    let outcome: Value = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let done = text
            .lines()
            .filter(|l| l.starts_with('{'))
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["state"] == "SUCCEEDED" || v["state"] == "FAILED")
            .find(|v| !v["result"].is_null());
        if let Some(v) = done {
            break v;
        }
        assert!(
            Instant::now() < deadline,
            "no outcome from the planner:\n{text}\n{}",
            std::fs::read_to_string(root.join("logs/supervisor.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(outcome["state"], "SUCCEEDED", "{outcome}");
    let task_id = outcome["task_id"].as_str().unwrap().to_owned();
    assert_eq!(
        outcome["result"]["commit_oid"].as_str().map(str::len),
        Some(40),
        "{outcome}"
    );

    // … attributed to the agent, and the agent still runs.
    let o = ctl(&bus, &["--json", "events", &task_id]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("agent:planner "), "{text}");
    assert_eq!(agent_state(&bus, "planner")["state"], "RUNNING");

    // The crash loop is held.
    let deadline = Instant::now() + Duration::from_secs(60);
    let held = loop {
        let v = agent_state(&bus, "crasher");
        if v["state"] == "HELD" {
            break v;
        }
        assert!(Instant::now() < deadline, "crasher never held: {v}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(held["consecutive_failures"], 5);
    assert_eq!(held["last_exit_status"], 1);
    let starts = std::fs::read_to_string(root.join("agents/crasher.log"))
        .unwrap()
        .matches(&marker)
        .count();
    assert_eq!(starts, 5, "five starts, no sixth");

    // Stopping the suite stops the agents: no agent process is left.
    // (the planner exec'd `sleep 2147483647` after its proposal)
    assert_eq!(processes_with("2147483647").len(), 1);
    drop(suite);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        processes_with("2147483647").is_empty(),
        "{:?}",
        processes_with("2147483647")
    );
    assert!(processes_with(&marker).is_empty());
}

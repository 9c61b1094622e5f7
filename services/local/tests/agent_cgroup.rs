//! Issue 41 item 6: under airlock-local an agent's child started with
//! `setsid` left the agent's session, and with it everything that told it
//! apart: it submitted for a repository outside the agent's list as a
//! plain planner, kept doing so after the agent was revoked, and outlived
//! the stack. Each agent now runs in a cgroup of its own that airlock-local
//! makes. The whole suite as separate processes, real uids (as root): the
//! agent's `setsid` child proposes for a repository outside the agent's
//! list and is refused as the agent (AGENT_REPOSITORY_DENIED); a
//! revocation (`airlockctl agent stop`) stops it too; so does the stack's
//! end, which leaves no process and no cgroup behind.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const FIX: &str = "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n";

/// The agent: its child leaves the session (`setsid`), proposes for
/// `other` (not one of the agent's repositories), says how that ended and
/// sleeps as MARKER+1; the agent itself sleeps as MARKER.
const SCRIPT: &str = r#"#!/bin/sh
# Arguments: AIRLOCKCTL CONFIG PATCH MARKER
setsid /bin/sh -c '
  "$1" --json --no-ask-password propose --config "$2" --repo other --base main \
      --patch "$3" --verify "python3 -m py_compile calc.py" --max-attempts 1
  echo "escaped-exit=$?"
  exec sleep "$4"
' escaped "$1" "$2" "$3" "$(($4 + 1))" &
exec sleep "$4"
"#;

/// Processes (not zombies) whose command line contains `needle`.
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

fn wait_for(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn ctl(bus: &str, args: &[&str]) -> std::process::Output {
    airlock_testkit::airlockctl(&airlock_local::sibling("airlockctl").unwrap(), bus, args)
}

/// The agent's cgroup as the kernel reports it for `pid`: the directory
/// under the hierarchy's mount.
fn agent_cgroup_of(pid: u32) -> PathBuf {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let line = airlock_agents::cgroup::agent_line(&text, "planner")
        .unwrap_or_else(|| panic!("{pid} is in no agent cgroup:\n{text}"));
    let path = line.splitn(3, ':').nth(2).unwrap().trim_start_matches('/');
    let mount = if line.starts_with("0::") {
        ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
            .into_iter()
            .map(|m| Path::new(m).join(path))
            .find(|p| p.exists())
            .unwrap()
    } else {
        Path::new("/sys/fs/cgroup/pids").join(path)
    };
    assert!(mount.is_dir(), "{}", mount.display());
    mount
}

#[test]
fn an_agents_setsid_child_is_still_the_agent_and_is_stopped_with_it() {
    assert!(
        nix::unistd::Uid::effective().is_root(),
        "an_agents_setsid_child_is_still_the_agent_and_is_stopped_with_it needs root (cgroups, one uid per component); CI runs the tests as root: run this one as root (sudo), it fails rather than pass without checking"
    );
    let scratch = tempfile::Builder::new()
        .prefix("airlock-agent-cgroup-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(scratch.path(), PermissionsExt::from_mode(0o755)).unwrap();
    let script = scratch.path().join("escape.sh");
    std::fs::write(&script, SCRIPT).unwrap();
    std::fs::set_permissions(&script, PermissionsExt::from_mode(0o755)).unwrap();
    let patch = scratch.path().join("fix.patch");
    std::fs::write(&patch, FIX).unwrap();
    std::fs::set_permissions(&patch, PermissionsExt::from_mode(0o644)).unwrap();
    // `other`: registered, not one of the agent's repositories.
    let other = scratch.path().join("other");
    std::fs::create_dir(&other).unwrap();
    airlock_testkit::git(&other, &["init", "-q", "-b", "main"]);
    std::fs::write(other.join("calc.py"), "def add(a, b):\n    return a - b\n").unwrap();
    airlock_testkit::git(&other, &["add", "-A"]);
    airlock_testkit::git(&other, &["commit", "-q", "-m", "base"]);

    let root = scratch.path().join("state");
    let config = root.join("airlock.toml");
    let marker = 2_000_000_000 + std::process::id() * 2 % 100_000_000;
    let (agent_marker, child_marker) = (marker.to_string(), (marker + 1).to_string());
    let s = |p: &Path| format!("{:?}", p.display().to_string());
    let text = format!(
        "[[agent]]\nname = \"planner\"\ncommand = [\"/bin/sh\", {}, {}, {}, {}, \"{marker}\"]\nrepositories = [\"demo\"]\n",
        s(&script),
        s(&airlock_local::sibling("airlockctl").unwrap()),
        s(&config),
        s(&patch),
    );
    let agents = airlock_config::Config::parse(&text, Path::new("agents.toml"))
        .unwrap()
        .agents;
    let tuning = airlock_local::Tuning {
        repositories: vec![("other".into(), other.clone())],
        agents,
        ..Default::default()
    };
    let suite = airlock_local::start_with(root.clone(), true, &tuning).expect("the suite starts");
    let bus = suite.bus.address().to_owned();
    let log = root.join("agents/planner.log");
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let supervisor_log =
        || std::fs::read_to_string(root.join("logs/supervisor.log")).unwrap_or_default();

    // 1. The escaped child is the agent: refused for `other`.
    wait_for(
        &format!("the child never finished its proposal:\n{}", read_log()),
        Duration::from_secs(120),
        || read_log().contains("escaped-exit="),
    );
    let text = read_log();
    assert!(
        text.contains("AGENT_REPOSITORY_DENIED") && !text.contains("escaped-exit=0"),
        "the setsid child proposed for `other` as a plain planner:\n{text}\n{}",
        supervisor_log()
    );
    let child = processes_with(&child_marker);
    assert_eq!(child.len(), 1, "{child:?}");
    let cgroup = agent_cgroup_of(child[0]);
    assert_eq!(processes_with(&agent_marker).len(), 1);

    // 2. A revocation stops it with the agent.
    let o = ctl(&bus, &["agent", "stop", "planner"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    wait_for(
        &format!(
            "processes left after `agent stop`: agent {:?}, child {:?}",
            processes_with(&agent_marker),
            processes_with(&child_marker)
        ),
        Duration::from_secs(20),
        || processes_with(&agent_marker).is_empty() && processes_with(&child_marker).is_empty(),
    );
    assert!(
        !cgroup.exists(),
        "{} is left after the stop",
        cgroup.display()
    );

    // 3. Started again, its child escapes again; the stack's end stops it.
    let o = ctl(&bus, &["agent", "start", "planner"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    wait_for(
        &format!("the agent did not run again:\n{}", read_log()),
        Duration::from_secs(120),
        || {
            read_log().matches("escaped-exit=").count() == 2
                && processes_with(&child_marker).len() == 1
        },
    );
    assert!(!read_log().contains("escaped-exit=0"), "{}", read_log());
    let cgroup = agent_cgroup_of(processes_with(&child_marker)[0]);
    let stack = cgroup.parent().unwrap().to_path_buf();
    drop(suite);
    wait_for(
        &format!(
            "processes left after the stack stopped: agent {:?}, child {:?}",
            processes_with(&agent_marker),
            processes_with(&child_marker)
        ),
        Duration::from_secs(10),
        || processes_with(&agent_marker).is_empty() && processes_with(&child_marker).is_empty(),
    );
    assert!(
        !stack.exists(),
        "{} is left after the stack stopped",
        stack.display()
    );
}

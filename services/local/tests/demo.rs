//! The README's main job, end to end: `airlock-local demo --json` runs the
//! real supervisor, worker, executor and retry API as separate processes
//! and must carry the sample task to a verified commit.

use serde_json::Value;
use std::process::Command;

#[test]
fn demo_reaches_succeeded_with_a_verified_commit_on_its_agent_branch() {
    let out = Command::new(env!("CARGO_BIN_EXE_airlock-local"))
        .args(["demo", "--json"])
        .output()
        .expect("airlock-local runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    assert_eq!(v["state"], "SUCCEEDED", "{v}");
    let commit = v["commit_oid"].as_str().expect("a commit");
    assert_eq!(commit.len(), 40);
    assert_eq!(
        v["branch_head"].as_str(),
        Some(commit),
        "the agent/ branch points at the governed commit"
    );
    assert!(
        v["target_branch"]
            .as_str()
            .unwrap()
            .starts_with("agent/demo-")
    );
    assert!(v["diffstat"].as_str().unwrap().contains("calc.py"));
    let evidence = v["verification"].as_array().expect("evidence");
    assert_eq!(evidence.len(), 2);
    assert!(
        evidence
            .iter()
            .all(|c| c["exit_code"] == 0 && c["timed_out"] == false),
        "{v}"
    );
    assert_eq!(
        v["transitions"].as_array().unwrap().last().unwrap(),
        "SUCCEEDED"
    );
    if nix_is_root() {
        assert_eq!(
            v["privilege_separation"], true,
            "as root every component runs as its own uid"
        );
        // The isolation evidence that let auto_accept take it: Landlock in
        // full, seccomp, a known view, and a uid that is not root's.
        let iso = &v["isolation"];
        assert_eq!(iso["landlock"], "full", "{iso}");
        assert_eq!(iso["seccomp"], "enforced", "{iso}");
        assert!(iso["uid"].as_u64().is_some_and(|u| u != 0), "{iso}");
    }
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

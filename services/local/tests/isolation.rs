//! Isolation evidence end to end: every result carries how its commands
//! were confined, and auto_accept (on in airlock-local) accepts only what
//! ran fully confined. A stack whose executor demands a Landlock ABI above
//! the kernel's and may run degraded (`[executor] landlock_min_abi = 10`,
//! `allow_degraded_landlock = true`) produces a passing result that waits
//! in VERIFYING with its gap recorded; the same task on a default stack
//! (the control, `demo.rs`) is accepted at once.

use airlock_local::client::{Supervisor, task_on_demo};
use airlock_testkit::git_dir as git;
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn a_degraded_landlock_result_is_recorded_as_such_and_waits_for_a_human() {
    let scratch = tempfile::tempdir().unwrap();
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let suite = airlock_local::start_with(
        scratch.path().join("state"),
        true,
        &airlock_local::Tuning {
            executor_landlock: Some((10, true)),
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("starting airlock-local: {e}"));
    let base = git(
        &suite.layout.repos().join("demo.git"),
        &["rev-parse", "refs/heads/main"],
    );
    let client = Supervisor::connect(Some(suite.bus.address())).unwrap();
    let task = task_on_demo(
        "iso-degraded",
        &base,
        1,
        json!({"operation": "write_file", "path": "NOTE.txt", "content": "degraded\n"}),
        json!([{"label": "true", "argv": ["/bin/true"], "timeout_seconds": 60}]),
    );
    client.submit_task(&task).unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let view = loop {
        let v = client.get_task("iso-degraded").unwrap();
        if !matches!(v.state.as_str(), "QUEUED" | "RUNNING") {
            break v;
        }
        assert!(Instant::now() < deadline, "still {}", v.state.as_str());
        std::thread::sleep(Duration::from_millis(150));
    };
    let result = view.result.clone().unwrap_or_default();
    assert_eq!(
        view.state.as_str(),
        "VERIFYING",
        "auto_accept must not accept a degraded result: {result}"
    );
    assert_eq!(result["outcome"], "passed", "{result}");
    let iso = &result["isolation"];
    assert_eq!(iso["landlock"], "degraded", "{iso}");
    assert_eq!(iso["seccomp"], "enforced", "{iso}");
    assert!(iso["uid"].is_u64(), "{iso}");
    assert!(view.verification.is_none(), "no decision was taken");

    // The result event says why auto_accept held back.
    let page = client.list_events("iso-degraded", 0, 100).unwrap();
    let submitted: Vec<&Value> = page
        .events
        .iter()
        .filter(|e| e.action == "TASK_RESULT_SUBMITTED")
        .map(|e| &e.payload)
        .collect();
    let withheld = submitted
        .first()
        .and_then(|p| p["auto_accept_withheld"].as_array())
        .unwrap_or_else(|| panic!("no reason recorded: {submitted:?}"));
    assert!(
        withheld
            .iter()
            .any(|g| g.as_str().unwrap_or("").starts_with("Landlock degraded")),
        "{withheld:?}"
    );

    // airlockctl show says it to the admin.
    let ctl = airlock_local::sibling("airlockctl").unwrap();
    let out = Command::new(ctl)
        .args(["show", "iso-degraded"])
        .env("DBUS_SYSTEM_BUS_ADDRESS", suite.bus.address())
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{shown}");
    assert!(
        shown.contains("NOT fully confined (Landlock degraded")
            && shown.contains("auto_accept leaves it to a human"),
        "{shown}"
    );
}

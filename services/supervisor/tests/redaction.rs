//! Secrets planted through every writer reach neither the task database,
//! nor the supervisor's log (what journald keeps, the audit trail's journal
//! entries included), nor airlockctl's output.
//!
//! Writers: an admin's reason (Verify, CancelTask), a denied call that
//! quotes what it was sent (an unknown field named like a token), and a
//! worker's result (its fields go through the same redaction). Positive
//! control: every planted value is found by the test's own scan of what it
//! sent, and the ordinary words sent beside each secret are found where the
//! secret is not — so the field was stored, and only the secret is gone.

mod common;

use airlock_client::Supervisor;
use airlock_localbus::{PrivateBus, SupervisorProcess, sibling_binary};
use airlock_proto::bus::LeaseRef;
use airlock_proto::redact::planted;
use airlock_proto::task::{Decision, DecisionRequest, TaskResult};
use serde_json::json;
use std::process::Command;

/// The part of a planted value that must never be kept.
fn secret_part(kind: &str, planted: &str) -> String {
    if kind == "url-password" {
        return "hunter2hunter2".to_owned();
    }
    planted
        .chars()
        .rev()
        .take(12)
        .collect::<String>()
        .chars()
        .rev()
        .collect()
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

#[test]
fn planted_secrets_are_redacted_in_the_database_the_log_and_airlockctl_output() {
    let secrets = planted();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("airlock.toml");
    std::fs::write(
        &config,
        "[[repository]]\nname = \"demo\"\npath = \"/srv/airlock/demo.git\"\n",
    )
    .unwrap();
    let db = dir.path().join("tasks.sqlite3");
    let log_path = dir.path().join("supervisor.log");
    let bus = PrivateBus::start().expect("dbus-daemon");
    let sup = SupervisorProcess::start_logging(
        &sibling_binary("airlock-supervisor").unwrap(),
        &bus,
        &config,
        &db,
        &[],
        std::fs::File::create(&log_path).unwrap(),
    )
    .expect("the supervisor starts");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let c = rt
        .block_on(Supervisor::connect(Some(bus.address())))
        .unwrap();

    // One reason per secret: ordinary words around it.
    let reason = |i: usize, s: &str| format!("marker-{i:02} saw {s} in the output, rejecting");

    // 1. Verify's reason, on a result whose fields carry secrets too.
    let mut n = 0;
    for (i, (_, secret)) in secrets.iter().enumerate() {
        let task = format!("redact-{i:02}");
        rt.block_on(c.submit_task(&common::submission(&task)))
            .unwrap();
        let grant = rt.block_on(c.claim()).unwrap().expect("a grant");
        let mut result = common::passed_result(&serde_json::to_value(&grant).unwrap());
        result["verification"][0]["label"] = json!(format!("compile {secret}"));
        let result: TaskResult = match serde_json::from_value(result) {
            Ok(r) => r,
            Err(e) => panic!("{e}"),
        };
        // A label is not validated by the store: the secret rides in.
        let _ = rt.block_on(c.submit_result(
            &LeaseRef::of(&grant),
            &format!("result-{task}-0001"),
            &result,
        ));
        let view = rt.block_on(c.get_task(&task)).unwrap();
        let req = DecisionRequest::about(&view, Decision::Reject, &reason(i, secret), None);
        rt.block_on(c.verify(&req)).unwrap();
        n += 1;
    }
    // 2. CancelTask's reason.
    rt.block_on(c.submit_task(&common::submission("redact-cancel")))
        .unwrap();
    let all: String = secrets
        .iter()
        .map(|(_, s)| s.as_str())
        .collect::<Vec<_>>()
        .join(" ");
    let view = rt.block_on(c.get_task("redact-cancel")).unwrap();
    let req = DecisionRequest::about(
        &view,
        Decision::Cancel,
        &format!("marker-cancel {all}"),
        None,
    );
    rt.block_on(c.cancel_task(&req)).unwrap();
    // 3. A denied call that quotes what it was sent: an unknown field
    //    named like a GitHub token.
    let github = &secrets
        .iter()
        .find(|(k, _)| *k == "github-token")
        .unwrap()
        .1;
    let mut bad = common::submission("redact-denied");
    bad[github.as_str()] = json!(1);
    let refused = rt.block_on(c.submit_task(&bad)).unwrap_err();
    assert_eq!(
        refused.code,
        airlock_proto::Code::MESSAGE_INVALID,
        "{refused}"
    );
    assert!(
        !refused
            .to_string()
            .contains(&secret_part("github-token", github)),
        "the refusal sent back quoted the secret: {refused}"
    );

    // What airlockctl shows.
    let ctl = |args: &[&str]| {
        let out = Command::new(sibling_binary("airlockctl").unwrap())
            .args(args)
            .env("DBUS_SYSTEM_BUS_ADDRESS", bus.address())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "airlockctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    let mut shown = ctl(&["--json", "events", "--limit", "1000"]);
    shown.extend(ctl(&["events", "--limit", "1000"]));
    for i in 0..n {
        shown.extend(ctl(&["--json", "show", &format!("redact-{i:02}")]));
    }
    drop(c);
    // The audit trail's journal entries (stderr lines outside systemd) are
    // exported after each commit: wait for the last reason's.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while !contains(&std::fs::read(&log_path).unwrap(), "marker-cancel") {
        assert!(
            std::time::Instant::now() < deadline,
            "the cancel's audit entry never reached the log"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    drop(sup); // SIGKILL: the WAL is still there to be searched too.
    let mut stored = std::fs::read(&db).unwrap();
    if let Ok(wal) = std::fs::read(dir.path().join("tasks.sqlite3-wal")) {
        stored.extend(wal);
    }
    let log = std::fs::read(&log_path).unwrap();

    for (i, (kind, secret)) in secrets.iter().enumerate() {
        let part = secret_part(kind, secret);
        // Positive control: what was sent held the secret.
        assert!(
            reason(i, secret).contains(&part),
            "{kind}: the control is broken"
        );
        assert!(all.contains(&part));
        for (place, bytes) in [
            ("the task database", &stored),
            ("the supervisor's log", &log),
            ("airlockctl's output", &shown),
        ] {
            assert!(!contains(bytes, &part), "{kind}: {part:?} reached {place}");
        }
        // The field itself was kept: its ordinary words are there.
        assert!(
            contains(&stored, &format!("marker-{i:02} saw")),
            "reason {i} not stored"
        );
        assert!(
            contains(&shown, &format!("marker-{i:02} saw")),
            "reason {i} not shown"
        );
        assert!(
            contains(&log, &format!("marker-{i:02} saw")),
            "reason {i} not in the audit trail's journal entry"
        );
        assert!(
            contains(&stored, &format!("[REDACTED:{kind}]")),
            "{kind}: no marker stored"
        );
    }
    assert!(contains(&stored, "marker-cancel"));
    assert!(
        contains(&stored, "MESSAGE_INVALID"),
        "the denial was recorded"
    );
    assert!(contains(&log, "refused"), "the denial was logged");
}

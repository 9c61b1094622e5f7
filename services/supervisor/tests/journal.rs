//! The audit trail's journal entries, end to end through the real
//! supervisor: each committed event is exported once with its action's
//! MESSAGE_ID and its fields, a refusal with the shared refusal id and its
//! code, and an event committed just before a crash (the export's cursor
//! behind it) is exported after the restart.
//!
//! Outside systemd the entries are lines on the supervisor's stderr (target
//! `airlock::audit`); journald's native fields from the same call are shown
//! by the nspawn testbed (tests/systemd: `journalctl -x` explains them).

mod common;

use airlock_client::Supervisor as Client;
use airlock_supervisor::journal::{CATALOG, REFUSED};
use common::{Opts, Supervisor, submission};
use std::time::{Duration, Instant};

/// The ids come from the catalogue table itself; its own unit tests hold
/// them to the released catalogue.
const SUBMITTED_ID: &str = CATALOG[0].id;
const REFUSED_ID: &str = REFUSED.id;

/// The audit lines of the log.
fn audit_lines(sup: &Supervisor) -> Vec<String> {
    std::fs::read_to_string(sup.log_path())
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("airlock::audit"))
        .map(str::to_owned)
        .collect()
}

/// Waits until an audit line holds every needle; returns the matching lines.
fn wait_audit(sup: &Supervisor, needles: &[&str]) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let found: Vec<String> = audit_lines(sup)
            .into_iter()
            .filter(|l| needles.iter().all(|n| l.contains(n)))
            .collect();
        if !found.is_empty() {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "no audit line with {needles:?} in:\n{}",
            audit_lines(sup).join("\n")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn cursor(sup: &Supervisor) -> i64 {
    std::fs::read_to_string(sup.dir().join("tasks.sqlite3.journal-cursor"))
        .expect("the export keeps its place beside the database")
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn committed_events_reach_the_journal_once_with_their_message_ids_even_across_a_crash() {
    assert_eq!(CATALOG[0].action, "TASK_SUBMITTED");
    let mut sup = Supervisor::start(Opts::default());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let c = rt
        .block_on(Client::connect(Some(sup.bus.address())))
        .unwrap();

    // An allowed event: its action's id, its task, who, the outcome.
    rt.block_on(c.submit_task(&submission("journal-1")))
        .unwrap();
    let lines = wait_audit(&sup, &[SUBMITTED_ID, "journal-1"]);
    assert_eq!(lines.len(), 1, "exported once: {lines:#?}");
    for field in [
        "airlock_action=\"TASK_SUBMITTED\"",
        "airlock_outcome=\"allowed\"",
        "airlock_actor_kind=\"planner\"",
        "airlock_event_id=",
    ] {
        assert!(lines[0].contains(field), "{field} missing: {}", lines[0]);
    }

    // A refusal: the shared id and its code; the refused task never existed.
    let mut bad = submission("journal-bad");
    bad["no_such_field"] = serde_json::json!(1);
    let refused = rt.block_on(c.submit_task(&bad)).unwrap_err();
    let code = refused.code.as_str();
    let lines = wait_audit(&sup, &[REFUSED_ID, &format!("airlock_code=\"{code}\"")]);
    assert!(
        lines[0].contains("airlock_outcome=\"denied\"") && lines[0].contains("WARN"),
        "{}",
        lines[0]
    );
    assert!(
        !audit_lines(&sup)
            .iter()
            .any(|l| l.contains(SUBMITTED_ID) && l.contains("journal-bad")),
        "a refused submission was exported as submitted"
    );

    // The cursor is at the log's newest event once the export caught up.
    let newest = sup.store().last_event_id().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while cursor(&sup) != newest {
        assert!(
            Instant::now() < deadline,
            "cursor {} != {newest}",
            cursor(&sup)
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // A crash between a commit and its export: journal-2's submission is
    // committed, and the cursor is left where it stood before it (what a
    // SIGKILL in that window leaves). The restart exports it, and nothing
    // older again.
    rt.block_on(c.submit_task(&submission("journal-2")))
        .unwrap();
    drop(c);
    sup.kill9();
    let before_crash = audit_lines(&sup).len();
    std::fs::write(
        sup.dir().join("tasks.sqlite3.journal-cursor"),
        format!("{newest}\n"),
    )
    .unwrap();
    sup.spawn();
    let deadline = Instant::now() + Duration::from_secs(15);
    let after = loop {
        let after: Vec<String> = audit_lines(&sup).split_off(before_crash);
        if after
            .iter()
            .any(|l| l.contains(SUBMITTED_ID) && l.contains("journal-2"))
        {
            break after;
        }
        assert!(
            Instant::now() < deadline,
            "journal-2 not exported after the restart: {after:#?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        !after.iter().any(|l| l.contains("journal-1")),
        "events before the cursor were exported again: {after:#?}"
    );
}

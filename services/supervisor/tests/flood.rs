//! Issue 41, item 2: no local user can fill the supervisor's log.
//!
//! A user with no rights (uid 65534) called `Tasks2.GetTask` with a 10 MiB
//! id and the log grew by 10 MiB: the id reached a log line whole, and
//! every refusal was logged. Here uid 65534 calls every method of every
//! interface — every row of `airlock_proto::bus::ROWS`, so a method added
//! later is covered without a change here — with each string argument
//! 1 MiB long (control characters and a forged log line among its bytes),
//! in its declared signature and with one argument too many, against the
//! real supervisor on a private bus. The log (at `AIRLOCK_LOG=debug`,
//! the audit trail included) grows by less than [`PER_CALL`] bytes per
//! call on average, no event of the task store carries more than a
//! bounded excerpt of what was sent, no raw control character sent
//! reaches the log, the refusals' own lines stop after the first few of
//! the caller's (one line says so), and the supervisor keeps answering.
//!
//! Twice: once with no right at all (every polkit action denied, Worker1
//! and Retry1 reserved for root), every call refused at the door; once
//! holding every right (polkit allowing every action, uid 65534 the
//! worker), so that the oversized arguments reach the handlers and the
//! store and are refused there.

mod common;

use airlock_proto::bus::ROWS;
use airlock_supervisor::authz::throttle::BURST;
use common::*;
use std::time::{Duration, Instant};

/// Each oversized string argument's length.
const HUGE: usize = 1024 * 1024;
/// The most the log may grow per call, on average.
const PER_CALL: u64 = 4 * 1024;
/// The caller: `nobody`.
const CALLER: u32 = 65534;
/// Every method is called this many times in each shape.
const ROUNDS: usize = 2;
/// What starts every oversized string: an escape sequence and a line of
/// its own that would pass for the supervisor's, were it written raw.
const FORGED: &str = "task-x\u{1b}[2J\r\n2026-01-01T00:00:00Z  INFO airlock: forged line\n";

fn huge() -> String {
    let mut s = String::with_capacity(HUGE);
    s.push_str(FORGED);
    while s.len() < HUGE {
        s.push_str("0123456789abcdef");
    }
    s.truncate(HUGE);
    s
}

/// The log's size once it stopped growing (the audit trail is exported
/// every second).
fn settled_size(sup: &Supervisor) -> u64 {
    let size = || std::fs::metadata(sup.log_path()).map_or(0, |m| m.len());
    let mut last = size();
    let mut stable_since = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
        let now = size();
        if now != last {
            last = now;
            stable_since = Instant::now();
        } else if stable_since.elapsed() > Duration::from_millis(2500) {
            break;
        }
    }
    last
}

/// Calls every row as uid 65534 with oversized arguments, in its declared
/// signature and with one string too many (each refused, when `refused`);
/// returns how many calls were made.
async fn flood(sup: &Supervisor, refused: bool) -> u64 {
    let conn = connect_as(sup.bus.address(), CALLER).await;
    let text = huge();
    let mut calls = 0;
    for _ in 0..ROUNDS {
        for row in ROWS.iter().flat_map(|r| r.iter()) {
            let too_many = format!("{}s", row.input);
            for signature in [row.input, too_many.as_str()] {
                let got =
                    call_with_signature(&conn, row.interface, row.name, signature, &text).await;
                assert!(
                    got.is_err() || !refused,
                    "{} ({signature}) with 1 MiB arguments answered {got:?}",
                    row.path()
                );
                calls += 1;
            }
        }
    }
    calls
}

fn check(opts: Opts, what: &str, refused: bool) {
    let sup = Supervisor::start(opts);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let before = settled_size(&sup);
    let calls = rt.block_on(flood(&sup, refused));
    let after = settled_size(&sup);
    let log = std::fs::read(sup.log_path()).unwrap();
    let grown = after - before;
    eprintln!(
        "{what}: {calls} calls with 1 MiB arguments grew the log by {grown} bytes ({} per call)",
        grown / calls
    );
    assert!(
        grown < PER_CALL * calls,
        "{what}: {calls} calls grew the log by {grown} bytes ({} per call)",
        grown / calls
    );
    // Nothing a caller sent reaches the log raw: its escape sequence and
    // its forged line are escaped.
    let tail = &log[before as usize..];
    let text = String::from_utf8_lossy(tail);
    if let Some(at) = text.find('\u{1b}') {
        let line_start = text[..at].rfind('\n').map_or(0, |n| n + 1);
        panic!(
            "{what}: a raw ESC reached the log: {:?}",
            &text[line_start..(at + 200).min(text.len())]
        );
    }
    for forged in ["\n2026-01-01T00:00:00Z  INFO airlock: forged", "\rINFO"] {
        if let Some(at) = text.find(forged) {
            let line_start = text[..at].rfind('\n').map_or(0, |n| n + 1);
            panic!(
                "{what}: a forged line reached the log: {:?}",
                &text[line_start..(at + 200).min(text.len())]
            );
        }
    }
    // The refusals' own lines are rate-limited per caller: the first
    // BURST of the window, then one line saying the rest are not logged
    // (the flood takes seconds; the window is a minute).
    let refused_lines = text
        .lines()
        .filter(|l| l.contains("airlock::authz: refused:") && l.contains(&format!("uid={CALLER}")))
        .count();
    assert_eq!(refused_lines, BURST as usize, "{what}: refusals logged");
    assert!(
        text.contains(&format!(
            "uid {CALLER}: more than {BURST} refusals within 60 s"
        )),
        "{what}: no line says the rest are not logged"
    );
    // Nor the task store: every event is a bounded excerpt.
    let events = sup.store().events(None, 0, 100_000).unwrap();
    assert!(!events.is_empty(), "{what}: the refusals are on record");
    for e in &events {
        let record = serde_json::to_string(&e.to_record()).unwrap();
        assert!(
            record.len() < 4096,
            "{what}: an event of {} bytes: {}…",
            record.len(),
            &record[..512]
        );
    }
    // And the supervisor answers still.
    rt.block_on(async {
        let conn = connect_as(sup.bus.address(), CALLER).await;
        let version: String = property(&conn, "Version").await;
        assert!(!version.is_empty());
    });
}

#[test]
fn oversized_arguments_from_a_caller_without_rights_grow_the_log_by_little() {
    check(
        Opts {
            authorizer: "deny-all-for-tests".into(),
            extra_args: vec![
                "--worker-user".into(),
                "root".into(),
                "--retry-user".into(),
                "root".into(),
            ],
            ..Opts::default()
        },
        "no rights",
        true,
    );
}

#[test]
fn oversized_arguments_from_a_caller_with_every_right_grow_the_log_by_little() {
    check(
        Opts {
            authorizer: "allow-all-for-tests".into(),
            ..Opts::default()
        },
        "every right",
        false,
    );
}

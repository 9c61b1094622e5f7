//! airlockctl on a real bus on which no supervisor runs: every command
//! that asks the supervisor fails with `RUNTIME_UNAVAILABLE` (seed 001's
//! 503; the catalogue's exit status 9), in words and in `--json`, at once
//! rather than after a call's time limit.

use airlock_localbus::PrivateBus;
use airlock_proto::Code;
use serde_json::Value;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn ctl(bus: &PrivateBus, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_airlockctl"))
        .args(args)
        .env("DBUS_SYSTEM_BUS_ADDRESS", bus.address())
        .env("NO_COLOR", "1")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

const COMMANDS: &[&[&str]] = &[
    &["status"],
    &["list"],
    &["show", "task-1"],
    &["events"],
    &["agent", "list"],
    &["reconcile", "list"],
];

#[test]
fn every_command_answers_runtime_unavailable_when_the_supervisor_is_down() {
    let bus = PrivateBus::start().expect("dbus-daemon");
    let unavailable = i32::from(Code::RUNTIME_UNAVAILABLE.exit_code());
    for args in COMMANDS {
        let started = Instant::now();
        let out = ctl(&bus, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(unavailable), "{args:?}: {stderr}");
        assert!(
            stderr.starts_with("error: RUNTIME_UNAVAILABLE: "),
            "{args:?}: {stderr}"
        );
        assert!(
            stderr.contains("hint: the supervisor is not answering"),
            "{args:?}: {stderr}"
        );
        assert!(started.elapsed() < Duration::from_secs(10), "{args:?}");

        let mut json_args = vec!["--json"];
        json_args.extend_from_slice(args);
        let out = ctl(&bus, &json_args);
        assert_eq!(out.status.code(), Some(unavailable), "{json_args:?}");
        let line = String::from_utf8_lossy(&out.stderr);
        let v: Value = serde_json::from_str(line.trim())
            .unwrap_or_else(|e| panic!("{json_args:?}: one JSON line on stderr ({e}): {line}"));
        assert_eq!(
            v["error"]["code"], "RUNTIME_UNAVAILABLE",
            "{json_args:?}: {v}"
        );
        assert_eq!(v["error"]["exit_code"], unavailable, "{json_args:?}: {v}");
    }
}

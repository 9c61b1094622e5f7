//! Secrets a verification command prints are redacted before they are
//! stored anywhere (issue 25, part 2): a real stack (supervisor, worker,
//! executor on a private dbus-daemon) runs a command that prints every
//! planted shape of `airlock_proto::redact::planted()` on stdout and
//! stderr, then fails, so its output tails are kept in the executor's
//! spool result, the worker's journal (the result_pending payload) and the
//! task database. Every file under the state directory (spool, journal,
//! the executor's work root, the task database with its WAL, the logs) is
//! then read as raw bytes: no planted secret is in any of them.
//!
//! Positive control: a canary printed beside the secrets is found in the
//! spool result, the journal and the task database, so the scan reads
//! where the tails are kept. Neither the secrets nor the canary appear in
//! the task as submitted: the script carries them hex-encoded and decodes
//! them at run time, so only the command's output can put them on disk.

use airlock_local::client::{Supervisor, task_on_demo};
use airlock_proto::redact::planted;
use airlock_testkit::git_dir as git;
use serde_json::json;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The part of a planted value that must never be kept (as the
/// supervisor's redaction test and `redact.rs` define it).
fn secret_part(kind: &str, planted: &str) -> String {
    if kind == "url-password" {
        return "hunter2hunter2".to_owned();
    }
    let chars: Vec<char> = planted.chars().collect();
    chars[chars.len().saturating_sub(12)..].iter().collect()
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

/// Every regular file under `dir`, symlinks not followed.
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => files(&path, out),
            Ok(m) if m.is_file() => out.push(path),
            _ => {}
        }
    }
}

const CANARY: &str = "airlock-canary-5e1f-still-here";

/// A unittest module that prints the canary and every secret (decoded
/// from hex at run time) on both streams, then fails.
fn script(secrets: &[String]) -> String {
    let hex: Vec<String> = secrets
        .iter()
        .map(|s| format!("    \"{}\",\n", hex::encode(s)))
        .collect();
    format!(
        "import sys, unittest\n\
         C = bytes.fromhex(\"{canary}\").decode()\n\
         S = [bytes.fromhex(h).decode() for h in [\n{hex}]]\n\
         for out in (sys.stdout, sys.stderr):\n    \
             print(C, C, C, file=out)\n    \
             for s in S:\n        \
                 print(s, file=out)\n    \
             print(C, C, C, file=out)\n    \
             out.flush()\n\
         class Leak(unittest.TestCase):\n    \
             def test_leak(self):\n        \
                 self.fail('printed on purpose')\n",
        canary = hex::encode(CANARY),
        hex = hex.concat(),
    )
}

#[test]
fn secrets_a_command_prints_are_in_no_file_of_the_state_directory_but_the_canary_is() {
    let secrets = planted();
    let scratch = tempfile::tempdir().unwrap();
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let state = scratch.path().join("state");
    let suite = airlock_local::start_with(state.clone(), true, &airlock_local::Tuning::default())
        .unwrap_or_else(|e| panic!("starting airlock-local: {e}"));
    let base = git(
        &suite.layout.repos().join("demo.git"),
        &["rev-parse", "refs/heads/main"],
    );
    let values: Vec<String> = secrets.iter().map(|(_, s)| s.clone()).collect();
    let text = script(&values);
    for (kind, secret) in &secrets {
        let part = secret_part(kind, secret);
        assert!(secret.contains(&part), "{kind}: the control is broken");
        assert!(!text.contains(&part), "{kind}: the script holds the secret");
    }
    assert!(!text.contains(CANARY));
    let task = task_on_demo(
        "redact-tails",
        &base,
        1,
        json!({"operation": "write_file", "path": "test_leak.py", "content": text}),
        json!([{"label": "leak", "argv": ["/usr/bin/python3", "-m", "unittest", "test_leak"],
                "timeout_seconds": 120}]),
    );
    let client = Supervisor::connect(Some(suite.bus.address())).unwrap();
    client.submit_task(&task).unwrap();
    let deadline = Instant::now() + Duration::from_secs(180);
    let view = loop {
        let v = client.get_task("redact-tails").unwrap();
        if !matches!(v.state.as_str(), "QUEUED" | "RUNNING") {
            break v;
        }
        assert!(
            Instant::now() < deadline,
            "still {}; the worker's log ends:\n{}",
            v.state.as_str(),
            airlock_local::fleet::tail(&suite.layout.logs().join("worker.log"), 30)
        );
        std::thread::sleep(Duration::from_millis(150));
    };
    let result = view.result.clone().unwrap_or_default();
    assert_eq!(view.state.as_str(), "FAILED", "{result}");
    assert_eq!(result["failure_code"], "VERIFICATION_FAILED", "{result}");
    let shown = result.to_string();
    assert!(shown.contains(CANARY), "the tails were kept: {shown}");
    assert!(shown.contains("[REDACTED:"), "{shown}");
    drop(client);

    // Stopped, so every write has landed (a WAL is read as it is).
    let mut suite = suite;
    suite.fleet.stop(Duration::from_secs(10));
    let mut all = Vec::new();
    files(&state, &mut all);
    assert!(!all.is_empty());
    let mut with_canary: Vec<PathBuf> = Vec::new();
    for file in &all {
        let bytes = std::fs::read(file).unwrap_or_default();
        for (kind, secret) in &secrets {
            let part = secret_part(kind, secret);
            assert!(
                !contains(&bytes, &part),
                "{kind}: {part:?} is stored in {}",
                file.display()
            );
        }
        if contains(&bytes, CANARY) {
            with_canary.push(file.clone());
        }
    }
    // The canary is where the tails are kept: so the scan read them.
    for (place, under) in [
        ("the spool's results", suite.layout.spool().join("results")),
        ("the worker's journal", state.join("worker")),
        ("the task database", state.join("tasks")),
    ] {
        assert!(
            with_canary.iter().any(|f| f.starts_with(&under)),
            "no canary in {place} ({}); found in {with_canary:?}",
            under.display()
        );
    }
    // The executor's work root was scanned too (whatever it still holds).
    assert!(
        all.iter().any(|f| f.starts_with(state.join("exec"))),
        "nothing under the executor's work root was scanned"
    );
}

/// Issue 41 item 6: values airlock generated are known, not secrets. A
/// repository whose environment has a setup (so airlock-egress runs and
/// the setup's environment holds the forwarder's URL as HTTPS_PROXY and
/// kin): the setup prints that URL and a generated-looking secret; the
/// verification command prints the task's id as a git ref names it
/// (`TASK:refs/heads/agent/TASK`, the shape of a publication's answer)
/// and the same secret, then fails. In the task database's result the
/// URL and the ref stay whole, the secret beside each is redacted.
#[test]
fn airlocks_own_values_stay_in_stored_tails_and_a_secret_beside_them_does_not() {
    let scratch = tempfile::tempdir().unwrap();
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let src = scratch.path().join("envd");
    std::fs::create_dir(&src).unwrap();
    airlock_testkit::git(&src, &["init", "-q", "-b", "main"]);
    std::fs::write(src.join("requirements.txt"), "nothing\n").unwrap();
    airlock_testkit::git(&src, &["add", "-A"]);
    airlock_testkit::git(&src, &["commit", "-q", "-m", "base"]);
    let (kind, secret) = planted()
        .into_iter()
        .find(|(k, _)| *k == "high-entropy")
        .unwrap();
    let part = secret_part(kind, &secret);
    // Carried hex-encoded: only the commands' output holds it.
    let decode = format!("bytes.fromhex('{}').decode()", hex::encode(&secret));
    let setup = format!(
        "import os; print('proxy', os.environ['HTTPS_PROXY']); print({decode}); os.makedirs('deps', exist_ok=True); open('deps/ok', 'w').write('ok')"
    );
    // A loopback entry the setup never connects to: it only makes the
    // setup's network (and so its proxy variables) exist.
    let idle = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let entry = format!("127.0.0.1:{}", idle.local_addr().unwrap().port());
    let environment = airlock_config::Environment {
        paths: Vec::new(),
        programs: vec!["python3".into()],
        variables: [("PATH".to_owned(), "/usr/bin:/bin".to_owned())].into(),
        setup: Some(airlock_config::Setup {
            commands: vec![vec!["python3".into(), "-c".into(), setup]],
            inputs: vec!["requirements.txt".into()],
            outputs: vec!["deps".into()],
            egress: vec![entry],
            timeout_seconds: 120,
        }),
    };
    let suite = airlock_local::start_with(
        scratch.path().join("state"),
        true,
        &airlock_local::Tuning {
            repositories: vec![("envd".into(), src.clone())],
            environments: vec![("envd".into(), environment)],
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("starting airlock-local: {e}"));
    let base = airlock_testkit::git(&src, &["rev-parse", "HEAD"]);
    let task_id = "p-5e1f0a9b3c7d2e64";
    let verify = format!(
        "import sys; t = '{task_id}'; print(t + ':refs/heads/agent/' + t); print({decode}); sys.exit(1)"
    );
    let mut task = task_on_demo(
        task_id,
        &base,
        1,
        json!({"operation": "write_file", "path": "note.txt", "content": "x\n"}),
        json!([{"label": "ids", "argv": ["/usr/bin/python3", "-c", verify],
                "timeout_seconds": 120}]),
    );
    task["binding"]["repository"] = json!("envd");
    let client = Supervisor::connect(Some(suite.bus.address())).unwrap();
    client.submit_task(&task).unwrap();
    let deadline = Instant::now() + Duration::from_secs(180);
    let view = loop {
        let v = client.get_task(task_id).unwrap();
        if !matches!(v.state.as_str(), "QUEUED" | "RUNNING") {
            break v;
        }
        assert!(
            Instant::now() < deadline,
            "still {}; the worker's log ends:\n{}",
            v.state.as_str(),
            airlock_local::fleet::tail(&suite.layout.logs().join("worker.log"), 30)
        );
        std::thread::sleep(Duration::from_millis(150));
    };
    let result = view.result.clone().unwrap_or_default();
    assert_eq!(result["failure_code"], "VERIFICATION_FAILED", "{result}");
    let setup_tail = result["isolation"]["layer"]["setup"][0]["stdout_tail"]
        .as_str()
        .unwrap_or_default();
    assert!(
        setup_tail.contains("proxy http://127.0.0.1:3128\n"),
        "the forwarder's URL is known: {setup_tail:?}"
    );
    let verify_tail = result["verification"][0]["stdout_tail"]
        .as_str()
        .unwrap_or_default();
    assert!(
        verify_tail.contains(&format!("{task_id}:refs/heads/agent/{task_id}\n")),
        "the task's ref is known: {verify_tail:?}"
    );
    for tail in [setup_tail, verify_tail] {
        assert!(
            tail.contains("[REDACTED:high-entropy]") && !tail.contains(&part),
            "the secret beside them is not known: {tail:?}"
        );
    }
    assert!(!result.to_string().contains(&part), "{result}");
}

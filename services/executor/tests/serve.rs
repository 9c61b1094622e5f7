//! The real executor binary, in a fresh network namespace (`unshare -n`),
//! with its real spawner: the start-up refusals, `run-once`, and
//! the `serve` loop answering spooled requests.

mod common;

use airlock_proto::Code;
use airlock_proto::bundle::{ExecFailure, ExecRequest, ExecResult};
use airlock_spool::{Kind, Spool, Wake};
use base64::Engine;
use common::*;
use serde_json::json;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The executor in a new network namespace with an empty environment.
fn executor(args: &[&str]) -> Command {
    let mut c = Command::new("unshare");
    c.arg("-n").arg(executor_bin()).args(args);
    c.env_clear().env("PATH", "/usr/bin:/bin");
    c
}

fn archive() -> Vec<u8> {
    gzip(&tar_of(&[
        ("hello.py", b"VALUE = 1\n", 0o644),
        (
            "test_hello.py",
            b"import hello\n\ndef test_value():\n    assert hello.VALUE == 2\n",
            0o644,
        ),
        ("tools/check.sh", b"#!/bin/sh\nexit 0\n", 0o755),
    ]))
}

fn deterministic(task: &str, verification: serde_json::Value) -> serde_json::Value {
    json!({
        "action": "deterministic",
        "change_set": [{
            "path": "hello.py", "operation": "replace_text",
            "old": "VALUE = 1", "new": "VALUE = 2", "count": 1,
            "expected_sha256": sha(b"VALUE = 1\n"),
        }],
        "verification": verification,
        "capability_scope": ["git.test"],
        "commit_idempotency_key": format!("commit-{task}"),
    })
}

/// The second verification command of the happy path.
const ASSERT_SCRIPT: &str = r#"
import hello, os, sys
assert hello.VALUE == 2
# Commands can neither smuggle files into the result nor change what it carries.
open('extra.txt', 'w').write('smuggled')
open('hello.py', 'w').write('VALUE = 666\n')
# Nor write outside the workspace.
for p in ('/etc/airlock-pwned', sys.argv[1]):
    try:
        open(p, 'w')
        sys.exit('wrote ' + p)
    except OSError:
        pass
print('all good')
"#;

fn happy_commands(probe: &Path) -> serde_json::Value {
    json!([
        {"label": "compile", "argv": ["/usr/bin/python3", "-m", "py_compile", "hello.py"], "cwd": ".", "timeout_seconds": 60},
        {"label": "assert", "argv": ["/usr/bin/python3", "-c", ASSERT_SCRIPT, probe],
         "cwd": ".", "timeout_seconds": 60}
    ])
}

fn check_happy_result(r: &ExecResult, request: &ExecRequest) {
    r.validate_against(request).unwrap();
    assert!(r.passed, "{r:#?}");
    assert_eq!(r.changed_files.len(), 1, "only the change set's paths");
    let f = &r.changed_files[0];
    assert_eq!(f.path, "hello.py");
    let content = base64::engine::general_purpose::STANDARD
        .decode(f.content_b64.as_ref().unwrap())
        .unwrap();
    assert_eq!(
        content, b"VALUE = 2\n",
        "content as changed, before the commands ran"
    );
    assert_eq!(f.sha256.as_deref(), Some(sha(b"VALUE = 2\n").as_str()));
    assert_eq!(r.verification.len(), 2);
    for v in &r.verification {
        assert_eq!(v.exit_code, Some(0), "{v:#?}");
        assert!(!v.timed_out);
        assert_eq!(v.stdout_sha256.len(), 64);
    }
    assert!(r.verification[1].stdout_tail.contains("all good"));
    assert_eq!(r.confinement.landlock, "full");
    assert!(r.confinement.landlock_abi >= 1);
    assert!(r.confinement.seccomp);
    assert_eq!(r.confinement.view, "minimal-root");
    for ns in ["mount", "pid", "proc", "tmp", "root"] {
        assert!(
            r.confinement.namespaces.iter().any(|n| n == ns),
            "{:?}",
            r.confinement.namespaces
        );
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn refuses_to_start_when_not_isolated() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    Spool::create_layout(&spool).unwrap();
    let work = dir.path().join("work");
    let base = [
        "serve",
        "--spool",
        spool.to_str().unwrap(),
        "--worker-uid",
        "0",
        "--work",
        work.to_str().unwrap(),
    ];
    let not_isolated = i32::from(Code::EXECUTOR_NOT_ISOLATED.exit_code());

    // A secret-looking variable.
    let out = executor(&base)
        .env("GITHUB_TOKEN", "ghp_x")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(not_isolated), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("EXECUTOR_NOT_ISOLATED: environment"),
        "{}",
        stderr(&out)
    );
    assert!(!stderr(&out).contains("ghp_x"), "values are never printed");
    let out = executor(&base)
        .env("NOTE", "Authorization: Bearer abcdefgh12345")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(not_isolated), "{}", stderr(&out));

    // A readable /run/credentials (a private tmpfs /run in a private mount namespace).
    let script = format!(
        "mount -t tmpfs none /run && mkdir /run/credentials && exec unshare -n {} {}",
        executor_bin().display(),
        base.join(" ")
    );
    let out = Command::new("unshare")
        .args(["-m", "sh", "-c", &script])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(not_isolated), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("credentials: /run/credentials is readable"),
        "{}",
        stderr(&out)
    );

    // The host's own network namespace (this machine has interfaces besides lo).
    let host_ifaces = airlock_executor::selfcheck::interfaces().unwrap();
    if host_ifaces.iter().any(|i| i != "lo") {
        let out = Command::new(executor_bin())
            .args(base)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(not_isolated), "{}", stderr(&out));
        assert!(
            stderr(&out).contains("EXECUTOR_NOT_ISOLATED: network"),
            "{}",
            stderr(&out)
        );
    } else {
        eprintln!("NOTE: this host has only lo; the network refusal is covered by unit tests only");
    }
}

#[test]
fn run_once_applies_verifies_and_binds_the_result() {
    let dir = tempfile::tempdir().unwrap();
    let archive = archive();
    let probe = dir.path().join("probe");
    let env = envelope(
        "task-run-once",
        deterministic("task-run-once", happy_commands(&probe)),
    );
    let request = exec_request(&env, &archive);
    let req_path = dir.path().join("request.json");
    let arc_path = dir.path().join("source.tar");
    std::fs::write(&req_path, serde_json::to_vec(&request).unwrap()).unwrap();
    std::fs::write(&arc_path, &archive).unwrap();
    let out_path = dir.path().join("out").join("result.json");
    std::fs::create_dir(out_path.parent().unwrap()).unwrap();
    let out = executor(&[
        "run-once",
        "--request",
        req_path.to_str().unwrap(),
        "--archive",
        arc_path.to_str().unwrap(),
        "--out",
        out_path.to_str().unwrap(),
        "--work",
        dir.path().join("work").to_str().unwrap(),
    ])
    .output()
    .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let result: ExecResult = serde_json::from_slice(&std::fs::read(&out_path).unwrap()).unwrap();
    check_happy_result(&result, &request);
    assert!(!dir.path().join("probe").exists());
    assert!(!Path::new("/etc/airlock-pwned").exists());
    // The workspace is gone; the tree and layer caches stay.
    let mut left: Vec<String> = std::fs::read_dir(dir.path().join("work"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["blobs", "layers", "trees"]);
}

/// The workspace over the tree cache: the command sees the tree with the
/// change set applied (a replaced file, a deleted one gone, a new one in a
/// new directory, modes kept) and may change it, while the cached tree
/// stays as it was; a second request of the same tree needs no archive.
#[test]
fn a_workspace_shows_the_tree_and_the_change_set_and_leaves_the_cache_alone() {
    let dir = tempfile::tempdir().unwrap();
    let archive = tar_of(&[
        ("hello.py", b"VALUE = 1\n", 0o644),
        ("gone.py", b"bye\n", 0o644),
        ("data/keep.txt", b"keep\n", 0o644),
        ("tools/check.sh", b"#!/bin/sh\nexit 0\n", 0o755),
    ]);
    let check = r#"
import os, sys
assert open('hello.py').read() == 'VALUE = 2\n', 'replaced'
assert not os.path.exists('gone.py'), 'deleted'
assert open('new/dir/added.txt').read() == 'added\n', 'written'
assert os.access('tools/check.sh', os.X_OK), 'mode kept'
assert sorted(os.listdir('.')) == ['data', 'hello.py', 'new', 'tools'], sorted(os.listdir('.'))
open('data/keep.txt', 'a').write('changed by the command\n')
open('made-by-command', 'w').write('x')
os.remove('hello.py')
print('workspace as planned')
"#;
    let plan = |task: &str| {
        json!({
            "action": "deterministic",
            "change_set": [
                {"path": "hello.py", "operation": "replace_text", "old": "VALUE = 1", "new": "VALUE = 2", "count": 1},
                {"path": "gone.py", "operation": "delete_file"},
                {"path": "new/dir/added.txt", "operation": "write_file", "content": "added\n"},
            ],
            "verification": [{"label": "check", "argv": ["/usr/bin/python3", "-c", check], "cwd": ".", "timeout_seconds": 60}],
            "capability_scope": ["git.test"],
            "commit_idempotency_key": format!("commit-{task}"),
        })
    };
    let run = |task: &str, with_archive: bool| -> (ExecResult, String) {
        let env = envelope(task, plan(task));
        let request = exec_request(&env, &archive);
        let req_path = dir.path().join(format!("{task}.json"));
        let arc_path = dir.path().join("source.tar");
        std::fs::write(&req_path, serde_json::to_vec(&request).unwrap()).unwrap();
        std::fs::write(&arc_path, &archive).unwrap();
        let out_path = dir.path().join(format!("{task}-result.json"));
        let mut args = vec![
            "run-once".to_owned(),
            "--request".into(),
            req_path.display().to_string(),
            "--out".into(),
            out_path.display().to_string(),
            "--work".into(),
            dir.path().join("work").display().to_string(),
        ];
        if with_archive {
            args.extend(["--archive".into(), arc_path.display().to_string()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = executor(&args).output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let r: ExecResult = serde_json::from_slice(&std::fs::read(&out_path).unwrap()).unwrap();
        r.validate_against(&request).unwrap();
        (r, request.source_tree)
    };
    let (first, tree) = run("task-overlay-1", true);
    assert!(first.passed, "{:#?}", first.verification);
    assert!(
        first.verification[0]
            .stdout_tail
            .contains("workspace as planned")
    );
    let changed: Vec<(&str, bool)> = first
        .changed_files
        .iter()
        .map(|f| (f.path.as_str(), f.deleted))
        .collect();
    assert_eq!(
        changed,
        [
            ("gone.py", true),
            ("hello.py", false),
            ("new/dir/added.txt", false)
        ],
        "the change set as applied, before the command ran"
    );
    // The cached tree is the archive's, untouched by the change set or the command.
    let cached = dir
        .path()
        .join("work")
        .join("trees")
        .join(&tree)
        .join("tree");
    assert_eq!(
        std::fs::read(cached.join("hello.py")).unwrap(),
        b"VALUE = 1\n"
    );
    assert_eq!(std::fs::read(cached.join("gone.py")).unwrap(), b"bye\n");
    assert_eq!(
        std::fs::read(cached.join("data/keep.txt")).unwrap(),
        b"keep\n"
    );
    assert!(!cached.join("made-by-command").exists());
    assert!(!cached.join("new").exists());
    // The same tree again, without an archive: served from the cache,
    // which verified at start that it still holds its tree.
    let (second, _) = run("task-overlay-2", false);
    assert!(second.passed, "{:#?}", second.verification);
}

struct Server {
    child: std::process::Child,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn serve_answers_each_spooled_request_once() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("spool");
    Spool::create_layout(&root).unwrap();
    let spool = Spool::open(&root).unwrap();
    let mut watcher = spool.watch(&[Kind::Results, Kind::Failed]).unwrap();
    let log = std::fs::File::create(dir.path().join("executor.log")).unwrap();
    let child = executor(&[
        "serve",
        "--spool",
        root.to_str().unwrap(),
        "--worker-uid",
        "0",
        "--work",
        dir.path().join("work").to_str().unwrap(),
    ])
    .stdout(Stdio::null())
    .stderr(log)
    .spawn()
    .unwrap();
    let _server = Server { child };

    let archive = archive();
    let mut expected: Vec<(String, &str)> = Vec::new();
    let mut requests = Vec::new();
    let cases = [
        (
            "task-serve-ok",
            happy_commands(&root.join("results").join("planted.json")),
            "ok",
        ),
        (
            "task-serve-red",
            json!([{"label": "red", "argv": ["/usr/bin/python3", "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"], "cwd": ".", "timeout_seconds": 30}]),
            "red",
        ),
        (
            "task-serve-slow",
            json!([{"label": "slow", "argv": ["/usr/bin/python3", "-c", "import time; time.sleep(60)"], "cwd": ".", "timeout_seconds": 1}]),
            "slow",
        ),
        (
            "task-serve-deny",
            json!([{"label": "shell", "argv": ["/bin/sh", "-c", "id"], "cwd": ".", "timeout_seconds": 30}]),
            "deny",
        ),
        (
            "task-serve-git",
            json!([{"label": "git", "argv": ["/usr/bin/git", "-c", "core.pager=sh", "log"], "cwd": ".", "timeout_seconds": 30}]),
            "git",
        ),
    ];
    for (task, commands, what) in cases {
        let env = envelope(task, deterministic(task, commands));
        let request = exec_request(&env, &archive);
        // Sources first, then the request: the worker's publication order.
        spool
            .publish(Kind::Sources, &request.request_id, &archive)
            .unwrap();
        spool
            .publish(
                Kind::Requests,
                &request.request_id,
                &serde_json::to_vec(&request).unwrap(),
            )
            .unwrap();
        expected.push((request.request_id.clone(), what));
        requests.push(request);
    }
    // A request naming another tree than its archive holds.
    let env = envelope(
        "task-serve-drift",
        deterministic("task-serve-drift", json!([])),
    );
    let other = gzip(&tar_of(&[
        ("hello.py", b"VALUE = 1\n", 0o644),
        ("more.py", b"", 0o644),
    ]));
    let request = exec_request(&env, &other);
    spool
        .publish(Kind::Sources, &request.request_id, &archive)
        .unwrap();
    spool
        .publish(
            Kind::Requests,
            &request.request_id,
            &serde_json::to_vec(&request).unwrap(),
        )
        .unwrap();
    expected.push((request.request_id.clone(), "tampered"));
    requests.push(request);

    // A request owned by another uid, and one that is a symlink: both
    // appear atomically (renamed into place) and both are rejected unread.
    for (task, what) in [
        ("task-serve-foreign", "foreign"),
        ("task-serve-link", "link"),
    ] {
        let env = envelope(task, deterministic(task, json!([])));
        let request = exec_request(&env, &archive);
        spool
            .publish(Kind::Sources, &request.request_id, &archive)
            .unwrap();
        let staged = dir.path().join(format!("{task}.json"));
        std::fs::write(&staged, serde_json::to_vec(&request).unwrap()).unwrap();
        let temp = root.join("requests").join(format!(".stage-{task}"));
        if what == "foreign" {
            std::fs::copy(&staged, &temp).unwrap();
            std::os::unix::fs::chown(&temp, Some(4242), Some(4242)).unwrap();
        } else {
            std::os::unix::fs::symlink(&staged, &temp).unwrap();
        }
        std::fs::rename(
            &temp,
            root.join("requests")
                .join(format!("{}.json", request.request_id)),
        )
        .unwrap();
        expected.push((request.request_id.clone(), what));
        requests.push(request);
    }

    let deadline = Instant::now() + Duration::from_secs(60);
    let answered = |id: &str| {
        spool.exists(Kind::Results, id).unwrap() || spool.exists(Kind::Failed, id).unwrap()
    };
    while !expected.iter().all(|(id, _)| answered(id)) {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "not answered in time; log:\n{}",
            std::fs::read_to_string(dir.path().join("executor.log")).unwrap()
        );
        if let Wake::Timeout = watcher.wait(left).unwrap() {
            continue;
        }
    }
    let me = rustix::process::geteuid().as_raw();
    let expect = airlock_spool::Expect {
        owner_uid: me,
        max_bytes: 32 << 20,
        sha256: None,
    };
    let result = |id: &str| -> ExecResult {
        serde_json::from_slice(&spool.read(Kind::Results, id, &expect).unwrap()).unwrap()
    };
    let failure = |id: &str| -> ExecFailure {
        serde_json::from_slice(&spool.read(Kind::Failed, id, &expect).unwrap()).unwrap()
    };
    for ((id, what), request) in expected.iter().zip(&requests) {
        match *what {
            "ok" => check_happy_result(&result(id), request),
            "red" => {
                let r = result(id);
                r.validate_against(request).unwrap();
                assert!(!r.passed);
                assert_eq!(r.verification[0].exit_code, Some(3));
                assert!(r.verification[0].stderr_tail.contains("boom"));
            }
            "slow" => {
                let r = result(id);
                assert!(!r.passed);
                assert!(r.verification[0].timed_out, "{:#?}", r.verification[0]);
                assert!(r.verification[0].duration_ms < 20_000);
            }
            "deny" => {
                let f = failure(id);
                assert_eq!(f.code, "COMMAND_PROGRAM_DENY");
                assert_eq!(f.request_sha256.as_deref(), Some(request.digest().as_str()));
            }
            "git" => assert_eq!(failure(id).code, "GIT_MUTATION_DENY"),
            "tampered" => assert_eq!(failure(id).code, "SOURCE_ARCHIVE_SHA_MISMATCH"),
            "foreign" | "link" => {
                let f = failure(id);
                assert_eq!(f.code, "SPOOL_FILE_REJECTED", "{f:?}");
                assert_eq!(f.request_sha256, None, "never parsed");
            }
            _ => unreachable!(),
        }
        // Answered exactly once: not in both directories.
        assert!(
            !(spool.exists(Kind::Results, id).unwrap() && spool.exists(Kind::Failed, id).unwrap())
        );
    }
    assert!(!root.join("results").join("planted.json").exists());
    // One tree served them all: filled once, then cached.
    let log = std::fs::read_to_string(dir.path().join("executor.log")).unwrap();
    assert_eq!(
        log.matches("tree filled from the archive").count(),
        1,
        "{log}"
    );
    assert_eq!(log.matches("tree cached").count(), 4, "{log}");

    // A tree the executor lacks, and no archive: it asks (wants/<id>.json,
    // bound to the request), then answers once the archive comes.
    let wanted_archive = tar_of(&[
        ("hello.py", b"VALUE = 1\n", 0o644),
        ("new.py", b"x = 1\n", 0o644),
    ]);
    let env = envelope(
        "task-serve-want",
        deterministic("task-serve-want", json!([])),
    );
    let wanted = exec_request(&env, &wanted_archive);
    let mut wants = spool.watch(&[Kind::Wants]).unwrap();
    spool
        .publish(
            Kind::Requests,
            &wanted.request_id,
            &serde_json::to_vec(&wanted).unwrap(),
        )
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !spool.exists(Kind::Wants, &wanted.request_id).unwrap() {
        assert!(Instant::now() < deadline, "no source request");
        let _ = wants.wait(Duration::from_secs(5)).unwrap();
    }
    let want: airlock_proto::bundle::SourceWanted = serde_json::from_slice(
        &spool
            .read(Kind::Wants, &wanted.request_id, &expect)
            .unwrap(),
    )
    .unwrap();
    want.validate_against(&wanted).unwrap();
    assert!(!answered(&wanted.request_id), "answered without its source");
    spool
        .publish(Kind::Sources, &wanted.request_id, &wanted_archive)
        .unwrap();
    while !answered(&wanted.request_id) {
        assert!(
            Instant::now() < deadline,
            "not answered once the source came"
        );
        let _ = watcher.wait(Duration::from_secs(5)).unwrap();
    }
    let r = result(&wanted.request_id);
    r.validate_against(&wanted).unwrap();
    assert!(r.passed);
    // Nothing is answered twice: a new wake-up (an unrelated publication)
    // makes the loop rescan, and the answered requests stay as they were.
    let before: Vec<_> = airlock_spool_listing(&spool);
    let env = envelope(
        "task-serve-late",
        deterministic("task-serve-late", json!([])),
    );
    let late = exec_request(&env, &archive);
    spool
        .publish(Kind::Sources, &late.request_id, &archive)
        .unwrap();
    spool
        .publish(
            Kind::Requests,
            &late.request_id,
            &serde_json::to_vec(&late).unwrap(),
        )
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !answered(&late.request_id) {
        assert!(Instant::now() < deadline, "late request not answered");
        let _ = watcher.wait(Duration::from_secs(5)).unwrap();
    }
    let r = result(&late.request_id);
    assert!(r.passed && r.verification.is_empty());
    let after: Vec<_> = airlock_spool_listing(&spool);
    assert_eq!(after.len(), before.len() + 1);
    for entry in &before {
        assert!(after.contains(entry), "{entry:?} changed");
    }
    // The workspaces are gone; the caches and the view status stay.
    let mut left: Vec<String> = std::fs::read_dir(dir.path().join("work"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["blobs", "layers", "sandbox.json", "trees"]);
    let mut trees: Vec<String> = std::fs::read_dir(dir.path().join("work").join("trees"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    trees.sort();
    let mut want_trees = vec![requests[0].source_tree.clone(), wanted.source_tree.clone()];
    want_trees.sort();
    assert_eq!(trees, want_trees, "the tampered archive filled nothing");
}

/// (directory, id, mtime) of every answer.
fn airlock_spool_listing(spool: &Spool) -> Vec<(String, String, std::time::SystemTime)> {
    let mut out = Vec::new();
    for kind in [Kind::Results, Kind::Failed] {
        for id in spool.list(kind).unwrap() {
            let path = spool.dir_path(kind).join(format!("{id}.json"));
            let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
            out.push((kind.dir_name().to_owned(), id, mtime));
        }
    }
    out
}

#[test]
fn source_capture_returns_files_and_withholds_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let archive = gzip(&tar_of(&[
        ("src/a.py", b"A = 1\n", 0o644),
        (".env", b"SECRET=1\n", 0o644),
    ]));
    let run = |paths: serde_json::Value, name: &str| -> Vec<u8> {
        let env = envelope(
            &format!("task-capture-{name}"),
            json!({"action": "source_capture", "capture_paths": paths, "capability_scope": ["git.read"]}),
        );
        let request = exec_request(&env, &archive);
        let req_path = dir.path().join(format!("{name}.json"));
        let arc_path = dir.path().join(format!("{name}.tar"));
        std::fs::write(&req_path, serde_json::to_vec(&request).unwrap()).unwrap();
        std::fs::write(&arc_path, &archive).unwrap();
        let out_path = dir.path().join(format!("{name}.out.json"));
        let out = executor(&[
            "run-once",
            "--request",
            req_path.to_str().unwrap(),
            "--archive",
            arc_path.to_str().unwrap(),
            "--out",
            out_path.to_str().unwrap(),
            "--work",
            dir.path().join("work").to_str().unwrap(),
        ])
        .output()
        .unwrap();
        let _ = out;
        std::fs::read(&out_path).unwrap()
    };
    let r: ExecResult =
        serde_json::from_slice(&run(json!(["src/a.py", "missing.py"]), "ok")).unwrap();
    assert!(r.passed && r.verification.is_empty() && r.changed_files.is_empty());
    assert_eq!(r.captured_files.len(), 2);
    assert_eq!(r.captured_files[0].path, "missing.py");
    assert!(r.captured_files[0].deleted);
    assert_eq!(
        r.captured_files[1].sha256.as_deref(),
        Some(sha(b"A = 1\n").as_str())
    );
    assert!(r.withheld_paths.is_empty());
    // A credential-like path is withheld: listed, never read, its content
    // nowhere in the result; the other paths are captured as asked.
    let bytes = run(json!([".env", "src/a.py"]), "cred");
    let r: ExecResult = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(r.withheld_paths, [".env"]);
    assert_eq!(
        r.captured_files
            .iter()
            .map(|f| f.path.as_str())
            .collect::<Vec<_>>(),
        ["src/a.py"]
    );
    let text = String::from_utf8_lossy(&bytes);
    assert!(!text.contains("SECRET"), "{text}");
    use base64::Engine;
    assert!(!text.contains(&base64::engine::general_purpose::STANDARD.encode(b"SECRET=1\n")));
}

#[test]
fn run_once_as_an_unprivileged_user() {
    // The production shape: the executor is not root (uid 4242 here), so
    // airlock-confine keeps that uid and uses a user namespace.
    const UID: u32 = 4242;
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(dir.path(), Some(UID), Some(UID)).unwrap();
    let archive = archive();
    let probe = dir.path().join("probe");
    let env = envelope(
        "task-unpriv",
        deterministic("task-unpriv", happy_commands(&probe)),
    );
    let request = exec_request(&env, &archive);
    let req_path = dir.path().join("request.json");
    let arc_path = dir.path().join("source.tar");
    std::fs::write(&req_path, serde_json::to_vec(&request).unwrap()).unwrap();
    std::fs::write(&arc_path, &archive).unwrap();
    for p in [&req_path, &arc_path] {
        std::os::unix::fs::chown(p, Some(UID), Some(UID)).unwrap();
    }
    let out_path = dir.path().join("result.json");
    let out = Command::new("unshare")
        .args([
            "-n",
            "setpriv",
            "--reuid",
            "4242",
            "--regid",
            "4242",
            "--clear-groups",
        ])
        .arg(executor_bin())
        .args([
            "run-once",
            "--request",
            req_path.to_str().unwrap(),
            "--archive",
            arc_path.to_str().unwrap(),
            "--out",
            out_path.to_str().unwrap(),
            "--work",
            dir.path().join("work").to_str().unwrap(),
        ])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let result: ExecResult = serde_json::from_slice(&std::fs::read(&out_path).unwrap()).unwrap();
    check_happy_result(&result, &request);
    assert!(result.confinement.namespaces.iter().any(|n| n == "user"));
    assert!(!probe.exists());
}

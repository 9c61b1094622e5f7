//! A request end to end through `request::handle`, up to (not including)
//! the sandbox: every refusal before a command runs, with its code, and
//! the workspace removed afterwards. There is deliberately no spawner, so
//! a command that did run would show up as SANDBOX_UNAVAILABLE.

mod common;

use airlock_executor::apply::CredentialPolicy;
use airlock_executor::policy::ProgramPolicy;
use airlock_executor::request::{Settings, handle};
use airlock_executor::result::Answer;
use airlock_executor::tree::extract::ArchiveLimits;
use airlock_executor::tree::{CacheLimits, Cached, TreeCache};
use airlock_proto::bundle::ExecRequest;
use common::*;
use serde_json::json;

fn settings(work: &std::path::Path) -> Settings {
    let config = airlock_config::Config::default();
    Settings {
        programs: ProgramPolicy::from_config(&config.executor),
        environments: Default::default(),
        credentials: CredentialPolicy::default(),
        archive: ArchiveLimits {
            max_entries: 100,
            max_file_bytes: 1 << 20,
            max_total_bytes: 4 << 20,
            max_expansion_ratio: 100,
        },
        max_archive_bytes: 1 << 20,
        max_file_bytes: 1 << 20,
        runner: None,
        work_root: work.to_owned(),
        own: None,
        layers: airlock_executor::layer::LayerCache::open(work, 1 << 30).unwrap(),
        egress_socket: work.join("egress.sock"),
    }
}

fn archive() -> Vec<u8> {
    tar_of(&[("hello.py", b"VALUE = 1\n", 0o644)])
}

fn plan(changes: serde_json::Value, commands: serde_json::Value) -> serde_json::Value {
    json!({"action": "deterministic", "change_set": changes, "verification": commands, "capability_scope": []})
}

fn write_hello() -> serde_json::Value {
    json!([{"path": "hello.py", "operation": "write_file", "content": "VALUE = 2\n"}])
}

/// The tree cache of a work root (no bounds to speak of).
fn cache(work: &std::path::Path) -> TreeCache {
    let limits = CacheLimits {
        max_entries: 8,
        max_bytes: 1 << 30,
    };
    TreeCache::open(work, limits, None).unwrap().0
}

/// Fills the cache from `archive` for the request's tree (as the serve
/// loop does on a miss).
fn from_archive<'a>(
    s: &'a Settings,
    cache: &'a TreeCache,
    archive: Vec<u8>,
) -> impl FnOnce(&ExecRequest) -> airlock_executor::Result<Cached> + 'a {
    move |req| cache.fill(&req.source_tree, &archive, &s.archive, &s.credentials)
}

/// Runs `request` (as JSON bytes) with `archive`; returns the failure code, or "RESULT".
fn answer(request: &[u8], file_id: Option<&str>, archive: Vec<u8>) -> (String, Option<String>) {
    let work = tempfile::tempdir().unwrap();
    let s = settings(work.path());
    let c = cache(work.path());
    let a = handle(
        &s,
        file_id,
        Ok(request.to_vec()),
        from_archive(&s, &c, archive),
    );
    let mut left: Vec<String> = std::fs::read_dir(work.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    // The caches only: the blob store, the tree cache and the (empty)
    // layer cache.
    assert_eq!(left, ["blobs", "layers", "trees"], "workspace left behind");
    let trees = std::fs::read_dir(work.path().join("trees")).unwrap();
    for t in trees {
        let name = t.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            !name.starts_with(".fill"),
            "a half-filled cache entry left: {name}"
        );
    }
    match a {
        Answer::Result(_) => ("RESULT".into(), None),
        Answer::Failure(f) => (f.code, f.request_sha256),
    }
}

fn bytes(r: &ExecRequest) -> Vec<u8> {
    serde_json::to_vec(r).unwrap()
}

#[test]
fn a_request_without_commands_produces_a_bound_result() {
    let env = envelope("task-req-ok", plan(write_hello(), json!([])));
    let req = exec_request(&env, &archive());
    let work = tempfile::tempdir().unwrap();
    let s = settings(work.path());
    let c = cache(work.path());
    let Answer::Result(r) = handle(
        &s,
        Some(&req.request_id),
        Ok(bytes(&req)),
        from_archive(&s, &c, archive()),
    ) else {
        panic!("refused")
    };
    r.validate_against(&req).unwrap();
    assert!(r.passed);
    assert_eq!(r.execution_digest, env.execution_digest);
    assert_eq!(
        r.changed_files[0].sha256.as_deref(),
        Some(sha(b"VALUE = 2\n").as_str())
    );
    assert_eq!(
        r.confinement.landlock, "none",
        "no command ran and the executor was not confined"
    );
}

#[test]
fn requests_are_parsed_strictly_and_bound_to_their_file() {
    let env = envelope("task-req-bind", plan(write_hello(), json!([])));
    let req = exec_request(&env, &archive());
    // Another file name.
    let other = airlock_proto::bundle::request_id_for("task-other", 1, &env.execution_digest);
    assert_eq!(
        answer(&bytes(&req), Some(&other), archive()).0,
        "SPOOL_DIGEST_MISMATCH"
    );
    // An id not derived from the envelope.
    let mut r = req.clone();
    r.attempt = 2;
    assert_eq!(
        answer(&bytes(&r), None, archive()).0,
        "SPOOL_DIGEST_MISMATCH"
    );
    // An unknown field.
    let mut v = serde_json::to_value(&req).unwrap();
    v["extra"] = json!(1);
    assert_eq!(
        answer(&serde_json::to_vec(&v).unwrap(), None, archive()).0,
        "MESSAGE_INVALID"
    );
    // Not JSON.
    assert_eq!(answer(b"{not json", None, archive()).0, "MESSAGE_INVALID");
}

#[test]
fn a_tampered_envelope_is_refused() {
    let env = envelope("task-req-tamper", plan(write_hello(), json!([])));
    let mut req = exec_request(&env, &archive());
    req.envelope["change_set"][0]["content"] = json!("import os; os.system('curl evil')\n");
    let (code, digest) = answer(&bytes(&req), Some(&req.request_id.clone()), archive());
    assert_eq!(code, "EXECUTION_DIGEST_INVALID");
    assert_eq!(digest.as_deref(), Some(req.digest().as_str()));
}

#[test]
fn archives_must_hold_the_requests_tree() {
    let env = envelope("task-req-arc", plan(write_hello(), json!([])));
    let req = exec_request(&env, &archive());
    // Another content, another tree.
    let other = tar_of(&[("hello.py", b"VALUE = 3\n", 0o644)]);
    assert_eq!(
        answer(&bytes(&req), None, other).0,
        "SOURCE_ARCHIVE_SHA_MISMATCH"
    );
    // Another mode is another tree too.
    let exec = tar_of(&[("hello.py", b"VALUE = 1\n", 0o755)]);
    assert_eq!(
        answer(&bytes(&req), None, exec).0,
        "SOURCE_ARCHIVE_SHA_MISMATCH"
    );
    // An extra file as well.
    let extra = tar_of(&[("hello.py", b"VALUE = 1\n", 0o644), ("x", b"", 0o644)]);
    assert_eq!(
        answer(&bytes(&req), None, extra).0,
        "SOURCE_ARCHIVE_SHA_MISMATCH"
    );
    // The right one.
    assert_eq!(answer(&bytes(&req), None, archive()).0, "RESULT");
    // A hostile archive with the right digest is still refused by extraction.
    let hostile = tar_with(
        raw_header(b"../../x", tar::EntryType::Regular, 1, 0o644, b""),
        b"x",
    );
    let req = exec_request(&env, &hostile);
    assert_eq!(
        answer(&bytes(&req), None, hostile).0,
        "SOURCE_ARCHIVE_PATH_INVALID"
    );
}

#[test]
fn program_policy_refuses_before_anything_runs() {
    for (argv, code) in [
        (
            json!(["/usr/bin/curl", "http://example.invalid"]),
            "COMMAND_PROGRAM_DENY",
        ),
        (
            json!(["/usr/bin/python3", "-m", "pip", "install", "x"]),
            "PYTHON_MODULE_DENY",
        ),
        (
            json!(["/usr/bin/git", "push", "origin", "HEAD"]),
            "GIT_MUTATION_DENY",
        ),
        (
            json!(["/usr/bin/git", "--git-dir=/srv/git/demo.git", "log"]),
            "GIT_MUTATION_DENY",
        ),
    ] {
        // The second command is refused; the first, allowed, must not run either.
        let commands = json!([
            {"label": "ok", "argv": ["/usr/bin/true"], "cwd": ".", "timeout_seconds": 5},
            {"label": "bad", "argv": argv, "cwd": ".", "timeout_seconds": 5},
        ]);
        let env = envelope("task-req-policy", plan(write_hello(), commands));
        let req = exec_request(&env, &archive());
        assert_eq!(answer(&bytes(&req), None, archive()).0, code, "{argv}");
    }
    // An allowed command reaches the (missing) helper: proof the refusals above happened first.
    let env = envelope(
        "task-req-helper",
        plan(
            write_hello(),
            json!([{"label": "ok", "argv": ["/usr/bin/true"], "cwd": ".", "timeout_seconds": 5}]),
        ),
    );
    let req = exec_request(&env, &archive());
    assert_eq!(
        answer(&bytes(&req), None, archive()).0,
        "SANDBOX_UNAVAILABLE"
    );
}

#[test]
fn change_refusals_carry_their_codes() {
    for (changes, code) in [
        (
            json!([{"path": "hello.py", "operation": "write_file", "content": "x", "expected_sha256": "0".repeat(64)}]),
            "SOURCE_DRIFT",
        ),
        (
            json!([{"path": "hello.py", "operation": "replace_text", "old": "VALUE", "new": "V", "count": 2}]),
            "REPLACE_COUNT_INVALID",
        ),
        (
            json!([{"path": "nope.py", "operation": "replace_text", "old": "a", "new": "b", "count": 1}]),
            "REPLACE_SOURCE_MISSING",
        ),
        (
            json!([{"path": ".env", "operation": "write_file", "content": "TOKEN=x"}]),
            "CREDENTIAL_PATH_DENIED",
        ),
    ] {
        let env = envelope("task-req-change", plan(changes, json!([])));
        let req = exec_request(&env, &archive());
        assert_eq!(answer(&bytes(&req), None, archive()).0, code);
    }
}

//! A repository whose suite needs a toolchain the system does not have: a
//! Python project tested with pytest, which Debian's python3 here lacks.
//! Its verification environment (`airlock-local up --environment`) adds a
//! root-owned virtual environment with pytest to the commands' view, allows
//! its python3 for that repository only and puts it first on PATH.
//!
//! - `--verify 'python3 -m pytest -q'` resolves to the environment's
//!   python3: a fix ends SUCCEEDED, a breaking change FAILED with the
//!   failing test named in the evidence;
//! - the same command on a repository without the environment runs the
//!   system python3 and fails for want of pytest (what the environment adds);
//! - naming the environment's python3 for that other repository is refused
//!   at submission with COMMAND_PROGRAM_DENY, and no task exists.
//!
//! pytest is installed into the virtual environment with pip from the
//! package registry this machine reaches (the ordinary client, as set up
//! here); without one the test fails saying so.

use airlock_testkit::{git, last_json};
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// A root-owned virtual environment with pytest, under /var/tmp (every
/// directory above it root's and not writable by others but sticky /var/tmp).
fn toolchain() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("airlock-env-")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let venv = dir.path().join("venv");
    // Debian's python3 (with python3-venv): the one under /usr, which
    // every user can run (a python3 first on this PATH may live elsewhere).
    let made = Command::new("/usr/bin/python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "python3 -m venv (Debian's python3-venv): {}",
        String::from_utf8_lossy(&made.stderr)
    );
    let pip = Command::new(venv.join("bin/python3"))
        .args([
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "pytest",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        pip.status.success(),
        "pip install pytest into {} (needs the package registry): {}",
        venv.display(),
        String::from_utf8_lossy(&pip.stderr)
    );
    (dir, venv)
}

/// A work tree whose `add` subtracts, with a pytest suite.
fn project(dir: &Path, name: &str) -> PathBuf {
    let src = dir.join(name);
    std::fs::create_dir_all(&src).unwrap();
    git(&src, &["init", "-q", "-b", "main"]);
    std::fs::write(src.join("calc.py"), "def add(a, b):\n    return a - b\n").unwrap();
    std::fs::write(
        src.join("test_calc.py"),
        "import pytest\n\nfrom calc import add\n\n\n@pytest.mark.parametrize(\"a, b, want\", [(2, 3, 5), (0, 0, 0), (-1, 1, 0)])\ndef test_add(a, b, want):\n    assert add(a, b) == want\n",
    )
    .unwrap();
    git(&src, &["add", "-A"]);
    git(&src, &["commit", "-q", "-m", "calc with a pytest suite"]);
    src
}

fn propose(bus: &str, args: &[&str], patch: &str) -> Output {
    let ctl = airlock_local::sibling("airlockctl").unwrap();
    airlock_testkit::airlockctl_with_stdin(&ctl, bus, args, patch)
}

const FIX: &str = "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n";
const BREAK: &str = "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a * b\n";

fn args<'a>(cfg: &'a str, repo: &'a str, verify: &'a str) -> Vec<&'a str> {
    airlock_testkit::propose_args(cfg, repo, verify, "300")
}

fn tail_of(task: &Value) -> String {
    task["result"]["verification"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            format!(
                "{}{}",
                c["stdout_tail"].as_str().unwrap_or(""),
                c["stderr_tail"].as_str().unwrap_or("")
            )
        })
        .collect()
}

#[test]
fn a_toolchain_from_the_environment_verifies_a_pytest_suite_for_its_repository_only() {
    let scratch = tempfile::tempdir().unwrap();
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (_toolchain, venv) = toolchain();
    let with_env = project(scratch.path(), "calc");
    let without = project(scratch.path(), "plain");
    let bin = venv.join("bin");
    let environment = airlock_config::Environment {
        paths: vec![venv.parent().unwrap().to_path_buf()],
        programs: vec!["python3".into()],
        variables: [(
            "PATH".to_owned(),
            format!("{}:/usr/bin:/bin", bin.display()),
        )]
        .into(),
        setup: None,
    };
    let resolved = environment
        .resolve()
        .expect("the environment resolves here");
    let python = bin.join("python3");
    assert_eq!(resolved.names["python3"], python);

    let suite = airlock_local::start_with(
        scratch.path().join("state"),
        true,
        &airlock_local::Tuning {
            repositories: vec![("calc".into(), with_env), ("plain".into(), without)],
            environments: vec![("calc".into(), environment)],
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("starting airlock-local: {e}"));
    let bus = suite.bus.address().to_owned();
    let config = suite.layout.config();
    let cfg = config.to_str().unwrap();
    let suite_cmd = "python3 -m pytest -q -p no:cacheprovider";

    // The fix, verified by pytest from the environment.
    let out = propose(&bus, &args(cfg, "calc", suite_cmd), FIX);
    let good = last_json(&out);
    assert_eq!(
        good["state"],
        "SUCCEEDED",
        "{good}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(good["result"]["verification"][0]["exit_code"], 0, "{good}");
    assert!(good["result"]["commit_oid"].is_string(), "{good}");

    // A breaking change: FAILED in its one attempt, the failing test named.
    let out = propose(&bus, &args(cfg, "calc", suite_cmd), BREAK);
    let bad = last_json(&out);
    assert_eq!(bad["state"], "FAILED", "{bad}");
    let tail = tail_of(&bad);
    assert!(tail.contains("test_add"), "{tail}");
    assert!(tail.contains("failed"), "{tail}");

    // Without the environment the same words run the system python3,
    // which has no pytest.
    let out = propose(&bus, &args(cfg, "plain", suite_cmd), FIX);
    let plain = last_json(&out);
    assert_eq!(plain["state"], "FAILED", "{plain}");
    assert!(
        tail_of(&plain).contains("No module named pytest"),
        "{}",
        tail_of(&plain)
    );

    // The environment's python3 is calc's only: for plain it is refused at
    // submission, before any attempt, and no task is made.
    let explicit = format!("{} -m pytest -q", python.display());
    let out = propose(&bus, &args(cfg, "plain", &explicit), FIX);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("COMMAND_PROGRAM_DENY"), "{err}");
    let ctl = airlock_local::sibling("airlockctl").unwrap();
    let list = Command::new(ctl)
        .env("DBUS_SYSTEM_BUS_ADDRESS", &bus)
        .args(["--json", "list"])
        .output()
        .unwrap();
    let listed: Value = serde_json::from_slice(&list.stdout).unwrap_or(Value::Null);
    let count = listed["tasks"]
        .as_array()
        .or_else(|| listed.as_array())
        .map(Vec::len)
        .unwrap_or(usize::MAX);
    assert_eq!(
        count, 3,
        "three tasks, none for the refused submission: {listed}"
    );
}

//! "I have a repository and an agent": a real public project with its own
//! test suite (more-itertools 10.5.0, the sdist from PyPI, pure Python,
//! tested with unittest), imported with `airlock-local up --repo`, changed
//! by planners through `airlockctl propose` and verified by the project's
//! own suite in the sandbox.
//!
//! - a planner clones it (`airlockctl repo clone`), edits the work tree and
//!   proposes with `--worktree`: SUCCEEDED, its commit on agent/<id>;
//! - another proposes a breaking `--patch`: FAILED, no branch, and the
//!   evidence's output tail names the failing test.
//!
//! Prints the task times beside the suite's bare run time on this machine.
//! The sdist is cached under target/e2e-cache (checked by SHA-256); without
//! it and without a reachable PyPI the test fails saying so.

use airlock_testkit::git;
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const PROJECT: &str = "more-itertools";
const VERSION: &str = "10.5.0";
const SDIST_SHA256: &str = "5482bfef7849c25dc3c6dd53a6173ae4795da2a41a80faea6700d9f5846c5da6";
const SUITE: &str = "python3 -m unittest -q";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn sha256_of(path: &Path) -> String {
    airlock_proto::canonical::sha256_hex(&std::fs::read(path).unwrap())
}

/// The sdist, from the cache or PyPI.
fn sdist() -> PathBuf {
    let cache = workspace().join("target/e2e-cache");
    std::fs::create_dir_all(&cache).unwrap();
    let file = cache.join(format!("{PROJECT}-{VERSION}.tar.gz"));
    if !file.exists() {
        let pip = ["pip3", "pip"]
            .into_iter()
            .find(|p| {
                Command::new(p)
                    .arg("--version")
                    .output()
                    .is_ok_and(|o| o.status.success())
            })
            .unwrap_or_else(|| {
                panic!(
                    "{} is not cached and pip is not installed to fetch it from PyPI",
                    file.display()
                )
            });
        let out = Command::new(pip)
            .args([
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                "--timeout",
                "60",
                "-d",
            ])
            .arg(&cache)
            .arg(format!("{PROJECT}=={VERSION}"))
            .output()
            .unwrap();
        assert!(
            out.status.success() && file.exists(),
            "cannot fetch {PROJECT} {VERSION} from PyPI (is the registry reachable?): {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(
        sha256_of(&file),
        SDIST_SHA256,
        "{} is not the pinned sdist",
        file.display()
    );
    file
}

/// The project as its maintainers' repository would be: the sdist, committed on main.
fn project(dir: &Path) -> PathBuf {
    let status = Command::new("tar")
        .arg("-xzf")
        .arg(sdist())
        .arg("-C")
        .arg(dir)
        .status()
        .unwrap();
    assert!(status.success());
    let src = dir.join(format!("{PROJECT}-{VERSION}"));
    git(&src, &["init", "-q", "-b", "main"]);
    git(&src, &["add", "-A"]);
    git(
        &src,
        &[
            "commit",
            "-q",
            "-m",
            &format!("{PROJECT} {VERSION} (sdist)"),
        ],
    );
    src
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// The suite run bare (no airlock) three times in a copy; the median.
fn bare_suite(src: &Path, scratch: &Path) -> Duration {
    let copy = scratch.join("bare");
    git(scratch, &["clone", "-q", src.to_str().unwrap(), "bare"]);
    let runs = (0..3)
        .map(|_| {
            let t = Instant::now();
            let out = Command::new("/usr/bin/python3")
                .args(["-m", "unittest", "-q"])
                .current_dir(&copy)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "the bare suite fails: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            t.elapsed()
        })
        .collect();
    median(runs)
}

/// airlockctl with nothing exported: `--config` names the stack, whose
/// bus airlock-local recorded in it (`supervisor.bus_address`).
fn airlockctl(args: &[&str]) -> (Output, Duration) {
    let ctl = airlock_local::sibling("airlockctl").unwrap();
    let t = Instant::now();
    let out = Command::new(ctl)
        .env_remove("DBUS_SYSTEM_BUS_ADDRESS")
        .args(args)
        .output()
        .unwrap();
    (out, t.elapsed())
}

/// The last JSON line `propose --json --wait` printed: task, state, result.
fn last_json(out: &Output) -> Value {
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| {
            panic!(
                "no JSON in {text}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    serde_json::from_str(line).unwrap()
}

#[test]
fn a_real_project_proposed_from_a_worktree_succeeds_and_a_breaking_patch_fails_naming_the_test() {
    let scratch = tempfile::tempdir().unwrap();
    // Every component user must reach the state directory (the pre-flight check says so otherwise).
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let src = project(scratch.path());
    let bare = bare_suite(&src, scratch.path());

    let state = scratch.path().join("state");
    let suite = airlock_local::start_with(
        state.clone(),
        true,
        &airlock_local::Tuning {
            repositories: vec![("moreit".into(), src.clone())],
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("starting airlock-local: {e}"));
    let config = suite.layout.config();
    let cfg = config.to_str().unwrap();
    let authority = suite.layout.repos().join("moreit.git");
    let branch_head = |branch: &str| {
        Command::new("git")
            .arg(format!("--git-dir={}", authority.display()))
            .args([
                "rev-parse",
                "--verify",
                "--quiet",
                &format!("refs/heads/{branch}"),
            ])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };

    // Planner one: a clone, an edit, --worktree.
    let work = scratch.path().join("planner-1");
    let ctl = airlock_local::sibling("airlockctl").unwrap();
    let cloned = Command::new(&ctl)
        .args([
            "repo",
            "--config",
            cfg,
            "clone",
            "moreit",
            work.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        cloned.status.success(),
        "{}",
        String::from_utf8_lossy(&cloned.stderr)
    );
    let more = work.join("more_itertools/more.py");
    let text = std::fs::read_to_string(&more).unwrap();
    std::fs::write(
        &more,
        text.replacen(
            "    :func:`first` is useful when",
            "    *default* may be ``None``, which is returned as is.\n\n    :func:`first` is useful when",
            1,
        ),
    )
    .unwrap();
    let tests = work.join("tests/test_more.py");
    let text = std::fs::read_to_string(&tests).unwrap();
    std::fs::write(
        &tests,
        text.replacen(
            "    def test_default(self):\n        self.assertEqual(mi.first([], 'boo'), 'boo')\n",
            "    def test_default(self):\n        self.assertEqual(mi.first([], 'boo'), 'boo')\n\n    def test_default_none(self):\n        self.assertIsNone(mi.first([], None))\n",
            1,
        ),
    )
    .unwrap();
    let (out, good_time) = airlockctl(&[
        "--json",
        "propose",
        "--config",
        cfg,
        "--repo",
        "moreit",
        "--base",
        "main",
        "--worktree",
        work.to_str().unwrap(),
        "--verify",
        SUITE,
        "--timeout",
        "600",
        "--max-attempts",
        "1",
        "--wait",
    ]);
    let good = last_json(&out);
    assert!(
        out.status.success(),
        "{good}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(good["state"], "SUCCEEDED", "{good}");
    let commit = good["result"]["commit_oid"]
        .as_str()
        .expect("a commit")
        .to_owned();
    let good_id = good["task_id"].as_str().unwrap();
    // Every command reaches the stack the same way.
    let (shown, _) = airlockctl(&["--config", cfg, "--json", "show", good_id]);
    assert!(
        shown.status.success(),
        "show --config: {}",
        String::from_utf8_lossy(&shown.stderr)
    );
    assert_eq!(last_json(&shown)["state"], "SUCCEEDED");
    assert_eq!(
        branch_head(&format!("agent/{good_id}")).as_deref(),
        Some(commit.as_str())
    );
    let changed = git(
        &work,
        &["fetch", "-q", "origin", &format!("agent/{good_id}")],
    );
    let _ = changed;
    let diff = git(&work, &["diff", "--stat", "HEAD", "FETCH_HEAD"]);
    assert!(
        diff.contains("more_itertools/more.py") && diff.contains("tests/test_more.py"),
        "{diff}"
    );
    let good_suite_ms = good["result"]["verification"][0]["duration_ms"]
        .as_u64()
        .unwrap();

    // Planner two: a breaking patch, as `git diff` writes it.
    let other = scratch.path().join("planner-2");
    git(
        scratch.path(),
        &[
            "clone",
            "-q",
            src.to_str().unwrap(),
            other.to_str().unwrap(),
        ],
    );
    let more = other.join("more_itertools/more.py");
    let text = std::fs::read_to_string(&more).unwrap();
    let broken = text.replacen(
        "            'default value was provided.'\n        )\n    return default\n",
        "            'default value was provided.'\n        )\n    return None\n",
        1,
    );
    assert_ne!(broken, text);
    std::fs::write(&more, broken).unwrap();
    let patch = scratch.path().join("break.patch");
    std::fs::write(&patch, git(&other, &["diff"]) + "\n").unwrap();
    let (out, bad_time) = airlockctl(&[
        "--json",
        "propose",
        "--config",
        cfg,
        "--repo",
        "moreit",
        "--base",
        "main",
        "--patch",
        patch.to_str().unwrap(),
        "--verify",
        SUITE,
        "--timeout",
        "600",
        "--max-attempts",
        "1",
        "--wait",
    ]);
    let bad = last_json(&out);
    assert_eq!(out.status.code(), Some(1), "a FAILED task exits 1: {bad}");
    assert_eq!(bad["state"], "FAILED", "{bad}");
    assert_eq!(bad["result"]["failure_code"], "VERIFICATION_FAILED");
    let bad_id = bad["task_id"].as_str().unwrap();
    assert_eq!(
        branch_head(&format!("agent/{bad_id}")),
        None,
        "no branch for a failed task"
    );
    let evidence = &bad["result"]["verification"][0];
    assert_ne!(evidence["exit_code"], 0);
    let tail = format!(
        "{}{}",
        evidence["stdout_tail"].as_str().unwrap_or(""),
        evidence["stderr_tail"].as_str().unwrap_or("")
    );
    assert!(
        tail.contains("FirstTests.test_default"),
        "the tail names the failing test: {tail}"
    );

    println!("\n{PROJECT} {VERSION}: {SUITE}");
    println!(
        "  bare suite, median of 3 runs        {:>8.2} s",
        bare.as_secs_f64()
    );
    println!(
        "  --worktree task, submit → SUCCEEDED  {:>8.2} s  (suite inside the sandbox {:.2} s; task / bare {:.1}x)",
        good_time.as_secs_f64(),
        good_suite_ms as f64 / 1000.0,
        good_time.as_secs_f64() / bare.as_secs_f64()
    );
    println!(
        "  --patch task, submit → FAILED        {:>8.2} s  (task / bare {:.1}x)",
        bad_time.as_secs_f64(),
        bad_time.as_secs_f64() / bare.as_secs_f64()
    );
    drop(suite);
}

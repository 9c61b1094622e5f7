//! README.md, tested as written (issue 42, item 3): every fenced command
//! block of "The two commands" and the airlock-local path of "Use it on
//! your own repository" is read from the README and run on a fresh state,
//! so a README that drifts from the code fails here.
//!
//! What a test must substitute, and nothing else: the binaries are this
//! build's (`target/release/X` is the `X` beside the test, already built:
//! `cargo build` is not run again), `/home/alice/calc` a repository made
//! here, `/var/lib/airlock-local` a temporary state directory, `sudo` the
//! test itself (root), `<task id>` the id the proposal printed. Of "The two
//! commands", `./scripts/test` is what CI runs (`.ci/run` calls it) and
//! `./scripts/demo` builds the demo profile and then runs `airlock-local
//! demo`, which is what runs here (`demo.rs` checks its output in full).

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn readme() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The text of the `## heading` section, up to the next `## `.
fn section<'a>(text: &'a str, heading: &str) -> &'a str {
    let start = text
        .find(&format!("\n## {heading}\n"))
        .unwrap_or_else(|| panic!("README.md has no section {heading:?}"));
    let rest = &text[start + 1..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |e| e + 3);
    &rest[..end]
}

/// The ```sh blocks of `text`, in order.
fn blocks(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("```sh\n") {
        let body = &rest[start + 6..];
        let end = body.find("```").expect("a closed block");
        out.push(body[..end].to_owned());
        rest = &body[end + 3..];
    }
    out
}

/// A block's commands: continuation lines joined, comments and blank
/// lines dropped, each split as a shell would split it.
fn commands(block: &str) -> Vec<Vec<String>> {
    block
        .replace("\\\n", " ")
        // One word, replaced when the proposal has printed the id.
        .replace("<task id>", "@TASK@")
        .lines()
        .map(|l| match l.find(" #") {
            Some(i) => &l[..i],
            None if l.trim_start().starts_with('#') => "",
            None => l,
        })
        .filter(|l| !l.trim().is_empty())
        .map(|l| shlex::split(l).unwrap_or_else(|| panic!("cannot split {l:?}")))
        .collect()
}

#[test]
fn the_two_commands_are_the_scripts_ci_runs_and_the_demo_succeeds() {
    let text = readme();
    let found = blocks(section(&text, "The two commands"));
    assert_eq!(found.len(), 1, "one block of two commands");
    let cmds = commands(&found[0]);
    assert_eq!(cmds, [vec!["./scripts/demo"], vec!["./scripts/test"]]);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for script in ["scripts/demo", "scripts/test"] {
        let mode = std::fs::metadata(root.join(script))
            .unwrap()
            .permissions()
            .mode();
        assert!(mode & 0o111 != 0, "{script} is not executable");
    }
    let ci = std::fs::read_to_string(root.join(".ci/run")).unwrap();
    assert!(
        ci.contains("scripts/test"),
        ".ci/run does not run scripts/test:\n{ci}"
    );
    let demo = std::fs::read_to_string(root.join("scripts/demo")).unwrap();
    assert!(
        demo.contains("exec target/demo/airlock-local demo"),
        "scripts/demo no longer ends in airlock-local demo"
    );
    let out = Command::new(airlock_local::sibling("airlock-local").unwrap())
        .arg("demo")
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && printed.contains("SUCCEEDED"),
        "airlock-local demo: {printed}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `/home/alice/calc`: a repository with a unittest suite.
fn calc(dir: &Path) -> PathBuf {
    let repo = dir.join("calc");
    std::fs::create_dir_all(&repo).unwrap();
    std::fs::write(repo.join("calc.py"), "def add(a, b):\n    return a - b\n").unwrap();
    std::fs::write(
        repo.join("test_calc.py"),
        "import unittest\nfrom calc import add\n\n\nclass T(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n",
    )
    .unwrap();
    for args in [
        &["init", "-q", "-b", "main"][..],
        &["add", "-A"],
        &[
            "-c",
            "user.name=alice",
            "-c",
            "user.email=alice@example.invalid",
            "commit",
            "-q",
            "-m",
            "calc",
        ],
    ] {
        let ok = Command::new("git")
            .current_dir(&repo)
            .args(args)
            .status()
            .unwrap();
        assert!(ok.success(), "git {args:?}");
    }
    repo
}

#[test]
fn the_airlock_local_path_runs_as_written() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root (the README's sudo; airlock-local's own uids): run it as root"
    );
    let text = readme();
    let own = section(&text, "Use it on your own repository");
    let local = &own[own
        .find("**With airlock-local**")
        .expect("the airlock-local path")..];
    let block = blocks(local).into_iter().next().expect("its block");
    let cmds = commands(&block);
    let scratch = tempfile::tempdir().unwrap();
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let repo = calc(scratch.path());
    let state = scratch.path().join("state");
    let substitute = |arg: &str, task: &str| -> String {
        arg.replace("/var/lib/airlock-local", &state.display().to_string())
            .replace("/home/alice/calc", &repo.display().to_string())
            .replace("@TASK@", task)
    };
    let program = |word: &str| -> PathBuf {
        let name = word
            .strip_prefix("target/release/")
            .unwrap_or_else(|| panic!("a command the test cannot run: {word}"));
        airlock_local::sibling(name).unwrap()
    };
    let mut up = None;
    let mut task = String::new();
    let mut ran = Vec::new();
    for cmd in &cmds {
        let words: Vec<&str> = cmd
            .iter()
            .map(String::as_str)
            .skip_while(|w| *w == "sudo")
            .collect();
        match words.as_slice() {
            ["cargo", "build", "--release", "--workspace", "--bins"] => {
                ran.push("cargo build (this build's binaries)".to_owned());
            }
            [bin, "up", rest @ ..] => {
                let mut child = Command::new(program(bin))
                    .arg("up")
                    .arg("--state")
                    .arg(&state)
                    .args(rest.iter().map(|a| substitute(a, "")))
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap();
                // Running once it says so; what it printed must name
                // the configuration the next commands use.
                let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
                let deadline = Instant::now() + Duration::from_secs(120);
                let mut printed = String::new();
                while !printed.contains("propose:") {
                    assert!(Instant::now() < deadline, "airlock-local up: {printed}");
                    let line = lines.next().expect("up exited").unwrap();
                    printed.push_str(&line);
                    printed.push('\n');
                }
                assert!(
                    printed.contains(&format!(
                        "airlockctl --config {}",
                        state.join("airlock.toml").display()
                    )),
                    "up prints another way to reach it:\n{printed}"
                );
                std::thread::spawn(move || lines.for_each(drop));
                // The planner's edit in the worktree, then the proposal.
                std::fs::write(repo.join("calc.py"), "def add(a, b):\n    return a + b\n").unwrap();
                up = Some(child);
                ran.push("airlock-local up".to_owned());
            }
            [bin, rest @ ..] => {
                assert!(up.is_some(), "{words:?} before airlock-local up");
                let out = Command::new(program(bin))
                    .env_remove("DBUS_SYSTEM_BUS_ADDRESS")
                    .args(rest.iter().map(|a| substitute(a, &task)))
                    .output()
                    .unwrap();
                let printed = String::from_utf8_lossy(&out.stdout).into_owned();
                assert!(
                    out.status.success(),
                    "{words:?}: {printed}\n{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                if let Some(at) = printed.find(" on agent/") {
                    task = printed[at + 10..]
                        .split(|c: char| c == ':' || c.is_whitespace())
                        .next()
                        .unwrap_or_default()
                        .to_owned();
                }
                if rest.contains(&"show") {
                    assert!(printed.contains("SUCCEEDED"), "show: {printed}");
                }
                ran.push(
                    rest.iter()
                        .find(|w| !w.starts_with('-') && !w.contains('/'))
                        .map_or(String::new(), |w| (*w).to_owned()),
                );
            }
            [] => {}
        }
    }
    if let Some(mut child) = up {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGINT,
        );
        let _ = child.wait();
    }
    assert!(!task.is_empty(), "no task was proposed: {ran:?}");
    assert!(
        ran.iter().any(|r| r == "show"),
        "the block shows the task: {ran:?}"
    );
}

//! git's writes across a power loss, on airlock's power-loss file system in
//! its strictest mode (unsynced data dropped, directory operations whose
//! directory was not synced dropped, unsynced writes torn at 4 KiB).
//!
//! The worker's governed commit and its compare-and-swap, and an import,
//! made through crates/git, survive: `git fsck --full` is clean and the
//! branch names the commit. The control makes the same commit with git's
//! default settings, which sync neither loose objects nor refs, and loses
//! it — so the first test's file system does drop what it claims.

use airlock_git::{AuthorityRepo, CommitSpec, FileChange, ForeignRepo};
use airlock_powerloss::PowerFs;
use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> std::process::Output {
    Command::new("/usr/bin/git")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@t.invalid")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@t.invalid")
        .args(["-c", "safe.directory=*"])
        .args(args)
        .output()
        .unwrap()
}

fn ok(args: &[&str]) -> String {
    let out = git(args);
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A source work tree (on an ordinary file system) with one commit.
fn source(dir: &Path) -> String {
    std::fs::create_dir_all(dir).unwrap();
    let d = dir.to_str().unwrap();
    ok(&["-C", d, "init", "-q", "-b", "main"]);
    std::fs::write(dir.join("calc.py"), "def add(a, b):\n    return a - b\n").unwrap();
    ok(&["-C", d, "add", "-A"]);
    ok(&["-C", d, "commit", "-q", "-m", "base"]);
    ok(&["-C", d, "rev-parse", "HEAD"])
}

/// The authority repository on the power-loss file system, imported as
/// `repo add` imports.
fn authority(fs: &PowerFs, src: &Path) -> std::path::PathBuf {
    let path = fs.path().join("calc.git");
    airlock_git::mirror(&ForeignRepo::open(src).unwrap(), &path).unwrap();
    path
}

fn fsck(repo: &Path) -> std::process::Output {
    git(&[&format!("--git-dir={}", repo.display()), "fsck", "--full"])
}

#[test]
fn an_import_then_a_governed_commit_and_its_ref_survive_a_power_loss() {
    let tmp = tempfile::tempdir().unwrap();
    let base = source(&tmp.path().join("src"));
    let fs = airlock_powerloss::mount();
    let repo_path = authority(&fs, &tmp.path().join("src"));
    let repo = AuthorityRepo::open(&repo_path).unwrap();
    let commit = repo
        .governed_commit(&CommitSpec {
            parent: base.clone(),
            changes: vec![FileChange::write(
                "calc.py",
                b"def add(a, b):\n    return a + b\n".to_vec(),
                false,
            )],
            message: "airlock: task-1 attempt 1".into(),
        })
        .unwrap();
    repo.cas_update("agent/task-1", &commit, None).unwrap();

    fs.power_loss();

    let out = fsck(&repo_path);
    assert!(
        out.status.success(),
        "fsck after the power loss: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let at = format!("--git-dir={}", repo_path.display());
    assert_eq!(ok(&[&at, "rev-parse", "refs/heads/agent/task-1"]), commit);
    assert_eq!(ok(&[&at, "rev-parse", "refs/heads/main"]), base);
    assert_eq!(ok(&[&at, "rev-parse", "HEAD"]), base);
    assert_eq!(
        ok(&[&at, "show", &format!("{commit}:calc.py")]),
        "def add(a, b):\n    return a + b"
    );
}

#[test]
fn control_the_same_commit_with_gits_defaults_is_lost() {
    let tmp = tempfile::tempdir().unwrap();
    let base = source(&tmp.path().join("src"));
    let fs = airlock_powerloss::mount();
    let repo_path = authority(&fs, &tmp.path().join("src"));
    let at = format!("--git-dir={}", repo_path.display());
    // What the worker does, with git's default settings (no core.fsync).
    let blob = {
        let mut child = Command::new("/usr/bin/git")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .args([
                "-c",
                "safe.directory=*",
                &at,
                "hash-object",
                "-w",
                "--stdin",
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"def add(a, b):\n    return a + b\n")
            .unwrap();
        let out = child.wait_with_output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let tree = {
        let mut child = Command::new("/usr/bin/git")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .args(["-c", "safe.directory=*", &at, "mktree"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(format!("100644 blob {blob}\tcalc.py\n").as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let commit = ok(&[&at, "commit-tree", "-p", &base, "-m", "control", &tree]);
    ok(&[&at, "update-ref", "refs/heads/agent/control", &commit]);

    fs.power_loss();

    let intact = fsck(&repo_path).status.success()
        && git(&[
            &at,
            "rev-parse",
            "--verify",
            "--quiet",
            "refs/heads/agent/control",
        ])
        .status
        .success()
        && git(&[&at, "cat-file", "-e", &commit]).status.success();
    assert!(
        !intact,
        "the unsynced commit survived: the file system dropped nothing, so the other tests prove nothing"
    );
    // The import itself, synced, is still whole.
    assert_eq!(ok(&[&at, "rev-parse", "refs/heads/main"]), base);
}

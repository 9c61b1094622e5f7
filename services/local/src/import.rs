//! `airlock-local up --repo NAME=PATH`: the caller's repository, imported
//! into the state directory as `repos/NAME.git`, where the worker is its
//! only writer (as `airlockctl repo add` does on an installed system).
//!
//! The first `up` makes a bare copy (never hard links: the worker's chown
//! must not take the caller's files). A later `up` brings it up to date
//! with the caller's branches and tags, except `agent/*`, which only the
//! worker writes; this happens before the worker starts.

use crate::layout::{self, Ids, Layout};
use std::path::Path;
use std::process::Command;

fn git(trusted: &Path) -> Command {
    let mut c = Command::new("git");
    c.env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_TERMINAL_PROMPT", "0")
        .arg("-c")
        .arg(format!("safe.directory={}", trusted.display()))
        .arg("-c")
        .arg(format!("safe.directory={}/.git", trusted.display()));
    c
}

fn run(mut cmd: Command, what: &str) -> Result<String, String> {
    let out = cmd
        .output()
        .map_err(|e| format!("{what}: cannot run git: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Imports (or updates) `name` from `from`.
pub fn repository(layout: &Layout, ids: &Ids, name: &str, from: &Path) -> Result<(), String> {
    let source = std::fs::canonicalize(from)
        .map_err(|e| format!("--repo {name}={}: {e}", from.display()))?;
    let mut probe = git(&source);
    probe
        .arg("-C")
        .arg(&source)
        .args(["rev-parse", "--git-dir"]);
    run(
        probe,
        &format!("--repo {name}={}: not a git repository", source.display()),
    )?;
    let target = layout.repos().join(format!("{name}.git"));
    if target.exists() {
        // Branches and tags from the caller; agent/* stays the worker's.
        let mut fetch = git(&target);
        fetch
            .arg(format!("--git-dir={}", target.display()))
            .arg("-c")
            .arg(format!("safe.directory={}", source.display()))
            .args(["fetch", "--quiet", "--no-write-fetch-head", "--upload-pack"])
            .arg(format!(
                "git -c safe.directory={0} -c safe.directory={0}/.git upload-pack",
                source.display()
            ))
            .arg(&source)
            .args([
                "+refs/heads/*:refs/heads/*",
                "^refs/heads/agent/*",
                "+refs/tags/*:refs/tags/*",
            ]);
        run(fetch, &format!("updating {name} from {}", source.display()))?;
    } else {
        let mut clone = git(&source);
        // The source may be another user's: trusted for this clone only.
        clone
            .args(["clone", "--quiet", "--bare", "--no-local", "--upload-pack"])
            .arg(format!(
                "git -c safe.directory={0} -c safe.directory={0}/.git upload-pack",
                source.display()
            ))
            .arg(&source)
            .arg(&target);
        run(
            clone,
            &format!("importing {name} from {}", source.display()),
        )?;
        let mut unlink = git(&target);
        unlink
            .arg(format!("--git-dir={}", target.display()))
            .args(["remote", "remove", "origin"]);
        run(unlink, "forgetting the source")?;
    }
    layout::chown_tree(&target, ids.worker, ids)
        .map_err(|e| format!("giving {} to the worker: {e}", target.display()))
}

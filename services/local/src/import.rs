//! `airlock-local up --repo NAME=PATH`: the caller's repository, imported
//! into the state directory as `repos/NAME.git`, where the worker is its
//! only writer (as `airlockctl repo add` does on an installed system).
//!
//! The first `up` makes a bare copy (never hard links: the worker's chown
//! must not take the caller's files). A later `up` brings it up to date
//! with the caller's branches and tags, except `agent/*`, which only the
//! worker writes; this happens before the worker starts. Both are
//! crates/git's [`airlock_git::mirror`] of a repository owned by someone
//! else: nothing runs in the source's context but hardened read-only
//! plumbing, and no part of the path reaches a shell.
//!
//! At start, [`sweep`] removes what an interrupted `airlockctl repo add`
//! (on this state directory's configuration) left in `repos/`.

use crate::layout::{self, Ids, Layout};
use std::path::Path;

/// Imports (or updates) `name` from `from`.
pub fn repository(layout: &Layout, ids: &Ids, name: &str, from: &Path) -> Result<(), String> {
    let fail = |what: String| {
        move |e: airlock_git::GitError| format!("{what}: {e} [{}]", e.code().as_str())
    };
    let source = airlock_git::ForeignRepo::open(from)
        .map_err(fail(format!("--repo {name}={}", from.display())))?;
    let target = layout.repos().join(format!("{name}.git"));
    airlock_git::mirror(&source, &target)
        .map_err(fail(format!("importing {name} from {}", from.display())))?;
    layout::chown_tree(&target, ids.worker, ids)
        .map_err(|e| format!("giving {} to the worker: {e}", target.display()))
}

/// Makes `<repos>/NAME.git` an empty bare repository, owned by the worker,
/// unless it exists: an upstream-only repository, which the worker's first
/// sync fills.
pub fn empty(layout: &Layout, ids: &Ids, name: &str) -> Result<(), String> {
    let target = layout.repos().join(format!("{name}.git"));
    if target.join("HEAD").exists() {
        return Ok(());
    }
    airlock_git::init(airlock_git::default_program(), &target, true, "sha1")
        .map_err(|e| format!("making {}: {e} [{}]", target.display(), e.code().as_str()))?;
    layout::chown_tree(&target, ids.worker, ids)
        .map_err(|e| format!("giving {} to the worker: {e}", target.display()))
}

/// Removes what an interrupted `airlockctl repo add` left in `repos`
/// (`.NAME.git.tmp-PID` of a process gone,
/// [`airlock_git::remove_stale_imports`]), saying so on stderr.
pub fn sweep(repos: &Path) {
    match airlock_git::remove_stale_imports(repos) {
        Ok(found) => {
            for f in found {
                match f.removed {
                    Ok(()) => eprintln!(
                        "airlock-local: removed {}, left by an interrupted import (process {} is gone)",
                        f.path.display(),
                        f.pid
                    ),
                    Err(e) => eprintln!(
                        "airlock-local: cannot remove {}, left by an interrupted import: {e}",
                        f.path.display()
                    ),
                }
            }
        }
        Err(e) => eprintln!(
            "airlock-local: cannot look for interrupted imports in {}: {e}",
            repos.display()
        ),
    }
}

//! Issue 41 item 6: what an interrupted `airlockctl repo add` on this
//! stack's configuration leaves in `repos/` (`.NAME.git.tmp-PID`, root's
//! files: it was cut before the copy was given to the worker) is removed
//! when airlock-local starts next; an import whose process still runs
//! stays, and so does a name that only looks like a leftover.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

#[test]
fn airlock_local_removes_an_interrupted_imports_leftover_at_start() {
    let scratch = tempfile::tempdir().unwrap();
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let state = scratch.path().join("state");
    let repos = state.join("repos");
    std::fs::create_dir_all(&repos).unwrap();
    let mut gone = Command::new("true").spawn().unwrap();
    let dead = gone.id();
    gone.wait().unwrap();
    let leftover = repos.join(airlock_git::import_temp_name("calc", dead));
    std::fs::create_dir_all(leftover.join("objects/pack")).unwrap();
    std::fs::write(leftover.join("objects/pack/pack-1.pack"), "x").unwrap();
    let mut running = Command::new("sleep").arg("600").spawn().unwrap();
    let busy = repos.join(airlock_git::import_temp_name("busy", running.id()));
    std::fs::create_dir_all(busy.join("objects")).unwrap();
    let lookalike = repos.join(".calc.git.tmp-0042");
    std::fs::create_dir(&lookalike).unwrap();
    let started = airlock_local::start_with(state, true, &airlock_local::Tuning::default());
    let kept = (busy.join("objects").is_dir(), lookalike.is_dir());
    let removed = !leftover.exists();
    running.kill().unwrap();
    running.wait().unwrap();
    let suite = started.unwrap_or_else(|e| panic!("starting airlock-local: {e}"));
    assert!(removed, "{} is still there", leftover.display());
    assert_eq!(
        kept,
        (true, true),
        "an import in progress and a look-alike stay"
    );
    assert!(repos.join("demo.git/HEAD").is_file());
    drop(suite);
}

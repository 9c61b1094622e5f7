//! Issue 41 item 6: what an interrupted `airlockctl repo add` leaves in
//! the repository root (`.NAME.git.tmp-PID`) is removed when the worker
//! starts next — the real binary as the package's worker user (made by
//! systemd-sysusers from sysusers/airlock.conf when missing; run as root):
//! a leftover given to the worker already is removed and logged; one still
//! root's (cut before it was given away) is logged and left for the next
//! `repo add`; an import whose process runs, and a look-alike name, stay.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

fn dead_pid() -> u32 {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

/// A bare-repository-like tree at `path`, owned by `uid:gid`.
fn tree(path: &Path, uid: u32, gid: u32) {
    std::fs::create_dir_all(path.join("objects/pack")).unwrap();
    std::fs::write(path.join("objects/pack/pack-1.pack"), "x").unwrap();
    std::fs::write(path.join("HEAD"), "ref: refs/heads/main\n").unwrap();
    Command::new("chown")
        .arg("-R")
        .arg(format!("{uid}:{gid}"))
        .arg(path)
        .status()
        .unwrap();
}

#[test]
fn the_worker_removes_an_interrupted_imports_leftover_at_start() {
    assert!(
        nix::unistd::Uid::effective().is_root(),
        "the_worker_removes_an_interrupted_imports_leftover_at_start needs root (systemd-sysusers, the worker's own uid); CI runs the tests as root: run this one as root (sudo), it fails rather than pass without checking"
    );
    airlock_testkit::package_users();
    let worker = nix::unistd::User::from_name("airlock-worker")
        .unwrap()
        .unwrap();
    let (uid, gid) = (worker.uid.as_raw(), worker.gid.as_raw());
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    let state = d.join("state");
    let srv = d.join("srv");
    for p in [&state, &srv] {
        std::fs::create_dir(p).unwrap();
        nix::unistd::chown(p, Some(worker.uid), Some(worker.gid)).unwrap();
    }
    std::fs::set_permissions(&srv, std::fs::Permissions::from_mode(0o2750)).unwrap();
    let given = srv.join(airlock_git::import_temp_name("given", dead_pid()));
    tree(&given, uid, gid);
    let roots = srv.join(airlock_git::import_temp_name("roots", dead_pid()));
    tree(&roots, 0, 0);
    let running = airlock_testkit::Reap(Command::new("sleep").arg("600").spawn().unwrap());
    let busy = srv.join(airlock_git::import_temp_name("busy", running.0.id()));
    tree(&busy, uid, gid);
    let lookalike = srv.join(".given.git.tmp-0042");
    tree(&lookalike, uid, gid);
    let config = d.join("airlock.toml");
    std::fs::write(
        &config,
        format!(
            "[worker]\njournal = \"{s}/journal.sqlite3\"\nworkspace_root = \"{s}/ws\"\nrepository_root = \"{srv}\"\n\n[spool]\nroot = \"{d}/no-spool\"\n",
            s = state.display(),
            srv = srv.display(),
            d = d.display(),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();
    // It stops at the spool, which does not exist: after its start-up
    // clean-up, before any bus.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_airlock-worker"));
    cmd.arg("--config")
        .arg(&config)
        .args([
            "--executor-uid",
            "0",
            "--bus-address",
            "unix:path=/nonexistent",
        ])
        .env_clear()
        .env("AIRLOCK_LOG", "info")
        .current_dir(d);
    // SAFETY: between fork and exec only setgroups/setresgid/setresuid on
    // values prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::setgroups(&[nix::unistd::Gid::from_raw(gid)])?;
            let (g, u) = (
                nix::unistd::Gid::from_raw(gid),
                nix::unistd::Uid::from_raw(uid),
            );
            nix::unistd::setresgid(g, g, g)?;
            nix::unistd::setresuid(u, u, u)?;
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "no spool, no worker: {log}");
    assert!(
        !given.exists(),
        "{} is still there:\n{log}",
        given.display()
    );
    assert!(
        log.contains("removed the leftover of an interrupted import")
            && log.contains(&given.display().to_string()),
        "{log}"
    );
    assert!(
        roots.join("HEAD").exists(),
        "root's files are not the worker's"
    );
    assert!(
        log.contains("cannot remove the leftover of an interrupted import")
            && log.contains(&roots.display().to_string()),
        "{log}"
    );
    assert!(busy.join("HEAD").exists(), "an import in progress stays");
    assert!(lookalike.join("HEAD").exists(), "not a leftover's name");
}

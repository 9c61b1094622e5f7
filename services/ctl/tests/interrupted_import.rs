//! Issue 41 item 6: an interrupted `airlockctl repo add` (killed mid-import,
//! as a cut session's hang-up kills its process group) left
//! `.NAME.git.tmp-PID` in the repository root for good. The next `repo add`
//! removes it, and removes nothing else: an import whose process still
//! runs, a name that only looks like the pattern, and the target of a
//! link named like a leftover (the link itself goes) all stay. Run as
//! root with the package's real worker user (systemd-sysusers makes it
//! from sysusers/airlock.conf when missing).

use airlock_testkit::git;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn ctl() -> &'static str {
    env!("CARGO_BIN_EXE_airlockctl")
}

/// A process id that named a process a moment ago and names none now.
fn dead_pid() -> u32 {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

/// A repository with one large incompressible file, so that importing it
/// takes long enough to be interrupted.
fn large_repository(dir: &Path) -> PathBuf {
    let src = dir.join("large");
    std::fs::create_dir(&src).unwrap();
    git(&src, &["init", "-q", "-b", "main"]);
    let mut noise = vec![0u8; 48 << 20];
    getrandom::getrandom(&mut noise).unwrap();
    std::fs::write(src.join("noise.bin"), noise).unwrap();
    git(&src, &["add", "-A"]);
    git(&src, &["commit", "-q", "-m", "noise"]);
    src
}

#[test]
fn the_next_repo_add_removes_what_an_interrupted_one_left_and_nothing_else() {
    assert!(
        nix::unistd::Uid::effective().is_root(),
        "the_next_repo_add_removes_what_an_interrupted_one_left_and_nothing_else needs root (repo add gives the copy to the worker's uid); CI runs the tests as root: run this one as root (sudo), it fails rather than pass without checking"
    );
    airlock_testkit::package_users();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755)).unwrap();
    let srv = root.join("srv");
    let config = root.join("airlock.toml");
    std::fs::write(
        &config,
        format!("[worker]\nrepository_root = \"{}\"\n", srv.display()),
    )
    .unwrap();
    let cfg = config.to_str().unwrap();
    let large = large_repository(root);
    let small = root.join("small");
    std::fs::create_dir(&small).unwrap();
    git(&small, &["init", "-q", "-b", "main"]);
    std::fs::write(small.join("a.txt"), "a\n").unwrap();
    git(&small, &["add", "-A"]);
    git(&small, &["commit", "-q", "-m", "a"]);

    // 1. `repo add` killed mid-import, with its whole process group (its
    //    git children too), once its temporary copy exists.
    let mut add = Command::new(ctl())
        .args([
            "repo",
            "--config",
            cfg,
            "add",
            "large",
            "--no-reload",
            "--from",
        ])
        .arg(&large)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    let leftover = srv.join(airlock_git::import_temp_name("large", add.id()));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !leftover.exists() {
        assert!(
            add.try_wait().unwrap().is_none(),
            "repo add ended before its copy was seen"
        );
        assert!(Instant::now() < deadline, "no {}", leftover.display());
        std::thread::sleep(Duration::from_millis(1));
    }
    nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(add.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    add.wait().unwrap();
    // Its git children were in the group: nothing writes there any more.
    std::thread::sleep(Duration::from_millis(200));
    assert!(leftover.is_dir(), "the interrupted import left its copy");
    assert!(
        !srv.join("large.git").exists(),
        "the import was interrupted before its rename"
    );

    // 2. Beside it: an import in progress (its process lives), names that
    //    only look like leftovers, and a link named like one.
    let running = airlock_testkit::Reap(Command::new("sleep").arg("600").spawn().unwrap());
    let in_progress = srv.join(airlock_git::import_temp_name("busy", running.0.id()));
    std::fs::create_dir_all(in_progress.join("objects")).unwrap();
    let lookalikes = [
        srv.join(".large.git.tmp-0123"),
        srv.join("large.git.tmp-4"),
        srv.join(".large.git.tmp-"),
    ];
    for l in &lookalikes {
        std::fs::create_dir(l).unwrap();
    }
    let outside = root.join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("precious"), "keep").unwrap();
    let link = srv.join(airlock_git::import_temp_name("link", dead_pid()));
    std::os::unix::fs::symlink(&outside, &link).unwrap();

    // 3. The next `repo add` removes the leftovers and says so.
    let out = Command::new(ctl())
        .args([
            "repo",
            "--config",
            cfg,
            "add",
            "small",
            "--no-reload",
            "--from",
        ])
        .arg(&small)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(srv.join("small.git/HEAD").is_file());
    assert!(!leftover.exists(), "{} is still there", leftover.display());
    assert!(
        stderr.contains(&format!("removed {}", leftover.display())),
        "{stderr}"
    );
    assert!(
        std::fs::symlink_metadata(&link).is_err(),
        "the link is removed"
    );
    assert_eq!(
        std::fs::read_to_string(outside.join("precious")).unwrap(),
        "keep",
        "never followed"
    );
    assert!(
        in_progress.join("objects").is_dir(),
        "an import in progress stays"
    );
    for l in &lookalikes {
        assert!(l.is_dir(), "{} is not a leftover's name", l.display());
    }
}

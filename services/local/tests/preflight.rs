//! `airlock-local up` run as root with a state directory its component
//! users cannot reach (the reported case: under /root, 0700) stops at once,
//! naming the directory and the fix, and starts nothing.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn an_unreachable_state_directory_is_named_before_anything_starts() {
    assert!(
        nix::unistd::Uid::effective().is_root(),
        "an_unreachable_state_directory_is_named_before_anything_starts needs root (the components run as their own users only under root); CI runs the tests as root: run this one as root (sudo), it fails rather than pass without checking"
    );
    let dir = tempfile::tempdir().unwrap();
    let closed = dir.path().join("home");
    std::fs::create_dir(&closed).unwrap();
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let state = closed.join("state");
    let t = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_airlock-local"))
        .args(["up", "--state"])
        .arg(&state)
        .output()
        .unwrap();
    assert!(t.elapsed() < Duration::from_secs(10), "it failed fast");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nothing was started"), "{err}");
    assert!(
        err.contains(&format!(
            "{}: the user cannot enter it (mode 0700",
            closed.display()
        )),
        "{err}"
    );
    assert!(err.contains("--state /var/lib/airlock-local"), "{err}");
    assert!(!state.exists(), "nothing was created");
}

//! The supervisor confines itself (`Role::Supervisor`): from inside the
//! running daemon, the test build's SIGUSR2 probe finds a readable file
//! outside its grants refused by Landlock and process_vm_readv(2) refused
//! by seccomp; every thread shows NoNewPrivs 1 and Seccomp 2; and the
//! confined daemon still serves (submit, read back).

mod common;

use airlock_sandbox::probe::{PROBE_ENV, observe};
use common::*;
use std::time::Duration;

fn status_field(pid: u32, key: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_owned()))
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_running_supervisor_refuses_a_forbidden_path_and_system_call() {
    let secret = tempfile::tempdir().unwrap();
    let forbidden = secret.path().join("secret");
    std::fs::write(&forbidden, b"s").unwrap();
    let sup = Supervisor::start(Opts {
        env: vec![(PROBE_ENV.into(), forbidden.display().to_string())],
        ..Opts::default()
    });
    let seen = observe(sup.pid(), &sup.log_path(), Duration::from_secs(10)).unwrap();
    eprintln!("supervisor: {seen:?}");
    assert!(seen.no_new_privs.iter().all(|v| v == "1"), "{seen:?}");
    assert!(seen.seccomp.iter().all(|v| v == "2"), "{seen:?}");
    assert_eq!(
        seen.open,
        nix::libc::EACCES,
        "Landlock must refuse the path"
    );
    assert_eq!(
        seen.process_vm_readv,
        nix::libc::EPERM,
        "seccomp must refuse"
    );
    if nix::unistd::geteuid().is_root() {
        // Run as root it held CAP_SETPCAP, so it emptied its bounding set.
        assert_eq!(status_field(sup.pid(), "CapBnd:"), "0000000000000000");
    }
    // Still serving, with its database behind Landlock's grant.
    let conn = sup.client().await;
    let view = submit(&conn, "task-lockdown").await;
    assert_eq!(view["task"]["state"].as_str(), Some("QUEUED"), "{view}");
}

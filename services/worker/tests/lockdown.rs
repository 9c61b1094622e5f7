//! The worker confines itself (`Role::Worker`): from inside the running
//! daemon (on a private bus, no supervisor there yet), the test build's
//! SIGUSR2 probe finds a readable file outside its grants refused by
//! Landlock and process_vm_readv(2) refused by seccomp, and every thread
//! shows NoNewPrivs 1 and Seccomp 2. (The demo test, services/local, shows
//! the confined worker committing through git.)

use airlock_localbus::PrivateBus as TestBus;
use airlock_sandbox::probe::{PROBE_ENV, observe};
use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn the_running_worker_refuses_a_forbidden_path_and_system_call() {
    let bus = TestBus::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    airlock_spool::Spool::create_layout(&d.join("spool")).unwrap();
    let repo = d.join("repos").join("demo.git");
    assert!(
        Command::new("git")
            .args(["init", "-q", "--bare"])
            .arg(&repo)
            .status()
            .unwrap()
            .success()
    );
    let config = d.join("airlock.toml");
    std::fs::write(
        &config,
        format!(
            r#"[worker]
journal = "{d}/worker/journal.sqlite3"
workspace_root = "{d}/worker/ws"

[spool]
root = "{d}/spool"

[[repository]]
name = "demo"
path = "{repo}"
"#,
            d = d.display(),
            repo = repo.display()
        ),
    )
    .unwrap();
    let secret = tempfile::tempdir().unwrap();
    let forbidden = secret.path().join("secret");
    std::fs::write(&forbidden, b"s").unwrap();
    let notify_path = d.join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let log_path = d.join("worker.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_airlock-worker"))
        .arg("--config")
        .arg(&config)
        .args(["--bus-address", bus.address(), "--executor-uid", "0"])
        .env("NOTIFY_SOCKET", &notify_path)
        .env(PROBE_ENV, &forbidden)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut buf = [0u8; 4096];
    loop {
        if let Ok(n) = notify.recv(&mut buf) {
            if String::from_utf8_lossy(&buf[..n]).contains("READY=1") {
                break;
            }
        }
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        assert!(child.try_wait().unwrap().is_none(), "worker exited:\n{log}");
        assert!(Instant::now() < deadline, "worker not ready:\n{log}");
    }
    let seen = observe(child.id(), &log_path, Duration::from_secs(10));
    let _ = child.kill();
    let _ = child.wait();
    let seen = seen.unwrap();
    eprintln!("worker: {seen:?}");
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
}

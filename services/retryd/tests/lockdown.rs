//! retryd confines itself (`Role::Retryd`): from inside the running daemon,
//! the test build's SIGUSR2 probe finds a readable file outside its grants
//! refused by Landlock and process_vm_readv(2) refused by seccomp; every
//! thread shows NoNewPrivs 1 and Seccomp 2; and it still answers.

use airlock_sandbox::probe::{PROBE_ENV, observe};
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn the_running_retryd_refuses_a_forbidden_path_and_system_call() {
    let dir = tempfile::tempdir().unwrap();
    let bus = airlock_localbus::PrivateBus::start().expect("dbus-daemon");
    let config = dir.path().join("airlock.toml");
    std::fs::write(&config, "").unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "t".repeat(48)).unwrap();
    let forbidden = dir.path().join("secret");
    std::fs::write(&forbidden, b"s").unwrap();
    let log_path = dir.path().join("retryd.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_airlock-retryd"))
        .arg("--config")
        .arg(&config)
        .args(["--bus-address", bus.address()])
        .args(["--listen", "127.0.0.1:0", "--token-file"])
        .arg(&token_file)
        .env("AIRLOCK_RETRY_AUTHORIZATION_ID", "owner-scheme-a-20260817")
        .env("AIRLOCK_LOG", "info")
        .env(PROBE_ENV, &forbidden)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let addr = loop {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        if let Some(rest) = log.split("listening on ").nth(1) {
            break rest.lines().next().unwrap().trim().to_owned();
        }
        assert!(child.try_wait().unwrap().is_none(), "retryd exited:\n{log}");
        assert!(Instant::now() < deadline, "retryd not ready:\n{log}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let seen = observe(child.id(), &log_path, Duration::from_secs(10));
    // Still answering.
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    let _ = child.kill();
    let _ = child.wait();
    let seen = seen.unwrap();
    eprintln!("retryd: {seen:?}");
    assert!(reply.starts_with("HTTP/1.1 "), "{reply}");
    assert!(seen.no_new_privs.iter().all(|v| v == "1"), "{seen:?}");
    assert!(seen.seccomp.iter().all(|v| v == "2"), "{seen:?}");
    assert_eq!(seen.open, libc::EACCES, "Landlock must refuse the path");
    assert_eq!(seen.process_vm_readv, libc::EPERM, "seccomp must refuse");
}

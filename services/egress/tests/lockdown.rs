//! airlock-egress confines itself (`Role::Egress`): from inside the running
//! daemon, the test build's SIGUSR2 probe finds a readable file outside its
//! grants refused by Landlock and process_vm_readv(2) refused by seccomp;
//! every thread shows NoNewPrivs 1 and Seccomp 2; and it still answers.

use airlock_sandbox::probe::{PROBE_ENV, observe};
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn the_running_egress_proxy_refuses_a_forbidden_path_and_system_call() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("egress.sock");
    let forbidden = dir.path().join("secret");
    std::fs::write(&forbidden, b"s").unwrap();
    let log_path = dir.path().join("egress.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_airlock-egress"))
        .arg("--socket")
        .arg(&socket)
        .args(["--allow-uid", "0"])
        .env("AIRLOCK_LOG", "info")
        .env(PROBE_ENV, &forbidden)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        if log.contains("lockdown airlock-egress") {
            assert!(log.contains("landlock full"), "{log}");
            break;
        }
        assert!(child.try_wait().unwrap().is_none(), "exited:\n{log}");
        assert!(Instant::now() < deadline, "not ready:\n{log}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let seen = observe(child.id(), &log_path, Duration::from_secs(10));
    // Still answering (a refusal: no preamble).
    let mut s = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    s.write_all(b"not a preamble\n").unwrap();
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    let mode = std::fs::metadata(&socket).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let seen = seen.unwrap();
    eprintln!("egress: {seen:?}");
    assert!(reply.starts_with("HTTP/1.1 400 "), "{reply}");
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o660
    );
    assert!(seen.no_new_privs.iter().all(|v| v == "1"), "{seen:?}");
    assert!(seen.seccomp.iter().all(|v| v == "2"), "{seen:?}");
    assert_eq!(seen.open, libc::EACCES, "Landlock must refuse the path");
    assert_eq!(seen.process_vm_readv, libc::EPERM, "seccomp must refuse");
}

//! The executor's own confinement (the `Executor` role of
//! `airlock_sandbox::role`): in a forked child of the test process, what it
//! may and may not reach; and from inside the running `serve` daemon, a
//! forbidden path and a forbidden system call refused (the test build's
//! SIGUSR2 probe), with NoNewPrivs 1 and Seccomp 2 on every thread.

use airlock_executor::lockdown::{Paths, Slot, apply};
use airlock_sandbox::probe::{PROBE_ENV, observe};
use std::io::ErrorKind::PermissionDenied;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Runs `f` in a forked child (one thread, so lockdown accepts it) and
/// returns whether it succeeded.
fn in_child(f: impl FnOnce()) -> bool {
    // SAFETY: the child only runs `f` and exits without returning to the
    // harness; glibc's malloc is fork-safe, and the test's other threads
    // hold no lock the child needs.
    match unsafe { nix::unistd::fork() }.unwrap() {
        nix::unistd::ForkResult::Child => {
            let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_ok();
            // SAFETY: _exit ends the child without running the harness's atexit handlers.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) }
        }
        nix::unistd::ForkResult::Parent { child } => {
            matches!(
                nix::sys::wait::waitpid(child, None).unwrap(),
                nix::sys::wait::WaitStatus::Exited(_, 0)
            )
        }
    }
}

#[test]
fn the_executor_reaches_only_what_it_was_granted() {
    let base = tempfile::tempdir().unwrap();
    let (ro, rw, outside) = (
        base.path().join("ro"),
        base.path().join("rw"),
        base.path().join("outside"),
    );
    for d in [&ro, &rw, &outside] {
        std::fs::create_dir(d).unwrap();
    }
    std::fs::write(ro.join("request.json"), b"{}").unwrap();
    std::fs::write(outside.join("secret"), b"s").unwrap();
    std::fs::copy("/usr/bin/true", outside.join("true")).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();

    let ok = in_child(|| {
        let own = apply(
            &Paths::new()
                .with(Slot::SpoolRequests, &ro)
                .with(Slot::WorkRoot, &rw),
        )
        .unwrap();
        assert_eq!(own.status, "full");
        // Granted: read the worker's side, write its own.
        assert_eq!(std::fs::read(ro.join("request.json")).unwrap(), b"{}");
        std::fs::write(rw.join("result.json"), b"{}").unwrap();
        // Denied: writing the worker's side, anything outside, executing any
        // program at all (its spawner starts the commands), TCP.
        let denied = |r: std::io::Result<()>, what: &str| {
            assert_eq!(r.map_err(|e| e.kind()), Err(PermissionDenied), "{what}");
        };
        denied(std::fs::write(ro.join("planted.json"), b"x"), "write ro");
        denied(
            std::fs::read(outside.join("secret")).map(drop),
            "read outside",
        );
        denied(std::fs::read_dir(&outside).map(drop), "list outside");
        denied(std::fs::read_dir("/var").map(drop), "list /var");
        denied(std::fs::write("/etc/airlock-x", b"x"), "write /etc");
        denied(
            Command::new(outside.join("true")).status().map(drop),
            "exec outside",
        );
        denied(
            Command::new("/usr/bin/true").status().map(drop),
            "exec a system program",
        );
        denied(
            std::net::TcpStream::connect(("127.0.0.1", port)).map(drop),
            "tcp connect",
        );
        // seccomp: no tracing, no keyrings.
        // SAFETY: PTRACE_TRACEME takes no pointer; denied, it changes nothing.
        let r = unsafe { libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) };
        assert_eq!(r, -1);
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EPERM)
        );
    });
    assert!(ok, "the confined child failed (see its panic above)");
    // The test process itself is not confined.
    std::fs::write(base.path().join("outside").join("after"), b"x").unwrap();
}

#[test]
fn lockdown_refuses_a_process_that_already_has_threads() {
    // A thread started before lockdown would escape Landlock, so lockdown
    // must refuse a process that has one (this one, for certain).
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let other = std::thread::spawn(move || rx.recv());
    let err = apply(&Paths::new()).unwrap_err();
    drop(tx);
    let _ = other.join();
    assert!(err.to_string().contains("threads"), "{err}");
}

#[test]
fn the_running_executor_refuses_a_forbidden_path_and_system_call() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("spool");
    airlock_spool::Spool::create_layout(&root).unwrap();
    let secret = tempfile::tempdir().unwrap();
    let forbidden = secret.path().join("secret");
    std::fs::write(&forbidden, b"s").unwrap();
    let log_path = dir.path().join("executor.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut child = Command::new("unshare")
        .arg("-n")
        .arg(env!("CARGO_BIN_EXE_airlock-executor"))
        .args(["serve", "--worker-uid", "0", "--spool"])
        .arg(&root)
        .arg("--work")
        .arg(dir.path().join("work"))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env(PROBE_ENV, &forbidden)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(&log_path)
        .unwrap_or_default()
        .contains("serving")
    {
        assert!(child.try_wait().unwrap().is_none(), "executor exited");
        assert!(std::time::Instant::now() < deadline, "executor not ready");
        std::thread::sleep(Duration::from_millis(50));
    }
    let seen = observe(child.id(), &log_path, Duration::from_secs(10));
    let _ = child.kill();
    let _ = child.wait();
    let seen = seen.unwrap();
    eprintln!("executor: {seen:?}");
    assert!(seen.no_new_privs.iter().all(|v| v == "1"), "{seen:?}");
    assert!(seen.seccomp.iter().all(|v| v == "2"), "{seen:?}");
    assert_eq!(seen.open, libc::EACCES, "Landlock must refuse the path");
    assert_eq!(seen.process_vm_readv, libc::EPERM, "seccomp must refuse");
}

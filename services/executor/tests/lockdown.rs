//! The executor's own Landlock confinement, applied to one thread of the
//! test process (landlock_restrict_self confines the calling thread and
//! what it starts), so the rest of the test harness stays free.

use airlock_executor::lockdown::{Grants, apply};
use std::io::ErrorKind::PermissionDenied;

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
    std::fs::copy("/usr/bin/true", rw.join("helper")).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();

    let confined = std::thread::spawn(move || {
        let own = apply(
            &Grants {
                read: vec![ro.clone()],
                write: vec![rw.clone()],
                exec_files: vec![rw.join("helper")],
            },
            false,
        )
        .unwrap();
        assert_eq!(own.status, "full");
        // Granted: read the worker's side, write its own, run the helper and system programs.
        assert_eq!(std::fs::read(ro.join("request.json")).unwrap(), b"{}");
        std::fs::write(rw.join("result.json"), b"{}").unwrap();
        assert!(
            std::process::Command::new(rw.join("helper"))
                .status()
                .unwrap()
                .success()
        );
        assert!(
            std::process::Command::new("/usr/bin/true")
                .status()
                .unwrap()
                .success()
        );
        // Denied: writing the worker's side, anything outside, other programs, TCP.
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
        denied(
            std::fs::read("/etc/hostname")
                .map(drop)
                .and(std::fs::write("/etc/airlock-x", b"x")),
            "write /etc",
        );
        denied(
            std::process::Command::new(outside.join("true"))
                .status()
                .map(drop),
            "exec outside",
        );
        denied(
            std::net::TcpStream::connect(("127.0.0.1", port)).map(drop),
            "tcp connect",
        );
    });
    confined.join().unwrap();
    // The rest of the process is not confined.
    std::fs::write(base.path().join("outside").join("after"), b"x").unwrap();
}

//! One owner per store: a database file airlock creates is 0600, and so
//! are the `-wal` and `-shm` files SQLite makes beside it, so no other
//! uid — airlock-retry included — can open it (docs/privsep/compromise.md).

use airlock_taskdb::tasks::SqliteStore;
use std::os::unix::fs::PermissionsExt;

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

#[test]
fn a_new_task_database_is_owner_only() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let db = dir.path().join("tasks.sqlite3");
    let store = SqliteStore::open(&db).unwrap();
    store.integrity_check().unwrap();
    assert_eq!(mode(&db), 0o600);
    for side in ["tasks.sqlite3-wal", "tasks.sqlite3-shm"] {
        let p = dir.path().join(side);
        if p.exists() {
            assert_eq!(mode(&p), 0o600, "{side}");
        }
    }

    // Another uid cannot open it (as root, drop to nobody in a child).
    assert!(
        nix::unistd::geteuid().is_root(),
        "the other-uid half of this test needs root (it opens the database as uid 65534); CI runs the tests as root: run this one as root (sudo), it fails rather than pass without checking"
    );
    let db_c = std::ffi::CString::new(db.to_str().unwrap()).unwrap();
    // SAFETY: fork in a test process; the child only calls async-signal-safe
    // functions (setresgid, setresuid, open, _exit) before exiting.
    match unsafe { nix::unistd::fork() }.unwrap() {
        nix::unistd::ForkResult::Child => {
            // SAFETY: plain system calls on valid arguments; the child exits
            // with a status that encodes what happened.
            unsafe {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setresgid(65534, 65534, 65534) != 0
                    || libc::setresuid(65534, 65534, 65534) != 0
                {
                    libc::_exit(2);
                }
                let fd = libc::open(db_c.as_ptr(), libc::O_RDONLY);
                let errno = *libc::__errno_location();
                libc::_exit(if fd < 0 && errno == libc::EACCES {
                    0
                } else {
                    1
                });
            }
        }
        nix::unistd::ForkResult::Parent { child } => {
            let status = nix::sys::wait::waitpid(child, None).unwrap();
            assert_eq!(
                status,
                nix::sys::wait::WaitStatus::Exited(child, 0),
                "uid 65534 must get EACCES opening the task database"
            );
        }
    }
}

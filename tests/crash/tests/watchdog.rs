//! The worker pings systemd's watchdog only while its threads make
//! progress (issue 14): an attempt thread that wedges (blocks for good in
//! a step, while the lease renewer runs on) stops the pings, so systemd's
//! `WatchdogSec=` restarts the worker; an attempt that is slow but moving
//! (a verification command running for several watchdog intervals) keeps
//! them coming.
//!
//! The whole suite on real processes (airlock-local). The test plays
//! systemd's side of the notify protocol: `NOTIFY_SOCKET` is a datagram
//! socket it reads, `WATCHDOG_USEC` is 1 s. The worker is built with
//! `fault-injection`: `AIRLOCK_FAULT_WEDGE_AT=<phase>` blocks the attempt
//! thread after that checkpoint.

use airlock_crash_matrix::Stack;
use airlock_local::client::task_on_demo;
use airlock_proto::task::TaskState;
use airlock_testkit::eventually;
use serde_json::json;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::time::{Duration, Instant};

const WATCHDOG_USEC: &str = "1000000";

/// systemd's end of the notify socket.
struct Notify {
    _dir: tempfile::TempDir,
    path: PathBuf,
    socket: UnixDatagram,
}

impl Notify {
    fn new() -> Notify {
        let dir = tempfile::tempdir().unwrap();
        // The worker runs as its own user when the test is root.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let path = dir.path().join("notify");
        let socket = UnixDatagram::bind(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        Notify {
            _dir: dir,
            path,
            socket,
        }
    }

    /// Every notification received during `window`.
    fn during(&self, window: Duration) -> Vec<String> {
        let end = Instant::now() + window;
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while Instant::now() < end {
            if let Ok(n) = self.socket.recv(&mut buf) {
                got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
            }
        }
        got
    }

    /// Waits (up to `within`) for the first ping: a worker just restarted
    /// on a loaded machine may take a while to start pinging, and what the
    /// test counts is its pinging once started.
    fn first_ping(&self, within: Duration) -> bool {
        let end = Instant::now() + within;
        let mut buf = [0u8; 4096];
        while Instant::now() < end {
            if let Ok(n) = self.socket.recv(&mut buf) {
                if String::from_utf8_lossy(&buf[..n])
                    .lines()
                    .any(|l| l == "WATCHDOG=1")
                {
                    return true;
                }
            }
        }
        false
    }

    fn pings(&self, window: Duration) -> usize {
        self.during(window)
            .iter()
            .filter(|n| n.lines().any(|l| l == "WATCHDOG=1"))
            .count()
    }
}

/// What this test does with the shared [`Stack`].
trait Watchdog {
    fn submit_running(&self, task: &str, argv: serde_json::Value);
    fn log_has(&self, needle: &str, within: Duration) -> bool;
}

impl Watchdog for Stack {
    /// Submits `task` (one attempt), whose check runs `argv`.
    fn submit_running(&self, task: &str, argv: serde_json::Value) {
        let s = task_on_demo(
            task,
            &self.base,
            1,
            json!({"operation": "write_file", "path": format!("wd/{task}.txt"), "content": "x\n"}),
            json!([{"label": "check", "argv": argv, "timeout_seconds": 30}]),
        );
        self.submit(&s);
    }

    /// Whether the worker's log says `needle` within `within`.
    fn log_has(&self, needle: &str, within: Duration) -> bool {
        eventually(within, Duration::from_millis(50), || {
            std::fs::read_to_string(self.worker_log())
                .unwrap_or_default()
                .contains(needle)
        })
    }
}

#[test]
fn a_wedged_attempt_thread_gets_no_watchdog_pings_and_a_slow_one_does() {
    let mut s = Stack::start("watchdog-wedge");
    let notify = Notify::new();
    let socket = notify.path.to_str().unwrap().to_owned();
    s.restart_worker(&[
        ("NOTIFY_SOCKET", &socket),
        ("WATCHDOG_USEC", WATCHDOG_USEC),
        ("AIRLOCK_FAULT_WEDGE_AT", "workspace_prepared"),
    ]);
    // Idle, the worker pings (at half the interval).
    assert!(
        notify.first_ping(Duration::from_secs(30)),
        "the restarted worker never pinged"
    );
    let idle = notify.pings(Duration::from_secs(3));
    assert!(idle >= 3, "an idle worker pings: {idle} pings in 3 s");

    // The attempt thread blocks for good after workspace_prepared.
    s.submit_running("wd-wedged", json!(["/bin/true"]));
    assert!(
        s.log_has(
            "fault injection: wedged after workspace_prepared task wd-wedged",
            Duration::from_secs(20)
        ),
        "the attempt thread wedged"
    );
    // Allow one interval for the last pings sent before the wedge showed.
    let _ = notify.during(Duration::from_millis(1500));
    let wedged = notify.pings(Duration::from_secs(4));
    assert_eq!(wedged, 0, "a wedged attempt thread must stop the pings");
    assert!(
        s.log_has(
            "makes no progress: the watchdog is no longer pinged",
            Duration::from_secs(1)
        ),
        "the worker says why it stopped pinging"
    );
    // The lease renewer kept the lease alive meanwhile (it is not what
    // keeps the watchdog fed).
    let v = s.client.get_task("wd-wedged").unwrap();
    assert_eq!(v.state, TaskState::Running);

    // A fresh worker (what systemd's restart gives) resumes the attempt
    // from its journal, and pings through a command that runs for four
    // watchdog intervals.
    s.restart_worker(&[("NOTIFY_SOCKET", &socket), ("WATCHDOG_USEC", WATCHDOG_USEC)]);
    s.submit_running(
        "wd-slow",
        json!(["/usr/bin/python3", "-c", "import time; time.sleep(4)"]),
    );
    let pings = notify.pings(Duration::from_secs(4));
    assert!(
        pings >= 4,
        "a slow but moving attempt keeps the pings: {pings}"
    );
    let end = Instant::now() + Duration::from_secs(30);
    for task in ["wd-wedged", "wd-slow"] {
        loop {
            let v = s.client.get_task(task).unwrap();
            if v.state == TaskState::Succeeded {
                break;
            }
            assert!(Instant::now() < end, "{task} is {:?}", v.state);
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

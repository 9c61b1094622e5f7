//! The one caller-credential lookup against a real dbus-daemon: the uid
//! and pid it reports are the caller's own, and a name the daemon does not
//! know is refused, never read as anybody's.

use airlock_client::peer;
use airlock_localbus::PrivateBus;
use airlock_proto::Code;

#[tokio::test]
async fn the_bus_reports_the_senders_uid_and_pid_and_nothing_for_a_stranger() {
    let bus = PrivateBus::start().expect("dbus-daemon");
    let asker = bus.connect().await.unwrap();
    let caller = bus.connect().await.unwrap();
    let name = caller.unique_name().unwrap().to_string();
    let creds = peer::of_sender(&asker, &name).await.unwrap();
    assert_eq!(creds.sender, name);
    assert_eq!(creds.uid, nix_uid());
    assert_eq!(creds.pid, Some(std::process::id()));
    // A unique name nobody holds, and one that is not a name at all.
    for sender in [":1.999999", "not a bus name"] {
        let e = peer::of_sender(&asker, sender).await.unwrap_err();
        assert_eq!(e.code, Code::AUTHORIZATION_DENIED, "{sender}: {e}");
        assert!(e.to_string().contains(sender), "{e}");
    }
    assert_eq!(peer::no_sender().code, Code::AUTHORIZATION_DENIED);
}

/// This process's uid, as the kernel gave it to the socket.
fn nix_uid() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|u| u.parse().ok())
        .unwrap()
}

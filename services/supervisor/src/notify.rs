//! systemd notifications: READY, STATUS, STOPPING and the watchdog.
//!
//! Without `NOTIFY_SOCKET` every call is a no-op, so the daemon runs the
//! same by hand or under another init. The watchdog is pinged at half of
//! `WATCHDOG_USEC`, and only after a round trip through the task store
//! succeeds: a supervisor whose store is wedged stops pinging and systemd
//! restarts it.

use crate::ops::Ops;
use sd_notify::NotifyState;
use std::time::Duration;

fn send(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(false, states) {
        tracing::warn!("sd_notify failed: {e}");
    }
}

/// READY=1 with a status line.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// STATUS=…
pub fn status(status: &str) {
    send(&[NotifyState::Status(status)]);
}

/// STOPPING=1 with a status line.
pub fn stopping(status: &str) {
    send(&[NotifyState::Stopping, NotifyState::Status(status)]);
}

/// The watchdog ping interval: half of `WATCHDOG_USEC`, when the watchdog
/// is meant for this process (`WATCHDOG_PID` unset or ours), as
/// `sd_watchdog_enabled(3)` decides. Reads the environment, changes nothing.
pub fn watchdog_interval() -> Option<Duration> {
    interval_from(
        std::env::var("WATCHDOG_USEC").ok().as_deref(),
        std::env::var("WATCHDOG_PID").ok().as_deref(),
        std::process::id(),
    )
}

/// The pure part of [`watchdog_interval`].
pub fn interval_from(usec: Option<&str>, pid: Option<&str>, my_pid: u32) -> Option<Duration> {
    let usec: u64 = usec?.trim().parse().ok().filter(|u| *u > 0)?;
    if let Some(pid) = pid {
        if pid.trim().parse::<u32>().ok()? != my_pid {
            return None;
        }
    }
    Some(Duration::from_micros(usec / 2))
}

/// Pings the watchdog every `every` while the store answers.
pub async fn watchdog(ops: Ops, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match tokio::time::timeout(every, ops.probe()).await {
            Ok(Ok(())) => send(&[NotifyState::Watchdog]),
            Ok(Err(e)) => tracing::error!("store probe failed; withholding the watchdog ping: {e}"),
            Err(_) => tracing::error!("store probe timed out; withholding the watchdog ping"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_is_half_of_watchdog_usec_for_this_pid_only() {
        assert_eq!(
            interval_from(Some("30000000"), None, 7),
            Some(Duration::from_secs(15))
        );
        assert_eq!(
            interval_from(Some("30000000"), Some("7"), 7),
            Some(Duration::from_secs(15))
        );
        assert_eq!(interval_from(Some("30000000"), Some("8"), 7), None);
        assert_eq!(interval_from(Some("0"), None, 7), None);
        assert_eq!(interval_from(Some("x"), None, 7), None);
        assert_eq!(interval_from(None, Some("7"), 7), None);
    }
}

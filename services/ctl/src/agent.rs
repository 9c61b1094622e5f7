//! A polkit text agent for the duration of one command, as `systemctl`
//! does: when calls allow interactive authorisation and polkit's
//! `pkttyagent` is installed, it is started for this process (falling back
//! to any agent already registered) so polkit can ask for a password on
//! this terminal. Without `pkttyagent`, nothing happens: a desktop agent,
//! if any, answers instead.

use std::os::fd::{AsRawFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where polkit installs its text agent.
pub const PKTTYAGENT: &str = "/usr/bin/pkttyagent";

/// How long to wait for the agent to register.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(5);

/// The running agent; stopped when dropped.
#[derive(Debug)]
pub struct Agent {
    child: Child,
}

impl Agent {
    /// Starts `pkttyagent --process <our pid> --fallback`, waiting until
    /// it has registered (it closes its notify fd), or returns `None`.
    pub fn start() -> Option<Agent> {
        if !std::path::Path::new(PKTTYAGENT).exists() {
            return None;
        }
        // Without O_CLOEXEC the write end is inherited under the same number.
        let (read, write): (OwnedFd, OwnedFd) = nix::unistd::pipe().ok()?;
        let child = Command::new(PKTTYAGENT)
            .arg("--notify-fd")
            .arg(write.as_raw_fd().to_string())
            .arg("--process")
            .arg(std::process::id().to_string())
            .arg("--fallback")
            .stdin(Stdio::inherit())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .ok()?;
        drop(write);
        wait_closed(&read, REGISTER_TIMEOUT);
        Some(Agent { child })
    }
}

/// Waits until the other end of the pipe is closed, or the timeout.
fn wait_closed(read: &OwnedFd, timeout: Duration) {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        let mut fds = [PollFd::new(read.as_fd(), PollFlags::POLLIN)];
        let ms =
            PollTimeout::try_from(left.as_millis().min(60_000) as i32).unwrap_or(PollTimeout::NONE);
        match poll(&mut fds, ms) {
            Ok(0) => return,
            Ok(_) => {
                let mut buf = [0u8; 64];
                match nix::unistd::read(read.as_raw_fd(), &mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => continue,
                }
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return,
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

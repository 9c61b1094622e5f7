//! The sandbox's init: pid 1 of the command's own pid namespace, in a copy
//! of the spawner's mount namespace. It builds the command's view (the
//! workspace, /tmp, /proc, then pivot_root into the minimal root), forks
//! the command, reaps everything, and when the command exits kills
//! whatever is left before it reports and exits.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::prctl;
use nix::sys::signal::Signal;
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork};

use crate::report::{Message, Namespaces, Outcome};
use crate::root::Template;
use crate::sandbox::{CommandPlan, Job, send};
use crate::{exit_now, namespaces, reaper, target};

/// The init's descriptors from the spawner.
pub(crate) struct Channels {
    /// Messages to the spawner (closed by the command's execve).
    pub status: File,
    /// Closed when the spawner dies.
    pub lifeline: OwnedFd,
    /// For a job with a network: where the listener is sent.
    pub handoff: Option<OwnedFd>,
}

/// Runs the init; never returns.
pub(crate) fn run(
    mut plan: CommandPlan<'_>,
    template: &Template,
    job: &Job,
    tmp_size: u64,
    channels: Channels,
    ns: &Namespaces,
) -> ! {
    let Channels {
        mut status,
        lifeline,
        handoff,
    } = channels;
    // Die with the spawner; if it is already gone, stop here.
    let _ = prctl::set_pdeathsig(Signal::SIGKILL);
    if supervisor_gone(&lifeline) {
        exit_now(125);
    }
    if ns.uts {
        namespaces::set_hostname();
    }
    let entered = template
        .enter(&job.binds, job.overlay.as_ref(), &job.nested, tmp_size)
        .and_then(|e| match (job.network, handoff) {
            (Some(port), Some(handoff)) => hand_over_listener(port, handoff).map(|()| e),
            _ => Ok(e),
        });
    let entered = match entered {
        Ok(e) => e,
        Err(err) => {
            eprintln!("airlock-confine: {}: {err}", err.code().as_str());
            send(
                &mut status,
                &Message::Failed {
                    step: err.step().into(),
                    code: err.code().as_str().into(),
                    message: err.to_string(),
                    exit_status: err.exit_status(),
                },
            );
            exit_now(125)
        }
    };
    send(
        &mut status,
        &Message::Mounts {
            mount: true,
            proc: entered.proc,
            tmp: entered.tmp,
            shm: entered.tmp,
            root: true,
        },
    );
    if !entered.proc {
        plan.grants.ro_if_present.retain(|p| p != "/proc");
    }

    // SAFETY: this process is single-threaded (a clone of the
    // single-threaded spawner that starts no thread), so the child may do
    // anything, including allocate, before it execs.
    let command = match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            drop(lifeline);
            target::run(&plan, entered, &mut status)
        }
        Ok(ForkResult::Parent { child }) => child,
        Err(e) => {
            eprintln!("airlock-confine: SANDBOX_UNAVAILABLE: fork failed: {e}");
            exit_now(125)
        }
    };
    drop(plan);
    let outcome = reap(command);
    send(
        &mut status,
        &Message::Exit {
            outcome: outcome.clone(),
        },
    );
    exit_now(match outcome {
        Outcome::Exited { code } => code,
        Outcome::Signaled { signal } => 128 + signal,
        _ => 125,
    })
}

/// A setup's network: `lo` up, a listener on `127.0.0.1:port`, sent to
/// the executor over `handoff` and closed here, before the command exists.
fn hand_over_listener(port: u16, handoff: OwnedFd) -> crate::error::Result<()> {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    use std::os::fd::AsRawFd;
    let failed = |e: std::io::Error| crate::error::Error::Network(e.to_string());
    let listener = namespaces::loopback_listener(port).map_err(failed)?;
    let fds = [listener.as_raw_fd()];
    let iov = [std::io::IoSlice::new(b"L")];
    sendmsg::<()>(
        handoff.as_raw_fd(),
        &iov,
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )
    .map_err(|e| failed(std::io::Error::from_raw_os_error(e as i32)))?;
    Ok(())
}

fn supervisor_gone(lifeline: &OwnedFd) -> bool {
    let mut fds = [PollFd::new(lifeline.as_fd(), PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(_) => fds[0]
            .revents()
            .is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR)),
        Err(_) => true,
    }
}

/// Reaps children until none is left; once the command has exited,
/// everything else in the pid namespace is killed.
fn reap(command: Pid) -> Outcome {
    let mut outcome = None;
    loop {
        match waitpid(None, None) {
            Ok(WaitStatus::Exited(pid, code)) if pid == command => {
                outcome = Some(Outcome::Exited { code });
            }
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid == command => {
                outcome = Some(Outcome::Signaled { signal: sig as i32 });
            }
            Ok(_) | Err(Errno::EINTR) => {}
            Err(_) => break,
        }
        if outcome.is_some() {
            reaper::kill_namespace();
        }
    }
    outcome.unwrap_or(Outcome::Failed {
        step: "supervise".into(),
        code: airlock_proto::Code::INTERNAL.as_str().into(),
        message: "the command's process vanished without a status".into(),
    })
}

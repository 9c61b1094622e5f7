//! The sandbox's init: pid 1 of the new pid namespace (or a subreaper
//! child when there is none). It sets up the mount namespace, forks the
//! command, reaps everything, and when the command exits kills whatever
//! is left before it reports and exits.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::prctl;
use nix::sys::signal::Signal;
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork};

use crate::report::{Message, Namespaces, Outcome};
use crate::{Plan, exit_now, namespaces, reaper, send, target};

/// Runs the init; never returns.
pub(crate) fn run(mut plan: Plan, mut status: File, lifeline: OwnedFd, ns: &Namespaces) -> ! {
    // Die with the supervisor; if it is already gone, stop here.
    let _ = prctl::set_pdeathsig(Signal::SIGKILL);
    if supervisor_gone(&lifeline) {
        exit_now(125);
    }
    // Orphans of the command become our children (matters without a pid namespace).
    let _ = prctl::set_child_subreaper(true);
    if ns.uts {
        namespaces::set_hostname();
    }
    let mounts = if plan.namespaces {
        namespaces::enter_mounts(ns.pid, plan.tmp_size)
    } else {
        Default::default()
    };
    send(
        &mut status,
        &Message::Mounts {
            mount: mounts.mount,
            proc: mounts.proc,
            tmp: mounts.tmp,
            shm: mounts.shm,
        },
    );
    if mounts.proc {
        plan.grants.ro_if_present.push("/proc".into());
    }
    if mounts.tmp {
        plan.grants.rw.push("/tmp".into());
    }
    if mounts.shm {
        plan.grants.rw.push("/dev/shm".into());
    }

    // SAFETY: this process is single-threaded (the supervisor checked before
    // its own fork, and the init starts no thread), so the child may do
    // anything, including allocate, before it execs.
    let command = match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            drop(lifeline);
            target::run(&plan, mounts, &mut status)
        }
        Ok(ForkResult::Parent { child }) => child,
        Err(e) => {
            eprintln!("airlock-confine: SANDBOX_UNAVAILABLE: fork failed: {e}");
            exit_now(125)
        }
    };
    let outcome = reap(command, ns.pid && nix::unistd::getpid().as_raw() == 1);
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
/// everything else is killed.
fn reap(command: Pid, namespace_init: bool) -> Outcome {
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
            reaper::kill_remaining(namespace_init);
        }
    }
    outcome.unwrap_or(Outcome::Failed {
        step: "supervise".into(),
        code: airlock_proto::Code::INTERNAL.as_str().into(),
        message: "the command's process vanished without a status".into(),
    })
}

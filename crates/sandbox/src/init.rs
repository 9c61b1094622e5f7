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

/// Runs the init; never returns.
pub(crate) fn run(
    mut plan: CommandPlan<'_>,
    template: &Template,
    job: &Job,
    tmp_size: u64,
    mut status: File,
    lifeline: OwnedFd,
    ns: &Namespaces,
) -> ! {
    // Die with the spawner; if it is already gone, stop here.
    let _ = prctl::set_pdeathsig(Signal::SIGKILL);
    if supervisor_gone(&lifeline) {
        exit_now(125);
    }
    if ns.uts {
        namespaces::set_hostname();
    }
    let entered = match template.enter(&job.binds, job.overlay.as_ref(), tmp_size) {
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

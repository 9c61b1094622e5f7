//! The command's own process: the remaining confinement steps in their
//! fixed order, each failing hard, then execve.

use std::convert::Infallible;
use std::fs::File;

use crate::error::Result;
use crate::report::Message;
use crate::root::Entered;
use crate::sandbox::{CommandPlan, send};
use crate::{caps, env, exec, exit_now, ids, landlock, no_new_privs, rlimits, seccomp};

/// Confines this process and executes the command; never returns.
pub(crate) fn run(plan: &CommandPlan<'_>, entered: Entered, status: &mut File) -> ! {
    let err = match confine_and_exec(plan, entered, status) {
        Err(e) => e,
        Ok(never) => match never {},
    };
    eprintln!("airlock-confine: {}: {err}", err.code().as_str());
    send(
        status,
        &Message::Failed {
            step: err.step().into(),
            code: err.code().as_str().into(),
            message: err.to_string(),
            exit_status: err.exit_status(),
        },
    );
    exit_now(err.exit_status())
}

fn confine_and_exec(
    plan: &CommandPlan<'_>,
    entered: Entered,
    status: &mut File,
) -> Result<Infallible> {
    // 0. Standard streams: /dev/null in, the caller's pipes out.
    if let Some(fds) = plan.stdio {
        env::redirect(fds)?;
    }
    // 1. Empty the bounding set and lock securebits while CAP_SETPCAP is held.
    caps::drop_bounding()?;
    // 2. Supplementary groups, gid, uid (root only; verified).
    ids::switch(plan.uid, plan.gid, plan.privileged)?;
    // 3. Every remaining capability: ambient, inheritable, effective, permitted.
    let capabilities_dropped = caps::clear()?;
    // 4. execve can never grant privileges again.
    no_new_privs::set()?;
    // 5. Resource limits, and no core dumps.
    rlimits::apply(plan.limits)?;
    // 6. Landlock; refuse unless fully enforced or degraded mode is allowed.
    let landlock = landlock::restrict(&plan.grants, plan.min_abi)?;
    let mut warnings = landlock::newer_kernel_warning(&landlock)
        .into_iter()
        .collect::<Vec<_>>();
    let degraded = match landlock::degraded_reason(&landlock) {
        None => false,
        Some(reason) if !plan.allow_degraded => return Err(crate::Error::Degraded { reason }),
        Some(reason) => {
            eprintln!(
                "airlock-confine: WARNING: SANDBOX DEGRADED: {reason}; running anyway (--allow-degraded)"
            );
            warnings.push(format!("sandbox degraded: {reason}"));
            true
        }
    };
    // 7. seccomp, last, compiled before the fork: after it, only the calls
    //    below are made. Where Landlock cannot confine pathname UNIX
    //    sockets, the program that keeps them out of reach is chosen.
    let unix = !landlock::confines_unix_paths(&landlock);
    seccomp::install_programs(&plan.programs[usize::from(unix)])?;
    // 8. Clean environment, working directory and signal state.
    let envp = env::build(&plan.workdir, entered.tmp || plan.tmp, &plan.env);
    let program = exec::resolve(&plan.command, path_of(&envp))?;
    let envp = env::to_cstrings(&envp)?;
    env::enter_workdir(&plan.workdir)?;
    env::reset_signals();
    // 9. A new session: no controlling terminal, own process group.
    exec::new_session()?;
    // 10. Tell the supervisor, then execve (the status pipe closes on exec).
    send(
        status,
        &Message::Confined {
            uid: plan.uid,
            gid: plan.gid,
            landlock,
            degraded,
            warnings,
            capabilities_dropped,
        },
    );
    Err(exec::execve(&program, &plan.argv, &envp))
}

fn path_of(env: &[(String, String)]) -> &str {
    env.iter()
        .find(|(k, _)| k == "PATH")
        .map_or("", |(_, v)| v.as_str())
}

//! A clean process state for the command: a fresh environment (nothing
//! inherited from the caller), the working directory, default signal
//! dispositions and an empty signal mask.

use std::ffi::CString;
use std::path::Path;

use nix::sys::signal::{SigHandler, SigSet, SigmaskHow, Signal, signal, sigprocmask};

use crate::error::{Error, Result};
use crate::policy::SANDBOX_PATH;

/// The command's environment: PATH, LC_ALL, HOME (the working directory)
/// and TMPDIR (the private /tmp when there is one, else the working
/// directory), then the policy's own entries, which may override them.
pub fn build(
    workdir: &Path,
    private_tmp: bool,
    extra: &[(String, String)],
) -> Vec<(String, String)> {
    let home = workdir.to_string_lossy().into_owned();
    let tmp = if private_tmp {
        "/tmp".to_owned()
    } else {
        home.clone()
    };
    let mut env: Vec<(String, String)> = vec![
        ("PATH".into(), SANDBOX_PATH.into()),
        ("LC_ALL".into(), "C.UTF-8".into()),
        ("HOME".into(), home),
        ("TMPDIR".into(), tmp),
    ];
    for (k, v) in extra {
        env.retain(|(key, _)| key != k);
        env.push((k.clone(), v.clone()));
    }
    env
}

/// `KEY=VALUE` C strings for execve.
pub fn to_cstrings(env: &[(String, String)]) -> Result<Vec<CString>> {
    env.iter()
        .map(|(k, v)| {
            CString::new(format!("{k}={v}"))
                .map_err(|_| Error::Policy(format!("NUL in environment entry {k}")))
        })
        .collect()
}

/// Makes `fds` (stdin, stdout, stderr) descriptors 0, 1 and 2; every
/// other descriptor is close-on-exec already (the spawner opens all so).
pub fn redirect(fds: [std::os::fd::RawFd; 3]) -> Result<()> {
    for (target, fd) in fds.into_iter().enumerate() {
        // SAFETY: dup2 only manipulates the descriptor table.
        if unsafe { libc::dup2(fd, target as i32) } < 0 {
            return Err(Error::CloseFds(std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

/// Enters the working directory (after the id switch, so the target
/// uid's own permissions apply).
pub fn enter_workdir(workdir: &Path) -> Result<()> {
    std::env::set_current_dir(workdir).map_err(|source| Error::Workdir {
        path: workdir.into(),
        source,
    })
}

/// Restores default dispositions for every catchable signal (ignored ones
/// would survive execve; Rust itself ignores SIGPIPE) and unblocks all.
pub fn reset_signals() {
    for sig in Signal::iterator() {
        if matches!(sig, Signal::SIGKILL | Signal::SIGSTOP) {
            continue;
        }
        // SAFETY: installing SIG_DFL registers no Rust code as a handler.
        let _ = unsafe { signal(sig, SigHandler::SigDfl) };
    }
    let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_environment_has_only_the_basics() {
        let env = build(Path::new("/ws"), false, &[]);
        let keys: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["PATH", "LC_ALL", "HOME", "TMPDIR"]);
        assert!(env.contains(&("TMPDIR".into(), "/ws".into())));
    }

    #[test]
    fn policy_entries_override() {
        let env = build(Path::new("/ws"), true, &[("PATH".into(), "/x".into())]);
        assert!(env.contains(&("PATH".into(), "/x".into())));
        assert!(env.contains(&("TMPDIR".into(), "/tmp".into())));
        assert_eq!(env.iter().filter(|(k, _)| k == "PATH").count(), 1);
    }
}

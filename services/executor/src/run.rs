//! Running one verification command in a fresh sandbox: one
//! `airlock-confine` process per command, so no state (processes, /tmp,
//! environment) carries from one command to the next.
//!
//! The command gets read-write access to the workspace and to a private
//! temporary directory (its HOME and TMPDIR), read-only system paths, the
//! configured rlimits and the command's timeout; everything else is the
//! helper's (ids, capabilities, no_new_privs, Landlock, seccomp,
//! namespaces). The helper's JSON report is the only source of the
//! confinement facts in the result: without a usable report the request
//! fails with SANDBOX_UNAVAILABLE, it is never filled in.
//!
//! Evidence comes from the executor's side: SHA-256 of all of stdout and
//! stderr with a bounded tail of each, wall time, and CPU time and peak RSS
//! from `wait4` on the helper (which waits for the whole command tree).

use crate::apply::Workspace;
use crate::beneath;
use crate::error::{Error, Result};
use airlock_proto::bundle::CommandEvidence;
use airlock_proto::canonical::digest_of;
use airlock_proto::envelope::Command;
use airlock_sandbox::{Limits, Outcome, Policy, REPORT_SCHEMA, Report};
use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::process::{Pid, PidfdFlags, Signal};
use sha2::{Digest, Sha256};
use std::collections::VecDeque;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Extra time the helper gets past the command's timeout before the
/// executor kills it itself.
pub const HELPER_GRACE: Duration = Duration::from_secs(15);

/// Where the helper normally lives.
pub const DEFAULT_CONFINE: &str = "/usr/libexec/airlock/airlock-confine";

/// How every command is confined.
#[derive(Clone, Debug)]
pub struct Runner {
    /// The airlock-confine binary.
    pub confine: PathBuf,
    /// Uid and gid to run commands as (only when the executor is root).
    pub ids: Option<(u32, u32)>,
    /// rlimits from `[executor.limits]`.
    pub limits: airlock_config::Limits,
    /// Pass `--allow-degraded` to the helper.
    pub allow_degraded: bool,
    /// Bytes of stdout/stderr kept as tails.
    pub tail_bytes: usize,
}

/// What one helper report says about the sandbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Confinement {
    /// The kernel's Landlock ABI.
    pub landlock_abi: u32,
    /// Landlock fully enforced.
    pub landlock_full: bool,
    /// The seccomp filter was installed.
    pub seccomp: bool,
    /// Namespaces obtained, by name.
    pub namespaces: Vec<String>,
}

struct Captured {
    sha256: String,
    tail: String,
}

fn capture(
    mut stream: impl Read + Send + 'static,
    keep: usize,
) -> std::thread::JoinHandle<Captured> {
    std::thread::spawn(move || {
        let mut hasher = Sha256::new();
        let mut tail: VecDeque<u8> = VecDeque::with_capacity(keep);
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match stream.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    hasher.update(&buf[..n]);
                    tail.extend(&buf[..n]);
                    while tail.len() > keep {
                        tail.pop_front();
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        let tail: Vec<u8> = tail.into();
        Captured {
            sha256: hex::encode(hasher.finalize()),
            tail: String::from_utf8_lossy(&tail).into_owned(),
        }
    })
}

struct Waited {
    status: i32,
    cpu_ms: u64,
    peak_rss_kib: u64,
    killed_by_executor: bool,
}

fn wait_helper(pid: u32, deadline: Duration) -> Result<Waited> {
    let raw = i32::try_from(pid).map_err(|_| Error::ConfineSpawn("pid out of range".into()))?;
    let rpid = Pid::from_raw(raw).ok_or_else(|| Error::ConfineSpawn("pid 0".into()))?;
    let mut killed_by_executor = false;
    if let Ok(pidfd) = rustix::process::pidfd_open(rpid, PidfdFlags::empty()) {
        let start = Instant::now();
        loop {
            let left = deadline.saturating_sub(start.elapsed());
            if left.is_zero() {
                let _ = rustix::process::kill_process(rpid, Signal::KILL);
                killed_by_executor = true;
                break;
            }
            let ts = Timespec {
                tv_sec: i64::try_from(left.as_secs()).unwrap_or(i64::MAX),
                tv_nsec: i64::from(left.subsec_nanos()),
            };
            let mut fds = [PollFd::new(&pidfd, PollFlags::IN)];
            match rustix::event::poll(&mut fds, Some(&ts)) {
                Ok(n) if n > 0 => break,
                Ok(_) | Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(Error::ConfineSpawn(format!("poll: {e}"))),
            }
        }
    }
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain old data; zeroed is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: `status` and `usage` are valid, exclusively borrowed
        // out-parameters for the duration of the call; `raw` is our own
        // child, not yet reaped (std's Child is never waited on).
        let r = unsafe { libc::wait4(raw, &mut status, 0, &mut usage) };
        if r == raw {
            break;
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(Error::ConfineSpawn(format!("wait4: {err}")));
        }
    }
    let ms = |tv: libc::timeval| {
        u64::try_from(tv.tv_sec).unwrap_or(0) * 1000 + u64::try_from(tv.tv_usec).unwrap_or(0) / 1000
    };
    Ok(Waited {
        status,
        cpu_ms: ms(usage.ru_utime) + ms(usage.ru_stime),
        peak_rss_kib: u64::try_from(usage.ru_maxrss).unwrap_or(0),
        killed_by_executor,
    })
}

/// Recursively hands a freshly made tree to `uid:gid`, never following a
/// symlink (the tree was just written by the executor itself).
pub fn chown_tree(path: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    let meta = std::fs::symlink_metadata(path)?;
    std::os::unix::fs::lchown(path, Some(uid), Some(gid))?;
    if meta.is_dir() {
        for entry in std::fs::read_dir(path)? {
            chown_tree(&entry?.path(), uid, gid)?;
        }
    }
    Ok(())
}

impl Runner {
    /// The sandbox policy for one command (the helper's options are
    /// [`Policy::to_args`] plus `--report`).
    pub fn policy(&self, workspace: &Path, workdir: &Path, tmp: &Path, timeout: u32) -> Policy {
        let l = &self.limits;
        let tmp_s = tmp.to_string_lossy().into_owned();
        let ceiling = workspace
            .parent()
            .unwrap_or(workspace)
            .to_string_lossy()
            .into_owned();
        let env = [
            ("HOME", tmp_s.as_str()),
            ("TMPDIR", tmp_s.as_str()),
            ("GIT_CONFIG_NOSYSTEM", "1"),
            ("GIT_CONFIG_GLOBAL", "/dev/null"),
            ("GIT_CEILING_DIRECTORIES", ceiling.as_str()),
            ("GIT_TERMINAL_PROMPT", "0"),
            ("GIT_PAGER", "cat"),
            ("PAGER", "cat"),
            ("PYTHONNOUSERSITE", "1"),
            ("PYTHONHASHSEED", "0"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        Policy {
            uid: self.ids.map(|(u, _)| u),
            gid: self.ids.map(|(_, g)| g),
            ro: Vec::new(),
            rw: vec![workspace.to_owned(), tmp.to_owned()],
            workdir: Some(workdir.to_owned()),
            system_ro: true,
            limits: Limits {
                nproc: Some(u64::from(l.processes)),
                address_space: Some(u64::from(l.address_space_mib) << 20),
                file_size: Some(u64::from(l.file_size_mib) << 20),
                open_files: Some(u64::from(l.open_files)),
                cpu_seconds: Some(u64::from(l.cpu_seconds)),
            },
            allow_degraded: self.allow_degraded,
            timeout: Some(Duration::from_secs(u64::from(timeout))),
            env,
            ..Policy::default()
        }
    }

    /// Runs `cmd` (already allowed by the program policy) in a fresh
    /// sandbox. `scratch` is a per-request directory the command cannot
    /// reach, holding its private tmp and the helper's report.
    pub fn run(
        &self,
        cmd: &Command,
        ws: &Workspace,
        scratch: &Path,
        index: usize,
    ) -> Result<(CommandEvidence, Confinement)> {
        // The working directory must be a real directory beneath the
        // workspace now (a previous command may have replaced it).
        let workdir = if cmd.cwd == "." {
            ws.path().to_owned()
        } else {
            match beneath::dir(ws.root(), &cmd.cwd, false)? {
                Some(_) => ws.path().join(&cmd.cwd),
                None => {
                    return Err(Error::PathInvalid {
                        path: cmd.cwd.clone(),
                        why: "working directory does not exist",
                    });
                }
            }
        };
        let tmp = scratch.join(format!("tmp-{index}"));
        let report = scratch.join(format!("report-{index}.json"));
        let setup = |e: std::io::Error, p: &Path| Error::Setup {
            path: p.to_owned(),
            detail: e.to_string(),
        };
        {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&tmp)
                .map_err(|e| setup(e, &tmp))?;
        }
        if let Some((uid, gid)) = self.ids {
            chown_tree(&tmp, uid, gid).map_err(|e| setup(e, &tmp))?;
        }
        let mut child = std::process::Command::new(&self.confine);
        child
            .args(
                self.policy(ws.path(), &workdir, &tmp, cmd.timeout_seconds)
                    .to_args(),
            )
            .arg("--report")
            .arg(&report)
            .arg("--")
            .args(&cmd.argv)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .current_dir(scratch)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // The helper leads its own process group so that a stray signal
        // to the executor's group does not reach it.
        child.process_group(0);
        let started = Instant::now();
        let mut child = child
            .spawn()
            .map_err(|e| Error::ConfineSpawn(format!("{}: {e}", self.confine.display())))?;
        let keep = self.tail_bytes;
        let out = child.stdout.take().map(|s| capture(s, keep));
        let err = child.stderr.take().map(|s| capture(s, keep));
        let deadline = Duration::from_secs(u64::from(cmd.timeout_seconds)) + HELPER_GRACE;
        let waited = wait_helper(child.id(), deadline)?;
        let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        if waited.killed_by_executor {
            // The readers are left to finish when the last writer dies.
            return Err(Error::ConfineReport(format!(
                "{}: the helper outlived the timeout by {}s and was killed",
                cmd.label,
                HELPER_GRACE.as_secs()
            )));
        }
        let join = |h: Option<std::thread::JoinHandle<Captured>>| {
            h.and_then(|h| h.join().ok()).unwrap_or(Captured {
                sha256: hex::encode(Sha256::digest(b"")),
                tail: String::new(),
            })
        };
        let (stdout, stderr) = (join(out), join(err));
        let report_value = read_report(&report)?;
        let (exit_code, signal, timed_out) = outcome(&cmd.label, &report_value)?;
        let _ = waited.status;
        let evidence = CommandEvidence {
            label: cmd.label.clone(),
            argv_sha256: digest_of(&cmd.argv).map_err(|e| Error::ConfineSpawn(e.to_string()))?,
            exit_code,
            signal,
            timed_out,
            duration_ms,
            cpu_ms: waited.cpu_ms,
            peak_rss_kib: waited.peak_rss_kib,
            stdout_sha256: stdout.sha256,
            stderr_sha256: stderr.sha256,
            stdout_tail: stdout.tail,
            stderr_tail: stderr.tail,
        };
        Ok((evidence, confinement(&report_value)))
    }
}

fn read_report(path: &Path) -> Result<Report> {
    let bytes = std::fs::read(path)
        .map_err(|e| Error::ConfineReport(format!("{}: {e}", path.display())))?;
    if bytes.len() > 1 << 20 {
        return Err(Error::ConfineReport("report larger than 1 MiB".into()));
    }
    let report: Report = serde_json::from_slice(&bytes)
        .map_err(|e| Error::ConfineReport(format!("{}: {e}", path.display())))?;
    if report.schema != REPORT_SCHEMA {
        return Err(Error::ConfineReport(format!(
            "unknown schema {:?}",
            report.schema
        )));
    }
    Ok(report)
}

/// (exit code, signal, timed out) from the report's outcome.
fn outcome(label: &str, report: &Report) -> Result<(Option<i32>, Option<i32>, bool)> {
    match &report.outcome {
        Outcome::Exited { code } => Ok((Some(*code), None, false)),
        Outcome::Signaled { signal } => Ok((None, Some(*signal), false)),
        Outcome::TimedOut => Ok((None, None, true)),
        Outcome::Interrupted { signal } => Err(Error::ConfineReport(format!(
            "{label}: the helper was interrupted by signal {signal}"
        ))),
        Outcome::Failed { code, message, .. } => Err(Error::Confine {
            label: label.to_owned(),
            code: code.clone(),
            message: message.clone(),
        }),
    }
}

fn confinement(report: &Report) -> Confinement {
    let n = &report.namespaces;
    let namespaces = [
        ("ipc", n.ipc),
        ("mount", n.mount),
        ("net", n.net),
        ("pid", n.pid),
        ("proc", n.proc),
        ("shm", n.shm),
        ("tmp", n.tmp),
        ("user", n.user),
        ("uts", n.uts),
    ]
    .iter()
    .filter(|(_, on)| *on)
    .map(|(name, _)| (*name).to_owned())
    .collect();
    let landlock = report.landlock.as_ref();
    Confinement {
        landlock_abi: landlock.map_or(0, |l| u32::try_from(l.kernel_abi).unwrap_or(0)),
        landlock_full: landlock.is_some_and(|l| l.status == "full") && !report.degraded,
        seccomp: report.seccomp,
        namespaces,
    }
}

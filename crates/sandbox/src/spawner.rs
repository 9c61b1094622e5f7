//! The executor's spawner: a process of its own that holds a prepared
//! [`Sandbox`] and starts every command, so each command costs one fork
//! and one exec.
//!
//! The executor forks it at start, before it confines itself (Landlock
//! forbids mounting to a process it restricts, and the minimal root is
//! built by mounting). The spawner then
//! 1. closes every descriptor but its socket and the standard streams,
//!    dies with the executor (`PR_SET_PDEATHSIG`), and moves into its
//!    job's cgroups ([`crate::cgroup`]) when the executor made walls;
//! 2. run as root, drops to the commands' uid and gid for good;
//! 3. prepares the sandbox: its own user and mount namespaces, the
//!    template, after which its view holds only the template and the
//!    executor's work root ([`crate::root`]) — or, where user namespaces
//!    are refused, the host view;
//! 4. tries once whether an overlay can be mounted over the work root's
//!    file system (not over an overlayfs, for one);
//! 5. confines itself ([`crate::lockdown::lockdown_spawner`]): no_new_privs,
//!    RLIMIT_CORE 0, a seccomp deny-list; Landlock in the host view (its
//!    mount namespace is its filesystem confinement in the minimal root);
//! 6. answers [`Hello`], then serves one [`Job`] at a time.
//!
//! The channel is a UNIX stream socket pair: each message is a 4-byte
//! length and a JSON body; a job carries the command's stdout and stderr
//! write ends as `SCM_RIGHTS`. The spawner trusts the executor no more
//! than it must: a job's paths must lie within the work root it kept, and
//! every command gets the same confinement whatever the job says.

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::report::{Namespaces, Report, ViewMode};
use crate::sandbox::{Job, Sandbox, Setup, Stdio};

/// Largest message on the channel (a job's argv and environment are bounded
/// well below this by the envelope's limits).
pub const MAX_MESSAGE: usize = 8 << 20;

/// What the spawner says once it is ready.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hello {
    /// The view every command gets.
    pub view: ViewMode,
    /// Why not the minimal root, when not.
    pub reason: Option<String>,
    /// The namespaces every command gets.
    pub namespaces: Namespaces,
    /// Uid and gid commands run as (as the spawner's namespace sees them).
    pub ids: (u32, u32),
    /// The spawner's own confinement, one line.
    pub lockdown: String,
    /// Overlay workspaces can be mounted over the work root (else `None`
    /// and the reason: the executor copies trees instead).
    pub overlay: std::result::Result<(), String>,
    /// Set when the spawner could not start; nothing else is meaningful then.
    pub error: Option<String>,
}

/// How to start the spawner.
#[derive(Clone, Debug)]
pub struct Options {
    /// The sandbox every command gets.
    pub setup: Setup,
    /// Run as root: drop to this uid and gid first, for good.
    pub drop_to: Option<(u32, u32)>,
    /// The executor's work root: the only host path the spawner keeps.
    pub work_root: PathBuf,
    /// The `cgroup.procs` files of its job's cgroups ([`crate::cgroup`]):
    /// it moves itself in first, so every command it starts is inside its
    /// job's walls. Empty: no walls.
    pub cgroup: Vec<PathBuf>,
}

/// The executor's handle on its spawner.
#[derive(Debug)]
pub struct Spawner {
    stream: UnixStream,
    pid: Pid,
    hello: Hello,
}

fn chan(e: impl std::fmt::Display) -> Error {
    Error::Spawner(e.to_string())
}

fn write_frame(stream: &UnixStream, body: &[u8], fds: &[RawFd]) -> Result<()> {
    let len = u32::try_from(body.len()).map_err(chan)?.to_le_bytes();
    let iov = [IoSlice::new(&len)];
    let cmsg = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsg };
    let sent =
        sendmsg::<()>(stream.as_raw_fd(), &iov, cmsgs, MsgFlags::empty(), None).map_err(chan)?;
    if sent != len.len() {
        // Stream sockets deliver a short write of four bytes only on error.
        return Err(chan("short write"));
    }
    (&*stream).write_all(body).map_err(chan)
}

/// Reads one frame; `None` at end of stream.
fn read_frame(stream: &UnixStream) -> Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    let mut len = [0u8; 4];
    let mut fds = Vec::new();
    let mut got = 0;
    while got < len.len() {
        let mut cmsg = nix::cmsg_space!([RawFd; 4]);
        let mut iov = [IoSliceMut::new(&mut len[got..])];
        let msg = recvmsg::<()>(
            stream.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(chan)?;
        if msg.bytes == 0 {
            return if got == 0 {
                Ok(None)
            } else {
                Err(chan("truncated frame"))
            };
        }
        for c in msg.cmsgs().map_err(chan)? {
            if let ControlMessageOwned::ScmRights(received) = c {
                // SAFETY: the kernel just installed these descriptors in
                // this process for us; nothing else owns them.
                fds.extend(
                    received
                        .into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
        got += msg.bytes;
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_MESSAGE {
        return Err(chan(format!("message of {len} bytes")));
    }
    let mut body = vec![0u8; len];
    (&*stream).read_exact(&mut body).map_err(chan)?;
    Ok(Some((body, fds)))
}

impl Spawner {
    /// Forks the spawner and waits for its [`Hello`]. The calling process
    /// must be single-threaded (the executor before its lockdown).
    pub fn start(options: Options) -> Result<Spawner> {
        let threads = std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count());
        if threads != 1 {
            return Err(Error::NotSingleThreaded { threads });
        }
        let (ours, theirs) = UnixStream::pair().map_err(chan)?;
        // SAFETY: single-threaded (checked above), so the child inherits no
        // lock held by another thread and may allocate.
        match unsafe { nix::unistd::fork() } {
            Ok(nix::unistd::ForkResult::Child) => {
                drop(ours);
                serve(theirs, options)
            }
            Ok(nix::unistd::ForkResult::Parent { child }) => {
                drop(theirs);
                let hello = match read_frame(&ours)? {
                    Some((body, _)) => serde_json::from_slice::<Hello>(&body).map_err(chan)?,
                    None => return Err(chan("the spawner exited before it was ready")),
                };
                if let Some(e) = &hello.error {
                    let _ = nix::sys::wait::waitpid(child, None);
                    return Err(Error::Spawner(e.clone()));
                }
                Ok(Spawner {
                    stream: ours,
                    pid: child,
                    hello,
                })
            }
            Err(e) => Err(Error::Fork(crate::error::errno(e))),
        }
    }

    /// What the spawner said when it was ready.
    pub fn hello(&self) -> &Hello {
        &self.hello
    }

    /// Runs one job; the spawner enforces its timeout, and this call gives
    /// up (killing the spawner) `grace` after it.
    pub fn run(&mut self, job: &Job, stdio: Stdio, grace: Duration) -> Result<Report> {
        let body = serde_json::to_vec(job).map_err(chan)?;
        let mut fds = vec![stdio.stdout.as_raw_fd(), stdio.stderr.as_raw_fd()];
        fds.extend(stdio.network.as_ref().map(|n| n.as_raw_fd()));
        fds.extend(stdio.cancel.as_ref().map(|c| c.as_raw_fd()));
        write_frame(&self.stream, &body, &fds)?;
        drop(stdio);
        let limit = job.timeout.map(|t| t + grace);
        self.stream.set_read_timeout(limit).map_err(chan)?;
        match read_frame(&self.stream) {
            Ok(Some((body, _))) => serde_json::from_slice(&body).map_err(chan),
            Ok(None) => Err(chan("the spawner exited")),
            Err(e) => {
                let _ = kill(self.pid, Signal::SIGKILL);
                Err(e)
            }
        }
    }
}

impl Drop for Spawner {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        let _ = kill(self.pid, Signal::SIGKILL);
        let _ = nix::sys::wait::waitpid(self.pid, None);
    }
}

/// The spawner process; never returns.
fn serve(stream: UnixStream, options: Options) -> ! {
    let hello_err = |stream: &UnixStream, e: String| -> ! {
        let hello = Hello {
            view: ViewMode::HostView,
            reason: None,
            namespaces: Namespaces::default(),
            ids: (0, 0),
            lockdown: String::new(),
            overlay: Err("not started".into()),
            error: Some(e),
        };
        if let Ok(body) = serde_json::to_vec(&hello) {
            let _ = write_frame(stream, &body, &[]);
        }
        crate::exit_now(125)
    };
    // 1. Only the socket and the standard streams; die with the executor.
    let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
    if nix::unistd::getppid().as_raw() == 1 {
        crate::exit_now(125);
    }
    if let Err(e) = crate::fds::close_inherited(&[stream.as_raw_fd()]) {
        hello_err(&stream, e.to_string());
    }
    // Into its job's walls, before it drops its ids (the executor made
    // them) and before it starts anything.
    if let Err(e) = crate::cgroup::enter(&options.cgroup) {
        hello_err(&stream, e.to_string());
    }
    // 2. Root drops to the commands' ids for good.
    let mut setup = options.setup;
    if let Some((uid, gid)) = options.drop_to {
        if nix::unistd::geteuid().is_root() {
            if let Err(e) = crate::ids::switch(uid, gid, true) {
                hello_err(&stream, e.to_string());
            }
            setup.uid = None;
            setup.gid = None;
        }
    }
    // 3. The sandbox; in the minimal root only the work root stays in view.
    setup.keep = Some(vec![options.work_root.clone()]);
    let allow_degraded = setup.allow_degraded;
    // Dropped from root, this process is not dumpable and its /proc files
    // belong to root; preparing reads and writes a few of them.
    let _ = nix::sys::prctl::set_dumpable(true);
    let prepared = Sandbox::prepare(setup);
    let _ = nix::sys::prctl::set_dumpable(false);
    let sandbox = match prepared {
        Ok(s) => s,
        Err(e) => hello_err(&stream, format!("{}: {e}", e.code().as_str())),
    };
    // 4. Can a workspace be an overlay on the work root's file system?
    let overlay = sandbox.probe_overlay(&options.work_root);
    // 5. Its own confinement.
    let lockdown =
        match crate::lockdown::lockdown_spawner(sandbox.view(), &options.work_root, allow_degraded)
        {
            Ok(r) => r.to_string(),
            Err(e) => hello_err(&stream, format!("{}: {e}", e.code().as_str())),
        };
    // 6. Ready; one job at a time.
    let hello = Hello {
        view: sandbox.view(),
        reason: sandbox.view_reason().map(str::to_owned),
        namespaces: sandbox.namespaces().clone(),
        ids: sandbox.ids(),
        lockdown,
        overlay,
        error: None,
    };
    let Ok(body) = serde_json::to_vec(&hello) else {
        crate::exit_now(125)
    };
    if write_frame(&stream, &body, &[]).is_err() {
        crate::exit_now(125);
    }
    loop {
        let (body, mut fds) = match read_frame(&stream) {
            Ok(Some(frame)) => frame,
            Ok(None) => crate::exit_now(0),
            Err(e) => {
                eprintln!("airlock-executor spawner: {e}");
                crate::exit_now(125)
            }
        };
        let report = match (serde_json::from_slice::<Job>(&body), fds.len()) {
            // stdout, stderr, the network's (a job with a network), the
            // cancel pipe's (when the executor watches the job's disk).
            (Ok(job), n @ 2..=4) => {
                let cancel = (n == 4 || (n == 3 && job.network.is_none()))
                    .then(|| fds.pop().expect("three descriptors"));
                let network = (fds.len() == 3).then(|| fds.pop().expect("three descriptors"));
                let stderr = fds.pop().expect("two descriptors");
                let stdout = fds.pop().expect("two descriptors");
                sandbox.run(
                    &job,
                    Some(Stdio {
                        stdout,
                        stderr,
                        network,
                        cancel,
                    }),
                )
            }
            (Ok(_), n) => {
                eprintln!("airlock-executor spawner: a job came with {n} descriptors, not 2 or 3");
                crate::exit_now(125)
            }
            (Err(e), _) => {
                eprintln!("airlock-executor spawner: malformed job: {e}");
                crate::exit_now(125)
            }
        };
        drop(fds);
        let Ok(body) = serde_json::to_vec(&report) else {
            crate::exit_now(125)
        };
        if write_frame(&stream, &body, &[]).is_err() {
            crate::exit_now(125);
        }
    }
}

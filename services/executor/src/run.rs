//! Running one verification command: the executor's spawner
//! (`airlock_sandbox::spawner`, forked before the executor confined
//! itself) starts it with one fork and one exec in a fresh sandbox, so no
//! state (processes, /tmp, environment) carries from one command to the
//! next.
//!
//! In the minimal root the command sees its workspace at `/workspace`
//! (the request's overlay or directory), a private tmpfs on `/tmp` (its
//! HOME and TMPDIR), its own `/proc`, a minimal `/dev` and read-only system
//! paths — nothing else. In the host view (user namespaces refused) it
//! gets the workspace at its own path and a private directory in the
//! request's scratch as HOME and TMPDIR, Landlock and seccomp refusing the
//! rest (every metadata call by path included). The spawner's report is
//! the only source of the confinement facts in the result: without a
//! usable report the request fails with SANDBOX_UNAVAILABLE, it is never
//! filled in.
//!
//! Evidence comes from the executor's side: SHA-256 of all of stdout and
//! stderr with a bounded tail of each, wall time; CPU time and peak RSS of
//! the command's process tree from the spawner's `wait4`.
//!
//! The tails are redacted here, before the result is built, hashed and
//! published, so the spool result, the worker's journal and the task
//! database hold only redacted text and every digest over the result binds
//! what is stored. [`tail_redactor`] is the redactor: every shape of
//! [`airlock_proto::redact`], plus the literal values of the command's own
//! environment by the rule [`environment_literal`] states, never the
//! values airlock made for the request ([`Extras::known`]: the task's ids,
//! branch and commits, the digests, the request's id, a setup's forwarder
//! URL, which is in its environment as HTTPS_PROXY). The redaction
//! runs over a wider window than the tail ([`REDACT_MARGIN`] bytes more,
//! its first partial line dropped), so a secret cut by the tail's start is
//! still whole when it is matched. The `stdout_sha256`/`stderr_sha256`
//! digests stay those of the full raw streams: a digest reveals nothing,
//! and they are what a rerun can be compared with.

use crate::error::{Error, Result};
use crate::tree::fs::{chown_tree, copy_into};
use airlock_proto::bundle::{CommandEvidence, WallEvidence};
use airlock_proto::canonical::digest_of;
use airlock_proto::envelope::Command;
use airlock_proto::redact::Redactor;
use airlock_proto::task::tail_of;
use airlock_sandbox::cgroup::{Limits as WallLimits, Measure, Walls};
use airlock_sandbox::spawner::{Hello, Spawner};
use airlock_sandbox::{
    Bind, Job, Limits, Outcome, Overlay, REPORT_SCHEMA, Report, Stdio, ViewMode,
};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, VecDeque};
use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

/// Extra time the spawner gets past the command's timeout before the
/// executor gives up on it.
pub const HELPER_GRACE: Duration = Duration::from_secs(15);

/// In the work root: the view the running executor's commands get (for
/// `airlockctl doctor`).
pub const VIEW_STATUS_FILE: &str = "sandbox.json";

/// Where the workspace appears in the minimal root.
pub const VIEW_WORKSPACE: &str = airlock_sandbox::root::WORKSPACE;

/// How every command is confined: the spawners (one per job that may run
/// at once, all forked at start, all prepared alike) and what the first
/// reported. A command takes whichever spawner is free, so jobs running
/// side by side never wait for each other's commands.
#[derive(Debug)]
pub struct Runner {
    spawners: Vec<Mutex<Spawner>>,
    /// The job slots' cgroups (spawner `k` lives in slot `k`) and the
    /// limits set on each, when the executor has them.
    walls: Option<(Walls, WallLimits)>,
    /// The disk's walls, watched where `walls` are (the job's processes
    /// are found in its cgroup).
    disk: DiskWalls,
    hello: Hello,
    /// Bytes of stdout/stderr kept as tails.
    pub tail_bytes: usize,
}

/// The disk's walls ([`Runner::with_disk`]): what a job may write, and the
/// free space it may never take from the host.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskWalls {
    /// Bytes a job may write to its workspace and scratch
    /// (`executor.limits.job_disk_mib`).
    pub job_bytes: Option<u64>,
    /// Free bytes of the work file system no job may take
    /// (`executor.min_free_disk_mib`).
    pub reserve_bytes: Option<u64>,
}

/// How often a running command's written bytes are measured.
pub const DISK_WATCH_INTERVAL: Duration = Duration::from_millis(250);

/// What the disk watch saw of one command.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskSeen {
    /// The most it had written at once.
    pub peak: u64,
    /// Killed past the job's quota.
    pub exceeded: bool,
    /// Killed for the host's reserve.
    pub reserve: bool,
}

/// Bytes `dirs` hold (blocks allocated, as the file system counts them),
/// without following links; what cannot be read counts nothing.
pub fn disk_usage(dirs: &[PathBuf]) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0u64;
    let mut stack: Vec<PathBuf> = dirs.to_vec();
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(m) = e.metadata() else { continue };
            total = total.saturating_add(m.blocks().saturating_mul(512));
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    total
}

/// Free bytes (for an unprivileged writer) of the file system of `path`.
fn free_bytes(path: &Path) -> Option<u64> {
    let s = rustix::fs::statvfs(path).ok()?;
    Some(s.f_bavail.saturating_mul(s.f_frsize))
}

/// Watches what a command writes to `dirs` until `done`: every
/// [`DISK_WATCH_INTERVAL`], the growth over what they held at the start;
/// past `limits`, `kill` (the job's processes).
fn watch_disk(limits: DiskWalls, dirs: &[PathBuf], done: &AtomicBool, kill: &dyn Fn()) -> DiskSeen {
    let base = disk_usage(dirs);
    let mut seen = DiskSeen::default();
    let mut killed = false;
    let fs = dirs.first().cloned().unwrap_or_default();
    loop {
        let mut waited = Duration::ZERO;
        while waited < DISK_WATCH_INTERVAL && !done.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(25));
            waited += Duration::from_millis(25);
        }
        let written = disk_usage(dirs).saturating_sub(base);
        seen.peak = seen.peak.max(written);
        if done.load(Ordering::Acquire) {
            return seen;
        }
        if !seen.exceeded && limits.job_bytes.is_some_and(|l| written > l) {
            seen.exceeded = true;
        }
        if !seen.exceeded
            && !seen.reserve
            && written > 0
            && limits
                .reserve_bytes
                .zip(free_bytes(&fs))
                .is_some_and(|(reserve, free)| free < reserve)
        {
            seen.reserve = true;
        }
        if (seen.exceeded || seen.reserve) && !killed {
            kill();
            killed = true;
        }
    }
}

/// The directories a command may write to on disk: its workspace (an
/// overlay's upper layer, or its copy) and the request's scratch (a host
/// view's /tmp and HOME, a layer's HOME part).
fn written_dirs(ws: &WorkspaceSource, scratch: &Path) -> Vec<PathBuf> {
    let ws = match ws {
        WorkspaceSource::Dir(d) => d.clone(),
        WorkspaceSource::Overlay { upper, .. } => upper.clone(),
    };
    // The workspace may live in the scratch (an overlay's upper layer):
    // counted once.
    if ws.starts_with(scratch) {
        vec![scratch.to_owned()]
    } else if scratch.starts_with(&ws) {
        vec![ws]
    } else {
        vec![ws, scratch.to_owned()]
    }
}

/// What one report says about the sandbox.
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
    /// The filesystem view.
    pub view: ViewMode,
}

/// Where one command's workspace comes from.
#[derive(Clone, Debug)]
pub enum WorkspaceSource {
    /// A directory the command may change (host view, or a plain bind).
    Dir(PathBuf),
    /// A cached tree under the request's upper directory (minimal root).
    Overlay {
        /// The cached tree (read-only).
        lower: PathBuf,
        /// The request's changes.
        upper: PathBuf,
        /// overlayfs's work directory.
        work: PathBuf,
    },
}

/// What one command gets beyond its workspace.
#[derive(Debug, Default)]
pub struct Extras<'a> {
    /// Its environment's variables.
    pub variables: Option<&'a BTreeMap<String, String>>,
    /// Directories mounted beneath the workspace or /tmp (minimal root).
    pub nested: Vec<airlock_sandbox::Nested>,
    /// Read-only directories stacked over the workspace overlay's tree
    /// (a dependency layer's workspace part; minimal root, overlay only).
    pub layers: Vec<PathBuf>,
    /// A setup's network: the forwarder's port and the descriptor its
    /// listener comes back on.
    pub network: Option<(u16, OwnedFd)>,
    /// A dependency layer's HOME part: each (directory of the layer,
    /// path under HOME) appears there, as the lower layer of an overlay
    /// where one can be mounted, else as a copy.
    pub home: Vec<(PathBuf, String)>,
    /// Values airlock made for the request, never redacted from its
    /// tails ([`known_values`]; a setup adds its forwarder's URL).
    pub known: Vec<String>,
}

/// What airlock made for `request_id` and its `envelope`, for
/// [`Extras::known`]: the binding's ids, branch and commits, the
/// envelope's digest ([`airlock_proto::redact::binding_values`]) and the
/// request's id.
pub fn known_values(request_id: &str, envelope: &airlock_proto::envelope::Envelope) -> Vec<String> {
    let mut known =
        airlock_proto::redact::binding_values(&envelope.binding, &envelope.execution_digest);
    known.push(request_id.to_owned());
    known
}

/// The sandbox settings of the executor, from `[executor.limits]`.
pub fn setup(
    limits: &airlock_config::Limits,
    allow_degraded: bool,
    landlock_min_abi: u8,
    ro: Vec<PathBuf>,
) -> airlock_sandbox::Setup {
    airlock_sandbox::Setup {
        uid: None,
        gid: None,
        system_ro: true,
        // The environments' toolchain paths (read-only, root's).
        ro,
        mountpoints: vec![VIEW_WORKSPACE.into()],
        limits: Limits {
            nproc: Some(u64::from(limits.processes)),
            address_space: Some(u64::from(limits.address_space_mib) << 20),
            file_size: Some(u64::from(limits.file_size_mib) << 20),
            open_files: Some(u64::from(limits.open_files)),
            cpu_seconds: Some(u64::from(limits.cpu_seconds)),
        },
        allow_degraded,
        landlock_min_abi,
        private_tmp: true,
        tmp_size: 256 << 20,
        namespaces: true,
        // A network namespace per command: only `lo`, down, for a
        // verification command (whose seccomp allows only AF_UNIX sockets
        // anyway); `lo` up with the forwarder's listener for a setup
        // command (crate::setup). The executor's own namespace holds only
        // lo as well (its self-check). No IPC
        // namespace either (its unit allows user, mnt and pid only): the
        // executor's is private, and commands may not create System V
        // objects or POSIX message queues in it (POSIX shared memory lives
        // in their private /tmp).
        net: true,
        uts: false,
        ipc: false,
        keep: None,
    }
}

/// Bytes of output read beyond the tail and redacted with it, so that a
/// secret starting before the tail is matched whole (a secret longer than
/// this that starts before the window is the one case left: its kept part
/// may no longer have the shape the redactor knows).
pub const REDACT_MARGIN: usize = 8 * 1024;

struct Captured {
    sha256: String,
    tail: String,
    /// The stream was longer than the tail kept.
    truncated: bool,
}

/// Whether the value of the command environment's variable `name` is
/// redacted as a literal wherever it appears in the command's output: a
/// value of 8 characters or more (shorter ones would redact ordinary
/// words; [`Redactor::with_literal`] ignores them) that is not an absolute
/// path or a `:`-separated list of them (PATH, HOME, TMPDIR,
/// GIT_CEILING_DIRECTORIES: what a test's output names all the time) —
/// unless the name or value looks secret ([`airlock_config::looks_secret`]),
/// which is redacted whatever it holds. A configured environment may not
/// hold a secret at all (ENVIRONMENT_VARIABLE_SECRET); this is the second
/// line, for a value no shape matches.
pub fn environment_literal(name: &str, value: &str) -> bool {
    let path_list = value.split(':').all(|p| p.starts_with('/'));
    value.len() >= 8 && (!path_list || airlock_config::looks_secret(name, value))
}

/// The redactor of one command's output tails: every shape, and the
/// literal values of `env` (the command's whole environment) that
/// [`environment_literal`] picks, but never the `known` values (a literal
/// that is one of them is no secret).
pub fn tail_redactor(env: &[(String, String)], known: &[String]) -> Redactor {
    env.iter()
        .filter(|(k, v)| environment_literal(k, v))
        .fold(Redactor::new(), |r, (_, v)| r.with_literal(v))
        .with_known_all(known)
}

/// `raw` (the last bytes read, `keep` + [`REDACT_MARGIN`] at most)
/// redacted, then cut to its last `keep` bytes. When the stream was longer
/// (`truncated`), the window's first line is dropped first: it may begin
/// inside a secret, which no longer has its shape.
fn redacted_tail(redactor: &Redactor, raw: &str, truncated: bool, keep: usize) -> String {
    let window = if truncated {
        raw.split_once('\n').map_or("", |(_, rest)| rest)
    } else {
        raw
    };
    tail_of(&redactor.text(window), keep).to_owned()
}

fn capture(stream: OwnedFd, keep: usize) -> std::thread::JoinHandle<Captured> {
    std::thread::spawn(move || {
        let mut stream = std::fs::File::from(stream);
        let mut hasher = Sha256::new();
        let mut tail: VecDeque<u8> = VecDeque::with_capacity(keep);
        let mut buf = vec![0u8; 64 * 1024];
        let mut truncated = false;
        loop {
            match stream.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    hasher.update(&buf[..n]);
                    tail.extend(&buf[..n]);
                    while tail.len() > keep {
                        tail.pop_front();
                        truncated = true;
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
            truncated,
        }
    })
}

fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| Error::ConfineSpawn(format!("pipe: {e}")))
}

impl Runner {
    /// Wraps started spawners (at least one; all prepared from the same
    /// options, so the first one's [`Hello`] speaks for all), spawner `k`
    /// in slot `k` of `walls` when given.
    pub fn new(
        spawners: Vec<Spawner>,
        tail_bytes: usize,
        walls: Option<(Walls, WallLimits)>,
    ) -> Result<Runner> {
        let hello = spawners
            .first()
            .ok_or_else(|| Error::ConfineSpawn("no spawner".into()))?
            .hello()
            .clone();
        Ok(Runner {
            spawners: spawners.into_iter().map(Mutex::new).collect(),
            walls,
            disk: DiskWalls::default(),
            hello,
            tail_bytes,
        })
    }

    /// Watches what each command writes against `disk` (where jobs have
    /// walls: the processes to kill are found in the job's cgroup).
    pub fn with_disk(mut self, disk: DiskWalls) -> Runner {
        self.disk = disk;
        self
    }

    /// How many commands may run at once.
    pub fn slots(&self) -> usize {
        self.spawners.len()
    }

    /// A free spawner. The serve loop runs at most [`Runner::slots`] jobs,
    /// each one command at a time, so one is always free; were none, this
    /// waits for the first.
    fn free_spawner(&self) -> Result<(usize, MutexGuard<'_, Spawner>)> {
        let poisoned = || Error::ConfineSpawn("spawner lock poisoned".into());
        for (k, s) in self.spawners.iter().enumerate() {
            match s.try_lock() {
                Ok(guard) => return Ok((k, guard)),
                Err(TryLockError::WouldBlock) => {}
                Err(TryLockError::Poisoned(_)) => return Err(poisoned()),
            }
        }
        Ok((0, self.spawners[0].lock().map_err(|_| poisoned())?))
    }

    /// The walls' interface (`v1`, `v2`), when jobs have walls.
    pub fn walls(&self) -> Option<&'static str> {
        self.walls.as_ref().map(|(w, _)| w.tree().version())
    }

    /// The view commands get.
    pub fn view(&self) -> ViewMode {
        self.hello.view
    }

    /// What the spawner reported when it started.
    pub fn hello(&self) -> &Hello {
        &self.hello
    }

    /// The job for one command: the workspace, its working directory
    /// (`cwd`, relative, already checked to exist), HOME and TMPDIR.
    /// `scratch` is a per-request directory the command cannot otherwise
    /// reach (the host view's private TMPDIR lives there).
    pub fn job(
        &self,
        cmd: &Command,
        ws: &WorkspaceSource,
        scratch: &Path,
        index: usize,
        extras: &Extras<'_>,
    ) -> Result<Job> {
        let setup = |e: std::io::Error, p: &Path| Error::Setup {
            path: p.to_owned(),
            detail: e.to_string(),
        };
        // The environment's variables first: what the sandbox sets below
        // (HOME, TMPDIR, git's and Python's switches) comes later and wins.
        let mut env: Vec<(String, String)> = extras
            .variables
            .map(|v| v.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        let (binds, overlay, root) = match (self.hello.view, ws) {
            (ViewMode::MinimalRoot, WorkspaceSource::Overlay { lower, upper, work }) => (
                Vec::new(),
                Some(Overlay {
                    lower: lower.clone(),
                    layers: extras.layers.clone(),
                    upper: upper.clone(),
                    work: work.clone(),
                    target: VIEW_WORKSPACE.into(),
                }),
                PathBuf::from(VIEW_WORKSPACE),
            ),
            (ViewMode::MinimalRoot, WorkspaceSource::Dir(dir)) => (
                vec![Bind {
                    source: dir.clone(),
                    target: VIEW_WORKSPACE.into(),
                }],
                None,
                PathBuf::from(VIEW_WORKSPACE),
            ),
            (ViewMode::HostView, WorkspaceSource::Dir(dir)) => {
                let tmp = scratch.join(format!("tmp-{index}"));
                {
                    use std::os::unix::fs::DirBuilderExt;
                    std::fs::DirBuilder::new()
                        .mode(0o700)
                        .create(&tmp)
                        .map_err(|e| setup(e, &tmp))?;
                }
                let (uid, gid) = self.hello.ids;
                if rustix::process::geteuid().is_root() {
                    chown_tree(&tmp, uid, gid).map_err(|e| setup(e, &tmp))?;
                }
                for (source, rel) in &extras.home {
                    copy_into(source, &tmp.join(rel))?;
                }
                if rustix::process::geteuid().is_root() {
                    chown_tree(&tmp, uid, gid).map_err(|e| setup(e, &tmp))?;
                }
                let t = tmp.to_string_lossy().into_owned();
                env.push(("HOME".into(), t.clone()));
                env.push(("TMPDIR".into(), t));
                (
                    vec![
                        Bind {
                            source: dir.clone(),
                            target: dir.clone(),
                        },
                        Bind {
                            source: tmp.clone(),
                            target: tmp,
                        },
                    ],
                    None,
                    dir.clone(),
                )
            }
            (ViewMode::HostView, WorkspaceSource::Overlay { .. }) => {
                return Err(Error::ConfineSpawn(
                    "an overlay workspace needs the minimal root".into(),
                ));
            }
        };
        let mut nested = extras.nested.clone();
        if self.hello.view == ViewMode::MinimalRoot {
            env.push(("HOME".into(), "/tmp".into()));
            env.push(("TMPDIR".into(), "/tmp".into()));
            nested.extend(self.home_layer(&extras.home, scratch, index)?);
        }
        let ceiling = root
            .parent()
            .unwrap_or(&root)
            .to_string_lossy()
            .into_owned();
        for (k, v) in [
            ("GIT_CONFIG_NOSYSTEM", "1"),
            ("GIT_CONFIG_GLOBAL", "/dev/null"),
            ("GIT_CEILING_DIRECTORIES", ceiling.as_str()),
            ("GIT_TERMINAL_PROMPT", "0"),
            ("GIT_PAGER", "cat"),
            ("PAGER", "cat"),
            ("PYTHONNOUSERSITE", "1"),
            ("PYTHONHASHSEED", "0"),
        ] {
            env.push((k.into(), v.into()));
        }
        let workdir = if cmd.cwd == "." {
            root
        } else {
            root.join(&cmd.cwd)
        };
        Ok(Job {
            binds,
            overlay,
            workdir,
            env,
            argv: cmd.argv.iter().map(Into::into).collect(),
            timeout: Some(Duration::from_secs(u64::from(cmd.timeout_seconds))),
            nested,
            network: extras.network.as_ref().map(|(port, _)| *port),
        })
    }

    /// A layer's HOME part in the minimal root: each top-level entry's
    /// directories mounted under /tmp, copy-on-write over the layer where
    /// overlays work, else a copy of them bound read-write.
    fn home_layer(
        &self,
        home: &[(PathBuf, String)],
        scratch: &Path,
        index: usize,
    ) -> Result<Vec<airlock_sandbox::Nested>> {
        let err = |e: std::io::Error, p: &Path| Error::Setup {
            path: p.to_owned(),
            detail: e.to_string(),
        };
        let mut out = Vec::new();
        let (uid, gid) = self.hello.ids;
        for (k, (source, rel)) in home.iter().enumerate() {
            let base = scratch.join(format!("home-{index}-{k}"));
            let (upper, work) = (base.join("u"), base.join("w"));
            for d in [&upper, &work] {
                std::fs::create_dir_all(d).map_err(|e| err(e, d))?;
            }
            let copy_on_write = if self.hello.overlay.is_ok() {
                Some((upper.clone(), work.clone()))
            } else {
                copy_into(source, &upper)?;
                None
            };
            if rustix::process::geteuid().is_root() {
                chown_tree(&base, uid, gid).map_err(|e| err(e, &base))?;
            }
            out.push(airlock_sandbox::Nested {
                source: if copy_on_write.is_some() {
                    source.clone()
                } else {
                    upper
                },
                target: Path::new("/tmp").join(rel),
                copy_on_write,
            });
        }
        Ok(out)
    }

    /// Runs `cmd` (already allowed by the program policy) in a fresh
    /// sandbox.
    pub fn run(
        &self,
        cmd: &Command,
        ws: &WorkspaceSource,
        scratch: &Path,
        index: usize,
        extras: Extras<'_>,
    ) -> Result<(CommandEvidence, Confinement)> {
        let job = self.job(cmd, ws, scratch, index, &extras)?;
        // The environment the command gets: the spawner's clean one under
        // the job's entries (with or without a private /tmp only TMPDIR
        // differs, a path either way, never a literal).
        let redactor = tail_redactor(
            &airlock_sandbox::env::build(&job.workdir, true, &job.env),
            &extras.known,
        );
        let (out_r, out_w) = pipe()?;
        let (err_r, err_w) = pipe()?;
        let keep = self.tail_bytes;
        let started = Instant::now();
        let out = capture(out_r, keep + REDACT_MARGIN);
        let err = capture(err_r, keep + REDACT_MARGIN);
        let watched = written_dirs(ws, scratch);
        let (report, wall) = {
            let (slot, mut spawner) = self.free_spawner()?;
            let counters = self.walls.as_ref().map(|(w, _)| w.before(slot));
            let done = AtomicBool::new(false);
            // The kill goes through the spawner: the executor's Landlock
            // scope lets it signal no command.
            let watching = self.walls.is_some() && self.disk != DiskWalls::default();
            let (cancel_r, cancel_w) = if watching {
                pipe().map(|(r, w)| (Some(r), Some(w)))?
            } else {
                (None, None)
            };
            let (report, disk) = std::thread::scope(|s| {
                let watch = cancel_w.map(|cancel| {
                    let (done, watched, disk) = (&done, &watched, self.disk);
                    s.spawn(move || {
                        let cancel = std::fs::File::from(cancel);
                        watch_disk(disk, watched, done, &|| {
                            use std::io::Write;
                            let _ = (&cancel).write(b"x");
                        })
                    })
                });
                let report = spawner.run(
                    &job,
                    Stdio {
                        stdout: out_w,
                        stderr: err_w,
                        network: extras.network.map(|(_, fd)| fd),
                        cancel: cancel_r,
                    },
                    HELPER_GRACE,
                );
                done.store(true, Ordering::Release);
                (report, watch.map(|h| h.join().unwrap_or_default()))
            });
            let wall = self
                .walls
                .as_ref()
                .zip(counters)
                .map(|((w, limits), before)| {
                    wall_evidence(w, limits, w.after(slot, before), self.disk, disk)
                });
            drop(spawner);
            (report, wall)
        };
        let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let report = report.map_err(|e| Error::ConfineReport(format!("{}: {e}", cmd.label)))?;
        let join = |h: std::thread::JoinHandle<Captured>| {
            h.join().unwrap_or(Captured {
                sha256: hex::encode(Sha256::digest(b"")),
                tail: String::new(),
                truncated: false,
            })
        };
        let (stdout, stderr) = (join(out), join(err));
        if report.schema != REPORT_SCHEMA {
            return Err(Error::ConfineReport(format!(
                "unknown schema {:?}",
                report.schema
            )));
        }
        let (exit_code, signal, timed_out) = outcome(&cmd.label, &report)?;
        let evidence = CommandEvidence {
            label: cmd.label.clone(),
            argv_sha256: digest_of(&cmd.argv).map_err(|e| Error::ConfineSpawn(e.to_string()))?,
            exit_code,
            signal,
            timed_out,
            duration_ms,
            cpu_ms: report.cpu_ms,
            peak_rss_kib: report.peak_rss_kib,
            stdout_sha256: stdout.sha256,
            stderr_sha256: stderr.sha256,
            // Redacted before anything is built over them (module doc).
            stdout_tail: redacted_tail(&redactor, &stdout.tail, stdout.truncated, keep),
            stderr_tail: redacted_tail(&redactor, &stderr.tail, stderr.truncated, keep),
            wall,
        };
        Ok((evidence, confinement(&report)))
    }
}

/// What a command's evidence says of its job's walls.
fn wall_evidence(
    walls: &Walls,
    limits: &WallLimits,
    m: Measure,
    disk: DiskWalls,
    seen: Option<DiskSeen>,
) -> WallEvidence {
    WallEvidence {
        cgroup: walls.tree().version().to_owned(),
        memory_limit_bytes: limits.memory,
        processes_limit: limits.processes,
        memory_peak_bytes: m.memory_peak,
        peak_per_command: walls.peak_per_command(),
        oom_kills: m.oom_kills,
        fork_refusals: m.fork_refusals,
        cpu_weight: walls.cpu_weight(),
        cpu_max_millis: limits.cpu_max_millis,
        cpu_used_ms: m.cpu_usage_us.map(|us| us / 1000),
        io_weight: walls.io_weight(),
        disk_limit_bytes: disk.job_bytes,
        disk_peak_bytes: seen.map(|d| d.peak),
        disk_exceeded: seen.is_some_and(|d| d.exceeded),
        disk_reserve_reached: seen.is_some_and(|d| d.reserve),
    }
}

/// (exit code, signal, timed out) from the report's outcome.
fn outcome(label: &str, report: &Report) -> Result<(Option<i32>, Option<i32>, bool)> {
    match &report.outcome {
        Outcome::Exited { code } => Ok((Some(*code), None, false)),
        Outcome::Signaled { signal } => Ok((None, Some(*signal), false)),
        Outcome::TimedOut => Ok((None, None, true)),
        Outcome::Interrupted { signal } => Err(Error::ConfineReport(format!(
            "{label}: the spawner was interrupted by signal {signal}"
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
        ("root", n.root),
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
        view: report.view,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_literals_are_non_path_values_of_eight_or_more_and_secret_looking_ones() {
        for (name, value) in [
            ("PATH", "/usr/local/bin:/usr/bin:/bin"),
            ("HOME", "/tmp"),
            ("TMPDIR", "/var/lib/airlock/exec/scratch/tmp-0"),
            ("GIT_CEILING_DIRECTORIES", "/"),
            ("GIT_CONFIG_GLOBAL", "/dev/null"),
            ("LC_ALL", "C.UTF-8"),
            ("PAGER", "cat"),
            ("PYTHONHASHSEED", "0"),
        ] {
            assert!(!environment_literal(name, value), "{name}={value}");
        }
        for (name, value) in [
            ("NODE_ENV", "production-eu-1"),
            ("DEPLOY_TOKEN", "/run/credentials/x"),
            ("MIXED", "/opt/bin:relative-dir"),
        ] {
            assert!(environment_literal(name, value), "{name}={value}");
        }
    }

    #[test]
    fn tails_lose_every_shape_and_the_environments_literals_but_keep_paths() {
        let env = vec![
            ("PATH".to_owned(), "/usr/local/bin:/usr/bin:/bin".to_owned()),
            ("REGION_SEED".to_owned(), "plainword-no-shape".to_owned()),
        ];
        let r = tail_redactor(&env, &[]);
        let mut raw = String::from("searched /usr/bin for plainword-no-shape\n");
        for (_, secret) in airlock_proto::redact::planted() {
            raw.push_str(&format!("canary {secret}\n"));
        }
        let out = redacted_tail(&r, &raw, false, 1 << 20);
        assert!(
            out.contains("searched /usr/bin for [REDACTED:literal]"),
            "{out}"
        );
        for (kind, _) in airlock_proto::redact::planted() {
            assert!(out.contains(&format!("[REDACTED:{kind}]")), "{kind}: {out}");
        }
        assert!(!out.contains("IOSFODNN7EXAMPLE") && !out.contains("hunter2hunter2"));
    }

    /// Issue 41 item 6: a setup's tails lost the forwarder's URL, a
    /// literal of its environment (HTTPS_PROXY and kin).
    #[test]
    fn the_known_values_stay_in_tails_and_the_secrets_beside_them_do_not() {
        let mut env = crate::setup::proxy_variables();
        env.push(("MIRROR_SEED".to_owned(), "plainword-no-shape".to_owned()));
        let url = env[0].1.clone();
        let task = "p-0a1b2c3d4e5f6071";
        let mut raw = format!("Using proxy {url} for {task} (refs/heads/agent/{task})\n");
        raw.push_str("seed plainword-no-shape\n");
        for (_, secret) in airlock_proto::redact::planted() {
            raw.push_str(&format!("{task} {secret} {url}\n"));
        }
        // Without the known values, the forwarder's URL is a literal.
        let out = redacted_tail(&tail_redactor(&env, &[]), &raw, false, 1 << 20);
        assert!(!out.contains(&url), "{out}");
        let known = vec![url.clone(), task.to_owned()];
        let out = redacted_tail(&tail_redactor(&env, &known), &raw, false, 1 << 20);
        assert!(
            out.starts_with(&format!(
                "Using proxy {url} for {task} (refs/heads/agent/{task})\n"
            )),
            "{out}"
        );
        assert!(out.contains("seed [REDACTED:literal]\n"), "{out}");
        for (kind, _) in airlock_proto::redact::planted() {
            assert!(out.contains(&format!("[REDACTED:{kind}]")), "{kind}: {out}");
        }
        for line in out.lines().skip(2) {
            assert!(
                line.starts_with(&format!("{task} ")) && line.ends_with(&format!(" {url}")),
                "{line}"
            );
        }
        assert!(!out.contains("IOSFODNN7EXAMPLE") && !out.contains("hunter2hunter2"));
    }

    #[test]
    fn a_secret_cut_by_the_windows_start_is_dropped_and_the_tail_is_bounded() {
        let secret = format!("ghp_{}", "1a2B3c4D5e6F7g8H9i0JkLmNoPqRsTuV");
        // The window begins inside the token: its shape is gone.
        let raw = format!("{}\n{}\nend\n", &secret[6..], "x".repeat(100));
        let out = redacted_tail(&Redactor::new(), &raw, true, 50);
        assert!(!out.contains("JkLmNoPqRsTuV"), "{out}");
        assert!(out.len() <= 50 && out.ends_with("end\n"), "{out}");
        // Not truncated: the first line is the stream's own, kept.
        let out = redacted_tail(&Redactor::new(), "first line\nend\n", false, 50);
        assert_eq!(out, "first line\nend\n");
    }

    /// Writes `files` files of 1 MiB under `dir`, one every 20 ms, until
    /// `stop`.
    fn writer(dir: PathBuf, files: usize, stop: &AtomicBool) {
        for i in 0..files {
            if stop.load(Ordering::Acquire) {
                return;
            }
            std::fs::write(dir.join(format!("f{i}")), vec![7u8; 1 << 20]).unwrap();
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn the_disk_watch_kills_past_the_quota_and_records_the_peak() {
        let d = tempfile::tempdir().unwrap();
        let (ws, scratch) = (d.path().join("ws"), d.path().join("scratch"));
        std::fs::create_dir_all(ws.join("sub")).unwrap();
        std::fs::create_dir_all(&scratch).unwrap();
        // What was there before the command does not count.
        std::fs::write(ws.join("old"), vec![0u8; 8 << 20]).unwrap();
        let dirs = written_dirs(&WorkspaceSource::Dir(ws.clone()), &scratch);
        let (done, killed) = (AtomicBool::new(false), AtomicBool::new(false));
        let limits = DiskWalls {
            job_bytes: Some(4 << 20),
            reserve_bytes: None,
        };
        let seen = std::thread::scope(|s| {
            let w = s.spawn(|| {
                watch_disk(limits, &dirs, &done, &|| {
                    killed.store(true, Ordering::Release)
                })
            });
            // Half in the workspace, half in the scratch, until "killed".
            s.spawn(|| writer(ws.join("sub"), 64, &killed));
            writer(scratch.clone(), 64, &killed);
            done.store(true, Ordering::Release);
            w.join().unwrap()
        });
        assert!(seen.exceeded && !seen.reserve, "{seen:?}");
        assert!(killed.load(Ordering::Acquire));
        assert!(
            seen.peak > 4 << 20 && seen.peak < 100 << 20,
            "peak {}",
            seen.peak
        );
    }

    #[test]
    fn the_reserve_stops_a_job_that_writes_and_never_one_that_does_not() {
        let d = tempfile::tempdir().unwrap();
        let dirs = vec![d.path().to_owned()];
        // A reserve larger than any disk: always below it.
        let limits = DiskWalls {
            job_bytes: None,
            reserve_bytes: Some(u64::MAX),
        };
        let (done, killed) = (AtomicBool::new(false), AtomicBool::new(false));
        let idle = std::thread::scope(|s| {
            let w = s.spawn(|| {
                watch_disk(limits, &dirs, &done, &|| {
                    killed.store(true, Ordering::Release)
                })
            });
            std::thread::sleep(DISK_WATCH_INTERVAL * 3);
            done.store(true, Ordering::Release);
            w.join().unwrap()
        });
        assert_eq!(idle, DiskSeen::default());
        assert!(!killed.load(Ordering::Acquire));
        done.store(false, Ordering::Release);
        let writing = std::thread::scope(|s| {
            let w = s.spawn(|| {
                watch_disk(limits, &dirs, &done, &|| {
                    killed.store(true, Ordering::Release)
                })
            });
            writer(d.path().to_owned(), 64, &killed);
            done.store(true, Ordering::Release);
            w.join().unwrap()
        });
        assert!(writing.reserve && !writing.exceeded, "{writing:?}");
        assert!(writing.peak > 0);
    }
}

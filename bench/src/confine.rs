//! `airlock-bench confine`: what confining one command costs.
//!
//! For `/bin/true` and `python3 -c pass`, side by side in the same rounds
//! (the variants interleaved, so drift hits them alike):
//!
//! 1. **bare**: spawn the command and wait (the floor);
//! 2. **executor (minimal root)**: the executor's own path — a spawner
//!    prepared once with the executor's policy (`airlock_executor`'s setup:
//!    user and mount namespaces, the minimal root's template, compiled
//!    seccomp), and per command a job over its socket with stdout and
//!    stderr pipes, one fork for the init and one fork and one exec for
//!    the command, in its own mount and pid namespaces, with the
//!    workspace, a private /tmp and /proc mounted, Landlock and seccomp;
//! 3. **executor (host view)**: the same spawner where user namespaces are
//!    refused (Landlock, seccomp with the metadata rows, no mounts);
//! 4. **airlock-confine**: the standalone tool, which prepares the same
//!    sandbox for one command and exits (so the preparation and one more
//!    exec are in each run);
//! 5. **bwrap** (the baseline): bubblewrap with the equivalent policy — a
//!    user and a pid namespace, the same read-only system paths, a
//!    minimal /dev, /proc, a tmpfs /tmp, the workspace at /workspace, a
//!    new session, the same seccomp programs (`--add-seccomp-fd`), a clean
//!    environment — but no Landlock, which bwrap does not have.
//!
//! Each figure is the median and p90 of wall time from the start to the
//! end of one command over `--runs` runs (after a warm-up), then the ratios
//! against the targets. Wall time depends on how busy the machine
//! is; for CPU time use `perf stat -r N` on each command line (see the
//! README). Timings are printed, never asserted.

use std::error::Error;
use std::ffi::OsString;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use airlock_sandbox::spawner::{Options, Spawner};
use airlock_sandbox::{Bind, Job, SYSTEM_RO, ViewMode};

type BenchResult<T> = Result<T, Box<dyn Error>>;

/// Runs of each variant discarded before measuring.
const WARMUP: usize = 3;

/// Uid and gid commands run as when the bench is root (the executor's
/// commands run as a user of their own).
const SANDBOX_UID: u32 = 65534;

/// The commands measured.
const COMMANDS: &[(&str, &[&str])] = &[
    ("/bin/true", &["/bin/true"]),
    ("python3 -c pass", &["/usr/bin/python3", "-c", "pass"]),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Bare,
    Spawner,
    SpawnerHostView,
    Confine,
    Bwrap,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Bare => "bare",
            Variant::Spawner => "executor (minimal root)",
            Variant::SpawnerHostView => "executor (host view)",
            Variant::Confine => "airlock-confine",
            Variant::Bwrap => "bwrap",
        }
    }
}

struct Bench {
    confine: Option<PathBuf>,
    bwrap: Option<PathBuf>,
    seccomp: Vec<PathBuf>,
    ws: PathBuf,
    tmp: PathBuf,
    report: PathBuf,
    root: bool,
    spawner: Spawner,
    host_view: Spawner,
    devnull: std::fs::File,
}

impl Bench {
    fn job(&self, view: ViewMode, argv: &[&str]) -> Job {
        let mut env: Vec<(String, String)> = Vec::new();
        let (binds, workdir) = match view {
            ViewMode::MinimalRoot => {
                env.push(("HOME".into(), "/tmp".into()));
                env.push(("TMPDIR".into(), "/tmp".into()));
                (
                    vec![Bind {
                        source: self.ws.clone(),
                        target: "/workspace".into(),
                    }],
                    PathBuf::from("/workspace"),
                )
            }
            ViewMode::HostView => {
                let t = self.tmp.display().to_string();
                env.push(("HOME".into(), t.clone()));
                env.push(("TMPDIR".into(), t));
                (
                    [&self.ws, &self.tmp]
                        .iter()
                        .map(|p| Bind {
                            source: (*p).clone(),
                            target: (*p).clone(),
                        })
                        .collect(),
                    self.ws.clone(),
                )
            }
        };
        for (k, v) in EXECUTOR_ENV {
            env.push(((*k).into(), (*v).into()));
        }
        Job {
            binds,
            overlay: None,
            workdir,
            env,
            argv: argv.iter().map(OsString::from).collect(),
            timeout: Some(Duration::from_secs(60)),
            nested: Vec::new(),
            network: None,
        }
    }

    fn null(&self) -> BenchResult<OwnedFd> {
        Ok(self.devnull.try_clone()?.into())
    }

    /// Wall time of one run.
    fn time_once(&mut self, variant: Variant, argv: &[&str]) -> BenchResult<Duration> {
        let (status, elapsed) = match variant {
            Variant::Spawner | Variant::SpawnerHostView => {
                let view = if variant == Variant::Spawner {
                    ViewMode::MinimalRoot
                } else {
                    ViewMode::HostView
                };
                let job = self.job(view, argv);
                let stdio = airlock_sandbox::Stdio {
                    stdout: self.null()?,
                    stderr: self.null()?,
                    network: None,
                    cancel: None,
                };
                let spawner = if variant == Variant::Spawner {
                    &mut self.spawner
                } else {
                    &mut self.host_view
                };
                let start = Instant::now();
                let report = spawner.run(&job, stdio, Duration::from_secs(30))?;
                let elapsed = start.elapsed();
                if report.view != view {
                    return Err(format!("{}: view {:?}", variant.name(), report.view).into());
                }
                (report.exit_status, elapsed)
            }
            _ => {
                let mut cmd = self.command(variant, argv)?;
                let start = Instant::now();
                let status = cmd.status()?;
                (status.code().unwrap_or(-1), start.elapsed())
            }
        };
        if status != 0 {
            return Err(format!("{} {:?}: exit {status}", variant.name(), argv.join(" ")).into());
        }
        Ok(elapsed)
    }

    fn command(&self, variant: Variant, argv: &[&str]) -> BenchResult<Command> {
        let mut c = match variant {
            Variant::Bare => {
                let mut c = Command::new(argv[0]);
                c.args(&argv[1..]);
                c
            }
            Variant::Confine => {
                let mut c = Command::new(self.confine.as_ref().ok_or("no airlock-confine")?);
                c.args(self.confine_args()).arg("--").args(argv);
                c
            }
            Variant::Bwrap => {
                let mut c = Command::new(self.bwrap.as_ref().ok_or("no bwrap")?);
                c.args(self.bwrap_args()?).arg("--").args(argv);
                c
            }
            _ => unreachable!("the spawner variants run no command line"),
        };
        c.current_dir(&self.ws)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if self.root && variant == Variant::Bwrap {
            c.uid(SANDBOX_UID).gid(SANDBOX_UID);
        }
        Ok(c)
    }

    /// The executor's policy for airlock-confine (read-only system paths,
    /// the workspace and a private tmp, rlimits, a timeout, the
    /// executor's environment, a JSON report to a file).
    fn confine_args(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        let mut push = |k: &str, v: OsString| {
            a.push(k.into());
            a.push(v);
        };
        if self.root {
            push("--uid", SANDBOX_UID.to_string().into());
            push("--gid", SANDBOX_UID.to_string().into());
        }
        push("--rw", self.ws.clone().into());
        push("--workdir", self.ws.clone().into());
        for (k, v) in [
            ("--limit-nproc", "64"),
            ("--limit-as", "4G"),
            ("--limit-fsize", "256M"),
            ("--limit-nofile", "1024"),
            ("--limit-cpu", "600"),
            ("--timeout", "60s"),
        ] {
            push(k, v.into());
        }
        push("--env", "HOME=/tmp".into());
        for (k, v) in EXECUTOR_ENV {
            push("--env", format!("{k}={v}").into());
        }
        push("--report", self.report.clone().into());
        a
    }

    /// bubblewrap with the executor's view and the same seccomp programs.
    fn bwrap_args(&self) -> BenchResult<Vec<OsString>> {
        let mut a: Vec<OsString> = [
            "--unshare-user",
            "--unshare-pid",
            "--die-with-parent",
            "--new-session",
            "--clearenv",
            "--setenv",
            "PATH",
            "/usr/local/bin:/usr/bin:/bin",
            "--setenv",
            "HOME",
            "/tmp",
            "--setenv",
            "TMPDIR",
            "/tmp",
        ]
        .iter()
        .map(OsString::from)
        .collect();
        for (k, v) in EXECUTOR_ENV {
            a.extend(["--setenv".into(), (*k).into(), (*v).into()]);
        }
        for p in SYSTEM_RO {
            let path = Path::new(p);
            let Ok(meta) = std::fs::symlink_metadata(path) else {
                continue;
            };
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(path)?;
                a.extend(["--symlink".into(), target.into(), (*p).into()]);
            } else {
                a.extend(["--ro-bind".into(), (*p).into(), (*p).into()]);
            }
        }
        a.extend(
            [
                "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--bind",
            ]
            .iter()
            .map(OsString::from),
        );
        a.extend([self.ws.clone().into(), "/workspace".into()]);
        a.extend(["--chdir".into(), "/workspace".into()]);
        for f in &self.seccomp {
            // Opened per run: bwrap reads each descriptor to its end.
            let file = std::fs::File::open(f)?;
            let fd = OwnedFd::from(file);
            let raw = fd.as_raw_fd();
            // The descriptor must survive into bwrap: leak it for this run
            // (closed when the bench exits; a handful per run).
            std::mem::forget(fd);
            clear_cloexec(raw)?;
            a.extend(["--add-seccomp-fd".into(), raw.to_string().into()]);
        }
        Ok(a)
    }
}

/// Lets `fd` survive into bubblewrap (fcntl(F_SETFD, 0)).
fn clear_cloexec(fd: i32) -> BenchResult<()> {
    // SAFETY: F_SETFD on a descriptor this process owns takes no pointer.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(())
}

/// The environment entries the executor adds (see the executor's `run.rs`).
const EXECUTOR_ENV: &[(&str, &str)] = &[
    ("GIT_CONFIG_NOSYSTEM", "1"),
    ("GIT_CONFIG_GLOBAL", "/dev/null"),
    ("GIT_CEILING_DIRECTORIES", "/"),
    ("GIT_TERMINAL_PROMPT", "0"),
    ("GIT_PAGER", "cat"),
    ("PAGER", "cat"),
    ("PYTHONNOUSERSITE", "1"),
    ("PYTHONHASHSEED", "0"),
];

/// Median and p90 of a sample, in milliseconds.
fn stats(samples: &[Duration]) -> (f64, f64) {
    let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| {
        let i = ((ms.len() as f64 - 1.0) * q).round() as usize;
        ms[i.min(ms.len() - 1)]
    };
    (at(0.5), at(0.9))
}

fn default_confine() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("airlock-confine")))
        .unwrap_or_else(|| PathBuf::from("/usr/libexec/airlock/airlock-confine"))
}

/// The executor's sandbox settings (its `run::setup` with the default limits).
fn executor_setup(namespaces: bool) -> airlock_sandbox::Setup {
    airlock_sandbox::Setup {
        mountpoints: vec!["/workspace".into()],
        limits: airlock_sandbox::Limits {
            nproc: Some(64),
            address_space: Some(4 << 30),
            file_size: Some(256 << 20),
            open_files: Some(1024),
            cpu_seconds: Some(600),
        },
        net: false,
        uts: false,
        ipc: false,
        namespaces,
        ..airlock_sandbox::Setup::default()
    }
}

/// Runs the benchmark and prints the table and ratios.
pub fn run(runs: u32, confine: Option<&Path>, bwrap: Option<&Path>) -> BenchResult<()> {
    let root = nix::unistd::geteuid().is_root();
    let dir = tempfile::Builder::new()
        .prefix("airlock-bench-confine-")
        .tempdir_in("/var/tmp")?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
    let (ws, tmp) = (dir.path().join("ws"), dir.path().join("tmp"));
    for d in [&ws, &tmp] {
        std::fs::create_dir(d)?;
        if root {
            std::os::unix::fs::chown(d, Some(SANDBOX_UID), Some(SANDBOX_UID))?;
        }
    }
    // The spawners first, while this process is single-threaded.
    let start = |namespaces: bool| {
        Spawner::start(Options {
            setup: executor_setup(namespaces),
            drop_to: root.then_some((SANDBOX_UID, SANDBOX_UID)),
            work_root: dir.path().to_owned(),
            cgroup: Vec::new(),
        })
    };
    let spawner = start(true)?;
    let host_view = start(false)?;
    println!(
        "spawner: {} ({}); host view spawner: {}",
        spawner.hello().view.as_str(),
        spawner.hello().lockdown,
        host_view.hello().view.as_str()
    );
    let confine = confine
        .map_or_else(default_confine, Path::to_path_buf)
        .is_file()
        .then(|| confine.map_or_else(default_confine, Path::to_path_buf));
    let bwrap = bwrap
        .map(Path::to_path_buf)
        .or_else(|| Some(PathBuf::from("/usr/bin/bwrap")))
        .filter(|p| p.is_file());
    // The executor's seccomp programs, for bwrap's --add-seccomp-fd.
    let mut seccomp = Vec::new();
    let extras = airlock_sandbox::seccomp_policy::Extras {
        unix_paths: true,
        shared_ipc: true,
        ..Default::default()
    };
    for (i, program) in airlock_sandbox::seccomp::compile_with(extras)?
        .iter()
        .enumerate()
    {
        let path = dir.path().join(format!("seccomp-{i}.bpf"));
        let mut f = std::fs::File::create(&path)?;
        for ins in program {
            f.write_all(&ins.code.to_ne_bytes())?;
            f.write_all(&[ins.jt, ins.jf])?;
            f.write_all(&ins.k.to_ne_bytes())?;
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
        seccomp.push(path);
    }
    let mut bench = Bench {
        confine,
        bwrap,
        seccomp,
        ws,
        tmp,
        report: dir.path().join("report.json"),
        root,
        spawner,
        host_view,
        devnull: std::fs::OpenOptions::new().write(true).open("/dev/null")?,
    };
    let mut variants = vec![Variant::Bare, Variant::Spawner, Variant::SpawnerHostView];
    if bench.confine.is_some() {
        variants.push(Variant::Confine);
    } else {
        println!("airlock-confine not found beside this binary: its column is left out");
    }
    if bench.bwrap.is_some() {
        variants.push(Variant::Bwrap);
    } else {
        println!("bwrap not found: install the Debian package bubblewrap for the baseline");
    }
    println!(
        "airlock-bench confine: {runs} runs per cell after {WARMUP} warm-up runs, as {}",
        if root {
            format!("root (commands as uid {SANDBOX_UID})")
        } else {
            "an unprivileged user (user namespaces)".into()
        }
    );
    // samples[command][variant]: wall times.
    let mut samples: Vec<Vec<Vec<Duration>>> =
        vec![vec![Vec::new(); variants.len()]; COMMANDS.len()];
    for round in 0..(WARMUP + runs as usize) {
        for (ci, (_, argv)) in COMMANDS.iter().enumerate() {
            for (vi, v) in variants.iter().enumerate() {
                let t = bench.time_once(*v, argv)?;
                if round >= WARMUP {
                    samples[ci][vi].push(t);
                }
            }
        }
    }
    println!();
    println!(
        "{:<18} {:<26} {:>11} {:>9}",
        "command", "variant", "median ms", "p90 ms"
    );
    let mut medians = vec![vec![0.0; variants.len()]; COMMANDS.len()];
    for (ci, (label, _)) in COMMANDS.iter().enumerate() {
        for (vi, v) in variants.iter().enumerate() {
            let (median, p90) = stats(&samples[ci][vi]);
            medians[ci][vi] = median;
            println!("{label:<18} {:<26} {median:>11.2} {p90:>9.2}", v.name());
        }
    }
    println!();
    println!("ratios of median wall times (target in brackets):");
    ratios(&variants, &medians);
    println!();
    println!("CPU time, independent of the load: perf stat -r 50 <the same command lines>");
    Ok(())
}

fn ratios(variants: &[Variant], figures: &[Vec<f64>]) {
    let idx = |v: Variant| variants.iter().position(|x| *x == v);
    for (ci, (label, _)) in COMMANDS.iter().enumerate() {
        let m = &figures[ci];
        let bare = m[0];
        let target = if ci == 0 { 2.0 } else { 1.1 };
        for v in [Variant::Spawner, Variant::SpawnerHostView, Variant::Confine] {
            let Some(i) = idx(v) else { continue };
            let r = m[i] / bare;
            let t = if v == Variant::Spawner {
                format!("[<= {target}] {}", verdict(r <= target))
            } else {
                String::new()
            };
            println!("  {label:<16} {:<26} / bare  = {r:>5.2}  {t}", v.name());
        }
        if let Some(b) = idx(Variant::Bwrap) {
            for v in [Variant::Spawner, Variant::SpawnerHostView, Variant::Confine] {
                let Some(i) = idx(v) else { continue };
                let r = m[i] / m[b];
                let t = if v == Variant::Spawner && ci == 0 {
                    format!("[<= 0.5] {}", verdict(r <= 0.5))
                } else {
                    String::new()
                };
                println!("  {label:<16} {:<26} / bwrap = {r:>5.2}  {t}", v.name());
            }
            println!(
                "  {label:<16} {:<26} / bare  = {:>5.2}",
                "bwrap",
                m[b] / bare
            );
        }
    }
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

//! `airlock-bench confine`: what confining one command costs.
//!
//! For `/bin/true` and `python3 -c pass`, side by side in the same rounds
//! (the variants interleaved, so drift hits them alike):
//!
//! 1. **bare**: spawn the command and wait (the floor);
//! 2. **helper**: `airlock-confine` with a policy like the executor's
//!    (read-only system paths, one read-write workspace and a private tmp,
//!    rlimits, a timeout, a clean environment plus the executor's entries,
//!    a JSON report to a file), namespaces on;
//! 3. **helper --no-namespaces**: the same without namespaces, so the cost
//!    of each part shows;
//! 4. **bwrap** (the baseline): bubblewrap with the equivalent policy:
//!    `--ro-bind / / --bind DIR DIR --unshare-net --unshare-pid --clearenv
//!    --die-with-parent`.
//!
//! Each figure is the median and p90 of wall time from spawn to exit over
//! `--runs` runs (after a warm-up), then the ratios helper/bare and
//! helper/bwrap against the targets. Wall time depends on how busy
//! the machine is; for CPU time use `perf stat -r N` on each command line
//! (its task-clock follows every process of the tree; see the README).
//! Timings are printed, never asserted.

use std::error::Error;
use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

type BenchResult<T> = Result<T, Box<dyn Error>>;

/// Runs of each variant discarded before measuring.
const WARMUP: usize = 3;

/// Uid and gid the helper runs the command as when the bench is root (the
/// executor's commands run as a user of their own).
const SANDBOX_UID: u32 = 65534;

/// The commands measured.
const COMMANDS: &[(&str, &[&str])] = &[
    ("/bin/true", &["/bin/true"]),
    ("python3 -c pass", &["/usr/bin/python3", "-c", "pass"]),
];

/// The environment entries the executor adds (see the executor's `run.rs`).
const EXECUTOR_ENV: &[(&str, &str)] = &[
    ("GIT_CONFIG_NOSYSTEM", "1"),
    ("GIT_CONFIG_GLOBAL", "/dev/null"),
    ("GIT_TERMINAL_PROMPT", "0"),
    ("GIT_PAGER", "cat"),
    ("PAGER", "cat"),
    ("PYTHONNOUSERSITE", "1"),
    ("PYTHONHASHSEED", "0"),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Bare,
    Helper,
    HelperNoNamespaces,
    Bwrap,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Bare => "bare",
            Variant::Helper => "airlock-confine",
            Variant::HelperNoNamespaces => "airlock-confine --no-namespaces",
            Variant::Bwrap => "bwrap",
        }
    }
}

struct Setup {
    confine: PathBuf,
    bwrap: Option<PathBuf>,
    ws: PathBuf,
    tmp: PathBuf,
    report: PathBuf,
    root: bool,
}

impl Setup {
    fn command(&self, variant: Variant, argv: &[&str]) -> Command {
        let mut c = match variant {
            Variant::Bare => {
                let mut c = Command::new(argv[0]);
                c.args(&argv[1..]);
                c
            }
            Variant::Helper | Variant::HelperNoNamespaces => {
                let mut c = Command::new(&self.confine);
                c.args(self.helper_args(variant == Variant::HelperNoNamespaces));
                c.arg("--").args(argv);
                c
            }
            Variant::Bwrap => {
                let mut c = Command::new(self.bwrap.as_ref().expect("bwrap present"));
                c.args(["--ro-bind", "/", "/", "--bind"])
                    .arg(&self.ws)
                    .arg(&self.ws)
                    .args(["--unshare-net", "--unshare-pid", "--clearenv"])
                    .args(["--die-with-parent", "--setenv", "PATH", "/usr/bin:/bin"])
                    .arg("--chdir")
                    .arg(&self.ws)
                    .arg("--")
                    .args(argv);
                c
            }
        };
        c.current_dir(&self.ws)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c
    }

    /// The executor's policy for one command (its `Runner::policy`).
    fn helper_args(&self, no_namespaces: bool) -> Vec<OsString> {
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
        push("--rw", self.tmp.clone().into());
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
        let tmp = self.tmp.display().to_string();
        push("--env", format!("HOME={tmp}").into());
        push("--env", format!("TMPDIR={tmp}").into());
        for (k, v) in EXECUTOR_ENV {
            push("--env", format!("{k}={v}").into());
        }
        push("--report", self.report.clone().into());
        if no_namespaces {
            a.push("--no-namespaces".into());
        }
        a
    }

    /// Wall time of one run.
    fn time_once(&self, variant: Variant, argv: &[&str]) -> BenchResult<Duration> {
        let mut cmd = self.command(variant, argv);
        let start = Instant::now();
        let status = cmd.status()?;
        let elapsed = start.elapsed();
        if !status.success() {
            return Err(format!("{} {:?}: {status}", variant.name(), argv.join(" ")).into());
        }
        Ok(elapsed)
    }
}

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

/// Runs the benchmark and prints the table and ratios.
pub fn run(runs: u32, confine: Option<&Path>, bwrap: Option<&Path>) -> BenchResult<()> {
    let confine = confine.map_or_else(default_confine, Path::to_path_buf);
    if !confine.is_file() {
        return Err(format!(
            "{} not found (build it: cargo build --release -p airlock-confine, or pass --confine)",
            confine.display()
        )
        .into());
    }
    let bwrap = bwrap
        .map(Path::to_path_buf)
        .or_else(|| Some(PathBuf::from("/usr/bin/bwrap")))
        .filter(|p| p.is_file());
    // Under /var/tmp: the helper mounts a private tmpfs on /tmp, which
    // would hide a workspace under /tmp.
    let dir = tempfile::Builder::new()
        .prefix("airlock-bench-confine-")
        .tempdir_in("/var/tmp")?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
    let root = nix_is_root();
    let (ws, tmp) = (dir.path().join("ws"), dir.path().join("tmp"));
    for d in [&ws, &tmp] {
        std::fs::create_dir(d)?;
        if root {
            std::os::unix::fs::chown(d, Some(SANDBOX_UID), Some(SANDBOX_UID))?;
        }
    }
    let setup = Setup {
        confine,
        bwrap,
        report: dir.path().join("report.json"),
        ws,
        tmp,
        root,
    };
    let mut variants = vec![Variant::Bare, Variant::Helper, Variant::HelperNoNamespaces];
    if setup.bwrap.is_some() {
        variants.push(Variant::Bwrap);
    } else {
        println!("bwrap not found: install the Debian package bubblewrap for the baseline");
    }
    println!(
        "airlock-bench confine: {runs} runs per cell after {WARMUP} warm-up runs; helper {} as {}",
        setup.confine.display(),
        if root {
            format!("root (command as uid {SANDBOX_UID})")
        } else {
            "an unprivileged user (user namespace)".into()
        }
    );
    // samples[command][variant]: wall times.
    let mut samples: Vec<Vec<Vec<Duration>>> =
        vec![vec![Vec::new(); variants.len()]; COMMANDS.len()];
    for round in 0..(WARMUP + runs as usize) {
        for (ci, (_, argv)) in COMMANDS.iter().enumerate() {
            for (vi, v) in variants.iter().enumerate() {
                let t = setup.time_once(*v, argv)?;
                if round >= WARMUP {
                    samples[ci][vi].push(t);
                }
            }
        }
    }
    println!();
    println!(
        "{:<18} {:<32} {:>11} {:>9}",
        "command", "variant", "median ms", "p90 ms"
    );
    let mut medians = vec![vec![0.0; variants.len()]; COMMANDS.len()];
    for (ci, (label, _)) in COMMANDS.iter().enumerate() {
        for (vi, v) in variants.iter().enumerate() {
            let (median, p90) = stats(&samples[ci][vi]);
            medians[ci][vi] = median;
            println!("{label:<18} {:<32} {median:>11.2} {p90:>9.2}", v.name());
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
        let target = if ci == 0 { 2.0 } else { 1.15 };
        for v in [Variant::Helper, Variant::HelperNoNamespaces] {
            let Some(i) = idx(v) else { continue };
            let r = m[i] / bare;
            println!(
                "  {label:<16} {:<32} / bare  = {r:>5.2}  [<= {target}] {}",
                v.name(),
                verdict(r <= target)
            );
        }
        if let Some(b) = idx(Variant::Bwrap) {
            for v in [Variant::Helper, Variant::HelperNoNamespaces] {
                let Some(i) = idx(v) else { continue };
                let r = m[i] / m[b];
                println!(
                    "  {label:<16} {:<32} / bwrap = {r:>5.2}  [<= 0.33] {}",
                    v.name(),
                    verdict(r <= 1.0 / 3.0)
                );
            }
            println!(
                "  {label:<16} {:<32} / bare  = {:>5.2}",
                "bwrap",
                m[b] / bare
            );
        }
    }
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

fn nix_is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}

//! airlock's systemd testbed.
//!
//! The package is checked the way an administrator meets it: `scripts/package`
//! builds the .deb, a minimal Debian root (debootstrap, cached between runs)
//! is booted with `systemd-nspawn --volatile=overlay`, so it has a real
//! systemd as pid 1, a real system bus and polkitd, the .deb is installed
//! with apt-get, and the services are driven with systemctl and airlockctl.
//! [`scenario`] holds the checks; this module holds the machinery: commands
//! with time limits, the cached root, the booted container and the report.
//!
//! The container is driven with `nsenter` into its init's namespaces (the
//! host's systemd is not pid 1 on every machine this runs on, so
//! `machinectl` and `systemd-run --machine` are not relied on).

#![allow(clippy::missing_errors_doc)]

pub mod hardening;
pub mod results;
pub mod scenario;
pub mod units;

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::FromRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Packages debootstrap adds to the minimal root (DESIGN.md §5): what the
/// package depends on, and Debian's node exporter with acl for the metrics
/// check (docs/metrics.md's ACL), and Cockpit (with dbus-user-session,
/// which debootstrap does not pick for dconf-service's alternative) for the
/// Cockpit page.
pub const ROOT_INCLUDE: &str = "systemd,systemd-sysv,dbus,libpam-systemd,polkitd,git,python3,prometheus-node-exporter,acl,cockpit-ws,cockpit-system,cockpit-bridge,dbus-user-session,sudo";
/// A Debian release the testbed boots: the same packages are installed
/// and checked on each, in a root of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Release {
    /// Its code name, debootstrap's suite (`bookworm`).
    pub suite: &'static str,
    /// Its major version (12).
    pub version: u32,
}

impl Release {
    /// "Debian 12 (bookworm)".
    pub fn label(&self) -> String {
        format!("Debian {} ({})", self.version, self.suite)
    }

    /// What each of its checks' names starts with in the report.
    pub fn prefix(&self) -> String {
        format!("[{} {}] ", self.version, self.suite)
    }
}

/// The releases the testbed runs on, in order: every check runs on each.
pub const RELEASES: &[Release] = &[
    Release {
        suite: "bookworm",
        version: 12,
    },
    Release {
        suite: "trixie",
        version: 13,
    },
];

/// The releases of this run: [`RELEASES`], or those
/// `AIRLOCK_TESTBED_RELEASES` names (suites or versions, separated by
/// commas: `trixie`, `12,13`), for a developer's narrower run.
pub fn selected_releases() -> Result<Vec<Release>, String> {
    match std::env::var("AIRLOCK_TESTBED_RELEASES") {
        Ok(list) if !list.trim().is_empty() => parse_releases(&list),
        _ => Ok(RELEASES.to_vec()),
    }
}

fn parse_releases(list: &str) -> Result<Vec<Release>, String> {
    let mut chosen = Vec::new();
    for word in list.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        let release = RELEASES
            .iter()
            .find(|r| r.suite == word || r.version.to_string() == word)
            .ok_or_else(|| {
                format!(
                    "AIRLOCK_TESTBED_RELEASES names {word:?}, not one of {}",
                    RELEASES
                        .iter()
                        .map(|r| format!("{} ({})", r.suite, r.version))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })?;
        if !chosen.contains(release) {
            chosen.push(*release);
        }
    }
    // In the testbed's order, whatever order the list gave.
    chosen.sort_by_key(|r| RELEASES.iter().position(|x| x == r));
    Ok(chosen)
}
/// Default cache directory for the root; `AIRLOCK_TESTBED_CACHE` overrides it.
pub const DEFAULT_CACHE: &str = "/var/cache/airlock-testbed";
/// The Debian mirror debootstrap fetches from: `AIRLOCK_TESTBED_MIRROR`,
/// else the one this host's apt uses (the first `deb` source of
/// `/etc/apt/sources.list` or a deb822 file in `sources.list.d/` that is
/// not a security archive), so that the testbed asks apt which registry
/// to use rather than naming one.
pub fn debian_mirror() -> Result<String, String> {
    if let Ok(m) = std::env::var("AIRLOCK_TESTBED_MIRROR") {
        return Ok(m);
    }
    let mut files = vec![PathBuf::from("/etc/apt/sources.list")];
    if let Ok(dir) = fs::read_dir("/etc/apt/sources.list.d") {
        let mut more: Vec<PathBuf> = dir.flatten().map(|e| e.path()).collect();
        more.sort();
        files.extend(more);
    }
    files
        .iter()
        .filter_map(|f| fs::read_to_string(f).ok().map(|t| (f, t)))
        .flat_map(|(f, text)| mirrors_in(f, &text))
        .find(|uri| !uri.trim_end_matches('/').ends_with("-security"))
        .ok_or_else(|| {
            "no Debian mirror in /etc/apt/sources.list{,.d}: set AIRLOCK_TESTBED_MIRROR".to_owned()
        })
}

/// The `deb` source URIs of one apt sources file (one-line or deb822).
#[must_use]
fn mirrors_in(file: &Path, text: &str) -> Vec<String> {
    let name = file.to_string_lossy();
    if name.ends_with(".sources") {
        text.split("\n\n")
            .filter(|stanza| {
                stanza.lines().any(|l| {
                    l.strip_prefix("Types:")
                        .is_some_and(|t| t.split_whitespace().any(|t| t == "deb"))
                }) && !stanza.lines().any(|l| l.trim() == "Enabled: no")
            })
            .flat_map(|stanza| {
                stanza
                    .lines()
                    .filter_map(|l| l.strip_prefix("URIs:"))
                    .flat_map(|u| u.split_whitespace().map(str::to_owned))
                    .collect::<Vec<_>>()
            })
            .collect()
    } else if name.ends_with(".list") {
        text.lines()
            .map(str::trim)
            .filter(|l| l.starts_with("deb "))
            .filter_map(|l| {
                // `deb [options] URI suite …`: the options may hold spaces.
                let rest = &l[4..];
                let rest = match rest.trim_start().strip_prefix('[') {
                    Some(opts) => opts.split_once(']').map_or("", |(_, r)| r),
                    None => rest,
                };
                rest.split_whitespace().next().map(str::to_owned)
            })
            .collect()
    } else {
        vec![]
    }
}
/// Host tools the testbed needs, with the Debian package providing each.
pub const HOST_TOOLS: &[(&str, &str)] = &[
    ("debootstrap", "debootstrap"),
    ("systemd-nspawn", "systemd-container"),
    ("nsenter", "util-linux"),
    ("dpkg-deb", "dpkg"),
    ("dpkg-shlibdeps", "dpkg-dev"),
    ("lintian", "lintian"),
    ("rpmbuild", "rpm"),
    ("help2man", "help2man"),
    ("systemd-analyze", "systemd"),
];

/// The workspace root (two levels above this crate).
pub fn workspace_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.join("../..")
        .canonicalize()
        .unwrap_or_else(|_| here.join("../.."))
}

/// True when the effective uid is 0.
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// The first directory of `PATH` holding an executable `name`.
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

// ---------------------------------------------------------------------------
// Commands with a time limit.

/// What a finished command left.
#[derive(Clone, Debug, Default)]
pub struct Out {
    /// Exit code; `None` when killed by a signal or at the time limit.
    pub code: Option<i32>,
    /// Standard output, lossily decoded.
    pub stdout: String,
    /// Standard error, lossily decoded.
    pub stderr: String,
    /// True when the time limit killed it.
    pub timed_out: bool,
}

impl Out {
    /// True for exit code 0.
    pub fn ok(&self) -> bool {
        self.code == Some(0)
    }

    /// Standard output and error together, for messages.
    pub fn both(&self) -> String {
        let mut s = self.stdout.clone();
        if !self.stderr.is_empty() {
            if !s.is_empty() && !s.ends_with('\n') {
                s.push('\n');
            }
            s.push_str(&self.stderr);
        }
        s
    }

    /// `Ok(self)` on exit code 0, else an error naming `what` with the output.
    pub fn expect_ok(self, what: &str) -> Result<Self, String> {
        if self.ok() {
            Ok(self)
        } else {
            Err(format!(
                "{what}: {}\n{}",
                self.describe(),
                tail(&self.both(), 40)
            ))
        }
    }

    /// "exit N", "killed", or "timed out".
    pub fn describe(&self) -> String {
        match (self.timed_out, self.code) {
            (true, _) => "timed out".into(),
            (false, Some(c)) => format!("exit {c}"),
            (false, None) => "killed by a signal".into(),
        }
    }
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn drain(mut from: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = from.read_to_end(&mut buf);
        buf
    })
}

fn wait_until(child: &mut Child, deadline: Instant) -> (Option<ExitStatus>, bool) {
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return (Some(status), false),
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                return (child.wait().ok(), true);
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(_) => return (None, false),
        }
    }
}

/// Runs `cmd` (stdin from /dev/null unless `input` is given) and waits at
/// most `limit`, then kills it.
pub fn run(cmd: &mut Command, input: Option<&[u8]>, limit: Duration) -> Result<Out, String> {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.stdin(if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run {:?}: {e}", cmd.get_program()))?;
    if let (Some(data), Some(mut stdin)) = (input, child.stdin.take()) {
        let data = data.to_vec();
        std::thread::spawn(move || {
            let _ = stdin.write_all(&data);
        });
    }
    let out = drain(child.stdout.take().ok_or("no stdout")?);
    let err = drain(child.stderr.take().ok_or("no stderr")?);
    let (status, timed_out) = wait_until(&mut child, Instant::now() + limit);
    Ok(Out {
        code: status.and_then(|s| s.code()),
        stdout: String::from_utf8_lossy(&out.join().unwrap_or_default()).into_owned(),
        stderr: String::from_utf8_lossy(&err.join().unwrap_or_default()).into_owned(),
        timed_out,
    })
}

// ---------------------------------------------------------------------------
// The report: progress lines as the run goes, a log file, a summary.

/// How a check ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It held.
    Pass,
    /// It did not.
    Fail,
    /// An earlier failure made it meaningless.
    Skipped,
}

/// One line of the summary.
#[derive(Clone, Debug)]
pub struct Check {
    /// What was checked (starting with its release's [`Release::prefix`]
    /// when it ran in a release's root).
    pub name: String,
    /// The release whose root it ran in; `None` for the checks made once
    /// (the packages).
    pub release: Option<Release>,
    /// Its family (README.md's table lists those that passed on a release).
    pub group: &'static str,
    /// How it ended.
    pub outcome: Outcome,
    /// How long it took.
    pub took: Duration,
    /// What it found (figures on success, the reason on failure).
    pub detail: String,
}

/// Progress and results of a run. Progress goes straight to the test's
/// standard error (live under `cargo test`; `cargo nextest` shows it for a
/// failing test, or with `--no-capture`) and to a log file.
#[derive(Debug)]
pub struct Report {
    started: Instant,
    log: Arc<Mutex<File>>,
    log_path: PathBuf,
    /// Every check so far.
    pub checks: Vec<Check>,
    release: Option<Release>,
    group: &'static str,
}

impl Report {
    /// A report logging to `log_path` (truncated).
    pub fn new(log_path: &Path) -> Result<Self, String> {
        if let Some(dir) = log_path.parent() {
            fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let log = File::create(log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
        Ok(Report {
            started: Instant::now(),
            log: Arc::new(Mutex::new(log)),
            log_path: log_path.to_owned(),
            checks: Vec::new(),
            release: None,
            group: "packages",
        })
    }

    /// The log file.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Seconds since the start.
    pub fn elapsed(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// A progress line.
    pub fn say(&self, msg: &str) {
        let line = format!("[testbed {:6.1}s] {msg}\n", self.elapsed());
        // Written to fd 2 directly, not with eprint!, so that libtest's
        // capture does not hold it back until the end.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
        self.log(&line);
    }

    /// A line in the log file only.
    pub fn log(&self, text: &str) {
        if let Ok(mut f) = self.log.lock() {
            let _ = f.write_all(text.as_bytes());
            if !text.ends_with('\n') {
                let _ = f.write_all(b"\n");
            }
        }
    }

    /// The checks from here on run in `release`'s root (their names carry
    /// it), or once for all (`None`).
    pub fn set_release(&mut self, release: Option<Release>) {
        self.release = release;
    }

    /// A report for the checks of `release`, which may run on a thread of
    /// its own beside the others: the same clock and log file, checks of
    /// its own, which [`Report::absorb`] adds to this one's afterwards.
    pub fn fork(&self, release: Release) -> Report {
        Report {
            started: self.started,
            log: Arc::clone(&self.log),
            log_path: self.log_path.clone(),
            checks: Vec::new(),
            release: Some(release),
            group: "root",
        }
    }

    /// Adds the checks of a [`Report::fork`] after this one's.
    pub fn absorb(&mut self, other: Report) {
        self.checks.extend(other.checks);
    }

    /// The release whose root the checks run in now.
    pub fn release(&self) -> Option<Release> {
        self.release
    }

    /// The family of the checks from here on.
    pub fn set_group(&mut self, group: &'static str) {
        self.group = group;
    }

    /// `name` as the report shows it: with the release, if any.
    fn full_name(&self, name: &str) -> String {
        match self.release {
            Some(r) => format!("{}{name}", r.prefix()),
            None => name.to_owned(),
        }
    }

    /// Runs one check and records it; returns whether it passed.
    pub fn check<T>(&mut self, name: &str, f: impl FnOnce(&Self) -> Result<T, String>) -> Option<T>
    where
        T: Detail,
    {
        let name = &self.full_name(name);
        self.say(&format!("... {name}"));
        let t = Instant::now();
        let result = f(self);
        let took = t.elapsed();
        let (outcome, detail, value) = match result {
            Ok(v) => (Outcome::Pass, v.detail(), Some(v)),
            Err(e) => (Outcome::Fail, e, None),
        };
        let mark = if outcome == Outcome::Pass {
            "PASS"
        } else {
            "FAIL"
        };
        let first = detail.lines().next().unwrap_or("");
        self.say(&format!(
            "{mark} {name} ({:.1}s){}{first}",
            took.as_secs_f64(),
            if first.is_empty() { "" } else { ": " }
        ));
        if outcome == Outcome::Fail {
            for line in detail.lines().skip(1).take(60) {
                self.say(&format!("     {line}"));
            }
        } else {
            self.log(&detail);
        }
        self.checks.push(Check {
            name: name.to_owned(),
            release: self.release,
            group: self.group,
            outcome,
            took,
            detail,
        });
        value
    }

    /// Records checks that could not run.
    pub fn skip(&mut self, names: &[&str], why: &str) {
        for name in names {
            let name = self.full_name(name);
            self.say(&format!("SKIP {name}: {why}"));
            self.checks.push(Check {
                name,
                release: self.release,
                group: self.group,
                outcome: Outcome::Skipped,
                took: Duration::ZERO,
                detail: why.to_owned(),
            });
        }
    }

    /// The summary table.
    pub fn summary(&self) -> String {
        let mut s = String::from("\nsystemd testbed summary\n");
        for c in &self.checks {
            let mark = match c.outcome {
                Outcome::Pass => "PASS",
                Outcome::Fail => "FAIL",
                Outcome::Skipped => "SKIP",
            };
            let first = c.detail.lines().next().unwrap_or("");
            s.push_str(&format!(
                "  {mark}  {:6.1}s  {:<52} {}\n",
                c.took.as_secs_f64(),
                c.name,
                first
            ));
        }
        let failed = self
            .checks
            .iter()
            .filter(|c| c.outcome != Outcome::Pass)
            .count();
        let mut releases: Vec<Release> = Vec::new();
        for c in &self.checks {
            if let Some(r) = c.release.filter(|r| !releases.contains(r)) {
                releases.push(r);
            }
        }
        for release in releases {
            let of: Vec<&Check> = self
                .checks
                .iter()
                .filter(|c| c.release == Some(release))
                .collect();
            s.push_str(&format!(
                "  {}: {} checks, {} not passed, {:.1}s of checks\n",
                release.label(),
                of.len(),
                of.iter().filter(|c| c.outcome != Outcome::Pass).count(),
                of.iter().map(|c| c.took.as_secs_f64()).sum::<f64>()
            ));
        }
        s.push_str(&format!(
            "  {} checks, {} not passed, {:.1}s in all; log: {}\n",
            self.checks.len(),
            failed,
            self.elapsed(),
            self.log_path.display()
        ));
        s
    }

    /// True when every check passed.
    pub fn all_passed(&self) -> bool {
        self.checks.iter().all(|c| c.outcome == Outcome::Pass)
    }
}

/// A check's value, rendered for the report.
pub trait Detail {
    /// One line (or more) for the report.
    fn detail(&self) -> String;
}

impl Detail for String {
    fn detail(&self) -> String {
        self.clone()
    }
}

impl Detail for () {
    fn detail(&self) -> String {
        String::new()
    }
}

// ---------------------------------------------------------------------------
// The cached Debian root.

fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Returns the cached minimal root of `release`, making it first with
/// debootstrap when it is missing (under a lock, into a temporary directory
/// renamed when complete). `--volatile=overlay` keeps it pristine
/// afterwards. Each release has a root of its own (its suite and the
/// package list name it).
pub fn debian_root(
    cache: &Path,
    mirror: &str,
    release: Release,
    report: &Report,
) -> Result<PathBuf, String> {
    fs::create_dir_all(cache).map_err(|e| format!("{}: {e}", cache.display()))?;
    let suite = release.suite;
    let key = format!("{suite} minbase {ROOT_INCLUDE}");
    let root = cache.join(format!("{suite}-minbase-{:016x}", fnv1a(&key)));
    let ready = root.join(".airlock-testbed-ready");
    // One lock per release: two releases' roots may be made side by side.
    let lock_path = cache.join(format!(".{suite}.lock"));
    let lock_file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| format!("{}: {e}", lock_path.display()))?;
    report.say(&format!(
        "waiting for the cache lock {}",
        lock_path.display()
    ));
    let _lock = nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| format!("locking {}: {e}", lock_path.display()))?;
    if ready.exists() {
        report.say(&format!("cached root: {}", root.display()));
        return Ok(root);
    }
    let tmp = cache.join(format!(
        "{}.tmp",
        root.file_name().and_then(|n| n.to_str()).unwrap_or("root")
    ));
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
    }
    if root.exists() {
        fs::remove_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
    }
    report.say(&format!(
        "no cached root: debootstrap --variant=minbase --include={ROOT_INCLUDE} {suite} (a few minutes, once)"
    ));
    // A mirror that fails a download once (a fresh machine has no cached
    // root, so every CI run depends on it) is tried once more from scratch.
    let mut tries = 0;
    loop {
        tries += 1;
        match debootstrap(&tmp, mirror, suite, report) {
            Ok(()) => break,
            Err(e) if tries < 2 => {
                report.say(&format!("{e}\ntrying debootstrap once more"));
                fs::remove_dir_all(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
            }
            Err(e) => return Err(e),
        }
    }
    // Nothing is installed on top: what the package needs must already be in
    // the root, as on a fresh minimal system.
    let _ = Command::new("chroot")
        .arg(&tmp)
        .args(["apt-get", "clean"])
        .status();
    fs::write(tmp.join(".airlock-testbed-ready"), format!("{key}\n")).map_err(|e| e.to_string())?;
    fs::rename(&tmp, &root).map_err(|e| format!("{} -> {}: {e}", tmp.display(), root.display()))?;
    report.say(&format!("root ready: {}", root.display()));
    Ok(root)
}

/// Where debootstrap keeps its suite scripts.
const DEBOOTSTRAP_SCRIPTS: &str = "/usr/share/debootstrap/scripts";

/// The script argument debootstrap needs for `suite`: none when it has a
/// script of that name, else its `sid` script, which every Debian suite
/// since bookworm uses (debootstrap's own `trixie` is a link to it), given
/// as the fourth argument (`debootstrap SUITE TARGET MIRROR SCRIPT`, the
/// documented way to bootstrap a suite newer than debootstrap).
fn debootstrap_script(scripts: &Path, suite: &str) -> Result<Option<PathBuf>, String> {
    if scripts.join(suite).exists() {
        return Ok(None);
    }
    let sid = scripts.join("sid");
    if sid.exists() {
        Ok(Some(sid))
    } else {
        Err(format!(
            "debootstrap has neither a {suite} nor a sid script in {}",
            scripts.display()
        ))
    }
}

/// One run of debootstrap of `suite` into `tmp`.
fn debootstrap(tmp: &Path, mirror: &str, suite: &str, report: &Report) -> Result<(), String> {
    let script = debootstrap_script(Path::new(DEBOOTSTRAP_SCRIPTS), suite)?;
    if let Some(script) = &script {
        report.say(&format!(
            "  debootstrap has no {suite} script: using {}",
            script.display()
        ));
    }
    let mut child = Command::new("debootstrap")
        .args(["--variant=minbase", &format!("--include={ROOT_INCLUDE}")])
        .arg(suite)
        .arg(tmp)
        .arg(mirror)
        .args(script)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run debootstrap: {e}"))?;
    let err = drain(child.stderr.take().ok_or("no stderr")?);
    let mut phase = String::new();
    for line in BufReader::new(child.stdout.take().ok_or("no stdout")?)
        .lines()
        .map_while(Result::ok)
    {
        report.log(&line);
        let verb = line
            .strip_prefix("I: ")
            .and_then(|l| l.split_whitespace().next())
            .unwrap_or("")
            .to_owned();
        if !verb.is_empty() && verb != phase {
            report.say(&format!(
                "  debootstrap: {}",
                line.trim_start_matches("I: ")
            ));
            phase = verb;
        }
    }
    let (status, _) = wait_until(&mut child, Instant::now() + Duration::from_secs(1200));
    let stderr = String::from_utf8_lossy(&err.join().unwrap_or_default()).into_owned();
    report.log(&stderr);
    if status.is_some_and(|s| s.success()) {
        return Ok(());
    }
    Err(format!(
        "debootstrap failed ({status:?}); see {}\n{}",
        report.log_path().display(),
        tail(&stderr, 20)
    ))
}

// ---------------------------------------------------------------------------
// The booted container.

/// A booted `systemd-nspawn --boot` container. Dropping it powers it off.
#[derive(Debug)]
pub struct Container {
    nspawn: Child,
    leader: u32,
    /// The machine name.
    pub name: String,
    /// The cgroup of the host's unified hierarchy it runs in, its own.
    cgroup: Option<PathBuf>,
}

/// A new cgroup `name` under this process's own in the host's unified
/// (v2) hierarchy, for one container; `None` on a host without one.
///
/// nspawn with `--keep-unit` runs the container in a `payload` cgroup
/// beside its own `supervisor`, both under the cgroup it was started in.
/// Where that is the same for two containers (the root of the hierarchy,
/// on a host whose pid 1 is not systemd), their systemds would share every
/// unit's cgroup (`/payload/system.slice/…`, logind's `user-1001.slice`):
/// one's stop would wait on the other's processes and miss its own. Each
/// container is started in a cgroup of its own instead.
fn container_cgroup(name: &str) -> Result<Option<PathBuf>, String> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").map_err(|e| e.to_string())?;
    // "… mount-point … - cgroup2 …": the fifth field, the type after " - ".
    let Some(mount) = mountinfo.lines().find_map(|l| {
        let (fields, rest) = l.split_once(" - ")?;
        (rest.split_whitespace().next()? == "cgroup2")
            .then(|| fields.split_whitespace().nth(4).map(PathBuf::from))?
    }) else {
        return Ok(None);
    };
    let own = fs::read_to_string("/proc/self/cgroup").map_err(|e| e.to_string())?;
    let own = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or("/")
        .trim_start_matches('/');
    let dir = mount.join(own).join(name);
    fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(Some(dir))
}

/// Removes a container's cgroup once its nspawn has ended: whatever still
/// runs in it is killed (`cgroup.kill`), then every directory of it goes,
/// the deepest first.
fn remove_cgroup(dir: &Path) {
    let populated = |d: &Path| {
        fs::read_to_string(d.join("cgroup.events"))
            .is_ok_and(|e| e.lines().any(|l| l == "populated 1"))
    };
    if populated(dir) {
        let _ = fs::write(dir.join("cgroup.kill"), "1");
        let deadline = Instant::now() + Duration::from_secs(5);
        while populated(dir) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    fn rmdir_tree(d: &Path) {
        if let Ok(entries) = fs::read_dir(d) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    rmdir_tree(&e.path());
                }
            }
        }
        let _ = fs::remove_dir(d);
    }
    rmdir_tree(dir);
}

fn children_of(pid: u32) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    let Ok(entries) = fs::read_dir("/proc") else {
        return found;
    };
    for e in entries.flatten() {
        let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        // pid (comm) state ppid ...; comm may hold spaces and parentheses.
        let Some(close) = stat.rfind(')') else {
            continue;
        };
        let comm = stat[stat.find('(').map_or(0, |i| i + 1)..close].to_owned();
        let ppid = stat[close + 1..]
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse::<u32>().ok());
        if ppid == Some(pid) {
            found.push((p, comm));
        }
    }
    found
}

impl Container {
    /// Boots `root` (volatile overlay, private network, `binds` read-only)
    /// as machine `airlock-testbed-<pid>-<tag>` and waits until its systemd
    /// reports the boot finished.
    pub fn boot(
        root: &Path,
        tag: &str,
        binds: &[(PathBuf, &str)],
        log: &Path,
        report: &Report,
    ) -> Result<Self, String> {
        let name = format!("airlock-testbed-{}-{tag}", std::process::id());
        let log_file = File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        let log_err = log_file.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = Command::new("systemd-nspawn");
        cmd.arg("--directory").arg(root).args([
            "--volatile=overlay",
            "--boot",
            "--private-network",
            "--register=no",
            "--keep-unit",
            "--console=passive",
            // systemd 252's nspawn filter lacks the Landlock calls the
            // executor and airlock-confine make; a real host has them.
            "--system-call-filter=landlock_create_ruleset landlock_add_rule landlock_restrict_self",
            &format!("--machine={name}"),
        ]);
        // The unified cgroup hierarchy (v2) alone, as Debian 12 and 13
        // boot on a real host; nspawn would otherwise copy a host's
        // hybrid layout, which systemd 257 counts as cgroup v1 (a taint,
        // and refused outright by later versions).
        cmd.env("SYSTEMD_NSPAWN_UNIFIED_HIERARCHY", "1");
        for (host, inside) in binds {
            cmd.arg(format!("--bind-ro={}:{inside}", host.display()));
        }
        let cgroup = container_cgroup(&name)?;
        let procs = cgroup
            .as_ref()
            .map(|d| std::ffi::CString::new(d.join("cgroup.procs").as_os_str().as_encoded_bytes()))
            .transpose()
            .map_err(|e| e.to_string())?;
        // If the test process dies without powering the container off (a
        // test-runner timeout, ^C), nspawn gets SIGTERM and shuts it down.
        // SAFETY: the closure runs in the forked child before exec and only
        // makes async-signal-safe calls that allocate nothing: open(2) and
        // write(2) of a path made before the fork (moving nspawn into the
        // container's own cgroup), and prctl(PR_SET_PDEATHSIG).
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                if let Some(procs) = &procs {
                    let fd = nix::fcntl::open(
                        procs.as_c_str(),
                        nix::fcntl::OFlag::O_WRONLY | nix::fcntl::OFlag::O_CLOEXEC,
                        nix::sys::stat::Mode::empty(),
                    )
                    .map_err(std::io::Error::from)?;
                    // open(2) just returned it (the unsafe block above
                    // covers from_raw_fd); closed on drop.
                    let fd = std::os::fd::OwnedFd::from_raw_fd(fd);
                    nix::unistd::write(&fd, b"0").map_err(std::io::Error::from)?;
                }
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM)
                    .map_err(std::io::Error::from)
            });
        }
        let nspawn = match cmd
            .stdin(Stdio::null())
            .stdout(log_file)
            .stderr(log_err)
            .spawn()
        {
            Ok(child) => child,
            Err(e) => {
                if let Some(dir) = &cgroup {
                    remove_cgroup(dir);
                }
                return Err(format!("cannot run systemd-nspawn: {e}"));
            }
        };
        let mut c = Container {
            nspawn,
            leader: 0,
            name,
            cgroup,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while c.leader == 0 {
            if let Ok(Some(status)) = c.nspawn.try_wait() {
                return Err(format!(
                    "systemd-nspawn exited ({status}) before the container booted:\n{}",
                    tail(&fs::read_to_string(log).unwrap_or_default(), 20)
                ));
            }
            if Instant::now() > deadline {
                return Err("the container's init did not appear within 60 s".into());
            }
            if let Some((pid, _)) = children_of(c.nspawn.id())
                .into_iter()
                .find(|(_, comm)| comm == "systemd")
            {
                c.leader = pid;
            } else {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        report.say(&format!(
            "container {} booting (init pid {})",
            c.name, c.leader
        ));
        loop {
            let out = c.sh(
                "systemctl is-system-running --wait",
                Duration::from_secs(90),
            )?;
            let state = out.stdout.trim().to_owned();
            if matches!(state.as_str(), "running" | "degraded") {
                if state == "degraded" {
                    let failed = c.sh(
                        "systemctl --failed --no-legend --plain",
                        Duration::from_secs(10),
                    )?;
                    report.say(&format!(
                        "container is degraded (not airlock's doing): {}",
                        failed.stdout.trim()
                    ));
                }
                break;
            }
            if Instant::now() > deadline + Duration::from_secs(60) {
                return Err(format!(
                    "the container did not finish booting: {}",
                    out.both()
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(c)
    }

    /// The container's init, as the host sees it.
    pub fn leader(&self) -> u32 {
        self.leader
    }

    /// Runs `script` with /bin/sh as root inside the container (all of its
    /// init's namespaces), with a clean environment.
    pub fn sh(&self, script: &str, limit: Duration) -> Result<Out, String> {
        let mut cmd = Command::new("nsenter");
        cmd.arg("--target")
            .arg(self.leader.to_string())
            .args(["--all", "/bin/sh", "-c", script])
            .env_clear()
            .envs(BTreeMap::from([
                (
                    "PATH",
                    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                ),
                ("HOME", "/root"),
                ("LANG", "C.UTF-8"),
                ("DEBIAN_FRONTEND", "noninteractive"),
                ("SYSTEMD_PAGER", ""),
                ("NO_COLOR", "1"),
            ]));
        run(&mut cmd, None, limit)
    }

    /// Like [`Container::sh`], failing unless the script exits 0.
    pub fn sh_ok(&self, script: &str, limit: Duration) -> Result<String, String> {
        let first = script.lines().next().unwrap_or(script);
        self.sh(script, limit)?.expect_ok(first).map(|o| o.stdout)
    }

    /// Where `path` inside the container is on the host (through the
    /// init's root), for checks made with the host's tools.
    pub fn host_path(&self, path: &str) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root{path}", self.leader))
    }

    /// Writes a file inside the container (through the init's root).
    pub fn write(&self, path: &str, content: &str) -> Result<(), String> {
        let host = PathBuf::from(format!("/proc/{}/root{path}", self.leader));
        if let Some(dir) = host.parent() {
            fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        fs::write(&host, content).map_err(|e| format!("{}: {e}", host.display()))
    }

    /// Powers the container off (SIGTERM to nspawn asks its systemd to shut
    /// down) and waits, killing it after `limit`.
    pub fn shutdown(&mut self, limit: Duration) -> Result<(), String> {
        if let Ok(Some(_)) = self.nspawn.try_wait() {
            if let Some(dir) = self.cgroup.take() {
                remove_cgroup(&dir);
            }
            return Ok(());
        }
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.nspawn.id()).unwrap_or(0));
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let (status, timed_out) = wait_until(&mut self.nspawn, Instant::now() + limit);
        if let Some(dir) = self.cgroup.take() {
            remove_cgroup(&dir);
        }
        if timed_out {
            return Err(format!(
                "the container did not power off within {limit:?}; killed"
            ));
        }
        match status {
            Some(s) if s.success() => Ok(()),
            other => Err(format!("systemd-nspawn ended with {other:?}")),
        }
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = self.shutdown(Duration::from_secs(20));
    }
}

#[cfg(test)]
mod mirror_tests {
    use super::mirrors_in;
    use std::path::Path;

    #[test]
    fn apt_sources_name_their_mirrors() {
        let deb822 = "Types: deb\nURIs: http://mirror.example.invalid/debian\nSuites: bookworm\n\n\
                      Types: deb-src\nURIs: http://src.example.invalid/debian\n\n\
                      Types: deb\nEnabled: no\nURIs: http://off.example.invalid/debian\n";
        assert_eq!(
            mirrors_in(Path::new("x.sources"), deb822),
            vec!["http://mirror.example.invalid/debian"]
        );
        let list = "# comment\ndeb-src http://src.example.invalid/debian bookworm main\n\
                    deb [arch=amd64 signed-by=/k.gpg] http://one.example.invalid/debian bookworm main\n\
                    deb http://two.example.invalid/debian bookworm main\n";
        assert_eq!(
            mirrors_in(Path::new("sources.list"), list),
            vec![
                "http://one.example.invalid/debian",
                "http://two.example.invalid/debian"
            ]
        );
        assert!(mirrors_in(Path::new("x.disabled"), list).is_empty());
    }
}

#[cfg(test)]
mod release_tests {
    use super::{RELEASES, debootstrap_script, parse_releases};

    #[test]
    fn a_developer_names_releases_by_suite_or_version() {
        let suites = |list: &str| -> Result<Vec<&str>, String> {
            Ok(parse_releases(list)?.iter().map(|r| r.suite).collect())
        };
        assert_eq!(suites("trixie").unwrap(), ["trixie"]);
        assert_eq!(suites("13, bookworm").unwrap(), ["bookworm", "trixie"]);
        assert_eq!(suites("12,bookworm").unwrap(), ["bookworm"]);
        assert!(suites("sid").unwrap_err().contains("\"sid\""));
        assert_eq!(RELEASES[0].prefix(), "[12 bookworm] ");
        assert_eq!(RELEASES[1].label(), "Debian 13 (trixie)");
    }

    #[test]
    fn a_suite_debootstrap_does_not_know_uses_its_sid_script() {
        let dir = tempfile::tempdir().unwrap();
        assert!(debootstrap_script(dir.path(), "trixie").is_err());
        std::fs::write(dir.path().join("sid"), "").unwrap();
        assert_eq!(
            debootstrap_script(dir.path(), "trixie").unwrap(),
            Some(dir.path().join("sid"))
        );
        std::os::unix::fs::symlink("sid", dir.path().join("trixie")).unwrap();
        assert_eq!(debootstrap_script(dir.path(), "trixie").unwrap(), None);
    }
}

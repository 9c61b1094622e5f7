//! airlock's sandbox escape suite.
//!
//! Every probe in [`probes::PROBES`] is a hostile verification command sent
//! through the real executor path: the harness builds a real `ExecRequest`
//! (a valid envelope, its source tree, a real source archive) whose one
//! verification command is `/usr/bin/python3 -c <probe>`, and runs
//! `airlock-executor run-once` as a non-root uid (one per probe) in a
//! network namespace of its own. This is the production shape: a non-root
//! executor, Landlocked itself, whose spawner starts each command in the
//! minimal root ([`Mode::MinimalRoot`]), or in the host view where the
//! kernel refuses namespaces ([`Mode::HostView`]).
//!
//! ```text
//!  harness (root)
//!   ├─ listeners: executor netns (127.0.0.1 TCP/UDP, :53, ::1, abstract UNIX),
//!   │             host netns (127.0.0.1, pathname UNIX stream + datagram),
//!   │             a veth peer namespace (169.254.x.2)
//!   ├─ marker (uid U, outside): secret in env, argv and memory; logs signals
//!   └─ ip netns exec NS  unshare -m  (fake /run/credentials, optional tmpfs work volume)
//!        └─ setpriv uid U [airlock-escape-no-namespaces]: airlock-executor run-once
//!             └─ spawner → init → python3 -c <probe> <fixtures as JSON>
//! ```
//!
//! A probe is **blocked** when the command itself reports it could not
//! reach its goal (exit 1, `BLOCKED: <errno or reason>`) *and* every
//! independent harness check passes: no secret in the answer, the marker
//! alive, untraced and unsignalled, no process of the probe's uid left, no
//! file created in /etc, /tmp, /var/tmp, /dev/shm, the answer genuine and
//! bound to its request, plus the probe's own checks; at the end, every
//! listener log empty and the outside directory unchanged.

pub mod probes;

use airlock_proto::binding::Binding;
use airlock_proto::bundle::{
    EXEC_REQUEST_SCHEMA, ExecFailure, ExecRequest, ExecResult, request_id_for,
};
use airlock_proto::envelope::{Envelope, ExecutionRequest};
use base64::Engine;
use probes::{Check, Evidence, Judge, Probe};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const LIB_PY: &str = include_str!("py/escape_lib.py");
const MARKER_PY: &str = include_str!("py/marker.py");
const LISTENER_PY: &str = include_str!("py/listener.py");

/// The interpreter the program policy allows.
pub const PYTHON: &str = "/usr/bin/python3";
/// Probe `i` runs as uid `UID_BASE + i` (+ 100 in the host view;
/// RLIMIT_NPROC counts per uid).
pub const UID_BASE: u32 = 47100;
/// Owner of the fake worker state directory.
pub const OTHER_UID: u32 = 47099;
/// Parallel probes.
pub const WORKERS: usize = 4;
/// Environment entries a sandboxed command may have (the executor's policy).
const ALLOWED_ENV: &[&str] = &[
    "PATH",
    "LC_ALL",
    "HOME",
    "TMPDIR",
    "GIT_CONFIG_NOSYSTEM",
    "GIT_CONFIG_GLOBAL",
    "GIT_CEILING_DIRECTORIES",
    "GIT_TERMINAL_PROMPT",
    "GIT_PAGER",
    "PAGER",
    "PYTHONNOUSERSITE",
    "PYTHONHASHSEED",
];

type Res<T> = Result<T, String>;

fn io<E: fmt::Display>(what: impl fmt::Display) -> impl FnOnce(E) -> String {
    move |e| format!("{what}: {e}")
}

/// Which view the executor's commands get.
#[derive(Clone, Debug)]
pub enum Mode {
    /// The minimal root: the spawner creates a user and a mount namespace,
    /// each command its own mount, pid and IPC namespaces, and sees only
    /// its workspace, a private /tmp, its /proc, a minimal /dev and
    /// read-only system paths (the executor by hand, or under its unit).
    MinimalRoot,
    /// The host view, where the kernel refuses namespaces (user namespaces
    /// disabled or restricted), emulated by running the executor under
    /// this wrapper (`airlock-escape-no-namespaces`): Landlock, seccomp
    /// (every metadata call by path refused), rlimits and the subreaper.
    HostView(PathBuf),
    /// The control: the same command as the same kind of uid, in the same
    /// network and mount namespace setup with the same fixtures, run
    /// directly (`setpriv … python3`), without the executor or any sandbox.
    /// A probe that claims to test the sandbox must escape here.
    Control,
}

impl Mode {
    /// A short name for the report.
    pub fn name(&self) -> &'static str {
        match self {
            Mode::MinimalRoot => "minimal-root",
            Mode::HostView(_) => "host-view",
            Mode::Control => "control",
        }
    }

    fn uid_offset(&self) -> u32 {
        match self {
            Mode::MinimalRoot => 0,
            Mode::HostView(_) => 100,
            Mode::Control => 200,
        }
    }
}

/// How a probe ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Blocked, and how.
    Blocked(String),
    /// Escaped, and what got through.
    Escaped(String),
    /// Did not run as designed (counts as a failure).
    Inconclusive(String),
    /// A known gap that got through (reported, not counted).
    Gap(String),
    /// Not run: a fixture is missing here.
    Skipped(String),
}

/// One probe's line of the report.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The probe's name.
    pub name: &'static str,
    /// What it tried.
    pub goal: &'static str,
    /// How it ended.
    pub verdict: Verdict,
    /// What its "blocked" proves (from the probe table).
    pub evidence: Evidence,
    /// Wall time of the executor run.
    pub elapsed: Duration,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (tag, text) = match &self.verdict {
            Verdict::Blocked(s) if matches!(self.evidence, Evidence::Host(_)) => {
                ("host-blocked", s)
            }
            Verdict::Blocked(s) => ("blocked", s),
            Verdict::Escaped(s) => ("ESCAPED", s),
            Verdict::Inconclusive(s) => ("INCONCLUSIVE", s),
            Verdict::Gap(s) => ("KNOWN GAP", s),
            Verdict::Skipped(s) => ("skipped", s),
        };
        let text: String = text.chars().take(300).collect();
        write!(f, "{:<24} {:<12} {text}", self.name, tag)
    }
}

/// The whole run.
#[derive(Debug, Default)]
pub struct Summary {
    /// One per probe, in table order.
    pub outcomes: Vec<Outcome>,
    /// Problems found by the checks made once at the end.
    pub global: Vec<String>,
}

impl Summary {
    fn count(&self, f: impl Fn(&Outcome) -> bool) -> usize {
        self.outcomes.iter().filter(|o| f(o)).count()
    }

    /// Probes run (every verdict but skipped).
    pub fn probes(&self) -> usize {
        self.count(|o| !matches!(o.verdict, Verdict::Skipped(_)))
    }

    /// Blocked probes whose control escaped: blocked by the sandbox.
    pub fn blocked_by_sandbox(&self) -> usize {
        self.count(|o| matches!(o.verdict, Verdict::Blocked(_)) && o.evidence == Evidence::Sandbox)
    }

    /// Blocked probes the control cannot make escape either.
    pub fn blocked_by_host(&self) -> usize {
        self.count(|o| {
            matches!(o.verdict, Verdict::Blocked(_)) && matches!(o.evidence, Evidence::Host(_))
        })
    }

    /// Escaped probes, plus one for every problem of the final checks.
    pub fn escaped(&self) -> usize {
        self.count(|o| matches!(o.verdict, Verdict::Escaped(_))) + self.global.len()
    }

    /// Known gaps that got through (by their own report only).
    pub fn gaps(&self) -> usize {
        self.count(|o| matches!(o.verdict, Verdict::Gap(_)))
    }

    /// Probes that did not run as designed.
    pub fn inconclusive(&self) -> usize {
        self.count(|o| matches!(o.verdict, Verdict::Inconclusive(_)))
    }

    /// Probes not run.
    pub fn skipped(&self) -> usize {
        self.count(|o| matches!(o.verdict, Verdict::Skipped(_)))
    }

    /// The summary line, from the same figures the test asserts.
    pub fn line(&self, mode: &str) -> String {
        format!(
            "{mode}: {} probes: {} blocked by the sandbox, {} blocked by the host anyway, \
             {} escaped, {} known gap{}{}{}",
            self.probes(),
            self.blocked_by_sandbox(),
            self.blocked_by_host(),
            self.escaped(),
            self.gaps(),
            if self.gaps() == 1 { "" } else { "s" },
            match self.inconclusive() {
                0 => String::new(),
                n => format!(", {n} INCONCLUSIVE"),
            },
            match self.skipped() {
                0 => String::new(),
                n => format!(", {n} skipped"),
            },
        )
    }
}

/// True when running as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Why the suite cannot run here (not root, a tool missing, ...), if so.
pub fn unavailable() -> Option<String> {
    if !is_root() {
        return Some("needs root (distinct uids, network namespaces)".into());
    }
    if !cfg!(target_arch = "x86_64") {
        return Some("probes use x86-64 system call conventions".into());
    }
    for tool in [
        "/usr/sbin/ip",
        "/usr/bin/unshare",
        "/usr/bin/setpriv",
        "/usr/sbin/setcap",
        "/usr/sbin/sysctl",
        PYTHON,
    ] {
        let alt = tool.replace("/usr/sbin/", "/sbin/");
        if !Path::new(tool).exists() && !Path::new(&alt).exists() {
            return Some(format!("{tool} is missing"));
        }
    }
    None
}

/// The executor binary of this build (its spawner starts every command).
#[derive(Clone, Debug)]
pub struct Bins {
    /// airlock-executor.
    pub executor: PathBuf,
}

impl Bins {
    /// The binaries beside this test binary's profile (`target/<profile>`),
    /// built with cargo only when they are missing. Never rebuilt when
    /// present: a rebuild with this package's feature set would replace
    /// the binaries other tests are running at that moment. `./scripts/test`
    /// builds them all first.
    pub fn locate() -> Res<Bins> {
        let exe = std::env::current_exe().map_err(io("current_exe"))?;
        // target/<profile>/deps/<test>-<hash>
        let profile = exe
            .parent()
            .and_then(Path::parent)
            .ok_or("no profile directory")?
            .to_owned();
        let bins = Bins {
            executor: profile.join("airlock-executor"),
        };
        let missing = !bins.executor.exists();
        if let (true, Ok(cargo), Some(target)) = (missing, std::env::var("CARGO"), profile.parent())
        {
            let mut build = Command::new(cargo);
            build
                .args(["build", "--quiet", "-p", "airlock-executor"])
                .env("CARGO_TARGET_DIR", target)
                .current_dir(env!("CARGO_MANIFEST_DIR"));
            if profile.file_name().and_then(|n| n.to_str()) == Some("release") {
                build.arg("--release");
            }
            let status = build.status().map_err(io("cargo build"))?;
            if !status.success() {
                return Err("cargo build -p airlock-executor failed".into());
            }
        }
        for b in [&bins.executor] {
            if !b.exists() {
                return Err(format!("{} is missing", b.display()));
            }
        }
        Ok(bins)
    }
}

fn random_hex(bytes: usize) -> String {
    let mut b = vec![0u8; bytes];
    getrandom::getrandom(&mut b).expect("getrandom");
    hex::encode(b)
}

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn run(cmd: &mut Command) -> Res<()> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(io(format!("{cmd:?}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn ip(args: &[&str]) -> Res<()> {
    run(Command::new("ip").args(args))
}

fn chown(path: &Path, uid: u32) -> Res<()> {
    std::os::unix::fs::chown(path, Some(uid), Some(uid)).map_err(io(path.display()))
}

fn mkdir(path: &Path, mode: u32, owner: Option<u32>) -> Res<()> {
    fs::create_dir_all(path).map_err(io(path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(io(path.display()))?;
    if let Some(uid) = owner {
        chown(path, uid)?;
    }
    Ok(())
}

fn put(path: &Path, data: &[u8], mode: u32, owner: Option<u32>) -> Res<()> {
    fs::write(path, data).map_err(io(path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(io(path.display()))?;
    if let Some(uid) = owner {
        chown(path, uid)?;
    }
    Ok(())
}

/// Waits for a JSON file another process renames into place.
fn wait_json(path: &Path, what: &str) -> Res<Value> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(bytes) = fs::read(path) {
            return serde_json::from_slice(&bytes).map_err(io(what));
        }
        if Instant::now() > deadline {
            return Err(format!("{what} did not start"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A child process killed and reaped on drop.
#[derive(Debug)]
struct Guarded(Child);

impl Drop for Guarded {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Pids whose real uid is `uid`.
pub fn processes_of(uid: u32) -> Vec<u32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
                s.lines().any(|l| {
                    l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some(&uid.to_string())
                })
            })
        })
        .collect()
}

fn status_field(pid: u32, field: &str) -> Option<String> {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix(field).map(|v| v.trim().to_owned()))
}

/// Everything about a directory tree that a write would change.
fn snapshot(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        let Ok(rd) = fs::read_dir(dir) else { return };
        for e in rd.flatten() {
            let p = e.path();
            let Ok(m) = fs::symlink_metadata(&p) else {
                continue;
            };
            let rel = p.strip_prefix(base).unwrap_or(&p).display().to_string();
            let content = if m.is_file() {
                fs::read(&p).map(|b| sha(&b)).unwrap_or_default()
            } else {
                String::new()
            };
            out.insert(
                rel,
                format!(
                    "{:o} {} {} {} {}",
                    m.mode(),
                    m.uid(),
                    m.len(),
                    m.nlink(),
                    content
                ),
            );
            if m.is_dir() {
                walk(base, &p, out);
            }
        }
    }
    walk(dir, dir, &mut out);
    out
}

/// Fixtures shared by all probes, removed on drop.
#[derive(Debug)]
pub struct Suite {
    tok: String,
    base: PathBuf,
    bins: Bins,
    netns: String,
    peer_netns: Option<String>,
    peer_addr: String,
    host_veth: Option<String>,
    suid_dir: PathBuf,
    ports: Value,
    secrets: Vec<String>,
    outside_before: BTreeMap<String, String>,
    listener_logs: Vec<PathBuf>,
    listeners: Vec<Guarded>,
    fixtures: BTreeMap<&'static str, String>,
}

impl Drop for Suite {
    fn drop(&mut self) {
        self.listeners.clear();
        let _ = ip(&["netns", "del", &self.netns]);
        if let Some(p) = &self.peer_netns {
            let _ = ip(&["netns", "del", p]);
        }
        if let Some(v) = &self.host_veth {
            let _ = ip(&["link", "del", v]);
        }
        let _ = fs::remove_dir_all(&self.suid_dir);
        if std::env::var_os("AIRLOCK_ESCAPE_KEEP").is_none() {
            let _ = fs::remove_dir_all(&self.base);
        }
    }
}

impl Suite {
    /// Creates the fixtures, namespaces and listeners.
    pub fn new(bins: Bins) -> Res<Suite> {
        let tok = random_hex(6);
        let base = PathBuf::from(format!("/var/tmp/airlock-escape-{tok}"));
        mkdir(&base, 0o755, None)?;
        let octet = 20 + (u32::from_str_radix(&tok[..2], 16).unwrap_or(0) % 200);
        let mut suite = Suite {
            tok: tok.clone(),
            base: base.clone(),
            bins,
            netns: format!("airlock-esc-{tok}"),
            peer_netns: None,
            peer_addr: format!("169.254.{octet}.2"),
            host_veth: None,
            suid_dir: PathBuf::from(format!("/usr/local/lib/airlock-escape-{tok}")),
            ports: json!({}),
            secrets: Vec::new(),
            outside_before: BTreeMap::new(),
            listener_logs: Vec::new(),
            listeners: Vec::new(),
            fixtures: BTreeMap::new(),
        };
        suite.files()?;
        suite.privileged_binaries()?;
        suite.networks(octet)?;
        suite.outside_before = snapshot(&base.join("outside"));
        Ok(suite)
    }

    fn files(&mut self) -> Res<()> {
        let tok = &self.tok;
        let outside = self.base.join("outside");
        mkdir(&outside, 0o777, None)?;
        let outside_secret = format!("outside-secret-{tok}");
        put(
            &outside.join("secret.txt"),
            outside_secret.as_bytes(),
            0o644,
            None,
        )?;
        put(&outside.join("target.txt"), b"target\n", 0o666, None)?;
        put(&outside.join("keep.txt"), b"keep\n", 0o644, None)?;
        let state = self.base.join("state");
        mkdir(&state, 0o700, Some(OTHER_UID))?;
        let state_secret = format!("state-secret-{tok}");
        put(
            &state.join("secret"),
            state_secret.as_bytes(),
            0o600,
            Some(OTHER_UID),
        )?;
        self.secrets = vec![
            outside_secret,
            state_secret,
            format!("cred-secret-{tok}"),
            format!("sibling-secret-{tok}"),
            format!("marker-secret-{tok}"),
            format!("canary-{tok}"),
        ];
        if let Ok(shadow) = fs::read_to_string("/etc/shadow") {
            self.secrets
                .extend(shadow.lines().filter(|l| l.len() > 24).map(str::to_owned));
        }
        let f = &mut self.fixtures;
        let s = |p: &Path| p.display().to_string();
        f.insert("outside", s(&outside));
        f.insert("outside_secret", s(&outside.join("secret.txt")));
        f.insert("target", s(&outside.join("target.txt")));
        f.insert("keep", s(&outside.join("keep.txt")));
        f.insert("state_dir", s(&state));
        f.insert("state_secret", s(&state.join("secret")));
        f.insert("sock", s(&outside.join("sock")));
        f.insert("dgram", s(&outside.join("dgram")));
        f.insert(
            "cred_file",
            "/run/credentials/airlock-worker.service/token".into(),
        );
        Ok(())
    }

    /// A setuid-root copy of `id` and a copy of `setpriv` with
    /// cap_setuid,cap_setgid+ep, under /usr (which the sandbox may execute).
    fn privileged_binaries(&mut self) -> Res<()> {
        mkdir(&self.suid_dir, 0o755, None)?;
        let id = self.suid_dir.join("id-setuid");
        fs::copy("/usr/bin/id", &id).map_err(io("copy /usr/bin/id"))?;
        fs::set_permissions(&id, fs::Permissions::from_mode(0o4755)).map_err(io("chmod 4755"))?;
        self.fixtures.insert("suid_id", id.display().to_string());
        let caps = self.suid_dir.join("setpriv-caps");
        fs::copy("/usr/bin/setpriv", &caps).map_err(io("copy /usr/bin/setpriv"))?;
        run(Command::new("setcap")
            .arg("cap_setuid,cap_setgid+ep")
            .arg(&caps))?;
        self.fixtures
            .insert("caps_setpriv", caps.display().to_string());
        Ok(())
    }

    fn listener(&mut self, netns: Option<&str>, name: &str, spec: Value) -> Res<Value> {
        let log = self.base.join(format!("listener-{name}.log"));
        let ready = self.base.join(format!("listener-{name}.json"));
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, PYTHON]);
                c
            }
            None => Command::new(PYTHON),
        };
        cmd.arg("-c")
            .arg(LISTENER_PY)
            .arg(&log)
            .arg(&ready)
            .arg(spec.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        let child = cmd.spawn().map_err(io("listener"))?;
        self.listeners.push(Guarded(child));
        self.listener_logs.push(log);
        // A listener that cannot bind exits: fatal, not a fallback.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(bytes) = fs::read(&ready) {
                return serde_json::from_slice(&bytes).map_err(io(format!("listener {name}")));
            }
            let guard = self.listeners.last_mut().ok_or("no listener")?;
            if let Some(status) = guard.0.try_wait().map_err(io("listener"))? {
                return Err(format!(
                    "listener {name} failed ({status}); see its stderr above"
                ));
            }
            if Instant::now() > deadline {
                return Err(format!("listener {name} did not start"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn networks(&mut self, octet: u32) -> Res<()> {
        let tok = self.tok.clone();
        ip(&["netns", "add", &self.netns])?;
        let ns = self.netns.clone();
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        // Ping sockets for every group, as systemd sets it on the host (a
        // new namespace starts with "1 0", nobody): the control can open
        // one, so raw_and_ping tests the sandbox, not this default.
        ip(&[
            "netns",
            "exec",
            &ns,
            "sysctl",
            "-q",
            "-w",
            "net.ipv4.ping_group_range=0 2147483647",
        ])?;
        let abstract_name = format!("airlock-escape-{tok}");
        let exec = self.listener(
            Some(&ns),
            "executor-netns",
            json!({
                "tcp": ["tcp4", ["127.0.0.1", 0]],
                "udp": ["udp4", ["127.0.0.1", 0]],
                "tcp6": ["tcp6", ["::1", 0]],
                "dns_udp": ["udp4", ["127.0.0.1", 53]],
                "dns_tcp": ["tcp4", ["127.0.0.1", 53]],
                "abstract": ["unix", format!("@{abstract_name}")],
            }),
        )?;
        let host = self.listener(
            None,
            "host",
            json!({
                "host_tcp": ["tcp4", ["127.0.0.1", 0]],
                "host_udp": ["udp4", ["127.0.0.1", 0]],
                "sock": ["unix", self.fixtures["sock"]],
                "dgram": ["unixdgram", self.fixtures["dgram"]],
            }),
        )?;
        // Another address: a veth peer in a namespace of our own, linked to
        // the host's namespace (the executor's may have only lo: its
        // self-check). Any failure is fatal.
        let peer_ns = format!("airlock-esp-{tok}");
        let host_veth = format!("aeh{}", &tok[..8]);
        let peer_veth = format!("aep{}", &tok[..8]);
        ip(&["netns", "add", &peer_ns])?;
        self.peer_netns = Some(peer_ns.clone());
        ip(&[
            "link", "add", &host_veth, "type", "veth", "peer", "name", &peer_veth, "netns",
            &peer_ns,
        ])?;
        self.host_veth = Some(host_veth.clone());
        let host_addr = format!("169.254.{octet}.1/30");
        let peer_cidr = format!("{}/30", self.peer_addr);
        ip(&["addr", "add", &host_addr, "dev", &host_veth])?;
        ip(&["link", "set", &host_veth, "up"])?;
        ip(&["-n", &peer_ns, "addr", "add", &peer_cidr, "dev", &peer_veth])?;
        ip(&["-n", &peer_ns, "link", "set", &peer_veth, "up"])?;
        ip(&["-n", &peer_ns, "link", "set", "lo", "up"])?;
        let peer = self.listener(
            Some(&peer_ns),
            "peer",
            json!({
                "peer_tcp": ["tcp4", [self.peer_addr, 0]],
                "peer_udp": ["udp4", [self.peer_addr, 0]],
            }),
        )?;
        let mut ports = serde_json::Map::new();
        for v in [exec, host, peer] {
            if let Value::Object(m) = v {
                ports.extend(m);
            }
        }
        for (k, v) in &ports {
            if !v.is_u64() {
                return Err(format!("listener {k} has no port: {v}"));
            }
        }
        self.ports = Value::Object(ports);
        self.fixtures.insert("abstract", abstract_name);
        Ok(())
    }

    /// Runs every probe, `WORKERS` at a time, printing one line each.
    pub fn run_all(&self, filter: Option<&str>, mode: &Mode) -> Summary {
        let list: Vec<(usize, &Probe)> = probes::PROBES
            .iter()
            .enumerate()
            .filter(|(_, p)| filter.is_none_or(|f| p.name.contains(f)))
            .collect();
        let next = AtomicUsize::new(0);
        let results: Mutex<Vec<(usize, Outcome)>> = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for _ in 0..WORKERS {
                s.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        let Some(&(index, probe)) = list.get(i) else {
                            break;
                        };
                        let started = Instant::now();
                        let verdict = self
                            .probe(index, probe, mode)
                            .unwrap_or_else(|e| Verdict::Inconclusive(format!("harness: {e}")));
                        let outcome = Outcome {
                            name: probe.name,
                            goal: probe.goal,
                            verdict,
                            evidence: probe.evidence,
                            elapsed: started.elapsed(),
                        };
                        println!("{outcome}");
                        let _ = std::io::stdout().flush();
                        results.lock().expect("no poison").push((index, outcome));
                    }
                });
            }
        });
        let mut results = results.into_inner().expect("no poison");
        results.sort_by_key(|(i, _)| *i);
        let mut summary = Summary {
            outcomes: results.into_iter().map(|(_, o)| o).collect(),
            global: Vec::new(),
        };
        summary.global = self.final_checks();
        summary
    }

    /// After the control run: empties the listener logs (the control was
    /// meant to reach them) and puts the outside directory back as it was.
    /// Returns what the control left in them (evidence, not failures).
    pub fn reset_after_control(&mut self) -> Res<Vec<String>> {
        let found = self.final_checks();
        for log in &self.listener_logs {
            if log.exists() {
                fs::write(log, b"").map_err(io(log.display()))?;
            }
        }
        let outside = self.base.join("outside");
        for e in fs::read_dir(&outside).map_err(io(outside.display()))? {
            let e = e.map_err(io("outside"))?;
            let rel = e.file_name().to_string_lossy().into_owned();
            if !self.outside_before.contains_key(&rel) {
                let p = e.path();
                let m = fs::symlink_metadata(&p).map_err(io(p.display()))?;
                if m.is_dir() {
                    fs::remove_dir_all(&p).map_err(io(p.display()))?;
                } else {
                    fs::remove_file(&p).map_err(io(p.display()))?;
                }
            }
        }
        let tok = &self.tok;
        put(
            &outside.join("secret.txt"),
            format!("outside-secret-{tok}").as_bytes(),
            0o644,
            Some(0),
        )?;
        put(&outside.join("target.txt"), b"target\n", 0o666, Some(0))?;
        put(&outside.join("keep.txt"), b"keep\n", 0o644, Some(0))?;
        let after = snapshot(&outside);
        if after != self.outside_before {
            return Err(format!(
                "the outside directory could not be restored after the control: {after:?}"
            ));
        }
        Ok(found)
    }

    /// Checks made once, after every probe ran.
    fn final_checks(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for log in &self.listener_logs {
            if let Ok(text) = fs::read_to_string(log) {
                if !text.trim().is_empty() {
                    problems.push(format!(
                        "listener {} received: {}",
                        log.display(),
                        text.trim()
                    ));
                }
            }
        }
        let after = snapshot(&self.base.join("outside"));
        if after != self.outside_before {
            let mut diff = Vec::new();
            for (k, v) in &after {
                if self.outside_before.get(k) != Some(v) {
                    diff.push(format!("{k} now {v}"));
                }
            }
            for k in self.outside_before.keys() {
                if !after.contains_key(k) {
                    diff.push(format!("{k} removed"));
                }
            }
            problems.push(format!("outside directory changed: {}", diff.join("; ")));
        }
        problems
    }

    /// Files one probe may try to create outside (named after it, so that
    /// parallel probes do not see each other's).
    fn pwned_paths(&self, probe: &Probe) -> Vec<PathBuf> {
        let tok = format!("{}-{}", self.tok, probe.name);
        ["/etc", "/tmp", "/var/tmp", "/dev/shm"]
            .iter()
            .map(|d| PathBuf::from(format!("{d}/airlock-pwned-{tok}")))
            .chain([self.base.join("outside").join(format!("moved-{tok}"))])
            .collect()
    }

    /// Runs one probe through the executor and judges it.
    fn probe(&self, index: usize, probe: &Probe, mode: &Mode) -> Res<Verdict> {
        if let Some(need) = probe.needs {
            if !self.fixtures.contains_key(need) {
                return Ok(Verdict::Skipped(format!(
                    "no {need} fixture on this machine"
                )));
            }
        }
        let uid = UID_BASE + mode.uid_offset() + u32::try_from(index).map_err(io("index"))?;
        if !processes_of(uid).is_empty() {
            return Err(format!("uid {uid} already has processes"));
        }
        let dir = self.base.join(format!("p-{}-{}", mode.name(), probe.name));
        mkdir(&dir, 0o755, None)?;
        for sub in ["marker", "out", "work"] {
            mkdir(&dir.join(sub), 0o755, Some(uid))?;
        }
        // A file outside that the probe's uid owns, in a directory it owns
        // (hard link, rename, truncate).
        mkdir(&dir.join("own"), 0o755, Some(uid))?;
        let own = dir.join("own").join("file.txt");
        let own_content = format!("own-{}\n", probe.name);
        put(&own, own_content.as_bytes(), 0o644, Some(uid))?;
        mkdir(&dir.join("gap"), 0o755, None)?;
        let gap_file = dir.join("gap").join("file.txt");
        put(&gap_file, b"gap\n", 0o644, Some(uid))?;
        set_keep_xattr(&gap_file)?;
        // A sibling request's workspace in the same work root (same uid).
        let sibling = dir
            .join("work")
            .join(format!("r{}", "0".repeat(40)))
            .join("src");
        mkdir(&sibling, 0o711, Some(uid))?;
        put(
            &sibling.join("secret.txt"),
            format!("sibling-secret-{}", self.tok).as_bytes(),
            0o600,
            Some(uid),
        )?;
        let mut marker = self.marker(uid, &dir)?;
        let marker_info = wait_json(&dir.join("marker").join("info.json"), "marker")?;
        let marker_pid = u32::try_from(marker_info["pid"].as_u64().ok_or("marker pid")?)
            .map_err(io("marker pid"))?;

        let out_path = dir.join("out").join("result.json");
        let spool = self.spool_answers(&dir, uid)?;
        // The source: its files and its symbolic links out of the
        // workspace (a repository's, as the executor makes them).
        let (archive, tree) = source_archive(&self.source_links(&dir))?;
        // The tree cache in the work root, as the executor lays it out (in
        // the sandboxed runs the executor finds no seal, removes this entry
        // and fills a real one from the archive, at the same path).
        let cache_file = self.tree_cache_entry(&dir, uid, &tree)?;
        // Metadata outside that the probe's uid owns: checked after every
        // probe, whatever it tried.
        let meta_targets: Vec<PathBuf> = std::iter::once(gap_file.clone())
            .chain(spool.iter().cloned())
            .collect();
        let meta_before = meta_targets
            .iter()
            .map(|p| metadata_of(p))
            .collect::<Res<Vec<_>>>()?;
        let meta_changes = || -> Vec<String> {
            let mut found: Vec<String> = meta_targets
                .iter()
                .zip(&meta_before)
                .filter_map(|(p, before)| match metadata_of(p) {
                    Ok(now) if now == *before => None,
                    Ok(now) => Some(format!(
                        "metadata of {} changed: {before:?} -> {now:?}",
                        p.display()
                    )),
                    Err(e) => Some(format!("metadata of {}: {e}", p.display())),
                })
                .collect();
            if probe.checks.contains(&Check::TreeCacheIntact) {
                if let Err(e) = cache_intact(&cache_file) {
                    found.push(e);
                }
            }
            found
        };
        let args = self.args(
            probe,
            mode,
            &Targets {
                own: &own,
                gap: &gap_file,
                sibling: &sibling,
                spool: &spool,
                cache: &cache_file,
            },
            &out_path,
            &marker_info,
        );
        let request = build_request(probe, index, &args, &tree)?;
        let req_path = dir.join("request.json");
        let arc_path = dir.join("source.tar");
        put(
            &req_path,
            &serde_json::to_vec(&request).map_err(io("request"))?,
            0o644,
            Some(uid),
        )?;
        put(&arc_path, &archive, 0o644, Some(uid))?;

        if let Mode::Control = mode {
            let ran = self.run_control(probe, uid, &dir, &req_path, &args)?;
            return self.judge_control(
                probe,
                uid,
                &dir,
                marker,
                marker_pid,
                &own,
                &own_content,
                ran,
                meta_changes(),
            );
        }
        let executor_log =
            self.run_executor(probe, mode, uid, &dir, &req_path, &arc_path, &out_path)?;

        // --- judge ---------------------------------------------------------
        let answer = fs::read(&out_path).unwrap_or_default();
        let mut problems = Vec::new();
        for secret in &self.secrets {
            let hit = |hay: &[u8]| hay.windows(secret.len()).any(|w| w == secret.as_bytes());
            if hit(&answer) || hit(executor_log.as_bytes()) {
                problems.push(format!(
                    "a secret reached the answer: {}…",
                    &secret[..secret.len().min(16)]
                ));
            }
        }
        // The marker: alive, untraced, unsignalled.
        let tracer = status_field(marker_pid, "TracerPid:");
        let state = status_field(marker_pid, "State:");
        if state.as_deref().is_none_or(|s| s.starts_with('Z')) {
            problems.push("the marker process died".into());
        }
        if tracer.as_deref().is_some_and(|t| t != "0") {
            problems.push(format!(
                "the marker is traced by {}",
                tracer.unwrap_or_default()
            ));
        }
        if let Some(seen) = marker_evidence(&mut marker, marker_pid, &dir)? {
            problems.push(seen);
        }
        // Nothing of the probe's uid left but the marker (give the kernel a moment).
        let mut left: Vec<u32> = Vec::new();
        for _ in 0..20 {
            left = processes_of(uid)
                .into_iter()
                .filter(|p| *p != marker_pid)
                .collect();
            if left.is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if !left.is_empty() {
            let names: Vec<String> = left
                .iter()
                .map(|p| format!("{p} {}", status_field(*p, "Name:").unwrap_or_default()))
                .collect();
            problems.push(format!(
                "processes of uid {uid} survived: {}",
                names.join(", ")
            ));
            for p in &left {
                // SAFETY: kill takes plain integers.
                unsafe { libc::kill(i32::try_from(*p).unwrap_or(0), libc::SIGKILL) };
            }
        }
        drop(marker);
        for p in self.pwned_paths(probe) {
            if fs::symlink_metadata(&p).is_ok() {
                problems.push(format!("{} was created", p.display()));
                let _ = fs::remove_file(&p);
            }
        }
        for check in probe.checks {
            if let Err(e) = self.check(*check, &own, &own_content, &answer) {
                problems.push(e);
            }
        }
        problems.extend(meta_changes());

        let result: Option<ExecResult> = serde_json::from_slice(&answer).ok();
        let Some(result) = result else {
            let failure: Option<ExecFailure> = serde_json::from_slice(&answer).ok();
            let why = match failure {
                Some(f) => format!("executor answered {}: {}", f.code, f.detail),
                None => format!(
                    "no answer; executor said: {}",
                    executor_log.lines().last().unwrap_or("")
                ),
            };
            return Ok(if problems.is_empty() {
                Verdict::Inconclusive(why)
            } else {
                Verdict::Escaped(problems.join("; "))
            });
        };
        if let Err(e) = result.validate_against(&request) {
            problems.push(format!("the answer is not bound to the request: {e}"));
        }
        let view = match mode {
            Mode::MinimalRoot => "minimal-root",
            _ => "host-view",
        };
        if result.confinement.view != view {
            return Ok(Verdict::Inconclusive(format!(
                "the commands got the {} view, not the {view}",
                result.confinement.view
            )));
        }
        if result.confinement.landlock != "full" || !result.confinement.seccomp {
            return Ok(Verdict::Inconclusive(format!(
                "sandbox not fully applied: {:?}",
                result.confinement
            )));
        }
        let Some(ev) = result.verification.first() else {
            return Ok(Verdict::Inconclusive("no verification evidence".into()));
        };
        let said = |prefix: &str| {
            ev.stdout_tail
                .lines()
                .find_map(|l| l.strip_prefix(prefix).map(str::to_owned))
        };
        let tails = || {
            format!(
                "exit {:?} signal {:?} timed_out {}; stdout {:?}; stderr {:?}",
                ev.exit_code,
                ev.signal,
                ev.timed_out,
                ev.stdout_tail.trim(),
                ev.stderr_tail.trim().lines().last().unwrap_or("")
            )
        };
        // A harness finding is an escape for every probe, a known gap too:
        // the gap's verdict covers only what the probe itself reports.
        if !problems.is_empty() {
            return Ok(Verdict::Escaped(problems.join("; ")));
        }
        let verdict = match probe.judge {
            Judge::SelfReport | Judge::KnownGap => {
                match (ev.exit_code, said("BLOCKED: "), said("ESCAPED: ")) {
                    (Some(1), Some(how), None) => Verdict::Blocked(how),
                    (Some(0), _, Some(what)) if probe.judge == Judge::KnownGap => {
                        Verdict::Gap(what)
                    }
                    (Some(0), _, Some(what)) => Verdict::Escaped(what),
                    _ => Verdict::Inconclusive(tails()),
                }
            }
            Judge::Harness => match (ev.exit_code, said("PLANTED: ")) {
                (Some(0), Some(what)) => {
                    Verdict::Blocked(format!("{what}: {}", harness_how(probe)))
                }
                _ => Verdict::Inconclusive(tails()),
            },
            Judge::Timeout if ev.timed_out => Verdict::Blocked(format!(
                "killed at the {} s timeout; no process of uid {uid} left",
                probe.timeout
            )),
            Judge::Timeout => Verdict::Inconclusive(tails()),
        };
        Ok(verdict)
    }

    fn check(&self, check: Check, own: &Path, own_content: &str, answer: &[u8]) -> Res<()> {
        match check {
            Check::OwnFileIntact => {
                let m = fs::symlink_metadata(own).map_err(io("own file"))?;
                let content = fs::read_to_string(own).unwrap_or_default();
                if m.nlink() != 1 || content != own_content || m.mode() & 0o7777 != 0o644 {
                    return Err(format!(
                        "own file changed: {} links, mode {:o}, {content:?}",
                        m.nlink(),
                        m.mode()
                    ));
                }
            }
            Check::ResultIsTheChangeSet => {
                let r: ExecResult =
                    serde_json::from_slice(answer).map_err(io("no result to check"))?;
                let ok = r.changed_files.len() == 1
                    && r.changed_files[0].path == "hello.py"
                    && r.changed_files[0].content_b64.as_deref()
                        == Some(
                            base64::engine::general_purpose::STANDARD
                                .encode(b"VALUE = 2\n")
                                .as_str(),
                        );
                if !ok {
                    return Err(format!(
                        "the result carries {:?}",
                        r.changed_files.iter().map(|f| &f.path).collect::<Vec<_>>()
                    ));
                }
            }
            Check::KeepSurvivesCleanup => {
                let keep = self.base.join("outside").join("keep.txt");
                if fs::read(&keep).ok().as_deref() != Some(b"keep\n") {
                    return Err("the executor's clean-up removed an outside file".into());
                }
            }
            // Judged with the outside metadata (it needs the entry's path).
            Check::TreeCacheIntact => {}
        }
        Ok(())
    }

    fn marker(&self, uid: u32, dir: &Path) -> Res<Guarded> {
        let m = dir.join("marker");
        let secret = format!("marker-secret-{}", self.tok);
        let child = Command::new("setpriv")
            .args([
                "--reuid",
                &uid.to_string(),
                "--regid",
                &uid.to_string(),
                "--clear-groups",
            ])
            .args([
                "env",
                "-i",
                &format!("AIRLOCK_MARKER_SECRET={secret}"),
                PYTHON,
                "-c",
                MARKER_PY,
            ])
            .arg(&secret)
            .arg(m.join("signals.log"))
            .arg(m.join("info.json"))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .map_err(io("marker"))?;
        Ok(Guarded(child))
    }

    fn args(
        &self,
        probe: &Probe,
        mode: &Mode,
        t: &Targets<'_>,
        out: &Path,
        marker: &Value,
    ) -> Value {
        let mut a = serde_json::Map::new();
        // In the minimal root what lies outside the view does not exist
        // (ENOENT; the control shows each target exists) and the view's own
        // frame is a read-only mount (EROFS): both mean blocked there.
        let mut errnos: Vec<&str> = probe.errnos.to_vec();
        if matches!(mode, Mode::MinimalRoot) && !errnos.is_empty() {
            errnos.extend(["ENOENT", "EROFS"]);
        }
        a.insert("errnos".into(), json!(errnos));
        for (k, v) in &self.fixtures {
            a.insert((*k).into(), json!(v));
        }
        a.insert("own".into(), json!(t.own));
        a.insert("gap_file".into(), json!(t.gap));
        a.insert("sibling_secret".into(), json!(t.sibling.join("secret.txt")));
        a.insert("spool_answers".into(), json!(t.spool));
        a.insert("tree_cache_file".into(), json!(t.cache));
        a.insert("out_path".into(), json!(out));
        a.insert("marker".into(), marker.clone());
        a.insert("ports".into(), self.ports.clone());
        a.insert("peer".into(), json!(self.peer_addr));
        // Names of files a probe may create outside (see pwned_paths).
        a.insert("tok".into(), json!(format!("{}-{}", self.tok, probe.name)));
        a.insert("canary".into(), json!(format!("canary-{}", self.tok)));
        a.insert("allowed_env".into(), json!(ALLOWED_ENV));
        a.insert("nr".into(), syscall_numbers());
        Value::Object(a)
    }

    /// `ip netns exec NS unshare -m sh -c SETUP; exec setpriv … airlock-executor run-once …`;
    /// returns the executor's stderr.
    #[allow(clippy::too_many_arguments)]
    fn run_executor(
        &self,
        probe: &Probe,
        mode: &Mode,
        uid: u32,
        dir: &Path,
        request: &Path,
        archive: &Path,
        out: &Path,
    ) -> Res<String> {
        let work = dir.join("work");
        let mut script = setup_script(probe, uid);
        script.push_str("shift 2\nexec \"$@\"\n");
        let log_path = dir.join("executor.log");
        let log = fs::File::create(&log_path).map_err(io("executor log"))?;
        let mut cmd = Command::new("ip");
        cmd.args([
            "netns",
            "exec",
            &self.netns,
            "unshare",
            "--mount",
            "--propagation",
            "private",
        ])
        .args(["/bin/sh", "-c", &script, "sh"])
        .arg(format!("cred-secret-{}", self.tok))
        .arg(&work)
        .args([
            "setpriv",
            "--reuid",
            &uid.to_string(),
            "--regid",
            &uid.to_string(),
            "--clear-groups",
        ]);
        if let Mode::HostView(wrapper) = mode {
            cmd.arg(wrapper);
        }
        cmd.arg(&self.bins.executor)
            .arg("run-once")
            .arg("--request")
            .arg(request)
            .arg("--archive")
            .arg(archive)
            .arg("--out")
            .arg(out)
            .arg("--work")
            .arg(&work)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("AIRLOCK_ESCAPE_CANARY", format!("canary-{}", self.tok))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        let child = cmd.spawn().map_err(io("executor"))?;
        let mut child = Guarded(child);
        let deadline = Instant::now() + Duration::from_secs(u64::from(probe.timeout) + 60);
        loop {
            if child.0.try_wait().map_err(io("wait"))?.is_some() {
                break;
            }
            if Instant::now() > deadline {
                return Err("the executor did not finish in time".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(fs::read_to_string(&log_path).unwrap_or_default())
    }
}

/// Files a probe aims at, made fresh for each run.
struct Targets<'a> {
    own: &'a Path,
    gap: &'a Path,
    sibling: &'a Path,
    spool: &'a [PathBuf],
    cache: &'a Path,
}

/// The extended attribute every metadata target carries (a probe tries to
/// remove it).
pub const KEEP_XATTR: &str = "user.airlock-keep";

impl Suite {
    /// A tree cache entry for the probes' source tree, owned by the probe's
    /// uid (the executor's): `<work>/trees/<tree>/tree/hello.py`, a hard
    /// link to its blob in the store, `<work>/blobs/<blob id>`.
    fn tree_cache_entry(&self, dir: &Path, uid: u32, tree: &str) -> Res<PathBuf> {
        let trees = dir.join("work").join("trees");
        mkdir(&trees, 0o711, Some(uid))?;
        let entry = trees.join(tree);
        mkdir(&entry, 0o755, Some(uid))?;
        mkdir(&entry.join("tree"), 0o755, Some(uid))?;
        let file = entry.join("tree").join("hello.py");
        put(&file, b"VALUE = 1\n", 0o644, Some(uid))?;
        set_keep_xattr(&file)?;
        let blobs = dir.join("work").join("blobs");
        mkdir(&blobs, 0o700, Some(uid))?;
        fs::hard_link(&file, blobs.join(HELLO_BLOB)).map_err(io("blob store link"))?;
        Ok(file)
    }

    /// Another request's answers in a spool laid out as the executor's:
    /// `results/` and `failed/` files owned by the executor's uid (here the
    /// probe's), as `tmpfiles/airlock.conf` and the spool code make them.
    fn spool_answers(&self, dir: &Path, uid: u32) -> Res<Vec<PathBuf>> {
        let spool = dir.join("spool");
        mkdir(&spool, 0o755, None)?;
        let mut out = Vec::new();
        for (sub, name) in [
            ("results", spool_answer_name('1')),
            ("failed", spool_answer_name('2')),
        ] {
            mkdir(&spool.join(sub), 0o2750, Some(uid))?;
            let f = spool.join(sub).join(name);
            put(&f, b"{\"answer\":\"another request's\"}", 0o640, Some(uid))?;
            set_keep_xattr(&f)?;
            out.push(f);
        }
        Ok(out)
    }
}

impl Suite {
    /// The symbolic links every probe's source tree holds, `(path,
    /// target)`: each names something outside the workspace — a host
    /// file, /etc/shadow, another request's spool answer, the tree cache —
    /// absolutely, by a `../` chain past the root, and (the spool and the
    /// cache) by the relative path that reaches it from the executor's
    /// copy of the workspace (`<dir>/work/<request>/src`). A repository
    /// may hold any of these; the `symlink_*` probes follow them.
    fn source_links(&self, dir: &Path) -> Vec<(String, String)> {
        let up = "../".repeat(24);
        let outside = self.fixtures["outside_secret"].clone();
        let spool = dir
            .join("spool")
            .join("results")
            .join(spool_answer_name('1'));
        let spool = spool.display().to_string();
        let trees = dir.join("work").join("trees").display().to_string();
        let blobs = dir.join("work").join("blobs").display().to_string();
        let rel = |p: &str| format!("{up}{}", p.trim_start_matches('/'));
        [
            ("outside_abs", outside.clone()),
            ("outside_up", rel(&outside)),
            ("shadow_abs", "/etc/shadow".to_owned()),
            ("shadow_up", rel("/etc/shadow")),
            ("spool_abs", spool.clone()),
            ("spool_up", rel(&spool)),
            (
                "spool_rel",
                format!("../../../../spool/results/{}", spool_answer_name('1')),
            ),
            ("trees_abs", trees.clone()),
            ("trees_up", rel(&trees)),
            ("trees_rel", "../../../trees".to_owned()),
            ("blobs_abs", blobs.clone()),
            ("blobs_up", rel(&blobs)),
            ("blobs_rel", "../../../blobs".to_owned()),
        ]
        .into_iter()
        .map(|(name, target)| (format!("links/{name}"), target))
        .collect()
    }
}

/// The git blob id of the probes' `hello.py` (`VALUE = 1\n`): its name in
/// the executor's blob store.
const HELLO_BLOB: &str = "b15b1b0797d64623135bb2d04a67bae078fa44c2";

/// The name of a spool answer of another request (`r` and 40 of `digit`).
fn spool_answer_name(digit: char) -> String {
    format!("r{}.json", digit.to_string().repeat(40))
}

/// The cached `hello.py` holds what the tree holds, with its mode, a real
/// modification time and no attribute a probe set.
fn cache_intact(path: &Path) -> Res<()> {
    let m =
        fs::symlink_metadata(path).map_err(io(format!("tree cache file {}", path.display())))?;
    let content = fs::read(path).unwrap_or_default();
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(io("path"))?;
    let name = std::ffi::CString::new("user.airlock-pwned").map_err(io("xattr"))?;
    let mut buf = [0u8; 8];
    // SAFETY: NUL-terminated strings and a buffer of the length given.
    let pwned = unsafe {
        libc::getxattr(
            c.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    } >= 0;
    if content != b"VALUE = 1\n" || m.mode() & 0o7777 != 0o644 || m.mtime() < 2 || pwned {
        return Err(format!(
            "the tree cache's file changed: mode {:o}, mtime {}, {} bytes, pwned xattr {pwned}",
            m.mode() & 0o7777,
            m.mtime(),
            content.len()
        ));
    }
    Ok(())
}

/// Sets [`KEEP_XATTR`] on `path`.
fn set_keep_xattr(path: &Path) -> Res<()> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(io("path"))?;
    let name = std::ffi::CString::new(KEEP_XATTR).map_err(io("xattr"))?;
    // SAFETY: both strings are NUL-terminated and live across the call; the
    // value is a 1-byte buffer.
    let r = unsafe { libc::setxattr(c.as_ptr(), name.as_ptr(), b"1".as_ptr().cast(), 1, 0) };
    if r != 0 {
        return Err(format!(
            "setxattr {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// Mode, owner, size, modification time and [`KEEP_XATTR`] of `path`.
fn metadata_of(path: &Path) -> Res<(u32, u32, u64, i64, i64, bool)> {
    let m = fs::symlink_metadata(path).map_err(io(path.display()))?;
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(io("path"))?;
    let name = std::ffi::CString::new(KEEP_XATTR).map_err(io("xattr"))?;
    let mut buf = [0u8; 8];
    // SAFETY: NUL-terminated strings and a buffer of the length given.
    let n = unsafe {
        libc::getxattr(
            c.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    Ok((
        m.mode(),
        m.uid(),
        m.len(),
        m.mtime(),
        m.ctime(),
        n == 1 && buf[0] == b'1',
    ))
}

/// The shell run (as root) in the suite's network namespace and a private
/// mount namespace before the probe's command, the same for the control and
/// the sandboxed runs: a fake /run/credentials (`$1` is the token), the
/// optional tmpfs work volume on `$2`, and a resolv.conf naming the DNS
/// listener on 127.0.0.1.
fn setup_script(probe: &Probe, uid: u32) -> String {
    let mut script = String::from(
        "set -e
mount -t tmpfs -o mode=0755,size=1m airlock-escape-run /run
mkdir -m 0711 /run/credentials
mkdir -m 0755 /run/credentials/airlock-worker.service
printf %s \"$1\" > /run/credentials/airlock-worker.service/token
chmod 0644 /run/credentials/airlock-worker.service/token
printf 'nameserver 127.0.0.1\\noptions attempts:1 timeout:2\\n' > /run/resolv.conf
chmod 0644 /run/resolv.conf
mount --bind /run/resolv.conf /etc/resolv.conf
",
    );
    if let Some(mib) = probe.work_tmpfs_mib {
        script.push_str(&format!(
            "mount -t tmpfs -o mode=0755,size={mib}m airlock-escape-work \"$2\"\nchown {uid}:{uid} \"$2\"\n"
        ));
    }
    script
}

/// What the control run of one probe left: its exit, its output, whether it
/// was still running at its timeout and survived SIGTERM.
#[derive(Debug)]
struct ControlRun {
    exit: Option<i32>,
    stdout: String,
    stderr: String,
    outlived: Vec<String>,
    workspace: PathBuf,
}

impl Suite {
    /// Runs the probe's command without the sandbox: the same setup script
    /// (network namespace, private mount namespace, fake credentials, work
    /// volume, resolv.conf), then `setpriv` to the probe's uid and python3
    /// directly, in a workspace laid out as the executor's (`src/` with the
    /// change set applied, `tmp/` as HOME and TMPDIR, their parent as the
    /// scratch directory), with the environment the executor itself has
    /// plus the one the executor gives, and descriptor 3 open on the request
    /// (as an unconfined launcher would leave it).
    fn run_control(
        &self,
        probe: &Probe,
        uid: u32,
        dir: &Path,
        request: &Path,
        args: &Value,
    ) -> Res<ControlRun> {
        let template = dir.join("control-src");
        mkdir(&template, 0o755, None)?;
        put(&template.join("hello.py"), b"VALUE = 2\n", 0o644, None)?;
        put(
            &template.join("escape_lib.py"),
            LIB_PY.as_bytes(),
            0o644,
            None,
        )?;
        mkdir(&template.join("links"), 0o755, None)?;
        for (path, target) in self.source_links(dir) {
            std::os::unix::fs::symlink(&target, template.join(&path))
                .map_err(io(format!("control link {path}")))?;
        }
        let work = dir.join("work");
        let scratch = work.join(format!("r{}", "c".repeat(40)));
        let ws = scratch.join("src");
        let tmp = scratch.join("tmp");
        let mut script = setup_script(probe, uid);
        script.push_str(&format!(
            "R=\"$3\"; T=\"$4\"; REQ=\"$5\"
mkdir -p \"$R/src\" \"$R/tmp\"
cp -a \"$T/.\" \"$R/src/\"
chown -hR {uid}:{uid} \"$R\"
chmod 0700 \"$R\" \"$R/src\" \"$R/tmp\"
cd \"$R/src\"
exec 3<\"$REQ\"
shift 5
exec \"$@\"
"
        ));
        let tmp_s = tmp.display().to_string();
        let ceiling = scratch.display().to_string();
        let env = [
            ("PATH", "/usr/sbin:/usr/bin:/sbin:/bin".to_owned()),
            ("AIRLOCK_ESCAPE_CANARY", format!("canary-{}", self.tok)),
            ("LC_ALL", "C.UTF-8".to_owned()),
            ("HOME", tmp_s.clone()),
            ("TMPDIR", tmp_s),
            ("GIT_CONFIG_NOSYSTEM", "1".to_owned()),
            ("GIT_CONFIG_GLOBAL", "/dev/null".to_owned()),
            ("GIT_CEILING_DIRECTORIES", ceiling),
            ("GIT_TERMINAL_PROMPT", "0".to_owned()),
            ("GIT_PAGER", "cat".to_owned()),
            ("PAGER", "cat".to_owned()),
            ("PYTHONNOUSERSITE", "1".to_owned()),
            ("PYTHONHASHSEED", "0".to_owned()),
        ];
        let stdout_path = dir.join("control.stdout");
        let stderr_path = dir.join("control.stderr");
        let stdout = fs::File::create(&stdout_path).map_err(io("control stdout"))?;
        let stderr = fs::File::create(&stderr_path).map_err(io("control stderr"))?;
        let mut cmd = Command::new("ip");
        cmd.args([
            "netns",
            "exec",
            &self.netns,
            "unshare",
            "--mount",
            "--propagation",
            "private",
        ])
        .args(["/bin/sh", "-c", &script, "sh"])
        .arg(format!("cred-secret-{}", self.tok))
        .arg(&work)
        .arg(&scratch)
        .arg(&template)
        .arg(request)
        .args([
            "setpriv",
            "--reuid",
            &uid.to_string(),
            "--regid",
            &uid.to_string(),
            "--clear-groups",
            "env",
            "-i",
        ])
        .args(env.iter().map(|(k, v)| format!("{k}={v}")))
        .args([
            PYTHON,
            "-c",
            &format!("from escape_lib import *\n{}\n", probe.code),
        ])
        .arg(args.to_string())
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("AIRLOCK_ESCAPE_CANARY", format!("canary-{}", self.tok))
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr);
        let mut child = Guarded(cmd.spawn().map_err(io("control"))?);
        let limit = if probe.judge == Judge::Timeout {
            u64::from(probe.timeout)
        } else {
            u64::from(probe.timeout) + 30
        };
        let deadline = Instant::now() + Duration::from_secs(limit);
        let mut outlived = Vec::new();
        let exit = loop {
            if let Some(status) = child.0.try_wait().map_err(io("wait"))? {
                break status.code();
            }
            if Instant::now() > deadline {
                if probe.judge != Judge::Timeout {
                    return Err(format!("the control did not finish in {limit} s"));
                }
                // What the executor does at the timeout, without the sandbox:
                // SIGTERM to every process of the command.
                let marker = marker_pid_of(dir);
                let targets: Vec<u32> = processes_of(uid)
                    .into_iter()
                    .filter(|p| Some(*p) != marker)
                    .collect();
                for p in &targets {
                    // SAFETY: kill takes plain integers.
                    unsafe { libc::kill(i32::try_from(*p).unwrap_or(0), libc::SIGTERM) };
                }
                std::thread::sleep(Duration::from_secs(1));
                outlived = processes_of(uid)
                    .into_iter()
                    .filter(|p| Some(*p) != marker)
                    .map(|p| format!("{p} {}", status_field(p, "Name:").unwrap_or_default()))
                    .collect();
                let _ = child.0.kill();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        Ok(ControlRun {
            exit,
            stdout: fs::read_to_string(&stdout_path).unwrap_or_default(),
            stderr: fs::read_to_string(&stderr_path).unwrap_or_default(),
            outlived,
            workspace: ws,
        })
    }

    /// Judges a control run: the harness's own observations first (the
    /// marker, processes left, files created, the probe's checks read as
    /// "could the command do it"), then the command's report.
    #[allow(clippy::too_many_arguments)]
    fn judge_control(
        &self,
        probe: &Probe,
        uid: u32,
        dir: &Path,
        mut marker: Guarded,
        marker_pid: u32,
        own: &Path,
        own_content: &str,
        ran: ControlRun,
        meta_changes: Vec<String>,
    ) -> Res<Verdict> {
        let mut seen = meta_changes;
        if !ran.outlived.is_empty() {
            seen.push(format!(
                "still running after SIGTERM at the {} s timeout: {}",
                probe.timeout,
                ran.outlived.join(", ")
            ));
        }
        let tracer = status_field(marker_pid, "TracerPid:");
        if tracer.as_deref().is_some_and(|t| t != "0") {
            seen.push("the marker is traced".into());
        }
        if let Some(marker_saw) = marker_evidence(&mut marker, marker_pid, dir)? {
            seen.push(marker_saw);
        }
        let left = kill_all_of(uid, marker_pid);
        if !left.is_empty() && ran.outlived.is_empty() {
            seen.push(format!(
                "{} processes of uid {uid} outlived the command",
                left.len()
            ));
        }
        drop(marker);
        kill_all_of(uid, 0);
        if !processes_of(uid).is_empty() {
            return Err(format!("processes of uid {uid} cannot be killed"));
        }
        for p in self.pwned_paths(probe) {
            if fs::symlink_metadata(&p).is_ok() {
                seen.push(format!("{} was created", p.display()));
                let _ = fs::remove_file(&p);
            }
        }
        for check in probe.checks {
            match check {
                Check::OwnFileIntact => {
                    if let Err(e) = self.check(*check, own, own_content, b"") {
                        seen.push(e);
                    }
                }
                // No executor, no clean-up: the trap is in place when a
                // clean-up following links would reach the outside file.
                Check::KeepSurvivesCleanup => {
                    if fs::read(ran.workspace.join("trapfile")).ok().as_deref() == Some(b"keep\n") {
                        seen.push(
                            "a planted link leads a clean-up to the outside keep file".into(),
                        );
                    }
                }
                // Judged with the outside metadata (meta_changes).
                Check::TreeCacheIntact => {}
                // No executor, no result: whatever the workspace holds
                // beyond the change set is what a naive copy would carry.
                Check::ResultIsTheChangeSet => {
                    let mut extra = Vec::new();
                    for (k, v) in snapshot(&ran.workspace) {
                        let ok = k == "escape_lib.py"
                            || k.starts_with("__pycache__")
                            || (k == "hello.py" && v.ends_with(&sha(b"VALUE = 2\n")));
                        if !ok {
                            extra.push(k);
                        }
                    }
                    if !extra.is_empty() {
                        seen.push(format!("the workspace holds {}", extra.join(", ")));
                    }
                }
            }
        }
        let said = |prefix: &str| {
            ran.stdout
                .lines()
                .find_map(|l| l.strip_prefix(prefix).map(str::to_owned))
        };
        let tails = || {
            format!(
                "exit {:?}; stdout {:?}; stderr {:?}",
                ran.exit,
                ran.stdout.trim(),
                ran.stderr.trim().lines().last().unwrap_or("")
            )
        };
        Ok(
            match (
                ran.exit,
                said("ESCAPED: "),
                said("BLOCKED: "),
                said("PLANTED: "),
            ) {
                (Some(0), Some(what), None, _) => {
                    seen.insert(0, what);
                    Verdict::Escaped(seen.join("; "))
                }
                _ if !seen.is_empty() => Verdict::Escaped(seen.join("; ")),
                (Some(1), None, Some(how), _) => Verdict::Blocked(how),
                (Some(0), None, None, Some(what)) => {
                    Verdict::Blocked(format!("{what}, and the harness saw nothing"))
                }
                _ if probe.judge == Judge::Timeout => {
                    Verdict::Blocked(format!("no process outlived the timeout: {}", tails()))
                }
                _ => Verdict::Inconclusive(tails()),
            },
        )
    }
}

/// The marker's pid from its info file, if it started.
/// What the marker went through, as evidence: the signals it received, as
/// its log names them, or that it was stopped or is gone; `None` when
/// nothing reached it. The command's signals may still be on their way to
/// the marker's handler when the command has exited, so the marker is first
/// asked to answer a line of its stdin: it logs the answer only after
/// handling every signal already sent, and only the harness knows the line.
fn marker_evidence(marker: &mut Guarded, pid: u32, dir: &Path) -> Res<Option<String>> {
    let log = dir.join("marker").join("signals.log");
    let read_log = || {
        let text = fs::read_to_string(&log).unwrap_or_default();
        text.lines()
            .filter(|l| !l.starts_with("sync "))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let with_log = |what: &str| {
        let signals = read_log();
        if signals.is_empty() {
            Some(what.to_owned())
        } else {
            Some(format!("{what}; it received {signals}"))
        }
    };
    let nonce = random_hex(8);
    let stdin = marker.0.stdin.as_mut().ok_or("the marker has no stdin")?;
    if writeln!(stdin, "{nonce}")
        .and_then(|()| stdin.flush())
        .is_err()
    {
        return Ok(with_log("the marker no longer reads its stdin"));
    }
    let answer = format!("sync {nonce}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = fs::read_to_string(&log).unwrap_or_default();
        if let Some(at) = text.lines().position(|l| l == answer) {
            let signals: Vec<&str> = text
                .lines()
                .take(at)
                .filter(|l| !l.starts_with("sync "))
                .collect();
            return Ok((!signals.is_empty())
                .then(|| format!("the marker received {}", signals.join(", "))));
        }
        match status_field(pid, "State:") {
            None => return Ok(with_log("the marker is gone")),
            Some(s) if s.starts_with('Z') => return Ok(with_log("the marker died")),
            // Stopped (a ptrace attach, SIGSTOP): it cannot answer.
            Some(s) if s.starts_with('T') || s.starts_with('t') => {
                return Ok(with_log("the marker was stopped"));
            }
            Some(_) => {}
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the marker did not answer in 30 s; its log: {:?}",
                text.trim()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn marker_pid_of(dir: &Path) -> Option<u32> {
    let info = fs::read(dir.join("marker").join("info.json")).ok()?;
    let v: Value = serde_json::from_slice(&info).ok()?;
    u32::try_from(v["pid"].as_u64()?).ok()
}

/// Kills every process of `uid` but `spare` (again while any is left, a
/// fork bomb's children included); returns those found the first time.
fn kill_all_of(uid: u32, spare: u32) -> Vec<u32> {
    let first: Vec<u32> = processes_of(uid)
        .into_iter()
        .filter(|p| *p != spare)
        .collect();
    for _ in 0..100 {
        let now: Vec<u32> = processes_of(uid)
            .into_iter()
            .filter(|p| *p != spare)
            .collect();
        if now.is_empty() {
            break;
        }
        for p in &now {
            // SAFETY: kill takes plain integers.
            unsafe { libc::kill(i32::try_from(*p).unwrap_or(0), libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    first
}

fn harness_how(probe: &Probe) -> &'static str {
    match probe.name {
        "daemonize" => "no process of its uid outlived the command",
        "git_hooks" => "the result carries only the change set",
        "cleanup_symlink_trap" => "the clean-up followed no planted symlink",
        "write_host_tmp" => "nothing appeared in the host's /tmp, /var/tmp or /dev/shm",
        "kill_everything" => {
            "the marker, the executor and the helper of the same uid received nothing"
        }
        _ => "side effects absent",
    }
}

/// System call numbers the probes use, from libc (so no table in Python).
fn syscall_numbers() -> Value {
    let mut m = serde_json::Map::new();
    for (name, nr) in [
        ("ptrace", libc::SYS_ptrace),
        ("process_vm_readv", libc::SYS_process_vm_readv),
        ("process_vm_writev", libc::SYS_process_vm_writev),
        ("pidfd_open", libc::SYS_pidfd_open),
        ("pidfd_send_signal", libc::SYS_pidfd_send_signal),
        ("pidfd_getfd", libc::SYS_pidfd_getfd),
        ("mount", libc::SYS_mount),
        ("fsopen", libc::SYS_fsopen),
        ("open_tree", libc::SYS_open_tree),
        ("chroot", libc::SYS_chroot),
        ("fchownat", libc::SYS_fchownat),
        ("pivot_root", libc::SYS_pivot_root),
        ("unshare", libc::SYS_unshare),
        ("clone", libc::SYS_clone),
        ("clone3", libc::SYS_clone3),
        ("setns", libc::SYS_setns),
        ("keyctl", libc::SYS_keyctl),
        ("add_key", libc::SYS_add_key),
        ("request_key", libc::SYS_request_key),
        ("bpf", libc::SYS_bpf),
        ("perf_event_open", libc::SYS_perf_event_open),
        ("io_uring_setup", libc::SYS_io_uring_setup),
        ("userfaultfd", libc::SYS_userfaultfd),
        ("syslog", libc::SYS_syslog),
        ("finit_module", libc::SYS_finit_module),
        ("init_module", libc::SYS_init_module),
        ("kexec_load", libc::SYS_kexec_load),
        ("name_to_handle_at", libc::SYS_name_to_handle_at),
        ("open_by_handle_at", libc::SYS_open_by_handle_at),
        ("capget", libc::SYS_capget),
        #[cfg(target_arch = "x86_64")]
        ("iopl", libc::SYS_iopl),
        ("x32_socket", libc::SYS_socket | 0x4000_0000),
    ] {
        m.insert(name.into(), json!(nr));
    }
    Value::Object(m)
}

fn binding(task: &str) -> Res<Binding> {
    Binding::from_value(&json!({
        "task_id": task, "job_id": "job-escape", "repository": "demo",
        "base_oid": "a".repeat(40), "expected_branch_oid": "a".repeat(40),
        "target_branch": format!("agent/{task}"), "branch_mode": "CREATE_NEW",
        "generation": 1, "idempotency_key": format!("idem-{task}"),
    }))
    .map_err(io("binding"))
}

/// The probes' source as an archive — its files and `links` — and the
/// git tree id of what it holds.
fn source_archive(links: &[(String, String)]) -> Res<(Vec<u8>, String)> {
    use airlock_proto::tree::{ObjectFormat, TreeBuilder};
    let mut t = TreeBuilder::new(ObjectFormat::Sha1);
    let mut b = tar::Builder::new(Vec::new());
    for (path, data) in [
        ("hello.py", &b"VALUE = 1\n"[..]),
        ("escape_lib.py", LIB_PY.as_bytes()),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, path, data).map_err(io("tar"))?;
        t.add_blob(path, false, data).map_err(io("tree"))?;
    }
    for (path, target) in links {
        let mut h = tar::Header::new_gnu();
        h.set_size(0);
        h.set_mode(0o777);
        h.set_entry_type(tar::EntryType::Symlink);
        b.append_link(&mut h, path, target).map_err(io("tar"))?;
        t.add_symlink(path, target.as_bytes()).map_err(io("tree"))?;
    }
    Ok((b.into_inner().map_err(io("tar"))?, t.finish()))
}

/// The request for one probe: a real envelope (one change, one
/// verification command) over the source tree `tree`.
pub fn build_request(probe: &Probe, index: usize, args: &Value, tree: &str) -> Res<ExecRequest> {
    let task = format!("task-escape-{index}-{}", probe.name.replace('_', "-"));
    let code = format!("from escape_lib import *\n{}\n", probe.code);
    let planner = json!({
        "action": "deterministic",
        "change_set": [{
            "path": "hello.py", "operation": "replace_text",
            "old": "VALUE = 1", "new": "VALUE = 2", "count": 1,
            "expected_sha256": sha(b"VALUE = 1\n"),
        }],
        "verification": [{
            "label": probe.name,
            "argv": [PYTHON, "-c", code, args.to_string()],
            "cwd": ".",
            "timeout_seconds": probe.timeout,
        }],
        "capability_scope": ["git.test"],
        "commit_idempotency_key": format!("commit-{task}"),
    });
    let req =
        ExecutionRequest::from_value(&planner).map_err(io(format!("{} request", probe.name)))?;
    let envelope = Envelope::project(&binding(&task)?, &req).map_err(io("envelope"))?;
    let request = ExecRequest {
        schema: EXEC_REQUEST_SCHEMA.into(),
        request_id: request_id_for(&envelope.binding.task_id, 1, &envelope.execution_digest),
        attempt: 1,
        envelope: envelope.to_value(),
        source_tree: tree.to_owned(),
    };
    Ok(request)
}

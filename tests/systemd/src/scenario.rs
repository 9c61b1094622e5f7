//! The testbed scenario: build the packages, boot the root, install the
//! .deb and use airlock as an administrator would, then reinstall,
//! upgrade, stop, remove and purge it. Every check is recorded in the
//! [`Report`]; a check that fails does not stop the ones after it, except
//! where they could not mean anything (no package, no container, no
//! installation).

use crate::units::{self, max_exposure};
use crate::{Container, Out, Report, debian_root, run, tail, which, workspace_root};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Where things are.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Cargo's target directory (packages and the testbed's files go there).
    pub target_dir: PathBuf,
    /// Cache of the Debian root.
    pub cache: PathBuf,
    /// Debian mirror for debootstrap.
    pub mirror: String,
}

const SEC: Duration = Duration::from_secs(1);
const SERVICES: &[&str] = &[
    "airlock-supervisor.service",
    "airlock-worker.service",
    "airlock-executor.service",
    "airlock-retryd.service",
    "airlock-egress.service",
];
const STARTED_BY_TARGET: &[&str] = &[
    "airlock.target",
    "airlock-supervisor.service",
    "airlock-worker.service",
    "airlock-executor.service",
    "airlock-retryd.socket",
    "airlock-egress.service",
];
const ALL_UNITS: &[&str] = &[
    "airlock.target",
    "airlock-supervisor.service",
    "airlock-worker.service",
    "airlock-executor.service",
    "airlock-retryd.service",
    "airlock-retryd.socket",
    "airlock-egress.service",
];
const USERS: &[&str] = &[
    "airlock",
    "airlock-worker",
    "airlock-exec",
    "airlock-retry",
    "airlock-agent",
    "airlock-egress",
];
/// Depends the root made by debootstrap satisfies without a network.
const ALLOWED_DEPENDS: &[&str] = &[
    "libc6",
    "libgcc-s1",
    "git",
    "python3",
    "dbus",
    "polkitd",
    "systemd",
];
/// Files a verification command, the executor or its user must not read.
const SECRETS: &[&str] = &[
    "/var/lib/airlock-worker",
    "/var/lib/airlock-worker/checkpoints.sqlite3",
    "/var/lib/airlock/tasks.sqlite3",
    "/etc/airlock/retry-control.token",
    "/etc/airlock/retryd.env",
    "/run/credentials",
    "/run/credentials/airlock-retryd.service",
    "/srv/airlock",
    "/srv/airlock/calc.git/config",
    "/etc/shadow",
    "/root",
];
const REPO: &str = "/srv/airlock/calc.git";

/// A refusal as airlock reports it: the catalogue code, its D-Bus error
/// name, HTTP status and `airlockctl` exit status. `airlockctl --json`
/// prints `{"error": {"code", "dbus_error", "message", "exit_code"}}` on
/// stderr; airlock-retryd answers `{"error": code}` with the status. The
/// figures are docs/errors.md's; tests/units.rs checks them against it.
#[derive(Clone, Copy, Debug)]
pub struct Refusal {
    /// Catalogue code.
    pub code: &'static str,
    /// D-Bus error name.
    pub dbus_error: &'static str,
    /// HTTP status.
    pub http_status: u16,
    /// `airlockctl` exit status.
    pub exit_code: i32,
}

/// polkit's answer to a caller without a rule for an `auth_admin_keep`
/// action (org.airlock.policy's default for everyone) who did not allow
/// interaction (`--no-ask-password`): a challenge, which the supervisor
/// reports as this and never as AUTHORITY_UNAVAILABLE (polkit unreachable)
/// or another code of the Denied class.
pub const INTERACTIVE_AUTHORIZATION_REQUIRED: Refusal = Refusal {
    code: "INTERACTIVE_AUTHORIZATION_REQUIRED",
    dbus_error: "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired",
    http_status: 401,
    exit_code: 11,
};

/// airlock-retryd's answer to a wrong bearer token.
pub const UNAUTHORIZED: Refusal = Refusal {
    code: "UNAUTHORIZED",
    dbus_error: "org.airlock.Error.UNAUTHORIZED",
    http_status: 401,
    exit_code: 4,
};

/// Every refusal the scenario asserts.
pub const REFUSALS: &[Refusal] = &[INTERACTIVE_AUTHORIZATION_REQUIRED, UNAUTHORIZED];

/// Checks that `out` is `airlockctl --json`'s report of exactly `want`,
/// for the polkit action `action` (its message names it).
fn expect_refusal(out: &Out, want: &Refusal, action: &str) -> Result<String, String> {
    let line = out
        .stderr
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .unwrap_or("");
    let v = json(line).map_err(|e| format!("{e}\n{}", out.both()))?;
    let e = &v["error"];
    let message = e["message"].as_str().unwrap_or_default().to_owned();
    let mut problems = Vec::new();
    if out.code != Some(want.exit_code) {
        problems.push(format!("{} (want exit {})", out.describe(), want.exit_code));
    }
    if e["code"] != want.code {
        problems.push(format!("code {} (want {})", e["code"], want.code));
    }
    if e["dbus_error"] != want.dbus_error {
        problems.push(format!(
            "dbus_error {} (want {})",
            e["dbus_error"], want.dbus_error
        ));
    }
    if e["exit_code"] != want.exit_code {
        problems.push(format!(
            "exit_code {} (want {})",
            e["exit_code"], want.exit_code
        ));
    }
    if !message.contains(action) {
        problems.push(format!("the message does not name {action}"));
    }
    if problems.is_empty() {
        Ok(message)
    } else {
        Err(format!("{}\n{}", problems.join(", "), out.both()))
    }
}

/// The denied event of an actor (`name@…`) with this action, and that its
/// code is `want`'s.
fn denial_audited(
    c: &Container,
    user: &str,
    action: &str,
    want: &Refusal,
) -> Result<Value, String> {
    let events = c.sh_ok("airlockctl --json events", 30 * SEC)?;
    let denied: Vec<Value> = events
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| {
            e["outcome"] == "denied"
                && e["action"] == action
                && e["actor"]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with(&format!("{user}@")))
        })
        .collect();
    let Some(last) = denied.last() else {
        return Err(format!(
            "no denied {action} event for {user} in:\n{}",
            tail(&events, 10)
        ));
    };
    if last["code"] != want.code {
        return Err(format!(
            "{user}'s denied {action} is audited with code {} (want {}): {last}",
            last["code"], want.code
        ));
    }
    Ok(last.clone())
}

/// Helper programs run inside the container (python3 is in the root).
const MKTASK_PY: &str = r#"
import hashlib, json, subprocess, sys
tid, mode, max_attempts, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
repo = "/srv/airlock/calc.git"
def git(*a):
    return subprocess.check_output(["git", "-c", "safe.directory=*", "-C", repo, *a])
base = git("rev-parse", "main").decode().strip()
calc = git("show", "main:calc.py")
fix = {"operation": "replace_text", "path": "calc.py", "old": "return a - b",
       "new": "return a + b", "count": 1, "expected_sha256": hashlib.sha256(calc).hexdigest()}
compile_ = {"label": "compile", "argv": ["/usr/bin/python3", "-m", "py_compile", "calc.py"],
            "timeout_seconds": 60}
tests = {"label": "unit tests", "argv": ["/usr/bin/python3", "-m", "unittest", "-v", "test_calc"],
         "timeout_seconds": 120}
if mode == "fix":
    changes, verification = [fix], [compile_, tests]
elif mode == "nofix":
    changes = [{"operation": "write_file", "path": "NOTES.txt", "content": "not fixed yet\n"}]
    verification = [tests]
elif mode == "probe":
    changes = [{"operation": "write_file", "path": "test_probe.py",
                "content": open("/tmp/tb/test_probe.py").read()}]
    verification = [{"label": "sandbox probe",
                     "argv": ["/usr/bin/python3", "-m", "unittest", "-v", "test_probe"],
                     "timeout_seconds": 120}]
else:
    sys.exit("unknown mode " + mode)
task = {
    "schema": "airlock.task.v1", "max_attempts": max_attempts,
    "binding": {"task_id": tid, "job_id": "job-" + tid, "repository": "calc", "base_oid": base,
                "expected_branch_oid": base, "target_branch": "agent/" + tid,
                "branch_mode": "CREATE_NEW", "generation": 1, "idempotency_key": "submit-" + tid},
    "plan": {"schema": "airlock.plan.v1", "task_id": tid, "job_id": "job-" + tid,
             "source_head_oid": base, "generation": 1, "idempotency_key": "plan-" + tid,
             "execution": {"action": "deterministic", "capability_scope": ["git.read", "git.test"],
                           "change_set": changes, "verification": verification}},
}
with open(out, "w") as f:
    json.dump(task, f)
print(base)
"#;

/// Runs as a verification command inside the executor's sandbox. It tries
/// each path and prints, on one stdout line after [`PROBE_MARKER`], what
/// happened to each (`lstat` and the read, `readable` or the errno name);
/// the line reaches the executor's result bundle (`stdout_tail`), where
/// the testbed reads it. The command fails if any path is readable or
/// fails otherwise than with EACCES, EPERM or ENOENT.
const TEST_PROBE_PY: &str = r#"
import errno, json, os, unittest

SECRETS = __SECRETS__
MARKER = "__MARKER__"

def name(e):
    return errno.errorcode.get(e.errno, str(e.errno))

def attempt(path):
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            with open(path, "rb") as f:
                f.read(1)
        return "readable"
    except OSError as e:
        return name(e)

def lstat(path):
    try:
        os.lstat(path)
        return "exists"
    except OSError as e:
        return name(e)

class Probe(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.report = {p: {"lstat": lstat(p), "read": attempt(p)} for p in SECRETS}
        print(MARKER + json.dumps(cls.report, sort_keys=True), flush=True)

    def test_secrets_are_out_of_reach(self):
        for path in SECRETS:
            with self.subTest(path=path):
                self.assertIn(self.report[path]["read"], ("EACCES", "EPERM", "ENOENT"))

    def test_the_workspace_is_usable(self):
        with open("probe-output.txt", "w") as f:
            f.write("ok\n")
        self.assertEqual(attempt("probe-output.txt"), "readable")
"#;

/// Starts the probe's report line in its stdout.
const PROBE_MARKER: &str = "AIRLOCK-TESTBED-PROBE ";

/// Finds the probe's report in the executor's result bundles (run as root
/// in the container): `[{file, sha256, report}]`.
const PROBE_REPORT_PY: &str = r#"
import glob, hashlib, json, sys
marker = sys.argv[1]
found = []
for path in sorted(glob.glob("/var/spool/airlock/results/*.json")):
    data = open(path, "rb").read()
    if marker.encode() not in data:
        continue
    bundle = json.loads(data)
    for command in bundle.get("verification", []):
        for line in command.get("stdout_tail", "").splitlines():
            if line.startswith(marker):
                found.append({"file": path, "sha256": hashlib.sha256(data).hexdigest(),
                              "confinement": bundle.get("confinement"),
                              "report": json.loads(line[len(marker):])})
print(json.dumps(found))
"#;

/// `lstat` of each path, as root outside any sandbox: `exists` or the
/// errno name.
const EXISTS_PY: &str = r#"
import errno, json, os, sys
out = {}
for p in sys.argv[1:]:
    try:
        os.lstat(p)
        out[p] = "exists"
    except OSError as e:
        out[p] = errno.errorcode.get(e.errno, str(e.errno))
print(json.dumps(out))
"#;

/// Reads paths and says which it could read (run as the executor's user):
/// `readable` or the errno name.
const PROBE_PATHS_PY: &str = r#"
import errno, json, os, sys
out = {}
for p in sys.argv[1:]:
    try:
        if os.path.isdir(p):
            os.listdir(p)
        else:
            with open(p, "rb") as f:
                f.read(1)
        out[p] = "readable"
    except OSError as e:
        out[p] = errno.errorcode.get(e.errno, str(e.errno))
print(json.dumps(out))
"#;

/// Lists the processes that belong to airlock.
const PROCS_PY: &str = r#"
import json, os, pwd
found = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        uid = int([l for l in open(f"/proc/{pid}/status") if l.startswith("Uid:")][0].split()[1])
        cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace").strip()
    except (OSError, IndexError):
        continue
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    if user.startswith("airlock") or "/usr/bin/airlock" in cmd or "airlock-confine" in cmd:
        found.append({"pid": int(pid), "user": user, "cmd": cmd})
print(json.dumps(found))
"#;

/// The owner's retry extension over HTTP, with a wrong token and then the
/// right one.
const RETRY_PY: &str = r#"
import hashlib, json, subprocess, sys, urllib.request, urllib.error
tid = sys.argv[1]
t = json.loads(subprocess.check_output(["airlockctl", "--json", "show", tid]))
canon = json.dumps(t["verification"], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
token = open("/etc/airlock/retry-control.token").read().strip()
auth = [l.split("=", 1)[1].strip() for l in open("/etc/airlock/retryd.env")
        if l.startswith("AIRLOCK_RETRY_AUTHORIZATION_ID=")][0]
body = {"expected_status": "FAILED", "expected_revision": t["revision"],
        "expected_attempt": t["attempt"], "expected_max_attempts": t["max_attempts"],
        "next_max_attempts": t["max_attempts"] + 1,
        "previous_verification_sha256": hashlib.sha256(canon.encode()).hexdigest(),
        "authorization_id": auth, "idempotency_key": "testbed-retry-" + tid}
def post(tok):
    req = urllib.request.Request(
        f"http://127.0.0.1:8941/v1/tasks/{tid}/retry-extension", data=json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + tok, "Content-Type": "application/json"},
        method="POST")
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")
wrong = post("x" * 48)
right = post(token)
replay = post(token)
print(json.dumps({"wrong": wrong, "right": right, "replay": replay}))
"#;

const HEALTH_PY: &str = r#"
import json, urllib.request
with urllib.request.urlopen("http://127.0.0.1:8941/health", timeout=20) as r:
    print(json.dumps({"status": r.status, "body": json.loads(r.read())}))
"#;

fn json(text: &str) -> Result<Value, String> {
    serde_json::from_str(text.trim()).map_err(|e| format!("not JSON ({e}): {}", tail(text, 5)))
}

fn q(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

fn installed_deb(dir: &Path, suffix: &str) -> Result<PathBuf, String> {
    fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("airlock_") && n.ends_with(suffix))
        })
        .ok_or_else(|| format!("no airlock_*{suffix} in {}", dir.display()))
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_owned()
}

/// The packages `scripts/package` built.
#[derive(Clone, Debug)]
struct Packages {
    deb: PathBuf,
    rpm: PathBuf,
    version: String,
}

impl crate::Detail for Packages {
    fn detail(&self) -> String {
        let size = |p: &Path| fs::metadata(p).map(|m| m.len() / 1024).unwrap_or(0);
        format!(
            "{} ({} KiB), {} ({} KiB)",
            file_name(&self.deb),
            size(&self.deb),
            file_name(&self.rpm),
            size(&self.rpm)
        )
    }
}

impl crate::Detail for PathBuf {
    fn detail(&self) -> String {
        self.display().to_string()
    }
}

/// What root sees of the secret paths (`secrets_on_host`).
struct Host(BTreeMap<String, String>);

impl crate::Detail for Host {
    fn detail(&self) -> String {
        format!("{} paths present: {}", self.0.len(), SECRETS.join(", "))
    }
}

impl crate::Detail for Container {
    fn detail(&self) -> String {
        format!("machine {} (init pid {})", self.name, self.leader())
    }
}

fn package_checks(r: &mut Report, s: &Settings, work: &Path) -> Option<Packages> {
    r.check("host tools present", |_| {
        let missing: Vec<String> = crate::HOST_TOOLS
            .iter()
            .filter(|(tool, _)| which(tool).is_none())
            .map(|(tool, pkg)| format!("{tool} (Debian package {pkg})"))
            .collect();
        if missing.is_empty() {
            Ok(String::new())
        } else {
            Err(format!(
                "missing: {}; scripts/test installs them from AIRLOCK_DEBIAN_PACKAGES in scripts/deps.sh",
                missing.join(", ")
            ))
        }
    })?;
    let pkgs = r.check("scripts/package builds the .deb and the .rpm", |r| {
        let log = work.join("package.log");
        let out = run(
            Command::new(workspace_root().join("scripts/package"))
                .arg("--no-lintian")
                .env("CARGO_TARGET_DIR", &s.target_dir)
                .env("CARGO_TERM_COLOR", "never"),
            None,
            Duration::from_secs(30 * 60),
        )?;
        fs::write(&log, out.both()).map_err(|e| e.to_string())?;
        r.log(&format!("scripts/package output: {}", log.display()));
        let out = out.expect_ok("scripts/package")?;
        let dir = s.target_dir.join("packages");
        let deb = installed_deb(&dir, "_amd64.deb")?;
        let version = file_name(&deb)
            .trim_start_matches("airlock_")
            .trim_end_matches("_amd64.deb")
            .to_owned();
        let rpm = dir.join(format!("airlock-{version}.x86_64.rpm"));
        if !rpm.is_file() {
            return Err(format!(
                "{} is missing\n{}",
                rpm.display(),
                tail(&out.both(), 20)
            ));
        }
        Ok(Packages { deb, rpm, version })
    })?;
    if !only_agents() {
        lintian(r, &pkgs);
    }
    r.check(
        "deb: maintainer scripts name the files it installs; Depends",
        |_| deb_structure(&pkgs.deb),
    );
    r.check("rpm: scriptlets equivalent, same files as the deb", |_| {
        rpm_structure(&pkgs.rpm, &pkgs.deb)
    });
    Some(pkgs)
}

fn lintian(r: &mut Report, pkgs: &Packages) {
    r.check("lintian accepts the .deb (no errors)", |_| {
        let out = run(
            Command::new("lintian")
                .arg("--no-tag-display-limit")
                .arg(&pkgs.deb),
            None,
            Duration::from_secs(600),
        )?;
        let tags: Vec<&str> = out
            .stdout
            .lines()
            .filter(|l| l.len() > 2 && l.as_bytes()[1] == b':')
            .collect();
        let errors: Vec<&&str> = tags.iter().filter(|l| l.starts_with("E:")).collect();
        if !errors.is_empty() || out.code.is_none_or(|c| c > 1) {
            return Err(format!("lintian ({}):\n{}", out.describe(), out.both()));
        }
        let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
        for t in &tags {
            let tag = t.split_whitespace().nth(2).unwrap_or("?");
            *kinds.entry(format!("{} {tag}", &t[..1])).or_default() += 1;
        }
        let summary: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} x{n}")).collect();
        Ok(format!("0 errors; {}", summary.join(", ")))
    });
}

fn deb_structure(deb: &Path) -> Result<String, String> {
    let limit = Duration::from_secs(60);
    let listing = run(Command::new("dpkg-deb").arg("-c").arg(deb), None, limit)?
        .expect_ok("dpkg-deb -c")?
        .stdout;
    let files: Vec<&str> = listing
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .collect();
    let field = |name: &str| -> Result<String, String> {
        Ok(run(
            Command::new("dpkg-deb").args(["-f"]).arg(deb).arg(name),
            None,
            limit,
        )?
        .expect_ok("dpkg-deb -f")?
        .stdout
        .trim()
        .to_owned())
    };
    let info = |name: &str| -> Result<String, String> {
        Ok(run(
            Command::new("dpkg-deb").args(["-I"]).arg(deb).arg(name),
            None,
            limit,
        )?
        .expect_ok(&format!("dpkg-deb -I {name}"))?
        .stdout)
    };
    let mut problems = Vec::new();
    let postinst = info("postinst")?;
    for (file, command) in [
        (
            "./usr/lib/sysusers.d/airlock.conf",
            "systemd-sysusers airlock.conf",
        ),
        (
            "./usr/lib/tmpfiles.d/airlock.conf",
            "systemd-tmpfiles --create airlock.conf",
        ),
    ] {
        if !files.contains(&file) {
            problems.push(format!("{file} is not in the package"));
        }
        if !postinst.contains(command) {
            problems.push(format!("postinst does not run `{command}`"));
        }
    }
    for expected in [
        "./usr/bin/airlock-supervisor",
        "./usr/bin/airlock-worker",
        "./usr/bin/airlock-executor",
        "./usr/bin/airlock-retryd",
        "./usr/bin/airlock-egress",
        "./usr/lib/systemd/system/airlock-egress.service",
        "./usr/share/man/man8/airlock-egress.8.gz",
        "./usr/bin/airlockctl",
        "./usr/libexec/airlock/airlock-confine",
        "./usr/lib/systemd/system/airlock.target",
        "./usr/share/dbus-1/system.d/org.airlock.Supervisor1.conf",
        "./usr/share/dbus-1/system-services/org.airlock.Supervisor1.service",
        "./usr/share/polkit-1/actions/org.airlock.policy",
        "./usr/share/polkit-1/rules.d/50-airlock-agent.rules",
        "./usr/share/polkit-1/rules.d/50-airlock-supervisor.rules",
        "./usr/lib/systemd/system/airlock-agent@.service",
        "./usr/lib/systemd/catalog/airlock.catalog",
        "./usr/share/man/man1/airlockctl.1.gz",
        "./usr/share/man/man1/airlock-confine.1.gz",
        "./usr/share/doc/airlock/copyright",
        "./usr/share/doc/airlock/changelog.gz",
        "./etc/airlock/airlock.toml",
    ] {
        if !files.contains(&expected) {
            problems.push(format!("{expected} is not in the package"));
        }
    }
    let conffiles = info("conffiles")?;
    if conffiles.trim() != "/etc/airlock/airlock.toml\n/etc/airlock/mcp.toml" {
        problems.push(format!("conffiles: {conffiles:?}"));
    }
    for script in ["prerm", "postrm"] {
        info(script)?;
    }
    let depends = field("Depends")?;
    for dep in depends.split(',') {
        let name = dep.split_whitespace().next().unwrap_or("");
        if !ALLOWED_DEPENDS.contains(&name) {
            problems.push(format!("Depends on {name}, which the minimal root lacks"));
        }
    }
    if problems.is_empty() {
        Ok(format!("Depends: {depends}"))
    } else {
        Err(problems.join("\n"))
    }
}

fn rpm_structure(rpm: &Path, deb: &Path) -> Result<String, String> {
    let limit = Duration::from_secs(60);
    let query = |fmt: &[&str]| -> Result<String, String> {
        Ok(run(
            Command::new("rpm").arg("-qp").args(fmt).arg(rpm),
            None,
            limit,
        )?
        .expect_ok("rpm -qp")?
        .stdout)
    };
    let mut problems = Vec::new();
    let scripts = query(&["--scripts"])?;
    for needle in [
        "systemd-sysusers airlock.conf",
        "systemd-tmpfiles --create airlock.conf",
        "/etc/airlock/retry-control.token",
        "AIRLOCK_RETRY_AUTHORIZATION_ID=",
        "systemctl enable airlock.target",
        "systemctl start airlock.target",
        "systemctl restart airlock.target",
        "systemctl stop airlock.target",
    ] {
        if !scripts.contains(needle) {
            problems.push(format!("the scriptlets lack `{needle}`"));
        }
    }
    for tag in ["POSTIN", "PREUN", "POSTUN"] {
        let body = query(&["--qf", &format!("%{{{tag}}}")])?;
        let sh = run(Command::new("sh").arg("-n"), Some(body.as_bytes()), limit)?;
        if !sh.ok() {
            problems.push(format!("%{tag} is not valid sh: {}", sh.both()));
        }
    }
    let config = query(&["-c"])?;
    if config.trim() != "/etc/airlock/airlock.toml\n/etc/airlock/mcp.toml" {
        problems.push(format!("rpm config files: {config:?}"));
    }
    let rpm_files: std::collections::BTreeSet<String> =
        query(&["--qf", "[%{FILEMODES:perms} %{FILENAMES}\n]"])?
            .lines()
            .filter(|l| l.starts_with('-'))
            .filter_map(|l| l.split_whitespace().nth(1).map(str::to_owned))
            .collect();
    let deb_files: std::collections::BTreeSet<String> =
        run(Command::new("dpkg-deb").arg("-c").arg(deb), None, limit)?
            .expect_ok("dpkg-deb -c")?
            .stdout
            .lines()
            .filter(|l| l.starts_with('-'))
            .filter_map(|l| l.split_whitespace().nth(5))
            .map(|p| p.trim_start_matches('.').to_owned())
            .collect();
    if rpm_files != deb_files {
        problems.push(format!(
            "files only in the rpm: {:?}; only in the deb: {:?}",
            rpm_files.difference(&deb_files).collect::<Vec<_>>(),
            deb_files.difference(&rpm_files).collect::<Vec<_>>()
        ));
    }
    if problems.is_empty() {
        Ok(format!("{} files, as in the deb", rpm_files.len()))
    } else {
        Err(problems.join("\n"))
    }
}

/// The same package with version `<version>+testbed1`, to upgrade to.
fn upgrade_deb(p: &Packages, dir: &Path) -> Result<PathBuf, String> {
    let unpacked = dir.join("upgrade-root");
    if unpacked.exists() {
        fs::remove_dir_all(&unpacked).map_err(|e| e.to_string())?;
    }
    let limit = Duration::from_secs(120);
    run(
        Command::new("dpkg-deb")
            .arg("-R")
            .arg(&p.deb)
            .arg(&unpacked),
        None,
        limit,
    )?
    .expect_ok("dpkg-deb -R")?;
    let control = unpacked.join("DEBIAN/control");
    let text = fs::read_to_string(&control).map_err(|e| e.to_string())?;
    let new_version = format!("{}+testbed1", p.version);
    let text = text.replace(
        &format!("Version: {}\n", p.version),
        &format!("Version: {new_version}\n"),
    );
    fs::write(&control, text).map_err(|e| e.to_string())?;
    let out = dir.join(format!("airlock_{new_version}_amd64.deb"));
    run(
        Command::new("dpkg-deb")
            .args(["--root-owner-group", "-Zgzip", "-z1", "--build"])
            .arg(&unpacked)
            .arg(&out),
        None,
        limit,
    )?
    .expect_ok("dpkg-deb --build")?;
    fs::remove_dir_all(&unpacked).map_err(|e| e.to_string())?;
    Ok(out)
}

/// Runs the whole scenario.
/// `AIRLOCK_TESTBED_ONLY=agents`: the narrow run while working on agents
/// (the package, its installation, a repository, then only the agent
/// checks; no lintian, no RPM scriptlets, no upgrade or removal).
pub fn only_agents() -> bool {
    std::env::var("AIRLOCK_TESTBED_ONLY").as_deref() == Ok("agents")
}

pub fn run_all(s: &Settings) -> Report {
    let work = s.target_dir.join("testbed");
    let _ = fs::create_dir_all(&work);
    let mut r = match Report::new(&work.join("testbed.log")) {
        Ok(r) => r,
        Err(e) => panic!("cannot start the report: {e}"),
    };
    r.say(&format!(
        "airlock systemd testbed: log in {}",
        r.log_path().display()
    ));
    let Some(pkgs) = package_checks(&mut r, s, &work) else {
        r.skip(&["everything in the booted root"], "no package was built");
        return r;
    };
    let debs = work.join("debs");
    let upgrade = r.check(
        "upgrade .deb: the same package as version +testbed1",
        |_| {
            let _ = fs::remove_dir_all(&debs);
            fs::create_dir_all(&debs).map_err(|e| e.to_string())?;
            fs::copy(&pkgs.deb, debs.join(file_name(&pkgs.deb))).map_err(|e| e.to_string())?;
            upgrade_deb(&pkgs, &debs)
        },
    );
    let Some(root) = r.check("minimal Debian root (debootstrap, cached)", |r| {
        debian_root(&s.cache, &s.mirror, r)
    }) else {
        r.skip(&["everything in the booted root"], "no Debian root");
        return r;
    };
    let Some(mut c) = r.check("boot the root with systemd-nspawn", |r| {
        Container::boot(
            &root,
            &[(debs.clone(), "/debs")],
            &work.join("nspawn.log"),
            r,
        )
    }) else {
        r.skip(
            &["everything in the booted root"],
            "the container did not boot",
        );
        return r;
    };
    in_container(&mut r, &c, &pkgs, upgrade.as_deref());
    if !r.all_passed() {
        if let Ok(out) = c.sh(
            "journalctl --no-pager -o short-monotonic -n 400 -u 'airlock*' -u dbus -u polkit",
            30 * SEC,
        ) {
            let path = work.join("journal.txt");
            let _ = fs::write(&path, out.both());
            r.say(&format!("the container's journal: {}", path.display()));
        }
    }
    r.check("the container powers off", |_| {
        c.shutdown(Duration::from_secs(60)).map(|()| String::new())
    });
    drop(c);
    if only_agents() {
        return r;
    }
    r.check(
        "rpm scriptlets on a fresh booted root: install, upgrade, erase",
        |r| rpm_scriptlets(r, &root, &pkgs.rpm, &work),
    );
    r
}

/// The RPM's scriptlets, run by sh on a freshly booted copy of the root
/// after its payload is unpacked there (rpm itself is not in the Debian
/// root): %post 1 (install), %post 2 (upgrade), %preun 0 and %postun 0
/// (erase, with the payload's files removed in between, as rpm does).
fn rpm_scriptlets(r: &Report, root: &Path, rpm: &Path, work: &Path) -> Result<String, String> {
    let mut c = Container::boot(root, &[], &work.join("nspawn-rpm.log"), r)?;
    let limit = Duration::from_secs(120);
    let into = format!("/proc/{}/root", c.leader());
    run(
        Command::new("sh")
            .arg("-c")
            .arg("rpm2archive - < \"$1\" | tar -xzf - -C \"$2\"")
            .arg("sh")
            .arg(rpm)
            .arg(&into),
        None,
        limit,
    )?
    .expect_ok("unpacking the rpm's payload")?;
    let query = |fmt: &str| -> Result<String, String> {
        Ok(run(
            Command::new("rpm").args(["-qp", "--qf", fmt]).arg(rpm),
            None,
            limit,
        )?
        .expect_ok("rpm -qp")?
        .stdout)
    };
    for (tag, file) in [("POSTIN", "post"), ("PREUN", "preun"), ("POSTUN", "postun")] {
        c.write(
            &format!("/tmp/tb/rpm-{file}.sh"),
            &query(&format!("%{{{tag}}}\n"))?,
        )?;
    }
    c.write("/tmp/tb/procs.py", PROCS_PY)?;
    c.sh_ok("sh /tmp/tb/rpm-post.sh 1", 300 * SEC)?;
    let installed = after_install(&c)?;
    all_active(&c, STARTED_BY_TARGET)?;
    let before = main_pids(&c)?;
    c.sh_ok("sh /tmp/tb/rpm-post.sh 2", 300 * SEC)?;
    all_active(&c, STARTED_BY_TARGET)?;
    let after = main_pids(&c)?;
    if before.get("airlock-supervisor.service") == after.get("airlock-supervisor.service") {
        return Err(format!("%post 2 did not restart: {before:?} {after:?}"));
    }
    c.sh_ok("sh /tmp/tb/rpm-preun.sh 0", 300 * SEC)?;
    no_airlock_process(&c)?;
    let files = query("[%{FILEMODES:perms} %{FILENAMES}\n]")?;
    let files: Vec<&str> = files
        .lines()
        .filter(|l| l.starts_with('-'))
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|f| *f != "/etc/airlock/airlock.toml")
        .collect();
    c.sh_ok(&format!("rm -f {}", files.join(" ")), 60 * SEC)?;
    c.sh_ok("sh /tmp/tb/rpm-postun.sh 0", 300 * SEC)?;
    let enabled = c.sh("systemctl is-enabled airlock.target", 10 * SEC)?;
    if enabled.stdout.trim() == "enabled" {
        return Err("airlock.target still enabled after the erase".into());
    }
    expect_paths(
        &c,
        &[
            "/var/lib/airlock/tasks.sqlite3",
            "/etc/airlock/retry-control.token",
        ],
        &["/usr/bin/airlock-supervisor"],
    )?;
    c.shutdown(Duration::from_secs(60))?;
    Ok(format!(
        "%post 1: {installed}, all active; %post 2 restarted; %preun 0 stopped everything; state kept"
    ))
}

/// `systemctl is-active` of each unit.
fn states(c: &Container, units: &[&str]) -> Result<BTreeMap<String, String>, String> {
    let out = c.sh(
        &format!("systemctl is-active {}", units.join(" ")),
        30 * SEC,
    )?;
    let states: Vec<&str> = out.stdout.lines().collect();
    if states.len() != units.len() {
        return Err(format!("systemctl is-active: {}", out.both()));
    }
    Ok(units
        .iter()
        .zip(states)
        .map(|(u, s)| ((*u).to_owned(), s.to_owned()))
        .collect())
}

fn all_active(c: &Container, units: &[&str]) -> Result<String, String> {
    let deadline = Instant::now() + 30 * SEC;
    loop {
        let st = states(c, units)?;
        let bad: Vec<String> = st
            .iter()
            .filter(|(_, s)| *s != "active")
            .map(|(u, s)| format!("{u} {s}"))
            .collect();
        if bad.is_empty() {
            return Ok(format!("{} units active", st.len()));
        }
        if Instant::now() > deadline || bad.iter().any(|b| b.ends_with("failed")) {
            let status = c
                .sh("systemctl status --no-pager -n 20 'airlock*'", 30 * SEC)
                .map(|o| o.both())
                .unwrap_or_default();
            return Err(format!("not active: {}\n{status}", bad.join(", ")));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn main_pids(c: &Container) -> Result<BTreeMap<String, String>, String> {
    let mut pids = BTreeMap::new();
    for unit in SERVICES {
        let pid = c.sh_ok(
            &format!("systemctl show -p MainPID --value {unit}"),
            10 * SEC,
        )?;
        pids.insert((*unit).to_owned(), pid.trim().to_owned());
    }
    Ok(pids)
}

fn airlock_processes(c: &Container) -> Result<Vec<Value>, String> {
    let out = c.sh_ok("python3 /tmp/tb/procs.py", 30 * SEC)?;
    Ok(json(&out)?.as_array().cloned().unwrap_or_default())
}

fn no_airlock_process(c: &Container) -> Result<String, String> {
    let deadline = Instant::now() + 15 * SEC;
    loop {
        let procs = airlock_processes(c)?;
        if procs.is_empty() {
            return Ok("no process of an airlock user or binary".to_owned());
        }
        if Instant::now() > deadline {
            return Err(format!("still running: {procs:?}"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn show(c: &Container, id: &str) -> Result<Value, String> {
    json(&c.sh_ok(&format!("airlockctl --json show {}", q(id)), 30 * SEC)?)
}

fn wait_state(c: &Container, id: &str, wanted: &[&str], limit: Duration) -> Result<Value, String> {
    let deadline = Instant::now() + limit;
    loop {
        let task = show(c, id)?;
        let state = task["state"].as_str().unwrap_or_default();
        if wanted.contains(&state) {
            return Ok(task);
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{id} is {state} after {limit:?}, not {wanted:?}: {}",
                serde_json::to_string(&task).unwrap_or_default()
            ));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn tasks(c: &Container) -> Result<BTreeMap<String, String>, String> {
    let list = json(&c.sh_ok("airlockctl --json list", 30 * SEC)?)?;
    let items = match &list {
        Value::Array(a) => a.clone(),
        other => other["tasks"].as_array().cloned().unwrap_or_default(),
    };
    Ok(items
        .iter()
        .map(|t| {
            (
                t["task_id"].as_str().unwrap_or_default().to_owned(),
                format!(
                    "{} {}/{}",
                    t["state"].as_str().unwrap_or_default(),
                    t["attempt"],
                    t["max_attempts"]
                ),
            )
        })
        .collect())
}

/// What must survive a reinstall or an upgrade.
#[derive(Debug, PartialEq, Eq)]
struct Kept {
    tasks: BTreeMap<String, String>,
    secrets: String,
    config_has_repository: bool,
}

fn kept(c: &Container) -> Result<Kept, String> {
    Ok(Kept {
        tasks: tasks(c)?,
        secrets: c.sh_ok(
            "sha256sum /etc/airlock/retry-control.token /etc/airlock/retryd.env",
            10 * SEC,
        )?,
        config_has_repository: c
            .sh_ok("cat /etc/airlock/airlock.toml", 10 * SEC)?
            .contains("path = \"/srv/airlock/calc.git\""),
    })
}

fn reinstall(c: &Container, command: &str) -> Result<String, String> {
    let before = kept(c)?;
    let pids_before = main_pids(c)?;
    if before.tasks.is_empty() {
        return Err("no tasks to keep".into());
    }
    let out = c.sh(command, 300 * SEC)?.expect_ok(command)?;
    all_active(c, STARTED_BY_TARGET)?;
    let after = kept(c)?;
    if after != before {
        return Err(format!("before: {before:?}\nafter: {after:?}"));
    }
    let pids_after = main_pids(c)?;
    let not_restarted: Vec<&str> = [
        "airlock-supervisor.service",
        "airlock-worker.service",
        "airlock-executor.service",
    ]
    .into_iter()
    .filter(|u| pids_before.get(*u) == pids_after.get(*u))
    .collect();
    if !not_restarted.is_empty() {
        return Err(format!(
            "not restarted: {not_restarted:?} (before {pids_before:?}, after {pids_after:?})\n{}",
            tail(&out.both(), 10)
        ));
    }
    Ok(format!(
        "{} tasks kept, secrets and configuration kept, services restarted",
        after.tasks.len()
    ))
}

fn in_container(r: &mut Report, c: &Container, p: &Packages, upgrade: Option<&Path>) {
    let deb = format!("/debs/{}", file_name(&p.deb));
    let helpers = || -> Result<(), String> {
        c.write("/tmp/tb/mktask.py", MKTASK_PY)?;
        c.write("/tmp/tb/procs.py", PROCS_PY)?;
        c.write("/tmp/tb/retry.py", RETRY_PY)?;
        c.write("/tmp/tb/health.py", HEALTH_PY)?;
        c.write("/tmp/tb/probe_paths.py", PROBE_PATHS_PY)?;
        let secrets = serde_json::to_string(SECRETS).map_err(|e| e.to_string())?;
        c.write(
            "/tmp/tb/test_probe.py",
            &TEST_PROBE_PY
                .replace("__SECRETS__", &secrets)
                .replace("__MARKER__", PROBE_MARKER),
        )?;
        c.write("/tmp/tb/probe_report.py", PROBE_REPORT_PY)?;
        c.write("/tmp/tb/exists.py", EXISTS_PY)?;
        c.sh_ok("chmod 755 /tmp/tb && chmod 644 /tmp/tb/*", 10 * SEC)
            .map(|_| ())
    };
    let installed = r.check(&format!("apt-get install {deb}"), |_| {
        helpers()?;
        if c.sh("getent passwd airlock", 10 * SEC)?.ok() {
            return Err("the fresh root already has an airlock user".into());
        }
        let out = c.sh(
            &format!("apt-get install -y --no-install-recommends {deb}"),
            300 * SEC,
        )?;
        let out = out.expect_ok("apt-get install")?;
        Ok(tail(&out.stdout, 1))
    });
    if installed.is_none() {
        r.skip(
            &["everything after the installation"],
            "the package did not install",
        );
        return;
    }
    r.check(
        "postinst: users, directories (tmpfiles), secrets, target enabled",
        |_| after_install(c),
    );
    r.check("started on install: target, services and socket active", |_| {
        std::thread::sleep(SEC);
        let active = all_active(c, STARTED_BY_TARGET)?;
        let restarts = c.sh_ok(
            "systemctl show -p NRestarts --value airlock-supervisor.service airlock-worker.service airlock-executor.service",
            10 * SEC,
        )?;
        // One value per unit, separated by blank lines.
        if restarts.split_whitespace().any(|n| n != "0") {
            return Err(format!("services restarted: {restarts}"));
        }
        Ok(format!("{active}, no restarts"))
    });
    r.check(
        "retryd: socket activation, LoadCredential token, env file",
        |_| {
            let health = json(&c.sh_ok("python3 /tmp/tb/health.py", 60 * SEC)?)?;
            if health["status"] != 200 {
                return Err(format!("/health: {health}"));
            }
            all_active(c, &["airlock-retryd.service"])?;
            Ok("GET /health 200; airlock-retryd.service active".to_owned())
        },
    );
    r.check(
        "systemd-analyze verify in the booted root: no output",
        |_| {
            let out = c.sh(
                &format!(
                    "systemd-analyze verify --man=no {} 2>&1",
                    ALL_UNITS.join(" ")
                ),
                120 * SEC,
            )?;
            if out.ok() && out.both().trim().is_empty() {
                Ok(format!("{} units, nothing printed", ALL_UNITS.len()))
            } else {
                Err(format!(
                    "systemd-analyze verify ({}):\n{}",
                    out.describe(),
                    out.both()
                ))
            }
        },
    );
    r.check("Documentation= of every unit is installed", |_| {
        let mut missing = Vec::new();
        let mut n = 0;
        for unit in ALL_UNITS {
            let docs = c.sh_ok(
                &format!("systemctl show -p Documentation --value {unit}"),
                10 * SEC,
            )?;
            for doc in docs.split_whitespace() {
                n += 1;
                let path = if let Some(man) = doc.strip_prefix("man:") {
                    let (name, section) = man
                        .trim_end_matches(')')
                        .split_once('(')
                        .ok_or_else(|| format!("{unit}: {doc}"))?;
                    format!("/usr/share/man/man{section}/{name}.{section}.gz")
                } else if let Some(file) = doc.strip_prefix("file:") {
                    file.to_owned()
                } else {
                    continue;
                };
                if !c.sh(&format!("test -f {}", q(&path)), 10 * SEC)?.ok() {
                    missing.push(format!("{unit}: {doc} ({path})"));
                }
            }
        }
        if missing.is_empty() {
            Ok(format!("{n} references, all installed"))
        } else {
            Err(missing.join("\n"))
        }
    });
    r.check(
        "systemd-analyze security: live and offline within EXPOSURE_LIMITS (README.md's figures)",
        |_| exposure(c),
    );
    let repo = r.check(
        "a bare repository under /srv/airlock, registered; restart",
        |_| setup_repository(c),
    );
    if only_agents() {
        if repo.is_some() {
            agent_checks(r, c);
        }
        return;
    }
    r.check(
        "airlockctl doctor: nothing fails, each warning on the expected list",
        |_| doctor(c),
    );
    r.check(
        "doctor's hardening verifier: every unit's directives checked by name",
        |_| crate::hardening::doctor_checks_every_unit(c),
    );
    r.check(
        "doctor: drop-ins removing PrivateNetwork= (worker) and InaccessiblePaths= (supervisor) fail exactly those properties; removed, doctor passes",
        |_| crate::hardening::doctor_names_weakened_properties(c),
    );
    r.check(
        "the packaged binaries have no test switches (allow-all-for-tests refused)",
        |_| no_test_switches(c),
    );
    if repo.is_some() {
        r.check(
            "demo task by root with airlockctl: SUCCEEDED, commit on agent/*",
            |_| demo_task(c),
        );
        r.check(
            "systemd's watchdog restarts a worker whose attempt thread is wedged (a fault build, in this root only); the task ends",
            |_| wedged_worker(c, p),
        );
        let host = r
            .check(
                "the secret paths the probes target exist (root, outside any sandbox)",
                |_| secrets_on_host(c).map(Host),
            )
            .map(|h| h.0);
        r.check("airlock-agent submits without a password (polkit rule)", |_| {
            c.sh_ok("python3 /tmp/tb/mktask.py tb-probe probe 1 /tmp/tb/probe.json", 30 * SEC)?;
            let out = c.sh(
                "runuser -u airlock-agent -- airlockctl --no-ask-password --json submit /tmp/tb/probe.json",
                60 * SEC,
            )?;
            let out = out.expect_ok("airlockctl submit as airlock-agent")?;
            let v = json(&out.stdout)?;
            Ok(format!("tb-probe {}", v["task"]["state"]))
        });
        if let Some(host) = &host {
            r.check(
                "sandbox probe: every secret path denied or hidden (ENOENT only for paths root sees)",
                |_| sandbox_probe(c, host),
            );
        } else {
            r.skip(&["sandbox probe"], "the secret paths are not all present");
        }
        r.check(
            "ordinary user: submit refused by polkit (exact code), refusal audited",
            |_| ordinary_user_denied(c),
        );
        r.check(
            "journal: events with their MESSAGE_IDs and AIRLOCK_* fields, explained by journalctl -x",
            |_| journal_catalogue(c),
        );
        r.check(
            "repo add + reload (same PIDs); airlock-agent clones it, cannot write it, proposes a --worktree: commit on agent/*",
            |_| own_repository(c),
        );
        r.check(
            "airlock-mcp as airlock-agent: an MCP client reads, proposes with a packaged preset, its commit lands on agent/*; polkit refuses its cancel",
            |_| mcp_agent(c),
        );
        agent_checks(r, c);
    } else {
        r.skip(
            &[
                "demo task by root with airlockctl",
                "airlock-agent submits",
                "sandbox probe",
                "ordinary user denied",
                "airlock-mcp as airlock-agent",
            ],
            "no repository",
        );
    }
    r.check(
        "live executor: NoNewPrivs 1, Seccomp 2, no capabilities",
        |_| executor_status(c),
    );
    r.check(
        "every running daemon confined itself: lockdown logged, NoNewPrivs 1, Seccomp 2",
        |_| daemons_locked_down(c),
    );
    r.check(
        "executor's namespace and user: worker state and secrets unreadable",
        |_| executor_namespace(c),
    );
    if repo.is_some() {
        r.check(
            "retryd: one more attempt for a failed task, with the owner's token",
            |_| retry_extension(c),
        );
    }
    r.check(
        "systemctl stop airlock.target leaves no airlock process",
        |_| stop_target(c),
    );
    r.check("D-Bus activation: a call starts the stopped supervisor", |_| {
        // airlockctl does not ask the bus to start the supervisor (it says
        // "not running"); any other client does, through the activation
        // file and systemd. busctl auto-starts by default.
        c.sh_ok(
            "busctl --system call org.airlock.Supervisor1 /org/airlock/Supervisor1 org.freedesktop.DBus.Peer Ping",
            60 * SEC,
        )?;
        all_active(c, &["airlock-supervisor.service"])?;
        Ok("airlock-supervisor.service started by the bus (SystemdService=)".to_owned())
    });
    r.check("systemctl start airlock.target", |_| {
        c.sh_ok("systemctl start airlock.target", 120 * SEC)?;
        all_active(c, STARTED_BY_TARGET)
    });
    r.check(
        "reinstall keeps tasks, config, secrets; restarts services",
        |_| reinstall(c, &format!("apt-get install -y --reinstall {deb}")),
    );
    match upgrade {
        Some(up) => {
            let up = format!("/debs/{}", file_name(up));
            r.check(
                "upgrade keeps tasks, config, secrets; restarts services",
                |_| {
                    let detail = reinstall(c, &format!("apt-get install -y {up}"))?;
                    let version = c.sh_ok("dpkg-query -W -f '${Version}' airlock", 10 * SEC)?;
                    if !version.ends_with("+testbed1") {
                        return Err(format!("installed version {version}"));
                    }
                    Ok(format!("{detail}; now {version}"))
                },
            );
        }
        None => r.skip(&["upgrade"], "no upgrade package"),
    }
    r.check("remove: stopped, state and configuration kept", |_| {
        c.sh_ok("apt-get remove -y airlock", 300 * SEC)?;
        no_airlock_process(c)?;
        let status = c.sh_ok("dpkg-query -W -f '${Status}' airlock", 10 * SEC)?;
        if status.trim() != "deinstall ok config-files" {
            return Err(format!("dpkg status {status:?}"));
        }
        expect_paths(
            c,
            &[
                "/var/lib/airlock/tasks.sqlite3",
                "/var/lib/airlock-worker/checkpoints.sqlite3",
                "/var/spool/airlock",
                "/etc/airlock/airlock.toml",
                "/etc/airlock/retry-control.token",
                "/etc/airlock/retryd.env",
            ],
            &[
                "/usr/bin/airlock-supervisor",
                "/usr/lib/systemd/system/airlock.target",
            ],
        )?;
        Ok(format!("dpkg: {status}"))
    });
    r.check("purge: state removed; repositories and users kept", |_| {
        c.sh_ok("apt-get purge -y airlock", 300 * SEC)?;
        no_airlock_process(c)?;
        expect_paths(
            c,
            &[REPO],
            &[
                "/var/lib/airlock",
                "/var/lib/airlock-worker",
                "/var/lib/airlock-exec",
                "/var/lib/airlock-agent",
                "/var/spool/airlock",
                "/etc/airlock",
                "/etc/systemd/system/multi-user.target.wants/airlock.target",
            ],
        )?;
        if c.sh(
            "dpkg-query -W -f '${Status}' airlock | grep -q installed",
            10 * SEC,
        )?
        .ok()
        {
            return Err("dpkg still knows airlock as installed".into());
        }
        let users = c.sh_ok(
            &format!("getent passwd {} | cut -d: -f1", USERS.join(" ")),
            10 * SEC,
        )?;
        Ok(format!(
            "state gone; {REPO} kept; users kept: {}",
            users.split_whitespace().collect::<Vec<_>>().join(" ")
        ))
    });
    r.check("install after purge: fresh secrets, started again", |_| {
        c.sh_ok(
            &format!("apt-get install -y --no-install-recommends {deb}"),
            300 * SEC,
        )?;
        all_active(c, STARTED_BY_TARGET)?;
        let mode = c.sh_ok("stat -c '%a %U' /etc/airlock/retry-control.token", 10 * SEC)?;
        if mode.trim() != "600 root" {
            return Err(format!("token mode {mode}"));
        }
        Ok("token regenerated (600 root), all active".to_owned())
    });
}

/// Issue 14: the worker's watchdog. The fault build comes from the
/// target directory the packages were built in (`<target>/packages/`).
fn wedged_worker(c: &Container, p: &Packages) -> Result<String, String> {
    let target = p
        .deb
        .parent()
        .and_then(Path::parent)
        .ok_or("the .deb is not in <target>/packages")?;
    let fault = crate::hardening::fault_worker(target)?;
    let submit = |id: &str| {
        c.sh_ok(
            &format!(
                "python3 /tmp/tb/mktask.py {id} fix 2 /tmp/tb/{id}.json >/dev/null && airlockctl --json submit /tmp/tb/{id}.json"
            ),
            60 * SEC,
        )
        .map(|_| ())
    };
    let settle = |id: &str| {
        let task = wait_state(c, id, &["VERIFYING", "SUCCEEDED", "FAILED"], 300 * SEC)?;
        if task["state"] == "VERIFYING" {
            c.sh_ok(
                &format!(
                    "airlockctl verify {id} accept --reason 'testbed: resumed after the watchdog'"
                ),
                60 * SEC,
            )?;
        }
        wait_state(c, id, &["SUCCEEDED", "FAILED"], 60 * SEC)
    };
    crate::hardening::watchdog_restarts_a_wedged_worker(c, &fault, submit, settle)
}

fn expect_paths(c: &Container, present: &[&str], absent: &[&str]) -> Result<(), String> {
    let mut problems = Vec::new();
    for p in present {
        if !c.sh(&format!("test -e {}", q(p)), 10 * SEC)?.ok() {
            problems.push(format!("{p} is missing"));
        }
    }
    for p in absent {
        if c.sh(&format!("test -e {} || test -L {}", q(p), q(p)), 10 * SEC)?
            .ok()
        {
            problems.push(format!("{p} is still there"));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

fn after_install(c: &Container) -> Result<String, String> {
    let mut problems = Vec::new();
    for user in USERS {
        if !c.sh(&format!("getent passwd {user}"), 10 * SEC)?.ok() {
            problems.push(format!("user {user} missing"));
        }
    }
    for group in ["airlock-exchange"] {
        if !c.sh(&format!("getent group {group}"), 10 * SEC)?.ok() {
            problems.push(format!("group {group} missing"));
        }
    }
    // Every line of tmpfiles.d/airlock.conf, as systemd-tmpfiles left it.
    let tmpfiles = fs::read_to_string(workspace_root().join("tmpfiles/airlock.conf"))
        .map_err(|e| e.to_string())?;
    let mut n = 0;
    for line in tmpfiles.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        let [kind, path, mode, user, group, ..] = f[..] else {
            return Err(format!("tmpfiles line {line:?}"));
        };
        n += 1;
        if kind == "z" {
            // An adjustment of files that may or may not exist yet (the
            // supervisor creates the task database): every match, if any.
            let st = c.sh(
                &format!(
                    "for f in {path}; do [ -e \"$f\" ] && stat -c '%n|%a|%U|%G' \"$f\"; done; true"
                ),
                10 * SEC,
            )?;
            for got in st.stdout.lines() {
                if !got.ends_with(&format!("|{}|{user}|{group}", mode.trim_start_matches('0'))) {
                    problems.push(format!("{got} (tmpfiles.d: z {mode} {user} {group})"));
                }
            }
            continue;
        }
        let st = c.sh(&format!("stat -c '%F|%a|%U|%G' {}", q(path)), 10 * SEC)?;
        if !st.ok() {
            problems.push(format!("{path} missing"));
            continue;
        }
        let got: Vec<&str> = st.stdout.trim().split('|').collect();
        let want_kind = if kind == "d" { "directory" } else { "regular" };
        let want_mode = u32::from_str_radix(mode, 8).unwrap_or(0);
        let got_mode = u32::from_str_radix(got.get(1).unwrap_or(&""), 8).unwrap_or(u32::MAX);
        if !got[0].starts_with(want_kind)
            || got_mode != want_mode
            || got.get(2) != Some(&user)
            || got.get(3) != Some(&group)
        {
            problems.push(format!(
                "{path}: {} (tmpfiles.d: {kind} {mode} {user} {group})",
                st.stdout.trim()
            ));
        }
    }
    let token = c.sh_ok(
        "stat -c '%a %U %G' /etc/airlock/retry-control.token && cat /etc/airlock/retry-control.token",
        10 * SEC,
    )?;
    let mut lines = token.lines();
    let mode = lines.next().unwrap_or("");
    let value = lines.next().unwrap_or("");
    if mode != "600 root root"
        || value.len() != 48
        || !value.chars().all(|ch| ch.is_ascii_alphanumeric())
    {
        problems.push(format!(
            "retry-control.token: {mode}, {} characters",
            value.len()
        ));
    }
    let env = c.sh_ok(
        "stat -c '%a %U' /etc/airlock/retryd.env && grep '^AIRLOCK_RETRY_AUTHORIZATION_ID=' /etc/airlock/retryd.env",
        10 * SEC,
    )?;
    if !env.starts_with("600 root\nAIRLOCK_RETRY_AUTHORIZATION_ID=owner-") {
        problems.push(format!("retryd.env: {}", env.lines().next().unwrap_or("")));
    }
    let enabled = c.sh("systemctl is-enabled airlock.target", 10 * SEC)?;
    if enabled.stdout.trim() != "enabled" {
        problems.push(format!("airlock.target is {}", enabled.stdout.trim()));
    }
    if problems.is_empty() {
        Ok(format!(
            "{} users, {n} tmpfiles entries as declared, token 600 root (48 chars), retryd.env, target enabled",
            USERS.len()
        ))
    } else {
        Err(problems.join("\n"))
    }
}

/// `systemd-analyze security` of each live service in the booted root and
/// `--offline=true` of its file in units/, against its limit in
/// [`units::EXPOSURE_LIMITS`] (which README.md quotes).
fn exposure(c: &Container) -> Result<String, String> {
    let mut figures = Vec::new();
    let mut bad = Vec::new();
    let files = units::unit_files()?;
    for unit in SERVICES {
        if max_exposure(unit).is_none() {
            bad.push(format!("{unit}: no limit in EXPOSURE_LIMITS"));
        }
    }
    for limit in units::EXPOSURE_LIMITS {
        let unit = limit.unit;
        let live = c.sh(
            &format!("SYSTEMD_COLORS=0 systemd-analyze security --no-pager {unit}"),
            60 * SEC,
        )?;
        let live_exposure = units::parse_exposure(&live.stdout)
            .ok_or_else(|| format!("{unit}: {}", live.both()))?;
        let file = files
            .iter()
            .find(|f| f.name == unit)
            .ok_or_else(|| format!("units/{unit} is missing"))?;
        let (offline, findings) = units::offline_exposure(file)?;
        let short = unit
            .trim_start_matches("airlock-")
            .trim_end_matches(".service");
        figures.push(format!(
            "{short} {live_exposure:.1}/{offline:.1} (limits {:.1}/{:.1})",
            limit.live, limit.offline
        ));
        if live_exposure > limit.live || offline > limit.offline {
            let live_findings: Vec<&str> =
                live.stdout.lines().filter(|l| l.starts_with('✗')).collect();
            bad.push(format!(
                "{unit}: live {live_exposure} (limit {}), offline {offline} (limit {})\nlive:\n{}\noffline:\n{findings}",
                limit.live,
                limit.offline,
                live_findings.join("\n")
            ));
        }
    }
    if bad.is_empty() {
        Ok(format!("live/offline: {}", figures.join(", ")))
    } else {
        Err(format!("{}\n{}", figures.join(", "), bad.join("\n")))
    }
}

fn setup_repository(c: &Container) -> Result<String, String> {
    let script = r#"set -e
work=$(mktemp -d)
cd "$work"
printf 'def add(a, b):\n    return a - b\n' > calc.py
cat > test_calc.py <<'PY'
import unittest

from calc import add


class AddTest(unittest.TestCase):
    def test_adds(self):
        self.assertEqual(add(2, 3), 5)


if __name__ == "__main__":
    unittest.main()
PY
git init -q -b main .
git add -A
git -c user.name=admin -c user.email=admin@testbed.invalid commit -q -m 'calc: add two numbers'
git clone -q --bare "$work" /srv/airlock/calc.git
chown -R airlock-worker:airlock-worker /srv/airlock/calc.git
rm -rf "$work"
cat >> /etc/airlock/airlock.toml <<'TOML'

[[repository]]
name = "calc"
path = "/srv/airlock/calc.git"
description = "testbed repository"
TOML
systemctl restart airlock.target
git -c safe.directory='*' -C /srv/airlock/calc.git rev-parse main
"#;
    let base = c.sh_ok(script, 120 * SEC)?;
    all_active(c, STARTED_BY_TARGET)?;
    Ok(format!("calc.git at {}", base.trim()))
}

fn demo_task(c: &Container) -> Result<String, String> {
    let base = c.sh_ok(
        "python3 /tmp/tb/mktask.py tb-demo fix 2 /tmp/tb/demo.json",
        30 * SEC,
    )?;
    let base = base.trim().to_owned();
    let t = Instant::now();
    let submitted = json(&c.sh_ok("airlockctl --json submit /tmp/tb/demo.json", 60 * SEC)?)?;
    if submitted["task"]["task_id"] != "tb-demo" {
        return Err(format!("submit answered {submitted}"));
    }
    let task = wait_state(
        c,
        "tb-demo",
        &["VERIFYING", "SUCCEEDED", "FAILED"],
        180 * SEC,
    )?;
    let to_verifying = t.elapsed();
    if task["state"] == "VERIFYING" {
        c.sh_ok(
            "airlockctl verify tb-demo accept --reason 'testbed: tests pass'",
            60 * SEC,
        )?;
    }
    let task = wait_state(c, "tb-demo", &["SUCCEEDED", "FAILED"], 60 * SEC)?;
    if task["state"] != "SUCCEEDED" {
        return Err(format!(
            "tb-demo ended {}: {}",
            task["state"], task["result"]
        ));
    }
    let commit = task["result"]["commit_oid"]
        .as_str()
        .ok_or("no commit in the result")?
        .to_owned();
    let git = |args: &str| {
        c.sh_ok(
            &format!("git -c safe.directory='*' -C {REPO} {args}"),
            30 * SEC,
        )
    };
    let head = git("rev-parse refs/heads/agent/tb-demo")?;
    let parent = git("rev-parse agent/tb-demo^")?;
    let calc = git("show agent/tb-demo:calc.py")?;
    let main = git("rev-parse main")?;
    if head.trim() != commit
        || parent.trim() != base
        || !calc.contains("return a + b")
        || main.trim() != base
    {
        return Err(format!(
            "agent/tb-demo {} (result {commit}), parent {} (base {base}), main {}, calc.py:\n{calc}",
            head.trim(),
            parent.trim(),
            main.trim()
        ));
    }
    Ok(format!(
        "commit {} on agent/tb-demo (VERIFYING after {:.1}s, accepted), main untouched",
        &commit[..12.min(commit.len())],
        to_verifying.as_secs_f64()
    ))
}

/// The README's "use it on your own repository", on the installed package:
/// `repo add` (which reloads the units through systemd), a clone and a
/// `propose --worktree` as airlock-agent, the admin's decision.
fn own_repository(c: &Container) -> Result<String, String> {
    let before = main_pids(c)?;
    let added = c.sh_ok(
        r#"set -e
work=$(mktemp -d)
cd "$work"
printf 'def mul(a, b):
    return a + b
' > mul.py
printf 'import unittest
from mul import mul

class MulTest(unittest.TestCase):
    def test_mul(self):
        self.assertEqual(mul(2, 3), 6)
' > test_mul.py
git init -q -b main .
git add -A
git -c user.name=alice -c user.email=alice@testbed.invalid commit -q -m 'mul: multiply'
airlockctl --json repo add mul --from "$work"
stat -c '%U:%G %a' /srv/airlock/mul.git /srv/airlock/mul.git/objects
"#,
        120 * SEC,
    )?;
    let mut lines = added.lines();
    let reply = json(lines.next().unwrap_or_default())?;
    if reply["reloaded"] != true {
        return Err(format!("repo add did not reload the units: {reply}"));
    }
    let modes: Vec<&str> = lines.collect();
    if modes != ["airlock-worker:airlock-readers 2750"; 2] {
        return Err(format!("modes of /srv/airlock/mul.git: {modes:?}"));
    }
    all_active(c, STARTED_BY_TARGET)?;
    let after = main_pids(c)?;
    if after != before {
        return Err(format!("reload restarted a unit: {before:?} → {after:?}"));
    }
    let agent = |cmd: &str| {
        c.sh(
            &format!(
                "cd /var/lib/airlock-agent && runuser -u airlock-agent -- sh -c {}",
                q(cmd)
            ),
            120 * SEC,
        )
    };
    agent("rm -rf mul && airlockctl repo clone mul mul")?
        .expect_ok("repo clone as airlock-agent")?;
    let write = agent("git --git-dir=/srv/airlock/mul.git update-ref refs/heads/agent/x main")?;
    if write.code == Some(0) {
        return Err("airlock-agent wrote a ref of /srv/airlock/mul.git".into());
    }
    agent("sed -i 's/a + b/a * b/' mul/mul.py")?.expect_ok("edit")?;
    let proposed = agent(
        "airlockctl --no-ask-password --json propose --repo mul --base main --worktree mul --verify 'python3 -m unittest -q' --max-attempts 1 --task-id tb-propose",
    )?
    .expect_ok("propose as airlock-agent")?;
    let task = wait_state(
        c,
        "tb-propose",
        &["VERIFYING", "SUCCEEDED", "FAILED"],
        180 * SEC,
    )?;
    if task["state"] == "VERIFYING" {
        c.sh_ok(
            "airlockctl verify tb-propose accept --reason 'testbed: the suite passes'",
            60 * SEC,
        )?;
    }
    let task = wait_state(c, "tb-propose", &["SUCCEEDED", "FAILED"], 60 * SEC)?;
    let commit = task["result"]["commit_oid"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let head = c.sh_ok(
        "git --git-dir=/srv/airlock/mul.git rev-parse refs/heads/agent/tb-propose",
        30 * SEC,
    )?;
    if task["state"] != "SUCCEEDED" || head.trim() != commit {
        return Err(format!(
            "tb-propose {} (commit {commit}, agent/tb-propose {}): {}",
            task["state"],
            head.trim(),
            proposed.stdout
        ));
    }
    Ok(format!(
        "mul.git added and served after a reload (PIDs unchanged); tb-propose SUCCEEDED at {}",
        &commit[..12.min(commit.len())]
    ))
}

/// A coding agent's MCP client drives the packaged airlock-mcp as
/// airlock-agent (tests/systemd/src/mcp_agent.py): real polkit, the
/// packaged presets, the repository `own_repository` added.
fn mcp_agent(c: &Container) -> Result<String, String> {
    c.write("/tmp/tb/mcp_agent.py", include_str!("mcp_agent.py"))?;
    let out = c.sh_ok(
        "chmod 0755 /tmp/tb && chmod 0644 /tmp/tb/mcp_agent.py && touch /tmp/tb/airlock-mcp.stderr && chown airlock-agent /tmp/tb/airlock-mcp.stderr && cd /var/lib/airlock-agent && runuser -u airlock-agent -- python3 /tmp/tb/mcp_agent.py",
        300 * SEC,
    )?;
    let v = json(out.trim().lines().last().unwrap_or_default())?;
    let tools = v["tools"].as_array().map_or(0, Vec::len);
    let commit = v["commit"].as_str().unwrap_or_default().to_owned();
    let id = v["task_id"].as_str().unwrap_or_default().to_owned();
    let head = c.sh_ok(
        &format!("git --git-dir=/srv/airlock/mul.git rev-parse refs/heads/agent/{id}"),
        30 * SEC,
    )?;
    let ok = tools == 10
        && v["repositories"]
            .as_array()
            .is_some_and(|r| r.iter().any(|x| x == "mul"))
        && v["presets"]
            .as_array()
            .is_some_and(|p| p.iter().any(|x| x == "python-unittest"))
        && v["read"] == "def mul(a, b):\n    return a + b\n"
        && ["VERIFYING", "SUCCEEDED"].contains(&v["state"].as_str().unwrap_or_default())
        && commit.len() == 40
        && head.trim() == commit
        // polkit's auth_admin for tasks.manage: an administrator's password,
        // which an agent (no interaction allowed) cannot give.
        && v["cancel"] == "INTERACTIVE_AUTHORIZATION_REQUIRED"
        && v["escape"] == "PATH_ESCAPE"
        && v["exit"] == 0;
    if !ok {
        let log = c
            .sh("cat /tmp/tb/airlock-mcp.stderr", 10 * SEC)
            .map(|o| o.stdout)
            .unwrap_or_default();
        return Err(format!(
            "{v} (agent/{id} at {}); airlock-mcp's log:\n{log}",
            head.trim()
        ));
    }
    // The administrator's decision, so that no task is left VERIFYING.
    if v["state"] == "VERIFYING" {
        c.sh_ok(
            &format!(
                "airlockctl verify {id} accept --reason 'testbed: airlock-mcp proposal verified'"
            ),
            60 * SEC,
        )?;
    }
    Ok(format!(
        "{} tools on {}; {id} {} at {}, on agent/{id}; cancel refused by polkit (INTERACTIVE_AUTHORIZATION_REQUIRED)",
        tools,
        v["protocol"],
        v["state"],
        &commit[..12]
    ))
}

fn ordinary_user_denied(c: &Container) -> Result<String, String> {
    c.sh_ok(
        "id alice >/dev/null 2>&1 || useradd --create-home alice; python3 /tmp/tb/mktask.py tb-alice fix 1 /tmp/tb/alice.json && chmod 644 /tmp/tb/alice.json",
        30 * SEC,
    )?;
    let out: Out = c.sh(
        "runuser -u alice -- airlockctl --no-ask-password --json submit /tmp/tb/alice.json",
        60 * SEC,
    )?;
    let want = &INTERACTIVE_AUTHORIZATION_REQUIRED;
    expect_refusal(&out, want, "org.airlock.tasks.submit")
        .map_err(|e| format!("alice's submit: {e}"))?;
    let missing = c.sh("airlockctl --json show tb-alice", 30 * SEC)?;
    if missing.code != Some(6) {
        return Err(format!(
            "tb-alice exists after a denied submit: {}",
            missing.both()
        ));
    }
    let audited = denial_audited(c, "alice", "TASK_SUBMITTED", want)?;
    Ok(format!(
        "exit {} {} ({}); audited as event {} with the same code",
        want.exit_code, want.code, want.dbus_error, audited["id"]
    ))
}

/// `MESSAGE_ID`s of services/supervisor/src/journal.rs (released ids never
/// change; a unit test there holds them to catalog/airlock.catalog).
const MSG_TASK_SUBMITTED: &str = "30cd7e4400814c929cb61023fca56d03";
const MSG_REFUSED: &str = "229810b04d424c38a8a0473d4ae44051";

/// The journal entries of one `journalctl` match, as JSON objects, waiting
/// up to 15 s for the supervisor's export (it polls the log every second).
fn journal_entries(c: &Container, matches: &str) -> Result<Vec<Value>, String> {
    let deadline = Instant::now() + 15 * SEC;
    loop {
        let out = c.sh_ok(
            &format!("journalctl --no-pager -o json {matches}"),
            30 * SEC,
        )?;
        let entries: Vec<Value> = out
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        if !entries.is_empty() || Instant::now() > deadline {
            return Ok(entries);
        }
        std::thread::sleep(SEC / 2);
    }
}

/// The demo task's submission and alice's refused submit are in the journal
/// with their MESSAGE_IDs and fields, and `journalctl -x` explains both
/// from the installed catalogue.
fn journal_catalogue(c: &Container) -> Result<String, String> {
    let submitted = journal_entries(
        c,
        &format!("MESSAGE_ID={MSG_TASK_SUBMITTED} AIRLOCK_TASK_ID=tb-demo"),
    )?;
    let Some(s) = submitted.first() else {
        return Err(format!(
            "no MESSAGE_ID={MSG_TASK_SUBMITTED} entry for tb-demo; the supervisor's journal:\n{}",
            c.sh(
                "journalctl --no-pager -n 20 -u airlock-supervisor.service",
                30 * SEC
            )?
            .both()
        ));
    };
    for (field, want) in [
        ("AIRLOCK_ACTION", "TASK_SUBMITTED"),
        ("AIRLOCK_OUTCOME", "allowed"),
        ("AIRLOCK_ACTOR_KIND", "planner"),
        ("SYSLOG_IDENTIFIER", "airlock-supervisor"),
        ("_SYSTEMD_UNIT", "airlock-supervisor.service"),
    ] {
        if s[field] != want {
            return Err(format!("{field} is {} (want {want}): {s}", s[field]));
        }
    }
    if submitted.len() != 1 {
        return Err(format!(
            "tb-demo's submission is in the journal {} times",
            submitted.len()
        ));
    }
    let refused = journal_entries(
        c,
        &format!(
            "MESSAGE_ID={MSG_REFUSED} AIRLOCK_ACTION=TASK_SUBMITTED AIRLOCK_ACTOR_UID=$(id -u alice)"
        ),
    )?;
    let Some(d) = refused.last() else {
        return Err("alice's refused submit is not in the journal".into());
    };
    let code = d["AIRLOCK_CODE"].as_str().unwrap_or_default().to_owned();
    if d["AIRLOCK_OUTCOME"] != "denied" || code.is_empty() || d["PRIORITY"] != "4" {
        return Err(format!("alice's refusal in the journal: {d}"));
    }
    let explained = c.sh_ok(
        &format!(
            "journalctl --no-pager -x MESSAGE_ID={MSG_REFUSED} AIRLOCK_ACTOR_UID=$(id -u alice)"
        ),
        30 * SEC,
    )?;
    let subject = format!("airlock refused TASK_SUBMITTED: {code}");
    if !explained.contains(&subject) || !explained.contains("Defined-By: airlock") {
        return Err(format!(
            "journalctl -x does not explain the refusal (want {subject:?}):\n{}",
            tail(&explained, 15)
        ));
    }
    let explained = c.sh_ok(
        &format!(
            "journalctl --no-pager -x MESSAGE_ID={MSG_TASK_SUBMITTED} AIRLOCK_TASK_ID=tb-demo"
        ),
        30 * SEC,
    )?;
    if !explained.contains("airlock task tb-demo submitted") {
        return Err(format!(
            "journalctl -x does not explain the submission:\n{}",
            tail(&explained, 15)
        ));
    }
    Ok(format!(
        "TASK_SUBMITTED of tb-demo once with MESSAGE_ID {MSG_TASK_SUBMITTED}; alice's refusal ({code}) with {MSG_REFUSED}; both explained by journalctl -x"
    ))
}

/// `lstat` of every secret path as root in the container, outside any
/// sandbox; each must exist, so that ENOENT inside a sandbox means hidden,
/// not absent. `/run/credentials/airlock-retryd.service` exists while
/// airlock-retryd runs, so it is started first (socket activation).
fn secrets_on_host(c: &Container) -> Result<BTreeMap<String, String>, String> {
    c.sh_ok("python3 /tmp/tb/health.py", 60 * SEC)?;
    all_active(c, &["airlock-retryd.service"])?;
    let found = json(&c.sh_ok(
        &format!("python3 /tmp/tb/exists.py {}", SECRETS.join(" ")),
        30 * SEC,
    )?)?;
    let found: BTreeMap<String, String> = SECRETS
        .iter()
        .map(|p| {
            (
                (*p).to_owned(),
                found[*p].as_str().unwrap_or("not reported").to_owned(),
            )
        })
        .collect();
    let absent: Vec<String> = found
        .iter()
        .filter(|(_, v)| *v != "exists")
        .map(|(p, v)| format!("{p}: {v}"))
        .collect();
    if absent.is_empty() {
        Ok(found)
    } else {
        Err(format!(
            "secret paths the probes target do not exist on the host side, so a probe's ENOENT would prove nothing: {}",
            absent.join(", ")
        ))
    }
}

/// Judges what a confined process got for each secret path (`readable`
/// or an errno name, from `seen(path)`), given that root sees every one
/// (`secrets_on_host`): EACCES or EPERM is denied, ENOENT is hidden (the
/// path exists outside), anything else fails.
fn judge_unreachable(
    seen: impl Fn(&str) -> String,
    host: &BTreeMap<String, String>,
) -> Result<String, String> {
    let (mut denied, mut hidden, mut problems) = (Vec::new(), Vec::new(), Vec::new());
    for p in SECRETS {
        let got = seen(p);
        let exists = host.get(*p).is_some_and(|h| h == "exists");
        match got.as_str() {
            "EACCES" | "EPERM" => denied.push(format!("{p} ({got})")),
            "ENOENT" if exists => hidden.push((*p).to_owned()),
            "ENOENT" => problems.push(format!("{p}: ENOENT, and root does not see it either")),
            _ => problems.push(format!("{p}: {got} (want EACCES, EPERM or ENOENT)")),
        }
    }
    if problems.is_empty() {
        Ok(format!(
            "denied: {}; hidden (ENOENT, present on the host side): {}",
            if denied.is_empty() {
                "none".to_owned()
            } else {
                denied.join(", ")
            },
            if hidden.is_empty() {
                "none".to_owned()
            } else {
                hidden.join(", ")
            }
        ))
    } else {
        Err(problems.join("\n"))
    }
}

/// The probe task: inside the executor's sandbox, every secret path is
/// denied or hidden (it exists on the host side, before and after), and
/// airlock-agent may not decide on its own task.
fn sandbox_probe(c: &Container, host_before: &BTreeMap<String, String>) -> Result<String, String> {
    let task = wait_state(
        c,
        "tb-probe",
        &["VERIFYING", "SUCCEEDED", "FAILED"],
        120 * SEC,
    )?;
    let result = &task["result"];
    if result["outcome"] != "passed" {
        return Err(format!(
            "the probe did not pass inside the sandbox: {}",
            serde_json::to_string_pretty(result).unwrap_or_default()
        ));
    }
    let host_after = secrets_on_host(c)?;
    if &host_after != host_before {
        return Err(format!(
            "the host side changed during the probe: {host_before:?} -> {host_after:?}"
        ));
    }
    // The probe's per-path report, from the executor's result bundle.
    let found = json(&c.sh_ok(
        &format!("python3 /tmp/tb/probe_report.py {}", q(PROBE_MARKER)),
        30 * SEC,
    )?)?;
    let found = found.as_array().cloned().unwrap_or_default();
    let [bundle] = found.as_slice() else {
        return Err(format!(
            "want one probe report in /var/spool/airlock/results, found {}: {found:?}",
            found.len()
        ));
    };
    let want_sha = result["exec_result_sha256"].as_str().unwrap_or_default();
    if bundle["sha256"] != want_sha {
        return Err(format!(
            "the bundle holding the probe's report ({}, sha256 {}) is not the task's ({want_sha})",
            bundle["file"], bundle["sha256"]
        ));
    }
    // Under the unit, commands get the minimal root with a /proc of their own.
    let confinement = &bundle["confinement"];
    let namespaces: Vec<&str> = confinement["namespaces"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
        .unwrap_or_default();
    if confinement["view"] != "minimal-root"
        || !["mount", "pid", "proc", "tmp", "root"]
            .iter()
            .all(|n| namespaces.contains(n))
    {
        return Err(format!(
            "the probe ran without its minimal root under the unit: {confinement}"
        ));
    }
    let report = &bundle["report"];
    let judged = judge_unreachable(
        |p| {
            report[p]["read"]
                .as_str()
                .unwrap_or("not reported")
                .to_owned()
        },
        &host_after,
    )?;
    // The planner may submit but never decide (no polkit rule grants it
    // org.airlock.tasks.manage).
    let agent = c.sh(
        "runuser -u airlock-agent -- airlockctl --no-ask-password --json verify tb-probe accept --reason 'self-approval'",
        30 * SEC,
    )?;
    let want = &INTERACTIVE_AUTHORIZATION_REQUIRED;
    expect_refusal(&agent, want, "org.airlock.tasks.manage")
        .map_err(|e| format!("airlock-agent's own verify: {e}"))?;
    let audited = denial_audited(c, "airlock-agent", "TASK_VERIFIED", want)?;
    let after = show(c, "tb-probe")?;
    if after["state"] != "VERIFYING" {
        return Err(format!(
            "tb-probe is {} after airlock-agent's refused verify",
            after["state"]
        ));
    }
    c.sh_ok(
        "airlockctl verify tb-probe reject --reason 'testbed probe, not a change'",
        30 * SEC,
    )?;
    Ok(format!(
        "{} paths, each present for root outside the sandbox; inside: {judged}; confinement {}; \
         airlock-agent's own verify: exit {} {}, audited as event {}",
        SECRETS.len(),
        bundle["confinement"],
        want.exit_code,
        want.code,
        audited["id"]
    ))
}

/// Each running airlock daemon logged its own lockdown (full Landlock) and
/// its /proc status shows NoNewPrivs 1 and Seccomp 2. A unit that is not
/// running (retryd waits for its socket) is skipped.
fn daemons_locked_down(c: &Container) -> Result<String, String> {
    let mut seen = Vec::new();
    let mut problems = Vec::new();
    for unit in [
        "airlock-supervisor",
        "airlock-worker",
        "airlock-executor",
        "airlock-retryd",
    ] {
        let out = c.sh_ok(
            &format!(
                "pid=$(systemctl show -p MainPID --value {unit}.service); echo pid=$pid; \
                 [ \"$pid\" = 0 ] || grep -E '^(NoNewPrivs|Seccomp):' /proc/$pid/status; \
                 echo logged=$(journalctl -b -u {unit}.service -o cat | grep -c 'lockdown {unit}: .*landlock full')"
            ),
            10 * SEC,
        )?;
        let field = |name: &str| {
            out.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_owned())
                .unwrap_or_default()
        };
        if field("pid=") == "0" {
            continue;
        }
        let (nnp, seccomp, logged) = (field("NoNewPrivs:"), field("Seccomp:"), field("logged="));
        if nnp != "1" || seccomp != "2" || logged == "0" || logged.is_empty() {
            problems.push(format!(
                "{unit}: NoNewPrivs {nnp}, Seccomp {seccomp}, lockdown lines {logged}"
            ));
        } else {
            seen.push(unit);
        }
    }
    if problems.is_empty() {
        Ok(format!("{} locked down", seen.join(", ")))
    } else {
        Err(problems.join("; "))
    }
}

fn executor_status(c: &Container) -> Result<String, String> {
    let out = c.sh_ok(
        "pid=$(systemctl show -p MainPID --value airlock-executor.service); cat /proc/$pid/status; getent group airlock-exchange | cut -d: -f3; id -u airlock-exec",
        10 * SEC,
    )?;
    let field = |name: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .map(|v| v.trim().to_owned())
            .unwrap_or_default()
    };
    let mut tail_lines = out.lines().rev();
    let uid = tail_lines.next().unwrap_or("").trim().to_owned();
    let gid = tail_lines.next().unwrap_or("").trim().to_owned();
    let mut problems = Vec::new();
    if field("NoNewPrivs") != "1" {
        problems.push(format!("NoNewPrivs {}", field("NoNewPrivs")));
    }
    if field("Seccomp") != "2" {
        problems.push(format!("Seccomp {}", field("Seccomp")));
    }
    for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        if !field(cap).trim_start_matches('0').is_empty() {
            problems.push(format!("{cap} {}", field(cap)));
        }
    }
    if field("Uid").split_whitespace().any(|u| u != uid) {
        problems.push(format!("Uid {} (airlock-exec is {uid})", field("Uid")));
    }
    // Its only group is the exchange group (Group=, no supplementary ones).
    if field("Gid").split_whitespace().any(|g| g != gid) || field("Groups") != gid {
        problems.push(format!(
            "Gid {}, Groups {} (airlock-exchange is {gid})",
            field("Gid"),
            field("Groups")
        ));
    }
    if problems.is_empty() {
        Ok(format!(
            "NoNewPrivs 1, Seccomp 2 ({} filters), every capability set 0, uid {uid}, only group {gid}",
            field("Seccomp_filters")
        ))
    } else {
        Err(problems.join(", "))
    }
}

fn executor_namespace(c: &Container) -> Result<String, String> {
    let readable = ["/var/spool/airlock/requests", "/var/lib/airlock-exec/work"];
    let mut paths: Vec<&str> = SECRETS.to_vec();
    paths.extend(readable);
    let script = format!(
        "pid=$(systemctl show -p MainPID --value airlock-executor.service); \
         nsenter -t $pid -m -n setpriv --reuid=airlock-exec --regid=airlock-exchange --init-groups --no-new-privs \
         python3 - {} < /tmp/tb/probe_paths.py",
        paths.join(" ")
    );
    let host = secrets_on_host(c)?;
    let found = json(&c.sh_ok(&script, 30 * SEC)?)?;
    let mut problems = Vec::new();
    let judged = judge_unreachable(
        |p| found[p].as_str().unwrap_or("not reported").to_owned(),
        &host,
    )
    .unwrap_or_else(|e| {
        problems.push(e);
        String::new()
    });
    for p in readable {
        if found[p] != "readable" {
            problems.push(format!("{p}: {} (the executor needs it)", found[p]));
        }
    }
    if problems.is_empty() {
        Ok(format!(
            "{} paths, each present for root: {judged}; its spool and work dir readable",
            SECRETS.len()
        ))
    } else {
        Err(problems.join("\n"))
    }
}

fn retry_extension(c: &Container) -> Result<String, String> {
    c.sh_ok(
        "python3 /tmp/tb/mktask.py tb-retry nofix 1 /tmp/tb/retry.json",
        30 * SEC,
    )?;
    c.sh_ok("airlockctl --json submit /tmp/tb/retry.json", 60 * SEC)?;
    let failed = wait_state(c, "tb-retry", &["FAILED", "SUCCEEDED"], 180 * SEC)?;
    if failed["state"] != "FAILED" || failed["max_attempts"] != 1 {
        return Err(format!("tb-retry: {failed}"));
    }
    let out = json(&c.sh_ok("python3 /tmp/tb/retry.py tb-retry", 60 * SEC)?)?;
    let (wrong, right, replay) = (&out["wrong"], &out["right"], &out["replay"]);
    if wrong[0] != UNAUTHORIZED.http_status
        || wrong[1]["error"] != UNAUTHORIZED.code
        || right[0] != 201
        || replay[0] != 200
        || right[1]["max_attempts"] != 2
    {
        return Err(format!("retry-extension answers: {out}"));
    }
    // The extension queued it again; its second attempt fails the same way.
    let again = wait_state(c, "tb-retry", &["FAILED"], 180 * SEC)?;
    if again["attempt"] != 2 || again["max_attempts"] != 2 {
        return Err(format!("tb-retry after the extension: {again}"));
    }
    // The owner's CLI: token, address and authorization id from the
    // package's files (retry.token_file, retry.listen, retryd.env).
    let cli = c.sh("airlockctl --json retry extend tb-retry", 60 * SEC)?;
    let cli = cli.expect_ok("airlockctl retry extend")?;
    let extended = show(c, "tb-retry")?;
    if extended["max_attempts"] != 3 {
        return Err(format!(
            "after airlockctl retry extend: {extended}\n{}",
            cli.both()
        ));
    }
    // Let the third attempt finish, so that later checks see settled tasks.
    let third = wait_state(c, "tb-retry", &["FAILED"], 180 * SEC)?;
    if third["attempt"] != 3 {
        return Err(format!("tb-retry after airlockctl retry extend: {third}"));
    }
    // retryd went through the supervisor: as its own uid it cannot even
    // open the task database, which is 0600 airlock:airlock.
    let db = c.sh_ok(
        "stat -c '%a %U %G' /var/lib/airlock/tasks.sqlite3",
        10 * SEC,
    )?;
    if db.trim() != "600 airlock airlock" {
        return Err(format!("the task database is {}", db.trim()));
    }
    let open = c.sh(
        "setpriv --reuid=airlock-retry --regid=airlock-retry --clear-groups cat /var/lib/airlock/tasks.sqlite3 >/dev/null",
        10 * SEC,
    )?;
    if open.ok() || !open.stderr.contains("Permission denied") {
        return Err(format!(
            "as airlock-retry, opening the task database: {}",
            open.both()
        ));
    }
    Ok(
        "HTTP: wrong token 401 UNAUTHORIZED, owner's token 201 (max_attempts 1 -> 2), replay 200; \
        second attempt ran; airlockctl retry extend: 2 -> 3, third attempt ran; \
        the task database is 600 airlock airlock and airlock-retry gets EACCES opening it"
            .to_owned(),
    )
}

fn stop_target(c: &Container) -> Result<String, String> {
    // The target is ordered after the services, so its stop job ends first;
    // PartOf= stops the services after it, in reverse start order (worker,
    // then supervisor), each within its TimeoutStopSec=.
    let t = Instant::now();
    c.sh_ok("systemctl stop airlock.target", 120 * SEC)?;
    let deadline = Instant::now() + 90 * SEC;
    loop {
        let st = states(c, ALL_UNITS)?;
        let running: Vec<String> = st
            .iter()
            .filter(|(_, s)| *s != "inactive" && *s != "failed")
            .map(|(u, s)| format!("{u} {s}"))
            .collect();
        if running.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("still {}", running.join(", ")));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let stopped = t.elapsed();
    let failed = c
        .sh(
            "systemctl list-units --state=failed --no-legend --plain 'airlock*'",
            10 * SEC,
        )?
        .stdout;
    if !failed.trim().is_empty() {
        return Err(format!("failed on stop: {failed}"));
    }
    no_airlock_process(c)?;
    Ok(format!(
        "every unit inactive {:.1}s after the stop began; no airlock process",
        stopped.as_secs_f64()
    ))
}

/// The packaged supervisor refuses a test authoriser, from the
/// configuration file and from the flag, with CONFIG_INVALID (exit 3).
fn no_test_switches(c: &Container) -> Result<String, String> {
    c.sh_ok(
        "mkdir -p /tmp/tb && printf '[supervisor]\\nauthorizer = \"allow-all-for-tests\"\\n' > /tmp/tb/allow-all.toml",
        10 * SEC,
    )?;
    let mut seen = Vec::new();
    for cmd in [
        "airlock-supervisor --check-config --config /tmp/tb/allow-all.toml",
        "airlock-supervisor --check-config --authorizer allow-all-for-tests",
    ] {
        let out = c.sh(cmd, 30 * SEC)?;
        if out.code != Some(3)
            || !out.both().contains("CONFIG_INVALID")
            || !out.both().contains("production build")
        {
            return Err(format!("{cmd}: {}\n{}", out.describe(), out.both()));
        }
        seen.push("exit 3 CONFIG_INVALID");
    }
    Ok(format!("config file and flag: {}", seen.join(", ")))
}

/// A warning `airlockctl doctor` may give on the testbed: the check's
/// name, a part of its detail, and why it is expected there.
struct ExpectedWarning {
    check: &'static str,
    detail: &'static str,
    reason: &'static str,
}

/// Every warning doctor may give on the freshly installed testbed (a
/// repository registered, the services started by the package). Any other
/// warning, and any failure, fails the check.
const DOCTOR_EXPECTED_WARNINGS: &[ExpectedWarning] = &[];

/// `airlockctl --json doctor`: `{"checks": [{check, status, detail, fix}],
/// "summary": {pass, warn, fail}}`, exit 0 when nothing fails. Every
/// warning must be in [`DOCTOR_EXPECTED_WARNINGS`].
fn doctor(c: &Container) -> Result<String, String> {
    judge_doctor(&c.sh("airlockctl --json doctor", 120 * SEC)?)
}

fn judge_doctor(out: &Out) -> Result<String, String> {
    let v =
        json(&out.stdout).map_err(|e| format!("airlockctl --json doctor: {e}\n{}", out.both()))?;
    let checks = v["checks"].as_array().cloned().unwrap_or_default();
    if checks.is_empty() {
        return Err(format!("doctor listed no checks:\n{}", out.both()));
    }
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let (mut problems, mut expected) = (Vec::new(), Vec::new());
    for ch in &checks {
        let status = ch["status"].as_str().unwrap_or("?");
        let name = ch["check"].as_str().unwrap_or("?");
        let detail = ch["detail"].as_str().unwrap_or_default();
        *counts.entry(status.to_owned()).or_default() += 1;
        match status {
            "pass" => {}
            "warn" => match DOCTOR_EXPECTED_WARNINGS
                .iter()
                .find(|w| w.check == name && detail.contains(w.detail))
            {
                Some(w) => expected.push(format!("warn {name}: {detail} (expected: {})", w.reason)),
                None => problems.push(format!(
                    "unexpected warning {name}: {detail} (fix: {})",
                    ch["fix"]
                )),
            },
            _ => problems.push(format!("{status} {name}: {detail} (fix: {})", ch["fix"])),
        }
    }
    for (status, key) in [("pass", "pass"), ("warn", "warn"), ("fail", "fail")] {
        let listed = counts.get(status).copied().unwrap_or(0);
        if v["summary"][key] != listed {
            problems.push(format!(
                "summary says {} {key}, the list has {listed}",
                v["summary"][key]
            ));
        }
    }
    if !out.ok() && problems.is_empty() {
        problems.push(format!("exit {} with nothing failing", out.describe()));
    }
    let counts: Vec<String> = counts.iter().map(|(k, n)| format!("{n} {k}")).collect();
    if !problems.is_empty() {
        return Err(format!(
            "airlockctl doctor ({}; {}):\n{}",
            out.describe(),
            counts.join(", "),
            problems.join("\n")
        ));
    }
    Ok(format!("{}\n{}", counts.join(", "), expected.join("\n"))
        .trim_end()
        .to_owned())
}

/// The agents the testbed configures: one that exits 1 at once (the crash
/// loop) and one that runs until stopped.
const AGENTS_TOML: &str = r#"
[[agent]]
name = "crashy"
command = ["/bin/sh", "-c", "exit 1"]
repositories = ["calc"]
description = "testbed: exits 1 at once"

[[agent]]
name = "steady"
command = ["/bin/sh", "-c", 'airlockctl --no-ask-password --json submit /opt/tb/steady.json > "$HOME/submit.out" 2>&1; echo $? > "$HOME/submit.rc"; sleep infinity & wait']
repositories = ["calc"]
description = "testbed: submits a task for calc, then runs until stopped, with a child"

[[agent]]
name = "submitter"
command = ["/bin/sh", "-c", 'airlockctl --no-ask-password --json submit /opt/tb/denied.json > "$HOME/submit.out" 2>&1; echo $? > "$HOME/submit.rc"; exec sleep infinity']
repositories = ["elsewhere"]
description = "testbed: submits a task for calc, which it may not propose for"

[[repository]]
name = "elsewhere"
path = "/srv/airlock/elsewhere.git"
"#;
const AGENT_UNITS: &[&str] = &[
    "airlock-agent@crashy.service",
    "airlock-agent@steady.service",
    "airlock-agent@submitter.service",
];

fn agent_view(c: &Container, name: &str) -> Result<Value, String> {
    json(&c.sh_ok(
        &format!("airlockctl --no-ask-password --json agent show {name}"),
        30 * SEC,
    )?)
}

/// Waits until the agent `name` is in `state`.
fn wait_agent(c: &Container, name: &str, state: &str, limit: Duration) -> Result<Value, String> {
    let deadline = Instant::now() + limit;
    loop {
        let v = agent_view(c, name)?;
        if v["state"] == state {
            return Ok(v);
        }
        if Instant::now() > deadline {
            return Err(format!("agent {name} is not {state} after {limit:?}: {v}"));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn unit_prop(c: &Container, unit: &str, prop: &str) -> Result<String, String> {
    Ok(c.sh_ok(
        &format!("systemctl show -p {prop} --value {unit}"),
        10 * SEC,
    )?
    .trim()
    .to_owned())
}

/// The processes in the agent unit's control group, as the kernel names
/// each process's cgroup (`/proc/PID/cgroup`): none once it is stopped.
fn cgroup_procs(c: &Container, unit: &str) -> Result<Vec<String>, String> {
    let out = c.sh_ok(
        &format!("python3 /tmp/tb/cgroup_procs.py {}", q(unit)),
        30 * SEC,
    )?;
    let v = json(&out)?;
    Ok(v.as_array()
        .map(|a| a.iter().map(|p| p.to_string()).collect())
        .unwrap_or_default())
}

/// Pids whose cgroup (v2) is the unit's, or below it.
const CGROUP_PROCS_PY: &str = r#"
import json, os, sys
unit = sys.argv[1]
found = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        lines = open(f"/proc/{pid}/cgroup").read().splitlines()
    except OSError:
        continue
    for line in lines:
        path = line.split(":", 2)[-1]
        parts = path.split("/")
        if unit in parts:
            found.append(int(pid))
            break
print(json.dumps(found))
"#;

/// Configures the two agents (a key file each) under the systemd driver
/// and restarts the supervisor.
fn configure_agents(c: &Container) -> Result<String, String> {
    c.write("/tmp/tb/agents.toml", AGENTS_TOML)?;
    c.write("/tmp/tb/cgroup_procs.py", CGROUP_PROCS_PY)?;
    c.sh_ok(
        "set -e
         mkdir -p /opt/tb
         python3 /tmp/tb/mktask.py tb-agent-steady nofix 1 /opt/tb/steady.json
         python3 /tmp/tb/mktask.py tb-agent-denied nofix 1 /opt/tb/denied.json
         chmod 755 /opt/tb && chmod 644 /opt/tb/*.json
         git init -q --bare /srv/airlock/elsewhere.git
         chown -R airlock-worker:airlock-worker /srv/airlock/elsewhere.git
         cp /etc/airlock/airlock.toml /tmp/tb/airlock.toml.before-agents
         cat /tmp/tb/agents.toml >> /etc/airlock/airlock.toml
         for a in crashy steady submitter; do install -m 0600 /dev/null /etc/airlock/agents/$a.key; done
         systemctl restart airlock.target",
        120 * SEC,
    )?;
    all_active(c, STARTED_BY_TARGET)?;
    all_active(c, &["airlock-supervisor.service"])?;
    let steady = wait_agent(c, "steady", "RUNNING", 60 * SEC)?;
    let active = unit_prop(c, "airlock-agent@steady.service", "ActiveState")?;
    let user = unit_prop(c, "airlock-agent@steady.service", "User")?;
    let procs = cgroup_procs(c, "airlock-agent@steady.service")?;
    if active != "active" || user != "airlock-agent" || procs.len() < 2 {
        return Err(format!(
            "steady: unit {active}, user {user:?}, cgroup {procs:?}; {steady}"
        ));
    }
    Ok(format!(
        "steady RUNNING as airlock-agent@steady.service ({active}, {} processes in its cgroup)",
        procs.len()
    ))
}

/// Submissions from an agent's unit are the agent's (systemd's
/// `GetUnitByPID`): steady's is allowed and recorded as `agent:steady`;
/// submitter's, for a repository it may not propose for, is refused with
/// AGENT_REPOSITORY_DENIED and nothing is queued; the same file submitted
/// by the same user outside any agent unit is a plain planner's.
fn agent_attribution(c: &Container) -> Result<String, String> {
    let deadline = Instant::now() + 60 * SEC;
    while !c
        .sh(
            "test -f /var/lib/airlock-agent/steady/submit.rc && test -f /var/lib/airlock-agent/submitter/submit.rc",
            10 * SEC,
        )?
        .ok()
    {
        if Instant::now() > deadline {
            return Err("the agents did not submit within 60 s".into());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let read = |f: &str| c.sh_ok(&format!("cat /var/lib/airlock-agent/{f}"), 10 * SEC);
    let (steady_rc, steady_out) = (read("steady/submit.rc")?, read("steady/submit.out")?);
    let (denied_rc, denied_out) = (read("submitter/submit.rc")?, read("submitter/submit.out")?);
    if steady_rc.trim() != "0" {
        return Err(format!("steady's submission failed: {steady_out}"));
    }
    if denied_rc.trim() == "0" || !denied_out.contains("AGENT_REPOSITORY_DENIED") {
        return Err(format!(
            "submitter's submission ({}): {denied_out}",
            denied_rc.trim()
        ));
    }
    let events = c.sh_ok("airlockctl --json events", 30 * SEC)?;
    let events: Vec<Value> = events
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect();
    let actor = |e: &Value| e["actor"]["name"].as_str().unwrap_or_default().to_owned();
    let submitted: Vec<String> = events
        .iter()
        .filter(|e| {
            e["action"] == "TASK_SUBMITTED"
                && e["outcome"] == "allowed"
                && e["task_id"] == "tb-agent-steady"
        })
        .map(actor)
        .collect();
    let refused: Vec<String> = events
        .iter()
        .filter(|e| e["code"] == "AGENT_REPOSITORY_DENIED")
        .map(actor)
        .collect();
    if submitted.is_empty() || !submitted.iter().all(|a| a.starts_with("agent:steady ")) {
        return Err(format!("tb-agent-steady submitted by {submitted:?}"));
    }
    if refused.len() != 1 || !refused[0].starts_with("agent:submitter ") {
        return Err(format!("AGENT_REPOSITORY_DENIED recorded for {refused:?}"));
    }
    let missing = c.sh("airlockctl --json show tb-agent-denied", 30 * SEC)?;
    if missing.ok() || !missing.stderr.contains("TASK_NOT_FOUND") {
        return Err(format!("the refused task: {}", missing.both()));
    }
    // The same user and file outside any agent unit: a plain planner.
    let plain = c.sh(
        "runuser -u airlock-agent -- airlockctl --no-ask-password --json submit /opt/tb/denied.json",
        60 * SEC,
    )?;
    if !plain.ok() {
        return Err(format!(
            "airlock-agent outside an agent unit: {}",
            plain.both()
        ));
    }
    Ok(format!(
        "steady's TASK_SUBMITTED by {:?}; submitter refused AGENT_REPOSITORY_DENIED as {:?}, nothing queued; the same submission by airlock-agent outside a unit accepted",
        submitted[0], refused[0]
    ))
}

/// The crash-looping agent is held after five failures, visibly.
fn crash_loop_held(c: &Container) -> Result<String, String> {
    let t = Instant::now();
    let v = wait_agent(c, "crashy", "HELD", 90 * SEC)?;
    let reason = v["hold_reason"].as_str().unwrap_or_default();
    // The fifth failure is a crash seen by a probe (exit status 1) or a
    // start whose unit had already failed by the time it was re-read.
    let status_1 = v["last_exit_status"] == 1
        || v["last_failure"]
            .as_str()
            .is_some_and(|f| f.contains("exited with status 1"));
    if v["consecutive_failures"] != 5 || !reason.contains("AGENTOS_CRASH_LOOP") || !status_1 {
        return Err(format!("held, but: {v}"));
    }
    let text = c.sh_ok("airlockctl --no-ask-password agent show crashy", 30 * SEC)?;
    if !text.contains("HELD") || !text.contains("AGENTOS_CRASH_LOOP") {
        return Err(format!("airlockctl agent show:\n{text}"));
    }
    // Nothing starts it while held: its unit stays down.
    let invocation = unit_prop(c, "airlock-agent@crashy.service", "InvocationID")?;
    std::thread::sleep(10 * SEC);
    let later = unit_prop(c, "airlock-agent@crashy.service", "InvocationID")?;
    let again = agent_view(c, "crashy")?;
    if later != invocation || again["state"] != "HELD" {
        return Err(format!(
            "started while held: invocation {invocation} then {later}; {again}"
        ));
    }
    let refused = c.sh(
        "airlockctl --no-ask-password --json agent start crashy",
        30 * SEC,
    )?;
    if refused.ok() || !refused.stderr.contains("AGENTOS_CRASH_LOOP") {
        return Err(format!("agent start while held: {}", refused.both()));
    }
    Ok(format!(
        "HELD after {:.1}s: 5 failures, the last: {}; {reason:?}; no start in 10 s; agent start refused with AGENTOS_CRASH_LOOP",
        t.elapsed().as_secs_f64(),
        v["last_failure"]
    ))
}

/// ClearHold starts it again: a new invocation of its unit, and (it still
/// exits 1) a new hold after five more failures.
fn clear_hold_restarts(c: &Container) -> Result<String, String> {
    let before = unit_prop(c, "airlock-agent@crashy.service", "InvocationID")?;
    let cleared = json(&c.sh_ok(
        "airlockctl --no-ask-password --json agent clear-hold crashy",
        30 * SEC,
    )?)?;
    if cleared["state"] == "HELD" || cleared["hold_reason"] != Value::Null {
        return Err(format!("after clear-hold: {cleared}"));
    }
    let deadline = Instant::now() + 30 * SEC;
    let after = loop {
        let now = unit_prop(c, "airlock-agent@crashy.service", "InvocationID")?;
        if !now.is_empty() && now != before {
            break now;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "no new invocation of the unit after clear-hold ({before})"
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let held = wait_agent(c, "crashy", "HELD", 90 * SEC)?;
    if held["consecutive_failures"] != 5 {
        return Err(format!("held again, but: {held}"));
    }
    Ok(format!(
        "clear-hold: {} with 0 failures; the unit ran again (invocation {before} → {after}); held again after 5 more failures",
        cleared["state"]
    ))
}

/// polkit lets user airlock manage its agent units and nothing else.
fn polkit_refuses_other_units(c: &Container) -> Result<String, String> {
    let call = |method: &str, unit: &str, mode: &str| {
        c.sh(
            &format!(
                "runuser -u airlock -- busctl --system call org.freedesktop.systemd1 /org/freedesktop/systemd1 \
                 org.freedesktop.systemd1.Manager {method} ss {} {mode}",
                q(unit)
            ),
            30 * SEC,
        )
    };
    let mut refused = Vec::new();
    let mut problems = Vec::new();
    let worker_pid = unit_prop(c, "airlock-worker.service", "MainPID")?;
    for (method, unit) in [
        ("StopUnit", "airlock-worker.service"),
        ("StartUnit", "systemd-hostnamed.service"),
        ("RestartUnit", "airlock-agent@steady.service"),
        ("StartUnit", "airlock-agent@Steady.service"),
        ("StartUnit", "airlock-agent@a.b.service"),
    ] {
        let out = call(method, unit, "replace")?;
        if out.ok() || !out.stderr.contains("Access denied") {
            problems.push(format!("{method} {unit}: {}", out.describe()));
        } else {
            refused.push(format!("{method} {unit}"));
        }
    }
    let kill = c.sh(
        "runuser -u airlock -- busctl --system call org.freedesktop.systemd1 /org/freedesktop/systemd1 \
         org.freedesktop.systemd1.Manager KillUnit ssi airlock-agent@steady.service all 9",
        30 * SEC,
    )?;
    if kill.ok() || !kill.stderr.contains("Access denied") {
        problems.push(format!(
            "KillUnit airlock-agent@steady.service: {}",
            kill.describe()
        ));
    } else {
        refused.push("KillUnit airlock-agent@steady.service".into());
    }
    if unit_prop(c, "airlock-worker.service", "MainPID")? != worker_pid {
        problems.push("the worker was restarted".into());
    }
    // The control: what the supervisor needs is allowed.
    let control = call("StartUnit", "airlock-agent@steady.service", "fail")?;
    if !control.ok() {
        problems.push(format!(
            "control: StartUnit airlock-agent@steady.service as airlock: {}",
            control.describe()
        ));
    }
    let reset = c.sh(
        "runuser -u airlock -- busctl --system call org.freedesktop.systemd1 /org/freedesktop/systemd1 \
         org.freedesktop.systemd1.Manager ResetFailedUnit s airlock-agent@crashy.service",
        30 * SEC,
    )?;
    if !reset.ok() {
        problems.push(format!(
            "control: ResetFailedUnit as airlock: {}",
            reset.describe()
        ));
    }
    if problems.is_empty() {
        Ok(format!(
            "refused (Access denied): {}; allowed: StartUnit and ResetFailedUnit of agent units",
            refused.join(", ")
        ))
    } else {
        Err(problems.join("\n"))
    }
}

/// A second supervisor cannot take the agents over: the bus name is held,
/// and it stops before touching any agent unit.
fn second_supervisor_refused(c: &Container) -> Result<String, String> {
    let unit = "airlock-agent@steady.service";
    let before = (
        unit_prop(c, unit, "InvocationID")?,
        unit_prop(c, unit, "MainPID")?,
    );
    let held = agent_view(c, "crashy")?;
    let out = c.sh(
        "runuser -u airlock -- timeout 60 /usr/bin/airlock-supervisor --config /etc/airlock/airlock.toml",
        90 * SEC,
    )?;
    if out.ok() || !out.both().contains("owned by another process") {
        return Err(format!(
            "a second supervisor: {}\n{}",
            out.describe(),
            tail(&out.both(), 20)
        ));
    }
    std::thread::sleep(2 * SEC);
    let after = (
        unit_prop(c, unit, "InvocationID")?,
        unit_prop(c, unit, "MainPID")?,
    );
    let held_after = agent_view(c, "crashy")?;
    if before != after || held_after["state"] != held["state"] {
        return Err(format!(
            "the agents changed: {before:?} → {after:?}; crashy {} → {}",
            held["state"], held_after["state"]
        ));
    }
    Ok(format!(
        "refused ({}): {}; steady's unit untouched (invocation and MainPID {})",
        out.describe(),
        tail(&out.both(), 1).trim(),
        before.1
    ))
}

/// Stopping airlock.target stops every agent: no process left in its
/// cgroup or of its user; a drain is no failure.
fn stop_target_stops_agents(c: &Container) -> Result<String, String> {
    let pid = unit_prop(c, "airlock-agent@steady.service", "MainPID")?;
    let before = cgroup_procs(c, "airlock-agent@steady.service")?;
    // systemctl returns once the target's own job is done; the services
    // and agents stop after it (PartOf=, BindsTo=): wait for all of them.
    c.sh_ok("systemctl stop airlock.target", 120 * SEC)?;
    let units: Vec<&str> = ALL_UNITS.iter().chain(AGENT_UNITS).copied().collect();
    let deadline = Instant::now() + 90 * SEC;
    loop {
        let st = states(c, &units)?;
        if st.values().all(|s| s == "inactive" || s == "failed") {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("after the stop: {st:?}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let left = cgroup_procs(c, "airlock-agent@steady.service")?;
    if !left.is_empty() {
        return Err(format!("left in steady's cgroup: {left:?}"));
    }
    let agent_procs: Vec<Value> = airlock_processes(c)?
        .into_iter()
        .filter(|p| p["user"] == "airlock-agent")
        .collect();
    if !agent_procs.is_empty() {
        return Err(format!("processes of airlock-agent: {agent_procs:?}"));
    }
    c.sh_ok("systemctl start airlock.target", 120 * SEC)?;
    all_active(c, STARTED_BY_TARGET)?;
    let steady = wait_agent(c, "steady", "RUNNING", 60 * SEC)?;
    if steady["consecutive_failures"] != 0 {
        return Err(format!("the drain counted as a failure: {steady}"));
    }
    let crashy = agent_view(c, "crashy")?;
    if crashy["state"] != "HELD" {
        return Err(format!("the hold did not survive the restart: {crashy}"));
    }
    Ok(format!(
        "steady (pid {pid}, {} processes) gone, its cgroup empty, no airlock-agent process; after a start: steady RUNNING with 0 failures, crashy still HELD",
        before.len()
    ))
}

/// Removes the agents again, so the checks after these see the suite
/// as it was.
fn remove_agents(c: &Container) -> Result<String, String> {
    c.sh_ok(
        "cp /tmp/tb/airlock.toml.before-agents /etc/airlock/airlock.toml && \
         rm -f /etc/airlock/agents/crashy.key /etc/airlock/agents/steady.key /etc/airlock/agents/submitter.key && \
         systemctl restart airlock.target && \
         { systemctl stop 'airlock-agent@*.service'; systemctl reset-failed 'airlock-agent@*.service'; true; }",
        120 * SEC,
    )?;
    all_active(c, STARTED_BY_TARGET)
}

/// The agent checks (issue 12): the systemd driver, polkit, single writer
/// and no residency.
fn agent_checks(r: &mut Report, c: &Container) {
    let Some(_) = r.check(
        "agents: two [[agent]]s under the systemd driver; steady RUNNING in airlock-agent@steady.service",
        |_| configure_agents(c),
    ) else {
        let _ = r.check("agents: removed again", |_| remove_agents(c));
        return;
    };
    r.check(
        "agents: a submission from an agent's unit is the agent's (GetUnitByPID), limited to its repositories",
        |_| agent_attribution(c),
    );
    r.check(
        "agents: doctor names exactly the properties a drop-in weakens on a running agent unit",
        |_| crate::hardening::doctor_names_a_weakened_agent(c, "airlock-agent@steady.service"),
    );
    r.check(
        "agents: the crash-looping agent is HELD after 5 failures (AGENTOS_CRASH_LOOP in agent show), nothing restarts it",
        |_| crash_loop_held(c),
    );
    r.check("agents: clear-hold restarts it", |_| clear_hold_restarts(c));
    r.check(
        "agents: polkit refuses user airlock every other unit and verb",
        |_| polkit_refuses_other_units(c),
    );
    r.check(
        "agents: a second supervisor cannot take over the agents (bus name held)",
        |_| second_supervisor_refused(c),
    );
    r.check(
        "agents: systemctl stop airlock.target leaves no agent process (cgroup empty); a drain is no failure",
        |_| stop_target_stops_agents(c),
    );
    r.check("agents: removed again", |_| remove_agents(c));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(code: i32, stdout: &str, stderr: &str) -> Out {
        Out {
            code: Some(code),
            stdout: stdout.to_owned(),
            stderr: stderr.to_owned(),
            timed_out: false,
        }
    }

    #[test]
    fn a_refusal_of_another_code_of_the_class_fails() {
        let want = &INTERACTIVE_AUTHORIZATION_REQUIRED;
        let action = "org.airlock.tasks.submit";
        let right = format!(
            r#"{{"error":{{"code":"{}","dbus_error":"{}","message":"{action} requires interactive authentication","exit_code":11}}}}"#,
            want.code, want.dbus_error
        );
        assert!(expect_refusal(&out(11, "", &right), want, action).is_ok());
        let unavailable = r#"{"error":{"code":"AUTHORITY_UNAVAILABLE","dbus_error":"org.airlock.Error.AUTHORITY_UNAVAILABLE","message":"polkit could not decide org.airlock.tasks.submit","exit_code":5}}"#;
        assert!(expect_refusal(&out(5, "", unavailable), want, action).is_err());
        // The right code for another action is not the refusal asked about.
        assert!(expect_refusal(&out(11, "", &right), want, "org.airlock.tasks.manage").is_err());
    }

    #[test]
    fn enoent_counts_only_for_a_path_root_sees() {
        let all: BTreeMap<String, String> = SECRETS
            .iter()
            .map(|p| ((*p).to_owned(), "exists".to_owned()))
            .collect();
        assert!(judge_unreachable(|_| "EACCES".into(), &all).is_ok());
        assert!(judge_unreachable(|_| "ENOENT".into(), &all).is_ok());
        let mut one_absent = all.clone();
        one_absent.insert("/root".into(), "ENOENT".into());
        assert!(judge_unreachable(|_| "ENOENT".into(), &one_absent).is_err());
        let root_readable = |p: &str| if p == "/root" { "readable" } else { "EACCES" }.to_owned();
        assert!(judge_unreachable(root_readable, &all).is_err());
        assert!(judge_unreachable(|_| "ELOOP".into(), &all).is_err());
    }

    #[test]
    fn a_doctor_warning_off_the_list_fails() {
        let pass = r#"{"checks":[{"check":"seccomp","status":"pass","detail":"","fix":null}],"summary":{"pass":1,"warn":0,"fail":0}}"#;
        assert!(judge_doctor(&out(0, pass, "")).is_ok());
        let warn = r#"{"checks":[{"check":"seccomp","status":"pass","detail":"","fix":null},{"check":"airlock-retryd.service","status":"warn","detail":"not running (inactive)","fix":null}],"summary":{"pass":1,"warn":1,"fail":0}}"#;
        assert!(judge_doctor(&out(0, warn, "")).is_err());
        let miscounted = r#"{"checks":[{"check":"seccomp","status":"pass","detail":"","fix":null}],"summary":{"pass":2,"warn":0,"fail":0}}"#;
        assert!(judge_doctor(&out(0, miscounted, "")).is_err());
        assert!(judge_doctor(&out(1, pass, "")).is_err());
    }
}

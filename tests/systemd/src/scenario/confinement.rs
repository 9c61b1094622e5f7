//! Confinement as the kernel shows it: the secret paths a sandboxed
//! command must not reach (denied or hidden), each daemon's own lockdown,
//! the executor's status and namespace.

use super::authz::{INTERACTIVE_AUTHORIZATION_REQUIRED, denial_audited, expect_refusal};
use super::status::{all_active, show, wait_state};
use super::{SEC, json, q};
use crate::{Container, Report};
use std::collections::BTreeMap;

/// The live daemons' confinement, as the kernel shows it.
pub(super) fn checks(r: &mut Report, c: &Container) {
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
}

/// Files a verification command, the executor or its user must not read.
pub(super) const SECRETS: &[&str] = &[
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

/// Runs as a verification command inside the executor's sandbox. It tries
/// each path and prints, on one stdout line after [`PROBE_MARKER`], what
/// happened to each (`lstat` and the read, `readable` or the errno name);
/// the line reaches the executor's result bundle (`stdout_tail`), where
/// the testbed reads it. The command fails if any path is readable or
/// fails otherwise than with EACCES, EPERM or ENOENT.
pub(super) const TEST_PROBE_PY: &str = r#"
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
pub(super) const PROBE_MARKER: &str = "AIRLOCK-TESTBED-PROBE ";

/// Finds the probe's report in the executor's result bundles (run as root
/// in the container): `[{file, sha256, report}]`.
pub(super) const PROBE_REPORT_PY: &str = r#"
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
pub(super) const EXISTS_PY: &str = r#"
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
pub(super) const PROBE_PATHS_PY: &str = r#"
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

/// What root sees of the secret paths (`secrets_on_host`).
pub(super) struct Host(pub(super) BTreeMap<String, String>);

impl crate::Detail for Host {
    fn detail(&self) -> String {
        format!("{} paths present: {}", self.0.len(), SECRETS.join(", "))
    }
}

/// `lstat` of every secret path as root in the container, outside any
/// sandbox; each must exist, so that ENOENT inside a sandbox means hidden,
/// not absent. `/run/credentials/airlock-retryd.service` exists while
/// airlock-retryd runs, so it is started first (socket activation).
pub(super) fn secrets_on_host(c: &Container) -> Result<BTreeMap<String, String>, String> {
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
pub(super) fn sandbox_probe(
    c: &Container,
    host_before: &BTreeMap<String, String>,
) -> Result<String, String> {
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
        "pid=$(systemctl show -p MainPID --value airlock-executor.service); cat /proc/$pid/status; getent group airlock-egress | cut -d: -f3; getent group airlock-exchange | cut -d: -f3; id -u airlock-exec",
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
    let egress_gid = tail_lines.next().unwrap_or("").trim().to_owned();
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
    // Its group is the exchange group (Group=); its one supplementary
    // group beside it is airlock-egress (sysusers), whose socket its
    // setups' forwarder connects to.
    let shown_groups = field("Groups");
    let mut groups: Vec<&str> = shown_groups.split_whitespace().collect();
    groups.sort_unstable();
    let mut want = vec![gid.as_str(), egress_gid.as_str()];
    want.sort_unstable();
    if field("Gid").split_whitespace().any(|g| g != gid) || groups != want {
        problems.push(format!(
            "Gid {}, Groups {} (airlock-exchange is {gid}, airlock-egress {egress_gid})",
            field("Gid"),
            field("Groups")
        ));
    }
    if problems.is_empty() {
        Ok(format!(
            "NoNewPrivs 1, Seccomp 2 ({} filters), every capability set 0, uid {uid}, group {gid} and airlock-egress {egress_gid} only",
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

#[cfg(test)]
mod tests {
    use super::*;

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
}

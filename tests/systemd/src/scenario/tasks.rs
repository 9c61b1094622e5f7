//! Tasks end to end: the demo task by root, the watchdog restarting a
//! wedged worker, airlock-agent's own repository and its MCP client, the
//! owner's retry extension over HTTP.

use super::authz::UNAUTHORIZED;
use super::status::{all_active, main_pids, show, wait_state};
use super::{REPO, SEC, STARTED_BY_TARGET, json, q};
use crate::Container;
use std::path::Path;
use std::time::Instant;

/// airlock-agent submits a task without a password (the polkit rule).
pub(super) fn agent_submits(c: &Container) -> Result<String, String> {
    c.sh_ok(
        "python3 /tmp/tb/mktask.py tb-probe probe 1 /tmp/tb/probe.json",
        30 * SEC,
    )?;
    let out = c.sh(
        "runuser -u airlock-agent -- airlockctl --no-ask-password --json submit /tmp/tb/probe.json",
        60 * SEC,
    )?;
    let out = out.expect_ok("airlockctl submit as airlock-agent")?;
    let v = json(&out.stdout)?;
    Ok(format!("tb-probe {}", v["task"]["state"]))
}

/// Helper programs run inside the container (python3 is in the root).
pub(super) const MKTASK_PY: &str = r#"
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

/// The owner's retry extension over HTTP, with a wrong token and then the
/// right one.
pub(super) const RETRY_PY: &str = r#"
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

pub(super) fn demo_task(c: &Container) -> Result<String, String> {
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

/// Issue 14: the worker's watchdog, with the worker's fault build made
/// once for every release's run (`hardening::fault_worker`).
pub(super) fn wedged_worker(c: &Container, fault: Option<&Path>) -> Result<String, String> {
    let fault = fault.ok_or("no fault build of the worker (its check failed)")?;
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
    crate::hardening::watchdog_restarts_a_wedged_worker(c, fault, submit, settle)
}

/// The README's "use it on your own repository", on the installed package:
/// `repo add` (which reloads the units through systemd), a clone and a
/// `propose --worktree` as airlock-agent, the admin's decision.
pub(super) fn own_repository(c: &Container) -> Result<String, String> {
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
pub(super) fn mcp_agent(c: &Container) -> Result<String, String> {
    c.write("/tmp/tb/mcp_agent.py", include_str!("../mcp_agent.py"))?;
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

pub(super) fn retry_extension(c: &Container) -> Result<String, String> {
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

/// A repository with an upstream and signed commits under the packaged
/// units: `repo add --upstream … --signing-key`, the worker restarted by
/// systemd to receive the key (LoadCredential=, from a root-only file it
/// cannot read itself), the first sync, a proposal published to the
/// upstream once, signed; `git verify-commit` (the host's) passes.
pub(super) fn upstream_publication(c: &Container) -> Result<String, String> {
    let scratch = tempfile::tempdir().map_err(|e| e.to_string())?;
    let key = scratch.path().join("signing");
    let keygen = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "testbed", "-f"])
        .arg(&key)
        .status()
        .map_err(|e| format!("ssh-keygen: {e}"))?;
    if !keygen.success() {
        return Err("ssh-keygen failed".into());
    }
    let private = std::fs::read_to_string(&key).map_err(|e| e.to_string())?;
    c.write("/root/tb-signing", &private)?;
    c.write(
        "/root/tb-upstream.patch",
        "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n",
    )?;
    let added = c.sh_ok(
        r#"set -e
chmod 600 /root/tb-signing
rm -rf /srv/team && mkdir -p /srv/team
git init -q --bare -b main /srv/team/calc.git
work=$(mktemp -d) && cd "$work"
printf 'def add(a, b):\n    return a - b\n' > calc.py
printf 'import unittest\nfrom calc import add\n\nclass T(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n' > test_calc.py
git init -q -b main . && git add -A
git -c user.name=team -c user.email=team@testbed.invalid commit -q -m calc
git push -q /srv/team/calc.git main
git --git-dir=/srv/team/calc.git config core.logAllRefUpdates always
chown -R airlock-worker:airlock-worker /srv/team/calc.git
airlockctl --json repo add teamcalc --upstream /srv/team/calc.git --signing-key /root/tb-signing --signer agent@testbed.invalid
"#,
        180 * SEC,
    )?;
    let reply = json(added.lines().last().unwrap_or_default())?;
    if reply["worker_restarted"] != true {
        return Err(format!("repo add did not restart the worker: {reply}"));
    }
    let unit = c.sh_ok(
        "cat /etc/systemd/system/airlock-worker.service.d/upstream-teamcalc.conf; stat -c '%U %a' /etc/airlock/credentials /etc/airlock/credentials/signing-teamcalc",
        30 * SEC,
    )?;
    if !unit.contains("LoadCredential=signing-teamcalc:/etc/airlock/credentials/signing-teamcalc")
        || !unit.contains("root 700")
        || !unit.contains("root 600")
    {
        return Err(format!(
            "the worker's drop-in or the credential's mode: {unit}"
        ));
    }
    let own_read = c.sh(
        "runuser -u airlock-worker -- cat /etc/airlock/credentials/signing-teamcalc",
        30 * SEC,
    )?;
    if own_read.code == Some(0) {
        return Err(
            "airlock-worker reads the credential file itself (it must come from systemd)".into(),
        );
    }
    // The first sync, at the worker's start.
    let mut synced = serde_json::Value::Null;
    for _ in 0..60 {
        synced = json(&c.sh_ok("airlockctl --json repo show teamcalc", 30 * SEC)?)?;
        if synced["last_sync"]["code"].is_null() && synced["branches"].to_string().contains("main")
        {
            break;
        }
        std::thread::sleep(SEC);
    }
    if !synced["branches"].to_string().contains("main") {
        return Err(format!("no sync from the upstream: {synced}"));
    }
    c.sh_ok(
        "airlockctl --json propose --repo teamcalc --base main --patch /root/tb-upstream.patch --verify 'python3 -m unittest -q' --max-attempts 1 --task-id tb-upstream",
        120 * SEC,
    )?;
    let task = wait_state(
        c,
        "tb-upstream",
        &["VERIFYING", "SUCCEEDED", "FAILED"],
        180 * SEC,
    )?;
    if task["state"] == "VERIFYING" {
        c.sh_ok(
            "airlockctl verify tb-upstream accept --reason 'testbed: published'",
            60 * SEC,
        )?;
    }
    let task = wait_state(c, "tb-upstream", &["SUCCEEDED", "FAILED"], 60 * SEC)?;
    let result = &task["result"];
    let commit = result["commit_oid"].as_str().unwrap_or_default().to_owned();
    if task["state"] != "SUCCEEDED" || result["publication"]["pushed"] != true {
        return Err(format!("tb-upstream: {task}"));
    }
    if result["signature"]["principal"] != "agent@testbed.invalid" {
        return Err(format!("no signature in the result: {result}"));
    }
    let remote = c.sh_ok(
        "git --git-dir=/srv/team/calc.git rev-parse refs/heads/agent/tb-upstream; git --git-dir=/srv/team/calc.git reflog show --format=%H refs/heads/agent/tb-upstream | wc -l",
        30 * SEC,
    )?;
    let mut lines = remote.lines();
    if lines.next() != Some(commit.as_str()) || lines.next().map(str::trim) != Some("1") {
        return Err(format!(
            "the upstream's agent branch: {remote} (expected {commit}, updated once)"
        ));
    }
    let signer = std::fs::read_to_string(key.with_extension("pub")).map_err(|e| e.to_string())?;
    let public: Vec<&str> = signer.split(' ').take(2).collect();
    let allowed = scratch.path().join("allowed_signers");
    std::fs::write(
        &allowed,
        format!(
            "agent@testbed.invalid namespaces=\"git\" {}\n",
            public.join(" ")
        ),
    )
    .map_err(|e| e.to_string())?;
    let verified = std::process::Command::new("git")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .arg("-c")
        .arg(format!("gpg.ssh.allowedSignersFile={}", allowed.display()))
        .args(["-c", "safe.directory=*", "--git-dir"])
        .arg(c.host_path("/srv/team/calc.git"))
        .args(["verify-commit", &commit])
        .output()
        .map_err(|e| e.to_string())?;
    if !verified.status.success() {
        return Err(format!(
            "git verify-commit {commit}: {}",
            String::from_utf8_lossy(&verified.stderr)
        ));
    }
    // doctor expects the drop-in repo add wrote (its own directives).
    let doctor = json(&c.sh("airlockctl --json doctor", 120 * SEC)?.stdout)?;
    let failed: Vec<String> = doctor["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["status"] == "fail" && c["unit"] == "airlock-worker.service")
        .map(|c| c["check"].to_string())
        .collect();
    if !failed.is_empty() {
        return Err(format!(
            "doctor fails the worker with the upstream's own drop-in: {failed:?}"
        ));
    }
    // repo remove takes the credential and the drop-in away again.
    c.sh_ok("airlockctl repo remove teamcalc --purge", 120 * SEC)?;
    let left = c.sh(
        "ls /etc/airlock/credentials/signing-teamcalc /etc/systemd/system/airlock-worker.service.d/upstream-teamcalc.conf 2>/dev/null",
        30 * SEC,
    )?;
    if !left.stdout.trim().is_empty() {
        return Err(format!("repo remove left {}", left.stdout.trim()));
    }
    Ok(format!(
        "synced, published {commit} once to /srv/team/calc.git, signed as agent@testbed.invalid (key by LoadCredential=); doctor accepts its drop-in; repo remove took key and drop-in away"
    ))
}

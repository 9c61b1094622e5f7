//! Repositories that follow the team's remote and publish agent branches to
//! it, with real servers: a local-path upstream (git's file protocol) and an
//! OpenSSH server on a loopback port serving bare repositories to key
//! authentication only (Debian's openssh-server, started by the test).
//!
//! - A commit the team pushes to the upstream's main is synced into the
//!   authority repository; a proposal on it lands; its agent branch
//!   appears on the upstream once, at the same commit as here; the commit
//!   is signed and `git verify-commit` with the allowed signers passes.
//! - Over ssh, with a deploy key and the pinned host key: the same.
//! - A wrong deploy key syncs nothing and records UPSTREAM_AUTH_FAILED; a
//!   changed host key records UPSTREAM_HOST_KEY_CHANGED.
//! - The deploy key is unreadable to every other airlock uid, and no byte
//!   of it, or of the signing key, is in the task database, the journal,
//!   the spool, the events or the logs.

use airlock_testkit::{git, git_dir, ssh_keygen, sshd};
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const FIX: &str = "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n";
const VERIFY: &str = "python3 -m unittest -q";

/// The team's upstream (bare) and a member's clone, with a failing test.
fn team(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let upstream = dir.join(format!("{name}-upstream.git"));
    let work = dir.join(format!("{name}-work"));
    git(
        dir,
        &[
            "init",
            "-q",
            "--bare",
            "-b",
            "main",
            upstream.to_str().unwrap(),
        ],
    );
    git(
        dir,
        &[
            "clone",
            "-q",
            upstream.to_str().unwrap(),
            work.to_str().unwrap(),
        ],
    );
    std::fs::write(work.join("calc.py"), "def add(a, b):\n    return a - b\n").unwrap();
    std::fs::write(
        work.join("test_calc.py"),
        "import unittest\nfrom calc import add\n\nclass T(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n",
    )
    .unwrap();
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "-q", "-m", "calc"]);
    git(&work, &["push", "-q", "origin", "main"]);
    (upstream, work)
}

/// Gives `path` to `uid` (the worker pushes to a local upstream as itself).
fn chown_tree(path: &Path, uid: u32) {
    let st = std::process::Command::new("chown")
        .arg("-R")
        .arg(format!("{uid}:{uid}"))
        .arg(path)
        .status()
        .unwrap();
    assert!(st.success());
}

/// git as the team, trusting repositories another uid owns (the worker's):
/// a global configuration of its own, as `-c` does not reach the local
/// receive-pack git starts.
fn team_git(dir: &Path, args: &[&str]) -> String {
    let global = dir.parent().unwrap().join("team.gitconfig");
    std::fs::write(&global, "[safe]\n\tdirectory = *\n").unwrap();
    airlock_testkit::git_with_global(dir, &global, args)
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn propose(bus: &str, cfg: &str, repo: &str) -> Value {
    let ctl = airlock_local::sibling("airlockctl").unwrap();
    airlock_testkit::propose_patch(&ctl, bus, cfg, repo, VERIFY, FIX)
}

/// airlockctl's output (stdout) for `args`, which must succeed.
fn ctl_json(bus: &str, args: &[&str]) -> String {
    let ctl = airlock_local::sibling("airlockctl").unwrap();
    let out = std::process::Command::new(ctl)
        .env("DBUS_SYSTEM_BUS_ADDRESS", bus)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The task once terminal (within a minute).
fn wait_terminal(client: &airlock_local::client::Supervisor, task: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v = client.get_task(task).unwrap();
        if v.state.is_terminal() {
            return serde_json::to_value(&v).unwrap();
        }
        assert!(Instant::now() < deadline, "{task} is still {:?}", v.state);
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn sync_state(state: &Path, repo: &str) -> Option<Value> {
    let text = std::fs::read_to_string(state.join(format!("worker/upstream/{repo}.json"))).ok()?;
    serde_json::from_str(&text).ok()
}

fn upstream_of(url: &str, sync_seconds: u32, host_keys: Vec<String>) -> airlock_config::Upstream {
    airlock_config::Upstream {
        sync_interval_seconds: sync_seconds,
        host_keys,
        timeout_seconds: 20,
        ..airlock_config::Upstream::at(url)
    }
}

/// Every regular file under `dir` (but `skip`), as bytes.
fn files_under(dir: &Path, skip: &Path, out: &mut Vec<(PathBuf, Vec<u8>)>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.starts_with(skip) {
            continue;
        }
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            files_under(&path, skip, out);
        } else if meta.is_file() {
            if let Ok(bytes) = std::fs::read(&path) {
                out.push((path, bytes));
            }
        }
    }
}

/// `cat FILE` as `id` with no supplementary group (util-linux setpriv).
fn read_as(id: airlock_local::layout::Id, file: &Path) -> std::process::Output {
    std::process::Command::new("setpriv")
        .arg(format!("--reuid={}", id.uid))
        .arg(format!("--regid={}", id.gid))
        .arg("--clear-groups")
        .arg("cat")
        .arg(file)
        .output()
        .unwrap()
}

#[test]
fn upstreams_are_followed_and_published_to_exactly_once() {
    let scratch = tempfile::tempdir().unwrap();
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let dir = scratch.path();
    let state = dir.join("state");
    let ids = airlock_local::layout::Ids::for_caller().unwrap();
    assert!(ids.separated, "run as root: the worker needs its own uid");

    // A local-path upstream, signed commits.
    let (local_up, local_work) = team(dir, "local");
    chown_tree(&local_up, ids.worker.uid);
    let signing_key = dir.join("signing");
    ssh_keygen(&signing_key);

    // An ssh upstream: sshd as root, the deploy key admitted.
    let deploy = dir.join("deploy");
    let deploy_public = ssh_keygen(&deploy);
    let wrong = dir.join("wrong");
    ssh_keygen(&wrong);
    let mut server = sshd(&dir.join("sshd"), &[&deploy_public]);
    let (ssh_up, ssh_work) = team(dir, "ssh");
    let ssh_url = format!("ssh://root@127.0.0.1:{}{}", server.port, ssh_up.display());
    // The same server under a host key it does not have.
    let other_host = dir.join("other-host");
    let other_public = ssh_keygen(&other_host);
    let mut parts = other_public.split(' ');
    let forged = format!(
        "[127.0.0.1]:{} {} {}",
        server.port,
        parts.next().unwrap(),
        parts.next().unwrap()
    );

    let suite = airlock_local::start_with(
        state.clone(),
        true,
        &airlock_local::Tuning {
            upstreams: vec![
                airlock_local::LocalUpstream {
                    name: "local".into(),
                    upstream: upstream_of(local_up.to_str().unwrap(), 1, vec![]),
                    credential: None,
                    signing: Some(("agent@example.org".into(), signing_key.clone())),
                },
                airlock_local::LocalUpstream {
                    name: "viassh".into(),
                    upstream: upstream_of(&ssh_url, 0, vec![server.known_hosts.clone()]),
                    credential: Some(deploy.clone()),
                    signing: None,
                },
                airlock_local::LocalUpstream {
                    name: "wrongkey".into(),
                    upstream: upstream_of(&ssh_url, 0, vec![server.known_hosts.clone()]),
                    credential: Some(wrong.clone()),
                    signing: None,
                },
                airlock_local::LocalUpstream {
                    name: "hostkey".into(),
                    upstream: upstream_of(&ssh_url, 0, vec![forged]),
                    credential: Some(deploy.clone()),
                    signing: None,
                },
            ],
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("starting airlock-local: {e}"));
    let bus = suite.bus.address().to_owned();
    let config = suite.layout.config();
    let cfg = config.to_str().unwrap();
    let authority = |name: &str| state.join(format!("repos/{name}.git"));
    let logs = || std::fs::read_to_string(state.join("logs/worker.log")).unwrap_or_default();

    // The first syncs at start: the team's main is here.
    let team_main = git(&local_work, &["rev-parse", "HEAD"]);
    wait_until("the first sync of local", Duration::from_secs(30), || {
        sync_state(&state, "local").is_some_and(|s| s["code"].is_null())
    });
    assert_eq!(
        git_dir(&authority("local"), &["rev-parse", "refs/heads/main"]),
        team_main
    );

    // The team moves main on; the schedule (1 s) follows it.
    std::fs::write(local_work.join("NOTES.md"), "team work\n").unwrap();
    git(&local_work, &["add", "-A"]);
    git(&local_work, &["commit", "-q", "-m", "team work"]);
    team_git(&local_work, &["push", "-q", "origin", "main"]);
    let moved = git(&local_work, &["rev-parse", "HEAD"]);
    wait_until(
        "the schedule to follow main",
        Duration::from_secs(30),
        || git_dir(&authority("local"), &["rev-parse", "refs/heads/main"]) == moved,
    );

    // A proposal on it lands, and is published once at the same commit.
    let task = propose(&bus, cfg, "local");
    assert_eq!(task["state"], "SUCCEEDED", "{task}\n{}", logs());
    let commit = task["result"]["commit_oid"].as_str().unwrap().to_owned();
    let branch = task["result"]["target_branch"].as_str().unwrap().to_owned();
    let publication = &task["result"]["publication"];
    assert_eq!(publication["pushed"], true, "{task}");
    assert_eq!(publication["commit_oid"], commit.as_str());
    assert_eq!(
        git_dir(&local_up, &["rev-parse", &format!("refs/heads/{branch}")]),
        commit
    );
    assert_eq!(
        git_dir(
            &authority("local"),
            &["rev-parse", &format!("refs/heads/{branch}")]
        ),
        commit
    );
    assert_eq!(
        git_dir(&authority("local"), &["rev-parse", &format!("{commit}^")]),
        moved,
        "planned on the synced main"
    );
    // Signed, verifiably, by the principal shown in the result.
    let signature = &task["result"]["signature"];
    assert_eq!(signature["principal"], "agent@example.org", "{task}");
    let signer = airlock_git::Signer::load(&signing_key, "agent@example.org").unwrap();
    assert_eq!(signature["fingerprint"], signer.fingerprint().as_str());
    let verified =
        airlock_testkit::verify_commit(&local_up, dir, &signer.allowed_signers_line(), &commit);
    assert!(
        verified.status.success(),
        "{}",
        String::from_utf8_lossy(&verified.stderr)
    );
    // The publication is in the task's events, with the upstream's answer.
    let events = ctl_json(
        &bus,
        &["--json", "events", task["task_id"].as_str().unwrap()],
    );
    assert!(events.contains("TASK_PUBLISHED"), "{events}");

    // The team rewrites main (a force-push) and moves the agent branch
    // upstream: a sync follows main, records the rewrite in the events, and
    // the agent branch here stays the worker's.
    team_git(&local_work, &["reset", "-q", "--hard", &team_main]);
    std::fs::write(local_work.join("REWRITTEN.md"), "history rewritten\n").unwrap();
    git(&local_work, &["add", "-A"]);
    git(&local_work, &["commit", "-q", "-m", "rewritten"]);
    let rewritten = git(&local_work, &["rev-parse", "HEAD"]);
    team_git(&local_work, &["push", "-q", "-f", "origin", "main"]);
    team_git(
        &local_work,
        &[
            "push",
            "-q",
            "-f",
            "origin",
            &format!("HEAD:refs/heads/{branch}"),
        ],
    );
    let ctl = airlock_local::sibling("airlockctl").unwrap();
    let out = std::process::Command::new(&ctl)
        .args([
            "--json", "repo", "--config", cfg, "sync", "local", "--wait", "60",
        ])
        .output()
        .unwrap();
    let synced: Value = airlock_testkit::last_json(&out);
    assert!(
        out.status.success(),
        "{synced}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(synced["code"].is_null(), "{synced}");
    assert_eq!(
        git_dir(&authority("local"), &["rev-parse", "refs/heads/main"]),
        rewritten
    );
    assert_eq!(
        git_dir(
            &authority("local"),
            &["rev-parse", &format!("refs/heads/{branch}")]
        ),
        commit,
        "a sync never moves an agent branch"
    );
    let events = ctl_json(&bus, &["--json", "events"]);
    assert!(
        events
            .lines()
            .any(|l| l.contains("UPSTREAM_REF_REWRITTEN") && l.contains("refs/heads/main")),
        "{events}"
    );
    let shown = std::process::Command::new(&ctl)
        .args(["--json", "repo", "--config", cfg, "show", "local"])
        .output()
        .unwrap();
    let shown = airlock_testkit::last_json(&shown);
    assert_eq!(shown["upstream"]["url"], local_up.to_str().unwrap());
    assert!(
        shown["last_sync"]["finished_at_ms"].as_u64().is_some(),
        "{shown}"
    );

    // Over ssh with the deploy key and the pinned host key.
    wait_until("the first sync over ssh", Duration::from_secs(30), || {
        sync_state(&state, "viassh").is_some()
    });
    let s = sync_state(&state, "viassh").unwrap();
    assert!(s["code"].is_null(), "{s}\n{}", logs());
    let task = propose(&bus, cfg, "viassh");
    assert_eq!(task["state"], "SUCCEEDED", "{task}\n{}", logs());
    let commit = task["result"]["commit_oid"].as_str().unwrap();
    let branch = task["result"]["target_branch"].as_str().unwrap();
    assert_eq!(
        git_dir(&ssh_up, &["rev-parse", &format!("refs/heads/{branch}")]),
        commit
    );
    assert_eq!(task["result"]["publication"]["pushed"], true);

    // A base the worker has not fetched yet (the planner saw it upstream;
    // viassh syncs only at start and on request): synced before the task.
    std::fs::write(ssh_work.join("LATER.md"), "later\n").unwrap();
    git(&ssh_work, &["add", "-A"]);
    git(&ssh_work, &["commit", "-q", "-m", "later"]);
    git(&ssh_work, &["push", "-q", "origin", "main"]);
    let later = git(&ssh_work, &["rev-parse", "HEAD"]);
    let client = airlock_local::client::Supervisor::connect(Some(&bus)).unwrap();
    let mut submission = airlock_local::client::task_on_demo(
        "task-later",
        &later,
        1,
        serde_json::json!({"operation": "write_file", "path": "later.txt", "content": "x\n"}),
        serde_json::json!([{"label": "check", "argv": ["/bin/true"], "timeout_seconds": 30}]),
    );
    submission["binding"]["repository"] = "viassh".into();
    client.submit_task(&submission).unwrap();
    let later_task = wait_terminal(&client, "task-later");
    assert_eq!(later_task["state"], "SUCCEEDED", "{later_task}\n{}", logs());
    assert!(logs().contains("the task's base is not here yet: syncing first"));

    // The upstream unreachable when the task publishes: the publication
    // waits (TASK_PUBLICATION_PENDING in its events) and lands when the
    // upstream is back.
    server.stop();
    let ctl_bin = airlock_local::sibling("airlockctl").unwrap();
    let mut proposal = std::process::Command::new(&ctl_bin)
        .env("DBUS_SYSTEM_BUS_ADDRESS", &bus)
        .args(airlock_testkit::propose_args(cfg, "viassh", VERIFY, "600"))
        .args(["--task-id", "task-pending"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = proposal.stdin.take().unwrap();
        stdin.write_all(FIX.as_bytes()).unwrap();
    }
    wait_until("the publication to wait", Duration::from_secs(60), || {
        ctl_json(&bus, &["--json", "events", "task-pending"]).contains("TASK_PUBLICATION_PENDING")
    });
    server.start();
    let out = proposal.wait_with_output().unwrap();
    let pending = airlock_testkit::last_json(&out);
    assert_eq!(pending["state"], "SUCCEEDED", "{pending}\n{}", logs());
    assert_eq!(pending["result"]["publication"]["pushed"], true);
    let events = ctl_json(&bus, &["--json", "events", "task-pending"]);
    assert!(
        events.contains("UPSTREAM_UNREACHABLE") && events.contains("TASK_PUBLISHED"),
        "{events}"
    );

    // The upstream's agent branch moved under a CONTINUE_EXISTING task:
    // never forced; the attempt is a reconciliation case with its code.
    let continued_branch = pending["result"]["target_branch"]
        .as_str()
        .unwrap()
        .to_owned();
    git(&ssh_work, &["fetch", "-q", "origin"]);
    git(
        &ssh_work,
        &[
            "push",
            "-q",
            "-f",
            "origin",
            &format!("origin/main:refs/heads/{continued_branch}"),
        ],
    );
    let moved_to = git_dir(
        &ssh_up,
        &["rev-parse", &format!("refs/heads/{continued_branch}")],
    );
    let out = airlock_testkit::airlockctl_with_stdin(
        &ctl_bin,
        &bus,
        &[
            "--json",
            "propose",
            "--config",
            cfg,
            "--repo",
            "viassh",
            "--base",
            &continued_branch,
            "--branch",
            &continued_branch,
            "--patch",
            "-",
            "--verify",
            VERIFY,
            "--max-attempts",
            "1",
            "--timeout",
            "600",
            "--wait",
        ],
        "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,3 @@\n def add(a, b):\n     return a + b\n+# continued\n",
    );
    let moved = airlock_testkit::last_json(&out);
    assert_eq!(moved["state"], "FAILED", "{moved}\n{}", logs());
    let task_id = moved["task_id"].as_str().unwrap().to_owned();
    let case = ctl_json(&bus, &["--json", "reconcile", "show", &task_id]);
    assert!(
        case.contains(&moved_to),
        "the case names the upstream's head: {case}"
    );
    assert!(logs().contains("UPSTREAM_BRANCH_MOVED"));
    assert_eq!(
        git_dir(
            &ssh_up,
            &["rev-parse", &format!("refs/heads/{continued_branch}")]
        ),
        moved_to,
        "the upstream's branch was forced"
    );

    // A wrong deploy key and a changed host key: each with its code.
    for (repo, code) in [
        ("wrongkey", "UPSTREAM_AUTH_FAILED"),
        ("hostkey", "UPSTREAM_HOST_KEY_CHANGED"),
    ] {
        wait_until(
            &format!("the first sync of {repo}"),
            Duration::from_secs(30),
            || sync_state(&state, repo).is_some(),
        );
        let s = sync_state(&state, repo).unwrap();
        assert_eq!(s["code"], code, "{s}");
        // …and the first failure is an event (UPSTREAM_SYNC_FAILED, its code).
        let events = ctl_json(&bus, &["--json", "events"]);
        assert!(
            events.lines().any(|l| l.contains("UPSTREAM_SYNC_FAILED")
                && l.contains(repo)
                && l.contains(code)),
            "{events}"
        );
        assert!(
            git_dir(&authority(repo), &["for-each-ref", "refs/heads"]).is_empty(),
            "{repo} synced something"
        );
    }

    // The credentials: the worker's alone.
    let creds = state.join("worker-credentials");
    for (who, id) in [
        ("supervisor", ids.supervisor),
        ("executor", ids.executor),
        ("retryd", ids.retry),
        ("egress", ids.egress),
    ] {
        for name in ["upstream-viassh", "signing-local"] {
            let out = read_as(id, &creds.join(name));
            assert!(!out.status.success(), "{who} read {name}");
        }
    }
    let out = read_as(ids.worker, &creds.join("upstream-viassh"));
    assert!(out.status.success(), "the worker cannot read its own key");
    drop(suite);

    // Nothing of either private key anywhere else in the state directory.
    let secret_lines: Vec<String> = [&deploy, &signing_key]
        .iter()
        .flat_map(|k| {
            std::fs::read_to_string(k)
                .unwrap()
                .lines()
                .filter(|l| !l.starts_with("-----") && l.len() > 20)
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(!secret_lines.is_empty());
    let mut files = Vec::new();
    files_under(&state, &creds, &mut files);
    assert!(files.len() > 10, "{} files", files.len());
    for (path, bytes) in &files {
        let text = String::from_utf8_lossy(bytes);
        for line in &secret_lines {
            assert!(
                !text.contains(line.as_str()),
                "{} holds a line of a private key",
                path.display()
            );
        }
    }
}

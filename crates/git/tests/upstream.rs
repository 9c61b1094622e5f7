//! Following an upstream and publishing to it, against real repositories:
//! a local-path upstream (git's file protocol, the same fetch and push
//! code as ssh and https) and a second clone standing in for the team.

use airlock_git::{AuthorityRepo, CommitSpec, FileChange, Signer, Upstream};
use airlock_proto::Code;
use airlock_testkit::{git, git_dir};
use std::path::{Path, PathBuf};

struct Team {
    _dir: tempfile::TempDir,
    /// The upstream (bare).
    upstream: PathBuf,
    /// A team member's clone of it.
    work: PathBuf,
    /// The authority repository (bare, empty at first).
    authority: PathBuf,
}

fn team() -> Team {
    let dir = tempfile::tempdir().unwrap();
    let upstream = dir.path().join("upstream.git");
    let work = dir.path().join("work");
    let authority = dir.path().join("authority.git");
    git(
        dir.path(),
        &["init", "-q", "--bare", "-b", "main", "upstream.git"],
    );
    git(
        dir.path(),
        &["init", "-q", "--bare", "-b", "main", "authority.git"],
    );
    git(
        dir.path(),
        &["clone", "-q", upstream.to_str().unwrap(), "work"],
    );
    commit(&work, "README.md", "one\n");
    git(&work, &["push", "-q", "origin", "main"]);
    Team {
        _dir: dir,
        upstream,
        work,
        authority,
    }
}

fn commit(work: &Path, file: &str, content: &str) -> String {
    std::fs::write(work.join(file), content).unwrap();
    git(work, &["add", "-A"]);
    git(work, &["commit", "-q", "-m", content.trim()]);
    git(work, &["rev-parse", "HEAD"])
}

fn open(t: &Team) -> (AuthorityRepo, Upstream) {
    let repo = AuthorityRepo::open(&t.authority).unwrap();
    let up = Upstream::new(t.upstream.to_str().unwrap()).unwrap();
    (repo, up)
}

/// The same team's upstream served by a real sshd on loopback, reached
/// with a deploy key and its pinned host key. The launcher is a test
/// script doing what the worker's own launcher does with the same
/// variables (`airlock_git::ssh_launcher_main`, tested end to end in
/// services/local/tests/upstream.rs).
fn over_ssh(t: &Team) -> (airlock_testkit::Sshd, Upstream) {
    let dir = t.authority.parent().unwrap();
    let key = dir.join("deploy");
    let public = airlock_testkit::ssh_keygen(&key);
    let server = airlock_testkit::sshd(&dir.join("sshd"), &[&public]);
    let known = dir.join("known_hosts");
    std::fs::write(&known, format!("{}\n", server.known_hosts)).unwrap();
    let launcher = dir.join("launcher");
    std::fs::write(
        &launcher,
        "#!/bin/sh\nexec /usr/bin/ssh -F /dev/null -o IdentitiesOnly=yes -o BatchMode=yes \\\n  -o StrictHostKeyChecking=yes -o GlobalKnownHostsFile=/dev/null \\\n  -o \"IdentityFile=$AIRLOCK_SSH_IDENTITY\" -o \"UserKnownHostsFile=$AIRLOCK_SSH_KNOWN_HOSTS\" \"$@\"\n",
    )
    .unwrap();
    std::fs::set_permissions(
        &launcher,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let url = format!(
        "ssh://root@127.0.0.1:{}{}",
        server.port,
        t.upstream.display()
    );
    let mut up = Upstream::new(&url).unwrap();
    up.credential = airlock_git::Credential::SshKey {
        key,
        known_hosts: known,
        launcher,
    };
    up.timeout = std::time::Duration::from_secs(30);
    (server, up)
}

fn code(e: airlock_git::GitError) -> Code {
    e.code()
}

#[test]
fn a_sync_follows_the_upstream_and_never_touches_agent_branches() {
    let t = team();
    let (repo, up) = open(&t);
    let first = repo.sync_from(&up).unwrap();
    let main = git(&t.work, &["rev-parse", "HEAD"]);
    assert_eq!(
        repo.resolve_commit("refs/heads/main").unwrap(),
        Some(main.clone())
    );
    assert_eq!(first.changes.len(), 1, "{first:?}");
    assert!(!first.changes[0].forced && first.changes[0].old.is_none());

    // An agent branch here, and one of the same name upstream: neither
    // sync nor prune moves ours.
    let spec = CommitSpec {
        parent: main.clone(),
        changes: vec![FileChange::write("a.txt", b"agent\n".to_vec(), false)],
        message: "agent".into(),
    };
    let ours = repo.governed_commit(&spec).unwrap();
    repo.cas_update("agent/task-1", &ours, None).unwrap();
    git(
        &t.work,
        &["push", "-q", "origin", "HEAD:refs/heads/agent/task-1"],
    );

    // The team moves main on, tags it, and force-pushes a topic branch.
    let second = commit(&t.work, "README.md", "two\n");
    git(&t.work, &["tag", "v1"]);
    git(&t.work, &["push", "-q", "origin", "main", "v1"]);
    git(&t.work, &["push", "-q", "origin", "HEAD:refs/heads/topic"]);
    repo.sync_from(&up).unwrap();
    git(&t.work, &["reset", "-q", "--hard", &main]);
    let rewritten = commit(&t.work, "other.txt", "rewritten\n");
    git(
        &t.work,
        &["push", "-q", "-f", "origin", "HEAD:refs/heads/topic"],
    );
    let report = repo.sync_from(&up).unwrap();
    assert_eq!(
        repo.resolve_commit("refs/heads/main").unwrap(),
        Some(second)
    );
    assert!(repo.resolve_commit("refs/tags/v1").unwrap().is_some());
    assert_eq!(
        repo.resolve_commit("refs/heads/topic").unwrap(),
        Some(rewritten.clone())
    );
    let forced: Vec<_> = report.forced().map(|c| c.name.as_str()).collect();
    assert_eq!(forced, ["refs/heads/topic"], "{report:?}");
    assert_eq!(
        repo.branch_head("agent/task-1").unwrap(),
        Some(ours.clone())
    );

    // A branch deleted upstream is pruned, and reported; ours stays.
    git(
        &t.work,
        &[
            "push",
            "-q",
            "origin",
            ":refs/heads/topic",
            ":refs/heads/agent/task-1",
        ],
    );
    let report = repo.sync_from(&up).unwrap();
    assert_eq!(repo.resolve_commit("refs/heads/topic").unwrap(), None);
    assert!(
        report
            .forced()
            .any(|c| c.name == "refs/heads/topic" && c.new.is_none())
    );
    assert_eq!(repo.branch_head("agent/task-1").unwrap(), Some(ours));
}

#[test]
fn a_publication_happens_once_and_never_forces() {
    let t = team();
    let (repo, up) = open(&t);
    repo.sync_from(&up).unwrap();
    let main = repo.resolve_commit("refs/heads/main").unwrap().unwrap();
    let spec = |text: &str, parent: &str| CommitSpec {
        parent: parent.to_owned(),
        changes: vec![FileChange::write("a.txt", text.as_bytes().to_vec(), false)],
        message: text.into(),
    };
    let c1 = repo.governed_commit(&spec("one", &main)).unwrap();
    let answer = repo
        .publish_to(&up, "agent/task-1", &c1, None, &[])
        .unwrap();
    assert!(answer.pushed, "{answer:?}");
    assert_eq!(
        git_dir(&t.upstream, &["rev-parse", "refs/heads/agent/task-1"]),
        c1
    );
    // A replay (the push done, its record lost) sends nothing.
    let again = repo
        .publish_to(&up, "agent/task-1", &c1, None, &[])
        .unwrap();
    assert!(!again.pushed, "{again:?}");

    // CONTINUE_EXISTING: leased on the recorded value.
    let c2 = repo.governed_commit(&spec("two", &c1)).unwrap();
    let answer = repo
        .publish_to(&up, "agent/task-1", &c2, Some(&c1), &[])
        .unwrap();
    assert!(answer.pushed);
    // Moved underneath (someone pushed to the agent branch): refused with
    // its code, and nothing forced.
    git(&t.work, &["fetch", "-q", "origin"]);
    git(
        &t.work,
        &[
            "push",
            "-q",
            "-f",
            "origin",
            "origin/main:refs/heads/agent/task-1",
        ],
    );
    let c3 = repo.governed_commit(&spec("three", &c2)).unwrap();
    let e = repo
        .publish_to(&up, "agent/task-1", &c3, Some(&c2), &[])
        .unwrap_err();
    assert_eq!(code(e), Code::UPSTREAM_BRANCH_MOVED);
    assert_eq!(
        git_dir(&t.upstream, &["rev-parse", "refs/heads/agent/task-1"]),
        main
    );
    // CREATE_NEW over an existing branch: the same refusal.
    let e = repo
        .publish_to(&up, "agent/task-1", &c3, None, &[])
        .unwrap_err();
    assert_eq!(code(e), Code::UPSTREAM_BRANCH_MOVED);
    // Only agent branches are ever pushed.
    let e = repo
        .publish_to(&up, "main", &c3, Some(&main), &[])
        .unwrap_err();
    assert_ne!(code(e), Code::UPSTREAM_BRANCH_MOVED);
    assert_eq!(
        git_dir(&t.upstream, &["rev-parse", "refs/heads/main"]),
        main
    );
}

#[test]
fn push_options_reach_the_upstream() {
    let t = team();
    let (repo, _) = open(&t);
    let (_server, up) = over_ssh(&t);
    repo.sync_from(&up).unwrap();
    git_dir(
        &t.upstream,
        &["config", "receive.advertisePushOptions", "true"],
    );
    let main = repo.resolve_commit("refs/heads/main").unwrap().unwrap();
    let c1 = repo
        .governed_commit(&CommitSpec {
            parent: main,
            changes: vec![FileChange::write("a.txt", b"x\n".to_vec(), false)],
            message: "x".into(),
        })
        .unwrap();
    let options = vec!["merge_request.create".to_owned()];
    let answer = repo
        .publish_to(&up, "agent/task-2", &c1, None, &options)
        .unwrap();
    assert!(answer.pushed, "{answer:?}");
    // An upstream that does not take push options refuses the push: the
    // option was sent.
    git_dir(
        &t.upstream,
        &["config", "receive.advertisePushOptions", "false"],
    );
    let e = repo
        .publish_to(&up, "agent/task-3", &c1, None, &options)
        .unwrap_err();
    assert_ne!(code(e), Code::UPSTREAM_BRANCH_MOVED);
    assert!(git_dir(&t.upstream, &["for-each-ref", "refs/heads/agent/task-3"]).is_empty());
}

#[test]
fn a_fetch_is_bounded_in_size() {
    let t = team();
    // 2 MB of incompressible content upstream; a 64 KiB bound.
    let noise: String = (0..200_000u32)
        .map(|i| format!("{:08x}", i.wrapping_mul(2_654_435_761)))
        .collect();
    std::fs::write(t.work.join("big.txt"), noise).unwrap();
    git(&t.work, &["add", "-A"]);
    git(&t.work, &["commit", "-q", "-m", "big"]);
    git(&t.work, &["push", "-q", "origin", "main"]);
    let (repo, _) = open(&t);
    let (_server, mut up) = over_ssh(&t);
    up.max_fetch_bytes = 64 << 10;
    let e = repo.sync_from(&up).unwrap_err();
    assert_eq!(e.code(), Code::UPSTREAM_FETCH_LIMIT, "{e}");
    assert_eq!(repo.resolve_commit("refs/heads/main").unwrap(), None);
    // Within the bound, the same fetch over ssh works.
    up.max_fetch_bytes = 64 << 20;
    repo.sync_from(&up).unwrap();
    assert!(repo.resolve_commit("refs/heads/main").unwrap().is_some());
}

#[test]
fn urls_other_than_ssh_https_or_a_path_are_refused() {
    for bad in [
        "git@host:repo.git",
        "ext::sh -c touch% /tmp/x",
        "http://host/repo",
        "git://host/repo",
        "relative/path",
        "ssh://-oProxyCommand=x/repo",
        "https://user:token@host/repo",
        "/srv/../etc",
        "/srv/repo\n",
    ] {
        let e = Upstream::new(bad).unwrap_err();
        assert_eq!(e.code, Code::UPSTREAM_URL_INVALID, "{bad}");
    }
    for good in [
        "ssh://git@host:2222/team/repo.git",
        "https://host/team/repo.git",
        "/srv/git/repo.git",
    ] {
        Upstream::new(good).unwrap();
    }
}

#[test]
fn signed_governed_commits_verify_and_replay_to_the_same_oid() {
    let t = team();
    let (repo, up) = open(&t);
    repo.sync_from(&up).unwrap();
    let main = repo.resolve_commit("refs/heads/main").unwrap().unwrap();
    let key = t.authority.parent().unwrap().join("signing");
    airlock_testkit::ssh_keygen(&key);
    let signer = Signer::load(&key, "agent@example.org").unwrap();
    let spec = CommitSpec {
        parent: main,
        changes: vec![FileChange::write("a.txt", b"signed\n".to_vec(), false)],
        message: "signed".into(),
    };
    let one = repo.governed_commit_signed(&spec, Some(&signer)).unwrap();
    let two = repo.governed_commit_signed(&spec, Some(&signer)).unwrap();
    assert_eq!(one, two);
    assert_ne!(one, repo.governed_commit(&spec).unwrap());
    let scratch = t.authority.parent().unwrap();
    let verify = |line: &str| airlock_testkit::verify_commit(&t.authority, scratch, line, &one);
    let out = verify(&signer.allowed_signers_line());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("agent@example.org"), "{said}");
    // Another key does not verify it.
    airlock_testkit::ssh_keygen(&key);
    let other = Signer::load(&key, "agent@example.org").unwrap();
    assert!(!verify(&other.allowed_signers_line()).status.success());
    git_dir(&t.authority, &["fsck", "--strict"]);
}

#[test]
fn a_local_upstreams_hooks_and_programs_never_run() {
    let t = team();
    let canary = t.upstream.parent().unwrap().join("CANARY");
    // Every hook a receive or a ref update would run, and configured
    // programs, each leaving the canary.
    let hooks = t.upstream.join("hooks");
    for hook in [
        "pre-receive",
        "update",
        "post-receive",
        "post-update",
        "reference-transaction",
        "proc-receive",
    ] {
        let path = hooks.join(hook);
        std::fs::write(&path, format!("#!/bin/sh\ntouch {}\n", canary.display())).unwrap();
        std::os::unix::fs::PermissionsExt::set_mode(
            &mut std::fs::metadata(&path).unwrap().permissions(),
            0o755,
        );
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
    }
    let touch = format!("!touch {}", canary.display());
    git_dir(
        &t.upstream,
        &["config", "core.hooksPath", hooks.to_str().unwrap()],
    );
    git_dir(
        &t.upstream,
        &["config", "uploadpack.packObjectsHook", &touch],
    );
    git_dir(&t.upstream, &["config", "core.fsmonitor", &touch]);
    let (repo, up) = open(&t);
    repo.sync_from(&up).unwrap();
    let main = repo.resolve_commit("refs/heads/main").unwrap().unwrap();
    let c1 = repo
        .governed_commit(&CommitSpec {
            parent: main,
            changes: vec![FileChange::write("a.txt", b"x\n".to_vec(), false)],
            message: "x".into(),
        })
        .unwrap();
    let answer = repo
        .publish_to(&up, "agent/task-9", &c1, None, &[])
        .unwrap();
    assert!(answer.pushed);
    assert_eq!(
        git_dir(&t.upstream, &["rev-parse", "refs/heads/agent/task-9"]),
        c1
    );
    git_dir(&t.upstream, &["fsck", "--connectivity-only"]);
    assert!(!canary.exists(), "a program of the upstream ran");
}

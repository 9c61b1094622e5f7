//! airlock-git against real bare repositories made by the real git.

use airlock_git::{ArchiveLimits, AuthorityRepo, CommitSpec, FileChange, RefUpdate};
use airlock_proto::Code;
use airlock_testkit::git_dated as git;
use std::path::{Path, PathBuf};
use std::process::Command;

struct Fixture {
    dir: tempfile::TempDir,
    bare: PathBuf,
    main: String,
}

/// A bare repo whose main has a few files, an executable, a symlink and a
/// submodule entry.
fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    git(&work, &["init", "-q", "-b", "main"]);
    std::fs::write(work.join("README.md"), "hello\n").unwrap();
    std::fs::create_dir_all(work.join("src/deep")).unwrap();
    std::fs::write(work.join("src/lib.py"), "VALUE = 1\n").unwrap();
    std::fs::write(work.join("src/deep/x.txt"), "x\n").unwrap();
    std::fs::write(work.join("run.sh"), "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(
        work.join("run.sh"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    std::os::unix::fs::symlink("/etc/passwd", work.join("link")).unwrap();
    git(&work, &["add", "-A"]);
    git(
        &work,
        &[
            "update-index",
            "--add",
            "--cacheinfo",
            &format!("160000,{},sub", "1".repeat(40)),
        ],
    );
    git(&work, &["commit", "-q", "-m", "base"]);
    let bare = dir.path().join("repo.git");
    git(
        dir.path(),
        &[
            "clone",
            "-q",
            "--bare",
            work.to_str().unwrap(),
            bare.to_str().unwrap(),
        ],
    );
    let main = git(&bare, &["rev-parse", "refs/heads/main"]);
    Fixture { dir, bare, main }
}

fn archive(repo: &AuthorityRepo, commit: &str) -> (Vec<u8>, airlock_git::ArchiveStats) {
    let mut out = Vec::new();
    let stats = repo
        .source_archive(commit, &ArchiveLimits::default(), &mut out)
        .unwrap();
    (out, stats)
}

#[test]
fn archive_is_deterministic_and_holds_files_and_links() {
    let f = fixture();
    let repo = AuthorityRepo::open(&f.bare).unwrap();
    let (a, stats) = archive(&repo, &f.main);
    let (b, _) = archive(&repo, &f.main);
    assert_eq!(a, b, "same commit, same bytes");
    assert_eq!(stats.files, 4);
    assert_eq!(stats.symlinks, 1);
    assert_eq!(stats.skipped, vec!["sub"]);
    let mut names = Vec::new();
    let mut ar = tar::Archive::new(&a[..]);
    let mut globals = 0;
    for entry in ar.entries().unwrap() {
        let entry = entry.unwrap();
        let h = entry.header();
        if h.entry_type() == tar::EntryType::XGlobalHeader {
            // The tree's entries that are not files, as metadata only.
            assert!(names.is_empty(), "the global header comes first");
            globals += 1;
            continue;
        }
        assert_eq!(
            (h.uid().unwrap(), h.gid().unwrap(), h.mtime().unwrap()),
            (0, 0, 0)
        );
        let path = entry.path().unwrap().to_string_lossy().into_owned();
        if h.entry_type() == tar::EntryType::Symlink {
            // The link as the tree has it, target and all (an absolute
            // one too: what it reaches is the sandbox's to govern).
            let target = entry.link_name().unwrap().unwrap();
            names.push((format!("{path} -> {}", target.display()), 0));
            continue;
        }
        assert_eq!(h.entry_type(), tar::EntryType::Regular);
        names.push((path, h.mode().unwrap()));
    }
    assert_eq!(
        names,
        vec![
            ("README.md".into(), 0o644),
            ("link -> /etc/passwd".into(), 0),
            ("run.sh".into(), 0o755),
            ("src/deep/x.txt".into(), 0o644),
            ("src/lib.py".into(), 0o644)
        ]
    );
    assert_eq!(globals, 1);
}

/// The tree id recomputed from an archive's content (what the executor's
/// cache checks) is git's own tree id of the commit, symlink and submodule
/// included: the link as a symlink member, the submodule as a pax record.
#[test]
fn the_archive_holds_the_commits_tree_and_names_it() {
    use airlock_proto::tree::{ObjectFormat, PAX_KEY_PREFIX, TreeBuilder, TreeEntry};
    use std::io::Read;
    let f = fixture();
    let repo = AuthorityRepo::open(&f.bare).unwrap();
    let tree = repo.tree_of(&f.main).unwrap();
    assert_eq!(
        tree,
        git(&f.bare, &["rev-parse", &format!("{}^{{tree}}", f.main)])
    );
    let (a, _) = archive(&repo, &f.main);
    let mut t = TreeBuilder::new(ObjectFormat::Sha1);
    let mut extras = Vec::new();
    let mut ar = tar::Archive::new(&a[..]);
    for entry in ar.entries().unwrap() {
        let mut entry = entry.unwrap();
        if entry.header().entry_type() == tar::EntryType::XGlobalHeader {
            for ext in entry.pax_extensions().unwrap().unwrap() {
                let ext = ext.unwrap();
                assert!(ext.key().unwrap().starts_with(PAX_KEY_PREFIX));
                let e = TreeEntry::from_pax(ext.value_bytes()).unwrap();
                t.add_entry(&e).unwrap();
                extras.push((e.path, e.mode));
            }
            continue;
        }
        let path = entry.path().unwrap().to_string_lossy().into_owned();
        if entry.header().entry_type() == tar::EntryType::Symlink {
            let target = entry.link_name_bytes().unwrap().into_owned();
            t.add_symlink(&path, &target).unwrap();
            extras.push((path, 0o120000));
            continue;
        }
        let exec = entry.header().mode().unwrap() & 0o111 != 0;
        let mut data = Vec::new();
        entry.read_to_end(&mut data).unwrap();
        t.add_blob(&path, exec, &data).unwrap();
    }
    extras.sort();
    assert_eq!(
        extras,
        [("link".into(), 0o120000), ("sub".into(), 0o160000)]
    );
    assert_eq!(
        t.finish(),
        tree,
        "git's tree id, recomputed from the archive"
    );
    // An unknown commit has no tree.
    assert!(repo.tree_of(&"e".repeat(40)).is_err());
}

#[test]
fn archive_enforces_limits_and_refuses_unknown_commits() {
    let f = fixture();
    let repo = AuthorityRepo::open(&f.bare).unwrap();
    let tight = ArchiveLimits {
        max_entries: 2,
        ..ArchiveLimits::default()
    };
    let err = repo
        .source_archive(&f.main, &tight, Vec::new())
        .unwrap_err();
    assert_eq!(err.code(), Code::SOURCE_ARCHIVE_LIMIT_EXCEEDED);
    let tight = ArchiveLimits {
        max_file_bytes: 3,
        ..ArchiveLimits::default()
    };
    assert_eq!(
        repo.source_archive(&f.main, &tight, Vec::new())
            .unwrap_err()
            .code(),
        Code::SOURCE_ARCHIVE_LIMIT_EXCEEDED
    );
    let err = repo
        .source_archive(&"e".repeat(40), &ArchiveLimits::default(), Vec::new())
        .unwrap_err();
    assert_eq!(err.code(), Code::GIT_OBJECT_MISSING);
}

fn spec(f: &Fixture, content: &str) -> CommitSpec {
    CommitSpec {
        parent: f.main.clone(),
        changes: vec![
            FileChange::write("src/lib.py", content.as_bytes().to_vec(), false),
            FileChange::write("new/tool.sh", b"#!/bin/sh\necho hi\n".to_vec(), true),
            FileChange::delete("src/deep/x.txt"),
        ],
        message: "airlock: task-a attempt 1".into(),
    }
}

#[test]
fn governed_commit_is_deterministic() {
    let f = fixture();
    let repo = AuthorityRepo::open(&f.bare).unwrap();
    let one = repo.governed_commit(&spec(&f, "VALUE = 2\n")).unwrap();
    let two = repo.governed_commit(&spec(&f, "VALUE = 2\n")).unwrap();
    assert_eq!(one, two, "same inputs, same commit");
    let other = repo.governed_commit(&spec(&f, "VALUE = 3\n")).unwrap();
    assert_ne!(one, other);
    assert_eq!(
        git(&f.bare, &["show", &format!("{one}:src/lib.py")]),
        "VALUE = 2"
    );
    assert_eq!(git(&f.bare, &["rev-parse", &format!("{one}^")]), f.main);
    let tree = git(&f.bare, &["ls-tree", "-r", &one]);
    assert!(
        tree.contains("100755 blob") && tree.contains("new/tool.sh"),
        "{tree}"
    );
    assert!(!tree.contains("src/deep/x.txt"));
    assert!(
        tree.contains("120000 blob") && tree.contains("\tlink"),
        "symlinks are kept: {tree}"
    );
    assert!(
        tree.contains("160000 commit"),
        "submodules are kept: {tree}"
    );
    let author = git(
        &f.bare,
        &["log", "-1", "--format=%an <%ae> %at %cn %ct", &one],
    );
    assert_eq!(
        author,
        "airlock <airlock@localhost> 1700000001 airlock 1700000001"
    );
}

/// The trees the governed commit writes (only those on the changed paths)
/// are the ones git's own index would give for the same changes.
#[test]
fn governed_trees_are_what_gits_index_would_write() {
    let f = fixture();
    let repo = AuthorityRepo::open(&f.bare).unwrap();
    let spec = CommitSpec {
        parent: f.main.clone(),
        changes: vec![
            FileChange::write("src/lib.py", b"VALUE = 9\n".to_vec(), false),
            FileChange::write("a/b/c/new.txt", b"new\n".to_vec(), true),
            FileChange::delete("src/deep/x.txt"),
            FileChange::delete("not/there.txt"),
            FileChange::write("README.md", b"hello\n".to_vec(), true),
            // git's order: a directory sorts as if its name ended in '/'.
            FileChange::write("order/a.txt", b"1\n".to_vec(), false),
            FileChange::write("order/a/b.txt", b"2\n".to_vec(), false),
            FileChange::write("order/a-b.txt", b"3\n".to_vec(), false),
            FileChange::write("order/a0", b"4\n".to_vec(), false),
        ],
        message: "m".into(),
    };
    let commit = repo.governed_commit(&spec).unwrap();
    let ours = git(&f.bare, &["rev-parse", &format!("{commit}^{{tree}}")]);
    // The same with a temporary index.
    let index = f.dir.path().join("index");
    let with_index = |args: &[&str], input: Option<&[u8]>| -> String {
        use std::io::Write;
        let mut c = Command::new("git");
        c.arg("--git-dir")
            .arg(&f.bare)
            .args(args)
            .env("GIT_INDEX_FILE", &index)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped());
        let mut child = c.spawn().unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.unwrap_or(b""))
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "git {args:?}");
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    with_index(&["read-tree", &format!("{}^{{tree}}", f.main)], None);
    let blob = |content: &[u8]| with_index(&["hash-object", "-w", "--stdin"], Some(content));
    let zero = "0".repeat(40);
    let mut info = format!(
        "100644 {} 0\tsrc/lib.py\0100755 {} 0\ta/b/c/new.txt\00 {zero}\tsrc/deep/x.txt\0100755 {} 0\tREADME.md\0",
        blob(b"VALUE = 9\n"),
        blob(b"new\n"),
        blob(b"hello\n"),
    );
    for (path, content) in [
        ("order/a.txt", "1\n"),
        ("order/a/b.txt", "2\n"),
        ("order/a-b.txt", "3\n"),
        ("order/a0", "4\n"),
    ] {
        info.push_str(&format!("100644 {} 0\t{path}\0", blob(content.as_bytes())));
    }
    with_index(
        &["update-index", "-z", "--index-info"],
        Some(info.as_bytes()),
    );
    let theirs = with_index(&["write-tree"], None);
    assert_eq!(ours, theirs);
    // The emptied directory is gone, as git stores no empty tree.
    let listing = git(&f.bare, &["ls-tree", "-r", "--name-only", &commit]);
    assert!(!listing.contains("src/deep"), "{listing}");
}

#[test]
fn changes_cannot_pass_through_links_submodules_or_directories() {
    let f = fixture();
    let repo = AuthorityRepo::open(&f.bare).unwrap();
    for (path, code) in [
        ("link/x", Code::PATH_ESCAPE),
        ("sub", Code::PATH_ESCAPE),
        ("sub/file", Code::PATH_ESCAPE),
        ("src", Code::PATH_ESCAPE),
        ("README.md/x", Code::PATH_ESCAPE),
        ("../x", Code::PATH_INVALID),
        (".git/hooks/pre-commit", Code::PATH_INVALID),
    ] {
        let s = CommitSpec {
            parent: f.main.clone(),
            changes: vec![FileChange::write(path, b"x".to_vec(), false)],
            message: "m".into(),
        };
        assert_eq!(repo.governed_commit(&s).unwrap_err().code(), code, "{path}");
    }
    let s = CommitSpec {
        parent: "f".repeat(40),
        changes: vec![],
        message: "m".into(),
    };
    assert_eq!(
        repo.governed_commit(&s).unwrap_err().code(),
        Code::GIT_OBJECT_MISSING
    );
}

/// Links are committed as links (mode 120000, the target as the blob):
/// made, retargeted, replaced by a file and deleted.
#[test]
fn symlinks_are_committed_as_links() {
    let f = fixture();
    let repo = AuthorityRepo::open(&f.bare).unwrap();
    let commit = |changes| {
        repo.governed_commit(&CommitSpec {
            parent: f.main.clone(),
            changes,
            message: "m".into(),
        })
        .unwrap()
    };
    let entry = |commit: &str, path: &str| {
        let line = git(&f.bare, &["ls-tree", commit, "--", path]);
        let mode = line.split(' ').next().unwrap_or("").to_owned();
        let blob = git(&f.bare, &["cat-file", "-p", &format!("{commit}:{path}")]);
        (mode, blob)
    };
    let c = commit(vec![
        FileChange::symlink("docs/readme", b"../README.md".to_vec()),
        FileChange::symlink("link", b"run.sh".to_vec()),
    ]);
    assert_eq!(
        entry(&c, "docs/readme"),
        ("120000".into(), "../README.md".into())
    );
    assert_eq!(entry(&c, "link"), ("120000".into(), "run.sh".into()));
    let c = commit(vec![FileChange::write(
        "link",
        b"now a file\n".to_vec(),
        false,
    )]);
    assert_eq!(entry(&c, "link"), ("100644".into(), "now a file".into()));
    let c = commit(vec![FileChange::delete("link")]);
    assert!(git(&f.bare, &["ls-tree", &c, "--", "link"]).is_empty());
}

#[test]
fn cas_update_creates_converges_and_refuses_moved_refs() {
    let f = fixture();
    let repo = AuthorityRepo::open(&f.bare).unwrap();
    let c1 = repo.governed_commit(&spec(&f, "VALUE = 2\n")).unwrap();
    assert_eq!(
        repo.cas_update("agent/task-a", &c1, None).unwrap(),
        RefUpdate::Updated
    );
    assert_eq!(
        repo.branch_head("agent/task-a").unwrap().as_deref(),
        Some(c1.as_str())
    );
    // A redo after a crash is a no-op.
    assert_eq!(
        repo.cas_update("agent/task-a", &c1, None).unwrap(),
        RefUpdate::AlreadyAtTarget
    );
    // A second writer that expected the branch absent loses.
    let c2 = repo.governed_commit(&spec(&f, "VALUE = 3\n")).unwrap();
    assert_eq!(
        repo.cas_update("agent/task-a", &c2, None)
            .unwrap_err()
            .code(),
        Code::REF_CAS_MISMATCH
    );
    assert_eq!(
        repo.cas_update("agent/task-a", &c2, Some(&f.main))
            .unwrap_err()
            .code(),
        Code::REF_CAS_MISMATCH
    );
    assert_eq!(
        repo.branch_head("agent/task-a").unwrap().as_deref(),
        Some(c1.as_str()),
        "unchanged by refusals"
    );
    // Continuing the branch from its expected value works.
    let c3 = repo
        .governed_commit(&CommitSpec {
            parent: c1.clone(),
            changes: vec![FileChange::write("b.txt", b"b".to_vec(), false)],
            message: "m".into(),
        })
        .unwrap();
    assert_eq!(
        repo.cas_update("agent/task-a", &c3, Some(&c1)).unwrap(),
        RefUpdate::Updated
    );
    assert_eq!(
        repo.cas_update("agent/task-a", &"e".repeat(40), Some(&c3))
            .unwrap_err()
            .code(),
        Code::GIT_OBJECT_MISSING
    );
}

#[test]
fn protected_and_foreign_refs_are_refused() {
    let f = fixture();
    let repo = AuthorityRepo::open(&f.bare).unwrap();
    let c = repo.governed_commit(&spec(&f, "VALUE = 2\n")).unwrap();
    for branch in [
        "main",
        "master",
        "refs/heads/main",
        "tags/v1",
        "release/1",
        "HEAD",
    ] {
        assert_eq!(
            repo.cas_update(branch, &c, Some(&f.main))
                .unwrap_err()
                .code(),
            Code::PROTECTED_REF_DENY,
            "{branch}"
        );
    }
    for branch in ["feature/x", "agent/..", "agent/x.lock", "agent/"] {
        assert_eq!(
            repo.cas_update(branch, &c, None).unwrap_err().code(),
            Code::TARGET_BRANCH_INVALID,
            "{branch}"
        );
    }
    assert_eq!(
        git(&f.bare, &["rev-parse", "refs/heads/main"]),
        f.main,
        "main never moves"
    );
}

fn install_hook(bare: &Path, name: &str, marker: &Path) {
    let hook = bare.join("hooks").join(name);
    std::fs::write(
        &hook,
        format!("#!/bin/sh\necho {name} >> {}\n", marker.display()),
    )
    .unwrap();
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
}

#[test]
fn hooks_and_repository_configured_programs_never_run() {
    let f = fixture();
    let marker = f.dir.path().join("ran");
    for hook in [
        "reference-transaction",
        "pre-commit",
        "post-commit",
        "post-update",
        "pre-receive",
        "update",
        "post-index-change",
    ] {
        install_hook(&f.bare, hook, &marker);
    }
    // Repository configuration that would run programs if honoured.
    let evil = format!("sh -c 'echo config >> {}'", marker.display());
    for (k, v) in [
        ("filter.evil.smudge", evil.as_str()),
        ("filter.evil.clean", evil.as_str()),
        ("filter.evil.required", "true"),
        ("commit.gpgSign", "true"),
        ("gpg.program", evil.as_str()),
        ("core.fsmonitor", evil.as_str()),
    ] {
        git(&f.bare, &["config", k, v]);
    }
    let attributes = f.bare.join("info/attributes");
    std::fs::create_dir_all(attributes.parent().unwrap()).unwrap();
    std::fs::write(&attributes, "* filter=evil\n").unwrap();

    let repo = AuthorityRepo::open(&f.bare).unwrap();
    archive(&repo, &f.main);
    let c = repo.governed_commit(&spec(&f, "VALUE = 2\n")).unwrap();
    repo.cas_update("agent/task-a", &c, None).unwrap();
    assert!(
        !marker.exists(),
        "something ran: {}",
        std::fs::read_to_string(&marker).unwrap_or_default()
    );

    // Control: the same reference-transaction hook does run for a plain
    // update-ref, so the assertion above can fail.
    git(
        &f.bare,
        &["update-ref", "refs/heads/agent/control", &f.main],
    );
    assert!(
        std::fs::read_to_string(&marker)
            .unwrap_or_default()
            .contains("reference-transaction")
    );
}

/// A power loss can leave an object's name with no content, or with part
/// of it, and git trusts a loose object that exists: the governed commit
/// replaces such a file for each object it writes (its blob, trees and
/// commit), and the repository it leaves passes `git fsck --full`.
#[test]
fn an_empty_object_file_under_an_objects_name_is_written_again() {
    let f = fixture();
    let repo = AuthorityRepo::open(&f.bare).unwrap();
    let spec = CommitSpec {
        parent: f.main.clone(),
        changes: vec![FileChange::write(
            "src/lib.py",
            b"VALUE = 5\n".to_vec(),
            false,
        )],
        message: "m".into(),
    };
    // The objects this commit writes, found in a copy of the repository.
    let copy = f.dir.path().join("copy.git");
    let status = Command::new("cp")
        .arg("-a")
        .arg(&f.bare)
        .arg(&copy)
        .status()
        .unwrap();
    assert!(status.success());
    let probe = AuthorityRepo::open(&copy)
        .unwrap()
        .governed_commit(&spec)
        .unwrap();
    let root = git(&copy, &["rev-parse", &format!("{probe}^{{tree}}")]);
    let src = git(&copy, &["rev-parse", &format!("{probe}:src")]);
    let blob = git(&copy, &["rev-parse", &format!("{probe}:src/lib.py")]);
    // Left empty under their names, as after a power loss; the blob cut
    // short instead (its first half: a header git can read, then nothing).
    let loose = |repo: &Path, oid: &str| repo.join("objects").join(&oid[..2]).join(&oid[2..]);
    for oid in [&probe, &root, &src, &blob] {
        let path = loose(&f.bare, oid);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let content = if oid == &blob {
            let whole = std::fs::read(loose(&copy, oid)).unwrap();
            whole[..whole.len() / 2].to_vec()
        } else {
            Vec::new()
        };
        std::fs::write(&path, content).unwrap();
    }
    let commit = repo.governed_commit(&spec).unwrap();
    assert_eq!(commit, probe);
    let fsck = Command::new("git")
        .arg("--git-dir")
        .arg(&f.bare)
        .args(["fsck", "--full", "--no-dangling"])
        .output()
        .unwrap();
    assert!(
        fsck.status.success(),
        "git fsck: {}",
        String::from_utf8_lossy(&fsck.stderr)
    );
    assert_eq!(
        git(&f.bare, &["show", &format!("{commit}:src/lib.py")]),
        "VALUE = 5"
    );
}

//! The task builder against real git repositories: a bare authority
//! repository, a clone a planner edits, and diffs written by `git diff`.

use airlock_builder::{Changes, Proposal, SourceRepo, verify_command};
use airlock_proto::Code;
use airlock_proto::canonical::sha256_hex;
use airlock_testkit::git;
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const CALC: &str = "def add(a, b):\n    return a - b\n";

/// A bare repository with calc.py, test_calc.py, run.sh (executable),
/// link (a symlink) and logo.bin (binary); and a clone of it.
struct Fixture {
    _dir: tempfile::TempDir,
    bare: PathBuf,
    clone: PathBuf,
    base: String,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    git(&work, &["init", "-q", "-b", "main"]);
    std::fs::write(work.join("calc.py"), CALC).unwrap();
    std::fs::write(work.join("test_calc.py"), "import calc\n").unwrap();
    std::fs::write(work.join("run.sh"), "#!/bin/sh\n").unwrap();
    chmod(work.join("run.sh"), 0o755);
    std::os::unix::fs::symlink("calc.py", work.join("link")).unwrap();
    std::fs::write(work.join("logo.bin"), b"\x89PNG\0\x01").unwrap();
    std::fs::write(work.join(".gitignore"), "__pycache__/\n").unwrap();
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "-q", "-m", "base"]);
    let bare = dir.path().join("calc.git");
    git(dir.path(), &["clone", "-q", "--bare", "work", "calc.git"]);
    let clone = dir.path().join("clone");
    git(dir.path(), &["clone", "-q", "calc.git", "clone"]);
    let base = git(&bare, &["rev-parse", "main"]);
    Fixture {
        _dir: dir,
        bare,
        clone,
        base,
    }
}

fn chmod(p: PathBuf, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn proposal() -> Proposal {
    let mut p = Proposal::new("calc", "main");
    p.task_id = Some("task-builder-1".into());
    p.verification
        .push(verify_command("python3 -m unittest -q", 60, &["/usr/bin/python3".into()]).unwrap());
    p
}

fn changes(task: &Value) -> Vec<(String, String)> {
    task["plan"]["execution"]["change_set"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["operation"].as_str().unwrap().to_owned(),
                c["path"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect()
}

#[test]
fn a_worktree_proposal_carries_additions_edits_and_deletions_guarded_by_the_base() {
    let f = fixture();
    std::fs::write(f.clone.join("calc.py"), CALC.replace("a - b", "a + b")).unwrap();
    std::fs::write(f.clone.join("NEW.md"), "hello\n").unwrap();
    std::fs::remove_file(f.clone.join("test_calc.py")).unwrap();
    // Ignored build output is not proposed.
    std::fs::create_dir(f.clone.join("__pycache__")).unwrap();
    std::fs::write(f.clone.join("__pycache__/calc.pyc"), b"\0\0").unwrap();
    let repo = SourceRepo::open(&f.bare).unwrap();
    let built = proposal()
        .build(&repo, Changes::Worktree(&f.clone))
        .unwrap();
    let t = &built.task;
    assert_eq!(t["schema"], "airlock.task.v1");
    assert_eq!(t["binding"]["base_oid"], f.base.as_str());
    assert_eq!(t["binding"]["expected_branch_oid"], f.base.as_str());
    assert_eq!(t["binding"]["branch_mode"], "CREATE_NEW");
    assert_eq!(t["binding"]["target_branch"], "agent/task-builder-1");
    assert_eq!(t["plan"]["source_head_oid"], f.base.as_str());
    assert_eq!(
        changes(t),
        pairs(&[
            ("write_file", "NEW.md"),
            ("write_file", "calc.py"),
            ("delete_file", "test_calc.py"),
        ])
    );
    let cs = &t["plan"]["execution"]["change_set"];
    assert!(
        cs[0].get("expected_sha256").is_none(),
        "a new file has no guard"
    );
    assert_eq!(cs[1]["expected_sha256"], sha256_hex(CALC.as_bytes()));
    assert_eq!(cs[1]["content"], CALC.replace("a - b", "a + b"));
    assert_eq!(cs[2]["expected_sha256"], sha256_hex(b"import calc\n"));
    let v = &t["plan"]["execution"]["verification"][0];
    assert_eq!(
        v["argv"],
        serde_json::json!(["/usr/bin/python3", "-m", "unittest", "-q"])
    );
    assert_eq!(v["timeout_seconds"], 60);
}

#[test]
fn a_plain_directory_works_too_and_nothing_changed_is_proposal_empty() {
    let f = fixture();
    let top = f.clone.parent().unwrap();
    let plain = top.join("plain");
    std::fs::create_dir(&plain).unwrap();
    git(&f.clone, &["archive", "-o", "../plain.tar", "HEAD"]);
    let untar = Command::new("tar")
        .args(["-xf", "../plain.tar"])
        .current_dir(&plain)
        .status()
        .unwrap();
    assert!(untar.success());
    let repo = SourceRepo::open(&f.bare).unwrap();
    let e = proposal()
        .build(&repo, Changes::Worktree(&plain))
        .unwrap_err();
    assert_eq!(e.code, Code::PROPOSAL_EMPTY, "{e}");
    std::fs::write(plain.join("calc.py"), "x = 1\n").unwrap();
    let built = proposal().build(&repo, Changes::Worktree(&plain)).unwrap();
    assert_eq!(changes(&built.task), pairs(&[("write_file", "calc.py")]));
    // A subdirectory of a work tree is refused: it would look like deleting the rest.
    std::fs::create_dir(f.clone.join("sub")).unwrap();
    let e = proposal()
        .build(&repo, Changes::Worktree(&f.clone.join("sub")))
        .unwrap_err();
    assert_eq!(e.code, Code::PATH_INVALID, "{e}");
}

fn refusal(edit: &dyn Fn(&Path)) -> Code {
    let f = fixture();
    edit(&f.clone);
    let repo = SourceRepo::open(&f.bare).unwrap();
    proposal()
        .build(&repo, Changes::Worktree(&f.clone))
        .unwrap_err()
        .code
}

#[test]
fn modes_type_changes_and_binaries_in_a_worktree_are_refused_with_their_codes() {
    assert_eq!(
        refusal(&|d| chmod(d.join("calc.py"), 0o755)),
        Code::PROPOSAL_MODE_CHANGE
    );
    assert_eq!(
        refusal(&|d| chmod(d.join("run.sh"), 0o644)),
        Code::PROPOSAL_MODE_CHANGE
    );
    assert_eq!(
        refusal(&|d| {
            std::fs::write(d.join("new.sh"), "x").unwrap();
            chmod(d.join("new.sh"), 0o755)
        }),
        Code::PROPOSAL_MODE_CHANGE
    );
    assert_eq!(
        refusal(&|d| std::os::unix::fs::symlink("/etc/passwd", d.join("leak")).unwrap()),
        Code::SYMLINK_TARGET_INVALID
    );
    assert_eq!(
        refusal(&|d| std::os::unix::fs::symlink("../../outside", d.join("leak")).unwrap()),
        Code::SYMLINK_TARGET_INVALID
    );
    assert_eq!(
        refusal(&|d| {
            std::fs::remove_file(d.join("link")).unwrap();
            std::fs::write(d.join("link"), "a file now\n").unwrap()
        }),
        Code::PROPOSAL_SYMLINK_CHANGE
    );
    assert_eq!(
        refusal(&|d| {
            std::fs::remove_file(d.join("calc.py")).unwrap();
            std::os::unix::fs::symlink("run.sh", d.join("calc.py")).unwrap()
        }),
        Code::PROPOSAL_SYMLINK_CHANGE
    );
    assert_eq!(
        refusal(&|d| std::fs::write(d.join("logo.bin"), b"\x89PNG\0\x02").unwrap()),
        Code::PROPOSAL_BINARY_CHANGE
    );
    assert_eq!(
        refusal(&|d| std::fs::write(d.join("calc.py"), b"caf\xe9\n").unwrap()),
        Code::PROPOSAL_BINARY_CHANGE
    );
    // Deleting a binary file needs no content: allowed.
    let f = fixture();
    std::fs::remove_file(f.clone.join("logo.bin")).unwrap();
    let repo = SourceRepo::open(&f.bare).unwrap();
    let built = proposal()
        .build(&repo, Changes::Worktree(&f.clone))
        .unwrap();
    assert_eq!(changes(&built.task), pairs(&[("delete_file", "logo.bin")]));
}

#[test]
fn a_git_diff_becomes_the_same_task_as_the_worktree_it_came_from() {
    let f = fixture();
    std::fs::write(f.clone.join("calc.py"), CALC.replace("a - b", "a + b")).unwrap();
    std::fs::write(f.clone.join("NEW.md"), "hello\n").unwrap();
    std::fs::remove_file(f.clone.join("test_calc.py")).unwrap();
    git(&f.clone, &["add", "-A"]);
    let diff = git(&f.clone, &["diff", "--cached"]) + "\n";
    let repo = SourceRepo::open(&f.bare).unwrap();
    let from_tree = proposal()
        .build(&repo, Changes::Worktree(&f.clone))
        .unwrap();
    let from_patch = proposal().build(&repo, Changes::Patch(&diff)).unwrap();
    assert_eq!(from_patch.task, from_tree.task);
    assert_eq!(from_patch.edits.len(), 3);
}

/// Symbolic links travel as themselves: a new one, a retargeted one and a
/// deleted one, from a work tree and from the git diff of the same work
/// tree (the same task), each guarded by the base's target.
#[test]
fn symlinks_are_added_retargeted_and_deleted_from_a_worktree_and_a_diff() {
    let f = fixture();
    let repo = SourceRepo::open(&f.bare).unwrap();
    std::fs::remove_file(f.clone.join("link")).unwrap();
    std::os::unix::fs::symlink("run.sh", f.clone.join("link")).unwrap();
    std::fs::create_dir(f.clone.join("docs")).unwrap();
    std::os::unix::fs::symlink("../calc.py", f.clone.join("docs/calc")).unwrap();
    let from_tree = proposal()
        .build(&repo, Changes::Worktree(&f.clone))
        .unwrap();
    let set = &from_tree.task["plan"]["execution"]["change_set"];
    assert_eq!(
        changes(&from_tree.task),
        pairs(&[("write_symlink", "docs/calc"), ("write_symlink", "link")])
    );
    assert_eq!(set[0]["target"], "../calc.py");
    assert!(set[0].get("expected_sha256").is_none(), "a new link");
    assert_eq!(set[1]["target"], "run.sh");
    assert_eq!(set[1]["expected_sha256"], sha256_hex(b"calc.py"));
    git(&f.clone, &["add", "-A"]);
    let diff = git(&f.clone, &["diff", "--cached"]) + "\n";
    let from_patch = proposal().build(&repo, Changes::Patch(&diff)).unwrap();
    assert_eq!(from_patch.task, from_tree.task);

    std::fs::remove_file(f.clone.join("link")).unwrap();
    std::fs::remove_file(f.clone.join("docs/calc")).unwrap();
    git(&f.clone, &["add", "-A"]);
    let deleted = proposal()
        .build(&repo, Changes::Worktree(&f.clone))
        .unwrap();
    assert_eq!(changes(&deleted.task), pairs(&[("delete_file", "link")]));
    assert_eq!(
        deleted.task["plan"]["execution"]["change_set"][0]["expected_sha256"],
        sha256_hex(b"calc.py")
    );
    let diff = git(&f.clone, &["diff", "--cached"]) + "\n";
    let from_patch = proposal().build(&repo, Changes::Patch(&diff)).unwrap();
    assert_eq!(from_patch.task, deleted.task);
}

#[test]
fn a_hunk_that_does_not_apply_names_the_file_and_line() {
    let f = fixture();
    let repo = SourceRepo::open(&f.bare).unwrap();
    let code = |patch: &str| proposal().build(&repo, Changes::Patch(patch)).unwrap_err();
    let stale = "--- a/calc.py\n+++ b/calc.py\n@@ -2 +2 @@\n-    return a * b\n+    return a + b\n";
    let e = code(stale);
    assert_eq!(e.code, Code::PATCH_HUNK_FAILED);
    let d = e.detail.unwrap();
    assert!(d.contains("calc.py") && d.contains("line 2"), "{d}");
    let missing = "--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-a\n+b\n";
    assert_eq!(code(missing).code, Code::PATCH_HUNK_FAILED);
    let exists = "--- /dev/null\n+++ b/calc.py\n@@ -0,0 +1 @@\n+x\n";
    assert_eq!(code(exists).code, Code::PATCH_HUNK_FAILED);
    let mode = "diff --git a/calc.py b/calc.py\nold mode 100644\nnew mode 100755\n";
    assert_eq!(code(mode).code, Code::PROPOSAL_MODE_CHANGE);
    let link = "--- a/link\n+++ b/link\n@@ -1 +1 @@\n-calc.py\n+run.sh\n";
    assert_eq!(code(link).code, Code::PROPOSAL_SYMLINK_CHANGE);
}

#[test]
fn coordinates_resolve_from_the_repository() {
    let f = fixture();
    let repo = SourceRepo::open(&f.bare).unwrap();
    std::fs::write(f.clone.join("calc.py"), "y = 2\n").unwrap();
    let tree = Changes::Worktree(&f.clone);
    let mut p = proposal();
    p.base = "nonexistent-branch".into();
    assert_eq!(
        p.build(&repo, tree).unwrap_err().code,
        Code::REVISION_NOT_FOUND
    );
    p.base = "--upload-pack=x".into();
    assert_eq!(
        p.build(&repo, tree).unwrap_err().code,
        Code::REVISION_NOT_FOUND
    );
    p.base = f.base[..10].to_owned();
    assert_eq!(p.build(&repo, tree).unwrap().base_oid, f.base);
    p.branch = Some("main".into());
    assert_eq!(
        p.build(&repo, tree).unwrap_err().code,
        Code::PROTECTED_REF_DENY
    );
    // An existing agent/ branch is continued from its head.
    git(&f.bare, &["branch", "agent/work", &f.base]);
    p.branch = Some("agent/work".into());
    let built = p.build(&repo, tree).unwrap();
    assert_eq!(built.task["binding"]["branch_mode"], "CONTINUE_EXISTING");
    // Without a branch named, a generated branch that exists is refused.
    let mut q = proposal();
    q.task_id = Some("work".into());
    assert_eq!(
        q.build(&repo, tree).unwrap_err().code,
        Code::REF_CAS_MISMATCH
    );
    // Generated ids are task ids.
    let mut r = proposal();
    r.task_id = None;
    let built = r.build(&repo, tree).unwrap();
    assert!(built.task_id.starts_with("p-"), "{}", built.task_id);
    assert_eq!(built.target_branch, format!("agent/{}", built.task_id));
}

#[test]
fn verification_commands_are_split_like_a_shell_and_resolved_against_the_allowlist() {
    let programs: Vec<PathBuf> = vec!["/usr/bin/python3".into(), "/usr/bin/git".into()];
    let c = verify_command("python3 -m pytest -q -k 'add and not slow'", 30, &programs).unwrap();
    assert_eq!(
        c.argv,
        [
            "/usr/bin/python3",
            "-m",
            "pytest",
            "-q",
            "-k",
            "add and not slow"
        ]
    );
    assert_eq!(c.label, "python3 -m pytest -q -k 'add and not slow'");
    // Shell syntax is not interpreted: `;` and `$(…)` are just arguments.
    let c = verify_command("git log; rm -rf $(pwd)", 30, &programs).unwrap();
    assert_eq!(c.argv, ["/usr/bin/git", "log;", "rm", "-rf", "$(pwd)"]);
    let code = |t: &str, s: u32| verify_command(t, s, &programs).unwrap_err().code;
    assert_eq!(code("sh -c true", 30), Code::COMMAND_PROGRAM_DENY);
    assert_eq!(code("bin/test", 30), Code::COMMAND_INVALID);
    assert_eq!(code("python3 'unbalanced", 30), Code::COMMAND_INVALID);
    assert_eq!(code("", 30), Code::COMMAND_INVALID);
    assert_eq!(code("python3", 0), Code::COMMAND_TIMEOUT_INVALID);
    assert_eq!(
        verify_command("/opt/x/run", 30, &programs).unwrap().argv,
        ["/opt/x/run"]
    );
}

/// Read through git's index, a work tree still proposes exactly what
/// differs: a change committed in the clone (clean in its index, not in
/// the base) is proposed; a file only touched (its stat changed, its
/// content not) is compared and left out; a file edited after its commit
/// is proposed with what it holds now, not what the index recorded; a
/// path in conflict is not taken from the index. (That unchanged files
/// are then not read is shown by its cost, in bench-e2e, not here.)
#[test]
fn a_worktree_is_read_through_its_index_and_its_stat_cache() {
    let f = fixture();
    // Committed in the clone: clean in the index, ahead of the base.
    std::fs::write(f.clone.join("calc.py"), CALC.replace("a - b", "a + b")).unwrap();
    git(&f.clone, &["commit", "-q", "-am", "fix"]);
    // Touched only: stat differs from the index, content does not.
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
    std::fs::File::options()
        .append(true)
        .open(f.clone.join("test_calc.py"))
        .unwrap()
        .set_modified(later)
        .unwrap();
    // Committed, then changed again without telling git.
    std::fs::write(f.clone.join("NOTES.md"), "one\n").unwrap();
    git(&f.clone, &["add", "NOTES.md"]);
    git(&f.clone, &["commit", "-q", "-m", "notes"]);
    std::fs::write(f.clone.join("NOTES.md"), "two\n").unwrap();

    let repo = SourceRepo::open(&f.bare).unwrap();
    let built = proposal()
        .build(&repo, Changes::Worktree(&f.clone))
        .unwrap();
    assert_eq!(
        changes(&built.task),
        pairs(&[("write_file", "NOTES.md"), ("write_file", "calc.py")])
    );
    let set = built.task["plan"]["execution"]["change_set"]
        .as_array()
        .unwrap();
    assert_eq!(set[0]["content"], "two\n");
    assert_eq!(set[1]["content"], CALC.replace("a - b", "a + b"));

    // A path in conflict is not taken from the index either.
    git(&f.clone, &["checkout", "-q", "-f", "-b", "side", "HEAD~2"]);
    std::fs::write(f.clone.join("calc.py"), "side\n").unwrap();
    git(&f.clone, &["commit", "-q", "-am", "side"]);
    let merge = Command::new("git")
        .args(["-C"])
        .arg(&f.clone)
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t.invalid",
            "merge",
            "-q",
            "main",
        ])
        .output()
        .unwrap();
    assert!(!merge.status.success(), "the merge conflicts");
    std::fs::write(f.clone.join("calc.py"), "resolved\n").unwrap();
    let built = proposal()
        .build(&repo, Changes::Worktree(&f.clone))
        .unwrap();
    let calc = built.task["plan"]["execution"]["change_set"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["path"] == "calc.py")
        .cloned()
        .expect("calc.py proposed");
    assert_eq!(calc["content"], "resolved\n");
}

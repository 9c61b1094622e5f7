//! A repository whose layout relies on symbolic links, through the whole
//! pipeline (`airlock-local up --repo`, `airlockctl propose --worktree`,
//! the real worker and executor): the verification command sees every
//! link of the tree as a link with its target — a file link, a directory
//! link, one to outside the tree — and a proposal that adds a link,
//! retargets one and deletes one lands on agent/<id> as links (mode
//! 120000, the target as the blob). A link whose target leaves the tree is
//! refused before anything is submitted.

use airlock_testkit::{git, git_dir, last_json};
use serde_json::Value;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;
use std::process::Output;

/// The project's own check: each link is a link (readlink, which every
/// view allows), with its target, and reading through it gives the file.
const CHECK: &str = r#"import json, os, sys
want = json.load(open("links.json"))
for path, target in want.items():
    found = os.readlink(path)
    assert found == target, f"{path} -> {found}, expected {target}"
    if not target.startswith("/") and not os.path.isdir(path):
        resolved = os.path.join(os.path.dirname(path), target)
        assert open(path).read() == open(resolved).read(), f"{path} reads otherwise"
assert open("current/data.txt").read() == "42\n"
print("links as the tree has them:", ", ".join(sorted(want)))
"#;

fn links_json(links: &[(&str, &str)]) -> String {
    let map: serde_json::Map<String, Value> = links
        .iter()
        .map(|(p, t)| ((*p).to_owned(), Value::from(*t)))
        .collect();
    Value::Object(map).to_string() + "\n"
}

fn project(dir: &Path) -> std::path::PathBuf {
    let src = dir.join("linked");
    std::fs::create_dir_all(src.join("pkg")).unwrap();
    std::fs::write(src.join("pkg/data.txt"), "42\n").unwrap();
    std::fs::write(src.join("pkg/other.txt"), "43\n").unwrap();
    std::fs::write(src.join("check.py"), CHECK).unwrap();
    symlink("pkg/data.txt", src.join("data")).unwrap();
    symlink("pkg", src.join("current")).unwrap();
    symlink("/etc/hostname", src.join("host")).unwrap();
    std::fs::write(
        src.join("links.json"),
        links_json(&[
            ("data", "pkg/data.txt"),
            ("current", "pkg"),
            ("host", "/etc/hostname"),
        ]),
    )
    .unwrap();
    git(&src, &["init", "-q", "-b", "main"]);
    git(&src, &["add", "-A"]);
    git(&src, &["commit", "-q", "-m", "a tree with links"]);
    src
}

fn ctl(bus: &str, args: &[&str]) -> Output {
    airlock_testkit::airlockctl(&airlock_local::sibling("airlockctl").unwrap(), bus, args)
}

#[test]
fn links_are_in_the_workspace_and_a_proposal_adds_retargets_and_deletes_them() {
    let scratch = tempfile::tempdir().unwrap();
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let src = project(scratch.path());
    let suite = airlock_local::start_with(
        scratch.path().join("state"),
        true,
        &airlock_local::Tuning {
            repositories: vec![("linked".into(), src.clone())],
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("starting airlock-local: {e}"));
    let bus = suite.bus.address().to_owned();
    let config = suite.layout.config();
    let cfg = config.to_str().unwrap();
    let authority = suite.layout.repos().join("linked.git");

    // A planner's clone of the registered repository.
    let clone = |name: &str| {
        let dir = scratch.path().join(name);
        let args = [
            "repo",
            "--config",
            cfg,
            "clone",
            "linked",
            dir.to_str().unwrap(),
        ];
        let cloned = ctl(&bus, &args);
        assert!(
            cloned.status.success(),
            "{}",
            String::from_utf8_lossy(&cloned.stderr)
        );
        dir
    };
    let work = clone("planner");
    // Add a link in a new directory, retarget one, delete one.
    std::fs::create_dir(work.join("docs")).unwrap();
    symlink("../pkg/data.txt", work.join("docs/data")).unwrap();
    std::fs::remove_file(work.join("data")).unwrap();
    symlink("pkg/other.txt", work.join("data")).unwrap();
    std::fs::remove_file(work.join("host")).unwrap();
    std::fs::write(
        work.join("links.json"),
        links_json(&[
            ("data", "pkg/other.txt"),
            ("current", "pkg"),
            ("docs/data", "../pkg/data.txt"),
        ]),
    )
    .unwrap();
    let propose = |dir: &Path| {
        ctl(
            &bus,
            &[
                "--json",
                "propose",
                "--config",
                cfg,
                "--repo",
                "linked",
                "--base",
                "main",
                "--worktree",
                dir.to_str().unwrap(),
                "--verify",
                "python3 check.py",
                "--max-attempts",
                "1",
                "--wait",
            ],
        )
    };
    let out = propose(&work);
    let done = last_json(&out);
    assert!(
        out.status.success(),
        "{done}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(done["state"], "SUCCEEDED", "{done}");
    let commit = done["result"]["commit_oid"].as_str().unwrap().to_owned();
    let listing = git_dir(
        &authority,
        &["ls-tree", "-r", "--format=%(objectmode) %(path)", &commit],
    );
    for line in ["120000 current", "120000 data", "120000 docs/data"] {
        assert!(
            listing.lines().any(|l| l == line),
            "{line} not in\n{listing}"
        );
    }
    assert!(
        !listing.contains(" host"),
        "the deleted link is gone\n{listing}"
    );
    for (path, target) in [("data", "pkg/other.txt"), ("docs/data", "../pkg/data.txt")] {
        assert_eq!(
            git_dir(&authority, &["cat-file", "-p", &format!("{commit}:{path}")]),
            target
        );
    }
    // check.py ran in the sandbox and found every link with its target.
    assert_eq!(done["result"]["verification"][0]["exit_code"], 0, "{done}");

    // A link out of the tree is refused with its code; nothing is submitted.
    let other = clone("planner-2");
    symlink("/etc/passwd", other.join("leak")).unwrap();
    let before = git_dir(&authority, &["for-each-ref", "--format=%(refname)"]);
    let out = propose(&other);
    assert!(!out.status.success());
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("SYMLINK_TARGET_INVALID"), "{text}");
    assert_eq!(
        git_dir(&authority, &["for-each-ref", "--format=%(refname)"]),
        before
    );
}

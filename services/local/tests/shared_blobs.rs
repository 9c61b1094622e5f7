//! Files of the same content through the whole pipeline: the executor
//! keeps such a blob once (each file of its tree cache is a hard link to
//! its blob in the store), and yet they stay separate files in the
//! workspace, as git has them — a command that writes one sees the others
//! unchanged, and the next task finds the cached tree as it was.

use airlock_testkit::{git, last_json};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// The project's own check: writes one of the equal files (appending,
/// then rewriting in place), and the others must still hold what the tree
/// has; fails on the first task if a write reached another path, and on
/// the second if it reached the cached tree.
const CHECK: &str = r#"import os
for path in ("a.txt", "b.txt", "dir/c.txt", "run.sh"):
    assert open(path).read() == "same\n", f"{path} does not hold what the tree has"
with open("a.txt", "a") as f:
    f.write("appended\n")
with open("dir/c.txt", "r+") as f:
    f.write("SAME")
assert open("b.txt").read() == "same\n", "a write to a.txt reached b.txt"
assert open("run.sh").read() == "same\n", "a write reached the executable copy"
assert os.access("run.sh", os.X_OK) and not os.access("b.txt", os.X_OK)
print("equal files stay separate")
"#;

fn project(dir: &Path) -> std::path::PathBuf {
    let src = dir.join("equal");
    std::fs::create_dir_all(src.join("dir")).unwrap();
    for path in ["a.txt", "b.txt", "dir/c.txt", "run.sh"] {
        std::fs::write(src.join(path), "same\n").unwrap();
    }
    std::fs::set_permissions(src.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(src.join("check.py"), CHECK).unwrap();
    git(&src, &["init", "-q", "-b", "main"]);
    git(&src, &["add", "-A"]);
    git(&src, &["commit", "-q", "-m", "equal files"]);
    src
}

#[test]
fn equal_files_are_one_blob_in_the_cache_and_separate_files_in_the_workspace() {
    let scratch = tempfile::tempdir().unwrap();
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let src = project(scratch.path());
    let suite = airlock_local::start_with(
        scratch.path().join("state"),
        true,
        &airlock_local::Tuning {
            repositories: vec![("equal".into(), src.clone())],
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("starting airlock-local: {e}"));
    let bus = suite.bus.address().to_owned();
    let config_path = suite.layout.config();
    let config = config_path.to_str().unwrap();
    let ctl = airlock_local::sibling("airlockctl").unwrap();
    for round in 0..2 {
        let patch = format!(
            "diff --git a/note.txt b/note.txt\nnew file mode 100644\n--- /dev/null\n+++ b/note.txt\n@@ -0,0 +1 @@\n+round {round}\n"
        );
        let out = airlock_testkit::airlockctl_with_stdin(
            &ctl,
            &bus,
            &airlock_testkit::propose_args(config, "equal", "python3 check.py", "600"),
            &patch,
        );
        let done = last_json(&out);
        assert!(
            out.status.success(),
            "round {round}: {done}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(done["state"], "SUCCEEDED", "round {round}: {done}");
        assert_eq!(done["result"]["verification"][0]["exit_code"], 0, "{done}");
    }

    // In the cache, the three plain files are one blob; the executable is
    // the same blob kept once more with its mode.
    let work = suite.layout.path("exec/work");
    let entry = std::fs::read_dir(work.join("trees"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.join("seal.json").exists())
        .expect("a sealed entry");
    let ino = |rel: &str| {
        std::fs::metadata(entry.join("tree").join(rel))
            .unwrap()
            .ino()
    };
    assert_eq!(ino("a.txt"), ino("b.txt"));
    assert_eq!(ino("a.txt"), ino("dir/c.txt"));
    assert_ne!(ino("a.txt"), ino("run.sh"));
    let blob = hex::encode(airlock_proto::tree::object_id(
        airlock_proto::tree::ObjectFormat::Sha1,
        "blob",
        b"same\n",
    ));
    let stored = std::fs::metadata(work.join("blobs").join(&blob)).unwrap();
    assert_eq!(stored.ino(), ino("a.txt"));
    assert_eq!(stored.nlink(), 4, "three paths and the store's name");
    assert_eq!(
        std::fs::metadata(work.join("blobs").join(format!("{blob}.x")))
            .unwrap()
            .ino(),
        ino("run.sh")
    );
}

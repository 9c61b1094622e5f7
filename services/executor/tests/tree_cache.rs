//! The tree cache across restarts: opening it reads no entry's files
//! (start-up costs the same with a full cache), the first use of an entry
//! in a process checks it against the stamp its seal recorded, an entry
//! changed behind the executor's back is a miss that is filled again, and
//! an entry sealed before stamps existed, or before the machine last
//! booted, is hashed in full once, then stamped.

mod common;

use airlock_executor::apply::CredentialPolicy;
use airlock_executor::tree::extract::ArchiveLimits;
use airlock_executor::tree::{CacheLimits, TreeCache};
use common::*;
use serde_json::{Value, json};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

const LIMITS: CacheLimits = CacheLimits {
    max_entries: 8,
    max_bytes: 1 << 30,
};

fn archive_limits() -> ArchiveLimits {
    ArchiveLimits {
        max_entries: 100,
        max_file_bytes: 1 << 20,
        max_total_bytes: 4 << 20,
        max_expansion_ratio: 100,
    }
}

/// An archive of two files, and its tree id.
fn source() -> (Vec<u8>, String) {
    let archive = tar_of(&[
        ("hello.py", b"VALUE = 1\n", 0o644),
        ("lib/util.py", b"def f():\n    return 1\n", 0o644),
    ]);
    let env = envelope(
        "task-tree-cache",
        json!({
            "action": "deterministic",
            "change_set": [{"path": "hello.py", "operation": "write_file", "content": "VALUE = 2\n"}],
            "verification": [],
            "capability_scope": [],
        }),
    );
    let tree = exec_request(&env, &archive).source_tree;
    (archive, tree)
}

/// A cache in `work` with `tree` filled from `archive`.
fn filled(work: &Path, archive: &[u8], tree: &str) -> TreeCache {
    let (cache, found) = TreeCache::open(work, LIMITS, None).unwrap();
    assert!(found.kept.is_empty() && found.removed.is_empty());
    let got = cache
        .fill(
            tree,
            archive,
            &archive_limits(),
            &CredentialPolicy::default(),
        )
        .unwrap();
    assert!(got.filled);
    cache
}

fn entry(work: &Path, tree: &str) -> PathBuf {
    work.join("trees").join(tree)
}

fn seal(work: &Path, tree: &str) -> Value {
    serde_json::from_slice(&std::fs::read(entry(work, tree).join("seal.json")).unwrap()).unwrap()
}

#[test]
fn an_entry_changed_behind_the_executors_back_is_a_miss_and_is_filled_again() {
    let work = tempfile::tempdir().unwrap();
    let (archive, tree) = source();
    drop(filled(work.path(), &archive, &tree));
    assert!(seal(work.path(), &tree)["stamp"].is_string());

    // While no executor runs, a file of the entry is rewritten.
    let file = entry(work.path(), &tree).join("tree/hello.py");
    std::fs::write(&file, b"VALUE = 666\n").unwrap();

    // A restart keeps the entry: it reads none of its files.
    let (cache, found) = TreeCache::open(work.path(), LIMITS, None).unwrap();
    assert_eq!(found.kept, std::slice::from_ref(&tree));
    assert!(found.removed.is_empty());
    // Its first use finds the change: a miss, and the entry is gone.
    assert!(cache.get(&tree).is_none());
    assert!(!entry(work.path(), &tree).exists());
    // Filled again from the source, it is the tree again.
    let again = cache
        .fill(
            &tree,
            &archive,
            &archive_limits(),
            &CredentialPolicy::default(),
        )
        .unwrap();
    assert!(again.filled);
    assert_eq!(
        std::fs::read(again.path.join("hello.py")).unwrap(),
        b"VALUE = 1\n"
    );
    assert!(cache.get(&tree).is_some());
}

#[test]
fn metadata_changes_and_added_files_are_seen_too() {
    let (archive, tree) = source();
    type Change = (&'static str, fn(&Path));
    let changes: [Change; 3] = [
        ("a chmod", |t| {
            std::fs::set_permissions(t.join("hello.py"), std::fs::Permissions::from_mode(0o755))
                .unwrap();
        }),
        ("a file added", |t| {
            std::fs::write(t.join("lib/extra.py"), b"x = 1\n").unwrap();
        }),
        ("a file replaced by another with the same content", |t| {
            std::fs::write(t.join("new.tmp"), b"VALUE = 1\n").unwrap();
            std::fs::rename(t.join("new.tmp"), t.join("hello.py")).unwrap();
        }),
    ];
    for (what, change) in changes {
        let work = tempfile::tempdir().unwrap();
        drop(filled(work.path(), &archive, &tree));
        change(&entry(work.path(), &tree).join("tree"));
        let (cache, _) = TreeCache::open(work.path(), LIMITS, None).unwrap();
        assert!(cache.get(&tree).is_none(), "{what} went unseen");
    }
    // Unchanged, it is served across restarts.
    let work = tempfile::tempdir().unwrap();
    drop(filled(work.path(), &archive, &tree));
    for _ in 0..2 {
        let (cache, _) = TreeCache::open(work.path(), LIMITS, None).unwrap();
        let got = cache.get(&tree).expect("an intact entry is served");
        assert!(!got.filled);
        assert_eq!(got.files, 2);
    }
}

#[test]
fn an_entry_sealed_without_a_stamp_is_hashed_on_first_use_then_stamped() {
    let (archive, tree) = source();
    // As an earlier release sealed it: schema v1, no stamp.
    let unstamp = |work: &Path| {
        let mut s = seal(work, &tree);
        s["schema"] = json!("airlock.tree-cache-seal.v1");
        s.as_object_mut().unwrap().remove("stamp");
        std::fs::write(
            entry(work, &tree).join("seal.json"),
            serde_json::to_vec(&s).unwrap(),
        )
        .unwrap();
    };
    let work = tempfile::tempdir().unwrap();
    drop(filled(work.path(), &archive, &tree));
    unstamp(work.path());
    let (cache, found) = TreeCache::open(work.path(), LIMITS, None).unwrap();
    assert_eq!(found.kept, std::slice::from_ref(&tree));
    assert!(cache.get(&tree).is_some(), "an intact v1 entry is served");
    let now = seal(work.path(), &tree);
    assert_eq!(now["schema"], "airlock.tree-cache-seal.v4");
    assert!(now["stamp"].is_string(), "and stamped: {now}");
    drop(cache);
    let (cache, _) = TreeCache::open(work.path(), LIMITS, None).unwrap();
    assert!(cache.get(&tree).is_some(), "then checked by its stamp");

    // A v1 entry whose content changed does not hash to its key.
    let work = tempfile::tempdir().unwrap();
    drop(filled(work.path(), &archive, &tree));
    unstamp(work.path());
    std::fs::write(
        entry(work.path(), &tree).join("tree/lib/util.py"),
        b"def f():\n    return 2\n",
    )
    .unwrap();
    let (cache, _) = TreeCache::open(work.path(), LIMITS, None).unwrap();
    assert!(cache.get(&tree).is_none());
    assert!(!entry(work.path(), &tree).exists());
}

#[test]
fn an_entry_sealed_before_this_boot_is_hashed_in_full_on_first_use() {
    let (archive, tree) = source();
    let work = tempfile::tempdir().unwrap();
    drop(filled(work.path(), &archive, &tree));
    let sealed = seal(work.path(), &tree);
    assert_eq!(
        sealed["boot"].as_str(),
        airlock_executor::tree::boot_id().as_deref()
    );
    // As if sealed in an earlier boot, with a power loss that took a
    // file's data and left its metadata (the stamp would not see it).
    let mut earlier = sealed.clone();
    earlier["boot"] = json!("00000000-0000-0000-0000-000000000000");
    std::fs::write(
        entry(work.path(), &tree).join("seal.json"),
        serde_json::to_vec(&earlier).unwrap(),
    )
    .unwrap();
    let file = entry(work.path(), &tree).join("tree/hello.py");
    let f = std::fs::File::options().write(true).open(&file).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"\0\0\0\0\0", 0).unwrap();
    drop(f);
    let mut forged = earlier.clone();
    forged["stamp"] = json!(stamp_of(&entry(work.path(), &tree)));
    std::fs::write(
        entry(work.path(), &tree).join("seal.json"),
        serde_json::to_vec(&forged).unwrap(),
    )
    .unwrap();
    let (cache, _) = TreeCache::open(work.path(), LIMITS, None).unwrap();
    assert!(cache.get(&tree).is_none(), "hashed, and found torn");

    // Intact, it is hashed once and stamped for this boot.
    let work = tempfile::tempdir().unwrap();
    drop(filled(work.path(), &archive, &tree));
    std::fs::write(
        entry(work.path(), &tree).join("seal.json"),
        serde_json::to_vec(&earlier).unwrap(),
    )
    .unwrap();
    let (cache, _) = TreeCache::open(work.path(), LIMITS, None).unwrap();
    assert!(cache.get(&tree).is_some());
    assert_eq!(
        seal(work.path(), &tree)["boot"].as_str(),
        airlock_executor::tree::boot_id().as_deref()
    );
}

#[test]
fn an_entry_sealed_by_the_previous_release_is_hashed_once_and_linked_to_the_blob_store() {
    let (archive, tree) = source();
    let work = tempfile::tempdir().unwrap();
    drop(filled(work.path(), &archive, &tree));
    // As the previous release left it: files of its own, no blob store,
    // a v3 seal.
    std::fs::remove_dir_all(work.path().join("blobs")).unwrap();
    let mut s = seal(work.path(), &tree);
    s["schema"] = json!("airlock.tree-cache-seal.v3");
    std::fs::write(
        entry(work.path(), &tree).join("seal.json"),
        serde_json::to_vec(&s).unwrap(),
    )
    .unwrap();
    let hello = entry(work.path(), &tree).join("tree/hello.py");
    assert_eq!(std::fs::metadata(&hello).unwrap().nlink(), 1);
    let (cache, _) = TreeCache::open(work.path(), LIMITS, None).unwrap();
    assert!(cache.get(&tree).is_some(), "an intact v3 entry is served");
    assert_eq!(
        seal(work.path(), &tree)["schema"],
        "airlock.tree-cache-seal.v4"
    );
    // Each file is now its blob in the store.
    let mut blobs: Vec<String> = std::fs::read_dir(work.path().join("blobs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    blobs.sort();
    let mut want = vec![
        blob_id(b"VALUE = 1\n"),
        blob_id(b"def f():\n    return 1\n"),
    ];
    want.sort();
    assert_eq!(blobs, want);
    assert_eq!(std::fs::metadata(&hello).unwrap().nlink(), 2);
    drop(cache);
    let (cache, _) = TreeCache::open(work.path(), LIMITS, None).unwrap();
    assert!(cache.get(&tree).is_some(), "then checked by its stamp");
}

/// The stamp of an entry as it is now.
fn stamp_of(entry: &Path) -> String {
    airlock_executor::tree::Stamp::of_entry(entry)
        .unwrap()
        .to_hex()
}

#[test]
fn a_start_removes_interrupted_fills_and_unsealed_entries() {
    let (archive, tree) = source();
    let work = tempfile::tempdir().unwrap();
    drop(filled(work.path(), &archive, &tree));
    let trees = work.path().join("trees");
    std::fs::create_dir_all(trees.join(format!(".fill-{tree}-42/tree"))).unwrap();
    let other = "ab".repeat(20);
    std::fs::create_dir_all(trees.join(&other).join("tree")).unwrap();
    let (_cache, found) = TreeCache::open(work.path(), LIMITS, None).unwrap();
    assert_eq!(found.kept, std::slice::from_ref(&tree));
    let mut removed: Vec<&str> = found.removed.iter().map(|(t, _)| t.as_str()).collect();
    removed.sort();
    assert_eq!(removed.len(), 2, "{:?}", found.removed);
    assert!(!trees.join(&other).exists());
    assert!(!trees.join(format!(".fill-{tree}-42")).exists());
}

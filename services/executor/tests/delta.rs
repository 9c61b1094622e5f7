//! Source deltas against a cached tree: only what differs crosses the
//! spool, what is assembled is the request's tree (checked again by a full
//! rehash and by a fresh process's stamp check), a delta that lies is
//! refused with its code, a held entry another request waits on is copied
//! rather than moved, and a corrupted entry is refused with
//! TREE_CACHE_CORRUPT and fetched again.

mod common;

use airlock_executor::apply::CredentialPolicy;
use airlock_executor::tree::extract::ArchiveLimits;
use airlock_executor::tree::{CacheLimits, TreeCache};
use airlock_git::AuthorityRepo;
use airlock_proto::Code;
use airlock_proto::tree::ObjectFormat;
use common::blob_id;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const LIMITS: CacheLimits = CacheLimits {
    max_entries: 8,
    max_bytes: 1 << 30,
};

fn archive_limits() -> ArchiveLimits {
    ArchiveLimits {
        max_entries: 10_000,
        max_file_bytes: 1 << 20,
        max_total_bytes: 64 << 20,
        max_expansion_ratio: 100,
    }
}

fn git_limits() -> airlock_git::ArchiveLimits {
    airlock_git::ArchiveLimits {
        max_entries: 10_000,
        max_file_bytes: 1 << 20,
        max_total_bytes: 64 << 20,
    }
}

/// A work tree and its bare clone, committed step by step.
struct Repo {
    dir: tempfile::TempDir,
}

impl Repo {
    fn new() -> Repo {
        let dir = tempfile::tempdir().unwrap();
        let r = Repo { dir };
        r.git(&["init", "-q", "-b", "main", "work"]);
        r
    }

    fn work(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    fn git(&self, args: &[&str]) -> String {
        let out = Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
            .args(args)
            .current_dir(if self.work().exists() {
                self.work()
            } else {
                self.dir.path().to_owned()
            })
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    fn write(&self, path: &str, content: &str) {
        let p = self.work().join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }

    /// Commits everything; returns the commit and its tree.
    fn commit(&self) -> (String, String) {
        self.git(&["add", "-A"]);
        self.git(&["commit", "-q", "--allow-empty", "-m", "step"]);
        (
            self.git(&["rev-parse", "HEAD"]),
            self.git(&["rev-parse", "HEAD^{tree}"]),
        )
    }

    fn authority(&self) -> AuthorityRepo {
        let bare = self.dir.path().join("bare.git");
        let _ = std::fs::remove_dir_all(&bare);
        let out = Command::new("git")
            .args(["clone", "-q", "--bare"])
            .arg(self.work())
            .arg(&bare)
            .output()
            .unwrap();
        assert!(out.status.success());
        AuthorityRepo::open(&bare).unwrap()
    }
}

/// The first tree: files in nested directories, an executable, a link, a
/// credential-like file.
fn first(repo: &Repo) -> (String, String) {
    repo.write("README.md", "hello\n");
    for i in 0..30 {
        repo.write(
            &format!("src/mod{}/file{i}.py", i % 3),
            &format!("V = {i}\n"),
        );
    }
    repo.write("gone/a.txt", "a\n");
    repo.write("gone/deep/b.txt", "b\n");
    repo.write("becomes_dir", "file now\n");
    repo.write("becomes_file/x", "x\n");
    repo.write("run.sh", "#!/bin/sh\n");
    repo.write(".env", "SECRET=1\n");
    std::os::unix::fs::symlink("README.md", repo.work().join("link")).unwrap();
    repo.commit()
}

/// The second: one file edited, a directory removed, a file become a
/// directory and the reverse, a mode change, a link retargeted, a new
/// nested directory, the credential file edited.
fn second(repo: &Repo) -> (String, String) {
    repo.write("src/mod1/file1.py", "V = 'changed'\n");
    std::fs::remove_dir_all(repo.work().join("gone")).unwrap();
    std::fs::remove_file(repo.work().join("becomes_dir")).unwrap();
    repo.write("becomes_dir/inner/y", "y\n");
    std::fs::remove_dir_all(repo.work().join("becomes_file")).unwrap();
    repo.write("becomes_file", "a file\n");
    std::fs::set_permissions(
        repo.work().join("run.sh"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::fs::remove_file(repo.work().join("link")).unwrap();
    std::os::unix::fs::symlink("src/mod0/file0.py", repo.work().join("link")).unwrap();
    repo.write("new/a/b/c.txt", "c\n");
    repo.write(".env", "SECRET=2\n");
    repo.commit()
}

/// A repository with the two trees, as commits and tree ids.
struct Two {
    repo: Repo,
    c1: String,
    t1: String,
    c2: String,
    t2: String,
    authority: AuthorityRepo,
}

fn two_trees() -> Two {
    let repo = Repo::new();
    let (c1, t1) = first(&repo);
    let (c2, t2) = second(&repo);
    let authority = repo.authority();
    Two {
        repo,
        c1,
        t1,
        c2,
        t2,
        authority,
    }
}

/// A fresh cache holding `tree` (of `commit`), filled from its archive.
fn holding(authority: &AuthorityRepo, commit: &str, tree: &str) -> (tempfile::TempDir, TreeCache) {
    let work = tempfile::tempdir().unwrap();
    let (cache, _) = TreeCache::open(work.path(), LIMITS, None).unwrap();
    fill(&cache, authority, commit, tree);
    (work, cache)
}

fn entry(work: &Path, tree: &str) -> PathBuf {
    work.join("trees").join(tree)
}

fn fill(cache: &TreeCache, authority: &AuthorityRepo, commit: &str, tree: &str) {
    let mut archive = Vec::new();
    authority
        .source_archive(commit, &git_limits(), &mut archive)
        .unwrap();
    let got = cache
        .receive(
            tree,
            &archive,
            &archive_limits(),
            &CredentialPolicy::default(),
            &mut || {},
        )
        .unwrap();
    assert!(got.filled);
}

fn delta(authority: &AuthorityRepo, base: &str, commit: &str) -> Vec<u8> {
    let mut bytes = Vec::new();
    let tree = authority.tree_of(commit).unwrap();
    authority
        .source_delta(base, &tree, &git_limits(), true, &mut bytes)
        .unwrap()
        .expect("the repository knows the base");
    bytes
}

fn receive(cache: &TreeCache, tree: &str, bytes: &[u8]) -> Result<(), Code> {
    cache
        .receive(
            tree,
            bytes,
            &archive_limits(),
            &CredentialPolicy::default(),
            &mut || {},
        )
        .map(drop)
        .map_err(|e| {
            eprintln!("refused: {e}");
            e.code()
        })
}

#[test]
fn a_delta_makes_the_requests_tree_from_a_held_one_and_sends_only_what_differs() {
    let Two {
        repo: _repo,
        c1,
        t1,
        c2,
        t2,
        authority,
    } = two_trees();
    let (work, cache) = holding(&authority, &c1, &t1);
    assert_eq!(cache.haves(ObjectFormat::Sha1, 4), vec![t1.clone()]);

    let bytes = delta(&authority, &t1, &c2);
    let mut archive = Vec::new();
    authority
        .source_archive(&c2, &git_limits(), &mut archive)
        .unwrap();
    assert!(
        bytes.len() < archive.len() / 2,
        "the delta ({} bytes) carries less than the archive ({} bytes)",
        bytes.len(),
        archive.len()
    );
    receive(&cache, &t2, &bytes).unwrap();
    // The base entry moved forward: it is the new tree now.
    assert!(!entry(work.path(), &t1).exists());
    let root = entry(work.path(), &t2).join("tree");
    assert_eq!(
        std::fs::read_to_string(root.join("src/mod1/file1.py")).unwrap(),
        "V = 'changed'\n"
    );
    assert!(!root.join("gone").exists());
    assert_eq!(
        std::fs::read(root.join("becomes_dir/inner/y")).unwrap(),
        b"y\n"
    );
    assert!(
        std::fs::metadata(root.join("becomes_file"))
            .unwrap()
            .is_file()
    );
    assert_eq!(
        std::fs::metadata(root.join("run.sh"))
            .unwrap()
            .permissions()
            .mode()
            & 0o111,
        0o111
    );
    assert_eq!(
        std::fs::read_link(root.join("link")).unwrap(),
        Path::new("src/mod0/file0.py")
    );
    assert!(
        !root.join(".env").exists(),
        "a credential-like path is withheld"
    );
    // A full rehash gives the request's tree id.
    cache.verify(&t2).unwrap();
    drop(cache);
    // And a fresh process finds the entry as its seal's stamp says.
    let (cache, _) = TreeCache::open(work.path(), LIMITS, None).unwrap();
    let got = cache
        .get(&t2)
        .expect("the stamp updated by the delta holds");
    assert_eq!(got.files, 30 + 5, "README, run.sh, y, becomes_file, c.txt");

    // Back to the first tree: a delta the other way.
    let back = delta(&authority, &t2, &c1);
    receive(&cache, &t1, &back).unwrap();
    cache.verify(&t1).unwrap();
    drop(cache);
    let (cache, _) = TreeCache::open(work.path(), LIMITS, None).unwrap();
    assert!(cache.get(&t1).is_some());
    assert!(cache.get(&t2).is_none());
}

#[test]
fn a_delta_that_lies_is_refused_with_its_code() {
    let Two {
        repo,
        c1,
        t1,
        c2,
        t2,
        authority,
    } = two_trees();
    let bytes = delta(&authority, &t1, &c2);
    let (work, cache) = holding(&authority, &c1, &t1);

    // A member whose content is not its id.
    let needle = b"V = 'changed'\n";
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap();
    let mut forged = bytes.clone();
    forged[at + 5] = b'X';
    assert_eq!(
        receive(&cache, &t2, &forged),
        Err(Code::SOURCE_ARCHIVE_SHA_MISMATCH)
    );
    // A delta for another tree.
    assert_eq!(
        receive(&cache, &"0".repeat(40), &bytes),
        Err(Code::SOURCE_ARCHIVE_SHA_MISMATCH)
    );
    // Refused before anything changed: the base is still held whole.
    assert!(cache.get(&t1).is_some());
    cache.verify(&t1).unwrap();

    // A delta against a tree the cache does not hold.
    let (c3, t3) = {
        repo.write("third.txt", "3\n");
        repo.commit()
    };
    let authority = repo.authority();
    let mut none = Vec::new();
    let unknown = authority
        .source_delta(&"ab".repeat(20), &t3, &git_limits(), true, &mut none)
        .unwrap();
    assert!(
        unknown.is_none() && none.is_empty(),
        "an unknown base is no delta"
    );
    let from_t2 = delta(&authority, &t2, &c3);
    assert_eq!(
        receive(&cache, &t3, &from_t2),
        Err(Code::SOURCE_ARCHIVE_INVALID)
    );
    // A delta without the blob of a changed path.
    let mut tar = tar::Archive::new(bytes.as_slice());
    let mut builder = tar::Builder::new(Vec::new());
    for e in tar.entries().unwrap() {
        let mut e = e.unwrap();
        let name = e.path().unwrap().to_string_lossy().into_owned();
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut e, &mut data).unwrap();
        if name == format!("b/{}", blob_id(needle)) {
            continue;
        }
        let mut h = e.header().clone();
        builder.append_data(&mut h, &name, data.as_slice()).unwrap();
    }
    let short = builder.into_inner().unwrap();
    assert_eq!(
        receive(&cache, &t2, &short),
        Err(Code::SOURCE_ARCHIVE_INVALID)
    );
    assert!(cache.get(&t2).is_none(), "nothing half-made is served");
    // Refused half-way: the base is put back as it was.
    assert!(cache.get(&t1).is_some(), "the base is back");
    cache.verify(&t1).unwrap();
    assert!(!entry(work.path(), &t1).join("undo").exists());
}

#[test]
fn a_held_tree_another_request_waits_on_is_copied_not_moved() {
    let Two {
        repo: _repo,
        c1,
        t1,
        c2,
        t2,
        authority,
    } = two_trees();
    let (work, cache) = holding(&authority, &c1, &t1);
    cache.set_pins([t1.clone()].into_iter().collect());
    receive(&cache, &t2, &delta(&authority, &t1, &c2)).unwrap();
    cache.verify(&t1).unwrap();
    cache.verify(&t2).unwrap();
    drop(cache);
    let (cache, _) = TreeCache::open(work.path(), LIMITS, None).unwrap();
    assert!(cache.get(&t1).is_some() && cache.get(&t2).is_some());
}

#[test]
fn a_corrupted_object_is_refused_with_its_code_and_fetched_again() {
    let Two {
        repo,
        c1,
        t1,
        c2,
        t2,
        authority,
    } = two_trees();
    let bytes = delta(&authority, &t1, &c2);

    // A tree object of the held entry changed on disk: the delta's walk
    // reads it, refuses it, and the entry goes; the whole tree heals it.
    let (work, cache) = holding(&authority, &c1, &t1);
    let src = repo.git(&["rev-parse", &format!("{c1}:src")]);
    let object = entry(work.path(), &t1).join("objects").join(&src);
    let mut body = std::fs::read(&object).unwrap();
    body[0] ^= 1;
    std::fs::write(&object, body).unwrap();
    assert_eq!(receive(&cache, &t2, &bytes), Err(Code::TREE_CACHE_CORRUPT));
    assert!(
        !entry(work.path(), &t1).exists(),
        "the corrupted entry is removed"
    );
    assert!(cache.haves(ObjectFormat::Sha1, 4).is_empty());
    fill(&cache, &authority, &c2, &t2);
    cache.verify(&t2).unwrap();

    // A file of the held entry changed on disk: the next process's first
    // look finds it, so the entry is not offered as held, and the source
    // comes whole again.
    let (work, cache) = holding(&authority, &c1, &t1);
    drop(cache);
    std::fs::write(entry(work.path(), &t1).join("tree/README.md"), "tampered\n").unwrap();
    let (cache, _) = TreeCache::open(work.path(), LIMITS, None).unwrap();
    assert!(cache.haves(ObjectFormat::Sha1, 4).is_empty());
    assert!(!entry(work.path(), &t1).exists());
    fill(&cache, &authority, &c2, &t2);
    assert!(cache.get(&t2).is_some());
}

#[test]
fn a_delta_interrupted_mid_assembly_is_rolled_back_at_the_next_start() {
    let Two {
        repo: _repo,
        c1,
        t1,
        c2,
        t2,
        authority,
    } = two_trees();
    let bytes = delta(&authority, &t1, &c2);
    let (work, cache) = holding(&authority, &c1, &t1);
    // The process dies once the base's removed paths are put aside.
    let died = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = cache.receive(
            &t2,
            &bytes,
            &archive_limits(),
            &CredentialPolicy::default(),
            &mut || panic!("killed mid-assembly"),
        );
    }));
    assert!(died.is_err());
    drop(cache);
    assert!(!entry(work.path(), &t1).exists(), "the base was moved");
    let (cache, found) = TreeCache::open(work.path(), LIMITS, None).unwrap();
    assert_eq!(found.kept, vec![t1.clone()], "{found:?}");
    let leftovers: Vec<_> = std::fs::read_dir(work.path().join("trees"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(leftovers, vec![t1.clone()]);
    // The base is whole again (hashed in full, then stamped), and the same
    // delta, sent again, applies.
    assert!(cache.get(&t1).is_some());
    cache.verify(&t1).unwrap();
    receive(&cache, &t2, &bytes).unwrap();
    cache.verify(&t2).unwrap();
    assert!(!entry(work.path(), &t2).join("undo").exists());
    assert!(!entry(work.path(), &t2).join("advance.json").exists());
}

#[test]
fn a_subtree_repeated_at_several_paths_crosses_once_and_an_unknown_base_gets_no_delta() {
    let repo = Repo::new();
    let (c1, t1) = first(&repo);
    // Three new directories with the same content: one tree object.
    for dir in ["copy1", "copy2", "nested/copy3"] {
        repo.write(&format!("{dir}/x/y.txt"), "same\n");
    }
    let (c2, t2) = repo.commit();
    let authority = repo.authority();
    let (work, cache) = holding(&authority, &c1, &t1);
    let bytes = delta(&authority, &t1, &c2);
    let mut members = Vec::new();
    for e in tar::Archive::new(bytes.as_slice()).entries().unwrap() {
        members.push(String::from_utf8_lossy(&e.unwrap().path_bytes()).into_owned());
    }
    let unique: std::collections::BTreeSet<_> = members.iter().collect();
    assert_eq!(unique.len(), members.len(), "no member twice: {members:?}");
    receive(&cache, &t2, &bytes).unwrap();
    cache.verify(&t2).unwrap();
    assert_eq!(
        std::fs::read(entry(work.path(), &t2).join("tree/nested/copy3/x/y.txt")).unwrap(),
        b"same\n"
    );
    // A base the repository lacks, or an id that is not a tree (the
    // commit's): no delta, and nothing written.
    for base in ["0123456789abcdef0123456789abcdef01234567", c1.as_str()] {
        let mut out = Vec::new();
        let got = authority
            .source_delta(base, &t2, &git_limits(), true, &mut out)
            .unwrap();
        assert!(got.is_none() && out.is_empty(), "{base}: {got:?}");
    }
}

/// The blob store's copy of `content` in `work`, and its link count (0:
/// not held).
fn stored(work: &Path, content: &[u8]) -> (PathBuf, u64) {
    use std::os::unix::fs::MetadataExt;
    let path = work.join("blobs").join(blob_id(content));
    let links = std::fs::metadata(&path).map(|m| m.nlink()).unwrap_or(0);
    (path, links)
}

fn ino(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).unwrap().ino()
}

#[test]
fn every_cached_file_is_its_blob_in_the_store_and_goes_with_the_last_entry_linking_it() {
    let Two {
        repo,
        c1,
        t1,
        c2,
        t2,
        authority,
    } = two_trees();
    let (old, new) = (b"V = 1\n".as_slice(), b"V = 'changed'\n".as_slice());

    // Filled from the archive: each file is a hard link to its blob.
    let (work, cache) = holding(&authority, &c1, &t1);
    let at = |tree: &str, rel: &str| entry(work.path(), tree).join("tree").join(rel);
    let (blob, links) = stored(work.path(), old);
    assert_eq!(links, 2, "the entry's file and the store's name");
    assert_eq!(ino(&blob), ino(&at(&t1, "src/mod1/file1.py")));

    // A held tree another request waits on is copied as links: the two
    // entries share every file that did not change.
    cache.set_pins([t1.clone()].into_iter().collect());
    receive(&cache, &t2, &delta(&authority, &t1, &c2)).unwrap();
    cache.set_pins(Default::default());
    assert_eq!(ino(&at(&t1, "README.md")), ino(&at(&t2, "README.md")));
    assert_eq!(stored(work.path(), old).1, 2, "t1 still links the old blob");
    assert_eq!(stored(work.path(), new).1, 2, "t2's new file is its blob");
    // run.sh became executable: the same blob, kept once more as such.
    let script = hex::encode(airlock_proto::tree::object_id(
        ObjectFormat::Sha1,
        "blob",
        b"#!/bin/sh\n",
    ));
    let blobs = work.path().join("blobs");
    assert_eq!(ino(&blobs.join(&script)), ino(&at(&t1, "run.sh")));
    assert_eq!(
        ino(&blobs.join(format!("{script}.x"))),
        ino(&at(&t2, "run.sh"))
    );
    cache.verify(&t1).unwrap();
    cache.verify(&t2).unwrap();

    // Evicted, t1 takes with it the blobs no other entry links.
    drop(cache);
    let one = CacheLimits {
        max_entries: 1,
        max_bytes: 1 << 30,
    };
    let (cache, _) = TreeCache::open(work.path(), one, None).unwrap();
    assert!(cache.get(&t2).is_some());
    let (c3, t3) = {
        repo.write("third.txt", "3\n");
        repo.commit()
    };
    let authority = repo.authority();
    std::thread::sleep(std::time::Duration::from_millis(20));
    receive(&cache, &t3, &delta(&authority, &t2, &c3)).unwrap();
    assert!(!entry(work.path(), &t1).exists(), "t1 was evicted");
    assert_eq!(stored(work.path(), old).1, 0, "its own blob went with it");
    assert_eq!(stored(work.path(), new).1, 2, "t3 still links the new one");
    cache.verify(&t3).unwrap();

    // Moved forward (no request waits on it), an entry lets go at once of
    // the blobs its new tree replaced.
    let (work, cache) = holding(&authority, &c1, &t1);
    receive(&cache, &t2, &delta(&authority, &t1, &c2)).unwrap();
    assert_eq!(stored(work.path(), old).1, 0);
    assert_eq!(stored(work.path(), new).1, 2);
}

/// The `b/<id>` members of a delta.
fn blob_members(bytes: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    for e in tar::Archive::new(bytes).entries().unwrap() {
        let name = String::from_utf8_lossy(&e.unwrap().path_bytes()).into_owned();
        if let Some(id) = name.strip_prefix("b/") {
            out.push(id.to_owned());
        }
    }
    out
}

#[test]
fn a_file_moved_renamed_or_copied_crosses_as_its_tree_entry_alone() {
    let repo = Repo::new();
    let (c1, t1) = first(&repo);
    // A directory renamed, a file moved to another directory, a file
    // copied next to where it was, a credential-like file renamed to a
    // plain name (the cache never held it), one new file.
    std::fs::rename(repo.work().join("src/mod2"), repo.work().join("lib")).unwrap();
    std::fs::create_dir_all(repo.work().join("docs")).unwrap();
    std::fs::rename(
        repo.work().join("README.md"),
        repo.work().join("docs/README.md"),
    )
    .unwrap();
    std::fs::copy(
        repo.work().join("src/mod0/file0.py"),
        repo.work().join("src/mod0/copy.py"),
    )
    .unwrap();
    std::fs::rename(repo.work().join(".env"), repo.work().join("settings.txt")).unwrap();
    repo.write("new.txt", "new\n");
    let (c2, t2) = repo.commit();
    let authority = repo.authority();

    let (work, cache) = holding(&authority, &c1, &t1);
    let bytes = delta(&authority, &t1, &c2);
    let mut sent = blob_members(&bytes);
    sent.sort();
    let mut want = vec![blob_id(b"new\n"), blob_id(b"SECRET=1\n")];
    want.sort();
    assert_eq!(
        sent, want,
        "only the new file and the one the cache never held cross"
    );
    receive(&cache, &t2, &bytes).unwrap();
    cache.verify(&t2).unwrap();
    let root = entry(work.path(), &t2).join("tree");
    assert_eq!(
        std::fs::read(root.join("docs/README.md")).unwrap(),
        b"hello\n"
    );
    assert_eq!(
        std::fs::read(root.join("lib/file2.py")).unwrap(),
        b"V = 2\n"
    );
    assert_eq!(
        std::fs::read(root.join("settings.txt")).unwrap(),
        b"SECRET=1\n"
    );
    assert_eq!(
        ino(&root.join("src/mod0/copy.py")),
        ino(&root.join("src/mod0/file0.py")),
        "a copy is the same blob"
    );
    drop(cache);
    let (cache, _) = TreeCache::open(work.path(), LIMITS, None).unwrap();
    assert!(cache.get(&t2).is_some(), "its stamp holds in a new process");

    // An executor that does not keep blobs by id gets every blob.
    let mut all = Vec::new();
    authority
        .source_delta(&t1, &t2, &git_limits(), false, &mut all)
        .unwrap()
        .unwrap();
    assert!(blob_members(&all).len() > sent.len() + 5);

    // A blob left out that the store no longer holds as it should (here:
    // changed on disk) is refused with its code, and nothing is served.
    let (work, cache) = holding(&authority, &c1, &t1);
    let readme = work.path().join("blobs").join(blob_id(b"hello\n"));
    std::fs::write(&readme, b"tampered\n").unwrap();
    assert_eq!(receive(&cache, &t2, &bytes), Err(Code::TREE_CACHE_CORRUPT));
    assert!(cache.get(&t2).is_none());
    // The base it shares that blob with is hashed in full on its next use
    // and goes; the whole tree heals it.
    assert!(cache.get(&t1).is_none());
    assert!(cache.haves(ObjectFormat::Sha1, 4).is_empty());
    fill(&cache, &authority, &c2, &t2);
    cache.verify(&t2).unwrap();
}

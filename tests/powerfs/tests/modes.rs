//! Each mode against a real mount: it loses exactly what it claims and
//! keeps what was synced; and real programs (git, SQLite, other uids) work
//! on it. Needs root (FUSE mount without fusermount, chown, setuid children).

use std::fs::{self, File, OpenOptions, Permissions};
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use airlock_powerfs::{Cut, Mode, PowerFs};

const NOBODY: u32 = 65534;

fn mount(mode: Mode) -> PowerFs {
    let euid = fs::metadata("/proc/self").map(|m| m.uid()).ok();
    assert_eq!(
        euid,
        Some(0),
        "the airlock-powerfs tests need root: they mount FUSE directly (no fusermount), \
         chown files and run children as nobody; run them as root"
    );
    PowerFs::mount(mode).expect("mounting powerfs")
}

fn write(path: &Path, bytes: &[u8], sync: bool) {
    let mut f = File::create(path).unwrap();
    f.write_all(bytes).unwrap();
    if sync {
        f.sync_all().unwrap();
    }
}

/// Writes at offset 0 of an existing file, without truncating or syncing.
fn overwrite(path: &Path, bytes: &[u8]) {
    let mut f = OpenOptions::new().write(true).open(path).unwrap();
    f.write_all(bytes).unwrap();
}

fn sync_dir(path: &Path) {
    File::open(path).unwrap().sync_all().unwrap();
}

fn read(path: &Path) -> Vec<u8> {
    fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn data_mode_drops_only_unsynced_data() {
    let fs = mount(Mode::Data);
    let p = fs.path();
    write(&p.join("unsynced"), b"lost", false);
    write(&p.join("synced"), b"kept", true);
    write(&p.join("empty"), b"", false);
    write(&p.join("tmp"), b"renamed", true);
    fs::rename(p.join("tmp"), p.join("final")).unwrap();
    fs::create_dir(p.join("dir")).unwrap();

    let cut = fs.power_loss();
    assert_eq!(
        read(&p.join("unsynced")),
        b"",
        "unsynced bytes must be gone, the file kept"
    );
    assert_eq!(read(&p.join("synced")), b"kept");
    assert_eq!(read(&p.join("empty")), b"");
    assert_eq!(
        read(&p.join("final")),
        b"renamed",
        "data mode keeps an unsynced rename"
    );
    assert!(!p.join("tmp").exists());
    assert!(p.join("dir").is_dir());
    assert_eq!(
        cut,
        Cut {
            cuts: 1,
            files_reverted: 1,
            writes_torn: 0,
            dir_ops_dropped: 0
        }
    );
    assert_eq!(fs.totals(), cut);
}

#[test]
fn metadata_mode_rename_needs_a_directory_sync() {
    let fs = mount(Mode::Metadata);
    let p = fs.path();
    write(&p.join("db.tmp"), b"v1", true);
    sync_dir(p);
    fs::rename(p.join("db.tmp"), p.join("db")).unwrap();
    let cut = fs.power_loss();
    assert_eq!(cut.dir_ops_dropped, 1);
    assert!(!p.join("db").exists(), "an unsynced rename must be undone");
    assert_eq!(read(&p.join("db.tmp")), b"v1", "the old name comes back");

    fs::rename(p.join("db.tmp"), p.join("db")).unwrap();
    sync_dir(p);
    fs.power_loss();
    assert_eq!(read(&p.join("db")), b"v1");
    assert!(!p.join("db.tmp").exists());

    // Neither name was ever durable: neither survives.
    write(&p.join("new.tmp"), b"x", true);
    fs::rename(p.join("new.tmp"), p.join("new")).unwrap();
    assert_eq!(fs.power_loss().dir_ops_dropped, 2);
    assert!(!p.join("new").exists() && !p.join("new.tmp").exists());
    assert_eq!(fs.totals().cuts, 3);
}

#[test]
fn metadata_mode_mkdir_and_unlink_need_their_parent_synced() {
    let fs = mount(Mode::Metadata);
    let p = fs.path();
    fs::create_dir(p.join("d")).unwrap();
    write(&p.join("keep"), b"k", true);
    sync_dir(p);
    fs::create_dir(p.join("unsynced")).unwrap();
    fs::remove_file(p.join("keep")).unwrap();
    fs.power_loss();
    assert!(p.join("d").is_dir());
    assert!(
        !p.join("unsynced").exists(),
        "a mkdir whose parent was not synced is gone"
    );
    assert_eq!(read(&p.join("keep")), b"k", "an unsynced unlink comes back");
}

#[test]
fn metadata_mode_synced_directory_is_unreachable_without_its_parent() {
    let fs = mount(Mode::Metadata);
    let p = fs.path();
    let d = p.join("d");
    fs::create_dir(&d).unwrap();
    write(&d.join("f"), b"data", true);
    sync_dir(&d);
    fs.power_loss();
    assert!(!d.exists(), "D's parent was never synced: D is unreachable");

    fs::create_dir(&d).unwrap();
    write(&d.join("f"), b"data", true);
    sync_dir(&d);
    sync_dir(p);
    fs.power_loss();
    assert_eq!(read(&d.join("f")), b"data");
}

#[test]
fn torn_mode_keeps_aligned_prefixes() {
    let fs = mount(Mode::Torn);
    let p = fs.path();
    let (f, g) = (p.join("f"), p.join("g"));
    write(&f, b"", true);
    write(&g, b"", true);
    sync_dir(p);
    let bytes: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    overwrite(&f, &bytes);
    overwrite(&g, &[7; 100]);
    // A write through an O_DSYNC descriptor is durable when it returns.
    let h = p.join("h");
    write(&h, b"", true);
    sync_dir(p);
    let mut w = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DSYNC)
        .open(&h)
        .unwrap();
    w.write_all(&bytes).unwrap();
    drop(w);
    let cut = fs.power_loss();
    assert_eq!(read(&h), bytes);
    assert_eq!(
        read(&f),
        &bytes[..8192],
        "the first two whole sectors, nothing more"
    );
    assert_eq!(read(&g), b"", "a write within one sector keeps nothing");
    assert!(cut.writes_torn >= 1, "{cut:?}");
    assert_eq!(cut.files_reverted, 2);
}

#[test]
fn hard_links_share_one_inode() {
    let fs = mount(Mode::Data);
    let p = fs.path();
    let (a, b) = (p.join("a"), p.join("b"));
    write(&a, b"one", true);
    fs::hard_link(&a, &b).unwrap();
    let (ma, mb) = (fs::metadata(&a).unwrap(), fs::metadata(&b).unwrap());
    assert_eq!(ma.ino(), mb.ino());
    assert_eq!((ma.nlink(), mb.nlink()), (2, 2));
    let mut w = OpenOptions::new().append(true).open(&b).unwrap();
    w.write_all(b"two").unwrap();
    w.sync_all().unwrap();
    drop(w);
    assert_eq!(read(&a), b"onetwo");
    fs::remove_file(&a).unwrap();
    assert_eq!(fs::metadata(&b).unwrap().nlink(), 1);
    fs::create_dir_all(p.join("d/sub")).unwrap();
    assert_eq!(fs::metadata(p.join("d")).unwrap().nlink(), 3);

    fs.power_loss();
    assert_eq!(read(&b), b"onetwo");
    assert!(!a.exists());
    assert_eq!(fs::metadata(&b).unwrap().nlink(), 1);
}

fn as_nobody(script: &str, path: &Path) -> bool {
    Command::new("sh")
        .args(["-c", script, "sh"])
        .arg(path)
        .uid(NOBODY)
        .gid(NOBODY)
        .stderr(std::process::Stdio::null())
        .status()
        .expect("running sh as nobody")
        .success()
}

#[test]
fn the_kernel_checks_modes_for_other_uids() {
    let fs = mount(Mode::STRICTEST);
    let p = fs.path();
    let f = p.join("f");
    write(&f, b"", false);
    fs::set_permissions(&f, Permissions::from_mode(0o644)).unwrap();
    let append = r#"printf x >> "$1""#;
    assert!(
        !as_nobody(append, &f),
        "nobody must not write root's 0644 file"
    );
    assert!(as_nobody(r#"cat "$1" >/dev/null"#, &f), "but may read it");

    std::os::unix::fs::chown(&f, Some(NOBODY), Some(NOBODY)).unwrap();
    assert!(as_nobody(append, &f), "the owner may write its 0644 file");
    fs::set_permissions(&f, Permissions::from_mode(0o444)).unwrap();
    assert!(!as_nobody(append, &f), "nor its own 0444 file");
    assert_eq!(read(&f), b"x");

    fs::set_permissions(&f, Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(&f, Some(0), Some(0)).unwrap();
    assert!(
        !as_nobody(r#"cat "$1" >/dev/null"#, &f),
        "nobody must not read root's 0600 file"
    );

    let shared = p.join("shared");
    fs::create_dir(&shared).unwrap();
    fs::set_permissions(&shared, Permissions::from_mode(0o777)).unwrap();
    assert!(as_nobody(r#"echo hi > "$1/mine""#, &shared));
    let m = fs::metadata(shared.join("mine")).unwrap();
    assert_eq!(
        (m.uid(), m.gid()),
        (NOBODY, NOBODY),
        "new files take the caller's ids"
    );
}

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "user.name=powerfs",
            "-c",
            "user.email=powerfs@example.invalid",
        ])
        .args(["-c", "core.fsync=all", "-c", "core.fsyncMethod=fsync"])
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .expect("running git");
    assert!(
        out.status.success(),
        "git {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn git_works() {
    let fs = mount(Mode::STRICTEST);
    let repo = fs.path().join("repo");
    git(fs.path(), &["init", "-q", "-b", "main", "repo"]);
    for i in 0..20 {
        fs::write(repo.join(format!("file{i}")), format!("content {i}\n")).unwrap();
    }
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-q", "-m", "first"]);
    fs::write(repo.join("file0"), "changed\n").unwrap();
    git(&repo, &["commit", "-q", "-am", "second"]);
    git(&repo, &["gc", "-q"]);
    git(&repo, &["fsck", "--full", "--strict"]);
}

/// fsyncs every file and directory under `path`.
fn sync_tree(path: &Path) {
    for e in fs::read_dir(path).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            sync_tree(&e.path());
        } else {
            File::open(e.path()).unwrap().sync_all().unwrap();
        }
    }
    sync_dir(path);
}

#[test]
fn git_commit_survives_a_cut_in_data_mode() {
    let fs = mount(Mode::Data);
    let repo = fs.path().join("repo");
    git(fs.path(), &["init", "-q", "-b", "main", "repo"]);
    // git init syncs nothing (HEAD and config would come back empty): start
    // from a durable repository, and let git's own fsyncs keep the commit.
    sync_tree(&repo);
    fs::write(repo.join("a"), "a\n").unwrap();
    git(&repo, &["add", "a"]);
    git(&repo, &["commit", "-q", "-m", "one"]);
    let head = read(&repo.join(".git/refs/heads/main"));
    let cut = fs.power_loss();
    assert!(
        cut.files_reverted >= 1,
        "the reflog is never synced: {cut:?}"
    );
    assert_eq!(read(&repo.join(".git/refs/heads/main")), head);
    git(&repo, &["fsck", "--full", "--strict"]);
}

const SQLITE_WRITE: &str = r#"
import os, sqlite3, sys
db, crash = sys.argv[1], sys.argv[2] == "crash"
a = sqlite3.connect(db, isolation_level=None)
assert a.execute("pragma journal_mode=wal").fetchone()[0] == "wal"
a.execute("pragma synchronous=full")
a.execute("create table t(id integer primary key, who text, v blob)")
# As a careful writer does: the new database's name made durable.
d = os.open(os.path.dirname(db), os.O_RDONLY)
os.fsync(d)
os.close(d)
b = sqlite3.connect(db, isolation_level=None)
b.execute("pragma synchronous=full")
for i in range(60):
    c = (a, b)[i % 2]
    c.execute("begin immediate")
    c.execute("insert into t(who, v) values (?, randomblob(3000))", ("ab"[i % 2],))
    if i % 7 == 0:
        c.execute("update t set who = who || '!' where id % 3 = 0")
    c.execute("commit")
assert b.execute("select count(*) from t").fetchone()[0] == 60
assert a.execute("pragma integrity_check").fetchone()[0] == "ok"
if crash:
    os._exit(0)
a.close()
b.close()
"#;

const SQLITE_CHECK: &str = r#"
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
assert c.execute("pragma integrity_check").fetchone()[0] == "ok"
n = c.execute("select count(*) from t").fetchone()[0]
assert n == 60, n
"#;

fn python(script: &str, args: &[&Path], extra: &str) {
    let out = Command::new("python3")
        .args(["-c", script])
        .args(args)
        .arg(extra)
        .output()
        .expect("running python3");
    assert!(
        out.status.success(),
        "python3: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn sqlite_wal_works() {
    let fs = mount(Mode::STRICTEST);
    let db = fs.path().join("t.db");
    python(SQLITE_WRITE, &[&db], "close");
    python(SQLITE_CHECK, &[&db], "");
}

#[test]
fn sqlite_wal_survives_a_cut_in_every_mode() {
    for mode in [Mode::Data, Mode::Metadata, Mode::Torn] {
        let fs = mount(mode);
        let db = fs.path().join("t.db");
        // The writer dies with its WAL and shared memory in place, then the
        // power goes: every committed transaction was fsynced and must be
        // back.
        python(SQLITE_WRITE, &[&db], "crash");
        let cut = fs.power_loss();
        assert_eq!(cut.dir_ops_dropped, 0, "{mode}: {cut:?}");
        python(SQLITE_CHECK, &[&db], "");
    }
}

#[test]
fn directories_list_stably_while_they_change() {
    let fs = mount(Mode::STRICTEST);
    let d = fs.path().join("many");
    fs::create_dir(&d).unwrap();
    for i in 0..1500 {
        write(
            &d.join(format!("entry-with-a-longish-name-{i:05}")),
            b"x",
            false,
        );
    }
    let mut names: Vec<_> = fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 1500);
    // Removes while it lists, over several readdir batches.
    fs::remove_dir_all(&d).unwrap();
    assert!(!d.exists());
    assert_eq!(fs::metadata(fs.path()).unwrap().nlink(), 2);
}

const PYTHON_NODES: &str = r#"
import errno, os, stat, sys
p = sys.argv[1]
f = os.path.join(p, "f")
open(f, "w").close()
os.setxattr(f, "user.a", b"1", os.XATTR_CREATE)
try:
    os.setxattr(f, "user.a", b"2", os.XATTR_CREATE)
    raise SystemExit("XATTR_CREATE over an existing name succeeded")
except OSError as e:
    assert e.errno == errno.EEXIST, e
try:
    os.setxattr(f, "user.b", b"2", os.XATTR_REPLACE)
    raise SystemExit("XATTR_REPLACE of a missing name succeeded")
except OSError as e:
    assert e.errno == errno.ENODATA, e
os.setxattr(f, "user.b", b"x" * 1000)
assert os.getxattr(f, "user.b") == b"x" * 1000
assert sorted(os.listxattr(f)) == ["user.a", "user.b"], os.listxattr(f)
os.removexattr(f, "user.a")
assert os.listxattr(f) == ["user.b"]
fifo = os.path.join(p, "fifo")
os.mkfifo(fifo, 0o640)
assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
assert stat.S_IMODE(os.lstat(fifo).st_mode) == 0o640 & ~os.umask(0o022)
os.symlink("f", os.path.join(p, "link"))
assert os.readlink(os.path.join(p, "link")) == "f"
with open(os.path.join(p, "link"), "w") as w:
    w.write("through the link")
assert open(f).read() == "through the link"
os.utime(f, (1_000_000_000, 1_000_000_000))
assert os.stat(f).st_mtime == 1_000_000_000
os.truncate(f, 3)
assert open(f).read() == "thr"
os.chmod(p, 0o2775)
os.mkdir(os.path.join(p, "sub"))
assert os.stat(os.path.join(p, "sub")).st_mode & stat.S_ISGID
"#;

#[test]
fn special_files_symlinks_and_xattrs() {
    let fs = mount(Mode::Data);
    python(PYTHON_NODES, &[fs.path()], "");
    fs.power_loss();
    let p = fs.path();
    assert_eq!(fs::read_link(p.join("link")).unwrap(), Path::new("f"));
    assert!(
        fs::symlink_metadata(p.join("fifo"))
            .unwrap()
            .file_type()
            .is_fifo()
    );
    assert_eq!(read(&p.join("f")), b"", "never fsynced");
}

fn mounted(at: &Path) -> bool {
    let target = at.to_string_lossy().into_owned();
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(target.as_str()))
}

#[test]
fn drop_unmounts_and_removes_the_directory_even_when_busy() {
    let fs = mount(Mode::Metadata);
    let at = fs.path().to_owned();
    assert!(mounted(&at));
    write(&at.join("f"), b"x", false);
    drop(fs);
    assert!(!mounted(&at) && !at.exists());

    let fs = mount(Mode::Metadata);
    let at = fs.path().to_owned();
    let mut busy = File::create(at.join("f")).unwrap();
    drop(fs);
    assert!(!mounted(&at) && !at.exists(), "a busy mount is detached");
    // The detached file system still serves the descriptor it has open.
    busy.write_all(b"still served").unwrap();
}

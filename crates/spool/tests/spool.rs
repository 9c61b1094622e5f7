//! Scenario tests of the spool on a real filesystem, with real inotify and,
//! as root, real foreign uids.

use airlock_proto::Code;
use airlock_proto::bundle::request_id_for;
use airlock_spool::{Error, Expect, GcPolicy, Kind, Side, Spool, Wake, publish_path, read_path};
use sha2::{Digest, Sha256};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

fn id(n: u32) -> String {
    request_id_for("task-spool", n, &"d".repeat(64))
}

fn me() -> u32 {
    rustix::process::getuid().as_raw()
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

fn expect(max: u64) -> Expect {
    Expect {
        owner_uid: me(),
        max_bytes: max,
        sha256: None,
    }
}

fn spool() -> (tempfile::TempDir, Spool) {
    let dir = tempfile::tempdir().unwrap();
    Spool::create_layout(dir.path()).unwrap();
    let spool = Spool::open(dir.path()).unwrap();
    (dir, spool)
}

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[test]
fn a_reader_never_sees_a_partial_file() {
    let (_dir, spool) = spool();
    let spool = std::sync::Arc::new(spool);
    const N: u32 = 40;
    let content = |n: u32| -> Vec<u8> {
        (0..512 * 1024u32)
            .map(|i| (i.wrapping_mul(31) ^ n) as u8)
            .collect()
    };
    let mut watcher = spool.watch(&[Kind::Requests]).unwrap();
    let writer = {
        let spool = spool.clone();
        std::thread::spawn(move || {
            for n in 0..N {
                spool.publish(Kind::Requests, &id(n), &content(n)).unwrap();
            }
        })
    };
    // A reader that scans as fast as it can, racing the writer.
    let scanner = {
        let spool = spool.clone();
        std::thread::spawn(move || {
            let mut seen = 0usize;
            let start = Instant::now();
            while seen < N as usize && start.elapsed() < Duration::from_secs(30) {
                let ids = spool.list(Kind::Requests).unwrap();
                for rid in &ids {
                    let bytes = spool.read(Kind::Requests, rid, &expect(1 << 20)).unwrap();
                    assert_eq!(bytes.len(), 512 * 1024, "partial file visible");
                }
                seen = ids.len();
            }
            seen
        })
    };
    // A reader woken by inotify that verifies each file's digest.
    let mut verified = std::collections::BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while verified.len() < N as usize && Instant::now() < deadline {
        match watcher.wait(Duration::from_secs(10)).unwrap() {
            Wake::Published(files) => {
                for (kind, rid) in files {
                    assert_eq!(kind, Kind::Requests);
                    let n = (0..N).find(|n| id(*n) == rid).expect("a known id");
                    let want = content(n);
                    let got = spool
                        .read(
                            Kind::Requests,
                            &rid,
                            &Expect {
                                sha256: Some(sha(&want)),
                                ..expect(1 << 20)
                            },
                        )
                        .unwrap();
                    assert_eq!(got, want);
                    verified.insert(rid);
                }
            }
            Wake::Rescan => {
                for rid in spool.list(Kind::Requests).unwrap() {
                    verified.insert(rid);
                }
            }
            Wake::Timeout => panic!("publication did not wake the watcher"),
        }
    }
    writer.join().unwrap();
    assert_eq!(scanner.join().unwrap(), N as usize);
    assert_eq!(verified.len(), N as usize);
    // No temporary file is left behind.
    let names: Vec<_> = std::fs::read_dir(spool.dir_path(Kind::Requests))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(names.iter().all(|n| n.ends_with(".json")), "{names:?}");
}

#[test]
fn a_name_is_published_once_with_mode_0640() {
    let (_dir, spool) = spool();
    let old = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    let path = spool.publish(Kind::Results, &id(1), b"first").unwrap();
    rustix::process::umask(old);
    let meta = std::fs::symlink_metadata(&path).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o640);
    let err = spool.publish(Kind::Results, &id(1), b"second").unwrap_err();
    assert!(matches!(err, Error::AlreadyPublished { .. }), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), b"first");
    assert_eq!(
        std::fs::read_dir(spool.dir_path(Kind::Results))
            .unwrap()
            .count(),
        1
    );
}

#[test]
fn a_symlink_is_refused() {
    let (_dir, spool) = spool();
    let link = spool
        .dir_path(Kind::Requests)
        .join(format!("{}.json", id(1)));
    std::os::unix::fs::symlink("/etc/passwd", &link).unwrap();
    let err = spool
        .read(Kind::Requests, &id(1), &expect(1 << 20))
        .unwrap_err();
    assert!(matches!(err, Error::Symlink { .. }), "{err}");
    assert_eq!(err.code(), Code::SPOOL_FILE_REJECTED);
}

#[test]
fn a_symlinked_spool_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real");
    std::fs::create_dir(&real).unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    for kind in Kind::ALL {
        if kind == Kind::Requests {
            std::os::unix::fs::symlink(&real, root.join("requests")).unwrap();
        } else {
            std::fs::create_dir(root.join(kind.dir_name())).unwrap();
        }
    }
    let err = Spool::open(&root).unwrap_err();
    assert!(matches!(err, Error::OpenDir { .. }), "{err}");
}

#[test]
fn a_fifo_and_a_directory_are_refused_without_blocking() {
    let (_dir, spool) = spool();
    let dir = spool.dir_path(Kind::Requests);
    rustix::fs::mknodat(
        rustix::fs::CWD,
        dir.join(format!("{}.json", id(1))),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o640),
        0,
    )
    .unwrap();
    std::fs::create_dir(dir.join(format!("{}.json", id(2)))).unwrap();
    let start = Instant::now();
    let err = spool
        .read(Kind::Requests, &id(1), &expect(1 << 20))
        .unwrap_err();
    assert!(
        matches!(err, Error::NotRegular { kind: "FIFO", .. }),
        "{err}"
    );
    assert!(start.elapsed() < Duration::from_secs(2));
    let err = spool
        .read(Kind::Requests, &id(2), &expect(1 << 20))
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::NotRegular {
                kind: "directory",
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(err.code(), Code::SPOOL_FILE_REJECTED);
}

#[test]
fn a_file_of_another_owner_is_refused() {
    assert!(is_root(), "this test needs root to chown to a foreign uid");
    let (_dir, spool) = spool();
    let path = spool.publish(Kind::Requests, &id(1), b"{}").unwrap();
    std::os::unix::fs::chown(&path, Some(4242), Some(4242)).unwrap();
    let err = spool
        .read(Kind::Requests, &id(1), &expect(1 << 20))
        .unwrap_err();
    assert!(matches!(err, Error::WrongOwner { uid: 4242, .. }), "{err}");
    assert_eq!(err.code(), Code::SPOOL_FILE_REJECTED);
    // The same file is accepted from its real producer.
    let ok = spool.read(
        Kind::Requests,
        &id(1),
        &Expect {
            owner_uid: 4242,
            ..expect(1 << 20)
        },
    );
    assert_eq!(ok.unwrap(), b"{}");
}

#[test]
fn a_hard_linked_file_is_refused() {
    let (_dir, spool) = spool();
    let path = spool.publish(Kind::Requests, &id(1), b"{}").unwrap();
    std::fs::hard_link(&path, spool.dir_path(Kind::Requests).join("other")).unwrap();
    let err = spool
        .read(Kind::Requests, &id(1), &expect(1 << 20))
        .unwrap_err();
    assert!(matches!(err, Error::Linked { nlink: 2, .. }), "{err}");
}

#[test]
fn an_oversized_file_is_refused() {
    let (_dir, spool) = spool();
    spool.publish(Kind::Sources, &id(1), &[7u8; 4097]).unwrap();
    let err = spool
        .read(Kind::Sources, &id(1), &expect(4096))
        .unwrap_err();
    assert!(matches!(err, Error::TooLarge { max: 4096, .. }), "{err}");
    assert_eq!(err.code(), Code::SPOOL_FILE_REJECTED);
    assert_eq!(
        spool
            .read(Kind::Sources, &id(1), &expect(4097))
            .unwrap()
            .len(),
        4097
    );
}

#[test]
fn a_digest_mismatch_is_refused() {
    let (_dir, spool) = spool();
    spool
        .publish(Kind::Sources, &id(1), b"archive bytes")
        .unwrap();
    let err = spool
        .read(
            Kind::Sources,
            &id(1),
            &Expect {
                sha256: Some(sha(b"other bytes")),
                ..expect(1 << 20)
            },
        )
        .unwrap_err();
    assert!(matches!(err, Error::DigestMismatch { .. }), "{err}");
    assert_eq!(err.code(), Code::SPOOL_DIGEST_MISMATCH);
}

#[test]
fn names_not_of_request_id_form_are_never_opened() {
    let (_dir, spool) = spool();
    for bad in ["../results/x", "r123", ".tmp-abc", ""] {
        let err = spool.read(Kind::Requests, bad, &expect(10)).unwrap_err();
        assert!(matches!(err, Error::InvalidName { .. }), "{bad}: {err}");
        assert!(spool.publish(Kind::Results, bad, b"x").is_err());
    }
    std::fs::write(spool.dir_path(Kind::Requests).join("junk.json"), b"{}").unwrap();
    std::fs::write(
        spool
            .dir_path(Kind::Requests)
            .join(format!("{}.tar", id(3))),
        b"{}",
    )
    .unwrap();
    spool.publish(Kind::Requests, &id(4), b"{}").unwrap();
    assert_eq!(spool.list(Kind::Requests).unwrap(), vec![id(4)]);
}

#[test]
fn the_watcher_wakes_on_publish_and_times_out_otherwise() {
    let (_dir, spool) = spool();
    let spool = std::sync::Arc::new(spool);
    let mut watcher = spool.watch(&[Kind::Results, Kind::Failed]).unwrap();

    // Nothing published: the wait times out, after the timeout and not much later.
    let start = Instant::now();
    assert_eq!(
        watcher.wait(Duration::from_millis(300)).unwrap(),
        Wake::Timeout
    );
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(3),
        "{waited:?}"
    );

    // Junk and files in unwatched directories do not wake it.
    std::fs::write(spool.dir_path(Kind::Results).join("junk"), b"x").unwrap();
    spool.publish(Kind::Requests, &id(9), b"{}").unwrap();
    assert_eq!(
        watcher.wait(Duration::from_millis(300)).unwrap(),
        Wake::Timeout
    );

    // A publication from another thread wakes it promptly.
    let publisher = {
        let spool = spool.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            spool.publish(Kind::Failed, &id(1), b"{}").unwrap();
        })
    };
    let start = Instant::now();
    let wake = watcher.wait(Duration::from_secs(20)).unwrap();
    assert_eq!(wake, Wake::Published(vec![(Kind::Failed, id(1))]));
    assert!(start.elapsed() < Duration::from_secs(10));
    publisher.join().unwrap();
}

#[test]
fn gc_removes_only_the_owners_own_regular_files() {
    assert!(is_root(), "this test needs root to chown to a foreign uid");
    let (_dir, spool) = spool();
    let results = spool.dir_path(Kind::Results);
    let finished = spool.publish(Kind::Results, &id(1), b"{}").unwrap();
    let kept = spool.publish(Kind::Results, &id(2), b"{}").unwrap();
    let stale_temp = results.join(".tmp-0123456789ab");
    std::fs::write(&stale_temp, b"partial").unwrap();
    let foreign = spool.publish(Kind::Failed, &id(3), b"{}").unwrap();
    std::os::unix::fs::chown(&foreign, Some(4242), None).unwrap();
    let link = results.join(format!("{}.json", id(4)));
    std::os::unix::fs::symlink("/etc/passwd", &link).unwrap();
    let dir = results.join(format!("{}.json", id(5)));
    std::fs::create_dir(&dir).unwrap();
    let junk = results.join("notes.txt");
    std::fs::write(&junk, b"x").unwrap();
    let other_side = spool.publish(Kind::Requests, &id(1), b"{}").unwrap();

    // By finished id: only the executor's own regular file of that id goes.
    let report = spool
        .gc(
            Side::Executor,
            me(),
            &GcPolicy {
                older_than: None,
                finished: vec![id(1)],
            },
        )
        .unwrap();
    assert_eq!(report.removed, vec![finished.clone()]);
    assert!(!finished.exists() && kept.exists() && other_side.exists());

    // By age (everything is older than zero seconds): the rest of its own
    // regular files go; the symlink, directory, foreign file and junk stay.
    let report = spool
        .gc(
            Side::Executor,
            me(),
            &GcPolicy {
                older_than: Some(Duration::ZERO),
                finished: vec![],
            },
        )
        .unwrap();
    let mut removed = report.removed.clone();
    removed.sort();
    let mut want = vec![kept.clone(), stale_temp.clone()];
    want.sort();
    assert_eq!(removed, want);
    let refused: Vec<&Path> = report.refused.iter().map(|(p, _)| p.as_path()).collect();
    for p in [&foreign, &link, &dir, &junk] {
        assert!(
            refused.contains(&p.as_path()),
            "{p:?} not refused: {refused:?}"
        );
    }
    assert!(std::fs::symlink_metadata(&link).is_ok());
    assert!(dir.is_dir() && foreign.exists() && junk.exists() && other_side.exists());
    assert!(Path::new("/etc/passwd").exists());
    assert_eq!(std::fs::metadata(&foreign).unwrap().uid(), 4242);
}

#[test]
fn gc_by_age_removes_old_files() {
    let (_dir, spool) = spool();
    let old = spool.publish(Kind::Sources, &id(1), b"x").unwrap();
    let new = spool.publish(Kind::Sources, &id(2), b"x").unwrap();
    let hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&old)
        .unwrap()
        .set_modified(hour_ago)
        .unwrap();
    let report = spool
        .gc(
            Side::Worker,
            me(),
            &GcPolicy {
                older_than: Some(Duration::from_secs(600)),
                finished: vec![],
            },
        )
        .unwrap();
    assert_eq!(report.removed, vec![old.clone()]);
    assert!(!old.exists() && new.exists());
}

#[test]
fn paths_outside_the_spool_use_the_same_rules() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.json");
    publish_path(&out, b"{\"a\":1}").unwrap();
    assert!(matches!(
        publish_path(&out, b"x").unwrap_err(),
        Error::AlreadyPublished { .. }
    ));
    assert_eq!(read_path(&out, &expect(100)).unwrap(), b"{\"a\":1}");
    let link = dir.path().join("link.json");
    std::os::unix::fs::symlink(&out, &link).unwrap();
    assert!(matches!(
        read_path(&link, &expect(100)).unwrap_err(),
        Error::Symlink { .. }
    ));
    assert!(matches!(
        read_path(&dir.path().join("missing"), &expect(100)).unwrap_err(),
        Error::Missing { .. }
    ));
}

#[test]
fn the_staged_hook_runs_with_the_whole_file_under_a_temporary_name_before_the_rename() {
    let (dir, spool) = spool();
    let requests = dir.path().join("requests");
    let mut seen = Vec::new();
    let path = spool
        .publish_observed(Kind::Requests, &id(7), b"{\"n\":7}", &mut || {
            for e in std::fs::read_dir(&requests).unwrap() {
                let e = e.unwrap();
                let name = e.file_name().to_string_lossy().into_owned();
                seen.push((name, std::fs::read(e.path()).unwrap()));
            }
        })
        .unwrap();
    assert_eq!(seen.len(), 1, "one file while staged: {seen:?}");
    assert!(seen[0].0.starts_with(".tmp-"), "{:?}", seen[0].0);
    assert_eq!(seen[0].1, b"{\"n\":7}");
    assert!(Kind::Requests.parse_name(&seen[0].0).is_none());
    assert_eq!(std::fs::read(path).unwrap(), b"{\"n\":7}");
    assert_eq!(std::fs::read_dir(&requests).unwrap().count(), 1);
}

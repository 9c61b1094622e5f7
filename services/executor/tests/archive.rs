//! Hostile source archives, built in the test, against the real extractor
//! on a real filesystem: each is refused with its code and nothing is
//! written outside the workspace.

mod common;

use airlock_proto::tree::ObjectFormat;

use airlock_executor::apply::{CredentialPolicy, Workspace};
use airlock_executor::tree::extract::{ArchiveLimits, extract};
use airlock_proto::Code;
use common::*;
use std::time::Instant;

fn limits() -> ArchiveLimits {
    ArchiveLimits {
        max_entries: 100,
        max_file_bytes: 1 << 20,
        max_total_bytes: 4 << 20,
        max_expansion_ratio: 100,
    }
}

struct Fixture {
    outer: tempfile::TempDir,
    ws: Workspace,
}

fn fixture() -> Fixture {
    let outer = tempfile::tempdir().unwrap();
    let src = outer.path().join("ws");
    std::fs::create_dir(&src).unwrap();
    let ws = Workspace::open(&src, 1 << 20).unwrap();
    Fixture { outer, ws }
}

fn refuse(archive: &[u8], limits: &ArchiveLimits) -> (Code, Fixture) {
    let f = fixture();
    let err = extract(
        archive,
        f.ws.root(),
        limits,
        &CredentialPolicy::default(),
        ObjectFormat::Sha1,
        None,
    )
    .unwrap_err();
    // Nothing outside the workspace, and no special file inside it.
    let outside: Vec<String> = std::fs::read_dir(f.outer.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(
        outside,
        vec!["ws".to_owned()],
        "written outside the workspace"
    );
    for rel in tree(f.ws.path()) {
        let m = std::fs::symlink_metadata(f.ws.path().join(&rel)).unwrap();
        assert!(
            m.is_file() || m.is_dir() || m.is_symlink(),
            "{rel} is special"
        );
    }
    (err.code(), f)
}

#[test]
fn a_clean_archive_is_extracted_plain_and_gzipped() {
    let tar = tar_of(&[
        ("hello.py", b"VALUE = 1\n", 0o644),
        ("bin/run.sh", b"#!/bin/sh\n", 0o755),
        ("deep/a/b/c.txt", b"c", 0o600),
    ]);
    for archive in [tar.clone(), gzip(&tar)] {
        let f = fixture();
        let out = extract(
            &archive,
            f.ws.root(),
            &limits(),
            &CredentialPolicy::default(),
            ObjectFormat::Sha1,
            None,
        )
        .unwrap();
        assert_eq!(out.files, 3);
        assert_eq!(
            out.tree,
            tree_of(&archive),
            "the git tree id of the content"
        );
        assert_eq!(
            tree(f.ws.path()),
            [
                "bin",
                "bin/run.sh",
                "deep",
                "deep/a",
                "deep/a/b",
                "deep/a/b/c.txt",
                "hello.py"
            ]
        );
        let snap = f.ws.read("bin/run.sh").unwrap().unwrap();
        assert!(snap.executable);
        assert!(!f.ws.read("hello.py").unwrap().unwrap().executable);
    }
}

#[test]
fn absolute_dotdot_and_dotgit_paths_are_refused() {
    let evil = format!("/tmp/airlock-exec-test-{}", std::process::id());
    for name in [
        evil.as_bytes(),
        b"../escape.txt",
        b"a/../../escape.txt",
        b".git/hooks/pre-commit",
        b"sub/.git/config",
        b"./x",
    ] {
        let h = raw_header(name, tar::EntryType::Regular, 4, 0o644, b"");
        let (code, _f) = refuse(&tar_with(h, b"evil"), &limits());
        assert_eq!(
            code,
            Code::SOURCE_ARCHIVE_PATH_INVALID,
            "{}",
            String::from_utf8_lossy(name)
        );
    }
    assert!(!std::path::Path::new(&evil).exists());
}

#[test]
fn hard_links_and_unusable_symlinks_are_refused() {
    for (kind, target) in [
        (tar::EntryType::Link, &b"ok.txt"[..]),
        (tar::EntryType::Link, b"/etc/shadow"),
        (tar::EntryType::Symlink, b""),
    ] {
        let h = raw_header(b"link", kind, 0, 0o777, target);
        let (code, f) = refuse(&tar_with(h, b""), &limits());
        assert_eq!(code, Code::SOURCE_ARCHIVE_LINK_DENY, "{kind:?}");
        assert!(std::fs::symlink_metadata(f.ws.path().join("link")).is_err());
    }
    // A target longer than PATH_MAX allows (a GNU long-link record).
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(0);
    h.set_mode(0o777);
    b.append_link(&mut h, "link", "a/".repeat(2048)).unwrap();
    let (code, f) = refuse(&b.into_inner().unwrap(), &limits());
    assert_eq!(code, Code::SOURCE_ARCHIVE_LINK_DENY);
    assert!(std::fs::symlink_metadata(f.ws.path().join("link")).is_err());
}

/// A tree's symbolic links are made as the tree has them, whatever they
/// name, and count in its tree id; nothing is ever written through one.
#[test]
fn symlinks_are_made_as_the_tree_has_them_and_never_written_through() {
    let f = fixture();
    let mut b = tar::Builder::new(Vec::new());
    for (path, target) in [
        ("abs", "/etc/passwd"),
        ("deep/up", "../../outside"),
        ("docs", "doc"),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        h.set_mode(0o777);
        b.append_link(&mut h, path, target).unwrap();
    }
    let mut h = tar::Header::new_gnu();
    h.set_size(3);
    h.set_mode(0o644);
    h.set_entry_type(tar::EntryType::Regular);
    b.append_data(&mut h, "doc/a.md", &b"doc"[..]).unwrap();
    let archive = b.into_inner().unwrap();
    let ex = extract(
        &archive,
        f.ws.root(),
        &limits(),
        &CredentialPolicy::default(),
        ObjectFormat::Sha1,
        None,
    )
    .unwrap();
    assert_eq!((ex.files, ex.symlinks), (1, 3));
    assert_eq!(ex.tree, tree_of(&archive), "links count in the tree id");
    for (path, target) in [
        ("abs", "/etc/passwd"),
        ("deep/up", "../../outside"),
        ("docs", "doc"),
    ] {
        let link = f.ws.path().join(path);
        assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
        assert_eq!(std::fs::read_link(&link).unwrap().to_str(), Some(target));
    }

    // A member beneath a link (the directory `d` a link to outside the
    // workspace, then `d/x`) is refused, and nothing lands outside.
    let g = fixture();
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(0);
    h.set_mode(0o777);
    b.append_link(&mut h, "d", g.outer.path()).unwrap();
    let mut h = tar::Header::new_gnu();
    h.set_size(4);
    h.set_mode(0o644);
    h.set_entry_type(tar::EntryType::Regular);
    b.append_data(&mut h, "d/x", &b"evil"[..]).unwrap();
    let err = extract(
        &b.into_inner().unwrap(),
        g.ws.root(),
        &limits(),
        &CredentialPolicy::default(),
        ObjectFormat::Sha1,
        None,
    )
    .unwrap_err();
    assert_eq!(err.code(), Code::PATH_ESCAPE);
    assert!(!g.outer.path().join("x").exists(), "written through a link");
}

#[test]
fn devices_fifos_and_setuid_members_are_refused() {
    for (kind, mode) in [
        (tar::EntryType::Char, 0o666),
        (tar::EntryType::Block, 0o660),
        (tar::EntryType::Fifo, 0o644),
        (tar::EntryType::Regular, 0o4755),
        (tar::EntryType::Regular, 0o2755),
        (tar::EntryType::Directory, 0o2775),
    ] {
        let h = raw_header(b"special", kind, 0, mode, b"");
        let (code, _f) = refuse(&tar_with(h, b""), &limits());
        assert_eq!(code, Code::SOURCE_ARCHIVE_MEMBER_DENY, "{kind:?} {mode:o}");
    }
}

#[test]
fn too_many_entries_are_refused() {
    let names: Vec<String> = (0..101).map(|i| format!("f{i}")).collect();
    let files: Vec<(&str, &[u8], u32)> = names
        .iter()
        .map(|n| (n.as_str(), &b"x"[..], 0o644))
        .collect();
    let (code, _f) = refuse(&tar_of(&files), &limits());
    assert_eq!(code, Code::SOURCE_ARCHIVE_LIMIT_EXCEEDED);
}

#[test]
fn oversized_files_and_totals_are_refused() {
    let big = vec![b'x'; (1 << 20) + 1];
    let (code, _f) = refuse(&tar_of(&[("big", &big, 0o644)]), &limits());
    assert_eq!(code, Code::SOURCE_ARCHIVE_LIMIT_EXCEEDED);
    let part = vec![b'y'; 900 << 10];
    let files: Vec<(String, &[u8], u32)> = (0..5)
        .map(|i| (format!("p{i}"), &part[..], 0o644))
        .collect();
    let files: Vec<(&str, &[u8], u32)> =
        files.iter().map(|(n, d, m)| (n.as_str(), *d, *m)).collect();
    let (code, _f) = refuse(&tar_of(&files), &limits());
    assert_eq!(code, Code::SOURCE_ARCHIVE_LIMIT_EXCEEDED);
}

#[test]
fn a_gzip_bomb_is_refused_early() {
    // 200 MiB of zeros in one member, compressed to a few hundred KiB.
    const SIZE: u64 = 200 << 20;
    let mut raw = Vec::with_capacity(1 << 20);
    let h = raw_header(b"zeros.bin", tar::EntryType::Regular, SIZE, 0o644, b"");
    raw.extend_from_slice(h.as_bytes());
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    {
        use std::io::Write;
        enc.write_all(&raw).unwrap();
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..(SIZE >> 20) {
            enc.write_all(&zeros).unwrap();
        }
        enc.write_all(&[0u8; 1024]).unwrap();
    }
    let bomb = enc.finish().unwrap();
    assert!(bomb.len() < 1 << 20, "{} bytes", bomb.len());
    // Per-file and total bounds wide open, so the ratio is what stops it.
    let wide = ArchiveLimits {
        max_entries: 10,
        max_file_bytes: 1 << 30,
        max_total_bytes: 1 << 30,
        max_expansion_ratio: 100,
    };
    let start = Instant::now();
    let (code, f) = refuse(&bomb, &wide);
    assert_eq!(code, Code::SOURCE_ARCHIVE_LIMIT_EXCEEDED);
    assert!(start.elapsed().as_secs() < 20);
    // It stopped long before writing the 200 MiB.
    let written = std::fs::metadata(f.ws.path().join("zeros.bin"))
        .map(|m| m.len())
        .unwrap_or(0);
    assert!(written < 100 * bomb.len() as u64 + (1 << 20), "{written}");
    // With the default limits it is refused as well.
    let defaults = airlock_config::Limits::default();
    let d = ArchiveLimits {
        max_entries: u64::from(defaults.max_archive_entries),
        max_file_bytes: defaults.max_file_bytes,
        max_total_bytes: defaults.max_total_bytes,
        max_expansion_ratio: u64::from(defaults.max_expansion_ratio),
    };
    assert_eq!(refuse(&bomb, &d).0, Code::SOURCE_ARCHIVE_LIMIT_EXCEEDED);
}

#[test]
fn duplicates_and_garbage_are_refused() {
    let dup = tar_of(&[("a.txt", b"1", 0o644), ("a.txt", b"2", 0o644)]);
    assert_eq!(refuse(&dup, &limits()).0, Code::SOURCE_ARCHIVE_PATH_INVALID);
    let garbage = vec![0x42u8; 4096];
    assert_eq!(refuse(&garbage, &limits()).0, Code::SOURCE_ARCHIVE_INVALID);
    let mut truncated = tar_of(&[("a.txt", &[7u8; 5000][..], 0o644)]);
    truncated.truncate(2048);
    assert_eq!(
        refuse(&truncated, &limits()).0,
        Code::SOURCE_ARCHIVE_INVALID
    );
}

#[test]
fn credential_paths_are_withheld_unless_allowed() {
    let tar = tar_of(&[
        ("app.py", b"x", 0o644),
        (".env", b"SECRET=1", 0o644),
        ("deploy/.ssh/id_ed25519", b"key", 0o600),
        ("tests/fixtures/server.key", b"test key", 0o644),
    ]);
    let f = fixture();
    let policy = CredentialPolicy {
        allow: vec!["tests/fixtures/**".into()],
    };
    let out = extract(
        &tar,
        f.ws.root(),
        &limits(),
        &policy,
        ObjectFormat::Sha1,
        None,
    )
    .unwrap();
    assert_eq!(
        out.withheld,
        vec![".env".to_owned(), "deploy/.ssh/id_ed25519".to_owned()]
    );
    // Withheld files are not written, but they are part of the tree.
    assert_eq!(out.tree, tree_of(&tar));
    assert_eq!(out.extras.len(), 2);
    assert!(f.ws.read(".env").unwrap().is_none());
    assert!(f.ws.read("tests/fixtures/server.key").unwrap().is_some());
}

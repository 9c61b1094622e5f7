//! Change application on a real workspace: guards, counts, planted
//! symlinks and credential paths.

mod common;

use airlock_executor::apply::{CredentialPolicy, Workspace};
use airlock_proto::Code;
use airlock_proto::envelope::Change;
use base64::Engine;
use common::sha;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

struct Fixture {
    outer: tempfile::TempDir,
    ws: Workspace,
}

fn fixture() -> Fixture {
    let outer = tempfile::tempdir().unwrap();
    let src = outer.path().join("ws");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("hello.py"), "VALUE = 1\nVALUE = 1\n").unwrap();
    std::fs::create_dir(src.join("pkg")).unwrap();
    std::fs::write(src.join("pkg/run.sh"), "#!/bin/sh\necho old\n").unwrap();
    std::fs::set_permissions(
        src.join("pkg/run.sh"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::fs::write(outer.path().join("outside.txt"), "precious\n").unwrap();
    let ws = Workspace::open(&src, 1 << 20).unwrap();
    Fixture { outer, ws }
}

fn write(path: &str, content: &str) -> Change {
    Change::WriteFile {
        path: path.into(),
        content: content.into(),
        expected_sha256: None,
    }
}

fn replace(path: &str, old: &str, new: &str, count: u32) -> Change {
    Change::ReplaceText {
        path: path.into(),
        old: old.into(),
        new: new.into(),
        count,
        expected_sha256: None,
    }
}

fn link(path: &str, target: &str) -> Change {
    Change::WriteSymlink {
        path: path.into(),
        target: target.into(),
        expected_sha256: None,
    }
}

fn delete(path: &str) -> Change {
    Change::DeleteFile {
        path: path.into(),
        expected_sha256: None,
    }
}

fn code(f: &Fixture, changes: &[Change]) -> Code {
    f.ws.apply(changes, &CredentialPolicy::default())
        .unwrap_err()
        .code()
}

fn outside_intact(f: &Fixture) {
    let names: Vec<String> = std::fs::read_dir(f.outer.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(names, ["outside.txt", "ws"]);
    assert_eq!(
        std::fs::read_to_string(f.outer.path().join("outside.txt")).unwrap(),
        "precious\n"
    );
}

#[test]
fn a_change_set_is_applied_and_read_back() {
    let f = fixture();
    let touched =
        f.ws.apply(
            &[
                replace("hello.py", "VALUE = 1", "VALUE = 2", 2),
                write("new/dir/file.txt", "hi\n"),
                replace("pkg/run.sh", "old", "new", 1),
                write("gone.txt", "x"),
                delete("gone.txt"),
                delete("never-existed.txt"),
            ],
            &CredentialPolicy::default(),
        )
        .unwrap();
    assert_eq!(
        touched,
        [
            "gone.txt",
            "hello.py",
            "never-existed.txt",
            "new/dir/file.txt",
            "pkg/run.sh"
        ]
    );
    let entries =
        f.ws.entries(&touched, &CredentialPolicy::default())
            .unwrap();
    let by = |p: &str| entries.iter().find(|e| e.path == p).unwrap().clone();
    let hello = by("hello.py");
    let content = base64::engine::general_purpose::STANDARD
        .decode(hello.content_b64.unwrap())
        .unwrap();
    assert_eq!(content, b"VALUE = 2\nVALUE = 2\n");
    assert_eq!(hello.sha256.unwrap(), sha(&content));
    assert!(!hello.deleted && !hello.executable);
    assert!(by("pkg/run.sh").executable, "the executable bit is kept");
    assert!(by("gone.txt").deleted && by("gone.txt").content_b64.is_none());
    assert!(by("never-existed.txt").deleted);
    assert!(!by("new/dir/file.txt").deleted);
    outside_intact(&f);
}

#[test]
fn drift_guards_are_enforced() {
    let f = fixture();
    let current = sha(b"VALUE = 1\nVALUE = 1\n");
    let guarded = |expected: &str| Change::WriteFile {
        path: "hello.py".into(),
        content: "x".into(),
        expected_sha256: Some(expected.into()),
    };
    assert_eq!(code(&f, &[guarded(&"0".repeat(64))]), Code::SOURCE_DRIFT);
    // A guard on a missing file is drift too.
    let missing = Change::DeleteFile {
        path: "absent.txt".into(),
        expected_sha256: Some(current.clone()),
    };
    assert_eq!(code(&f, &[missing]), Code::SOURCE_DRIFT);
    // The right digest passes.
    f.ws.apply(&[guarded(&current)], &CredentialPolicy::default())
        .unwrap();
    assert_eq!(f.ws.read("hello.py").unwrap().unwrap().bytes, b"x");
}

#[test]
fn replace_text_needs_the_exact_count_and_an_existing_file() {
    let f = fixture();
    assert_eq!(
        code(&f, &[replace("hello.py", "VALUE = 1", "V", 1)]),
        Code::REPLACE_COUNT_INVALID
    );
    assert_eq!(
        code(&f, &[replace("hello.py", "VALUE = 1", "V", 3)]),
        Code::REPLACE_COUNT_INVALID
    );
    assert_eq!(
        code(&f, &[replace("hello.py", "absent", "V", 1)]),
        Code::REPLACE_COUNT_INVALID
    );
    assert_eq!(
        code(&f, &[replace("nope.py", "a", "b", 1)]),
        Code::REPLACE_SOURCE_MISSING
    );
    // Nothing was changed by the refused replacements.
    assert_eq!(
        f.ws.read("hello.py").unwrap().unwrap().bytes,
        b"VALUE = 1\nVALUE = 1\n"
    );
}

#[test]
fn planted_symlinks_are_never_followed() {
    let f = fixture();
    let ws = f.ws.path().to_owned();
    let outside = f.outer.path().join("outside.txt");
    std::os::unix::fs::symlink(&outside, ws.join("link.txt")).unwrap();
    std::os::unix::fs::symlink(f.outer.path(), ws.join("dirlink")).unwrap();
    std::os::unix::fs::symlink("../outside.txt", ws.join("pkg/rel.txt")).unwrap();
    for change in [
        write("link.txt", "pwned\n"),
        replace("link.txt", "precious", "pwned", 1),
        write("dirlink/outside.txt", "pwned\n"),
        write("dirlink/new.txt", "pwned\n"),
        delete("dirlink/outside.txt"),
        link("dirlink/l", "x"),
        write("pkg/rel.txt", "pwned\n"),
    ] {
        assert_eq!(
            code(&f, std::slice::from_ref(&change)),
            Code::PATH_ESCAPE,
            "{change:?}"
        );
    }
    // Reading back through a link is refused the same way.
    assert_eq!(
        f.ws.entries(
            &["dirlink/outside.txt".into()],
            &CredentialPolicy::default()
        )
        .unwrap_err()
        .code(),
        Code::PATH_ESCAPE
    );
    // A guard is over the link's target, never what it points to.
    let guarded = Change::DeleteFile {
        path: "pkg/rel.txt".into(),
        expected_sha256: Some(sha(b"precious\n")),
    };
    assert_eq!(code(&f, &[guarded]), Code::SOURCE_DRIFT);
    outside_intact(&f);
    assert!(
        std::fs::symlink_metadata(ws.join("link.txt"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
}

/// A link is itself the thing a change reads, retargets or deletes: the
/// result carries it as a link, and what it points to is never touched.
#[test]
fn links_are_added_retargeted_and_deleted_as_links() {
    let f = fixture();
    let ws = f.ws.path().to_owned();
    let outside = f.outer.path().join("outside.txt");
    std::os::unix::fs::symlink(&outside, ws.join("abs")).unwrap();
    std::os::unix::fs::symlink("hello.py", ws.join("old")).unwrap();
    let policy = CredentialPolicy::default();
    let touched =
        f.ws.apply(
            &[
                link("docs/hello", "../hello.py"),
                Change::WriteSymlink {
                    path: "old".into(),
                    target: "pkg/run.sh".into(),
                    expected_sha256: Some(sha(b"hello.py")),
                },
                delete("abs"),
                link("pkg/run.sh", "../hello.py"),
            ],
            &policy,
        )
        .unwrap();
    assert_eq!(touched, ["abs", "docs/hello", "old", "pkg/run.sh"]);
    assert_eq!(
        std::fs::read_link(ws.join("docs/hello")).unwrap().to_str(),
        Some("../hello.py")
    );
    assert_eq!(
        std::fs::read_link(ws.join("old")).unwrap().to_str(),
        Some("pkg/run.sh")
    );
    assert!(std::fs::symlink_metadata(ws.join("abs")).is_err());
    outside_intact(&f);
    let entries = f.ws.entries(&touched, &policy).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD;
    let shown: Vec<(&str, bool, bool, Vec<u8>)> = entries
        .iter()
        .map(|e| {
            (
                e.path.as_str(),
                e.deleted,
                e.symlink,
                b64.decode(e.content_b64.as_deref().unwrap_or("")).unwrap(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            ("abs", true, false, vec![]),
            ("docs/hello", false, true, b"../hello.py".to_vec()),
            ("old", false, true, b"pkg/run.sh".to_vec()),
            ("pkg/run.sh", false, true, b"../hello.py".to_vec()),
        ]
    );
    assert_eq!(
        entries[1].sha256.as_deref(),
        Some(sha(b"../hello.py").as_str())
    );
    // A stale guard on a link is drift, and changes nothing.
    let stale = Change::WriteSymlink {
        path: "old".into(),
        target: "hello.py".into(),
        expected_sha256: Some(sha(b"hello.py")),
    };
    assert_eq!(code(&f, &[stale]), Code::SOURCE_DRIFT);
    assert_eq!(
        std::fs::read_link(ws.join("old")).unwrap().to_str(),
        Some("pkg/run.sh")
    );
    // A directory is neither replaced by a link nor deleted.
    assert_eq!(code(&f, &[link("pkg", "hello.py")]), Code::PATH_ESCAPE);
}

#[test]
fn directories_and_fifos_are_not_files() {
    let f = fixture();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        f.ws.path().join("fifo"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    assert_eq!(code(&f, &[write("pkg", "x")]), Code::PATH_ESCAPE);
    assert_eq!(code(&f, &[delete("pkg")]), Code::PATH_ESCAPE);
    assert_eq!(code(&f, &[write("fifo", "x")]), Code::PATH_ESCAPE);
    assert_eq!(
        code(&f, &[write("hello.py/child", "x")]),
        Code::PATH_INVALID
    );
}

#[test]
fn credential_paths_are_denied_unless_allowed() {
    let f = fixture();
    for path in [
        ".env",
        "config/.env.local",
        "home/.ssh/authorized_keys",
        "id_rsa",
        ".aws/credentials",
        "tls/server.key",
    ] {
        assert_eq!(
            code(&f, &[write(path, "x")]),
            Code::CREDENTIAL_PATH_DENIED,
            "{path}"
        );
        assert!(!Path::new(&f.ws.path().join(path)).exists());
    }
    let allow = CredentialPolicy {
        allow: vec!["tests/fixtures/*.key".into()],
    };
    f.ws.apply(&[write("tests/fixtures/test.key", "k")], &allow)
        .unwrap();
    assert_eq!(
        f.ws.apply(&[write("tests/fixtures/deeper/test.key", "k")], &allow)
            .unwrap_err()
            .code(),
        Code::CREDENTIAL_PATH_DENIED
    );
    // An escape is reported as an escape even on a credential path.
    std::os::unix::fs::symlink(f.outer.path(), f.ws.path().join("cfg")).unwrap();
    assert_eq!(code(&f, &[write("cfg/.env", "x")]), Code::PATH_ESCAPE);
}

#[test]
fn oversized_content_is_refused() {
    let outer = tempfile::tempdir().unwrap();
    let src = outer.path().join("ws");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("big.bin"), vec![0u8; 2048]).unwrap();
    let ws = Workspace::open(&src, 1024).unwrap();
    assert_eq!(
        ws.apply(
            &[write("a.txt", &"x".repeat(1025))],
            &CredentialPolicy::default()
        )
        .unwrap_err()
        .code(),
        Code::FILE_TOO_LARGE
    );
    assert_eq!(
        ws.entries(&["big.bin".into()], &CredentialPolicy::default())
            .unwrap_err()
            .code(),
        Code::FILE_TOO_LARGE
    );
}

//! Fuzz targets for the executor's two untrusted inputs, and the corpora
//! that seed them.
//!
//! - [`request`]: arbitrary bytes through the executor's request parsing
//!   (`ExecRequest` strictly, its id, `validate`), `Envelope::validate` and
//!   `TaskSubmission::from_value` on whatever JSON they hold. Must never
//!   panic.
//! - [`extract`]: arbitrary bytes through the executor's archive
//!   extraction into a fresh workspace. Must never panic and never leave
//!   anything outside the workspace, nor a link, a special file or a
//!   setuid bit inside it.
//!
//! Both run two ways: as cargo-fuzz targets (`fuzz_targets/`, nightly,
//! `--features libfuzzer`), and as plain stable tests (`tests/replay.rs`)
//! that replay the generated corpora ([`request_corpus`],
//! [`archive_corpus`]) and then a seeded random-mutation loop ([`Rng`],
//! [`mutate`]). No binary fixture is committed: every hostile input is
//! built here.

use airlock_executor::apply::{CredentialPolicy, Workspace};
use airlock_executor::tree::extract::{ArchiveLimits, extract as executor_extract};
use airlock_proto::envelope::Envelope;
use airlock_proto::task::TaskSubmission;
use serde_json::{Value, json};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Request parsing on arbitrary bytes.
pub fn request(data: &[u8]) {
    let _ = airlock_executor::request::parse(data, None);
    let _ =
        airlock_executor::request::parse(data, Some("r0000000000000000000000000000000000000000"));
    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let _ = Envelope::validate(&value, None, None);
    let _ = TaskSubmission::from_value(&value);
    if let Some(envelope) = value.get("envelope") {
        let _ = Envelope::validate(envelope, None, None);
    }
    if let Some(plan) = value.get("plan") {
        let _ = airlock_proto::plan::PlanRequest::from_value(plan);
    }
}

/// Bounds used for extraction in the fuzz targets (small, so that inputs
/// stay cheap).
pub fn limits() -> ArchiveLimits {
    ArchiveLimits {
        max_entries: 256,
        max_file_bytes: 1 << 20,
        max_total_bytes: 4 << 20,
        max_expansion_ratio: 100,
    }
}

/// Content of the file beside the workspace that no archive may touch.
const SENTINEL: &[u8] = b"outside the workspace\n";

/// Extracts `data` into a fresh workspace inside a fresh directory that
/// also holds a sentinel file, then checks that nothing but the workspace
/// and the untouched sentinel is there, and that the workspace holds only
/// plain directories, regular files without special mode bits and
/// symbolic links (never written through).
/// Extraction errors are fine; a violated check is returned as `Err`.
pub fn extract(data: &[u8]) -> Result<(), String> {
    let outer = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
    let ws_path = outer.path().join("ws");
    std::fs::create_dir(&ws_path).map_err(|e| format!("mkdir: {e}"))?;
    std::fs::write(outer.path().join("sentinel"), SENTINEL).map_err(|e| format!("{e}"))?;
    let ws = Workspace::open(&ws_path, 1 << 20).map_err(|e| format!("open: {e}"))?;
    let _ = executor_extract(
        data,
        ws.root(),
        &limits(),
        &CredentialPolicy::default(),
        airlock_proto::tree::ObjectFormat::Sha1,
        None,
    );
    drop(ws);
    check_outer(outer.path())
}

fn check_outer(outer: &Path) -> Result<(), String> {
    let mut names: Vec<String> = std::fs::read_dir(outer)
        .map_err(|e| format!("{e}"))?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{e}"))?;
    names.sort();
    if names != ["sentinel", "ws"] {
        return Err(format!("written outside the workspace: {names:?}"));
    }
    let sentinel = outer.join("sentinel");
    let meta = std::fs::symlink_metadata(&sentinel).map_err(|e| format!("{e}"))?;
    if !meta.is_file()
        || meta.nlink() != 1
        || std::fs::read(&sentinel).ok().as_deref() != Some(SENTINEL)
    {
        return Err("the sentinel outside the workspace changed".into());
    }
    check_tree(&outer.join("ws"), outer)
}

fn check_tree(dir: &Path, outer: &Path) -> Result<(), String> {
    for entry in std::fs::read_dir(dir).map_err(|e| format!("{e}"))? {
        let path = entry.map_err(|e| format!("{e}"))?.path();
        let rel = path
            .strip_prefix(outer)
            .unwrap_or(&path)
            .display()
            .to_string();
        let m = std::fs::symlink_metadata(&path).map_err(|e| format!("{rel}: {e}"))?;
        if m.mode() & 0o7000 != 0 {
            return Err(format!("{rel}: mode {:o} has special bits", m.mode()));
        }
        if path
            .file_name()
            .is_some_and(|n| n.eq_ignore_ascii_case(".git"))
        {
            return Err(format!("{rel}: a .git component"));
        }
        if m.is_dir() {
            check_tree(&path, outer)?;
        } else if m.is_symlink() {
            // A tree's link, made as the archive has it (never followed:
            // nothing outside changed, which check_outer saw).
        } else if !m.is_file() {
            return Err(format!("{rel}: not a regular file, link or directory"));
        } else if m.nlink() != 1 {
            return Err(format!("{rel}: {} hard links", m.nlink()));
        }
    }
    Ok(())
}

// --- corpora ---------------------------------------------------------------

fn binding_json(task: &str) -> Value {
    json!({
        "task_id": task, "job_id": "job-fuzz", "repository": "demo",
        "base_oid": "a".repeat(40), "expected_branch_oid": "a".repeat(40),
        "target_branch": format!("agent/{task}"), "branch_mode": "CREATE_NEW",
        "generation": 1, "idempotency_key": format!("idem-{task}"),
    })
}

fn planner_request() -> Value {
    json!({
        "action": "deterministic",
        "change_set": [{"path": "x.py", "operation": "write_file", "content": "x=1\n"}],
        "verification": [{"label": "compile", "argv": ["/usr/bin/python3", "-m", "py_compile", "x.py"], "cwd": ".", "timeout_seconds": 30}],
        "capability_scope": ["git.test"],
        "commit_idempotency_key": "commit-fuzz",
    })
}

/// A valid ExecRequest (as JSON) for a fixed archive.
pub fn valid_request() -> Value {
    use airlock_proto::binding::Binding;
    use airlock_proto::bundle::{EXEC_REQUEST_SCHEMA, ExecRequest, request_id_for};
    use airlock_proto::envelope::ExecutionRequest;
    let binding = Binding::from_value(&binding_json("task-fuzz")).expect("binding");
    let req = ExecutionRequest::from_value(&planner_request()).expect("planner request");
    let env = Envelope::project(&binding, &req).expect("envelope");
    let r = ExecRequest {
        schema: EXEC_REQUEST_SCHEMA.into(),
        request_id: request_id_for("task-fuzz", 1, &env.execution_digest),
        attempt: 1,
        envelope: env.to_value(),
        source_tree: "0".repeat(40),
    };
    serde_json::to_value(&r).expect("request")
}

/// Request-parsing seeds: a valid request and submission, each edited in
/// hostile ways, and JSON that stresses the parser.
pub fn request_corpus() -> Vec<Vec<u8>> {
    let valid = valid_request();
    let submission = json!({
        "schema": "airlock.task.v1", "binding": binding_json("task-fuzz"),
        "plan": {"schema": "airlock.plan.v1", "task_id": "task-fuzz", "job_id": "job-fuzz",
                 "source_head_oid": "a".repeat(40), "generation": 1,
                 "idempotency_key": "plan-fuzz", "execution": planner_request()},
        "max_attempts": 2,
    });
    let mut values = vec![valid.clone(), valid["envelope"].clone(), submission.clone()];
    let edits: Vec<(&str, Value)> = vec![
        ("/envelope/target_branch", json!("main")),
        ("/envelope/target_branch", json!("agent/../main")),
        ("/envelope/execution_digest", json!("0".repeat(64))),
        (
            "/envelope/verification/0/argv",
            json!(["/bin/sh", "-c", "id"]),
        ),
        ("/envelope/verification/0/timeout_seconds", json!(-1)),
        ("/envelope/verification/0/timeout_seconds", json!(1e300)),
        ("/envelope/change_set/0/path", json!("../../etc/passwd")),
        ("/envelope/change_set/0/path", json!("/etc/passwd")),
        (
            "/envelope/change_set/0/path",
            json!(".git/hooks/pre-commit"),
        ),
        ("/envelope/change_set/0/path", json!("a\u{0}b")),
        ("/envelope/change_set/0/operation", json!("chmod")),
        ("/envelope/governance", json!({"force_push": true})),
        ("/attempt", json!(4_294_967_296u64)),
        ("/source_tree", json!("../../x")),
        ("/source_tree", json!("A".repeat(40))),
        ("/request_id", json!("../../x")),
        ("/schema", json!(null)),
        ("/envelope", json!([])),
    ];
    for (pointer, replacement) in edits {
        let mut v = valid.clone();
        if let Some(slot) = v.pointer_mut(pointer) {
            *slot = replacement;
            values.push(v);
        }
    }
    let mut extra = valid.clone();
    extra["unexpected"] = json!(true);
    values.push(extra);
    let mut sub = submission;
    sub["max_attempts"] = json!(51);
    values.push(sub);
    let mut out: Vec<Vec<u8>> = values
        .iter()
        .map(|v| serde_json::to_vec(v).expect("json"))
        .collect();
    out.push(b"[".repeat(4096));
    out.push(format!("{}{}", "{\"a\":".repeat(300), "}".repeat(300)).into_bytes());
    out.push(b"\"\\ud800\"".to_vec());
    out.push(b"{\"schema\":\"airlock.exec-request.v1\",\"schema\":\"x\"}".to_vec());
    out.push(b"1e99999".to_vec());
    out.push(vec![0xff, 0xfe, 0x00]);
    out.push(Vec::new());
    out
}

fn header(name: &[u8], kind: tar::EntryType, size: u64, mode: u32, link: &[u8]) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    {
        let gnu = h.as_gnu_mut().expect("gnu header");
        let n = name.len().min(gnu.name.len());
        gnu.name[..n].copy_from_slice(&name[..n]);
        let l = link.len().min(gnu.linkname.len());
        gnu.linkname[..l].copy_from_slice(&link[..l]);
    }
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_cksum();
    h
}

/// Raw tar bytes from (header, data) members, with the end blocks.
fn raw_tar(members: &[(tar::Header, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (h, data) in members {
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(data);
        out.extend(std::iter::repeat_n(0u8, (512 - data.len() % 512) % 512));
    }
    out.extend(std::iter::repeat_n(0u8, 1024));
    out
}

fn file(name: &str, data: &[u8]) -> (tar::Header, Vec<u8>) {
    (
        header(
            name.as_bytes(),
            tar::EntryType::Regular,
            data.len() as u64,
            0o644,
            b"",
        ),
        data.to_vec(),
    )
}

/// A pax extended header member setting `key=value` for the next member.
fn pax(key: &str, value: &[u8]) -> (tar::Header, Vec<u8>) {
    let mut record = Vec::new();
    let body_len = key.len() + value.len() + 3; // ' ', '=', '\n'
    let mut len = body_len + 1;
    while len != body_len + len.to_string().len() {
        len = body_len + len.to_string().len();
    }
    record.extend_from_slice(format!("{len} {key}=").as_bytes());
    record.extend_from_slice(value);
    record.push(b'\n');
    (
        header(
            b"././@PaxHeader",
            tar::EntryType::XHeader,
            record.len() as u64,
            0o644,
            b"",
        ),
        record,
    )
}

/// A GNU long-name member naming the next member.
fn long_name(name: &[u8]) -> (tar::Header, Vec<u8>) {
    let mut data = name.to_vec();
    data.push(0);
    (
        header(
            b"././@LongLink",
            tar::EntryType::GNULongName,
            data.len() as u64,
            0o644,
            b"",
        ),
        data,
    )
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).expect("gzip");
    e.finish().expect("gzip")
}

/// Hostile archives, each built here: escapes by path, by link, by long
/// name and by pax header, special members and bits, duplicates and
/// type clashes, a gzip bomb, truncation and garbage.
pub fn archive_corpus() -> Vec<Vec<u8>> {
    use tar::EntryType as T;
    let ok = file("ok.txt", b"fine\n");
    let mut out: Vec<Vec<u8>> = vec![
        raw_tar(std::slice::from_ref(&ok)),
        raw_tar(&[file("/tmp/abs", b"x")]),
        raw_tar(&[file("../escape", b"x")]),
        raw_tar(&[file("a/../../escape", b"x")]),
        raw_tar(&[file(".git/hooks/pre-commit", b"#!/bin/sh\n")]),
        raw_tar(&[file("./.GIT/config", b"x")]),
        raw_tar(&[(
            header(b"link", T::Symlink, 0, 0o777, b"/etc/passwd"),
            vec![],
        )]),
        raw_tar(&[
            (header(b"dir", T::Symlink, 0, 0o777, b".."), vec![]),
            file("dir/escape", b"x"),
        ]),
        raw_tar(&[(header(b"hard", T::Link, 0, 0o644, b"../sentinel"), vec![])]),
        raw_tar(&[
            ok.clone(),
            (header(b"hard", T::Link, 0, 0o644, b"ok.txt"), vec![]),
        ]),
        raw_tar(&[(header(b"null", T::Char, 0, 0o666, b""), vec![])]),
        raw_tar(&[(header(b"disk", T::Block, 0, 0o660, b""), vec![])]),
        raw_tar(&[(header(b"fifo", T::Fifo, 0, 0o644, b""), vec![])]),
        raw_tar(&[(header(b"suid", T::Regular, 1, 0o4755, b""), b"x".to_vec())]),
        raw_tar(&[(header(b"sgid-dir/", T::Directory, 0, 0o2755, b""), vec![])]),
        raw_tar(&[ok.clone(), ok.clone()]),
        raw_tar(&[
            file("clash", b"x"),
            (header(b"clash/", T::Directory, 0, 0o755, b""), vec![]),
            file("clash/inner", b"y"),
        ]),
        raw_tar(&[
            (header(b"d/", T::Directory, 0, 0o755, b""), vec![]),
            file("d", b"x"),
        ]),
        raw_tar(&[pax("path", b"../pax-escape"), file("innocent", b"x")]),
        raw_tar(&[pax("path", b"/etc/pax-abs"), file("innocent", b"x")]),
        raw_tar(&[
            pax("linkpath", b"/etc/shadow"),
            (header(b"pl", T::Symlink, 0, 0o777, b"x"), vec![]),
        ]),
        raw_tar(&[pax("size", b"99999999999"), file("big", b"x")]),
        raw_tar(&[long_name(b"../../long-escape"), file("short", b"x")]),
        raw_tar(&[long_name(&[b'a'; 5000]), file("short", b"x")]),
        raw_tar(&[(header(b"sparse", T::GNUSparse, 0, 0o644, b""), vec![])]),
        raw_tar(&[(
            header(b"contig", T::Continuous, 1, 0o644, b""),
            b"x".to_vec(),
        )]),
        raw_tar(&[(header(b"huge", T::Regular, 1 << 40, 0o644, b""), vec![])]),
        raw_tar(&[file("ctrl\nname", b"x")]),
        raw_tar(&[(header(b"bad\xff", T::Regular, 1, 0o644, b""), b"x".to_vec())]),
        raw_tar(
            &(0..300)
                .map(|i| file(&format!("f{i}"), b""))
                .collect::<Vec<_>>(),
        ),
        gzip(&raw_tar(&[file("z.txt", &vec![0u8; 8 << 20])])),
        gzip(&raw_tar(std::slice::from_ref(&ok))),
    ];
    let whole = raw_tar(std::slice::from_ref(&ok));
    out.push(whole[..700].to_vec());
    out.push(gzip(&whole)[..20].to_vec());
    let mut bad_sum = whole.clone();
    bad_sum[148] ^= 1;
    out.push(bad_sum);
    out.push(vec![0x1f, 0x8b]);
    out.push(b"not a tar".to_vec());
    out.push(Vec::new());
    out
}

// --- the random loop --------------------------------------------------------

/// A small deterministic generator (xorshift64*), so a failing case can be
/// reproduced from its seed.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed (0 is replaced by a constant).
    pub fn new(seed: u64) -> Rng {
        Rng(if seed == 0 {
            0x9e37_79b9_7f4a_7c15
        } else {
            seed
        })
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// One random mutation of `input`: flip, overwrite, insert, delete, splice
/// a chunk of `other`, truncate, or interesting values (0, 0xff, '/', '.').
pub fn mutate(rng: &mut Rng, input: &[u8], other: &[u8]) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..=rng.below(4) {
        let len = v.len();
        match rng.below(7) {
            0 if len > 0 => {
                let i = rng.below(len);
                v[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                v[i] = [0u8, 0xff, b'/', b'.', b'"', b'0', b'7'][rng.below(7)];
            }
            2 => {
                let i = rng.below(len + 1);
                v.insert(i, rng.next_u64() as u8);
            }
            3 if len > 0 => {
                let i = rng.below(len);
                v.remove(i);
            }
            4 if !other.is_empty() => {
                let start = rng.below(other.len());
                let end = (start + rng.below(64) + 1).min(other.len());
                let at = rng.below(len + 1);
                v.splice(at..at, other[start..end].iter().copied());
            }
            5 if len > 0 => v.truncate(rng.below(len)),
            _ => {
                let n = rng.below(32);
                v.extend((0..n).map(|_| rng.next_u64() as u8));
            }
        }
    }
    v
}

/// Writes the corpora where cargo-fuzz looks for seeds
/// (`fuzz/corpus/<target>/seed-N`).
pub fn write_corpora(dir: &Path) -> std::io::Result<()> {
    for (target, corpus) in [("request", request_corpus()), ("extract", archive_corpus())] {
        let d = dir.join(target);
        std::fs::create_dir_all(&d)?;
        for (i, input) in corpus.iter().enumerate() {
            std::fs::write(d.join(format!("seed-{i:03}")), input)?;
        }
    }
    Ok(())
}

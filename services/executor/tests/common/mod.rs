//! Shared test helpers: envelopes, requests and archives built in the test.
#![allow(dead_code)]

use airlock_proto::binding::Binding;
use airlock_proto::bundle::{EXEC_REQUEST_SCHEMA, ExecRequest, request_id_for};
use airlock_proto::envelope::{Envelope, ExecutionRequest};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

pub fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// A blob's git id (SHA-1), hex.
pub fn blob_id(content: &[u8]) -> String {
    hex::encode(airlock_proto::tree::object_id(
        airlock_proto::tree::ObjectFormat::Sha1,
        "blob",
        content,
    ))
}

pub fn binding(task: &str) -> Binding {
    Binding::from_value(&json!({
        "task_id": task, "job_id": "job-exec-1", "repository": "demo",
        "base_oid": "a".repeat(40), "expected_branch_oid": "a".repeat(40),
        "target_branch": format!("agent/{task}"), "branch_mode": "CREATE_NEW",
        "generation": 1, "idempotency_key": format!("idem-{task}"),
    }))
    .unwrap()
}

/// A projected, validated envelope for a planner request.
pub fn envelope(task: &str, request: Value) -> Envelope {
    let req = ExecutionRequest::from_value(&request).unwrap();
    Envelope::project(&binding(task), &req).unwrap()
}

/// An ExecRequest for `envelope` whose source is the tree `archive` holds.
pub fn exec_request(envelope: &Envelope, archive: &[u8]) -> ExecRequest {
    ExecRequest {
        schema: EXEC_REQUEST_SCHEMA.into(),
        request_id: request_id_for(&envelope.binding.task_id, 1, &envelope.execution_digest),
        attempt: 1,
        envelope: envelope.to_value(),
        source_tree: tree_of(archive),
    }
}

/// The git tree id (SHA-1 format) of a tar or tar.gz of regular files, as
/// the worker's repository would name it; an unreadable archive gets the
/// empty tree's id.
pub fn tree_of(archive: &[u8]) -> String {
    use airlock_proto::tree::{ObjectFormat, TreeBuilder};
    use std::io::Read;
    let reader: Box<dyn Read + '_> = if archive.starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::read::GzDecoder::new(archive))
    } else {
        Box::new(archive)
    };
    let mut tree = TreeBuilder::new(ObjectFormat::Sha1);
    let mut tar = tar::Archive::new(reader);
    let Ok(entries) = tar.entries() else {
        return tree.finish();
    };
    for entry in entries {
        let Ok(mut entry) = entry else { break };
        let path = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        if entry.header().entry_type() == tar::EntryType::Symlink {
            let target = entry.link_name_bytes().unwrap_or_default().into_owned();
            let _ = tree.add_symlink(&path, &target);
            continue;
        }
        if entry.header().entry_type() != tar::EntryType::Regular {
            continue;
        }
        let exec = entry.header().mode().unwrap_or(0) & 0o111 != 0;
        let mut data = Vec::new();
        if entry.read_to_end(&mut data).is_err() {
            break;
        }
        let _ = tree.add_blob(&path, exec, &data);
    }
    tree.finish()
}

/// A plain tar of regular files.
pub fn tar_of(files: &[(&str, &[u8], u32)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, data, mode) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(*mode);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, path, *data).unwrap();
    }
    b.into_inner().unwrap()
}

pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

/// A header written by hand, so that names the tar crate would refuse
/// (absolute, `..`) and link targets go in as raw bytes.
pub fn raw_header(
    name: &[u8],
    kind: tar::EntryType,
    size: u64,
    mode: u32,
    link: &[u8],
) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    {
        let gnu = h.as_gnu_mut().unwrap();
        gnu.name[..name.len()].copy_from_slice(name);
        gnu.linkname[..link.len()].copy_from_slice(link);
    }
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    if matches!(kind, tar::EntryType::Char | tar::EntryType::Block) {
        h.set_device_major(1).unwrap();
        h.set_device_minor(3).unwrap();
    }
    h.set_cksum();
    h
}

/// A tar holding one good file, then `header` (with `data`).
pub fn tar_with(header: tar::Header, data: &[u8]) -> Vec<u8> {
    let mut out = tar_of(&[("ok.txt", b"fine\n", 0o644)]);
    // Drop the two zero end blocks the builder wrote, then append.
    out.truncate(out.len() - 1024);
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    let pad = (512 - data.len() % 512) % 512;
    out.extend(std::iter::repeat_n(0u8, pad));
    out.extend(std::iter::repeat_n(0u8, 1024));
    out
}

/// Every path under `dir` (relative), sorted.
pub fn tree(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            out.push(p.strip_prefix(base).unwrap().display().to_string());
            if e.file_type().unwrap().is_dir() {
                walk(base, &p, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// The directory holding this test binary's cargo profile outputs
/// (`target/<profile>`), where `airlock-executor` and `airlock-confine` are.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/<test>-<hash>
    exe.parent().unwrap().parent().unwrap().to_owned()
}

pub fn executor_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_airlock-executor"))
}

//! The release check of the bus protocol: a change to any message a
//! process sends another — a struct or enum in the message modules, a
//! schema tag, the bus contract's interfaces and methods, the state table —
//! fails this test until `airlock_proto::bus::PROTOCOL_VERSION` is bumped
//! (docs/protocol.md says which number) and `crates/proto/protocol.lock`
//! is rewritten with `UPDATE_PROTOCOL_LOCK=1 cargo test -p airlock-proto
//! --test protocol`. Doc comments and code outside the declarations do not
//! count.

use airlock_proto::bus::{INTERFACES, PROTOCOL_VERSION, protocol_string};
use airlock_proto::states::TABLE;
use sha2::{Digest, Sha256};
use std::path::Path;

/// The modules that declare what crosses a boundary.
const MESSAGE_MODULES: &[&str] = &[
    "binding.rs",
    "bundle.rs",
    "bus.rs",
    "checkpoint.rs",
    "envelope.rs",
    "plan.rs",
    "reconcile.rs",
    "retry.rs",
    "states.rs",
    "task.rs",
];

/// Top-level `pub struct`/`pub enum` declarations with their attributes,
/// and `pub const …SCHEMA…` tags, without doc comments or blank lines.
fn declarations(source: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut attrs: Vec<&str> = Vec::new();
    let mut inside = false;
    for line in source.lines() {
        let t = line.trim();
        if inside {
            if !t.starts_with("//") && !t.is_empty() {
                out.push(t.to_owned());
            }
            if line == "}" {
                inside = false;
            }
            continue;
        }
        if t.starts_with("#[") && !line.starts_with(' ') {
            attrs.push(t);
            continue;
        }
        if line.starts_with("pub struct ") || line.starts_with("pub enum ") {
            out.extend(attrs.drain(..).map(str::to_owned));
            out.push(t.to_owned());
            inside = !t.ends_with(';');
            continue;
        }
        if line.starts_with("pub const ") && line.contains("SCHEMA") {
            out.push(t.to_owned());
        }
        if !t.starts_with("///") {
            attrs.clear();
        }
    }
    out
}

fn fingerprint() -> String {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut h = Sha256::new();
    for m in MESSAGE_MODULES {
        let text = std::fs::read_to_string(src.join(m)).unwrap();
        h.update(m.as_bytes());
        for d in declarations(&text) {
            h.update(d.as_bytes());
            h.update(b"\n");
        }
    }
    h.update(format!("{INTERFACES:?}").as_bytes());
    h.update(format!("{TABLE:?}").as_bytes());
    hex::encode(h.finalize())
}

#[test]
fn a_message_change_needs_a_protocol_version_bump() {
    let lock = Path::new(env!("CARGO_MANIFEST_DIR")).join("protocol.lock");
    let version = protocol_string(PROTOCOL_VERSION);
    let wanted = format!("version = {version}\nfingerprint = {}\n", fingerprint());
    if std::env::var_os("UPDATE_PROTOCOL_LOCK").is_some_and(|v| v == "1") {
        std::fs::write(&lock, &wanted).unwrap();
        return;
    }
    let actual = std::fs::read_to_string(&lock).unwrap_or_default();
    let locked_version = actual
        .lines()
        .find_map(|l| l.strip_prefix("version = "))
        .unwrap_or("");
    if actual == wanted {
        return;
    }
    if locked_version == version {
        panic!(
            "the messages changed but PROTOCOL_VERSION is still {version}: bump the minor \
             for an addition old peers can ignore, the major for anything else (a removed or \
             renamed field, a new required field, a tightened rule or default; \
             docs/protocol.md), then run\n\n    UPDATE_PROTOCOL_LOCK=1 cargo test -p airlock-proto --test protocol\n"
        );
    }
    panic!(
        "PROTOCOL_VERSION is {version} but crates/proto/protocol.lock records {locked_version}: \
         run\n\n    UPDATE_PROTOCOL_LOCK=1 cargo test -p airlock-proto --test protocol\n"
    );
}

#[test]
fn declarations_ignore_doc_comments_but_see_fields() {
    let a = "/// one\npub struct M {\n    /// doc\n    pub a: u32,\n}\n";
    let b = "/// two\npub struct M {\n    /// other doc\n    pub a: u32,\n}\n";
    let c = "pub struct M {\n    pub a: u32,\n    pub b: u32,\n}\n";
    assert_eq!(declarations(a), declarations(b));
    assert_ne!(declarations(a), declarations(c));
    let d = "#[serde(deny_unknown_fields)]\npub struct M {\n    pub a: u32,\n}\n";
    assert_ne!(
        declarations(c.replace("    pub b: u32,\n", "").as_str()),
        declarations(d)
    );
}

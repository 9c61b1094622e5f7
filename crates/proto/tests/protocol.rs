//! The release check of the bus protocol: a change to any message a
//! process sends another — a struct or enum in the message modules, a
//! schema tag, the bus contract's rows (interfaces, methods, signatures,
//! permissions, audited events, reply types), the state table —
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
    // Every row: signature, permission, audited event, reply type; and the
    // call shapes refused by name.
    let rows: Vec<_> = airlock_proto::bus::every_row().collect();
    h.update(format!("{rows:?}").as_bytes());
    h.update(format!("{:?}", airlock_proto::bus::tasks_v1::RETIRED).as_bytes());
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

// ---- the signature lock ---------------------------------------------------
//
// `crates/proto/bus.lock` records the D-Bus signature of every row of
// `airlock_proto::bus`. A client written against an interface calls its
// methods with the signatures it was written for; if a method's arguments
// change under the same interface name, that client gets a bare signature
// error from the bus library instead of an answer. So, as systemd and
// stratisd do, an incompatible change is a new interface version (Tasks2
// beside Tasks1, the old one kept for at least a release): this test fails
// when a locked signature changes, or a locked method disappears, under
// the same interface name, and when a new version replaces the previous
// one in the same change. Additions (a method, an interface) and an old
// interface retired after its successor was locked only need the lock
// rewritten: `UPDATE_PROTOCOL_LOCK=1 cargo test -p airlock-proto --test
// protocol`, which refuses to record an incompatible change.

/// One locked row: interface, method, in, out.
type Sig = (String, String, String, String);

const LOCK_HEADER: &str =
    "# interface method in out ('-': none); see crates/proto/tests/protocol.rs\n";

fn dash(s: &str) -> &str {
    if s.is_empty() { "-" } else { s }
}

fn current_signatures() -> Vec<Sig> {
    airlock_proto::bus::every_row()
        .map(|m| {
            (
                m.interface.to_owned(),
                m.name.to_owned(),
                dash(m.input).to_owned(),
                dash(m.output).to_owned(),
            )
        })
        .collect()
}

fn render(sigs: &[Sig]) -> String {
    let mut lines: Vec<String> = sigs
        .iter()
        .map(|(i, m, a, r)| format!("{i} {m} {a} {r}\n"))
        .collect();
    lines.sort();
    format!("{LOCK_HEADER}{}", lines.concat())
}

fn parse(lock: &str) -> Vec<Sig> {
    lock.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 4, "a bus.lock line: {l:?}");
            (f[0].into(), f[1].into(), f[2].into(), f[3].into())
        })
        .collect()
}

/// `org.airlock.Tasks2` → `org.airlock.Tasks1`.
fn predecessor(interface: &str) -> Option<String> {
    let digits = interface.len()
        - interface
            .trim_end_matches(|c: char| c.is_ascii_digit())
            .len();
    let (stem, n) = interface.split_at(interface.len() - digits);
    let n: u32 = n.parse().ok()?;
    (n > 1).then(|| format!("{stem}{}", n - 1))
}

/// The changes from `locked` to `current` that a client of the locked
/// interfaces would trip over.
fn incompatible(locked: &[Sig], current: &[Sig]) -> Vec<String> {
    let served = |i: &str, v: &[Sig]| v.iter().any(|s| s.0 == i);
    let mut out = Vec::new();
    for (i, m, a, r) in locked {
        if !served(i, current) {
            continue; // retired whole
        }
        match current.iter().find(|s| &s.0 == i && &s.1 == m) {
            None => out.push(format!(
                "{i}.{m} was removed from {i}, which is still served: a client of {i} calling it gets an unknown-method error. Keep it, or serve the interface without it under a new version beside {i}"
            )),
            Some((_, _, a2, r2)) if a2 != a || r2 != r => out.push(format!(
                "{i}.{m} changed its signature from ({a}) -> {r} to ({a2}) -> {r2} under the same interface name: a client written against {i} would get a bare signature error. Declare the new signature under the next version of the interface, beside {i} (kept for at least a release, answering its old signature or PROTOCOL_VERSION_MISMATCH naming the new one)"
            )),
            Some(_) => {}
        }
    }
    let mut new: Vec<&str> = current
        .iter()
        .map(|s| s.0.as_str())
        .filter(|i| !served(i, locked))
        .collect();
    new.dedup();
    for i in new {
        if let Some(p) = predecessor(i) {
            if served(&p, locked) && !served(&p, current) {
                out.push(format!(
                    "{i} replaces {p} in the same change: keep {p} beside it for at least a release"
                ));
            }
        }
    }
    out
}

#[test]
fn a_signature_change_needs_a_new_interface_version() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("bus.lock");
    let actual = std::fs::read_to_string(&path).unwrap_or_default();
    let current = current_signatures();
    let broken = incompatible(&parse(&actual), &current);
    assert!(
        broken.is_empty(),
        "incompatible bus changes (crates/proto/bus.lock is not rewritten for these):\n- {}",
        broken.join("\n- ")
    );
    let wanted = render(&current);
    if std::env::var_os("UPDATE_PROTOCOL_LOCK").is_some_and(|v| v == "1") {
        std::fs::write(&path, &wanted).unwrap();
        return;
    }
    assert!(
        actual == wanted,
        "crates/proto/bus.lock does not list every row's signature as declared (an addition, or an interface retired): run\n\n    UPDATE_PROTOCOL_LOCK=1 cargo test -p airlock-proto --test protocol\n"
    );
}

#[test]
fn the_signature_lock_refuses_what_would_break_a_client() {
    let row =
        |i: &str, m: &str, a: &str, r: &str| -> Sig { (i.into(), m.into(), a.into(), r.into()) };
    let t1 = "org.airlock.Tasks1";
    let t2 = "org.airlock.Tasks2";
    let locked = vec![row(t1, "Verify", "sss", "s"), row(t1, "GetTask", "s", "s")];
    // The same rows, an added method, an added interface: compatible.
    assert!(incompatible(&locked, &locked).is_empty());
    let mut added = locked.clone();
    added.push(row(t1, "ListTasks", "ssu", "s"));
    added.push(row("org.airlock.Other1", "Do", "-", "-"));
    assert!(incompatible(&locked, &added).is_empty());
    // Verify's arguments changed under Tasks1 (what happened at 3.0).
    let changed = vec![row(t1, "Verify", "ss", "s"), row(t1, "GetTask", "s", "s")];
    let e = incompatible(&locked, &changed);
    assert!(
        e.len() == 1 && e[0].contains("Tasks1.Verify changed its signature"),
        "{e:?}"
    );
    // A reply changed is a signature change too.
    let reply = vec![row(t1, "Verify", "sss", "x"), row(t1, "GetTask", "s", "s")];
    assert_eq!(incompatible(&locked, &reply).len(), 1);
    // A method removed from an interface still served.
    let removed = vec![row(t1, "GetTask", "s", "s")];
    assert!(incompatible(&locked, &removed)[0].contains("was removed"));
    // Tasks2 beside Tasks1: compatible; Tasks2 instead of Tasks1: not.
    let mut beside = locked.clone();
    beside.push(row(t2, "Verify", "ss", "s"));
    assert!(incompatible(&locked, &beside).is_empty());
    let instead = vec![row(t2, "Verify", "ss", "s")];
    assert!(incompatible(&locked, &instead)[0].contains("replaces org.airlock.Tasks1"));
    // Once both are locked, Tasks1 may be retired.
    assert!(incompatible(&beside, &instead).is_empty());
    assert_eq!(
        predecessor("org.airlock.Tasks10").as_deref(),
        Some("org.airlock.Tasks9")
    );
    assert_eq!(predecessor("org.airlock.Tasks1"), None);
    // The lock round-trips.
    assert_eq!(parse(&render(&locked)).len(), 2);
}

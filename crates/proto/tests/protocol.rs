//! The release check of the bus protocol (docs/protocol.md, "Versions").
//!
//! `crates/proto/protocol.lock` records the protocol as its last release
//! declared it, one line per thing a peer sees: every message type (struct
//! or enum, and whether it refuses unknown fields), each of its fields
//! (type, whether a reader may go without it) and variants, every schema
//! tag, every method of the bus contract (signature, permission, audited
//! event, reply type), every call shape refused by name, every row of the
//! state table and of the store's transitions — and the version that
//! release was, `major.minor`.
//!
//! This test reads the declarations again, compares them with the lock and
//! classifies every difference as a peer of the locked release meets it
//! (seed 002's protocol checker, "classify, then assert the bump"):
//!
//! | difference | judged |
//! |---|---|
//! | a new message type, schema tag, method, refused call shape or table row | additive |
//! | a new field that is optional on read, in a type that ignores unknown fields | additive |
//! | a new field in a type that refuses unknown fields (`deny_unknown_fields`, or parsed by hand) | breaking: an older peer refuses every message that carries it |
//! | a new required field | breaking: an older peer's messages lack it |
//! | a new variant of an enum on the wire (without a `#[serde(other)]` catch-all) | breaking: an older peer cannot read it |
//! | a new variant of an enum that never crosses a boundary by itself | additive |
//! | anything removed, renamed or changed (a type, an attribute, a tag, a permission, a table row) | breaking |
//! | a type that stops refusing unknown fields, an enum that gains a catch-all | additive |
//!
//! What a shape cannot show — a tightened rule or default (seed 002:
//! "tightening a default is a major"), an addition the shapes judge
//! breaking that no older peer ever receives, a new refusal code — is
//! declared in [`FACTS`] for the release being made, with its reason.
//!
//! Then the bump must match, in both directions: a breaking change needs
//! the next major (`x+1.0`) and is refused as a minor; an additive one
//! needs the next minor (`x.y+1`) and is refused as a major (an upgrade
//! forced for nothing anyone needs); no change needs no bump; a version
//! moves one step at a time and never backwards. The lock is rewritten with
//! `UPDATE_PROTOCOL_LOCK=1 cargo test -p airlock-proto --test protocol`,
//! which applies the same judgement first and records nothing it refuses.
//! Doc comments and code outside the declarations do not count.

use airlock_proto::bus::{PROTOCOL_VERSION, protocol_string};
use airlock_proto::states::{Outcome, TABLE, TRANSITIONS};
use quote::ToTokens;
use std::collections::BTreeMap;
use std::path::Path;

/// The modules that declare what crosses a boundary.
const MESSAGE_MODULES: &[&str] = &[
    "binding.rs",
    "bundle.rs",
    "bus.rs",
    "checkpoint.rs",
    "egress/preamble.rs",
    "envelope.rs",
    "plan.rs",
    "reconcile.rs",
    "retry.rs",
    "states.rs",
    "task.rs",
    "upstream.rs",
];

// ---- facts the declarations do not show ------------------------------------

/// What the declarations cannot show about a release.
#[derive(Clone, Copy, Debug)]
enum Fact {
    /// The release breaks an older peer by a rule, a default or a meaning
    /// no declaration shows (a tightened check, a refusal where there was
    /// an answer): it needs the next major.
    Breaks {
        version: (u32, u32),
        why: &'static str,
    },
    /// The release adds what an older peer may ignore and no declaration
    /// shows (a new refusal code, a new optional behaviour): it needs at
    /// least the next minor.
    Adds {
        version: (u32, u32),
        why: &'static str,
    },
    /// `item` (a lock line's name) is judged breaking by its shape, but no
    /// older peer ever receives it (a variant only a newer client sends,
    /// refused cleanly by an older supervisor): judged additive.
    Unseen {
        version: (u32, u32),
        item: &'static str,
        why: &'static str,
    },
}

/// The facts of releases, newest first. Only those of the version
/// `PROTOCOL_VERSION` names count, while the lock still records an older
/// one; the rest are history (docs/protocol.md tells each release).
const FACTS: &[Fact] = &[
    Fact::Breaks {
        version: (12, 0),
        why: "a malformed call is MESSAGE_INVALID, an agent deciding its own task SELF_APPROVAL_FORBIDDEN, and a client more than one minor behind is refused",
    },
    Fact::Breaks {
        version: (11, 0),
        why: "CancelTask of a task under a fence is refused with TASK_COMMITTING where it used to cancel",
    },
];

// ---- the lock's lines ----------------------------------------------------------

/// What a line of the lock describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// A message type: `struct|enum`, how it reads unknown input, its serde
    /// attributes.
    Type,
    /// A field of a struct (or of an enum's variant): its type, whether a
    /// reader may go without it, its serde attributes.
    Field,
    /// A variant of an enum: its payload and serde attributes.
    Variant,
    /// A schema tag.
    Schema,
    /// A row of the bus contract.
    Method,
    /// A call shape refused by name.
    Retired,
    /// A row of the state table (operation, state).
    Table,
    /// A move of the task store (from, step, attempts).
    Step,
}

impl Kind {
    const ALL: [Kind; 8] = [
        Kind::Type,
        Kind::Field,
        Kind::Variant,
        Kind::Schema,
        Kind::Method,
        Kind::Retired,
        Kind::Table,
        Kind::Step,
    ];

    fn word(self) -> &'static str {
        match self {
            Kind::Type => "type",
            Kind::Field => "field",
            Kind::Variant => "variant",
            Kind::Schema => "schema",
            Kind::Method => "method",
            Kind::Retired => "retired",
            Kind::Table => "table",
            Kind::Step => "step",
        }
    }

    fn of(word: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.word() == word)
    }
}

/// The protocol as lines: `(kind, name)` → value.
type Lines = BTreeMap<(Kind, String), String>;

/// A lock: its version and its lines.
#[derive(Debug, PartialEq)]
struct Lock {
    version: (u32, u32),
    lines: Lines,
}

const LOCK_HEADER: &str = "# The airlock bus protocol as released: see crates/proto/tests/protocol.rs.\n\
# Rewrite it with UPDATE_PROTOCOL_LOCK=1 cargo test -p airlock-proto --test protocol\n";

fn render(lock: &Lock) -> String {
    let mut out = format!("{LOCK_HEADER}version {}\n", protocol_string(lock.version));
    for ((kind, name), value) in &lock.lines {
        out.push_str(&format!("{} {name} {value}\n", kind.word()));
    }
    out
}

fn parse_version(s: &str) -> Option<(u32, u32)> {
    let (a, b) = s.split_once('.')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

fn parse_lock(text: &str) -> Result<Lock, String> {
    let mut version = None;
    let mut lines = Lines::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (word, rest) = line
            .split_once(' ')
            .ok_or(format!("a lock line: {line:?}"))?;
        if word == "version" {
            version = Some(parse_version(rest).ok_or(format!("a version: {line:?}"))?);
            continue;
        }
        let kind = Kind::of(word).ok_or(format!("a lock line of no known kind: {line:?}"))?;
        let (name, value) = rest.split_once(' ').unwrap_or((rest, ""));
        lines.insert((kind, name.to_owned()), value.to_owned());
    }
    Ok(Lock {
        version: version.ok_or("the lock records no version")?,
        lines,
    })
}

// ---- reading the declarations ------------------------------------------------

/// Tokens as one line, the spaces `quote` puts between them dropped where
/// Rust writes none.
fn tokens(t: &impl ToTokens) -> String {
    let mut s = t.to_token_stream().to_string();
    for (from, to) in [
        (" :: ", "::"),
        (":: ", "::"),
        (" < ", "<"),
        ("< ", "<"),
        (" >", ">"),
        (" ,", ","),
        ("& '", "&'"),
        (" (", "("),
        ("( ", "("),
        (" )", ")"),
        ("[ ", "["),
        (" ]", "]"),
    ] {
        s = s.replace(from, to);
    }
    s
}

/// The `#[serde(…)]` attributes, in order, as they are written.
fn serde_attrs(attrs: &[syn::Attribute]) -> Vec<String> {
    attrs
        .iter()
        .filter(|a| a.path().is_ident("serde"))
        .map(|a| tokens(&a.meta))
        .collect()
}

/// Whether `#[derive(…)]` names `what`.
fn derives(attrs: &[syn::Attribute], what: &str) -> bool {
    attrs
        .iter()
        .filter(|a| a.path().is_ident("derive"))
        .any(|a| {
            let mut found = false;
            let _ = a.parse_nested_meta(|m| {
                found |= m.path.segments.last().is_some_and(|s| s.ident == what);
                Ok(())
            });
            found
        })
}

/// Whether one of the serde attributes holds the word `word` alone
/// (`deny_unknown_fields`, `default`, `other`, `skip`).
fn has_word(serde: &[String], word: &str) -> bool {
    serde.iter().any(|a| {
        a.trim_start_matches("serde(")
            .trim_end_matches(')')
            .split(',')
            .any(|p| {
                let p = p.trim();
                p == word || p.starts_with(&format!("{word} ="))
            })
    })
}

fn with_serde(mut value: String, serde: &[String]) -> String {
    for a in serde {
        value.push(' ');
        value.push_str(a);
    }
    value
}

/// Whether a reader may go without a field of type `ty` with `serde`
/// attributes (serde reads a missing `Option` as `None`).
fn optional(ty: &syn::Type, serde: &[String]) -> bool {
    let is_option = matches!(ty, syn::Type::Path(p)
        if p.path.segments.last().is_some_and(|s| s.ident == "Option"));
    is_option || has_word(serde, "default")
}

fn fields(lines: &mut Lines, owner: &str, fields: &syn::Fields) {
    for (i, f) in fields.iter().enumerate() {
        let serde = serde_attrs(&f.attrs);
        if has_word(&serde, "skip") {
            continue; // never on the wire
        }
        let name = f
            .ident
            .as_ref()
            .map_or_else(|| i.to_string(), ToString::to_string);
        let need = if optional(&f.ty, &serde) {
            "optional"
        } else {
            "required"
        };
        lines.insert(
            (Kind::Field, format!("{owner}.{name}")),
            with_serde(format!("{} {need}", tokens(&f.ty)), &serde),
        );
    }
}

fn items(lines: &mut Lines, module: &str, list: &[syn::Item]) {
    for item in list {
        match item {
            syn::Item::Struct(s) if matches!(s.vis, syn::Visibility::Public(_)) => {
                let name = format!("{module}::{}", s.ident);
                let serde = serde_attrs(&s.attrs);
                // A struct without Deserialize is parsed by hand, and
                // airlock's parsers refuse unknown fields.
                let strict =
                    has_word(&serde, "deny_unknown_fields") || !derives(&s.attrs, "Deserialize");
                let reads = if strict { "strict" } else { "lenient" };
                lines.insert(
                    (Kind::Type, name.clone()),
                    with_serde(format!("struct {reads}"), &serde),
                );
                fields(lines, &name, &s.fields);
            }
            syn::Item::Enum(e) if matches!(e.vis, syn::Visibility::Public(_)) => {
                let name = format!("{module}::{}", e.ident);
                let serde = serde_attrs(&e.attrs);
                let on_wire = derives(&e.attrs, "Serialize") || derives(&e.attrs, "Deserialize");
                let open = e
                    .variants
                    .iter()
                    .any(|v| has_word(&serde_attrs(&v.attrs), "other"));
                let reads = match (on_wire, open) {
                    (false, _) => "internal",
                    (true, true) => "open",
                    (true, false) => "strict",
                };
                lines.insert(
                    (Kind::Type, name.clone()),
                    with_serde(format!("enum {reads}"), &serde),
                );
                for v in &e.variants {
                    let vname = format!("{name}.{}", v.ident);
                    let payload = match &v.fields {
                        syn::Fields::Unit => "unit",
                        syn::Fields::Named(_) => "fields",
                        syn::Fields::Unnamed(_) => "tuple",
                    };
                    lines.insert(
                        (Kind::Variant, vname.clone()),
                        with_serde(payload.to_owned(), &serde_attrs(&v.attrs)),
                    );
                    fields(lines, &vname, &v.fields);
                }
            }
            syn::Item::Const(c)
                if matches!(c.vis, syn::Visibility::Public(_))
                    && c.ident.to_string().contains("SCHEMA") =>
            {
                lines.insert(
                    (Kind::Schema, format!("{module}::{}", c.ident)),
                    tokens(&c.expr),
                );
            }
            syn::Item::Mod(m) if matches!(m.vis, syn::Visibility::Public(_)) => {
                if let Some((_, inner)) = &m.content {
                    items(lines, &format!("{module}::{}", m.ident), inner);
                }
            }
            _ => {}
        }
    }
}

/// The lines of one module's source (`module`: `task`, `egress::preamble`).
fn declared(module: &str, source: &str) -> Lines {
    let file = syn::parse_file(source).unwrap_or_else(|e| panic!("{module}: {e}"));
    let mut lines = Lines::new();
    items(&mut lines, module, &file.items);
    lines
}

/// The protocol as this build declares it.
fn current() -> Lines {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut lines = Lines::new();
    for m in MESSAGE_MODULES {
        let text = std::fs::read_to_string(src.join(m)).unwrap();
        let module = m.trim_end_matches(".rs").replace('/', "::");
        lines.extend(declared(&module, &text));
    }
    for m in airlock_proto::bus::every_row() {
        lines.insert(
            (Kind::Method, m.path()),
            format!(
                "({}) -> ({}) {:?} event {} reply {}",
                m.input,
                m.output,
                m.permission,
                m.event.unwrap_or("-"),
                // A type by name, however the macro spaced it.
                m.reply.split_whitespace().collect::<String>()
            ),
        );
    }
    for r in airlock_proto::bus::tasks_v1::RETIRED {
        lines.insert(
            (
                Kind::Retired,
                format!(
                    "{}.{}({})",
                    airlock_proto::bus::tasks_v1::INTERFACE,
                    r.name,
                    r.input
                ),
            ),
            format!("instead {} ({})", r.instead.path(), r.instead.input),
        );
    }
    for (op, state, outcome) in TABLE {
        let value = match outcome {
            Outcome::To(states, _) => format!("to {states:?}"),
            Outcome::Refused(code, _) => format!("refused {}", code.as_str()),
            Outcome::NotClaimed => "not-claimed".to_owned(),
        };
        let key = (Kind::Table, format!("{op:?}.{state:?}"));
        assert!(lines.insert(key, value).is_none(), "{op:?} {state:?} twice");
    }
    for t in TRANSITIONS {
        let key = (
            Kind::Step,
            format!("{:?}.{:?}.{:?}", t.from, t.step, t.attempts),
        );
        assert!(lines.insert(key, format!("to {:?}", t.to)).is_none());
    }
    lines
}

// ---- classifying a change ----------------------------------------------------

/// How an older peer meets a change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Class {
    Additive,
    Breaking,
}

/// One difference between the lock and the declarations.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Change {
    class: Class,
    /// The line's name.
    item: String,
    /// What changed, and why it is judged so.
    why: String,
}

/// The type a field or variant line belongs to (`task::TaskResult` of
/// `task::TaskResult.isolation`; `envelope::Change.WriteFile` of one of
/// that variant's fields).
fn owner(name: &str) -> &str {
    name.rsplit_once('.').map_or(name, |(o, _)| o)
}

/// How a locked type reads input: `strict`, `lenient`, `open`, `internal`.
fn reads(locked: &Lines, ty: &str) -> Option<String> {
    let value = locked.get(&(Kind::Type, ty.to_owned()))?;
    value.split(' ').nth(1).map(str::to_owned)
}

/// A type line's value as (`struct|enum`, how it reads, its serde
/// attributes without `deny_unknown_fields`, which "how it reads" says).
fn type_parts(value: &str) -> (&str, &str, String) {
    let (kind, rest) = value.split_once(' ').unwrap_or((value, ""));
    let (reads, attrs) = rest.split_once(' ').unwrap_or((rest, ""));
    let attrs = attrs
        .replace("deny_unknown_fields, ", "")
        .replace(", deny_unknown_fields", "")
        .replace("serde(deny_unknown_fields)", "")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    (kind, reads, attrs)
}

/// The locked type (struct or enum) a field or variant line belongs to:
/// a field of a variant belongs to the variant's enum.
fn owning_type<'a>(locked: &Lines, name: &'a str) -> &'a str {
    let o = owner(name);
    if locked.contains_key(&(Kind::Variant, o.to_owned())) {
        owner(o)
    } else {
        o
    }
}

fn classify(locked: &Lines, now: &Lines) -> Vec<Change> {
    let mut out = Vec::new();
    let mut push = |class, item: &str, why: String| {
        out.push(Change {
            class,
            item: item.to_owned(),
            why,
        })
    };
    let parent_gone = |kind: Kind, name: &str, lines: &Lines| match kind {
        Kind::Field | Kind::Variant => {
            !lines.contains_key(&(Kind::Type, owner(name).to_owned()))
                && !lines.contains_key(&(Kind::Variant, owner(name).to_owned()))
        }
        _ => false,
    };
    for ((kind, name), old) in locked {
        match now.get(&(*kind, name.clone())) {
            None if parent_gone(*kind, name, now) => {} // said with its type
            None => push(
                Class::Breaking,
                name,
                format!(
                    "{} {name} is gone: an older peer that sends, reads or calls it is refused",
                    kind.word()
                ),
            ),
            Some(new) if new == old => {}
            Some(new) => {
                let loosened = *kind == Kind::Type && {
                    let (o, n) = (type_parts(old), type_parts(new));
                    o.0 == n.0 && o.2 == n.2 && matches!((o.1, n.1), ("strict", "lenient" | "open"))
                };
                if loosened {
                    push(
                        Class::Additive,
                        name,
                        format!("{name} accepts more than it did ({old} → {new})"),
                    );
                } else {
                    push(
                        Class::Breaking,
                        name,
                        format!(
                            "{} {name} changed from `{old}` to `{new}`: an older peer reads or sends the old form",
                            kind.word()
                        ),
                    );
                }
            }
        }
    }
    for ((kind, name), new) in now {
        if locked.contains_key(&(*kind, name.clone())) || parent_gone(*kind, name, locked) {
            continue; // compared above, or said with its new type
        }
        match kind {
            Kind::Field => {
                let ty = owning_type(locked, name);
                let in_new_variant = locked
                    .get(&(Kind::Variant, owner(name).to_owned()))
                    .is_none()
                    && now.contains_key(&(Kind::Variant, owner(name).to_owned()));
                if in_new_variant {
                    continue; // said with its variant
                }
                match reads(locked, ty).as_deref() {
                    Some("internal") => push(
                        Class::Additive,
                        name,
                        format!(
                            "{name} is a new field of {ty}, which never crosses a boundary by itself"
                        ),
                    ),
                    Some("lenient") if new.contains(" optional") => push(
                        Class::Additive,
                        name,
                        format!(
                            "{name} is a new optional field of {ty}, which ignores unknown fields"
                        ),
                    ),
                    Some("lenient") => push(
                        Class::Breaking,
                        name,
                        format!("{name} is a new required field: an older peer's messages lack it"),
                    ),
                    _ => push(
                        Class::Breaking,
                        name,
                        format!(
                            "{name} is a new field of {ty}, which refuses unknown fields: an older peer refuses every message that carries it"
                        ),
                    ),
                }
            }
            Kind::Variant => {
                let ty = owner(name);
                let catch_all = new.contains("serde(other)");
                match reads(locked, ty).as_deref() {
                    _ if catch_all => push(
                        Class::Additive,
                        name,
                        format!("{name} is a catch-all of {ty}: read, never sent"),
                    ),
                    Some("open" | "internal") => push(
                        Class::Additive,
                        name,
                        format!(
                            "{name} is a new value of {ty}, which an older peer reads as unknown or never sees"
                        ),
                    ),
                    _ => push(
                        Class::Breaking,
                        name,
                        format!("{name} is a new value of {ty}: an older peer cannot read it"),
                    ),
                }
            }
            _ => push(
                Class::Additive,
                name,
                format!("{} {name} is new: an older peer never uses it", kind.word()),
            ),
        }
    }
    out
}

// ---- judging the bump ----------------------------------------------------------

fn next_minor(v: (u32, u32)) -> (u32, u32) {
    (v.0, v.1 + 1)
}

fn next_major(v: (u32, u32)) -> (u32, u32) {
    (v.0 + 1, 0)
}

fn list(changes: &[&Change]) -> String {
    changes.iter().map(|c| format!("\n  - {}", c.why)).collect()
}

/// Whether `now` is the version a release of `changes` over the `locked`
/// one must carry; `Err` says why not and what to do.
fn judge(
    locked: (u32, u32),
    now: (u32, u32),
    changes: &[Change],
    facts: &[Fact],
) -> Result<(), String> {
    let (l, n) = (protocol_string(locked), protocol_string(now));
    if now < locked {
        return Err(format!(
            "PROTOCOL_VERSION is {n}, older than the released {l} that crates/proto/protocol.lock records: a version never moves backwards (a peer of {l} would take {n} for an older release). Go on from {l}."
        ));
    }
    let pending = |v: (u32, u32)| now > locked && v == now;
    let changes: Vec<Change> = changes
        .iter()
        .map(|c| {
            let unseen = facts.iter().find_map(|f| match f {
                Fact::Unseen { version, item, why } if pending(*version) && *item == c.item => {
                    Some(*why)
                }
                _ => None,
            });
            match unseen {
                Some(why) if c.class == Class::Breaking => Change {
                    class: Class::Additive,
                    why: format!("{} (declared unseen by older peers: {why})", c.why),
                    ..c.clone()
                },
                _ => c.clone(),
            }
        })
        .collect();
    let mut declared: Vec<Change> = Vec::new();
    for f in facts {
        match *f {
            Fact::Breaks { version, why } if pending(version) => declared.push(Change {
                class: Class::Breaking,
                item: "(declared)".into(),
                why: format!("declared breaking: {why}"),
            }),
            Fact::Adds { version, why } if pending(version) => declared.push(Change {
                class: Class::Additive,
                item: "(declared)".into(),
                why: format!("declared additive: {why}"),
            }),
            _ => {}
        }
    }
    let all: Vec<&Change> = changes.iter().chain(&declared).collect();
    let breaking: Vec<&Change> = all
        .iter()
        .copied()
        .filter(|c| c.class == Class::Breaking)
        .collect();
    let class = all.iter().map(|c| c.class).max();
    match class {
        None if now == locked => Ok(()),
        None => Err(format!(
            "PROTOCOL_VERSION moved from {l} to {n} but nothing a peer sees changed: keep {l}, or declare in FACTS (crates/proto/tests/protocol.rs) the rule, default or code that changed"
        )),
        Some(_) if now == locked => Err(format!(
            "the protocol changed but PROTOCOL_VERSION is still {l}: make it {} ({}) and record it with\n\n    UPDATE_PROTOCOL_LOCK=1 cargo test -p airlock-proto --test protocol\n\nThe changes:{}",
            protocol_string(if breaking.is_empty() {
                next_minor(locked)
            } else {
                next_major(locked)
            }),
            if breaking.is_empty() {
                "additive"
            } else {
                "breaking"
            },
            list(&all)
        )),
        Some(Class::Breaking) if now == next_major(locked) => Ok(()),
        Some(Class::Breaking) if now == next_minor(locked) => Err(format!(
            "a breaking change shipped as a minor ({l} → {n}): a client of {l} would meet what it cannot read. Make it {}. What breaks:{}",
            protocol_string(next_major(locked)),
            list(&breaking)
        )),
        Some(Class::Additive) if now == next_minor(locked) => Ok(()),
        Some(Class::Additive) if now == next_major(locked) => Err(format!(
            "an additive change shipped as a major ({l} → {n}): every peer of {l} would be refused for an addition it may ignore. Make it {}, or declare in FACTS the rule or default that breaks. The changes:{}",
            protocol_string(next_minor(locked)),
            list(&all)
        )),
        Some(c) => Err(format!(
            "{l} → {n} skips versions: the {} change makes it {}",
            if c == Class::Breaking {
                "breaking"
            } else {
                "additive"
            },
            protocol_string(if c == Class::Breaking {
                next_major(locked)
            } else {
                next_minor(locked)
            })
        )),
    }
}

fn lock_path() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("protocol.lock")
}

#[test]
fn a_protocol_change_needs_the_bump_its_class_asks_for() {
    let text = std::fs::read_to_string(lock_path()).unwrap_or_default();
    let locked = parse_lock(&text).unwrap_or_else(|e| {
        panic!("crates/proto/protocol.lock: {e}; it is written by UPDATE_PROTOCOL_LOCK=1 cargo test -p airlock-proto --test protocol")
    });
    let now = Lock {
        version: PROTOCOL_VERSION,
        lines: current(),
    };
    let changes = classify(&locked.lines, &now.lines);
    if let Err(e) = judge(locked.version, now.version, &changes, FACTS) {
        panic!("{e}");
    }
    let wanted = render(&now);
    if std::env::var_os("UPDATE_PROTOCOL_LOCK").is_some_and(|v| v == "1") {
        std::fs::write(lock_path(), &wanted).unwrap();
        return;
    }
    assert!(
        text == wanted,
        "crates/proto/protocol.lock does not record the protocol {} declares{}: record it with\n\n    UPDATE_PROTOCOL_LOCK=1 cargo test -p airlock-proto --test protocol\n",
        protocol_string(now.version),
        list(&changes.iter().collect::<Vec<_>>())
    );
}

#[test]
fn the_lock_round_trips_and_sees_every_message_module() {
    let now = Lock {
        version: PROTOCOL_VERSION,
        lines: current(),
    };
    assert_eq!(parse_lock(&render(&now)).unwrap(), now);
    for m in MESSAGE_MODULES {
        let module = m.trim_end_matches(".rs").replace('/', "::");
        assert!(
            now.lines
                .keys()
                .any(|(k, name)| *k == Kind::Type && name.starts_with(&format!("{module}::"))),
            "{m} declares no message type"
        );
    }
    for kind in Kind::ALL {
        assert!(
            now.lines.keys().any(|(k, _)| *k == kind),
            "no {} line",
            kind.word()
        );
    }
}

// ---- the classifier and the judge, on made-up declarations ------------------------

/// The lines of a made-up module `m`.
fn lines_of(source: &str) -> Lines {
    declared("m", source)
}

fn one(old: &str, new: &str) -> Vec<(Class, String)> {
    classify(&lines_of(old), &lines_of(new))
        .into_iter()
        .map(|c| (c.class, c.item))
        .collect()
}

const STRICT: &str = "#[derive(Serialize, Deserialize)]\n#[serde(deny_unknown_fields)]\npub struct M {\n    /// a\n    pub a: u32,\n}\n";
const LENIENT: &str = "#[derive(Serialize, Deserialize)]\npub struct M {\n    pub a: u32,\n}\n";

#[test]
fn doc_comments_and_order_are_not_changes() {
    let reworded = STRICT.replace("/// a", "/// another word");
    assert!(one(STRICT, &reworded).is_empty());
    let two = "#[derive(Serialize, Deserialize)]\npub struct M {\n    pub a: u32,\n    pub b: Option<u32>,\n}\n";
    let swapped = "#[derive(Serialize, Deserialize)]\npub struct M {\n    pub b: Option<u32>,\n    pub a: u32,\n}\n";
    assert!(one(two, swapped).is_empty());
}

#[test]
fn a_field_is_judged_as_an_older_peer_meets_it() {
    let add =
        |s: &str, field: &str| s.replace("    pub a: u32,\n", &format!("    pub a: u32,\n{field}"));
    let m_b = || "m::M.b".to_owned();
    // An optional field a lenient reader ignores: additive.
    let opt = "    #[serde(default, skip_serializing_if = \"Option::is_none\")]\n    pub b: Option<u32>,\n";
    assert_eq!(one(LENIENT, &add(LENIENT, opt)), [(Class::Additive, m_b())]);
    assert_eq!(
        one(
            LENIENT,
            &add(LENIENT, "    #[serde(default)]\n    pub b: u32,\n")
        ),
        [(Class::Additive, m_b())]
    );
    // The same field where unknown fields are refused: breaking (an older
    // peer refuses every message carrying it, skipped when empty or not).
    assert_eq!(one(STRICT, &add(STRICT, opt)), [(Class::Breaking, m_b())]);
    // A required field: breaking anywhere.
    assert_eq!(
        one(LENIENT, &add(LENIENT, "    pub b: u32,\n")),
        [(Class::Breaking, m_b())]
    );
    // A struct parsed by hand (no Deserialize) refuses unknown fields.
    let by_hand = "pub struct M {\n    pub a: u32,\n}\n";
    assert_eq!(one(by_hand, &add(by_hand, opt)), [(Class::Breaking, m_b())]);
    // Removed, retyped, renamed, made required: breaking.
    let m_a = || "m::M.a".to_owned();
    assert_eq!(
        one(STRICT, &STRICT.replace("    /// a\n    pub a: u32,\n", "")),
        [(Class::Breaking, m_a())]
    );
    assert_eq!(
        one(STRICT, &STRICT.replace("a: u32", "a: u64")),
        [(Class::Breaking, m_a())]
    );
    assert_eq!(
        one(
            STRICT,
            &STRICT.replace("    pub a", "    #[serde(rename = \"b\")]\n    pub a")
        ),
        [(Class::Breaking, m_a())]
    );
    assert_eq!(
        one(&add(LENIENT, opt), &add(LENIENT, "    pub b: u32,\n")),
        [(Class::Breaking, m_b())]
    );
    // Refusing unknown fields is a tightening; no longer refusing them a loosening.
    assert_eq!(one(LENIENT, STRICT), [(Class::Breaking, "m::M".to_owned())]);
    assert_eq!(one(STRICT, LENIENT), [(Class::Additive, "m::M".to_owned())]);
}

#[test]
fn types_variants_tags_and_rows_are_judged_too() {
    // A new type, and a new schema tag: additive; a tag changed: breaking.
    let tag = "pub const M_SCHEMA: &str = \"airlock.m.v1\";\n";
    assert_eq!(
        one("", &format!("{STRICT}{tag}")),
        [
            (Class::Additive, "m::M".to_owned()),
            (Class::Additive, "m::M_SCHEMA".to_owned())
        ]
    );
    assert_eq!(
        one(tag, &tag.replace("v1", "v2")),
        [(Class::Breaking, "m::M_SCHEMA".to_owned())]
    );
    assert_eq!(one(STRICT, ""), [(Class::Breaking, "m::M".to_owned())]);
    // A value of an enum on the wire: breaking, unless the enum has a
    // catch-all or never crosses alone.
    let wire = "#[derive(Serialize, Deserialize)]\npub enum E {\n    A,\n}\n";
    let more = wire.replace("    A,\n", "    A,\n    B { x: u32 },\n");
    assert_eq!(one(wire, &more), [(Class::Breaking, "m::E.B".to_owned())]);
    let open = wire.replace("    A,\n", "    A,\n    #[serde(other)]\n    Unknown,\n");
    assert_eq!(
        one(wire, &open),
        [
            (Class::Additive, "m::E".to_owned()),
            (Class::Additive, "m::E.Unknown".to_owned())
        ]
    );
    assert_eq!(
        one(&open, &open.replace("    A,\n", "    A,\n    B,\n")),
        [(Class::Additive, "m::E.B".to_owned())]
    );
    let internal = "pub enum E {\n    A,\n}\n";
    assert_eq!(
        one(internal, &internal.replace("    A,\n", "    A,\n    B,\n")),
        [(Class::Additive, "m::E.B".to_owned())]
    );
    assert_eq!(one(&more, wire), [(Class::Breaking, "m::E.B".to_owned())]);
    // Fields of a variant belong to the enum: a new one is breaking.
    assert_eq!(
        one(&more, &more.replace("x: u32", "x: u32, y: Option<u32>")),
        [(Class::Breaking, "m::E.B.y".to_owned())]
    );
    // Rows: a new method is additive; one gone or changed is breaking.
    let row = |v: &str| -> Lines {
        [(
            (Kind::Method, "org.airlock.Tasks2.GetTask".to_owned()),
            v.to_owned(),
        )]
        .into()
    };
    let rows = row("(s) -> (s) Polkit(\"read\") event TASK_READ reply TaskView");
    assert_eq!(classify(&Lines::new(), &rows)[0].class, Class::Additive);
    assert_eq!(classify(&rows, &Lines::new())[0].class, Class::Breaking);
    let tighter = row("(s) -> (s) Polkit(\"manage\") event TASK_READ reply TaskView");
    assert_eq!(classify(&rows, &tighter)[0].class, Class::Breaking);
}

#[test]
fn the_bump_must_match_the_change_in_both_directions() {
    let change = |class| Change {
        class,
        item: "m::M.b".into(),
        why: "m::M.b".into(),
    };
    let add = [change(Class::Additive)];
    let brk = [change(Class::Breaking), change(Class::Additive)];
    let v = (11, 3);
    // Nothing changed: no bump; a bump for nothing is refused.
    assert_eq!(judge(v, v, &[], &[]), Ok(()));
    assert!(
        judge(v, (11, 4), &[], &[])
            .unwrap_err()
            .contains("nothing a peer sees changed")
    );
    // Backwards is refused, whatever changed.
    for changes in [&[][..], &add, &brk] {
        assert!(
            judge(v, (11, 2), changes, &[])
                .unwrap_err()
                .contains("never moves backwards")
        );
        assert!(
            judge(v, (10, 9), changes, &[])
                .unwrap_err()
                .contains("never moves backwards")
        );
    }
    // A change needs a bump.
    assert!(
        judge(v, v, &add, &[])
            .unwrap_err()
            .contains("make it 11.4 (additive)")
    );
    assert!(
        judge(v, v, &brk, &[])
            .unwrap_err()
            .contains("make it 12.0 (breaking)")
    );
    // Additive: the next minor, and never a major.
    assert_eq!(judge(v, (11, 4), &add, &[]), Ok(()));
    assert!(
        judge(v, (12, 0), &add, &[])
            .unwrap_err()
            .contains("an additive change shipped as a major")
    );
    // Breaking: the next major, and never a minor.
    assert_eq!(judge(v, (12, 0), &brk, &[]), Ok(()));
    assert!(
        judge(v, (11, 4), &brk, &[])
            .unwrap_err()
            .contains("a breaking change shipped as a minor")
    );
    // One step at a time.
    assert!(
        judge(v, (11, 5), &add, &[])
            .unwrap_err()
            .contains("skips versions")
    );
    assert!(
        judge(v, (13, 0), &brk, &[])
            .unwrap_err()
            .contains("skips versions")
    );
    assert!(
        judge(v, (12, 1), &brk, &[])
            .unwrap_err()
            .contains("skips versions")
    );
    // Facts of the pending release: a declared break makes an additive
    // shape a major; a declared addition allows a minor with no shape
    // change; an unseen item downgrades its breaking shape. Facts of
    // another release count for nothing.
    let breaks = [Fact::Breaks {
        version: (12, 0),
        why: "a default tightened",
    }];
    assert_eq!(judge(v, (12, 0), &add, &breaks), Ok(()));
    assert_eq!(judge(v, (12, 0), &[], &breaks), Ok(()));
    let breaks_now = [Fact::Breaks {
        version: (11, 4),
        why: "a default tightened",
    }];
    assert!(
        judge(v, (11, 4), &add, &breaks_now)
            .unwrap_err()
            .contains("a breaking change shipped as a minor")
    );
    let adds = [Fact::Adds {
        version: (11, 4),
        why: "a new refusal code",
    }];
    assert_eq!(judge(v, (11, 4), &[], &adds), Ok(()));
    let unseen = [Fact::Unseen {
        version: (11, 4),
        item: "m::M.b",
        why: "only a newer client sends it",
    }];
    assert_eq!(
        judge(v, (11, 4), &[change(Class::Breaking)], &unseen),
        Ok(())
    );
    let old_fact = [Fact::Breaks {
        version: v,
        why: "history",
    }];
    assert_eq!(judge(v, v, &[], &old_fact), Ok(()));
    assert!(judge(v, (12, 0), &[], &old_fact).is_err());
}

#[test]
fn an_optional_field_where_unknown_fields_are_refused_needs_a_major() {
    // A reply gains an optional field, skipped when empty: a client of
    // 11.3 parses replies with deny_unknown_fields and refuses every one
    // that carries it, so 11.4 is refused (and backwards too); the update
    // judges before it writes, so such a lock is never recorded.
    let locked = Lock {
        version: (11, 3),
        lines: lines_of(STRICT),
    };
    let now = lines_of(&STRICT.replace(
        "    pub a: u32,\n",
        "    pub a: u32,\n    pub b: Option<u32>,\n",
    ));
    let changes = classify(&locked.lines, &now);
    assert!(judge(locked.version, (11, 4), &changes, &[]).is_err());
    assert!(judge(locked.version, (11, 2), &changes, &[]).is_err());
    assert_eq!(judge(locked.version, (12, 0), &changes, &[]), Ok(()));
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

const SIG_LOCK_HEADER: &str =
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

fn render_sigs(sigs: &[Sig]) -> String {
    let mut lines: Vec<String> = sigs
        .iter()
        .map(|(i, m, a, r)| format!("{i} {m} {a} {r}\n"))
        .collect();
    lines.sort();
    format!("{SIG_LOCK_HEADER}{}", lines.concat())
}

fn parse_sigs(lock: &str) -> Vec<Sig> {
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
    let broken = incompatible(&parse_sigs(&actual), &current);
    assert!(
        broken.is_empty(),
        "incompatible bus changes (crates/proto/bus.lock is not rewritten for these):\n- {}",
        broken.join("\n- ")
    );
    let wanted = render_sigs(&current);
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
    assert_eq!(parse_sigs(&render_sigs(&locked)).len(), 2);
}

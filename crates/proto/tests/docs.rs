//! docs/errors.md is generated from `airlock_proto::Code::ALL`; this test
//! fails when the file differs from the catalogue, and rewrites it when
//! `UPDATE_DOCS=1` is set.

use std::fmt::Write as _;
use std::path::Path;

use airlock_proto::{Class, Code};

const DOC: &str = "docs/errors.md";

/// Markdown-safe table cell: `|` would end the cell, `<…>` would be read as HTML.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn render() -> String {
    let mut out = String::new();
    out.push_str(
        "<!-- Generated from crates/proto/src/error.rs by crates/proto/tests/docs.rs.\n     Do not edit by hand: change the catalogue, then run\n     UPDATE_DOCS=1 cargo test -p airlock-proto --test docs -->\n\n",
    );
    out.push_str("# Error catalogue\n\n");
    out.push_str(
        "Every refusal in airlock carries one of these stable codes. Each code has one \
         meaning everywhere, and is mapped once (in `crates/proto/src/error.rs`) to an \
         HTTP status, a D-Bus error name and an `airlockctl` exit code. The status and \
         exit code follow from the code's class:\n\n",
    );
    out.push_str("| class | HTTP status | exit code | retryable |\n|---|---|---|---|\n");
    let mut classes: Vec<Class> = Vec::new();
    for code in Code::ALL {
        if !classes.contains(&code.class()) {
            classes.push(code.class());
        }
    }
    classes.sort_by_key(|c| c.exit_code());
    for class in classes {
        let retryable = Code::ALL
            .iter()
            .find(|c| c.class() == class)
            .is_some_and(|c| c.retryable());
        let _ = writeln!(
            out,
            "| {class:?} | {} | {} | {} |",
            class.http_status(),
            class.exit_code(),
            if retryable { "yes" } else { "no" }
        );
    }
    out.push_str(
        "\nExit code 1 is a generic failure and 2 a usage error; codes start at 3. \
         A retryable code (`Code::retryable`) means the same request may succeed later \
         unchanged, once its condition clears (a dependency is back, an operator cleared \
         an agent's hold); any other refusal stays until the request changes.\n\n\
         Two columns say what the worker does when it meets a code while it drives an \
         attempt. **transient** (`Code::transient`, the retryable codes): it tries the \
         step again in place while its lease holds. **fails the attempt** \
         (`Code::fails_attempt`): it ends the attempt with a failed result carrying the \
         code, which `airlockctl show` displays. A code that is neither says the worker \
         no longer owns the attempt (its lease, the task's state, its journal's scope): \
         it records `reconciliation_required` and reports nothing.\n\n\
         ## Codes\n\n\
         | code | meaning | HTTP status | D-Bus error name | exit code | transient | fails the attempt |\n\
         |---|---|---|---|---|---|---|\n",
    );
    let yes = |b: bool| if b { "yes" } else { "no" };
    for code in Code::ALL {
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | `{}` | {} | {} | {} |",
            code.as_str(),
            cell(code.meaning()),
            code.http_status(),
            code.dbus_error_name(),
            code.exit_code(),
            yes(code.transient()),
            yes(code.fails_attempt())
        );
    }
    out
}

#[test]
fn error_catalogue_document_is_current() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(DOC);
    let wanted = render();
    if std::env::var_os("UPDATE_DOCS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &wanted).expect("write docs/errors.md");
        return;
    }
    let actual = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        actual == wanted,
        "{DOC} is out of date with crates/proto/src/error.rs.\n\
         Regenerate it with:\n\n    UPDATE_DOCS=1 cargo test -p airlock-proto --test docs\n"
    );
}

#[test]
fn every_code_has_a_row() {
    let doc = render();
    for code in Code::ALL {
        assert!(
            doc.contains(&format!("| `{}` |", code.as_str())),
            "{code} missing"
        );
    }
}

const STATES_DOC: &str = "docs/states.md";

fn render_states() -> String {
    use airlock_proto::states::{Op, Outcome, outcome};
    use airlock_proto::task::TaskState;
    let mut out = String::new();
    out.push_str(
        "<!-- Generated from crates/proto/src/states.rs by crates/proto/tests/docs.rs.\n     Do not edit by hand: change the table, then run\n     UPDATE_DOCS=1 cargo test -p airlock-proto --test docs -->\n\n",
    );
    out.push_str("# Task states\n\n");
    out.push_str(
        "What each operation does to a task in each state: the states it may move the \
         task to, or the one code it is refused with (nothing changes then). The task \
         database checks these preconditions through `airlock_proto::states::check`, and \
         `services/supervisor/tests/contract.rs` calls every method in every state over \
         the bus and compares the outcome with this table.\n\n\
         `QUEUED → RUNNING (claimed, leased) → VERIFYING → SUCCEEDED`, or `FAILED`, or \
         `CANCELLED`; a failed attempt or a rework goes back to `QUEUED` while attempts \
         remain. An expired lease is swept back to `QUEUED` (or `FAILED` when no attempt \
         is left) with `LEASE_EXPIRED`. A `QUEUED` task whose repository is no longer \
         registered (removed, then `systemctl reload`, or a restart) goes to `FAILED` with \
         `REPOSITORY_NOT_REGISTERED` (event `TASK_REPOSITORY_UNREGISTERED`); it never vanishes.\n\n",
    );
    out.push_str("| operation |");
    for s in TaskState::ALL {
        let _ = write!(out, " {} |", s.as_str());
    }
    out.push_str("\n|---|");
    for _ in TaskState::ALL {
        out.push_str("---|");
    }
    out.push('\n');
    for op in Op::ALL {
        let _ = write!(out, "| `{}` |", op.method());
        for s in TaskState::ALL {
            let text = match outcome(*op, *s) {
                Outcome::To(states, why) => {
                    let to: Vec<&str> = states.iter().map(|t| t.as_str()).collect();
                    if why.is_empty() {
                        format!("→ {}", to.join(" or "))
                    } else {
                        format!("→ {} ({})", to.join(" or "), cell(why))
                    }
                }
                Outcome::Refused(code, why) => format!("`{}` ({})", code.as_str(), cell(why)),
                Outcome::NotClaimed => "never claimed".to_owned(),
            };
            let _ = write!(out, " {text} |");
        }
        out.push('\n');
    }
    out.push_str(
        "\n## Transitions\n\n\
         Every move the task store makes, from `airlock_proto::states::TRANSITIONS`. One \
         function of the task database (`tasks::moves`, through \
         `airlock_proto::states::next`) picks the row and sets the state; the engines only \
         find the rows and persist what it decided. A step with no row here is refused with \
         `TASK_STATE_INVALID`, and `services/supervisor/tests/contract.rs` checks that every \
         move it sees the store make is a row. A submitted task starts `",
    );
    out.push_str(airlock_proto::states::SUBMITTED.as_str());
    out.push_str(
        "` (attempt 0).\n\n\
         | from | step | attempts | to | also |\n|---|---|---|---|---|\n",
    );
    for t in airlock_proto::states::TRANSITIONS {
        let step = match t.step.op() {
            Some(op) => format!("{} (`{}`)", t.step.name(), op.method()),
            None => t.step.name().to_owned(),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            t.from.as_str(),
            cell(&step),
            t.attempts.name(),
            t.to.as_str(),
            cell(t.why)
        );
    }
    out.push_str(
        "\n## The worker's checkpoint phases\n\n\
         While a task is `RUNNING` the worker records each step of its attempt in its \
         checkpoint journal before acting on it, phases monotonic by rank within an attempt \
         (`source_capture_done` and `commit_done` share a rank: an attempt reaches one of them; \
         `reconciliation_required` may be recorded at any point). Each phase has one payload \
         type in `crates/proto/src/checkpoint.rs`, written and read only through it: every \
         field is required, unknown fields are refused, and a payload that does not decode \
         is `STORE_CORRUPT` (the attempt ends with that code). A `source_capture_done` is \
         reused by a later attempt of the same task only when the execution digest and every \
         coordinate but the attempt are identical.\n\n\
         | phase | rank | payload | meaning |\n|---|---|---|---|\n",
    );
    for p in airlock_proto::checkpoint::Phase::ALL {
        let fields: Vec<String> = p
            .payload_fields()
            .iter()
            .map(|f| format!("`{f}`"))
            .collect();
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} |",
            p.as_str(),
            p.order(),
            fields.join(", "),
            cell(p.meaning())
        );
    }
    out.push_str(
        "\n## Reconciliation cases\n\n\
         An attempt whose branch moved behind the worker's back (resumed at `commit_done` with \
         the branch elsewhere, or resumed after a crash with the compare-and-swap finding it \
         elsewhere) is reported failed with `RECONCILIATION_REQUIRED` and what the worker saw; \
         the task ends `FAILED` and a case opens. An administrator resolves it once \
         (`airlockctl reconcile resolve`, compare-and-swap on the case as shown). The supervisor \
         holds no git access, so `adopt` is settled by the worker, which reads the ref: the \
         one way a `FAILED` task becomes `SUCCEEDED`. Adoption never moves a ref.\n\n",
    );
    out.push_str("| operation | case | outcome |\n|---|---|---|\n");
    for (op, from, outcome) in airlock_proto::reconcile::CASE_TABLE {
        let _ = writeln!(out, "| `{op}` | {} | {} |", cell(from), cell(outcome));
    }
    out
}

#[test]
fn state_table_document_is_current() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(STATES_DOC);
    let wanted = render_states();
    if std::env::var_os("UPDATE_DOCS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &wanted).expect("write docs/states.md");
        return;
    }
    let actual = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        actual == wanted,
        "{STATES_DOC} is out of date with crates/proto/src/states.rs.\n\
         Regenerate it with:\n\n    UPDATE_DOCS=1 cargo test -p airlock-proto --test docs\n"
    );
}

// ---- the lists of bus methods ---------------------------------------------
//
// Every list of the bus's methods in the documents is rendered here from
// the rows of `crates/proto/src/bus.rs` (`airlock_proto::rows!`), between
// two markers: `dbus/README.md`, `docs/privsep/messages.md` and the crate
// doc of `crates/proto/src/lib.rs`. A copy that differs fails the test;
// `UPDATE_DOCS=1` rewrites it.

use airlock_proto::bus::{Call, Method, Peer, Permission, action, tasks_v1};

/// One interface of the table, as the documents show it.
struct Interface {
    /// `org.airlock.Tasks2`.
    name: &'static str,
    /// Its module in `airlock_proto::bus` (`tasks`).
    module: &'static str,
    /// Its rows, in declaration order.
    rows: Vec<Row>,
}

/// One row of the table.
struct Row {
    method: Method,
    /// Its name constant (`GET_TASK`).
    konst: &'static str,
    /// Its doc comment, on one line.
    doc: String,
}

/// The table, from `airlock_proto::rows!`.
macro_rules! collect {
    ($(
        $(#[doc = $idoc:literal])+
        mod $module:ident = $iface:literal {
            also { $($also:item)* }
            $(
                $(#[doc = $doc:literal])+
                $konst:ident = $name:ident ( $input:literal ) -> $output:literal $reply:ty,
                    $pkind:ident $pwhich:ident $(, audited $event:ident)?
                    $(, client $fn:ident ( $($arg:ident : $aty:ty),* ) = $wire:expr)?;
            )+
        }
    )+) => {
        vec![$(
            Interface {
                name: $iface,
                module: stringify!($module),
                rows: vec![$(
                    Row {
                        method: <airlock_proto::bus::$module::$name as Call>::METHOD,
                        konst: stringify!($konst),
                        doc: one_line(&[$($doc),+]),
                    }
                ),+],
            }
        ),+]
    };
}

fn table() -> Vec<Interface> {
    airlock_proto::rows!(collect)
}

/// Doc comment lines as one line of Markdown: rustdoc's links
/// (`` [`LeaseRef`] ``) as plain code.
fn one_line(lines: &[&str]) -> String {
    let text = lines.iter().map(|l| l.trim()).collect::<Vec<_>>().join(" ");
    text.replace("[`", "`").replace("`]", "`")
}

/// Who may call a row, as the documents say it.
fn caller(p: Permission) -> String {
    match p {
        Permission::Polkit(a) => {
            let who = match a {
                action::TASKS_READ => "admin, planner",
                action::TASKS_SUBMIT => "planner, admin",
                action::TASKS_MANAGE
                | action::AGENTS_READ
                | action::AGENTS_MANAGE
                | action::RECONCILE_MANAGE => "admin",
                other => panic!("no caller for the action {other}"),
            };
            format!("{who} (polkit `{a}`)")
        }
        Permission::PeerUid(Peer::Worker) => {
            "the worker (peer uid `supervisor.worker_user`)".to_owned()
        }
        Permission::PeerUid(Peer::Retry) => "airlock-retryd (peer uid `retry.user`)".to_owned(),
        Permission::PeerUid(Peer::Supervisor) => "the supervisor (its peer uid)".to_owned(),
    }
}

/// A row's reply type as code (`stringify!` spaces `Option < ClaimGrant >`).
fn reply(m: &Method) -> String {
    format!("`{}`", m.reply.replace(' ', ""))
}

/// `(in) → out`, `-` for none.
fn signature(m: &Method) -> String {
    let dash = |s: &str| {
        if s.is_empty() {
            "-".to_owned()
        } else {
            format!("`{s}`")
        }
    };
    format!("{} → {}", dash(m.input), dash(m.output))
}

/// What Tasks1 is, from its own declaration.
fn tasks_v1_line() -> String {
    let retired: Vec<String> = tasks_v1::RETIRED
        .iter()
        .map(|r| {
            format!(
                "`{}({})` of {} is refused with `PROTOCOL_VERSION_MISMATCH` naming `{}`",
                r.name,
                r.input,
                r.was,
                r.instead.path()
            )
        })
        .collect();
    format!(
        "`{}`'s methods {} under the old name, deprecated, kept for one release; {}",
        tasks_v1::SUCCESSOR,
        tasks_v1::METHODS
            .iter()
            .map(|m| format!("`{m}`"))
            .collect::<Vec<_>>()
            .join(", "),
        retired.join("; ")
    )
}

/// dbus/README.md: every method with its signature, reply, caller and
/// audited event.
fn render_dbus_readme() -> String {
    let mut out = String::from(
        "| interface | method | in → out | reply | who may call | audited as |\n|---|---|---|---|---|---|\n",
    );
    for iface in table() {
        for r in &iface.rows {
            let m = &r.method;
            let _ = writeln!(
                out,
                "| `{}` | `{}` | {} | {} | {} | {} |",
                m.interface,
                m.name,
                signature(m),
                reply(m),
                caller(m.permission),
                m.event
                    .map_or("the journal".to_owned(), |e| format!("`{e}`"))
            );
        }
        if iface.name == tasks_v1::SUCCESSOR {
            let _ = writeln!(
                out,
                "| `{}` | | | | | {} |",
                tasks_v1::INTERFACE,
                cell(&tasks_v1_line())
            );
        }
    }
    out
}

/// docs/privsep/messages.md: every method with who may call it and when.
fn render_messages() -> String {
    let mut out = String::from(
        "| method | who may call | in → out (reply) | allowed when | audited as |\n|---|---|---|---|---|\n",
    );
    for iface in table() {
        let short = iface.name.trim_start_matches("org.airlock.");
        for r in &iface.rows {
            let m = &r.method;
            let _ = writeln!(
                out,
                "| `{short}.{}` | {} | {} ({}) | {} | {} |",
                m.name,
                caller(m.permission),
                signature(m),
                reply(m),
                cell(&r.doc),
                m.event
                    .map_or("the journal".to_owned(), |e| format!("`{e}`"))
            );
        }
        if iface.name == tasks_v1::SUCCESSOR {
            let _ = writeln!(
                out,
                "| `Tasks1.*` | as on `Tasks2` | as on `Tasks2` | {} | as on `Tasks2` |",
                cell(&tasks_v1_line())
            );
        }
    }
    out
}

/// crates/proto/src/lib.rs: every method, linked to its row.
fn render_crate_doc() -> String {
    let mut out = String::from("| method | who may call | in → out (reply) |\n|---|---|---|\n");
    for iface in table() {
        let short = iface.name.trim_start_matches("org.airlock.");
        for r in &iface.rows {
            let m = &r.method;
            let _ = writeln!(
                out,
                "| [`{short}.{}`](bus::{}::{}) | {} | {} ({}) |",
                m.name,
                iface.module,
                r.konst,
                caller(m.permission),
                signature(m),
                reply(m)
            );
        }
        if iface.name == tasks_v1::SUCCESSOR {
            let _ = writeln!(
                out,
                "| [`Tasks1.*`](bus::tasks_v1) | as on `Tasks2` | {} |",
                cell(&tasks_v1_line())
            );
        }
    }
    out
}

const METHODS_BEGIN: &str = "<!-- bus-methods:begin (generated from crates/proto/src/bus.rs: UPDATE_DOCS=1 cargo test -p airlock-proto --test docs) -->";
const METHODS_END: &str = "<!-- bus-methods:end -->";

/// `path` (from the workspace root) with the lines between its markers
/// (each line starting with `prefix`) replaced by `generated`; rewritten
/// with `UPDATE_DOCS=1`, else a difference fails.
fn section_is_current(path: &str, prefix: &str, generated: &str) {
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path);
    let actual = std::fs::read_to_string(&file).unwrap();
    let begin = format!("{prefix}{METHODS_BEGIN}\n");
    let end = format!("{prefix}{METHODS_END}\n");
    let (Some(b), Some(e)) = (actual.find(&begin), actual.find(&end)) else {
        panic!("{path} lacks the bus-methods markers");
    };
    let body: String = generated
        .lines()
        .map(|l| format!("{prefix}{l}").trim_end().to_owned() + "\n")
        .collect();
    let wanted = format!("{}{begin}{body}{}", &actual[..b], &actual[e..]);
    if std::env::var_os("UPDATE_DOCS").is_some_and(|v| v == "1") {
        std::fs::write(&file, &wanted).unwrap();
        return;
    }
    assert!(
        actual == wanted,
        "{path}'s list of bus methods is out of date with crates/proto/src/bus.rs.\n\
         Regenerate it with:\n\n    UPDATE_DOCS=1 cargo test -p airlock-proto --test docs\n"
    );
}

#[test]
fn dbus_readme_lists_every_method() {
    section_is_current("dbus/README.md", "", &render_dbus_readme());
}

#[test]
fn the_message_table_lists_every_method() {
    section_is_current("docs/privsep/messages.md", "", &render_messages());
}

#[test]
fn the_crate_doc_lists_every_method() {
    section_is_current("crates/proto/src/lib.rs", "//! ", &render_crate_doc());
}

#[test]
fn the_lists_have_every_row_and_only_the_rows() {
    let rows: Vec<String> = airlock_proto::bus::every_row()
        .filter(|m| m.interface != tasks_v1::INTERFACE)
        .map(|m| m.path())
        .collect();
    let listed: Vec<String> = table()
        .iter()
        .flat_map(|i| i.rows.iter().map(|r| r.method.path()))
        .collect();
    assert_eq!(rows, listed);
    let readme = render_dbus_readme();
    let messages = render_messages();
    for m in airlock_proto::bus::every_row() {
        if m.interface == tasks_v1::INTERFACE {
            assert!(readme.contains(&format!("`{}`", m.name)), "{}", m.path());
            continue;
        }
        assert!(
            readme.contains(&format!("| `{}` | `{}` |", m.interface, m.name)),
            "{}",
            m.path()
        );
        let short = m.interface.trim_start_matches("org.airlock.");
        assert!(
            messages.contains(&format!("`{short}.{}`", m.name)),
            "{}",
            m.path()
        );
    }
}

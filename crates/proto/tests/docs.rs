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
    out.push_str("| class | HTTP status | exit code |\n|---|---|---|\n");
    let mut classes: Vec<Class> = Vec::new();
    for code in Code::ALL {
        if !classes.contains(&code.class()) {
            classes.push(code.class());
        }
    }
    classes.sort_by_key(|c| c.exit_code());
    for class in classes {
        let _ = writeln!(
            out,
            "| {class:?} | {} | {} |",
            class.http_status(),
            class.exit_code()
        );
    }
    out.push_str(
        "\nExit code 1 is a generic failure and 2 a usage error; codes start at 3.\n\n\
         ## Codes\n\n\
         | code | meaning | HTTP status | D-Bus error name | exit code |\n\
         |---|---|---|---|---|\n",
    );
    for code in Code::ALL {
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | `{}` | {} |",
            code.as_str(),
            cell(code.meaning()),
            code.http_status(),
            code.dbus_error_name(),
            code.exit_code()
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

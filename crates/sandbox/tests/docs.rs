//! The "Each role's policy" section of docs/privsep/confinement.md is
//! generated from `airlock_sandbox::role`; this test fails when it differs
//! from the policies, and rewrites it when `UPDATE_DOCS=1` is set.

use std::path::Path;

const DOC: &str = "docs/privsep/confinement.md";
const BEGIN: &str = "<!-- role-policy:begin (generated from crates/sandbox/src/role.rs: UPDATE_DOCS=1 cargo test -p airlock-sandbox --test docs) -->\n";
const END: &str = "<!-- role-policy:end -->\n";

#[test]
fn role_policy_section_is_current() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(DOC);
    let actual = std::fs::read_to_string(&path).unwrap();
    let (Some(b), Some(e)) = (actual.find(BEGIN), actual.find(END)) else {
        panic!("{DOC} lacks the role-policy markers");
    };
    let wanted = format!(
        "{}{BEGIN}{}{}",
        &actual[..b],
        airlock_sandbox::role::markdown(),
        &actual[e..]
    );
    if std::env::var_os("UPDATE_DOCS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &wanted).unwrap();
        return;
    }
    assert!(
        actual == wanted,
        "{DOC}'s role policies are out of date with crates/sandbox/src/role.rs.\n\
         Regenerate them with:\n\n    UPDATE_DOCS=1 cargo test -p airlock-sandbox --test docs\n"
    );
}

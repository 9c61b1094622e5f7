//! The hardening verifier behind `airlockctl doctor`: every directive a
//! shipped unit file sets is checked on its own, by name, against the
//! effective unit as `systemctl show` reports it, so that a drop-in which
//! removes `PrivateNetwork=` or `InaccessiblePaths=` is reported as exactly
//! that property failing. A property `systemctl show` does not report, or
//! reports in a form this module does not recognise, fails.
//!
//! The expected values are the unit files of `units/`, compiled in by
//! `build.rs` ([`SHIPPED_UNITS`]), so the verifier and the package cannot
//! disagree; a template (`airlock-agent@.service`) is checked for each of
//! its running instances, its specifiers (`%i`, `%n`, ...) expanded.
//!
//! What "matches" means depends on how systemd reports a directive; each
//! row of [`RULES`] names its [`Kind`], and each kind says how it compares
//! (sets compare as sets, sizes and times as numbers, the system call
//! filter as the expanded set of names). Every directive of every shipped
//! unit has a row: verified, or [`Kind::NotVerified`] with the reason (a
//! test holds the table to the unit files).
//!
//! By job: `unit.rs` reads the shipped files, `shown.rs` what systemd
//! reports, `rules.rs` holds the table, `compare.rs` one comparison per
//! kind and `values.rs` the value parsers they use.

mod compare;
mod rules;
mod shown;
mod unit;
mod values;

use std::collections::BTreeSet;

pub use compare::compare;
pub use rules::{Kind, RULES, Rule, rule_for, shown_names};
pub use shown::{Shown, SyscallGroups};
pub use unit::{
    Assignment, SHIPPED_UNITS, ShippedUnit, UNSET_MEANS_EMPTY, directives, expand_specifiers,
    parse_unit,
};
pub use values::split_quoted;

/// What the verifier needs besides the unit and `systemctl show`.
#[derive(Clone, Debug, Default)]
pub struct Host {
    /// This host's system call groups; empty when `systemd-analyze` could
    /// not be run (then `SystemCallFilter=` fails: it cannot be judged).
    pub syscall_groups: SyscallGroups,
}

/// The verdict on one directive of one unit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// The directive, e.g. `PrivateNetwork`.
    pub property: String,
    /// Whether the effective unit has it as shipped.
    pub ok: bool,
    /// What was found (and, on a failure, what was wanted).
    pub detail: String,
}

/// Every verified directive of `unit` against `shown`, in file order. A
/// template's `instance` expands its specifiers.
pub fn verify(
    unit: &ShippedUnit,
    instance: Option<&str>,
    shown: &Shown,
    host: &Host,
) -> Vec<Verdict> {
    directives(unit, instance)
        .into_iter()
        .filter_map(|(key, values)| {
            let rule = rule_for(&key);
            let kind = match rule {
                Some(r) => r.kind,
                None => {
                    return Some(Verdict {
                        property: key,
                        ok: false,
                        detail: "the verifier has no rule for this directive".to_owned(),
                    });
                }
            };
            if let Kind::NotVerified(_) = kind {
                return None;
            }
            let (ok, detail) = match compare(kind, &values, shown, host) {
                Ok(d) => (true, d),
                Err(d) => (false, d),
            };
            Some(Verdict {
                property: key,
                ok,
                detail,
            })
        })
        .collect()
}

/// The `systemctl show` properties the verified directives of `unit` need.
pub fn properties(unit: &ShippedUnit) -> Vec<String> {
    let mut out = BTreeSet::new();
    for (key, _) in directives(unit, None) {
        let Some(rule) = rule_for(&key) else {
            continue;
        };
        for p in shown_names(rule.kind) {
            out.insert(p);
        }
    }
    out.into_iter().collect()
}

//! The administrator's own checks: `airlockctl doctor` (every warning on
//! the expected list), its hardening verifier, and no test switch in the
//! packaged binaries.

use super::{SEC, json};
use crate::{Container, Out, Report};
use std::collections::BTreeMap;

/// The administrator's own checks of the installation: doctor, its
/// hardening verifier (as shipped and with weakening drop-ins), and no
/// test switch in the packaged binaries.
pub(super) fn checks(r: &mut Report, c: &Container) {
    r.check(
        "airlockctl doctor: nothing fails, each warning on the expected list",
        |_| doctor(c),
    );
    r.check(
        "doctor's hardening verifier: every unit's directives checked by name",
        |_| crate::hardening::doctor_checks_every_unit(c),
    );
    r.check(
        "doctor: drop-ins removing PrivateNetwork= (worker) and InaccessiblePaths= (supervisor) fail exactly those properties; removed, doctor passes",
        |_| crate::hardening::doctor_names_weakened_properties(c),
    );
    r.check(
        "the packaged binaries have no test switches (allow-all-for-tests refused)",
        |_| no_test_switches(c),
    );
}

/// A warning `airlockctl doctor` may give on the testbed: the check's
/// name, a part of its detail, and why it is expected there.
struct ExpectedWarning {
    check: &'static str,
    detail: &'static str,
    reason: &'static str,
}

/// Every warning doctor may give on the freshly installed testbed (a
/// repository registered, the services started by the package). Any other
/// warning, and any failure, fails the check.
const DOCTOR_EXPECTED_WARNINGS: &[ExpectedWarning] = &[];

/// `airlockctl --json doctor`: `{"checks": [{check, status, detail, fix}],
/// "summary": {pass, warn, fail}}`, exit 0 when nothing fails. Every
/// warning must be in [`DOCTOR_EXPECTED_WARNINGS`].
pub(super) fn doctor(c: &Container) -> Result<String, String> {
    judge_doctor(&c.sh("airlockctl --json doctor", 120 * SEC)?)
}

fn judge_doctor(out: &Out) -> Result<String, String> {
    let v =
        json(&out.stdout).map_err(|e| format!("airlockctl --json doctor: {e}\n{}", out.both()))?;
    let checks = v["checks"].as_array().cloned().unwrap_or_default();
    if checks.is_empty() {
        return Err(format!("doctor listed no checks:\n{}", out.both()));
    }
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let (mut problems, mut expected) = (Vec::new(), Vec::new());
    for ch in &checks {
        let status = ch["status"].as_str().unwrap_or("?");
        let name = ch["check"].as_str().unwrap_or("?");
        let detail = ch["detail"].as_str().unwrap_or_default();
        *counts.entry(status.to_owned()).or_default() += 1;
        match status {
            "pass" => {}
            "warn" => match DOCTOR_EXPECTED_WARNINGS
                .iter()
                .find(|w| w.check == name && detail.contains(w.detail))
            {
                Some(w) => expected.push(format!("warn {name}: {detail} (expected: {})", w.reason)),
                None => problems.push(format!(
                    "unexpected warning {name}: {detail} (fix: {})",
                    ch["fix"]
                )),
            },
            _ => problems.push(format!("{status} {name}: {detail} (fix: {})", ch["fix"])),
        }
    }
    for (status, key) in [("pass", "pass"), ("warn", "warn"), ("fail", "fail")] {
        let listed = counts.get(status).copied().unwrap_or(0);
        if v["summary"][key] != listed {
            problems.push(format!(
                "summary says {} {key}, the list has {listed}",
                v["summary"][key]
            ));
        }
    }
    if !out.ok() && problems.is_empty() {
        problems.push(format!("exit {} with nothing failing", out.describe()));
    }
    let counts: Vec<String> = counts.iter().map(|(k, n)| format!("{n} {k}")).collect();
    if !problems.is_empty() {
        return Err(format!(
            "airlockctl doctor ({}; {}):\n{}",
            out.describe(),
            counts.join(", "),
            problems.join("\n")
        ));
    }
    Ok(format!("{}\n{}", counts.join(", "), expected.join("\n"))
        .trim_end()
        .to_owned())
}

/// The packaged supervisor refuses a test authoriser, from the
/// configuration file and from the flag, with CONFIG_INVALID (exit 3).
fn no_test_switches(c: &Container) -> Result<String, String> {
    c.sh_ok(
        "mkdir -p /tmp/tb && printf '[supervisor]\\nauthorizer = \"allow-all-for-tests\"\\n' > /tmp/tb/allow-all.toml",
        10 * SEC,
    )?;
    let mut seen = Vec::new();
    for cmd in [
        "airlock-supervisor --check-config --config /tmp/tb/allow-all.toml",
        "airlock-supervisor --check-config --authorizer allow-all-for-tests",
    ] {
        let out = c.sh(cmd, 30 * SEC)?;
        if out.code != Some(3)
            || !out.both().contains("CONFIG_INVALID")
            || !out.both().contains("production build")
        {
            return Err(format!("{cmd}: {}\n{}", out.describe(), out.both()));
        }
        seen.push("exit 3 CONFIG_INVALID");
    }
    Ok(format!("config file and flag: {}", seen.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::tests::out;

    #[test]
    fn a_doctor_warning_off_the_list_fails() {
        let pass = r#"{"checks":[{"check":"seccomp","status":"pass","detail":"","fix":null}],"summary":{"pass":1,"warn":0,"fail":0}}"#;
        assert!(judge_doctor(&out(0, pass, "")).is_ok());
        let warn = r#"{"checks":[{"check":"seccomp","status":"pass","detail":"","fix":null},{"check":"airlock-retryd.service","status":"warn","detail":"not running (inactive)","fix":null}],"summary":{"pass":1,"warn":1,"fail":0}}"#;
        assert!(judge_doctor(&out(0, warn, "")).is_err());
        let miscounted = r#"{"checks":[{"check":"seccomp","status":"pass","detail":"","fix":null}],"summary":{"pass":2,"warn":0,"fail":0}}"#;
        assert!(judge_doctor(&out(0, miscounted, "")).is_err());
        assert!(judge_doctor(&out(1, pass, "")).is_err());
    }
}

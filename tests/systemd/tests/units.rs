//! Checks of units/ that need no booted system and no root:
//! `systemd-analyze security --offline=true` (every service within its limit
//! in `EXPOSURE_LIMITS`, which README.md quotes) and `systemd-analyze verify` against a
//! scratch root holding the host's units and ours (nothing printed). The
//! same checks run again inside the booted root in tests/testbed.rs.

use airlock_systemd_tests::scenario::REFUSALS;
use airlock_systemd_tests::units::{
    EXPOSURE_LIMITS, max_exposure, offline_exposure, packaged_man_pages, readme_exposure_statement,
    unit_files, verify_in_root, verify_root,
};
use airlock_systemd_tests::workspace_root;
use std::path::PathBuf;

#[test]
fn offline_exposure_is_within_limits() {
    let mut figures = Vec::new();
    let mut over = Vec::new();
    let services: Vec<_> = unit_files()
        .unwrap()
        .into_iter()
        .filter(|u| u.is_service())
        .collect();
    for unit in &services {
        let (exposure, findings) = offline_exposure(unit).unwrap();
        figures.push(format!("{} {exposure}", unit.name));
        match max_exposure(&unit.name) {
            None => over.push(format!(
                "{}: no limit in EXPOSURE_LIMITS (tests/systemd/src/units.rs)",
                unit.name
            )),
            Some(limit) if exposure > limit.offline => {
                over.push(format!(
                    "{}: {exposure} > {}\n{findings}",
                    unit.name, limit.offline
                ));
            }
            Some(_) => {}
        }
    }
    for limit in EXPOSURE_LIMITS {
        if !services.iter().any(|s| s.name == limit.unit) {
            over.push(format!(
                "EXPOSURE_LIMITS names {}, which units/ lacks",
                limit.unit
            ));
        }
    }
    eprintln!(
        "systemd-analyze security --offline=true: {}",
        figures.join(", ")
    );
    assert!(over.is_empty(), "{}", over.join("\n"));
}

/// README.md and tests/systemd/README.md state the limits the checks use.
#[test]
fn readmes_quote_the_exposure_limits() {
    let statement = readme_exposure_statement();
    for readme in ["README.md", "tests/systemd/README.md"] {
        let text = std::fs::read_to_string(workspace_root().join(readme)).unwrap();
        // Markdown may wrap the statement; compare with whitespace folded.
        let fold = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            fold(&text).contains(&fold(&statement)),
            "{readme} does not say {statement:?} (the limits in EXPOSURE_LIMITS, tests/systemd/src/units.rs)"
        );
    }
}

#[test]
fn verify_prints_nothing_offline() {
    let units = unit_files().unwrap();
    // Stubs stand in for the binaries here (verify checks that each program
    // is executable); the booted testbed runs verify on the real ones.
    let programs: Vec<(String, Option<PathBuf>)> = units
        .iter()
        .flat_map(|u| u.programs())
        .map(|p| (p, None))
        .collect();
    let dir = std::env::temp_dir().join(format!("airlock-verify-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    verify_root(&dir, &programs).unwrap();
    let names: Vec<String> = units.iter().map(|u| u.name.clone()).collect();
    let out = verify_in_root(&dir, &names).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.ok() && out.both().trim().is_empty(),
        "systemd-analyze verify ({}):\n{}",
        out.describe(),
        out.both()
    );
}

#[test]
fn every_program_and_man_page_a_unit_names_is_packaged() {
    let pages = packaged_man_pages().unwrap();
    let script =
        std::fs::read_to_string(airlock_systemd_tests::workspace_root().join("scripts/package"))
            .unwrap();
    for unit in unit_files().unwrap() {
        for doc in unit.documentation() {
            if let Some(man) = doc.strip_prefix("man:") {
                let (name, section) = man.trim_end_matches(')').split_once('(').unwrap();
                assert!(
                    pages.iter().any(|(n, s)| n == name && s == section),
                    "{}: {doc} is not a page the package ships ({pages:?})",
                    unit.name
                );
            }
        }
        for program in unit.programs() {
            // ExecReload= signals the daemon with the shell's kill
            // (/bin/sh is essential; procps' /bin/kill is not in minbase).
            if program == "/bin/sh" {
                continue;
            }
            let name = program.rsplit('/').next().unwrap();
            assert!(
                program.starts_with("/usr/bin/") && script.contains(&format!("\"{name} usr/bin\"")),
                "{}: {program} is not a binary scripts/package installs in /usr/bin",
                unit.name
            );
        }
    }
}

/// The refusals the testbed asserts are docs/errors.md's (generated from
/// crates/proto/src/error.rs): code, HTTP status, D-Bus name, exit code.
#[test]
fn asserted_refusals_are_the_catalogue_s() {
    let catalogue = std::fs::read_to_string(workspace_root().join("docs/errors.md")).unwrap();
    for r in REFUSALS {
        let row = catalogue
            .lines()
            .find(|l| l.starts_with(&format!("| `{}` |", r.code)))
            .unwrap_or_else(|| panic!("{} is not in docs/errors.md", r.code));
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        // "", code, meaning, status, D-Bus name, exit, ""
        assert_eq!(
            (cells[3], cells[4], cells[5]),
            (
                r.http_status.to_string().as_str(),
                format!("`{}`", r.dbus_error).as_str(),
                r.exit_code.to_string().as_str()
            ),
            "{}: the testbed's figures differ from docs/errors.md: {row}",
            r.code
        );
    }
}

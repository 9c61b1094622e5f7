//! Checks of units/ that need no booted system and no root:
//! `systemd-analyze security --offline=true` (every service at 1.5 or lower,
//! the executor at 0.5 or lower) and `systemd-analyze verify` against a
//! scratch root holding the host's units and ours (nothing printed). The
//! same checks run again inside the booted root in tests/testbed.rs.

use airlock_systemd_tests::units::{
    max_exposure, offline_exposure, packaged_man_pages, unit_files, verify_in_root, verify_root,
};
use std::path::PathBuf;

#[test]
fn offline_exposure_is_within_limits() {
    let mut figures = Vec::new();
    let mut over = Vec::new();
    for unit in unit_files().unwrap().iter().filter(|u| u.is_service()) {
        let (exposure, findings) = offline_exposure(unit).unwrap();
        figures.push(format!("{} {exposure}", unit.name));
        if exposure > max_exposure(&unit.name) {
            over.push(format!(
                "{}: {exposure} > {}\n{findings}",
                unit.name,
                max_exposure(&unit.name)
            ));
        }
    }
    eprintln!(
        "systemd-analyze security --offline=true: {}",
        figures.join(", ")
    );
    assert!(over.is_empty(), "{}", over.join("\n"));
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
            let name = program.rsplit('/').next().unwrap();
            assert!(
                program.starts_with("/usr/bin/") && script.contains(&format!("\"{name} usr/bin\"")),
                "{}: {program} is not a binary scripts/package installs in /usr/bin",
                unit.name
            );
        }
    }
}

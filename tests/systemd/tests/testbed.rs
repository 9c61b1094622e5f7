//! The systemd testbed (see the crate docs and tests/systemd/README.md):
//! builds the packages, boots a cached minimal Debian root with
//! systemd-nspawn, installs the .deb and checks it as an administrator would.
//!
//! Needs root (debootstrap, systemd-nspawn); as another user it says so and
//! passes without checking anything. Everything else it needs is in
//! AIRLOCK_DEBIAN_PACKAGES (scripts/deps.sh); a missing tool is a failure.

use airlock_systemd_tests::scenario::{Settings, run_all};
use airlock_systemd_tests::{DEFAULT_CACHE, Outcome, debian_mirror, is_root, selected_releases};
use std::path::PathBuf;

#[test]
fn package_installs_and_runs_under_systemd() {
    assert!(
        is_root(),
        "package_installs_and_runs_under_systemd needs root (debootstrap, systemd-nspawn); CI runs the tests as root: run this one as root (sudo), it fails rather than pass without checking"
    );
    // CARGO_TARGET_TMPDIR is <target dir>/tmp.
    let target_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .map(PathBuf::from)
        .expect("CARGO_TARGET_TMPDIR has a parent");
    let settings = Settings {
        target_dir,
        cache: std::env::var_os("AIRLOCK_TESTBED_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_CACHE)),
        mirror: debian_mirror().expect("a Debian mirror for debootstrap"),
        releases: selected_releases().expect("AIRLOCK_TESTBED_RELEASES"),
    };
    let report = run_all(&settings);
    let summary = report.summary();
    report.say(&summary);
    // The failed checks also on standard output, first and short: a CI
    // excerpt of a long run may show little else.
    let failed: Vec<String> = report
        .checks
        .iter()
        .filter(|c| c.outcome == Outcome::Fail)
        .map(|c| {
            let detail: Vec<&str> = c.detail.lines().take(6).collect();
            format!("FAILED {}: {}", c.name, detail.join(" | "))
        })
        .collect();
    for f in &failed {
        println!("{f}");
    }
    assert!(
        report.all_passed(),
        "the systemd testbed found problems:\n{}\nsee the summary above and {}",
        failed.join("\n"),
        report.log_path().display()
    );
}

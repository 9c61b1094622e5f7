//! The escape suite: every hostile command must be blocked.
//!
//! Needs root (it runs the executor as distinct uids in network namespaces
//! of its own); skips otherwise. `AIRLOCK_ESCAPE_FILTER=name` runs only the
//! probes whose name contains it; `AIRLOCK_ESCAPE_STRICT=1` fails on known
//! gaps too; `AIRLOCK_ESCAPE_KEEP=1` keeps the fixtures under /var/tmp.
//! Run with `-- --nocapture` to see one line per probe.

use airlock_escape_suite::{Bins, Suite, is_root, probes, unavailable};

#[test]
fn every_hostile_command_is_blocked() {
    if let Some(why) = unavailable() {
        // As root the suite can run: a missing tool must not pass silently.
        let may_skip = !is_root()
            || !cfg!(target_arch = "x86_64")
            || std::env::var_os("AIRLOCK_ESCAPE_ALLOW_SKIP").is_some();
        assert!(
            may_skip,
            "the escape suite cannot run: {why} (Debian: iproute2, util-linux, python3; \
             set AIRLOCK_ESCAPE_ALLOW_SKIP=1 to skip)"
        );
        eprintln!("skipped: {why}");
        return;
    }
    let bins = Bins::locate().expect("the executor and airlock-confine binaries");
    let suite = Suite::new(bins).expect("fixtures, namespaces and listeners");
    let filter = std::env::var("AIRLOCK_ESCAPE_FILTER").ok();
    let summary = suite.run_all(filter.as_deref());
    drop(suite);
    for problem in &summary.global {
        println!("ESCAPED (final check): {problem}");
    }
    let gaps = summary.gaps();
    for gap in &gaps {
        println!("known gap, not counted: {gap}");
    }
    println!(
        "{} attempts, {} blocked",
        summary.attempts(),
        summary.blocked()
    );
    if filter.is_none() {
        assert!(
            summary.attempts() >= 40,
            "only {} probes ran of {}",
            summary.attempts(),
            probes::PROBES.len()
        );
    }
    let failed: Vec<String> = summary
        .outcomes
        .iter()
        .filter(|o| {
            !matches!(
                o.verdict,
                airlock_escape_suite::Verdict::Blocked(_)
                    | airlock_escape_suite::Verdict::Skipped(_)
                    | airlock_escape_suite::Verdict::Gap(_)
            )
        })
        .map(ToString::to_string)
        .chain(summary.global.iter().cloned())
        .collect();
    assert!(failed.is_empty(), "not blocked:\n{}", failed.join("\n"));
    assert!(summary.all_blocked());
    if std::env::var_os("AIRLOCK_ESCAPE_STRICT").is_some() {
        assert!(gaps.is_empty(), "known gaps got through (strict mode)");
    }
}

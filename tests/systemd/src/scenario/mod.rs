//! The testbed scenario: build the packages, boot the root, install the
//! .deb and use airlock as an administrator would, then reinstall,
//! upgrade, stop, remove and purge it. Every check is recorded in the
//! [`Report`]; a check that fails does not stop the ones after it, except
//! where they could not mean anything (no package, no container, no
//! installation).
//!
//! By check family: `package.rs` (the packages, before any root),
//! `install.rs` (the installation), `doctor.rs` (the administrator's own
//! checks), `tasks.rs` (tasks end to end), `authz.rs` (refusals and their
//! audit), `journal.rs`, `confinement.rs` (what the kernel shows of each
//! sandbox), `metrics.rs` (airlock.prom through a real node exporter),
//! `lifecycle.rs` (stop, start, reinstall, upgrade, remove, purge) and
//! `agents.rs`; `status.rs` reads what is running; `facts.rs` records
//! what each booted root is (README.md's table of releases). This file
//! runs them in order: the packages once, then everything in a booted root
//! on each release of the run ([`crate::RELEASES`]), each check's name
//! carrying its release.

mod agents;
mod authz;
mod cockpit;
mod confinement;
mod doctor;
mod facts;
mod install;
mod journal;
mod lifecycle;
mod metrics;
mod package;
mod status;
mod tasks;

use crate::results::{self, Facts, ReleaseRun};
use crate::{Container, Outcome, Release, Report, debian_root, tail};
use package::{
    PREVIOUS_RELEASE, Packages, package_checks, previous_release_deb, previous_release_reachable,
    previous_stand_in_deb, rpm_scriptlets, upgrade_deb,
};
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use authz::{INTERACTIVE_AUTHORIZATION_REQUIRED, REFUSALS, Refusal, UNAUTHORIZED};

/// Where things are.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Cargo's target directory (packages and the testbed's files go there).
    pub target_dir: PathBuf,
    /// Cache of the Debian root.
    pub cache: PathBuf,
    /// Debian mirror for debootstrap.
    pub mirror: String,
    /// The releases to boot, each its own root ([`crate::selected_releases`]).
    pub releases: Vec<Release>,
}

pub(super) const SEC: Duration = Duration::from_secs(1);

pub(super) const SERVICES: &[&str] = &[
    "airlock-supervisor.service",
    "airlock-worker.service",
    "airlock-executor.service",
    "airlock-retryd.service",
    "airlock-egress.service",
];

pub(super) const STARTED_BY_TARGET: &[&str] = &[
    "airlock.target",
    "airlock-supervisor.service",
    "airlock-worker.service",
    "airlock-executor.service",
    "airlock-retryd.socket",
    "airlock-egress.service",
];

pub(super) const ALL_UNITS: &[&str] = &[
    "airlock.target",
    "airlock-supervisor.service",
    "airlock-worker.service",
    "airlock-executor.service",
    "airlock-retryd.service",
    "airlock-retryd.socket",
    "airlock-egress.service",
];

pub(super) const USERS: &[&str] = &[
    "airlock",
    "airlock-worker",
    "airlock-exec",
    "airlock-retry",
    "airlock-agent",
    "airlock-egress",
];

pub(super) const REPO: &str = "/srv/airlock/calc.git";

pub(super) fn json(text: &str) -> Result<Value, String> {
    serde_json::from_str(text.trim()).map_err(|e| format!("not JSON ({e}): {}", tail(text, 5)))
}

pub(super) fn q(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

pub(super) fn file_name(p: &Path) -> String {
    p.file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_owned()
}

impl crate::Detail for PathBuf {
    fn detail(&self) -> String {
        self.display().to_string()
    }
}

impl crate::Detail for Container {
    fn detail(&self) -> String {
        format!("machine {} (init pid {})", self.name, self.leader())
    }
}

/// Runs the whole scenario.
/// `AIRLOCK_TESTBED_ONLY=agents`: the narrow run while working on agents
/// (the package, its installation, a repository, then only the agent
/// checks; no lintian, no RPM scriptlets, no upgrade or removal);
/// `AIRLOCK_TESTBED_ONLY=cockpit`: the same with the Cockpit checks.
pub fn only_agents() -> bool {
    matches!(
        std::env::var("AIRLOCK_TESTBED_ONLY").as_deref(),
        Ok("agents" | "cockpit")
    )
}

fn only_cockpit() -> bool {
    std::env::var("AIRLOCK_TESTBED_ONLY").as_deref() == Ok("cockpit")
}

pub fn run_all(s: &Settings) -> Report {
    let work = s.target_dir.join("testbed");
    let _ = fs::create_dir_all(&work);
    let mut r = match Report::new(&work.join("testbed.log")) {
        Ok(r) => r,
        Err(e) => panic!("cannot start the report: {e}"),
    };
    r.say(&format!(
        "airlock systemd testbed: log in {}; releases: {}",
        r.log_path().display(),
        s.releases
            .iter()
            .map(Release::label)
            .collect::<Vec<_>>()
            .join(", ")
    ));
    // Before this build's package: the previous release's build replaces
    // the binaries in the shared profile directory, which this build's
    // then links again.
    let reachable = previous_release_reachable();
    let previous = if only_agents() || !reachable {
        None
    } else {
        r.check(
            &format!(
                "the previous release ({}) built as a .deb from its own sources",
                &PREVIOUS_RELEASE[..12]
            ),
            |_| previous_release_deb(s, &work),
        )
    };
    let Some(pkgs) = package_checks(&mut r, s, &work) else {
        r.skip(&["everything in the booted root"], "no package was built");
        return r;
    };
    let debs = work.join("debs");
    let upgrade = r.check(
        "upgrade .deb: the same package as version +testbed1",
        |_| {
            let _ = fs::remove_dir_all(&debs);
            fs::create_dir_all(&debs).map_err(|e| e.to_string())?;
            fs::copy(&pkgs.deb, debs.join(file_name(&pkgs.deb))).map_err(|e| e.to_string())?;
            fs::copy(&pkgs.cockpit, debs.join(file_name(&pkgs.cockpit)))
                .map_err(|e| e.to_string())?;
            upgrade_deb(&pkgs, &debs)
        },
    );
    let earlier = match &previous {
        Some(p) => r.check("the previous release's .deb beside this one", |_| {
            let to = debs.join(file_name(p));
            fs::copy(p, &to).map_err(|e| e.to_string())?;
            Ok(to)
        }),
        // A shallow clone has no previous release to build: its stand-in
        // still takes the configuration through the upgrade's path.
        None if !reachable && !only_agents() => r.check(
            "a shallow clone without the previous release's commit: this package as the previous release shipped its airlock.toml, in its place",
            |_| previous_stand_in_deb(&pkgs, &debs),
        ),
        None => None,
    };
    // The worker's fault build for the watchdog check, once for all.
    let fault = if only_agents() {
        None
    } else {
        r.check(
            "the worker's fault build (--features fault-injection) for the watchdog check, in the testbed's roots only",
            |_| crate::hardening::fault_worker(&s.target_dir),
        )
    };
    let shared = Shared {
        pkgs: &pkgs,
        debs: &debs,
        upgrade: upgrade.as_deref(),
        earlier: earlier.as_deref(),
        fault: fault.as_deref(),
    };
    // Each release on a thread of its own, beside the others (their checks
    // wait on systemd's timers more than they compute), unless
    // AIRLOCK_TESTBED_SERIAL=1; either way their checks are reported
    // release by release, in the testbed's order.
    let forked: Vec<(Report, ReleaseRun)> = if serial() {
        s.releases
            .iter()
            .map(|&release| run_release(&r, s, release, &shared, &work))
            .collect()
    } else {
        std::thread::scope(|scope| {
            let (r, shared, work) = (&r, &shared, &work);
            let threads: Vec<_> = s
                .releases
                .iter()
                .map(|&release| scope.spawn(move || run_release(r, s, release, shared, work)))
                .collect();
            threads
                .into_iter()
                .map(|t| match t.join() {
                    Ok(done) => done,
                    Err(panic) => std::panic::resume_unwind(panic),
                })
                .collect()
        })
    };
    let mut runs = Vec::new();
    for (checks, run) in forked {
        r.absorb(checks);
        runs.push(run);
    }
    if !only_agents() {
        r.set_group("results");
        results::record(&mut r, &work, &runs);
    }
    r
}

/// `AIRLOCK_TESTBED_SERIAL=1`: the releases one after the other.
fn serial() -> bool {
    std::env::var("AIRLOCK_TESTBED_SERIAL").as_deref() == Ok("1")
}

/// What every release's run shares: the packages built once, and the
/// worker's fault build.
struct Shared<'a> {
    pkgs: &'a Packages,
    debs: &'a Path,
    upgrade: Option<&'a Path>,
    earlier: Option<&'a Path>,
    fault: Option<&'a Path>,
}

/// One release's run, in a report of its own ([`Report::fork`]), and
/// what it found.
fn run_release(
    r: &Report,
    s: &Settings,
    release: Release,
    shared: &Shared,
    work: &Path,
) -> (Report, ReleaseRun) {
    let mut rr = r.fork(release);
    let t = Instant::now();
    let facts = on_release(&mut rr, s, release, shared, &work.join(release.suite));
    let seconds = t.elapsed().as_secs_f64();
    let checks = &rr.checks;
    let run = ReleaseRun {
        release,
        seconds,
        facts,
        proven: results::proven(checks),
        passed: checks.iter().all(|c| c.outcome == Outcome::Pass),
    };
    rr.say(&format!(
        "{}: {} checks, {} not passed, {seconds:.0} s",
        release.label(),
        checks.len(),
        checks.iter().filter(|c| c.outcome != Outcome::Pass).count()
    ));
    (rr, run)
}

/// Everything on one release: its root (made once, cached), booted with
/// the packages at /debs, the scenario in it, then the RPM's scriptlets on
/// a second boot of it. Its files go to `work` (the release's directory);
/// what the booted root is, when the scenario got that far.
fn on_release(
    r: &mut Report,
    s: &Settings,
    release: Release,
    shared: &Shared,
    work: &Path,
) -> Option<Facts> {
    let _ = fs::create_dir_all(work);
    r.set_group("root");
    let first = r.checks.len();
    let Some(root) = r.check("minimal Debian root (debootstrap, cached)", |r| {
        debian_root(&s.cache, &s.mirror, release, r)
    }) else {
        r.skip(&["everything in the booted root"], "no Debian root");
        return None;
    };
    let Some(mut c) = r.check("boot the root with systemd-nspawn", |r| {
        Container::boot(
            &root,
            release.suite,
            &[(shared.debs.to_owned(), "/debs")],
            &work.join("nspawn.log"),
            r,
        )
    }) else {
        r.skip(
            &["everything in the booted root"],
            "the container did not boot",
        );
        return None;
    };
    let facts = in_container(r, &c, shared, work);
    if r.checks[first..].iter().any(|c| c.outcome != Outcome::Pass) {
        // The whole boot's: Cockpit's, logind's and systemd's own messages
        // explain as many failures as airlock's do.
        if let Ok(out) = c.sh("journalctl --no-pager -o short-monotonic -b", 60 * SEC) {
            let path = work.join("journal.txt");
            let _ = fs::write(&path, out.both());
            r.say(&format!("the container's journal: {}", path.display()));
        }
    }
    r.set_group("root");
    r.check("the container powers off", |_| {
        c.shutdown(Duration::from_secs(60)).map(|()| String::new())
    });
    drop(c);
    if only_agents() {
        return facts;
    }
    r.set_group("RPM scriptlets");
    r.check(
        "rpm scriptlets on a fresh booted root: install, upgrade, erase",
        |r| rpm_scriptlets(r, &root, release.suite, &shared.pkgs.rpm, work),
    );
    facts
}

/// Everything in the booted root, in order: the installation, the
/// administrator's checks, the tasks (with a repository), the live
/// confinement, what the root is, then the package's life cycle. The
/// facts of the root, when the run got that far.
fn in_container(r: &mut Report, c: &Container, shared: &Shared, work: &Path) -> Option<Facts> {
    let p = shared.pkgs;
    let deb = format!("/debs/{}", file_name(&p.deb));
    r.set_group("install");
    if !install::checks(r, c, &deb) {
        r.skip(
            &["everything after the installation"],
            "the package did not install",
        );
        return None;
    }
    r.set_group("tasks");
    let repo = r.check(
        "a bare repository under /srv/airlock, registered; restart",
        |_| install::setup_repository(c),
    );
    if only_agents() {
        if repo.is_some() {
            r.set_group("agents");
            agents::agent_checks(r, c, |r| {
                if only_cockpit() {
                    r.set_group("Cockpit in Chromium");
                    cockpit::checks(r, c, p, work);
                    r.set_group("agents");
                }
            });
        }
        return None;
    }
    r.set_group("doctor");
    doctor::checks(r, c);
    if repo.is_some() {
        with_repository(r, c, shared, work);
    } else {
        r.skip(
            &[
                "demo task by root with airlockctl",
                "airlock-agent submits",
                "reads bound to the caller",
                "sandbox probe",
                "ordinary user denied",
                "airlock-mcp as airlock-agent",
            ],
            "no repository",
        );
    }
    r.set_group("sandbox");
    confinement::checks(r, c);
    r.set_group("facts");
    let facts = r.check(
        "what the booted root is: distribution, systemd, polkit, Cockpit; the kernel features airlock used there",
        |r| facts::gather(c, r.release()),
    );
    if repo.is_some() {
        r.set_group("retry API");
        r.check(
            "retryd: one more attempt for a failed task, with the owner's token",
            |_| tasks::retry_extension(c),
        );
        r.set_group("metrics through the node exporter");
        r.check(
            "metrics: Debian's node exporter serves airlock.prom's series (ACL and ReadWritePaths= as docs/metrics.md says)",
            |_| metrics::node_exporter_reads_airlock_prom(c),
        );
    }
    r.set_group("lifecycle");
    lifecycle::checks(r, c, &deb, shared.upgrade, shared.earlier);
    facts
}

/// The checks that need the registered repository: tasks by root, by
/// airlock-agent and through MCP, the sandbox probe, the refused user, the
/// journal, then the agents (and, while they are configured, the Cockpit
/// page).
fn with_repository(r: &mut Report, c: &Container, shared: &Shared, work: &Path) {
    let (p, fault) = (shared.pkgs, shared.fault);
    r.set_group("tasks");
    r.check(
        "demo task by root with airlockctl: SUCCEEDED, commit on agent/*",
        |_| tasks::demo_task(c),
    );
    r.check(
        "systemd's watchdog restarts a worker whose attempt thread is wedged (a fault build, in this root only); the task ends",
        |_| tasks::wedged_worker(c, fault),
    );
    r.set_group("sandbox");
    let host = r
        .check(
            "the secret paths the probes target exist (root, outside any sandbox)",
            |_| confinement::secrets_on_host(c).map(confinement::Host),
        )
        .map(|h| h.0);
    r.set_group("polkit matrix");
    r.check(
        "airlock-agent submits without a password (polkit rule)",
        |_| tasks::agent_submits(c),
    );
    r.set_group("reads bound to the caller");
    r.check(
        "reads bound to the caller: airlock-agent reads its own task only, root's answers TASK_NOT_FOUND as a missing one; root reads both (polkit tasks.read-all)",
        |_| authz::reads_bound_to_the_caller(c),
    );
    r.set_group("sandbox");
    if let Some(host) = &host {
        r.check(
            "sandbox probe: every secret path denied or hidden (ENOENT only for paths root sees)",
            |_| confinement::sandbox_probe(c, host),
        );
    } else {
        r.skip(&["sandbox probe"], "the secret paths are not all present");
    }
    r.set_group("polkit matrix");
    r.check(
        "ordinary user: submit refused by polkit (exact code), refusal audited",
        |_| authz::ordinary_user_denied(c),
    );
    r.set_group("journal");
    r.check(
        "journal: events with their MESSAGE_IDs and AIRLOCK_* fields, explained by journalctl -x",
        |_| journal::journal_catalogue(c),
    );
    r.set_group("tasks");
    r.check(
        "repo add + reload (same PIDs); airlock-agent clones it, cannot write it, proposes a --worktree: commit on agent/*",
        |_| tasks::own_repository(c),
    );
    r.set_group("upstream publication");
    r.check(
        "repo add --upstream --signing-key: the worker restarted with its key by LoadCredential=, the first sync, a proposal published once to the upstream, signed (git verify-commit)",
        |_| tasks::upstream_publication(c),
    );
    r.set_group("MCP");
    r.check(
        "airlock-mcp as airlock-agent: an MCP client reads, proposes with a packaged preset, its commit lands on agent/*; polkit refuses its cancel",
        |_| tasks::mcp_agent(c),
    );
    // The Cockpit page runs while the agents are there, one of them held.
    r.set_group("agents");
    agents::agent_checks(r, c, |r| {
        r.set_group("Cockpit in Chromium");
        cockpit::checks(r, c, p, work);
        r.set_group("agents");
    });
}

#[cfg(test)]
pub(crate) mod tests {
    use crate::Out;

    /// A finished command that left `code`, `stdout` and `stderr`.
    pub(crate) fn out(code: i32, stdout: &str, stderr: &str) -> Out {
        Out {
            code: Some(code),
            stdout: stdout.to_owned(),
            stderr: stderr.to_owned(),
            timed_out: false,
        }
    }
}

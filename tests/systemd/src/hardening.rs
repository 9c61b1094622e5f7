//! Testbed checks of what systemd itself enforces on airlock's units:
//! `airlockctl doctor`'s hardening verifier against drop-ins that weaken
//! the installed units (issue 12, part 6), and systemd's watchdog
//! restarting a worker whose attempt thread is wedged (issue 14, part 3).
//! Called from [`crate::scenario`], each its own check.

use crate::{Container, Out, workspace_root};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const SEC: Duration = Duration::from_secs(1);

/// The units the package runs, each checked by doctor property by property.
const HARDENED: &[&str] = &[
    "airlock-supervisor.service",
    "airlock-worker.service",
    "airlock-executor.service",
    "airlock-retryd.service",
    "airlock-retryd.socket",
    "airlock-egress.service",
];

fn json(text: &str) -> Result<Value, String> {
    serde_json::from_str(text).map_err(|e| format!("not JSON ({e}): {text}"))
}

/// `(unit, property)` of failing hardening checks.
type Failing = BTreeSet<(String, String)>;

/// `airlockctl --json doctor`: its output, and the `(unit, property)` of
/// every failing hardening check. Other failing checks are errors.
fn doctor_failures(c: &Container) -> Result<(Out, Value, Failing), String> {
    let out = c.sh("airlockctl --json doctor", 180 * SEC)?;
    let v = json(&out.stdout)?;
    let mut props = BTreeSet::new();
    let mut others = Vec::new();
    for ch in v["checks"].as_array().cloned().unwrap_or_default() {
        if ch["status"] != "fail" {
            continue;
        }
        match (ch["unit"].as_str(), ch["property"].as_str()) {
            (Some(u), Some(p)) => {
                props.insert((u.to_owned(), p.to_owned()));
            }
            _ => others.push(format!("{}: {}", ch["check"], ch["detail"])),
        }
    }
    if !others.is_empty() {
        return Err(format!(
            "doctor failed checks other than hardening:\n{}",
            others.join("\n")
        ));
    }
    Ok((out, v, props))
}

/// Doctor checks each unit property by property on the installed package.
pub fn doctor_checks_every_unit(c: &Container) -> Result<String, String> {
    let (out, v, failing) = doctor_failures(c)?;
    if !out.ok() || !failing.is_empty() {
        return Err(format!(
            "doctor ({}) fails {failing:?} on the units as installed",
            out.describe()
        ));
    }
    let checks = v["checks"].as_array().cloned().unwrap_or_default();
    let mut counts = Vec::new();
    for unit in HARDENED {
        let props: BTreeSet<&str> = checks
            .iter()
            .filter(|ch| ch["unit"] == *unit && ch["status"] == "pass")
            .filter_map(|ch| ch["property"].as_str())
            .collect();
        let must: &[&str] = if unit.ends_with(".socket") {
            &["ListenStream", "IPAddressAllow", "IPAddressDeny"]
        } else {
            &[
                "NoNewPrivileges",
                "PrivateNetwork",
                "InaccessiblePaths",
                "SystemCallFilter",
                "CapabilityBoundingSet",
                "RestrictAddressFamilies",
                "ProtectSystem",
                "User",
                "ExecStart",
            ]
        };
        let lacking: Vec<&&str> = must.iter().filter(|p| !props.contains(**p)).collect();
        if !lacking.is_empty() {
            return Err(format!("{unit}: doctor did not check {lacking:?}"));
        }
        counts.push(format!("{unit} {}", props.len()));
    }
    Ok(format!("properties verified: {}", counts.join(", ")))
}

/// A drop-in per unit, daemon-reload, restart: doctor fails exactly the
/// weakened properties, by name, and exits non-zero; without the drop-ins
/// it passes again. (An agent unit: [`doctor_names_a_weakened_agent`],
/// where one runs.)
pub fn doctor_names_weakened_properties(c: &Container) -> Result<String, String> {
    let weaken = [
        (
            "airlock-worker.service",
            "PrivateNetwork=no",
            "PrivateNetwork",
        ),
        (
            "airlock-supervisor.service",
            "InaccessiblePaths=",
            "InaccessiblePaths",
        ),
    ];
    let mut want: BTreeSet<(String, String)> = BTreeSet::new();
    let mut script = String::from("set -e\n");
    let mut units = Vec::new();
    for (unit, line, prop) in weaken {
        script.push_str(&format!(
            "mkdir -p /etc/systemd/system/{unit}.d\nprintf '[Service]\\n{line}\\n' > /etc/systemd/system/{unit}.d/weaken.conf\n"
        ));
        want.insert((unit.to_owned(), prop.to_owned()));
        units.push(unit);
    }
    script.push_str(&format!(
        "systemctl daemon-reload\nsystemctl restart {}\n",
        units.join(" ")
    ));
    let result = (|| {
        c.sh_ok(&script, 120 * SEC)?;
        wait_active(c, &units)?;
        let (out, _, failing) = doctor_failures(c)?;
        if out.ok() {
            return Err("doctor exited 0 with weakened units".to_owned());
        }
        if failing != want {
            return Err(format!("doctor failed {failing:?}, want exactly {want:?}"));
        }
        // The human output names each by unit and property.
        let human = c.sh("airlockctl doctor", 180 * SEC)?;
        for (u, p) in &want {
            if !human
                .stdout
                .lines()
                .any(|l| l.starts_with("FAIL") && l.contains(&format!("{u} {p} ")))
            {
                return Err(format!(
                    "the human output does not name {u} {p}:\n{}",
                    crate::tail(&human.stdout, 30)
                ));
            }
        }
        Ok(format!(
            "{} ({}): {}",
            out.describe(),
            human.describe(),
            want.iter()
                .map(|(u, p)| format!("{u} {p}"))
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })();
    // Whatever happened, the drop-ins go.
    let mut restore = String::from("rm -rf");
    for u in &units {
        restore.push_str(&format!(" /etc/systemd/system/{u}.d/weaken.conf"));
    }
    restore.push_str(&format!(
        "\nsystemctl daemon-reload\nsystemctl restart {}\n",
        units.join(" ")
    ));
    let restored = c
        .sh_ok(&restore, 120 * SEC)
        .and_then(|_| wait_active(c, &units));
    let detail = result?;
    restored?;
    let (out, _, failing) = doctor_failures(c)?;
    if !out.ok() || !failing.is_empty() {
        return Err(format!(
            "without the drop-ins doctor still fails ({}): {failing:?}",
            out.describe()
        ));
    }
    Ok(format!("with the drop-ins {detail}; without them exit 0"))
}

fn wait_active(c: &Container, units: &[&str]) -> Result<(), String> {
    let deadline = Instant::now() + 60 * SEC;
    loop {
        let out = c.sh(
            &format!("systemctl is-active {}", units.join(" ")),
            30 * SEC,
        )?;
        if out.stdout.lines().all(|l| l == "active") && out.stdout.lines().count() == units.len() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("not active: {}", out.both()));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Builds the worker with its `fault-injection` feature for the testbed
/// only (the package is built without it): `cargo build --profile pkg-dev
/// -p airlock-worker --features fault-injection`, copied out of the
/// profile directory at once.
pub fn fault_worker(target_dir: &Path) -> Result<PathBuf, String> {
    let out = crate::run(
        Command::new("cargo")
            .current_dir(workspace_root())
            .args([
                "build",
                "--profile",
                "pkg-dev",
                "-p",
                "airlock-worker",
                "--bin",
                "airlock-worker",
                "--features",
                "fault-injection",
            ])
            .env("CARGO_TARGET_DIR", target_dir)
            .env("CARGO_TERM_COLOR", "never"),
        None,
        Duration::from_secs(30 * 60),
    )?
    .expect_ok("cargo build airlock-worker --features fault-injection")?;
    let _ = out;
    let dir = target_dir.join("testbed/fault");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let dest = dir.join("airlock-worker-fault");
    std::fs::copy(target_dir.join("pkg-dev/airlock-worker"), &dest)
        .map_err(|e| format!("copying the fault build: {e}"))?;
    Ok(dest)
}

const FAULT_BIN: &str = "/usr/local/libexec/airlock-testbed/airlock-worker-fault";
const FAULT_DROP_IN: &str = "/etc/systemd/system/airlock-worker.service.d/fault.conf";
const WEDGE_ENV: &str = "/run/airlock-testbed/wedge.env";

fn worker_state(c: &Container) -> Result<(String, u64), String> {
    let out = c.sh_ok(
        "systemctl show -p MainPID -p NRestarts airlock-worker.service",
        10 * SEC,
    )?;
    let get = |k: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .unwrap_or("")
            .to_owned()
    };
    Ok((get("MainPID"), get("NRestarts").parse().unwrap_or(0)))
}

/// systemd restarts a worker whose attempt thread is wedged: the worker
/// built with `fault-injection` (installed only in this root, by a drop-in
/// `ExecStart=`) blocks its attempt thread after `workspace_prepared`
/// (`AIRLOCK_FAULT_WEDGE_AT`, from an environment file removed once the
/// wedge shows, so the restarted worker runs normally); its watchdog pings
/// stop, the unit's `WatchdogSec=` (as shipped) expires, systemd kills and
/// restarts it, and the task ends.
pub fn watchdog_restarts_a_wedged_worker(
    c: &Container,
    fault_build: &Path,
    submit: impl Fn(&str) -> Result<(), String>,
    settle: impl Fn(&str) -> Result<Value, String>,
) -> Result<String, String> {
    // The packaged worker has no such switch; the fault build has.
    let packaged = c.sh(
        "grep -c AIRLOCK_FAULT_WEDGE_AT /usr/bin/airlock-worker",
        30 * SEC,
    )?;
    if packaged.stdout.trim() != "0" {
        return Err(format!(
            "the packaged worker mentions AIRLOCK_FAULT_WEDGE_AT: {}",
            packaged.both()
        ));
    }
    let inside = PathBuf::from(format!("/proc/{}/root{FAULT_BIN}", c.leader()));
    if let Some(dir) = inside.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    std::fs::copy(fault_build, &inside).map_err(|e| format!("{}: {e}", inside.display()))?;
    c.sh_ok(
        &format!(
            "set -e\nchmod 0755 {FAULT_BIN}\ngrep -q AIRLOCK_FAULT_WEDGE_AT {FAULT_BIN}\nmkdir -p /run/airlock-testbed /etc/systemd/system/airlock-worker.service.d\n\
             printf 'AIRLOCK_FAULT_WEDGE_AT=workspace_prepared\\n' > {WEDGE_ENV}\n\
             printf '[Service]\\nExecStart=\\nExecStart={FAULT_BIN} --config /etc/airlock/airlock.toml\\nEnvironmentFile=-{WEDGE_ENV}\\n' > {FAULT_DROP_IN}\n\
             systemctl daemon-reload\nsystemctl restart airlock-worker.service\n"
        ),
        120 * SEC,
    )?;
    let result = (|| {
        wait_active(c, &["airlock-worker.service"])?;
        let watchdog = c.sh_ok(
            "systemctl show -p WatchdogUSec --value airlock-worker.service",
            10 * SEC,
        )?;
        // While the fault build runs, doctor names the changed command.
        let (_, _, failing) = doctor_failures(c)?;
        let exec = ("airlock-worker.service".to_owned(), "ExecStart".to_owned());
        if failing != BTreeSet::from([exec]) {
            return Err(format!(
                "doctor with the fault build in place fails {failing:?}, want exactly airlock-worker.service ExecStart"
            ));
        }
        let (pid, restarts) = worker_state(c)?;
        let since = c
            .sh_ok("date '+%Y-%m-%d %H:%M:%S'", 10 * SEC)?
            .trim()
            .to_owned();
        let t = Instant::now();
        submit("tb-wedge")?;
        let wedged = "fault injection: wedged after workspace_prepared task tb-wedge";
        wait_journal(c, &since, wedged, 180 * SEC)?;
        let wedged_at = t.elapsed();
        // The next worker must not wedge again.
        c.sh_ok(&format!("rm -f {WEDGE_ENV}"), 10 * SEC)?;
        wait_journal(c, &since, "Watchdog timeout", 300 * SEC)?;
        let timeout_at = t.elapsed();
        let deadline = Instant::now() + 120 * SEC;
        let (new_pid, new_restarts) = loop {
            let (p, n) = worker_state(c)?;
            if n > restarts && p != pid && p != "0" {
                break (p, n);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "no restart: MainPID {p} (was {pid}), NRestarts {n} (was {restarts})"
                ));
            }
            std::thread::sleep(Duration::from_millis(500));
        };
        let task = settle("tb-wedge")?;
        let state = task["state"].as_str().unwrap_or("?").to_owned();
        let code = task["result"]["failure_code"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        if state != "SUCCEEDED" && (state != "FAILED" || code.is_empty() || code == "LEASE_EXPIRED")
        {
            return Err(format!("tb-wedge ended {state} {code}: {task}"));
        }
        Ok(format!(
            "WatchdogUSec={}; wedged {:.0} s after submission, \"Watchdog timeout\" at {:.0} s; MainPID {pid} -> {new_pid}, NRestarts {restarts} -> {new_restarts}; tb-wedge {state}{}",
            watchdog.trim(),
            wedged_at.as_secs_f64(),
            timeout_at.as_secs_f64(),
            if code.is_empty() {
                String::new()
            } else {
                format!(" {code}")
            }
        ))
    })();
    let restored = c
        .sh_ok(
            &format!(
                "rm -f {FAULT_DROP_IN} {WEDGE_ENV} {FAULT_BIN}\nsystemctl daemon-reload\nsystemctl restart airlock-worker.service\nsystemctl show -p ExecStart --value airlock-worker.service"
            ),
            120 * SEC,
        )
        .and_then(|exec| {
            wait_active(c, &["airlock-worker.service"])?;
            if exec.contains("argv[]=/usr/bin/airlock-worker ") {
                Ok(())
            } else {
                Err(format!("the worker runs {exec} after the drop-in went"))
            }
        });
    let detail = result?;
    restored?;
    Ok(format!("{detail}; the packaged worker back"))
}

/// Waits for `needle` in the worker unit's journal (messages from its
/// process and systemd's about it) since `since`.
fn wait_journal(c: &Container, since: &str, needle: &str, limit: Duration) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    loop {
        let out = c.sh(
            &format!("journalctl --no-pager -o cat -u airlock-worker.service --since '{since}'"),
            30 * SEC,
        )?;
        if out.stdout.contains(needle) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "no {needle:?} in the worker's journal within {limit:?}:\n{}",
                crate::tail(&out.stdout, 30)
            ));
        }
        std::thread::sleep(SEC);
    }
}

/// Issue 12's testbed bullet, for a running agent instance (`unit`, e.g.
/// `airlock-agent@fixer.service`): a drop-in `NoNewPrivileges=no` and
/// `RestrictAddressFamilies=` on it, daemon-reload (no restart: the
/// supervisor's restart policy stays out of it; doctor reads the loaded
/// unit) → doctor exits non-zero and fails exactly those two properties
/// of that unit; the drop-in removed and reloaded → doctor passes.
pub fn doctor_names_a_weakened_agent(c: &Container, unit: &str) -> Result<String, String> {
    let dir = format!("/etc/systemd/system/{unit}.d");
    c.sh_ok(
        &format!(
            "set -e\nsystemctl is-active {unit}\nmkdir -p {dir}\nprintf '[Service]\\nNoNewPrivileges=no\\nRestrictAddressFamilies=\\n' > {dir}/weaken.conf\nsystemctl daemon-reload\n"
        ),
        60 * SEC,
    )?;
    let weakened = doctor_failures(c);
    c.sh_ok(
        &format!("rm -f {dir}/weaken.conf\nsystemctl daemon-reload\n"),
        60 * SEC,
    )?;
    let (out, _, failing) = weakened?;
    let want: Failing = ["NoNewPrivileges", "RestrictAddressFamilies"]
        .iter()
        .map(|p| (unit.to_owned(), (*p).to_owned()))
        .collect();
    if out.ok() || failing != want {
        return Err(format!(
            "doctor ({}) failed {failing:?}, want exactly {want:?}",
            out.describe()
        ));
    }
    let (after, _, failing) = doctor_failures(c)?;
    if !after.ok() || !failing.is_empty() {
        return Err(format!(
            "without the drop-in doctor ({}) fails {failing:?}",
            after.describe()
        ));
    }
    Ok(format!(
        "with the drop-in {}: {unit} NoNewPrivileges, {unit} RestrictAddressFamilies; without it exit 0",
        out.describe()
    ))
}

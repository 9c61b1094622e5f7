//! The installation: `apt-get install` in the fresh root, what the
//! postinst leaves, every unit started, verified and documented, the live
//! and offline exposure, the repository the later checks use.

use super::confinement::{
    EXISTS_PY, PROBE_MARKER, PROBE_PATHS_PY, PROBE_REPORT_PY, SECRETS, TEST_PROBE_PY,
};
use super::status::{PROCS_PY, all_active};
use super::tasks::{MKTASK_PY, RETRY_PY};
use super::{ALL_UNITS, SEC, SERVICES, STARTED_BY_TARGET, USERS, json, q};
use crate::units::{self, max_exposure};
use crate::{Container, Report, tail, workspace_root};
use std::fs;

/// The installation and what it must leave: the package installed, its
/// users, directories and secrets, every unit started, verified and
/// documented, the exposure within its limits. False when the package did
/// not install (nothing after it could mean anything).
pub(super) fn checks(r: &mut Report, c: &Container, deb: &str) -> bool {
    let installed = r.check(&format!("apt-get install {deb}"), |_| apt_install(c, deb));
    if installed.is_none() {
        return false;
    }
    r.check(
        "postinst: users, directories (tmpfiles), secrets, target enabled",
        |_| after_install(c),
    );
    r.check(
        "started on install: target, services and socket active",
        |_| started_on_install(c),
    );
    r.check(
        "retryd: socket activation, LoadCredential token, env file",
        |_| retryd_activation(c),
    );
    r.check(
        "systemd-analyze verify in the booted root: no output",
        |_| verify_in_root(c),
    );
    r.check("Documentation= of every unit is installed", |_| {
        documentation_installed(c)
    });
    r.set_group("hardening exposure");
    r.check(
        "systemd-analyze security: live and offline within EXPOSURE_LIMITS (README.md's figures)",
        |_| exposure(c),
    );
    r.set_group("install");
    true
}

/// The helper programs the checks run in the container, under /tmp/tb.
fn write_helpers(c: &Container) -> Result<(), String> {
    c.write("/tmp/tb/mktask.py", MKTASK_PY)?;
    c.write("/tmp/tb/procs.py", PROCS_PY)?;
    c.write("/tmp/tb/retry.py", RETRY_PY)?;
    c.write("/tmp/tb/health.py", HEALTH_PY)?;
    c.write("/tmp/tb/probe_paths.py", PROBE_PATHS_PY)?;
    let secrets = serde_json::to_string(SECRETS).map_err(|e| e.to_string())?;
    c.write(
        "/tmp/tb/test_probe.py",
        &TEST_PROBE_PY
            .replace("__SECRETS__", &secrets)
            .replace("__MARKER__", PROBE_MARKER),
    )?;
    c.write("/tmp/tb/probe_report.py", PROBE_REPORT_PY)?;
    c.write("/tmp/tb/exists.py", EXISTS_PY)?;
    c.sh_ok("chmod 755 /tmp/tb && chmod 644 /tmp/tb/*", 10 * SEC)
        .map(|_| ())
}

/// `apt-get install` of the .deb in the fresh root (no network).
fn apt_install(c: &Container, deb: &str) -> Result<String, String> {
    write_helpers(c)?;
    if c.sh("getent passwd airlock", 10 * SEC)?.ok() {
        return Err("the fresh root already has an airlock user".into());
    }
    let out = c.sh(
        &format!("apt-get install -y --no-install-recommends {deb}"),
        300 * SEC,
    )?;
    let out = out.expect_ok("apt-get install")?;
    Ok(tail(&out.stdout, 1))
}

/// The target, the services and the socket active, none restarted.
fn started_on_install(c: &Container) -> Result<String, String> {
    std::thread::sleep(SEC);
    let active = all_active(c, STARTED_BY_TARGET)?;
    let restarts = c.sh_ok(
        "systemctl show -p NRestarts --value airlock-supervisor.service airlock-worker.service airlock-executor.service",
        10 * SEC,
    )?;
    // One value per unit, separated by blank lines.
    if restarts.split_whitespace().any(|n| n != "0") {
        return Err(format!("services restarted: {restarts}"));
    }
    Ok(format!("{active}, no restarts"))
}

/// airlock-retryd started by its socket, answering `GET /health`.
fn retryd_activation(c: &Container) -> Result<String, String> {
    let health = json(&c.sh_ok("python3 /tmp/tb/health.py", 60 * SEC)?)?;
    if health["status"] != 200 {
        return Err(format!("/health: {health}"));
    }
    all_active(c, &["airlock-retryd.service"])?;
    Ok("GET /health 200; airlock-retryd.service active".to_owned())
}

/// `systemd-analyze verify` of every unit in the booted root prints nothing.
fn verify_in_root(c: &Container) -> Result<String, String> {
    let out = c.sh(
        &format!(
            "systemd-analyze verify --man=no {} 2>&1",
            ALL_UNITS.join(" ")
        ),
        120 * SEC,
    )?;
    if out.ok() && out.both().trim().is_empty() {
        Ok(format!("{} units, nothing printed", ALL_UNITS.len()))
    } else {
        Err(format!(
            "systemd-analyze verify ({}):\n{}",
            out.describe(),
            out.both()
        ))
    }
}

/// Every `Documentation=` of every unit (a man page or a file) is installed.
fn documentation_installed(c: &Container) -> Result<String, String> {
    let mut missing = Vec::new();
    let mut n = 0;
    for unit in ALL_UNITS {
        let docs = c.sh_ok(
            &format!("systemctl show -p Documentation --value {unit}"),
            10 * SEC,
        )?;
        for doc in docs.split_whitespace() {
            n += 1;
            let path = if let Some(man) = doc.strip_prefix("man:") {
                let (name, section) = man
                    .trim_end_matches(')')
                    .split_once('(')
                    .ok_or_else(|| format!("{unit}: {doc}"))?;
                format!("/usr/share/man/man{section}/{name}.{section}.gz")
            } else if let Some(file) = doc.strip_prefix("file:") {
                file.to_owned()
            } else {
                continue;
            };
            if !c.sh(&format!("test -f {}", q(&path)), 10 * SEC)?.ok() {
                missing.push(format!("{unit}: {doc} ({path})"));
            }
        }
    }
    if missing.is_empty() {
        Ok(format!("{n} references, all installed"))
    } else {
        Err(missing.join("\n"))
    }
}

const HEALTH_PY: &str = r#"
import json, urllib.request
with urllib.request.urlopen("http://127.0.0.1:8941/health", timeout=20) as r:
    print(json.dumps({"status": r.status, "body": json.loads(r.read())}))
"#;

pub(super) fn after_install(c: &Container) -> Result<String, String> {
    let mut problems = Vec::new();
    for user in USERS {
        if !c.sh(&format!("getent passwd {user}"), 10 * SEC)?.ok() {
            problems.push(format!("user {user} missing"));
        }
    }
    for group in ["airlock-exchange"] {
        if !c.sh(&format!("getent group {group}"), 10 * SEC)?.ok() {
            problems.push(format!("group {group} missing"));
        }
    }
    // Every line of tmpfiles.d/airlock.conf, as systemd-tmpfiles left it.
    let tmpfiles = fs::read_to_string(workspace_root().join("tmpfiles/airlock.conf"))
        .map_err(|e| e.to_string())?;
    let mut n = 0;
    for line in tmpfiles.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        let [kind, path, mode, user, group, ..] = f[..] else {
            return Err(format!("tmpfiles line {line:?}"));
        };
        n += 1;
        if kind == "z" {
            // An adjustment of files that may or may not exist yet (the
            // supervisor creates the task database): every match, if any.
            let st = c.sh(
                &format!(
                    "for f in {path}; do [ -e \"$f\" ] && stat -c '%n|%a|%U|%G' \"$f\"; done; true"
                ),
                10 * SEC,
            )?;
            for got in st.stdout.lines() {
                if !got.ends_with(&format!("|{}|{user}|{group}", mode.trim_start_matches('0'))) {
                    problems.push(format!("{got} (tmpfiles.d: z {mode} {user} {group})"));
                }
            }
            continue;
        }
        let st = c.sh(&format!("stat -c '%F|%a|%U|%G' {}", q(path)), 10 * SEC)?;
        if !st.ok() {
            problems.push(format!("{path} missing"));
            continue;
        }
        let got: Vec<&str> = st.stdout.trim().split('|').collect();
        let want_kind = if kind == "d" { "directory" } else { "regular" };
        let want_mode = u32::from_str_radix(mode, 8).unwrap_or(0);
        let got_mode = u32::from_str_radix(got.get(1).unwrap_or(&""), 8).unwrap_or(u32::MAX);
        if !got[0].starts_with(want_kind)
            || got_mode != want_mode
            || got.get(2) != Some(&user)
            || got.get(3) != Some(&group)
        {
            problems.push(format!(
                "{path}: {} (tmpfiles.d: {kind} {mode} {user} {group})",
                st.stdout.trim()
            ));
        }
    }
    let token = c.sh_ok(
        "stat -c '%a %U %G' /etc/airlock/retry-control.token && cat /etc/airlock/retry-control.token",
        10 * SEC,
    )?;
    let mut lines = token.lines();
    let mode = lines.next().unwrap_or("");
    let value = lines.next().unwrap_or("");
    if mode != "600 root root"
        || value.len() != 48
        || !value.chars().all(|ch| ch.is_ascii_alphanumeric())
    {
        problems.push(format!(
            "retry-control.token: {mode}, {} characters",
            value.len()
        ));
    }
    let env = c.sh_ok(
        "stat -c '%a %U' /etc/airlock/retryd.env && grep '^AIRLOCK_RETRY_AUTHORIZATION_ID=' /etc/airlock/retryd.env",
        10 * SEC,
    )?;
    if !env.starts_with("600 root\nAIRLOCK_RETRY_AUTHORIZATION_ID=owner-") {
        problems.push(format!("retryd.env: {}", env.lines().next().unwrap_or("")));
    }
    let enabled = c.sh("systemctl is-enabled airlock.target", 10 * SEC)?;
    if enabled.stdout.trim() != "enabled" {
        problems.push(format!("airlock.target is {}", enabled.stdout.trim()));
    }
    if problems.is_empty() {
        Ok(format!(
            "{} users, {n} tmpfiles entries as declared, token 600 root (48 chars), retryd.env, target enabled",
            USERS.len()
        ))
    } else {
        Err(problems.join("\n"))
    }
}

/// `systemd-analyze security` of each live service in the booted root and
/// `--offline=true` of its file in units/, against its limit in
/// [`units::EXPOSURE_LIMITS`] (which README.md quotes).
fn exposure(c: &Container) -> Result<String, String> {
    let mut figures = Vec::new();
    let mut bad = Vec::new();
    let files = units::unit_files()?;
    for unit in SERVICES {
        if max_exposure(unit).is_none() {
            bad.push(format!("{unit}: no limit in EXPOSURE_LIMITS"));
        }
    }
    for limit in units::EXPOSURE_LIMITS {
        let unit = limit.unit;
        let live = c.sh(
            &format!("SYSTEMD_COLORS=0 systemd-analyze security --no-pager {unit}"),
            60 * SEC,
        )?;
        let live_exposure = units::parse_exposure(&live.stdout)
            .ok_or_else(|| format!("{unit}: {}", live.both()))?;
        let file = files
            .iter()
            .find(|f| f.name == unit)
            .ok_or_else(|| format!("units/{unit} is missing"))?;
        let (offline, findings) = units::offline_exposure(file)?;
        let short = unit
            .trim_start_matches("airlock-")
            .trim_end_matches(".service");
        figures.push(format!(
            "{short} {live_exposure:.1}/{offline:.1} (limits {:.1}/{:.1})",
            limit.live, limit.offline
        ));
        if live_exposure > limit.live || offline > limit.offline {
            let live_findings: Vec<&str> =
                live.stdout.lines().filter(|l| l.starts_with('✗')).collect();
            bad.push(format!(
                "{unit}: live {live_exposure} (limit {}), offline {offline} (limit {})\nlive:\n{}\noffline:\n{findings}",
                limit.live,
                limit.offline,
                live_findings.join("\n")
            ));
        }
    }
    if bad.is_empty() {
        Ok(format!("live/offline: {}", figures.join(", ")))
    } else {
        Err(format!("{}\n{}", figures.join(", "), bad.join("\n")))
    }
}

/// The `[[repository]]` table that registers calc.git, as an
/// administrator appends it to airlock.toml.
pub(super) const CALC_TABLE: &str = r#"
[[repository]]
name = "calc"
path = "/srv/airlock/calc.git"
description = "testbed repository"
"#;

pub(super) fn setup_repository(c: &Container) -> Result<String, String> {
    let script = format!(
        r#"set -e
work=$(mktemp -d)
cd "$work"
printf 'def add(a, b):\n    return a - b\n' > calc.py
cat > test_calc.py <<'PY'
import unittest

from calc import add


class AddTest(unittest.TestCase):
    def test_adds(self):
        self.assertEqual(add(2, 3), 5)


if __name__ == "__main__":
    unittest.main()
PY
git init -q -b main .
git add -A
git -c user.name=admin -c user.email=admin@testbed.invalid commit -q -m 'calc: add two numbers'
git clone -q --bare "$work" /srv/airlock/calc.git
chown -R airlock-worker:airlock-worker /srv/airlock/calc.git
rm -rf "$work"
cat >> /etc/airlock/airlock.toml <<'TOML'
{CALC_TABLE}TOML
systemctl restart airlock.target
git -c safe.directory='*' -C /srv/airlock/calc.git rev-parse main
"#
    );
    let base = c.sh_ok(&script, 120 * SEC)?;
    all_active(c, STARTED_BY_TARGET)?;
    Ok(format!("calc.git at {}", base.trim()))
}

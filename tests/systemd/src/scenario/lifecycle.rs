//! The package's life cycle: stop and start (by hand and by the bus),
//! reinstall and upgrade keeping state, remove, purge, install again.

use super::install::CALC_TABLE;
use super::status::{
    all_active, expect_paths, main_pids, no_airlock_process, states, tasks, wait_state,
};
use super::{ALL_UNITS, REPO, SEC, STARTED_BY_TARGET, USERS, file_name};
use crate::{Container, Report, tail};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

/// The package's life after installation: stopped and started (by hand
/// and by the bus), reinstalled, upgraded, removed, purged, installed
/// again, and upgraded to from the previous release, whose airlock.toml
/// the administrator edited.
pub(super) fn checks(
    r: &mut Report,
    c: &Container,
    deb: &str,
    upgrade: Option<&Path>,
    previous: Option<&Path>,
) {
    r.check(
        "systemctl stop airlock.target leaves no airlock process",
        |_| stop_target(c),
    );
    r.check(
        "D-Bus activation: a call starts the stopped supervisor",
        |_| bus_activation(c),
    );
    r.check("systemctl start airlock.target", |_| start_target(c));
    r.check(
        "reinstall keeps tasks, config, secrets; restarts services",
        |_| reinstall(c, &format!("apt-get install -y --reinstall {deb}")),
    );
    match upgrade {
        Some(up) => {
            let up = format!("/debs/{}", file_name(up));
            r.check(
                "upgrade keeps tasks, config, secrets; restarts services",
                |_| upgrade_to(c, &up),
            );
        }
        None => r.skip(&["upgrade"], "no upgrade package"),
    }
    r.check(
        "postinst's restart with airlock-retryd running, 6 times: the retry API's socket listens after each (systemd 257 may fail to listen again; postinst starts it once more)",
        |_| restarts_keep_the_retry_socket(c),
    );
    r.check("remove: stopped, state and configuration kept", |_| {
        remove(c)
    });
    r.check("purge: state removed; repositories and users kept", |_| {
        purge(c)
    });
    r.check("install after purge: fresh secrets, started again", |_| {
        install_after_purge(c, deb)
    });
    r.set_group("upgrade from the previous release");
    match previous {
        Some(p) => {
            let p = format!("/debs/{}", file_name(p));
            r.check(
                "upgrade from the previous release with an edited airlock.toml, without a terminal or --force-conf*: nothing prompts, tasks and secrets kept, its settings move into airlock.toml.d/ once and hold; purge takes them",
                |_| upgrade_from_previous(c, &p, deb),
            );
        }
        None => r.skip(
            &["upgrade from the previous release"],
            "no package of the previous release",
        ),
    }
}

/// A task `id` (calc fixed, its tests run) submitted and SUCCEEDED
/// without a decision: the supervisor's `auto_accept` holds.
fn accepted_without_a_decision(c: &Container, id: &str) -> Result<Value, String> {
    c.sh_ok(
        &format!(
            "python3 /tmp/tb/mktask.py {id} fix 2 /tmp/tb/{id}.json && airlockctl --json submit /tmp/tb/{id}.json"
        ),
        60 * SEC,
    )?;
    let task = wait_state(c, id, &["SUCCEEDED", "FAILED", "VERIFYING"], 180 * SEC)?;
    if task["state"] != "SUCCEEDED" {
        return Err(format!("{id} ended {}: {}", task["state"], task["result"]));
    }
    Ok(task)
}

/// An administrator on the previous release (installed fresh), who
/// registered the repository and changed a setting the way that release
/// documented, in /etc/airlock/airlock.toml, and ran a task; then `dpkg -i`
/// of this package with no terminal and no `--force-conf*`.
fn upgrade_from_previous(c: &Container, previous: &str, deb: &str) -> Result<String, String> {
    c.sh_ok(
        &format!(
            "apt-get purge -y airlock && apt-get install -y --no-install-recommends {previous}"
        ),
        600 * SEC,
    )?;
    c.sh_ok(
        &format!(
            r#"set -e
sed -i 's/^auto_accept = false$/auto_accept = true/' /etc/airlock/airlock.toml
grep -qx 'auto_accept = true' /etc/airlock/airlock.toml
cat >> /etc/airlock/airlock.toml <<'TOML'
{CALC_TABLE}TOML
systemctl restart airlock.target"#
        ),
        120 * SEC,
    )?;
    all_active(c, STARTED_BY_TARGET)?;
    // A task under the previous release (auto_accept: no decision).
    let before = accepted_without_a_decision(c, "tb-before-upgrade")?;
    let secrets = "sha256sum /etc/airlock/retry-control.token /etc/airlock/retryd.env";
    let secrets_before = c.sh_ok(secrets, 10 * SEC)?;
    let edited = c.sh_ok("sha256sum < /etc/airlock/airlock.toml", 10 * SEC)?;
    let out = c.sh(&format!("dpkg -i {deb} </dev/null"), 600 * SEC)?;
    let said = out.both();
    if !out.ok() || said.contains("conffile prompt") || said.contains("Configuration file '") {
        return Err(format!("dpkg -i stopped or asked:\n{}", tail(&said, 20)));
    }
    let status = c.sh_ok("dpkg-query -W -f '${Status} ${Version}' airlock", 10 * SEC)?;
    if !status.starts_with("install ok installed ") || status.contains("~previous") {
        return Err(format!("dpkg status after the upgrade: {status}"));
    }
    let settings = c.sh_ok(
        "grep -v -e '^[[:space:]]*#' -e '^[[:space:]]*$' /etc/airlock/airlock.toml || true",
        10 * SEC,
    )?;
    if !settings.trim().is_empty() {
        return Err(format!("the installed airlock.toml sets:\n{settings}"));
    }
    let kept = c.sh_ok("sha256sum < /etc/airlock/airlock.toml.dpkg-old", 10 * SEC)?;
    if kept != edited {
        return Err("airlock.toml.dpkg-old is not the edited file".into());
    }
    let drop_ins = c.sh_ok("ls /etc/airlock/airlock.toml.d", 10 * SEC)?;
    let drop_in = c.sh_ok("cat /etc/airlock/airlock.toml.d/*.toml", 10 * SEC)?;
    if drop_ins.lines().count() != 1
        || !drop_in.contains("auto_accept = true")
        || !drop_in.contains("name = \"calc\"")
        || drop_in.contains("lease_seconds")
    {
        return Err(format!("airlock.toml.d/ holds {drop_ins:?}:\n{drop_in}"));
    }
    if c.sh("test -e /var/lib/airlock/airlock.toml.migrate", 10 * SEC)?
        .ok()
    {
        return Err("the migration marker is still there".into());
    }
    all_active(c, STARTED_BY_TARGET)?;
    // What the previous release had is kept: its task, with its commit on
    // its branch, and the secrets.
    let after = wait_state(c, "tb-before-upgrade", &["SUCCEEDED"], 30 * SEC)?;
    let commit = after["result"]["commit_oid"].as_str().unwrap_or_default();
    let head = c.sh_ok(
        &format!(
            "git -c safe.directory='*' -C {REPO} rev-parse refs/heads/agent/tb-before-upgrade"
        ),
        30 * SEC,
    )?;
    if commit.is_empty() || head.trim() != commit || commit != before["result"]["commit_oid"] {
        return Err(format!(
            "tb-before-upgrade after the upgrade: {after}; branch at {head}"
        ));
    }
    if c.sh_ok(secrets, 10 * SEC)? != secrets_before {
        return Err("the secrets changed in the upgrade".into());
    }
    // The settings hold: calc is registered, and a task that passes its
    // verification succeeds without a decision (auto_accept).
    let repos = c.sh_ok("airlockctl --json repo list", 30 * SEC)?;
    if !repos.contains("\"calc\"") {
        return Err(format!("repo list after the upgrade: {repos}"));
    }
    let supervisor = c.sh_ok("airlockctl --json status", 30 * SEC)?;
    if !supervisor.contains("\"auto_accept\":true") {
        return Err(format!("status after the upgrade: {supervisor}"));
    }
    accepted_without_a_decision(c, "tb-after-migration")?;
    // retryd is socket-activated and has had no connection since the
    // upgrade; started, doctor checks its hardening too.
    c.sh_ok("systemctl start airlock-retryd.service", 60 * SEC)?;
    super::doctor::doctor(c)?;
    // Once: a reinstall moves nothing again.
    c.sh_ok(
        &format!("apt-get install -y --reinstall {deb} </dev/null"),
        600 * SEC,
    )?;
    let again = c.sh_ok("ls /etc/airlock/airlock.toml.d", 10 * SEC)?;
    if again != drop_ins {
        return Err(format!("after a reinstall airlock.toml.d/ holds {again:?}"));
    }
    all_active(c, STARTED_BY_TARGET)?;
    // purge takes the administrator's drop-ins and the kept file with it.
    c.sh_ok("apt-get purge -y airlock", 300 * SEC)?;
    expect_paths(c, &[REPO], &["/etc/airlock"])?;
    Ok(format!(
        "no prompt; {} key lines moved into airlock.toml.d/{}; edited file kept as airlock.toml.dpkg-old; the previous release's task and secrets kept; a new task SUCCEEDED without a decision; doctor clean; purge removed /etc/airlock with them",
        drop_in.lines().filter(|l| l.contains(" = ")).count(),
        drop_ins.trim()
    ))
}

/// A call on the bus starts the stopped supervisor.
fn bus_activation(c: &Container) -> Result<String, String> {
    // airlockctl does not ask the bus to start the supervisor (it says
    // "not running"); any other client does, through the activation
    // file and systemd. busctl auto-starts by default.
    c.sh_ok(
        "busctl --system call org.airlock.Supervisor1 /org/airlock/Supervisor1 org.freedesktop.DBus.Peer Ping",
        60 * SEC,
    )?;
    all_active(c, &["airlock-supervisor.service"])?;
    Ok("airlock-supervisor.service started by the bus (SystemdService=)".to_owned())
}

/// `systemctl start airlock.target` starts everything again.
fn start_target(c: &Container) -> Result<String, String> {
    c.sh_ok("systemctl start airlock.target", 120 * SEC)?;
    all_active(c, STARTED_BY_TARGET)
}

/// The upgrade to `up` (the same package as `+testbed1`) keeps what a
/// reinstall keeps.
fn upgrade_to(c: &Container, up: &str) -> Result<String, String> {
    let detail = reinstall(c, &format!("apt-get install -y {up}"))?;
    let version = c.sh_ok("dpkg-query -W -f '${Version}' airlock", 10 * SEC)?;
    if !version.ends_with("+testbed1") {
        return Err(format!("installed version {version}"));
    }
    Ok(format!("{detail}; now {version}"))
}

/// The installed postinst's upgrade path (`configure <version>`: its
/// restart of airlock.target) run 6 times, each with airlock-retryd
/// running (started through its socket, as any request to the retry API
/// does): afterwards the socket is active and `/health` answers. systemd
/// 257 (Debian 13) may fail to listen again on the restart ("Address
/// already in use": a helper it forks while the other units stop holds a
/// copy of the old socket for a moment; about one restart in ten there);
/// postinst then starts the socket once more. How often that happened is
/// in the detail.
fn restarts_keep_the_retry_socket(c: &Container) -> Result<String, String> {
    let since = c
        .sh_ok("date '+%Y-%m-%d %H:%M:%S'", 10 * SEC)?
        .trim()
        .to_owned();
    let version = c.sh_ok("dpkg-query -W -f '${Version}' airlock", 10 * SEC)?;
    for i in 1..=6 {
        c.sh_ok("python3 /tmp/tb/health.py", 60 * SEC)?;
        all_active(c, &["airlock-retryd.service"])?;
        let out = c.sh(
            &format!(
                "/var/lib/dpkg/info/airlock.postinst configure {} </dev/null",
                version.trim()
            ),
            300 * SEC,
        )?;
        let out = out.expect_ok("postinst configure")?;
        let state = c.sh("systemctl is-active airlock-retryd.socket", 10 * SEC)?;
        if state.stdout.trim() != "active" {
            let journal = c
                .sh(
                    &format!(
                        "journalctl --no-pager -u airlock-retryd.socket -u airlock-retryd.service --since '{since}' | tail -n 15"
                    ),
                    30 * SEC,
                )
                .map(|o| o.both())
                .unwrap_or_default();
            return Err(format!(
                "after postinst's restart {i}: airlock-retryd.socket is {}\n{}\n{journal}",
                state.stdout.trim(),
                tail(&out.both(), 5)
            ));
        }
        c.sh_ok("python3 /tmp/tb/health.py", 60 * SEC)?;
        all_active(c, STARTED_BY_TARGET)?;
        // systemd refuses a sixth start of retryd within 10 s.
        std::thread::sleep(2 * SEC);
    }
    let raced = c.sh_ok(
        &format!(
            "journalctl --no-pager -u airlock-retryd.socket --since '{since}' | grep -c 'Address already in use' || true"
        ),
        30 * SEC,
    )?;
    Ok(format!(
        "6 restarts by postinst with airlock-retryd running: the socket listened after each, /health answered; systemd failed to listen again {} times, and postinst started the socket once more",
        raced.trim()
    ))
}

/// `apt-get remove`: stopped, state and configuration kept.
fn remove(c: &Container) -> Result<String, String> {
    c.sh_ok("apt-get remove -y airlock", 300 * SEC)?;
    no_airlock_process(c)?;
    let status = c.sh_ok("dpkg-query -W -f '${Status}' airlock", 10 * SEC)?;
    if status.trim() != "deinstall ok config-files" {
        return Err(format!("dpkg status {status:?}"));
    }
    expect_paths(
        c,
        &[
            "/var/lib/airlock/tasks.sqlite3",
            "/var/lib/airlock-worker/checkpoints.sqlite3",
            "/var/spool/airlock",
            "/etc/airlock/airlock.toml",
            "/etc/airlock/retry-control.token",
            "/etc/airlock/retryd.env",
        ],
        &[
            "/usr/bin/airlock-supervisor",
            "/usr/lib/systemd/system/airlock.target",
        ],
    )?;
    Ok(format!("dpkg: {status}"))
}

/// `apt-get purge`: state removed; repositories and users kept.
fn purge(c: &Container) -> Result<String, String> {
    c.sh_ok("apt-get purge -y airlock", 300 * SEC)?;
    no_airlock_process(c)?;
    expect_paths(
        c,
        &[REPO],
        &[
            "/var/lib/airlock",
            "/var/lib/airlock-worker",
            "/var/lib/airlock-exec",
            "/var/lib/airlock-agent",
            "/var/spool/airlock",
            "/etc/airlock",
            "/etc/systemd/system/multi-user.target.wants/airlock.target",
        ],
    )?;
    if c.sh(
        "dpkg-query -W -f '${Status}' airlock | grep -q installed",
        10 * SEC,
    )?
    .ok()
    {
        return Err("dpkg still knows airlock as installed".into());
    }
    let users = c.sh_ok(
        &format!("getent passwd {} | cut -d: -f1", USERS.join(" ")),
        10 * SEC,
    )?;
    Ok(format!(
        "state gone; {REPO} kept; users kept: {}",
        users.split_whitespace().collect::<Vec<_>>().join(" ")
    ))
}

/// Installed again after the purge: fresh secrets, everything started.
fn install_after_purge(c: &Container, deb: &str) -> Result<String, String> {
    c.sh_ok(
        &format!("apt-get install -y --no-install-recommends {deb}"),
        300 * SEC,
    )?;
    all_active(c, STARTED_BY_TARGET)?;
    let mode = c.sh_ok("stat -c '%a %U' /etc/airlock/retry-control.token", 10 * SEC)?;
    if mode.trim() != "600 root" {
        return Err(format!("token mode {mode}"));
    }
    Ok("token regenerated (600 root), all active".to_owned())
}

/// What must survive a reinstall or an upgrade.
#[derive(Debug, PartialEq, Eq)]
struct Kept {
    tasks: BTreeMap<String, String>,
    secrets: String,
    config_has_repository: bool,
}

fn kept(c: &Container) -> Result<Kept, String> {
    Ok(Kept {
        tasks: tasks(c)?,
        secrets: c.sh_ok(
            "sha256sum /etc/airlock/retry-control.token /etc/airlock/retryd.env",
            10 * SEC,
        )?,
        config_has_repository: c
            .sh_ok("cat /etc/airlock/airlock.toml", 10 * SEC)?
            .contains("path = \"/srv/airlock/calc.git\""),
    })
}

fn reinstall(c: &Container, command: &str) -> Result<String, String> {
    let before = kept(c)?;
    let pids_before = main_pids(c)?;
    if before.tasks.is_empty() {
        return Err("no tasks to keep".into());
    }
    let out = c.sh(command, 300 * SEC)?.expect_ok(command)?;
    all_active(c, STARTED_BY_TARGET)?;
    let after = kept(c)?;
    if after != before {
        return Err(format!("before: {before:?}\nafter: {after:?}"));
    }
    let pids_after = main_pids(c)?;
    let not_restarted: Vec<&str> = [
        "airlock-supervisor.service",
        "airlock-worker.service",
        "airlock-executor.service",
    ]
    .into_iter()
    .filter(|u| pids_before.get(*u) == pids_after.get(*u))
    .collect();
    if !not_restarted.is_empty() {
        return Err(format!(
            "not restarted: {not_restarted:?} (before {pids_before:?}, after {pids_after:?})\n{}",
            tail(&out.both(), 10)
        ));
    }
    Ok(format!(
        "{} tasks kept, secrets and configuration kept, services restarted",
        after.tasks.len()
    ))
}

fn stop_target(c: &Container) -> Result<String, String> {
    // The target is ordered after the services, so its stop job ends first;
    // PartOf= stops the services after it, in reverse start order (worker,
    // then supervisor), each within its TimeoutStopSec=.
    let t = Instant::now();
    c.sh_ok("systemctl stop airlock.target", 120 * SEC)?;
    let deadline = Instant::now() + 90 * SEC;
    loop {
        let st = states(c, ALL_UNITS)?;
        let running: Vec<String> = st
            .iter()
            .filter(|(_, s)| *s != "inactive" && *s != "failed")
            .map(|(u, s)| format!("{u} {s}"))
            .collect();
        if running.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("still {}", running.join(", ")));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let stopped = t.elapsed();
    let failed = c
        .sh(
            "systemctl list-units --state=failed --no-legend --plain 'airlock*'",
            10 * SEC,
        )?
        .stdout;
    if !failed.trim().is_empty() {
        return Err(format!("failed on stop: {failed}"));
    }
    no_airlock_process(c)?;
    Ok(format!(
        "every unit inactive {:.1}s after the stop began; no airlock process",
        stopped.as_secs_f64()
    ))
}

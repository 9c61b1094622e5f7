//! The agent checks (issue 12): the systemd driver, polkit, a single
//! writer and no residency.

use super::status::{airlock_processes, all_active, states};
use super::{ALL_UNITS, SEC, STARTED_BY_TARGET, json, q};
use crate::{Container, Report, tail};
use serde_json::Value;
use std::time::{Duration, Instant};

/// The agents the testbed configures: one that exits 1 at once (the crash
/// loop) and one that runs until stopped.
const AGENTS_TOML: &str = r#"
[[agent]]
name = "crashy"
command = ["/bin/sh", "-c", "exit 1"]
repositories = ["calc"]
tasks_per_hour = 7
cpu_seconds_per_day = 3600
description = "testbed: exits 1 at once (its quotas are shown in Cockpit)"

[[agent]]
name = "steady"
command = ["/bin/sh", "-c", 'airlockctl --no-ask-password --json submit /opt/tb/steady.json > "$HOME/submit.out" 2>&1; echo $? > "$HOME/submit.rc"; sleep infinity & wait']
repositories = ["calc"]
description = "testbed: submits a task for calc, then runs until stopped, with a child"

[[agent]]
name = "submitter"
command = ["/bin/sh", "-c", 'airlockctl --no-ask-password --json submit /opt/tb/denied.json > "$HOME/submit.out" 2>&1; echo $? > "$HOME/submit.rc"; exec sleep infinity']
repositories = ["elsewhere"]
description = "testbed: submits a task for calc, which it may not propose for"

[[repository]]
name = "elsewhere"
path = "/srv/airlock/elsewhere.git"
"#;

const AGENT_UNITS: &[&str] = &[
    "airlock-agent@crashy.service",
    "airlock-agent@steady.service",
    "airlock-agent@submitter.service",
];

fn agent_view(c: &Container, name: &str) -> Result<Value, String> {
    json(&c.sh_ok(
        &format!("airlockctl --no-ask-password --json agent show {name}"),
        30 * SEC,
    )?)
}

/// Waits until the agent `name` is in `state`.
fn wait_agent(c: &Container, name: &str, state: &str, limit: Duration) -> Result<Value, String> {
    let deadline = Instant::now() + limit;
    loop {
        let v = agent_view(c, name)?;
        if v["state"] == state {
            return Ok(v);
        }
        if Instant::now() > deadline {
            return Err(format!("agent {name} is not {state} after {limit:?}: {v}"));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn unit_prop(c: &Container, unit: &str, prop: &str) -> Result<String, String> {
    Ok(c.sh_ok(
        &format!("systemctl show -p {prop} --value {unit}"),
        10 * SEC,
    )?
    .trim()
    .to_owned())
}

/// The processes in the agent unit's control group, as the kernel names
/// each process's cgroup (`/proc/PID/cgroup`): none once it is stopped.
fn cgroup_procs(c: &Container, unit: &str) -> Result<Vec<String>, String> {
    let out = c.sh_ok(
        &format!("python3 /tmp/tb/cgroup_procs.py {}", q(unit)),
        30 * SEC,
    )?;
    let v = json(&out)?;
    Ok(v.as_array()
        .map(|a| a.iter().map(|p| p.to_string()).collect())
        .unwrap_or_default())
}

/// Pids whose cgroup (v2) is the unit's, or below it.
const CGROUP_PROCS_PY: &str = r#"
import json, os, sys
unit = sys.argv[1]
found = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        lines = open(f"/proc/{pid}/cgroup").read().splitlines()
    except OSError:
        continue
    for line in lines:
        path = line.split(":", 2)[-1]
        parts = path.split("/")
        if unit in parts:
            found.append(int(pid))
            break
print(json.dumps(found))
"#;

/// Configures the two agents (a key file each) under the systemd driver
/// and restarts the supervisor.
fn configure_agents(c: &Container) -> Result<String, String> {
    c.write("/tmp/tb/agents.toml", AGENTS_TOML)?;
    c.write("/tmp/tb/cgroup_procs.py", CGROUP_PROCS_PY)?;
    c.sh_ok(
        "set -e
         mkdir -p /opt/tb
         python3 /tmp/tb/mktask.py tb-agent-steady nofix 1 /opt/tb/steady.json
         python3 /tmp/tb/mktask.py tb-agent-denied nofix 1 /opt/tb/denied.json
         chmod 755 /opt/tb && chmod 644 /opt/tb/*.json
         git init -q --bare /srv/airlock/elsewhere.git
         chown -R airlock-worker:airlock-worker /srv/airlock/elsewhere.git
         cp /etc/airlock/airlock.toml /tmp/tb/airlock.toml.before-agents
         cat /tmp/tb/agents.toml >> /etc/airlock/airlock.toml
         for a in crashy steady submitter; do install -m 0600 /dev/null /etc/airlock/agents/$a.key; done
         systemctl restart airlock.target",
        120 * SEC,
    )?;
    all_active(c, STARTED_BY_TARGET)?;
    all_active(c, &["airlock-supervisor.service"])?;
    let steady = wait_agent(c, "steady", "RUNNING", 60 * SEC)?;
    let active = unit_prop(c, "airlock-agent@steady.service", "ActiveState")?;
    let user = unit_prop(c, "airlock-agent@steady.service", "User")?;
    let procs = cgroup_procs(c, "airlock-agent@steady.service")?;
    if active != "active" || user != "airlock-agent" || procs.len() < 2 {
        return Err(format!(
            "steady: unit {active}, user {user:?}, cgroup {procs:?}; {steady}"
        ));
    }
    Ok(format!(
        "steady RUNNING as airlock-agent@steady.service ({active}, {} processes in its cgroup)",
        procs.len()
    ))
}

/// Submissions from an agent's unit are the agent's (systemd's
/// `GetUnitByPID`): steady's is allowed and recorded as `agent:steady`;
/// submitter's, for a repository it may not propose for, is refused with
/// AGENT_REPOSITORY_DENIED and nothing is queued; the same file submitted
/// by the same user outside any agent unit is a plain planner's.
fn agent_attribution(c: &Container) -> Result<String, String> {
    let deadline = Instant::now() + 60 * SEC;
    while !c
        .sh(
            "test -f /var/lib/airlock-agent/steady/submit.rc && test -f /var/lib/airlock-agent/submitter/submit.rc",
            10 * SEC,
        )?
        .ok()
    {
        if Instant::now() > deadline {
            return Err("the agents did not submit within 60 s".into());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let read = |f: &str| c.sh_ok(&format!("cat /var/lib/airlock-agent/{f}"), 10 * SEC);
    let (steady_rc, steady_out) = (read("steady/submit.rc")?, read("steady/submit.out")?);
    let (denied_rc, denied_out) = (read("submitter/submit.rc")?, read("submitter/submit.out")?);
    if steady_rc.trim() != "0" {
        return Err(format!("steady's submission failed: {steady_out}"));
    }
    if denied_rc.trim() == "0" || !denied_out.contains("AGENT_REPOSITORY_DENIED") {
        return Err(format!(
            "submitter's submission ({}): {denied_out}",
            denied_rc.trim()
        ));
    }
    let events = c.sh_ok("airlockctl --json events", 30 * SEC)?;
    let events: Vec<Value> = events
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect();
    let actor = |e: &Value| e["actor"]["name"].as_str().unwrap_or_default().to_owned();
    let submitted: Vec<String> = events
        .iter()
        .filter(|e| {
            e["action"] == "TASK_SUBMITTED"
                && e["outcome"] == "allowed"
                && e["task_id"] == "tb-agent-steady"
        })
        .map(actor)
        .collect();
    let refused: Vec<String> = events
        .iter()
        .filter(|e| e["code"] == "AGENT_REPOSITORY_DENIED")
        .map(actor)
        .collect();
    if submitted.is_empty() || !submitted.iter().all(|a| a.starts_with("agent:steady ")) {
        return Err(format!("tb-agent-steady submitted by {submitted:?}"));
    }
    if refused.len() != 1 || !refused[0].starts_with("agent:submitter ") {
        return Err(format!("AGENT_REPOSITORY_DENIED recorded for {refused:?}"));
    }
    let missing = c.sh("airlockctl --json show tb-agent-denied", 30 * SEC)?;
    if missing.ok() || !missing.stderr.contains("TASK_NOT_FOUND") {
        return Err(format!("the refused task: {}", missing.both()));
    }
    // The same user and file outside any agent unit: a plain planner.
    let plain = c.sh(
        "runuser -u airlock-agent -- airlockctl --no-ask-password --json submit /opt/tb/denied.json",
        60 * SEC,
    )?;
    if !plain.ok() {
        return Err(format!(
            "airlock-agent outside an agent unit: {}",
            plain.both()
        ));
    }
    Ok(format!(
        "steady's TASK_SUBMITTED by {:?}; submitter refused AGENT_REPOSITORY_DENIED as {:?}, nothing queued; the same submission by airlock-agent outside a unit accepted",
        submitted[0], refused[0]
    ))
}

/// The crash-looping agent is held after five failures, visibly.
fn crash_loop_held(c: &Container) -> Result<String, String> {
    let t = Instant::now();
    let v = wait_agent(c, "crashy", "HELD", 90 * SEC)?;
    let reason = v["hold_reason"].as_str().unwrap_or_default();
    // The fifth failure is a crash seen by a probe (exit status 1) or a
    // start whose unit had already failed by the time it was re-read.
    let status_1 = v["last_exit_status"] == 1
        || v["last_failure"]
            .as_str()
            .is_some_and(|f| f.contains("exited with status 1"));
    if v["consecutive_failures"] != 5 || !reason.contains("AGENTOS_CRASH_LOOP") || !status_1 {
        return Err(format!("held, but: {v}"));
    }
    let text = c.sh_ok("airlockctl --no-ask-password agent show crashy", 30 * SEC)?;
    if !text.contains("HELD") || !text.contains("AGENTOS_CRASH_LOOP") {
        return Err(format!("airlockctl agent show:\n{text}"));
    }
    // Nothing starts it while held: its unit stays down.
    let invocation = unit_prop(c, "airlock-agent@crashy.service", "InvocationID")?;
    std::thread::sleep(10 * SEC);
    let later = unit_prop(c, "airlock-agent@crashy.service", "InvocationID")?;
    let again = agent_view(c, "crashy")?;
    if later != invocation || again["state"] != "HELD" {
        return Err(format!(
            "started while held: invocation {invocation} then {later}; {again}"
        ));
    }
    let refused = c.sh(
        "airlockctl --no-ask-password --json agent start crashy",
        30 * SEC,
    )?;
    if refused.ok() || !refused.stderr.contains("AGENTOS_CRASH_LOOP") {
        return Err(format!("agent start while held: {}", refused.both()));
    }
    Ok(format!(
        "HELD after {:.1}s: 5 failures, the last: {}; {reason:?}; no start in 10 s; agent start refused with AGENTOS_CRASH_LOOP",
        t.elapsed().as_secs_f64(),
        v["last_failure"]
    ))
}

/// ClearHold starts it again: a new invocation of its unit, and (it still
/// exits 1) a new hold after five more failures.
fn clear_hold_restarts(c: &Container) -> Result<String, String> {
    let before = unit_prop(c, "airlock-agent@crashy.service", "InvocationID")?;
    let cleared = json(&c.sh_ok(
        "airlockctl --no-ask-password --json agent clear-hold crashy",
        30 * SEC,
    )?)?;
    if cleared["state"] == "HELD" || cleared["hold_reason"] != Value::Null {
        return Err(format!("after clear-hold: {cleared}"));
    }
    let deadline = Instant::now() + 30 * SEC;
    let after = loop {
        let now = unit_prop(c, "airlock-agent@crashy.service", "InvocationID")?;
        if !now.is_empty() && now != before {
            break now;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "no new invocation of the unit after clear-hold ({before})"
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let held = wait_agent(c, "crashy", "HELD", 90 * SEC)?;
    if held["consecutive_failures"] != 5 {
        return Err(format!("held again, but: {held}"));
    }
    Ok(format!(
        "clear-hold: {} with 0 failures; the unit ran again (invocation {before} → {after}); held again after 5 more failures",
        cleared["state"]
    ))
}

/// polkit lets user airlock manage its agent units and nothing else.
fn polkit_refuses_other_units(c: &Container) -> Result<String, String> {
    let call = |method: &str, unit: &str, mode: &str| {
        c.sh(
            &format!(
                "runuser -u airlock -- busctl --system call org.freedesktop.systemd1 /org/freedesktop/systemd1 \
                 org.freedesktop.systemd1.Manager {method} ss {} {mode}",
                q(unit)
            ),
            30 * SEC,
        )
    };
    let mut refused = Vec::new();
    let mut problems = Vec::new();
    let worker_pid = unit_prop(c, "airlock-worker.service", "MainPID")?;
    for (method, unit) in [
        ("StopUnit", "airlock-worker.service"),
        ("StartUnit", "systemd-hostnamed.service"),
        ("RestartUnit", "airlock-agent@steady.service"),
        ("StartUnit", "airlock-agent@Steady.service"),
        ("StartUnit", "airlock-agent@a.b.service"),
    ] {
        let out = call(method, unit, "replace")?;
        if out.ok() || !out.stderr.contains("Access denied") {
            problems.push(format!("{method} {unit}: {}", out.describe()));
        } else {
            refused.push(format!("{method} {unit}"));
        }
    }
    let kill = c.sh(
        "runuser -u airlock -- busctl --system call org.freedesktop.systemd1 /org/freedesktop/systemd1 \
         org.freedesktop.systemd1.Manager KillUnit ssi airlock-agent@steady.service all 9",
        30 * SEC,
    )?;
    if kill.ok() || !kill.stderr.contains("Access denied") {
        problems.push(format!(
            "KillUnit airlock-agent@steady.service: {}",
            kill.describe()
        ));
    } else {
        refused.push("KillUnit airlock-agent@steady.service".into());
    }
    if unit_prop(c, "airlock-worker.service", "MainPID")? != worker_pid {
        problems.push("the worker was restarted".into());
    }
    // The control: what the supervisor needs is allowed.
    let control = call("StartUnit", "airlock-agent@steady.service", "fail")?;
    if !control.ok() {
        problems.push(format!(
            "control: StartUnit airlock-agent@steady.service as airlock: {}",
            control.describe()
        ));
    }
    let reset = c.sh(
        "runuser -u airlock -- busctl --system call org.freedesktop.systemd1 /org/freedesktop/systemd1 \
         org.freedesktop.systemd1.Manager ResetFailedUnit s airlock-agent@crashy.service",
        30 * SEC,
    )?;
    if !reset.ok() {
        problems.push(format!(
            "control: ResetFailedUnit as airlock: {}",
            reset.describe()
        ));
    }
    if problems.is_empty() {
        Ok(format!(
            "refused (Access denied): {}; allowed: StartUnit and ResetFailedUnit of agent units",
            refused.join(", ")
        ))
    } else {
        Err(problems.join("\n"))
    }
}

/// A second supervisor cannot take the agents over: the bus name is held,
/// and it stops before touching any agent unit.
fn second_supervisor_refused(c: &Container) -> Result<String, String> {
    let unit = "airlock-agent@steady.service";
    let before = (
        unit_prop(c, unit, "InvocationID")?,
        unit_prop(c, unit, "MainPID")?,
    );
    let held = agent_view(c, "crashy")?;
    let out = c.sh(
        "runuser -u airlock -- timeout 60 /usr/bin/airlock-supervisor --config /etc/airlock/airlock.toml",
        90 * SEC,
    )?;
    if out.ok() || !out.both().contains("owned by another process") {
        return Err(format!(
            "a second supervisor: {}\n{}",
            out.describe(),
            tail(&out.both(), 20)
        ));
    }
    std::thread::sleep(2 * SEC);
    let after = (
        unit_prop(c, unit, "InvocationID")?,
        unit_prop(c, unit, "MainPID")?,
    );
    let held_after = agent_view(c, "crashy")?;
    if before != after || held_after["state"] != held["state"] {
        return Err(format!(
            "the agents changed: {before:?} → {after:?}; crashy {} → {}",
            held["state"], held_after["state"]
        ));
    }
    Ok(format!(
        "refused ({}): {}; steady's unit untouched (invocation and MainPID {})",
        out.describe(),
        tail(&out.both(), 1).trim(),
        before.1
    ))
}

/// Stopping airlock.target stops every agent: no process left in its
/// cgroup or of its user; a drain is no failure.
fn stop_target_stops_agents(c: &Container) -> Result<String, String> {
    let pid = unit_prop(c, "airlock-agent@steady.service", "MainPID")?;
    let before = cgroup_procs(c, "airlock-agent@steady.service")?;
    // systemctl returns once the target's own job is done; the services
    // and agents stop after it (PartOf=, BindsTo=): wait for all of them.
    c.sh_ok("systemctl stop airlock.target", 120 * SEC)?;
    let units: Vec<&str> = ALL_UNITS.iter().chain(AGENT_UNITS).copied().collect();
    let deadline = Instant::now() + 90 * SEC;
    loop {
        let st = states(c, &units)?;
        if st.values().all(|s| s == "inactive" || s == "failed") {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("after the stop: {st:?}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let left = cgroup_procs(c, "airlock-agent@steady.service")?;
    if !left.is_empty() {
        return Err(format!("left in steady's cgroup: {left:?}"));
    }
    let agent_procs: Vec<Value> = airlock_processes(c)?
        .into_iter()
        .filter(|p| p["user"] == "airlock-agent")
        .collect();
    if !agent_procs.is_empty() {
        return Err(format!("processes of airlock-agent: {agent_procs:?}"));
    }
    c.sh_ok("systemctl start airlock.target", 120 * SEC)?;
    all_active(c, STARTED_BY_TARGET)?;
    let steady = wait_agent(c, "steady", "RUNNING", 60 * SEC)?;
    if steady["consecutive_failures"] != 0 {
        return Err(format!("the drain counted as a failure: {steady}"));
    }
    let crashy = agent_view(c, "crashy")?;
    if crashy["state"] != "HELD" {
        return Err(format!("the hold did not survive the restart: {crashy}"));
    }
    Ok(format!(
        "steady (pid {pid}, {} processes) gone, its cgroup empty, no airlock-agent process; after a start: steady RUNNING with 0 failures, crashy still HELD",
        before.len()
    ))
}

/// Removes the agents again, so the checks after these see the suite
/// as it was: no process of airlock-agent left.
fn remove_agents(c: &Container) -> Result<String, String> {
    c.sh_ok(
        "cp /tmp/tb/airlock.toml.before-agents /etc/airlock/airlock.toml && \
         rm -f /etc/airlock/agents/crashy.key /etc/airlock/agents/steady.key /etc/airlock/agents/submitter.key && \
         systemctl restart airlock.target && \
         { systemctl stop 'airlock-agent@*.service'; systemctl reset-failed 'airlock-agent@*.service'; true; }",
        120 * SEC,
    )?;
    let active = all_active(c, STARTED_BY_TARGET)?;
    let deadline = Instant::now() + 15 * SEC;
    loop {
        let left: Vec<Value> = airlock_processes(c)?
            .into_iter()
            .filter(|p| p["user"] == "airlock-agent")
            .collect();
        if left.is_empty() {
            return Ok(format!("{active}; no process of airlock-agent"));
        }
        if Instant::now() > deadline {
            let journal = c
                .sh("journalctl --no-pager -n 30 -u 'airlock-agent@*'", 30 * SEC)
                .map(|o| o.both())
                .unwrap_or_default();
            return Err(format!(
                "processes of airlock-agent left: {left:?}\n{journal}"
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The agent checks (issue 12): the systemd driver, polkit, single writer
/// and no residency. `while_held` runs after them, while both agents are
/// configured and crashy is held, before they are removed.
pub(super) fn agent_checks(r: &mut Report, c: &Container, while_held: impl FnOnce(&mut Report)) {
    let Some(_) = r.check(
        "agents: two [[agent]]s under the systemd driver; steady RUNNING in airlock-agent@steady.service",
        |_| configure_agents(c),
    ) else {
        let _ = r.check("agents: removed again", |_| remove_agents(c));
        return;
    };
    r.check(
        "agents: a submission from an agent's unit is the agent's (GetUnitByPID), limited to its repositories",
        |_| agent_attribution(c),
    );
    r.check(
        "agents: doctor names exactly the properties a drop-in weakens on a running agent unit",
        |_| crate::hardening::doctor_names_a_weakened_agent(c, "airlock-agent@steady.service"),
    );
    r.check(
        "agents: the crash-looping agent is HELD after 5 failures (AGENTOS_CRASH_LOOP in agent show), nothing restarts it",
        |_| crash_loop_held(c),
    );
    r.check("agents: clear-hold restarts it", |_| clear_hold_restarts(c));
    r.set_group("polkit matrix");
    r.check(
        "agents: polkit refuses user airlock every other unit and verb",
        |_| polkit_refuses_other_units(c),
    );
    r.set_group("agents");
    r.check(
        "agents: a second supervisor cannot take over the agents (bus name held)",
        |_| second_supervisor_refused(c),
    );
    r.check(
        "agents: systemctl stop airlock.target leaves no agent process (cgroup empty); a drain is no failure",
        |_| stop_target_stops_agents(c),
    );
    while_held(r);
    r.check("agents: removed again", |_| remove_agents(c));
}

//! What is running in the container: unit states, main pids, airlock's
//! processes, a task's state, which paths exist.

use super::{SEC, SERVICES, json, q};
use crate::Container;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Lists the processes that belong to airlock.
pub(super) const PROCS_PY: &str = r#"
import json, os, pwd
found = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        uid = int([l for l in open(f"/proc/{pid}/status") if l.startswith("Uid:")][0].split()[1])
        cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace").strip()
    except (OSError, IndexError):
        continue
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    try:
        cgroup = [l[3:] for l in open(f"/proc/{pid}/cgroup").read().splitlines() if l.startswith("0::")][0]
    except (OSError, IndexError):
        cgroup = "?"
    if user.startswith("airlock") or "/usr/bin/airlock" in cmd or "airlock-confine" in cmd:
        found.append({"pid": int(pid), "user": user, "cmd": cmd, "cgroup": cgroup})
print(json.dumps(found))
"#;

/// `systemctl is-active` of each unit.
pub(super) fn states(c: &Container, units: &[&str]) -> Result<BTreeMap<String, String>, String> {
    let out = c.sh(
        &format!("systemctl is-active {}", units.join(" ")),
        30 * SEC,
    )?;
    let states: Vec<&str> = out.stdout.lines().collect();
    if states.len() != units.len() {
        return Err(format!("systemctl is-active: {}", out.both()));
    }
    Ok(units
        .iter()
        .zip(states)
        .map(|(u, s)| ((*u).to_owned(), s.to_owned()))
        .collect())
}

pub(super) fn all_active(c: &Container, units: &[&str]) -> Result<String, String> {
    let deadline = Instant::now() + 30 * SEC;
    loop {
        let st = states(c, units)?;
        let bad: Vec<String> = st
            .iter()
            .filter(|(_, s)| *s != "active")
            .map(|(u, s)| format!("{u} {s}"))
            .collect();
        if bad.is_empty() {
            return Ok(format!("{} units active", st.len()));
        }
        if Instant::now() > deadline || bad.iter().any(|b| b.ends_with("failed")) {
            let status = c
                .sh("systemctl status --no-pager -n 20 'airlock*'", 30 * SEC)
                .map(|o| o.both())
                .unwrap_or_default();
            return Err(format!("not active: {}\n{status}", bad.join(", ")));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub(super) fn main_pids(c: &Container) -> Result<BTreeMap<String, String>, String> {
    let mut pids = BTreeMap::new();
    for unit in SERVICES {
        let pid = c.sh_ok(
            &format!("systemctl show -p MainPID --value {unit}"),
            10 * SEC,
        )?;
        pids.insert((*unit).to_owned(), pid.trim().to_owned());
    }
    Ok(pids)
}

pub(super) fn airlock_processes(c: &Container) -> Result<Vec<Value>, String> {
    let out = c.sh_ok("python3 /tmp/tb/procs.py", 30 * SEC)?;
    Ok(json(&out)?.as_array().cloned().unwrap_or_default())
}

pub(super) fn no_airlock_process(c: &Container) -> Result<String, String> {
    let deadline = Instant::now() + 15 * SEC;
    loop {
        let procs = airlock_processes(c)?;
        if procs.is_empty() {
            return Ok("no process of an airlock user or binary".to_owned());
        }
        if Instant::now() > deadline {
            return Err(format!("still running: {procs:?}"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub(super) fn show(c: &Container, id: &str) -> Result<Value, String> {
    json(&c.sh_ok(&format!("airlockctl --json show {}", q(id)), 30 * SEC)?)
}

pub(super) fn wait_state(
    c: &Container,
    id: &str,
    wanted: &[&str],
    limit: Duration,
) -> Result<Value, String> {
    let deadline = Instant::now() + limit;
    loop {
        let task = show(c, id)?;
        let state = task["state"].as_str().unwrap_or_default();
        if wanted.contains(&state) {
            return Ok(task);
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{id} is {state} after {limit:?}, not {wanted:?}: {}",
                serde_json::to_string(&task).unwrap_or_default()
            ));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

pub(super) fn tasks(c: &Container) -> Result<BTreeMap<String, String>, String> {
    let list = json(&c.sh_ok("airlockctl --json list", 30 * SEC)?)?;
    let items = match &list {
        Value::Array(a) => a.clone(),
        other => other["tasks"].as_array().cloned().unwrap_or_default(),
    };
    Ok(items
        .iter()
        .map(|t| {
            (
                t["task_id"].as_str().unwrap_or_default().to_owned(),
                format!(
                    "{} {}/{}",
                    t["state"].as_str().unwrap_or_default(),
                    t["attempt"],
                    t["max_attempts"]
                ),
            )
        })
        .collect())
}

pub(super) fn expect_paths(c: &Container, present: &[&str], absent: &[&str]) -> Result<(), String> {
    let mut problems = Vec::new();
    for p in present {
        if !c.sh(&format!("test -e {}", q(p)), 10 * SEC)?.ok() {
            problems.push(format!("{p} is missing"));
        }
    }
    for p in absent {
        if c.sh(&format!("test -e {} || test -L {}", q(p), q(p)), 10 * SEC)?
            .ok()
        {
            problems.push(format!("{p} is still there"));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

//! The journal: airlock's events with their MESSAGE_IDs and fields, and
//! `journalctl -x` explaining them from the installed catalogue.

use super::SEC;
use crate::{Container, tail};
use serde_json::Value;
use std::time::Instant;

/// `MESSAGE_ID`s of services/supervisor/src/journal.rs (released ids never
/// change; a unit test there holds them to catalog/airlock.catalog).
const MSG_TASK_SUBMITTED: &str = "30cd7e4400814c929cb61023fca56d03";

const MSG_REFUSED: &str = "229810b04d424c38a8a0473d4ae44051";

/// The journal entries of one `journalctl` match, as JSON objects, waiting
/// up to 15 s for the supervisor's export (it polls the log every second).
fn journal_entries(c: &Container, matches: &str) -> Result<Vec<Value>, String> {
    let deadline = Instant::now() + 15 * SEC;
    loop {
        let out = c.sh_ok(
            &format!("journalctl --no-pager -o json {matches}"),
            30 * SEC,
        )?;
        let entries: Vec<Value> = out
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        if !entries.is_empty() || Instant::now() > deadline {
            return Ok(entries);
        }
        std::thread::sleep(SEC / 2);
    }
}

/// The demo task's submission and alice's refused submit are in the journal
/// with their MESSAGE_IDs and fields, and `journalctl -x` explains both
/// from the installed catalogue.
pub(super) fn journal_catalogue(c: &Container) -> Result<String, String> {
    let submitted = journal_entries(
        c,
        &format!("MESSAGE_ID={MSG_TASK_SUBMITTED} AIRLOCK_TASK_ID=tb-demo"),
    )?;
    let Some(s) = submitted.first() else {
        return Err(format!(
            "no MESSAGE_ID={MSG_TASK_SUBMITTED} entry for tb-demo; the supervisor's journal:\n{}",
            c.sh(
                "journalctl --no-pager -n 20 -u airlock-supervisor.service",
                30 * SEC
            )?
            .both()
        ));
    };
    for (field, want) in [
        ("AIRLOCK_ACTION", "TASK_SUBMITTED"),
        ("AIRLOCK_OUTCOME", "allowed"),
        ("AIRLOCK_ACTOR_KIND", "planner"),
        ("SYSLOG_IDENTIFIER", "airlock-supervisor"),
        ("_SYSTEMD_UNIT", "airlock-supervisor.service"),
    ] {
        if s[field] != want {
            return Err(format!("{field} is {} (want {want}): {s}", s[field]));
        }
    }
    if submitted.len() != 1 {
        return Err(format!(
            "tb-demo's submission is in the journal {} times",
            submitted.len()
        ));
    }
    let refused = journal_entries(
        c,
        &format!(
            "MESSAGE_ID={MSG_REFUSED} AIRLOCK_ACTION=TASK_SUBMITTED AIRLOCK_ACTOR_UID=$(id -u alice)"
        ),
    )?;
    let Some(d) = refused.last() else {
        return Err("alice's refused submit is not in the journal".into());
    };
    let code = d["AIRLOCK_CODE"].as_str().unwrap_or_default().to_owned();
    if d["AIRLOCK_OUTCOME"] != "denied" || code.is_empty() || d["PRIORITY"] != "4" {
        return Err(format!("alice's refusal in the journal: {d}"));
    }
    let explained = c.sh_ok(
        &format!(
            "journalctl --no-pager -x MESSAGE_ID={MSG_REFUSED} AIRLOCK_ACTOR_UID=$(id -u alice)"
        ),
        30 * SEC,
    )?;
    let subject = format!("airlock refused TASK_SUBMITTED: {code}");
    if !explained.contains(&subject) || !explained.contains("Defined-By: airlock") {
        return Err(format!(
            "journalctl -x does not explain the refusal (want {subject:?}):\n{}",
            tail(&explained, 15)
        ));
    }
    let explained = c.sh_ok(
        &format!(
            "journalctl --no-pager -x MESSAGE_ID={MSG_TASK_SUBMITTED} AIRLOCK_TASK_ID=tb-demo"
        ),
        30 * SEC,
    )?;
    if !explained.contains("airlock task tb-demo submitted") {
        return Err(format!(
            "journalctl -x does not explain the submission:\n{}",
            tail(&explained, 15)
        ));
    }
    Ok(format!(
        "TASK_SUBMITTED of tb-demo once with MESSAGE_ID {MSG_TASK_SUBMITTED}; alice's refusal ({code}) with {MSG_REFUSED}; both explained by journalctl -x"
    ))
}

//! Refusals as airlock reports them (code, D-Bus error, HTTP status,
//! exit status) and their audit records: polkit's answer to an ordinary
//! user.

use super::{SEC, json};
use crate::{Container, Out, tail};
use serde_json::Value;

/// A refusal as airlock reports it: the catalogue code, its D-Bus error
/// name, HTTP status and `airlockctl` exit status. `airlockctl --json`
/// prints `{"error": {"code", "dbus_error", "message", "exit_code"}}` on
/// stderr; airlock-retryd answers `{"error": code}` with the status. The
/// figures are docs/errors.md's; tests/units.rs checks them against it.
#[derive(Clone, Copy, Debug)]
pub struct Refusal {
    /// Catalogue code.
    pub code: &'static str,
    /// D-Bus error name.
    pub dbus_error: &'static str,
    /// HTTP status.
    pub http_status: u16,
    /// `airlockctl` exit status.
    pub exit_code: i32,
}

/// polkit's answer to a caller without a rule for an `auth_admin_keep`
/// action (org.airlock.policy's default for everyone) who did not allow
/// interaction (`--no-ask-password`): a challenge, which the supervisor
/// reports as this and never as AUTHORITY_UNAVAILABLE (polkit unreachable)
/// or another code of the Denied class.
pub const INTERACTIVE_AUTHORIZATION_REQUIRED: Refusal = Refusal {
    code: "INTERACTIVE_AUTHORIZATION_REQUIRED",
    dbus_error: "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired",
    http_status: 401,
    exit_code: 11,
};

/// airlock-retryd's answer to a wrong bearer token.
pub const UNAUTHORIZED: Refusal = Refusal {
    code: "UNAUTHORIZED",
    dbus_error: "org.airlock.Error.UNAUTHORIZED",
    http_status: 401,
    exit_code: 4,
};

/// Every refusal the scenario asserts.
pub const REFUSALS: &[Refusal] = &[INTERACTIVE_AUTHORIZATION_REQUIRED, UNAUTHORIZED];

/// Checks that `out` is `airlockctl --json`'s report of exactly `want`,
/// for the polkit action `action` (its message names it).
pub(super) fn expect_refusal(out: &Out, want: &Refusal, action: &str) -> Result<String, String> {
    let line = out
        .stderr
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .unwrap_or("");
    let v = json(line).map_err(|e| format!("{e}\n{}", out.both()))?;
    let e = &v["error"];
    let message = e["message"].as_str().unwrap_or_default().to_owned();
    let mut problems = Vec::new();
    if out.code != Some(want.exit_code) {
        problems.push(format!("{} (want exit {})", out.describe(), want.exit_code));
    }
    if e["code"] != want.code {
        problems.push(format!("code {} (want {})", e["code"], want.code));
    }
    if e["dbus_error"] != want.dbus_error {
        problems.push(format!(
            "dbus_error {} (want {})",
            e["dbus_error"], want.dbus_error
        ));
    }
    if e["exit_code"] != want.exit_code {
        problems.push(format!(
            "exit_code {} (want {})",
            e["exit_code"], want.exit_code
        ));
    }
    if !message.contains(action) {
        problems.push(format!("the message does not name {action}"));
    }
    if problems.is_empty() {
        Ok(message)
    } else {
        Err(format!("{}\n{}", problems.join(", "), out.both()))
    }
}

/// The denied event of an actor (`name@…`) with this action, and that its
/// code is `want`'s.
pub(super) fn denial_audited(
    c: &Container,
    user: &str,
    action: &str,
    want: &Refusal,
) -> Result<Value, String> {
    let events = c.sh_ok("airlockctl --json events", 30 * SEC)?;
    let denied: Vec<Value> = events
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| {
            e["outcome"] == "denied"
                && e["action"] == action
                && e["actor"]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with(&format!("{user}@")))
        })
        .collect();
    let Some(last) = denied.last() else {
        return Err(format!(
            "no denied {action} event for {user} in:\n{}",
            tail(&events, 10)
        ));
    };
    if last["code"] != want.code {
        return Err(format!(
            "{user}'s denied {action} is audited with code {} (want {}): {last}",
            last["code"], want.code
        ));
    }
    Ok(last.clone())
}

pub(super) fn ordinary_user_denied(c: &Container) -> Result<String, String> {
    c.sh_ok(
        "id alice >/dev/null 2>&1 || useradd --create-home alice; python3 /tmp/tb/mktask.py tb-alice fix 1 /tmp/tb/alice.json && chmod 644 /tmp/tb/alice.json",
        30 * SEC,
    )?;
    let out: Out = c.sh(
        "runuser -u alice -- airlockctl --no-ask-password --json submit /tmp/tb/alice.json",
        60 * SEC,
    )?;
    let want = &INTERACTIVE_AUTHORIZATION_REQUIRED;
    expect_refusal(&out, want, "org.airlock.tasks.submit")
        .map_err(|e| format!("alice's submit: {e}"))?;
    let missing = c.sh("airlockctl --json show tb-alice", 30 * SEC)?;
    if missing.code != Some(6) {
        return Err(format!(
            "tb-alice exists after a denied submit: {}",
            missing.both()
        ));
    }
    let audited = denial_audited(c, "alice", "TASK_SUBMITTED", want)?;
    Ok(format!(
        "exit {} {} ({}); audited as event {} with the same code",
        want.exit_code, want.code, want.dbus_error, audited["id"]
    ))
}

/// Reads bound to the caller under the real polkit and the shipped rules:
/// airlock-agent (`tasks.read` by 50-airlock-agent.rules, not
/// `tasks.read-all`) lists and reads tb-probe, which it submitted, and not
/// root's tb-demo, which answers exactly as a task that does not exist
/// (TASK_NOT_FOUND, exit 6); its event log holds none of tb-demo's
/// events; root (every action) lists both.
pub(super) fn reads_bound_to_the_caller(c: &Container) -> Result<String, String> {
    let agent = |cmd: &str| {
        c.sh(
            &format!("runuser -u airlock-agent -- airlockctl --no-ask-password --json {cmd}"),
            60 * SEC,
        )
    };
    let listed = agent("list")?
        .expect_ok("airlockctl list as airlock-agent")?
        .stdout;
    if !listed.contains("tb-probe") || listed.contains("tb-demo") {
        return Err(format!(
            "airlock-agent's list is not its own tasks alone:\n{}",
            tail(&listed, 10)
        ));
    }
    let theirs = agent("show tb-demo")?;
    let missing = agent("show tb-nothing")?;
    let error = |o: &Out, id: &str| -> Result<Value, String> {
        let line = o
            .stderr
            .lines()
            .rev()
            .find(|l| l.trim_start().starts_with('{'))
            .unwrap_or("");
        let v = json(&line.replace(id, "ID")).map_err(|e| format!("{e}\n{}", o.both()))?;
        Ok(v["error"].clone())
    };
    let (t, m) = (error(&theirs, "tb-demo")?, error(&missing, "tb-nothing")?);
    if theirs.code != Some(6) || t["code"] != "TASK_NOT_FOUND" || t != m {
        return Err(format!(
            "root's task, read by airlock-agent: {} {t}; a missing task: {} {m}",
            theirs.describe(),
            missing.describe()
        ));
    }
    let events = agent("events")?
        .expect_ok("airlockctl events as airlock-agent")?
        .stdout;
    if events.contains("tb-demo") || !events.contains("tb-probe") {
        return Err(format!(
            "airlock-agent's event log is not its own tasks' alone:\n{}",
            tail(&events, 10)
        ));
    }
    let all = c.sh_ok("airlockctl --json list", 30 * SEC)?;
    if !(all.contains("tb-probe") && all.contains("tb-demo")) {
        return Err(format!("root's list lacks a task:\n{}", tail(&all, 10)));
    }
    Ok("airlock-agent: tb-probe only (tb-demo answers TASK_NOT_FOUND as a missing task, exit 6); root: both".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::tests::out;

    #[test]
    fn a_refusal_of_another_code_of_the_class_fails() {
        let want = &INTERACTIVE_AUTHORIZATION_REQUIRED;
        let action = "org.airlock.tasks.submit";
        let right = format!(
            r#"{{"error":{{"code":"{}","dbus_error":"{}","message":"{action} requires interactive authentication","exit_code":11}}}}"#,
            want.code, want.dbus_error
        );
        assert!(expect_refusal(&out(11, "", &right), want, action).is_ok());
        let unavailable = r#"{"error":{"code":"AUTHORITY_UNAVAILABLE","dbus_error":"org.airlock.Error.AUTHORITY_UNAVAILABLE","message":"polkit could not decide org.airlock.tasks.submit","exit_code":5}}"#;
        assert!(expect_refusal(&out(5, "", unavailable), want, action).is_err());
        // The right code for another action is not the refusal asked about.
        assert!(expect_refusal(&out(11, "", &right), want, "org.airlock.tasks.manage").is_err());
    }
}

//! `airlockctl show ID`: one task in detail.

use crate::client::{Client, CtlError, shown};
use crate::output::{Ctx, text, time_of};
use serde_json::Value;
use std::process::ExitCode;

/// Arguments of `show`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The task id.
    pub task_id: String,
}

/// Fetches and prints the task.
pub async fn run(ctx: &Ctx, client: &Client, args: Args) -> Result<ExitCode, CtlError> {
    let task = shown(&client.sup().get_task(&args.task_id).await?);
    if ctx.json {
        ctx.print_json(&task);
    } else {
        print!("{}", render(ctx, &task));
    }
    Ok(ExitCode::SUCCESS)
}

/// The human form of a task.
pub fn render(ctx: &Ctx, t: &Value) -> String {
    let b = &t["binding"];
    let mut rows: Vec<(&str, String)> = vec![
        ("Task", ctx.paint("1", &text(&t["task_id"]))),
        ("State", ctx.state(t["state"].as_str().unwrap_or("?"))),
        (
            "Attempt",
            format!("{} of {}", t["attempt"], t["max_attempts"]),
        ),
        ("Revision", text(&t["revision"])),
        ("Job", text(&b["job_id"])),
        ("Repository", text(&b["repository"])),
        (
            "Target branch",
            format!(
                "{} ({})",
                text(&b["target_branch"]),
                text(&b["branch_mode"])
            ),
        ),
        ("Base", text(&b["base_oid"])),
        ("Expected head", text(&b["expected_branch_oid"])),
        ("Generation", text(&b["generation"])),
        ("Plan digest", text(&t["plan_digest"])),
        ("Execution digest", text(&t["execution_digest"])),
    ];
    if !t["lease_expires_at_ms"].is_null() {
        rows.push((
            "Lease",
            format!(
                "epoch {}, expires {}",
                t["lease_epoch"],
                time_of(&t["lease_expires_at_ms"])
            ),
        ));
    }
    if let Some(r) = t["result"].as_object() {
        let mut s = text(r.get("outcome").unwrap_or(&Value::Null));
        if let Some(c) = r.get("commit_oid").and_then(Value::as_str) {
            s.push_str(&format!(", commit {c}"));
        }
        if let Some(c) = r.get("failure_code").and_then(Value::as_str) {
            s.push_str(&format!(", {c}"));
        }
        rows.push(("Result", s));
        if let Some(h) = t["result_sha256"].as_str() {
            rows.push(("Result SHA-256", h.to_owned()));
        }
    }
    if let Some(v) = t["verification"].as_object() {
        let mut s = text(v.get("decision").unwrap_or(&Value::Null));
        if let Some(r) = v.get("reason").filter(|r| !r.is_null()) {
            s.push_str(&format!(": {}", text(r)));
        }
        if let Some(a) = v.get("actor").and_then(Value::as_str) {
            s.push_str(&format!(" (by {a})"));
        }
        rows.push(("Verification", s));
    }
    rows.push(("Created", time_of(&t["created_at_ms"])));
    rows.push(("Updated", time_of(&t["updated_at_ms"])));
    let w = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    rows.iter()
        .map(|(k, v)| format!("{:>w$}: {v}\n", k, w = w))
        .collect()
}

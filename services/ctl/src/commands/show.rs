//! `airlockctl show ID`: one task in detail.

use crate::client::{Client, CtlError, shown};
use crate::output::{Ctx, text, time_of};
use airlock_proto::task::{Isolation, UNMEASURED};
use serde_json::Value;
use std::process::ExitCode;

/// Arguments of `show`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The task id.
    pub task_id: String,
    /// Of a source capture's result: write this captured file's content to
    /// standard output, as it is (nothing else is printed).
    #[arg(long, value_name = "PATH")]
    pub file: Option<String>,
}

/// Fetches and prints the task.
pub async fn run(ctx: &Ctx, client: &Client, args: Args) -> Result<ExitCode, CtlError> {
    let task = shown(&client.sup().get_task(&args.task_id).await?);
    if let Some(path) = &args.file {
        let bytes = captured_file(&task, path)?;
        use std::io::Write;
        std::io::stdout()
            .write_all(&bytes)
            .map_err(|e| CtlError::generic(format!("writing {path}: {e}")))?;
        return Ok(ExitCode::SUCCESS);
    }
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
        if let Some(c) = r.get("captured").filter(|c| !c.is_null()) {
            let files = c["files"].as_array().cloned().unwrap_or_default();
            rows.push((
                "Captured",
                format!(
                    "{} file(s) from tree {} (captured in attempt {}); `airlockctl show {} --file PATH` prints one",
                    files.len(),
                    text(&c["source_tree"]),
                    text(&c["captured_in_attempt"]),
                    text(&t["task_id"]),
                ),
            ));
            for f in &files {
                let line = if f["present"].as_bool() == Some(true) {
                    let sha = f["sha256"].as_str().unwrap_or("");
                    format!(
                        "{}  {} bytes, sha256 {}",
                        text(&f["path"]),
                        decoded_len(f),
                        &sha[..sha.len().min(16)]
                    )
                } else {
                    format!("{}  (no such file at the source commit)", text(&f["path"]))
                };
                rows.push(("File", line));
            }
            let withheld: Vec<String> = c["withheld"]
                .as_array()
                .map(|w| w.iter().map(text).collect())
                .unwrap_or_default();
            if !withheld.is_empty() {
                rows.push((
                    "Withheld",
                    format!("{} (credential-like: never read)", withheld.join(", ")),
                ));
            }
            if let Some(signals) = c["source_signals"].as_array().filter(|s| !s.is_empty()) {
                let s: Vec<String> = signals.iter().map(text).collect();
                rows.push(("Signals", s.join(" | ")));
            }
        }
        rows.push(("Isolation", isolation(r.get("isolation"))));
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
        // An adopted head is the task's commit (airlockctl reconcile).
        if let Some(c) = v.get("commit_oid").and_then(Value::as_str) {
            s.push_str(&format!(", commit {c}"));
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

/// The content of a captured file of the task's result.
fn captured_file(task: &Value, path: &str) -> Result<Vec<u8>, CtlError> {
    use base64::Engine;
    let captured = &task["result"]["captured"];
    if !captured.is_object() {
        return Err(CtlError::local(
            airlock_proto::Code::MESSAGE_INVALID,
            format!("{} has no captured result", text(&task["task_id"])),
        ));
    }
    if captured["withheld"]
        .as_array()
        .is_some_and(|w| w.iter().any(|p| p.as_str() == Some(path)))
    {
        return Err(CtlError::local(
            airlock_proto::Code::CREDENTIAL_PATH_DENIED,
            format!("{path} was withheld: a credential-like path is never captured"),
        ));
    }
    let file = captured["files"]
        .as_array()
        .and_then(|f| f.iter().find(|f| f["path"].as_str() == Some(path)))
        .ok_or_else(|| {
            CtlError::local(
                airlock_proto::Code::PATH_INVALID,
                format!("{path} is not among the captured files"),
            )
        })?;
    let Some(b64) = file["content_b64"].as_str() else {
        return Err(CtlError::local(
            airlock_proto::Code::PATH_INVALID,
            format!("{path} does not exist at the source commit"),
        ));
    };
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| CtlError::local(airlock_proto::Code::MESSAGE_INVALID, format!("{path}: {e}")))
}

/// The size of a captured file from its base64 length.
fn decoded_len(f: &Value) -> usize {
    let b64 = f["content_b64"].as_str().unwrap_or("");
    let pad = b64.bytes().rev().take_while(|b| *b == b'=').count();
    (b64.len() / 4 * 3).saturating_sub(pad)
}

/// The isolation evidence of a result, in words: what was measured and,
/// when the commands were not fully confined, each gap (auto_accept then
/// leaves the decision to a human).
fn isolation(evidence: Option<&Value>) -> String {
    let Some(i) = evidence
        .filter(|v| !v.is_null())
        .and_then(|v| serde_json::from_value::<Isolation>(v.clone()).ok())
    else {
        return "unmeasured (no evidence in this result): not fully confined".to_owned();
    };
    let measured = format!(
        "Landlock {} (ABI {}), seccomp {}, view {}, namespaces {}, uid {}",
        i.landlock,
        i.landlock_abi
            .map_or_else(|| UNMEASURED.to_owned(), |a| a.to_string()),
        i.seccomp,
        i.view,
        i.namespaces.as_ref().map_or_else(
            || UNMEASURED.to_owned(),
            |n| if n.is_empty() {
                "none".to_owned()
            } else {
                n.join(",")
            }
        ),
        i.uid
            .map_or_else(|| UNMEASURED.to_owned(), |u| u.to_string()),
    );
    let gaps = i.gaps();
    if gaps.is_empty() {
        format!("fully confined: {measured}")
    } else {
        format!(
            "NOT fully confined ({}); auto_accept leaves it to a human: {measured}",
            gaps.join("; ")
        )
    }
}

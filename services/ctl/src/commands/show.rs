//! `airlockctl show ID`: one task in detail.

use crate::client::{Client, CtlError};
use crate::output::{Ctx, text, text_opt, time, wire};
use crate::view;
use airlock_proto::task::{CapturedFile, CommandSummary, Isolation, TaskView, UNMEASURED};
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
    let task = client.sup().get_task(&args.task_id).await?;
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
pub fn render(ctx: &Ctx, t: &TaskView) -> String {
    let b = &t.binding;
    let mut rows: Vec<(&str, String)> = vec![
        ("Task", ctx.paint("1", &t.task_id)),
        ("State", ctx.state(t.state.as_str())),
        ("Attempt", format!("{} of {}", t.attempt, t.max_attempts)),
        ("Revision", t.revision.to_string()),
        ("Job", b.job_id.clone()),
        ("Repository", b.repository.clone()),
        (
            "Target branch",
            format!("{} ({})", b.target_branch, wire(&b.branch_mode)),
        ),
        ("Base", b.base_oid.clone()),
        ("Expected head", b.expected_branch_oid.clone()),
        ("Generation", b.generation.to_string()),
        ("Plan digest", t.plan_digest.clone()),
        ("Execution digest", t.execution_digest.clone()),
    ];
    if let Some(expires) = t.lease_expires_at_ms {
        rows.push((
            "Lease",
            format!("epoch {}, expires {}", t.lease_epoch, time(expires)),
        ));
    }
    match view::result(t) {
        None => {}
        Some(Err(e)) => rows.push(("Result", format!("(not readable by this airlockctl: {e})"))),
        Some(Ok(r)) => {
            let mut s = wire(&r.outcome);
            if let Some(c) = &r.commit_oid {
                s.push_str(&format!(", commit {c}"));
            }
            if let Some(c) = &r.failure_code {
                s.push_str(&format!(", {c}"));
            }
            rows.push(("Result", s));
            for c in &r.verification {
                rows.push(("Command", command(c)));
            }
            if let Some(c) = &r.captured {
                rows.push((
                    "Captured",
                    format!(
                        "{} file(s) from tree {} (captured in attempt {}); `airlockctl show {} --file PATH` prints one",
                        c.files.len(),
                        c.source_tree,
                        c.captured_in_attempt,
                        t.task_id,
                    ),
                ));
                for f in &c.files {
                    let line = if f.present {
                        let sha = f.sha256.as_deref().unwrap_or("");
                        format!(
                            "{}  {} bytes, sha256 {}",
                            f.path,
                            decoded_len(f),
                            &sha[..sha.len().min(16)]
                        )
                    } else {
                        format!("{}  (no such file at the source commit)", f.path)
                    };
                    rows.push(("File", line));
                }
                if !c.withheld.is_empty() {
                    rows.push((
                        "Withheld",
                        format!("{} (credential-like: never read)", c.withheld.join(", ")),
                    ));
                }
                if !c.source_signals.is_empty() {
                    rows.push(("Signals", c.source_signals.join(" | ")));
                }
            }
            rows.push(("Isolation", isolation(r.isolation.as_ref())));
            if let Some(l) = r.isolation.as_ref().and_then(|i| i.layer.as_ref()) {
                rows.push((
                    "Layer",
                    format!(
                        "{} ({} bytes, {}; {} setup command(s), {} egress decision(s))",
                        l.key,
                        l.bytes,
                        if l.reused {
                            "reused"
                        } else {
                            "made by this attempt"
                        },
                        l.setup.len(),
                        l.egress.len()
                    ),
                ));
            }
            if let Some(p) = &r.publication {
                rows.push((
                    "Published",
                    format!(
                        "{} at {} on {} ({}){}",
                        p.remote_ref,
                        p.commit_oid,
                        p.url,
                        if p.pushed {
                            "pushed by this attempt"
                        } else {
                            "already there: nothing sent again"
                        },
                        if p.push_options.is_empty() {
                            String::new()
                        } else {
                            format!(", push options {}", p.push_options.join(" "))
                        }
                    ),
                ));
            }
            if let Some(sig) = &r.signature {
                rows.push((
                    "Signed",
                    format!("as {}, key {}", sig.principal, sig.fingerprint),
                ));
            }
            if let Some(h) = &t.result_sha256 {
                rows.push(("Result SHA-256", h.clone()));
            }
        }
    }
    if let Some(v) = view::verification(t) {
        let mut s = text_opt(v.decision.as_ref());
        if let Some(r) = v.reason.as_ref().filter(|r| !r.is_null()) {
            s.push_str(&format!(": {}", text(r)));
        }
        if let Some(a) = v.actor.as_ref().and_then(Value::as_str) {
            s.push_str(&format!(" (by {a})"));
        }
        // An adopted head is the task's commit (airlockctl reconcile).
        if let Some(c) = v.commit_oid.as_ref().and_then(Value::as_str) {
            s.push_str(&format!(", commit {c}"));
        }
        rows.push(("Verification", s));
    }
    rows.push(("Created", time(t.created_at_ms)));
    rows.push(("Updated", time(t.updated_at_ms)));
    let w = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    rows.iter()
        .map(|(k, v)| format!("{:>w$}: {v}\n", k, w = w))
        .collect()
}

/// The content of a captured file of the task's result.
fn captured_file(task: &TaskView, path: &str) -> Result<Vec<u8>, CtlError> {
    use base64::Engine;
    let captured = view::result(task)
        .and_then(Result::ok)
        .and_then(|r| r.captured)
        .ok_or_else(|| {
            CtlError::local(
                airlock_proto::Code::MESSAGE_INVALID,
                format!("{} has no captured result", task.task_id),
            )
        })?;
    if captured.withheld.iter().any(|p| p == path) {
        return Err(CtlError::local(
            airlock_proto::Code::CREDENTIAL_PATH_DENIED,
            format!("{path} was withheld: a credential-like path is never captured"),
        ));
    }
    let file = captured
        .files
        .iter()
        .find(|f| f.path == path)
        .ok_or_else(|| {
            CtlError::local(
                airlock_proto::Code::PATH_INVALID,
                format!("{path} is not among the captured files"),
            )
        })?;
    let Some(b64) = &file.content_b64 else {
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
fn decoded_len(f: &CapturedFile) -> usize {
    let b64 = f.content_b64.as_deref().unwrap_or("");
    let pad = b64.bytes().rev().take_while(|b| *b == b'=').count();
    (b64.len() / 4 * 3).saturating_sub(pad)
}

/// One verification command of a result: how it ended, and its job's
/// walls — each limit with what the command reached against it.
fn command(c: &CommandSummary) -> String {
    let end = match (c.exit_code, c.timed_out) {
        (_, true) => "timed out".to_owned(),
        (Some(code), false) => format!("exit {code}"),
        (None, false) => "killed".to_owned(),
    };
    let mut s = format!("{}: {end}, {} ms", c.label, c.duration_ms);
    let Some(w) = &c.wall else {
        s.push_str(" (no walls between jobs)");
        return s;
    };
    let mib = |b: u64| format!("{:.1} MiB", b as f64 / f64::from(1u32 << 20));
    s.push_str(&format!(
        "; memory {} of {}{}",
        w.memory_peak_bytes.map_or_else(|| "-".to_owned(), mib),
        mib(w.memory_limit_bytes),
        if w.oom_kills > 0 {
            format!(" ({} OOM kill(s))", w.oom_kills)
        } else {
            String::new()
        }
    ));
    s.push_str(&format!(
        "; processes at most {}{}",
        w.processes_limit,
        if w.fork_refusals > 0 {
            format!(" ({} fork(s) refused)", w.fork_refusals)
        } else {
            String::new()
        }
    ));
    s.push_str(&format!(
        "; CPU {} used, {}",
        w.cpu_used_ms.map_or_else(
            || "-".to_owned(),
            |ms| format!("{:.2} s", ms as f64 / 1000.0)
        ),
        w.cpu_max_millis.map_or_else(
            || "no quota".to_owned(),
            |m| format!("quota {:.2} CPU(s)", m as f64 / 1000.0)
        )
    ));
    if let Some(limit) = w.disk_limit_bytes {
        s.push_str(&format!(
            "; disk {} written of {}",
            w.disk_peak_bytes.map_or_else(|| "-".to_owned(), mib),
            mib(limit)
        ));
    } else if let Some(peak) = w.disk_peak_bytes {
        s.push_str(&format!("; disk {} written, no quota", mib(peak)));
    }
    if w.disk_exceeded {
        s.push_str(" (killed past its disk quota)");
    }
    if w.disk_reserve_reached {
        s.push_str(" (killed for the host's free-space reserve)");
    }
    s.push_str(&format!(" (cgroup {})", w.cgroup));
    s
}

/// The isolation evidence of a result, in words: what was measured and,
/// when the commands were not fully confined, each gap (auto_accept then
/// leaves the decision to a human).
fn isolation(evidence: Option<&Isolation>) -> String {
    let Some(i) = evidence else {
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

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_proto::bundle::WallEvidence;

    #[test]
    fn a_command_shows_each_limit_beside_what_it_reached() {
        let mut c = CommandSummary {
            label: "hog".into(),
            exit_code: None,
            timed_out: false,
            duration_ms: 812,
            stdout_tail: None,
            stderr_tail: None,
            wall: Some(WallEvidence {
                cgroup: "v1".into(),
                memory_limit_bytes: 192 << 20,
                processes_limit: 48,
                memory_peak_bytes: Some(191 << 20),
                peak_per_command: true,
                oom_kills: 1,
                fork_refusals: 0,
                cpu_weight: Some(1024),
                cpu_max_millis: Some(1500),
                cpu_used_ms: Some(640),
                io_weight: None,
                disk_limit_bytes: Some(1 << 30),
                disk_peak_bytes: Some(3 << 20),
                disk_exceeded: false,
                disk_reserve_reached: false,
            }),
        };
        assert_eq!(
            command(&c),
            "hog: killed, 812 ms; memory 191.0 MiB of 192.0 MiB (1 OOM kill(s)); processes at most 48; CPU 0.64 s used, quota 1.50 CPU(s); disk 3.0 MiB written of 1024.0 MiB (cgroup v1)"
        );
        c.wall = None;
        c.exit_code = Some(0);
        assert_eq!(command(&c), "hog: exit 0, 812 ms (no walls between jobs)");
    }
}

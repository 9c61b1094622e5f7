//! `airlockctl verify ID accept|rework|reject --reason TEXT`, and the
//! decision path `cancel` shares.
//!
//! A decision is a compare-and-swap on what the admin saw: the command
//! reads the task, shows which attempt and result it decides on, and names
//! that task's revision, attempt and result SHA-256 in the request (or the
//! ones given with `--expect-*`, from an earlier `airlockctl show`). If the
//! task moved on in between, the supervisor refuses with
//! `DECISION_CAS_MISMATCH` (or `DECISION_RESULT_DRIFT`) and nothing
//! changes. The idempotency key is derived from the task, its revision,
//! the decision and the reason, so the same command about the same view
//! decides once; an identical replay returns the stored answer.

use crate::client::{Client, CtlError};
use crate::output::Ctx;
use airlock_proto::Code;
use airlock_proto::task::{Decision as Verdict, DecisionRequest};
use serde_json::json;
use std::process::ExitCode;

/// The decision on a verifying task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Decision {
    /// The result is good: SUCCEEDED.
    Accept,
    /// Try again: QUEUED while attempts remain, else FAILED.
    Rework,
    /// The result is wrong: FAILED.
    Reject,
}

impl Decision {
    fn verdict(self) -> Verdict {
        match self {
            Decision::Accept => Verdict::Accept,
            Decision::Rework => Verdict::Rework,
            Decision::Reject => Verdict::Reject,
        }
    }
}

/// What the decision is about, when the admin names it (else it is read
/// from the task now and shown).
#[derive(Debug, Default, clap::Args)]
pub struct Expect {
    /// The task revision the decision is about [default: the task's now].
    #[arg(long, value_name = "N")]
    pub expect_revision: Option<i64>,

    /// The attempt the decision is about [default: the task's now].
    #[arg(long, value_name = "N")]
    pub expect_attempt: Option<u32>,

    /// SHA-256 of the result the decision is about, or `none` when the task
    /// showed no result [default: the task's now; `airlockctl show` prints it].
    #[arg(long, value_name = "HEX|none")]
    pub expect_result_sha256: Option<String>,

    /// The idempotency key [default: derived from the task, its revision,
    /// the decision and the reason].
    #[arg(long, value_name = "KEY")]
    pub idempotency_key: Option<String>,
}

/// Arguments of `verify`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The task id.
    pub task_id: String,

    /// accept, rework or reject.
    #[arg(value_enum)]
    pub decision: Decision,

    /// Why (kept in the task's verification record).
    #[arg(long, value_name = "TEXT")]
    pub reason: String,

    #[command(flatten)]
    pub expect: Expect,
}

/// Records the decision.
pub async fn run(ctx: &Ctx, client: &Client, args: Args) -> Result<ExitCode, CtlError> {
    decide(
        ctx,
        client,
        &args.task_id,
        args.decision.verdict(),
        &args.reason,
        &args.expect,
    )
    .await
}

/// Builds the request from the task as shown (overridden by `expect`),
/// sends it, and prints the outcome.
pub async fn decide(
    ctx: &Ctx,
    client: &Client,
    task_id: &str,
    verdict: Verdict,
    reason: &str,
    expect: &Expect,
) -> Result<ExitCode, CtlError> {
    let view = client.sup().get_task(task_id).await?;
    let mut req = DecisionRequest::about(&view, verdict, reason, expect.idempotency_key.as_deref());
    if let Some(r) = expect.expect_revision {
        req.expected_revision = r;
    }
    if let Some(a) = expect.expect_attempt {
        req.expected_attempt = a;
    }
    if let Some(h) = &expect.expect_result_sha256 {
        req.expected_result_sha256 = match h.as_str() {
            "none" => None,
            h if airlock_proto::canonical::is_sha256_hex(h) => Some(h.to_owned()),
            _ => {
                return Err(CtlError::local(
                    Code::RESULT_SHA256_INVALID,
                    "--expect-result-sha256 takes 64 lowercase hex digits or `none`",
                ));
            }
        };
    }
    if !ctx.json {
        println!(
            "Deciding {verb} on {task_id}: {state} at revision {rev}, attempt {att}, result {sha}",
            verb = verdict.as_str(),
            state = view.state.as_str(),
            rev = req.expected_revision,
            att = req.expected_attempt,
            sha = req.expected_result_sha256.as_deref().unwrap_or("none"),
        );
    }
    let out = if verdict == Verdict::Cancel {
        client.sup().cancel_task(&req).await?
    } else {
        client.sup().verify(&req).await?
    };
    if ctx.json {
        ctx.print_json(&json!({"request": req.to_value(), "outcome": &out}));
    } else {
        let verb = match (out.idempotent, verdict) {
            (true, _) => "Already decided",
            (false, Verdict::Cancel) => "Cancelled",
            (false, _) => "Decided",
        };
        println!(
            "{verb} {} ({}, attempt {}, revision {}; key {})",
            ctx.paint("1", &out.task_id),
            ctx.state(out.state.as_str()),
            out.attempt,
            out.revision,
            out.idempotency_key
        );
    }
    Ok(ExitCode::SUCCESS)
}

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
/// sends it, and prints the outcome. A cancel refused because the attempt
/// is moving its branch (`TASK_COMMITTING`) is sent again, about the task
/// as it is then, once that step has ended (at most
/// [`COMMITTING_PATIENCE`]); with `--expect-*` it fails at once.
pub async fn decide(
    ctx: &Ctx,
    client: &Client,
    task_id: &str,
    verdict: Verdict,
    reason: &str,
    expect: &Expect,
) -> Result<ExitCode, CtlError> {
    let mut waiting = None;
    let (req, out) = loop {
        let (view, req) = request(client, task_id, verdict, reason, expect).await?;
        if waiting.is_none() {
            say_what(ctx, task_id, verdict, &view, &req);
        }
        let sent = if verdict == Verdict::Cancel {
            client.sup().cancel_task(&req).await
        } else {
            client.sup().verify(&req).await
        };
        match sent {
            // The attempt is moving its branch under a fence: a cancel now
            // would be acknowledged while the branch still moves. Wait for
            // the step to end and decide again about the task as it is then
            // (unless the admin named what the decision is about).
            Err(e) if e.code == Code::TASK_COMMITTING && expect.is_unset() => {
                if waiting.is_none() && !ctx.json {
                    println!(
                        "{task_id} (attempt {}) is moving its agent branch; waiting for that step to end",
                        view.attempt
                    );
                }
                let since = *waiting.get_or_insert_with(std::time::Instant::now);
                if since.elapsed() > COMMITTING_PATIENCE {
                    return Err(e.into());
                }
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            }
            sent => break (req, sent?),
        }
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

/// How long a cancel waits for an attempt's fenced step (its ref move or
/// push; a push is bounded by its timeout) before it gives up with
/// `TASK_COMMITTING`.
const COMMITTING_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10 * 60);

impl Expect {
    /// True when the admin named nothing the decision is about.
    fn is_unset(&self) -> bool {
        self.expect_revision.is_none()
            && self.expect_attempt.is_none()
            && self.expect_result_sha256.is_none()
            && self.idempotency_key.is_none()
    }
}

/// Reads the task and builds the decision about it as shown (overridden
/// by `expect`).
async fn request(
    client: &Client,
    task_id: &str,
    verdict: Verdict,
    reason: &str,
    expect: &Expect,
) -> Result<(airlock_proto::task::TaskView, DecisionRequest), CtlError> {
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
    Ok((view, req))
}

/// Prints what the decision is about.
fn say_what(
    ctx: &Ctx,
    task_id: &str,
    verdict: Verdict,
    view: &airlock_proto::task::TaskView,
    req: &DecisionRequest,
) {
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
}

//! `airlockctl reconcile list|show|resolve`: reconciliation cases, the
//! attempts whose branch moved behind the worker's back
//! (org.airlock.Reconcile1; polkit org.airlock.tasks.read to read,
//! org.airlock.reconcile.manage to resolve).
//!
//! A resolution is a compare-and-swap on what the admin saw, like
//! `verify`: the command reads the case, shows it, and names its attempt,
//! revision and observed head in the request (or the ones given with
//! `--expect-*`, from an earlier `reconcile show`). The idempotency key is
//! derived from the case, its revision, the resolution and the reason, so
//! the same command about the same view resolves once.

use crate::client::{Client, CtlError};
use crate::output::{Ctx, emit, or_dash, table, text_opt, time};
use crate::view;
use airlock_proto::Code;
use airlock_proto::reconcile::{CaseStatus, ReconciliationCase, Resolution, ResolveRequest};
use serde_json::json;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Arguments of `reconcile`.
pub type Args = super::Verbs<Action>;

/// `reconcile` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Action {
    /// List reconciliation cases (all, or only those in one status).
    List(ListArgs),
    /// Show a task's latest case: the branch, the commit the attempt made,
    /// the head the worker found, and what was decided.
    Show(ShowArgs),
    /// Adopt the observed head as the task's commit, or fail the task.
    ///
    /// adopt: the worker (which alone reads the repository) checks that
    /// the branch still holds the head and that it descends from the
    /// commit the task started from; only then is the task SUCCEEDED. If
    /// the branch moved again the case opens again with the new head
    /// (RECONCILIATION_HEAD_MOVED). fail: the task stays FAILED with
    /// RECONCILIATION_REQUIRED and your reason.
    Resolve(ResolveArgs),
}

/// Arguments of `reconcile list`.
#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// Only cases in this status.
    #[arg(long, value_enum)]
    pub status: Option<Status>,
}

/// A case's status, as a filter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Status {
    /// Waiting for an administrator.
    Open,
    /// Adopt chosen; waiting for the worker's check of the ref.
    Adopting,
    /// Adopted: the task SUCCEEDED.
    Adopted,
    /// Failed by an administrator.
    Failed,
}

impl Status {
    fn case_status(self) -> CaseStatus {
        match self {
            Status::Open => CaseStatus::Open,
            Status::Adopting => CaseStatus::Adopting,
            Status::Adopted => CaseStatus::Adopted,
            Status::Failed => CaseStatus::Failed,
        }
    }
}

/// Arguments of `reconcile show`.
#[derive(Debug, clap::Args)]
pub struct ShowArgs {
    /// The task id.
    pub task_id: String,
}

/// The resolution.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Choice {
    /// Make the observed head the task's commit (checked by the worker).
    Adopt,
    /// End the task FAILED with RECONCILIATION_REQUIRED and the reason.
    Fail,
}

/// Arguments of `reconcile resolve`.
#[derive(Debug, clap::Args)]
pub struct ResolveArgs {
    /// The task id.
    pub task_id: String,

    /// adopt or fail.
    #[arg(value_enum)]
    pub resolution: Choice,

    /// Why (kept with the case and in the event log).
    #[arg(long, value_name = "TEXT")]
    pub reason: String,

    /// The attempt of the case the resolution is about [default: the case's now].
    #[arg(long, value_name = "N")]
    pub expect_attempt: Option<u32>,

    /// The case revision the resolution is about [default: the case's now].
    #[arg(long, value_name = "N")]
    pub expect_revision: Option<i64>,

    /// The observed head the resolution is about, or `none` when the
    /// branch was missing [default: the case's now; `reconcile show` prints it].
    #[arg(long, value_name = "OID|none")]
    pub expect_head: Option<String>,

    /// The idempotency key [default: derived from the case, its revision,
    /// the resolution and the reason].
    #[arg(long, value_name = "KEY")]
    pub idempotency_key: Option<String>,

    /// After adopt, wait up to this many seconds for the worker's check
    /// and exit with its refusal's code if the case opened again (0: do
    /// not wait).
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    pub wait: u64,
}

/// Runs `reconcile`.
pub async fn run(ctx: &Ctx, client: &Client, args: Args) -> Result<ExitCode, CtlError> {
    match args.action {
        Action::List(a) => list(ctx, client, a).await,
        Action::Show(a) => {
            let case = client.sup().get_reconciliation(&a.task_id).await?;
            if ctx.json {
                ctx.print_json(&case);
            } else {
                emit(&render(ctx, &case));
            }
            Ok(ExitCode::SUCCESS)
        }
        Action::Resolve(a) => resolve(ctx, client, a).await,
    }
}

async fn list(ctx: &Ctx, client: &Client, args: ListArgs) -> Result<ExitCode, CtlError> {
    let status = args.status.map(|s| s.case_status().as_str()).unwrap_or("");
    let mut cases: Vec<ReconciliationCase> = Vec::new();
    let mut after = String::new();
    loop {
        let page = client.sup().list_reconciliations(status, &after, 0).await?;
        cases.extend(page.cases);
        match page.next_after {
            Some(next) => after = next,
            None => break,
        }
    }
    if ctx.json {
        ctx.print_json(&json!({ "cases": &cases }));
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<Vec<String>> = cases
        .iter()
        .map(|c| {
            vec![
                c.task_id.clone(),
                c.attempt.to_string(),
                c.status.as_str().to_owned(),
                c.branch.clone(),
                short(&c.commit_oid),
                head(c.observed_head.as_deref()),
                time(c.opened_at_ms),
            ]
        })
        .collect();
    emit(&table(
        ctx,
        &[
            "TASK", "ATTEMPT", "STATUS", "BRANCH", "COMMIT", "OBSERVED", "OPENED",
        ],
        &rows,
    ));
    Ok(ExitCode::SUCCESS)
}

fn short(s: &str) -> String {
    s[..s.len().min(12)].to_owned()
}

fn head(h: Option<&str>) -> String {
    h.unwrap_or("(branch missing)").to_owned()
}

/// The human form of one case.
pub fn render(ctx: &Ctx, c: &ReconciliationCase) -> String {
    let resolution = match view::resolution(c.resolution.as_ref()) {
        Some(r) => format!(
            "{} by {}: {}",
            text_opt(r.resolution.as_ref()),
            text_opt(r.actor.as_ref()),
            text_opt(r.reason.as_ref())
        ),
        None => "-".to_owned(),
    };
    let rows = [
        ("Task", ctx.paint("1", &c.task_id)),
        ("Attempt", c.attempt.to_string()),
        ("Status", c.status.as_str().to_owned()),
        ("Repository", c.repository.clone()),
        ("Branch", c.branch.clone()),
        ("Commit made", c.commit_oid.clone()),
        ("Observed head", head(c.observed_head.as_deref())),
        ("Base", c.base_oid.clone()),
        ("Resolution", resolution),
        ("Last refusal", or_dash(c.last_refusal.as_deref())),
        ("Revision", c.revision.to_string()),
        ("Opened", time(c.opened_at_ms)),
        ("Changed", time(c.updated_at_ms)),
    ];
    let mut out = String::new();
    for (k, v) in rows {
        out.push_str(&format!("{:<16}{v}\n", format!("{k}:")));
    }
    out
}

async fn resolve(ctx: &Ctx, client: &Client, args: ResolveArgs) -> Result<ExitCode, CtlError> {
    let case = client.sup().get_reconciliation(&args.task_id).await?;
    let resolution = match args.resolution {
        Choice::Adopt => Resolution::Adopt,
        Choice::Fail => Resolution::Fail,
    };
    let mut req = ResolveRequest::about(
        &case,
        resolution,
        &args.reason,
        args.idempotency_key.as_deref(),
    );
    if let Some(a) = args.expect_attempt {
        req.expected_attempt = a;
    }
    if let Some(r) = args.expect_revision {
        req.expected_revision = r;
    }
    if let Some(h) = &args.expect_head {
        req.expected_observed_head = match h.as_str() {
            "none" => None,
            h if airlock_proto::binding::is_oid(h) => Some(h.to_owned()),
            _ => {
                return Err(CtlError::local(
                    Code::RECONCILIATION_RESOLUTION_INVALID,
                    "--expect-head takes a commit id or `none`",
                ));
            }
        };
    }
    if !ctx.json {
        println!(
            "Resolving {verb} on {task}: case {status} at revision {rev}, attempt {att}, {branch} at {head}",
            verb = resolution.as_str(),
            task = args.task_id,
            status = case.status.as_str(),
            rev = req.expected_revision,
            att = req.expected_attempt,
            branch = case.branch,
            head = req
                .expected_observed_head
                .as_deref()
                .unwrap_or("(branch missing)"),
        );
    }
    let out = client.sup().resolve_reconciliation(&req).await?;
    // An adoption is settled by the worker's check of the ref: wait for it.
    let mut settled = None;
    if resolution == Resolution::Adopt && out.status == CaseStatus::Adopting && args.wait > 0 {
        let deadline = Instant::now() + Duration::from_secs(args.wait);
        loop {
            let now = client.sup().get_reconciliation(&args.task_id).await?;
            if now.status != CaseStatus::Adopting || Instant::now() >= deadline {
                settled = Some(now);
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    if ctx.json {
        ctx.print_json(&json!({
            "request": req.to_value(),
            "outcome": &out,
            "case": &settled,
        }));
    } else {
        let verb = if out.idempotent {
            "Already resolved"
        } else {
            "Resolved"
        };
        println!(
            "{verb} {} ({}, case {}, revision {}; key {})",
            ctx.paint("1", &out.task_id),
            out.resolution.as_str(),
            out.status.as_str(),
            out.revision,
            out.idempotency_key
        );
        if let Some(now) = &settled {
            match now.status {
                CaseStatus::Adopted => println!(
                    "Adopted: {} is SUCCEEDED with {} as its commit",
                    now.task_id,
                    now.observed_head.as_deref().unwrap_or("?")
                ),
                CaseStatus::Adopting => println!(
                    "Still waiting for the worker's check of {} after {} s",
                    now.branch, args.wait
                ),
                _ => println!(
                    "The worker refused the adoption ({}): the case is {} again, {} at {}",
                    now.last_refusal.as_deref().unwrap_or("?"),
                    now.status.as_str(),
                    now.branch,
                    now.observed_head.as_deref().unwrap_or("(branch missing)")
                ),
            }
        }
    }
    if let Some(now) = &settled {
        if now.status == CaseStatus::Open {
            let code = now
                .last_refusal
                .as_deref()
                .and_then(Code::from_name)
                .unwrap_or(Code::RECONCILIATION_HEAD_MOVED);
            return Ok(ExitCode::from(code.exit_code()));
        }
    }
    Ok(ExitCode::SUCCESS)
}

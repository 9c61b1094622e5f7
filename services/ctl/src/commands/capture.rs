//! `airlockctl capture`: a planner's read-only request. Builds a source
//! capture of a registered repository at a revision (the task builder of
//! airlock-client) and submits it: the executor reads the named files from
//! its copy of that commit, withholding credential-like paths, and the
//! files come back in the task's result (`airlockctl show ID`, `--file`).
//! Nothing is committed.

use super::propose::Submitting;
use crate::client::{Client, CtlError};
use crate::output::Ctx;
use airlock_builder::{Built, Proposal};
use airlock_proto::task::{Outcome, TaskState};
use std::process::ExitCode;
use std::time::Duration;

/// Arguments of `capture`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The registered repository (see `airlockctl repo list`).
    #[arg(long, value_name = "NAME")]
    pub repo: String,

    /// The revision to read: a branch, a tag or a commit id.
    #[arg(long, value_name = "REV")]
    pub base: String,

    /// The files to return, repository-relative (at most 64). A
    /// credential-like path (.env, *.pem, id_rsa, …) is withheld: listed
    /// in the result, never read.
    #[arg(value_name = "PATH", required = true)]
    pub paths: Vec<String>,

    /// A hint for the planner that reads the capture (kept in the result,
    /// whitespace folded; repeatable, at most 16 kept).
    #[arg(long = "signal", value_name = "TEXT")]
    pub signals: Vec<String>,

    /// The task id [default: p- and 16 random hex digits].
    #[arg(long, value_name = "ID")]
    pub task_id: Option<String>,

    #[command(flatten)]
    pub submitting: Submitting,

    /// Wait for the capture's result and show it (exit 0 only when the
    /// files were captured).
    #[arg(long)]
    pub wait: bool,
}

/// Builds the task (no bus needed).
pub fn build(args: &Args) -> Result<Built, CtlError> {
    let (_, repo) = super::propose::registered_repo(&args.submitting.config, &args.repo)?;
    let mut proposal = Proposal::new(&args.repo, &args.base);
    proposal.task_id = args.task_id.clone();
    proposal.max_attempts = args.submitting.max_attempts;
    Ok(proposal.capture(&repo, &args.paths, &args.signals)?)
}

/// Builds, then prints (`--dry-run`) or submits (and with `--wait` shows
/// the capture once it is there).
pub async fn run(ctx: &Ctx, client: Option<&Client>, args: Args) -> Result<ExitCode, CtlError> {
    let built = build(&args)?;
    if args.submitting.dry_run {
        return Ok(super::propose::dry_run(ctx, &built.task));
    }
    let client = client.expect("a client unless --dry-run");
    let out = client.sup().submit_task(&built.task).await?;
    if ctx.json && !args.wait {
        ctx.print_json(&out);
    } else if !ctx.json {
        super::print_task_line(ctx, "Submitted", &out.task);
    }
    if !args.wait {
        return Ok(ExitCode::SUCCESS);
    }
    // A capture's result waits in VERIFYING for a decision: the wait ends
    // there, or at a final state.
    let task = loop {
        let t = client.sup().get_task(&built.task_id).await?;
        if !matches!(t.state, TaskState::Queued | TaskState::Running) {
            break t;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let captured = crate::view::result(&task)
        .and_then(Result::ok)
        .is_some_and(|r| r.outcome == Outcome::Captured);
    if ctx.json {
        ctx.print_json(&task);
    } else {
        print!("{}", super::show::render(ctx, &task));
    }
    Ok(if captured {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

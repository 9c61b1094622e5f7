//! `airlockctl replan ID FILE`: replace a queued task's plan.

use super::{print_task_line, read_json_file};
use crate::client::{Client, CtlError};
use crate::output::Ctx;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `replan`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The task id.
    pub task_id: String,

    /// The new plan (airlock.plan.v1 JSON, or - for stdin). It must name
    /// the digest of the plan it replaces in expected_previous_plan_digest
    /// (see `airlockctl show ID`); a stale digest is refused.
    pub file: PathBuf,
}

/// Replaces the plan.
pub async fn run(ctx: &Ctx, client: &Client, args: Args) -> Result<ExitCode, CtlError> {
    let (_, plan) = read_json_file(&args.file)?;
    let task = client.sup().replace_plan(&args.task_id, &plan).await?;
    print_task_line(ctx, "Replanned", &task);
    if !ctx.json {
        println!("plan digest {}", task.plan_digest);
    }
    Ok(ExitCode::SUCCESS)
}

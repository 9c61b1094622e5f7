//! `airlockctl cancel ID --reason TEXT`.

use super::print_task_line;
use crate::client::{Client, CtlError, shown};
use crate::output::Ctx;
use std::process::ExitCode;

/// Arguments of `cancel`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The task id.
    pub task_id: String,

    /// Why (recorded in the event log).
    #[arg(long, value_name = "TEXT")]
    pub reason: String,
}

/// Cancels the task.
pub async fn run(ctx: &Ctx, client: &Client, args: Args) -> Result<ExitCode, CtlError> {
    let task = shown(
        &client
            .sup()
            .cancel_task(&args.task_id, &args.reason)
            .await?,
    );
    print_task_line(ctx, "Cancelled", &task);
    Ok(ExitCode::SUCCESS)
}

//! `airlockctl cancel ID --reason TEXT`: a decision like `verify`'s,
//! bound to the task as shown (see [`super::verify`]).

use super::verify::{Expect, decide};
use crate::client::{Client, CtlError};
use crate::output::Ctx;
use airlock_proto::task::Decision;
use std::process::ExitCode;

/// Arguments of `cancel`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The task id.
    pub task_id: String,

    /// Why (recorded in the event log).
    #[arg(long, value_name = "TEXT")]
    pub reason: String,

    #[command(flatten)]
    pub expect: Expect,
}

/// Cancels the task.
pub async fn run(ctx: &Ctx, client: &Client, args: Args) -> Result<ExitCode, CtlError> {
    decide(
        ctx,
        client,
        &args.task_id,
        Decision::Cancel,
        &args.reason,
        &args.expect,
    )
    .await
}

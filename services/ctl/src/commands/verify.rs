//! `airlockctl verify ID accept|rework|reject --reason TEXT`.

use super::print_task_line;
use crate::client::{Client, CtlError, shown};
use crate::output::Ctx;
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
    fn as_str(self) -> &'static str {
        match self {
            Decision::Accept => "accept",
            Decision::Rework => "rework",
            Decision::Reject => "reject",
        }
    }
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
}

/// Records the decision.
pub async fn run(ctx: &Ctx, client: &Client, args: Args) -> Result<ExitCode, CtlError> {
    let task = shown(
        &client
            .sup()
            .verify(&args.task_id, args.decision.as_str(), &args.reason)
            .await?,
    );
    print_task_line(ctx, "Decided", &task);
    Ok(ExitCode::SUCCESS)
}

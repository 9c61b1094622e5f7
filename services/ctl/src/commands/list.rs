//! `airlockctl list [--state S]`: tasks, paged through to the end.

use crate::client::{Client, CtlError};
use crate::output::{Ctx, emit, table, time};
use airlock_proto::task::{TaskState, TaskView};
use std::process::ExitCode;

/// Arguments of `list`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Only tasks in this state (QUEUED, RUNNING, VERIFYING, SUCCEEDED, FAILED, CANCELLED).
    #[arg(long, value_name = "STATE", value_parser = parse_state)]
    pub state: Option<String>,

    /// At most this many tasks (default: all).
    #[arg(long, value_name = "N")]
    pub limit: Option<u32>,
}

fn parse_state(s: &str) -> Result<String, String> {
    TaskState::parse(&s.to_ascii_uppercase())
        .map(|st| st.as_str().to_owned())
        .map_err(|_| {
            let names: Vec<&str> = TaskState::ALL.iter().map(|s| s.as_str()).collect();
            format!("expected one of {}", names.join(", "))
        })
}

/// Page size asked of the supervisor.
const PAGE: u32 = 500;

/// Lists the tasks.
pub async fn run(ctx: &Ctx, client: &Client, args: Args) -> Result<ExitCode, CtlError> {
    let state = args.state.unwrap_or_default();
    let mut tasks: Vec<TaskView> = Vec::new();
    let mut after = String::new();
    loop {
        let want = match args.limit {
            Some(l) => (l as usize).saturating_sub(tasks.len()).min(PAGE as usize) as u32,
            None => PAGE,
        };
        if want == 0 {
            break;
        }
        let page = client.sup().list_tasks(&state, &after, want).await?;
        tasks.extend(page.tasks);
        match page.next_after {
            Some(next) => after = next,
            None => break,
        }
    }
    if ctx.json {
        ctx.print_json(&tasks);
        return Ok(ExitCode::SUCCESS);
    }
    if tasks.is_empty() {
        println!("No tasks.");
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<Vec<String>> = tasks
        .iter()
        .map(|t| {
            vec![
                t.task_id.clone(),
                ctx.state(t.state.as_str()),
                format!("{}/{}", t.attempt, t.max_attempts),
                t.binding.repository.clone(),
                t.binding.target_branch.clone(),
                time(t.updated_at_ms),
            ]
        })
        .collect();
    emit(&table(
        ctx,
        &[
            "TASK",
            "STATE",
            "ATTEMPT",
            "REPOSITORY",
            "BRANCH",
            "UPDATED",
        ],
        &rows,
    ));
    Ok(ExitCode::SUCCESS)
}

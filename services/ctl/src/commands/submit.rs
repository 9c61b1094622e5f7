//! `airlockctl submit FILE [--wait]`.

use super::read_json_file;
use crate::client::{BUS_NAME, Client, CtlError};
use crate::output::Ctx;
use airlock_proto::bus::tasks;
use futures_util::StreamExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Arguments of `submit`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The task (airlock.task.v1 JSON: schema, binding, plan, max_attempts), or - for stdin.
    pub file: PathBuf,

    /// Follow the task until it is SUCCEEDED, FAILED or CANCELLED, showing
    /// each state change (exit 0 only if it SUCCEEDED). With --json, one
    /// JSON line per change.
    #[arg(long)]
    pub wait: bool,
}

/// How often the task is polled in case a signal was missed.
const POLL: Duration = Duration::from_secs(5);

fn is_terminal(state: &str) -> bool {
    matches!(state, "SUCCEEDED" | "FAILED" | "CANCELLED")
}

/// A stream of TaskChanged signals for one task (all tasks if `task_id` is empty).
pub async fn task_changes(
    client: &Client,
    task_id: Option<&str>,
) -> Result<zbus::MessageStream, CtlError> {
    let mut rule = zbus::MatchRule::builder()
        .msg_type(zbus::message::Type::Signal)
        .sender(BUS_NAME)?
        .interface(tasks::INTERFACE)?
        .member(tasks::TASK_CHANGED)?;
    if let Some(id) = task_id {
        rule = rule.arg(0, id)?;
    }
    Ok(zbus::MessageStream::for_match_rule(rule.build(), client.connection(), None).await?)
}

/// Submits, and follows when asked.
pub async fn run(ctx: &Ctx, client: &Client, args: Args) -> Result<ExitCode, CtlError> {
    let (_, value) = read_json_file(&args.file)?;
    Ok(submit_and_follow(ctx, client, &value, args.wait).await?.0)
}

/// Submits `value` (an airlock.task.v1 document) and, with `wait`, follows
/// the task to its end: exit 0 only if it SUCCEEDED. Returns the last view
/// of the task when it was followed.
pub async fn submit_and_follow(
    ctx: &Ctx,
    client: &Client,
    value: &serde_json::Value,
    wait: bool,
) -> Result<(ExitCode, Option<airlock_proto::task::TaskView>), CtlError> {
    let task_id = value["binding"]["task_id"].as_str().map(str::to_owned);
    // Subscribe before submitting, so no change can be missed.
    let mut changes = if wait {
        Some(task_changes(client, task_id.as_deref()).await?)
    } else {
        None
    };
    let out = client.sup().submit_task(value).await?;
    if ctx.json {
        ctx.print_json(&out);
    } else {
        let verb = if out.idempotent {
            "Already submitted"
        } else {
            "Submitted"
        };
        super::print_task_line(ctx, verb, &out.task);
    }
    let Some(changes) = changes.as_mut() else {
        return Ok((ExitCode::SUCCESS, None));
    };
    let id = out.task.task_id.clone();
    let mut revision = out.task.revision;
    let mut state = out.task.state.as_str().to_owned();
    loop {
        if is_terminal(&state) {
            let last = client.sup().get_task(&id).await?;
            if ctx.json {
                ctx.print_json(&last);
            } else {
                super::print_task_line(ctx, "Finished", &last);
            }
            let succeeded = last.state == airlock_proto::task::TaskState::Succeeded;
            let code = if succeeded {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            };
            return Ok((code, Some(last)));
        }
        // The signal carries the state itself, so a quick succession of
        // changes is shown change by change; the poll covers a lost signal.
        let seen: Option<(String, i64)> = tokio::select! {
            signal = changes.next() => match signal {
                None => return Err(CtlError::generic("the bus connection closed while waiting")),
                Some(Err(e)) => return Err(e.into()),
                Some(Ok(msg)) => msg
                    .body()
                    .deserialize::<(String, String, i64)>()
                    .ok()
                    .filter(|(t, _, _)| *t == id)
                    .map(|(_, s, r)| (s, r)),
            },
            _ = tokio::time::sleep(POLL) => {
                let now = client.sup().get_task(&id).await?;
                Some((now.state.as_str().to_owned(), now.revision))
            }
        };
        let Some((new_state, new_revision)) = seen else {
            continue;
        };
        if new_revision <= revision {
            continue;
        }
        revision = new_revision;
        if new_state != state {
            if ctx.json {
                ctx.print_json(&serde_json::json!({
                    "task_id": id, "state": new_state, "revision": new_revision,
                }));
            } else {
                println!("  {id}: {}", ctx.state(&new_state));
            }
            state = new_state;
        }
    }
}

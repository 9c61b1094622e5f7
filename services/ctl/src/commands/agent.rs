//! `airlockctl agent list|show|start|stop|clear-hold`: the planner agents
//! the supervisor runs (org.airlock.Agents1; polkit
//! org.airlock.agents.read and .manage).

use crate::client::{Client, CtlError, shown};
use crate::output::{Ctx, emit, table, text, time_of};
use serde_json::Value;
use std::process::ExitCode;

/// Arguments of `agent`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// What to do.
    #[command(subcommand)]
    pub action: Action,
}

/// `agent` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Action {
    /// List the configured agents with their state and failures.
    List,
    /// Show one agent: state, consecutive failures, next start, last exit, the hold's reason.
    Show(Name),
    /// Start a stopped agent (refused while held: clear the hold instead).
    Start(Name),
    /// Stop an agent; it stays stopped, across supervisor restarts too, until started.
    Stop(Name),
    /// Clear a crash-loop hold: the failure count resets and the agent starts.
    ClearHold(Name),
}

/// One agent's name.
#[derive(Debug, clap::Args)]
pub struct Name {
    /// The agent's name ([[agent]] name in airlock.toml).
    pub name: String,
}

/// Runs `agent`.
pub async fn run(ctx: &Ctx, client: &Client, args: Args) -> Result<ExitCode, CtlError> {
    let sup = client.sup();
    let (verb, agent) = match args.action {
        Action::List => {
            let list = shown(&sup.list_agents().await?);
            if ctx.json {
                ctx.print_json(&list);
            } else {
                let rows: Vec<Vec<String>> = list["agents"]
                    .as_array()
                    .map(Vec::as_slice)
                    .unwrap_or_default()
                    .iter()
                    .map(|a| {
                        vec![
                            text(&a["name"]),
                            ctx.state(a["state"].as_str().unwrap_or("?")),
                            text(&a["consecutive_failures"]),
                            time_of(&a["next_start_at_ms"]),
                            repositories(a),
                        ]
                    })
                    .collect();
                emit(&table(
                    ctx,
                    &["NAME", "STATE", "FAILURES", "NEXT START", "REPOSITORIES"],
                    &rows,
                ));
            }
            return Ok(ExitCode::SUCCESS);
        }
        Action::Show(n) => ("", sup.get_agent(&n.name).await?),
        Action::Start(n) => ("Started", sup.start_agent(&n.name).await?),
        Action::Stop(n) => ("Stopped", sup.stop_agent(&n.name).await?),
        Action::ClearHold(n) => ("Hold cleared", sup.clear_hold(&n.name).await?),
    };
    let agent = shown(&agent);
    if ctx.json {
        ctx.print_json(&agent);
    } else {
        if !verb.is_empty() {
            emit(&format!("{verb}: {}\n", text(&agent["name"])));
        }
        emit(&render(ctx, &agent));
    }
    Ok(ExitCode::SUCCESS)
}

fn repositories(a: &Value) -> String {
    a["repositories"]
        .as_array()
        .map(|r| r.iter().map(text).collect::<Vec<_>>().join(", "))
        .unwrap_or_default()
}

/// The human form of one agent.
pub fn render(ctx: &Ctx, a: &Value) -> String {
    let last = match (
        a["last_exit_status"].as_i64(),
        a["last_exit_signal"].as_i64(),
    ) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => format!("signal {sig}"),
        (None, None) => "-".to_owned(),
    };
    let rows = [
        ("Agent", ctx.paint("1", &text(&a["name"]))),
        ("State", ctx.state(a["state"].as_str().unwrap_or("?"))),
        ("Consecutive failures", text(&a["consecutive_failures"])),
        ("Next start", time_of(&a["next_start_at_ms"])),
        ("Running since", time_of(&a["running_since_ms"])),
        ("Last exit", last),
        ("Last failure", text(&a["last_failure"])),
        ("Hold", text(&a["hold_reason"])),
        ("Repositories", repositories(a)),
        ("Changed", time_of(&a["updated_at_ms"])),
    ];
    let mut out = String::new();
    for (k, v) in rows {
        out.push_str(&format!("{:<22}{v}\n", format!("{k}:")));
    }
    out
}

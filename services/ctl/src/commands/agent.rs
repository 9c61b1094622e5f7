//! `airlockctl agent list|show|start|stop|clear-hold|cancel-queued`: the planner agents
//! the supervisor runs (org.airlock.Agents1; polkit
//! org.airlock.agents.read and .manage).

use crate::client::{Client, CtlError};
use crate::output::{Ctx, emit, or_dash, table, time_u};
use airlock_proto::bus::{AgentLimits, AgentView};
use std::process::ExitCode;

/// Arguments of `agent`.
pub type Args = super::Verbs<Action>;

/// `agent` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Action {
    /// List the configured agents with their state and failures.
    List,
    /// Show one agent: state, consecutive failures, next start, last exit, the hold's reason,
    /// and its quotas (tasks per hour, CPU seconds per day) and cap on running tasks with
    /// their use now.
    Show(Name),
    /// Start a stopped agent (refused while held: clear the hold instead).
    Start(Name),
    /// Stop an agent; it stays stopped, across supervisor restarts too, until started.
    Stop(Name),
    /// Clear a crash-loop hold: the failure count resets and the agent starts.
    ClearHold(Name),
    /// Cancel the queued tasks a stopped (or held) agent submitted: each ends
    /// CANCELLED with AGENT_REVOKED. Refused with AGENT_RUNNING while the
    /// agent runs (stop it first); a running task finishes or fails as it would.
    CancelQueued(CancelQueued),
    /// Run the configured agent NAME in this process: the entry point of
    /// airlock-agent@NAME.service (not a command for administrators).
    ///
    /// Reads the agent from the configuration (the argv is never taken from
    /// anywhere else), refuses to run as root, lowers RLIMIT_AS to its
    /// memory_max_mib and RLIMIT_CORE to 0, and executes its command with a
    /// clean environment: PATH, HOME (the unit's state directory),
    /// AIRLOCK_AGENT, CREDENTIALS_DIRECTORY when the agent has a
    /// credential_file (systemd's LoadCredential=), and the variables its
    /// environment allowlist names, from this process's environment (the
    /// unit's Environment= or EnvironmentFile= drop-ins).
    #[command(hide = true)]
    Exec(Exec),
}

/// Arguments of `agent exec`.
#[derive(Debug, clap::Args)]
pub struct Exec {
    /// The agent's name ([[agent]] name in airlock.toml).
    pub name: String,
    /// The configuration file.
    #[arg(long, value_name = "PATH", default_value = airlock_config::DEFAULT_PATH)]
    pub config: std::path::PathBuf,
}

/// Arguments of `agent cancel-queued`.
#[derive(Debug, clap::Args)]
pub struct CancelQueued {
    /// The agent's name ([[agent]] name in airlock.toml, or one no longer configured).
    pub name: String,
    /// Why, recorded in each task's TASK_CANCELLED event.
    #[arg(long, value_name = "TEXT")]
    pub reason: String,
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
            let list = sup.list_agents().await?;
            if ctx.json {
                ctx.print_json(&list);
            } else {
                let rows: Vec<Vec<String>> = list
                    .agents
                    .iter()
                    .map(|a| {
                        vec![
                            a.name.clone(),
                            ctx.state(&a.state),
                            a.consecutive_failures.to_string(),
                            time_u(a.next_start_at_ms),
                            a.repositories.join(", "),
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
        Action::Show(n) => {
            let agent = sup.get_agent(&n.name).await?;
            // A supervisor older than protocol 12.0 has no GetAgentLimits,
            // and a store it cannot read has no use to count: the agent is
            // shown without them.
            let limits = match sup.get_agent_limits(&n.name).await {
                Ok(l) => Some(l),
                Err(e) => {
                    ctx.warn(&format!("{}'s quotas are not shown: {e}", n.name));
                    None
                }
            };
            if ctx.json {
                let mut value = serde_json::to_value(&agent).unwrap_or_default();
                value["limits"] = serde_json::to_value(&limits).unwrap_or_default();
                ctx.print_json(&value);
            } else {
                emit(&render(ctx, &agent));
                if let Some(l) = &limits {
                    emit(&render_limits(l));
                }
            }
            return Ok(ExitCode::SUCCESS);
        }
        Action::Start(n) => ("Started", sup.start_agent(&n.name).await?),
        Action::Stop(n) => ("Stopped", sup.stop_agent(&n.name).await?),
        Action::ClearHold(n) => ("Hold cleared", sup.clear_hold(&n.name).await?),
        Action::CancelQueued(c) => {
            let out = sup.cancel_agent_queued(&c.name, &c.reason).await?;
            if ctx.json {
                ctx.print_json(&out);
            } else {
                let mut text = format!(
                    "Cancelled {} queued task(s) of agent {} (AGENT_REVOKED)\n",
                    out.cancelled.len(),
                    out.name
                );
                for t in &out.cancelled {
                    text.push_str(&format!("  {t}\n"));
                }
                emit(&text);
            }
            return Ok(ExitCode::SUCCESS);
        }
        Action::Exec(_) => unreachable!("agent exec does not use the bus"),
    };
    if ctx.json {
        ctx.print_json(&agent);
    } else {
        if !verb.is_empty() {
            emit(&format!("{verb}: {}\n", agent.name));
        }
        emit(&render(ctx, &agent));
    }
    Ok(ExitCode::SUCCESS)
}

/// The human form of one agent.
pub fn render(ctx: &Ctx, a: &AgentView) -> String {
    let last = match (a.last_exit_status, a.last_exit_signal) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => format!("signal {sig}"),
        (None, None) => "-".to_owned(),
    };
    let rows = [
        ("Agent", ctx.paint("1", &a.name)),
        ("State", ctx.state(&a.state)),
        ("Consecutive failures", a.consecutive_failures.to_string()),
        ("Next start", time_u(a.next_start_at_ms)),
        ("Running since", time_u(a.running_since_ms)),
        ("Last exit", last),
        ("Last failure", or_dash(a.last_failure.as_deref())),
        ("Hold", or_dash(a.hold_reason.as_deref())),
        ("Repositories", a.repositories.join(", ")),
        ("Changed", time_u(Some(a.updated_at_ms))),
    ];
    let mut out = String::new();
    for (k, v) in rows {
        out.push_str(&format!("{:<22}{v}\n", format!("{k}:")));
    }
    out
}

/// The human form of an agent's quotas and cap with their use: "USE of
/// LIMIT in WINDOW", or "USE in WINDOW (no quota)"; the running tasks with
/// their cap.
pub fn render_limits(l: &AgentLimits) -> String {
    let u = &l.usage;
    let line = |used: String, limit: u64, unit: &str, window: &str| {
        if limit == 0 {
            format!("{used}{unit} {window} (no quota)")
        } else {
            format!("{used}{unit} of {limit}{unit} {window}")
        }
    };
    let rows = [
        (
            "Tasks per hour",
            line(
                u.tasks_last_hour.to_string(),
                u64::from(l.tasks_per_hour),
                "",
                "in the last hour",
            ),
        ),
        (
            "CPU seconds per day",
            line(
                format!("{:.1}", u.cpu_ms_last_day as f64 / 1000.0),
                l.cpu_seconds_per_day,
                " s",
                "in the last day (verification's wall-clock time)",
            ),
        ),
        (
            "Running",
            match l.max_running {
                0 => format!("{} (no cap)", u.running),
                cap => format!("{} (cap {cap})", u.running),
            },
        ),
    ];
    let mut out = String::new();
    for (k, v) in rows {
        out.push_str(&format!("{:<22}{v}\n", format!("{k}:")));
    }
    out
}

/// `agent exec`: replaces this process with the configured agent, or
/// returns why it cannot.
pub fn exec(args: Exec) -> Result<ExitCode, CtlError> {
    use airlock_proto::Code;
    use std::os::unix::process::CommandExt;

    if nix::unistd::Uid::effective().is_root() {
        return Err(CtlError::local(
            Code::AUTHORIZATION_DENIED,
            "agent exec runs an agent as its own user (airlock-agent), never as root",
        ));
    }
    let config = airlock_config::Config::load(&args.config)
        .map_err(|e| CtlError::local(Code::CONFIG_INVALID, e.to_string()))?;
    let agent = config
        .agents
        .iter()
        .find(|a| a.name == args.name)
        .ok_or_else(|| {
            CtlError::local(
                Code::AGENT_NOT_FOUND,
                format!("no agent {:?} in {}", args.name, args.config.display()),
            )
        })?;
    let home = std::env::var_os("STATE_DIRECTORY").unwrap_or_else(|| "/".into());
    let mut cmd = std::process::Command::new(&agent.command[0]);
    cmd.args(&agent.command[1..])
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", &home)
        .env("AIRLOCK_AGENT", &agent.name)
        .current_dir(&home);
    for name in &agent.environment {
        if let Some(v) = std::env::var_os(name) {
            cmd.env(name, v);
        }
    }
    if agent.credential_file.is_some()
        && let Some(dir) = std::env::var_os("CREDENTIALS_DIRECTORY")
    {
        cmd.env("CREDENTIALS_DIRECTORY", dir);
    }
    let memory = u64::from(agent.memory_max_mib) * 1024 * 1024;
    let limit = |r, v| {
        nix::sys::resource::setrlimit(r, v, v).map_err(|e| {
            CtlError::local(Code::SANDBOX_UNAVAILABLE, format!("setrlimit {r:?}: {e}"))
        })
    };
    limit(nix::sys::resource::Resource::RLIMIT_AS, memory)?;
    limit(nix::sys::resource::Resource::RLIMIT_CORE, 0)?;
    let e = cmd.exec();
    Err(CtlError::generic(format!("{}: {e}", agent.command[0])))
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_proto::bus::AgentUsage;

    #[test]
    fn show_names_each_quota_with_its_use() {
        let limits = AgentLimits {
            name: "planner".into(),
            tasks_per_hour: 10,
            cpu_seconds_per_day: 0,
            max_running: 2,
            usage: AgentUsage {
                tasks_last_hour: 3,
                cpu_ms_last_day: 12_500,
                running: 1,
            },
        };
        assert_eq!(
            render_limits(&limits),
            "Tasks per hour:       3 of 10 in the last hour\n\
             CPU seconds per day:  12.5 s in the last day (verification's wall-clock time) (no quota)\n\
             Running:              1 (cap 2)\n"
        );
        let none = AgentLimits {
            tasks_per_hour: 0,
            cpu_seconds_per_day: 3600,
            max_running: 0,
            ..limits
        };
        let out = render_limits(&none);
        assert!(out.contains("3 in the last hour (no quota)"), "{out}");
        assert!(out.contains("12.5 s of 3600 s in the last day"), "{out}");
        assert!(out.contains("Running:              1 (no cap)"), "{out}");
    }
}

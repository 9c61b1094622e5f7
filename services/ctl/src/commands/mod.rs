//! One module per subcommand: each declares its `Args` (clap) and `run`.
//! New commands (`retry extend`, `doctor`) add a module here and a variant
//! in [`crate::cli::Command`].

pub mod agent;
pub mod cancel;
pub mod capture;
pub mod completions;
pub mod config;
pub mod doctor;
pub mod events;
pub mod list;
pub mod propose;
pub mod reconcile;
pub mod replan;
pub mod repo;
pub mod retry;
pub mod show;
pub mod status;
pub mod submit;
pub mod upstream;
pub mod verify;

use crate::agent::Agent as TextAgent;
use crate::cli::{Cli, Command};
use crate::client::{Client, CtlError, wants_interaction};
use crate::output::Ctx;
use airlock_proto::Code;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Arguments of a command that is only its subcommands (`agent`,
/// `reconcile`, `retry`): each module names its own as
/// `pub type Args = Verbs<Action>;`.
#[derive(Debug, clap::Args)]
pub struct Verbs<A: clap::Subcommand> {
    /// What to do.
    #[command(subcommand)]
    pub action: A,
}

/// The bus to reach the supervisor on: `--bus`, else the configuration's
/// `supervisor.bus_address` (a `--config` that does not load is an error;
/// the default file counts only when it loads and names one), else `None`:
/// DBUS_SYSTEM_BUS_ADDRESS or the system bus.
fn bus_address(cli: &Cli) -> Result<Option<String>, CtlError> {
    if let Some(bus) = &cli.bus {
        return Ok(Some(bus.clone()));
    }
    let loaded = match &cli.config {
        Some(path) => Some(
            airlock_config::Config::load(path)
                .map_err(|e| CtlError::local(Code::CONFIG_INVALID, e.to_string()))?,
        ),
        None => airlock_config::Config::load(Path::new(airlock_config::DEFAULT_PATH)).ok(),
    };
    Ok(loaded
        .map(|c| c.supervisor.bus_address)
        .filter(|a| !a.is_empty()))
}

/// Runs one subcommand.
pub async fn dispatch(ctx: &Ctx, mut cli: Cli) -> Result<ExitCode, CtlError> {
    if let Command::Completions(args) = &cli.command {
        return completions::run(args);
    }
    // One `--config` for every command that reads the configuration.
    let config_path = cli
        .config
        .clone()
        .unwrap_or_else(|| PathBuf::from(airlock_config::DEFAULT_PATH));
    match &mut cli.command {
        Command::Propose(a) => a.submitting.config = config_path.clone(),
        Command::Capture(a) => a.submitting.config = config_path.clone(),
        Command::Retry(retry::Args {
            action: retry::Action::Extend(a),
        }) => a.config = config_path.clone(),
        Command::Doctor(a) => a.config = config_path.clone(),
        Command::Repo(a) => a.config = config_path.clone(),
        _ => {}
    }
    let cli = match cli.command {
        Command::Doctor(args) => return Ok(doctor::run(ctx, args).await),
        // Repositories are files and git, not the bus.
        Command::Repo(args) => return repo::run(ctx, args),
        Command::Config(args) => return config::run(ctx, &config_path, args),
        // The agent unit's entry point: the configuration, then execve.
        Command::Agent(agent::Args {
            action: agent::Action::Exec(args),
        }) => return agent::exec(args),
        // A dry run builds the task without the supervisor.
        Command::Propose(args) if args.submitting.dry_run => {
            return propose::run(ctx, None, args).await;
        }
        Command::Capture(args) if args.submitting.dry_run => {
            return capture::run(ctx, None, args).await;
        }
        command => Cli { command, ..cli },
    };
    let interactive = wants_interaction(cli.no_ask_password);
    let client = Client::connect(interactive, bus_address(&cli)?.as_deref()).await?;
    // A text agent lets polkit ask for a password on this terminal.
    let _agent = if interactive {
        TextAgent::start()
    } else {
        None
    };
    match cli.command {
        Command::Submit(a) => submit::run(ctx, &client, a).await,
        Command::List(a) => list::run(ctx, &client, a).await,
        Command::Show(a) => show::run(ctx, &client, a).await,
        Command::Cancel(a) => cancel::run(ctx, &client, a).await,
        Command::Verify(a) => verify::run(ctx, &client, a).await,
        Command::Replan(a) => replan::run(ctx, &client, a).await,
        Command::Events(a) => events::run(ctx, &client, a).await,
        Command::Status(a) => status::run(ctx, &client, a).await,
        Command::Retry(a) => retry::run(ctx, &client, a).await,
        Command::Agent(a) => agent::run(ctx, &client, a).await,
        Command::Reconcile(a) => reconcile::run(ctx, &client, a).await,
        Command::Propose(a) => propose::run(ctx, Some(&client), a).await,
        Command::Capture(a) => capture::run(ctx, Some(&client), a).await,
        Command::Completions(_) | Command::Doctor(_) | Command::Repo(_) | Command::Config(_) => {
            unreachable!("handled above")
        }
    }
}

/// Reads a JSON file (`-` = stdin), bounded like any D-Bus argument.
pub fn read_json_file(path: &Path) -> Result<(String, serde_json::Value), CtlError> {
    use std::io::Read;
    let limit = airlock_proto::limits::MAX_MESSAGE_BYTES as u64;
    let mut text = String::new();
    let read = if path == Path::new("-") {
        std::io::stdin().take(limit + 1).read_to_string(&mut text)
    } else {
        std::fs::File::open(path).and_then(|f| f.take(limit + 1).read_to_string(&mut text))
    };
    read.map_err(|e| CtlError::generic(format!("{}: {e}", path.display())))?;
    if text.len() as u64 > limit {
        return Err(CtlError::local(
            Code::FIELD_BOUNDS_EXCEEDED,
            format!("{} is larger than {limit} bytes", path.display()),
        ));
    }
    let value = serde_json::from_str(&text).map_err(|e| {
        CtlError::local(
            Code::MESSAGE_INVALID,
            format!("{} is not JSON: {e}", path.display()),
        )
    })?;
    Ok((text, value))
}

/// Prints a task: JSON, or the one-line summary used after changes.
pub fn print_task_line(ctx: &Ctx, verb: &str, task: &airlock_proto::task::TaskView) {
    if ctx.json {
        ctx.print_json(task);
    } else {
        println!(
            "{verb} {} ({}, attempt {}/{})",
            ctx.paint("1", &task.task_id),
            ctx.state(task.state.as_str()),
            task.attempt,
            task.max_attempts
        );
    }
}

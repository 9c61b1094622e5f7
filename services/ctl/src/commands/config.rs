//! `airlockctl config show`: the configuration the services read, with
//! its drop-ins merged and every default filled in, and the files it came
//! from. `airlockctl config migrate`: an earlier release's edited
//! airlock.toml becomes a settings drop-in in airlock.toml.d/ (what the
//! package's upgrade runs, so that dpkg never stops at a conffile prompt;
//! see packaging/README.md). Files, not the bus.

use crate::client::CtlError;
use crate::output::Ctx;
use airlock_proto::Code;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Arguments of `config`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// What to do.
    #[command(subcommand)]
    pub command: ConfigCommand,
}

/// The `config` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ConfigCommand {
    /// Print the configuration the services read: the file with its
    /// drop-ins (airlock.toml.d/, repositories.d/) merged and every
    /// default filled in, as TOML (with --json: the files read and the
    /// configuration as JSON). A configuration the services would refuse
    /// is refused here with the same message.
    Show,
    /// Move the settings of an earlier release's airlock.toml into a
    /// drop-in: the keys whose values differ from the built-in defaults and
    /// the [[repository]] and [[agent]] tables (comments are not carried).
    /// FROM is not changed; the drop-in is refused if it exists, and is
    /// removed again if the configuration with it does not load.
    Migrate {
        /// The earlier file (the package's upgrade passes
        /// /etc/airlock/airlock.toml.dpkg-old).
        #[arg(long, value_name = "FILE")]
        from: PathBuf,
        /// The drop-in to write (root, 0644, written durably).
        #[arg(
            long,
            value_name = "FILE",
            default_value = "/etc/airlock/airlock.toml.d/50-migrated.toml"
        )]
        to: PathBuf,
        /// Print the drop-in instead of writing it.
        #[arg(long)]
        dry_run: bool,
    },
}

/// Runs `config` on the configuration file `config` (airlockctl's global
/// `--config`; for `migrate`, the file the drop-in belongs to, loaded with
/// it to check the result).
pub fn run(ctx: &Ctx, config: &Path, args: Args) -> Result<ExitCode, CtlError> {
    match args.command {
        ConfigCommand::Show => show(ctx, config),
        ConfigCommand::Migrate { from, to, dry_run } => migrate(ctx, &from, &to, config, dry_run),
    }
}

fn show(ctx: &Ctx, config: &Path) -> Result<ExitCode, CtlError> {
    let loaded = airlock_config::Config::load(config).map_err(|e| invalid(e.to_string()))?;
    let files = airlock_config::files_read(config).map_err(|e| invalid(e.to_string()))?;
    if ctx.json {
        ctx.print_json(&json!({"files": files, "config": loaded}));
        return Ok(ExitCode::SUCCESS);
    }
    let text = toml::to_string(&loaded)
        .map_err(|e| CtlError::local(Code::INTERNAL, format!("the configuration as TOML: {e}")))?;
    println!("# The configuration airlock's services read, defaults filled in, from:");
    for f in &files {
        println!("#   {}", f.display());
    }
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}

fn invalid(message: String) -> CtlError {
    CtlError::local(Code::CONFIG_INVALID, message)
}

fn migrate(
    ctx: &Ctx,
    from: &Path,
    to: &Path,
    config: &Path,
    dry_run: bool,
) -> Result<ExitCode, CtlError> {
    let text = std::fs::read_to_string(from)
        .map_err(|e| invalid(format!("{}: cannot read it: {e}", from.display())))?;
    let migrated =
        airlock_config::migrated_settings(&text, from).map_err(|e| invalid(e.to_string()))?;
    let body = format!(
        "# Moved here from {} by `airlockctl config migrate` on upgrade: the\n\
         # settings that differ from the built-in defaults, and the repository\n\
         # and agent tables. That file is kept as it was; the defaults and what\n\
         # each key means are in /usr/share/doc/airlock/airlock.toml.example.\n{}",
        from.display(),
        migrated.text
    );
    let report = |written: bool| {
        json!({
            "from": from,
            "to": to,
            "written": written,
            "kept": migrated.kept,
            "defaults_dropped": migrated.defaults_dropped,
        })
    };
    if dry_run {
        if ctx.json {
            let mut v = report(false);
            v["text"] = json!(body);
            ctx.print_json(&v);
        } else {
            print!("{body}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    if to.symlink_metadata().is_ok() {
        return Err(invalid(format!(
            "{}: exists already; expected a new drop-in (remove it, or pass --to)",
            to.display()
        )));
    }
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| invalid(format!("{}: cannot make it: {e}", dir.display())))?;
    }
    airlock_config::write_durably(to, body.as_bytes(), 0o644, None)
        .map_err(|e| invalid(format!("{}: cannot write it: {e}", to.display())))?;
    if let Err(e) = airlock_config::Config::load(config) {
        let _ = std::fs::remove_file(to);
        return Err(invalid(format!(
            "with {} the configuration does not load, so it was removed again: {e}",
            to.display()
        )));
    }
    if ctx.json {
        ctx.print_json(&report(true));
    } else {
        println!(
            "{}: {} setting(s) moved from {} ({}), {} default(s) left out",
            to.display(),
            migrated.kept.len(),
            from.display(),
            if migrated.kept.is_empty() {
                "none".to_owned()
            } else {
                migrated.kept.join(", ")
            },
            migrated.defaults_dropped
        );
    }
    Ok(ExitCode::SUCCESS)
}

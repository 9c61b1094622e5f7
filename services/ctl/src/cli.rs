//! The command line, declared once. The man page (`airlockctl.1`) and the
//! shell completions are generated from these definitions.

use crate::commands::{
    agent, cancel, capture, completions, config, doctor, events, list, propose, reconcile, replan,
    repo, retry, show, status, submit, verify,
};
use airlock_proto::Class;
use clap::{CommandFactory, Parser, Subcommand};
use std::path::PathBuf;

/// Administer airlock: submit, inspect, verify and cancel tasks held by the
/// airlock supervisor (org.airlock.Supervisor1 on the D-Bus system bus).
///
/// Every call is authorised by polkit on the supervisor's side
/// (org.airlock.tasks.read, .read-all, .submit, .manage;
/// org.airlock.agents.read, .manage; org.airlock.reconcile.manage): a
/// caller reads the tasks it submitted, and every task only with
/// org.airlock.tasks.read-all (root has it). When stdin is a terminal,
/// airlockctl allows interactive authentication and starts a text
/// authentication agent if none is running.
#[derive(Debug, Parser)]
#[command(
    name = "airlockctl",
    version,
    max_term_width = 100,
    after_long_help = exit_status_help(),
    propagate_version = true
)]
pub struct Cli {
    /// Print machine-readable JSON instead of tables (errors too, on stderr).
    #[arg(long, global = true)]
    pub json: bool,

    /// Never ask for a password: do not allow interactive authorisation.
    #[arg(long, global = true)]
    pub no_ask_password: bool,

    /// The configuration file [default: /etc/airlock/airlock.toml]: the
    /// repositories, environments and programs of the commands that read
    /// it, and the bus (supervisor.bus_address) every command reaches the
    /// supervisor on — airlock-local records its private bus there.
    #[arg(long, global = true, value_name = "PATH")]
    pub config: Option<PathBuf>,

    /// Reach the supervisor on this D-Bus address (e.g.
    /// unix:path=/run/dbus/system_bus_socket), whatever the configuration,
    /// DBUS_SYSTEM_BUS_ADDRESS or the system bus would give.
    #[arg(long, global = true, value_name = "ADDRESS")]
    pub bus: Option<String>,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands, one module each under `commands/`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Propose changes: build a task from a work tree or a diff against a
    /// registered repository, and submit it (the planner's one command).
    Propose(propose::Args),
    /// Capture files of a registered repository at a revision, read-only:
    /// they come back in the task's result (credential-like paths
    /// withheld), nothing is committed.
    Capture(capture::Args),
    /// Submit a task (an airlock.task.v1 JSON file, or - for stdin).
    Submit(submit::Args),
    /// List tasks, optionally only those in one state.
    List(list::Args),
    /// Show one task in detail.
    Show(show::Args),
    /// Cancel a task that has not finished.
    Cancel(cancel::Args),
    /// Decide on a task waiting in VERIFYING: accept, rework or reject.
    Verify(verify::Args),
    /// Replace a queued task's plan (compare-and-swap on the previous plan's digest).
    Replan(replan::Args),
    /// Show the event log (every decision, denials included), optionally following it.
    Events(events::Args),
    /// Show the supervisor's state: authoriser, settings and queue counts.
    Status(status::Args),
    /// Owner actions through airlock-retryd (not the bus): `retry extend ID`.
    Retry(retry::Args),
    /// Authority repositories: add (import and register), list, remove, clone.
    Repo(repo::Args),
    /// The configuration files: show the merged configuration, or migrate
    /// an earlier release's edited airlock.toml into a drop-in in
    /// airlock.toml.d/.
    Config(config::Args),
    /// Planner agents the supervisor runs: list, show, start, stop, clear-hold, cancel-queued.
    Agent(agent::Args),
    /// Reconciliation cases (a branch moved behind the worker's back): list, show, resolve adopt|fail.
    Reconcile(reconcile::Args),
    /// Check this machine: users, directories, kernel features, bus, polkit, each unit's hardening, databases, configuration.
    ///
    /// Each check passes, warns or fails and names its fix. The hardening
    /// verifier takes every directive the package's unit files set (compiled
    /// into airlockctl from units/) and checks it on its own, by name, against
    /// the running unit as `systemctl show` reports it, drop-ins included:
    /// airlock-supervisor, -worker, -executor and -retryd (service and socket),
    /// and every running instance of a shipped template
    /// (airlock-agent@NAME.service, its %i expanded). A directive whose
    /// effective value differs from the shipped one, that systemctl does not
    /// report, or that it reports in a form the verifier does not recognise
    /// fails as "UNIT Directive" (with --json, "unit" and "property"), and
    /// the fix names the drop-in. Sets compare as sets (paths with their "-",
    /// groups, capabilities, address prefixes with "any" and "localhost"
    /// expanded), times, sizes, limits and modes as numbers, booleans in any
    /// spelling; SystemCallFilter= and RestrictAddressFamilies= match when
    /// nothing is allowed beyond the shipped lines (the groups expanded by
    /// this host's `systemd-analyze syscall-filter`). Not verified:
    /// Description=, Documentation=, dependencies (systemd adds its own),
    /// LoadCredential= (systemctl prints [unprintable]).
    ///
    /// Exit status 0 when nothing fails (warnings allowed), 1 when a check fails.
    #[command(after_long_help = doctor::families_help())]
    Doctor(doctor::Args),
    /// Print a shell completion script.
    Completions(completions::Args),
}

/// The EXIT STATUS text, generated from the error catalogue's classes.
pub fn exit_status_help() -> String {
    let classes: [(Class, &str); 9] = [
        (Class::Invalid, "the request was malformed or out of bounds"),
        (Class::Unauthenticated, "no or a wrong credential"),
        (
            Class::Denied,
            "not allowed (polkit said no, polkit unreachable, wrong uid, protected ref, ...)",
        ),
        (Class::NotFound, "no such task"),
        (
            Class::Conflict,
            "conflicts with the task's current state (wrong state, CAS mismatch, ...)",
        ),
        (Class::TooLarge, "too large"),
        (
            Class::Unavailable,
            "the supervisor, its store or the bus is not available (retry later)",
        ),
        (Class::Internal, "an internal error (a bug)"),
        (
            Class::InteractiveRequired,
            "authentication is needed but was not allowed (no terminal, or --no-ask-password)",
        ),
    ];
    let mut s = String::from(
        "Exit status:\n  0   success (submit --wait: the task SUCCEEDED)\n  1   failure not from the supervisor (submit --wait: the task FAILED or was CANCELLED)\n  2   usage error\n",
    );
    for (class, what) in classes {
        s.push_str(&format!("  {:<3} {what}\n", class.exit_code()));
    }
    s.push_str(
        "\nThe supervisor's D-Bus error names map back to airlock's error codes\n\
         (org.airlock.Error.<CODE>); with --json, errors are printed on stderr as\n\
         {\"error\": {\"code\", \"dbus_error\", \"message\", \"exit_code\"}}.\n\
         \nThe bus: --bus ADDRESS, else supervisor.bus_address in the configuration\n(--config FILE; the default file when it sets one), else\nDBUS_SYSTEM_BUS_ADDRESS, else the system bus.\n\nEnvironment:\n  DBUS_SYSTEM_BUS_ADDRESS   talk to this bus instead of the system bus\n  NO_COLOR                  never colour the output",
    );
    s
}

/// The clap command, for the man page and completions.
pub fn command() -> clap::Command {
    Cli::command()
}

/// One of clap_mangen's section renderers.
type RenderSection = fn(&clap_mangen::Man, &mut dyn std::io::Write) -> std::io::Result<()>;

/// The man page, rendered from [`command`]: clap_mangen's title, name,
/// synopsis, description and options, then one subsection per command
/// with its own usage and arguments, then the exit status.
pub fn man_page() -> Vec<u8> {
    let mut cmd = command();
    cmd.build();
    let man = clap_mangen::Man::new(cmd.clone())
        .section("1")
        .manual("airlock")
        .source(concat!("airlock ", env!("CARGO_PKG_VERSION")));
    let mut out = Vec::new();
    let sections: [RenderSection; 5] = [
        clap_mangen::Man::render_title,
        clap_mangen::Man::render_name_section,
        clap_mangen::Man::render_synopsis_section,
        clap_mangen::Man::render_description_section,
        clap_mangen::Man::render_options_section,
    ];
    for render in sections {
        render(&man, &mut out).expect("rendering to memory cannot fail");
    }
    let mut roff = String::from(".SH COMMANDS\n");
    for sub in cmd.get_subcommands_mut() {
        if sub.get_name() == "help" {
            continue;
        }
        let usage = sub.render_usage().to_string();
        let usage = usage.trim_start_matches("Usage: ");
        roff.push_str(&format!(".SS \"{}\"\n", roff_escape(usage)));
        let about = sub
            .get_long_about()
            .or_else(|| sub.get_about())
            .map(|a| a.to_string())
            .unwrap_or_default();
        roff.push_str(&format!("{}\n", roff_escape(&about)));
        if let Some(after) = sub.get_after_long_help() {
            roff.push_str(".PP\n.nf\n");
            for line in after.to_string().lines() {
                roff.push_str(&format!("{}\n", roff_escape(line)));
            }
            roff.push_str(".fi\n");
        }
        for arg in sub.get_arguments() {
            if arg.is_hide_set()
                || arg.is_global_set()
                || matches!(arg.get_id().as_str(), "help" | "version")
            {
                continue;
            }
            let name = match (arg.get_short(), arg.get_long()) {
                (Some(s), Some(l)) => format!("\\fB\\-{s}\\fR, \\fB\\-\\-{}\\fR", roff_escape(l)),
                (None, Some(l)) => format!("\\fB\\-\\-{}\\fR", roff_escape(l)),
                _ => format!(
                    "\\fI{}\\fR",
                    roff_escape(
                        &arg.get_value_names()
                            .and_then(|v| v.first())
                            .map(|v| v.to_string())
                            .unwrap_or_else(|| arg.get_id().as_str().to_ascii_uppercase())
                    )
                ),
            };
            let value = match (arg.get_long(), arg.get_value_names()) {
                (Some(_), Some(v)) if arg.get_action().takes_values() => {
                    format!(" \\fI{}\\fR", roff_escape(&v[0]))
                }
                _ => String::new(),
            };
            let help = arg
                .get_long_help()
                .or_else(|| arg.get_help())
                .map(|h| h.to_string())
                .unwrap_or_default();
            roff.push_str(&format!(".TP\n{name}{value}\n{}\n", roff_escape(&help)));
        }
    }
    roff.push_str(".SH \"EXIT STATUS AND ENVIRONMENT\"\n.nf\n");
    for line in exit_status_help().lines() {
        roff.push_str(&roff_escape(line));
        roff.push('\n');
    }
    roff.push_str(".fi\n");
    out.extend_from_slice(roff.as_bytes());
    clap_mangen::Man::render_version_section(&man, &mut out)
        .expect("rendering to memory cannot fail");
    out
}

/// Escapes text for roff: backslashes, hyphens, and a leading dot or quote.
fn roff_escape(s: &str) -> String {
    let mut out = s.replace('\\', "\\e").replace('-', "\\-");
    if out.starts_with('.') || out.starts_with('\'') {
        out.insert_str(0, "\\&");
    }
    out.replace("\n.", "\n\\&.")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_definition_is_consistent() {
        command().debug_assert();
    }

    #[test]
    fn every_exit_code_is_documented() {
        let help = exit_status_help();
        for code in airlock_proto::Code::ALL {
            assert!(
                help.contains(&format!("  {:<3} ", code.exit_code())),
                "{code}"
            );
        }
    }
}

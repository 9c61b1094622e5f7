//! airlockctl: the admin CLI for airlock, a client of
//! `org.airlock.Supervisor1` on the D-Bus system bus.
//!
//! - [`cli`]: the clap definitions (one table for every flag; the man page
//!   and the shell completions are generated from it);
//! - [`commands`]: one module per subcommand, each with its `Args` and `run`;
//! - [`client`]: the bus connection, calls with ALLOW_INTERACTIVE_AUTHORIZATION
//!   when stdin is a terminal, and D-Bus errors mapped back to the catalogue;
//! - [`agent`]: a polkit text agent for interactive authorisation;
//! - [`hardening`]: `doctor`'s hardening verifier, each shipped unit
//!   directive against `systemctl show`;
//! - [`output`]: tables, colour (only on a terminal, never with NO_COLOR),
//!   JSON for scripts;
//! - [`view`]: the free-form JSON inside some replies (a stored result, a
//!   verification record, an event's actor and payload) as types. Every
//!   reply is rendered from its typed fields, never read by string key.
//!
//! Exit status: 0 on success, 1 for a generic failure, 2 for a usage error,
//! and otherwise the catalogue code's exit code ([`airlock_proto::Code::exit_code`]).

pub mod agent;
pub mod cli;
pub mod client;
pub mod commands;
pub mod hardening;
pub mod output;
pub mod view;

use std::process::ExitCode;

/// Runs a parsed command line and returns the process exit status.
pub fn run(cli: cli::Cli) -> ExitCode {
    let ctx = output::Ctx::new(cli.json);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            let err = client::CtlError::local(
                airlock_proto::Code::INTERNAL,
                format!("tokio runtime: {e}"),
            );
            return ctx.fail(&err);
        }
    };
    match runtime.block_on(commands::dispatch(&ctx, cli)) {
        Ok(status) => status,
        Err(e) => ctx.fail(&e),
    }
}

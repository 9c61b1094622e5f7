//! `airlockctl completions SHELL`: a completion script on stdout.

use crate::client::CtlError;
use clap_complete::Shell;
use std::process::ExitCode;

/// Arguments of `completions`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The shell: bash, zsh, fish, elvish or powershell.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// Prints the script.
pub fn run(args: &Args) -> Result<ExitCode, CtlError> {
    let mut cmd = crate::cli::command();
    clap_complete::generate(args.shell, &mut cmd, "airlockctl", &mut std::io::stdout());
    Ok(ExitCode::SUCCESS)
}

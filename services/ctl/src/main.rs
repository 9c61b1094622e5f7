//! `airlockctl`: administer airlock over the D-Bus system bus.

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    airlockctl::run(airlockctl::cli::Cli::parse())
}

//! airlock-bench: benchmarks against named baselines.
//!
//! Each benchmark measures airlock beside the baseline that bounds it, on
//! the same machine and disk, in the same run, and prints both and their
//! ratio. It never asserts a timing: figures depend on the hardware, and
//! the ratio is what carries from one machine to another.
//!
//! ```text
//! airlock-bench store [--dir DIR] [--seconds N] [--rounds R]
//! airlock-bench confine [--runs N] [--confine PATH] [--bwrap PATH]
//! ```
//!
//! See `bench/README.md` for what each figure means.

mod confine;
mod store;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// Benchmarks against named baselines.
#[derive(Debug, Parser)]
#[command(name = "airlock-bench", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Durable-write cost: raw write+fsync beside checkpoint appends and
    /// claim→result cycles of the task store.
    Store {
        /// Directory on the disk to measure (default: a fresh temporary
        /// directory under /var/tmp, removed afterwards).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Seconds each measurement runs in each round.
        #[arg(long, default_value_t = 1.0, value_parser = parse_seconds)]
        seconds: f64,
        /// Rounds; every figure is the median over the rounds.
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
        rounds: u32,
    },
    /// Confinement cost: /bin/true and python3 -c pass bare, through the
    /// executor's spawner (minimal root and host view), under
    /// airlock-confine and under bubblewrap with an equivalent policy.
    Confine {
        /// Measured runs of each command under each variant.
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(5..=10_000))]
        runs: u32,
        /// The airlock-confine binary (default: beside this binary).
        #[arg(long)]
        confine: Option<PathBuf>,
        /// The bubblewrap binary (default: /usr/bin/bwrap; skipped when absent).
        #[arg(long)]
        bwrap: Option<PathBuf>,
    },
}

fn parse_seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if (0.05..=600.0).contains(&v) {
        Ok(v)
    } else {
        Err("must be between 0.05 and 600".into())
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Store {
            dir,
            seconds,
            rounds,
        } => store::run(dir.as_deref(), seconds, rounds),
        Command::Confine {
            runs,
            confine,
            bwrap,
        } => confine::run(runs, confine.as_deref(), bwrap.as_deref()),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("airlock-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

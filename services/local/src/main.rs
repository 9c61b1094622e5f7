//! airlock-local: the whole airlock suite on one machine, without systemd.
//!
//! `up` starts a private dbus-daemon, the supervisor, the worker, the
//! executor (in its own network namespace) and the retry API as separate
//! processes — as distinct uids when started as root, otherwise as the
//! caller with a plain warning — and runs until Ctrl-C. `demo` does the
//! same in a fresh state directory, makes a sample repository, submits a
//! task, shows its progress and the result, and exits.

use airlock_local::{demo, start};
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Run the whole airlock suite on this machine without systemd.
#[derive(Debug, Parser)]
#[command(name = "airlock-local", version, about, long_about)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start every component and run until Ctrl-C; prints how to reach them.
    Up {
        /// State directory (created; kept afterwards).
        #[arg(long, value_name = "DIR", default_value = "airlock-local-state")]
        state: PathBuf,
    },
    /// Start everything in a fresh state directory, run a sample task end to end, print the result, stop.
    Demo {
        /// Print one JSON object (task_id, state, commit_oid, target_branch, verification) instead of text.
        #[arg(long)]
        json: bool,
        /// State directory [default: a new temporary directory, removed afterwards].
        #[arg(long, value_name = "DIR")]
        state: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = match args.command {
        Command::Up { state } => up(state),
        Command::Demo { json, state } => demo::run(json, state),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("airlock-local: {e}");
            ExitCode::FAILURE
        }
    }
}

fn up(state: PathBuf) -> Result<(), String> {
    let mut suite = start(state, false)?;
    println!(
        "airlock is running (state in {}).",
        suite.layout.root.display()
    );
    println!(
        "  bus:        DBUS_SYSTEM_BUS_ADDRESS='{}'",
        suite.bus.address()
    );
    println!(
        "  admin CLI:  DBUS_SYSTEM_BUS_ADDRESS='{}' airlockctl status",
        suite.bus.address()
    );
    println!(
        "  retry API:  {} (token in {})",
        suite.retry_url,
        suite.layout.token().display()
    );
    println!("  logs:       {}", suite.layout.logs().display());
    println!(
        "  separation: {}",
        if suite.ids.separated {
            "on (one uid per component)"
        } else {
            "OFF (all components run as you)"
        }
    );
    println!("Ctrl-C stops everything.");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = std::sync::Arc::clone(&stop);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    std::thread::spawn(move || {
        rt.block_on(async {
            let _ = tokio::signal::ctrl_c().await;
        });
        flag.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        suite.fleet.check_alive()?;
        std::thread::sleep(Duration::from_millis(300));
    }
    println!("stopping…");
    suite.fleet.stop(Duration::from_secs(10));
    Ok(())
}

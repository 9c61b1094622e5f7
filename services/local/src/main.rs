//! airlock-local: the whole airlock suite on one machine, without systemd.
//!
//! `up` starts a private dbus-daemon, the supervisor, the worker, the
//! executor (in its own network namespace) and the retry API as separate
//! processes — as distinct uids when started as root, otherwise as the
//! caller with a plain warning — and runs until Ctrl-C. `demo` does the
//! same in a fresh state directory, makes a sample repository, submits a
//! task, shows its progress and the result, and exits.

mod demo;
mod fleet;
mod layout;

use airlock_supervisor::testbus::TestBus;
use clap::{Parser, Subcommand};
use fleet::{Fleet, Spec, wait_for_log};
use layout::{Ids, Layout};
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

/// The running suite.
#[derive(Debug)]
pub struct Suite {
    pub layout: Layout,
    pub ids: Ids,
    pub bus: TestBus,
    pub fleet: Fleet,
    pub retry_url: String,
}

fn sibling(name: &str) -> Result<PathBuf, String> {
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let path = me
        .parent()
        .map(|d| d.join(name))
        .unwrap_or_else(|| PathBuf::from(name));
    if path.exists() {
        Ok(path)
    } else {
        Err(format!(
            "{} not found next to airlock-local; build the workspace first (cargo build --release --workspace)",
            path.display()
        ))
    }
}

/// Prepares the state directory and starts every component.
pub fn start(state: PathBuf, quiet: bool) -> Result<Suite, String> {
    let ids = Ids::for_caller()?;
    if !ids.separated && !quiet {
        eprintln!(
            "airlock-local: WARNING: not running as root, so every component runs as your user: privilege separation is OFF."
        );
    }
    let root = std::path::absolute(&state).map_err(|e| e.to_string())?;
    let layout = Layout { root };
    layout::create(&layout, &ids)
        .map_err(|e| format!("preparing {}: {e}", layout.root.display()))?;
    let supervisor_bin = sibling("airlock-supervisor")?;
    let worker_bin = sibling("airlock-worker")?;
    let executor_bin = sibling("airlock-executor")?;
    let retryd_bin = sibling("airlock-retryd")?;
    let confine_bin = sibling("airlock-confine")?;

    std::fs::write(layout.config(), layout::config_text(&layout, &ids))
        .map_err(|e| e.to_string())?;
    let mut token = [0u8; 32];
    getrandom::getrandom(&mut token).map_err(|e| e.to_string())?;
    layout::file(
        &layout.token(),
        hex::encode(token).as_bytes(),
        0o600,
        ids.retry,
        &ids,
    )
    .map_err(|e| e.to_string())?;
    demo::create_repository(&layout, &ids)?;

    let bus = TestBus::start_with_owner(&ids.name(ids.supervisor))
        .map_err(|e| format!("starting dbus-daemon: {e}"))?;
    let address = bus.address().to_owned();
    let config = layout.config().display().to_string();
    let logs = layout.logs();
    let mut fleet = Fleet::default();
    let s = |v: &str| v.to_owned();
    fleet
        .start(
            Spec {
                name: "supervisor",
                program: supervisor_bin,
                args: vec![
                    s("--config"),
                    config.clone(),
                    s("--bus-address"),
                    address.clone(),
                ],
                env: vec![],
                id: ids.supervisor,
                new_netns: false,
            },
            &ids,
            &logs,
        )
        .map_err(|e| e.to_string())?;
    demo::wait_for_name(&address, Duration::from_secs(20))
        .map_err(|e| format!("{e}\n{}", fleet::tail(&logs.join("supervisor.log"), 15)))?;
    fleet
        .start(
            Spec {
                name: "executor",
                program: executor_bin,
                args: vec![
                    s("serve"),
                    s("--config"),
                    config.clone(),
                    s("--spool"),
                    layout.spool().display().to_string(),
                    s("--worker-uid"),
                    ids.worker.uid.to_string(),
                    s("--confine"),
                    confine_bin.display().to_string(),
                    s("--work"),
                    layout.path("exec/work").display().to_string(),
                ],
                env: vec![],
                id: ids.executor,
                new_netns: true,
            },
            &ids,
            &logs,
        )
        .map_err(|e| e.to_string())?;
    fleet
        .start(
            Spec {
                name: "worker",
                program: worker_bin,
                args: vec![
                    s("--config"),
                    config,
                    s("--bus-address"),
                    address,
                    s("--executor-uid"),
                    ids.executor.uid.to_string(),
                ],
                env: vec![],
                id: ids.worker,
                new_netns: false,
            },
            &ids,
            &logs,
        )
        .map_err(|e| e.to_string())?;
    fleet
        .start(
            Spec {
                name: "retryd",
                program: retryd_bin,
                args: vec![
                    s("--db"),
                    layout.tasks_db().display().to_string(),
                    s("--listen"),
                    s("127.0.0.1:0"),
                    s("--token-file"),
                    layout.token().display().to_string(),
                ],
                env: vec![("AIRLOCK_RETRY_AUTHORIZATION_ID", s("airlock-local-owner"))],
                id: ids.retry,
                new_netns: false,
            },
            &ids,
            &logs,
        )
        .map_err(|e| e.to_string())?;
    let retry_addr = wait_for_log(
        &logs.join("retryd.log"),
        "listening on ",
        Duration::from_secs(15),
    )
    .ok_or_else(|| {
        format!(
            "retryd did not start:\n{}",
            fleet::tail(&logs.join("retryd.log"), 15)
        )
    })?;
    std::thread::sleep(Duration::from_millis(300));
    fleet.check_alive()?;
    Ok(Suite {
        layout,
        ids,
        bus,
        fleet,
        retry_url: format!("http://{retry_addr}"),
    })
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

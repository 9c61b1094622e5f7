//! airlock-mcp: see the crate docs (src/lib.rs) and docs/mcp.md.

use airlock_mcp::{AirlockMcp, Settings, limits};
use clap::Parser;
use rmcp::ServiceExt;
use std::io::Write;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::ExitCode;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, ReadBuf};

/// MCP tool server for airlock: lets a coding agent read the repositories
/// airlock serves and propose changes to them as verified tasks, which
/// land only on agent/ branches. Started by the agent's MCP client over
/// stdio; runs as the agent's user and holds no credential (the
/// supervisor's polkit rules decide what that user may do). stdout carries
/// the protocol only, logs go to stderr (AIRLOCK_LOG=debug for more), and
/// it exits when stdin closes.
#[derive(Debug, Parser)]
#[command(name = "airlock-mcp", version, after_help = AFTER_HELP)]
struct Cli {
    /// airlock's configuration: the registered repositories and the
    /// executor's programs.
    #[arg(long, value_name = "PATH", default_value = airlock_config::DEFAULT_PATH)]
    config: PathBuf,

    /// Verification presets, offered to propose_change by name
    /// ([preset.NAME] commands = ["python3 -m unittest -q"]); a missing
    /// file means none.
    #[arg(long, value_name = "PATH", default_value = "/etc/airlock/mcp.toml")]
    presets: PathBuf,

    /// The longest wait_for_task waits, in seconds (at most 45, below the
    /// usual 60 s tool timeout of MCP clients).
    #[arg(long, value_name = "SECONDS", default_value_t = limits::MAX_WAIT_SECONDS,
          value_parser = clap::value_parser!(u64).range(1..=limits::MAX_WAIT_SECONDS))]
    max_wait: u64,

    /// Print the tool catalogue (names, descriptions, schemas,
    /// annotations) as JSON and exit.
    #[arg(long)]
    print_tools: bool,
}

const AFTER_HELP: &str = "Tools, in order: list_repositories, resolve_ref, list_files, read_file, \
propose_change, task_status, wait_for_task, get_task_log, list_tasks, cancel_task.\n\n\
Environment:\n  DBUS_SYSTEM_BUS_ADDRESS   talk to this bus instead of the system bus\n  \
AIRLOCK_LOG               log filter on stderr (default info)\n\n\
Configure it in Claude Code with\n  claude mcp add airlock -- airlock-mcp\n\
and in Codex CLI (~/.codex/config.toml) with\n  [mcp_servers.airlock]\n  command = \"airlock-mcp\"\n\
See docs/mcp.md.";

/// stdin with a bound on one line (one JSON-RPC message): a longer line
/// ends the session instead of growing a buffer without end.
struct BoundedLines<R> {
    inner: R,
    line: usize,
}

impl<R: AsyncRead + Unpin> AsyncRead for BoundedLines<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let mut line = self.line;
            for b in &buf.filled()[before..] {
                line = if *b == b'\n' { 0 } else { line + 1 };
                if line > limits::MAX_MESSAGE_BYTES {
                    return Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("a message longer than {} bytes", limits::MAX_MESSAGE_BYTES),
                    )));
                }
            }
            self.line = line;
        }
        polled
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.print_tools {
        let tools = airlock_mcp::server::tool_list();
        let text = serde_json::to_string_pretty(&tools).unwrap_or_default();
        // A closed pipe (| head) is not an error worth a panic.
        let _ = writeln!(std::io::stdout(), "{text}");
        return ExitCode::SUCCESS;
    }
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("AIRLOCK_LOG")
                .unwrap_or_else(|_| "info,rmcp=warn".into()),
        )
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("airlock-mcp: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let settings = Settings {
        config: cli.config,
        presets: cli.presets,
        bus: None,
        max_wait: Duration::from_secs(cli.max_wait),
    };
    runtime.block_on(async move {
        let server = AirlockMcp::new(settings);
        let stdin = BoundedLines {
            inner: tokio::io::stdin(),
            line: 0,
        };
        let running = match server.serve((stdin, tokio::io::stdout())).await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!("the session did not start: {e}");
                return ExitCode::FAILURE;
            }
        };
        match running.waiting().await {
            Ok(reason) => {
                tracing::info!("session ended: {reason:?}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                tracing::error!("session failed: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

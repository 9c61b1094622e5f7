//! The MCP server: rmcp's `ServerHandler` over the catalogue in
//! [`crate::tools`], each call parsed strictly ([`crate::input`]) and
//! served by reading the registered repository (read-only, as the task
//! builder reads it) or by asking the supervisor over the bus, as this
//! process's own user. airlock-mcp holds no credential: what the user may
//! do is what the supervisor's authoriser (polkit) lets that uid do.
//!
//! By tool family: `read.rs` the repository readers (list_repositories,
//! resolve_ref, list_files, read_file), `propose.rs` propose_change and
//! its verification (`presets.rs`: the presets it may name), `tasks.rs`
//! the task tools (task_status, wait_for_task, get_task_log, list_tasks,
//! cancel_task), `owner.rs` whose task a task is. This file holds the
//! handler, the connection and the dispatch.

mod owner;
mod presets;
mod propose;
mod read;
mod tasks;

use crate::input;
use crate::text;
use crate::tools::{self, ToolSpec};
use airlock_builder::SourceRepo;
use airlock_client::Supervisor;
use airlock_config::Config;
use airlock_proto::{Code, Error};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use presets::{Preset, Presets};
pub use tasks::{summary, task_log};

/// What the server needs to know, from its command line.
#[derive(Clone, Debug)]
pub struct Settings {
    /// airlock.toml: the registered repositories, the executor's programs.
    pub config: PathBuf,
    /// The verification presets (absent: none).
    pub presets: PathBuf,
    /// The bus, when not the system bus.
    pub bus: Option<String>,
    /// wait_for_task's upper bound.
    pub max_wait: Duration,
}

/// The server. Cheap to clone; clones share the connection.
#[derive(Clone, Debug)]
pub struct AirlockMcp {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    settings: Settings,
    uid: u32,
    supervisor: tokio::sync::Mutex<Option<Supervisor>>,
}

/// A tool's answer: its structured result, or a refusal.
type Answer = Result<Value, Error>;

fn refusal(e: &Error) -> CallToolResult {
    let message = e
        .detail
        .clone()
        .unwrap_or_else(|| e.code.meaning().to_owned());
    CallToolResult::structured_error(json!({"error": {
        "code": e.code.as_str(),
        "message": text::clean(&message, 2048).0,
        "retryable": e.code.retryable(),
    }}))
}

fn tool_of(spec: &ToolSpec) -> Tool {
    let schema = |v: Value| match v {
        Value::Object(m) => Arc::new(m),
        _ => unreachable!("every schema in the catalogue is an object"),
    };
    Tool::new(spec.name, spec.description, schema((spec.input)()))
        .with_title(spec.title)
        .with_raw_output_schema(schema((spec.output)()))
        .with_annotations(
            ToolAnnotations::with_title(spec.title)
                .read_only(spec.read_only)
                .destructive(spec.destructive)
                .idempotent(spec.idempotent)
                .open_world(false),
        )
}

/// Every tool as `tools/list` shows it, in catalogue order.
pub fn tool_list() -> Vec<Tool> {
    tools::TOOLS.iter().map(tool_of).collect()
}

impl AirlockMcp {
    /// A server with `settings`, acting as this process's uid.
    pub fn new(settings: Settings) -> AirlockMcp {
        AirlockMcp {
            inner: Arc::new(Inner {
                settings,
                uid: nix::unistd::getuid().as_raw(),
                supervisor: tokio::sync::Mutex::new(None),
            }),
        }
    }

    fn config(&self) -> Result<Config, Error> {
        Config::load(&self.inner.settings.config)
            .map_err(|e| Error::with(Code::CONFIG_INVALID, e.to_string()))
    }

    fn presets(&self) -> Result<Presets, Error> {
        Presets::load(&self.inner.settings.presets)
    }

    /// The supervisor, connected on first use and again after it was lost.
    async fn supervisor(&self) -> Result<Supervisor, Error> {
        let mut slot = self.inner.supervisor.lock().await;
        if let Some(s) = slot.as_ref() {
            return Ok(s.clone());
        }
        let s = Supervisor::connect(self.inner.settings.bus.as_deref()).await?;
        s.check_protocol().await?;
        *slot = Some(s.clone());
        Ok(s)
    }

    /// Forgets the connection after the bus said it is gone.
    async fn lost(&self, e: &Error) {
        if e.code == Code::RUNTIME_UNAVAILABLE {
            *self.inner.supervisor.lock().await = None;
        }
    }

    /// The registered repository `id`, opened for reading.
    fn repository(&self, id: &str) -> Result<SourceRepo, Error> {
        input::repository(id)?;
        let config = self.config()?;
        let registered = config.repository(id).ok_or_else(|| {
            Error::with(
                Code::REPOSITORY_NOT_REGISTERED,
                format!("{id:?} is not registered (list_repositories names them)"),
            )
        })?;
        SourceRepo::open(&registered.path)
    }

    async fn call(
        &self,
        name: &str,
        args: Option<serde_json::Map<String, Value>>,
        ctx: &RequestContext<RoleServer>,
    ) -> Answer {
        let answer = match name {
            "list_repositories" => {
                input::parse::<input::ListRepositories>(name, args)?;
                self.list_repositories()
            }
            "resolve_ref" => self.resolve_ref(input::parse(name, args)?),
            "list_files" => self.list_files(input::parse(name, args)?),
            "read_file" => self.read_file(input::parse(name, args)?),
            "propose_change" => self.propose_change(input::parse(name, args)?).await,
            "task_status" => {
                let a: input::TaskRef = input::parse(name, args)?;
                let task = self.own_task(&a.task_id).await?;
                Ok(summary(&task))
            }
            "wait_for_task" => self.wait_for_task(input::parse(name, args)?, ctx).await,
            "get_task_log" => {
                let a: input::TaskRef = input::parse(name, args)?;
                let task = self.own_task(&a.task_id).await?;
                Ok(task_log(&task))
            }
            "list_tasks" => self.list_tasks(input::parse(name, args)?).await,
            "cancel_task" => self.cancel_task(input::parse(name, args)?).await,
            other => Err(Error::with(
                Code::MESSAGE_INVALID,
                format!("no tool {other:?}"),
            )),
        };
        if let Err(e) = &answer {
            self.lost(e).await;
        }
        answer
    }
}

impl ServerHandler for AirlockMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(
                Implementation::new("airlock-mcp", env!("CARGO_PKG_VERSION")).with_title("airlock"),
            )
            .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(tool_list()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let name = request.name.to_string();
        if tools::find(&name).is_none() {
            return Err(McpError::invalid_params(format!("no tool {name:?}"), None));
        }
        let started = Instant::now();
        let answer = self.call(&name, request.arguments, &context).await;
        let result = match &answer {
            Ok(v) => CallToolResult::structured(v.clone()),
            Err(e) => refusal(e),
        };
        match &answer {
            Ok(_) => tracing::info!(tool = %name, ms = started.elapsed().as_millis() as u64, "ok"),
            Err(e) => {
                tracing::info!(tool = %name, ms = started.elapsed().as_millis() as u64, code = %e.code, "refused: {e}")
            }
        }
        Ok(result.into())
    }
}

const INSTRUCTIONS: &str = "airlock: change a repository only through verified tasks. Read with list_repositories, resolve_ref, list_files and read_file; propose a change (a unified diff or whole files) with propose_change and verification commands; follow it with wait_for_task; read failures with get_task_log. A change that passes lands on an agent/ branch for a human to review; nothing is pushed or merged.";

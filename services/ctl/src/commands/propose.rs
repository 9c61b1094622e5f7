//! `airlockctl propose`: the planner's one command. Builds a task from a
//! work tree or a unified diff against a registered repository (the task
//! builder of airlock-client, read-only on the repository) and submits it.

use super::submit::submit_and_follow;
use crate::client::{Client, CtlError};
use crate::output::Ctx;
use airlock_builder::{Built, Changes, Proposal, SourceRepo, verify_command};
use airlock_proto::Code;
use airlock_proto::limits::{DEFAULT_COMMAND_TIMEOUT_SECONDS, DEFAULT_MAX_ATTEMPTS};
use airlock_proto::task::TaskResult;
use serde_json::json;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `propose`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("changes").required(true).args(["worktree", "patch"])))]
pub struct Args {
    /// The registered repository (see `airlockctl repo list`).
    #[arg(long, value_name = "NAME")]
    pub repo: String,

    /// The revision the changes are made against: a branch, a tag or a
    /// commit id of the repository.
    #[arg(long, value_name = "REV")]
    pub base: String,

    /// A directory holding the changed tree (usually your clone): every
    /// file that differs from the base is proposed — additions, edits,
    /// deletions, and symbolic links added, retargeted or deleted (a new
    /// target must stay inside the tree). In a git work tree, ignored
    /// files are left out. File modes, binary files and a file turned into
    /// a link or back cannot be proposed.
    #[arg(long, value_name = "DIR")]
    pub worktree: Option<PathBuf>,

    /// A unified diff (as `git diff` writes it, symbolic links included),
    /// or - for stdin, applied to the base in memory; a hunk that does not
    /// apply is refused with PATCH_HUNK_FAILED naming the file and line.
    #[arg(long, value_name = "FILE")]
    pub patch: Option<PathBuf>,

    /// A verification command, split like a shell would split it but never
    /// run by one (e.g. 'python3 -m unittest -q'); a bare program name is
    /// looked up in executor.programs. Repeatable; run in order.
    #[arg(long = "verify", value_name = "COMMAND", required = true)]
    pub verify: Vec<String>,

    /// Time limit of each verification command, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_COMMAND_TIMEOUT_SECONDS)]
    pub timeout: u32,

    /// The task id [default: p- and 16 random hex digits].
    #[arg(long, value_name = "ID")]
    pub task_id: Option<String>,

    /// The agent/ branch [default: agent/<task id>, created]. An existing
    /// branch is continued from its head.
    #[arg(long, value_name = "BRANCH")]
    pub branch: Option<String>,

    #[command(flatten)]
    pub submitting: Submitting,

    /// Follow the task until it is SUCCEEDED, FAILED or CANCELLED (exit 0
    /// only if it SUCCEEDED), then show its evidence.
    #[arg(long)]
    pub wait: bool,
}

/// The options of every command that builds a task and submits it: its
/// attempts, printing it instead (`--dry-run`), and the configuration.
#[derive(Debug, clap::Args)]
pub struct Submitting {
    /// Attempts before the task fails.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_ATTEMPTS)]
    pub max_attempts: u32,

    /// Print the task JSON that would be submitted, and submit nothing.
    #[arg(long)]
    pub dry_run: bool,

    /// The configuration file (airlockctl's global `--config`): where the
    /// repository is, which programs the executor runs.
    #[arg(skip = PathBuf::from(airlock_config::DEFAULT_PATH))]
    pub config: PathBuf,
}

/// `--dry-run`'s answer: the task JSON that would be submitted, printed.
pub(crate) fn dry_run(ctx: &Ctx, task: &impl serde::Serialize) -> ExitCode {
    if ctx.json {
        ctx.print_json(task);
    } else {
        println!("{}", serde_json::to_string_pretty(task).unwrap_or_default());
    }
    ExitCode::SUCCESS
}

/// The configuration at `config_path` and the registered repository
/// `name` opened read-only: what every task builder starts from.
pub(crate) fn registered_repo(
    config_path: &std::path::Path,
    name: &str,
) -> Result<(airlock_config::Config, SourceRepo), CtlError> {
    let config = airlock_config::Config::load(config_path)
        .map_err(|e| CtlError::local(Code::CONFIG_INVALID, e.to_string()))?;
    let registered = config.repository(name).ok_or_else(|| {
        CtlError::local(
            Code::REPOSITORY_NOT_REGISTERED,
            format!(
                "{:?} is not registered in {} (registered: {})",
                name,
                config_path.display(),
                config.repository_names().join(", ")
            ),
        )
    })?;
    let repo = SourceRepo::open(&registered.path)?;
    Ok((config, repo))
}

/// Builds the task (no bus needed).
pub fn build(args: &Args) -> Result<Built, CtlError> {
    let (config, repo) = registered_repo(&args.submitting.config, &args.repo)?;
    let mut proposal = Proposal::new(&args.repo, &args.base);
    proposal.task_id = args.task_id.clone();
    proposal.branch = args.branch.clone();
    proposal.max_attempts = args.submitting.max_attempts;
    // The repository's environment's programs first, then the executor's.
    let programs = airlock_config::ProgramTable::from_config(&config)
        .for_repository(&args.repo)
        .map_err(|e| CtlError::local(e.code, format!("repository {}: {e}", args.repo)))?;
    for text in &args.verify {
        proposal
            .verification
            .push(verify_command(text, args.timeout, &programs)?);
    }
    let patch_text;
    let changes = match (&args.worktree, &args.patch) {
        (Some(dir), _) => Changes::Worktree(dir),
        (None, Some(file)) => {
            patch_text = read_patch(file)?;
            Changes::Patch(&patch_text)
        }
        (None, None) => unreachable!("clap requires one of --worktree and --patch"),
    };
    Ok(proposal.build(&repo, changes)?)
}

fn read_patch(file: &std::path::Path) -> Result<String, CtlError> {
    use std::io::Read;
    let limit = airlock_proto::limits::MAX_MESSAGE_BYTES as u64;
    let mut bytes = Vec::new();
    let read = if file == std::path::Path::new("-") {
        std::io::stdin().take(limit + 1).read_to_end(&mut bytes)
    } else {
        std::fs::File::open(file).and_then(|f| f.take(limit + 1).read_to_end(&mut bytes))
    };
    read.map_err(|e| CtlError::generic(format!("{}: {e}", file.display())))?;
    if bytes.len() as u64 > limit {
        return Err(CtlError::local(
            Code::FIELD_BOUNDS_EXCEEDED,
            format!("{} is larger than {limit} bytes", file.display()),
        ));
    }
    String::from_utf8(bytes).map_err(|_| {
        CtlError::local(
            Code::PROPOSAL_BINARY_CHANGE,
            format!("{}: the patch is not UTF-8 text", file.display()),
        )
    })
}

/// Builds, then prints (`--dry-run`) or submits.
pub async fn run(ctx: &Ctx, client: Option<&Client>, args: Args) -> Result<ExitCode, CtlError> {
    let built = build(&args)?;
    if args.submitting.dry_run {
        return Ok(dry_run(ctx, &built.task));
    }
    let client = client.expect("a client unless --dry-run");
    if !ctx.json {
        println!(
            "Proposing {} change{} to {} at {} on {}:",
            built.edits.len(),
            if built.edits.len() == 1 { "" } else { "s" },
            args.repo,
            &built.source_head[..12.min(built.source_head.len())],
            built.target_branch
        );
        for e in &built.edits {
            println!("  {:<6} {}", e.verb(), e.path());
        }
    }
    let (code, last) = submit_and_follow(ctx, client, &built.task, args.wait).await?;
    if let Some(task) = last {
        if ctx.json {
            ctx.print_json(
                &json!({"task_id": &task.task_id, "state": task.state, "result": &task.result}),
            );
        } else if let Some(Ok(result)) = crate::view::result(&task) {
            print_evidence(ctx, &result, &task.binding.target_branch);
        }
    }
    Ok(code)
}

/// The result's commit and each command's evidence; a failed command's
/// output tails.
fn print_evidence(ctx: &Ctx, result: &TaskResult, branch: &str) {
    if let Some(commit) = &result.commit_oid {
        println!("commit    {commit} on {branch}");
    }
    if let Some(code) = &result.failure_code {
        println!("failure   {code}");
    }
    for c in &result.verification {
        let status = match (c.exit_code, c.timed_out) {
            (_, true) => "timed out".to_owned(),
            (Some(n), _) => format!("exit {n}"),
            (None, _) => "killed".to_owned(),
        };
        println!(
            "  {:<40} {:<10} {} ms",
            c.label,
            ctx.paint(if status == "exit 0" { "32" } else { "31" }, &status),
            c.duration_ms
        );
        for (stream, tail) in [("stdout", &c.stdout_tail), ("stderr", &c.stderr_tail)] {
            if let Some(tail) = tail {
                println!("    --- {stream} (last bytes) ---");
                for line in tail.lines() {
                    println!("    {line}");
                }
            }
        }
    }
}

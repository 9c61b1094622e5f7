//! `airlockctl repo add|list|remove|clone`: the authority repositories as
//! an administrator registers them, and a reader's clone of one.
//!
//! `add` (as root) makes `<worker.repository_root>/NAME.git`, a bare copy
//! of the source (no hard links to it, no remote pointing back), owned by
//! the worker and readable by `worker.readers_group` (directories 2750,
//! files 0640 or 0440: the worker writes, readers read, nobody else
//! enters), and registers it in `repositories.d/NAME.toml` beside the
//! configuration file; then it asks systemd to reload the supervisor and
//! the worker, which pick it up without dropping tasks. `remove` deletes
//! the drop-in (and, with `--purge`, the repository). `add` builds the
//! copy as `.NAME.git.tmp-PID` and renames it into place when complete;
//! before it starts it removes such leftovers of an import that was cut
//! or killed (whose process is gone). `clone` gives a
//! reader a clone of a registered repository without trusting it in their
//! git configuration (see docs/privsep/repositories.md).

use crate::client::CtlError;
use crate::output::Ctx;
use airlock_config::{Config, Repository};
use airlock_proto::Code;
use nix::unistd::{Gid, Uid};
use serde_json::json;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// Arguments of `repo`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// What to do.
    #[command(subcommand)]
    pub command: RepoCommand,

    /// The configuration file (airlockctl's global `--config`); drop-ins
    /// live in repositories.d beside it.
    #[arg(skip = PathBuf::from(airlock_config::DEFAULT_PATH))]
    pub config: PathBuf,
}

/// The `repo` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum RepoCommand {
    /// Import a git repository (bare or not) as the authority repository
    /// NAME and register it (as root); with --upstream, follow the team's
    /// remote and publish agent branches to it (docs/upstream.md).
    Add {
        /// The name tasks use.
        name: String,
        /// The repository to import: its branches and tags are copied.
        /// Optional with --upstream (the worker's first sync fills it).
        #[arg(long, value_name = "PATH", required_unless_present = "upstream")]
        from: Option<PathBuf>,
        /// The upstream, its credential and the signing key.
        #[command(flatten)]
        upstream: Box<super::upstream::UpstreamArgs>,
        /// Free text for admins.
        #[arg(long, value_name = "TEXT")]
        description: Option<String>,
        /// A verification environment: a TOML file with one [environment]
        /// table (toolchain paths, programs, variables, setup; see
        /// docs/environments.md), checked and copied into the registration.
        #[arg(long, value_name = "FILE")]
        environment: Option<PathBuf>,
        /// Do not ask systemd to reload the supervisor and the worker.
        #[arg(long)]
        no_reload: bool,
    },
    /// List the registered repositories and where each is registered.
    List,
    /// Ask the worker to fetch NAME's upstream now, and wait for what it
    /// did (the refs that moved, force-pushes followed, or the refusal).
    Sync {
        /// The repository.
        name: String,
        /// How long to wait for the worker's answer.
        #[arg(long, value_name = "SECONDS", default_value_t = 180)]
        wait: u64,
    },
    /// Show one repository: where it is, its registration, its branches
    /// and its verification environment (checked against this host).
    Show {
        /// The repository.
        name: String,
    },
    /// Unregister NAME (as root). Its queued tasks fail with
    /// REPOSITORY_NOT_REGISTERED; the repository's data stays unless --purge.
    Remove {
        /// The repository.
        name: String,
        /// Also delete the repository (only under worker.repository_root).
        #[arg(long)]
        purge: bool,
        /// Do not ask systemd to reload the supervisor and the worker.
        #[arg(long)]
        no_reload: bool,
    },
    /// Clone a registered repository into DIR, read-only at the source
    /// (for members of worker.readers_group, such as airlock-agent). The
    /// repository is trusted for this clone and its fetches only, never in
    /// your git configuration.
    Clone {
        /// The repository.
        name: String,
        /// Where to clone it [default: NAME].
        dir: Option<PathBuf>,
    },
    /// What a clone made by `repo clone` runs for `git fetch` (its
    /// remote.origin.uploadpack): git upload-pack on PATH, trusting PATH
    /// alone. Not for interactive use.
    #[command(hide = true)]
    UploadPack {
        /// The repository git names.
        path: PathBuf,
    },
}

fn config(path: &Path) -> Result<Config, CtlError> {
    Config::load(path).map_err(|e| CtlError::local(Code::CONFIG_INVALID, e.to_string()))
}

fn as_root(what: &str) -> Result<(), CtlError> {
    if Uid::effective().is_root() {
        Ok(())
    } else {
        Err(CtlError::local(
            Code::AUTHORIZATION_DENIED,
            format!("repo {what} changes /etc/airlock and the repositories: run it as root"),
        ))
    }
}

/// Runs `repo …`.
pub fn run(ctx: &Ctx, args: Args) -> Result<ExitCode, CtlError> {
    match args.command {
        RepoCommand::Add {
            name,
            from,
            upstream,
            description,
            environment,
            no_reload,
        } => add(
            ctx,
            &args.config,
            &name,
            from.as_deref(),
            &upstream,
            description,
            environment.as_deref(),
            !no_reload,
        ),
        RepoCommand::List => list(ctx, &args.config),
        RepoCommand::Sync { name, wait } => super::upstream::sync(
            ctx,
            &config(&args.config)?,
            &name,
            std::time::Duration::from_secs(wait),
        ),
        RepoCommand::Show { name } => show(ctx, &args.config, &name),
        RepoCommand::Remove {
            name,
            purge,
            no_reload,
        } => remove(ctx, &args.config, &name, purge, !no_reload),
        RepoCommand::Clone { name, dir } => clone(ctx, &args.config, &name, dir),
        RepoCommand::UploadPack { path } => upload_pack(&path),
    }
}

/// A git failure as the CLI reports it: the crate's code, with what was
/// being done.
fn git_failed(what: &str) -> impl Fn(airlock_git::GitError) -> CtlError + '_ {
    move |e| {
        let message = format!("{what}: {e}");
        let code = if message.contains("Permission denied") {
            Code::SOURCE_ACCESS_DENIED
        } else {
            e.code()
        };
        CtlError::local(code, message)
    }
}

/// Gives `path` (recursively) to `uid:gid`: directories 2750, files 0640,
/// read-only files (git's objects) 0440.
pub fn own_tree(path: &Path, uid: Uid, gid: Gid) -> std::io::Result<()> {
    let meta = std::fs::symlink_metadata(path)?;
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    nix::unistd::chown(path, Some(uid), Some(gid)).map_err(std::io::Error::from)?;
    let mode = if meta.is_dir() {
        0o2750
    } else if meta.permissions().mode() & 0o200 != 0 {
        0o640
    } else {
        0o440
    };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    if meta.is_dir() {
        for entry in std::fs::read_dir(path)? {
            own_tree(&entry?.path(), uid, gid)?;
        }
    }
    Ok(())
}

fn user_and_group(c: &Config) -> Result<(Uid, Gid), CtlError> {
    let user = nix::unistd::User::from_name(&c.supervisor.worker_user)
        .ok()
        .flatten()
        .ok_or_else(|| {
            CtlError::local(
                Code::CONFIG_INVALID,
                format!(
                    "supervisor.worker_user {:?} does not exist",
                    c.supervisor.worker_user
                ),
            )
        })?;
    let group = nix::unistd::Group::from_name(&c.worker.readers_group)
        .ok()
        .flatten()
        .ok_or_else(|| {
            CtlError::local(
                Code::CONFIG_INVALID,
                format!(
                    "worker.readers_group {:?} does not exist (the package creates it: systemd-sysusers airlock.conf)",
                    c.worker.readers_group
                ),
            )
        })?;
    Ok((user.uid, group.gid))
}

/// Asks systemd to reload the supervisor and the worker, when systemd runs.
/// With `executor`, the executor is restarted as well: it resolves the
/// environments (and builds its commands' view) at start.
fn reload(ctx: &Ctx, executor: bool) -> bool {
    if !Path::new("/run/systemd/system").is_dir() {
        if !ctx.json {
            println!(
                "systemd is not running: restart the supervisor and the worker{}, or send them SIGHUP",
                if executor { " (and the executor)" } else { "" }
            );
        }
        return false;
    }
    let mut units = vec!["airlock-supervisor.service", "airlock-worker.service"];
    if executor {
        units.push("airlock-executor.service");
    }
    let status = Command::new("systemctl")
        .arg("try-reload-or-restart")
        .args(&units)
        .status();
    match status {
        Ok(s) if s.success() => true,
        Ok(s) => {
            ctx.warn(&format!("systemctl try-reload-or-restart: {s}"));
            false
        }
        Err(e) => {
            ctx.warn(&format!("cannot run systemctl: {e}"));
            false
        }
    }
}

fn write_atomically(path: &Path, text: &str, mode: u32) -> Result<(), CtlError> {
    airlock_config::write_durably(path, text.as_bytes(), mode, None)
        .map_err(|e| CtlError::generic(format!("{}: {e}", path.display())))
}

#[allow(clippy::too_many_arguments)]
/// The directories airlock keeps its own configuration, state and
/// repositories in: never a local upstream's.
fn reserved_paths(config_path: &Path, c: &Config) -> Vec<PathBuf> {
    let parent = |p: &Path| p.parent().map(Path::to_path_buf);
    [
        parent(config_path),
        Some(c.worker.repository_root.clone()),
        Some(c.worker.workspace_root.clone()),
        parent(&c.worker.journal),
        parent(&c.supervisor.database),
        Some(c.spool.root.clone()),
    ]
    .into_iter()
    .flatten()
    .filter(|p| p.is_absolute() && p != Path::new("/"))
    .collect()
}

// One argument per `repo add` option, as clap parsed them.
#[allow(clippy::too_many_arguments)]
fn add(
    ctx: &Ctx,
    config_path: &Path,
    name: &str,
    from: Option<&Path>,
    upstream: &super::upstream::UpstreamArgs,
    description: Option<String>,
    environment: Option<&Path>,
    do_reload: bool,
) -> Result<ExitCode, CtlError> {
    as_root("add")?;
    let plan = super::upstream::plan(upstream)?;
    // The environment is checked against this host before anything is made.
    let environment = environment
        .map(|file| {
            let env = airlock_config::read_environment_file(file)
                .and_then(|env| env.resolve().map(|_| env))
                .map_err(|e| CtlError::local(e.code, format!("{}: {e}", file.display())))?;
            Ok::<_, CtlError>(env)
        })
        .transpose()?;
    if !airlock_proto::binding::is_repository_name(name) {
        return Err(CtlError::local(
            Code::REPOSITORY_INVALID,
            format!("{name:?}: 1 to 64 characters [A-Za-z0-9._-], starting with a letter or digit"),
        ));
    }
    let c = config(config_path)?;
    let exists = |why: String| CtlError::local(Code::REPOSITORY_EXISTS, why);
    if let Some(r) = c.repository(name) {
        return Err(exists(format!(
            "{name} is registered already, at {}",
            r.path.display()
        )));
    }
    let root = &c.worker.repository_root;
    // A local upstream is opened to the worker (its unit's
    // ReadWritePaths=, its Landlock): it must be a bare repository by its
    // own path, never a system directory or airlock's own state.
    if let Some(up) = &plan.upstream {
        let reserved = reserved_paths(config_path, &c);
        let reserved: Vec<&Path> = reserved.iter().map(PathBuf::as_path).collect();
        airlock_git::check_local_upstream(&up.url, &reserved)
            .map_err(|e| CtlError::local(e.code(), e.to_string()))?;
    }
    let target = root.join(format!("{name}.git"));
    if target.exists() {
        return Err(exists(format!(
            "{} exists (a repository removed without --purge?); remove it or choose another name",
            target.display()
        )));
    }
    let source = from
        .map(|from| {
            let source = std::fs::canonicalize(from).map_err(|e| {
                CtlError::local(
                    Code::REPOSITORY_SOURCE_INVALID,
                    format!("{}: {e}", from.display()),
                )
            })?;
            let foreign = airlock_git::ForeignRepo::open(&source).map_err(|e| {
                CtlError::local(
                    Code::REPOSITORY_SOURCE_INVALID,
                    format!("{} is not a git repository: {e}", source.display()),
                )
            })?;
            Ok::<_, CtlError>((source, foreign))
        })
        .transpose()?;
    let (uid, gid) = user_and_group(&c)?;
    if !root.exists() {
        // As tmpfiles makes /srv/airlock: the worker's, readable by the group.
        std::fs::create_dir_all(root)
            .and_then(|_| {
                nix::unistd::chown(root, Some(uid), Some(gid)).map_err(std::io::Error::from)
            })
            .and_then(|_| std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o2750)))
            .map_err(|e| CtlError::generic(format!("{}: {e}", root.display())))?;
    }
    // What an earlier import left when it was cut or killed goes first
    // (its process is gone); one in progress stays.
    sweep_stale_imports(root);
    let tmp = root.join(airlock_git::import_temp_name(name, std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    // A copy, never hard links into the caller's repository (the chown
    // below would otherwise take their files too); no remote points back.
    let imported = match &source {
        Some((source, foreign)) => airlock_git::mirror(foreign, &tmp)
            .map_err(git_failed(&format!("importing {}", source.display()))),
        // Upstream only: empty, for the worker's first sync to fill.
        None => airlock_git::init(airlock_git::default_program(), &tmp, true, "sha1")
            .map(|_| airlock_git::Imported::default())
            .map_err(git_failed(&format!("making {}", tmp.display()))),
    };
    let owned = imported.and_then(|imported| {
        own_tree(&tmp, uid, gid)
            .map_err(|e| CtlError::generic(format!("{}: {e}", tmp.display())))
            .map(|_| imported)
    });
    // Renamed into place only once every file is on disk; then the rename.
    let placed = owned.and_then(|imported| {
        std::fs::rename(&tmp, &target)
            .and_then(|_| std::fs::File::open(root)?.sync_all())
            .map_err(|e| CtlError::generic(format!("{}: {e}", target.display())))
            .map(|_| imported)
    });
    let imported = match placed {
        Ok(imported) => imported,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
    };
    let repo = Repository {
        name: name.to_owned(),
        path: target.clone(),
        description,
        environment,
        upstream: plan.upstream.clone(),
        signing: plan.signing.clone(),
        drop_in: None,
    };
    let dir = airlock_config::drop_in_dir(config_path);
    std::fs::create_dir_all(&dir)
        .map_err(|e| CtlError::generic(format!("{}: {e}", dir.display())))?;
    let drop_in = dir.join(format!("{name}.toml"));
    write_atomically(&drop_in, &airlock_config::drop_in_text(&repo), 0o644)?;
    // The whole configuration must still load (a clash is refused here,
    // not by the daemons at their next reload).
    if let Err(e) = Config::load(config_path) {
        let _ = std::fs::remove_file(&drop_in);
        return Err(CtlError::local(Code::CONFIG_INVALID, e.to_string()));
    }
    let branches: String = imported
        .updated
        .iter()
        .filter_map(|r| r.name.strip_prefix("refs/heads/"))
        .map(|b| format!("{b}\n"))
        .collect();
    let installed = match super::upstream::install(config_path, name, &plan) {
        Ok(files) => files,
        Err(e) => {
            let _ = std::fs::remove_file(&drop_in);
            super::upstream::uninstall(config_path, name);
            return Err(e);
        }
    };
    let reloaded = do_reload && reload(ctx, repo.environment.is_some());
    let restarted =
        do_reload && plan.needs_worker_restart() && super::upstream::restart_worker(ctx);
    let from_text = match (&source, &repo.upstream) {
        (Some((s, _)), _) => s.display().to_string(),
        (None, Some(up)) => format!("{}, filled by the worker's first sync", up.url),
        (None, None) => String::new(),
    };
    if ctx.json {
        ctx.print_json(&json!({
            "name": name, "path": target, "drop_in": drop_in, "reloaded": reloaded,
            "branches": branches.lines().collect::<Vec<_>>(),
            "upstream": repo.upstream, "signing": repo.signing,
            "installed": installed, "worker_restarted": restarted,
        }));
    } else {
        println!("Added {name}: {} (from {from_text})", target.display());
        if let Some(up) = &repo.upstream {
            println!(
                "  upstream {} ({}; synced every {} s)",
                up.url,
                if up.publish {
                    "agent branches published to it"
                } else {
                    "followed only"
                },
                up.sync_interval_seconds
            );
        }
        if let Some(s) = &repo.signing {
            println!("  commits signed as {}", s.principal);
        }
        for f in &installed {
            println!(
                "  installed {} (root only; the worker's unit loads it)",
                f.display()
            );
        }
        if restarted {
            println!("  the worker was restarted to receive its credentials");
        }
        println!("  registered in {}", drop_in.display());
        println!(
            "  branches: {}",
            branches.lines().collect::<Vec<_>>().join(", ")
        );
        println!(
            "  owner {} (writes), group {} (reads); nobody else",
            c.supervisor.worker_user, c.worker.readers_group
        );
        if reloaded {
            println!("  the supervisor and the worker were reloaded");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Removes the leftovers of interrupted imports in `root`
/// ([`airlock_git::remove_stale_imports`]), saying what it removed on
/// stderr (stdout may be JSON).
fn sweep_stale_imports(root: &Path) {
    match airlock_git::remove_stale_imports(root) {
        Ok(found) => {
            for f in found {
                match f.removed {
                    Ok(()) => eprintln!(
                        "airlockctl: removed {}, left by an interrupted import (process {} is gone)",
                        f.path.display(),
                        f.pid
                    ),
                    Err(e) => eprintln!(
                        "airlockctl: cannot remove {}, left by an interrupted import: {e}",
                        f.path.display()
                    ),
                }
            }
        }
        Err(e) => eprintln!(
            "airlockctl: cannot look for interrupted imports in {}: {e}",
            root.display()
        ),
    }
}

fn list(ctx: &Ctx, config_path: &Path) -> Result<ExitCode, CtlError> {
    let c = config(config_path)?;
    let rows: Vec<_> = c
        .repositories
        .iter()
        .map(|r| {
            let from = r
                .drop_in
                .as_deref()
                .unwrap_or(config_path)
                .display()
                .to_string();
            (r, from, r.path.join("objects").is_dir())
        })
        .collect();
    if ctx.json {
        let v: Vec<_> = rows
            .iter()
            .map(|(r, from, readable)| {
                json!({"name": r.name, "path": r.path, "description": r.description,
                       "registered_in": from, "readable": readable})
            })
            .collect();
        ctx.print_json(&json!(v));
        return Ok(ExitCode::SUCCESS);
    }
    if rows.is_empty() {
        println!("No repository is registered (airlockctl repo add NAME --from PATH).");
    }
    for (r, from, readable) in rows {
        println!(
            "{:<20} {}{}\n{:<20} registered in {from}",
            r.name,
            r.path.display(),
            if readable {
                ""
            } else {
                " (not readable by you)"
            },
            ""
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn remove(
    ctx: &Ctx,
    config_path: &Path,
    name: &str,
    purge: bool,
    do_reload: bool,
) -> Result<ExitCode, CtlError> {
    as_root("remove")?;
    let c = config(config_path)?;
    let r = c.repository(name).ok_or_else(|| {
        CtlError::local(
            Code::REPOSITORY_NOT_REGISTERED,
            format!("{name} is not registered"),
        )
    })?;
    let Some(drop_in) = &r.drop_in else {
        return Err(CtlError::local(
            Code::CONFIG_INVALID,
            format!(
                "{name} is registered in {} itself: remove its [[repository]] table there, then restart",
                config_path.display()
            ),
        ));
    };
    let under_root = r.path.parent() == Some(c.worker.repository_root.as_path());
    if purge && !under_root {
        return Err(CtlError::local(
            Code::PATH_ESCAPE,
            format!(
                "{} is not under worker.repository_root ({}); not purging it",
                r.path.display(),
                c.worker.repository_root.display()
            ),
        ));
    }
    std::fs::remove_file(drop_in)
        .map_err(|e| CtlError::generic(format!("{}: {e}", drop_in.display())))?;
    let uninstalled = super::upstream::uninstall(config_path, name);
    let reloaded = do_reload && reload(ctx, false);
    if do_reload && !uninstalled.is_empty() {
        super::upstream::restart_worker(ctx);
    }
    if purge {
        std::fs::remove_dir_all(&r.path)
            .map_err(|e| CtlError::generic(format!("{}: {e}", r.path.display())))?;
    }
    if ctx.json {
        ctx.print_json(
            &json!({"name": name, "path": r.path, "purged": purge, "reloaded": reloaded}),
        );
    } else {
        println!("Removed {name} ({} deleted)", drop_in.display());
        if purge {
            println!("  purged {}", r.path.display());
        } else {
            println!("  the repository stays at {}", r.path.display());
        }
        if reloaded {
            println!(
                "  the supervisor and the worker were reloaded; its queued tasks fail with REPOSITORY_NOT_REGISTERED"
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn clone(
    ctx: &Ctx,
    config_path: &Path,
    name: &str,
    dir: Option<PathBuf>,
) -> Result<ExitCode, CtlError> {
    let c = config(config_path)?;
    let r = c.repository(name).ok_or_else(|| {
        CtlError::local(
            Code::REPOSITORY_NOT_REGISTERED,
            format!("{name} is not registered"),
        )
    })?;
    let source = std::fs::canonicalize(&r.path).map_err(|e| {
        CtlError::local(
            Code::SOURCE_ACCESS_DENIED,
            format!(
                "{}: {e} (readers are members of {})",
                r.path.display(),
                c.worker.readers_group
            ),
        )
    })?;
    let dir = dir.unwrap_or_else(|| PathBuf::from(name));
    if dir.exists()
        && std::fs::read_dir(&dir)
            .map(|mut d| d.next().is_some())
            .unwrap_or(true)
    {
        return Err(CtlError::local(
            Code::REPOSITORY_EXISTS,
            format!("{} exists and is not an empty directory", dir.display()),
        ));
    }
    let foreign = airlock_git::ForeignRepo::open(&source).map_err(|e| {
        CtlError::local(
            Code::SOURCE_ACCESS_DENIED,
            format!("{e} (readers are members of {})", c.worker.readers_group),
        )
    })?;
    clone_worktree(&foreign, &source, &dir).map_err(git_failed(&format!("cloning {name}")))?;
    if ctx.json {
        ctx.print_json(&json!({"name": name, "source": source, "dir": dir}));
    } else {
        println!(
            "Cloned {name} into {} (read-only at {})",
            dir.display(),
            source.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The program a clone's later fetches run as upload-pack: this
/// airlockctl, named by a path of plain characters (git hands the value to
/// a shell, so anything else is left to PATH).
fn upload_pack_program() -> String {
    let plain = |p: &str| {
        !p.is_empty()
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"/._-+".contains(&b))
    };
    let exe = std::env::current_exe()
        .ok()
        .and_then(|p| p.to_str().map(str::to_owned))
        .filter(|p| plain(p))
        .unwrap_or_else(|| "airlockctl".to_owned());
    format!("{exe} repo upload-pack")
}

/// A work tree at `dir` with `from`'s branches as `origin/*`, the source's
/// `HEAD` branch checked out, and `origin` set up so that a plain `git
/// fetch` later works: its upload-pack is `airlockctl repo upload-pack`,
/// which trusts that one repository (see [`upload_pack`]).
fn clone_worktree(
    from: &airlock_git::ForeignRepo,
    source: &Path,
    dir: &Path,
) -> airlock_git::GitResult<()> {
    let git = airlock_git::init(
        airlock_git::default_program(),
        dir,
        false,
        &from.object_format()?,
    )?;
    let url = source.to_str().ok_or_else(|| {
        airlock_git::GitError::NotARepository(source.to_path_buf(), "not a UTF-8 path".into())
    })?;
    git.output(&["config", "remote.origin.url", url])?;
    git.output(&[
        "config",
        "remote.origin.fetch",
        "+refs/heads/*:refs/remotes/origin/*",
    ])?;
    git.output(&["config", "remote.origin.uploadpack", &upload_pack_program()])?;
    airlock_git::import(&git, from, airlock_git::RefMap::Remote("origin"))?;
    if let Some(branch) = from.head_branch()? {
        let tracking = format!("refs/remotes/origin/{branch}");
        if let Some(oid) = git.optional(&[
            "rev-parse",
            "--verify",
            "--quiet",
            "--end-of-options",
            &tracking,
        ])? {
            let local = format!("refs/heads/{branch}");
            git.output(&["update-ref", &local, &oid])?;
            git.output(&["symbolic-ref", "HEAD", &local])?;
            git.output(&["config", &format!("branch.{branch}.remote"), "origin"])?;
            git.output(&["config", &format!("branch.{branch}.merge"), &local])?;
            git.output(&["read-tree", "-u", "--reset", "HEAD"])?;
        }
    }
    Ok(())
}

/// `repo upload-pack PATH`: what a reader's clone runs for `git fetch`
/// (its `remote.origin.uploadpack`): git's upload-pack on PATH alone,
/// trusted for this run, hardened, replacing this process.
pub fn upload_pack(path: &Path) -> Result<ExitCode, CtlError> {
    use std::os::unix::process::CommandExt;
    let mut cmd = airlock_git::upload_pack(&airlock_git::default_program(), path)
        .map_err(git_failed("upload-pack"))?;
    let e = cmd.exec();
    Err(CtlError::local(
        Code::GIT_FAILED,
        format!("cannot run git upload-pack: {e}"),
    ))
}

/// `repo show NAME`.
fn show(ctx: &Ctx, config_path: &Path, name: &str) -> Result<ExitCode, CtlError> {
    let c = config(config_path)?;
    let r = c.repository(name).ok_or_else(|| {
        CtlError::local(
            Code::REPOSITORY_NOT_REGISTERED,
            format!("{name} is not registered"),
        )
    })?;
    let branches: Vec<String> = airlock_git::ForeignRepo::open(&r.path)
        .and_then(|repo| repo.refs())
        .map(|refs| {
            refs.into_iter()
                .filter_map(|r| r.name.strip_prefix("refs/heads/").map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let resolved = r.environment.as_ref().map(|e| e.resolve());
    let registered_in = r
        .drop_in
        .clone()
        .unwrap_or_else(|| config_path.to_path_buf());
    if ctx.json {
        let environment = match (&r.environment, &resolved) {
            (Some(env), Some(Ok(res))) => {
                json!({"configured": env, "resolved": res, "problem": null})
            }
            (Some(env), Some(Err(e))) => json!({"configured": env, "resolved": null,
                "problem": {"code": e.code.as_str(), "key": e.key, "message": e.problem}}),
            _ => serde_json::Value::Null,
        };
        ctx.print_json(&json!({
            "name": r.name, "path": r.path, "description": r.description,
            "registered_in": registered_in, "branches": branches, "environment": environment,
            "upstream": r.upstream, "signing": r.signing,
            "last_sync": super::upstream::last_sync(&c, name),
        }));
    } else {
        println!("{}: {}", r.name, r.path.display());
        if let Some(d) = &r.description {
            println!("  {d}");
        }
        println!("  registered in {}", registered_in.display());
        println!("  branches: {}", branches.join(", "));
        match &r.upstream {
            None => println!("  upstream: none"),
            Some(up) => {
                println!(
                    "  upstream: {} ({}; every {} s)",
                    up.url,
                    if up.publish {
                        "publishes agent branches"
                    } else {
                        "followed only"
                    },
                    up.sync_interval_seconds
                );
                match super::upstream::last_sync(&c, name) {
                    Some(s) => super::upstream::print_state(&s),
                    None => println!("  last sync: none yet"),
                }
            }
        }
        if let Some(s) = &r.signing {
            println!("  signing: as {}", s.principal);
        }
        match (&r.environment, resolved) {
            (None, _) | (_, None) => println!("  environment: none (system programs only)"),
            (Some(_), Some(Err(e))) => {
                println!("  environment: UNUSABLE here: {e} [{}]", e.code.as_str())
            }
            (Some(env), Some(Ok(res))) => {
                println!("  environment:");
                for p in &res.paths {
                    println!("    path      {} (read-only)", p.display());
                }
                for p in &res.programs {
                    println!("    program   {}", p.display());
                }
                for (k, v) in &res.variables {
                    println!("    variable  {k}={v}");
                }
                if let Some(setup) = &env.setup {
                    for cmd in &setup.commands {
                        println!("    setup     {}", cmd.join(" "));
                    }
                    println!("    inputs    {}", setup.inputs.join(", "));
                    println!("    outputs   {}", setup.outputs.join(", "));
                    println!("    egress    {}", setup.egress.join(", "));
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

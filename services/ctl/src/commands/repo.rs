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
//! the drop-in (and, with `--purge`, the repository). `clone` gives a
//! reader a clone of a registered repository without trusting it in their
//! git configuration (see docs/privsep.md).

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

    /// Configuration file; drop-ins live in repositories.d beside it.
    #[arg(long, global = true, value_name = "PATH", default_value = airlock_config::DEFAULT_PATH)]
    pub config: PathBuf,
}

/// The `repo` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum RepoCommand {
    /// Import a git repository (bare or not) as the authority repository
    /// NAME and register it (as root).
    Add {
        /// The name tasks use.
        name: String,
        /// The repository to import: its branches and tags are copied.
        #[arg(long, value_name = "PATH")]
        from: PathBuf,
        /// Free text for admins.
        #[arg(long, value_name = "TEXT")]
        description: Option<String>,
        /// Do not ask systemd to reload the supervisor and the worker.
        #[arg(long)]
        no_reload: bool,
    },
    /// List the registered repositories and where each is registered.
    List,
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
            description,
            no_reload,
        } => add(ctx, &args.config, &name, &from, description, !no_reload),
        RepoCommand::List => list(ctx, &args.config),
        RepoCommand::Remove {
            name,
            purge,
            no_reload,
        } => remove(ctx, &args.config, &name, purge, !no_reload),
        RepoCommand::Clone { name, dir } => clone(ctx, &args.config, &name, dir),
    }
}

/// `git` with no system or global configuration, trusting `trusted` only.
fn git(trusted: &Path) -> Command {
    let mut c = Command::new("git");
    c.env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_TERMINAL_PROMPT", "0")
        .arg("-c")
        .arg(format!("safe.directory={}", trusted.display()))
        .arg("-c")
        .arg(format!("safe.directory={}/.git", trusted.display()));
    c
}

fn run_git(mut cmd: Command, what: &str) -> Result<String, CtlError> {
    let out = cmd
        .output()
        .map_err(|e| CtlError::local(Code::GIT_FAILED, format!("cannot run git: {e}")))?;
    if !out.status.success() {
        return Err(CtlError::local(
            Code::GIT_FAILED,
            format!("{what}: {}", String::from_utf8_lossy(&out.stderr).trim()),
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
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
fn reload(ctx: &Ctx) -> bool {
    if !Path::new("/run/systemd/system").is_dir() {
        if !ctx.json {
            println!(
                "systemd is not running: restart the supervisor and the worker, or send them SIGHUP"
            );
        }
        return false;
    }
    let status = Command::new("systemctl")
        .args([
            "try-reload-or-restart",
            "airlock-supervisor.service",
            "airlock-worker.service",
        ])
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
    let io = |e: std::io::Error| CtlError::generic(format!("{}: {e}", path.display()));
    let tmp = path.with_extension(format!("toml.tmp-{}", std::process::id()));
    std::fs::write(&tmp, text).map_err(io)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode)).map_err(io)?;
    std::fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)?;
    if let Some(dir) = path.parent() {
        let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
    }
    Ok(())
}

fn add(
    ctx: &Ctx,
    config_path: &Path,
    name: &str,
    from: &Path,
    description: Option<String>,
    do_reload: bool,
) -> Result<ExitCode, CtlError> {
    as_root("add")?;
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
    let target = root.join(format!("{name}.git"));
    if target.exists() {
        return Err(exists(format!(
            "{} exists (a repository removed without --purge?); remove it or choose another name",
            target.display()
        )));
    }
    let source = std::fs::canonicalize(from).map_err(|e| {
        CtlError::local(
            Code::REPOSITORY_SOURCE_INVALID,
            format!("{}: {e}", from.display()),
        )
    })?;
    let mut probe = git(&source);
    probe
        .arg("-C")
        .arg(&source)
        .args(["rev-parse", "--git-dir"]);
    run_git(
        probe,
        &format!("{} is not a git repository", source.display()),
    )
    .map_err(|e| CtlError::local(Code::REPOSITORY_SOURCE_INVALID, e.message))?;
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
    let tmp = root.join(format!(".{name}.git.tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    // --no-local: a copy, never hard links into the caller's repository
    // (the chown below would otherwise take their files too).
    let mut clone = git(&source);
    // The source may be another user's (an administrator importing a
    // colleague's checkout): trusted for this clone only.
    clone
        .args(["clone", "--quiet", "--bare", "--no-local", "--upload-pack"])
        .arg(format!(
            "git -c safe.directory={0} -c safe.directory={0}/.git upload-pack",
            source.display()
        ))
        .arg(&source)
        .arg(&tmp);
    let imported = run_git(clone, &format!("importing {}", source.display())).and_then(|_| {
        let mut unlink = git(&tmp);
        unlink
            .arg(format!("--git-dir={}", tmp.display()))
            .args(["remote", "remove", "origin"]);
        run_git(unlink, "forgetting the source")
    });
    let owned = imported.and_then(|_| {
        own_tree(&tmp, uid, gid).map_err(|e| CtlError::generic(format!("{}: {e}", tmp.display())))
    });
    if let Err(e) = owned.and_then(|_| {
        std::fs::rename(&tmp, &target)
            .map_err(|e| CtlError::generic(format!("{}: {e}", target.display())))
    }) {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    let repo = Repository {
        name: name.to_owned(),
        path: target.clone(),
        description,
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
    let branches = {
        let mut b = git(&target);
        b.arg(format!("--git-dir={}", target.display())).args([
            "for-each-ref",
            "--format=%(refname:short)",
            "refs/heads",
        ]);
        run_git(b, "listing branches").unwrap_or_default()
    };
    let reloaded = do_reload && reload(ctx);
    if ctx.json {
        ctx.print_json(&json!({
            "name": name, "path": target, "drop_in": drop_in, "reloaded": reloaded,
            "branches": branches.lines().collect::<Vec<_>>(),
        }));
    } else {
        println!(
            "Added {name}: {} (from {})",
            target.display(),
            source.display()
        );
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
    let reloaded = do_reload && reload(ctx);
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
    // The repository belongs to the worker, so git's ownership check would
    // refuse it: trust it on this command line (clone) and in the clone's
    // own configuration (upload-pack for later fetches), nowhere else.
    let upload_pack = format!("git -c safe.directory={} upload-pack", source.display());
    let mut cmd = Command::new("git");
    cmd.arg("-c")
        .arg(format!("safe.directory={}", source.display()))
        .args(["clone", "--quiet", "--no-local", "--upload-pack"])
        .arg(&upload_pack)
        .arg("--config")
        .arg(format!("remote.origin.uploadpack={upload_pack}"))
        .arg(&source)
        .arg(&dir);
    run_git(cmd, &format!("cloning {name}")).map_err(|e| {
        if e.message.contains("Permission denied") || e.message.contains("could not read") {
            CtlError::local(Code::SOURCE_ACCESS_DENIED, e.message)
        } else {
            e
        }
    })?;
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

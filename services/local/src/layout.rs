//! The state directory, its owners and modes, and the configuration.

use nix::unistd::{Gid, Uid, chown};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// A uid/gid pair a process runs as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Id {
    pub uid: u32,
    pub gid: u32,
}

/// Who runs what. As root each role gets its own uid (numeric ids with no
/// passwd entry, so nothing on the host is reused); otherwise everything
/// runs as the caller and privilege separation is off.
#[derive(Clone, Copy, Debug)]
pub struct Ids {
    pub separated: bool,
    pub supervisor: Id,
    pub worker: Id,
    pub executor: Id,
    pub retry: Id,
    /// airlock-egress.
    pub egress: Id,
    /// Whoever runs airlock-local: the local authoriser's one user.
    pub admin: Id,
    pub exchange_gid: u32,
}

/// The package's own sysusers file: airlock-local creates the same users.
const SYSUSERS: &str = include_str!("../../../sysusers/airlock.conf");

fn user(name: &str) -> Result<Id, String> {
    let u = nix::unistd::User::from_name(name)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("user {name} does not exist"))?;
    Ok(Id {
        uid: u.uid.as_raw(),
        gid: u.gid.as_raw(),
    })
}

fn group(name: &str) -> Result<u32, String> {
    nix::unistd::Group::from_name(name)
        .map_err(|e| e.to_string())?
        .map(|g| g.gid.as_raw())
        .ok_or_else(|| format!("group {name} does not exist"))
}

/// Creates the airlock system users and groups with systemd-sysusers from
/// the package's sysusers file, unless they exist already.
fn ensure_users() -> Result<(), String> {
    let member = nix::unistd::Group::from_name("airlock-egress")
        .ok()
        .flatten()
        .is_some_and(|g| g.mem.iter().any(|m| m == "airlock-exec"));
    if user("airlock-exec").is_ok() && user("airlock-retry").is_ok() && member {
        return Ok(());
    }
    let file = std::env::temp_dir().join(format!(
        "airlock-local-sysusers-{}.conf",
        std::process::id()
    ));
    std::fs::write(&file, SYSUSERS).map_err(|e| e.to_string())?;
    let status = std::process::Command::new("systemd-sysusers")
        .arg(&file)
        .status();
    let _ = std::fs::remove_file(&file);
    match status {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("systemd-sysusers failed ({s})")),
        Err(e) => Err(format!("cannot run systemd-sysusers: {e}")),
    }
}

impl Ids {
    pub fn for_caller() -> Result<Self, String> {
        let me = Id {
            uid: Uid::current().as_raw(),
            gid: Gid::current().as_raw(),
        };
        if Uid::effective().is_root() {
            ensure_users()?;
            Ok(Ids {
                separated: true,
                supervisor: user("airlock")?,
                worker: user("airlock-worker")?,
                executor: user("airlock-exec")?,
                retry: user("airlock-retry")?,
                egress: user("airlock-egress")?,
                admin: me,
                exchange_gid: group("airlock-exchange")?,
            })
        } else {
            Ok(Ids {
                separated: false,
                supervisor: me,
                worker: me,
                executor: me,
                retry: me,
                egress: me,
                admin: me,
                exchange_gid: me.gid,
            })
        }
    }

    /// The user name of a role, as configuration and bus policy want it.
    pub fn name(&self, who: Id) -> String {
        nix::unistd::User::from_uid(Uid::from_raw(who.uid))
            .ok()
            .flatten()
            .map(|u| u.name)
            .unwrap_or_else(|| who.uid.to_string())
    }

    /// Supplementary groups of a role.
    pub fn groups(&self, who: Id) -> Vec<u32> {
        if !self.separated {
            return vec![];
        }
        if who == self.executor {
            vec![self.exchange_gid, self.egress.gid]
        } else if who == self.worker {
            vec![self.exchange_gid]
        } else {
            vec![]
        }
    }
}

/// Paths inside the state directory.
#[derive(Clone, Debug)]
pub struct Layout {
    pub root: PathBuf,
}

impl Layout {
    /// airlock-egress's socket.
    pub fn egress_socket(&self) -> PathBuf {
        self.root.join("egress/egress.sock")
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }
    pub fn config(&self) -> PathBuf {
        self.path("airlock.toml")
    }
    pub fn tasks_db(&self) -> PathBuf {
        self.path("tasks/tasks.sqlite3")
    }
    pub fn spool(&self) -> PathBuf {
        self.path("spool")
    }
    pub fn repos(&self) -> PathBuf {
        self.path("repos")
    }
    pub fn logs(&self) -> PathBuf {
        self.path("logs")
    }
    pub fn token(&self) -> PathBuf {
        self.path("retry/control-token")
    }
}

fn dir(path: &Path, mode: u32, uid: u32, gid: u32, ids: &Ids) -> std::io::Result<()> {
    std::fs::create_dir_all(path)?;
    if ids.separated {
        chown(path, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))
            .map_err(std::io::Error::from)?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    // Its owner and mode are on disk once it is synced, the new entry once
    // its parent directory is.
    std::fs::File::open(path)?.sync_all()?;
    match path.parent() {
        Some(parent) => std::fs::File::open(parent)?.sync_all(),
        None => Ok(()),
    }
}

/// Creates the tree with the same ownership model as tmpfiles/airlock.conf:
/// each side of the spool owns the directories it writes; the shared group
/// may only read them.
pub fn create(layout: &Layout, ids: &Ids) -> std::io::Result<()> {
    let r = |p: &str| layout.path(p);
    dir(
        &layout.root,
        0o755,
        0,
        0,
        &Ids {
            separated: false,
            ..*ids
        },
    )?;
    for (p, mode, owner, group) in [
        ("bus", 0o755, 0, 0),
        // Repository drop-ins: re-read by the supervisor and the worker on SIGHUP.
        ("repositories.d", 0o755, 0, 0),
        ("logs", 0o755, 0, 0),
        ("tasks", 0o700, ids.supervisor.uid, ids.supervisor.gid),
        ("worker", 0o700, ids.worker.uid, ids.worker.gid),
        ("worker/workspaces", 0o700, ids.worker.uid, ids.worker.gid),
        ("exec", 0o700, ids.executor.uid, ids.executor.gid),
        ("repos", 0o750, ids.worker.uid, ids.worker.gid),
        ("retry", 0o700, ids.retry.uid, ids.retry.gid),
        // airlock-egress's socket (0660): the executor is in its group.
        ("egress", 0o750, ids.egress.uid, ids.egress.gid),
        ("spool", 0o750, 0, ids.exchange_gid),
        ("spool/requests", 0o2750, ids.worker.uid, ids.exchange_gid),
        ("spool/sources", 0o2750, ids.worker.uid, ids.exchange_gid),
        ("spool/results", 0o2750, ids.executor.uid, ids.exchange_gid),
        ("spool/failed", 0o2750, ids.executor.uid, ids.exchange_gid),
        ("spool/wants", 0o2750, ids.executor.uid, ids.exchange_gid),
    ] {
        let (owner, group) = if ids.separated {
            (owner, group)
        } else {
            (ids.supervisor.uid, ids.supervisor.gid)
        };
        dir(&r(p), mode, owner, group, ids)?;
    }
    Ok(())
}

/// Writes a file owned by `who` with `mode`, durably (replaced whole,
/// synced with its directory: a power loss leaves the old file or this
/// one).
pub fn file(path: &Path, content: &[u8], mode: u32, who: Id, ids: &Ids) -> std::io::Result<()> {
    let owner = ids.separated.then_some((who.uid, who.gid));
    airlock_config::write_durably(path, content, mode, owner)
}

/// Gives a whole tree to `who` (the demo repository to the worker), each
/// path synced after its owner changed: a power loss must not hand the
/// tree back to root.
pub fn chown_tree(path: &Path, who: Id, ids: &Ids) -> std::io::Result<()> {
    if !ids.separated {
        return Ok(());
    }
    let meta = std::fs::symlink_metadata(path)?;
    if meta.file_type().is_symlink() {
        // Its own owner (lchown): a link is never followed, nor synced.
        return std::os::unix::fs::lchown(path, Some(who.uid), Some(who.gid));
    }
    chown(
        path,
        Some(Uid::from_raw(who.uid)),
        Some(Gid::from_raw(who.gid)),
    )
    .map_err(std::io::Error::from)?;
    if meta.is_dir() {
        for entry in std::fs::read_dir(path)? {
            chown_tree(&entry?.path(), who, ids)?;
        }
    }
    std::fs::File::open(path)?.sync_all()
}

/// The configuration every component reads; `bus` is the suite's private
/// bus, recorded for airlockctl.
pub fn config_text(layout: &Layout, ids: &Ids, tuning: &crate::Tuning, bus: &str) -> String {
    let p = |rel: &str| layout.path(rel).display().to_string();
    let db = match &tuning.shared_store {
        Some(store) => store.url.clone(),
        None => layout.tasks_db().display().to_string(),
    };
    let repos = tuning.repos.clone().unwrap_or_else(|| layout.repos());
    format!(
        r#"# Written by airlock-local for this state directory only.
[supervisor]
database = "{db}"{plaintext}
lease_seconds = {lease}
sweep_interval_seconds = 1
auto_accept = true
worker_user = "{worker_uid}"
# airlock-local has no polkit: the local authoriser lets the user who runs
# airlock-local (and nobody else) call every Tasks2 method.
authorizer = "local"
local_users = ["{admin}"]
# The agents' user may read and submit tasks, nothing else.
local_planners = [{planners}]
# airlock-local runs the [[agent]]s itself (org.airlock.AgentHost1).
agent_driver = "local-host"
# airlockctl --config THIS_FILE reaches the suite on its private bus.
bus_address = "{bus}"

[retry]
user = "{retry_user}"
token_file = "{token}"
authorization_id = "airlock-local-owner"

[worker]
journal = "{journal}"
workspace_root = "{workspaces}"
parallel_tasks = {parallel}
renew_interval_seconds = {renew}
repository_root = "{repos}"

[spool]
root = "{spool}"
{executor}
[[repository]]
name = "demo"
path = "{repo}"
description = "sample repository made by airlock-local demo"
{extra}{agents}"#,
        db = db,
        bus = bus,
        plaintext = match &tuning.shared_store {
            Some(store) if store.allow_plaintext => "\ndatabase_allow_plaintext = true",
            _ => "",
        },
        worker_uid = ids.name(ids.worker),
        admin = ids.name(ids.admin),
        retry_user = ids.name(ids.retry),
        token = layout.token().display(),
        journal = p("worker/checkpoints.sqlite3"),
        workspaces = p("worker/workspaces"),
        spool = layout.spool().display(),
        repo = repos.join("demo.git").display(),
        repos = repos.display(),
        extra = tuning
            .repositories
            .iter()
            .map(|(name, _)| name)
            .chain(
                tuning
                    .upstreams
                    .iter()
                    .map(|u| &u.name)
                    .filter(|n| !tuning.repositories.iter().any(|(r, _)| r == *n)),
            )
            .map(|name| {
                let up = tuning.upstreams.iter().find(|u| &u.name == name);
                let repo = airlock_config::Repository {
                    name: name.clone(),
                    path: repos.join(format!("{name}.git")),
                    description: Some(match up {
                        Some(u) => format!("follows {}", u.upstream.url),
                        None => format!("imported by airlock-local up --repo {name}=…"),
                    }),
                    environment: tuning
                        .environments
                        .iter()
                        .find(|(n, _)| n == name)
                        .map(|(_, e)| e.clone()),
                    upstream: up.map(|u| u.upstream.clone()),
                    signing: up.and_then(|u| u.signing.as_ref()).map(|(principal, _)| {
                        airlock_config::Signing {
                            principal: principal.clone(),
                        }
                    }),
                    drop_in: None,
                };
                format!("\n{}", airlock_config::repository_text(&repo))
            })
            .collect::<String>(),
        agents = agents_text(&tuning.agents),
        planners = if tuning.agents.is_empty() {
            String::new()
        } else {
            format!("\"{}\"", crate::agents::agent_user(ids))
        },
        executor = executor_text(layout, tuning),
        lease = tuning.lease_seconds,
        parallel = tuning.parallel_tasks,
        renew = (tuning.lease_seconds / 3).max(1),
    )
}

/// The `[executor]` table: the egress proxy's socket, and the Landlock
/// settings when a test asks for them.
fn executor_text(layout: &Layout, tuning: &crate::Tuning) -> String {
    let mut text = format!(
        "\n[executor]\negress_socket = \"{}\"\nparallel_jobs = {}\n",
        layout.egress_socket().display(),
        tuning.parallel_jobs
    );
    if let Some((abi, degraded)) = tuning.executor_landlock {
        text.push_str(&format!(
            "landlock_min_abi = {abi}\nallow_degraded_landlock = {degraded}\n"
        ));
    }
    if let Some((memory, processes)) = tuning.job_walls {
        text.push_str(&format!(
            "\n[executor.limits]\njob_memory_mib = {memory}\njob_processes = {processes}\n"
        ));
        if let Some(disk) = tuning.job_disk_mib {
            text.push_str(&format!("job_disk_mib = {disk}\n"));
        }
    }
    text
}

/// The `[[agent]]` tables of `agents`, as TOML.
pub fn agents_text(agents: &[airlock_config::Agent]) -> String {
    #[derive(serde::Serialize)]
    struct Tables<'a> {
        agent: &'a [airlock_config::Agent],
    }
    if agents.is_empty() {
        return String::new();
    }
    let text = toml::to_string(&Tables { agent: agents }).unwrap_or_default();
    format!("\n{text}")
}

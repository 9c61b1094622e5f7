//! airlock-executor: the CLI and the serve loop.
//!
//! Start-up, in order, each step failing hard:
//! 1. isolation self-check (EXECUTOR_NOT_ISOLATED naming the check);
//! 2. configuration;
//! 3. spool and work root opened and checked;
//! 4. the spawner forked (`airlock_sandbox::spawner`): it prepares the
//!    commands' sandbox — the minimal root where user namespaces are
//!    allowed, else the host view — and confines itself;
//! 5. the executor confines itself (`lockdown`: bounding set, no_new_privs,
//!    rlimits, Landlock, seccomp), before any thread is started; it
//!    executes nothing from now on;
//! 6. then, and only then, requests are read.

use airlock_executor::apply::CredentialPolicy;
use airlock_executor::environment::Environments;
use airlock_executor::error::{Error, Result};
use airlock_executor::lockdown::{self, Paths, Slot};
use airlock_executor::policy::ProgramPolicy;
use airlock_executor::request::{self, Settings};
use airlock_executor::result::Answer;
use airlock_executor::run::{self as run, Runner};
use airlock_executor::selfcheck;
use airlock_executor::tree::extract::ArchiveLimits;
use airlock_executor::tree::{CacheLimits, TreeCache};
use airlock_proto::bundle::{SOURCE_WANTED_SCHEMA, SourceWanted};
use airlock_proto::limits::MAX_MESSAGE_BYTES;
use airlock_sandbox::cgroup::{Limits as WallLimits, Tree, Walls};
use airlock_sandbox::spawner::{Options, Spawner};
use airlock_spool::{Expect, GcPolicy, Kind, Side, Spool};
use clap::{Args, Parser, Subcommand};
use std::collections::HashSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Uid and gid commands run as when the executor runs as root and
/// `executor.user` does not exist (nobody / nogroup).
const NOBODY: u32 = 65534;

#[derive(Debug, Parser)]
#[command(
    name = "airlock-executor",
    version,
    about = "Uncredentialed executor: applies a plan to a throw-away copy of the source and runs its verification commands, each in a fresh sandbox.",
    long_about = "Uncredentialed executor: applies a plan to a throw-away copy of the source and \
runs its verification commands, each in a fresh sandbox.\n\n\
Each command gets a minimal root where the kernel allows user namespaces: its workspace, \
a private /tmp, its own /proc, a minimal /dev and read-only system paths, nothing else. \
Elsewhere it gets the host view narrowed by Landlock, with every metadata call by path \
(chmod, chown, utime, xattrs) refused. The start-up log names the view.\n\n\
At start it refuses to run (EXECUTOR_NOT_ISOLATED) if the environment holds a \
secret-looking variable, /run/credentials or $CREDENTIALS_DIRECTORY is readable, or \
any network interface but lo exists. There is no option to skip these checks: run \
it with PrivateNetwork=yes (systemd) or in a fresh network namespace (unshare -n).\n\n\
Exit status: 0 on success (run-once: a result was written, whether or not the \
commands passed); otherwise the exit code of the refusal's catalogue class."
)]
struct Cli {
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Debug, Subcommand)]
enum Mode {
    /// Wait on <spool>/requests with inotify and answer each request once,
    /// in <spool>/results or <spool>/failed.
    Serve(ServeArgs),
    /// Handle one request from files and write the answer to --out (for tests and debugging).
    RunOnce(RunOnceArgs),
}

#[derive(Debug, Args)]
struct Common {
    /// airlock.toml; without it the built-in defaults apply.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Directory for per-request workspaces (created if missing).
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/var/lib/airlock-executor/work"
    )]
    work: PathBuf,
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// Spool root holding requests/, sources/, results/ and failed/
    /// (default: spool.root of the configuration).
    #[arg(long, value_name = "DIR")]
    spool: Option<PathBuf>,
    /// Uid that must own every request and source archive (the worker's)
    /// [default: the uid of --worker-user].
    #[arg(long, value_name = "UID", conflicts_with = "worker_user")]
    worker_uid: Option<u32>,
    /// User (name or numeric uid) that must own every request and source
    /// archive [default: supervisor.worker_user of the configuration].
    #[arg(long, value_name = "USER")]
    worker_user: Option<String>,
    /// Remove own results and failures older than this many hours.
    #[arg(long, value_name = "HOURS", default_value_t = 168)]
    retain_hours: u64,
    #[command(flatten)]
    common: Common,
}

#[derive(Debug, Args)]
struct RunOnceArgs {
    /// The ExecRequest JSON.
    #[arg(long, value_name = "FILE")]
    request: PathBuf,
    /// The source archive (tar or tar.gz), for a tree not in the cache.
    #[arg(long, value_name = "FILE")]
    archive: Option<PathBuf>,
    /// Where to write the ExecResult or ExecFailure JSON (must not exist).
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// Uid that must own --request and --archive (default: the executor's own).
    #[arg(long, value_name = "UID")]
    worker_uid: Option<u32>,
    #[command(flatten)]
    common: Common,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.mode {
        Mode::Serve(args) => serve(args),
        Mode::RunOnce(args) => run_once(args),
    };
    match outcome {
        Ok(code) => code,
        Err(e) => {
            eprintln!("airlock-executor: {}: {e}", e.code());
            ExitCode::from(e.code().exit_code())
        }
    }
}

fn load_config(path: Option<&Path>) -> Result<airlock_config::Config> {
    match path {
        Some(p) => airlock_config::Config::load(p).map_err(|e| Error::Config(e.to_string())),
        None => Ok(airlock_config::Config::default()),
    }
}

/// The worker's uid: --worker-uid, else --worker-user, else the
/// configuration's supervisor.worker_user, looked up in the user database.
fn worker_uid(args: &ServeArgs, config: &airlock_config::Config) -> Result<u32> {
    if let Some(uid) = args.worker_uid {
        return Ok(uid);
    }
    let user = args
        .worker_user
        .as_deref()
        .unwrap_or(&config.supervisor.worker_user);
    if let Ok(uid) = user.parse::<u32>() {
        return Ok(uid);
    }
    match nix::unistd::User::from_name(user) {
        Ok(Some(u)) => Ok(u.uid.as_raw()),
        Ok(None) => Err(Error::Config(format!(
            "worker user {user:?} does not exist"
        ))),
        Err(e) => Err(Error::Config(format!(
            "looking up worker user {user:?}: {e}"
        ))),
    }
}

/// The owner the worker's files show here. Under the unit's
/// `PrivateUsers=yes` only root, the executor's user and group are mapped:
/// the worker's uid is not, and its files show the overflow uid. Then only
/// the worker can have made such a file in `requests/` or `sources/`: they
/// must show that owner (the worker's, unmapped) and be writable by it
/// alone — checked here, or the executor refuses to start.
fn worker_owner_as_seen(spool: &Spool, worker_uid: u32) -> Result<u32> {
    let map = std::fs::read_to_string("/proc/self/uid_map").unwrap_or_default();
    let mapped = map.lines().any(|l| {
        let f: Vec<u64> = l
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        f.len() == 3 && (f[0]..f[0] + f[2]).contains(&u64::from(worker_uid))
    });
    if mapped {
        return Ok(worker_uid);
    }
    let overflow: u32 = std::fs::read_to_string("/proc/sys/kernel/overflowuid")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(NOBODY);
    for kind in [Kind::Requests, Kind::Sources] {
        let dir = spool.dir_path(kind);
        let meta = std::fs::metadata(&dir).map_err(|e| Error::Setup {
            path: dir.clone(),
            detail: e.to_string(),
        })?;
        use std::os::unix::fs::MetadataExt;
        if meta.uid() != overflow || meta.mode() & 0o022 != 0 {
            return Err(Error::Setup {
                path: dir,
                detail: format!(
                    "the worker's uid {worker_uid} is not mapped in this user namespace, so its directory must show the overflow uid {overflow} and be writable by it alone (found uid {}, mode {:o})",
                    meta.uid(),
                    meta.mode() & 0o7777
                ),
            });
        }
    }
    eprintln!(
        "airlock-executor: the worker's uid {worker_uid} is not mapped here (PrivateUsers=): its files show uid {overflow}"
    );
    Ok(overflow)
}

fn prepare_work_root(path: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(path).map_err(|e| Error::Setup {
        path: path.to_owned(),
        detail: e.to_string(),
    })?;
    // Commands running as another uid must be able to traverse it.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o711)).map_err(|e| {
        Error::Setup {
            path: path.to_owned(),
            detail: e.to_string(),
        }
    })?;
    std::fs::canonicalize(path).map_err(|e| Error::Setup {
        path: path.to_owned(),
        detail: e.to_string(),
    })
}

/// The uid:gid commands run as: only chosen when the executor is root
/// (otherwise the helper keeps the executor's own, unprivileged, ids).
fn command_ids(user: &str) -> Option<(u32, u32)> {
    if !rustix::process::geteuid().is_root() {
        return None;
    }
    match nix::unistd::User::from_name(user) {
        Ok(Some(u)) => Some((u.uid.as_raw(), u.gid.as_raw())),
        _ => {
            eprintln!(
                "airlock-executor: user {user:?} does not exist; commands run as {NOBODY}:{NOBODY}"
            );
            Some((NOBODY, NOBODY))
        }
    }
}

/// Forks one spawner per job that may run at once
/// ([`airlock_config::Config::parallel_jobs`]; one for `run-once`), before
/// the lockdown: each builds its commands' minimal root by mounting, which
/// Landlock would forbid, and none can be forked later.
fn spawners(
    config: &airlock_config::Config,
    environments: &Environments,
    work_root: &Path,
    jobs: u32,
    walls: Option<(Walls, WallLimits)>,
) -> Result<Runner> {
    let ex = &config.executor;
    let mut setup = run::setup(
        &ex.limits,
        ex.allow_degraded_landlock,
        ex.landlock_min_abi,
        environments.paths(),
    );
    if walls.is_some() {
        // Each job's pids.max bounds its processes; RLIMIT_NPROC, counted
        // per uid for every job at once, must not couple them: it only
        // backs the walls up, above what every job together may have.
        setup.limits.nproc = Some(u64::from(ex.limits.job_processes) * (u64::from(jobs) + 1));
    }
    let spawners = (0..jobs.max(1) as usize)
        .map(|k| {
            Spawner::start(Options {
                setup: setup.clone(),
                drop_to: command_ids(&ex.user),
                work_root: work_root.to_owned(),
                cgroup: walls.as_ref().map(|(w, _)| w.procs(k)).unwrap_or_default(),
            })
        })
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::ConfineSpawn(e.to_string()))?;
    let hello = spawners[0].hello();
    let workspace = match (&hello.view, &hello.overlay) {
        (airlock_sandbox::ViewMode::MinimalRoot, Ok(())) => {
            "workspaces: an overlay of the cached tree".to_owned()
        }
        (_, Err(why)) if hello.view == airlock_sandbox::ViewMode::MinimalRoot => {
            format!("workspaces: a copy of the cached tree ({why})")
        }
        _ => "workspaces: a copy of the cached tree".to_owned(),
    };
    eprintln!(
        "airlock-executor: commands get the {} view{} (ids {}:{}); {workspace}; {} spawner(s), {}",
        hello.view.as_str(),
        hello
            .reason
            .as_deref()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default(),
        hello.ids.0,
        hello.ids.1,
        spawners.len(),
        hello.lockdown
    );
    let tail = usize::try_from(ex.limits.output_tail_bytes).unwrap_or(4096);
    let disk = airlock_executor::run::DiskWalls {
        job_bytes: (ex.limits.job_disk_mib > 0).then(|| u64::from(ex.limits.job_disk_mib) << 20),
        reserve_bytes: (ex.min_free_disk_mib > 0).then_some(ex.min_free_disk_mib << 20),
    };
    Ok(Runner::new(spawners, tail, walls)?.with_disk(disk))
}

/// The walls between jobs: a cgroup per job slot, each limited as
/// configured, where a cgroup was delegated to the executor
/// (`AIRLOCK_EXECUTOR_CGROUP`, or its own v2 cgroup under systemd's
/// `Delegate=yes`); none elsewhere, said at start. Made before the
/// spawners, which move into their slots as they start.
fn job_walls(config: &airlock_config::Config, jobs: u32) -> Result<Option<(Walls, WallLimits)>> {
    let cgroup = |e: airlock_sandbox::Error| Error::ConfineSpawn(e.to_string());
    let Some(tree) = Tree::find().map_err(cgroup)? else {
        eprintln!(
            "airlock-executor: no cgroup delegated to the executor: its {jobs} job(s) run without walls between them"
        );
        return Ok(None);
    };
    let l = &config.executor.limits;
    let limits = WallLimits {
        memory: u64::from(l.job_memory_mib) << 20,
        processes: u64::from(l.job_processes),
        cpu_max_millis: (l.job_cpu_max > 0).then(|| u64::from(l.job_cpu_max) * 1000),
    };
    let walls = Walls::create(&tree, jobs.max(1) as usize).map_err(cgroup)?;
    for k in 0..walls.slots() {
        walls.set_limits(k, &limits).map_err(cgroup)?;
    }
    eprintln!(
        "airlock-executor: walls: a cgroup ({}) per job, {} MiB and {} processes each; CPU: {}; IO: {}",
        tree.version(),
        l.job_memory_mib,
        l.job_processes,
        match (walls.cpu(), l.job_cpu_max) {
            (false, _) => "no cpu controller, no share".to_owned(),
            (true, 0) => "an equal share, no quota".to_owned(),
            (true, n) => format!("an equal share, at most {n} CPU(s)"),
        },
        walls
            .io_weight()
            .map_or("no IO weights on this kernel".to_owned(), |w| format!(
                "an equal weight ({w})"
            )),
    );
    Ok(Some((walls, limits)))
}

/// The view commands get, for `airlockctl doctor`: `<work>/sandbox.json`
/// (written fresh at every start; a failure to write is only logged).
fn write_view_status(work_root: &Path, runner: Option<&Runner>) {
    let Some(runner) = runner else { return };
    let hello = runner.hello();
    let status = serde_json::json!({
        "view": hello.view.as_str(),
        "reason": hello.reason,
        "pid": std::process::id(),
    });
    let path = work_root.join(airlock_executor::run::VIEW_STATUS_FILE);
    let tmp = work_root.join(".sandbox.json.tmp");
    let written =
        std::fs::write(&tmp, status.to_string()).and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = written {
        eprintln!("airlock-executor: cannot write {}: {e}", path.display());
    }
}

fn settings(
    config: &airlock_config::Config,
    environments: Environments,
    runner: Runner,
    work_root: PathBuf,
) -> Result<Settings> {
    let ex = &config.executor;
    let l = &ex.limits;
    let layers = airlock_executor::layer::LayerCache::open(&work_root, ex.layer_cache_mib << 20)?;
    Ok(Settings {
        programs: ProgramPolicy::from_config(ex),
        environments,
        credentials: CredentialPolicy {
            allow: ex.allow_credential_paths.clone(),
        },
        archive: ArchiveLimits {
            max_entries: u64::from(l.max_archive_entries),
            max_file_bytes: l.max_file_bytes,
            max_total_bytes: l.max_total_bytes,
            max_expansion_ratio: u64::from(l.max_expansion_ratio),
        },
        max_archive_bytes: l.max_archive_bytes,
        max_file_bytes: l.max_file_bytes,
        runner: Some(runner),
        work_root,
        own: None,
        layers,
        egress_socket: ex.egress_socket.clone(),
    })
}

fn serve(args: ServeArgs) -> Result<ExitCode> {
    // 1. Isolation.
    let isolation = selfcheck::run()?;
    // 2. Configuration.
    let config = load_config(args.common.config.as_deref())?;
    let worker_uid = worker_uid(&args, &config)?;
    // 3. Spool, work root, helper.
    let root = args
        .spool
        .clone()
        .unwrap_or_else(|| config.spool.root.clone());
    let spool = Spool::open(&root)?;
    let worker_uid = worker_owner_as_seen(&spool, worker_uid)?;
    let work_root = prepare_work_root(&args.common.work)?;
    // 4. The spawner, before any confinement of our own.
    let environments = Environments::from_config(&config);
    for line in environments.summary() {
        eprintln!("airlock-executor: environment {line}");
    }
    let jobs = config.parallel_jobs();
    let walls = job_walls(&config, jobs)?;
    let runner = spawners(&config, &environments, &work_root, jobs, walls)?;
    let mut settings = settings(&config, environments, runner, work_root.clone())?;
    let mut watcher = spool.watch(&[Kind::Requests, Kind::Sources])?;
    // 5. Confinement: bounding set, no_new_privs, rlimits, Landlock, seccomp.
    let mut paths = Paths::new()
        .with(Slot::SpoolRequests, spool.dir_path(Kind::Requests))
        .with(Slot::SpoolSources, spool.dir_path(Kind::Sources))
        .with(Slot::SpoolResults, spool.dir_path(Kind::Results))
        .with(Slot::SpoolFailed, spool.dir_path(Kind::Failed))
        .with(Slot::SpoolWants, spool.dir_path(Kind::Wants))
        .with(Slot::WorkRoot, work_root.clone());
    paths.allow_degraded = config.executor.allow_degraded_landlock;
    // Read now: the lockdown leaves /proc out of reach.
    let _ = airlock_executor::tree::boot_id();
    let own = lockdown::apply(&paths)?;
    eprintln!(
        "airlock-executor: serving {} (interfaces: {}; landlock {} ABI {}; worker uid {})",
        root.display(),
        isolation.interfaces.join(","),
        own.status,
        own.abi,
        worker_uid
    );
    settings.own = Some(own);
    write_view_status(&work_root, settings.runner.as_ref());
    let cache = open_cache(&config, &work_root, settings.runner.as_ref())?;
    let max_spool = config.spool.max_file_bytes;
    let me = rustix::process::geteuid().as_raw();
    let retain = Duration::from_secs(args.retain_hours.saturating_mul(3600));
    let mut last_gc: Option<Instant> = None;
    // 6. The loop: this thread reads each unanswered request and finds its
    // source (filling the cache, one entry at a time, never twice); up to
    // one job per spawner runs side by side, each on a thread of its own
    // holding its tree until it has published its answer.
    let slots = settings.runner.as_ref().map_or(1, Runner::slots);
    let running: Mutex<HashSet<String>> = Mutex::default();
    let running = &running;
    let (settings, spool, cache) = (&settings, &spool, &cache);
    std::thread::scope(|scope| -> Result<ExitCode> {
        loop {
            // Until a pass starts nothing: a request left waiting for its
            // source may be served by a tree another one just filled.
            loop {
                let mut progressed = false;
                for id in spool.list(Kind::Requests)? {
                    if locked(running).len() >= slots {
                        break;
                    }
                    if locked(running).contains(&id) || answered(spool, &id) {
                        continue;
                    }
                    match prepare(spool, settings, cache, &id, worker_uid, max_spool) {
                        Next::Answered => progressed = true,
                        Next::Waiting => {}
                        Next::Ready(job) => {
                            locked(running).insert(id.clone());
                            scope.spawn(move || {
                                job.run(spool, settings);
                                locked(running).remove(&id);
                            });
                            progressed = true;
                        }
                    }
                }
                if !progressed {
                    break;
                }
            }
            if last_gc.is_none_or(|t| t.elapsed() > Duration::from_secs(3600)) {
                gc(spool, me, retain);
                last_gc = Some(Instant::now());
            }
            // The spool changing wakes this thread; a job ending frees a
            // slot, seen within the short wait while any runs.
            let idle = locked(running).is_empty();
            watcher.wait(if idle {
                Duration::from_secs(300)
            } else {
                Duration::from_millis(200)
            })?;
        }
    })
}

/// The set of requests running, whatever a panicked job left it as.
fn locked(running: &Mutex<HashSet<String>>) -> std::sync::MutexGuard<'_, HashSet<String>> {
    running
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether `id` has its answer (a result or a failure) in the spool.
fn answered(spool: &Spool, id: &str) -> bool {
    // Unreadable counts as answered: it is not run on a guess.
    spool.exists(Kind::Results, id).unwrap_or(true)
        || spool.exists(Kind::Failed, id).unwrap_or(true)
}

/// The executor's side of the spool, collected: answers older than
/// `retain`, and what is left of requests long answered.
fn gc(spool: &Spool, me: u32, retain: Duration) {
    match spool.gc(
        Side::Executor,
        me,
        &GcPolicy {
            older_than: Some(retain),
            finished: Vec::new(),
        },
    ) {
        Ok(r) => {
            for (path, why) in r.refused {
                eprintln!("airlock-executor: gc left {}: {why}", path.display());
            }
        }
        Err(e) => eprintln!("airlock-executor: gc: {e}"),
    }
}

/// What the serve loop does next with an unanswered request.
enum Next {
    /// Refused before anything ran: its failure is published.
    Answered,
    /// Its source is not at hand: asked for, left for a later pass.
    Waiting,
    /// Ready to run on a job thread.
    Ready(Box<Job>),
}

/// A request ready to run: its tree found (or the reason it was not),
/// held until the job ends.
struct Job {
    id: String,
    request: airlock_proto::bundle::ExecRequest,
    source: Result<airlock_executor::tree::Cached>,
    _hold: Option<airlock_executor::tree::hold::Hold>,
    started: Instant,
}

impl Job {
    /// Runs the request's commands and publishes its answer.
    fn run(self, spool: &Spool, settings: &Settings) {
        let Job {
            id,
            request,
            source,
            _hold,
            started,
        } = self;
        let answer = request::handle_parsed(settings, &request, |_| source);
        publish(spool, &id, &answer, started);
    }
}

/// Reads a spooled request and finds its source: its tree cached, or its
/// archive or delta published (which then fills the cache). Otherwise asks
/// the worker for it (`wants/<id>.json`) and leaves the request for a
/// later pass. A request that cannot be read is answered here.
fn prepare(
    spool: &Spool,
    settings: &Settings,
    cache: &TreeCache,
    id: &str,
    worker_uid: u32,
    max_spool: u64,
) -> Next {
    let started = Instant::now();
    let bytes = spool
        .read(
            Kind::Requests,
            id,
            &Expect {
                owner_uid: worker_uid,
                max_bytes: (MAX_MESSAGE_BYTES as u64).min(max_spool),
                sha256: None,
            },
        )
        .map_err(Error::from);
    let req = match bytes.and_then(|b| request::parse(&b, Some(id))) {
        Ok(req) => req,
        Err(e) => {
            let answer = Answer::Failure(airlock_executor::result::failure(id, None, &e));
            publish(spool, id, &answer, started);
            return Next::Answered;
        }
    };
    let source = match cache.get(&req.source_tree) {
        Some(cached) => Ok(cached),
        None => match spool.exists(Kind::Sources, id) {
            Ok(true) => spool
                .read(
                    Kind::Sources,
                    id,
                    &Expect {
                        owner_uid: worker_uid,
                        max_bytes: settings.max_archive_bytes.min(max_spool),
                        sha256: None,
                    },
                )
                .map_err(|e| Error::ArchiveInvalid(e.to_string()))
                .and_then(|source| {
                    cache.set_pins(pending_haves(spool, id));
                    cache.receive(
                        &req.source_tree,
                        &source,
                        &settings.archive,
                        &settings.credentials,
                        &mut assembly_fault,
                    )
                }),
            Ok(false) => {
                want_source(spool, cache, &req);
                return Next::Waiting;
            }
            Err(e) => Err(Error::ArchiveInvalid(e.to_string())),
        },
    };
    let hit = match &source {
        Ok(c) if c.from_delta => "tree made from a held one and a source delta",
        Ok(c) if c.filled => "tree filled from the archive",
        Ok(_) => "tree cached",
        Err(_) => "no tree",
    };
    eprintln!("airlock-executor: {id}: {hit} ({})", req.source_tree);
    let hold = source.as_ref().ok().map(|c| cache.hold(&c.tree));
    Next::Ready(Box::new(Job {
        id: id.to_owned(),
        request: req,
        source,
        _hold: hold,
        started,
    }))
}

/// Publishes a request's answer (a failure when the answer cannot be
/// rendered, being too large); says what happened on standard error.
fn publish(spool: &Spool, id: &str, answer: &Answer, started: Instant) {
    let (kind, summary) = match answer {
        Answer::Result(r) => (Kind::Results, format!("passed={}", r.passed)),
        Answer::Failure(f) => (Kind::Failed, format!("{}: {}", f.code, f.detail)),
    };
    let rendered = answer.to_bytes().map(|b| (b, kind)).or_else(|e| {
        let f = airlock_executor::result::failure(id, None, &e);
        Answer::Failure(f).to_bytes().map(|b| (b, Kind::Failed))
    });
    let published = rendered
        .map_err(|e| e.to_string())
        .and_then(|(b, kind)| spool.publish(kind, id, &b).map_err(|e| e.to_string()));
    match published {
        Ok(path) => eprintln!(
            "airlock-executor: {id}: {summary} -> {} ({} ms)",
            path.display(),
            started.elapsed().as_millis()
        ),
        Err(e) => eprintln!("airlock-executor: {id}: {summary}; not published: {e}"),
    }
}

/// Where the crash tests kill the executor (`fault-injection` builds
/// only): with `AIRLOCK_FAULT_EXECUTOR_AT=assembly` it aborts once a
/// source delta's removals are made and nothing new is written yet, after
/// saying so on standard error. A no-op otherwise.
fn assembly_fault() {
    #[cfg(feature = "fault-injection")]
    if std::env::var("AIRLOCK_FAULT_EXECUTOR_AT").as_deref() == Ok("assembly") {
        eprintln!("airlock-executor: fault injection: killed at assembly");
        std::process::abort();
    }
}

/// The trees named as held in this executor's source requests that are
/// still unanswered, but `except`'s: a delta may yet come against each.
fn pending_haves(spool: &Spool, except: &str) -> std::collections::HashSet<String> {
    let me = rustix::process::geteuid().as_raw();
    let mut held = std::collections::HashSet::new();
    for id in spool.list(Kind::Wants).unwrap_or_default() {
        if id == except
            || spool.exists(Kind::Results, &id).unwrap_or(true)
            || spool.exists(Kind::Failed, &id).unwrap_or(true)
        {
            continue;
        }
        let expect = Expect {
            owner_uid: me,
            max_bytes: 64 * 1024,
            sha256: None,
        };
        if let Some(want) = spool
            .read(Kind::Wants, &id, &expect)
            .ok()
            .and_then(|b| serde_json::from_slice::<SourceWanted>(&b).ok())
        {
            held.extend(want.haves);
        }
    }
    held
}

/// How many held trees a source request names (each is checked against
/// its seal on its first use in a process).
const HAVES: usize = 4;

/// Asks the worker for a request's source, once, naming the trees the
/// cache holds so that only what differs from one of them need come.
fn want_source(spool: &Spool, cache: &TreeCache, req: &airlock_proto::bundle::ExecRequest) {
    let id = &req.request_id;
    if spool.exists(Kind::Wants, id).unwrap_or(false) {
        return;
    }
    let haves = airlock_proto::tree::ObjectFormat::of_id(&req.source_tree)
        .map(|f| cache.haves(f, HAVES))
        .unwrap_or_default();
    let want = SourceWanted {
        schema: SOURCE_WANTED_SCHEMA.into(),
        request_id: id.clone(),
        request_sha256: req.digest(),
        source_tree: req.source_tree.clone(),
        haves,
        blobs_by_id: true,
    };
    let published = serde_json::to_vec(&want)
        .map_err(|e| e.to_string())
        .and_then(|b| {
            spool
                .publish(Kind::Wants, id, &b)
                .map_err(|e| e.to_string())
        });
    match published {
        Ok(_) => eprintln!(
            "airlock-executor: {id}: tree {} not cached; asked the worker for its source",
            req.source_tree
        ),
        Err(e) => eprintln!("airlock-executor: {id}: cannot ask for the source: {e}"),
    }
}

/// Opens the tree cache (after the lockdown: only the work root is needed),
/// verifying every entry.
fn open_cache(
    config: &airlock_config::Config,
    work_root: &Path,
    runner: Option<&Runner>,
) -> Result<TreeCache> {
    let ex = &config.executor;
    let owner = runner
        .filter(|_| rustix::process::geteuid().is_root())
        .map(|r| r.hello().ids);
    let (cache, verified) = TreeCache::open(
        work_root,
        CacheLimits {
            max_entries: ex.tree_cache_entries,
            max_bytes: ex.tree_cache_mib.saturating_mul(1 << 20),
        },
        owner,
    )?;
    eprintln!(
        "airlock-executor: tree cache: {} sealed entries, each checked against its seal on first use{}",
        verified.kept.len(),
        verified
            .removed
            .iter()
            .map(|(t, why)| format!("; removed {t}: {why}"))
            .collect::<String>()
    );
    Ok(cache)
}

fn run_once(args: RunOnceArgs) -> Result<ExitCode> {
    selfcheck::run()?;
    let config = load_config(args.common.config.as_deref())?;
    let owner = args
        .worker_uid
        .unwrap_or_else(|| rustix::process::geteuid().as_raw());
    let work_root = prepare_work_root(&args.common.work)?;
    let environments = Environments::from_config(&config);
    for line in environments.summary() {
        eprintln!("airlock-executor: environment {line}");
    }
    let runner = spawners(&config, &environments, &work_root, 1, None)?;
    let mut settings = settings(&config, environments, runner, work_root.clone())?;
    // Both inputs are read before the lockdown; the archive, when the tree
    // is not cached, must hold the request's tree.
    let request_bytes = airlock_spool::read_path(
        &args.request,
        &Expect {
            owner_uid: owner,
            max_bytes: MAX_MESSAGE_BYTES as u64,
            sha256: None,
        },
    )
    .map_err(Error::from);
    let archive_bytes = args.archive.as_ref().map(|archive| {
        airlock_spool::read_path(
            archive,
            &Expect {
                owner_uid: owner,
                max_bytes: settings.max_archive_bytes,
                sha256: None,
            },
        )
        .map_err(|e| Error::ArchiveInvalid(e.to_string()))
    });
    let out_dir = match args.out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    let mut paths = Paths::new()
        .with(Slot::WorkRoot, work_root.clone())
        .with(Slot::OutputDir, out_dir);
    paths.allow_degraded = config.executor.allow_degraded_landlock;
    let _ = airlock_executor::tree::boot_id();
    let own = lockdown::apply(&paths)?;
    settings.own = Some(own);
    let cache = open_cache(&config, &work_root, settings.runner.as_ref())?;
    let answer = request::handle(&settings, None, request_bytes, |req| {
        if let Some(cached) = cache.get(&req.source_tree) {
            return Ok(cached);
        }
        match archive_bytes {
            Some(bytes) => cache.receive(
                &req.source_tree,
                &bytes?,
                &settings.archive,
                &settings.credentials,
                &mut assembly_fault,
            ),
            None => Err(Error::ArchiveInvalid(format!(
                "tree {} is not cached and no --archive was given",
                req.source_tree
            ))),
        }
    });
    let bytes = answer.to_bytes()?;
    airlock_spool::publish_path(&args.out, &bytes)?;
    match answer {
        Answer::Result(r) => {
            eprintln!("airlock-executor: {}: passed={}", r.request_id, r.passed);
            Ok(ExitCode::SUCCESS)
        }
        Answer::Failure(f) => {
            eprintln!(
                "airlock-executor: {}: {}: {}",
                f.request_id, f.code, f.detail
            );
            let code =
                airlock_proto::Code::from_name(&f.code).unwrap_or(airlock_proto::Code::INTERNAL);
            Ok(ExitCode::from(code.exit_code()))
        }
    }
}

//! airlock-worker: claims tasks from the supervisor and carries each attempt
//! through its checkpointed phases (see the crate docs of `airlock_worker`).

use airlock_config::Config;
use airlock_journal::checkpoint::CheckpointJournal;
use airlock_proto::bus::LeaseRef;
use airlock_proto::envelope::Envelope;
use airlock_proto::{Code, Error};
use airlock_spool::Spool;
use airlock_worker::attempt::{Grant, Worker, WorkerSettings};
use airlock_worker::bus::{Supervisor, Wakeup, follow_queued, is_transient};
use airlock_worker::recover;
use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The credentialed airlock worker.
///
/// Claims tasks from org.airlock.Supervisor1 (Worker1 interface), publishes
/// each attempt's source archive and request to the spool, verifies the
/// executor's result against the request, commits it to the task's agent/
/// branch with a deterministic commit and a compare-and-swap, and submits
/// the result. Every phase is checkpointed in the journal; on start the
/// worker removes stale workspaces and what an interrupted `repo add` left
/// in the repository root, and resumes unfinished attempts.
#[derive(Debug, Parser)]
#[command(name = "airlock-worker", version, about, long_about)]
struct Args {
    /// Configuration file.
    #[arg(long, value_name = "PATH", default_value = airlock_config::DEFAULT_PATH)]
    config: PathBuf,
    /// D-Bus address of the supervisor's bus [default: the system bus].
    #[arg(long, value_name = "ADDRESS", env = "AIRLOCK_BUS_ADDRESS")]
    bus_address: Option<String>,
    /// The executor's uid (results must be owned by it) [default: from executor.user].
    #[arg(long, value_name = "UID")]
    executor_uid: Option<u32>,
    /// Seconds between claims when the queue is empty and no TaskChanged
    /// signal arrives (the signal wakes the worker at once).
    #[arg(long, value_name = "SECONDS", default_value_t = 2.0)]
    poll_seconds: f64,
}

fn main() -> ExitCode {
    // Started by git as its ssh (GIT_SSH) for an upstream transfer: become
    // airlock's ssh launcher, before anything else.
    if std::env::var_os(airlock_git::SSH_KEY_ENV).is_some() {
        airlock_git::ssh_launcher_main();
    }
    let args = Args::parse();
    airlock_service::init_logging();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("airlock-worker: {e}");
            eprintln!("airlock-worker: {e}");
            ExitCode::from(e.code.exit_code())
        }
    }
}

fn settings(config: &Config, executor_uid: Option<u32>) -> Result<WorkerSettings, Error> {
    let executor_uid = match executor_uid {
        Some(uid) => uid,
        None => airlock_service::uid_of("executor.user", &config.executor.user)?,
    };
    let state_dir = config
        .worker
        .journal
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    let limits = &config.executor.limits;
    Ok(WorkerSettings {
        repositories: config
            .repositories
            .iter()
            .map(|r| (r.name.clone(), r.clone()))
            .collect(),
        credentials: std::env::var_os("CREDENTIALS_DIRECTORY").map(PathBuf::from),
        upstream_state: state_dir.join("upstream"),
        ssh_launcher: std::env::current_exe()
            .map_err(|e| Error::with(Code::INTERNAL, format!("the worker's own path: {e}")))?,
        capabilities: config.worker.capabilities.clone(),
        workspace_root: config.worker.workspace_root.clone(),
        envelope_dir: state_dir.join("envelopes"),
        executor_uid,
        max_result_bytes: config.spool.max_file_bytes,
        archive_limits: airlock_git::ArchiveLimits {
            max_entries: limits.max_archive_entries as usize,
            max_file_bytes: limits.max_file_bytes,
            max_total_bytes: limits.max_total_bytes.min(limits.max_archive_bytes),
        },
        result_slack: Duration::from_secs(120),
        renew_interval: Duration::from_secs(u64::from(config.worker.renew_interval_seconds.max(1))),
        #[cfg(feature = "fault-injection")]
        fault: {
            airlock_worker::fault::arm_error_from_env()?;
            airlock_worker::fault::FaultPoint::from_env()?
        },
    })
}

fn run(args: Args) -> Result<(), Error> {
    let config = airlock_service::load_config(&args.config)?;
    let settings = settings(&config, args.executor_uid)?;
    let drop_ins = airlock_config::drop_in_dir(&args.config);
    if !drop_ins.is_dir() {
        tracing::warn!(
            "{} does not exist: repositories registered there after start need a restart, not a reload",
            drop_ins.display()
        );
    }
    // Open what the worker keeps: its state, the journal, the spool.
    std::fs::create_dir_all(&settings.envelope_dir)
        .map_err(|e| Error::with(Code::STORE_UNAVAILABLE, e.to_string()))?;
    let removed = recover::clean_workspaces(&settings.workspace_root)?;
    recover::clean_imports(&config.worker.repository_root);
    let journal = CheckpointJournal::open(&config.worker.journal)
        .map_err(|e| Error::with(e.code(), e.to_string()))?;
    let spool = Spool::open(&config.spool.root).map_err(|e| e.to_proto())?;
    // Confinement, before the runtime starts any thread.
    confine(&config, &settings, &spool, &drop_ins)?;
    if removed > 0 {
        tracing::info!("removed {removed} stale workspaces");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| Error::with(Code::INTERNAL, e.to_string()))?;
    // SIGHUP (systemctl reload) re-reads the repository drop-ins; its
    // handler is installed before anything else can be interrupted by it.
    let hangups = rt
        .block_on(async { tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) })
        .map_err(|e| Error::with(Code::INTERNAL, format!("installing SIGHUP: {e}")))?;
    let stopping = Arc::new(AtomicBool::new(false));
    {
        let stopping = Arc::clone(&stopping);
        rt.spawn(async move {
            if let Ok(mut term) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            {
                tokio::select! { _ = term.recv() => {}, _ = tokio::signal::ctrl_c() => {} }
            }
            tracing::info!("stopping: finishing attempts in flight");
            stopping.store(true, Ordering::SeqCst);
        });
    }
    // Every call to the supervisor is bounded by the renewal interval (at
    // most 30 s): a call with no answer by then fails as transient
    // (RUNTIME_UNAVAILABLE) and is tried again — a claim by the claim
    // loop, a renewal at the next interval, a result under the same key —
    // and its late answer is dropped with its future, never acted on (a
    // claim granted too late stays unclaimed by us and its lease lapses).
    let call_timeout = settings.renew_interval.min(airlock_client::DEFAULT_TIMEOUT);
    let bus = Supervisor::connect_on(rt.handle().clone(), args.bus_address.as_deref())?
        .with_timeout(call_timeout);
    let worker = Arc::new(Worker::new(
        settings,
        journal,
        spool,
        bus,
        Arc::clone(&stopping),
    ));

    {
        let worker = Arc::clone(&worker);
        let path = args.config.clone();
        let config = config.clone();
        let mut hangups = hangups;
        rt.spawn(async move {
            while hangups.recv().await.is_some() {
                reload(&worker, &config, &path);
            }
        });
    }

    let mut threads = Vec::new();
    for grant in recover::resumable(&worker)? {
        tracing::info!(task = %grant.envelope.binding.task_id, attempt = grant.attempt, "resuming");
        let worker = Arc::clone(&worker);
        let name = format!("resume-{}", grant.envelope.binding.task_id);
        threads.push(
            std::thread::Builder::new()
                .name(name)
                .spawn(move || {
                    report(&grant, worker.run(&grant));
                    worker.progress().retire();
                })
                .map_err(|e| Error::with(Code::INTERNAL, format!("spawning a thread: {e}")))?,
        );
    }
    // Following the upstreams: a thread of its own, so a slow remote
    // never delays a claim.
    {
        let worker = Arc::clone(&worker);
        std::thread::Builder::new()
            .name("upstreams".into())
            .spawn(move || worker.follow_upstreams())
            .map_err(|e| Error::with(Code::INTERNAL, format!("spawning a thread: {e}")))?;
    }
    let poll = Duration::from_secs_f64(args.poll_seconds.clamp(0.05, 60.0));
    let wakeup = Arc::new(Wakeup::default());
    if let Err(e) = follow_queued(worker.bus(), Arc::clone(&wakeup)) {
        tracing::warn!("not following TaskChanged signals, polling only: {e}");
    }
    for i in 0..config.parallel_tasks().max(1) {
        let worker = Arc::clone(&worker);
        let stopping = Arc::clone(&stopping);
        let wakeup = Arc::clone(&wakeup);
        threads.push(
            std::thread::Builder::new()
                .name(format!("claim-{i}"))
                .spawn(move || {
                    claim_loop(&worker, &stopping, &wakeup, poll);
                    worker.progress().retire();
                })
                .map_err(|e| Error::with(Code::INTERNAL, format!("spawning a thread: {e}")))?,
        );
    }
    let _ = sd_notify::notify(
        false,
        &[
            sd_notify::NotifyState::Ready,
            sd_notify::NotifyState::Status("claiming tasks"),
        ],
    );
    let watchdog_usec = watchdog_usec().unwrap_or(0);
    let watchdog = watchdog_usec > 0;
    // Wake at least twice a second to notice SIGTERM, and at half the
    // watchdog interval when systemd asks for pings.
    let mut tick = Duration::from_millis(500);
    if watchdog {
        tick = tick.min(Duration::from_micros(watchdog_usec / 2));
    }
    // The watchdog is pinged only while every claiming or attempt thread
    // moves (airlock_worker::progress): a wedged attempt stops the pings,
    // and systemd restarts the worker.
    let silence = Duration::from_micros(watchdog_usec.max(1));
    let mut wedged = false;
    while !stopping.load(Ordering::SeqCst) {
        std::thread::sleep(tick);
        if !watchdog {
            continue;
        }
        match worker.progress().stalled(silence) {
            None => {
                wedged = false;
                let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Watchdog]);
            }
            Some((thread, silent)) => {
                if !wedged {
                    tracing::error!(%thread, ?silent, "a worker thread makes no progress: the watchdog is no longer pinged");
                    let _ = sd_notify::notify(
                        false,
                        &[sd_notify::NotifyState::Status(&format!(
                            "{thread} makes no progress"
                        ))],
                    );
                }
                wedged = true;
            }
        }
    }
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
    for t in threads {
        let _ = t.join();
    }
    Ok(())
}

/// The worker's lockdown (`Role::Worker` in airlock_sandbox::role): its
/// journal's directory, workspaces, its side of the spool (and read access
/// to the executor's), the authority repositories, and git. The bus is
/// connected after it (Landlock, at the ABI requested, does not check
/// connect(2) to the bus socket).
fn confine(
    config: &Config,
    settings: &WorkerSettings,
    spool: &Spool,
    drop_ins: &std::path::Path,
) -> Result<(), Error> {
    use airlock_sandbox::role::{Paths, Role, Slot};
    use airlock_spool::Kind;
    let journal_dir = match config.worker.journal.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    // The upstreams known at start: the ports their URLs connect to (the
    // Landlock TCP rule), and the local paths (a grant each). An upstream
    // registered later with a new port needs a restart, which `airlockctl
    // repo add` does anyway (credentials are delivered at start).
    let mut ports = std::collections::BTreeSet::new();
    let mut local_upstreams = Vec::new();
    let mut ssh = false;
    for up in settings
        .repositories
        .values()
        .filter_map(|r| r.upstream.as_ref())
    {
        match airlock_proto::upstream::Scheme::of(&up.url) {
            Ok(airlock_proto::upstream::Scheme::Local) => {
                // A local upstream removed since it was registered stops
                // its own syncs (they fail with its path), not the worker.
                match airlock_proto::upstream::local_path(&up.url).map(PathBuf::from) {
                    Some(path) if path.is_dir() => local_upstreams.push(path),
                    _ => {
                        tracing::warn!(url = %up.url, "a local upstream that is not a directory: not opened to the worker")
                    }
                }
            }
            Ok(scheme) => {
                ssh |= scheme == airlock_proto::upstream::Scheme::Ssh;
                ports.extend(scheme.port(&up.url));
            }
            Err(_) => {}
        }
    }
    let paths = Paths::new()
        .with(Slot::JournalDir, journal_dir)
        .with(Slot::WorkspaceRoot, settings.workspace_root.clone())
        .with(Slot::SpoolRequests, spool.dir_path(Kind::Requests))
        .with(Slot::SpoolSources, spool.dir_path(Kind::Sources))
        .with(Slot::SpoolResults, spool.dir_path(Kind::Results))
        .with(Slot::SpoolFailed, spool.dir_path(Kind::Failed))
        .with(Slot::SpoolWants, spool.dir_path(Kind::Wants))
        .with_all(
            Slot::Repositories,
            settings.repositories.values().map(|r| r.path.clone()),
        )
        .with(Slot::RepositoryRoot, config.worker.repository_root.clone())
        .with(Slot::DropInDir, drop_ins.to_path_buf())
        .with_all(Slot::Credentials, settings.credentials.clone())
        .with_all(Slot::LocalUpstreams, local_upstreams)
        .with_all(
            Slot::SshLauncher,
            ssh.then(|| settings.ssh_launcher.clone()),
        )
        .with_tcp_connect(ports);
    let report = airlock_sandbox::lockdown::lockdown(Role::Worker, &paths)
        .map_err(|e| Error::with(e.code(), format!("lockdown: {e}")))?;
    tracing::info!("{report}");
    Ok(())
}

/// A reload: the main file's repositories as read at start, and the
/// drop-ins as they are now. A refused drop-in keeps the previous set.
fn reload(worker: &Worker, config: &Config, path: &std::path::Path) {
    let repositories = match config.repositories_now(path) {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("reload refused, repositories unchanged: {e}");
            return;
        }
    };
    for r in &repositories {
        if let Err(e) = airlock_git::AuthorityRepo::open(&r.path) {
            tracing::warn!(
                repository = %r.name,
                "{e}; its tasks will fail (a repository outside worker.repository_root needs a restart of the worker to be reachable)"
            );
        }
    }
    let map = repositories
        .into_iter()
        .map(|r| (r.name.clone(), r))
        .collect();
    let (added, removed) = worker.set_repositories(map);
    tracing::info!(?added, ?removed, "reloaded the registered repositories");
}

fn report(grant: &Grant, outcome: Result<airlock_worker::Finish, Error>) {
    let task = &grant.envelope.binding.task_id;
    match outcome {
        Ok(finish) => tracing::info!(%task, attempt = grant.attempt, ?finish, "attempt finished"),
        Err(e) => tracing::error!(%task, attempt = grant.attempt, "attempt interrupted: {e}"),
    }
}

/// The watchdog interval systemd asks for, as sd_watchdog_enabled(3)
/// decides: `WATCHDOG_USEC`, unless `WATCHDOG_PID` is set and names
/// another process.
fn watchdog_usec() -> Option<u64> {
    let usec = std::env::var("WATCHDOG_USEC").ok()?.parse::<u64>().ok()?;
    match std::env::var("WATCHDOG_PID") {
        Ok(pid) if pid.parse::<u32>().ok() != Some(std::process::id()) => None,
        _ => Some(usec),
    }
}

/// Ends an attempt whose envelope this worker refuses (a capability it
/// does not offer, an envelope it cannot check) with a failed result
/// carrying the refusal's code, so the task ends with its real reason
/// instead of waiting for the lease to lapse. Nothing was done yet, so no
/// checkpoint is needed: the result is derived from the claim alone and a
/// resend after a lost answer is an idempotent replay of the same key.
fn fail_refused_claim(
    worker: &Worker,
    stopping: &AtomicBool,
    claim: &airlock_proto::task::ClaimGrant,
    error: Error,
) {
    let Some(result) = airlock_proto::task::TaskResult::refused_claim(claim, error.code) else {
        tracing::error!(task = %claim.task_id, "the refused envelope names no digest or branch; its lease will expire");
        return;
    };
    let key = airlock_proto::checkpoint::result_idempotency_key(
        &claim.task_id,
        claim.attempt,
        &result.execution_digest,
    );
    let lease = LeaseRef::of(claim);
    let mut backoff = Duration::from_millis(200);
    loop {
        match worker.bus().submit_result(&lease, &key, &result) {
            Ok(_) => {
                tracing::info!(task = %claim.task_id, code = error.code.as_str(), "attempt failed with the refusal's code");
                return;
            }
            Err(e) if is_transient(e.code) && !stopping.load(Ordering::SeqCst) => {
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
            Err(e) => {
                tracing::error!(task = %claim.task_id, "could not report the refusal: {e}");
                return;
            }
        }
    }
}

/// How often an idle claiming thread beats while it waits for work.
const IDLE_BEAT: Duration = Duration::from_millis(200);

fn claim_loop(worker: &Worker, stopping: &AtomicBool, wakeup: &Wakeup, poll: Duration) {
    let mut backoff = poll;
    while !stopping.load(Ordering::SeqCst) {
        worker.progress().beat();
        let seen = wakeup.generation();
        match worker.bus().claim() {
            Ok(Some(claim)) => {
                backoff = poll;
                match Envelope::validate(
                    &claim.envelope,
                    None,
                    Some(&worker.settings().capabilities),
                ) {
                    Ok(envelope) => {
                        let grant = Grant {
                            attempt: claim.attempt,
                            lease: LeaseRef::of(&claim),
                            envelope,
                            resumed: false,
                        };
                        report(&grant, worker.run(&grant));
                    }
                    Err(e) => {
                        tracing::error!(task = %claim.task_id, attempt = claim.attempt, "refusing the claimed envelope: {e}");
                        fail_refused_claim(worker, stopping, &claim, e);
                    }
                }
            }
            Ok(None) => {
                // Idle: check the cases an administrator chose to adopt
                // (each settled one may be followed by another at once).
                while !stopping.load(Ordering::SeqCst) && worker.check_adoption() {
                    worker.progress().beat();
                }
                // Waiting is progress: beat in slices shorter than any
                // watchdog interval, so an idle worker keeps pinging even
                // when the poll is longer than systemd's WatchdogSec.
                let until = std::time::Instant::now() + poll;
                loop {
                    worker.progress().beat();
                    let left = until.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero()
                        || stopping.load(Ordering::SeqCst)
                        || wakeup.wait_past(seen, left.min(IDLE_BEAT))
                    {
                        break;
                    }
                }
            }
            Err(e) if is_transient(e.code) => {
                tracing::warn!("claim failed: {e}");
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
            Err(e) => {
                tracing::error!("claim refused: {e}");
                std::thread::sleep(Duration::from_secs(5));
            }
        }
    }
}

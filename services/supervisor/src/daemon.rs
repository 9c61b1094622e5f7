//! The daemon's life: start in order, serve, stop in order.
//!
//! Start: open and check the store; connect to the bus; choose and announce
//! the authoriser; export the three interfaces; sweep once (leases that expired
//! while the supervisor was down); take the well-known name; READY=1.
//!
//! Stop (SIGTERM): STOPPING=1; refuse new calls; let the calls in flight
//! finish (each commits or rolls back as a whole); release the name; answer
//! stragglers for a moment; close the connection.

use crate::agents::Agents;
use crate::authz::local::LocalAuthorizer;
use crate::authz::polkit::PolkitAuthorizer;
#[cfg(any(test, feature = "test-authorizers"))]
use crate::authz::testing::TestAuthorizer;
use crate::authz::{Authorizer, Gatekeeper, PeerUids};
use crate::bus::agents::AgentsIface;
use crate::bus::reconcile::Reconcile;
use crate::bus::retry::Retry;
use crate::bus::strict::Strict;
use crate::bus::tasks::Tasks;
use crate::bus::tasks_v1::TasksV1;
use crate::bus::worker::Worker;
use crate::bus::{BUS_NAME, Info, OBJECT_PATH, Shared};
use crate::ops::Ops;
use crate::repositories::Listing;
use crate::store::Store;
use crate::{follow, journal, notify, sweeper};
use airlock_proto::{Code, Error};
pub use airlock_taskdb::Location;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use zbus::fdo::{RequestNameFlags, RequestNameReply};
use zbus::object_server::SignalEmitter;

/// Which authoriser to use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthorizerChoice {
    /// polkit on the bus the daemon serves.
    Polkit,
    /// A fixed list of uids (machines without polkit).
    Local(LocalAuthorizer),
    /// A test authoriser, chosen explicitly; only in test builds.
    #[cfg(any(test, feature = "test-authorizers"))]
    ForTests(TestAuthorizer),
}

/// Everything the daemon needs, resolved from configuration and flags.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The task store (an SQLite file, or PostgreSQL shared with other hosts).
    pub database: Location,
    /// The bus to serve on; `None` = the system bus (`DBUS_SYSTEM_BUS_ADDRESS`
    /// or the standard socket).
    pub bus_address: Option<String>,
    /// The authoriser.
    pub authorizer: AuthorizerChoice,
    /// The uid Worker1 is reserved for.
    pub worker_uid: u32,
    /// The uid Retry1 is reserved for (airlock-retryd).
    pub retry_uid: u32,
    /// Lease lifetime.
    pub lease_seconds: u32,
    /// Sweeper period.
    pub sweep_interval: Duration,
    /// The registered repositories (`[[repository]]`), whose names
    /// submissions may use.
    pub repositories: Vec<Listing>,
    /// The programs each repository's commands may start.
    pub programs: airlock_config::ProgramTable,
    /// Accept passed results without an admin.
    pub auto_accept: bool,
    /// How long shutdown waits for calls in flight.
    pub drain_timeout: Duration,
    /// Slows every call down (shutdown tests only).
    pub call_delay: Option<Duration>,
    /// The planner agents to run (`[[agent]]`).
    pub agents: Vec<airlock_config::Agent>,
    /// What runs them.
    pub agent_driver: airlock_config::AgentDriver,
    /// How the agent runners call their driver.
    pub agent_options: airlock_agents::Options,
    /// Where and how often `airlock.prom` is written; `None`: never.
    pub metrics: Option<crate::metrics::MetricsSettings>,
    /// `supervisor.max_running_per_submitter` (0: no cap); each agent's
    /// `max_running` and quotas come with its table in `agents`.
    pub max_running_per_submitter: u32,
}

/// How long the journal export's last pass may take at shutdown.
const JOURNAL_FLUSH: Duration = Duration::from_secs(5);

/// How long after the last call finished its reply is surely written.
const SETTLE: Duration = Duration::from_millis(50);
/// How long stragglers are still answered after the name is released.
const LINGER: Duration = Duration::from_millis(200);

/// What a reload reads: the registered repositories, the programs
/// their commands may start, and the `[[agent]]` tables.
#[derive(Clone, Debug)]
pub struct Registered {
    /// The registered repositories.
    pub repositories: Vec<Listing>,
    /// The programs each repository's commands may start.
    pub programs: airlock_config::ProgramTable,
    /// The planner agents (`[[agent]]` in airlock.toml), each naming only
    /// registered repositories.
    pub agents: Vec<airlock_config::Agent>,
}

/// How the daemon re-reads the registered repositories and the agents: on
/// each signal (SIGHUP under `systemctl reload`), `reread` gives them now.
pub struct Reload {
    /// The signals, installed by the caller before anything could be
    /// interrupted by one.
    pub signals: tokio::signal::unix::Signal,
    /// The registered names and their programs now, or why the
    /// configuration was refused.
    pub reread: Box<dyn Fn() -> Result<Registered, Error> + Send + Sync>,
}

impl std::fmt::Debug for Reload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reload").finish_non_exhaustive()
    }
}

/// Runs the supervisor until `shutdown` completes, then stops in order.
pub async fn run(settings: Settings, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
    run_with_reload(settings, shutdown, None).await
}

/// Fails the queued tasks of repositories no longer registered, announcing
/// each. Not on a queue other hosts share: a repository this host does not
/// serve may be another host's, whose tasks stay queued for it (this host
/// only stops claiming them).
async fn fail_unregistered(shared: &Shared, emitter: &SignalEmitter<'_>) {
    if shared.ops.shared_queue() {
        tracing::info!(
            "shared queue: tasks of repositories this host does not serve stay queued for the hosts that serve them"
        );
        return;
    }
    let Ok(_guard) = shared.inflight.enter() else {
        return;
    };
    match shared.ops.fail_unregistered(shared.repositories()).await {
        Ok(failed) => {
            for task_id in failed {
                tracing::warn!(
                    task_id,
                    "FAILED: its repository is no longer registered (REPOSITORY_NOT_REGISTERED)"
                );
                if let Ok((state, revision)) = shared.ops.signal_facts(task_id.clone()).await {
                    crate::bus::tasks::announce(shared, emitter, &task_id, state, revision).await;
                }
            }
        }
        Err(e) => tracing::error!("failing the tasks of unregistered repositories: {e}"),
    }
}

/// The system actor that cancels a revoked agent's queued tasks after a reload.
pub const AGENT_REGISTRY: &str = "agent-registry";

/// Under the systemd driver, systemd (pid 1) hands each agent instance its
/// key from one place: any other `credential_file` is refused.
fn check_agent_credentials(
    driver: airlock_config::AgentDriver,
    agents: &[airlock_config::Agent],
) -> Result<(), Error> {
    if driver != airlock_config::AgentDriver::Systemd {
        return Ok(());
    }
    for a in agents {
        let want = std::path::PathBuf::from(format!("/etc/airlock/agents/{}.key", a.name));
        if a.credential_file.as_ref().is_some_and(|f| *f != want) {
            return Err(Error::with(
                Code::CONFIG_INVALID,
                format!(
                    "agent {:?}: under the systemd driver its credential_file must be {} (the unit's LoadCredential=)",
                    a.name,
                    want.display()
                ),
            ));
        }
    }
    Ok(())
}

/// Cancels, with AGENT_REVOKED, the queued tasks a reload took from their
/// agents: all of a removed agent's, and a narrowed agent's for the
/// repositories it lost; each announced.
async fn cancel_revoked(
    shared: &Shared,
    emitter: &SignalEmitter<'_>,
    applied: &crate::agents::Applied,
    tables: &[airlock_config::Agent],
) {
    let Ok(_guard) = shared.inflight.enter() else {
        return;
    };
    let mut revoked: Vec<(String, Option<Vec<String>>, String)> = Vec::new();
    for name in &applied.removed {
        revoked.push((
            name.clone(),
            None,
            format!("agent {name:?} was removed from the configuration"),
        ));
    }
    for (name, lost) in &applied.narrowed {
        let keep = tables
            .iter()
            .find(|a| &a.name == name)
            .map(|a| a.repositories.clone())
            .unwrap_or_default();
        revoked.push((
            name.clone(),
            Some(keep),
            format!("agent {name:?} may no longer propose for {lost:?}"),
        ));
    }
    for (name, keep, reason) in revoked {
        let actor = airlock_taskdb::tasks::Actor::system(AGENT_REGISTRY);
        match shared
            .ops
            .cancel_agent_queued(name.clone(), keep, reason, actor)
            .await
        {
            Ok(cancelled) => {
                for task_id in cancelled {
                    tracing::warn!(
                        task_id,
                        agent = %name,
                        "CANCELLED: its agent's right to it was revoked (AGENT_REVOKED)"
                    );
                    if let Ok((state, revision)) = shared.ops.signal_facts(task_id.clone()).await {
                        crate::bus::tasks::announce(shared, emitter, &task_id, state, revision)
                            .await;
                    }
                }
            }
            Err(e) => {
                tracing::error!(agent = %name, "cancelling a revoked agent's queued tasks: {e}")
            }
        }
    }
}

/// Applies one reload: new names, then the queued tasks of removed
/// repositories fail; then the agents' tables, and the queued tasks they
/// lost are cancelled. A refused configuration changes nothing.
async fn reload(
    shared: &Shared,
    emitter: &SignalEmitter<'_>,
    reload: &Reload,
    driver: airlock_config::AgentDriver,
) {
    let now = match (reload.reread)()
        .and_then(|r| check_agent_credentials(driver, &r.agents).map(|()| r))
    {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("reload refused, repositories unchanged, agents unchanged: {e}");
            return;
        }
    };
    let agents = shared.agents().unwrap_or_default();
    if let Err(e) = agents.check_apply(&now.agents) {
        tracing::error!("reload refused, repositories unchanged, agents unchanged: {e}");
        return;
    }
    let Registered {
        repositories,
        programs,
        agents: tables,
    } = now;
    shared.set_programs(programs);
    let before = shared.repositories();
    let names: Vec<String> = repositories.iter().map(|r| r.name().to_owned()).collect();
    let added: Vec<&String> = names.iter().filter(|n| !before.contains(n)).collect();
    let removed: Vec<&String> = before.iter().filter(|n| !names.contains(n)).collect();
    tracing::info!(?added, ?removed, "reloaded the registered repositories");
    shared.set_repositories(repositories);
    fail_unregistered(shared, emitter).await;
    match agents.apply(tables.clone()).await {
        Ok(applied) => {
            // The agents' caps and quotas apply to the next claim and
            // submission; the supervisor-wide cap is read at start only.
            let per_submitter = shared.ops.limits().caps.per_submitter;
            shared
                .ops
                .set_limits(crate::ops::Limits::of(per_submitter, &tables));
            tracing::info!(
                added = ?applied.added,
                removed = ?applied.removed,
                restarted = ?applied.restarted,
                narrowed = ?applied.narrowed,
                "reloaded the agents"
            );
            cancel_revoked(shared, emitter, &applied, &tables).await;
        }
        Err(e) => tracing::error!("agents unchanged: {e}"),
    }
}

/// [`run`], re-reading the registered repositories on each of `reload`'s
/// signals. The steps, in order: [`open`] the store and the bus, [`serve`]
/// the interfaces (calls wait until the name is owned), [`claim`] the bus
/// name, [`start_agents`], tell systemd it is [`ready`], [`spawn_loops`] (reload,
/// metrics, sweeps, the journal, the watchdog); then, once `shutdown`
/// completes, [`stop`].
pub async fn run_with_reload(
    settings: Settings,
    shutdown: impl Future<Output = ()>,
    reload_on: Option<Reload>,
) -> Result<(), Error> {
    let opened = open(&settings).await?;
    let served = serve(&settings, opened).await?;
    claim(&served.conn).await?;
    let agents = start_agents(&settings, &served).await?;
    ready(&settings, &served).await?;
    let loops = spawn_loops(&settings, &served, &agents, reload_on);
    shutdown.await;
    stop(&settings, served, agents, loops).await;
    Ok(())
}

fn unavailable(what: &str, e: zbus::Error) -> Error {
    Error::with(Code::RUNTIME_UNAVAILABLE, format!("{what}: {e}"))
}

/// What [`open`] opened: the task store, the bus connection and the
/// authoriser of calls.
struct Opened {
    store: Store,
    conn: zbus::Connection,
    authorizer: Arc<dyn Authorizer>,
}

/// Opens the task store, connects to the bus and chooses the authoriser.
async fn open(settings: &Settings) -> Result<Opened, Error> {
    // The store's client blocks (SQLite, and the PostgreSQL client with its
    // own small runtime): open it on the blocking pool, as every call runs.
    let location = settings.database.clone();
    let store = tokio::task::spawn_blocking(move || Store::open(&location))
        .await
        .map_err(|e| Error::with(Code::INTERNAL, format!("opening the store: {e}")))??;
    tracing::info!(database = %settings.database.describe(), "task store open");

    let builder = match &settings.bus_address {
        Some(addr) => zbus::connection::Builder::address(addr.as_str()),
        None => zbus::connection::Builder::system(),
    }
    .map_err(|e| unavailable("bus address", e))?;
    let conn = builder
        .build()
        .await
        .map_err(|e| unavailable("connecting to the bus", e))?;

    let authorizer: Arc<dyn Authorizer> = match &settings.authorizer {
        AuthorizerChoice::Polkit => Arc::new(PolkitAuthorizer::new(conn.clone())),
        AuthorizerChoice::Local(l) => Arc::new(l.clone()),
        #[cfg(any(test, feature = "test-authorizers"))]
        AuthorizerChoice::ForTests(t) => Arc::new(t.clone()),
    };
    if authorizer.is_for_tests() {
        tracing::warn!(
            authorizer = %authorizer.name(),
            "TEST AUTHORISER IN USE: Tasks1 calls are decided without polkit; never run this in production"
        );
    } else {
        tracing::info!(authorizer = %authorizer.name(), "Tasks1 calls are authorised");
    }
    Ok(Opened {
        store,
        conn,
        authorizer,
    })
}

/// The supervisor serving: its state shared with every handler, and what
/// runs beside the handlers until [`stop`].
struct Served {
    conn: zbus::Connection,
    store: Store,
    ops: Ops,
    shared: Arc<Shared>,
    emitter: SignalEmitter<'static>,
    /// Forgets TaskChanged listeners that left the bus.
    departures: tokio::task::JoinHandle<()>,
    /// Follows other hosts' changes (a shared PostgreSQL queue).
    follower: Option<tokio::task::JoinHandle<()>>,
    /// Turned true to stop the loops.
    stop_tx: tokio::sync::watch::Sender<bool>,
    stop_rx: tokio::sync::watch::Receiver<bool>,
}

/// Exports every interface but Agents1 (each call checked against its row
/// before its handler, bus::strict), follows departures and other hosts'
/// changes, and settles what changed while the supervisor was down.
async fn serve(settings: &Settings, opened: Opened) -> Result<Served, Error> {
    let Opened {
        store,
        conn,
        authorizer,
    } = opened;
    let info = Info {
        authorizer: authorizer.name(),
        auto_accept: settings.auto_accept,
        lease_seconds: settings.lease_seconds,
        worker_uid: settings.worker_uid,
    };
    let ops = Ops::new(store.clone(), settings.lease_seconds, settings.auto_accept)
        .with_shared_queue(matches!(settings.database, Location::Postgres(_)));
    ops.set_limits(crate::ops::Limits::of(
        settings.max_running_per_submitter,
        &settings.agents,
    ));
    let peers = PeerUids {
        worker: settings.worker_uid,
        retry: settings.retry_uid,
    };
    let gate = Gatekeeper::new(authorizer, peers, store.clone());
    let shared = Arc::new(Shared::new(
        ops.clone(),
        gate,
        info,
        settings.repositories.clone(),
        settings.call_delay,
    ));
    tracing::info!(programs = ?settings.programs, "the programs each repository's commands may start");
    shared.set_programs(settings.programs.clone());

    export(&conn, "Tasks2", Tasks::new(Arc::clone(&shared)), &shared).await?;
    export(
        &conn,
        "Tasks1",
        TasksV1::new(Tasks::new(Arc::clone(&shared))),
        &shared,
    )
    .await?;
    export(&conn, "Worker1", Worker::new(Arc::clone(&shared)), &shared).await?;
    export(&conn, "Retry1", Retry::new(Arc::clone(&shared)), &shared).await?;
    export(
        &conn,
        "Reconcile1",
        Reconcile::new(Arc::clone(&shared)),
        &shared,
    )
    .await?;
    let emitter = SignalEmitter::new(&conn, OBJECT_PATH)
        .map_err(|e| unavailable("signal emitter", e))?
        .into_owned();
    // TaskChanged goes to the connections that may read the task; one
    // that leaves the bus is forgotten.
    let departures = tokio::spawn({
        let (conn, watchers) = (conn.clone(), Arc::clone(&shared.watchers));
        async move {
            if let Err(e) = crate::bus::watchers::forget_departed(conn, watchers).await {
                tracing::warn!(
                    "not following departures from the bus (TaskChanged listeners are kept until a restart): {e}"
                );
            }
        }
    });

    // Shared with other hosts: their changes become TaskChanged here, from
    // before this supervisor announces itself.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let follower = match &settings.database {
        Location::Postgres(pg) => Some(
            follow::start(
                (**pg).clone(),
                Arc::clone(&shared),
                emitter.clone(),
                stop_rx.clone(),
            )
            .await,
        ),
        Location::Sqlite(_) => None,
    };

    sweeper::sweep_once(&shared, &emitter).await;
    // A repository removed while the supervisor was down: its queued tasks fail.
    fail_unregistered(&shared, &emitter).await;
    Ok(Served {
        conn,
        store,
        ops,
        shared,
        emitter,
        departures,
        follower,
        stop_tx,
        stop_rx,
    })
}

/// Exports one interface at the object path, every call checked against
/// its row before its handler runs (bus::strict).
async fn export<I>(
    conn: &zbus::Connection,
    name: &str,
    iface: I,
    shared: &Arc<Shared>,
) -> Result<(), Error>
where
    I: zbus::object_server::Interface,
    Strict<I>: zbus::object_server::Interface,
{
    conn.object_server()
        .at(OBJECT_PATH, Strict::new(iface, Arc::clone(shared)))
        .await
        .map(drop)
        .map_err(|e| unavailable(&format!("exporting {name}"), e))
}

/// Takes the bus name; a name another process owns stops the start.
async fn claim(conn: &zbus::Connection) -> Result<(), Error> {
    match conn
        .request_name_with_flags(BUS_NAME, RequestNameFlags::DoNotQueue.into())
        .await
    {
        Ok(RequestNameReply::PrimaryOwner) | Ok(RequestNameReply::AlreadyOwner) => Ok(()),
        Ok(other) => Err(Error::with(
            Code::RUNTIME_UNAVAILABLE,
            format!("{BUS_NAME} is owned by another process ({other:?})"),
        )),
        Err(zbus::Error::NameTaken) => Err(Error::with(
            Code::RUNTIME_UNAVAILABLE,
            format!("{BUS_NAME} is owned by another process"),
        )),
        Err(e) => Err(unavailable(&format!("requesting {BUS_NAME}"), e)),
    }
}

/// The planner agents, with the announcer of their changes.
struct Started {
    agents: Arc<Agents>,
    announcer: tokio::task::JoinHandle<()>,
    announcer_stop: tokio::sync::watch::Sender<bool>,
}

/// Starts the planner agents with their driver and exports Agents1. Only
/// the owner of the name runs agents: a second supervisor stopped at
/// [`claim`], before it could start (or stop) any of them. Their changes
/// come back on a channel, announced as AgentChanged.
async fn start_agents(settings: &Settings, served: &Served) -> Result<Started, Error> {
    let (agent_changes, agent_changed) = tokio::sync::mpsc::unbounded_channel();
    let (announcer_stop, announcer_stopped) = tokio::sync::watch::channel(false);
    let announcer = tokio::spawn(crate::bus::agents::announce(
        agent_changed,
        served.emitter.clone(),
        announcer_stopped,
    ));
    let store = served.store.clone();
    let conn = &served.conn;
    let agents = Arc::new(match settings.agent_driver {
        _ if settings.agents.is_empty() => {
            drop(agent_changes);
            Agents::default()
        }
        airlock_config::AgentDriver::LocalHost => Agents::start(
            settings.agents.clone(),
            Arc::new(airlock_agents::host::HostDriver::new(conn.clone())),
            store,
            agent_changes,
            settings.agent_options,
        )?,
        airlock_config::AgentDriver::Systemd => {
            check_agent_credentials(settings.agent_driver, &settings.agents)?;
            // Subscribed, with the match rules installed, before anything
            // starts; then whatever agent unit a previous supervisor left
            // running is stopped, and the runners decide from the store.
            let call_timeout = settings.agent_options.call_timeout;
            let bounded = |what: &'static str| {
                move |_| {
                    Error::with(
                        Code::RUNTIME_UNAVAILABLE,
                        format!(
                            "systemd1 {what}: not answered within {} ms",
                            call_timeout.as_millis()
                        ),
                    )
                }
            };
            let driver = tokio::time::timeout(
                call_timeout,
                airlock_agents::systemd::SystemdDriver::connect(conn.clone()),
            )
            .await
            .map_err(bounded("Subscribe"))?
            .map_err(|e| Error::with(Code::RUNTIME_UNAVAILABLE, e.to_string()))?;
            match tokio::time::timeout(call_timeout, driver.reconcile()).await {
                Ok(Ok(stopped)) => tracing::info!(?stopped, "agent units reconciled"),
                Ok(Err(e)) => tracing::warn!("reconciling the agent units: {e}"),
                Err(_) => tracing::warn!("reconciling the agent units: not answered in time"),
            }
            Agents::start(
                settings.agents.clone(),
                Arc::new(driver.clone()),
                store,
                agent_changes,
                settings.agent_options,
            )?
            .with_units(driver)
        }
    });
    served.shared.set_agents(Arc::clone(&agents));
    export(
        conn,
        "Agents1",
        AgentsIface::new(Arc::clone(&served.shared), Arc::clone(&agents)),
        &served.shared,
    )
    .await?;
    Ok(Started {
        agents,
        announcer,
        announcer_stop,
    })
}

/// Logs the ready line and tells systemd (READY=1).
async fn ready(settings: &Settings, served: &Served) -> Result<(), Error> {
    let summary = served.ops.summary().await?;
    let status = sweeper::status_line(
        summary.queued,
        summary.running,
        summary.verifying,
        &served.shared.info.authorizer,
    );
    tracing::info!(
        name = BUS_NAME,
        unique_name = served
            .conn
            .unique_name()
            .map(|n| n.to_string())
            .unwrap_or_default(),
        worker_uid = settings.worker_uid,
        retry_uid = settings.retry_uid,
        lease_seconds = settings.lease_seconds,
        auto_accept = settings.auto_accept,
        "ready: {status}"
    );
    notify::ready(&status);
    Ok(())
}

/// What runs until [`stop`]: the reloader, metrics, the sweeper, the
/// journal's exporter and the watchdog.
struct Loops {
    reloader: Option<tokio::task::JoinHandle<()>>,
    metrics: Option<tokio::task::JoinHandle<()>>,
    sweeper: tokio::task::JoinHandle<()>,
    exporter: tokio::task::JoinHandle<()>,
    /// Stops the exporter, after the drain, so that the drain's own
    /// events are exported too.
    journal_stop: tokio::sync::watch::Sender<bool>,
    watchdog: Option<tokio::task::JoinHandle<()>>,
}

fn spawn_loops(
    settings: &Settings,
    served: &Served,
    started: &Started,
    reload_on: Option<Reload>,
) -> Loops {
    let reloader = reload_on.map(|mut r| {
        let shared = Arc::clone(&served.shared);
        let driver = settings.agent_driver;
        let emitter = served.emitter.clone();
        tokio::spawn(async move {
            while r.signals.recv().await.is_some() {
                reload(&shared, &emitter, &r, driver).await;
            }
        })
    });
    let metrics = settings.metrics.clone().map(|m| {
        tracing::info!(
            "metrics: {}/{} every {} s",
            m.directory.display(),
            crate::metrics::FILE_NAME,
            m.interval.as_secs()
        );
        tokio::spawn(crate::metrics::run(
            Arc::clone(&served.shared),
            Arc::clone(&started.agents),
            m,
            served.stop_rx.clone(),
        ))
    });
    let sweeper = tokio::spawn(sweeper::run(
        Arc::clone(&served.shared),
        served.emitter.clone(),
        settings.sweep_interval,
        served.stop_rx.clone(),
    ));
    // The audit trail in the journal.
    let (journal_stop, journal_stop_rx) = tokio::sync::watch::channel(false);
    let cursor = match &settings.database {
        Location::Sqlite(path) => journal::Cursor::beside(path),
        Location::Postgres(_) => journal::Cursor::none(),
    };
    let exporter = tokio::spawn(journal::run(served.ops.clone(), cursor, journal_stop_rx));
    let watchdog = notify::watchdog_interval().map(|every| {
        tracing::info!("watchdog ping every {} ms", every.as_millis());
        tokio::spawn(notify::watchdog(served.ops.clone(), every))
    });
    Loops {
        reloader,
        metrics,
        sweeper,
        exporter,
        journal_stop,
        watchdog,
    }
}

/// Refuses new calls, finishes those in flight (at most the drain
/// timeout), stops the loops and every agent, then leaves the bus.
async fn stop(settings: &Settings, served: Served, started: Started, loops: Loops) {
    let Served {
        conn,
        shared,
        departures,
        follower,
        stop_tx,
        ..
    } = served;
    shared.inflight.close();
    tracing::info!("stopping: refusing new calls, finishing those in flight");
    notify::stopping("stopping: finishing calls in flight");
    let _ = stop_tx.send(true);
    if !shared.inflight.drained(settings.drain_timeout).await {
        tracing::error!(
            running = shared.inflight.running(),
            "calls still running after {} s; stopping anyway (their transactions commit whole or not at all)",
            settings.drain_timeout.as_secs()
        );
    }
    let _ = loops.sweeper.await;
    if let Some(m) = loops.metrics {
        let _ = m.await;
    }
    // Drain: every agent stopped (bounded by the driver's call timeout),
    // nothing recorded as an operator's stop.
    started.agents.drain().await;
    // The drain's changes are queued by now: the announcer announces them
    // and ends (the runners' senders may outlive the drain).
    let _ = started.announcer_stop.send(true);
    if tokio::time::timeout(JOURNAL_FLUSH, started.announcer)
        .await
        .is_err()
    {
        tracing::warn!("agent changes still being announced after the drain; stopping anyway");
    }
    let _ = loops.journal_stop.send(true);
    if tokio::time::timeout(JOURNAL_FLUSH, loops.exporter)
        .await
        .is_err()
    {
        tracing::warn!("journal export still running after its last pass; stopping anyway");
    }
    if let Some(r) = loops.reloader {
        r.abort();
    }
    if let Some(f) = follower {
        let _ = f.await;
    }
    if let Some(w) = loops.watchdog {
        w.abort();
    }
    departures.abort();
    // A handler's reply is written just after its guard drops.
    tokio::time::sleep(SETTLE).await;
    if let Err(e) = conn.release_name(BUS_NAME).await {
        tracing::warn!("releasing {BUS_NAME}: {e}");
    }
    tokio::time::sleep(LINGER).await;
    let server = conn.object_server();
    for removed in [
        server.remove::<Strict<Tasks>, _>(OBJECT_PATH).await,
        server.remove::<Strict<TasksV1>, _>(OBJECT_PATH).await,
        server.remove::<Strict<Worker>, _>(OBJECT_PATH).await,
        server.remove::<Strict<Retry>, _>(OBJECT_PATH).await,
        server.remove::<Strict<Reconcile>, _>(OBJECT_PATH).await,
        server.remove::<Strict<AgentsIface>, _>(OBJECT_PATH).await,
    ] {
        if let Err(e) = removed {
            tracing::warn!("unexporting an interface: {e}");
        }
    }
    if let Err(e) = conn.close().await {
        tracing::warn!("closing the bus connection: {e}");
    }
    tracing::info!("stopped");
}

//! A real supervisor in the test's own process, on a private bus of its
//! own (a real dbus-daemon), with an SQLite store in a temporary
//! directory: what the airlockctl, MCP and bus benchmark suites drive.
//!
//! ```ignore
//! let sup = InProcess::builder(AuthorizerChoice::ForTests(TestAuthorizer::allow_all()))
//!     .start()
//!     .await;
//! // … airlockctl with DBUS_SYSTEM_BUS_ADDRESS=sup.address() …
//! sup.stop().await;
//! ```

use airlock_localbus::PrivateBus;
use airlock_proto::bus::BUS_NAME;
use airlock_supervisor::daemon::{self, AuthorizerChoice, Location, Settings};
use airlock_supervisor::repositories::Listing;
use std::time::Duration;
use tokio::sync::oneshot;

/// How a supervisor is started: [`InProcess::builder`], then the settings
/// that differ from a test's usual ones, then [`Builder::start`].
pub struct Builder {
    authorizer: AuthorizerChoice,
    worker_uid: u32,
    retry_uid: u32,
    sweep_interval: Duration,
    auto_accept: bool,
    agents: Vec<airlock_config::Agent>,
    agent_options: airlock_agents::Options,
    metrics: Option<airlock_supervisor::metrics::MetricsSettings>,
}

/// Where the daemon runs: a task on the caller's tokio runtime, or a
/// runtime of its own on a thread (as in its own process).
enum Running {
    Task(tokio::task::JoinHandle<Result<(), airlock_proto::Error>>),
    Thread(std::thread::JoinHandle<Result<(), airlock_proto::Error>>),
}

/// A supervisor running in this process on its own bus, with its store
/// in [`InProcess::dir`].
pub struct InProcess {
    /// The private bus it serves on.
    pub bus: PrivateBus,
    /// Its state directory (the store is `tasks.sqlite3` here); tests may
    /// put their files here too.
    pub dir: tempfile::TempDir,
    stop: Option<oneshot::Sender<()>>,
    running: Option<Running>,
}

impl std::fmt::Debug for InProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcess")
            .field("bus", &self.address())
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Builder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builder")
            .field("worker_uid", &self.worker_uid)
            .field("retry_uid", &self.retry_uid)
            .field("sweep_interval", &self.sweep_interval)
            .field("auto_accept", &self.auto_accept)
            .field("agents", &self.agents.len())
            .finish_non_exhaustive()
    }
}

impl InProcess {
    /// A supervisor asking `authorizer`, with the test process as its
    /// worker and retry service (both reserved for this process's uid),
    /// one repository `demo`, results awaiting an admin, a 300 s lease, a
    /// 1 s sweep and no agents.
    pub fn builder(authorizer: AuthorizerChoice) -> Builder {
        let me = nix::unistd::getuid().as_raw();
        Builder {
            authorizer,
            worker_uid: me,
            retry_uid: me,
            sweep_interval: Duration::from_secs(1),
            auto_accept: false,
            agents: Vec::new(),
            agent_options: airlock_agents::Options::default(),
            metrics: None,
        }
    }

    /// The bus address (for `DBUS_SYSTEM_BUS_ADDRESS`).
    pub fn address(&self) -> &str {
        self.bus.address()
    }

    /// A new connection to the bus.
    pub async fn connect(&self) -> zbus::Connection {
        self.bus
            .connect()
            .await
            .expect("a connection to the private bus")
    }

    /// The one client, on a new connection.
    pub async fn client(&self) -> airlock_client::Supervisor {
        airlock_client::Supervisor::connect(Some(self.address()))
            .await
            .expect("a client of the supervisor")
    }

    /// Stops it and waits until it has; panics when it ended with an
    /// error.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        match self.running.take() {
            Some(Running::Task(t)) => t
                .await
                .expect("the supervisor task")
                .expect("the supervisor"),
            Some(Running::Thread(t)) => {
                t.join()
                    .expect("the supervisor thread")
                    .expect("the supervisor");
            }
            None => {}
        }
    }

    /// [`InProcess::stop`] for a supervisor on its own thread, from
    /// outside any runtime; its error, if it ended with one.
    pub fn stop_thread(mut self) -> Result<(), airlock_proto::Error> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        match self.running.take() {
            Some(Running::Thread(t)) => t.join().expect("the supervisor thread"),
            Some(Running::Task(_)) => panic!("stop_thread on a supervisor started with start()"),
            None => Ok(()),
        }
    }
}

impl Builder {
    /// Worker1 reserved for `uid` instead of this process's.
    pub fn worker_uid(mut self, uid: u32) -> Builder {
        self.worker_uid = uid;
        self
    }

    /// Retry1 reserved for `uid` instead of this process's.
    pub fn retry_uid(mut self, uid: u32) -> Builder {
        self.retry_uid = uid;
        self
    }

    /// The sweeper's period.
    pub fn sweep_interval(mut self, every: Duration) -> Builder {
        self.sweep_interval = every;
        self
    }

    /// Passed results accepted without an admin.
    pub fn auto_accept(mut self) -> Builder {
        self.auto_accept = true;
        self
    }

    /// The planner agents to run, and how their runners call the driver.
    pub fn agents(
        mut self,
        agents: Vec<airlock_config::Agent>,
        options: airlock_agents::Options,
    ) -> Builder {
        self.agents = agents;
        self.agent_options = options;
        self
    }

    /// `airlock.prom` written into `directory` every `every`.
    pub fn metrics(mut self, directory: &std::path::Path, every: Duration) -> Builder {
        self.metrics = Some(airlock_supervisor::metrics::MetricsSettings {
            directory: directory.to_owned(),
            interval: every,
        });
        self
    }

    fn settings(self, bus: &PrivateBus, dir: &std::path::Path) -> Settings {
        Settings {
            database: Location::Sqlite(dir.join("tasks.sqlite3")),
            bus_address: Some(bus.address().to_owned()),
            authorizer: self.authorizer,
            worker_uid: self.worker_uid,
            retry_uid: self.retry_uid,
            lease_seconds: 300,
            sweep_interval: self.sweep_interval,
            auto_accept: self.auto_accept,
            repositories: vec![Listing::of(&airlock_config::Repository {
                name: "demo".into(),
                path: "/srv/git/demo.git".into(),
                description: None,
                environment: None,
                upstream: None,
                signing: None,
                drop_in: None,
            })],
            programs: airlock_config::ProgramTable::from_config(&airlock_config::Config::default()),
            drain_timeout: Duration::from_secs(5),
            call_delay: None,
            agents: self.agents,
            agent_driver: airlock_config::AgentDriver::LocalHost,
            agent_options: self.agent_options,
            metrics: self.metrics,
            max_running_per_submitter: 0,
        }
    }

    /// Starts it on a new private bus, as a task on the caller's runtime,
    /// and waits until it owns its bus name.
    pub async fn start(self) -> InProcess {
        let bus = PrivateBus::start().expect("dbus-daemon");
        self.start_on(bus).await
    }

    /// [`Builder::start`] on `bus` (one the test started with its own
    /// policies, or with an agent host already serving on it).
    pub async fn start_on(self, bus: PrivateBus) -> InProcess {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let settings = self.settings(&bus, dir.path());
        let (tx, rx) = oneshot::channel();
        let task = tokio::spawn(daemon::run(settings, async {
            let _ = rx.await;
        }));
        let sup = InProcess {
            bus,
            dir,
            stop: Some(tx),
            running: Some(Running::Task(task)),
        };
        named(&sup.bus).await;
        sup
    }

    /// Starts it on a new private bus, on a two-thread runtime of its own
    /// (as in its own process: a benchmark's client then measures only
    /// the calls). Returns without waiting for its name; a caller waits
    /// with [`named`] from its own runtime.
    pub fn start_threaded(self) -> InProcess {
        let bus = PrivateBus::start().expect("dbus-daemon");
        let dir = tempfile::tempdir().expect("a temporary directory");
        let settings = self.settings(&bus, dir.path());
        let (tx, rx) = oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("the supervisor's runtime")
                .block_on(daemon::run(settings, async {
                    let _ = rx.await;
                }))
        });
        InProcess {
            bus,
            dir,
            stop: Some(tx),
            running: Some(Running::Thread(thread)),
        }
    }
}

/// Waits (10 s at most) until the supervisor owns its name on `bus`.
pub async fn named(bus: &PrivateBus) {
    let conn = bus
        .connect()
        .await
        .expect("a connection to the private bus");
    let dbus = zbus::fdo::DBusProxy::new(&conn)
        .await
        .expect("the bus's own proxy");
    let name: zbus::names::BusName<'static> = BUS_NAME.try_into().expect("a well-known name");
    for _ in 0..400 {
        if dbus
            .name_has_owner(name.clone())
            .await
            .expect("NameHasOwner")
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the supervisor did not take its name");
}

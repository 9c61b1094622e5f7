//! airlock-local as a library: start the whole suite on one machine, as
//! the `airlock-local` binary and the crash matrix do.
//!
//! Owns: airlock-local: the whole suite on one machine without packages,
//! one uid per component as root.
//! Never: be what an installed system runs: packages ship units, and
//! airlock-local only starts the same binaries.

pub mod agents;
pub mod client;
pub mod demo;
pub mod fleet;
pub mod import;
pub mod layout;
pub mod preflight;
pub mod walls;

use airlock_localbus::PrivateBus;
use fleet::{Fleet, Spec, wait_for_log};
use layout::{Ids, Layout};
use std::path::PathBuf;
use std::time::Duration;

/// The running suite.
#[derive(Debug)]
pub struct Suite {
    pub layout: Layout,
    pub ids: Ids,
    pub bus: PrivateBus,
    pub fleet: Fleet,
    pub retry_url: String,
    /// The agent host (dropped after the fleet: the supervisor drains the
    /// agents through it as it stops).
    pub agent_host: Option<agents::HostThread>,
    /// The cgroups delegated to the executor for the walls between jobs
    /// (removed after the fleet stopped).
    pub walls: Option<walls::Delegated>,
}

impl Drop for Suite {
    /// Stops in order: the components (the supervisor drains its agents
    /// through the host as it stops), then the agent host, then the bus.
    fn drop(&mut self) {
        self.fleet.stop(Duration::from_secs(10));
        self.agent_host.take();
    }
}

/// A component binary: next to the running executable, or one directory
/// up (a test binary lives in target/<profile>/deps).
pub fn sibling(name: &str) -> Result<PathBuf, String> {
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let dir = me.parent().map(PathBuf::from).unwrap_or_default();
    for candidate in [dir.join(name), dir.join("..").join(name)] {
        if candidate.exists() {
            return Ok(candidate);
        }
    }
    Err(format!(
        "{name} not found next to {}; build the binaries first (cargo build --workspace --bins)",
        me.display()
    ))
}

/// Prepares the state directory and starts every component.
pub fn start(state: PathBuf, quiet: bool) -> Result<Suite, String> {
    start_with(state, quiet, &Tuning::default())
}

/// Knobs the crash matrix turns; the demo uses the defaults.
#[derive(Debug, Clone)]
pub struct Tuning {
    /// Lease length in seconds.
    pub lease_seconds: u32,
    /// Worker threads.
    pub parallel_tasks: u32,
    /// `[executor] parallel_jobs`: verification jobs at once (0: the CPUs
    /// the executor may use).
    pub parallel_jobs: u32,
    /// `[executor.limits] job_memory_mib` and `job_processes`, when set.
    pub job_walls: Option<(u32, u32)>,
    /// `[executor.limits] job_disk_mib`, when set.
    pub job_disk_mib: Option<u32>,
    /// The caller's repositories to serve next to the demo one: (name,
    /// path of a git repository, bare or not). Each is imported into the
    /// state directory, where the worker is its only writer.
    pub repositories: Vec<(String, PathBuf)>,
    /// A task store shared with other stacks (default: an SQLite file in
    /// the state directory).
    pub shared_store: Option<SharedStore>,
    /// The directory of the authority repositories, when other stacks
    /// share it (default: `repos/` in the state directory). The demo
    /// repository is made there unless it exists.
    pub repos: Option<PathBuf>,
    /// A network namespace (`/run/netns/NAME`) every component joins, so
    /// that the stack is a host of its own (root only). The executor then
    /// makes its own namespace inside it.
    pub netns: Option<PathBuf>,
    /// Planner agents to run (`[[agent]]` tables), started by the
    /// supervisor through airlock-local's agent host.
    pub agents: Vec<airlock_config::Agent>,
    /// `[executor] landlock_min_abi` and `allow_degraded_landlock`, when
    /// set: a stack whose commands run under degraded Landlock (tests of
    /// the isolation evidence).
    pub executor_landlock: Option<(u8, bool)>,
    /// Verification environments of the caller's repositories, by name
    /// (`--environment NAME=FILE`).
    pub environments: Vec<(String, airlock_config::Environment)>,
    /// airlock-egress's routes (`--egress-config FILE`): the text of its
    /// `--config` file (`[[route]]` tables, docs/privsep/egress.md),
    /// written to the state directory. None: every host direct.
    pub egress_routes: Option<String>,
    /// Credentials airlock-egress's routes name (`--egress-credential
    /// NAME=FILE`), handed over as systemd's LoadCredential= would: a
    /// directory only the proxy's uid reads, as CREDENTIALS_DIRECTORY.
    pub egress_credentials: Vec<(String, PathBuf)>,
    /// Upstreams of the caller's repositories (`--upstream NAME=URL`): a
    /// name also in `repositories` is imported, then follows its upstream;
    /// any other starts empty and is filled by the worker's first sync.
    pub upstreams: Vec<LocalUpstream>,
}

/// One repository's upstream under airlock-local.
#[derive(Debug, Clone)]
pub struct LocalUpstream {
    /// The repository.
    pub name: String,
    /// `repository[].upstream` as written to the configuration.
    pub upstream: airlock_config::Upstream,
    /// The deploy key (ssh) or token (https), copied where only the
    /// worker's uid reads it.
    pub credential: Option<PathBuf>,
    /// The signer's principal and its Ed25519 key, when commits are signed.
    pub signing: Option<(String, PathBuf)>,
}

/// A PostgreSQL task store several stacks share.
#[derive(Clone)]
pub struct SharedStore {
    /// `postgresql://` URL of the supervisors' role (no password).
    pub url: String,
    /// That role's password, handed to the supervisor as the systemd
    /// credential `airlock-database-password` would be.
    pub password: String,
    /// `supervisor.database_allow_plaintext`: TCP without TLS to a host
    /// that is not loopback (a network the caller owns end to end, such
    /// as the namespaces of airlock-pgcluster's `Network`).
    pub allow_plaintext: bool,
}

impl std::fmt::Debug for SharedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedStore")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            lease_seconds: 60,
            parallel_tasks: 2,
            parallel_jobs: 0,
            job_walls: None,
            job_disk_mib: None,
            repositories: Vec::new(),
            shared_store: None,
            repos: None,
            netns: None,
            agents: Vec::new(),
            executor_landlock: None,
            environments: Vec::new(),
            egress_routes: None,
            egress_credentials: Vec::new(),
            upstreams: Vec::new(),
        }
    }
}

/// Like [`start`], with tuning.
pub fn start_with(state: PathBuf, quiet: bool, tuning: &Tuning) -> Result<Suite, String> {
    let ids = Ids::for_caller()?;
    if !ids.separated && !quiet {
        eprintln!(
            "airlock-local: WARNING: not running as root, so every component runs as your user: privilege separation is OFF."
        );
    }
    let root = std::path::absolute(&state).map_err(|e| e.to_string())?;
    let layout = Layout { root };
    let names = tuning
        .repositories
        .iter()
        .map(|(n, _)| n)
        .chain(tuning.upstreams.iter().map(|u| &u.name));
    for name in names {
        if !airlock_proto::binding::is_repository_name(name) || name == "demo" {
            return Err(format!(
                "--repo {name}=…: a name is 1 to 64 characters [A-Za-z0-9._-] starting with a letter or digit, other than demo"
            ));
        }
    }
    // Every component must reach its paths before anything starts.
    preflight::check(&layout, &ids)?;
    layout::create(&layout, &ids)
        .map_err(|e| format!("preparing {}: {e}", layout.root.display()))?;
    let supervisor_bin = sibling("airlock-supervisor")?;
    let worker_bin = sibling("airlock-worker")?;
    let executor_bin = sibling("airlock-executor")?;
    let retryd_bin = sibling("airlock-retryd")?;
    // The egress proxy runs only for a stack with a setup to serve.
    let with_setup = tuning.environments.iter().any(|(_, e)| e.setup.is_some());
    let egress_bin = if with_setup {
        Some(sibling("airlock-egress")?)
    } else {
        None
    };

    // The bus first: the configuration records its address, so that
    // `airlockctl --config STATE/airlock.toml` reaches this stack.
    let host_policy = layout.path("agent-host.conf");
    let extra_policies: Vec<&std::path::Path> = if tuning.agents.is_empty() {
        Vec::new()
    } else {
        let text =
            airlock_agents::host::bus_policy(&ids.name(ids.admin), &ids.name(ids.supervisor));
        std::fs::write(&host_policy, text)
            .map_err(|e| format!("{}: {e}", host_policy.display()))?;
        vec![host_policy.as_path()]
    };
    let bus = PrivateBus::start_with(&ids.name(ids.supervisor), &extra_policies)
        .map_err(|e| format!("starting dbus-daemon: {e}"))?;
    let address = bus.address().to_owned();

    // Readable by every component user, whatever the caller's umask.
    layout::file(
        &layout.config(),
        layout::config_text(&layout, &ids, tuning, &address).as_bytes(),
        0o644,
        layout::Id { uid: 0, gid: 0 },
        &layout::Ids {
            separated: false,
            ..ids
        },
    )
    .map_err(|e| format!("{}: {e}", layout.config().display()))?;
    // A shared store's password, as systemd's LoadCredential= would hand
    // it over: a file only the supervisor's uid may read.
    let mut supervisor_env = vec![];
    if let Some(store) = &tuning.shared_store {
        let creds = layout.path("credentials");
        std::fs::create_dir_all(&creds).map_err(|e| e.to_string())?;
        layout::chown_tree(&creds, ids.supervisor, &ids).map_err(|e| e.to_string())?;
        std::fs::set_permissions(&creds, std::os::unix::fs::PermissionsExt::from_mode(0o500))
            .map_err(|e| e.to_string())?;
        layout::file(
            &creds.join("airlock-database-password"),
            store.password.as_bytes(),
            0o400,
            ids.supervisor,
            &ids,
        )
        .map_err(|e| e.to_string())?;
        supervisor_env.push((
            "CREDENTIALS_DIRECTORY".to_owned(),
            creds.display().to_string(),
        ));
    }
    let mut token = [0u8; 32];
    getrandom::getrandom(&mut token).map_err(|e| e.to_string())?;
    layout::file(
        &layout.token(),
        hex::encode(token).as_bytes(),
        0o600,
        ids.retry,
        &ids,
    )
    .map_err(|e| e.to_string())?;
    let repos = tuning.repos.clone().unwrap_or_else(|| layout.repos());
    // What an interrupted `airlockctl repo add` left there (its process
    // gone), before anything is made beside it.
    import::sweep(&repos);
    demo::create_repository_at(&repos, &ids)?;
    if !tuning.agents.is_empty() {
        agents::share_repositories(&repos, &ids)?;
    }
    for (name, path) in &tuning.repositories {
        import::repository(&layout, &ids, name, path)?;
    }
    for up in &tuning.upstreams {
        if !tuning.repositories.iter().any(|(n, _)| n == &up.name) {
            import::empty(&layout, &ids, &up.name)?;
        }
    }
    // The worker's credentials, as systemd's LoadCredential= would hand
    // them over: a directory and files only the worker's uid may read.
    let mut worker_env = vec![];
    let worker_credentials: Vec<(String, &std::path::Path)> = tuning
        .upstreams
        .iter()
        .flat_map(|u| {
            let (credential, signing) = airlock_config::credential_names(&u.name);
            u.credential
                .as_deref()
                .map(|p| (credential, p))
                .into_iter()
                .chain(u.signing.as_ref().map(|(_, p)| (signing, p.as_path())))
        })
        .collect();
    if !worker_credentials.is_empty() {
        let creds = layout.path("worker-credentials");
        let _ = std::fs::remove_dir_all(&creds);
        std::fs::create_dir_all(&creds).map_err(|e| e.to_string())?;
        for (name, from) in &worker_credentials {
            let bytes = std::fs::read(from).map_err(|e| format!("{}: {e}", from.display()))?;
            layout::file(&creds.join(name), &bytes, 0o400, ids.worker, &ids)
                .map_err(|e| e.to_string())?;
        }
        layout::chown_tree(&creds, ids.worker, &ids).map_err(|e| e.to_string())?;
        std::fs::set_permissions(&creds, std::os::unix::fs::PermissionsExt::from_mode(0o500))
            .map_err(|e| e.to_string())?;
        worker_env.push((
            "CREDENTIALS_DIRECTORY".to_owned(),
            creds.display().to_string(),
        ));
    }
    preflight::check_config(&layout, &ids)?;

    // The host is on the bus before the supervisor starts any agent.
    let agent_host = if tuning.agents.is_empty() {
        None
    } else {
        Some(agents::HostThread::start(
            &address,
            tuning.agents.clone(),
            &ids,
            layout.path("agents"),
        )?)
    };
    let config = layout.config().display().to_string();
    let logs = layout.logs();
    let mut fleet = Fleet::default();
    let s = |v: &str| v.to_owned();
    fleet
        .start(
            Spec {
                name: "supervisor",
                program: supervisor_bin,
                args: vec![
                    s("--config"),
                    config.clone(),
                    s("--bus-address"),
                    address.clone(),
                ],
                env: supervisor_env,
                id: ids.supervisor,
                new_netns: false,
                netns: tuning.netns.clone(),
            },
            &ids,
            &logs,
        )
        .map_err(|e| e.to_string())?;
    demo::wait_for_name(&address, Duration::from_secs(20))
        .map_err(|e| format!("{e}\n{}", fleet::tail(&logs.join("supervisor.log"), 15)))?;
    if let Some(program) = egress_bin {
        let socket = layout.egress_socket();
        let mut args = vec![
            s("--socket"),
            socket.display().to_string(),
            s("--allow-uid"),
            ids.executor.uid.to_string(),
        ];
        let mut env = vec![];
        if let Some(routes) = &tuning.egress_routes {
            let file = layout.path("egress.toml");
            layout::file(
                &file,
                routes.as_bytes(),
                0o444,
                layout::Id { uid: 0, gid: 0 },
                &ids,
            )
            .map_err(|e| format!("{}: {e}", file.display()))?;
            args.extend([s("--config"), file.display().to_string()]);
        }
        if !tuning.egress_credentials.is_empty() {
            // As systemd's LoadCredential= would: only the proxy's uid reads them.
            let creds = layout.path("egress-credentials");
            let _ = std::fs::remove_dir_all(&creds);
            std::fs::create_dir_all(&creds).map_err(|e| e.to_string())?;
            for (name, from) in &tuning.egress_credentials {
                let bytes = std::fs::read(from).map_err(|e| format!("{}: {e}", from.display()))?;
                layout::file(&creds.join(name), &bytes, 0o400, ids.egress, &ids)
                    .map_err(|e| e.to_string())?;
            }
            layout::chown_tree(&creds, ids.egress, &ids).map_err(|e| e.to_string())?;
            std::fs::set_permissions(&creds, std::os::unix::fs::PermissionsExt::from_mode(0o500))
                .map_err(|e| e.to_string())?;
            env.push((
                "CREDENTIALS_DIRECTORY".to_owned(),
                creds.display().to_string(),
            ));
        }
        fleet
            .start(
                Spec {
                    name: "egress",
                    program,
                    args,
                    env,
                    id: ids.egress,
                    new_netns: false,
                    netns: tuning.netns.clone(),
                },
                &ids,
                &logs,
            )
            .map_err(|e| e.to_string())?;
        wait_for_log(
            &logs.join("egress.log"),
            "listening on ",
            Duration::from_secs(20),
        )
        .ok_or_else(|| {
            format!(
                "airlock-egress did not start:\n{}",
                fleet::tail(&logs.join("egress.log"), 15)
            )
        })?;
    }
    // The executor's job walls: cgroups given to it, as Delegate=yes would.
    let delegated = walls::Delegated::make(&ids);
    fleet
        .start(
            Spec {
                name: "executor",
                program: executor_bin,
                args: vec![
                    s("serve"),
                    s("--config"),
                    config.clone(),
                    s("--spool"),
                    layout.spool().display().to_string(),
                    s("--worker-uid"),
                    ids.worker.uid.to_string(),
                    s("--work"),
                    layout.path("exec/work").display().to_string(),
                ],
                env: delegated.iter().map(walls::Delegated::env).collect(),
                id: ids.executor,
                new_netns: true,
                netns: tuning.netns.clone(),
            },
            &ids,
            &logs,
        )
        .map_err(|e| e.to_string())?;
    fleet
        .start(
            Spec {
                name: "worker",
                program: worker_bin,
                args: vec![
                    s("--config"),
                    config.clone(),
                    s("--bus-address"),
                    address.clone(),
                    s("--executor-uid"),
                    ids.executor.uid.to_string(),
                ],
                env: worker_env,
                id: ids.worker,
                new_netns: false,
                netns: tuning.netns.clone(),
            },
            &ids,
            &logs,
        )
        .map_err(|e| e.to_string())?;
    fleet
        .start(
            Spec {
                name: "retryd",
                program: retryd_bin,
                args: vec![
                    s("--config"),
                    config.clone(),
                    s("--bus-address"),
                    address.clone(),
                    s("--listen"),
                    s("127.0.0.1:0"),
                ],
                env: vec![],
                id: ids.retry,
                new_netns: false,
                netns: tuning.netns.clone(),
            },
            &ids,
            &logs,
        )
        .map_err(|e| e.to_string())?;
    let retry_addr = wait_for_log(
        &logs.join("retryd.log"),
        "listening on ",
        Duration::from_secs(15),
    )
    .ok_or_else(|| {
        format!(
            "retryd did not start:\n{}",
            fleet::tail(&logs.join("retryd.log"), 15)
        )
    })?;
    std::thread::sleep(Duration::from_millis(300));
    fleet.check_alive()?;
    Ok(Suite {
        layout,
        ids,
        bus,
        fleet,
        retry_url: format!("http://{retry_addr}"),
        agent_host,
        walls: delegated,
    })
}

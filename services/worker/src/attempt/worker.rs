//! The worker's state: its settings, and the stores every phase reads and
//! writes through (the registry of repositories, the checkpoint journal,
//! the kept envelopes).

use super::{Step, refused, spool_err};
use crate::bus::Supervisor;
use airlock_config::Repository;
use airlock_git::ArchiveLimits;
use airlock_journal::checkpoint::CheckpointJournal;
use airlock_proto::envelope::Envelope;
use airlock_proto::{Code, Error};
use airlock_spool::{Expect, Spool};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the worker needs to know, resolved from configuration at start.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    /// Registered repositories by name (path, upstream, signing).
    pub repositories: BTreeMap<String, Repository>,
    /// Where systemd (or airlock-local) put the worker's credentials: each
    /// repository's deploy key or token and signing key
    /// (`airlock_config::credential_names`); `None`: there are none.
    pub credentials: Option<PathBuf>,
    /// The worker's own files about upstreams: pinned host keys, sync
    /// state, sync requests (`<state>/upstream`).
    pub upstream_state: PathBuf,
    /// The program git starts as ssh (this worker's own executable, which
    /// becomes airlock's ssh launcher: `airlock_git::ssh_launcher_main`).
    pub ssh_launcher: PathBuf,
    /// Capabilities this worker offers; an envelope may ask for no more.
    pub capabilities: Vec<String>,
    /// Per-attempt scratch directories live here; removed at start.
    pub workspace_root: PathBuf,
    /// Where envelopes of claimed attempts are kept for resumption.
    pub envelope_dir: PathBuf,
    /// The executor's uid: the only acceptable owner of results.
    pub executor_uid: u32,
    /// Largest result or failure file read from the spool.
    pub max_result_bytes: u64,
    /// Bounds on the source archive.
    pub archive_limits: ArchiveLimits,
    /// Added to the sum of command timeouts when waiting for a result.
    pub result_slack: Duration,
    /// How often a lease is renewed.
    pub renew_interval: Duration,
    /// Fault injection for the crash matrix: SIGKILL (or SIGSTOP) this
    /// process at this point (env AIRLOCK_FAULT_KILL_AFTER or
    /// AIRLOCK_FAULT_STOP_AT; see [`crate::fault`]).
    #[cfg(feature = "fault-injection")]
    pub fault: Option<crate::fault::Armed>,
}

/// The worker: journal, spool and supervisor.
#[derive(Debug)]
pub struct Worker {
    pub(crate) settings: WorkerSettings,
    /// The registered repositories now: `settings.repositories` at start,
    /// replaced on reload (SIGHUP). An attempt looks its repository up at
    /// each step, so one removed meanwhile fails with
    /// REPOSITORY_NOT_REGISTERED.
    registry: std::sync::RwLock<BTreeMap<String, Repository>>,
    /// Shared by every attempt; appends group-commit (see
    /// [`CheckpointJournal::append`]).
    journal: CheckpointJournal,
    pub(super) spool: Spool,
    pub(super) bus: Supervisor,
    pub(crate) stopping: Arc<AtomicBool>,
    pub(super) progress: crate::progress::Progress,
    /// Attempts whose pending publication was reported (once each).
    pending_reported: Mutex<std::collections::BTreeSet<String>>,
}

impl Worker {
    /// Assembles a worker.
    pub fn new(
        settings: WorkerSettings,
        journal: CheckpointJournal,
        spool: Spool,
        bus: Supervisor,
        stopping: Arc<AtomicBool>,
    ) -> Self {
        Worker {
            registry: std::sync::RwLock::new(settings.repositories.clone()),
            settings,
            journal,
            spool,
            bus,
            stopping,
            progress: crate::progress::Progress::default(),
            pending_reported: Mutex::new(Default::default()),
        }
    }

    /// The calling thread's progress, for the watchdog ([`crate::progress`]).
    /// True the first time `key` (task/attempt) asks.
    pub(super) fn first_pending(&self, key: &str) -> bool {
        self.pending_reported
            .lock()
            .map(|mut s| s.insert(key.to_owned()))
            .unwrap_or(false)
    }

    pub fn progress(&self) -> &crate::progress::Progress {
        &self.progress
    }

    /// The supervisor connection.
    pub fn bus(&self) -> &Supervisor {
        &self.bus
    }

    /// The settings.
    pub fn settings(&self) -> &WorkerSettings {
        &self.settings
    }

    /// Replaces the registered repositories (a reload); returns the names
    /// added and removed.
    pub fn set_repositories(
        &self,
        repositories: BTreeMap<String, Repository>,
    ) -> (Vec<String>, Vec<String>) {
        let mut now = self
            .registry
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let added = repositories
            .iter()
            .filter(|(n, r)| now.get(*n) != Some(r))
            .map(|(n, _)| n.clone())
            .collect();
        let removed = now
            .keys()
            .filter(|n| !repositories.contains_key(*n))
            .cloned()
            .collect();
        *now = repositories;
        (added, removed)
    }

    /// The path of a registered repository.
    pub fn repository_path(&self, name: &str) -> Option<PathBuf> {
        self.repository(name).map(|r| r.path)
    }

    /// The registration of `name` now.
    pub fn repository(&self, name: &str) -> Option<Repository> {
        self.registry().get(name).cloned()
    }

    /// Refuses a repository no longer registered (REPOSITORY_NOT_REGISTERED).
    pub(super) fn registered(&self, name: &str) -> Step<()> {
        let known = self.registry().contains_key(name);
        known
            .then_some(())
            .ok_or_else(|| Error::with(Code::REPOSITORY_NOT_REGISTERED, name))
    }

    fn registry(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Repository>> {
        self.registry
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Every registered repository's name now.
    pub fn repository_names(&self) -> Vec<String> {
        self.registry().keys().cloned().collect()
    }

    /// The spool.
    pub fn spool(&self) -> &Spool {
        &self.spool
    }

    /// Runs `f` on the journal.
    pub fn with_journal<T>(
        &self,
        f: impl FnOnce(&CheckpointJournal) -> Result<T, airlock_journal::SqliteError>,
    ) -> Step<T> {
        f(&self.journal).map_err(refused)
    }

    /// Keeps the envelope of a claimed attempt where a restarted worker finds
    /// it: `<envelope_dir>/<execution_digest>.json`, content-addressed.
    pub fn keep_envelope(&self, envelope: &Envelope) -> Step<()> {
        let path = self
            .settings
            .envelope_dir
            .join(format!("{}.json", envelope.execution_digest));
        if path.exists() {
            return Ok(());
        }
        let bytes = serde_json::to_vec(&envelope.to_value())
            .map_err(|e| Error::with(Code::INTERNAL, e.to_string()))?;
        match airlock_spool::publish_path(&path, &bytes) {
            Ok(_) => Ok(()),
            Err(airlock_spool::Error::AlreadyPublished { .. }) => Ok(()),
            Err(e) => Err(spool_err(e)),
        }
    }

    /// Loads a kept envelope and checks it is the one its name says.
    pub fn load_envelope(&self, execution_digest: &str) -> Step<Envelope> {
        let path = self
            .settings
            .envelope_dir
            .join(format!("{execution_digest}.json"));
        let me = nix::unistd::getuid().as_raw();
        let bytes = airlock_spool::read_path(
            &path,
            &Expect::owned_by(me, airlock_proto::limits::MAX_MESSAGE_BYTES as u64),
        )
        .map_err(spool_err)?;
        let value: Value = serde_json::from_slice(&bytes)
            .map_err(|e| Error::with(Code::MESSAGE_INVALID, e.to_string()))?;
        let env = Envelope::validate(&value, None, Some(&self.settings.capabilities))?;
        if env.execution_digest != execution_digest {
            return Err(Error::new(Code::EXECUTION_DIGEST_INVALID));
        }
        Ok(env)
    }
}

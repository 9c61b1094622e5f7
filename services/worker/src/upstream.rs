//! Following each repository's upstream: how the worker reaches it (its
//! URL, the deploy key or token from the worker's credentials, the pinned
//! host keys), the sync (on a jittered schedule, on request, and when a
//! task's base is not here yet), and what each sync left for
//! `airlockctl repo show` (`<state>/upstream/NAME.json`, a
//! [`SyncState`]).
//!
//! `airlockctl repo sync NAME` asks for a sync by writing
//! `<state>/upstream/NAME.request` (a [`SyncRequest`]; root writes there);
//! the sync loop sees it within a second, syncs, and records the answer
//! with the request's id, which the command waits for. Both files are
//! declared in `airlock_proto::upstream`.

use crate::attempt::Worker;
use airlock_git::{AuthorityRepo, Credential, Upstream};
use airlock_proto::upstream::{
    SYNC_STATE_SCHEMA, Scheme, SyncReport, SyncRequest, SyncState, UpstreamEvent, UpstreamReport,
};
use airlock_proto::{Code, Error};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Worker {
    /// How to reach `repository`'s upstream, or `None` when it has none.
    pub fn upstream_of(&self, repository: &str) -> Result<Option<Upstream>, Error> {
        let Some(repo) = self.repository(repository) else {
            return Err(Error::with(
                Code::REPOSITORY_NOT_REGISTERED,
                repository.to_owned(),
            ));
        };
        let Some(cfg) = repo.upstream else {
            return Ok(None);
        };
        let mut up = Upstream::new(&cfg.url)?;
        up.timeout = Duration::from_secs(u64::from(cfg.timeout_seconds));
        up.max_fetch_bytes = u64::from(cfg.max_fetch_mib) << 20;
        let (credential, _) = airlock_config::credential_names(repository);
        let credential_file = self
            .settings
            .credentials
            .as_ref()
            .map(|d| d.join(&credential));
        up.credential = match up.scheme {
            Scheme::Local => Credential::None,
            Scheme::Ssh => {
                let key = credential_file.filter(|p| p.is_file()).ok_or_else(|| {
                    Error::with(
                        Code::UPSTREAM_AUTH_FAILED,
                        format!(
                            "{repository}: no deploy key is installed for the worker (credential {credential}; airlockctl repo add --credential)"
                        ),
                    )
                })?;
                let known_hosts = self.pin_host_keys(repository, &cfg.host_keys)?;
                Credential::SshKey {
                    key,
                    known_hosts,
                    launcher: self.settings.ssh_launcher.clone(),
                }
            }
            Scheme::Https => match credential_file.filter(|p| p.is_file()) {
                None => Credential::None,
                Some(path) => {
                    let token = std::fs::read_to_string(&path).map_err(|e| {
                        Error::with(
                            Code::UPSTREAM_AUTH_FAILED,
                            format!("{repository}: reading its token: {e}"),
                        )
                    })?;
                    Credential::Token {
                        user: cfg.user.clone(),
                        token: token.trim().to_owned(),
                    }
                }
            },
        };
        Ok(Some(up))
    }

    /// Writes the repository's pinned host keys where ssh reads them.
    fn pin_host_keys(&self, repository: &str, lines: &[String]) -> Result<PathBuf, Error> {
        let dir = &self.settings.upstream_state;
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::with(Code::STORE_UNAVAILABLE, format!("{}: {e}", dir.display())))?;
        let path = dir.join(format!("{repository}.known_hosts"));
        let mut text = lines.join("\n");
        text.push('\n');
        if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
            write_atomic(&path, text.as_bytes())?;
        }
        Ok(path)
    }

    /// Fetches `repository`'s upstream into its authority repository and
    /// records what happened; the report, or the refusal.
    pub fn sync_repository(
        &self,
        repository: &str,
        request: Option<String>,
    ) -> Result<SyncReport, Error> {
        let outcome = self.sync_once(repository);
        let previous = self.sync_state(repository);
        let url = self
            .repository(repository)
            .and_then(|r| r.upstream)
            .map(|u| u.url)
            .unwrap_or_default();
        let finished = now_ms();
        let state = match &outcome {
            Ok(report) => SyncState {
                schema: SYNC_STATE_SCHEMA.to_owned(),
                repository: repository.to_owned(),
                url,
                finished_at_ms: finished,
                request,
                code: None,
                detail: None,
                report: report.clone(),
                last_success_ms: Some(finished),
            },
            Err(e) => SyncState {
                schema: SYNC_STATE_SCHEMA.to_owned(),
                repository: repository.to_owned(),
                url,
                finished_at_ms: finished,
                request,
                code: Some(e.code.as_str().to_owned()),
                detail: Some(e.to_string()),
                report: SyncReport::default(),
                last_success_ms: previous.as_ref().and_then(|p| p.last_success_ms),
            },
        };
        self.report_sync(repository, &outcome, previous.as_ref());
        match &outcome {
            Ok(report) => {
                for change in &report.changes {
                    if change.forced || change.new.is_none() {
                        tracing::warn!(
                            %repository,
                            r#ref = %change.name,
                            old = ?change.old,
                            new = ?change.new,
                            "the upstream rewrote a ref (force-push or deletion); mirrored as the upstream says"
                        );
                    }
                }
                tracing::info!(%repository, changed = report.changes.len(), "synced from the upstream");
            }
            Err(e) => tracing::warn!(%repository, "sync from the upstream failed: {e}"),
        }
        let bytes = state.to_json()?;
        let path = self
            .settings
            .upstream_state
            .join(format!("{repository}.json"));
        if let Err(e) = write_atomic(&path, &bytes) {
            tracing::warn!(%repository, "recording the sync: {e}");
        }
        outcome
    }

    /// Tells the supervisor's event log what a sync did: the refs it
    /// changed, each ref the upstream rewrote, a failure where the last
    /// sync had none (or another). A sync that changed nothing is not an
    /// event.
    fn report_sync(
        &self,
        repository: &str,
        outcome: &Result<SyncReport, Error>,
        previous: Option<&SyncState>,
    ) {
        let mut reports = Vec::new();
        let report = |event, detail| UpstreamReport {
            repository: repository.to_owned(),
            event,
            task_id: None,
            detail,
        };
        match outcome {
            Ok(r) if !r.changes.is_empty() => {
                reports.push(report(
                    UpstreamEvent::Synced,
                    serde_json::json!({ "changes": r.changes.len() }),
                ));
                for c in r.forced() {
                    reports.push(report(
                        UpstreamEvent::RefRewritten,
                        serde_json::json!({ "ref": c.name, "old": c.old, "new": c.new }),
                    ));
                }
            }
            Ok(_) => {}
            Err(e) if previous.and_then(|p| p.code.as_deref()) != Some(e.code.as_str()) => {
                reports.push(report(
                    UpstreamEvent::SyncFailed,
                    serde_json::json!({ "code": e.code.as_str(), "detail": e.to_string() }),
                ));
            }
            Err(_) => {}
        }
        for r in reports {
            self.report_upstream(&r);
        }
    }

    /// Sends `report` to the supervisor's event log; a failure is logged,
    /// never the caller's failure.
    pub fn report_upstream(&self, report: &UpstreamReport) {
        if let Err(e) = self.bus().report_upstream(report) {
            tracing::warn!(repository = %report.repository, event = report.event.action(), "could not record the upstream event: {e}");
        }
    }

    fn sync_once(&self, repository: &str) -> Result<SyncReport, Error> {
        let up = self.upstream_of(repository)?.ok_or_else(|| {
            Error::with(
                Code::UPSTREAM_NOT_CONFIGURED,
                format!("{repository} has no upstream"),
            )
        })?;
        let path = self
            .repository_path(repository)
            .ok_or_else(|| Error::with(Code::REPOSITORY_NOT_REGISTERED, repository.to_owned()))?;
        let repo = AuthorityRepo::open(&path).map_err(|e| Error::with(e.code(), e.to_string()))?;
        repo.sync_from(&up)
            .map_err(|e| Error::with(e.code(), e.to_string()))
    }

    /// The last recorded sync of `repository` (one the previous release
    /// wrote too); `None` when there is none or it does not read.
    pub fn sync_state(&self, repository: &str) -> Option<SyncState> {
        let path = self
            .settings
            .upstream_state
            .join(format!("{repository}.json"));
        SyncState::from_json(&std::fs::read(path).ok()?).ok()
    }

    /// Makes `commit` known locally when it is not, by a sync of the
    /// task's repository (a planner may name a base it saw upstream
    /// before the schedule fetched it).
    pub fn ensure_commit(&self, repository: &str, commit: &str) -> Result<(), Error> {
        // Without an upstream there is nothing to fetch: no git runs.
        let Some(path) = self
            .repository(repository)
            .filter(|r| r.upstream.is_some())
            .map(|r| r.path)
        else {
            return Ok(());
        };
        let Ok(repo) = AuthorityRepo::open(&path) else {
            return Ok(());
        };
        if repo.resolve_commit(commit).ok().flatten().as_deref() == Some(commit) {
            return Ok(());
        }
        tracing::info!(%repository, %commit, "the task's base is not here yet: syncing first");
        self.sync_repository(repository, None).map(|_| ())
    }

    /// The sync loop: every repository with an upstream and an interval
    /// is synced at its interval (each wait jittered by up to a tenth),
    /// and any at once when `repo sync` asks; each once at start; until the
    /// worker stops.
    pub fn follow_upstreams(&self) {
        let mut due: BTreeMap<String, Instant> = BTreeMap::new();
        let mut answered: BTreeMap<String, String> = BTreeMap::new();
        while !self.stopping.load(Ordering::SeqCst) {
            for name in self.repository_names() {
                let Some(cfg) = self.repository(&name).and_then(|r| r.upstream) else {
                    continue;
                };
                let request = self.pending_request(&name);
                let requested = request
                    .as_ref()
                    .is_some_and(|r| answered.get(&name) != Some(&r.id));
                let interval = u64::from(cfg.sync_interval_seconds);
                // Every upstream is synced once at start, then on its
                // schedule (none with an interval of 0).
                let scheduled = match due.get(&name) {
                    None => true,
                    Some(next) => interval > 0 && Instant::now() >= *next,
                };
                if !(requested || scheduled) {
                    continue;
                }
                let id = request.filter(|_| requested).map(|r| r.id);
                let _ = self.sync_repository(&name, id.clone());
                if let Some(id) = id {
                    answered.insert(name.clone(), id);
                }
                let jitter = jitter_ms(interval * 100);
                due.insert(
                    name,
                    Instant::now() + Duration::from_millis(interval * 1000 + jitter),
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    fn pending_request(&self, repository: &str) -> Option<SyncRequest> {
        let path = self
            .settings
            .upstream_state
            .join(format!("{repository}.request"));
        let bytes = std::fs::read(path).ok()?;
        serde_json::from_slice(&bytes).ok()
    }
}

/// A pseudo-random number of milliseconds below `max` (the jitter of a
/// schedule; no secrecy needed).
fn jitter_ms(max: u64) -> u64 {
    if max == 0 {
        return 0;
    }
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    u64::from(nanos ^ std::process::id().rotate_left(16)) % max
}

/// Writes `bytes` to `path` by a synced temporary file and a rename.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    use std::io::Write;
    let err = |e: std::io::Error| {
        Error::with(Code::STORE_UNAVAILABLE, format!("{}: {e}", path.display()))
    };
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).map_err(err)?;
    f.write_all(bytes).map_err(err)?;
    f.sync_all().map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(err)?;
    }
    Ok(())
}

//! One attempt, phase by phase.

use crate::bus::{Supervisor, is_transient};
use airlock_git::{ArchiveLimits, AuthorityRepo, CommitSpec, FileChange, GitError};
use airlock_journal::checkpoint::{Checkpoint, CheckpointJournal};
use airlock_proto::bundle::{
    EXEC_REQUEST_SCHEMA, ExecFailure, ExecRequest, ExecResult, SourceWanted, request_id_for,
};
use airlock_proto::bus::LeaseRef;
use airlock_proto::canonical::{digest_of, sha256_hex};
use airlock_proto::checkpoint::{
    CheckpointBinding, ClaimedPayload, CommitDonePayload, Payload, Phase, ReconciliationPayload,
    ResultPendingPayload, ResultSubmittedPayload, SourceCaptureDonePayload,
    VerificationPassedPayload, WorkspacePreparedPayload, result_idempotency_key,
};
use airlock_proto::envelope::{Action, Envelope};
use airlock_proto::limits::MAX_SUMMARY_TAIL_BYTES;
use airlock_proto::reconcile::BranchFacts;
use airlock_proto::task::{
    Capture, CapturedFile, CommandSummary, Isolation, Outcome, TaskResult, tail_of,
};
use airlock_proto::{Code, Error};
use airlock_spool::{Expect, Kind, Spool};
use base64::Engine;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the worker needs to know, resolved from configuration at start.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    /// Registered repositories: name → bare repository path.
    pub repositories: BTreeMap<String, PathBuf>,
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

/// A claimed attempt the worker holds a lease for.
#[derive(Debug, Clone)]
pub struct Grant {
    /// The attempt number.
    pub attempt: u32,
    /// The lease the claim granted (task, fencing epoch, bearer token).
    pub lease: LeaseRef,
    /// The validated envelope.
    pub envelope: Envelope,
    /// Resumed from the journal after a restart: an earlier process drove
    /// this attempt and may have moved the ref before it died.
    pub resumed: bool,
}

/// How an attempt ended for this worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finish {
    /// The result was submitted (or was already there).
    Submitted {
        /// The outcome reported.
        outcome: Outcome,
        /// The governed commit, when there is one.
        commit_oid: Option<String>,
    },
    /// The worker cannot settle the attempt alone (lease lost, conflicting
    /// result, journal scope mismatch); recorded as reconciliation_required.
    Reconcile(Code),
}

/// The worker: journal, spool and supervisor.
#[derive(Debug)]
pub struct Worker {
    settings: WorkerSettings,
    /// The registered repositories now: `settings.repositories` at start,
    /// replaced on reload (SIGHUP). An attempt looks its repository up at
    /// each step, so one removed meanwhile fails with
    /// REPOSITORY_NOT_REGISTERED.
    registry: std::sync::RwLock<BTreeMap<String, PathBuf>>,
    journal: Mutex<CheckpointJournal>,
    spool: Spool,
    bus: Supervisor,
    stopping: Arc<AtomicBool>,
    progress: crate::progress::Progress,
}

type Step<T> = Result<T, Error>;

fn refused(e: airlock_journal::StoreError) -> Error {
    match e.refusal() {
        Some(r) => r.clone(),
        None => Error::with(e.code(), e.to_string()),
    }
}

fn git_err(e: GitError) -> Error {
    Error::with(e.code(), e.to_string())
}

fn spool_err(e: airlock_spool::Error) -> Error {
    e.to_proto()
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
            journal: Mutex::new(journal),
            spool,
            bus,
            stopping,
            progress: crate::progress::Progress::default(),
        }
    }

    /// The calling thread's progress, for the watchdog ([`crate::progress`]).
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
        repositories: BTreeMap<String, PathBuf>,
    ) -> (Vec<String>, Vec<String>) {
        let mut now = self
            .registry
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let added = repositories
            .iter()
            .filter(|(n, p)| now.get(*n) != Some(p))
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
        self.registry
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(name)
            .cloned()
    }

    /// The spool.
    pub fn spool(&self) -> &Spool {
        &self.spool
    }

    /// Runs `f` on the journal.
    pub fn with_journal<T>(
        &self,
        f: impl FnOnce(&mut CheckpointJournal) -> Result<T, airlock_journal::StoreError>,
    ) -> Step<T> {
        let mut j = self
            .journal
            .lock()
            .map_err(|_| Error::with(Code::INTERNAL, "journal lock poisoned"))?;
        f(&mut j).map_err(refused)
    }

    fn append(&self, cb: &CheckpointBinding, payload: Payload) -> Step<Checkpoint> {
        let phase = payload.phase();
        let cp = self.with_journal(|j| j.append(cb, &payload))?;
        self.progress.beat();
        tracing::info!(task = %cb.task_id, attempt = cb.attempt, phase = phase.as_str(), "checkpoint");
        #[cfg(feature = "fault-injection")]
        crate::fault::hit(
            self.settings.fault,
            crate::fault::FaultPoint::AfterPhase(phase),
            &cb.task_id,
        );
        Ok(cp)
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
            &Expect {
                owner_uid: me,
                max_bytes: airlock_proto::limits::MAX_MESSAGE_BYTES as u64,
                sha256: None,
            },
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

    fn repo(&self, envelope: &Envelope, scratch: &Path) -> Step<AuthorityRepo> {
        let name = &envelope.binding.repository;
        let path = self
            .repository_path(name)
            .ok_or_else(|| Error::with(Code::REPOSITORY_NOT_REGISTERED, name.clone()))?;
        Ok(AuthorityRepo::open(&path)
            .map_err(git_err)?
            .with_scratch(scratch.to_path_buf()))
    }

    /// Drives one attempt from wherever its journal says it is to the end.
    pub fn run(&self, grant: &Grant) -> Step<Finish> {
        let lost = Arc::new(Mutex::new(None::<Code>));
        let done = Arc::new(AtomicBool::new(false));
        let renewer = self.spawn_renewer(grant, Arc::clone(&lost), Arc::clone(&done));
        let outcome = self.drive(grant, &lost);
        done.store(true, Ordering::SeqCst);
        renewer.thread().unpark();
        let _ = renewer.join();
        outcome
    }

    fn spawn_renewer(
        &self,
        grant: &Grant,
        lost: Arc<Mutex<Option<Code>>>,
        done: Arc<AtomicBool>,
    ) -> std::thread::JoinHandle<()> {
        let bus = self.bus.clone();
        let task = grant.envelope.binding.task_id.clone();
        let lease = grant.lease.clone();
        let every = self.settings.renew_interval;
        std::thread::spawn(move || {
            loop {
                std::thread::park_timeout(every);
                if done.load(Ordering::SeqCst) {
                    return;
                }
                match bus.renew(&lease) {
                    Ok(_) => {}
                    Err(e) if is_transient(e.code) => {
                        tracing::warn!(%task, "lease renewal failed, will retry: {e}")
                    }
                    Err(e) => {
                        tracing::warn!(%task, "lease lost: {e}");
                        if let Ok(mut l) = lost.lock() {
                            *l = Some(e.code);
                        }
                        return;
                    }
                }
            }
        })
    }

    fn lease_lost(lost: &Mutex<Option<Code>>) -> Option<Code> {
        lost.lock().ok().and_then(|l| *l)
    }

    /// Drives the attempt; a step that fails is settled by the catalogue's
    /// attributes of its code (docs/errors.md): a transient one is tried
    /// again in place while the lease holds; one that fails the attempt
    /// ends it with a failed result carrying the code (so the task ends
    /// with its real reason, never as an expired lease); any other means
    /// the attempt is no longer ours (reconciliation_required). Once a
    /// result is pending it is the one reported: later trouble is not
    /// turned into another result.
    fn drive(&self, grant: &Grant, lost: &Mutex<Option<Code>>) -> Step<Finish> {
        let cb = CheckpointBinding::of(&grant.envelope, grant.attempt);
        let mut backoff = Duration::from_millis(200);
        loop {
            self.progress.beat();
            let error = match self.drive_phases(grant, lost) {
                Ok(finish) => return Ok(finish),
                Err(e) => e,
            };
            // A pending result is the one reported, unless its record no
            // longer decodes (STORE_CORRUPT): then the attempt's failure
            // is reported under the same key instead (a supervisor that
            // already holds the original answers a conflict, and the
            // attempt needs reconciliation).
            let pending = self
                .with_journal(|j| j.latest_for_attempt(&cb.task_id, grant.attempt))
                .ok()
                .flatten()
                .is_some_and(|c| match c.phase {
                    Phase::ResultPending => c.decode().is_ok(),
                    Phase::ResultSubmitted | Phase::ReconciliationRequired => true,
                    _ => false,
                });
            if error.code.transient() {
                if self.stopping.load(Ordering::SeqCst) || Self::lease_lost(lost).is_some() {
                    return Err(error);
                }
                tracing::warn!(task = %cb.task_id, attempt = cb.attempt, "transient failure, trying the step again: {error}");
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
            if pending {
                return Err(error);
            }
            if error.code.fails_attempt() {
                return self.finish_failed(&cb, grant, error, None);
            }
            let detail = error.to_string();
            return self.reconcile(&cb, error.code, &detail);
        }
    }

    fn drive_phases(&self, grant: &Grant, lost: &Mutex<Option<Code>>) -> Step<Finish> {
        let env = &grant.envelope;
        let task = env.binding.task_id.as_str();
        let cb = CheckpointBinding::of(env, grant.attempt);
        let rid = request_id_for(task, grant.attempt, &env.execution_digest);
        // A journal ahead of this grant, or bound to another scope, stops here.
        self.with_journal(|j| j.verify_latest_binding(&cb))?;
        let mut head = self.with_journal(|j| j.latest_for_attempt(task, grant.attempt))?;
        loop {
            #[cfg(feature = "fault-injection")]
            let phase = head.as_ref().map(|c| c.phase);
            // The head's payload, typed: one that does not decode is
            // STORE_CORRUPT, never a default the next step acts on.
            let decoded = head.as_ref().map(Checkpoint::decode).transpose()?;
            self.progress.beat();
            #[cfg(feature = "fault-injection")]
            if let Some(e) = crate::fault::injected_error(phase, task) {
                return Err(e);
            }
            #[cfg(feature = "fault-injection")]
            crate::fault::wedge(phase, task);
            head = Some(match decoded {
                None => {
                    self.keep_envelope(env)?;
                    self.append(
                        &cb,
                        Payload::Claimed(ClaimedPayload {
                            lease_epoch: grant.lease.lease_epoch,
                            lease_token: grant.lease.lease_token.clone(),
                            request_id: rid.clone(),
                        }),
                    )?
                }
                Some(Payload::Claimed(_)) => match self.reusable_capture(&cb)? {
                    // An earlier attempt of the identical execution and
                    // binding captured already: its capture is this one's.
                    Some(done) => {
                        tracing::info!(%task, attempt = grant.attempt, "reusing the capture of attempt {}", done.capture.captured_in_attempt);
                        self.append(&cb, Payload::SourceCaptureDone(Box::new(done)))?
                    }
                    None => {
                        let payload = self.prepare(env, grant.attempt, &rid)?;
                        self.append(&cb, Payload::WorkspacePrepared(payload))?
                    }
                },
                Some(Payload::WorkspacePrepared(prepared)) => {
                    match self.await_result(env, &rid, &prepared, lost)? {
                        Ok((result, sha)) => self.append(
                            &cb,
                            Payload::VerificationPassed(VerificationPassedPayload {
                                request_id: rid.clone(),
                                exec_result_sha256: sha,
                                changed: result.changed_files.len() as u64,
                            }),
                        )?,
                        Err((error, evidence)) => {
                            return self.finish_failed(&cb, grant, error, evidence);
                        }
                    }
                }
                Some(Payload::VerificationPassed(passed))
                    if env.action == Action::SourceCapture =>
                {
                    let done =
                        self.capture_of(env, grant.attempt, &rid, &passed.exec_result_sha256);
                    match done {
                        Ok(done) => self.append(&cb, Payload::SourceCaptureDone(Box::new(done)))?,
                        Err(e) if e.code.fails_attempt() => {
                            return self.finish_failed(&cb, grant, e, None);
                        }
                        Err(e) => return Err(e),
                    }
                }
                Some(Payload::VerificationPassed(passed)) => {
                    let sha = passed.exec_result_sha256;
                    if let Some(code) = Self::lease_lost(lost) {
                        return self.reconcile(&cb, code, "lease lost before the commit");
                    }
                    match self.commit(env, &rid, &sha) {
                        Ok(Ok(oid)) => self.append(
                            &cb,
                            Payload::CommitDone(CommitDonePayload {
                                commit_oid: oid,
                                exec_result_sha256: sha,
                            }),
                        )?,
                        // Resumed after a crash, the branch at neither the
                        // expected head nor this attempt's commit: the
                        // earlier process may have moved it to the commit
                        // before someone moved it again, and nothing can
                        // tell which. Not this attempt's to settle.
                        Ok(Err((oid, observed))) if grant.resumed => {
                            return self.branch_moved(&cb, grant, &oid, observed.as_deref());
                        }
                        Ok(Err((_, observed))) => {
                            let e = Error::with(
                                Code::REF_CAS_MISMATCH,
                                format!(
                                    "{} is at {}, not where the task expects it",
                                    env.binding.target_branch,
                                    observed.as_deref().unwrap_or("nothing")
                                ),
                            );
                            let evidence = self
                                .read_result(env, &rid, Some(&sha))
                                .ok()
                                .map(|r| evidence_of(&r));
                            return self.finish_failed(&cb, grant, e, evidence);
                        }
                        Err(e) if e.code.fails_attempt() => {
                            let evidence = self
                                .read_result(env, &rid, Some(&sha))
                                .ok()
                                .map(|r| evidence_of(&r));
                            return self.finish_failed(&cb, grant, e, evidence);
                        }
                        Err(e) => return Err(e),
                    }
                }
                Some(Payload::CommitDone(done)) => {
                    let CommitDonePayload {
                        commit_oid: oid,
                        exec_result_sha256: sha,
                    } = done;
                    // Converge only while the branch holds the commit made:
                    // a ref moved behind the worker's back (between the
                    // commit and the report, or across a crash) is not
                    // reported as this attempt's success.
                    let scratch = self.scratch(&rid)?;
                    let observed = self
                        .repo(env, &scratch)?
                        .branch_head(&env.binding.target_branch)
                        .map_err(git_err)?;
                    let _ = std::fs::remove_dir_all(&scratch);
                    if observed.as_deref() != Some(oid.as_str()) {
                        return self.branch_moved(&cb, grant, &oid, observed.as_deref());
                    }
                    let exec = self.read_result(env, &rid, Some(&sha))?;
                    let result = TaskResult::passed(
                        env,
                        grant.attempt,
                        oid,
                        sha,
                        summaries(exec.verification.clone()),
                        Isolation::from_report(&exec.confinement),
                    );
                    self.pending(&cb, grant, &result)?.0
                }
                Some(Payload::ResultPending(pending)) => {
                    return self.submit(&cb, grant, &pending);
                }
                Some(Payload::ResultSubmitted(submitted)) => {
                    return Ok(Finish::Submitted {
                        outcome: submitted.outcome,
                        commit_oid: submitted.commit_oid,
                    });
                }
                Some(Payload::ReconciliationRequired(recorded)) => {
                    let code = recorded.code;
                    if code == Code::RECONCILIATION_REQUIRED {
                        // Reported before the crash, or not: the same
                        // result under the same key again is a replay.
                        let facts = BranchFacts {
                            commit_oid: recorded.commit_oid.unwrap_or_default(),
                            observed_head: recorded.observed_head,
                        };
                        self.report_reconciliation(grant, facts)?;
                    }
                    return Ok(Finish::Reconcile(code));
                }
                Some(Payload::SourceCaptureDone(done)) => {
                    if env.action != Action::SourceCapture {
                        return self.reconcile(
                            &cb,
                            Code::EXECUTION_ACTION_UNSUPPORTED,
                            "source capture in a deterministic attempt",
                        );
                    }
                    let result = TaskResult::captured(
                        env,
                        grant.attempt,
                        done.exec_result_sha256,
                        done.capture,
                        done.isolation,
                    );
                    self.pending(&cb, grant, &result)?.0
                }
            });
        }
    }

    /// The capture of an earlier attempt this one may report as its own:
    /// the latest `source_capture_done` of an earlier attempt whose binding
    /// has the identical scope (execution digest and every coordinate but
    /// the attempt; seed 001's verify_latest_binding). Another execution
    /// digest (a replaced plan) or any other coordinate means a capture
    /// afresh.
    fn reusable_capture(&self, cb: &CheckpointBinding) -> Step<Option<SourceCaptureDonePayload>> {
        let scope = cb.scope_sha256();
        let history = self.with_journal(|j| j.history(&cb.task_id))?;
        let Some(earlier) = history.iter().rev().find(|c| {
            c.attempt < cb.attempt
                && c.phase == Phase::SourceCaptureDone
                && c.binding.scope_sha256() == scope
        }) else {
            return Ok(None);
        };
        match earlier.decode()? {
            Payload::SourceCaptureDone(done) => Ok(Some(*done)),
            _ => Err(Error::new(Code::INTERNAL)),
        }
    }

    /// The capture the executor returned for `rid` (its result, verified
    /// again by the digest recorded at verification_passed): the captured
    /// files and withheld paths must be exactly the plan's capture paths.
    fn capture_of(
        &self,
        env: &Envelope,
        attempt: u32,
        rid: &str,
        exec_sha: &str,
    ) -> Step<SourceCaptureDonePayload> {
        let exec = self.read_result(env, rid, Some(exec_sha))?;
        check_captured_files(env, &exec)?;
        let capture = Capture {
            source_tree: exec.source_tree.clone(),
            captured_in_attempt: attempt,
            source_signals: env.source_signals.clone(),
            files: exec
                .captured_files
                .iter()
                .map(|f| CapturedFile {
                    path: f.path.clone(),
                    present: !f.deleted,
                    sha256: f.sha256.clone(),
                    executable: f.executable,
                    content_b64: f.content_b64.clone(),
                })
                .collect(),
            withheld: exec.withheld_paths.clone(),
        };
        capture.validate()?;
        Ok(SourceCaptureDonePayload {
            request_id: rid.to_owned(),
            exec_result_sha256: exec_sha.to_owned(),
            capture,
            isolation: Isolation::from_report(&exec.confinement),
        })
    }

    /// Publishes the request, naming the source by its git tree id (read
    /// from the repository without touching a blob: O(1) whatever its
    /// size). The archive follows only if the executor asks for it
    /// ([`Worker::send_source`]). The request is derived from the envelope
    /// alone, so a replay after a crash publishes the same bytes; an
    /// existing file is accepted only if it is byte-identical.
    fn prepare(&self, env: &Envelope, attempt: u32, rid: &str) -> Step<WorkspacePreparedPayload> {
        let scratch = self.scratch(rid)?;
        let repo = self.repo(env, &scratch)?;
        let tree = repo.tree_of(env.binding.source_head()).map_err(git_err)?;
        let request = ExecRequest {
            schema: EXEC_REQUEST_SCHEMA.into(),
            request_id: rid.to_owned(),
            attempt,
            envelope: env.to_value(),
            source_tree: tree.clone(),
        };
        let request_bytes =
            serde_json::to_vec(&request).map_err(|e| Error::with(Code::INTERNAL, e.to_string()))?;
        self.publish_once(Kind::Requests, rid, &request_bytes)?;
        let _ = std::fs::remove_dir_all(&scratch);
        Ok(WorkspacePreparedPayload {
            request_id: rid.to_owned(),
            request_sha256: request.digest(),
            source_tree: tree,
        })
    }

    /// Answers the executor's `wants/<rid>.json` (it lacks the request's
    /// tree): checks it names our request and its tree, then publishes the
    /// deterministic archive of the source commit at `sources/<rid>.tar`,
    /// once. The executor accepts it only if it hashes to that tree.
    fn send_source(&self, env: &Envelope, rid: &str, request: &ExecRequest) -> Step<()> {
        if self.spool.exists(Kind::Sources, rid).map_err(spool_err)? {
            return Ok(());
        }
        let bytes = self
            .spool
            .read(
                Kind::Wants,
                rid,
                &Expect {
                    owner_uid: self.settings.executor_uid,
                    max_bytes: 64 * 1024,
                    sha256: None,
                },
            )
            .map_err(spool_err)?;
        let want: SourceWanted = serde_json::from_slice(&bytes)
            .map_err(|e| Error::with(Code::MESSAGE_INVALID, format!("source request: {e}")))?;
        want.validate_against(request)?;
        let scratch = self.scratch(rid)?;
        let repo = self.repo(env, &scratch)?;
        let mut archive = Vec::new();
        repo.source_archive(
            env.binding.source_head(),
            &self.settings.archive_limits,
            &mut archive,
        )
        .map_err(git_err)?;
        self.publish_once(Kind::Sources, rid, &archive)?;
        let _ = std::fs::remove_dir_all(&scratch);
        tracing::info!(request = %rid, tree = %request.source_tree, bytes = archive.len(), "source archive sent");
        Ok(())
    }

    fn publish_once(&self, kind: Kind, rid: &str, bytes: &[u8]) -> Step<()> {
        match self.spool.publish(kind, rid, bytes) {
            Ok(_) => Ok(()),
            Err(airlock_spool::Error::AlreadyPublished { .. }) => {
                let me = nix::unistd::getuid().as_raw();
                let expect = Expect {
                    owner_uid: me,
                    max_bytes: bytes.len() as u64,
                    sha256: Some(sha256_hex(bytes)),
                };
                self.spool
                    .read(kind, rid, &expect)
                    .map(|_| ())
                    .map_err(spool_err)
            }
            Err(e) => Err(spool_err(e)),
        }
    }

    fn scratch(&self, rid: &str) -> Step<PathBuf> {
        let dir = self.settings.workspace_root.join(format!("task-{rid}"));
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::with(Code::STORE_UNAVAILABLE, format!("{}: {e}", dir.display())))?;
        Ok(dir)
    }

    /// Our own published request, checked against the digest recorded at
    /// workspace_prepared.
    fn own_request(&self, rid: &str, request_sha: Option<&str>) -> Step<ExecRequest> {
        let me = nix::unistd::getuid().as_raw();
        let bytes = self
            .spool
            .read(
                Kind::Requests,
                rid,
                &Expect {
                    owner_uid: me,
                    max_bytes: airlock_proto::limits::MAX_MESSAGE_BYTES as u64,
                    sha256: None,
                },
            )
            .map_err(spool_err)?;
        let request: ExecRequest = serde_json::from_slice(&bytes)
            .map_err(|e| Error::with(Code::MESSAGE_INVALID, e.to_string()))?;
        if request_sha.is_some_and(|s| s != request.digest()) {
            return Err(Error::with(
                Code::SPOOL_DIGEST_MISMATCH,
                "our request changed since it was published",
            ));
        }
        Ok(request)
    }

    /// Reads and verifies the executor's result for `rid`.
    fn read_result(&self, env: &Envelope, rid: &str, sha: Option<&str>) -> Step<ExecResult> {
        let expect = Expect {
            owner_uid: self.settings.executor_uid,
            max_bytes: self.settings.max_result_bytes,
            sha256: None,
        };
        let bytes = self
            .spool
            .read(Kind::Results, rid, &expect)
            .map_err(spool_err)?;
        let result: ExecResult = serde_json::from_slice(&bytes)
            .map_err(|e| Error::with(Code::MESSAGE_INVALID, format!("result bundle: {e}")))?;
        if sha.is_some_and(|s| s != result.digest()) {
            return Err(Error::with(
                Code::SPOOL_DIGEST_MISMATCH,
                "the result changed since it was verified",
            ));
        }
        let request = self.own_request(rid, None)?;
        result.validate_against(&request)?;
        check_changed_files(env, &result)?;
        Ok(result)
    }

    /// Waits (inotify) for the executor's result or failure record, renewing
    /// the lease meanwhile (the renewer thread). The outer error is the
    /// worker's own trouble; the inner one is the attempt's failure.
    #[allow(clippy::type_complexity)]
    fn await_result(
        &self,
        env: &Envelope,
        rid: &str,
        prepared: &WorkspacePreparedPayload,
        lost: &Mutex<Option<Code>>,
    ) -> Step<Result<(ExecResult, String), (Error, Option<Evidence>)>> {
        let request = self.own_request(rid, Some(&prepared.request_sha256))?;
        let budget: u64 = env
            .verification
            .iter()
            .map(|c| u64::from(c.timeout_seconds))
            .sum();
        let deadline = Instant::now() + Duration::from_secs(budget) + self.settings.result_slack;
        let mut watcher = self
            .spool
            .watch(&[Kind::Results, Kind::Failed, Kind::Wants])
            .map_err(spool_err)?;
        loop {
            if self.spool.exists(Kind::Wants, rid).map_err(spool_err)? {
                if let Err(e) = self.send_source(env, rid, &request) {
                    // The source cannot be archived (limits, a missing
                    // object, …): a code that fails the attempt does so
                    // here; any other is settled by drive().
                    if e.code.fails_attempt() {
                        return Ok(Err((e, None)));
                    }
                    return Err(e);
                }
            }
            if self.spool.exists(Kind::Results, rid).map_err(spool_err)? {
                let result = match self.read_result(env, rid, None) {
                    Ok(r) => r,
                    Err(e) => return Ok(Err((e, None))),
                };
                let sha = result.digest();
                if !result.passed {
                    let evidence = evidence_of(&result);
                    return Ok(Err((
                        Error::with(Code::VERIFICATION_FAILED, "a verification command failed"),
                        Some(evidence),
                    )));
                }
                return Ok(Ok((result, sha)));
            }
            if self.spool.exists(Kind::Failed, rid).map_err(spool_err)? {
                let expect = Expect {
                    owner_uid: self.settings.executor_uid,
                    max_bytes: 64 * 1024,
                    sha256: None,
                };
                let bytes = self
                    .spool
                    .read(Kind::Failed, rid, &expect)
                    .map_err(spool_err)?;
                let failure: ExecFailure = serde_json::from_slice(&bytes)
                    .map_err(|e| Error::with(Code::MESSAGE_INVALID, e.to_string()))?;
                let code = Code::from_name(&failure.code).unwrap_or(Code::INTERNAL);
                return Ok(Err((Error::with(code, failure.detail), None)));
            }
            if Instant::now() >= deadline {
                return Ok(Err((
                    Error::with(
                        Code::VERIFICATION_FAILED,
                        "the executor produced no result in time",
                    ),
                    None,
                )));
            }
            if self.stopping.load(Ordering::SeqCst) {
                return Err(Error::with(Code::WORKER_STOPPING, "worker stopping"));
            }
            if let Some(code) = Self::lease_lost(lost) {
                return Err(Error::with(
                    code,
                    "lease lost while waiting for the executor",
                ));
            }
            let wait = deadline
                .saturating_duration_since(Instant::now())
                .min(Duration::from_secs(1));
            // Any wake-up (a publication, an overflow, the timeout) leads to
            // the same re-check of both directories above.
            watcher.wait(wait).map_err(spool_err)?;
            self.progress.beat();
        }
    }

    /// Builds the governed commit and moves the branch by CAS. The commit
    /// message names the task, generation and execution digest but nothing
    /// of the attempt — not its number, nor the executor's result digest,
    /// which covers the commands' durations and so differs per attempt —
    /// so every attempt of one plan converges on one commit. (With the
    /// digest in it, an attempt superseded after its ref update, e.g. a
    /// worker paused past its lease while another host took the task over,
    /// left a commit no later attempt could match: REF_CAS_MISMATCH until
    /// the task failed. The multi-host crash matrix found it.)
    ///
    /// A branch at neither the expected head nor this commit is returned as
    /// `Err((commit, head found))` for the caller to settle.
    #[allow(clippy::type_complexity)]
    fn commit(
        &self,
        env: &Envelope,
        rid: &str,
        exec_sha: &str,
    ) -> Step<Result<String, (String, Option<String>)>> {
        let result = self.read_result(env, rid, Some(exec_sha))?;
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut changes = Vec::new();
        for f in &result.changed_files {
            if f.deleted {
                changes.push(FileChange::delete(&f.path));
            } else {
                let content = b64
                    .decode(f.content_b64.as_deref().unwrap_or(""))
                    .map_err(|e| Error::with(Code::MESSAGE_INVALID, format!("{}: {e}", f.path)))?;
                if Some(sha256_hex(&content).as_str()) != f.sha256.as_deref() {
                    return Err(Error::with(
                        Code::SPOOL_DIGEST_MISMATCH,
                        format!("{}: content digest", f.path),
                    ));
                }
                changes.push(FileChange::write(&f.path, content, f.executable));
            }
        }
        let b = &env.binding;
        let message = format!(
            "airlock: {} (job {}, generation {})\n\nexecution-digest: {}\ngoverned-by: airlock",
            b.task_id, b.job_id, b.generation, env.execution_digest
        );
        let scratch = self.scratch(rid)?;
        let repo = self.repo(env, &scratch)?;
        let oid = repo
            .governed_commit(&CommitSpec {
                parent: b.source_head().to_owned(),
                changes,
                message,
            })
            .map_err(git_err)?;
        let expected = match b.branch_mode {
            airlock_proto::binding::BranchMode::CreateNew => None,
            airlock_proto::binding::BranchMode::ContinueExisting => {
                Some(b.expected_branch_oid.as_str())
            }
        };
        let update = match repo.cas_update(&b.target_branch, &oid, expected) {
            Ok(update) => update,
            Err(GitError::CasMismatch { .. }) => {
                let observed = repo.branch_head(&b.target_branch).map_err(git_err)?;
                let _ = std::fs::remove_dir_all(&scratch);
                return Ok(Err((oid, observed)));
            }
            Err(e) => return Err(git_err(e)),
        };
        tracing::info!(task = %b.task_id, commit = %oid, branch = %b.target_branch, ?update, "governed commit");
        #[cfg(feature = "fault-injection")]
        crate::fault::hit(
            self.settings.fault,
            crate::fault::FaultPoint::RefUpdated,
            &b.task_id,
        );
        let _ = std::fs::remove_dir_all(&scratch);
        Ok(Ok(oid))
    }

    fn finish_failed(
        &self,
        cb: &CheckpointBinding,
        grant: &Grant,
        error: Error,
        evidence: Option<Evidence>,
    ) -> Step<Finish> {
        tracing::warn!(task = %cb.task_id, attempt = cb.attempt, "attempt failed: {error}");
        let env = &grant.envelope;
        let mut result = TaskResult::failed(env, grant.attempt, error.code);
        if let Some(e) = evidence {
            result = result.with_evidence(e.verification, e.isolation);
        }
        let (_, pending) = self.pending(cb, grant, &result)?;
        self.submit(cb, grant, &pending)
    }

    /// Durably records the result, its hash and its idempotency key before
    /// anything is sent.
    fn pending(
        &self,
        cb: &CheckpointBinding,
        grant: &Grant,
        result: &TaskResult,
    ) -> Step<(Checkpoint, ResultPendingPayload)> {
        let pending = ResultPendingPayload {
            idempotency_key: result_idempotency_key(
                &cb.task_id,
                grant.attempt,
                &grant.envelope.execution_digest,
            ),
            result_sha256: digest_of(result)?,
            result: result.clone(),
        };
        let cp = self.append(cb, Payload::ResultPending(Box::new(pending.clone())))?;
        Ok((cp, pending))
    }

    /// Submits a pending result (its hash was checked when its checkpoint
    /// was decoded, or computed just now).
    fn submit(
        &self,
        cb: &CheckpointBinding,
        grant: &Grant,
        pending: &ResultPendingPayload,
    ) -> Step<Finish> {
        let key = pending.idempotency_key.as_str();
        let result = &pending.result;
        let mut backoff = Duration::from_millis(200);
        loop {
            match self.bus.submit_result(&grant.lease, key, result) {
                Ok(receipt) => {
                    let replay = receipt.idempotent;
                    #[cfg(feature = "fault-injection")]
                    crate::fault::hit(
                        self.settings.fault,
                        crate::fault::FaultPoint::ResultAccepted,
                        &cb.task_id,
                    );
                    self.append(
                        cb,
                        Payload::ResultSubmitted(ResultSubmittedPayload {
                            idempotency_key: key.to_owned(),
                            result_sha256: pending.result_sha256.clone(),
                            outcome: result.outcome,
                            commit_oid: result.commit_oid.clone(),
                            replay,
                        }),
                    )?;
                    let _ = self.spool.gc(
                        airlock_spool::Side::Worker,
                        nix::unistd::getuid().as_raw(),
                        &airlock_spool::GcPolicy {
                            older_than: None,
                            finished: vec![request_id_for(
                                &cb.task_id,
                                cb.attempt,
                                &cb.execution_digest,
                            )],
                        },
                    );
                    return Ok(Finish::Submitted {
                        outcome: result.outcome,
                        commit_oid: result.commit_oid.clone(),
                    });
                }
                Err(e) if is_transient(e.code) && !self.stopping.load(Ordering::SeqCst) => {
                    tracing::warn!(task = %cb.task_id, "result submission failed, retrying with the same key: {e}");
                    self.progress.beat();
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                Err(e) if is_transient(e.code) => return Err(e),
                // A refusal (lease lost, conflicting result) is not retried.
                Err(e) => return self.reconcile(cb, e.code, &e.to_string()),
            }
        }
    }

    /// The branch does not hold the commit this attempt made: records
    /// `reconciliation_required` with the head observed, then reports the
    /// attempt failed with `RECONCILIATION_REQUIRED` (so the task does not
    /// wait for its lease to lapse, and an administrator sees why).
    fn branch_moved(
        &self,
        cb: &CheckpointBinding,
        grant: &Grant,
        commit: &str,
        observed: Option<&str>,
    ) -> Step<Finish> {
        let branch = &grant.envelope.binding.target_branch;
        tracing::error!(task = %cb.task_id, attempt = cb.attempt, %branch, commit, ?observed, "reconciliation required: the branch moved behind the worker's back");
        self.append(
            cb,
            Payload::ReconciliationRequired(ReconciliationPayload {
                code: Code::RECONCILIATION_REQUIRED,
                detail: format!(
                    "{branch} is at {} instead of the attempt's commit {commit}",
                    observed.unwrap_or("nothing")
                ),
                commit_oid: Some(commit.to_owned()),
                observed_head: observed.map(str::to_owned),
            }),
        )?;
        self.report_reconciliation(
            grant,
            BranchFacts {
                commit_oid: commit.to_owned(),
                observed_head: observed.map(str::to_owned),
            },
        )?;
        Ok(Finish::Reconcile(Code::RECONCILIATION_REQUIRED))
    }

    /// Sends the failed result of an attempt that needs reconciliation,
    /// carrying what the worker saw of the branch (the supervisor opens a
    /// case from it): derived from the grant and the journal's record
    /// alone, under the attempt's result key, so a resend is an idempotent
    /// replay. A refusal (the lease is gone) is logged; the journal keeps
    /// the observed head either way.
    fn report_reconciliation(&self, grant: &Grant, facts: BranchFacts) -> Step<()> {
        let env = &grant.envelope;
        let task = &env.binding.task_id;
        let result = TaskResult::reconciliation_required(env, grant.attempt, facts);
        let key = result_idempotency_key(task, grant.attempt, &env.execution_digest);
        let mut backoff = Duration::from_millis(200);
        loop {
            match self.bus.submit_result(&grant.lease, &key, &result) {
                Ok(_) => return Ok(()),
                Err(e) if is_transient(e.code) && !self.stopping.load(Ordering::SeqCst) => {
                    self.progress.beat();
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                Err(e) if is_transient(e.code) => return Err(e),
                Err(e) => {
                    tracing::warn!(%task, "the reconciliation could not be reported: {e}");
                    return Ok(());
                }
            }
        }
    }

    fn reconcile(&self, cb: &CheckpointBinding, code: Code, why: &str) -> Step<Finish> {
        tracing::error!(task = %cb.task_id, attempt = cb.attempt, "reconciliation required: {code}: {why}");
        self.append(
            cb,
            Payload::ReconciliationRequired(ReconciliationPayload {
                code,
                detail: why.to_owned(),
                commit_oid: None,
                observed_head: None,
            }),
        )?;
        Ok(Finish::Reconcile(code))
    }
}

/// The executor may return exactly the paths of the change set, no more:
/// a verification command cannot smuggle another file into the commit.
fn check_changed_files(env: &Envelope, result: &ExecResult) -> Step<()> {
    let expected: BTreeSet<&str> = env.change_set.iter().map(|c| c.path()).collect();
    let got: BTreeSet<&str> = result
        .changed_files
        .iter()
        .map(|f| f.path.as_str())
        .collect();
    if expected != got || got.len() != result.changed_files.len() {
        return Err(Error::with(
            Code::CHANGED_PATHS_MISMATCH,
            "changed files are not exactly the change set's paths",
        ));
    }
    Ok(())
}

/// A capture returns exactly the plan's capture paths, each once: captured,
/// or withheld because it is credential-like (a path the policy would let
/// through is never withheld, and nothing the plan did not name is
/// returned).
fn check_captured_files(env: &Envelope, result: &ExecResult) -> Step<()> {
    let expected: BTreeSet<&str> = env.capture_paths.iter().map(String::as_str).collect();
    let mut got = BTreeSet::new();
    let returned = result
        .captured_files
        .iter()
        .map(|f| f.path.as_str())
        .chain(result.withheld_paths.iter().map(String::as_str));
    let mut count = 0;
    for p in returned {
        got.insert(p);
        count += 1;
    }
    if expected != got || count != got.len() || !result.changed_files.is_empty() {
        return Err(Error::with(
            Code::CHANGED_PATHS_MISMATCH,
            "captured and withheld files are not exactly the capture's paths",
        ));
    }
    if let Some(p) = result
        .withheld_paths
        .iter()
        .find(|p| !airlock_proto::path::is_credential_path(p))
    {
        return Err(Error::with(
            Code::CHANGED_PATHS_MISMATCH,
            format!("{p}: withheld, but not a credential-like path"),
        ));
    }
    Ok(())
}

/// What a failed result keeps of the executor's: each command's summary
/// and how the commands were isolated.
struct Evidence {
    verification: Vec<CommandSummary>,
    isolation: Isolation,
}

fn evidence_of(exec: &ExecResult) -> Evidence {
    Evidence {
        verification: summaries(exec.verification.clone()),
        isolation: Isolation::from_report(&exec.confinement),
    }
}

fn summaries(evidence: Vec<airlock_proto::bundle::CommandEvidence>) -> Vec<CommandSummary> {
    evidence
        .into_iter()
        .map(|c| {
            let passed = c.exit_code == Some(0) && !c.timed_out;
            // A failed command keeps the end of its output: the evidence a
            // planner reads to see which test failed.
            let tail = |t: &str| {
                (!passed && !t.is_empty()).then(|| tail_of(t, MAX_SUMMARY_TAIL_BYTES).to_owned())
            };
            CommandSummary {
                stdout_tail: tail(&c.stdout_tail),
                stderr_tail: tail(&c.stderr_tail),
                label: c.label,
                exit_code: c.exit_code,
                timed_out: c.timed_out,
                duration_ms: c.duration_ms,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_proto::binding::Binding;
    use airlock_proto::bundle::{ConfinementReport, EXEC_RESULT_SCHEMA, FileEntry};
    use airlock_proto::envelope::ExecutionRequest;
    use serde_json::json;

    fn envelope() -> Envelope {
        let base = "a".repeat(40);
        let binding = Binding::from_value(&json!({
            "task_id": "task-w", "job_id": "job-w", "repository": "demo", "base_oid": base,
            "expected_branch_oid": base, "target_branch": "agent/task-w", "branch_mode": "CREATE_NEW",
            "generation": 1, "idempotency_key": "key-task-w",
        }))
        .unwrap();
        let request = ExecutionRequest::from_value(&json!({
            "action": "deterministic",
            "change_set": [
                {"operation": "write_file", "path": "a.txt", "content": "a\n"},
                {"operation": "delete_file", "path": "b.txt"},
            ],
        }))
        .unwrap();
        Envelope::project(&binding, &request).unwrap()
    }

    fn result(paths: &[&str]) -> ExecResult {
        ExecResult {
            schema: EXEC_RESULT_SCHEMA.into(),
            request_id: "r".into(),
            request_sha256: "0".repeat(64),
            execution_digest: "0".repeat(64),
            source_tree: "0".repeat(40),
            passed: true,
            changed_files: paths
                .iter()
                .map(|p| FileEntry {
                    path: (*p).into(),
                    deleted: true,
                    sha256: None,
                    executable: false,
                    content_b64: None,
                })
                .collect(),
            captured_files: vec![],
            withheld_paths: vec![],
            verification: vec![],
            confinement: ConfinementReport {
                landlock_abi: 7,
                landlock: "full".into(),
                seccomp: true,
                namespaces: vec![],
                view: "minimal-root".into(),
                uid: Some(992),
            },
        }
    }

    #[test]
    fn only_the_change_sets_paths_are_accepted_from_the_executor() {
        let env = envelope();
        assert!(check_changed_files(&env, &result(&["a.txt", "b.txt"])).is_ok());
        for bad in [
            &["a.txt", "b.txt", "extra.txt"][..],
            &["a.txt"],
            &["a.txt", "a.txt", "b.txt"],
            &["a.txt", ".github/workflows/x.yml"],
        ] {
            let err = check_changed_files(&env, &result(bad)).unwrap_err();
            assert_eq!(err.code, Code::CHANGED_PATHS_MISMATCH, "{bad:?}");
        }
    }
}

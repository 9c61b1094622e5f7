//! One attempt, phase by phase: its entry ([`Worker::run`]), the context
//! its phases share ([`Run`]) and the phase driver ([`Run::drive`]). The
//! driver reads the attempt's latest checkpoint, hands its payload to the
//! module that owns the step to the next one, and appends what that step
//! returns — the journal is written here alone:
//!
//! ```text
//! (nothing yet)       ─▶ claimed                  here: the envelope kept, the lease recorded
//! claimed             ─▶ workspace_prepared       spool.rs: the request published
//!                     ─▶ source_capture_done      capture.rs: an earlier attempt's capture reused
//! workspace_prepared  ─▶ verification_passed      spool.rs: the executor's result awaited and checked
//! verification_passed ─▶ source_capture_done      capture.rs: the captured paths checked
//!                     ─▶ commit_done              commit.rs: the governed commit and the CAS
//! source_capture_done ─▶ result_pending           capture.rs: the captured result
//! commit_done         ─▶ published                publish.rs: the agent branch pushed to the upstream (when it publishes)
//!                     ─▶ result_pending           commit.rs: the passed result, while the branch holds it
//! published           ─▶ result_pending           commit.rs: the same, with the publication
//! result_pending      ─▶ result_submitted         report.rs: submitted under the attempt's key
//! any                 ─▶ reconciliation_required  reconcile.rs
//! ```
//!
//! A step that fails the attempt leads to a failed result_pending
//! (report.rs). What several phases read — the repository, our request,
//! the executor's verified result, the signer — is read once per run and
//! kept in the [`Run`]. lease.rs renews the lease while the attempt is
//! driven; fence.rs fences every move of the branch (the compare-and-swap,
//! the push) with the supervisor, so none happens for an attempt whose task
//! was cancelled or whose lease was taken; worker.rs holds the settings and
//! the stores every step uses.

mod capture;
mod commit;
mod fence;
mod lease;
mod publish;
mod reconcile;
mod report;
mod spool;
mod worker;

pub use worker::{Worker, WorkerSettings};

use airlock_config::Repository;
use airlock_git::{AuthorityRepo, GitError, Signer};
use airlock_journal::checkpoint::Checkpoint;
use airlock_proto::bundle::{ExecRequest, ExecResult, request_id_for};
use airlock_proto::bus::LeaseRef;
use airlock_proto::checkpoint::{
    CheckpointBinding, ClaimedPayload, CommitDonePayload, Payload, Phase,
};
use airlock_proto::envelope::Envelope;
use airlock_proto::task::Outcome;
use airlock_proto::{Code, Error};
use lease::Lease;
use once_cell::unsync::OnceCell;
use std::ops::ControlFlow::{self, Break, Continue};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

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

type Step<T> = Result<T, Error>;

/// Where a phase's step leads: the payload of the next checkpoint (the
/// driver appends it), or the end.
type Next = Step<ControlFlow<Finish, Payload>>;

fn refused(e: airlock_journal::SqliteError) -> Error {
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

/// One attempt being driven: its grant and lease, and what its phases
/// share, each read at most once per run.
struct Run<'w> {
    w: &'w Worker,
    grant: &'w Grant,
    cb: CheckpointBinding,
    /// The attempt's spool request id.
    rid: String,
    lease: Lease,
    /// The repository's registration when the run started (its upstream
    /// and signing settings for the whole run).
    registration: Option<Repository>,
    /// git's scratch space for this run (temporary index, archive),
    /// removed when the run ends.
    scratch: PathBuf,
    repo: OnceCell<AuthorityRepo>,
    request: OnceCell<ExecRequest>,
    /// The executor's verified result and its digest.
    result: OnceCell<(ExecResult, String)>,
    signer: OnceCell<Option<Signer>>,
}

impl Worker {
    /// Drives one attempt from wherever its journal says it is to the end.
    pub fn run(&self, grant: &Grant) -> Step<Finish> {
        let env = &grant.envelope;
        let rid = request_id_for(&env.binding.task_id, grant.attempt, &env.execution_digest);
        let run = Run {
            w: self,
            grant,
            cb: CheckpointBinding::of(env, grant.attempt),
            scratch: self.settings.workspace_root.join(format!("task-{rid}")),
            rid,
            lease: Lease::renew(&self.bus, grant, self.settings.renew_interval),
            registration: self.repository(&env.binding.repository),
            repo: OnceCell::new(),
            request: OnceCell::new(),
            result: OnceCell::new(),
            signer: OnceCell::new(),
        };
        let outcome = run.drive();
        let _ = std::fs::remove_dir_all(&run.scratch);
        run.lease.release();
        outcome
    }
}

impl Run<'_> {
    fn env(&self) -> &Envelope {
        &self.grant.envelope
    }

    /// One step per checkpoint until the attempt ends, one call per phase
    /// arm to the phase's owner (the table at the top of this module), and
    /// the payload it returns appended. A step that
    /// fails is settled by the catalogue's attributes of its code
    /// (docs/errors.md): a transient one is tried again in place while the
    /// lease holds; one that fails the attempt leads to a failed result
    /// carrying the code (so the task ends with its real reason, never as
    /// an expired lease); any other means the attempt is no longer ours
    /// (reconciliation_required). Once a result is pending it is the one
    /// reported: later trouble is not turned into another result.
    fn drive(&self) -> Step<Finish> {
        let (w, task) = (self.w, self.cb.task_id.as_str());
        let mutates = self.env().action.mutates();
        let mut backoff = Duration::from_millis(200);
        // A journal ahead of this grant, or bound to another scope, stops here.
        w.with_journal(|j| j.verify_latest_binding(&self.cb))?;
        let mut head = w.with_journal(|j| j.latest_for_attempt(task, self.cb.attempt))?;
        loop {
            w.progress.beat();
            #[cfg(feature = "fault-injection")]
            let injected = {
                let phase = head.as_ref().map(|c| c.phase);
                let injected = crate::fault::injected_error(phase, task);
                if injected.is_none() {
                    crate::fault::wedge(phase, task);
                }
                injected
            };
            #[cfg(not(feature = "fault-injection"))]
            let injected: Option<Error> = None;
            // The head's payload, typed: one that does not decode is
            // STORE_CORRUPT, never a default the next step acts on.
            let decoded = match injected {
                Some(e) => Err(e),
                None => head.as_ref().map(Checkpoint::decode).transpose(),
            };
            let step = decoded.and_then(|decoded| match decoded {
                None => self.claim(),
                Some(Payload::Claimed(_)) if mutates => self.prepare(),
                Some(Payload::Claimed(_)) => self.reuse_capture_or_prepare(),
                Some(Payload::WorkspacePrepared(prepared)) => self.verify(&prepared),
                Some(Payload::VerificationPassed(passed)) if mutates => {
                    self.commit_verified(passed)
                }
                Some(Payload::VerificationPassed(passed)) => self.capture(&passed),
                Some(Payload::SourceCaptureDone(done)) => self.report_capture(*done),
                Some(Payload::CommitDone(done)) if self.publishes() => self.publish(done),
                Some(Payload::CommitDone(done)) => self.converge(done, None),
                Some(Payload::Published(p)) => {
                    self.report_published(&p);
                    let done = CommitDonePayload {
                        commit_oid: p.commit_oid,
                        exec_result_sha256: p.exec_result_sha256,
                    };
                    self.converge(done, Some(p.publication))
                }
                Some(Payload::ResultPending(pending)) => self.submit(&pending),
                Some(Payload::ResultSubmitted(submitted)) => Ok(Break(Finish::Submitted {
                    outcome: submitted.outcome,
                    commit_oid: submitted.commit_oid,
                })),
                Some(Payload::ReconciliationRequired(recorded)) => {
                    self.resume_reconciliation(recorded).map(Break)
                }
            });
            // The one place the journal is written: the step's payload, or
            // what its error settles to.
            let append = |payload: Payload| -> Step<Checkpoint> {
                let phase = payload.phase();
                let appended = w.with_journal(|j| j.append(&self.cb, &payload))?;
                tracing::info!(%task, attempt = self.cb.attempt, phase = phase.as_str(), "checkpoint");
                #[cfg(feature = "fault-injection")]
                crate::fault::hit(
                    w.settings.fault,
                    crate::fault::FaultPoint::AfterPhase(phase),
                    task,
                );
                Ok(appended)
            };
            let step = step.and_then(|next| match next {
                Continue(payload) => append(payload).map(Continue),
                Break(finish) => Ok(Break(finish)),
            });
            head = match step {
                Ok(Break(finish)) => return Ok(finish),
                Ok(Continue(appended)) => Some(appended),
                Err(error) if error.code.transient() => {
                    if w.stopping.load(Ordering::SeqCst) || self.lease.lost().is_some() {
                        return Err(error);
                    }
                    tracing::warn!(%task, attempt = self.cb.attempt, "transient failure, trying the step again: {error}");
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    w.with_journal(|j| j.latest_for_attempt(task, self.cb.attempt))?
                }
                // A pending result is the one reported, unless its record
                // no longer decodes (STORE_CORRUPT): then the attempt's
                // failure is reported under the same key instead (a
                // supervisor that already holds the original answers a
                // conflict, and the attempt needs reconciliation).
                Err(error) if self.settled(head.as_ref()) => return Err(error),
                Err(error) => Some(append(self.settle(error)?)?),
            };
        }
    }

    /// Whether the attempt's answer is already recorded (a decodable
    /// pending result, a submitted one, a reconciliation).
    fn settled(&self, head: Option<&Checkpoint>) -> bool {
        head.is_some_and(|c| match c.phase {
            Phase::ResultPending => c.decode().is_ok(),
            Phase::ResultSubmitted | Phase::ReconciliationRequired => true,
            _ => false,
        })
    }

    /// What a step's error leads to: a failed result for a code that
    /// fails the attempt, else reconciliation_required.
    fn settle(&self, error: Error) -> Step<Payload> {
        if error.code.fails_attempt() {
            return self.failed(error, None);
        }
        Ok(self.reconciliation(error.code, &error.to_string()))
    }

    /// The first step: the envelope kept where a restarted worker finds it,
    /// and the lease recorded.
    fn claim(&self) -> Next {
        let (w, env) = (self.w, self.env());
        w.keep_envelope(env)?;
        // A base the planner saw upstream before the schedule fetched it:
        // fetch first. A failed sync is not this step's failure; a base
        // still missing fails where the archive is made.
        let b = &env.binding;
        if let Err(e) = w.ensure_commit(&b.repository, b.source_head()) {
            tracing::warn!(task = %b.task_id, "could not sync for the task's base: {e}");
        }
        Ok(Continue(Payload::Claimed(ClaimedPayload {
            lease_epoch: self.grant.lease.lease_epoch,
            lease_token: self.grant.lease.lease_token.clone(),
            request_id: self.rid.clone(),
        })))
    }

    /// The task's repository, opened once per run; refused with
    /// REPOSITORY_NOT_REGISTERED once it is no longer registered.
    fn repo(&self) -> Step<&AuthorityRepo> {
        self.w.registered(&self.env().binding.repository)?;
        self.repo.get_or_try_init(|| self.open_repo())
    }

    fn open_repo(&self) -> Step<AuthorityRepo> {
        let path = self
            .registration
            .as_ref()
            .map(|r| r.path.clone())
            .ok_or_else(|| {
                Error::with(
                    Code::REPOSITORY_NOT_REGISTERED,
                    self.env().binding.repository.clone(),
                )
            })?;
        std::fs::create_dir_all(&self.scratch).map_err(|e| {
            Error::with(
                Code::STORE_UNAVAILABLE,
                format!("{}: {e}", self.scratch.display()),
            )
        })?;
        let repo = AuthorityRepo::open(&path).map_err(git_err)?;
        Ok(repo.with_scratch(self.scratch.clone()))
    }
}

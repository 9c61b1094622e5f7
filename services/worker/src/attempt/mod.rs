//! One attempt, phase by phase: its entry ([`Worker::run`]) and the phase
//! driver. The driver reads the attempt's latest checkpoint and hands it to
//! the module that owns the step to the next one:
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
//! A step that fails the attempt records a failed result_pending through
//! report.rs. lease.rs renews the lease while the attempt is driven;
//! worker.rs holds the settings and the stores every step uses.

mod capture;
mod commit;
mod lease;
mod publish;
mod reconcile;
mod report;
mod spool;
mod worker;

pub use worker::{Worker, WorkerSettings};

use airlock_git::GitError;
use airlock_journal::checkpoint::Checkpoint;
use airlock_proto::bundle::request_id_for;
use airlock_proto::bus::LeaseRef;
use airlock_proto::checkpoint::{
    CheckpointBinding, ClaimedPayload, CommitDonePayload, Payload, Phase,
};
use airlock_proto::envelope::{Action, Envelope};
use airlock_proto::task::Outcome;
use airlock_proto::{Code, Error};
use lease::Lease;
use std::ops::ControlFlow::{self, Break, Continue};
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

/// Where a phase's step leads: the checkpoint it appended, or the end.
type Next = Step<ControlFlow<Finish, Checkpoint>>;

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

impl Worker {
    /// Drives one attempt from wherever its journal says it is to the end.
    pub fn run(&self, grant: &Grant) -> Step<Finish> {
        let lease = Lease::renew(&self.bus, grant, self.settings.renew_interval);
        let outcome = self.drive(grant, &lease);
        lease.release();
        outcome
    }

    /// Drives the attempt; a step that fails is settled by the catalogue's
    /// attributes of its code (docs/errors.md): a transient one is tried
    /// again in place while the lease holds; one that fails the attempt
    /// ends it with a failed result carrying the code (so the task ends
    /// with its real reason, never as an expired lease); any other means
    /// the attempt is no longer ours (reconciliation_required). Once a
    /// result is pending it is the one reported: later trouble is not
    /// turned into another result.
    fn drive(&self, grant: &Grant, lease: &Lease) -> Step<Finish> {
        let cb = CheckpointBinding::of(&grant.envelope, grant.attempt);
        let mut backoff = Duration::from_millis(200);
        loop {
            self.progress.beat();
            let error = match self.drive_phases(grant, lease) {
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
                if self.stopping.load(Ordering::SeqCst) || lease.lost().is_some() {
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

    /// One step per checkpoint until the attempt ends; each arm is the
    /// phase's owner (the table at the top of this module).
    fn drive_phases(&self, grant: &Grant, lease: &Lease) -> Step<Finish> {
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
            let next = match decoded {
                None => self.claim(&cb, grant, &rid),
                Some(Payload::Claimed(_)) => match self.reuse_capture(&cb, grant)? {
                    Some(reused) => Ok(Continue(reused)),
                    None => self.prepare(&cb, grant, &rid),
                },
                Some(Payload::WorkspacePrepared(prepared)) => {
                    self.verify(&cb, grant, &rid, &prepared, lease)
                }
                Some(Payload::VerificationPassed(passed))
                    if env.action == Action::SourceCapture =>
                {
                    self.capture(&cb, grant, &rid, &passed)
                }
                Some(Payload::VerificationPassed(passed)) => {
                    self.commit_verified(&cb, grant, &rid, passed, lease)
                }
                Some(Payload::SourceCaptureDone(done)) => self.report_capture(&cb, grant, *done),
                Some(Payload::CommitDone(done)) if self.publishes(&env.binding.repository) => {
                    self.publish(&cb, grant, &rid, done)
                }
                Some(Payload::CommitDone(done)) => self.converge(&cb, grant, &rid, done, None),
                Some(Payload::Published(p)) => {
                    let done = CommitDonePayload {
                        commit_oid: p.commit_oid,
                        exec_result_sha256: p.exec_result_sha256,
                    };
                    self.converge(&cb, grant, &rid, done, Some(p.publication))
                }
                Some(Payload::ResultPending(pending)) => {
                    self.submit(&cb, grant, &pending).map(Break)
                }
                Some(Payload::ResultSubmitted(submitted)) => Ok(Break(Finish::Submitted {
                    outcome: submitted.outcome,
                    commit_oid: submitted.commit_oid,
                })),
                Some(Payload::ReconciliationRequired(recorded)) => {
                    self.resume_reconciliation(grant, recorded).map(Break)
                }
            };
            match next? {
                Continue(appended) => head = Some(appended),
                Break(finish) => return Ok(finish),
            }
        }
    }

    /// The first step: the envelope kept where a restarted worker finds it,
    /// and the lease recorded.
    fn claim(&self, cb: &CheckpointBinding, grant: &Grant, rid: &str) -> Next {
        self.keep_envelope(&grant.envelope)?;
        // A base the planner saw upstream before the schedule fetched it:
        // fetch first. A failed sync is not this step's failure; a base
        // still missing fails where the archive is made.
        let b = &grant.envelope.binding;
        if let Err(e) = self.ensure_commit(&b.repository, b.source_head()) {
            tracing::warn!(task = %b.task_id, "could not sync for the task's base: {e}");
        }
        let claimed = ClaimedPayload {
            lease_epoch: grant.lease.lease_epoch,
            lease_token: grant.lease.lease_token.clone(),
            request_id: rid.to_owned(),
        };
        Ok(Continue(self.append(cb, Payload::Claimed(claimed))?))
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
}

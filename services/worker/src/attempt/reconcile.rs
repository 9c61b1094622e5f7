//! reconciliation_required: an attempt the worker cannot settle alone (the
//! lease lost, a conflicting result, a branch moved behind its back) is
//! recorded as such, and a moved branch is reported to the supervisor,
//! which opens a case from it.

use super::{Finish, Grant, Step, Worker};
use crate::bus::is_transient;
use airlock_proto::Code;
use airlock_proto::checkpoint::{
    CheckpointBinding, Payload, ReconciliationPayload, result_idempotency_key,
};
use airlock_proto::reconcile::BranchFacts;
use airlock_proto::task::TaskResult;
use std::sync::atomic::Ordering;
use std::time::Duration;

impl Worker {
    /// Records reconciliation_required with `code`: not this worker's to settle.
    pub(super) fn reconcile(&self, cb: &CheckpointBinding, code: Code, why: &str) -> Step<Finish> {
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

    /// The branch does not hold the commit this attempt made: records
    /// `reconciliation_required` with the head observed, then reports the
    /// attempt failed with `RECONCILIATION_REQUIRED` (so the task does not
    /// wait for its lease to lapse, and an administrator sees why).
    pub(super) fn branch_moved(
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

    /// The upstream's agent branch is neither where the task expects it
    /// nor at the attempt's commit (UPSTREAM_BRANCH_MOVED): recorded as
    /// reconciliation_required with the upstream's head as the head
    /// observed, and reported as a moved branch is, so a case opens. The
    /// upstream is never forced.
    pub(super) fn upstream_moved(
        &self,
        cb: &CheckpointBinding,
        grant: &Grant,
        commit: &str,
        observed: Option<&str>,
        why: &str,
    ) -> Step<Finish> {
        tracing::error!(task = %cb.task_id, attempt = cb.attempt, commit, ?observed, "reconciliation required: {}: {why}", Code::UPSTREAM_BRANCH_MOVED);
        self.append(
            cb,
            Payload::ReconciliationRequired(ReconciliationPayload {
                code: Code::RECONCILIATION_REQUIRED,
                detail: format!("{}: {why}", Code::UPSTREAM_BRANCH_MOVED),
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

    /// An attempt whose journal ends at reconciliation_required: a moved
    /// branch is reported again (before the crash or not, the same result
    /// under the same key is a replay).
    pub(super) fn resume_reconciliation(
        &self,
        grant: &Grant,
        recorded: ReconciliationPayload,
    ) -> Step<Finish> {
        let code = recorded.code;
        if code == Code::RECONCILIATION_REQUIRED {
            let facts = BranchFacts {
                commit_oid: recorded.commit_oid.unwrap_or_default(),
                observed_head: recorded.observed_head,
            };
            self.report_reconciliation(grant, facts)?;
        }
        Ok(Finish::Reconcile(code))
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
}

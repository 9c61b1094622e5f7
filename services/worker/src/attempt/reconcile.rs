//! reconciliation_required: an attempt the worker cannot settle alone (the
//! lease lost, a conflicting result, a branch moved behind its back) is
//! recorded as such, and a moved branch is reported to the supervisor,
//! which opens a case from it.

use super::{Finish, Run, Step};
use crate::bus::is_transient;
use airlock_proto::Code;
use airlock_proto::checkpoint::{Payload, ReconciliationPayload, result_idempotency_key};
use airlock_proto::reconcile::BranchFacts;
use airlock_proto::task::TaskResult;
use std::sync::atomic::Ordering;
use std::time::Duration;

impl Run<'_> {
    /// reconciliation_required with `code`: not this worker's to settle.
    pub(super) fn reconciliation(&self, code: Code, why: &str) -> Payload {
        tracing::error!(task = %self.cb.task_id, attempt = self.cb.attempt, "reconciliation required: {code}: {why}");
        Payload::ReconciliationRequired(ReconciliationPayload {
            code,
            detail: why.to_owned(),
            commit_oid: None,
            observed_head: None,
        })
    }

    /// The branch does not hold the commit this attempt made:
    /// reconciliation_required with the head observed (the driver then
    /// reports the attempt failed with RECONCILIATION_REQUIRED, so the task
    /// does not wait for its lease to lapse, and an administrator sees why).
    pub(super) fn branch_moved(&self, commit: &str, observed: Option<&str>) -> Payload {
        let branch = &self.env().binding.target_branch;
        tracing::error!(task = %self.cb.task_id, attempt = self.cb.attempt, %branch, commit, ?observed, "reconciliation required: the branch moved behind the worker's back");
        let at = observed.unwrap_or("nothing");
        let detail = format!("{branch} is at {at} instead of the attempt's commit {commit}");
        moved(commit, observed, detail)
    }

    /// The upstream's agent branch is neither where the task expects it
    /// nor at the attempt's commit (UPSTREAM_BRANCH_MOVED): recorded with
    /// the upstream's head as the head observed, and reported as a moved
    /// branch is, so a case opens. The upstream is never forced.
    pub(super) fn upstream_moved(
        &self,
        commit: &str,
        observed: Option<&str>,
        why: &str,
    ) -> Payload {
        let code = Code::UPSTREAM_BRANCH_MOVED;
        tracing::error!(task = %self.cb.task_id, attempt = self.cb.attempt, commit, ?observed, "reconciliation required: {code}: {why}");
        moved(commit, observed, format!("{code}: {why}"))
    }

    /// reconciliation_required recorded: a moved branch is reported (again,
    /// after a crash: the same result under the same key is a replay).
    pub(super) fn resume_reconciliation(&self, recorded: ReconciliationPayload) -> Step<Finish> {
        let code = recorded.code;
        if code == Code::RECONCILIATION_REQUIRED {
            let facts = BranchFacts {
                commit_oid: recorded.commit_oid.unwrap_or_default(),
                observed_head: recorded.observed_head,
            };
            self.report_reconciliation(facts)?;
        }
        Ok(Finish::Reconcile(code))
    }

    /// Sends the failed result of an attempt that needs reconciliation,
    /// carrying what the worker saw of the branch (the supervisor opens a
    /// case from it): derived from the grant and the journal's record
    /// alone, under the attempt's result key, so a resend is an idempotent
    /// replay. A refusal (the lease is gone) is logged; the journal keeps
    /// the observed head either way.
    fn report_reconciliation(&self, facts: BranchFacts) -> Step<()> {
        let (w, env, attempt) = (self.w, self.env(), self.grant.attempt);
        let task = &env.binding.task_id;
        let result = TaskResult::reconciliation_required(env, attempt, facts);
        let key = result_idempotency_key(task, attempt, &env.execution_digest);
        let mut backoff = Duration::from_millis(200);
        loop {
            match w.bus.submit_result(&self.grant.lease, &key, &result) {
                Ok(_) => return Ok(()),
                Err(e) if is_transient(e.code) && !w.stopping.load(Ordering::SeqCst) => {
                    w.progress.beat();
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

/// reconciliation_required for a branch that moved: RECONCILIATION_REQUIRED
/// with the commit made and the head observed.
fn moved(commit: &str, observed: Option<&str>, detail: String) -> Payload {
    Payload::ReconciliationRequired(ReconciliationPayload {
        code: Code::RECONCILIATION_REQUIRED,
        detail,
        commit_oid: Some(commit.to_owned()),
        observed_head: observed.map(str::to_owned),
    })
}

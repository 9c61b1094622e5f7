//! Adoptions: the worker's part of a reconciliation case.
//!
//! When an administrator resolves a case with `adopt`, the supervisor (which
//! holds no git access) only records the decision; the case waits
//! `adopting`. The worker, the one reader and writer of the authority
//! repositories, takes it (`Worker1.TakeAdoption`), reads the branch and
//! reports what it holds (`Worker1.SettleAdoption`): the supervisor adopts
//! the head only if the branch still holds it and it descends from the
//! task's base. The worker never moves the ref here.

use crate::attempt::Worker;
use airlock_git::AuthorityRepo;
use airlock_proto::reconcile::{AdoptionCheck, AdoptionReport};
use airlock_proto::{Code, Error};

impl Worker {
    /// Checks one case waiting for adoption, if there is one this worker
    /// serves the repository of. True when a case was settled (adopted or
    /// opened again), so the caller may look for another at once.
    pub fn check_adoption(&self) -> bool {
        let check = match self.bus().take_adoption() {
            Ok(Some(check)) => check,
            Ok(None) => return false,
            Err(e) => {
                tracing::warn!("looking for an adoption: {e}");
                return false;
            }
        };
        let report = match self.read_branch(&check) {
            Ok(report) => report,
            Err(e) => {
                tracing::warn!(task = %check.task_id, "checking an adoption: {e}");
                return false;
            }
        };
        match self.bus().settle_adoption(&report) {
            Ok(case) => {
                match report.refusal() {
                    None => {
                        tracing::info!(task = %check.task_id, head = %check.observed_head, status = case.status.as_str(), "adoption checked: the branch holds the head")
                    }
                    Some(code) => {
                        tracing::warn!(task = %check.task_id, head = %check.observed_head, now = ?report.head_now, code = code.as_str(), "adoption refused: the case is open again")
                    }
                }
                true
            }
            Err(e) => {
                tracing::warn!(task = %check.task_id, "reporting an adoption check: {e}");
                false
            }
        }
    }

    fn read_branch(&self, check: &AdoptionCheck) -> Result<AdoptionReport, Error> {
        let path = self.repository_path(&check.repository).ok_or_else(|| {
            Error::with(Code::REPOSITORY_NOT_REGISTERED, check.repository.clone())
        })?;
        let git = |e: airlock_git::GitError| Error::with(e.code(), e.to_string());
        let repo = AuthorityRepo::open(&path).map_err(git)?;
        let head_now = repo.branch_head(&check.branch).map_err(git)?;
        let descends = match &head_now {
            Some(head) => repo.is_ancestor(&check.base_oid, head).map_err(git)?,
            None => false,
        };
        Ok(AdoptionReport {
            task_id: check.task_id.clone(),
            attempt: check.attempt,
            checked_head: check.observed_head.clone(),
            head_now,
            descends,
        })
    }
}

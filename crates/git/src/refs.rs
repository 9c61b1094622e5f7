//! Compare-and-swap updates of agent/* branches.

use crate::AuthorityRepo;
use crate::error::{GitError, GitResult};
use airlock_proto::binding::check_target_branch;

/// What a successful [`AuthorityRepo::cas_update`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefUpdate {
    /// The branch moved from the expected value to the new one.
    Updated,
    /// The branch was already at the new value (a redo after a crash).
    AlreadyAtTarget,
}

/// Refuses anything but a valid, unprotected `agent/…` branch name.
pub(crate) fn check_agent_branch(branch: &str) -> GitResult<()> {
    check_target_branch(branch).map_err(GitError::Refused)
}

impl AuthorityRepo {
    /// Moves `refs/heads/<branch>` to `new` if it is at `expected`
    /// (`None`: the branch must not exist). If it is already at `new`, this
    /// is a no-op, so a worker redoing the step after a crash converges.
    /// Anything else is REF_CAS_MISMATCH and changes nothing.
    pub fn cas_update(
        &self,
        branch: &str,
        new: &str,
        expected: Option<&str>,
    ) -> GitResult<RefUpdate> {
        check_agent_branch(branch)?;
        if self.resolve_commit(new)?.as_deref() != Some(new) {
            return Err(GitError::ObjectMissing(new.to_owned()));
        }
        let refname = format!("refs/heads/{branch}");
        let current = self.branch_head(branch)?;
        if current.as_deref() == Some(new) {
            // A redo after a crash: the rename may not be on disk yet.
            self.git.sync_ref_dirs(&refname)?;
            return Ok(RefUpdate::AlreadyAtTarget);
        }
        let mismatch = |actual: Option<String>| GitError::CasMismatch {
            branch: branch.to_owned(),
            expected: expected.unwrap_or("absent").to_owned(),
            actual: actual.unwrap_or_else(|| "absent".into()),
        };
        if current.as_deref() != expected {
            return Err(mismatch(current));
        }
        let zero = "0".repeat(new.len());
        let old = expected.unwrap_or(&zero);
        let moved = match self.git.output(&[
            "update-ref",
            "-m",
            "airlock: governed commit",
            &refname,
            new,
            old,
        ]) {
            Ok(_) => RefUpdate::Updated,
            Err(GitError::Failed { .. }) => {
                // Lost a race inside git's own lock: report what is there now.
                let now = self.branch_head(branch)?;
                if now.as_deref() != Some(new) {
                    return Err(mismatch(now));
                }
                RefUpdate::AlreadyAtTarget
            }
            Err(e) => return Err(e),
        };
        // Made durable before the caller records it (`commit_done`).
        self.git.sync_ref_dirs(&refname)?;
        Ok(moved)
    }
}

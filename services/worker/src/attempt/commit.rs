//! The governed commit: verification_passed → commit_done (the commit built
//! from the verified result, the branch moved by CAS), then commit_done →
//! result_pending while the branch still holds it.

use super::lease::Lease;
use super::report::{Evidence, evidence_of, summaries};
use super::{Grant, Next, Step, Worker, git_err};
use airlock_git::{CommitSpec, FileChange, GitError};
use airlock_proto::canonical::sha256_hex;
use airlock_proto::checkpoint::{
    CheckpointBinding, CommitDonePayload, Payload, VerificationPassedPayload,
};
use airlock_proto::envelope::Envelope;
use airlock_proto::task::{Isolation, TaskResult};
use airlock_proto::{Code, Error};
use base64::Engine;
use std::ops::ControlFlow::{Break, Continue};

impl Worker {
    /// verification_passed → commit_done, or the attempt's failure.
    pub(super) fn commit_verified(
        &self,
        cb: &CheckpointBinding,
        grant: &Grant,
        rid: &str,
        passed: VerificationPassedPayload,
        lease: &Lease,
    ) -> Next {
        let env = &grant.envelope;
        let sha = passed.exec_result_sha256;
        if let Some(code) = lease.lost() {
            return self
                .reconcile(cb, code, "lease lost before the commit")
                .map(Break);
        }
        let failed = match self.commit(env, rid, &sha) {
            Ok(Ok(oid)) => {
                let done = CommitDonePayload {
                    commit_oid: oid,
                    exec_result_sha256: sha,
                };
                return Ok(Continue(self.append(cb, Payload::CommitDone(done))?));
            }
            // Resumed after a crash, the branch at neither the expected
            // head nor this attempt's commit: the earlier process may have
            // moved it to the commit before someone moved it again, and
            // nothing can tell which. Not this attempt's to settle.
            Ok(Err((oid, observed))) if grant.resumed => {
                return self
                    .branch_moved(cb, grant, &oid, observed.as_deref())
                    .map(Break);
            }
            Ok(Err((_, observed))) => Error::with(
                Code::REF_CAS_MISMATCH,
                format!(
                    "{} is at {}, not where the task expects it",
                    env.binding.target_branch,
                    observed.as_deref().unwrap_or("nothing")
                ),
            ),
            Err(e) if e.code.fails_attempt() => e,
            Err(e) => return Err(e),
        };
        let evidence = self.evidence(env, rid, &sha);
        self.finish_failed(cb, grant, failed, evidence).map(Break)
    }

    /// commit_done → result_pending: the passed result. Converges only
    /// while the branch holds the commit made: a ref moved behind the
    /// worker's back (between the commit and the report, or across a crash)
    /// is not reported as this attempt's success.
    pub(super) fn converge(
        &self,
        cb: &CheckpointBinding,
        grant: &Grant,
        rid: &str,
        done: CommitDonePayload,
        publication: Option<airlock_proto::task::Publication>,
    ) -> Next {
        let env = &grant.envelope;
        let CommitDonePayload {
            commit_oid: oid,
            exec_result_sha256: sha,
        } = done;
        let scratch = self.scratch(rid)?;
        let observed = self
            .repo(env, &scratch)?
            .branch_head(&env.binding.target_branch)
            .map_err(git_err)?;
        let _ = std::fs::remove_dir_all(&scratch);
        if observed.as_deref() != Some(oid.as_str()) {
            return self
                .branch_moved(cb, grant, &oid, observed.as_deref())
                .map(Break);
        }
        let exec = self.read_result(env, rid, Some(&sha))?;
        let mut result = TaskResult::passed(
            env,
            grant.attempt,
            oid,
            sha,
            summaries(exec.verification.clone()),
            Isolation::from_report(&exec.confinement),
        );
        result.publication = publication;
        result.signature =
            self.signer(&env.binding.repository)?
                .map(|s| airlock_proto::task::Signature {
                    principal: s.principal().to_owned(),
                    fingerprint: s.fingerprint(),
                });
        Ok(Continue(self.pending(cb, grant, &result)?.0))
    }

    /// The repository's signer, when it signs: its key from the worker's
    /// credentials (SIGNING_KEY_INVALID when missing or unusable).
    pub(super) fn signer(&self, repository: &str) -> super::Step<Option<airlock_git::Signer>> {
        let Some(signing) = self.repository(repository).and_then(|r| r.signing) else {
            return Ok(None);
        };
        let (_, name) = airlock_config::credential_names(repository);
        let path = self
            .settings
            .credentials
            .as_ref()
            .map(|d| d.join(&name))
            .ok_or_else(|| {
                Error::with(
                    Code::SIGNING_KEY_INVALID,
                    format!("{repository} signs, but the worker has no credentials ({name})"),
                )
            })?;
        airlock_git::Signer::load(&path, &signing.principal)
            .map(Some)
            .map_err(|e| Error::with(Code::SIGNING_KEY_INVALID, e.to_string()))
    }

    /// What a failed result keeps of the verified executor's result, when
    /// it can still be read.
    fn evidence(&self, env: &Envelope, rid: &str, sha: &str) -> Option<Evidence> {
        self.read_result(env, rid, Some(sha))
            .ok()
            .map(|r| evidence_of(&r))
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
                changes.push(if f.symlink {
                    FileChange::symlink(&f.path, content)
                } else {
                    FileChange::write(&f.path, content, f.executable)
                });
            }
        }
        let b = &env.binding;
        let message = format!(
            "airlock: {} (job {}, generation {})\n\nexecution-digest: {}\ngoverned-by: airlock",
            b.task_id, b.job_id, b.generation, env.execution_digest
        );
        let scratch = self.scratch(rid)?;
        let repo = self.repo(env, &scratch)?;
        let signer = self.signer(&b.repository)?;
        let oid = repo
            .governed_commit_signed(
                &CommitSpec {
                    parent: b.source_head().to_owned(),
                    changes,
                    message,
                },
                signer.as_ref(),
            )
            .map_err(git_err)?;
        #[cfg(feature = "fault-injection")]
        crate::fault::hit(
            self.settings.fault,
            crate::fault::FaultPoint::CommitWritten,
            &b.task_id,
        );
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
}

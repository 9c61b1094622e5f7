//! The governed commit: verification_passed → commit_done (the commit built
//! from the verified result, the branch moved by CAS), then commit_done →
//! result_pending while the branch still holds it.

use super::fence::REF_HOLD;
use super::report::{evidence_of, pending, summaries};
use super::{Next, Run, Step, git_err};
use airlock_git::{CommitSpec, FileChange, GitError, Signer};
use airlock_proto::binding::BranchMode;
use airlock_proto::bus::FenceStep;
use airlock_proto::canonical::sha256_hex;
use airlock_proto::checkpoint::{CommitDonePayload, Payload, VerificationPassedPayload};
use airlock_proto::task::{Isolation, Publication, Signature, TaskResult};
use airlock_proto::{Code, Error};
use base64::Engine;
use std::ops::ControlFlow::Continue;

impl Run<'_> {
    /// verification_passed → commit_done, or the attempt's failure: the
    /// governed commit built from the verified result, and the branch moved
    /// by CAS. The commit message names the task, generation and execution
    /// digest but nothing of the attempt — not its number, nor the
    /// executor's result digest, which covers the commands' durations and
    /// so differs per attempt — so every attempt of one plan converges on
    /// one commit. (With the digest in it, an attempt superseded after its
    /// ref update, e.g. a worker paused past its lease while another host
    /// took the task over, left a commit no later attempt could match:
    /// REF_CAS_MISMATCH until the task failed. The multi-host crash matrix
    /// found it.)
    pub(super) fn commit_verified(&self, passed: VerificationPassedPayload) -> Next {
        let sha = passed.exec_result_sha256;
        if let Some(code) = self.lease.lost() {
            return Ok(Continue(
                self.reconciliation(code, "lease lost before the commit"),
            ));
        }
        let result = self.result(&sha)?;
        // Whatever fails the attempt from here keeps the verified evidence.
        let failed = |error: Error| {
            let evidence = evidence_of(result, &self.redactor());
            Ok(Continue(self.failed(error, Some(evidence))?))
        };
        let commit = || -> Next {
            let b64 = base64::engine::general_purpose::STANDARD;
            let mut changes = Vec::new();
            for f in &result.changed_files {
                let Some(encoded) = f.content_b64.as_deref().filter(|_| !f.deleted) else {
                    changes.push(FileChange::delete(&f.path));
                    continue;
                };
                let content = b64
                    .decode(encoded)
                    .map_err(|e| Error::with(Code::MESSAGE_INVALID, format!("{}: {e}", f.path)))?;
                if Some(sha256_hex(&content).as_str()) != f.sha256.as_deref() {
                    let detail = format!("{}: content digest", f.path);
                    return Err(Error::with(Code::SPOOL_DIGEST_MISMATCH, detail));
                }
                changes.push(match f.symlink {
                    true => FileChange::symlink(&f.path, content),
                    false => FileChange::write(&f.path, content, f.executable),
                });
            }
            let b = &self.env().binding;
            let message = format!(
                "airlock: {} (job {}, generation {})\n\nexecution-digest: {}\ngoverned-by: airlock",
                b.task_id,
                b.job_id,
                b.generation,
                self.env().execution_digest
            );
            let spec = CommitSpec {
                parent: b.source_head().to_owned(),
                changes,
                message,
            };
            let repo = self.repo()?;
            let oid = repo
                .governed_commit_signed(&spec, self.signer()?)
                .map_err(git_err)?;
            #[cfg(feature = "fault-injection")]
            crate::fault::hit(
                self.w.settings.fault,
                crate::fault::FaultPoint::CommitWritten,
                &b.task_id,
            );
            let expected = match b.branch_mode {
                BranchMode::CreateNew => None,
                BranchMode::ContinueExisting => Some(b.expected_branch_oid.as_str()),
            };
            // The branch moves only under a fence: never for an attempt
            // whose task was cancelled or whose lease was taken.
            let update = self.fenced(FenceStep::Ref, &oid, REF_HOLD, || {
                Ok(repo.cas_update(&b.target_branch, &oid, expected))
            })?;
            match update {
                Ok(update) => {
                    tracing::info!(task = %b.task_id, commit = %oid, branch = %b.target_branch, ?update, "governed commit");
                    #[cfg(feature = "fault-injection")]
                    crate::fault::hit(
                        self.w.settings.fault,
                        crate::fault::FaultPoint::RefUpdated,
                        &b.task_id,
                    );
                    let done = CommitDonePayload {
                        commit_oid: oid,
                        exec_result_sha256: sha.clone(),
                    };
                    Ok(Continue(Payload::CommitDone(done)))
                }
                // Resumed after a crash, the branch at neither the expected
                // head nor this attempt's commit: the earlier process may
                // have moved it to the commit before someone moved it
                // again, and nothing can tell which. Not this attempt's to
                // settle.
                Err(GitError::CasMismatch { .. }) if self.grant.resumed => {
                    let observed = repo.branch_head(&b.target_branch).map_err(git_err)?;
                    Ok(Continue(self.branch_moved(&oid, observed.as_deref())))
                }
                Err(GitError::CasMismatch { .. }) => {
                    let observed = repo.branch_head(&b.target_branch).map_err(git_err)?;
                    let at = observed.as_deref().unwrap_or("nothing");
                    let detail = format!(
                        "{} is at {at}, not where the task expects it",
                        b.target_branch
                    );
                    failed(Error::with(Code::REF_CAS_MISMATCH, detail))
                }
                Err(e) => Err(git_err(e)),
            }
        };
        match commit() {
            Err(e) if e.code.fails_attempt() => failed(e),
            other => other,
        }
    }

    /// commit_done → result_pending: the passed result. Converges only
    /// while the branch holds the commit made: a ref moved behind the
    /// worker's back (between the commit and the report, or across a crash)
    /// is not reported as this attempt's success.
    pub(super) fn converge(
        &self,
        done: CommitDonePayload,
        publication: Option<Publication>,
    ) -> Next {
        let branch = &self.env().binding.target_branch;
        let observed = self.repo()?.branch_head(branch).map_err(git_err)?;
        if observed.as_deref() != Some(done.commit_oid.as_str()) {
            return Ok(Continue(
                self.branch_moved(&done.commit_oid, observed.as_deref()),
            ));
        }
        let exec = self.result(&done.exec_result_sha256)?;
        let mut result = TaskResult::passed(
            self.env(),
            self.grant.attempt,
            done.commit_oid,
            done.exec_result_sha256,
            summaries(exec.verification.clone(), &self.redactor()),
            Isolation::from_report(&exec.confinement),
        );
        result.publication = publication;
        result.signature = self.signer()?.map(|s| Signature {
            principal: s.principal().to_owned(),
            fingerprint: s.fingerprint(),
        });
        Ok(Continue(pending(result)?))
    }

    /// The repository's signer, loaded once per run when it signs: its key
    /// from the worker's credentials (SIGNING_KEY_INVALID when missing or
    /// unusable).
    fn signer(&self) -> Step<Option<&Signer>> {
        self.signer
            .get_or_try_init(|| self.load_signer())
            .map(Option::as_ref)
    }

    fn load_signer(&self) -> Step<Option<Signer>> {
        let Some(signing) = self.registration.as_ref().and_then(|r| r.signing.as_ref()) else {
            return Ok(None);
        };
        let repository = &self.env().binding.repository;
        let (_, name) = airlock_config::credential_names(repository);
        let Some(dir) = self.w.settings.credentials.as_ref() else {
            let detail = format!("{repository} signs, but the worker has no credentials ({name})");
            return Err(Error::with(Code::SIGNING_KEY_INVALID, detail));
        };
        Signer::load(&dir.join(&name), &signing.principal)
            .map(Some)
            .map_err(|e| Error::with(Code::SIGNING_KEY_INVALID, e.to_string()))
    }
}

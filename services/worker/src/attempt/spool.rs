//! The exchange with the executor through the spool: publishing the
//! request (claimed → workspace_prepared) and the source archive it asks
//! for, then waiting for its result or failure record and verifying it
//! (workspace_prepared → verification_passed).

use super::report::{Evidence, evidence_of};
use super::{Next, Run, Step, git_err, spool_err};
use airlock_proto::bundle::{
    EXEC_REQUEST_SCHEMA, ExecFailure, ExecRequest, ExecResult, SourceWanted,
};
use airlock_proto::canonical::sha256_hex;
use airlock_proto::checkpoint::{Payload, VerificationPassedPayload, WorkspacePreparedPayload};
use airlock_proto::{Code, Error};
use airlock_spool::{Expect, Kind};
use std::ops::ControlFlow::Continue;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

impl Run<'_> {
    /// claimed → workspace_prepared: the request published, naming the
    /// source by its git tree id (read from the repository without touching
    /// a blob: O(1) whatever its size). The archive follows only if the
    /// executor asks for it ([`Run::send_source`]). The request is derived
    /// from the envelope alone, so a replay after a crash publishes the
    /// same bytes; an existing file is accepted only if it is
    /// byte-identical.
    pub(super) fn prepare(&self) -> Next {
        let env = self.env();
        let tree = self
            .repo()?
            .tree_of(env.binding.source_head())
            .map_err(git_err)?;
        let request = ExecRequest {
            schema: EXEC_REQUEST_SCHEMA.into(),
            request_id: self.rid.clone(),
            attempt: self.grant.attempt,
            envelope: env.to_value(),
            source_tree: tree.clone(),
        };
        let bytes =
            serde_json::to_vec(&request).map_err(|e| Error::with(Code::INTERNAL, e.to_string()))?;
        self.publish_once(Kind::Requests, &bytes)?;
        let prepared = WorkspacePreparedPayload {
            request_id: self.rid.clone(),
            request_sha256: request.digest(),
            source_tree: tree,
        };
        let _ = self.request.set(request);
        Ok(Continue(Payload::WorkspacePrepared(prepared)))
    }

    /// workspace_prepared → verification_passed, or the attempt's failure:
    /// waits (inotify) for the executor's result or failure record, the
    /// lease renewed meanwhile (the renewer thread), answering a request
    /// for the source on the way.
    pub(super) fn verify(&self, prepared: &WorkspacePreparedPayload) -> Next {
        let (w, rid) = (self.w, self.rid.as_str());
        let request = self.request(Some(&prepared.request_sha256))?;
        let budget: u64 = self
            .env()
            .verification
            .iter()
            .map(|c| u64::from(c.timeout_seconds))
            .sum();
        let deadline = Instant::now() + Duration::from_secs(budget) + w.settings.result_slack;
        let mut watcher = w
            .spool
            .watch(&[Kind::Results, Kind::Failed, Kind::Wants])
            .map_err(spool_err)?;
        let failed =
            |error: Error, evidence: Option<Evidence>| Ok(Continue(self.failed(error, evidence)?));
        loop {
            if w.spool.exists(Kind::Wants, rid).map_err(spool_err)? {
                // The source cannot be archived (limits, a missing
                // object, …): a code that fails the attempt does so here;
                // any other is settled by the driver.
                match self.send_source(request) {
                    Err(e) if e.code.fails_attempt() => return failed(e, None),
                    other => other?,
                }
            }
            if w.spool.exists(Kind::Results, rid).map_err(spool_err)? {
                let (result, sha) = match self.read_result(request, None) {
                    Ok(r) => r,
                    Err(e) => return failed(e, None),
                };
                if !result.passed {
                    let error = verification_failure(&result);
                    return failed(error, Some(evidence_of(&result, &self.redactor())));
                }
                let passed = VerificationPassedPayload {
                    request_id: rid.to_owned(),
                    exec_result_sha256: sha.clone(),
                    changed: result.changed_files.len() as u64,
                };
                let _ = self.result.set((result, sha));
                return Ok(Continue(Payload::VerificationPassed(passed)));
            }
            if w.spool.exists(Kind::Failed, rid).map_err(spool_err)? {
                let expect = Expect::owned_by(w.settings.executor_uid, 64 * 1024);
                let bytes = w
                    .spool
                    .read(Kind::Failed, rid, &expect)
                    .map_err(spool_err)?;
                let failure: ExecFailure = serde_json::from_slice(&bytes)
                    .map_err(|e| Error::with(Code::MESSAGE_INVALID, e.to_string()))?;
                let code = Code::from_name(&failure.code).unwrap_or(Code::INTERNAL);
                return failed(Error::with(code, failure.detail), None);
            }
            if Instant::now() >= deadline {
                let error = Error::with(
                    Code::VERIFICATION_FAILED,
                    "the executor produced no result in time",
                );
                return failed(error, None);
            }
            if w.stopping.load(Ordering::SeqCst) {
                return Err(Error::with(Code::WORKER_STOPPING, "worker stopping"));
            }
            if let Some(code) = self.lease.lost() {
                return Err(Error::with(
                    code,
                    "lease lost while waiting for the executor",
                ));
            }
            let wait = deadline
                .saturating_duration_since(Instant::now())
                .min(Duration::from_secs(1));
            // Any wake-up (a publication, an overflow, the timeout) leads to
            // the same re-check of the directories above.
            watcher.wait(wait).map_err(spool_err)?;
            w.progress.beat();
        }
    }

    /// Answers the executor's `wants/<rid>.json` (it lacks the request's
    /// tree): checks it names our request and its tree, then publishes at
    /// `sources/<rid>.tar`, once, a delta against the first tree it holds
    /// that the repository knows, else the deterministic archive of the
    /// source commit. The executor accepts either only if what it
    /// assembles hashes to that tree.
    fn send_source(&self, request: &ExecRequest) -> Step<()> {
        let (w, rid) = (self.w, self.rid.as_str());
        if w.spool.exists(Kind::Sources, rid).map_err(spool_err)? {
            return Ok(());
        }
        let expect = Expect::owned_by(w.settings.executor_uid, 64 * 1024);
        let bytes = w.spool.read(Kind::Wants, rid, &expect).map_err(spool_err)?;
        let want: SourceWanted = serde_json::from_slice(&bytes)
            .map_err(|e| Error::with(Code::MESSAGE_INVALID, format!("source request: {e}")))?;
        want.validate_against(request)?;
        let (repo, head) = (self.repo()?, self.env().binding.source_head());
        let limits = &w.settings.archive_limits;
        let mut bytes = Vec::new();
        // The first tree the executor holds that the repository knows:
        // only what differs from it crosses the spool. The request's tree
        // is the head's (read from the repository at workspace_prepared,
        // and the want names it).
        for base in &want.haves {
            if let Some(stats) = repo
                .source_delta(
                    base,
                    &request.source_tree,
                    limits,
                    want.blobs_by_id,
                    &mut bytes,
                )
                .map_err(git_err)?
            {
                self.publish_once(Kind::Sources, &bytes)?;
                tracing::info!(
                    request = %rid, tree = %request.source_tree, base = %base,
                    trees = stats.trees, blobs = stats.blobs, bytes = bytes.len(),
                    "source delta sent"
                );
                return Ok(());
            }
        }
        repo.source_archive(head, limits, &mut bytes)
            .map_err(git_err)?;
        self.publish_once(Kind::Sources, &bytes)?;
        tracing::info!(request = %rid, tree = %request.source_tree, bytes = bytes.len(), "source archive sent");
        Ok(())
    }

    fn publish_once(&self, kind: Kind, bytes: &[u8]) -> Step<()> {
        let w = self.w;
        let mut staged = || {
            #[cfg(feature = "fault-injection")]
            crate::fault::hit(
                w.settings.fault,
                if kind == Kind::Sources {
                    crate::fault::FaultPoint::SourceStaged
                } else {
                    crate::fault::FaultPoint::SpoolStaged
                },
                &self.cb.task_id,
            );
        };
        match w
            .spool
            .publish_observed(kind, &self.rid, bytes, &mut staged)
        {
            Ok(_) => Ok(()),
            Err(airlock_spool::Error::AlreadyPublished { .. }) => {
                let expect = Expect {
                    owner_uid: nix::unistd::getuid().as_raw(),
                    max_bytes: bytes.len() as u64,
                    sha256: Some(sha256_hex(bytes)),
                };
                w.spool
                    .read(kind, &self.rid, &expect)
                    .map(|_| ())
                    .map_err(spool_err)
            }
            Err(e) => Err(spool_err(e)),
        }
    }

    /// Our published request, read once per run (checked against the
    /// digest recorded at workspace_prepared when there is one).
    fn request(&self, sha: Option<&str>) -> Step<&ExecRequest> {
        self.request.get_or_try_init(|| self.load_request(sha))
    }

    fn load_request(&self, sha: Option<&str>) -> Step<ExecRequest> {
        let expect = Expect::owned_by(
            nix::unistd::getuid().as_raw(),
            airlock_proto::limits::MAX_MESSAGE_BYTES as u64,
        );
        let bytes = self
            .w
            .spool
            .read(Kind::Requests, &self.rid, &expect)
            .map_err(spool_err)?;
        let request: ExecRequest = serde_json::from_slice(&bytes)
            .map_err(|e| Error::with(Code::MESSAGE_INVALID, e.to_string()))?;
        if sha.is_some_and(|s| s != request.digest()) {
            return Err(Error::with(
                Code::SPOOL_DIGEST_MISMATCH,
                "our request changed since it was published",
            ));
        }
        Ok(request)
    }

    /// The executor's verified result, read once per run: bound to our
    /// request, exactly the change set's paths, and the digest recorded at
    /// verification_passed.
    pub(super) fn result(&self, sha: &str) -> Step<&ExecResult> {
        let read = || self.read_result(self.request(None)?, Some(sha));
        self.result.get_or_try_init(read).map(|(result, _)| result)
    }

    /// Reads and verifies the executor's result for our request, and its digest.
    fn read_result(&self, request: &ExecRequest, sha: Option<&str>) -> Step<(ExecResult, String)> {
        let expect = Expect::owned_by(
            self.w.settings.executor_uid,
            self.w.settings.max_result_bytes,
        );
        let bytes = self
            .w
            .spool
            .read(Kind::Results, &self.rid, &expect)
            .map_err(spool_err)?;
        let result: ExecResult = serde_json::from_slice(&bytes)
            .map_err(|e| Error::with(Code::MESSAGE_INVALID, format!("result bundle: {e}")))?;
        let digest = result.digest();
        if sha.is_some_and(|s| s != digest) {
            return Err(Error::with(
                Code::SPOOL_DIGEST_MISMATCH,
                "the result changed since it was verified",
            ));
        }
        result.validate_against(request)?;
        result.check_changes_of(self.env())?;
        Ok((result, digest))
    }
}

/// Why a result that did not pass failed: the wall its failed command hit
/// (its job's memory or process limit), else VERIFICATION_FAILED.
fn verification_failure(result: &airlock_proto::bundle::ExecResult) -> Error {
    let hit = result
        .verification
        .iter()
        .rev()
        .find(|c| c.exit_code != Some(0) || c.timed_out)
        .and_then(|c| Some((c.label.as_str(), c.wall.as_ref()?.code()?)));
    match hit {
        Some((label, code)) => Error::with(
            code,
            format!("verification command {label:?} failed at its job's limit"),
        ),
        None => Error::with(Code::VERIFICATION_FAILED, "a verification command failed"),
    }
}

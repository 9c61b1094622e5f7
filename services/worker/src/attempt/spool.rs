//! The exchange with the executor through the spool: publishing the
//! request (claimed → workspace_prepared) and the source archive it asks
//! for, then waiting for its result or failure record and verifying it
//! (workspace_prepared → verification_passed).

use super::lease::Lease;
use super::report::{Evidence, evidence_of};
use super::{Grant, Next, Step, Worker, git_err, spool_err};
use airlock_proto::bundle::{
    EXEC_REQUEST_SCHEMA, ExecFailure, ExecRequest, ExecResult, SourceWanted,
};
use airlock_proto::canonical::sha256_hex;
use airlock_proto::checkpoint::{
    CheckpointBinding, Payload, VerificationPassedPayload, WorkspacePreparedPayload,
};
use airlock_proto::envelope::Envelope;
use airlock_proto::{Code, Error};
use airlock_spool::{Expect, Kind};
use std::collections::BTreeSet;
use std::ops::ControlFlow::{Break, Continue};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

impl Worker {
    /// claimed → workspace_prepared.
    pub(super) fn prepare(&self, cb: &CheckpointBinding, grant: &Grant, rid: &str) -> Next {
        let prepared = self.publish_request(&grant.envelope, grant.attempt, rid)?;
        Ok(Continue(
            self.append(cb, Payload::WorkspacePrepared(prepared))?,
        ))
    }

    /// workspace_prepared → verification_passed, or the attempt's failure.
    pub(super) fn verify(
        &self,
        cb: &CheckpointBinding,
        grant: &Grant,
        rid: &str,
        prepared: &WorkspacePreparedPayload,
        lease: &Lease,
    ) -> Next {
        match self.await_result(&grant.envelope, rid, prepared, lease)? {
            Ok((result, sha)) => {
                let passed = VerificationPassedPayload {
                    request_id: rid.to_owned(),
                    exec_result_sha256: sha,
                    changed: result.changed_files.len() as u64,
                };
                Ok(Continue(
                    self.append(cb, Payload::VerificationPassed(passed))?,
                ))
            }
            Err((error, evidence)) => self.finish_failed(cb, grant, error, evidence).map(Break),
        }
    }

    /// Publishes the request, naming the source by its git tree id (read
    /// from the repository without touching a blob: O(1) whatever its
    /// size). The archive follows only if the executor asks for it
    /// ([`Worker::send_source`]). The request is derived from the envelope
    /// alone, so a replay after a crash publishes the same bytes; an
    /// existing file is accepted only if it is byte-identical.
    fn publish_request(
        &self,
        env: &Envelope,
        attempt: u32,
        rid: &str,
    ) -> Step<WorkspacePreparedPayload> {
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
        self.publish_once(Kind::Requests, rid, &request_bytes, &env.binding.task_id)?;
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
        self.publish_once(Kind::Sources, rid, &archive, &env.binding.task_id)?;
        let _ = std::fs::remove_dir_all(&scratch);
        tracing::info!(request = %rid, tree = %request.source_tree, bytes = archive.len(), "source archive sent");
        Ok(())
    }

    fn publish_once(&self, kind: Kind, rid: &str, bytes: &[u8], task: &str) -> Step<()> {
        let mut staged = || {
            #[cfg(feature = "fault-injection")]
            crate::fault::hit(
                self.settings.fault,
                crate::fault::FaultPoint::SpoolStaged,
                task,
            );
        };
        #[cfg(not(feature = "fault-injection"))]
        let _ = task;
        match self.spool.publish_observed(kind, rid, bytes, &mut staged) {
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
    pub(super) fn read_result(
        &self,
        env: &Envelope,
        rid: &str,
        sha: Option<&str>,
    ) -> Step<ExecResult> {
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
        lease: &Lease,
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
            if let Some(code) = lease.lost() {
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
                    symlink: false,
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
                layer: None,
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

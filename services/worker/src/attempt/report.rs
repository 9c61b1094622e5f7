//! The result: built from what the attempt did, recorded as result_pending
//! with its hash and idempotency key before anything is sent, then
//! submitted (result_pending → result_submitted). Also what a result keeps
//! of the executor's evidence.

use super::{Finish, Grant, Step, Worker};
use crate::bus::is_transient;
use airlock_journal::checkpoint::Checkpoint;
use airlock_proto::Error;
use airlock_proto::bundle::{CommandEvidence, ExecResult, request_id_for};
use airlock_proto::canonical::digest_of;
use airlock_proto::checkpoint::{
    CheckpointBinding, Payload, ResultPendingPayload, ResultSubmittedPayload,
    result_idempotency_key,
};
use airlock_proto::limits::MAX_SUMMARY_TAIL_BYTES;
use airlock_proto::task::{CommandSummary, Isolation, TaskResult, tail_of};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// What a failed result keeps of the executor's: each command's summary
/// and how the commands were isolated.
pub(super) struct Evidence {
    verification: Vec<CommandSummary>,
    isolation: Isolation,
}

pub(super) fn evidence_of(exec: &ExecResult) -> Evidence {
    Evidence {
        verification: summaries(exec.verification.clone()),
        isolation: Isolation::from_report(&exec.confinement),
    }
}

pub(super) fn summaries(evidence: Vec<CommandEvidence>) -> Vec<CommandSummary> {
    evidence
        .into_iter()
        .map(|c| {
            let passed = c.exit_code == Some(0) && !c.timed_out;
            // A failed command keeps the end of its output: the evidence a
            // planner reads to see which test failed. The executor redacted
            // it already; redacting again (idempotent), with the label,
            // keeps a secret's shape out of the journal and the result
            // even from an executor that did not, and the result's hash
            // then binds what the task database stores.
            let tail = |t: &str| {
                (!passed && !t.is_empty()).then(|| {
                    tail_of(&airlock_proto::redact::text(t), MAX_SUMMARY_TAIL_BYTES).to_owned()
                })
            };
            CommandSummary {
                stdout_tail: tail(&c.stdout_tail),
                stderr_tail: tail(&c.stderr_tail),
                label: airlock_proto::redact::text(&c.label).into_owned(),
                exit_code: c.exit_code,
                timed_out: c.timed_out,
                duration_ms: c.duration_ms,
            }
        })
        .collect()
}

impl Worker {
    /// Ends the attempt with a failed result carrying `error`'s code.
    pub(super) fn finish_failed(
        &self,
        cb: &CheckpointBinding,
        grant: &Grant,
        error: Error,
        evidence: Option<Evidence>,
    ) -> Step<Finish> {
        tracing::warn!(task = %cb.task_id, attempt = cb.attempt, "attempt failed: {error}");
        let mut result = TaskResult::failed(&grant.envelope, grant.attempt, error.code);
        if let Some(e) = evidence {
            result = result.with_evidence(e.verification, e.isolation);
        }
        let (_, pending) = self.pending(cb, grant, &result)?;
        self.submit(cb, grant, &pending)
    }

    /// Durably records the result, its hash and its idempotency key before
    /// anything is sent.
    pub(super) fn pending(
        &self,
        cb: &CheckpointBinding,
        grant: &Grant,
        result: &TaskResult,
    ) -> Step<(Checkpoint, ResultPendingPayload)> {
        let pending = ResultPendingPayload {
            idempotency_key: result_idempotency_key(
                &cb.task_id,
                grant.attempt,
                &grant.envelope.execution_digest,
            ),
            result_sha256: digest_of(result)?,
            result: result.clone(),
        };
        let cp = self.append(cb, Payload::ResultPending(Box::new(pending.clone())))?;
        Ok((cp, pending))
    }

    /// Submits a pending result (its hash was checked when its checkpoint
    /// was decoded, or computed just now).
    pub(super) fn submit(
        &self,
        cb: &CheckpointBinding,
        grant: &Grant,
        pending: &ResultPendingPayload,
    ) -> Step<Finish> {
        let key = pending.idempotency_key.as_str();
        let result = &pending.result;
        let mut backoff = Duration::from_millis(200);
        loop {
            match self.bus.submit_result(&grant.lease, key, result) {
                Ok(receipt) => {
                    let replay = receipt.idempotent;
                    #[cfg(feature = "fault-injection")]
                    crate::fault::hit(
                        self.settings.fault,
                        crate::fault::FaultPoint::ResultAccepted,
                        &cb.task_id,
                    );
                    self.append(
                        cb,
                        Payload::ResultSubmitted(ResultSubmittedPayload {
                            idempotency_key: key.to_owned(),
                            result_sha256: pending.result_sha256.clone(),
                            outcome: result.outcome,
                            commit_oid: result.commit_oid.clone(),
                            replay,
                        }),
                    )?;
                    let _ = self.spool.gc(
                        airlock_spool::Side::Worker,
                        nix::unistd::getuid().as_raw(),
                        &airlock_spool::GcPolicy {
                            older_than: None,
                            finished: vec![request_id_for(
                                &cb.task_id,
                                cb.attempt,
                                &cb.execution_digest,
                            )],
                        },
                    );
                    return Ok(Finish::Submitted {
                        outcome: result.outcome,
                        commit_oid: result.commit_oid.clone(),
                    });
                }
                Err(e) if is_transient(e.code) && !self.stopping.load(Ordering::SeqCst) => {
                    tracing::warn!(task = %cb.task_id, "result submission failed, retrying with the same key: {e}");
                    self.progress.beat();
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                Err(e) if is_transient(e.code) => return Err(e),
                // A refusal (lease lost, conflicting result) is not retried.
                Err(e) => return self.reconcile(cb, e.code, &e.to_string()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn evidence(exit_code: i32, label: &str, tail: &str) -> CommandEvidence {
        CommandEvidence {
            label: label.to_owned(),
            argv_sha256: "0".repeat(64),
            exit_code: Some(exit_code),
            signal: None,
            timed_out: false,
            duration_ms: 1,
            cpu_ms: 1,
            peak_rss_kib: 1,
            stdout_sha256: "0".repeat(64),
            stderr_sha256: "0".repeat(64),
            stdout_tail: tail.to_owned(),
            stderr_tail: tail.to_owned(),
        }
    }

    #[test]
    fn a_summary_keeps_no_secret_shape_even_from_an_executor_that_left_one() {
        for (kind, secret) in airlock_proto::redact::planted() {
            let s = summaries(vec![evidence(
                1,
                &format!("run {secret}"),
                &format!("FAIL {secret}\n"),
            )]);
            let marker = format!("[REDACTED:{kind}]");
            let kept = [s[0].stdout_tail.as_deref(), s[0].stderr_tail.as_deref()];
            for t in kept {
                let t = t.expect("a failed command keeps its tails");
                assert!(t.starts_with("FAIL ") && t.contains(&marker), "{kind}: {t}");
            }
            assert!(s[0].label.contains(&marker), "{kind}: {}", s[0].label);
        }
        // A passing command keeps no tail at all.
        let s = summaries(vec![evidence(0, "ok", "all good\n")]);
        assert_eq!(
            (s[0].stdout_tail.as_deref(), s[0].stderr_tail.as_deref()),
            (None, None)
        );
    }
}

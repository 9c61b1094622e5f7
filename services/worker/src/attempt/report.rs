//! The result: built from what the attempt did, recorded as result_pending
//! with its hash and idempotency key before anything is sent, then
//! submitted (result_pending → result_submitted). Also what a result keeps
//! of the executor's evidence.

use super::{Next, Run, Step};
use crate::bus::is_transient;
use airlock_proto::Error;
use airlock_proto::bundle::{CommandEvidence, ExecResult, request_id_for};
use airlock_proto::checkpoint::{Payload, ResultPendingPayload, ResultSubmittedPayload};
use airlock_proto::limits::MAX_SUMMARY_TAIL_BYTES;
use airlock_proto::redact::Redactor;
use airlock_proto::task::{CommandSummary, Isolation, TaskResult, tail_of};
use std::ops::ControlFlow::Continue;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// What a failed result keeps of the executor's: each command's summary
/// and how the commands were isolated.
pub(super) struct Evidence {
    verification: Vec<CommandSummary>,
    isolation: Isolation,
}

pub(super) fn evidence_of(exec: &ExecResult, redactor: &Redactor) -> Evidence {
    Evidence {
        verification: summaries(exec.verification.clone(), redactor),
        isolation: Isolation::from_report(&exec.confinement),
    }
}

/// Each command's summary, its kept tails and label passed through
/// `redactor` ([`Run::redactor`]: the attempt's own values known).
pub(super) fn summaries(
    evidence: Vec<CommandEvidence>,
    redactor: &Redactor,
) -> Vec<CommandSummary> {
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
                (!passed && !t.is_empty())
                    .then(|| tail_of(&redactor.text(t), MAX_SUMMARY_TAIL_BYTES).to_owned())
            };
            CommandSummary {
                stdout_tail: tail(&c.stdout_tail),
                stderr_tail: tail(&c.stderr_tail),
                wall: c.wall.clone(),
                label: redactor.text(&c.label).into_owned(),
                exit_code: c.exit_code,
                timed_out: c.timed_out,
                duration_ms: c.duration_ms,
            }
        })
        .collect()
}

impl Run<'_> {
    /// The redactor of what this attempt keeps of the executor's output:
    /// every shape, but never the values airlock made for the attempt
    /// (the task and job ids, its branch and ref, the commits, the
    /// envelope's digest, the request's id).
    pub(super) fn redactor(&self) -> Redactor {
        let env = self.env();
        Redactor::new()
            .with_binding(&env.binding, &env.execution_digest)
            .with_known(&self.rid)
    }

    /// The failed result carrying `error`'s code, as a pending result.
    pub(super) fn failed(&self, error: Error, evidence: Option<Evidence>) -> Step<Payload> {
        tracing::warn!(task = %self.cb.task_id, attempt = self.cb.attempt, "attempt failed: {error}");
        let mut result = TaskResult::failed(self.env(), self.grant.attempt, error.code);
        if let Some(e) = evidence {
            result = result.with_evidence(e.verification, e.isolation);
        }
        pending(result)
    }

    /// result_pending → result_submitted: the pending result submitted (its
    /// hash was checked when its checkpoint was decoded) under the
    /// attempt's key, tried again with that key while the supervisor is
    /// unreachable. A refusal (lease lost, conflicting result) is not
    /// retried: it needs reconciliation.
    pub(super) fn submit(&self, pending: &ResultPendingPayload) -> Next {
        let (w, cb) = (self.w, &self.cb);
        let key = pending.idempotency_key.as_str();
        let result = &pending.result;
        let mut backoff = Duration::from_millis(200);
        loop {
            match w.bus.submit_result(&self.grant.lease, key, result) {
                Ok(receipt) => {
                    #[cfg(feature = "fault-injection")]
                    crate::fault::hit(
                        w.settings.fault,
                        crate::fault::FaultPoint::ResultAccepted,
                        &cb.task_id,
                    );
                    let finished = vec![request_id_for(
                        &cb.task_id,
                        cb.attempt,
                        &cb.execution_digest,
                    )];
                    let policy = airlock_spool::GcPolicy {
                        older_than: None,
                        finished,
                    };
                    let me = nix::unistd::getuid().as_raw();
                    let _ = w.spool.gc(airlock_spool::Side::Worker, me, &policy);
                    return Ok(Continue(Payload::ResultSubmitted(ResultSubmittedPayload {
                        idempotency_key: key.to_owned(),
                        result_sha256: pending.result_sha256.clone(),
                        outcome: result.outcome,
                        commit_oid: result.commit_oid.clone(),
                        replay: receipt.idempotent,
                    })));
                }
                Err(e) if is_transient(e.code) && !w.stopping.load(Ordering::SeqCst) => {
                    tracing::warn!(task = %cb.task_id, "result submission failed, retrying with the same key: {e}");
                    w.progress.beat();
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                Err(e) if is_transient(e.code) => return Err(e),
                Err(e) => return Ok(Continue(self.reconciliation(e.code, &e.to_string()))),
            }
        }
    }
}

/// `result` as the attempt's pending result: its hash and idempotency key
/// recorded before anything is sent.
pub(super) fn pending(result: TaskResult) -> Step<Payload> {
    Ok(Payload::ResultPending(Box::new(ResultPendingPayload::of(
        result,
    )?)))
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
            wall: None,
        }
    }

    #[test]
    fn a_summary_keeps_no_secret_shape_even_from_an_executor_that_left_one() {
        for (kind, secret) in airlock_proto::redact::planted() {
            let s = summaries(
                vec![evidence(
                    1,
                    &format!("run {secret}"),
                    &format!("FAIL {secret}\n"),
                )],
                &Redactor::new(),
            );
            let marker = format!("[REDACTED:{kind}]");
            let kept = [s[0].stdout_tail.as_deref(), s[0].stderr_tail.as_deref()];
            for t in kept {
                let t = t.expect("a failed command keeps its tails");
                assert!(t.starts_with("FAIL ") && t.contains(&marker), "{kind}: {t}");
            }
            assert!(s[0].label.contains(&marker), "{kind}: {}", s[0].label);
        }
        // The attempt's own values stay (issue 41 item 6); a secret beside
        // them does not, and without them the task's ref was eaten.
        let task = "p-0a1b2c3d4e5f6071";
        let line = format!(
            "ok {task}:refs/heads/agent/{task}\nSIGNING_SEED=Zq8vN3kP0wR7tY2uB5xM9cL4jH6gF1dS\n"
        );
        let known = Redactor::new().with_task(task, &format!("agent/{task}"));
        let s = summaries(vec![evidence(1, "push", &line)], &known);
        let t = s[0].stdout_tail.as_deref().unwrap();
        assert!(
            t.starts_with(&format!("ok {task}:refs/heads/agent/{task}\n")),
            "{t}"
        );
        assert!(t.contains("SIGNING_SEED=[REDACTED:high-entropy]"), "{t}");
        let s = summaries(vec![evidence(1, "push", &line)], &Redactor::new());
        let t = s[0].stdout_tail.as_deref().unwrap();
        assert!(!t.contains(&format!("refs/heads/agent/{task}")), "{t}");
        // A passing command keeps no tail at all.
        let s = summaries(vec![evidence(0, "ok", "all good\n")], &Redactor::new());
        assert_eq!(
            (s[0].stdout_tail.as_deref(), s[0].stderr_tail.as_deref()),
            (None, None)
        );
    }
}

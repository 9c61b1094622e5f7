//! Source capture: an earlier attempt's capture reused (claimed →
//! source_capture_done), the executor's capture checked against the plan
//! (verification_passed → source_capture_done), and the captured result
//! (source_capture_done → result_pending).

use super::report::pending;
use super::{Next, Run, Step};
use airlock_proto::bundle::ExecResult;
use airlock_proto::checkpoint::{
    Payload, Phase, SourceCaptureDonePayload, VerificationPassedPayload,
};
use airlock_proto::envelope::{Action, Envelope};
use airlock_proto::task::{Capture, CapturedFile, Isolation, TaskResult};
use airlock_proto::{Code, Error};
use std::collections::BTreeSet;
use std::ops::ControlFlow::Continue;

impl Run<'_> {
    /// claimed → source_capture_done, when an earlier attempt of the
    /// identical execution and binding captured already (its capture is
    /// this one's); else claimed → workspace_prepared.
    pub(super) fn reuse_capture_or_prepare(&self) -> Next {
        let Some(done) = self.reusable_capture()? else {
            return self.prepare();
        };
        tracing::info!(task = %self.cb.task_id, attempt = self.cb.attempt, "reusing the capture of attempt {}", done.capture.captured_in_attempt);
        Ok(Continue(Payload::SourceCaptureDone(Box::new(done))))
    }

    /// verification_passed → source_capture_done, or the attempt's failure:
    /// the capture the executor returned (its result, verified again by the
    /// digest recorded at verification_passed), whose captured files and
    /// withheld paths must be exactly the plan's capture paths.
    pub(super) fn capture(&self, passed: &VerificationPassedPayload) -> Next {
        let (env, sha) = (self.env(), passed.exec_result_sha256.as_str());
        let captured = (|| -> Step<SourceCaptureDonePayload> {
            let exec = self.result(sha)?;
            check_captured_files(env, exec)?;
            let capture = Capture {
                source_tree: exec.source_tree.clone(),
                captured_in_attempt: self.grant.attempt,
                source_signals: env.source_signals.clone(),
                files: exec
                    .captured_files
                    .iter()
                    .map(|f| CapturedFile {
                        path: f.path.clone(),
                        present: !f.deleted,
                        sha256: f.sha256.clone(),
                        executable: f.executable,
                        content_b64: f.content_b64.clone(),
                        symlink: f.symlink,
                    })
                    .collect(),
                withheld: exec.withheld_paths.clone(),
            };
            capture.validate()?;
            Ok(SourceCaptureDonePayload {
                request_id: self.rid.clone(),
                exec_result_sha256: sha.to_owned(),
                capture,
                isolation: Isolation::from_report(&exec.confinement),
            })
        })();
        match captured {
            Ok(done) => Ok(Continue(Payload::SourceCaptureDone(Box::new(done)))),
            Err(e) if e.code.fails_attempt() => Ok(Continue(self.failed(e, None)?)),
            Err(e) => Err(e),
        }
    }

    /// source_capture_done → result_pending: the captured result.
    pub(super) fn report_capture(&self, done: SourceCaptureDonePayload) -> Next {
        let env = self.env();
        if env.action != Action::SourceCapture {
            let why = "source capture in a deterministic attempt";
            return Ok(Continue(
                self.reconciliation(Code::EXECUTION_ACTION_UNSUPPORTED, why),
            ));
        }
        let result = TaskResult::captured(
            env,
            self.grant.attempt,
            done.exec_result_sha256,
            done.capture,
            done.isolation,
        );
        Ok(Continue(pending(result)?))
    }

    /// The capture of an earlier attempt this one may report as its own:
    /// the latest `source_capture_done` of an earlier attempt whose binding
    /// has the identical scope (execution digest and every coordinate but
    /// the attempt; seed 001's verify_latest_binding). Another execution
    /// digest (a replaced plan) or any other coordinate means a capture
    /// afresh.
    fn reusable_capture(&self) -> Step<Option<SourceCaptureDonePayload>> {
        let cb = &self.cb;
        let scope = cb.scope_sha256();
        let history = self.w.with_journal(|j| j.history(&cb.task_id))?;
        let Some(earlier) = history.iter().rev().find(|c| {
            c.attempt < cb.attempt
                && c.phase == Phase::SourceCaptureDone
                && c.binding.scope_sha256() == scope
        }) else {
            return Ok(None);
        };
        match earlier.decode()? {
            Payload::SourceCaptureDone(done) => Ok(Some(*done)),
            _ => Err(Error::new(Code::INTERNAL)),
        }
    }
}

/// A capture returns exactly the plan's capture paths, each once: captured,
/// or withheld because it is credential-like (a path the policy would let
/// through is never withheld, and nothing the plan did not name is
/// returned).
fn check_captured_files(env: &Envelope, result: &ExecResult) -> Step<()> {
    let expected: BTreeSet<&str> = env.capture_paths.iter().map(String::as_str).collect();
    let mut got = BTreeSet::new();
    let returned = result
        .captured_files
        .iter()
        .map(|f| f.path.as_str())
        .chain(result.withheld_paths.iter().map(String::as_str));
    let mut count = 0;
    for p in returned {
        got.insert(p);
        count += 1;
    }
    if expected != got || count != got.len() || !result.changed_files.is_empty() {
        return Err(Error::with(
            Code::CHANGED_PATHS_MISMATCH,
            "captured and withheld files are not exactly the capture's paths",
        ));
    }
    if let Some(p) = result
        .withheld_paths
        .iter()
        .find(|p| !airlock_proto::path::is_credential_path(p))
    {
        return Err(Error::with(
            Code::CHANGED_PATHS_MISMATCH,
            format!("{p}: withheld, but not a credential-like path"),
        ));
    }
    Ok(())
}

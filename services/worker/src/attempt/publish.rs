//! The publication: commit_done → published, when the repository's
//! upstream publishes. The agent branch goes to the upstream by an atomic
//! push leased on the value the task expects there (absent for
//! CREATE_NEW, the recorded head for CONTINUE_EXISTING). A replay — the
//! push done, its checkpoint lost to a crash — finds the upstream already
//! at the commit and records that, sending nothing. A branch elsewhere
//! upstream is never forced: it is a reconciliation case
//! (UPSTREAM_BRANCH_MOVED). An unreachable upstream is transient and the
//! step is tried again with backoff while the lease holds.

use super::fence::hold_for;
use super::{Next, Run, git_err};
use airlock_proto::binding::BranchMode;
use airlock_proto::bus::FenceStep;
use airlock_proto::checkpoint::{CommitDonePayload, Payload, PublishedPayload};
use airlock_proto::task::Publication;
use airlock_proto::upstream::{UpstreamEvent, UpstreamReport};
use airlock_proto::{Code, Error};
use std::ops::ControlFlow::Continue;

impl Run<'_> {
    /// Whether the task's repository publishes to an upstream.
    pub(super) fn publishes(&self) -> bool {
        let upstream = self.registration.as_ref().and_then(|r| r.upstream.as_ref());
        upstream.is_some_and(|u| u.publish)
    }

    /// commit_done → published, or a reconciliation case.
    pub(super) fn publish(&self, done: CommitDonePayload) -> Next {
        let (w, b) = (self.w, &self.env().binding);
        let up = w
            .upstream_of(&b.repository)?
            .ok_or_else(|| Error::with(Code::UPSTREAM_NOT_CONFIGURED, b.repository.clone()))?;
        // A local-path upstream is written directly (no receive-pack to
        // take push options): none are sent, none recorded.
        let options = match up.scheme {
            airlock_proto::upstream::Scheme::Local => Vec::new(),
            _ => self
                .registration
                .as_ref()
                .and_then(|r| r.upstream.as_ref())
                .map(|u| u.push_options.clone())
                .unwrap_or_default(),
        };
        let expected = match b.branch_mode {
            BranchMode::CreateNew => None,
            BranchMode::ContinueExisting => Some(b.expected_branch_oid.as_str()),
        };
        let repo = self.repo()?;
        #[cfg(feature = "fault-injection")]
        crate::fault::hit(
            w.settings.fault,
            crate::fault::FaultPoint::BeforePush,
            &b.task_id,
        );
        // The push happens only under a fence, as the local ref move does.
        let pushed = self.fenced(
            FenceStep::Push,
            &done.commit_oid,
            hold_for(up.timeout),
            || Ok(repo.publish_to(&up, &b.target_branch, &done.commit_oid, expected, &options)),
        )?;
        let answer = match pushed {
            Ok(a) => a,
            Err(e) if e.code() == Code::UPSTREAM_BRANCH_MOVED => {
                let observed = repo.upstream_head(&up, &b.target_branch).ok().flatten();
                let why = e.to_string();
                return Ok(Continue(self.upstream_moved(
                    &done.commit_oid,
                    observed.as_deref(),
                    &why,
                )));
            }
            Err(e) => {
                let e = git_err(e);
                if e.code.transient() {
                    tracing::warn!(task = %b.task_id, "publication pending, the upstream is unreachable: {e}");
                    let key = format!("{}/{}", b.task_id, self.grant.attempt);
                    if w.first_pending(&key) {
                        w.report_upstream(&UpstreamReport {
                            repository: b.repository.clone(),
                            event: UpstreamEvent::PublicationPending,
                            task_id: Some(b.task_id.clone()),
                            detail: serde_json::json!({
                                "attempt": self.grant.attempt,
                                "code": e.code.as_str(),
                                "detail": e.to_string(),
                            }),
                        });
                    }
                }
                return Err(e);
            }
        };
        tracing::info!(task = %b.task_id, commit = %done.commit_oid, remote_ref = %answer.remote_ref, pushed = answer.pushed, "published");
        #[cfg(feature = "fault-injection")]
        crate::fault::hit(
            w.settings.fault,
            crate::fault::FaultPoint::AfterPush,
            &b.task_id,
        );
        Ok(Continue(Payload::Published(PublishedPayload {
            commit_oid: done.commit_oid.clone(),
            exec_result_sha256: done.exec_result_sha256,
            publication: Publication {
                url: up.url.clone(),
                remote_ref: answer.remote_ref,
                commit_oid: done.commit_oid,
                pushed: answer.pushed,
                answer: answer.answer,
                push_options: options,
            },
        })))
    }

    /// The publication recorded (published, just appended or found on a
    /// resumed attempt) is reported to the supervisor: at least once, so a
    /// crash between the checkpoint and the report repeats the event
    /// rather than losing it.
    pub(super) fn report_published(&self, published: &PublishedPayload) {
        self.w.report_upstream(&UpstreamReport {
            repository: self.env().binding.repository.clone(),
            event: UpstreamEvent::Published,
            task_id: Some(self.cb.task_id.clone()),
            detail: serde_json::to_value(&published.publication).unwrap_or_default(),
        });
    }
}

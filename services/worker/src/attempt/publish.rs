//! The publication: commit_done → published, when the repository's
//! upstream publishes. The agent branch goes to the upstream by an atomic
//! push leased on the value the task expects there (absent for
//! CREATE_NEW, the recorded head for CONTINUE_EXISTING). A replay — the
//! push done, its checkpoint lost to a crash — finds the upstream already
//! at the commit and records that, sending nothing. A branch elsewhere
//! upstream is never forced: it is a reconciliation case
//! (UPSTREAM_BRANCH_MOVED). An unreachable upstream is transient and the
//! step is tried again with backoff while the lease holds.

use super::{Grant, Next, Worker, git_err};
use airlock_proto::binding::BranchMode;
use airlock_proto::checkpoint::{CheckpointBinding, CommitDonePayload, Payload, PublishedPayload};
use airlock_proto::task::Publication;
use airlock_proto::upstream::{UpstreamEvent, UpstreamReport};
use airlock_proto::{Code, Error};
use std::ops::ControlFlow::{Break, Continue};

impl Worker {
    /// Whether `repository` publishes to an upstream.
    pub(super) fn publishes(&self, repository: &str) -> bool {
        self.repository(repository)
            .and_then(|r| r.upstream)
            .is_some_and(|u| u.publish)
    }

    /// commit_done → published, or a reconciliation case.
    pub(super) fn publish(
        &self,
        cb: &CheckpointBinding,
        grant: &Grant,
        rid: &str,
        done: CommitDonePayload,
    ) -> Next {
        let env = &grant.envelope;
        let b = &env.binding;
        let up = self
            .upstream_of(&b.repository)?
            .ok_or_else(|| Error::with(Code::UPSTREAM_NOT_CONFIGURED, b.repository.clone()))?;
        // A local-path upstream is written directly (no receive-pack to
        // take push options): none are sent, none recorded.
        let options = match up.scheme {
            airlock_proto::upstream::Scheme::Local => Vec::new(),
            _ => self
                .repository(&b.repository)
                .and_then(|r| r.upstream)
                .map(|u| u.push_options)
                .unwrap_or_default(),
        };
        let expected = match b.branch_mode {
            BranchMode::CreateNew => None,
            BranchMode::ContinueExisting => Some(b.expected_branch_oid.as_str()),
        };
        let scratch = self.scratch(rid)?;
        let repo = self.repo(env, &scratch)?;
        #[cfg(feature = "fault-injection")]
        crate::fault::hit(
            self.settings.fault,
            crate::fault::FaultPoint::BeforePush,
            &b.task_id,
        );
        let answer = repo.publish_to(&up, &b.target_branch, &done.commit_oid, expected, &options);
        let answer = match answer {
            Ok(a) => a,
            Err(e) if e.code() == Code::UPSTREAM_BRANCH_MOVED => {
                let observed = repo.upstream_head(&up, &b.target_branch).ok().flatten();
                let _ = std::fs::remove_dir_all(&scratch);
                let detail = e.to_string();
                return self
                    .upstream_moved(cb, grant, &done.commit_oid, observed.as_deref(), &detail)
                    .map(Break);
            }
            Err(e) => {
                let e = git_err(e);
                if e.code.transient() {
                    tracing::warn!(task = %b.task_id, "publication pending, the upstream is unreachable: {e}");
                    let key = format!("{}/{}", b.task_id, grant.attempt);
                    if self.first_pending(&key) {
                        self.report_upstream(&UpstreamReport {
                            repository: b.repository.clone(),
                            event: UpstreamEvent::PublicationPending,
                            task_id: Some(b.task_id.clone()),
                            detail: serde_json::json!({
                                "attempt": grant.attempt,
                                "code": e.code.as_str(),
                                "detail": e.to_string(),
                            }),
                        });
                    }
                }
                return Err(e);
            }
        };
        let _ = std::fs::remove_dir_all(&scratch);
        tracing::info!(task = %b.task_id, commit = %done.commit_oid, remote_ref = %answer.remote_ref, pushed = answer.pushed, "published");
        #[cfg(feature = "fault-injection")]
        crate::fault::hit(
            self.settings.fault,
            crate::fault::FaultPoint::AfterPush,
            &b.task_id,
        );
        let published = PublishedPayload {
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
        };
        let appended = self.append(cb, Payload::Published(published.clone()))?;
        self.report_upstream(&UpstreamReport {
            repository: b.repository.clone(),
            event: UpstreamEvent::Published,
            task_id: Some(b.task_id.clone()),
            detail: serde_json::to_value(&published.publication).unwrap_or_default(),
        });
        Ok(Continue(appended))
    }
}

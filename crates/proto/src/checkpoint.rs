//! Checkpoint phases and the binding a checkpoint is tied to.

use crate::canonical::digest_of;
use crate::envelope::Envelope;
use crate::error::{Code, Error, Result};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// A phase of one attempt in the worker. Phases are monotonic within an
/// attempt; `ReconciliationRequired` may be recorded at any point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// The task was claimed; nothing done yet.
    Claimed,
    /// Source archive and request are in the spool.
    WorkspacePrepared,
    /// The executor's result was verified against the request.
    VerificationPassed,
    /// Read-only capture finished (source_capture).
    SourceCaptureDone,
    /// The governed commit exists and the ref points at it.
    CommitDone,
    /// A state the worker cannot settle alone; needs an explicit recovery.
    ReconciliationRequired,
    /// The result, its hash and its idempotency key are recorded; not yet submitted.
    ResultPending,
    /// The supervisor accepted the result.
    ResultSubmitted,
}

impl Phase {
    /// Every phase, in order.
    pub const ALL: &'static [Phase] = &[
        Phase::Claimed,
        Phase::WorkspacePrepared,
        Phase::VerificationPassed,
        Phase::SourceCaptureDone,
        Phase::CommitDone,
        Phase::ReconciliationRequired,
        Phase::ResultPending,
        Phase::ResultSubmitted,
    ];

    /// Ordering rank; source_capture_done and commit_done share a rank
    /// because an attempt reaches exactly one of them.
    pub const fn order(self) -> u32 {
        match self {
            Phase::Claimed => 10,
            Phase::WorkspacePrepared => 20,
            Phase::VerificationPassed => 30,
            Phase::SourceCaptureDone | Phase::CommitDone => 40,
            Phase::ReconciliationRequired => 45,
            Phase::ResultPending => 50,
            Phase::ResultSubmitted => 60,
        }
    }

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Claimed => "claimed",
            Phase::WorkspacePrepared => "workspace_prepared",
            Phase::VerificationPassed => "verification_passed",
            Phase::SourceCaptureDone => "source_capture_done",
            Phase::CommitDone => "commit_done",
            Phase::ReconciliationRequired => "reconciliation_required",
            Phase::ResultPending => "result_pending",
            Phase::ResultSubmitted => "result_submitted",
        }
    }

    /// Parses a wire name; unknown names are CHECKPOINT_PHASE_INVALID.
    pub fn parse(name: &str) -> Result<Self> {
        Phase::ALL
            .iter()
            .copied()
            .find(|p| p.as_str() == name)
            .ok_or_else(|| Error::with(Code::CHECKPOINT_PHASE_INVALID, name))
    }
}

/// The coordinates a checkpoint is bound to.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointBinding {
    /// The task.
    pub task_id: String,
    /// The attempt.
    pub attempt: u32,
    /// The envelope's digest.
    pub execution_digest: String,
    /// The job.
    pub job_id: String,
    /// The repository.
    pub repository: String,
    /// The base commit.
    pub base_oid: String,
    /// The branch's expected value.
    pub expected_branch_oid: String,
    /// The agent/ branch.
    pub target_branch: String,
    /// The binding generation.
    pub generation: u32,
}

impl CheckpointBinding {
    /// The checkpoint binding of `attempt` of an envelope.
    pub fn of(envelope: &Envelope, attempt: u32) -> Self {
        let b = &envelope.binding;
        CheckpointBinding {
            task_id: b.task_id.clone(),
            attempt,
            execution_digest: envelope.execution_digest.clone(),
            job_id: b.job_id.clone(),
            repository: b.repository.clone(),
            base_oid: b.base_oid.clone(),
            expected_branch_oid: b.expected_branch_oid.clone(),
            target_branch: b.target_branch.clone(),
            generation: b.generation,
        }
    }

    /// SHA-256 of every coordinate, attempt included.
    pub fn binding_sha256(&self) -> String {
        digest_of(self).expect("a checkpoint binding is always canonical")
    }

    /// SHA-256 of the scope: every coordinate but the attempt. Two
    /// attempts of one task share a scope exactly when nothing but the
    /// attempt changed.
    pub fn scope_sha256(&self) -> String {
        digest_of(&json!({
            "task_id": self.task_id,
            "execution_digest": self.execution_digest,
            "job_id": self.job_id,
            "repository": self.repository,
            "base_oid": self.base_oid,
            "expected_branch_oid": self.expected_branch_oid,
            "target_branch": self.target_branch,
            "generation": self.generation,
        }))
        .expect("a checkpoint scope is always canonical")
    }
}

/// The result-submission idempotency key of an attempt: it includes the
/// attempt and the execution digest, so the same attempt reuses the same
/// key after a crash and a later attempt can never collide with it.
pub fn result_idempotency_key(task_id: &str, attempt: u32, execution_digest: &str) -> String {
    let tag = crate::canonical::sha256_hex(
        format!("{task_id}\0{attempt}\0{execution_digest}").as_bytes(),
    );
    format!("a{attempt}-result-{}", &tag[..40])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_round_trip_and_order() {
        for p in Phase::ALL {
            assert_eq!(Phase::parse(p.as_str()).unwrap(), *p);
        }
        assert_eq!(
            Phase::parse("done").unwrap_err().code,
            Code::CHECKPOINT_PHASE_INVALID
        );
        assert!(Phase::Claimed.order() < Phase::WorkspacePrepared.order());
        assert_eq!(Phase::CommitDone.order(), Phase::SourceCaptureDone.order());
        assert!(Phase::ResultPending.order() < Phase::ResultSubmitted.order());
    }

    #[test]
    fn result_keys_are_attempt_aware_and_stable() {
        let d = "d".repeat(64);
        let one = result_idempotency_key("task-p1-a", 1, &d);
        let two = result_idempotency_key("task-p1-a", 2, &d);
        assert_ne!(one, two);
        assert!(one.starts_with("a1-result-") && two.starts_with("a2-result-"));
        assert_eq!(one, result_idempotency_key("task-p1-a", 1, &d));
        assert_ne!(one, result_idempotency_key("task-p1-a", 1, &"e".repeat(64)));
        assert!(crate::binding::is_key(&one));
    }
}

//! Checkpoint phases and the binding a checkpoint is tied to.

use crate::canonical::digest_of;
use crate::envelope::Envelope;
use crate::error::{Code, Error, Result};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

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
    /// The agent branch is on the upstream at the governed commit.
    Published,
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
        Phase::Published,
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
            Phase::Published => 42,
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
            Phase::Published => "published",
            Phase::ReconciliationRequired => "reconciliation_required",
            Phase::ResultPending => "result_pending",
            Phase::ResultSubmitted => "result_submitted",
        }
    }

    /// What reaching the phase means, for docs/states.md.
    pub fn meaning(self) -> &'static str {
        match self {
            Phase::Claimed => {
                "the task was claimed under a lease; the envelope is kept for a restart"
            }
            Phase::WorkspacePrepared => {
                "the request is in the spool, naming the source commit's tree"
            }
            Phase::VerificationPassed => {
                "the executor's result passed and was verified against the request"
            }
            Phase::SourceCaptureDone => {
                "a source capture finished (or an earlier attempt's capture of the identical execution and binding is reused); the capture is in the payload"
            }
            Phase::CommitDone => "the governed commit exists and the branch points at it",
            Phase::Published => {
                "the upstream's agent branch is at the governed commit (pushed now, or found there on a replay); the upstream's answer is in the payload"
            }
            Phase::ReconciliationRequired => {
                "the worker cannot settle the attempt alone (recorded at any point; the branch's observed head when it moved)"
            }
            Phase::ResultPending => {
                "the result, its hash and its idempotency key are durable; not yet submitted"
            }
            Phase::ResultSubmitted => "the supervisor accepted the result",
        }
    }

    /// The fields of the phase's payload ([`Payload`]), every one required.
    pub fn payload_fields(self) -> &'static [&'static str] {
        match self {
            Phase::Claimed => &["lease_epoch", "lease_token", "request_id"],
            Phase::WorkspacePrepared => &["request_id", "request_sha256", "source_tree"],
            Phase::VerificationPassed => &["changed", "exec_result_sha256", "request_id"],
            Phase::SourceCaptureDone => {
                &["capture", "exec_result_sha256", "isolation", "request_id"]
            }
            Phase::CommitDone => &["commit_oid", "exec_result_sha256"],
            Phase::Published => &["commit_oid", "exec_result_sha256", "publication"],
            Phase::ReconciliationRequired => &["code", "commit_oid", "detail", "observed_head"],
            Phase::ResultPending => &["idempotency_key", "result", "result_sha256"],
            Phase::ResultSubmitted => &[
                "commit_oid",
                "idempotency_key",
                "outcome",
                "replay",
                "result_sha256",
            ],
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

/// The payload a checkpoint phase records: one type per phase, written
/// and read only through these types. Every field is required (a missing
/// one is a decode error, never a default), unknown fields are refused,
/// and [`Payload::decode`] checks each digest, object id and key for its
/// form, so a damaged journal row is `STORE_CORRUPT` instead of an empty
/// string the worker would act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Payload {
    /// `claimed`.
    Claimed(ClaimedPayload),
    /// `workspace_prepared`.
    WorkspacePrepared(WorkspacePreparedPayload),
    /// `verification_passed`.
    VerificationPassed(VerificationPassedPayload),
    /// `source_capture_done`.
    SourceCaptureDone(Box<SourceCaptureDonePayload>),
    /// `commit_done`.
    CommitDone(CommitDonePayload),
    /// `published`.
    Published(PublishedPayload),
    /// `reconciliation_required`.
    ReconciliationRequired(ReconciliationPayload),
    /// `result_pending`.
    ResultPending(Box<ResultPendingPayload>),
    /// `result_submitted`.
    ResultSubmitted(ResultSubmittedPayload),
}

/// `claimed`: the lease the claim granted, so a restarted worker can
/// resume the attempt under it, and the spool request id of the attempt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimedPayload {
    /// The lease's fencing epoch.
    pub lease_epoch: u64,
    /// The lease's bearer token.
    pub lease_token: String,
    /// The attempt's spool request id.
    pub request_id: String,
}

/// `workspace_prepared`: the request is in the spool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspacePreparedPayload {
    /// The spool request id.
    pub request_id: String,
    /// SHA-256 of the published request.
    pub request_sha256: String,
    /// The git tree id of the source the request names.
    pub source_tree: String,
}

/// `verification_passed`: the executor's result passed and was verified
/// against the request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerificationPassedPayload {
    /// The spool request id.
    pub request_id: String,
    /// SHA-256 of the executor's result bundle.
    pub exec_result_sha256: String,
    /// How many changed files the result carries.
    pub changed: u64,
}

/// `source_capture_done`: a capture finished; the payload holds all a
/// later attempt of the identical binding needs to report it again
/// without capturing anew (the captured files, their isolation evidence).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceCaptureDonePayload {
    /// The spool request id of the attempt that captured.
    pub request_id: String,
    /// SHA-256 of the executor's result bundle.
    pub exec_result_sha256: String,
    /// What was captured, and in which attempt.
    pub capture: crate::task::Capture,
    /// The executor's isolation evidence of that request.
    pub isolation: crate::task::Isolation,
}

/// `commit_done`: the governed commit exists and the branch points at it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommitDonePayload {
    /// The governed commit.
    pub commit_oid: String,
    /// SHA-256 of the executor's result bundle it was made from.
    pub exec_result_sha256: String,
}

/// `published`: the governed commit is on the upstream's agent branch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishedPayload {
    /// The governed commit.
    pub commit_oid: String,
    /// SHA-256 of the executor's result bundle it was made from.
    pub exec_result_sha256: String,
    /// What the upstream answered.
    pub publication: crate::task::Publication,
}

/// `reconciliation_required`: why the worker cannot settle the attempt
/// alone. `commit_oid` and `observed_head` are recorded (possibly null)
/// by every writer of this release; the previous release wrote only
/// `code` and `detail` when no commit was involved, which
/// [`Payload::decode`] still reads (both then `None`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReconciliationPayload {
    /// The catalogue code.
    #[serde(with = "code_name")]
    pub code: Code,
    /// What happened, for the log and an administrator.
    pub detail: String,
    /// The attempt's commit, when it made one.
    #[serde(deserialize_with = "present")]
    pub commit_oid: Option<String>,
    /// The branch head observed instead of that commit (`None`: the
    /// branch is gone, or no commit was involved).
    #[serde(deserialize_with = "present")]
    pub observed_head: Option<String>,
}

/// `result_pending`: the result, its hash and its idempotency key, durable
/// before anything is sent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResultPendingPayload {
    /// The attempt's result key ([`result_idempotency_key`]).
    pub idempotency_key: String,
    /// SHA-256 of `result` in canonical JSON.
    pub result_sha256: String,
    /// The result to submit.
    pub result: crate::task::TaskResult,
}

impl ResultPendingPayload {
    /// `result` as its attempt's pending result: the attempt's result key
    /// and the result's digest.
    pub fn of(result: crate::task::TaskResult) -> crate::error::Result<Self> {
        Ok(ResultPendingPayload {
            idempotency_key: result_idempotency_key(
                &result.task_id,
                result.attempt,
                &result.execution_digest,
            ),
            result_sha256: crate::canonical::digest_of(&result)?,
            result,
        })
    }
}

/// `result_submitted`: the supervisor accepted the result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResultSubmittedPayload {
    /// The key it was submitted under.
    pub idempotency_key: String,
    /// Its SHA-256.
    pub result_sha256: String,
    /// Its outcome.
    pub outcome: crate::task::Outcome,
    /// Its commit, if any (recorded as null when none).
    #[serde(deserialize_with = "present")]
    pub commit_oid: Option<String>,
    /// True when the supervisor answered it as an identical replay.
    pub replay: bool,
}

/// The previous release's `reconciliation_required` payload without a
/// commit: `code` and `detail` only.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LegacyReconciliation {
    #[serde(with = "code_name")]
    code: Code,
    detail: String,
}

/// An `Option` field that must be present (null for `None`): with
/// `deserialize_with`, serde reports a missing field instead of `None`.
fn present<'de, D, T>(d: D) -> std::result::Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d)
}

/// A catalogue code as its name; an unknown name is a decode error.
mod code_name {
    use crate::error::Code;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(code: &Code, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(code.as_str())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Code, D::Error> {
        let name = String::deserialize(d)?;
        Code::from_name(&name)
            .ok_or_else(|| serde::de::Error::custom(format!("{name:?} is not a catalogue code")))
    }
}

impl Payload {
    /// The phase this payload belongs to.
    pub fn phase(&self) -> Phase {
        match self {
            Payload::Claimed(_) => Phase::Claimed,
            Payload::WorkspacePrepared(_) => Phase::WorkspacePrepared,
            Payload::VerificationPassed(_) => Phase::VerificationPassed,
            Payload::SourceCaptureDone(_) => Phase::SourceCaptureDone,
            Payload::CommitDone(_) => Phase::CommitDone,
            Payload::Published(_) => Phase::Published,
            Payload::ReconciliationRequired(_) => Phase::ReconciliationRequired,
            Payload::ResultPending(_) => Phase::ResultPending,
            Payload::ResultSubmitted(_) => Phase::ResultSubmitted,
        }
    }

    /// The payload as the JSON object the journal stores.
    pub fn to_value(&self) -> Value {
        let v = match self {
            Payload::Claimed(p) => serde_json::to_value(p),
            Payload::WorkspacePrepared(p) => serde_json::to_value(p),
            Payload::VerificationPassed(p) => serde_json::to_value(p),
            Payload::SourceCaptureDone(p) => serde_json::to_value(p),
            Payload::CommitDone(p) => serde_json::to_value(p),
            Payload::Published(p) => serde_json::to_value(p),
            Payload::ReconciliationRequired(p) => serde_json::to_value(p),
            Payload::ResultPending(p) => serde_json::to_value(p),
            Payload::ResultSubmitted(p) => serde_json::to_value(p),
        };
        v.expect("checkpoint payloads always serialise")
    }

    /// Reads the payload a journal row of `phase` holds. Any missing or
    /// unknown field, wrong type, or malformed digest, object id or key is
    /// `STORE_CORRUPT`: the journal was damaged, or written by something
    /// other than this worker.
    pub fn decode(phase: Phase, value: &Value) -> Result<Payload> {
        fn typed<T: serde::de::DeserializeOwned>(phase: Phase, value: &Value) -> Result<T> {
            T::deserialize(value).map_err(|e| corrupt(phase, &e.to_string()))
        }
        let payload = match phase {
            Phase::Claimed => Payload::Claimed(typed(phase, value)?),
            Phase::WorkspacePrepared => Payload::WorkspacePrepared(typed(phase, value)?),
            Phase::VerificationPassed => Payload::VerificationPassed(typed(phase, value)?),
            Phase::SourceCaptureDone => Payload::SourceCaptureDone(typed(phase, value)?),
            Phase::CommitDone => Payload::CommitDone(typed(phase, value)?),
            Phase::Published => Payload::Published(typed(phase, value)?),
            Phase::ReconciliationRequired => {
                Payload::ReconciliationRequired(match ReconciliationPayload::deserialize(value) {
                    Ok(p) => p,
                    Err(new_shape) => match LegacyReconciliation::deserialize(value) {
                        Ok(old) => ReconciliationPayload {
                            code: old.code,
                            detail: old.detail,
                            commit_oid: None,
                            observed_head: None,
                        },
                        Err(_) => return Err(corrupt(phase, &new_shape.to_string())),
                    },
                })
            }
            Phase::ResultPending => Payload::ResultPending(typed(phase, value)?),
            Phase::ResultSubmitted => Payload::ResultSubmitted(typed(phase, value)?),
        };
        payload.check().map_err(|why| corrupt(phase, &why))?;
        Ok(payload)
    }

    /// The forms serde cannot see: digests, object ids, keys, non-empty
    /// names, and a pending result that hashes to its recorded digest.
    fn check(&self) -> std::result::Result<(), String> {
        use crate::binding::is_oid;
        use crate::canonical::is_sha256_hex;
        let sha = |what: &str, s: &str| {
            if is_sha256_hex(s) {
                Ok(())
            } else {
                Err(format!("{what} is not a SHA-256: {s:?}"))
            }
        };
        let oid = |what: &str, s: &str| {
            if is_oid(s) {
                Ok(())
            } else {
                Err(format!("{what} is not an object id: {s:?}"))
            }
        };
        let named = |what: &str, s: &str| {
            if s.is_empty() || s.len() > 512 {
                Err(format!("{what} is empty or too long"))
            } else {
                Ok(())
            }
        };
        match self {
            Payload::Claimed(p) => {
                named("lease_token", &p.lease_token)?;
                named("request_id", &p.request_id)
            }
            Payload::WorkspacePrepared(p) => {
                named("request_id", &p.request_id)?;
                sha("request_sha256", &p.request_sha256)?;
                oid("source_tree", &p.source_tree)
            }
            Payload::VerificationPassed(p) => {
                named("request_id", &p.request_id)?;
                sha("exec_result_sha256", &p.exec_result_sha256)
            }
            Payload::SourceCaptureDone(p) => {
                named("request_id", &p.request_id)?;
                sha("exec_result_sha256", &p.exec_result_sha256)?;
                p.capture.validate().map_err(|e| e.to_string())
            }
            Payload::CommitDone(p) => {
                oid("commit_oid", &p.commit_oid)?;
                sha("exec_result_sha256", &p.exec_result_sha256)
            }
            Payload::Published(p) => {
                oid("commit_oid", &p.commit_oid)?;
                sha("exec_result_sha256", &p.exec_result_sha256)?;
                if p.publication.commit_oid != p.commit_oid {
                    return Err("the publication names another commit".into());
                }
                named("publication.remote_ref", &p.publication.remote_ref)
            }
            Payload::ReconciliationRequired(p) => {
                if let Some(c) = &p.commit_oid {
                    oid("commit_oid", c)?;
                }
                if let Some(h) = &p.observed_head {
                    oid("observed_head", h)?;
                }
                Ok(())
            }
            Payload::ResultPending(p) => {
                if !crate::binding::is_key(&p.idempotency_key) {
                    return Err("idempotency_key is not a key".into());
                }
                sha("result_sha256", &p.result_sha256)?;
                let actual = digest_of(&p.result).map_err(|e| e.to_string())?;
                if actual != p.result_sha256 {
                    return Err("the pending result does not match its hash".into());
                }
                p.result.validate().map_err(|e| e.to_string())
            }
            Payload::ResultSubmitted(p) => {
                if !crate::binding::is_key(&p.idempotency_key) {
                    return Err("idempotency_key is not a key".into());
                }
                sha("result_sha256", &p.result_sha256)?;
                if let Some(c) = &p.commit_oid {
                    oid("commit_oid", c)?;
                }
                Ok(())
            }
        }
    }
}

fn corrupt(phase: Phase, why: &str) -> Error {
    Error::with(
        Code::STORE_CORRUPT,
        format!("{} checkpoint payload: {why}", phase.as_str()),
    )
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

    fn passed_result() -> crate::task::TaskResult {
        crate::task::TaskResult {
            schema: crate::task::RESULT_SCHEMA.into(),
            task_id: "task-p1-a".into(),
            attempt: 1,
            execution_digest: "d".repeat(64),
            outcome: crate::task::Outcome::Passed,
            commit_oid: Some("c".repeat(40)),
            target_branch: "agent/task-p1-a".into(),
            exec_result_sha256: Some("e".repeat(64)),
            failure_code: None,
            verification: vec![],
            isolation: Some(crate::task::Isolation::unmeasured()),
            captured: None,
            reconciliation: None,
            publication: None,
            signature: None,
        }
    }

    /// One payload of every phase, as this release writes them.
    pub(crate) fn one_of_each() -> Vec<Payload> {
        let result = passed_result();
        vec![
            Payload::Claimed(ClaimedPayload {
                lease_epoch: 3,
                lease_token: "t".repeat(43),
                request_id: "r-1".into(),
            }),
            Payload::WorkspacePrepared(WorkspacePreparedPayload {
                request_id: "r-1".into(),
                request_sha256: "a".repeat(64),
                source_tree: "b".repeat(40),
            }),
            Payload::VerificationPassed(VerificationPassedPayload {
                request_id: "r-1".into(),
                exec_result_sha256: "e".repeat(64),
                changed: 2,
            }),
            Payload::SourceCaptureDone(Box::new(SourceCaptureDonePayload {
                request_id: "r-1".into(),
                exec_result_sha256: "e".repeat(64),
                capture: crate::task::Capture {
                    source_tree: "b".repeat(40),
                    captured_in_attempt: 1,
                    withheld: vec![".env".into()],
                    source_signals: vec!["look at main".into()],
                    files: vec![
                        crate::task::CapturedFile {
                            path: "a.txt".into(),
                            present: true,
                            sha256: Some(crate::canonical::sha256_hex(b"A\n")),
                            executable: false,
                            content_b64: Some("QQo=".into()),
                            symlink: false,
                        },
                        crate::task::CapturedFile {
                            path: "gone.txt".into(),
                            present: false,
                            sha256: None,
                            executable: false,
                            content_b64: None,
                            symlink: false,
                        },
                    ],
                },
                isolation: crate::task::Isolation::unmeasured(),
            })),
            Payload::CommitDone(CommitDonePayload {
                commit_oid: "c".repeat(40),
                exec_result_sha256: "e".repeat(64),
            }),
            Payload::Published(PublishedPayload {
                commit_oid: "c".repeat(40),
                exec_result_sha256: "e".repeat(64),
                publication: crate::task::Publication {
                    url: "ssh://git@forge.example/team/r.git".into(),
                    remote_ref: "refs/heads/agent/task-p1-a".into(),
                    commit_oid: "c".repeat(40),
                    pushed: true,
                    answer: "*\tc:refs/heads/agent/task-p1-a\t[new branch]".into(),
                    push_options: vec![],
                },
            }),
            Payload::ReconciliationRequired(ReconciliationPayload {
                code: Code::RECONCILIATION_REQUIRED,
                detail: "moved".into(),
                commit_oid: Some("c".repeat(40)),
                observed_head: None,
            }),
            Payload::ResultPending(Box::new(ResultPendingPayload {
                idempotency_key: result_idempotency_key("task-p1-a", 1, &"d".repeat(64)),
                result_sha256: digest_of(&result).unwrap(),
                result,
            })),
            Payload::ResultSubmitted(ResultSubmittedPayload {
                idempotency_key: result_idempotency_key("task-p1-a", 1, &"d".repeat(64)),
                result_sha256: "f".repeat(64),
                outcome: crate::task::Outcome::Failed,
                commit_oid: None,
                replay: false,
            }),
        ]
    }

    #[test]
    fn every_phase_has_a_payload_that_round_trips() {
        let all = one_of_each();
        for p in &all {
            let keys: Vec<String> = p.to_value().as_object().unwrap().keys().cloned().collect();
            assert_eq!(
                keys,
                p.phase().payload_fields(),
                "the documented fields of {}",
                p.phase().as_str()
            );
        }
        let phases: Vec<Phase> = all.iter().map(Payload::phase).collect();
        assert_eq!(phases, Phase::ALL, "one payload type per phase, in order");
        for p in all {
            let v = p.to_value();
            assert!(v.is_object());
            assert_eq!(Payload::decode(p.phase(), &v).unwrap(), p, "{v}");
        }
    }

    #[test]
    fn a_missing_field_a_wrong_type_or_an_unknown_field_is_store_corrupt() {
        for p in one_of_each() {
            let v = p.to_value();
            let fields: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            for f in &fields {
                let mut missing = v.clone();
                missing.as_object_mut().unwrap().remove(f);
                // The one exception: the previous release's reconciliation
                // payload without a commit (code and detail only).
                let legacy = p.phase() == Phase::ReconciliationRequired
                    && fields.len() == 4
                    && missing.as_object().unwrap().len() == 3
                    && !matches!(f.as_str(), "code" | "detail");
                if legacy {
                    continue;
                }
                let err = Payload::decode(p.phase(), &missing).unwrap_err();
                assert_eq!(
                    err.code,
                    Code::STORE_CORRUPT,
                    "{} without {f}",
                    p.phase().as_str()
                );
                let mut wrong = v.clone();
                wrong[f.as_str()] = json!({"not": "this"});
                let err = Payload::decode(p.phase(), &wrong).unwrap_err();
                assert_eq!(
                    err.code,
                    Code::STORE_CORRUPT,
                    "{} with {f} an object",
                    p.phase().as_str()
                );
            }
            let mut extra = v.clone();
            extra["surprise"] = json!(1);
            assert_eq!(
                Payload::decode(p.phase(), &extra).unwrap_err().code,
                Code::STORE_CORRUPT
            );
            // Another phase's payload is not this one's.
            let other = if p.phase() == Phase::Claimed {
                Phase::CommitDone
            } else {
                Phase::Claimed
            };
            assert_eq!(
                Payload::decode(other, &v).unwrap_err().code,
                Code::STORE_CORRUPT
            );
        }
    }

    #[test]
    fn an_empty_or_malformed_value_is_store_corrupt_not_a_default() {
        let corrupt = |phase: Phase, v: Value| {
            assert_eq!(
                Payload::decode(phase, &v).unwrap_err().code,
                Code::STORE_CORRUPT,
                "{v}"
            )
        };
        corrupt(
            Phase::CommitDone,
            json!({"commit_oid": "", "exec_result_sha256": "e".repeat(64)}),
        );
        corrupt(
            Phase::CommitDone,
            json!({"commit_oid": "c".repeat(40), "exec_result_sha256": "nope"}),
        );
        corrupt(
            Phase::WorkspacePrepared,
            json!({"request_id": "", "request_sha256": "a".repeat(64), "source_tree": "b".repeat(40)}),
        );
        // A publication of another commit than the one it records.
        let Payload::Published(mut p) = one_of_each().remove(5) else {
            unreachable!()
        };
        p.publication.commit_oid = "d".repeat(40);
        corrupt(Phase::Published, Payload::Published(p).to_value());
        corrupt(
            Phase::ReconciliationRequired,
            json!({"code": "NOT_A_CODE", "detail": "x"}),
        );
        corrupt(
            Phase::ResultSubmitted,
            json!({"idempotency_key": "a1-result-0000000000", "result_sha256": "f".repeat(64), "outcome": "passed", "replay": false}),
        );
        // A pending result that no longer hashes to its recorded digest.
        let Payload::ResultPending(mut p) = one_of_each().remove(7) else {
            unreachable!()
        };
        p.result.attempt = 2;
        corrupt(Phase::ResultPending, Payload::ResultPending(p).to_value());
    }

    #[test]
    fn the_previous_releases_payloads_still_decode() {
        // Exactly what the 4.0 worker wrote (its json! literals), so an
        // attempt in flight across an upgrade resumes.
        let key = result_idempotency_key("task-p1-a", 1, &"d".repeat(64));
        let result = serde_json::to_value(passed_result()).unwrap();
        let old = [
            (
                Phase::Claimed,
                json!({"lease_epoch": 1, "lease_token": "t".repeat(43), "request_id": "r-1"}),
            ),
            (
                Phase::WorkspacePrepared,
                json!({"request_id": "r-1", "request_sha256": "a".repeat(64), "source_tree": "b".repeat(40)}),
            ),
            (
                Phase::VerificationPassed,
                json!({"request_id": "r-1", "exec_result_sha256": "e".repeat(64), "changed": 1}),
            ),
            (
                Phase::CommitDone,
                json!({"commit_oid": "c".repeat(40), "exec_result_sha256": "e".repeat(64)}),
            ),
            (
                Phase::ResultPending,
                json!({"idempotency_key": key, "result_sha256": digest_of(&result).unwrap(), "result": result}),
            ),
            (
                Phase::ResultSubmitted,
                json!({"idempotency_key": key, "result_sha256": "f".repeat(64), "outcome": "passed", "commit_oid": "c".repeat(40), "replay": false}),
            ),
            (
                Phase::ResultSubmitted,
                json!({"idempotency_key": key, "result_sha256": "f".repeat(64), "outcome": "failed", "commit_oid": null, "replay": true}),
            ),
            (
                Phase::ReconciliationRequired,
                json!({"code": "RECONCILIATION_REQUIRED", "detail": "d", "commit_oid": "c".repeat(40), "observed_head": null}),
            ),
            (
                Phase::ReconciliationRequired,
                json!({"code": "LEASE_EXPIRED", "detail": "lease lost"}),
            ),
            (
                Phase::ReconciliationRequired,
                json!({"code": "INTERNAL", "detail": "no claimed checkpoint with a lease"}),
            ),
        ];
        for (phase, v) in old {
            let p = Payload::decode(phase, &v).unwrap_or_else(|e| panic!("{v}: {e}"));
            assert_eq!(p.phase(), phase);
        }
        let Payload::ReconciliationRequired(r) = Payload::decode(
            Phase::ReconciliationRequired,
            &json!({"code": "LEASE_EXPIRED", "detail": "lease lost"}),
        )
        .unwrap() else {
            unreachable!()
        };
        assert_eq!(
            (r.code, r.commit_oid, r.observed_head),
            (Code::LEASE_EXPIRED, None, None)
        );
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

//! A worker's result for one attempt: its constructors, one per outcome,
//! and the checks the supervisor runs on it.

use super::{Capture, ClaimGrant, CommandSummary, Isolation, Outcome, RESULT_SCHEMA, TaskResult};
use crate::canonical::is_sha256_hex;
use crate::envelope::Envelope;
use crate::error::{Code, Error, Result};

impl CommandSummary {
    /// True when the command exited 0 within its time.
    pub fn passed(&self) -> bool {
        self.exit_code == Some(0) && !self.timed_out
    }
}

/// The last at most `max` bytes of `text`, cut at a character boundary.
pub fn tail_of(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

impl TaskResult {
    fn of(
        task_id: &str,
        attempt: u32,
        execution_digest: &str,
        target_branch: &str,
        outcome: Outcome,
    ) -> Self {
        TaskResult {
            schema: RESULT_SCHEMA.into(),
            task_id: task_id.to_owned(),
            attempt,
            execution_digest: execution_digest.to_owned(),
            outcome,
            commit_oid: None,
            target_branch: target_branch.to_owned(),
            exec_result_sha256: None,
            failure_code: None,
            verification: vec![],
            isolation: None,
            captured: None,
            reconciliation: None,
            publication: None,
            signature: None,
        }
    }

    fn of_envelope(envelope: &Envelope, attempt: u32, outcome: Outcome) -> Self {
        let b = &envelope.binding;
        Self::of(
            &b.task_id,
            attempt,
            &envelope.execution_digest,
            &b.target_branch,
            outcome,
        )
    }

    /// `attempt` passed: the governed commit on the branch, the digest of
    /// the executor's result it was made from, and that result's evidence.
    pub fn passed(
        envelope: &Envelope,
        attempt: u32,
        commit_oid: String,
        exec_result_sha256: String,
        verification: Vec<CommandSummary>,
        isolation: Isolation,
    ) -> Self {
        TaskResult {
            commit_oid: Some(commit_oid),
            exec_result_sha256: Some(exec_result_sha256),
            verification,
            isolation: Some(isolation),
            ..Self::of_envelope(envelope, attempt, Outcome::Passed)
        }
    }

    /// `attempt` captured: what its source capture returned.
    pub fn captured(
        envelope: &Envelope,
        attempt: u32,
        exec_result_sha256: String,
        capture: Capture,
        isolation: Isolation,
    ) -> Self {
        TaskResult {
            exec_result_sha256: Some(exec_result_sha256),
            captured: Some(capture),
            isolation: Some(isolation),
            ..Self::of_envelope(envelope, attempt, Outcome::Captured)
        }
    }

    /// `attempt` failed with `code`; [`TaskResult::with_evidence`] adds
    /// what its commands left.
    pub fn failed(envelope: &Envelope, attempt: u32, code: Code) -> Self {
        Self::of_envelope(envelope, attempt, Outcome::Failed).failing_with(code)
    }

    /// The failed result of a claim whose envelope the worker refuses
    /// (`code`), derived from the claim alone; `None` when the envelope
    /// names no execution digest or target branch.
    pub fn refused_claim(claim: &ClaimGrant, code: Code) -> Option<Self> {
        let digest = claim.envelope["execution_digest"].as_str()?;
        let branch = claim.envelope["target_branch"].as_str()?;
        let result = Self::of(
            &claim.task_id,
            claim.attempt,
            digest,
            branch,
            Outcome::Failed,
        );
        Some(result.failing_with(code))
    }

    /// `attempt` failed with `RECONCILIATION_REQUIRED`, carrying what the
    /// worker saw of the branch.
    pub fn reconciliation_required(
        envelope: &Envelope,
        attempt: u32,
        facts: crate::reconcile::BranchFacts,
    ) -> Self {
        TaskResult {
            reconciliation: Some(facts),
            publication: None,
            signature: None,
            ..Self::failed(envelope, attempt, Code::RECONCILIATION_REQUIRED)
        }
    }

    /// This result with its commands' summaries and how they were isolated.
    pub fn with_evidence(self, verification: Vec<CommandSummary>, isolation: Isolation) -> Self {
        TaskResult {
            verification,
            isolation: Some(isolation),
            ..self
        }
    }

    fn failing_with(self, code: Code) -> Self {
        TaskResult {
            failure_code: Some(code.as_str().to_owned()),
            ..self
        }
    }

    /// Structural checks the supervisor applies before storing a result.
    pub fn validate(&self) -> Result<()> {
        let bad = |why: &str| Err(Error::with(Code::MESSAGE_INVALID, why.to_owned()));
        if self.schema != RESULT_SCHEMA {
            return Err(Error::new(Code::SCHEMA_INVALID));
        }
        if !is_sha256_hex(&self.execution_digest) {
            return bad("execution_digest");
        }
        if let Some(oid) = &self.commit_oid {
            if !crate::binding::is_oid(oid) {
                return bad("commit_oid");
            }
        }
        if (self.outcome == Outcome::Passed) != self.commit_oid.is_some() {
            return bad("a passed result carries a commit, and only it");
        }
        if (self.outcome == Outcome::Failed) != self.failure_code.is_some() {
            return bad("a failed result carries a failure code, and only it");
        }
        if (self.outcome == Outcome::Captured) != self.captured.is_some() {
            return bad("a captured result carries its capture, and only it");
        }
        if let Some(c) = &self.captured {
            c.validate()?;
        }
        if let Some(code) = &self.failure_code {
            if Code::from_name(code).is_none() {
                return bad("failure_code is not a catalogue code");
            }
        }
        let reconciling =
            self.failure_code.as_deref() == Some(Code::RECONCILIATION_REQUIRED.as_str());
        match &self.reconciliation {
            Some(facts) if reconciling => facts.validate()?,
            None if !reconciling => {}
            _ => {
                return bad(
                    "a RECONCILIATION_REQUIRED result carries what the worker saw of the branch, and only it",
                );
            }
        }
        if self
            .exec_result_sha256
            .as_deref()
            .is_some_and(|s| !is_sha256_hex(s))
        {
            return bad("exec_result_sha256");
        }
        if self.verification.len() > crate::limits::MAX_COMMANDS {
            return Err(Error::new(Code::FIELD_BOUNDS_EXCEEDED));
        }
        match (&self.isolation, self.outcome) {
            (None, Outcome::Passed | Outcome::Captured) => {
                return bad("a passed or captured result carries its isolation evidence");
            }
            (Some(i), _) => i.validate()?,
            (None, Outcome::Failed) => {}
        }
        for c in &self.verification {
            let tails = [&c.stdout_tail, &c.stderr_tail];
            if tails.iter().any(|t| t.is_some()) && c.passed() {
                return bad("only a failed command carries output tails");
            }
            if tails
                .iter()
                .flat_map(|t| t.as_deref())
                .any(|t| t.len() > crate::limits::MAX_SUMMARY_TAIL_BYTES)
            {
                return Err(Error::with(Code::FIELD_BOUNDS_EXCEEDED, "output tail"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binding::Binding;
    use crate::task::isolation::tests::confined;
    use serde_json::json;

    fn envelope() -> Envelope {
        let base = "a".repeat(40);
        let binding = Binding::from_value(&json!({
            "task_id": "task-a", "job_id": "job-a", "repository": "demo", "base_oid": base,
            "expected_branch_oid": base, "target_branch": "agent/task-a", "branch_mode": "CREATE_NEW",
            "generation": 1, "idempotency_key": "key-task-a",
        }))
        .unwrap();
        let request = crate::envelope::ExecutionRequest::from_value(&json!({
            "action": "deterministic",
            "change_set": [{"operation": "write_file", "path": "a.txt", "content": "a\n"}],
        }))
        .unwrap();
        Envelope::project(&binding, &request).unwrap()
    }

    #[test]
    fn each_outcomes_constructor_builds_a_valid_result() {
        let env = envelope();
        let passed =
            TaskResult::passed(&env, 2, "c".repeat(40), "e".repeat(64), vec![], confined());
        let capture = Capture {
            source_tree: "f".repeat(40),
            captured_in_attempt: 1,
            source_signals: vec![],
            files: vec![],
            withheld: vec![],
        };
        let captured = TaskResult::captured(&env, 2, "e".repeat(64), capture, confined());
        let failed = TaskResult::failed(&env, 2, Code::VERIFICATION_FAILED);
        assert_eq!(failed.failure_code.as_deref(), Some("VERIFICATION_FAILED"));
        let with_evidence = failed.clone().with_evidence(vec![], confined());
        let facts = crate::reconcile::BranchFacts {
            commit_oid: "c".repeat(40),
            observed_head: None,
        };
        let reconciling = TaskResult::reconciliation_required(&env, 2, facts);
        let claim = ClaimGrant {
            task_id: "task-a".into(),
            attempt: 2,
            lease_epoch: 1,
            lease_token: "t".repeat(43),
            lease_expires_at_ms: 0,
            envelope: env.to_value(),
        };
        let refused =
            TaskResult::refused_claim(&claim, Code::EXECUTION_ACTION_UNSUPPORTED).unwrap();
        for r in [
            passed,
            captured,
            failed,
            with_evidence,
            reconciling,
            refused,
        ] {
            assert!(r.validate().is_ok(), "{r:?}");
            assert_eq!(r.schema, RESULT_SCHEMA);
            assert_eq!((r.task_id.as_str(), r.attempt), ("task-a", 2));
            assert_eq!(r.execution_digest, env.execution_digest);
            assert_eq!(r.target_branch, "agent/task-a");
        }
        let nameless = ClaimGrant {
            envelope: json!({}),
            ..claim
        };
        assert_eq!(TaskResult::refused_claim(&nameless, Code::INTERNAL), None);
    }

    #[test]
    fn result_validation() {
        let mut r = TaskResult {
            schema: RESULT_SCHEMA.into(),
            task_id: "task-a".into(),
            attempt: 1,
            execution_digest: "d".repeat(64),
            outcome: Outcome::Passed,
            commit_oid: Some("c".repeat(40)),
            target_branch: "agent/x".into(),
            exec_result_sha256: Some("e".repeat(64)),
            failure_code: None,
            verification: vec![],
            reconciliation: None,
            publication: None,
            signature: None,
            isolation: None,
            captured: None,
        };
        assert_eq!(
            r.validate().unwrap_err().code,
            Code::MESSAGE_INVALID,
            "a passed result without isolation evidence"
        );
        r.isolation = Some(confined());
        assert!(r.validate().is_ok());
        r.isolation.as_mut().unwrap().view = "chroot".into();
        assert_eq!(r.validate().unwrap_err().code, Code::MESSAGE_INVALID);
        r.isolation = Some(confined());
        r.commit_oid = None;
        assert!(r.validate().is_err());
        r.outcome = Outcome::Failed;
        r.failure_code = Some("NOT_A_CODE".into());
        assert!(r.validate().is_err());
        r.failure_code = Some("VERIFICATION_FAILED".into());
        assert!(r.validate().is_ok());
        r.failure_code = Some("RECONCILIATION_REQUIRED".into());
        assert!(r.validate().is_err(), "without what the worker saw");
        r.reconciliation = Some(crate::reconcile::BranchFacts {
            commit_oid: "c".repeat(40),
            observed_head: None,
        });
        assert!(r.validate().is_ok());
        r.failure_code = Some("VERIFICATION_FAILED".into());
        assert!(r.validate().is_err(), "facts on another failure");
        r.reconciliation = None;
        let mut failed = CommandSummary {
            label: "tests".into(),
            exit_code: Some(1),
            timed_out: false,
            duration_ms: 5,
            stdout_tail: None,
            stderr_tail: Some("FAIL: test_adds".into()),
            wall: None,
        };
        r.verification = vec![failed.clone()];
        assert!(r.validate().is_ok(), "a failed command keeps its tail");
        let old = serde_json::to_value(&failed).unwrap();
        failed.stderr_tail = Some("x".repeat(crate::limits::MAX_SUMMARY_TAIL_BYTES + 1));
        r.verification = vec![failed.clone()];
        assert_eq!(r.validate().unwrap_err().code, Code::FIELD_BOUNDS_EXCEEDED);
        failed.exit_code = Some(0);
        failed.stderr_tail = Some("ok".into());
        r.verification = vec![failed];
        assert_eq!(r.validate().unwrap_err().code, Code::MESSAGE_INVALID);
        // A summary without tails (an older worker's) still reads.
        let mut older = old;
        older.as_object_mut().unwrap().remove("stderr_tail");
        assert!(serde_json::from_value::<CommandSummary>(older).is_ok());
        assert_eq!(tail_of("aé", 1), "");
        assert_eq!(tail_of("abc", 2), "bc");
        r.verification = vec![];
        let v = serde_json::to_value(&r).unwrap();
        let mut extra = v.clone();
        extra["x"] = json!(1);
        assert!(serde_json::from_value::<TaskResult>(extra).is_err());
    }
}

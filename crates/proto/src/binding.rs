//! The binding: the exact coordinates an execution is bound to.
//!
//! Natural-language fields from a planner never choose coordinates; only a
//! validated [`Binding`] does, and every later message is compared against
//! it coordinate by coordinate, each with its own refusal code.

use crate::canonical::digest_of;
use crate::error::{Code, Error, Result};
use crate::fields::Obj;
use crate::limits::{MAX_ID_LEN, MAX_REPOSITORY_LEN};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Ref prefixes (and exact names) airlock never writes.
pub const PROTECTED_REFS: &[&str] = &[
    "main",
    "master",
    "HEAD",
    "refs/",
    "tags/",
    "tag/",
    "release/",
    "baseline/",
    "production/",
];

/// Every branch airlock writes lives under this prefix.
pub const AGENT_BRANCH_PREFIX: &str = "agent/";

/// How the target branch relates to the base.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BranchMode {
    /// The branch does not exist yet; expected_branch_oid must equal base_oid.
    #[serde(rename = "CREATE_NEW")]
    CreateNew,
    /// The branch exists and is at expected_branch_oid.
    #[serde(rename = "CONTINUE_EXISTING")]
    ContinueExisting,
}

impl BranchMode {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            BranchMode::CreateNew => "CREATE_NEW",
            BranchMode::ContinueExisting => "CONTINUE_EXISTING",
        }
    }
}

/// The validated coordinates of a task's execution.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Binding {
    /// The task's id.
    pub task_id: String,
    /// The job the task belongs to.
    pub job_id: String,
    /// The repository's name as registered in configuration.
    pub repository: String,
    /// The commit the plan was made against.
    pub base_oid: String,
    /// The value the target branch must have when the result is committed.
    pub expected_branch_oid: String,
    /// The `agent/…` branch the result is committed to.
    pub target_branch: String,
    /// Whether the branch is new or continued.
    pub branch_mode: BranchMode,
    /// Increases each time the planner re-plans the same job.
    pub generation: u32,
    /// The task's idempotency key.
    pub idempotency_key: String,
}

/// The field names of a binding, for messages that embed one flat.
pub const BINDING_FIELDS: &[&str] = &[
    "task_id",
    "job_id",
    "repository",
    "base_oid",
    "expected_branch_oid",
    "target_branch",
    "branch_mode",
    "generation",
    "idempotency_key",
];

fn id_shaped(s: &str, min_tail: usize, max_tail: usize) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && (min_tail..=max_tail).contains(&(b.len() - 1))
        && b[1..]
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b':' | b'-'))
}

/// Task and job ids: `[A-Za-z0-9][A-Za-z0-9._:-]{2,179}`.
pub fn is_task_id(s: &str) -> bool {
    id_shaped(s, 2, MAX_ID_LEN - 1)
}

/// Idempotency keys and authorization ids: `[A-Za-z0-9][A-Za-z0-9._:-]{7,159}`.
pub fn is_key(s: &str) -> bool {
    id_shaped(s, 7, 159)
}

/// Repository names: `[A-Za-z0-9][A-Za-z0-9._-]{0,63}`.
pub fn is_repository_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_REPOSITORY_LEN
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

/// A full git object id in lowercase hex (SHA-1 or SHA-256 repositories).
pub fn is_oid(s: &str) -> bool {
    (s.len() == 40 || s.len() == 64) && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// True when `name` (a short branch name or a full ref) is one airlock never writes.
pub fn is_protected_ref(name: &str) -> bool {
    let short = name.strip_prefix("refs/heads/").unwrap_or(name);
    PROTECTED_REFS.iter().any(|p| {
        if p.ends_with('/') {
            short.starts_with(p) || name.starts_with(p) && !name.starts_with("refs/heads/")
        } else {
            short == *p
        }
    })
}

/// Validates an `agent/…` branch name; the checks follow `git check-ref-format`.
pub fn check_target_branch(name: &str) -> Result<()> {
    let Some(tail) = name.strip_prefix(AGENT_BRANCH_PREFIX) else {
        let code = if name.starts_with("refs/") || is_protected_ref(name) {
            Code::PROTECTED_REF_DENY
        } else {
            Code::TARGET_BRANCH_INVALID
        };
        return Err(Error::with(code, format!("{name:?} is not under agent/")));
    };
    let tail_ok = tail.len() >= 3
        && tail.len() <= 180
        && tail.as_bytes()[0].is_ascii_alphanumeric()
        && tail
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'/' | b'-'))
        && !tail.contains("..")
        && !tail.contains("//")
        && !tail.ends_with('/')
        && !tail.ends_with('.')
        && !tail.ends_with(".lock")
        && tail
            .split('/')
            .all(|c| !c.starts_with('.') && !c.ends_with(".lock"));
    if tail_ok {
        Ok(())
    } else {
        Err(Error::with(
            Code::TARGET_BRANCH_INVALID,
            format!("{name:?} is not a valid agent/ branch name"),
        ))
    }
}

impl Binding {
    /// Parses and validates a binding from a JSON object whose other fields
    /// (if any) the caller has already vetted. Checks run in a fixed order,
    /// so one input always yields one code.
    pub fn from_obj(o: &Obj<'_>) -> Result<Self> {
        let task_id = o.str("task_id", Code::TASK_ID_INVALID, MAX_ID_LEN)?;
        if !is_task_id(task_id) {
            return Err(Error::with(Code::TASK_ID_INVALID, task_id));
        }
        let job_id = o.str("job_id", Code::JOB_ID_REQUIRED, 4096)?;
        if !is_task_id(job_id) {
            return Err(Error::with(Code::JOB_ID_INVALID, job_id));
        }
        let repository = o.str("repository", Code::REPOSITORY_INVALID, 4096)?;
        if !is_repository_name(repository) {
            return Err(Error::with(Code::REPOSITORY_INVALID, repository));
        }
        let base_oid = o.str("base_oid", Code::BASE_OID_INVALID, 64)?;
        if !is_oid(base_oid) {
            return Err(Error::new(Code::BASE_OID_INVALID));
        }
        let expected = o.str("expected_branch_oid", Code::EXPECTED_BRANCH_OID_INVALID, 64)?;
        if !is_oid(expected) {
            return Err(Error::new(Code::EXPECTED_BRANCH_OID_INVALID));
        }
        let target_branch = o.str("target_branch", Code::TARGET_BRANCH_INVALID, 4096)?;
        check_target_branch(target_branch)?;
        let mode = o.str("branch_mode", Code::BRANCH_MODE_MISSING, 64)?;
        let branch_mode = match mode {
            "CREATE_NEW" => BranchMode::CreateNew,
            "CONTINUE_EXISTING" => BranchMode::ContinueExisting,
            _ => return Err(Error::with(Code::BRANCH_MODE_INVALID, mode)),
        };
        let generation = o.int(
            "generation",
            Code::GENERATION_INVALID,
            1..=i64::from(u32::MAX),
        )?;
        if branch_mode == BranchMode::CreateNew && expected != base_oid {
            return Err(Error::new(Code::EXPECTED_BASE_CONFLICT));
        }
        let key = o.str("idempotency_key", Code::IDEMPOTENCY_KEY_INVALID, 4096)?;
        if !is_key(key) {
            return Err(Error::new(Code::IDEMPOTENCY_KEY_INVALID));
        }
        Ok(Binding {
            task_id: task_id.to_owned(),
            job_id: job_id.to_owned(),
            repository: repository.to_owned(),
            base_oid: base_oid.to_owned(),
            expected_branch_oid: expected.to_owned(),
            target_branch: target_branch.to_owned(),
            branch_mode,
            generation: generation as u32,
            idempotency_key: key.to_owned(),
        })
    }

    /// Parses a standalone binding object (no other fields allowed).
    pub fn from_value(value: &Value) -> Result<Self> {
        let o = Obj::new(value, "binding", Code::MESSAGE_INVALID)?;
        o.only(BINDING_FIELDS)?;
        Binding::from_obj(&o)
    }

    /// The binding as a JSON object.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("a binding always serialises")
    }

    /// The commit the plan's changes apply to: the branch head when
    /// continuing a branch, the base otherwise.
    pub fn source_head(&self) -> &str {
        match self.branch_mode {
            BranchMode::ContinueExisting => &self.expected_branch_oid,
            BranchMode::CreateNew => &self.base_oid,
        }
    }

    /// Fails when `self` (a candidate, e.g. from an envelope) differs from
    /// `authority` in any coordinate, with that coordinate's own code.
    pub fn check_against(&self, authority: &Binding) -> Result<()> {
        let checks = [
            (
                self.task_id == authority.task_id,
                Code::TASK_BINDING_CONFLICT,
            ),
            (self.job_id == authority.job_id, Code::JOB_BINDING_CONFLICT),
            (
                self.repository == authority.repository,
                Code::WRONG_REPOSITORY_ENVELOPE_DENY,
            ),
            (
                self.base_oid == authority.base_oid,
                Code::WRONG_BASE_ENVELOPE_DENY,
            ),
            (
                self.expected_branch_oid == authority.expected_branch_oid,
                Code::WRONG_EXPECTED_HEAD_ENVELOPE_DENY,
            ),
            (
                self.target_branch == authority.target_branch,
                Code::WRONG_BRANCH_ENVELOPE_DENY,
            ),
            (
                self.generation == authority.generation,
                Code::WRONG_GENERATION_ENVELOPE_DENY,
            ),
            (
                self.branch_mode == authority.branch_mode,
                Code::BRANCH_MODE_BINDING_CONFLICT,
            ),
            (
                self.idempotency_key == authority.idempotency_key,
                Code::IDEMPOTENCY_BINDING_CONFLICT,
            ),
        ];
        match checks.into_iter().find(|(ok, _)| !ok) {
            Some((_, code)) => Err(Error::new(code)),
            None => Ok(()),
        }
    }

    /// Fails with REPOSITORY_NOT_REGISTERED unless `registered` knows the repository.
    pub fn check_registered<'a>(
        &self,
        mut registered: impl Iterator<Item = &'a str>,
    ) -> Result<()> {
        if registered.any(|r| r == self.repository) {
            Ok(())
        } else {
            Err(Error::with(
                Code::REPOSITORY_NOT_REGISTERED,
                self.repository.clone(),
            ))
        }
    }

    /// SHA-256 of the canonical binding.
    pub fn digest(&self) -> String {
        digest_of(self).expect("a binding is always canonical")
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    pub const BASE: &str = "a642b045775b9154a00ae78543037fbef4fb447b";
    pub const HEAD: &str = "71523aef6e48b1e2fa516c456ca189b7a039104b";

    pub fn binding_json() -> Value {
        json!({
            "task_id": "task-plan-a", "job_id": "job-plan-a", "repository": "demo",
            "base_oid": BASE, "expected_branch_oid": HEAD, "target_branch": "agent/task-plan-a",
            "branch_mode": "CONTINUE_EXISTING", "generation": 1, "idempotency_key": "governed-plan-a",
        })
    }

    fn code_of(edit: impl FnOnce(&mut serde_json::Map<String, Value>)) -> Code {
        let mut v = binding_json();
        edit(v.as_object_mut().unwrap());
        Binding::from_value(&v).unwrap_err().code
    }

    #[test]
    fn valid_binding_parses_and_round_trips() {
        let b = Binding::from_value(&binding_json()).unwrap();
        assert_eq!(b.source_head(), HEAD);
        assert_eq!(Binding::from_value(&b.to_value()).unwrap(), b);
        assert_eq!(b.digest().len(), 64);
    }

    #[test]
    fn each_bad_coordinate_has_its_own_code() {
        assert_eq!(
            code_of(|m| {
                m.remove("task_id");
            }),
            Code::TASK_ID_INVALID
        );
        assert_eq!(
            code_of(|m| {
                m.insert("task_id".into(), json!("-bad"));
            }),
            Code::TASK_ID_INVALID
        );
        assert_eq!(
            code_of(|m| {
                m.remove("job_id");
            }),
            Code::JOB_ID_REQUIRED
        );
        assert_eq!(
            code_of(|m| {
                m.insert("job_id".into(), json!("j"));
            }),
            Code::JOB_ID_INVALID
        );
        assert_eq!(
            code_of(|m| {
                m.insert("repository".into(), json!("../x"));
            }),
            Code::REPOSITORY_INVALID
        );
        assert_eq!(
            code_of(|m| {
                m.insert("base_oid".into(), json!("abc"));
            }),
            Code::BASE_OID_INVALID
        );
        assert_eq!(
            code_of(|m| {
                m.insert("base_oid".into(), json!(BASE.to_uppercase()));
            }),
            Code::BASE_OID_INVALID
        );
        assert_eq!(
            code_of(|m| {
                m.insert("expected_branch_oid".into(), json!(1));
            }),
            Code::EXPECTED_BRANCH_OID_INVALID
        );
        assert_eq!(
            code_of(|m| {
                m.insert("target_branch".into(), json!("feature/x"));
            }),
            Code::TARGET_BRANCH_INVALID
        );
        assert_eq!(
            code_of(|m| {
                m.insert("target_branch".into(), json!("agent/a..b"));
            }),
            Code::TARGET_BRANCH_INVALID
        );
        assert_eq!(
            code_of(|m| {
                m.insert("target_branch".into(), json!("agent/x.lock"));
            }),
            Code::TARGET_BRANCH_INVALID
        );
        assert_eq!(
            code_of(|m| {
                m.remove("branch_mode");
            }),
            Code::BRANCH_MODE_MISSING
        );
        assert_eq!(
            code_of(|m| {
                m.insert("branch_mode".into(), json!("FORCE"));
            }),
            Code::BRANCH_MODE_INVALID
        );
        assert_eq!(
            code_of(|m| {
                m.insert("generation".into(), json!(0));
            }),
            Code::GENERATION_INVALID
        );
        assert_eq!(
            code_of(|m| {
                m.insert("generation".into(), json!(true));
            }),
            Code::GENERATION_INVALID
        );
        assert_eq!(
            code_of(|m| {
                m.insert("idempotency_key".into(), json!("short"));
            }),
            Code::IDEMPOTENCY_KEY_INVALID
        );
        assert_eq!(
            code_of(|m| {
                m.insert("extra".into(), json!(1));
            }),
            Code::MESSAGE_INVALID
        );
    }

    #[test]
    fn protected_refs_are_refused_with_their_own_code() {
        for name in [
            "main",
            "master",
            "refs/heads/agent/x",
            "tags/v1",
            "release/1.0",
            "production/x",
            "HEAD",
        ] {
            assert_eq!(
                code_of(|m| {
                    m.insert("target_branch".into(), json!(name));
                }),
                Code::PROTECTED_REF_DENY,
                "{name}"
            );
        }
        assert!(is_protected_ref("refs/heads/main"));
        assert!(is_protected_ref("refs/tags/v1"));
        assert!(!is_protected_ref("refs/heads/agent/x"));
        assert!(!is_protected_ref("agent/main"));
    }

    #[test]
    fn create_new_requires_expected_equal_to_base() {
        assert_eq!(
            code_of(|m| {
                m.insert("branch_mode".into(), json!("CREATE_NEW"));
            }),
            Code::EXPECTED_BASE_CONFLICT
        );
        let mut v = binding_json();
        v["branch_mode"] = json!("CREATE_NEW");
        v["expected_branch_oid"] = json!(BASE);
        let b = Binding::from_value(&v).unwrap();
        assert_eq!(b.source_head(), BASE);
    }

    #[test]
    fn comparison_names_the_conflicting_coordinate() {
        let authority = Binding::from_value(&binding_json()).unwrap();
        let cases: Vec<(&str, Value, Code)> = vec![
            ("task_id", json!("task-other"), Code::TASK_BINDING_CONFLICT),
            ("job_id", json!("job-other"), Code::JOB_BINDING_CONFLICT),
            (
                "repository",
                json!("other"),
                Code::WRONG_REPOSITORY_ENVELOPE_DENY,
            ),
            (
                "base_oid",
                json!("b".repeat(40)),
                Code::WRONG_BASE_ENVELOPE_DENY,
            ),
            (
                "expected_branch_oid",
                json!("c".repeat(40)),
                Code::WRONG_EXPECTED_HEAD_ENVELOPE_DENY,
            ),
            (
                "target_branch",
                json!("agent/other"),
                Code::WRONG_BRANCH_ENVELOPE_DENY,
            ),
            ("generation", json!(2), Code::WRONG_GENERATION_ENVELOPE_DENY),
            (
                "idempotency_key",
                json!("other-key-1"),
                Code::IDEMPOTENCY_BINDING_CONFLICT,
            ),
        ];
        for (field, value, code) in cases {
            let mut v = binding_json();
            v[field] = value;
            let candidate = Binding::from_value(&v).unwrap();
            assert_eq!(
                candidate.check_against(&authority).unwrap_err().code,
                code,
                "{field}"
            );
        }
        let mut v = binding_json();
        v["branch_mode"] = json!("CREATE_NEW");
        v["expected_branch_oid"] = json!(HEAD);
        v["base_oid"] = json!(HEAD);
        // base differs first, so the base code wins: one input, one code.
        let candidate = Binding::from_value(&v).unwrap();
        assert_eq!(
            candidate.check_against(&authority).unwrap_err().code,
            Code::WRONG_BASE_ENVELOPE_DENY
        );
        assert!(authority.check_against(&authority).is_ok());
        assert_eq!(
            authority
                .check_registered(["x"].into_iter())
                .unwrap_err()
                .code,
            Code::REPOSITORY_NOT_REGISTERED
        );
        assert!(
            authority
                .check_registered(["x", "demo"].into_iter())
                .is_ok()
        );
    }
}

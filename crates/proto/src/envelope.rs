//! The execution envelope: a binding plus exactly what to do, bound by a
//! digest of its canonical JSON.
//!
//! The supervisor *projects* an envelope from a binding and a planner's
//! [`ExecutionRequest`]; the worker and the executor *validate* it again
//! against the binding they hold, before any handler runs.

use crate::binding::{BINDING_FIELDS, Binding, is_key};
use crate::canonical::{digest_of, is_sha256_hex, sha256_hex};
use crate::error::{Code, Error, Result};
use crate::fields::Obj;
use crate::limits::*;
use crate::path::check_relative_path;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// Schema tag of every execution envelope.
pub const EXECUTION_SCHEMA: &str = "airlock.execution.v1";

/// What the executor is asked to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Apply a change set to a copy of the source and run the verification commands.
    Deterministic,
    /// Read-only: return the requested files to the planner.
    SourceCapture,
}

impl Action {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Deterministic => "deterministic",
            Action::SourceCapture => "source_capture",
        }
    }

    fn parse(s: &str) -> Result<Self> {
        match s {
            "deterministic" => Ok(Action::Deterministic),
            "source_capture" => Ok(Action::SourceCapture),
            other => Err(Error::with(Code::EXECUTION_ACTION_UNSUPPORTED, other)),
        }
    }

    /// Only deterministic executions hold a writer lease and produce a commit.
    pub fn mutates(self) -> bool {
        self == Action::Deterministic
    }
}

/// One change to the source tree.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "operation", rename_all = "snake_case")]
pub enum Change {
    /// Create or overwrite a file with `content`.
    WriteFile {
        /// Repository-relative path.
        path: String,
        /// The new content (UTF-8 text).
        content: String,
        /// When present, the file must currently have this SHA-256.
        #[serde(skip_serializing_if = "Option::is_none")]
        expected_sha256: Option<String>,
    },
    /// Replace exactly `count` occurrences of `old` with `new`.
    ReplaceText {
        /// Repository-relative path.
        path: String,
        /// Text to find; never empty.
        old: String,
        /// Replacement text.
        new: String,
        /// Exact number of occurrences that must be present.
        count: u32,
        /// When present, the file must currently have this SHA-256.
        #[serde(skip_serializing_if = "Option::is_none")]
        expected_sha256: Option<String>,
    },
    /// Create a symbolic link, or retarget one (replacing a file or a
    /// link at `path`). The target must stay inside the tree: relative,
    /// and, resolved lexically from the link's directory, never above the
    /// root nor through `.git` ([`check_symlink_target`]).
    WriteSymlink {
        /// Repository-relative path of the link.
        path: String,
        /// The link's target, as `ln -s` takes it.
        target: String,
        /// When present, what is at `path` now (a file's content, a
        /// link's target) must have this SHA-256.
        #[serde(skip_serializing_if = "Option::is_none")]
        expected_sha256: Option<String>,
    },
    /// Delete a file or a symbolic link (never what the link points to).
    DeleteFile {
        /// Repository-relative path.
        path: String,
        /// When present, the file must currently have this SHA-256.
        #[serde(skip_serializing_if = "Option::is_none")]
        expected_sha256: Option<String>,
    },
}

impl Change {
    /// The path the change touches.
    pub fn path(&self) -> &str {
        match self {
            Change::WriteFile { path, .. }
            | Change::ReplaceText { path, .. }
            | Change::WriteSymlink { path, .. }
            | Change::DeleteFile { path, .. } => path,
        }
    }

    /// The drift guard, if any.
    pub fn expected_sha256(&self) -> Option<&str> {
        match self {
            Change::WriteFile {
                expected_sha256, ..
            }
            | Change::ReplaceText {
                expected_sha256, ..
            }
            | Change::WriteSymlink {
                expected_sha256, ..
            }
            | Change::DeleteFile {
                expected_sha256, ..
            } => expected_sha256.as_deref(),
        }
    }

    fn payload_bytes(&self) -> usize {
        match self {
            Change::WriteFile { content, .. } => content.len(),
            Change::ReplaceText { old, new, .. } => old.len() + new.len(),
            Change::WriteSymlink { target, .. } => target.len(),
            Change::DeleteFile { .. } => 0,
        }
    }

    /// Parses one change strictly.
    pub fn from_value(value: &Value) -> Result<Self> {
        let o = Obj::new(value, "change", Code::CHANGE_SET_INVALID)?;
        let op = o.str("operation", Code::CHANGE_OPERATION_INVALID, 64)?;
        let allowed: &[&str] = match op {
            "write_file" => &["operation", "path", "content", "expected_sha256"],
            "replace_text" => &[
                "operation",
                "path",
                "old",
                "new",
                "count",
                "expected_sha256",
            ],
            "write_symlink" => &["operation", "path", "target", "expected_sha256"],
            "delete_file" => &["operation", "path", "expected_sha256"],
            other => return Err(Error::with(Code::CHANGE_OPERATION_INVALID, other)),
        };
        o.only(allowed)?;
        let path =
            check_relative_path(o.str("path", Code::PATH_INVALID, MAX_PATH_LEN)?)?.to_owned();
        let expected_sha256 = match o.get("expected_sha256") {
            None => None,
            Some(Value::String(s)) if is_sha256_hex(s) => Some(s.clone()),
            Some(_) => {
                return Err(Error::with(
                    Code::CHANGE_SET_INVALID,
                    format!("{path}: expected_sha256 must be 64 lowercase hex digits"),
                ));
            }
        };
        let change = match op {
            "write_file" => Change::WriteFile {
                content: o
                    .text(
                        "content",
                        Code::WRITE_CONTENT_INVALID,
                        MAX_CHANGE_CONTENT_BYTES,
                    )?
                    .to_owned(),
                path,
                expected_sha256,
            },
            "replace_text" => {
                let old = o.text("old", Code::CHANGE_SET_INVALID, MAX_CHANGE_CONTENT_BYTES)?;
                if old.is_empty() {
                    return Err(Error::with(
                        Code::CHANGE_SET_INVALID,
                        format!("{path}: old is empty"),
                    ));
                }
                Change::ReplaceText {
                    old: old.to_owned(),
                    new: o
                        .text("new", Code::CHANGE_SET_INVALID, MAX_CHANGE_CONTENT_BYTES)?
                        .to_owned(),
                    count: o.int("count", Code::REPLACE_COUNT_INVALID, 1..=1_000_000)? as u32,
                    path,
                    expected_sha256,
                }
            }
            "write_symlink" => {
                let target = o.str("target", Code::SYMLINK_TARGET_INVALID, MAX_PATH_LEN)?;
                check_symlink_target(&path, target)?;
                Change::WriteSymlink {
                    target: target.to_owned(),
                    path,
                    expected_sha256,
                }
            }
            _ => Change::DeleteFile {
                path,
                expected_sha256,
            },
        };
        Ok(change)
    }
}

/// Checks the target of a link at `path` that a change writes: not empty,
/// relative, no NUL, and resolved lexically from the link's directory
/// (`.` skipped, `..` one level up) it names a path inside the tree — never
/// above its root, never through a `.git` component. Symbolic links the
/// tree already holds are not checked: they are the repository's. Returns
/// the normalised repository-relative path the target names (empty for
/// the root itself).
pub fn check_symlink_target(path: &str, target: &str) -> Result<String> {
    let bad = |why: &str| {
        Err(Error::with(
            Code::SYMLINK_TARGET_INVALID,
            format!("{path} -> {target:?}: {why}"),
        ))
    };
    if target.is_empty() {
        return bad("empty target");
    }
    if target.starts_with('/') {
        return bad("absolute target; a link may only point inside the tree");
    }
    if target.chars().any(|c| c.is_control()) {
        return bad("control character in the target");
    }
    let mut resolved: Vec<&str> = path.split('/').collect();
    resolved.pop();
    for component in target.split('/') {
        match component {
            "" | "." => {}
            ".." => {
                if resolved.pop().is_none() {
                    return bad("the target leaves the tree");
                }
            }
            c if c.eq_ignore_ascii_case(".git") => return bad("the target names .git"),
            c => resolved.push(c),
        }
    }
    Ok(resolved.join("/"))
}

/// One verification command: an argv, never a shell string.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Command {
    /// Short name shown in evidence.
    pub label: String,
    /// Program (absolute path) and arguments.
    pub argv: Vec<String>,
    /// Working directory, relative to the workspace ("." for its root).
    pub cwd: String,
    /// Wall-clock limit in seconds.
    pub timeout_seconds: u32,
}

impl Command {
    /// Parses a command; with `defaults`, a missing cwd or timeout is filled
    /// in (the planner's form), otherwise every field is required (the
    /// envelope's form).
    pub fn from_value(value: &Value, defaults: bool) -> Result<Self> {
        let o = Obj::new(value, "command", Code::COMMAND_INVALID)?;
        o.only(&["label", "argv", "cwd", "timeout_seconds"])?;
        let label = o.str("label", Code::COMMAND_INVALID, MAX_LABEL_LEN)?;
        if !label.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
            return Err(Error::with(
                Code::COMMAND_INVALID,
                "label must be printable ASCII",
            ));
        }
        let raw_argv = o.array("argv", Code::COMMAND_INVALID, MAX_ARGV)?;
        if raw_argv.is_empty() {
            return Err(Error::with(
                Code::COMMAND_INVALID,
                format!("{label}: empty argv"),
            ));
        }
        let mut argv = Vec::with_capacity(raw_argv.len());
        for arg in raw_argv {
            match arg {
                Value::String(s) if s.len() <= MAX_ARG_LEN && !s.contains('\0') => {
                    argv.push(s.clone())
                }
                _ => {
                    return Err(Error::with(
                        Code::COMMAND_INVALID,
                        format!("{label}: bad argument"),
                    ));
                }
            }
        }
        if !argv[0].starts_with('/') {
            return Err(Error::with(
                Code::COMMAND_INVALID,
                format!("{label}: program must be an absolute path"),
            ));
        }
        let cwd = match (o.get("cwd"), defaults) {
            (None, true) => ".".to_owned(),
            _ => {
                let cwd = o.str("cwd", Code::COMMAND_INVALID, MAX_PATH_LEN)?;
                if cwd != "." {
                    check_relative_path(cwd)?;
                }
                cwd.to_owned()
            }
        };
        let timeout_seconds = match (o.get("timeout_seconds"), defaults) {
            (None, true) => DEFAULT_COMMAND_TIMEOUT_SECONDS,
            _ => {
                let r = COMMAND_TIMEOUT_RANGE;
                o.int(
                    "timeout_seconds",
                    Code::COMMAND_TIMEOUT_INVALID,
                    i64::from(*r.start())..=i64::from(*r.end()),
                )? as u32
            }
        };
        Ok(Command {
            label: label.to_owned(),
            argv,
            cwd,
            timeout_seconds,
        })
    }
}

/// Governance flags: what the execution may never do, stated explicitly.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Governance {
    /// Must equal the binding's task id.
    pub task_id: String,
    /// Must equal the binding's job id.
    pub job_id: String,
    /// Must equal the binding's idempotency key.
    pub idempotency_key: String,
    /// Idempotency key of the governed commit.
    pub commit_idempotency_key: String,
    /// True exactly when the action mutates (deterministic).
    pub writer_lease: bool,
    /// Always false.
    pub main_write: bool,
    /// Always false.
    pub production_write: bool,
    /// Always false.
    pub tag_write: bool,
    /// Always false.
    pub baseline_write: bool,
    /// Always false.
    pub force_push: bool,
    /// Always false.
    pub protected_ref_bypass: bool,
}

const FORBIDDEN_FLAGS: &[&str] = &[
    "main_write",
    "production_write",
    "tag_write",
    "baseline_write",
    "force_push",
    "protected_ref_bypass",
];

const GOVERNANCE_FIELDS: &[&str] = &[
    "task_id",
    "job_id",
    "idempotency_key",
    "commit_idempotency_key",
    "writer_lease",
    "main_write",
    "production_write",
    "tag_write",
    "baseline_write",
    "force_push",
    "protected_ref_bypass",
];

impl Governance {
    fn defaults(binding: &Binding, action: Action, commit_key: Option<&str>) -> Map<String, Value> {
        let commit_key = commit_key.map(str::to_owned).unwrap_or_else(|| {
            let tag = format!("{}\0{}", binding.task_id, binding.generation);
            format!(
                "commit-g{}-{}",
                binding.generation,
                &sha256_hex(tag.as_bytes())[..24]
            )
        });
        let mut m = Map::new();
        m.insert("task_id".into(), json!(binding.task_id));
        m.insert("job_id".into(), json!(binding.job_id));
        m.insert("idempotency_key".into(), json!(binding.idempotency_key));
        m.insert("commit_idempotency_key".into(), json!(commit_key));
        m.insert("writer_lease".into(), json!(action.mutates()));
        for flag in FORBIDDEN_FLAGS {
            m.insert((*flag).into(), json!(false));
        }
        m
    }

    fn from_value(value: Option<&Value>, candidate: &Binding, action: Action) -> Result<Self> {
        let value = value.ok_or(Error::new(Code::GOVERNANCE_POLICY_REQUIRED))?;
        let o = Obj::new(value, "governance", Code::GOVERNANCE_POLICY_REQUIRED)?;
        o.only(GOVERNANCE_FIELDS)?;
        let coordinates = [
            ("task_id", &candidate.task_id, Code::TASK_BINDING_CONFLICT),
            ("job_id", &candidate.job_id, Code::JOB_BINDING_CONFLICT),
            (
                "idempotency_key",
                &candidate.idempotency_key,
                Code::IDEMPOTENCY_BINDING_CONFLICT,
            ),
        ];
        for (field, expected, code) in coordinates {
            if o.get(field).and_then(Value::as_str) != Some(expected.as_str()) {
                return Err(Error::with(code, format!("governance.{field}")));
            }
        }
        let commit_key = o.str(
            "commit_idempotency_key",
            Code::COMMIT_IDEMPOTENCY_KEY_INVALID,
            4096,
        )?;
        if !is_key(commit_key) {
            return Err(Error::new(Code::COMMIT_IDEMPOTENCY_KEY_INVALID));
        }
        if o.get("writer_lease") != Some(&Value::Bool(action.mutates())) {
            return Err(Error::new(Code::WRITER_LEASE_POLICY_DENY));
        }
        for flag in FORBIDDEN_FLAGS {
            if o.get(flag) != Some(&Value::Bool(false)) {
                return Err(Error::with(
                    Code::POLICY_DENY,
                    format!("governance.{flag} must be false"),
                ));
            }
        }
        Ok(Governance {
            task_id: candidate.task_id.clone(),
            job_id: candidate.job_id.clone(),
            idempotency_key: candidate.idempotency_key.clone(),
            commit_idempotency_key: commit_key.to_owned(),
            writer_lease: action.mutates(),
            main_write: false,
            production_write: false,
            tag_write: false,
            baseline_write: false,
            force_push: false,
            protected_ref_bypass: false,
        })
    }
}

/// Normalises untrusted natural-language hints before they enter an
/// envelope: whitespace collapsed, each cut to 512 characters, blanks and
/// duplicates dropped, at most 16 kept.
pub fn normalise_source_signals(values: &[Value]) -> Result<Vec<String>> {
    if values.len() > MAX_SOURCE_SIGNALS_IN {
        return Err(Error::with(
            Code::SOURCE_CAPTURE_SIGNALS_INVALID,
            "too many signals",
        ));
    }
    let mut out: Vec<String> = Vec::new();
    for value in values {
        let Value::String(s) = value else {
            return Err(Error::with(
                Code::SOURCE_CAPTURE_SIGNALS_INVALID,
                "signal is not a string",
            ));
        };
        if s.len() > MAX_MESSAGE_BYTES / 512 {
            return Err(Error::with(
                Code::SOURCE_CAPTURE_SIGNALS_INVALID,
                "signal too long",
            ));
        }
        let collapsed = s.split_whitespace().collect::<Vec<_>>().join(" ");
        if collapsed.is_empty() {
            continue;
        }
        let cut: String = collapsed.chars().take(MAX_SOURCE_SIGNAL_CHARS).collect();
        let cut = cut.trim_end().to_owned();
        if !out.contains(&cut) {
            out.push(cut);
        }
        if out.len() == MAX_SOURCE_SIGNALS {
            break;
        }
    }
    Ok(out)
}

/// Sorted, de-duplicated, bounded capability names.
fn capabilities(values: &[Value]) -> Result<Vec<String>> {
    let mut out = Vec::with_capacity(values.len());
    for value in values {
        match value {
            Value::String(s) if !s.trim().is_empty() && s.len() <= MAX_CAPABILITY_LEN => {
                out.push(s.clone())
            }
            _ => return Err(Error::new(Code::CAPABILITY_SCOPE_INVALID)),
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

fn capture_paths(values: &[Value]) -> Result<Vec<String>> {
    values
        .iter()
        .map(|v| match v {
            Value::String(s) => check_relative_path(s).map(str::to_owned),
            _ => Err(Error::with(
                Code::PATH_INVALID,
                "capture path is not a string",
            )),
        })
        .collect()
}

fn change_set(values: &[Value]) -> Result<Vec<Change>> {
    let changes = values
        .iter()
        .map(Change::from_value)
        .collect::<Result<Vec<_>>>()?;
    let total: usize = changes.iter().map(Change::payload_bytes).sum();
    if total > MAX_CHANGE_SET_BYTES {
        return Err(Error::with(
            Code::FIELD_BOUNDS_EXCEEDED,
            "change set too large",
        ));
    }
    Ok(changes)
}

/// What a planner asks to be executed, before projection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecutionRequest {
    /// The action.
    pub action: Action,
    /// Capabilities needed (sorted, unique).
    pub capability_scope: Vec<String>,
    /// Changes to apply (deterministic only).
    pub change_set: Vec<Change>,
    /// Commands to run (deterministic only).
    pub verification: Vec<Command>,
    /// Normalised hints (source_capture only).
    pub source_signals: Vec<String>,
    /// Files to return (source_capture only).
    pub capture_paths: Vec<String>,
    /// Overrides the default commit idempotency key.
    pub commit_idempotency_key: Option<String>,
    /// Governance fields the planner states; still validated.
    pub governance: Option<Map<String, Value>>,
}

const EXECUTION_REQUEST_FIELDS: &[&str] = &[
    "action",
    "capability_scope",
    "change_set",
    "verification",
    "source_signals",
    "capture_paths",
    "commit_idempotency_key",
    "governance",
];

impl ExecutionRequest {
    /// Parses a planner's execution request. Commands may omit cwd and timeout.
    pub fn from_value(value: &Value) -> Result<Self> {
        let o = Obj::new(value, "execution", Code::MESSAGE_INVALID)?;
        o.only(EXECUTION_REQUEST_FIELDS)?;
        let action = Action::parse(o.str("action", Code::EXECUTION_ACTION_MISSING, 64)?)?;
        let governance = match o.get("governance") {
            None | Some(Value::Null) => None,
            Some(Value::Object(m)) => Some(m.clone()),
            Some(_) => return Err(Error::new(Code::GOVERNANCE_POLICY_REQUIRED)),
        };
        Ok(ExecutionRequest {
            action,
            capability_scope: capabilities(o.opt_array(
                "capability_scope",
                Code::CAPABILITY_SCOPE_INVALID,
                MAX_CAPABILITIES,
            )?)?,
            change_set: change_set(o.opt_array(
                "change_set",
                Code::EXECUTION_OPERATIONS_INVALID,
                MAX_CHANGES,
            )?)?,
            verification: o
                .opt_array(
                    "verification",
                    Code::EXECUTION_OPERATIONS_INVALID,
                    MAX_COMMANDS,
                )?
                .iter()
                .map(|c| Command::from_value(c, true))
                .collect::<Result<_>>()?,
            source_signals: normalise_source_signals(o.opt_array(
                "source_signals",
                Code::SOURCE_CAPTURE_SIGNALS_INVALID,
                MAX_SOURCE_SIGNALS_IN,
            )?)?,
            capture_paths: capture_paths(o.opt_array(
                "capture_paths",
                Code::EXECUTION_OPERATIONS_INVALID,
                MAX_CAPTURE_PATHS,
            )?)?,
            commit_idempotency_key: o
                .opt_str(
                    "commit_idempotency_key",
                    Code::COMMIT_IDEMPOTENCY_KEY_INVALID,
                    4096,
                )?
                .map(str::to_owned),
            governance,
        })
    }

    /// The request in its normal form (defaults filled in), which is what
    /// plan digests cover.
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        m.insert("action".into(), json!(self.action));
        m.insert("capability_scope".into(), json!(self.capability_scope));
        m.insert("change_set".into(), json!(self.change_set));
        m.insert("verification".into(), json!(self.verification));
        m.insert("source_signals".into(), json!(self.source_signals));
        m.insert("capture_paths".into(), json!(self.capture_paths));
        if let Some(k) = &self.commit_idempotency_key {
            m.insert("commit_idempotency_key".into(), json!(k));
        }
        if let Some(g) = &self.governance {
            m.insert("governance".into(), Value::Object(g.clone()));
        }
        Value::Object(m)
    }
}

/// A validated execution envelope.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope {
    /// The coordinates.
    pub binding: Binding,
    /// The action.
    pub action: Action,
    /// Capabilities the execution needs.
    pub capability_scope: Vec<String>,
    /// Changes to apply.
    pub change_set: Vec<Change>,
    /// Commands to run.
    pub verification: Vec<Command>,
    /// Normalised hints (source_capture).
    pub source_signals: Vec<String>,
    /// Files to return (source_capture).
    pub capture_paths: Vec<String>,
    /// What the execution may never do.
    pub governance: Governance,
    /// SHA-256 of the canonical envelope without this field.
    pub execution_digest: String,
}

const ENVELOPE_OWN_FIELDS: &[&str] = &[
    "schema",
    "action",
    "capability_scope",
    "change_set",
    "verification",
    "source_signals",
    "capture_paths",
    "governance",
    "execution_digest",
];

impl Envelope {
    /// The envelope without its digest: the bytes the digest covers.
    pub fn material(&self) -> Value {
        let mut m = match self.binding.to_value() {
            Value::Object(m) => m,
            _ => unreachable!("a binding serialises to an object"),
        };
        m.insert("schema".into(), json!(EXECUTION_SCHEMA));
        m.insert("action".into(), json!(self.action));
        m.insert("capability_scope".into(), json!(self.capability_scope));
        m.insert("change_set".into(), json!(self.change_set));
        m.insert("verification".into(), json!(self.verification));
        m.insert("source_signals".into(), json!(self.source_signals));
        m.insert("capture_paths".into(), json!(self.capture_paths));
        m.insert("governance".into(), json!(self.governance));
        Value::Object(m)
    }

    /// The full envelope as JSON.
    pub fn to_value(&self) -> Value {
        let mut v = self.material();
        v["execution_digest"] = json!(self.execution_digest);
        v
    }

    /// Builds the envelope for `binding` from a planner's request, then
    /// validates it exactly as a receiver would.
    pub fn project(binding: &Binding, request: &ExecutionRequest) -> Result<Self> {
        let mut governance = Governance::defaults(
            binding,
            request.action,
            request.commit_idempotency_key.as_deref(),
        );
        if let Some(supplied) = &request.governance {
            for (k, v) in supplied {
                governance.insert(k.clone(), v.clone());
            }
        }
        let mut m = match binding.to_value() {
            Value::Object(m) => m,
            _ => unreachable!("a binding serialises to an object"),
        };
        m.insert("schema".into(), json!(EXECUTION_SCHEMA));
        m.insert("action".into(), json!(request.action));
        m.insert("capability_scope".into(), json!(request.capability_scope));
        m.insert("change_set".into(), json!(request.change_set));
        m.insert("verification".into(), json!(request.verification));
        m.insert("source_signals".into(), json!(request.source_signals));
        m.insert("capture_paths".into(), json!(request.capture_paths));
        m.insert("governance".into(), Value::Object(governance));
        let mut value = Value::Object(m);
        let digest = digest_of(&value)?;
        value["execution_digest"] = json!(digest);
        Envelope::validate(&value, Some(binding), None)
    }

    /// Validates a received envelope: schema, binding (and, when given, its
    /// equality with `authority`, one code per coordinate), action,
    /// capability subset of `worker_capabilities`, governance, operations,
    /// source-capture rules, and finally the digest.
    pub fn validate(
        value: &Value,
        authority: Option<&Binding>,
        worker_capabilities: Option<&[String]>,
    ) -> Result<Self> {
        let o = Obj::new(value, "envelope", Code::MESSAGE_INVALID)?;
        if o.get("schema").and_then(Value::as_str) != Some(EXECUTION_SCHEMA) {
            return Err(Error::with(
                Code::SCHEMA_INVALID,
                "envelope schema is not airlock.execution.v1",
            ));
        }
        let allowed: Vec<&str> = BINDING_FIELDS
            .iter()
            .chain(ENVELOPE_OWN_FIELDS)
            .copied()
            .collect();
        o.only(&allowed)?;
        let binding = Binding::from_obj(&o)?;
        if let Some(authority) = authority {
            binding.check_against(authority)?;
        }
        let action = Action::parse(o.str("action", Code::EXECUTION_ACTION_MISSING, 64)?)?;
        let caps_raw = o.array(
            "capability_scope",
            Code::CAPABILITY_SCOPE_INVALID,
            MAX_CAPABILITIES,
        )?;
        let capability_scope = capabilities(caps_raw)?;
        if caps_raw.len() != capability_scope.len()
            || caps_raw
                .iter()
                .zip(&capability_scope)
                .any(|(a, b)| a.as_str() != Some(b))
        {
            return Err(Error::with(
                Code::CAPABILITY_SCOPE_INVALID,
                "capability_scope must be sorted and unique",
            ));
        }
        if let Some(worker) = worker_capabilities {
            if let Some(missing) = capability_scope.iter().find(|c| !worker.contains(c)) {
                return Err(Error::with(Code::CAPABILITY_MISMATCH_DENY, missing.clone()));
            }
        }
        let governance = Governance::from_value(o.get("governance"), &binding, action)?;
        let changes_raw = o.array(
            "change_set",
            Code::EXECUTION_OPERATIONS_INVALID,
            MAX_CHANGES,
        )?;
        let commands_raw = o.array(
            "verification",
            Code::EXECUTION_OPERATIONS_INVALID,
            MAX_COMMANDS,
        )?;
        let signals_raw = o.array(
            "source_signals",
            Code::SOURCE_CAPTURE_SIGNALS_INVALID,
            MAX_SOURCE_SIGNALS_IN,
        )?;
        let capture_raw = o.array(
            "capture_paths",
            Code::EXECUTION_OPERATIONS_INVALID,
            MAX_CAPTURE_PATHS,
        )?;
        match action {
            Action::SourceCapture => {
                if !changes_raw.is_empty() || !commands_raw.is_empty() {
                    return Err(Error::new(Code::SOURCE_CAPTURE_MUTATION_DENY));
                }
                let normal = normalise_source_signals(signals_raw)?;
                if signals_raw.len() != normal.len()
                    || signals_raw
                        .iter()
                        .zip(&normal)
                        .any(|(a, b)| a.as_str() != Some(b))
                {
                    return Err(Error::new(Code::SOURCE_CAPTURE_SIGNALS_INVALID));
                }
            }
            Action::Deterministic => {
                if changes_raw.is_empty() {
                    return Err(Error::with(Code::CHANGE_SET_INVALID, "empty change set"));
                }
                if !signals_raw.is_empty() || !capture_raw.is_empty() {
                    return Err(Error::with(
                        Code::EXECUTION_OPERATIONS_INVALID,
                        "source signals and capture paths belong to source_capture",
                    ));
                }
            }
        }
        let envelope = Envelope {
            change_set: change_set(changes_raw)?,
            verification: commands_raw
                .iter()
                .map(|c| Command::from_value(c, false))
                .collect::<Result<_>>()?,
            source_signals: normalise_source_signals(signals_raw)?,
            capture_paths: capture_paths(capture_raw)?,
            binding,
            action,
            capability_scope,
            governance,
            execution_digest: String::new(),
        };
        let material = envelope.material();
        let mut received = value.clone();
        if let Some(m) = received.as_object_mut() {
            m.remove("execution_digest");
        }
        if received != material {
            return Err(Error::with(
                Code::MESSAGE_INVALID,
                "envelope is not in normal form",
            ));
        }
        let actual = digest_of(&material)?;
        if o.get("execution_digest").and_then(Value::as_str) != Some(actual.as_str()) {
            return Err(Error::new(Code::EXECUTION_DIGEST_INVALID));
        }
        Ok(Envelope {
            execution_digest: actual,
            ..envelope
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::binding::tests::binding_json;

    pub fn binding() -> Binding {
        Binding::from_value(&binding_json()).unwrap()
    }

    pub fn deterministic_request() -> Value {
        json!({
            "action": "deterministic",
            "change_set": [{"path": "x.py", "operation": "write_file", "content": "x=1\n"}],
            "verification": [{"label": "compile", "argv": ["/usr/bin/python3", "-m", "py_compile", "x.py"]}],
            "capability_scope": ["git.test", "git.read", "git.read"],
        })
    }

    fn projected() -> Value {
        let req = ExecutionRequest::from_value(&deterministic_request()).unwrap();
        Envelope::project(&binding(), &req).unwrap().to_value()
    }

    fn refuse(edit: impl FnOnce(&mut Value)) -> Code {
        let mut v = projected();
        edit(&mut v);
        Envelope::validate(&v, Some(&binding()), None)
            .unwrap_err()
            .code
    }

    /// Changes a field and re-seals the digest, so the check under test is
    /// the one that fires rather than the digest check.
    fn refuse_resealed(edit: impl FnOnce(&mut Value)) -> Code {
        refuse(|v| {
            edit(v);
            v.as_object_mut().unwrap().remove("execution_digest");
            let d = digest_of(v).unwrap();
            v["execution_digest"] = json!(d);
        })
    }

    #[test]
    fn projection_fills_defaults_and_validates() {
        let env = Envelope::validate(
            &projected(),
            Some(&binding()),
            Some(&["git.read".into(), "git.test".into()]),
        )
        .unwrap();
        assert_eq!(env.capability_scope, vec!["git.read", "git.test"]);
        assert_eq!(env.verification[0].cwd, ".");
        assert_eq!(env.verification[0].timeout_seconds, 300);
        assert!(env.governance.writer_lease);
        assert_eq!(env.execution_digest, digest_of(&env.material()).unwrap());
        // Projection is deterministic.
        assert_eq!(projected(), projected());
    }

    #[test]
    fn digest_mismatch_is_refused() {
        assert_eq!(
            refuse(|v| v["execution_digest"] = json!("0".repeat(64))),
            Code::EXECUTION_DIGEST_INVALID
        );
        assert_eq!(
            refuse(|v| v["change_set"][0]["content"] = json!("x=2\n")),
            Code::EXECUTION_DIGEST_INVALID
        );
    }

    #[test]
    fn every_envelope_check_has_its_code() {
        assert_eq!(
            refuse(|v| v["schema"] = json!("other")),
            Code::SCHEMA_INVALID
        );
        assert_eq!(refuse(|v| v["surprise"] = json!(1)), Code::MESSAGE_INVALID);
        assert_eq!(
            refuse(|v| v["generation"] = json!(2)),
            Code::WRONG_GENERATION_ENVELOPE_DENY
        );
        assert_eq!(
            refuse(|v| v["target_branch"] = json!("agent/elsewhere")),
            Code::WRONG_BRANCH_ENVELOPE_DENY
        );
        assert_eq!(
            refuse(|v| {
                v.as_object_mut().unwrap().remove("action");
            }),
            Code::EXECUTION_ACTION_MISSING
        );
        assert_eq!(
            refuse(|v| v["action"] = json!("shell")),
            Code::EXECUTION_ACTION_UNSUPPORTED
        );
        assert_eq!(
            refuse(|v| v["capability_scope"] = json!(["b", "a"])),
            Code::CAPABILITY_SCOPE_INVALID
        );
        assert_eq!(
            refuse(|v| v["capability_scope"] = json!([""])),
            Code::CAPABILITY_SCOPE_INVALID
        );
        assert_eq!(
            refuse(|v| {
                v.as_object_mut().unwrap().remove("governance");
            }),
            Code::GOVERNANCE_POLICY_REQUIRED
        );
        assert_eq!(
            refuse(|v| v["governance"]["task_id"] = json!("task-zzz")),
            Code::TASK_BINDING_CONFLICT
        );
        assert_eq!(
            refuse(|v| v["governance"]["job_id"] = json!("job-zzz")),
            Code::JOB_BINDING_CONFLICT
        );
        assert_eq!(
            refuse(|v| v["governance"]["commit_idempotency_key"] = json!("x")),
            Code::COMMIT_IDEMPOTENCY_KEY_INVALID
        );
        assert_eq!(
            refuse(|v| v["governance"]["writer_lease"] = json!(false)),
            Code::WRITER_LEASE_POLICY_DENY
        );
        for flag in FORBIDDEN_FLAGS {
            assert_eq!(
                refuse(|v| v["governance"][flag] = json!(true)),
                Code::POLICY_DENY,
                "{flag}"
            );
        }
        assert_eq!(
            refuse(|v| v["change_set"] = json!({})),
            Code::EXECUTION_OPERATIONS_INVALID
        );
        assert_eq!(
            refuse(|v| v["change_set"] = json!([])),
            Code::CHANGE_SET_INVALID
        );
        assert_eq!(
            refuse_resealed(|v| v["change_set"][0]["operation"] = json!("chmod")),
            Code::CHANGE_OPERATION_INVALID
        );
        assert_eq!(
            refuse_resealed(|v| v["change_set"][0]["path"] = json!("../x")),
            Code::PATH_INVALID
        );
        assert_eq!(
            refuse_resealed(|v| v["verification"][0]["timeout_seconds"] = json!(0)),
            Code::COMMAND_TIMEOUT_INVALID
        );
        assert_eq!(
            refuse_resealed(|v| v["verification"][0]["argv"] = json!(["python3"])),
            Code::COMMAND_INVALID
        );
        assert_eq!(
            refuse_resealed(|v| {
                v["verification"][0].as_object_mut().unwrap().remove("cwd");
            }),
            Code::COMMAND_INVALID
        );
    }

    #[test]
    fn symlink_targets_stay_inside_the_tree() {
        assert_eq!(check_symlink_target("a/b/l", "../c/d").unwrap(), "a/c/d");
        assert_eq!(check_symlink_target("a/l", "./x/../y").unwrap(), "a/y");
        assert_eq!(check_symlink_target("a/l", "..").unwrap(), "");
        for (path, target) in [
            ("l", ""),
            ("l", "/etc/shadow"),
            ("l", ".."),
            ("a/l", "../../x"),
            ("a/l", "b/../../../etc"),
            ("l", ".git/config"),
            ("a/l", "../.GIT/hooks"),
            ("l", "x\0y"),
        ] {
            let err = check_symlink_target(path, target).unwrap_err();
            assert_eq!(
                err.code,
                Code::SYMLINK_TARGET_INVALID,
                "{path} -> {target:?}"
            );
        }
        let parsed = Change::from_value(
            &json!({"operation": "write_symlink", "path": "docs/l", "target": "../README"}),
        )
        .unwrap();
        assert_eq!(parsed.path(), "docs/l");
        for bad in [
            json!({"operation": "write_symlink", "path": "l", "target": "/etc/passwd"}),
            json!({"operation": "write_symlink", "path": "l"}),
            json!({"operation": "write_symlink", "path": "l", "target": 7}),
        ] {
            assert_eq!(
                Change::from_value(&bad).unwrap_err().code,
                Code::SYMLINK_TARGET_INVALID,
                "{bad}"
            );
        }
        let extra =
            json!({"operation": "write_symlink", "path": "l", "target": "a", "content": "x"});
        assert!(Change::from_value(&extra).is_err());
    }

    #[test]
    fn capability_subset_is_enforced() {
        let v = projected();
        let err = Envelope::validate(&v, Some(&binding()), Some(&["git.read".into()])).unwrap_err();
        assert_eq!(err.code, Code::CAPABILITY_MISMATCH_DENY);
    }

    #[test]
    fn planner_cannot_grant_itself_protected_writes() {
        let mut req = deterministic_request();
        req["governance"] = json!({"force_push": true});
        let req = ExecutionRequest::from_value(&req).unwrap();
        assert_eq!(
            Envelope::project(&binding(), &req).unwrap_err().code,
            Code::POLICY_DENY
        );
        let mut req = deterministic_request();
        req["governance"] = json!({"task_id": "task-other"});
        let req = ExecutionRequest::from_value(&req).unwrap();
        assert_eq!(
            Envelope::project(&binding(), &req).unwrap_err().code,
            Code::TASK_BINDING_CONFLICT
        );
    }

    #[test]
    fn source_capture_rules() {
        let req = json!({"action": "source_capture", "source_signals": ["  look   at\tmain.rs ", "", "look at main.rs", "x".repeat(600)],
                          "capture_paths": ["src/main.rs"]});
        let req = ExecutionRequest::from_value(&req).unwrap();
        assert_eq!(req.source_signals.len(), 2);
        assert_eq!(req.source_signals[0], "look at main.rs");
        assert_eq!(req.source_signals[1].chars().count(), 512);
        let env = Envelope::project(&binding(), &req).unwrap();
        assert!(!env.governance.writer_lease);
        let good = env.to_value();
        let mut v = good.clone();
        v["change_set"] = json!([{"path": "a", "operation": "delete_file"}]);
        assert_eq!(
            Envelope::validate(&v, None, None).unwrap_err().code,
            Code::SOURCE_CAPTURE_MUTATION_DENY
        );
        let mut v = good.clone();
        v["source_signals"] = json!(["not   normalised"]);
        assert_eq!(
            Envelope::validate(&v, None, None).unwrap_err().code,
            Code::SOURCE_CAPTURE_SIGNALS_INVALID
        );
        let many: Vec<String> = (0..40).map(|i| format!("signal {i}")).collect();
        let req = ExecutionRequest::from_value(
            &json!({"action": "source_capture", "source_signals": many}),
        )
        .unwrap();
        assert_eq!(req.source_signals.len(), MAX_SOURCE_SIGNALS);
        let huge: Vec<String> = (0..300).map(|i| format!("s{i}")).collect();
        assert_eq!(
            ExecutionRequest::from_value(
                &json!({"action": "source_capture", "source_signals": huge})
            )
            .unwrap_err()
            .code,
            Code::FIELD_BOUNDS_EXCEEDED
        );
    }

    #[test]
    fn change_parsing_is_strict() {
        let bad = |v: Value| Change::from_value(&v).unwrap_err().code;
        assert_eq!(
            bad(json!({"operation": "write_file", "path": "a"})),
            Code::WRITE_CONTENT_INVALID
        );
        assert_eq!(
            bad(json!({"operation": "write_file", "path": "a", "content": "", "mode": 1})),
            Code::MESSAGE_INVALID
        );
        assert_eq!(
            bad(
                json!({"operation": "replace_text", "path": "a", "old": "", "new": "", "count": 1})
            ),
            Code::CHANGE_SET_INVALID
        );
        assert_eq!(
            bad(
                json!({"operation": "replace_text", "path": "a", "old": "x", "new": "", "count": 0})
            ),
            Code::REPLACE_COUNT_INVALID
        );
        assert_eq!(
            bad(json!({"operation": "delete_file", "path": "a", "expected_sha256": "ABC"})),
            Code::CHANGE_SET_INVALID
        );
        let ok = json!({"operation": "replace_text", "path": "a", "old": "x", "new": "y", "count": 2, "expected_sha256": "0".repeat(64)});
        assert_eq!(
            serde_json::to_value(Change::from_value(&ok).unwrap()).unwrap(),
            ok
        );
    }
}

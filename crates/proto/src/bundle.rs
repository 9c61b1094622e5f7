//! The spool bundles between the worker and the executor (DESIGN.md §1).
//!
//! File names are never chosen freely: every name is derived from the
//! request id, which is itself derived from the task, the attempt and the
//! execution digest, so each side can recompute what to expect.

use crate::canonical::{digest_of, sha256_hex};
use crate::error::{Code, Error, Result};
use crate::limits::MAX_OUTPUT_TAIL_BYTES;
use crate::path::check_relative_path;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Schema tags.
pub const EXEC_REQUEST_SCHEMA: &str = "airlock.exec-request.v2";
/// Schema tag of a result bundle.
pub const EXEC_RESULT_SCHEMA: &str = "airlock.exec-result.v2";
/// Schema tag of the executor's request for a source archive.
pub const SOURCE_WANTED_SCHEMA: &str = "airlock.source-wanted.v1";
/// Schema tag of a failure record.
pub const EXEC_FAILURE_SCHEMA: &str = "airlock.exec-failure.v1";

/// The request id of an attempt: `r` + 40 hex digits.
pub fn request_id_for(task_id: &str, attempt: u32, execution_digest: &str) -> String {
    let tag = sha256_hex(format!("{task_id}\0{attempt}\0{execution_digest}").as_bytes());
    format!("r{}", &tag[..40])
}

/// True when `s` has the shape of a request id (so it is safe as a file name).
pub fn is_request_id(s: &str) -> bool {
    s.len() == 41
        && s.starts_with('r')
        && s[1..]
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Worker → executor: `requests/<request_id>.json`. The source travels
/// only when the executor lacks its tree: the executor then asks with a
/// [`SourceWanted`] at `wants/<request_id>.json`, and the worker answers
/// with the archive at `sources/<request_id>.tar`, which the executor
/// accepts only if the git tree id it recomputes from the archive's content
/// is `source_tree` ([`crate::tree`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// Always [`EXEC_REQUEST_SCHEMA`].
    pub schema: String,
    /// Derived with [`request_id_for`].
    pub request_id: String,
    /// The attempt.
    pub attempt: u32,
    /// The full execution envelope; the executor validates it again.
    pub envelope: Value,
    /// The git tree id of the envelope's source commit (40 or 64 hex
    /// digits): what the workspace holds before the change set.
    pub source_tree: String,
}

impl ExecRequest {
    /// Checks that the request id is the one derived from its own contents
    /// (so a renamed or replayed file is refused) and the digests are well formed.
    pub fn validate(&self) -> Result<()> {
        if self.schema != EXEC_REQUEST_SCHEMA {
            return Err(Error::new(Code::SCHEMA_INVALID));
        }
        let task_id = self
            .envelope
            .get("task_id")
            .and_then(Value::as_str)
            .unwrap_or("");
        let digest = self
            .envelope
            .get("execution_digest")
            .and_then(Value::as_str)
            .unwrap_or("");
        if self.request_id != request_id_for(task_id, self.attempt, digest) {
            return Err(Error::with(
                Code::SPOOL_DIGEST_MISMATCH,
                "request id is not derived from its task",
            ));
        }
        if crate::tree::ObjectFormat::of_id(&self.source_tree).is_none() {
            return Err(Error::with(Code::MESSAGE_INVALID, "source_tree"));
        }
        Ok(())
    }

    /// SHA-256 of the canonical request; results are bound to it.
    pub fn digest(&self) -> String {
        digest_of(self).expect("a request is always canonical")
    }
}

/// A file the executor changed (or captured).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    /// Repository-relative path.
    pub path: String,
    /// True when the change deleted it.
    pub deleted: bool,
    /// SHA-256 of the content, when present.
    pub sha256: Option<String>,
    /// Whether the file is executable.
    pub executable: bool,
    /// Content, base64; absent when deleted. A symbolic link's content is
    /// its target.
    pub content_b64: Option<String>,
    /// True when it is a symbolic link (never executable).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub symlink: bool,
}

/// Evidence of one verification command.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandEvidence {
    /// The command's label.
    pub label: String,
    /// SHA-256 of the canonical argv.
    pub argv_sha256: String,
    /// Exit status, if it exited.
    pub exit_code: Option<i32>,
    /// Signal number, if it was killed.
    pub signal: Option<i32>,
    /// True when killed at its timeout.
    pub timed_out: bool,
    /// Wall-clock time.
    pub duration_ms: u64,
    /// User + system CPU time.
    pub cpu_ms: u64,
    /// Peak resident set size.
    pub peak_rss_kib: u64,
    /// SHA-256 of all of stdout.
    pub stdout_sha256: String,
    /// SHA-256 of all of stderr.
    pub stderr_sha256: String,
    /// Last bytes of stdout (lossy UTF-8).
    pub stdout_tail: String,
    /// Last bytes of stderr (lossy UTF-8).
    pub stderr_tail: String,
    /// Its job's walls (a cgroup per job), when the executor has them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall: Option<WallEvidence>,
}

/// A command's job walls: the limits its job's cgroup set and what the
/// command did against them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WallEvidence {
    /// The cgroup interface: `v1` or `v2`.
    pub cgroup: String,
    /// The job's memory limit, in bytes (no swap).
    pub memory_limit_bytes: u64,
    /// The job's process limit (processes and threads).
    pub processes_limit: u64,
    /// The highest memory use seen, in bytes: this command's when
    /// `peak_per_command`, else the job slot's since the executor started
    /// (a kernel that cannot reset it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_peak_bytes: Option<u64>,
    /// Whether `memory_peak_bytes` is this command's alone.
    pub peak_per_command: bool,
    /// Processes of the job the OOM killer ended while it ran.
    pub oom_kills: u64,
    /// Forks the process limit refused while it ran.
    pub fork_refusals: u64,
    /// The job's CPU weight, equal for every job (v2 `cpu.weight`, v1
    /// `cpu.shares`); absent without the cpu controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_weight: Option<u64>,
    /// The job's CPU quota, in thousandths of a CPU
    /// (`executor.limits.job_cpu_max`); absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_max_millis: Option<u64>,
    /// CPU time the job's cgroup used while the command ran, in
    /// milliseconds: every process of it, those no one waited for too
    /// (`cpu_ms` counts the children the spawner reaped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_used_ms: Option<u64>,
    /// The job's IO weight, equal for every job (v2 `io.weight`, v1
    /// `blkio.weight`); absent where the kernel has no IO weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_weight: Option<u64>,
    /// The job's disk quota, in bytes (`executor.limits.job_disk_mib`):
    /// what its commands may write to its workspace and its scratch (a
    /// host view's /tmp); absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_limit_bytes: Option<u64>,
    /// The most the command had written there at once, in bytes, as the
    /// executor's watch saw it; absent where the disk is not watched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_peak_bytes: Option<u64>,
    /// The command was killed for writing past `disk_limit_bytes`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disk_exceeded: bool,
    /// The command was killed because, while it wrote, the free space of
    /// the executor's work file system fell below
    /// `executor.min_free_disk_mib`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disk_reserve_reached: bool,
}

impl WallEvidence {
    /// The code of a failed command that hit a wall, if it did.
    pub fn code(&self) -> Option<crate::Code> {
        if self.disk_exceeded {
            Some(crate::Code::COMMAND_DISK_EXCEEDED)
        } else if self.disk_reserve_reached {
            Some(crate::Code::HOST_DISK_RESERVE)
        } else if self.oom_kills > 0 {
            Some(crate::Code::COMMAND_MEMORY_EXCEEDED)
        } else if self.fork_refusals > 0 {
            Some(crate::Code::COMMAND_PROCESS_LIMIT)
        } else {
            None
        }
    }
}

/// The dependency layer a verification read: made by its environment's
/// setup in this request, or reused from the layer cache.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerEvidence {
    /// SHA-256 over the environment and the content of the setup's
    /// inputs: the layer's cache key.
    pub key: String,
    /// SHA-256 over the layer's content (every path, kind, mode and
    /// content digest), recomputed when it is first used.
    pub digest: String,
    /// Bytes of files in the layer.
    pub bytes: u64,
    /// True when the layer came from the cache: no setup ran, no egress.
    pub reused: bool,
    /// Evidence of each setup command (none when reused).
    pub setup: Vec<CommandEvidence>,
    /// Every connection the setup asked the egress proxy for, in order.
    pub egress: Vec<EgressDecision>,
}

/// One connection a setup asked for through the egress proxy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressDecision {
    /// What the request named (`host:port` of a CONNECT, else its method
    /// and target), at most 300 bytes.
    pub target: String,
    /// True when the proxy opened the tunnel.
    pub allowed: bool,
    /// The refusal's catalogue code, when refused.
    pub code: Option<String>,
}

/// How the executor was confined while it ran the commands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfinementReport {
    /// Landlock ABI the kernel offered.
    pub landlock_abi: u32,
    /// "full", or "degraded" when config allowed less than full enforcement.
    pub landlock: String,
    /// True when the seccomp filter was installed.
    pub seccomp: bool,
    /// Namespaces that were unshared.
    pub namespaces: Vec<String>,
    /// The uid the commands ran as, outside any user namespace.
    pub uid: Option<u32>,
    /// The commands' filesystem view: `minimal-root` (their workspace,
    /// a private /tmp, their own /proc, a minimal /dev and read-only system
    /// paths, nothing else) or `host-view` (the host's, narrowed by
    /// Landlock, every metadata call by path refused); `none` when no
    /// command ran.
    pub view: String,
    /// The dependency layer the commands read, when the repository's
    /// environment has a setup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer: Option<LayerEvidence>,
}

/// Executor → worker: `results/<request_id>.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecResult {
    /// Always [`EXEC_RESULT_SCHEMA`].
    pub schema: String,
    /// The request's id.
    pub request_id: String,
    /// SHA-256 of the canonical request.
    pub request_sha256: String,
    /// The envelope's digest.
    pub execution_digest: String,
    /// The git tree id the workspace was made from (the request's, which
    /// the executor's cache entry was verified to hold).
    pub source_tree: String,
    /// True when every verification command exited 0.
    pub passed: bool,
    /// Changed files (deterministic) in path order.
    pub changed_files: Vec<FileEntry>,
    /// Captured files (source_capture) in path order.
    pub captured_files: Vec<FileEntry>,
    /// Requested capture paths the credential policy withholds (never
    /// read, never returned), in path order.
    pub withheld_paths: Vec<String>,
    /// One entry per verification command, in order.
    pub verification: Vec<CommandEvidence>,
    /// How the commands were confined.
    pub confinement: ConfinementReport,
}

impl ExecResult {
    /// Checks the result against the request that caused it and its own
    /// structure: ids and digests bound, paths safe, tails bounded.
    pub fn validate_against(&self, request: &ExecRequest) -> Result<()> {
        if self.schema != EXEC_RESULT_SCHEMA {
            return Err(Error::new(Code::SCHEMA_INVALID));
        }
        let digest = request
            .envelope
            .get("execution_digest")
            .and_then(Value::as_str)
            .unwrap_or("");
        if self.request_id != request.request_id
            || self.request_sha256 != request.digest()
            || self.execution_digest != digest
            || self.source_tree != request.source_tree
        {
            return Err(Error::new(Code::SPOOL_DIGEST_MISMATCH));
        }
        for f in self.changed_files.iter().chain(&self.captured_files) {
            check_relative_path(&f.path)?;
            if f.deleted != f.content_b64.is_none() || f.deleted != f.sha256.is_none() {
                return Err(Error::with(
                    Code::MESSAGE_INVALID,
                    format!("{}: inconsistent entry", f.path),
                ));
            }
        }
        for p in &self.withheld_paths {
            check_relative_path(p)?;
        }
        for c in &self.verification {
            if c.stdout_tail.len() > MAX_OUTPUT_TAIL_BYTES * 4
                || c.stderr_tail.len() > MAX_OUTPUT_TAIL_BYTES * 4
            {
                return Err(Error::new(Code::FIELD_BOUNDS_EXCEEDED));
            }
        }
        Ok(())
    }

    /// SHA-256 of the canonical result.
    pub fn digest(&self) -> String {
        digest_of(self).expect("a result is always canonical")
    }

    /// The executor may return exactly the paths of `envelope`'s change
    /// set, each once, no more (CHANGED_PATHS_MISMATCH): a verification
    /// command cannot smuggle another file into the commit.
    pub fn check_changes_of(&self, envelope: &crate::envelope::Envelope) -> Result<()> {
        let expected: std::collections::BTreeSet<&str> =
            envelope.change_set.iter().map(|c| c.path()).collect();
        let got: std::collections::BTreeSet<&str> =
            self.changed_files.iter().map(|f| f.path.as_str()).collect();
        if expected != got || got.len() != self.changed_files.len() {
            return Err(Error::with(
                Code::CHANGED_PATHS_MISMATCH,
                "changed files are not exactly the change set's paths",
            ));
        }
        Ok(())
    }
}

/// Most trees a [`SourceWanted`] names as held.
pub const MAX_HAVES: usize = 16;

/// Executor → worker: `wants/<request_id>.json` when the executor lacks the
/// request's tree. It names the trees it holds whole (`haves`, most
/// recently used first, as git's fetch names what it has): the worker
/// answers with a [`SourceDelta`] against the first of them its
/// repository knows (only the objects the executor lacks), or, when it
/// knows none, with the whole tree's archive.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceWanted {
    /// Always [`SOURCE_WANTED_SCHEMA`].
    pub schema: String,
    /// The request's id.
    pub request_id: String,
    /// SHA-256 of the canonical request.
    pub request_sha256: String,
    /// The tree the executor lacks (the request's `source_tree`).
    pub source_tree: String,
    /// Trees the executor holds whole, with every object beneath them (at
    /// most [`MAX_HAVES`], each of the request tree's object format).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub haves: Vec<String>,
    /// The executor keeps every file of a tree it holds by blob id (its
    /// blob store): a delta may leave out a blob the base holds, with the
    /// same mode, at a path that is not credential-like
    /// ([`crate::path::is_credential_path`]; such a path may be withheld
    /// from the cache). Absent: every blob of a changed path comes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub blobs_by_id: bool,
}

/// Schema tag of a source delta's header.
pub const SOURCE_DELTA_SCHEMA: &str = "airlock.source-delta.v1";

/// The first member of a source delta (a tar archive at
/// `sources/<request_id>.tar`, like a whole source archive): a name no
/// archive of a tree can carry, since no tree holds `.git`.
pub const SOURCE_DELTA_HEADER: &str = ".git/airlock-source-delta.json";

/// Worker → executor: the header of a source delta. The members after it
/// are `t/<id>` (the content of a tree object of `source_tree` that
/// `base` lacks at the same path, the root's among them) and `b/<id>`
/// (the content of each blob at a path where `source_tree` differs from
/// `base`). The executor hashes every member to its id and walks
/// `source_tree` from its root object, so what it assembles is that
/// tree or nothing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceDelta {
    /// Always [`SOURCE_DELTA_SCHEMA`].
    pub schema: String,
    /// A tree of the want's `haves`.
    pub base: String,
    /// The request's `source_tree`.
    pub source_tree: String,
}

impl SourceWanted {
    /// Checks it against the request it names.
    pub fn validate_against(&self, request: &ExecRequest) -> Result<()> {
        if self.schema != SOURCE_WANTED_SCHEMA {
            return Err(Error::new(Code::SCHEMA_INVALID));
        }
        if self.request_id != request.request_id
            || self.request_sha256 != request.digest()
            || self.source_tree != request.source_tree
        {
            return Err(Error::new(Code::SPOOL_DIGEST_MISMATCH));
        }
        let format = crate::tree::ObjectFormat::of_id(&self.source_tree);
        if self.haves.len() > MAX_HAVES
            || self
                .haves
                .iter()
                .any(|h| crate::tree::ObjectFormat::of_id(h) != format || *h == self.source_tree)
        {
            return Err(Error::with(
                Code::MESSAGE_INVALID,
                "the source request names held trees that cannot be",
            ));
        }
        Ok(())
    }
}

/// Executor → worker: `failed/<request_id>.json` when a request was refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecFailure {
    /// Always [`EXEC_FAILURE_SCHEMA`].
    pub schema: String,
    /// The request's id.
    pub request_id: String,
    /// SHA-256 of the canonical request, when it could be parsed.
    pub request_sha256: Option<String>,
    /// The refusal code.
    pub code: String,
    /// Human detail (no secrets).
    pub detail: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope() -> crate::envelope::Envelope {
        use crate::binding::Binding;
        use crate::envelope::{Envelope, ExecutionRequest};
        let base = "a".repeat(40);
        let binding = Binding::from_value(&serde_json::json!({
            "task_id": "task-w", "job_id": "job-w", "repository": "demo", "base_oid": base,
            "expected_branch_oid": base, "target_branch": "agent/task-w", "branch_mode": "CREATE_NEW",
            "generation": 1, "idempotency_key": "key-task-w",
        }))
        .unwrap();
        let request = ExecutionRequest::from_value(&serde_json::json!({
            "action": "deterministic",
            "change_set": [
                {"operation": "write_file", "path": "a.txt", "content": "a\n"},
                {"operation": "delete_file", "path": "b.txt"},
            ],
        }))
        .unwrap();
        Envelope::project(&binding, &request).unwrap()
    }

    fn result(paths: &[&str]) -> ExecResult {
        ExecResult {
            schema: EXEC_RESULT_SCHEMA.into(),
            request_id: "r".into(),
            request_sha256: "0".repeat(64),
            execution_digest: "0".repeat(64),
            source_tree: "0".repeat(40),
            passed: true,
            changed_files: paths
                .iter()
                .map(|p| FileEntry {
                    path: (*p).into(),
                    deleted: true,
                    sha256: None,
                    executable: false,
                    content_b64: None,
                    symlink: false,
                })
                .collect(),
            captured_files: vec![],
            withheld_paths: vec![],
            verification: vec![],
            confinement: ConfinementReport {
                landlock_abi: 7,
                landlock: "full".into(),
                seccomp: true,
                namespaces: vec![],
                view: "minimal-root".into(),
                uid: Some(992),
                layer: None,
            },
        }
    }

    #[test]
    fn only_the_change_sets_paths_are_accepted_from_the_executor() {
        let env = envelope();
        assert!(result(&["a.txt", "b.txt"]).check_changes_of(&env).is_ok());
        for bad in [
            &["a.txt", "b.txt", "extra.txt"][..],
            &["a.txt"],
            &["a.txt", "a.txt", "b.txt"],
            &["a.txt", ".github/workflows/x.yml"],
        ] {
            let err = result(bad).check_changes_of(&env).unwrap_err();
            assert_eq!(err.code, Code::CHANGED_PATHS_MISMATCH, "{bad:?}");
        }
    }

    #[test]
    fn request_ids_are_derived_and_safe_names() {
        let id = request_id_for("task-a", 1, &"d".repeat(64));
        assert!(is_request_id(&id));
        assert_ne!(id, request_id_for("task-a", 2, &"d".repeat(64)));
        assert!(!is_request_id("r../../etc/passwd"));
    }

    #[test]
    fn a_request_with_a_foreign_id_is_refused() {
        let envelope = serde_json::json!({"task_id": "task-a", "execution_digest": "d".repeat(64)});
        let mut r = ExecRequest {
            schema: EXEC_REQUEST_SCHEMA.into(),
            request_id: request_id_for("task-a", 1, &"d".repeat(64)),
            attempt: 1,
            envelope,
            source_tree: "a".repeat(40),
        };
        assert!(r.validate().is_ok());
        r.attempt = 2;
        assert_eq!(r.validate().unwrap_err().code, Code::SPOOL_DIGEST_MISMATCH);
    }
}

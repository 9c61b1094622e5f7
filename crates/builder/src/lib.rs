//! The task builder: from "these files changed" to an `airlock.task.v1`
//! submission (the one `airlockctl propose` submits; a Rust agent calls it
//! directly).
//!
//! It reads the authority repository (read-only, see [`SourceRepo`]),
//! resolves the base and the branch to object ids, takes the changes from
//! a work tree ([`Changes::Worktree`]) or a unified diff
//! ([`Changes::Patch`]), turns each touched file into a `write_file` (its
//! whole new content) or `delete_file`, each guarded by the SHA-256 the
//! file has in the source head, and fills in the binding and the plan.
//! The result is checked the way the supervisor will check it (strict
//! parse, plan registration, envelope projection) before it is returned,
//! so a task the builder returns is one the supervisor accepts, unless the
//! repository moves or is not registered there.
//!
//! `docs/tasks.md` describes the JSON for agents in other languages.
//!
//! ```no_run
//! use airlock_builder::{Changes, Proposal, SourceRepo, verify_command};
//! # fn demo() -> Result<(), airlock_proto::Error> {
//! let repo = SourceRepo::open("/srv/airlock/calc.git".as_ref())?;
//! let mut proposal = Proposal::new("calc", "main");
//! proposal.verification.push(verify_command(
//!     "python3 -m unittest -q",
//!     300,
//!     &["/usr/bin/python3".into()],
//! )?);
//! let built = proposal.build(&repo, Changes::Worktree("/tmp/calc".as_ref()))?;
//! println!("{}", built.task);
//! # Ok(()) }
//! ```
//!
//! Owns: turning a planner's work tree or patch into a hash-bound task
//! submission.
//! Never: talk to the bus or submit anything itself, or start git except
//! through crates/git.

pub mod patch;
mod source;
mod worktree;

pub use source::{Entry, Kind, SourceRepo};

use airlock_proto::binding::{AGENT_BRANCH_PREFIX, check_target_branch, is_task_id};
use airlock_proto::canonical::sha256_hex;
use airlock_proto::envelope::Command;
use airlock_proto::limits::{COMMAND_TIMEOUT_RANGE, DEFAULT_MAX_ATTEMPTS, MAX_LABEL_LEN};
use airlock_proto::path::check_relative_path;
use airlock_proto::plan::{PLAN_SCHEMA, PlanRequest, register_plan};
use airlock_proto::task::{TASK_SCHEMA, TaskSubmission};
use airlock_proto::{Code, Error};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

/// One file the proposal changes, against the source head.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Edit {
    /// The file's whole new content; `base_sha256` is the content's digest
    /// in the source head (`None` for a new file).
    Write {
        /// Repository-relative path.
        path: String,
        /// The new content.
        content: String,
        /// SHA-256 of the file in the source head.
        base_sha256: Option<String>,
    },
    /// A symbolic link made or retargeted; `base_sha256` is the digest of
    /// the link's target in the source head (`None` for a new link).
    Link {
        /// Repository-relative path.
        path: String,
        /// The new target (inside the tree, see
        /// [`airlock_proto::envelope::check_symlink_target`]).
        target: String,
        /// SHA-256 of the link's target in the source head.
        base_sha256: Option<String>,
    },
    /// The file (or link) goes.
    Delete {
        /// Repository-relative path.
        path: String,
        /// SHA-256 of the file's content (a link's target) in the source head.
        base_sha256: String,
    },
}

impl Edit {
    /// The path.
    pub fn path(&self) -> &str {
        match self {
            Edit::Write { path, .. } | Edit::Link { path, .. } | Edit::Delete { path, .. } => path,
        }
    }

    /// `add`, `edit` or `delete`, for summaries.
    pub fn verb(&self) -> &'static str {
        match self {
            Edit::Write {
                base_sha256: None, ..
            }
            | Edit::Link {
                base_sha256: None, ..
            } => "add",
            Edit::Write { .. } | Edit::Link { .. } => "edit",
            Edit::Delete { .. } => "delete",
        }
    }

    fn change(&self) -> Value {
        match self {
            Edit::Write {
                path,
                content,
                base_sha256,
            } => {
                let mut c = json!({"operation": "write_file", "path": path, "content": content});
                if let Some(sha) = base_sha256 {
                    c["expected_sha256"] = json!(sha);
                }
                c
            }
            Edit::Link {
                path,
                target,
                base_sha256,
            } => {
                let mut c = json!({"operation": "write_symlink", "path": path, "target": target});
                if let Some(sha) = base_sha256 {
                    c["expected_sha256"] = json!(sha);
                }
                c
            }
            Edit::Delete { path, base_sha256 } => {
                json!({"operation": "delete_file", "path": path, "expected_sha256": base_sha256})
            }
        }
    }
}

/// Where the changes come from.
#[derive(Clone, Copy, Debug)]
pub enum Changes<'a> {
    /// A directory holding the changed tree (usually a clone of the
    /// repository the planner edited).
    Worktree(&'a Path),
    /// A unified diff against the source head.
    Patch(&'a str),
    /// Whole files: each `(path, content)` written, each `(path, target)`
    /// made a symbolic link, each path in `delete` removed (an MCP
    /// client's `propose_change`).
    Files {
        /// Files written with their whole new content.
        write: &'a [(String, String)],
        /// Symbolic links made or retargeted.
        link: &'a [(String, String)],
        /// Files (or links) removed.
        delete: &'a [String],
    },
}

/// What a planner proposes; [`Proposal::build`] makes the task.
#[derive(Clone, Debug)]
pub struct Proposal {
    /// The registered repository's name.
    pub repository: String,
    /// The base revision (a branch, tag or commit id of the repository).
    pub base: String,
    /// The `agent/…` branch; `agent/<task id>` when `None`. An existing
    /// branch is continued (its head becomes the source head).
    pub branch: Option<String>,
    /// The task id; generated when `None`.
    pub task_id: Option<String>,
    /// The verification commands, in order.
    pub verification: Vec<Command>,
    /// The attempt budget (default 3).
    pub max_attempts: u32,
}

/// A built task.
#[derive(Clone, Debug)]
pub struct Built {
    /// The `airlock.task.v1` submission.
    pub task: Value,
    /// Its task id.
    pub task_id: String,
    /// Its branch.
    pub target_branch: String,
    /// The base commit.
    pub base_oid: String,
    /// The commit the changes apply to (the base, or the branch's head).
    pub source_head: String,
    /// The files it changes.
    pub edits: Vec<Edit>,
}

/// The coordinates a proposal resolves to.
struct Head {
    task_id: String,
    target_branch: String,
    base_oid: String,
    expected: String,
    mode: &'static str,
    source_head: String,
}

/// A fresh task id: `p-` and 16 random hex digits.
pub fn new_task_id() -> Result<String, Error> {
    let mut bytes = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .map_err(|e| Error::with(Code::INTERNAL, format!("no randomness: {e}")))?;
    Ok(format!(
        "p-{}",
        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
    ))
}

/// A verification command from a line of text: split the way a POSIX shell
/// splits words (quotes and backslashes), never run by one. A bare program
/// name is looked up among `programs` (the executor's allowlist,
/// `executor.programs`) by file name; a path must be absolute.
pub fn verify_command(
    text: &str,
    timeout_seconds: u32,
    programs: &[PathBuf],
) -> Result<Command, Error> {
    let bad = |why: String| Error::with(Code::COMMAND_INVALID, format!("{text:?}: {why}"));
    let mut argv = shlex::split(text).ok_or_else(|| bad("unbalanced quotes".into()))?;
    if argv.is_empty() {
        return Err(bad("empty command".into()));
    }
    if !COMMAND_TIMEOUT_RANGE.contains(&timeout_seconds) {
        return Err(Error::with(
            Code::COMMAND_TIMEOUT_INVALID,
            format!("{timeout_seconds} s is outside {COMMAND_TIMEOUT_RANGE:?}"),
        ));
    }
    if !argv[0].contains('/') {
        let name = argv[0].clone();
        let found = programs
            .iter()
            .find(|p| p.file_name().is_some_and(|f| f == name.as_str()))
            .ok_or_else(|| {
                let list: Vec<String> = programs.iter().map(|p| p.display().to_string()).collect();
                Error::with(
                    Code::COMMAND_PROGRAM_DENY,
                    format!(
                        "{name:?} is not one of the executor's programs ({})",
                        list.join(", ")
                    ),
                )
            })?;
        argv[0] = found.display().to_string();
    } else if !argv[0].starts_with('/') {
        return Err(bad("a program path must be absolute".into()));
    }
    Ok(Command {
        label: label_of(text),
        argv,
        cwd: ".".into(),
        timeout_seconds,
    })
}

/// A command's label from its text: every run of spaces and control or
/// non-ASCII characters one space, at most [`MAX_LABEL_LEN`] characters.
pub fn label_of(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_ascii_graphic() { c } else { ' ' })
        .collect::<String>()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .take(MAX_LABEL_LEN)
        .collect()
}

/// True for bytes a `write_file` can carry: UTF-8 without NUL.
pub fn is_text(bytes: &[u8]) -> bool {
    !bytes.contains(&0) && std::str::from_utf8(bytes).is_ok()
}

pub(crate) fn refuse(code: Code, path: &str, why: &str) -> Error {
    Error::with(code, format!("{path}: {why}"))
}

impl Proposal {
    /// A proposal on `repository` from `base`, with defaults otherwise.
    pub fn new(repository: &str, base: &str) -> Proposal {
        Proposal {
            repository: repository.to_owned(),
            base: base.to_owned(),
            branch: None,
            task_id: None,
            verification: Vec::new(),
            max_attempts: DEFAULT_MAX_ATTEMPTS,
        }
    }

    /// Builds the task from `changes` read against `repo` (see the module docs).
    pub fn build(&self, repo: &SourceRepo, changes: Changes<'_>) -> Result<Built, Error> {
        let head = self.head(repo)?;
        let edits = match changes {
            Changes::Worktree(dir) => worktree::edits(repo, &head.source_head, dir)?,
            Changes::Patch(text) => patch_edits(repo, &head.source_head, text)?,
            Changes::Files {
                write,
                link,
                delete,
            } => file_edits(repo, &head.source_head, write, link, delete)?,
        };
        if edits.is_empty() {
            return Err(Error::with(
                Code::PROPOSAL_EMPTY,
                format!("nothing differs from {}", head.source_head),
            ));
        }
        for e in &edits {
            check_relative_path(e.path())?;
        }
        let execution = json!({
            "action": "deterministic",
            "change_set": edits.iter().map(Edit::change).collect::<Vec<_>>(),
            "verification": self.verification,
        });
        self.finish(head, execution, edits)
    }

    /// Builds a source capture: a read-only task that returns the files at
    /// `paths` of the source head (credential-like paths withheld) and
    /// carries the planner's `signals` (hints, normalised: whitespace
    /// folded, empty and repeated ones dropped). Nothing is committed; the
    /// files come back in the task's result (`captured`), which
    /// `GetTask` shows. The proposal's verification commands are not used.
    pub fn capture(
        &self,
        repo: &SourceRepo,
        paths: &[String],
        signals: &[String],
    ) -> Result<Built, Error> {
        let head = self.head(repo)?;
        for p in paths {
            check_relative_path(p)?;
        }
        let execution = json!({
            "action": "source_capture",
            "capture_paths": paths,
            "source_signals": signals,
            "capability_scope": ["git.read"],
        });
        self.finish(head, execution, Vec::new())
    }

    /// Resolves the task id, branch, base and source head.
    fn head(&self, repo: &SourceRepo) -> Result<Head, Error> {
        let task_id = match &self.task_id {
            Some(id) if is_task_id(id) => id.clone(),
            Some(id) => return Err(Error::with(Code::TASK_ID_INVALID, id.clone())),
            None => new_task_id()?,
        };
        let target_branch = self
            .branch
            .clone()
            .unwrap_or_else(|| format!("{AGENT_BRANCH_PREFIX}{task_id}"));
        check_target_branch(&target_branch)?;
        let base_oid = repo.resolve_commit(&self.base)?;
        let (mode, expected) = match repo.branch_head(&target_branch)? {
            Some(head) if self.branch.is_some() => ("CONTINUE_EXISTING", head),
            Some(_) => {
                return Err(Error::with(
                    Code::REF_CAS_MISMATCH,
                    format!("{target_branch} exists already; name it as the branch to continue it"),
                ));
            }
            None => ("CREATE_NEW", base_oid.clone()),
        };
        Ok(Head {
            source_head: expected.clone(),
            task_id,
            target_branch,
            base_oid,
            expected,
            mode,
        })
    }

    /// The submission around `execution`, checked as the supervisor will.
    fn finish(&self, head: Head, execution: Value, edits: Vec<Edit>) -> Result<Built, Error> {
        let Head {
            task_id,
            target_branch,
            base_oid,
            expected,
            mode,
            source_head,
        } = head;
        let job_id = format!("job-{task_id}");
        let task = json!({
            "schema": TASK_SCHEMA,
            "max_attempts": self.max_attempts,
            "binding": {
                "task_id": task_id, "job_id": job_id, "repository": self.repository,
                "base_oid": base_oid, "expected_branch_oid": expected,
                "target_branch": target_branch, "branch_mode": mode, "generation": 1,
                "idempotency_key": format!("propose-{task_id}"),
            },
            "plan": {
                "schema": PLAN_SCHEMA, "task_id": task_id, "job_id": job_id,
                "source_head_oid": source_head, "generation": 1,
                "idempotency_key": format!("plan-{task_id}-1"),
                "execution": execution,
            },
        });
        // The supervisor's own checks, before anything is sent.
        let parsed = TaskSubmission::from_value(&task)?;
        let plan: &PlanRequest = &parsed.plan;
        register_plan(&parsed.binding, plan, None)?;
        Ok(Built {
            task,
            task_id,
            target_branch,
            base_oid,
            source_head,
            edits,
        })
    }
}

/// The edits whole files make to `head`: a write of a file the head has
/// is guarded by its digest there (and dropped when nothing changes), as
/// is a link's retargeting; a deletion must name a file or link the head
/// has. A write onto a link, or a link onto a file, is refused.
fn file_edits(
    repo: &SourceRepo,
    head: &str,
    write: &[(String, String)],
    link: &[(String, String)],
    delete: &[String],
) -> Result<Vec<Edit>, Error> {
    let tree = repo.tree(head)?;
    let mut seen = std::collections::BTreeSet::new();
    let mut edits = Vec::new();
    // What the head has at `path`: its bytes (a link's target), their
    // digest, and whether it is a link.
    let base = |path: &str| -> Result<Option<(Vec<u8>, String, bool)>, Error> {
        let Some(entry) = tree.get(path) else {
            return Ok(None);
        };
        if entry.kind == Kind::Submodule {
            return Err(refuse(
                Code::PROPOSAL_SYMLINK_CHANGE,
                path,
                "a submodule in the base",
            ));
        }
        let bytes = repo.blobs(&[entry.oid.as_str()])?.remove(0);
        let sha = sha256_hex(&bytes);
        Ok(Some((bytes, sha, entry.kind == Kind::Symlink)))
    };
    let kind_changes = |path: &str, to_link: bool| {
        refuse(
            Code::PROPOSAL_SYMLINK_CHANGE,
            path,
            if to_link {
                "a file in the base becomes a symbolic link; delete it in one task, link in another"
            } else {
                "a symbolic link in the base becomes a file; delete it in one task, write in another"
            },
        )
    };
    let paths = write
        .iter()
        .chain(link)
        .map(|(p, _)| p)
        .chain(delete.iter());
    for path in paths {
        check_relative_path(path)?;
        if !seen.insert(path.clone()) {
            return Err(Error::with(
                Code::CHANGE_SET_INVALID,
                format!("{path} is changed twice"),
            ));
        }
    }
    for (path, content) in write {
        if !is_text(content.as_bytes()) {
            return Err(refuse(
                Code::PROPOSAL_BINARY_CHANGE,
                path,
                "the content has a NUL byte",
            ));
        }
        match base(path)? {
            Some((.., true)) => return Err(kind_changes(path, false)),
            Some((bytes, ..)) if bytes == content.as_bytes() => {}
            found => edits.push(Edit::Write {
                path: path.clone(),
                content: content.clone(),
                base_sha256: found.map(|(_, sha, _)| sha),
            }),
        }
    }
    for (path, target) in link {
        airlock_proto::envelope::check_symlink_target(path, target)?;
        match base(path)? {
            Some((.., false)) => return Err(kind_changes(path, true)),
            Some((bytes, ..)) if bytes == target.as_bytes() => {}
            found => edits.push(Edit::Link {
                path: path.clone(),
                target: target.clone(),
                base_sha256: found.map(|(_, sha, _)| sha),
            }),
        }
    }
    for path in delete {
        let (_, sha, _) = base(path)?.ok_or_else(|| {
            refuse(
                Code::PATCH_HUNK_FAILED,
                path,
                "deleted, but the base has no such file",
            )
        })?;
        edits.push(Edit::Delete {
            path: path.clone(),
            base_sha256: sha,
        });
    }
    edits.sort_by(|a, b| a.path().cmp(b.path()));
    Ok(edits)
}

/// The edits a unified diff makes to `head`.
fn patch_edits(repo: &SourceRepo, head: &str, text: &str) -> Result<Vec<Edit>, Error> {
    let files = patch::parse(text)?;
    let tree = repo.tree(head)?;
    let mut seen = std::collections::BTreeSet::new();
    let mut edits = Vec::new();
    // The base's text at `path` and its digest; `link` says which kind the
    // section is (a link's text is its target).
    let base_text = |path: &str, link: bool| -> Result<(String, String), Error> {
        let entry = tree.get(path).ok_or_else(|| {
            Error::with(
                Code::PATCH_HUNK_FAILED,
                format!("{path}: the patch changes a file the base does not have"),
            )
        })?;
        match (entry.kind, link) {
            (Kind::File | Kind::Executable, false) | (Kind::Symlink, true) => {}
            (Kind::Submodule, _) => {
                return Err(refuse(
                    Code::PROPOSAL_SYMLINK_CHANGE,
                    path,
                    "a submodule in the base",
                ));
            }
            _ => {
                return Err(refuse(
                    Code::PROPOSAL_SYMLINK_CHANGE,
                    path,
                    "the base and the patch disagree on whether this is a symbolic link (git diff marks a link's section with mode 120000; a file cannot become a link or back)",
                ));
            }
        }
        let bytes = repo.blobs(&[entry.oid.as_str()])?.remove(0);
        let sha = sha256_hex(&bytes);
        if !is_text(&bytes) {
            return Err(refuse(
                Code::PROPOSAL_BINARY_CHANGE,
                path,
                "a binary file in the base",
            ));
        }
        Ok((String::from_utf8(bytes).unwrap_or_default(), sha))
    };
    // What a section leaves at `path`: a file's content, or a link.
    let written = |file: &patch::FilePatch, path: &String, content: String, base_sha256| {
        if file.symlink {
            Edit::Link {
                path: path.clone(),
                target: content,
                base_sha256,
            }
        } else {
            Edit::Write {
                path: path.clone(),
                content,
                base_sha256,
            }
        }
    };
    for file in &files {
        for p in [&file.old_path, &file.new_path].into_iter().flatten() {
            check_relative_path(p)?;
        }
        let mut touched: Vec<&String> = [
            (!file.copy).then_some(file.old_path.as_ref()).flatten(),
            file.new_path.as_ref(),
        ]
        .into_iter()
        .flatten()
        .collect();
        touched.dedup();
        for p in touched {
            if !seen.insert(p.clone()) {
                return Err(Error::with(
                    Code::PATCH_INVALID,
                    format!("patch line {}: {p} is changed twice", file.patch_line),
                ));
            }
        }
        match (&file.old_path, &file.new_path) {
            (None, Some(new)) => {
                if tree.contains_key(new) {
                    return Err(Error::with(
                        Code::PATCH_HUNK_FAILED,
                        format!(
                            "{new}: the patch creates a file the base already has (patch line {})",
                            file.patch_line
                        ),
                    ));
                }
                edits.push(written(file, new, patch::apply(file, "")?, None));
            }
            (Some(old), None) => {
                let (content, sha) = base_text(old, file.symlink)?;
                // The removal must match the base, like any hunk.
                if !patch::apply(file, &content)?.is_empty() {
                    return Err(Error::with(
                        Code::PATCH_HUNK_FAILED,
                        format!("{old}: the patch deletes the file but leaves lines behind"),
                    ));
                }
                edits.push(Edit::Delete {
                    path: old.clone(),
                    base_sha256: sha,
                });
            }
            (Some(old), Some(new)) => {
                let (content, sha) = base_text(old, file.symlink)?;
                let after = patch::apply(file, &content)?;
                if old != new {
                    if tree.contains_key(new) {
                        return Err(Error::with(
                            Code::PATCH_HUNK_FAILED,
                            format!("{new}: the patch renames onto a file the base already has"),
                        ));
                    }
                    if !file.copy {
                        edits.push(Edit::Delete {
                            path: old.clone(),
                            base_sha256: sha,
                        });
                    }
                    edits.push(written(file, new, after, None));
                } else if after != content {
                    edits.push(written(file, new, after, Some(sha)));
                }
            }
            (None, None) => unreachable!("the parser refuses a section without paths"),
        }
    }
    edits.sort_by(|a, b| a.path().cmp(b.path()));
    Ok(edits)
}

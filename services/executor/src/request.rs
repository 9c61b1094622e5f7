//! One request, start to finish, in a fixed order of steps (each failing
//! hard with its own code):
//!
//! 1. parse the ExecRequest strictly (unknown fields refused);
//! 2. its id must be the file's name and derived from its envelope;
//! 3. validate the envelope (schema, binding, governance, digest);
//! 4. check every verification command against the program policy;
//! 5. the source archive: exact size, SHA-256 equal to the request's;
//! 6. extract it into a fresh workspace;
//! 7. deterministic: apply the change set, read the changed paths back
//!    (this content, not whatever the commands leave, is the result), run
//!    each command in its own sandbox, stopping at the first that fails;
//!    source_capture: read the requested paths;
//! 8. bind the result to the request by digests.
//!
//! The workspace is removed afterwards, whatever happened.

use crate::apply::{CredentialPolicy, Workspace};
use crate::error::{Error, Result};
use crate::extract::{ArchiveLimits, extract};
use crate::lockdown::SelfConfinement;
use crate::policy::ProgramPolicy;
use crate::result::{self, Answer, Outcome};
use crate::run::{Runner, WorkspaceSource, chown_tree};
use airlock_proto::bundle::ExecRequest;
use airlock_proto::envelope::{Action, Envelope};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// Everything fixed at start that shapes how requests are handled.
#[derive(Debug)]
pub struct Settings {
    /// Program allowlists.
    pub programs: ProgramPolicy,
    /// Credential-path allowances.
    pub credentials: CredentialPolicy,
    /// Archive bounds.
    pub archive: ArchiveLimits,
    /// Largest source archive.
    pub max_archive_bytes: u64,
    /// Largest changed or captured file.
    pub max_file_bytes: u64,
    /// How commands are confined: the spawner (none in tests that never
    /// reach a command; a command then fails with SANDBOX_UNAVAILABLE).
    pub runner: Option<Runner>,
    /// Where per-request workspaces are made.
    pub work_root: PathBuf,
    /// The executor's own confinement.
    pub own: Option<SelfConfinement>,
}

/// Handles one request. `expected_id` is the id its file name carries
/// (None for `run-once`); `archive` yields the raw archive bytes.
pub fn handle(
    settings: &Settings,
    expected_id: Option<&str>,
    request_bytes: Result<Vec<u8>>,
    archive: impl FnOnce(&ExecRequest) -> Result<Vec<u8>>,
) -> Answer {
    let fallback_id = expected_id.unwrap_or("unknown").to_owned();
    let request = match request_bytes.and_then(|b| parse(&b, expected_id)) {
        Ok(r) => r,
        Err(e) => return Answer::Failure(result::failure(&fallback_id, None, &e)),
    };
    match execute(settings, &request, archive) {
        Ok(answer) => answer,
        Err(e) => Answer::Failure(result::failure(&request.request_id, Some(&request), &e)),
    }
}

/// Steps 1–2.
pub fn parse(bytes: &[u8], expected_id: Option<&str>) -> Result<ExecRequest> {
    let request: ExecRequest =
        serde_json::from_slice(bytes).map_err(|e| Error::RequestParse(e.to_string()))?;
    if let Some(id) = expected_id {
        if request.request_id != id {
            return Err(Error::RequestInvalid(airlock_proto::Error::with(
                airlock_proto::Code::SPOOL_DIGEST_MISMATCH,
                "request id differs from its file name",
            )));
        }
    }
    request.validate().map_err(Error::RequestInvalid)?;
    Ok(request)
}

fn execute(
    settings: &Settings,
    request: &ExecRequest,
    archive: impl FnOnce(&ExecRequest) -> Result<Vec<u8>>,
) -> Result<Answer> {
    // 3. The envelope.
    let envelope =
        Envelope::validate(&request.envelope, None, None).map_err(Error::EnvelopeInvalid)?;
    // 4. Every command is allowed, before anything runs.
    for cmd in &envelope.verification {
        settings.programs.check(cmd)?;
    }
    // 5. The archive.
    let bytes = archive(request)?;
    if bytes.len() as u64 > settings.max_archive_bytes {
        return Err(Error::ArchiveInvalid(format!(
            "larger than {} bytes",
            settings.max_archive_bytes
        )));
    }
    if bytes.len() as u64 != request.source_archive_bytes {
        return Err(Error::ArchiveInvalid(format!(
            "{} bytes, the request says {}",
            bytes.len(),
            request.source_archive_bytes
        )));
    }
    let actual = hex::encode(Sha256::digest(&bytes));
    if actual != request.source_archive_sha256 {
        return Err(Error::ArchiveDigest(format!(
            "sha256 {actual}, the request says {}",
            request.source_archive_sha256
        )));
    }
    // 6–8 in a fresh directory that is removed whatever happens.
    let dir = Scratch::create(&settings.work_root, &request.request_id)?;
    let answer = in_workspace(settings, request, &envelope, &bytes, &dir.path);
    drop(dir);
    answer
}

fn in_workspace(
    settings: &Settings,
    request: &ExecRequest,
    envelope: &Envelope,
    archive: &[u8],
    dir: &Path,
) -> Result<Answer> {
    let src = dir.join("src");
    mkdir(&src, 0o755)?;
    let ws = Workspace::open(&src, settings.max_file_bytes)?;
    extract(archive, ws.root(), &settings.archive, &settings.credentials)?;
    let mut outcome = Outcome {
        passed: true,
        ..Outcome::default()
    };
    let mut confinements = Vec::new();
    match envelope.action {
        Action::SourceCapture => {
            outcome.captured_files = ws.entries(&envelope.capture_paths, &settings.credentials)?;
        }
        Action::Deterministic => {
            let touched = ws.apply(&envelope.change_set, &settings.credentials)?;
            outcome.changed_files = ws.entries(&touched, &settings.credentials)?;
            let runner = match (&settings.runner, envelope.verification.is_empty()) {
                (_, true) => None,
                (Some(r), false) => Some(r),
                (None, false) => {
                    return Err(Error::ConfineSpawn("no spawner to run commands".into()));
                }
            };
            if let Some(runner) = runner.filter(|_| rustix::process::geteuid().is_root()) {
                // Run as root, the spawner runs as the commands' uid.
                let (uid, gid) = runner.hello().ids;
                chown_tree(&src, uid, gid).map_err(|e| Error::Setup {
                    path: src.clone(),
                    detail: format!("chown to {uid}:{gid}: {e}"),
                })?;
            }
            let source = WorkspaceSource::Dir(src.clone());
            for (i, cmd) in envelope.verification.iter().enumerate() {
                // The working directory must be a real directory beneath the
                // workspace now (a previous command may have replaced it).
                if cmd.cwd != "." && crate::beneath::dir(ws.root(), &cmd.cwd, false)?.is_none() {
                    return Err(Error::PathInvalid {
                        path: cmd.cwd.clone(),
                        why: "working directory does not exist",
                    });
                }
                let Some(runner) = runner else { break };
                let (evidence, confinement) = runner.run(cmd, &source, dir, i)?;
                let ok = evidence.exit_code == Some(0) && !evidence.timed_out;
                outcome.verification.push(evidence);
                confinements.push(confinement);
                if !ok {
                    outcome.passed = false;
                    break;
                }
            }
        }
    }
    let report = result::confinement_report(settings.own.as_ref(), &confinements);
    let r = result::result(request, &envelope.execution_digest, outcome, report)?;
    Ok(Answer::Result(Box::new(r)))
}

fn mkdir(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .mode(mode)
        .create(path)
        .map_err(|e| Error::Setup {
            path: path.to_owned(),
            detail: e.to_string(),
        })
}

/// `work_root/<request_id>`, made fresh and removed on drop.
struct Scratch {
    path: PathBuf,
}

impl Scratch {
    fn create(work_root: &Path, request_id: &str) -> Result<Self> {
        // request_id has been validated (r + 40 hex), so it is a plain name.
        let path = work_root.join(request_id);
        if std::fs::symlink_metadata(&path).is_ok() {
            // Left over from a crash: std's remove_dir_all never follows symlinks.
            std::fs::remove_dir_all(&path).map_err(|e| Error::Setup {
                path: path.clone(),
                detail: format!("cannot remove a stale workspace: {e}"),
            })?;
        }
        mkdir(&path, 0o711)?;
        Ok(Scratch { path })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

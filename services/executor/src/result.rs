//! Building what the executor answers: an `ExecResult` bound by digests to
//! its request, or an `ExecFailure` carrying the refusal code — rendered
//! as canonical JSON and checked before it is published.

use crate::error::{Error, Result};
use crate::lockdown::SelfConfinement;
use crate::run::Confinement;
use airlock_proto::bundle::{
    CommandEvidence, ConfinementReport, EXEC_FAILURE_SCHEMA, EXEC_RESULT_SCHEMA, ExecFailure,
    ExecRequest, ExecResult, FileEntry,
};
use airlock_proto::canonical::canonical_of;
use airlock_proto::limits::MAX_MESSAGE_BYTES;

/// What the executor answers for one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The request was carried out (its commands may still have failed: see `passed`).
    Result(Box<ExecResult>),
    /// The request was refused.
    Failure(ExecFailure),
}

impl Answer {
    /// Canonical JSON bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let text = match self {
            Answer::Result(r) => canonical_of(r.as_ref()),
            Answer::Failure(f) => canonical_of(f),
        }
        .map_err(|e| Error::RequestParse(e.to_string()))?;
        if text.len() > MAX_MESSAGE_BYTES {
            return Err(Error::ResultTooLarge(text.len()));
        }
        Ok(text.into_bytes())
    }
}

/// Combines the per-command reports: the weakest of them. With no command,
/// the executor's own confinement is reported (and no seccomp, no
/// namespaces, since none were set up).
pub fn confinement_report(
    own: Option<&SelfConfinement>,
    commands: &[Confinement],
) -> ConfinementReport {
    // Commands run as the executor's own uid (no setuid in between).
    let uid = rustix::process::getuid().as_raw();
    if commands.is_empty() {
        return ConfinementReport {
            landlock_abi: own.map_or(0, |o| o.abi),
            landlock: own.map_or("none", |o| o.status).to_owned(),
            seccomp: false,
            namespaces: Vec::new(),
            view: "none".to_owned(),
            uid: Some(uid),
            layer: None,
        };
    }
    let mut namespaces = commands[0].namespaces.clone();
    namespaces.retain(|n| commands.iter().all(|c| c.namespaces.contains(n)));
    let full = commands.iter().all(|c| c.landlock_full) && own.is_none_or(|o| o.status == "full");
    ConfinementReport {
        landlock_abi: commands.iter().map(|c| c.landlock_abi).min().unwrap_or(0),
        landlock: if full { "full" } else { "degraded" }.to_owned(),
        seccomp: commands.iter().all(|c| c.seccomp),
        namespaces,
        uid: Some(uid),
        view: if commands
            .iter()
            .all(|c| c.view == airlock_sandbox::ViewMode::MinimalRoot)
        {
            airlock_sandbox::ViewMode::MinimalRoot.as_str()
        } else {
            airlock_sandbox::ViewMode::HostView.as_str()
        }
        .to_owned(),
        layer: None,
    }
}

/// The parts of a result besides its bindings.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Files of the change set, read back before the commands ran.
    pub changed_files: Vec<FileEntry>,
    /// Files returned by a source capture.
    pub captured_files: Vec<FileEntry>,
    /// Capture paths the credential policy withholds.
    pub withheld_paths: Vec<String>,
    /// Evidence of each command that ran.
    pub verification: Vec<CommandEvidence>,
    /// True when every command exited 0 in time.
    pub passed: bool,
}

/// A result bound to `request` by its digest, execution digest and source tree.
pub fn result(
    request: &ExecRequest,
    execution_digest: &str,
    outcome: Outcome,
    confinement: ConfinementReport,
) -> Result<ExecResult> {
    let r = ExecResult {
        schema: EXEC_RESULT_SCHEMA.to_owned(),
        request_id: request.request_id.clone(),
        request_sha256: request.digest(),
        execution_digest: execution_digest.to_owned(),
        source_tree: request.source_tree.clone(),
        passed: outcome.passed,
        changed_files: outcome.changed_files,
        captured_files: outcome.captured_files,
        withheld_paths: outcome.withheld_paths,
        verification: outcome.verification,
        confinement,
    };
    r.validate_against(request).map_err(Error::RequestInvalid)?;
    Ok(r)
}

/// A failure record for `request_id`.
pub fn failure(request_id: &str, request: Option<&ExecRequest>, error: &Error) -> ExecFailure {
    let mut detail = error.to_string();
    if detail.len() > 4096 {
        let mut cut = 4096;
        while !detail.is_char_boundary(cut) {
            cut -= 1;
        }
        detail.truncate(cut);
    }
    ExecFailure {
        schema: EXEC_FAILURE_SCHEMA.to_owned(),
        request_id: request_id.to_owned(),
        request_sha256: request.map(ExecRequest::digest),
        code: error.code().as_str().to_owned(),
        detail,
    }
}

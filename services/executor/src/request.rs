//! One request, start to finish, in a fixed order of steps (each failing
//! hard with its own code):
//!
//! 1. parse the ExecRequest strictly (unknown fields refused);
//! 2. its id must be the file's name and derived from its envelope;
//! 3. validate the envelope (schema, binding, governance, digest);
//! 4. check every verification command against the program policy;
//! 5. the source: the tree cache's entry for the request's `source_tree`,
//!    filled (when missing) only from an archive that hashes to that tree;
//! 6. a workspace over it: in the minimal root an overlay whose upper
//!    directory receives the change set (files copied up, deletions as
//!    whiteouts) — O(change), whatever the repository's size; in the host
//!    view a copy of the tree (reflinked where the file system can);
//! 7. deterministic: apply the change set, read the changed paths back
//!    (this content, not whatever the commands leave, is the result); when
//!    the repository's environment has a setup, take its dependency layer
//!    from the cache or make it ([`crate::setup`]) and show it to every
//!    command (read-only below the workspace and HOME); run each command
//!    in its own sandbox, stopping at the first that fails;
//!    source_capture: read the requested paths from the tree, withholding
//!    every credential-like path (listed, never read);
//! 8. bind the result to the request by digests.
//!
//! The per-request directory is removed afterwards, whatever happened.

use crate::apply::{CredentialPolicy, Workspace};
use crate::beneath;
use crate::error::{Error, Result};
use crate::lockdown::SelfConfinement;
use crate::policy::ProgramPolicy;
use crate::result::{self, Answer, Outcome};
use crate::run::{Runner, WorkspaceSource};
use crate::tree::Cached;
use crate::tree::extract::ArchiveLimits;
use crate::tree::fs::{chown_tree, copy_into, copy_tree, mkdir, remove_tree};
use airlock_proto::bundle::ExecRequest;
use airlock_proto::envelope::{Action, Change, Envelope};
use airlock_sandbox::ViewMode;
use std::path::{Path, PathBuf};

/// Everything fixed at start that shapes how requests are handled.
#[derive(Debug)]
pub struct Settings {
    /// Program allowlists.
    pub programs: ProgramPolicy,
    /// Each repository's verification environment.
    pub environments: crate::environment::Environments,
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
    /// The dependency layer cache (`<work>/layers`).
    pub layers: crate::layer::LayerCache,
    /// airlock-egress's socket, for setups.
    pub egress_socket: PathBuf,
}

/// Handles one request. `expected_id` is the id its file name carries
/// (None for `run-once`); `source` yields the request's cached tree
/// (filling the cache from an archive when it must).
pub fn handle(
    settings: &Settings,
    expected_id: Option<&str>,
    request_bytes: Result<Vec<u8>>,
    source: impl FnOnce(&ExecRequest) -> Result<Cached>,
) -> Answer {
    let fallback_id = expected_id.unwrap_or("unknown").to_owned();
    let request = match request_bytes.and_then(|b| parse(&b, expected_id)) {
        Ok(r) => r,
        Err(e) => return Answer::Failure(result::failure(&fallback_id, None, &e)),
    };
    handle_parsed(settings, &request, source)
}

/// [`handle`] for a request already parsed (steps 3–8).
pub fn handle_parsed(
    settings: &Settings,
    request: &ExecRequest,
    source: impl FnOnce(&ExecRequest) -> Result<Cached>,
) -> Answer {
    match execute(settings, request, source) {
        Ok(answer) => answer,
        Err(e) => Answer::Failure(result::failure(&request.request_id, Some(request), &e)),
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
    source: impl FnOnce(&ExecRequest) -> Result<Cached>,
) -> Result<Answer> {
    // 3. The envelope.
    let envelope =
        Envelope::validate(&request.envelope, None, None).map_err(Error::EnvelopeInvalid)?;
    // 4. Every command is allowed, before anything runs: by the
    // executor's programs, or by its repository's environment.
    let environment = settings
        .environments
        .for_repository(&envelope.binding.repository)?;
    let extra = environment.map(|e| e.programs.as_slice()).unwrap_or(&[]);
    for cmd in &envelope.verification {
        settings.programs.check_with(cmd, extra)?;
    }
    // 5. The source tree.
    let tree = source(request)?;
    if tree.tree != request.source_tree {
        return Err(Error::ArchiveDigest(format!(
            "the cache gave tree {}, the request names {}",
            tree.tree, request.source_tree
        )));
    }
    // 6–8 in a fresh directory that is removed whatever happens.
    let dir = Scratch::create(&settings.work_root, &request.request_id)?;
    let answer = in_workspace(settings, request, &envelope, &tree, &dir.path);
    drop(dir);
    answer
}

/// The runner and the commands' ids when the executor is root (they must
/// own what the spawner mounts for them).
fn runner_for<'a>(settings: &'a Settings, envelope: &Envelope) -> Result<Option<&'a Runner>> {
    match (&settings.runner, envelope.verification.is_empty()) {
        (_, true) => Ok(None),
        (Some(r), false) => Ok(Some(r)),
        (None, false) => Err(Error::ConfineSpawn("no spawner to run commands".into())),
    }
}

fn in_workspace(
    settings: &Settings,
    request: &ExecRequest,
    envelope: &Envelope,
    tree: &Cached,
    dir: &Path,
) -> Result<Answer> {
    let lower = Workspace::open(&tree.path, settings.max_file_bytes)?;
    let mut outcome = Outcome {
        passed: true,
        ..Outcome::default()
    };
    let mut confinements = Vec::new();
    let mut layer_evidence = None;
    match envelope.action {
        Action::SourceCapture => {
            // A credential-like path is withheld, not read: the tree
            // cache never holds its content anyway (extract leaves it out).
            let (mut withheld, wanted): (Vec<String>, Vec<String>) = envelope
                .capture_paths
                .iter()
                .cloned()
                .partition(|p| settings.credentials.denies(p));
            withheld.sort();
            withheld.dedup();
            outcome.captured_files = lower.entries(&wanted, &settings.credentials)?;
            outcome.withheld_paths = withheld;
        }
        Action::Deterministic => {
            let runner = runner_for(settings, envelope)?;
            // An overlay where the spawner can mount one (the minimal root,
            // and a work root overlayfs accepts), else a copy of the tree.
            let overlay = runner
                .is_none_or(|r| r.view() == ViewMode::MinimalRoot && r.hello().overlay.is_ok());
            let (source, ws) = if overlay {
                let upper = dir.join("upper");
                let work = dir.join("ovl");
                mkdir(&upper, 0o755)?;
                mkdir(&work, 0o755)?;
                let ws = Workspace::open(&upper, settings.max_file_bytes)?;
                outcome.changed_files =
                    apply_layered(&lower, &ws, &envelope.change_set, &settings.credentials)?;
                (
                    WorkspaceSource::Overlay {
                        lower: tree.path.clone(),
                        upper,
                        work,
                    },
                    ws,
                )
            } else {
                let src = dir.join("src");
                copy_tree(&tree.path, &src)?;
                let ws = Workspace::open(&src, settings.max_file_bytes)?;
                let touched = ws.apply(&envelope.change_set, &settings.credentials)?;
                outcome.changed_files = ws.entries(&touched, &settings.credentials)?;
                (WorkspaceSource::Dir(src), ws)
            };
            let environment = settings
                .environments
                .for_repository(&envelope.binding.repository)?;
            // The dependency layer, cached or made now, before anything of
            // the workspace changes hands.
            let mut layer = None;
            if let (Some(env), Some(runner)) = (environment, runner) {
                if let Some(setup) = &env.setup {
                    let applied = match &source {
                        WorkspaceSource::Overlay { lower, upper, .. } => {
                            crate::setup::Applied::Layered { lower, upper }
                        }
                        WorkspaceSource::Dir(d) => crate::setup::Applied::Dir(d),
                    };
                    let ctx = crate::setup::Context {
                        runner,
                        layers: &settings.layers,
                        egress_socket: &settings.egress_socket,
                        scratch: dir,
                        request_id: &request.request_id,
                        task_id: &envelope.binding.task_id,
                        environment_digest: &env.digest,
                        variables: &env.variables,
                    };
                    let (made, evidence) = crate::setup::layer(&ctx, setup, &applied)?;
                    if let (WorkspaceSource::Dir(d), Some(ws_part)) = (&source, made.workspace()) {
                        copy_into(&ws_part, d)?;
                    }
                    let home = setup
                        .outputs
                        .iter()
                        .filter_map(|o| o.strip_prefix("~/"))
                        .filter_map(|rel| Some((made.home(rel)?, rel.to_owned())))
                        .collect::<Vec<_>>();
                    layer = Some((made, evidence, home));
                }
            }
            if let Some(runner) = runner.filter(|_| rustix::process::geteuid().is_root()) {
                // Run as root, the spawner runs as the commands' uid.
                let (uid, gid) = runner.hello().ids;
                chown_tree(dir, uid, gid).map_err(|e| Error::Setup {
                    path: dir.to_owned(),
                    detail: format!("chown to {uid}:{gid}: {e}"),
                })?;
            }
            let Some(runner) = runner else {
                let report = result::confinement_report(settings.own.as_ref(), &[]);
                let r = result::result(request, &envelope.execution_digest, outcome, report)?;
                return Ok(Answer::Result(Box::new(r)));
            };
            for (i, cmd) in envelope.verification.iter().enumerate() {
                // The working directory must be a real directory in the
                // workspace now (a previous command may have replaced it).
                if cmd.cwd != "." && !dir_exists(&ws, overlay.then_some(&lower), &cmd.cwd)? {
                    return Err(Error::PathInvalid {
                        path: cmd.cwd.clone(),
                        why: "working directory does not exist",
                    });
                }
                let extras = crate::run::Extras {
                    variables: environment.map(|e| &e.variables),
                    layers: match (&source, &layer) {
                        (WorkspaceSource::Overlay { .. }, Some((made, _, _))) => {
                            made.workspace().into_iter().collect()
                        }
                        _ => Vec::new(),
                    },
                    home: layer.as_ref().map(|l| l.2.clone()).unwrap_or_default(),
                    known: crate::run::known_values(&request.request_id, envelope),
                    ..Default::default()
                };
                let (evidence, confinement) = runner.run(cmd, &source, dir, i, extras)?;
                let ok = evidence.exit_code == Some(0) && !evidence.timed_out;
                outcome.verification.push(evidence);
                confinements.push(confinement);
                if !ok {
                    outcome.passed = false;
                    break;
                }
            }
            layer_evidence = layer.map(|l| l.1);
        }
    }
    let mut report = result::confinement_report(settings.own.as_ref(), &confinements);
    report.layer = layer_evidence;
    let r = result::result(request, &envelope.execution_digest, outcome, report)?;
    Ok(Answer::Result(Box::new(r)))
}

/// Whether `rel` is a directory of the workspace (the upper layer, else
/// the tree beneath it).
fn dir_exists(ws: &Workspace, lower: Option<&Workspace>, rel: &str) -> Result<bool> {
    if beneath::dir(ws.root(), rel, false)?.is_some() {
        return Ok(true);
    }
    match lower {
        Some(l) => Ok(beneath::dir(l.root(), rel, false)?.is_some()),
        None => Ok(false),
    }
}

/// Applies `changes` to `upper`, an overlay's upper directory over `lower`:
/// each path's file or link is copied up first (so a replace or a guard
/// reads the tree's content), the change set is applied to the upper directory as to
/// any workspace, the changed files are read back, and each deleted file
/// the tree holds gets a whiteout (a character device 0/0), which hides it
/// in the overlay. Returns the changed files.
fn apply_layered(
    lower: &Workspace,
    upper: &Workspace,
    changes: &[Change],
    credentials: &CredentialPolicy,
) -> Result<Vec<airlock_proto::bundle::FileEntry>> {
    for change in changes {
        let rel = change.path();
        // Writing beneath a parent that is a file in the tree fails in a
        // plain workspace; in the upper directory it would create the
        // directory and hide the file: refuse it the same way.
        let creates = matches!(
            change,
            Change::WriteFile { .. } | Change::WriteSymlink { .. }
        );
        if let (true, (Some(parent), _)) = (creates, beneath::split(rel)) {
            beneath::dir(lower.root(), parent, false)?;
        }
        if upper.read_node(rel)?.is_none() {
            match lower.read_node(rel)? {
                Some(snap) if snap.symlink => upper.link(rel, &snap.bytes)?,
                Some(snap) => upper.put(rel, &snap.bytes, snap.executable)?,
                None => {}
            }
        }
    }
    let touched = upper.apply(changes, credentials)?;
    let entries = upper.entries(&touched, credentials)?;
    for e in entries.iter().filter(|e| e.deleted) {
        if lower.read_node(&e.path)?.is_some() {
            upper.whiteout(&e.path)?;
        }
    }
    Ok(entries)
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
            // Left over from a crash: never follows symlinks.
            remove_tree(&path);
            if std::fs::symlink_metadata(&path).is_ok() {
                return Err(Error::Setup {
                    path,
                    detail: "cannot remove a stale workspace".into(),
                });
            }
        }
        mkdir(&path, 0o711)?;
        Ok(Scratch { path })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        remove_tree(&self.path);
    }
}

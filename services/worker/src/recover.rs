//! Start-up recovery: stale workspaces, what an interrupted import left in
//! the repository root, and attempts to resume.

use crate::attempt::{Grant, Worker};
use airlock_proto::checkpoint::{Payload, Phase, ReconciliationPayload};
use airlock_proto::{Code, Error};
use std::path::Path;

/// Removes every `task-*` entry under `root` left by an earlier run, after
/// checking that each resolved path is directly inside `root`. Returns how
/// many were removed. Anything else in `root` is left alone and logged.
pub fn clean_workspaces(root: &Path) -> Result<usize, Error> {
    let io = |e: std::io::Error| {
        Error::with(Code::STORE_UNAVAILABLE, format!("{}: {e}", root.display()))
    };
    std::fs::create_dir_all(root).map_err(io)?;
    let canonical_root = root.canonicalize().map_err(io)?;
    let mut removed = 0;
    for entry in std::fs::read_dir(&canonical_root).map_err(io)? {
        let entry = entry.map_err(io)?;
        let name = entry.file_name();
        let path = entry.path();
        if !name.to_string_lossy().starts_with("task-") {
            tracing::warn!(
                "leaving unknown entry {} in the workspace root",
                path.display()
            );
            continue;
        }
        let meta = std::fs::symlink_metadata(&path).map_err(io)?;
        if meta.file_type().is_symlink() {
            std::fs::remove_file(&path).map_err(io)?;
        } else {
            let resolved = path.canonicalize().map_err(io)?;
            if resolved.parent() != Some(canonical_root.as_path()) {
                return Err(Error::with(
                    Code::PATH_ESCAPE,
                    format!("{} resolves outside {}", path.display(), root.display()),
                ));
            }
            if meta.is_dir() {
                std::fs::remove_dir_all(&resolved).map_err(io)?;
            } else {
                std::fs::remove_file(&resolved).map_err(io)?;
            }
        }
        removed += 1;
    }
    Ok(removed)
}

/// Removes what an interrupted `airlockctl repo add` left in the
/// repository root (`.NAME.git.tmp-PID` of a process gone,
/// [`airlock_git::remove_stale_imports`]), logging each; returns how many
/// were removed. One the worker may not remove (the import was cut before
/// it was given to the worker, so root's files) is logged and left for
/// the next `repo add`, which runs as root and removes it; it never stops
/// the start.
pub fn clean_imports(root: &Path) -> usize {
    let found = match airlock_git::remove_stale_imports(root) {
        Ok(found) => found,
        Err(e) => {
            tracing::warn!(
                "cannot look for interrupted imports in {}: {e}",
                root.display()
            );
            return 0;
        }
    };
    let mut removed = 0;
    for f in found {
        match f.removed {
            Ok(()) => {
                removed += 1;
                tracing::info!(path = %f.path.display(), pid = f.pid, "removed the leftover of an interrupted import");
            }
            Err(e) => tracing::warn!(
                path = %f.path.display(),
                pid = f.pid,
                "cannot remove the leftover of an interrupted import ({e}); the next `airlockctl repo add` removes it"
            ),
        }
    }
    removed
}

/// The attempts the journal left unfinished, with what is needed to resume
/// them: the lease from the claimed checkpoint and the kept envelope. An
/// attempt whose envelope is gone is marked reconciliation_required.
pub fn resumable(worker: &Worker) -> Result<Vec<Grant>, Error> {
    let heads = worker.with_journal(|j| j.unfinished())?;
    let mut grants = Vec::new();
    for head in heads {
        if head.phase == Phase::ReconciliationRequired {
            continue;
        }
        let history = worker.with_journal(|j| j.history(&head.task_id))?;
        let claimed = history
            .iter()
            .find(|c| c.attempt == head.attempt && c.phase == Phase::Claimed);
        // The lease, from the claimed checkpoint's typed payload; one that
        // does not decode is STORE_CORRUPT and the attempt cannot resume.
        let lease = match claimed.map(|c| c.decode()) {
            Some(Ok(Payload::Claimed(p))) => Ok((p.lease_epoch, p.lease_token)),
            Some(Ok(_)) => Err(Error::new(Code::INTERNAL)),
            Some(Err(e)) => Err(e),
            None => Err(Error::with(
                Code::INTERNAL,
                "no claimed checkpoint with a lease",
            )),
        };
        let envelope = worker.load_envelope(&head.binding.execution_digest);
        match (lease, envelope) {
            (Ok((lease_epoch, lease_token)), Ok(envelope)) => {
                grants.push(Grant {
                    attempt: head.attempt,
                    lease: airlock_proto::bus::LeaseRef {
                        task_id: head.task_id.clone(),
                        lease_epoch,
                        lease_token,
                    },
                    envelope,
                    resumed: true,
                });
            }
            (lease, envelope) => {
                let (code, why) = match (&lease, &envelope) {
                    (Err(e), _) => (e.code, format!("the claim's lease is unreadable: {e}")),
                    (_, Err(e)) => (Code::INTERNAL, format!("envelope unavailable: {e}")),
                    _ => (Code::INTERNAL, String::new()),
                };
                tracing::error!(task = %head.task_id, attempt = head.attempt, "cannot resume: {why}");
                let payload = Payload::ReconciliationRequired(ReconciliationPayload {
                    code,
                    detail: why,
                    commit_oid: None,
                    observed_head: None,
                });
                worker.with_journal(|j| j.append(&head.binding, &payload))?;
            }
        }
    }
    Ok(grants)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removes_only_task_entries_inside_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("ws");
        std::fs::create_dir_all(root.join("task-a/deep")).unwrap();
        std::fs::write(root.join("task-a/deep/f"), "x").unwrap();
        std::fs::write(root.join("task-b"), "x").unwrap();
        std::fs::write(root.join("keep.txt"), "x").unwrap();
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("precious"), "x").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("task-link")).unwrap();
        assert_eq!(clean_workspaces(&root).unwrap(), 3);
        assert!(!root.join("task-a").exists() && !root.join("task-b").exists());
        assert!(root.join("keep.txt").exists());
        assert!(
            outside.join("precious").exists(),
            "a symlink is removed, never followed"
        );
    }
}

//! The journal of a delta applied to a moved entry (`<entry>/advance.json`)
//! and what undoes it: written before anything changes, so that a crash
//! mid-assembly is rolled back onto the base at the next start
//! ([`roll_back`], from [`super::TreeCache::open`]).
//!
//! ```text
//! <work>/trees/<id>/advance.json   the journal (base, its seal, what changes)
//! <work>/trees/<id>/undo/<index>   each path the delta removed, kept until sealed
//! ```

use super::delta::Plan;
use super::fs::{remove_tree, setup_error};
use crate::error::Result;
use std::path::Path;

/// The record of a delta being applied to a moved entry
/// (`<entry>/advance.json`), written before anything changes: a crash
/// mid-assembly is undone from it at the next start ([`roll_back`]).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Journal {
    /// The tree the entry held.
    pub base: String,
    /// Its seal, as it was.
    pub base_seal: serde_json::Value,
    /// Paths removed, in order: each kept at `undo/<index>`.
    pub removed: Vec<String>,
    /// Paths made (directories before what they hold).
    pub created: Vec<String>,
    /// Tree objects added (hex ids).
    pub objects: Vec<String>,
}

/// The journal's file name in an entry.
pub const JOURNAL: &str = "advance.json";

impl Journal {
    /// The journal of applying `plan` to the entry of `base`.
    pub fn of(base: &str, base_seal: serde_json::Value, plan: &Plan) -> Journal {
        Journal {
            base: base.to_owned(),
            base_seal,
            removed: plan.remove.clone(),
            created: plan
                .mkdir
                .iter()
                .cloned()
                .chain(plan.write.iter().map(|(p, _, _)| p.clone()))
                .collect(),
            objects: plan.objects.iter().map(|(o, _)| hex::encode(o)).collect(),
        }
    }

    /// Writes it into `entry` (synced: it must be there before the first
    /// change is).
    pub fn write(&self, entry: &Path) -> Result<()> {
        let path = entry.join(JOURNAL);
        let bytes = serde_json::to_vec(self).map_err(|e| setup_error(e, &path))?;
        airlock_spool::publish_path(&path, &bytes).map_err(|e| setup_error(e, &path))?;
        Ok(())
    }
}

/// Undoes an interrupted application of a delta ([`super::advance`]) in
/// `entry` from its journal: what was made is removed, what was removed
/// is put back, the added tree objects go, and the base's seal is written
/// again without its boot id, so the entry is hashed in full on its first
/// use (renames changed its stamp). Returns the base tree.
pub fn roll_back(entry: &Path) -> Result<String> {
    let path = entry.join(JOURNAL);
    let bytes = std::fs::read(&path).map_err(|e| setup_error(e, &path))?;
    let journal: Journal = serde_json::from_slice(&bytes).map_err(|e| setup_error(e, &path))?;
    let tree = entry.join("tree");
    for p in journal.created.iter().rev() {
        let at = tree.join(p);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.is_dir() => remove_tree(&at),
            Ok(_) => std::fs::remove_file(&at).map_err(|e| setup_error(e, &at))?,
            Err(_) => {}
        }
    }
    for (i, p) in journal.removed.iter().enumerate() {
        let kept = entry.join("undo").join(i.to_string());
        if std::fs::symlink_metadata(&kept).is_ok() {
            let at = tree.join(p);
            std::fs::rename(&kept, &at).map_err(|e| setup_error(e, &at))?;
        }
    }
    for o in &journal.objects {
        let _ = std::fs::remove_file(entry.join("objects").join(o));
    }
    let mut seal = journal.base_seal;
    if let Some(obj) = seal.as_object_mut() {
        obj.remove("boot");
    }
    let seal_path = entry.join("seal.json");
    let seal_bytes = serde_json::to_vec(&seal).map_err(|e| setup_error(e, &seal_path))?;
    std::fs::write(&seal_path, seal_bytes).map_err(|e| setup_error(e, &seal_path))?;
    let _ = std::fs::remove_dir_all(entry.join("undo"));
    std::fs::remove_file(&path).map_err(|e| setup_error(e, &path))?;
    Ok(journal.base)
}

/// Removes what a sealed entry may still hold of the delta that made it
/// (its journal and undo directory: the delta was complete).
pub(super) fn tidy(entry: &Path) {
    let _ = std::fs::remove_file(entry.join(JOURNAL));
    let undo = entry.join("undo");
    if undo.exists() {
        remove_tree(&undo);
    }
}

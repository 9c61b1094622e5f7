//! What a tree-cache entry holds on disk besides its files: its seal
//! (`seal.json`: what the entry holds, its stamp, the boot it was stamped
//! in) and its git tree objects (`objects/<hex id>`).
//!
//! ```text
//! <work>/trees/<tree id>/seal.json    what the entry holds (files, bytes, the
//!                                      tree's entries that are not files, its stamp)
//! <work>/trees/<tree id>/objects/<id> the tree's git tree objects, by id
//! ```

use super::fs::setup_error;
use crate::error::Result;
use airlock_proto::tree::TreeEntry;
use serde::{Deserialize, Serialize};
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

/// Schema of a seal.
pub const SEAL_SCHEMA: &str = "airlock.tree-cache-seal.v4";

/// The schemas of seals written by earlier releases (v1 without a stamp,
/// v2 with a stamp over `tree/` alone and no tree objects, v3 with files
/// of their own rather than links to the blob store and a stamp over
/// their change times): hashed in full on first use, then given their
/// tree objects, linked to the blob store and stamped.
const SEAL_SCHEMAS_BEFORE: [&str; 3] = [
    "airlock.tree-cache-seal.v1",
    "airlock.tree-cache-seal.v2",
    "airlock.tree-cache-seal.v3",
];

/// What a sealed entry holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Seal {
    pub(super) schema: String,
    pub(super) tree: String,
    pub(super) files: u64,
    pub(super) bytes: u64,
    /// `(mode, id, path)` of the tree's entries that are not files here.
    pub(super) extras: Vec<(u32, String, String)>,
    /// [`super::Stamp`] of `tree/` when sealed; absent in a v1 seal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) stamp: Option<String>,
    /// The kernel's boot id when stamped: after a reboot (a power loss
    /// among them) the entry is hashed in full once, since unsynced data
    /// may be gone while its metadata stayed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) boot: Option<String>,
}

static BOOT_ID: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();

/// The kernel's boot id (`/proc/sys/kernel/random/boot_id`), read once:
/// call it before the lockdown, which leaves /proc out of reach; `None`
/// when it cannot be read (every entry is then hashed on first use).
pub fn boot_id() -> Option<String> {
    BOOT_ID
        .get_or_init(|| {
            std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
                .ok()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
        })
        .clone()
}

impl Seal {
    /// A current seal of `tree` over `extras`, stamped `stamp` in this boot.
    pub(super) fn new(
        tree: &str,
        (files, bytes): (u64, u64),
        extras: &[TreeEntry],
        stamp: String,
    ) -> Seal {
        Seal {
            schema: SEAL_SCHEMA.into(),
            tree: tree.to_owned(),
            files,
            bytes,
            extras: extras
                .iter()
                .map(|e| (e.mode, e.oid.clone(), e.path.clone()))
                .collect(),
            stamp: Some(stamp),
            boot: boot_id(),
        }
    }

    /// The seal of the entry at `entry`, which must be `tree`'s: a current
    /// one with its stamp, or one an earlier release wrote.
    pub(super) fn read(entry: &Path, tree: &str) -> Result<Seal> {
        let path = entry.join("seal.json");
        let bytes = airlock_spool::read_path(
            &path,
            &airlock_spool::Expect {
                owner_uid: rustix::process::geteuid().as_raw(),
                max_bytes: 64 << 20,
                sha256: None,
            },
        )
        .map_err(|e| setup_error(e, &path))?;
        let seal: Seal = serde_json::from_slice(&bytes).map_err(|e| setup_error(e, &path))?;
        let stamped = seal.schema == SEAL_SCHEMA && seal.stamp.is_some();
        let before = SEAL_SCHEMAS_BEFORE.contains(&seal.schema.as_str());
        if !(stamped || before) || seal.tree != tree {
            return Err(setup_error("a seal of another entry", &path));
        }
        Ok(seal)
    }

    /// Writes the seal into `dir` whole (a temporary file renamed over it).
    pub(super) fn write(&self, dir: &Path) -> Result<()> {
        let bytes = serde_json::to_vec(self).map_err(|e| setup_error(e, dir))?;
        let tmp = dir.join(".seal.json.tmp");
        std::fs::write(&tmp, bytes).map_err(|e| setup_error(e, &tmp))?;
        std::fs::rename(&tmp, dir.join("seal.json")).map_err(|e| setup_error(e, dir))
    }

    /// Makes it current, stamped `stamp` in this boot.
    pub(super) fn restamp(&mut self, stamp: String) {
        self.schema = SEAL_SCHEMA.into();
        self.stamp = Some(stamp);
        self.boot = boot_id();
    }

    /// Whether it is current and was stamped in this boot, so that the
    /// stamp alone checks the entry.
    pub(super) fn stamped_this_boot(&self) -> bool {
        let boot = boot_id();
        self.schema == SEAL_SCHEMA && boot.is_some() && self.boot == boot
    }

    /// The tree's entries that are not files here.
    pub(super) fn extras(&self) -> Vec<TreeEntry> {
        self.extras
            .iter()
            .map(|(mode, oid, path)| TreeEntry {
                mode: *mode,
                oid: oid.clone(),
                path: path.clone(),
            })
            .collect()
    }
}

/// Writes an entry's tree objects into its `objects/` (made if missing),
/// each as `<hex id>` holding its content.
pub(super) fn write_objects(entry: &Path, objects: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
    let dir = entry.join("objects");
    if !dir.is_dir() {
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| setup_error(e, &dir))?;
    }
    for (oid, body) in objects {
        let path = dir.join(hex::encode(oid));
        if !path.exists() {
            std::fs::write(&path, body).map_err(|e| setup_error(e, &path))?;
        }
    }
    Ok(())
}

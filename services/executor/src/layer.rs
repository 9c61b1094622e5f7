//! The dependency layer cache: what environments' setups produced, sealed
//! and keyed so that a task on the same lockfile runs no setup.
//!
//! ```text
//! <work>/layers/<key>/seal.json      the key, the content digest, bytes
//! <work>/layers/<key>/layer/ws/…      outputs in the workspace (node_modules)
//! <work>/layers/<key>/layer/home/…    outputs under HOME (~/.cargo/registry)
//! <work>/layers/.fill-<key>-<pid>/    a layer being made (removed at start)
//! ```
//!
//! - **Keyed by what determines it.** [`key`] is SHA-256 over the
//!   environment's digest (its paths, programs, variables and setup, all of
//!   it) and every input file's path and content: a changed lockfile, a
//!   changed setup command or a changed variable makes a new layer.
//! - **Self-verifying.** The seal records a digest over the layer's
//!   content ([`digest`]: every path, kind, executable bit, and content or
//!   link target); a layer is hashed again the first time this executor
//!   process uses it and removed when the digest differs.
//! - **Never writable by commands.** In the minimal root a layer is only
//!   ever a read-only lower layer of an overlay (overlayfs copies a file
//!   up before any change); elsewhere commands get a copy. No command's
//!   view holds the cache itself. Write bits of group and others are
//!   cleared when it is sealed.
//! - **Bounded.** At most `max_bytes` of files; the least recently used
//!   layers go first (use touches the seal).

use crate::error::Result;
use crate::tree::fs::{file_sha256, remove_tree, setup_error, walk};
use crate::tree::hold::{Hold, Holds, Makers, Making, least_recently_used};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

/// Schema of a layer's seal.
pub const LAYER_SEAL_SCHEMA: &str = "airlock.layer-seal.v1";

fn is_key(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The key of the layer for an environment (its digest) and the content of
/// the setup's inputs, `(path, SHA-256)` sorted by path.
pub fn key(environment_digest: &str, inputs: &[(String, String)]) -> String {
    let mut h = Sha256::new();
    h.update(b"airlock.layer-key.v1\0");
    h.update(environment_digest.as_bytes());
    h.update(b"\0");
    for (path, sha) in inputs {
        h.update(path.as_bytes());
        h.update(b"\0");
        h.update(sha.as_bytes());
        h.update(b"\n");
    }
    hex::encode(h.finalize())
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Seal {
    schema: String,
    key: String,
    digest: String,
    bytes: u64,
}

/// A sealed layer, held for the job that has it: never evicted while
/// this value (or a clone) lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layer {
    /// Its key.
    pub key: String,
    /// The digest of its content.
    pub digest: String,
    /// Bytes of files.
    pub bytes: u64,
    /// `…/layer`: `ws/` and `home/` beneath it.
    pub path: PathBuf,
    /// The job's hold on it.
    hold: Hold,
}

impl Layer {
    /// The workspace part, when the setup left one.
    pub fn workspace(&self) -> Option<PathBuf> {
        let p = self.path.join("ws");
        non_empty_dir(&p).then_some(p)
    }

    /// The HOME part of `output` (`~/rel`), when the setup left it.
    pub fn home(&self, rel: &str) -> Option<PathBuf> {
        let p = self.path.join("home").join(rel);
        p.is_dir().then_some(p)
    }
}

fn non_empty_dir(p: &Path) -> bool {
    std::fs::read_dir(p).is_ok_and(|mut d| d.next().is_some())
}

/// The cache in a work root.
#[derive(Debug)]
pub struct LayerCache {
    dir: PathBuf,
    max_bytes: u64,
    verified: Mutex<BTreeSet<String>>,
    /// The layers jobs use now: never evicted.
    holds: Holds,
    /// The layers a job's setup is making now: made once.
    makers: Makers,
}

impl LayerCache {
    /// Opens (creating) `<work_root>/layers`, removing half-made layers.
    /// Layers are verified when first used, not here.
    pub fn open(work_root: &Path, max_bytes: u64) -> Result<LayerCache> {
        let dir = work_root.join("layers");
        {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(&dir)
                .map_err(|e| setup_error(e, &dir))?;
        }
        for entry in std::fs::read_dir(&dir)
            .map_err(|e| setup_error(e, &dir))?
            .flatten()
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !is_key(&name) {
                remove_tree(&entry.path());
            }
        }
        Ok(LayerCache {
            dir,
            max_bytes,
            verified: Mutex::new(BTreeSet::new()),
            holds: Holds::default(),
            makers: Makers::default(),
        })
    }

    fn read_seal(&self, key: &str) -> Option<Seal> {
        let path = self.dir.join(key).join("seal.json");
        let bytes = airlock_spool::read_path(
            &path,
            &airlock_spool::Expect {
                owner_uid: rustix::process::geteuid().as_raw(),
                max_bytes: 1 << 20,
                sha256: None,
            },
        )
        .ok()?;
        let seal: Seal = serde_json::from_slice(&bytes).ok()?;
        (seal.schema == LAYER_SEAL_SCHEMA && seal.key == key).then_some(seal)
    }

    /// The layer for `key`, if cached and intact; marks it used. A layer
    /// whose content no longer matches its seal is removed.
    pub fn get(&self, key: &str) -> Option<Layer> {
        if !is_key(key) {
            return None;
        }
        let seal = self.read_seal(key)?;
        let entry = self.dir.join(key);
        let layer = Layer {
            key: key.to_owned(),
            digest: seal.digest.clone(),
            bytes: seal.bytes,
            path: entry.join("layer"),
            hold: self.holds.hold(key),
        };
        let mut verified = self.verified.lock().ok()?;
        if !verified.contains(key) {
            match digest(&layer.path) {
                Ok((d, _)) if d == seal.digest => {
                    verified.insert(key.to_owned());
                }
                _ => {
                    eprintln!(
                        "airlock-executor: dependency layer {key} does not match its seal; removed"
                    );
                    remove_tree(&entry);
                    return None;
                }
            }
        }
        let _ = std::fs::File::options()
            .append(true)
            .open(entry.join("seal.json"))
            .and_then(|f| f.set_modified(SystemTime::now()));
        Some(layer)
    }

    /// The claim on making the layer for `key`: waits while another job's
    /// setup makes it (the caller then finds it with [`LayerCache::get`]),
    /// so two jobs on one lockfile run its setup once.
    pub fn claim(&self, key: &str) -> Making<'_> {
        self.makers.claim(key)
    }

    /// A fresh directory to make the layer for `key` in (`ws/` and `home/`
    /// beneath it), on the cache's file system.
    pub fn staging(&self, key: &str) -> Result<PathBuf> {
        let path = self.dir.join(format!(".fill-{key}-{}", std::process::id()));
        remove_tree(&path);
        for d in [path.join("layer/ws"), path.join("layer/home")] {
            std::fs::create_dir_all(&d).map_err(|e| setup_error(e, &d))?;
        }
        Ok(path)
    }

    /// Seals `staging` (from [`LayerCache::staging`]) as the layer for
    /// `key`, then evicts what the bound needs.
    pub fn seal(&self, key: &str, staging: &Path) -> Result<Layer> {
        let content = staging.join("layer");
        lock_down(&content)?;
        let (digest, bytes) = digest(&content)?;
        let seal = Seal {
            schema: LAYER_SEAL_SCHEMA.into(),
            key: key.to_owned(),
            digest: digest.clone(),
            bytes,
        };
        let seal_path = staging.join("seal.json");
        std::fs::write(
            &seal_path,
            serde_json::to_vec(&seal).map_err(|e| setup_error(e, &seal_path))?,
        )
        .map_err(|e| setup_error(e, &seal_path))?;
        let entry = self.dir.join(key);
        remove_tree(&entry);
        std::fs::rename(staging, &entry).map_err(|e| setup_error(e, &entry))?;
        if let Ok(mut v) = self.verified.lock() {
            v.insert(key.to_owned());
        }
        let hold = self.holds.hold(key);
        self.evict(key);
        Ok(Layer {
            key: key.to_owned(),
            digest,
            bytes,
            path: entry.join("layer"),
            hold,
        })
    }

    /// Removes least recently used layers (never `keep`, nor one a job
    /// holds) until the bound holds.
    fn evict(&self, keep: &str) {
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let entries: Vec<(SystemTime, u64, String)> = dir
            .filter_map(|e| {
                let name = e.ok()?.file_name().to_string_lossy().into_owned();
                let seal = self.read_seal(&name)?;
                let used = std::fs::metadata(self.dir.join(&name).join("seal.json"))
                    .and_then(|m| m.modified())
                    .ok()?;
                Some((used, seal.bytes, name))
            })
            .collect();
        let evicted = least_recently_used(entries, u64::MAX, self.max_bytes, |name| {
            name == keep || self.holds.is_held(name)
        });
        for name in evicted {
            remove_tree(&self.dir.join(&name));
            if let Ok(mut v) = self.verified.lock() {
                v.remove(&name);
            }
        }
    }
}

/// Normalises modes beneath `root` (0755 directories and executables, 0644
/// other files: no write bit for group or others, no set-id bit) and,
/// when the executor is root, gives everything to root: the commands' uid
/// made these files, and must not be able to change them later.
fn lock_down(root: &Path) -> Result<()> {
    let root_owned = rustix::process::geteuid().is_root();
    walk(root, &mut |path, meta| {
        if root_owned {
            std::os::unix::fs::lchown(path, Some(0), Some(0)).map_err(|e| setup_error(e, path))?;
        }
        if !meta.file_type().is_symlink() {
            // Readable by everyone (the commands' uid sees root's files as
            // others'), executable where any execute bit was set, writable
            // by the owner alone; no set-id bit.
            let mode = if meta.is_dir() || meta.mode() & 0o111 != 0 {
                0o755
            } else {
                0o644
            };
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
                .map_err(|e| setup_error(e, path))?;
        }
        Ok(())
    })
}

/// SHA-256 over everything beneath `root` in path order — each entry's
/// relative path, its kind (directory, file with its executable bit,
/// symlink), and a file's content digest or a link's target — and the
/// bytes of its files. Anything else (a device, a socket) is an error.
pub fn digest(root: &Path) -> Result<(String, u64)> {
    let mut h = Sha256::new();
    let mut bytes = 0u64;
    h.update(b"airlock.layer-digest.v1\n");
    walk(root, &mut |path, meta| {
        let rel = path.strip_prefix(root).unwrap_or(path);
        h.update(rel.as_os_str().as_encoded_bytes());
        h.update(b"\0");
        let ft = meta.file_type();
        if ft.is_dir() {
            h.update(b"d\n");
        } else if ft.is_symlink() {
            let target = std::fs::read_link(path).map_err(|e| setup_error(e, path))?;
            h.update(b"l\0");
            h.update(target.as_os_str().as_encoded_bytes());
            h.update(b"\n");
        } else if ft.is_file() {
            h.update(if meta.mode() & 0o111 != 0 {
                b"x\0"
            } else {
                b"f\0"
            });
            h.update(file_sha256(path)?.as_bytes());
            h.update(b"\n");
            bytes += meta.len();
        } else {
            return Err(setup_error(
                "neither a file, a directory nor a symlink",
                path,
            ));
        }
        Ok(())
    })?;
    Ok((hex::encode(h.finalize()), bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_change_with_the_environment_and_every_input() {
        let inputs = vec![("Cargo.lock".to_owned(), "a".repeat(64))];
        let k = key("e1", &inputs);
        assert!(is_key(&k));
        assert_eq!(k, key("e1", &inputs));
        assert_ne!(k, key("e2", &inputs));
        let mut changed = inputs.clone();
        changed[0].1 = "b".repeat(64);
        assert_ne!(k, key("e1", &changed));
        assert_ne!(k, key("e1", &[]));
    }

    #[test]
    fn a_sealed_layer_is_reused_and_a_tampered_one_is_removed() {
        let work = tempfile::tempdir().unwrap();
        let cache = LayerCache::open(work.path(), 1 << 30).unwrap();
        let key = "c".repeat(64);
        assert!(cache.get(&key).is_none());
        let staging = cache.staging(&key).unwrap();
        std::fs::create_dir_all(staging.join("layer/ws/node_modules/a")).unwrap();
        std::fs::write(staging.join("layer/ws/node_modules/a/index.js"), b"x").unwrap();
        std::os::unix::fs::symlink("a/index.js", staging.join("layer/ws/node_modules/l")).unwrap();
        let sealed = cache.seal(&key, &staging).unwrap();
        assert_eq!(sealed.bytes, 1);
        assert!(sealed.workspace().is_some() && sealed.home(".cargo").is_none());
        let again = cache.get(&key).unwrap();
        assert_eq!(again, sealed);
        // A second executor process verifies before use: tampering shows.
        let fresh = LayerCache::open(work.path(), 1 << 30).unwrap();
        let file = sealed.path.join("ws/node_modules/a/index.js");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::write(&file, b"y").unwrap();
        assert!(fresh.get(&key).is_none());
        assert!(!work.path().join("layers").join(&key).exists());
    }

    #[test]
    fn the_bound_evicts_the_least_recently_used_layer() {
        let work = tempfile::tempdir().unwrap();
        let cache = LayerCache::open(work.path(), 3).unwrap();
        for (i, k) in ["a", "b"].iter().enumerate() {
            let key = k.repeat(64);
            let staging = cache.staging(&key).unwrap();
            std::fs::write(staging.join("layer/ws/f"), vec![0u8; 2]).unwrap();
            cache.seal(&key, &staging).unwrap();
            assert!(cache.get(&key).is_some(), "{i}");
        }
        assert!(cache.get(&"a".repeat(64)).is_none());
        assert!(cache.get(&"b".repeat(64)).is_some());
    }
}

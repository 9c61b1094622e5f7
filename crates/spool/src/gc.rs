//! Garbage collection, by the owning side only.
//!
//! A side cleans only the directories it writes ([`Side::writes`]), and in
//! them only regular files it owns whose names it recognises (its own
//! `<request_id>.<ext>` files and its own temporary files). Anything else —
//! a symlink, a directory, a FIFO, a file of another uid, an unknown name —
//! is reported as refused and left where it is.
//!
//! Only the owning side writes its directories, so nothing can swap an
//! entry between the `lstat` and the `unlink`.

use crate::error::{Error, Result};
use crate::file::{TEMP_PREFIX, io, kind_name};
use crate::{Kind, Side, Spool};
use rustix::fs::{AtFlags, FileType};
use rustix::io::Errno;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// What to collect.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcPolicy {
    /// Remove files (and stale temporary files) last modified longer ago than this.
    pub older_than: Option<Duration>,
    /// Remove the files of these finished request ids regardless of age.
    pub finished: Vec<String>,
}

/// What a collection did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Files removed.
    pub removed: Vec<PathBuf>,
    /// Entries that matched but were left alone, with the reason.
    pub refused: Vec<(PathBuf, String)>,
}

impl Spool {
    /// Collects garbage in `side`'s own directories. `own_uid` is the uid
    /// this side runs as; files of any other uid are refused.
    pub fn gc(&self, side: Side, own_uid: u32, policy: &GcPolicy) -> Result<GcReport> {
        let cutoff = policy
            .older_than
            .and_then(|age| SystemTime::now().checked_sub(age))
            .map(|t| t.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO));
        let mut report = GcReport::default();
        for &kind in side.writes() {
            let dir_path = self.dir_path(kind);
            for (name, _) in self.entries(kind)? {
                let path = dir_path.join(&name);
                let (finished, known) = match kind.parse_name(&name) {
                    Some(id) => (policy.finished.iter().any(|f| f == id), true),
                    None => (false, name.starts_with(TEMP_PREFIX)),
                };
                if !known {
                    report.refused.push((path, "unrecognised name".into()));
                    continue;
                }
                let st = match rustix::fs::statat(
                    self.dir(kind),
                    name.as_str(),
                    AtFlags::SYMLINK_NOFOLLOW,
                ) {
                    Ok(st) => st,
                    Err(Errno::NOENT) => continue,
                    Err(e) => {
                        return Err(Error::Stat {
                            path,
                            source: io(e),
                        });
                    }
                };
                let old = match cutoff {
                    Some(cutoff) => {
                        let mtime = Duration::new(
                            u64::try_from(st.st_mtime).unwrap_or(0),
                            u32::try_from(st.st_mtime_nsec).unwrap_or(0),
                        );
                        mtime < cutoff
                    }
                    None => false,
                };
                if !(finished || old) {
                    continue;
                }
                let ft = FileType::from_raw_mode(st.st_mode);
                if ft != FileType::RegularFile {
                    report
                        .refused
                        .push((path, format!("not a regular file ({})", kind_name(ft))));
                    continue;
                }
                if st.st_uid != own_uid {
                    report
                        .refused
                        .push((path, format!("owned by uid {}", st.st_uid)));
                    continue;
                }
                match rustix::fs::unlinkat(self.dir(kind), name.as_str(), AtFlags::empty()) {
                    Ok(()) | Err(Errno::NOENT) => report.removed.push(path),
                    Err(e) => {
                        return Err(Error::Remove {
                            path,
                            source: io(e),
                        });
                    }
                }
            }
            let _ = self.sync_dir(kind);
        }
        Ok(report)
    }

    fn sync_dir(&self, kind: Kind) -> Result<()> {
        rustix::fs::fsync(self.dir(kind)).map_err(|e| Error::SyncDir {
            path: self.dir_path(kind),
            source: io(e),
        })
    }
}

//! airlock-spool: the file exchange between the worker and the executor.
//!
//! ```text
//! <root>/requests/<request_id>.json   worker   → executor   (ExecRequest)
//! <root>/sources/<request_id>.tar     worker   → executor   (source archive)
//! <root>/results/<request_id>.json    executor → worker     (ExecResult)
//! <root>/failed/<request_id>.json     executor → worker     (ExecFailure)
//! <root>/wants/<request_id>.json      executor → worker     (SourceWanted: the
//!                                                          executor lacks the tree)
//! ```
//!
//! Every file is published atomically ([`Spool::publish`]: temporary name,
//! O_EXCL|O_NOFOLLOW, mode 0640, fsync, rename without replacing, fsync of
//! the directory) and read defensively ([`Spool::read`]: O_NOFOLLOW, a
//! regular singly-linked file on the opened descriptor, owned by the
//! expected producer uid, bounded, SHA-256-verified when a digest is
//! expected). Names are never chosen by the other side: they are always
//! `<request_id>.<ext>` with a request id of [`airlock_proto::bundle::is_request_id`]
//! form, recomputed or validated by the reader. [`Watcher`] wakes a side
//! when the other publishes; [`Spool::gc`] lets a side remove old files from
//! its own directories only.
//!
//! # Example
//!
//! ```
//! use airlock_spool::{Expect, Kind, Spool};
//! let root = tempfile::tempdir().unwrap();
//! Spool::create_layout(root.path()).unwrap();
//! let spool = Spool::open(root.path()).unwrap();
//! let id = airlock_proto::bundle::request_id_for("task-1", 1, &"d".repeat(64));
//! spool.publish(Kind::Requests, &id, b"{}").unwrap();
//! let me = rustix::process::getuid().as_raw();
//! let bytes = spool
//!     .read(Kind::Requests, &id, &Expect { owner_uid: me, max_bytes: 1024, sha256: None })
//!     .unwrap();
//! assert_eq!(bytes, b"{}");
//! ```

mod error;
mod file;
mod gc;
mod watch;

pub use error::{Error, Result};
pub use file::{Expect, FILE_MODE, publish_path, read_path};
pub use gc::{GcPolicy, GcReport};
pub use watch::{Wake, Watcher};

use airlock_proto::bundle::is_request_id;
use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::{AtFlags, FileType};
use rustix::io::Errno;
use std::path::{Path, PathBuf};

/// The five spool directories.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `requests/`: ExecRequest JSON, written by the worker.
    Requests,
    /// `sources/`: source archives, written by the worker.
    Sources,
    /// `results/`: ExecResult JSON, written by the executor.
    Results,
    /// `failed/`: ExecFailure JSON, written by the executor.
    Failed,
    /// `wants/`: SourceWanted JSON, written by the executor when it lacks a
    /// request's source tree.
    Wants,
}

impl Kind {
    /// Every directory, in layout order.
    pub const ALL: [Kind; 5] = [
        Kind::Requests,
        Kind::Sources,
        Kind::Results,
        Kind::Failed,
        Kind::Wants,
    ];

    /// The directory's name under the spool root.
    pub const fn dir_name(self) -> &'static str {
        match self {
            Kind::Requests => "requests",
            Kind::Sources => "sources",
            Kind::Results => "results",
            Kind::Failed => "failed",
            Kind::Wants => "wants",
        }
    }

    /// The extension of every file in the directory.
    pub const fn extension(self) -> &'static str {
        match self {
            Kind::Sources => "tar",
            _ => "json",
        }
    }

    /// The side that writes this directory.
    pub const fn producer(self) -> Side {
        match self {
            Kind::Requests | Kind::Sources => Side::Worker,
            Kind::Results | Kind::Failed | Kind::Wants => Side::Executor,
        }
    }

    /// `<request_id>.<ext>`, after checking the id's form.
    pub fn file_name(self, request_id: &str) -> Result<String> {
        if !is_request_id(request_id) {
            return Err(Error::InvalidName {
                name: request_id.to_owned(),
            });
        }
        Ok(format!("{request_id}.{}", self.extension()))
    }

    /// The request id of a well-formed name in this directory, or None.
    pub fn parse_name(self, name: &str) -> Option<&str> {
        let id = name.strip_suffix(self.extension())?.strip_suffix('.')?;
        is_request_id(id).then_some(id)
    }

    const fn index(self) -> usize {
        match self {
            Kind::Requests => 0,
            Kind::Sources => 1,
            Kind::Results => 2,
            Kind::Failed => 3,
            Kind::Wants => 4,
        }
    }
}

/// The two sides of the exchange.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    /// airlock-worker: writes requests and sources.
    Worker,
    /// airlock-executor: writes results and failures.
    Executor,
}

impl Side {
    /// The directories this side writes (and alone may clean).
    pub fn writes(self) -> &'static [Kind] {
        match self {
            Side::Worker => &[Kind::Requests, Kind::Sources],
            Side::Executor => &[Kind::Results, Kind::Failed, Kind::Wants],
        }
    }
}

/// A spool root with its five directories held open.
#[derive(Debug)]
pub struct Spool {
    root: PathBuf,
    dirs: [OwnedFd; 5],
}

impl Spool {
    /// Creates `root` and its five directories (mode 0750) where missing.
    /// Packaging normally does this (tmpfiles); tests and `airlock-local` use it.
    pub fn create_layout(root: &Path) -> std::io::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(root)?;
        for kind in Kind::ALL {
            let path = root.join(kind.dir_name());
            match std::fs::DirBuilder::new().mode(0o750).create(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Opens the five directories of `root`; none may be a symlink.
    pub fn open(root: &Path) -> Result<Self> {
        let root_fd = file::open_dir(root)?;
        let open = |kind: Kind| -> Result<OwnedFd> {
            let path = root.join(kind.dir_name());
            rustix::fs::openat(
                &root_fd,
                kind.dir_name(),
                rustix::fs::OFlags::RDONLY
                    | rustix::fs::OFlags::DIRECTORY
                    | rustix::fs::OFlags::NOFOLLOW
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .map_err(|e| Error::OpenDir {
                path,
                source: file::io(e),
            })
        };
        Ok(Spool {
            root: root.to_owned(),
            dirs: [
                open(Kind::Requests)?,
                open(Kind::Sources)?,
                open(Kind::Results)?,
                open(Kind::Failed)?,
                open(Kind::Wants)?,
            ],
        })
    }

    /// The spool root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The path of a directory (for messages and watches).
    pub fn dir_path(&self, kind: Kind) -> PathBuf {
        self.root.join(kind.dir_name())
    }

    fn dir(&self, kind: Kind) -> &OwnedFd {
        &self.dirs[kind.index()]
    }

    /// Publishes `bytes` as `<kind>/<request_id>.<ext>`, atomically and once:
    /// a second publication of the same name fails with
    /// [`Error::AlreadyPublished`] and leaves the first intact.
    pub fn publish(&self, kind: Kind, request_id: &str, bytes: &[u8]) -> Result<PathBuf> {
        self.publish_observed(kind, request_id, bytes, &mut || {})
    }

    /// [`Spool::publish`], calling `staged` once the temporary file is
    /// written and synced and before it is renamed into place: the window
    /// the power-loss matrix stops the worker in (its `spool_staged` fault
    /// point).
    pub fn publish_observed(
        &self,
        kind: Kind,
        request_id: &str,
        bytes: &[u8],
        staged: &mut dyn FnMut(),
    ) -> Result<PathBuf> {
        let name = kind.file_name(request_id)?;
        file::publish_at(
            self.dir(kind).as_fd(),
            &self.dir_path(kind),
            &name,
            bytes,
            staged,
        )
    }

    /// Reads `<kind>/<request_id>.<ext>` under the rules of [`Expect`].
    pub fn read(&self, kind: Kind, request_id: &str, expect: &Expect) -> Result<Vec<u8>> {
        let name = kind.file_name(request_id)?;
        file::read_at(self.dir(kind).as_fd(), &self.dir_path(kind), &name, expect)
    }

    /// True when `<kind>/<request_id>.<ext>` exists as anything (not followed).
    pub fn exists(&self, kind: Kind, request_id: &str) -> Result<bool> {
        let name = kind.file_name(request_id)?;
        match rustix::fs::statat(self.dir(kind), name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(_) => Ok(true),
            Err(Errno::NOENT) => Ok(false),
            Err(e) => Err(Error::Stat {
                path: self.dir_path(kind).join(name),
                source: file::io(e),
            }),
        }
    }

    /// The request ids of the well-formed names in a directory, sorted.
    /// Other names (temporary files, junk) are skipped, never opened.
    pub fn list(&self, kind: Kind) -> Result<Vec<String>> {
        let mut ids: Vec<String> = self
            .entries(kind)?
            .into_iter()
            .filter_map(|(name, _)| kind.parse_name(&name).map(str::to_owned))
            .collect();
        ids.sort();
        Ok(ids)
    }

    /// Every entry name of a directory with its type as reported by readdir.
    pub(crate) fn entries(&self, kind: Kind) -> Result<Vec<(String, FileType)>> {
        let path = self.dir_path(kind);
        let err = |e: Errno| Error::List {
            path: path.clone(),
            source: file::io(e),
        };
        let mut dir = rustix::fs::Dir::read_from(self.dir(kind)).map_err(err)?;
        dir.rewind();
        let mut out = Vec::new();
        while let Some(entry) = dir.read() {
            let entry = entry.map_err(err)?;
            let Ok(name) = entry.file_name().to_str() else {
                continue;
            };
            if name == "." || name == ".." {
                continue;
            }
            out.push((name.to_owned(), entry.file_type()));
        }
        Ok(out)
    }

    /// An inotify watcher on the given directories.
    pub fn watch(&self, kinds: &[Kind]) -> Result<Watcher> {
        let paths: Vec<(Kind, PathBuf)> = kinds.iter().map(|k| (*k, self.dir_path(*k))).collect();
        let refs: Vec<(Kind, &Path)> = paths.iter().map(|(k, p)| (*k, p.as_path())).collect();
        Watcher::new(&refs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_request_ids_with_the_directory_extension() {
        let id = airlock_proto::bundle::request_id_for("t", 1, &"a".repeat(64));
        assert_eq!(Kind::Sources.file_name(&id).unwrap(), format!("{id}.tar"));
        assert_eq!(
            Kind::Requests.parse_name(&format!("{id}.json")),
            Some(id.as_str())
        );
        assert_eq!(Kind::Requests.parse_name(&format!("{id}.tar")), None);
        assert_eq!(Kind::Requests.parse_name(".tmp-abc"), None);
        assert_eq!(Kind::Requests.parse_name("../../etc/passwd.json"), None);
        assert!(Kind::Results.file_name("../x").is_err());
        assert_eq!(Kind::Results.producer(), Side::Executor);
        assert_eq!(Side::Worker.writes(), &[Kind::Requests, Kind::Sources]);
    }
}

//! Applying a change set to the workspace, and reading files back out of it.
//!
//! Every access resolves beneath the workspace root with openat2
//! (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS): a
//! symlink anywhere on the path, planted or not, is never followed
//! (PATH_ESCAPE). Regular files are read, written and deleted; a symbolic
//! link as the last component is itself the thing a change reads (its
//! target), replaces (write_symlink) or deletes, never what it points to,
//! and write_file or replace_text on one is refused (PATH_ESCAPE).
//! For each change, in order: resolve (PATH_ESCAPE), credential policy
//! (CREDENTIAL_PATH_DENIED), the expected_sha256 guard over the file's
//! content or the link's target (SOURCE_DRIFT), then the operation
//! (REPLACE_SOURCE_MISSING, REPLACE_COUNT_INVALID). A write_symlink's
//! target was checked to stay inside the tree when the change was parsed.

use crate::beneath;
use crate::error::{Error, Result};
use airlock_proto::bundle::FileEntry;
use airlock_proto::envelope::Change;
use airlock_proto::path::is_credential_path;
use base64::Engine;
use rustix::fd::OwnedFd;
use rustix::fs::{AtFlags, FileType, OFlags};
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Which credential-like paths are nevertheless allowed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CredentialPolicy {
    /// Globs (`*` within a component, `?` one character, `**` any number
    /// of whole components) from `executor.allow_credential_paths`.
    pub allow: Vec<String>,
}

impl CredentialPolicy {
    /// True when `path` is credential-like and no allow glob matches it.
    pub fn denies(&self, path: &str) -> bool {
        is_credential_path(path) && !self.allow.iter().any(|g| glob_match(g, path))
    }
}

/// Matches a repository-relative path against a glob.
pub fn glob_match(glob: &str, path: &str) -> bool {
    let g: Vec<&str> = glob.split('/').collect();
    let p: Vec<&str> = path.split('/').collect();
    match_parts(&g, &p)
}

fn match_parts(g: &[&str], p: &[&str]) -> bool {
    match g.split_first() {
        None => p.is_empty(),
        Some((&"**", rest)) => (0..=p.len()).any(|i| match_parts(rest, &p[i..])),
        Some((first, rest)) => match p.split_first() {
            Some((name, prest)) => {
                match_component(first.as_bytes(), name.as_bytes()) && match_parts(rest, prest)
            }
            None => false,
        },
    }
}

fn match_component(g: &[u8], s: &[u8]) -> bool {
    match g.split_first() {
        None => s.is_empty(),
        Some((b'*', rest)) => (0..=s.len()).any(|i| match_component(rest, &s[i..])),
        Some((b'?', rest)) => !s.is_empty() && match_component(rest, &s[1..]),
        Some((c, rest)) => s.first() == Some(c) && match_component(rest, &s[1..]),
    }
}

/// A file (or a symbolic link) read out of the workspace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// Its bytes; a link's target.
    pub bytes: Vec<u8>,
    /// Any execute bit set (never for a link).
    pub executable: bool,
    /// True for a symbolic link.
    pub symlink: bool,
}

/// What the last component of a path is, found without following it.
enum Found {
    File(OwnedFd),
    Link(Vec<u8>),
}

/// A workspace directory held open; every access goes beneath it.
#[derive(Debug)]
pub struct Workspace {
    root: OwnedFd,
    path: PathBuf,
    max_file_bytes: u64,
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

impl Workspace {
    /// Opens an existing workspace directory (not following a symlink).
    pub fn open(path: &Path, max_file_bytes: u64) -> Result<Self> {
        let root = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| Error::Workspace {
            path: path.display().to_string(),
            source: e.into(),
        })?;
        Ok(Workspace {
            root,
            path: path.to_owned(),
            max_file_bytes,
        })
    }

    /// The workspace root descriptor.
    pub fn root(&self) -> &OwnedFd {
        &self.root
    }

    /// The workspace's absolute path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens an existing regular file for reading; None when it does not exist.
    fn open_regular(&self, rel: &str) -> Result<Option<OwnedFd>> {
        let fd = match beneath::open(
            &self.root,
            rel,
            OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY,
            0,
        ) {
            Ok(fd) => fd,
            // "a/b" where "a" is a file: b does not exist.
            Err(Error::PathInvalid { .. }) => None,
            Err(e) => return Err(e),
        };
        let Some(fd) = fd else { return Ok(None) };
        let (ft, _) = beneath::file_type(&fd, rel)?;
        if ft != FileType::RegularFile {
            return Err(Error::PathEscape {
                path: rel.to_owned(),
                why: "not a regular file",
            });
        }
        Ok(Some(fd))
    }

    fn read_fd(&self, fd: OwnedFd, rel: &str) -> Result<Snapshot> {
        let (_, st) = beneath::file_type(&fd, rel)?;
        let executable = st.st_mode & 0o111 != 0;
        let max = self.max_file_bytes;
        if u64::try_from(st.st_size).unwrap_or(u64::MAX) > max {
            return Err(Error::FileTooLarge {
                path: rel.to_owned(),
                max,
            });
        }
        let _ = rustix::fs::fcntl_setfl(&fd, OFlags::empty());
        let mut bytes = Vec::new();
        std::fs::File::from(fd)
            .take(max + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| Error::Workspace {
                path: rel.to_owned(),
                source: e,
            })?;
        if bytes.len() as u64 > max {
            return Err(Error::FileTooLarge {
                path: rel.to_owned(),
                max,
            });
        }
        Ok(Snapshot {
            bytes,
            executable,
            symlink: false,
        })
    }

    /// The directory holding `rel`'s last component, and that name; None
    /// when a parent is missing (or is a file).
    fn parent_of<'p>(&self, rel: &'p str) -> Result<Option<(OwnedFd, &'p str)>> {
        let (parent, name) = beneath::split(rel);
        let dir = match parent {
            Some(p) => match beneath::dir(&self.root, p, false) {
                Ok(Some(d)) => d,
                Ok(None) | Err(Error::PathInvalid { .. }) => return Ok(None),
                Err(e) => return Err(e),
            },
            None => rustix::io::dup(&self.root).map_err(|e| beneath::classify(rel, e))?,
        };
        Ok(Some((dir, name)))
    }

    /// Finds `rel`: a regular file (held open), a symbolic link (its
    /// target), or nothing; anything else, or a link on the way, is an
    /// error.
    fn find(&self, rel: &str) -> Result<Option<Found>> {
        let Some((dir, name)) = self.parent_of(rel)? else {
            return Ok(None);
        };
        match rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Symlink => {
                let target = rustix::fs::readlinkat(&dir, name, Vec::new())
                    .map_err(|e| beneath::classify(rel, e))?;
                Ok(Some(Found::Link(target.into_bytes())))
            }
            Ok(_) => Ok(self.open_regular(rel)?.map(Found::File)),
            Err(rustix::io::Errno::NOENT) => Ok(None),
            Err(e) => Err(beneath::classify(rel, e)),
        }
    }

    /// Reads a regular file or a symbolic link (its target, not followed);
    /// None when nothing is there.
    pub fn read_node(&self, rel: &str) -> Result<Option<Snapshot>> {
        match self.find(rel)? {
            Some(Found::File(fd)) => self.read_fd(fd, rel).map(Some),
            Some(Found::Link(target)) => Ok(Some(Snapshot {
                bytes: target,
                executable: false,
                symlink: true,
            })),
            None => Ok(None),
        }
    }

    /// Makes `rel` a symbolic link to `target`, replacing a file or a link
    /// there (creating parents).
    pub fn link(&self, rel: &str, target: &[u8]) -> Result<()> {
        let (dir, name) = beneath::parent_for_create(&self.root, rel)?;
        self.unlink_node(&dir, name, rel)?;
        let target = std::ffi::OsStr::from_bytes(target);
        rustix::fs::symlinkat(target, &dir, name).map_err(|e| beneath::classify(rel, e))
    }

    /// Removes the file or link `name` in `dir` (nothing there is fine);
    /// anything else is refused.
    fn unlink_node(&self, dir: &OwnedFd, name: &str, rel: &str) -> Result<()> {
        match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => {
                let ft = FileType::from_raw_mode(st.st_mode);
                if ft != FileType::RegularFile && ft != FileType::Symlink {
                    return Err(Error::PathEscape {
                        path: rel.to_owned(),
                        why: "not a regular file or a symbolic link",
                    });
                }
            }
            Err(rustix::io::Errno::NOENT) => return Ok(()),
            Err(e) => return Err(beneath::classify(rel, e)),
        }
        match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
            Err(e) => Err(beneath::classify(rel, e)),
        }
    }

    /// Reads a regular file; None when it does not exist.
    pub fn read(&self, rel: &str) -> Result<Option<Snapshot>> {
        match self.open_regular(rel)? {
            Some(fd) => self.read_fd(fd, rel).map(Some),
            None => Ok(None),
        }
    }

    fn write(&self, rel: &str, bytes: &[u8]) -> Result<()> {
        if bytes.len() as u64 > self.max_file_bytes {
            return Err(Error::FileTooLarge {
                path: rel.to_owned(),
                max: self.max_file_bytes,
            });
        }
        let (dir, name) = beneath::parent_for_create(&self.root, rel)?;
        let fd = beneath::open(
            &dir,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC,
            0o644,
        )?
        .ok_or_else(|| Error::PathInvalid {
            path: rel.to_owned(),
            why: "cannot create",
        })?;
        let (ft, _) = beneath::file_type(&fd, rel)?;
        if ft != FileType::RegularFile {
            return Err(Error::PathEscape {
                path: rel.to_owned(),
                why: "not a regular file",
            });
        }
        let mut file = std::fs::File::from(fd);
        file.write_all(bytes).map_err(|e| Error::Workspace {
            path: rel.to_owned(),
            source: e,
        })
    }

    /// Writes a regular file (creating parents), executable or not: how a
    /// file of the tree is copied into an overlay's upper directory.
    pub fn put(&self, rel: &str, bytes: &[u8], executable: bool) -> Result<()> {
        self.write(rel, bytes)?;
        let fd = self.open_regular(rel)?.ok_or_else(|| Error::PathInvalid {
            path: rel.to_owned(),
            why: "vanished while written",
        })?;
        let mode = if executable { 0o755 } else { 0o644 };
        rustix::fs::fchmod(&fd, rustix::fs::Mode::from_raw_mode(mode)).map_err(|e| {
            Error::Workspace {
                path: rel.to_owned(),
                source: e.into(),
            }
        })
    }

    /// Makes `rel` an overlay whiteout (a character device 0/0, which an
    /// unprivileged process may create): in the overlay, the lower layer's
    /// file at `rel` is gone. Parents are created as needed.
    pub fn whiteout(&self, rel: &str) -> Result<()> {
        let (dir, name) = beneath::parent_for_create(&self.root, rel)?;
        rustix::fs::mknodat(
            &dir,
            name,
            FileType::CharacterDevice,
            rustix::fs::Mode::empty(),
            rustix::fs::makedev(0, 0),
        )
        .map_err(|e| beneath::classify(rel, e))
    }

    fn delete(&self, rel: &str) -> Result<()> {
        match self.parent_of(rel)? {
            Some((dir, name)) => self.unlink_node(&dir, name, rel),
            None => Ok(()),
        }
    }

    /// Applies `changes` in order; returns the sorted, de-duplicated
    /// paths they touched (the only files a result may carry).
    pub fn apply(&self, changes: &[Change], credentials: &CredentialPolicy) -> Result<Vec<String>> {
        let mut touched: Vec<String> = Vec::new();
        for change in changes {
            let rel = change.path();
            // 1. Resolve: a link on the way or an escape fails here, before
            // anything else (a link as the last component is found, not
            // followed).
            let found = self.find(rel)?;
            // 2. Credential policy.
            if credentials.denies(rel) {
                return Err(Error::CredentialPath(rel.to_owned()));
            }
            let current = match found {
                Some(Found::File(fd)) => Some(self.read_fd(fd, rel)?),
                Some(Found::Link(target)) => Some(Snapshot {
                    bytes: target,
                    executable: false,
                    symlink: true,
                }),
                None => None,
            };
            if current.as_ref().is_some_and(|c| c.symlink)
                && matches!(
                    change,
                    Change::WriteFile { .. } | Change::ReplaceText { .. }
                )
            {
                return Err(Error::PathEscape {
                    path: rel.to_owned(),
                    why: "is a symbolic link (delete it first to write a file there)",
                });
            }
            // 3. Drift guard.
            if let Some(expected) = change.expected_sha256() {
                let found = current
                    .as_ref()
                    .map(|s| sha256_hex(&s.bytes))
                    .unwrap_or_else(|| "absent".to_owned());
                if found != expected {
                    return Err(Error::Drift {
                        path: rel.to_owned(),
                        expected: expected.to_owned(),
                        found,
                    });
                }
            }
            // 4. The operation.
            match change {
                Change::WriteFile { content, .. } => self.write(rel, content.as_bytes())?,
                Change::ReplaceText {
                    old, new, count, ..
                } => {
                    let snap = current.ok_or_else(|| Error::ReplaceMissing(rel.to_owned()))?;
                    let text = String::from_utf8(snap.bytes)
                        .map_err(|_| Error::NotText(rel.to_owned()))?;
                    let found = text.matches(old.as_str()).count();
                    if found != *count as usize {
                        return Err(Error::ReplaceCount {
                            path: rel.to_owned(),
                            expected: *count,
                            found,
                        });
                    }
                    self.write(rel, text.replace(old.as_str(), new).as_bytes())?;
                }
                Change::WriteSymlink { target, .. } => self.link(rel, target.as_bytes())?,
                Change::DeleteFile { .. } => self.delete(rel)?,
            }
            if !touched.iter().any(|t| t == rel) {
                touched.push(rel.to_owned());
            }
        }
        touched.sort();
        Ok(touched)
    }

    /// The current content of each path as result entries (deleted when
    /// absent; a symbolic link as itself, its target the content).
    pub fn entries(
        &self,
        paths: &[String],
        credentials: &CredentialPolicy,
    ) -> Result<Vec<FileEntry>> {
        let mut out = Vec::with_capacity(paths.len());
        for rel in paths {
            if credentials.denies(rel) {
                return Err(Error::CredentialPath(rel.clone()));
            }
            out.push(match self.read_node(rel)? {
                Some(snap) => FileEntry {
                    path: rel.clone(),
                    deleted: false,
                    sha256: Some(sha256_hex(&snap.bytes)),
                    executable: snap.executable,
                    content_b64: Some(
                        base64::engine::general_purpose::STANDARD.encode(&snap.bytes),
                    ),
                    symlink: snap.symlink,
                },
                None => FileEntry {
                    path: rel.clone(),
                    deleted: true,
                    sha256: None,
                    executable: false,
                    content_b64: None,
                    symlink: false,
                },
            });
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_whole_components() {
        assert!(glob_match(".env.example", ".env.example"));
        assert!(glob_match("config/*.pem", "config/test.pem"));
        assert!(!glob_match("config/*.pem", "config/sub/test.pem"));
        assert!(glob_match("fixtures/**", "fixtures/a/b/id_rsa"));
        assert!(glob_match("**/.env.test", "a/b/.env.test"));
        assert!(glob_match("**/.env.test", ".env.test"));
        assert!(glob_match("id_rsa.?ub", "id_rsa.pub"));
        assert!(!glob_match("fixtures/**", "other/id_rsa"));
    }

    #[test]
    fn credential_policy_allows_only_listed_globs() {
        let p = CredentialPolicy {
            allow: vec!["tests/fixtures/**".into()],
        };
        assert!(p.denies(".env"));
        assert!(p.denies("home/.ssh/id_rsa"));
        assert!(!p.denies("tests/fixtures/server.key"));
        assert!(!p.denies("src/main.rs"));
    }
}

//! A directory compared with the base: every file that differs.
//!
//! In a git work tree the files are those git would commit (tracked:
//! `git ls-files --stage`; untracked but not ignored: `git ls-files
//! --others --exclude-standard`), so build output and `__pycache__` stay
//! out, and
//! git's own index says which tracked files are as it recorded them: a
//! file `git diff-files` does not name (its stat cache, with git's own
//! content check for a racily clean entry) has the blob id its index entry
//! holds, so one whose entry matches the base's is not read, hashed or even
//! looked at here. The cost is git's stat of each file and the work on the
//! files that differ, not a hash of every file. In a plain directory every
//! file is compared. Symbolic links are never followed: a link is compared
//! by its target, and a new or retargeted one must point inside the tree.

use super::source::{Kind, SourceRepo};
use super::{Edit, is_text, refuse};
use airlock_proto::canonical::sha256_hex;
use airlock_proto::path::check_relative_path;
use airlock_proto::{Code, Error};
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// What a path is in the directory.
enum Here {
    Missing,
    File { executable: bool },
    Symlink(PathBuf),
    Directory,
}

fn here(dir: &Path, path: &str) -> Result<Here, Error> {
    let full = dir.join(path);
    match std::fs::symlink_metadata(&full) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Here::Missing),
        Err(e) => Err(Error::with(
            Code::SOURCE_ACCESS_DENIED,
            format!("{}: {e}", full.display()),
        )),
        Ok(m) if m.file_type().is_symlink() => {
            Ok(Here::Symlink(std::fs::read_link(&full).unwrap_or_default()))
        }
        Ok(m) if m.is_dir() => Ok(Here::Directory),
        Ok(m) if m.is_file() => Ok(Here::File {
            executable: m.permissions().mode() & 0o111 != 0,
        }),
        Ok(_) => Err(Error::with(
            Code::PROPOSAL_BINARY_CHANGE,
            format!("{path}: a special file (device, FIFO or socket)"),
        )),
    }
}

/// What git says of its work tree `dir`, its commands run side by side:
/// `git ls-files --stage`, `git diff-files --name-only` and `git ls-files
/// --others --exclude-standard`, as they printed it (NUL-separated).
struct GitTree {
    staged: String,
    changed: String,
    others: String,
}

/// A work tree's paths and what its index vouches for, borrowed from
/// [`GitTree`] (or the paths of a plain directory, with no index).
struct Seen<'a> {
    /// Every path git would commit (tracked, and untracked but not
    /// ignored), or every file of a plain directory.
    listed: Vec<&'a str>,
    /// The tracked files whose content is what their index entry records:
    /// path to (mode, blob id).
    unchanged: std::collections::HashMap<&'a str, (&'a str, &'a str)>,
}

impl GitTree {
    fn seen(&self) -> Seen<'_> {
        fn split(text: &str) -> Vec<&str> {
            text.split('\0').filter(|r| !r.is_empty()).collect()
        }
        let changed: std::collections::HashSet<&str> = split(&self.changed).into_iter().collect();
        let (mut listed, unchanged) = unchanged_in_index(split(&self.staged), &changed);
        listed.extend(split(&self.others));
        Seen { listed, unchanged }
    }
}

fn git_tree(dir: &Path) -> Result<GitTree, Error> {
    // The planner's own checkout, read through crates/git's command for a
    // repository owned by someone else (hooks, fsmonitor and helpers off,
    // this directory alone trusted).
    let repo = airlock_git::ForeignRepo::open(dir)
        .map_err(|e| Error::with(Code::REPOSITORY_SOURCE_INVALID, e.to_string()))?;
    let mut others = repo.command(&["ls-files", "-z", "--others", "--exclude-standard"]);
    // git's own configuration is not read, so the user's global ignore
    // file (git's default location for it) is named here.
    let xdg = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")));
    if let Some(ignore) = xdg.map(|d| d.join("git/ignore")).filter(|f| f.is_file()) {
        let mut arg = std::ffi::OsString::from("--exclude-from=");
        arg.push(ignore);
        others.arg(arg);
    }
    let mut commands = [
        repo.command(&["ls-files", "-z", "--stage"]),
        repo.command(&["diff-files", "-z", "--name-only", "--no-renames"]),
        others,
    ];
    let outputs: Vec<std::io::Result<std::process::Output>> = std::thread::scope(|s| {
        let running: Vec<_> = commands
            .iter_mut()
            .map(|c| s.spawn(move || c.output()))
            .collect();
        running
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("panicked")))
            })
            .collect()
    });
    let mut out = Vec::new();
    for (o, what) in
        outputs
            .into_iter()
            .zip(["ls-files --stage", "diff-files", "ls-files --others"])
    {
        let o = o.map_err(|e| Error::with(Code::GIT_FAILED, format!("cannot run git: {e}")))?;
        if !o.status.success() {
            return Err(Error::with(
                Code::GIT_FAILED,
                format!(
                    "git {what} in {}: {}",
                    dir.display(),
                    String::from_utf8_lossy(&o.stderr).trim()
                ),
            ));
        }
        out.push(o.stdout);
    }
    let mut text = out.into_iter().map(|bytes| {
        String::from_utf8(bytes)
            .map_err(|_| Error::with(Code::PATH_INVALID, "a path in the work tree is not UTF-8"))
    });
    let mut next = || text.next().unwrap_or_else(|| Ok(String::new()));
    Ok(GitTree {
        staged: next()?,
        changed: next()?,
        others: next()?,
    })
}

fn walk(root: &Path, prefix: &str, found: &mut BTreeSet<String>) -> Result<(), Error> {
    let dir = root.join(prefix);
    let entries = std::fs::read_dir(&dir).map_err(|e| {
        Error::with(
            Code::SOURCE_ACCESS_DENIED,
            format!("{}: {e}", dir.display()),
        )
    })?;
    for entry in entries {
        let entry = entry.map_err(|e| {
            Error::with(
                Code::SOURCE_ACCESS_DENIED,
                format!("{}: {e}", dir.display()),
            )
        })?;
        let name = entry.file_name().into_string().map_err(|n| {
            Error::with(
                Code::PATH_INVALID,
                format!("{n:?} in {}: not UTF-8", dir.display()),
            )
        })?;
        if prefix.is_empty() && name == ".git" {
            continue;
        }
        let rel = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        let kind = entry
            .file_type()
            .map_err(|e| Error::with(Code::SOURCE_ACCESS_DENIED, format!("{rel}: {e}")))?;
        if kind.is_dir() {
            walk(root, &rel, found)?;
        } else {
            found.insert(rel);
        }
    }
    Ok(())
}

/// From `git ls-files --stage` records and the paths `git diff-files`
/// names: every tracked path, and the tracked files whose content is what
/// their index entry records (mode and blob id), by path — every stage-0
/// entry git does not name. An entry of a path in conflict (stages 1-3)
/// is left out, as is every entry git names as changed, deleted or of
/// another type.
fn unchanged_in_index<'a>(
    staged: Vec<&'a str>,
    changed: &std::collections::HashSet<&str>,
) -> (
    Vec<&'a str>,
    std::collections::HashMap<&'a str, (&'a str, &'a str)>,
) {
    let mut tracked = Vec::with_capacity(staged.len());
    let mut entries = std::collections::HashMap::with_capacity(staged.len());
    let mut conflicted = Vec::new();
    for record in staged {
        // "<mode> <oid> <stage>\t<path>"
        let Some((meta, path)) = record.split_once('\t') else {
            continue;
        };
        let mut fields = meta.split(' ');
        let (Some(mode), Some(oid), Some(stage)) = (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        tracked.push(path);
        if stage != "0" {
            conflicted.push(path);
        } else if !changed.contains(path) {
            entries.insert(path, (mode, oid));
        }
    }
    for path in conflicted {
        entries.remove(path);
    }
    (tracked, entries)
}

/// The git mode of a tree entry's kind.
fn mode_of(kind: Kind) -> &'static str {
    match kind {
        Kind::File => "100644",
        Kind::Executable => "100755",
        Kind::Symlink => "120000",
        Kind::Submodule => "160000",
    }
}

/// Every difference between `dir` and the commit `head` of `repo`.
pub fn edits(repo: &SourceRepo, head: &str, dir: &Path) -> Result<Vec<Edit>, Error> {
    if !dir.is_dir() {
        return Err(Error::with(
            Code::SOURCE_ACCESS_DENIED,
            format!("{}: not a directory", dir.display()),
        ));
    }
    if !dir.join(".git").exists() {
        let absolute = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
        if let Some(top) = absolute
            .ancestors()
            .skip(1)
            .find(|a| a.join(".git").exists())
        {
            return Err(Error::with(
                Code::PATH_INVALID,
                format!(
                    "{} is inside the git work tree {}; give the work tree's top directory",
                    dir.display(),
                    top.display()
                ),
            ));
        }
    }
    // The base's tree is read while git looks at the work tree.
    let (tree, found) = std::thread::scope(|s| {
        let git = dir.join(".git").exists().then(|| s.spawn(|| git_tree(dir)));
        let tree = repo.tree(head);
        let found = git.map(|t| {
            t.join().unwrap_or_else(|_| {
                Err(Error::with(
                    Code::GIT_FAILED,
                    "reading the work tree panicked",
                ))
            })
        });
        (tree, found)
    });
    let tree = tree?;
    let git = found.transpose()?;
    let mut plain = BTreeSet::new();
    let seen = match &git {
        Some(g) => g.seen(),
        None => {
            walk(dir, "", &mut plain)?;
            Seen {
                listed: plain.iter().map(String::as_str).collect(),
                unchanged: std::collections::HashMap::new(),
            }
        }
    };
    // The paths to look at: the base's, but for those the index vouches
    // for as the base has them, and the work tree's the base lacks.
    let mut paths: BTreeSet<&str> = BTreeSet::new();
    for (path, b) in &tree {
        match seen.unchanged.get(path.as_str()) {
            Some((mode, oid)) if *oid == b.oid && *mode == mode_of(b.kind) => {}
            _ => {
                paths.insert(path);
            }
        }
    }
    for path in &seen.listed {
        let path = path.trim_end_matches('/');
        if !tree.contains_key(path) {
            paths.insert(path);
        }
    }

    // Regular files on both sides: compare blob ids first (hash-object
    // writes nothing), read contents only where they differ.
    let mut both: Vec<(&str, PathBuf)> = Vec::new();
    let mut edits = Vec::new();
    let mut need_base: BTreeMap<&str, &str> = BTreeMap::new();
    for path in &paths {
        let base = tree.get(*path);
        let now = here(dir, path)?;
        match (base.map(|e| e.kind), now) {
            (None, Here::Missing) => {}
            (Some(Kind::Submodule), Here::Directory | Here::Missing) => {}
            (None, Here::File { executable }) => {
                check_relative_path(path)?;
                if executable {
                    return Err(refuse(
                        Code::PROPOSAL_MODE_CHANGE,
                        path,
                        "a new file is executable; file modes cannot be proposed",
                    ));
                }
                let bytes = read(dir, path)?;
                edits.push(Edit::Write {
                    path: (*path).to_owned(),
                    content: text(path, bytes)?,
                    base_sha256: None,
                });
            }
            (Some(k @ (Kind::File | Kind::Executable)), Here::File { executable }) => {
                if executable != (k == Kind::Executable) {
                    return Err(refuse(
                        Code::PROPOSAL_MODE_CHANGE,
                        path,
                        "the executable bit differs from the base; file modes cannot be proposed",
                    ));
                }
                both.push((path, dir.join(path)));
            }
            (Some(Kind::File | Kind::Executable), Here::Missing) => {
                need_base.insert(path, &tree[*path].oid);
            }
            (None, Here::Symlink(target)) => {
                edits.push(Edit::Link {
                    path: (*path).to_owned(),
                    target: link_target(path, &target)?,
                    base_sha256: None,
                });
            }
            (Some(Kind::Symlink), Here::Symlink(target)) => {
                let old = repo.blobs(&[tree[*path].oid.as_str()])?.remove(0);
                if old != target.as_os_str().as_encoded_bytes() {
                    edits.push(Edit::Link {
                        path: (*path).to_owned(),
                        target: link_target(path, &target)?,
                        base_sha256: Some(sha256_hex(&old)),
                    });
                }
            }
            (Some(Kind::Symlink), Here::Missing) => {
                let old = repo.blobs(&[tree[*path].oid.as_str()])?.remove(0);
                edits.push(Edit::Delete {
                    path: (*path).to_owned(),
                    base_sha256: sha256_hex(&old),
                });
            }
            (_, Here::Directory) => {
                return Err(refuse(
                    Code::PROPOSAL_SYMLINK_CHANGE,
                    path,
                    "a nested repository or a file that became a directory",
                ));
            }
            _ => {
                return Err(refuse(
                    Code::PROPOSAL_SYMLINK_CHANGE,
                    path,
                    "a file became a symbolic link or back, or a submodule was added, removed or replaced",
                ));
            }
        }
    }
    let files: Vec<PathBuf> = both.iter().map(|(_, f)| f.clone()).collect();
    let oids = repo.hash_files(&files)?;
    let mut changed = Vec::new();
    for ((path, _), oid) in both.iter().zip(&oids) {
        if *oid != tree[*path].oid {
            changed.push(*path);
            need_base.insert(path, &tree[*path].oid);
        }
    }
    let wanted: Vec<&str> = need_base.values().copied().collect();
    let contents: BTreeMap<&str, Vec<u8>> = need_base
        .keys()
        .copied()
        .zip(repo.blobs(&wanted)?)
        .collect();
    for (path, old) in &contents {
        let base_sha256 = sha256_hex(old);
        if changed.contains(path) {
            edits.push(Edit::Write {
                path: (*path).to_owned(),
                content: text(path, read(dir, path)?)?,
                base_sha256: Some(base_sha256),
            });
        } else {
            edits.push(Edit::Delete {
                path: (*path).to_owned(),
                base_sha256,
            });
        }
    }
    edits.sort_by(|a, b| a.path().cmp(b.path()));
    Ok(edits)
}

/// A work tree link's target as a change carries it: UTF-8, inside the
/// tree (SYMLINK_TARGET_INVALID otherwise).
fn link_target(path: &str, target: &Path) -> Result<String, Error> {
    check_relative_path(path)?;
    let target = target.to_str().ok_or_else(|| {
        Error::with(
            Code::SYMLINK_TARGET_INVALID,
            format!("{path}: the link's target is not UTF-8"),
        )
    })?;
    airlock_proto::envelope::check_symlink_target(path, target)?;
    Ok(target.to_owned())
}

fn read(dir: &Path, path: &str) -> Result<Vec<u8>, Error> {
    std::fs::read(dir.join(path))
        .map_err(|e| Error::with(Code::SOURCE_ACCESS_DENIED, format!("{path}: {e}")))
}

fn text(path: &str, bytes: Vec<u8>) -> Result<String, Error> {
    if !is_text(&bytes) {
        return Err(refuse(
            Code::PROPOSAL_BINARY_CHANGE,
            path,
            "not UTF-8 text; binary files cannot be proposed",
        ));
    }
    String::from_utf8(bytes).map_err(|_| refuse(Code::PROPOSAL_BINARY_CHANGE, path, "not UTF-8"))
}

//! A directory compared with the base: every file that differs.
//!
//! In a git work tree the files are those git would commit (tracked, and
//! untracked but not ignored: `git ls-files --cached --others
//! --exclude-standard`), so build output and `__pycache__` stay out, and
//! git's own index says which tracked files are as it recorded them: a
//! file `git diff-files` does not name (its stat cache, with git's own
//! content check for a racily clean entry) has the blob id its index entry
//! holds, so one whose entry matches the base's is not read, hashed or even
//! looked at here. The cost is git's stat of each file and the work on the
//! files that differ, not a hash of every file. In a plain directory every
//! file is compared. Symbolic links are never followed.

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

/// The paths the directory holds (see the module docs).
fn listing(dir: &Path) -> Result<BTreeSet<String>, Error> {
    if dir.join(".git").exists() {
        // The planner's own checkout, read through crates/git's command
        // for a repository owned by someone else (hooks, fsmonitor and
        // helpers off, this directory alone trusted).
        let repo = airlock_git::ForeignRepo::open(dir)
            .map_err(|e| Error::with(Code::REPOSITORY_SOURCE_INVALID, e.to_string()))?;
        let mut ls = repo.command(&[
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ]);
        // git's own configuration is not read, so the user's global
        // ignore file (git's default location for it) is named here.
        let xdg = std::env::var_os("XDG_CONFIG_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")));
        if let Some(ignore) = xdg.map(|d| d.join("git/ignore")).filter(|f| f.is_file()) {
            let mut arg = std::ffi::OsString::from("--exclude-from=");
            arg.push(ignore);
            ls.arg(arg);
        }
        let out = ls
            .output()
            .map_err(|e| Error::with(Code::GIT_FAILED, format!("cannot run git: {e}")))?;
        if !out.status.success() {
            return Err(Error::with(
                Code::GIT_FAILED,
                format!(
                    "git ls-files in {}: {}",
                    dir.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            ));
        }
        return out
            .stdout
            .split(|b| *b == 0)
            .filter(|r| !r.is_empty())
            .map(|r| {
                String::from_utf8(r.to_vec()).map_err(|_| {
                    Error::with(Code::PATH_INVALID, "a path in the work tree is not UTF-8")
                })
            })
            .collect();
    }
    let mut found = BTreeSet::new();
    walk(dir, "", &mut found)?;
    Ok(found)
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

/// The tracked files of the git work tree `dir` whose content is what its
/// index entry records (mode and blob id), by path: every stage-0 entry
/// that `git diff-files` does not name. An entry of a path in conflict
/// (stages 1-3) is left out, as is every entry git names as changed,
/// deleted or of another type.
fn unchanged_in_index(dir: &Path) -> Result<BTreeMap<String, (String, String)>, Error> {
    let repo = airlock_git::ForeignRepo::open(dir)
        .map_err(|e| Error::with(Code::REPOSITORY_SOURCE_INVALID, e.to_string()))?;
    let run = |args: &[&str]| -> Result<Vec<u8>, Error> {
        let out = repo
            .command(args)
            .output()
            .map_err(|e| Error::with(Code::GIT_FAILED, format!("cannot run git: {e}")))?;
        if !out.status.success() {
            return Err(Error::with(
                Code::GIT_FAILED,
                format!(
                    "git {} in {}: {}",
                    args.join(" "),
                    dir.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            ));
        }
        Ok(out.stdout)
    };
    let changed: BTreeSet<Vec<u8>> = run(&["diff-files", "-z", "--name-only", "--no-renames"])?
        .split(|b| *b == 0)
        .filter(|r| !r.is_empty())
        .map(<[u8]>::to_vec)
        .collect();
    let mut entries = BTreeMap::new();
    let mut conflicted = BTreeSet::new();
    for record in run(&["ls-files", "-z", "--stage"])?.split(|b| *b == 0) {
        // "<mode> <oid> <stage>\t<path>"
        let Some(tab) = record.iter().position(|b| *b == b'\t') else {
            continue;
        };
        let (meta, path) = (&record[..tab], &record[tab + 1..]);
        let Ok(path) = std::str::from_utf8(path) else {
            continue;
        };
        let mut fields = std::str::from_utf8(meta).unwrap_or("").split(' ');
        let (Some(mode), Some(oid), Some(stage)) = (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if stage != "0" {
            conflicted.insert(path.to_owned());
            continue;
        }
        if !changed.contains(path.as_bytes()) {
            entries.insert(path.to_owned(), (mode.to_owned(), oid.to_owned()));
        }
    }
    for path in conflicted {
        entries.remove(&path);
    }
    Ok(entries)
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
    let tree = repo.tree(head)?;
    let listed = listing(dir)?;
    let unchanged = if dir.join(".git").exists() {
        unchanged_in_index(dir)?
    } else {
        BTreeMap::new()
    };
    let paths: BTreeSet<&str> = tree
        .keys()
        .map(String::as_str)
        .chain(listed.iter().map(|p| p.trim_end_matches('/')))
        .collect();

    // Regular files on both sides: compare blob ids first (hash-object
    // writes nothing), read contents only where they differ.
    let mut both: Vec<(&str, PathBuf)> = Vec::new();
    let mut edits = Vec::new();
    let mut need_base: BTreeMap<&str, &str> = BTreeMap::new();
    for path in &paths {
        let base = tree.get(*path);
        // As the index records it, and the index as the base has it.
        if let (Some(b), Some((mode, oid))) = (base, unchanged.get(*path))
            && *oid == b.oid
            && mode == mode_of(b.kind)
        {
            continue;
        }
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
            (Some(Kind::Symlink), Here::Symlink(target)) => {
                let old = repo.blobs(&[tree[*path].oid.as_str()])?;
                if old.first().map(Vec::as_slice) != Some(target.as_os_str().as_encoded_bytes()) {
                    return Err(refuse(
                        Code::PROPOSAL_SYMLINK_CHANGE,
                        path,
                        "a symbolic link changed target",
                    ));
                }
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
                    "a symbolic link or submodule was added, removed or replaced",
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

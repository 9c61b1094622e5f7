//! Reading an authority repository without writing to it.
//!
//! The planner reads the repository the worker owns (group-readable, see
//! `docs/privsep/repositories.md`), so git's ownership check would refuse it. Rather
//! than trusting every directory (`safe.directory=*` in the user's global
//! configuration), each git call here is crates/git's command for a
//! repository owned by someone else ([`airlock_git::ForeignRepo`]): this
//! one repository named as safe, the system and global configuration
//! ignored, the hardening on, and only commands that read (`rev-parse`,
//! `ls-tree`, `cat-file`, `hash-object` without `-w`) with optional locks
//! off.

use airlock_proto::{Code, Error};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// What a path is in a commit's tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A regular file (mode 100644).
    File,
    /// An executable file (mode 100755).
    Executable,
    /// A symbolic link (mode 120000).
    Symlink,
    /// A submodule (mode 160000).
    Submodule,
}

/// One entry of a commit's tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// What it is.
    pub kind: Kind,
    /// Its object id.
    pub oid: String,
}

/// An authority repository, opened for reading.
#[derive(Clone, Debug)]
pub struct SourceRepo {
    path: PathBuf,
    repo: airlock_git::ForeignRepo,
}

fn denied(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::with(
        Code::SOURCE_ACCESS_DENIED,
        format!(
            "{}: {e} (readers of airlock's repositories are members of the group airlock-readers)",
            path.display()
        ),
    )
}

impl SourceRepo {
    /// Opens the repository at `path` (bare, or a work tree's `.git`).
    pub fn open(path: &Path) -> Result<SourceRepo, Error> {
        let mut path = std::fs::canonicalize(path).map_err(|e| denied(path, e))?;
        if path.join(".git").is_dir() {
            path = path.join(".git");
        }
        std::fs::read_dir(path.join("objects")).map_err(|e| denied(&path, e))?;
        let foreign = airlock_git::ForeignRepo::open(&path)
            .map_err(|e| Error::with(Code::REPOSITORY_SOURCE_INVALID, e.to_string()))?;
        let repo = SourceRepo {
            path,
            repo: foreign,
        };
        let out = repo.git(&["rev-parse", "--git-dir"], None)?;
        if out.trim().is_empty() {
            return Err(Error::with(
                Code::REPOSITORY_SOURCE_INVALID,
                format!("{}: not a git repository", repo.path.display()),
            ));
        }
        Ok(repo)
    }

    /// The repository's canonical path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `git` on this repository, as described in the module docs.
    pub(crate) fn command(&self) -> Command {
        let mut c = self.repo.command(&[]);
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        c
    }

    fn run(&self, args: &[&str], input: Option<&[u8]>) -> Result<(bool, Vec<u8>, String), Error> {
        let mut cmd = self.command();
        cmd.args(args);
        if input.is_some() {
            cmd.stdin(Stdio::piped());
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| Error::with(Code::GIT_FAILED, format!("cannot run git: {e}")))?;
        if let (Some(data), Some(mut stdin)) = (input, child.stdin.take()) {
            // A writer thread, so a large answer cannot block a large question.
            let data = data.to_vec();
            std::thread::spawn(move || {
                let _ = stdin.write_all(&data);
            });
        }
        let out = child
            .wait_with_output()
            .map_err(|e| Error::with(Code::GIT_FAILED, format!("git: {e}")))?;
        Ok((
            out.status.success(),
            out.stdout,
            String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        ))
    }

    fn git(&self, args: &[&str], input: Option<&[u8]>) -> Result<String, Error> {
        match self.run(args, input)? {
            (true, out, _) => Ok(String::from_utf8_lossy(&out).into_owned()),
            (false, _, err) if err.contains("Permission denied") => Err(denied(&self.path, err)),
            (false, _, err) => Err(Error::with(
                Code::GIT_FAILED,
                format!("git {}: {err}", args.join(" ")),
            )),
        }
    }

    /// The commit `rev` names (a branch, a tag, an abbreviated or full id).
    pub fn resolve_commit(&self, rev: &str) -> Result<String, Error> {
        let not_found = || {
            Error::with(
                Code::REVISION_NOT_FOUND,
                format!("{rev:?} is not a commit in {}", self.path.display()),
            )
        };
        if rev.is_empty() || rev.starts_with('-') || rev.contains(char::is_control) {
            return Err(not_found());
        }
        let spec = format!("{rev}^{{commit}}");
        match self.run(
            &[
                "rev-parse",
                "--verify",
                "--quiet",
                "--end-of-options",
                &spec,
            ],
            None,
        )? {
            (true, out, _) => {
                let oid = String::from_utf8_lossy(&out).trim().to_owned();
                if airlock_proto::binding::is_oid(&oid) {
                    Ok(oid)
                } else {
                    Err(not_found())
                }
            }
            (false, _, err) if err.contains("Permission denied") => Err(denied(&self.path, err)),
            (false, _, _) => Err(not_found()),
        }
    }

    /// The head of `refs/heads/<branch>`, if the branch exists.
    pub fn branch_head(&self, branch: &str) -> Result<Option<String>, Error> {
        let full = format!("refs/heads/{branch}");
        match self.run(
            &[
                "rev-parse",
                "--verify",
                "--quiet",
                "--end-of-options",
                &full,
            ],
            None,
        )? {
            (true, out, _) => Ok(Some(String::from_utf8_lossy(&out).trim().to_owned())),
            (false, _, err) if err.contains("Permission denied") => Err(denied(&self.path, err)),
            (false, _, _) => Ok(None),
        }
    }

    /// Every path of `commit`'s tree.
    pub fn tree(&self, commit: &str) -> Result<BTreeMap<String, Entry>, Error> {
        let out = self.run(&["ls-tree", "-r", "-z", "--full-tree", commit], None)?;
        if !out.0 {
            return Err(Error::with(
                Code::GIT_FAILED,
                format!("git ls-tree: {}", out.2),
            ));
        }
        let mut tree = BTreeMap::new();
        for record in out.1.split(|b| *b == 0).filter(|r| !r.is_empty()) {
            let text = String::from_utf8(record.to_vec()).map_err(|_| {
                Error::with(Code::PATH_INVALID, "the base has a path that is not UTF-8")
            })?;
            let (meta, path) = text
                .split_once('\t')
                .ok_or_else(|| Error::with(Code::GIT_FAILED, "unexpected ls-tree output"))?;
            let mut fields = meta.split(' ');
            let (mode, _type, oid) = (fields.next(), fields.next(), fields.next());
            let kind = match mode {
                Some("100644") | Some("100664") => Kind::File,
                Some("100755") => Kind::Executable,
                Some("120000") => Kind::Symlink,
                _ => Kind::Submodule,
            };
            tree.insert(
                path.to_owned(),
                Entry {
                    kind,
                    oid: oid.unwrap_or_default().to_owned(),
                },
            );
        }
        Ok(tree)
    }

    /// The content of each blob in `oids`, in order.
    pub fn blobs(&self, oids: &[&str]) -> Result<Vec<Vec<u8>>, Error> {
        if oids.is_empty() {
            return Ok(Vec::new());
        }
        let mut question = Vec::new();
        for oid in oids {
            question.extend_from_slice(oid.as_bytes());
            question.push(b'\n');
        }
        let (ok, out, err) = self.run(&["cat-file", "--batch"], Some(&question))?;
        if !ok {
            return Err(Error::with(
                Code::GIT_FAILED,
                format!("git cat-file: {err}"),
            ));
        }
        let mut rest = out.as_slice();
        let mut blobs = Vec::with_capacity(oids.len());
        for oid in oids {
            let nl = rest
                .iter()
                .position(|b| *b == b'\n')
                .ok_or_else(|| Error::with(Code::GIT_FAILED, "short cat-file output"))?;
            let header = String::from_utf8_lossy(&rest[..nl]).into_owned();
            let size: usize = header
                .rsplit(' ')
                .next()
                .and_then(|s| s.parse().ok())
                .filter(|_| header.starts_with(oid))
                .ok_or_else(|| Error::with(Code::GIT_OBJECT_MISSING, format!("{oid}: {header}")))?;
            let body = rest
                .get(nl + 1..nl + 1 + size)
                .ok_or_else(|| Error::with(Code::GIT_FAILED, "short cat-file output"))?;
            blobs.push(body.to_vec());
            rest = rest.get(nl + 2 + size..).unwrap_or_default();
        }
        Ok(blobs)
    }

    /// The blob id each file would have in this repository (`hash-object`
    /// without `-w`: nothing is written).
    pub fn hash_files(&self, files: &[PathBuf]) -> Result<Vec<String>, Error> {
        if files.is_empty() {
            return Ok(Vec::new());
        }
        let mut question = Vec::new();
        for f in files {
            let text = f.to_str().ok_or_else(|| {
                Error::with(Code::PATH_INVALID, format!("{}: not UTF-8", f.display()))
            })?;
            if text.contains('\n') {
                return Err(Error::with(
                    Code::PATH_INVALID,
                    format!("{text:?}: newline"),
                ));
            }
            question.extend_from_slice(text.as_bytes());
            question.push(b'\n');
        }
        let out = self.git(
            &["hash-object", "--no-filters", "--stdin-paths"],
            Some(&question),
        )?;
        let oids: Vec<String> = out.lines().map(str::to_owned).collect();
        if oids.len() != files.len() {
            return Err(Error::with(
                Code::GIT_FAILED,
                "git hash-object answered short",
            ));
        }
        Ok(oids)
    }
}

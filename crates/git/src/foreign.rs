//! A repository that belongs to someone else, read once, and the copy of
//! its branches and tags into a repository airlock owns.
//!
//! Importing used to run `git clone` with an `--upload-pack` string built
//! from the source path, which git hands to a shell: a directory named
//! `a$(cmd)b` ran `cmd` as whoever imported it (root, for `airlockctl repo
//! add`). Here nothing reaches a shell and nothing runs in the source's
//! context but read-only plumbing under the hardening:
//!
//! 1. [`ForeignRepo::open`] finds the git directory by looking at the path
//!    (never by git's discovery), and names it, alone, in `safe.directory`.
//! 2. Its refs are listed (`for-each-ref`) and its object directory asked
//!    for (`rev-parse --git-path objects`); both runs have hooks, fsmonitor
//!    and every helper switched off, whatever the source's configuration says.
//! 3. [`import`] runs `pack-objects` in the *destination*, with the source's
//!    object directory as an alternate given in the environment
//!    (`GIT_ALTERNATE_OBJECT_DIRECTORIES`, C-quoted, so any byte of a path
//!    is data), and pipes the pack into the destination's `index-pack`.
//!    The destination's configuration is airlock's; the source's is never
//!    read by either process. No transport, no upload-pack, no protocol.
//! 4. The new tips are checked to be connected without the alternate, then
//!    the refs move in one `update-ref --stdin` transaction, and the
//!    repository is synced to disk.

use crate::command::{self, Git};
use crate::error::{GitError, GitResult};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

/// A repository owned by someone else, opened to be read once.
#[derive(Debug, Clone)]
pub struct ForeignRepo {
    git: Git,
    objects: PathBuf,
}

/// One ref of a repository: its full name and the object it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ref {
    /// `refs/heads/…` or `refs/tags/…`.
    pub name: String,
    /// The object id.
    pub oid: String,
}

fn not_a_repository(path: &Path, why: impl std::fmt::Display) -> GitError {
    GitError::NotARepository(path.to_path_buf(), why.to_string())
}

/// Where the git directory of `path` is, found without git: a bare
/// repository, a work tree's `.git` directory, or the directory a `.git`
/// file (a linked work tree, a submodule) names.
fn locate(path: &Path) -> GitResult<(PathBuf, Option<PathBuf>)> {
    let path = std::fs::canonicalize(path).map_err(|e| not_a_repository(path, e))?;
    let dot_git = path.join(".git");
    let meta = std::fs::symlink_metadata(&dot_git);
    match meta {
        Ok(m) if m.is_dir() => return Ok((dot_git, Some(path))),
        Ok(m) if m.is_file() => {
            let text = std::fs::read_to_string(&dot_git).map_err(|e| not_a_repository(&path, e))?;
            let target = text
                .strip_prefix("gitdir: ")
                .map(|t| t.trim_end_matches('\n'))
                .filter(|t| !t.is_empty() && !t.contains('\n'))
                .ok_or_else(|| not_a_repository(&path, ".git is a file without a gitdir line"))?;
            let dir = std::fs::canonicalize(path.join(target))
                .map_err(|e| not_a_repository(&path, format!("{target}: {e}")))?;
            return Ok((dir, Some(path)));
        }
        _ => {}
    }
    if path.join("HEAD").is_file() && path.join("objects").is_dir() {
        return Ok((path, None));
    }
    Err(not_a_repository(
        &path,
        "neither a bare repository nor a work tree with .git",
    ))
}

impl ForeignRepo {
    /// Opens the repository at `path` (bare, or a work tree) with the
    /// system's git.
    pub fn open(path: &Path) -> GitResult<Self> {
        Self::open_with(path, command::default_program())
    }

    /// Opens the repository at `path` with a given git program.
    pub fn open_with(path: &Path, program: PathBuf) -> GitResult<Self> {
        let (git_dir, work_tree) = locate(path)?;
        let mut git = Git::new(program, git_dir.clone());
        if let Some(dir) = work_tree {
            git = git.with_work_tree(dir);
        }
        let objects = git
            .output(&["rev-parse", "--git-path", "objects"])
            .map_err(|e| not_a_repository(&git_dir, e))?;
        let objects = PathBuf::from(objects.trim_end_matches('\n'));
        let objects = if objects.is_absolute() {
            objects
        } else {
            git_dir.join(objects)
        };
        Ok(ForeignRepo { git, objects })
    }

    /// The git directory.
    pub fn git_dir(&self) -> &Path {
        self.git.repo()
    }

    /// The directory holding its objects (the common directory's, for a
    /// linked work tree).
    pub fn objects(&self) -> &Path {
        &self.objects
    }

    /// A hardened git command on this repository (read-only use: the
    /// builder's `rev-parse`, `ls-tree`, `cat-file`, `ls-files`). The
    /// caller adds nothing that writes.
    pub fn command(&self, args: &[&str]) -> std::process::Command {
        self.git.command(args)
    }

    /// Its branches and tags.
    pub fn refs(&self) -> GitResult<Vec<Ref>> {
        list_refs(&self.git)
    }

    /// The branch `HEAD` names, when it names one.
    pub fn head_branch(&self) -> GitResult<Option<String>> {
        Ok(self
            .git
            .optional(&["symbolic-ref", "-q", "HEAD"])?
            .and_then(|r| r.strip_prefix("refs/heads/").map(str::to_owned)))
    }

    /// `sha1` or `sha256`.
    pub fn object_format(&self) -> GitResult<String> {
        let out = self.git.output(&["rev-parse", "--show-object-format"])?;
        Ok(out.trim().to_owned())
    }
}

pub(crate) fn list_refs(git: &Git) -> GitResult<Vec<Ref>> {
    let out = git.output(&[
        "for-each-ref",
        "--format=%(objectname) %(refname)",
        "refs/heads/",
        "refs/tags/",
    ])?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(oid, name)| Ref {
            name: name.to_owned(),
            oid: oid.to_owned(),
        })
        .collect())
}

/// Where a source's refs land in the destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefMap<'a> {
    /// Branches and tags under their own names (an authority repository's
    /// import): `agent/*` excluded, since only the worker writes those.
    Mirror,
    /// Branches under `refs/remotes/REMOTE/`, tags under their own names
    /// (a reader's clone).
    Remote(&'a str),
}

impl RefMap<'_> {
    fn target(&self, source: &str) -> Option<String> {
        match self {
            RefMap::Mirror if source.starts_with("refs/heads/agent/") => None,
            RefMap::Mirror => Some(source.to_owned()),
            RefMap::Remote(remote) => match source.strip_prefix("refs/heads/") {
                Some(branch) => Some(format!("refs/remotes/{remote}/{branch}")),
                None => Some(source.to_owned()),
            },
        }
    }
}

/// What [`import`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Imported {
    /// Refs created or moved.
    pub updated: Vec<Ref>,
    /// Refs already at the source's value.
    pub unchanged: usize,
}

/// `"…"` with C escapes, as git reads a quoted alternate: every byte of the
/// path is data, a colon or a newline included.
pub(crate) fn c_quote(path: &Path) -> String {
    let mut s = String::from("\"");
    for &b in path.as_os_str().as_bytes() {
        match b {
            b'"' => s.push_str("\\\""),
            b'\\' => s.push_str("\\\\"),
            b'\n' => s.push_str("\\n"),
            b'\t' => s.push_str("\\t"),
            0x20..=0x7e => s.push(b as char),
            _ => s.push_str(&format!("\\{b:03o}")),
        }
    }
    s.push('"');
    s
}

/// Makes a new repository at `path` (bare or with a work tree) in `format`.
pub fn init(program: PathBuf, path: &Path, bare: bool, format: &str) -> GitResult<Git> {
    std::fs::create_dir_all(path)?;
    let path = std::fs::canonicalize(path)?;
    let git_dir = if bare {
        path.clone()
    } else {
        path.join(".git")
    };
    let git = Git::new(program, git_dir);
    let format_arg = format!("--object-format={format}");
    let mut args = vec!["init", "--quiet", format_arg.as_str()];
    if bare {
        args.push("--bare");
    }
    git.output(&args)?;
    Ok(if bare { git } else { git.with_work_tree(path) })
}

/// Copies `from`'s branches and tags into `into` as `map` says: the
/// objects they need (only those `into` lacks), then the refs, forced to
/// the source's values, in one transaction. Nothing is deleted. Then every
/// file of `into` is synced.
pub fn import(into: &Git, from: &ForeignRepo, map: RefMap<'_>) -> GitResult<Imported> {
    let wanted: Vec<(Ref, String)> = from
        .refs()?
        .into_iter()
        .filter_map(|r| map.target(&r.name).map(|t| (r, t)))
        .collect();
    let have = list_refs(into)?;
    let current = |name: &str| have.iter().find(|r| r.name == name).map(|r| r.oid.clone());
    let mut result = Imported::default();
    let mut moves = Vec::new();
    for (source, target) in &wanted {
        if current(target).as_deref() == Some(source.oid.as_str()) {
            result.unchanged += 1;
        } else {
            moves.push((target.clone(), source.oid.clone()));
        }
    }
    if moves.is_empty() {
        return Ok(result);
    }
    let alternate = c_quote(from.objects());
    let mut revs: Vec<u8> = Vec::new();
    for (_, oid) in &moves {
        writeln!(revs, "{oid}")?;
    }
    writeln!(revs, "--not")?;
    for r in &have {
        writeln!(revs, "{}", r.oid)?;
    }
    transfer(into, &alternate, &revs)?;
    // Connected without the alternate: every object the new tips reach is
    // here now (or was already reachable from a ref here).
    let mut check: Vec<u8> = Vec::new();
    for (_, oid) in &moves {
        writeln!(check, "{oid}")?;
    }
    into.output_with(
        &[
            "rev-list",
            "--objects",
            "--quiet",
            "--stdin",
            "--not",
            "--all",
        ],
        Some(&check),
        &[],
    )?;
    let mut transaction = Vec::new();
    for (name, oid) in &moves {
        writeln!(transaction, "update {name} {oid}")?;
    }
    into.output_with(&["update-ref", "--stdin"], Some(&transaction), &[])?;
    result.updated = moves
        .into_iter()
        .map(|(name, oid)| Ref { name, oid })
        .collect();
    sync_tree(into.repo())?;
    Ok(result)
}

/// A bare copy of `from` at `path`, made when `path` does not exist and
/// brought up to date when it does: branches (but `agent/*`) and tags,
/// and, on a new copy, `HEAD` on the source's `HEAD` branch. Synced to
/// disk before it returns.
pub fn mirror(from: &ForeignRepo, path: &Path) -> GitResult<Imported> {
    let program = from.git.program().to_path_buf();
    if path.exists() {
        return import(&Git::new(program, path.to_path_buf()), from, RefMap::Mirror);
    }
    let git = init(program, path, true, &from.object_format()?)?;
    let imported = import(&git, from, RefMap::Mirror)?;
    if let Some(branch) = from.head_branch()? {
        let head = format!("refs/heads/{branch}");
        if imported.updated.iter().any(|r| r.name == head) {
            git.output(&["symbolic-ref", "HEAD", &head])?;
        }
    }
    sync_tree(path)?;
    Ok(imported)
}

/// `pack-objects` in `into` reading through the alternate, piped into
/// `into`'s `index-pack`.
pub(crate) fn transfer(into: &Git, alternate: &str, revs: &[u8]) -> GitResult<()> {
    let mut pack = into.command(&["pack-objects", "--revs", "--stdout", "--quiet"]);
    pack.env("GIT_ALTERNATE_OBJECT_DIRECTORIES", alternate)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let spawn = |e| GitError::Spawn {
        program: into.program().to_path_buf(),
        source: e,
    };
    let mut packer = pack.spawn().map_err(spawn)?;
    let writer = command::feed(&mut packer, revs)?;
    let stdout = packer
        .stdout
        .take()
        .ok_or_else(|| std::io::Error::other("no stdout"))?;
    let mut index = into.command(&["index-pack", "--stdin", "--fix-thin"]);
    index
        .stdin(Stdio::from(stdout))
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let indexed = index.spawn().map_err(spawn)?.wait_with_output()?;
    let packed = packer.wait_with_output()?;
    writer
        .join()
        .map_err(|_| std::io::Error::other("stdin writer panicked"))??;
    for (what, out) in [("pack-objects", &packed), ("index-pack", &indexed)] {
        if !out.status.success() {
            return Err(GitError::Failed {
                args: what.to_owned(),
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            });
        }
    }
    Ok(())
}

/// `git upload-pack PATH` for a reader's later fetches from the authority
/// repository it cloned (`airlockctl repo upload-pack`, which the clone's
/// `remote.origin.uploadpack` names): PATH alone trusted, hardened, the
/// client's protocol version passed on, nothing through a shell.
pub fn upload_pack(program: &Path, path: &Path) -> GitResult<std::process::Command> {
    let (git_dir, work_tree) = locate(path)?;
    let mut cmd = command::hardened(program, |_| true);
    command::trust(&mut cmd, &git_dir);
    if let Some(dir) = &work_tree {
        command::trust(&mut cmd, dir);
    }
    if let Some(v) = std::env::var_os("GIT_PROTOCOL") {
        cmd.env("GIT_PROTOCOL", v);
    }
    cmd.stdin(Stdio::inherit())
        .arg("upload-pack")
        .arg("--strict")
        .arg("--")
        .arg(&git_dir);
    Ok(cmd)
}

/// Syncs every file and directory under `root` (and `root`'s parent, which
/// holds its entry): git's own fsync covers objects and refs, not the
/// configuration, `HEAD` or the directories `init` made.
pub fn sync_tree(root: &Path) -> std::io::Result<()> {
    fn walk(path: &Path) -> std::io::Result<()> {
        let meta = std::fs::symlink_metadata(path)?;
        if meta.file_type().is_symlink() {
            return Ok(());
        }
        if meta.is_dir() {
            for entry in std::fs::read_dir(path)? {
                walk(&entry?.path())?;
            }
        }
        std::fs::File::open(path)?.sync_all()
    }
    walk(root)?;
    if let Some(parent) = root.parent() {
        std::fs::File::open(parent)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quoted_alternate_keeps_every_byte_as_data() {
        assert_eq!(c_quote(Path::new("/a:b")), "\"/a:b\"");
        assert_eq!(
            c_quote(Path::new("/x/a$(touch p)\"b\\\n;`")),
            "\"/x/a$(touch p)\\\"b\\\\\\n;`\""
        );
        assert_eq!(c_quote(Path::new("/é")), "\"/\\303\\251\"");
    }

    #[test]
    fn mirror_leaves_agent_branches_out_and_remote_moves_branches() {
        assert_eq!(RefMap::Mirror.target("refs/heads/agent/x"), None);
        assert_eq!(
            RefMap::Mirror.target("refs/heads/main").as_deref(),
            Some("refs/heads/main")
        );
        assert_eq!(
            RefMap::Remote("origin")
                .target("refs/heads/agent/x")
                .as_deref(),
            Some("refs/remotes/origin/agent/x")
        );
        assert_eq!(
            RefMap::Remote("origin").target("refs/tags/v1").as_deref(),
            Some("refs/tags/v1")
        );
    }
}

//! Running git with nothing of the host's or the repository's able to run code.

use crate::error::{GitError, GitResult};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Configuration forced on every invocation, after the repository's own,
/// so it wins. Each line closes a way for a repository to run a program.
pub(crate) const HARDENING: &[&str] = &[
    "core.hooksPath=/dev/null", // no hook runs, reference-transaction included
    "core.fsmonitor=false",     // no fsmonitor daemon or hook
    "commit.gpgSign=false",     // no signing program
    "tag.gpgSign=false",        // no signing program
    "gpg.program=/bin/false",   // even if signing were asked for
    "core.sshCommand=/bin/false", // no transport programs
    "protocol.allow=never",     // no fetch or push of any kind
    "core.askPass=/bin/false",  // no credential prompts
    "credential.helper=",       // no credential helpers
    "core.pager=cat",           // no pager
];

/// Configuration that makes what git writes durable before git exits:
/// loose objects, packs and their indexes, and references are fsynced
/// (git syncs neither objects nor refs by default), so a checkpoint that
/// records a commit or a ref never outlives it across a power loss.
const DURABILITY: &[&str] = &["core.fsync=all", "core.fsyncMethod=fsync"];

/// Picks the system git: Debian's first, then a local build.
pub fn default_program() -> PathBuf {
    ["/usr/bin/git", "/usr/local/bin/git"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("/usr/bin/git"))
}

/// A git program bound to one repository: `GIT_DIR` names it (git never
/// discovers a repository by walking up from a directory), and only that
/// repository is named in `safe.directory` — never a wildcard.
#[derive(Debug, Clone)]
pub struct Git {
    program: PathBuf,
    repo: PathBuf,
    work_tree: Option<PathBuf>,
}

/// The environment and configuration every git run starts from: a clean
/// environment, no system or global configuration, the hardening and the
/// durability settings. No repository is named yet. `keep` chooses the
/// hardening lines (every one but a transfer's transport line, see
/// crate::upstream).
pub(crate) fn hardened(program: &Path, keep: impl Fn(&str) -> bool) -> Command {
    let mut cmd = Command::new(program);
    cmd.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("LC_ALL", "C")
        .env("HOME", "/nonexistent")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_OPTIONAL_LOCKS", "0")
        .env("GIT_NO_REPLACE_OBJECTS", "1")
        .stdin(Stdio::null());
    for c in HARDENING.iter().filter(|c| keep(c)).chain(DURABILITY) {
        cmd.args(["-c", c]);
    }
    cmd
}

/// Writes `data` to `child`'s piped stdin from a thread, so that a large
/// input cannot deadlock against a full stdout pipe; join the thread after
/// reading the output.
pub(crate) fn feed(
    child: &mut std::process::Child,
    data: &[u8],
) -> std::io::Result<std::thread::JoinHandle<std::io::Result<()>>> {
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| std::io::Error::other("no stdin"))?;
    let data = data.to_vec();
    Ok(std::thread::spawn(move || stdin.write_all(&data)))
}

/// The last `n` characters of `text` (of git's stderr: where it says why).
pub(crate) fn tail_of(text: &str, n: usize) -> String {
    text.chars()
        .rev()
        .take(n)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect()
}

/// `safe.directory=PATH` as one argument: a path is an argument of its
/// own, never part of a string a shell or git splits.
pub(crate) fn trust(cmd: &mut Command, path: &Path) {
    let mut value = std::ffi::OsString::from("safe.directory=");
    value.push(path);
    cmd.arg("-c").arg(value);
}

impl Git {
    pub fn new(program: PathBuf, repo: PathBuf) -> Self {
        Git {
            program,
            repo,
            work_tree: None,
        }
    }

    /// The same repository with a work tree (a checkout's `.git` and its
    /// directory).
    pub fn with_work_tree(mut self, dir: PathBuf) -> Self {
        self.work_tree = Some(dir);
        self
    }

    pub fn program(&self) -> &Path {
        &self.program
    }

    pub fn repo(&self) -> &Path {
        &self.repo
    }

    /// A command with a clean environment and the hardening configuration.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = hardened(&self.program, |_| true);
        cmd.env("GIT_DIR", &self.repo);
        trust(&mut cmd, &self.repo);
        if let Some(dir) = &self.work_tree {
            cmd.env("GIT_WORK_TREE", dir).current_dir(dir);
            trust(&mut cmd, dir);
        }
        cmd.args(args);
        cmd
    }

    pub fn run(
        &self,
        args: &[&str],
        input: Option<&[u8]>,
        env: &[(&str, &str)],
    ) -> GitResult<std::process::Output> {
        let mut cmd = self.command(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        if input.is_some() {
            cmd.stdin(Stdio::piped());
        }
        let mut child = cmd.spawn().map_err(|source| GitError::Spawn {
            program: self.program.clone(),
            source,
        })?;
        if let Some(data) = input {
            let writer = feed(&mut child, data)?;
            let out = child.wait_with_output()?;
            writer
                .join()
                .map_err(|_| std::io::Error::other("stdin writer panicked"))??;
            return Ok(out);
        }
        Ok(child.wait_with_output()?)
    }

    /// Runs git and returns stdout; a non-zero exit is an error.
    pub fn output_with(
        &self,
        args: &[&str],
        input: Option<&[u8]>,
        env: &[(&str, &str)],
    ) -> GitResult<String> {
        let out = self.run(args, input, env)?;
        if !out.status.success() {
            let tail = tail_of(&String::from_utf8_lossy(&out.stderr), 600);
            return Err(GitError::Failed {
                args: args.join(" "),
                status: out.status.to_string(),
                stderr: tail.trim().to_owned(),
            });
        }
        String::from_utf8(out.stdout).map_err(|e| std::io::Error::other(e.to_string()).into())
    }

    /// Removes the loose object file of `oid`, if there is one, and syncs
    /// its directory (an object file that does not hold its object).
    pub fn remove_loose_object(&self, oid: &str) -> GitResult<()> {
        if oid.len() < 4 || !oid.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Ok(());
        }
        let dir = self.repo.join("objects").join(&oid[..2]);
        match std::fs::remove_file(dir.join(&oid[2..])) {
            Ok(()) => std::fs::File::open(&dir)?.sync_all()?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
        Ok(())
    }

    /// Syncs the loose object `oid` and its directory, when it is loose:
    /// `core.fsync` syncs the file, this also syncs the directory's entry
    /// for it, and `objects/`'s entry for that directory (git may just
    /// have made it), before anything records it.
    pub fn sync_loose_object(&self, oid: &str) -> GitResult<()> {
        if oid.len() < 4 || !oid.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Ok(());
        }
        let objects = self.repo.join("objects");
        let dir = objects.join(&oid[..2]);
        match std::fs::File::open(dir.join(&oid[2..])) {
            Ok(f) => f.sync_all()?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        std::fs::File::open(&dir)?.sync_all()?;
        std::fs::File::open(&objects)?.sync_all()?;
        Ok(())
    }

    /// Syncs the directories that hold the loose reference `refname`
    /// (`refs/heads/agent/t` → `refs/heads/agent`, `refs/heads`, `refs`):
    /// `core.fsync` syncs the reference's file before git renames it into
    /// place, but git syncs no directory, so the rename itself, and a
    /// directory git made for it, are not on disk until this returns.
    pub fn sync_ref_dirs(&self, refname: &str) -> GitResult<()> {
        let mut dir = self.repo.join(refname);
        while dir.pop() && dir.starts_with(self.repo.join("refs")) {
            match std::fs::File::open(&dir) {
                Ok(d) => d.sync_all()?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Runs git and returns stdout.
    pub fn output(&self, args: &[&str]) -> GitResult<String> {
        self.output_with(args, None, &[])
    }

    /// Runs a query whose exit status 1 (with no output) means "absent".
    pub fn optional(&self, args: &[&str]) -> GitResult<Option<String>> {
        let out = self.run(args, None, &[])?;
        if out.status.success() {
            let s = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            Ok((!s.is_empty()).then_some(s))
        } else if out.status.code() == Some(1) || out.status.code() == Some(128) {
            Ok(None)
        } else {
            Err(GitError::Failed {
                args: args.join(" "),
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            })
        }
    }
}

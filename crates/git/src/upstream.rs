//! The team's remote: fetching its branches and tags into the authority
//! repository, and pushing an agent branch to it with a lease.
//!
//! A local-path upstream is never reached through git's transports (they
//! would run `git-receive-pack` in it, and with it its hooks, as the
//! worker): a sync reads it as a foreign repository ([`crate::import`]:
//! objects through an alternate, no process in it), and a publication
//! copies the commit's objects into it the same way and moves its
//! `agent/…` ref with `update-ref`'s compare-and-swap, hooks off.
//!
//! Every transfer over ssh or https runs the hardened git of
//! [`crate::command`] with one change: the protocol of the upstream's own scheme is allowed (and no
//! other), and for ssh the transport program is airlock's ssh launcher
//! (`GIT_SSH`, run without a shell) which starts OpenSSH with the
//! repository's deploy key, its pinned host keys and nothing of any user's
//! or the system's ssh configuration. A token for https travels in git's
//! environment (`GIT_CONFIG_*`), never on a command line. Each run is
//! bounded in wall time (its process group is killed past it) and, for a
//! fetch, in the bytes of the pack it receives: every fetch writes one
//! pack (`fetch.unpackLimit=1`), whose temporary file is watched while it
//! grows and the group killed past the bound; no ref moves then.

use crate::AuthorityRepo;
use crate::command::{HARDENING, hardened, tail_of, trust};
use crate::error::{GitError, GitResult};
use airlock_proto::upstream::Scheme;
use airlock_proto::{Code, Error};
use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The environment variable that makes a program airlock's ssh launcher
/// ([`ssh_launcher_main`]); its value is the deploy key's path.
pub const SSH_KEY_ENV: &str = "AIRLOCK_SSH_IDENTITY";
/// The pinned host keys the launcher hands to ssh (a known_hosts file).
pub const SSH_KNOWN_HOSTS_ENV: &str = "AIRLOCK_SSH_KNOWN_HOSTS";
/// Seconds ssh may take to connect.
pub const SSH_CONNECT_TIMEOUT_ENV: &str = "AIRLOCK_SSH_CONNECT_TIMEOUT";

/// What the worker authenticates with.
#[derive(Debug, Clone, Default)]
pub enum Credential {
    /// Nothing (a local path, or a public https remote to fetch from).
    #[default]
    None,
    /// An SSH deploy key (a private key file) and the pinned host keys.
    SshKey {
        /// The private key file (readable by the worker only).
        key: PathBuf,
        /// A known_hosts file with the upstream's host keys.
        known_hosts: PathBuf,
        /// The launcher program (`GIT_SSH`): a program that calls
        /// [`ssh_launcher_main`] when [`SSH_KEY_ENV`] is set.
        launcher: PathBuf,
    },
    /// A token for https, sent as HTTP basic authentication.
    Token {
        /// The user name the forge expects with a token.
        user: String,
        /// The token itself.
        token: String,
    },
}

/// An upstream repository and how to reach it.
#[derive(Debug, Clone)]
pub struct Upstream {
    /// Its URL.
    pub url: String,
    /// Its scheme.
    pub scheme: Scheme,
    /// The credential.
    pub credential: Credential,
    /// Wall time one git run may take.
    pub timeout: Duration,
    /// Largest file (the pack) a fetch may write, in bytes.
    pub max_fetch_bytes: u64,
}

impl Upstream {
    /// An upstream at `url` with no credential and default bounds.
    pub fn new(url: &str) -> Result<Upstream, Error> {
        Ok(Upstream {
            url: url.to_owned(),
            scheme: Scheme::of(url)?,
            credential: Credential::None,
            timeout: Duration::from_secs(120),
            max_fetch_bytes: 4 << 30,
        })
    }
}

/// What a sync did, and each ref it changed: declared in the protocol,
/// since the worker's record of a sync ([`airlock_proto::upstream::SyncState`])
/// carries them to `airlockctl`.
pub use airlock_proto::upstream::{RefChange, SyncReport};

/// What the upstream answered to a push.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PushAnswer {
    /// The ref pushed (`refs/heads/agent/…`).
    pub remote_ref: String,
    /// Whether this run sent the commit (false: the upstream already had
    /// the branch at it, so nothing was sent).
    pub pushed: bool,
    /// git's porcelain line for the ref, as the upstream answered.
    pub answer: String,
}

impl PushAnswer {
    /// The answer when the upstream's branch is at the commit already:
    /// nothing was sent.
    fn already(remote_ref: String) -> Self {
        PushAnswer {
            remote_ref,
            pushed: false,
            answer: "= already at the commit".into(),
        }
    }
}

/// The refs a sync mirrors: branches and tags, never an agent branch (the
/// worker's own, which only its compare-and-swap moves).
const FETCH_REFSPECS: &[&str] = &[
    "+refs/heads/*:refs/heads/*",
    "^refs/heads/agent/*",
    "+refs/tags/*:refs/tags/*",
];

impl AuthorityRepo {
    /// Every branch and tag with its value.
    fn mirrored_refs(&self) -> GitResult<BTreeMap<String, String>> {
        let out = self.git.output(&[
            "for-each-ref",
            "--format=%(refname) %(objectname)",
            "refs/heads",
            "refs/tags",
        ])?;
        Ok(out
            .lines()
            .filter_map(|l| l.split_once(' '))
            .filter(|(name, _)| !name.starts_with("refs/heads/agent/"))
            .map(|(n, o)| (n.to_owned(), o.to_owned()))
            .collect())
    }

    /// Fetches the upstream's branches and tags into this repository: a
    /// branch the upstream moved, force-pushed or deleted follows it, a
    /// tag follows it, and `refs/heads/agent/*` is never written. Returns
    /// what changed (each force-push marked).
    pub fn sync_from(&self, upstream: &Upstream) -> GitResult<SyncReport> {
        self.refuse_transport_config()?;
        let before = self.mirrored_refs()?;
        match local_path(upstream) {
            Some(path) => self.sync_from_path(&path)?,
            None => {
                let mut args = vec!["fetch", "--prune", "--no-tags", "--no-write-fetch-head"];
                args.extend(["--no-recurse-submodules", "--quiet", "--end-of-options"]);
                args.push(&upstream.url);
                args.extend(FETCH_REFSPECS);
                transfer(self, upstream, &args, Some(upstream.max_fetch_bytes))?;
            }
        }
        let after = self.mirrored_refs()?;
        let mut changes = Vec::new();
        for name in before.keys().chain(after.keys()) {
            let (old, new) = (before.get(name), after.get(name));
            if old == new || changes.iter().any(|c: &RefChange| &c.name == name) {
                continue;
            }
            let forced = match (old, new) {
                (Some(o), Some(n)) => name.starts_with("refs/heads/") && !self.is_ancestor(o, n)?,
                _ => false,
            };
            changes.push(RefChange {
                name: name.clone(),
                old: old.cloned(),
                new: new.cloned(),
                forced,
            });
        }
        changes.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(SyncReport { changes })
    }

    /// A local upstream's branches and tags, imported as a foreign
    /// repository's (agent/* excluded), then those it no longer has
    /// pruned here.
    fn sync_from_path(&self, path: &Path) -> GitResult<()> {
        let from = crate::ForeignRepo::open_with(path, self.git.program().to_path_buf())?;
        crate::import(&self.git, &from, crate::RefMap::Mirror)?;
        let theirs: std::collections::BTreeSet<String> =
            from.refs()?.into_iter().map(|r| r.name).collect();
        let mut transaction = Vec::new();
        for (name, oid) in self.mirrored_refs()? {
            if !theirs.contains(&name) {
                transaction.extend_from_slice(format!("delete {name} {oid}\n").as_bytes());
            }
        }
        if !transaction.is_empty() {
            self.git
                .output_with(&["update-ref", "--stdin"], Some(&transaction), &[])?;
        }
        Ok(())
    }

    /// The upstream's value of `refs/heads/<branch>` (`None`: absent).
    pub fn upstream_head(&self, upstream: &Upstream, branch: &str) -> GitResult<Option<String>> {
        crate::refs::check_agent_branch(branch)?;
        self.refuse_transport_config()?;
        let refname = format!("refs/heads/{branch}");
        if let Some(path) = local_path(upstream) {
            return local_repo(self, &path)?.optional(&[
                "rev-parse",
                "--verify",
                "--quiet",
                "--end-of-options",
                &refname,
            ]);
        }
        let out = transfer(
            self,
            upstream,
            &[
                "ls-remote",
                "--refs",
                "--end-of-options",
                &upstream.url,
                &refname,
            ],
            None,
        )?;
        Ok(out
            .lines()
            .filter_map(|l| l.split_once('\t'))
            .find(|(_, name)| *name == refname)
            .map(|(oid, _)| oid.to_owned()))
    }

    /// Pushes `oid` to the upstream's `refs/heads/<branch>`, leased on its
    /// value there being `expected` (`None`: absent) — an atomic push that
    /// never forces anything else. The upstream already at `oid` is
    /// success with nothing sent. A branch elsewhere is
    /// UPSTREAM_BRANCH_MOVED, checked before sending and enforced by the
    /// lease while sending.
    pub fn publish_to(
        &self,
        upstream: &Upstream,
        branch: &str,
        oid: &str,
        expected: Option<&str>,
        push_options: &[String],
    ) -> GitResult<PushAnswer> {
        let remote_ref = format!("refs/heads/{branch}");
        let moved = |found: Option<&str>| {
            GitError::Refused(Error::with(
                Code::UPSTREAM_BRANCH_MOVED,
                format!(
                    "the upstream's {remote_ref} is at {}, expected {}",
                    found.unwrap_or("nothing"),
                    expected.unwrap_or("nothing")
                ),
            ))
        };
        let found = self.upstream_head(upstream, branch)?;
        if found.as_deref() == Some(oid) {
            return Ok(PushAnswer::already(remote_ref));
        }
        if found.as_deref() != expected {
            return Err(moved(found.as_deref()));
        }
        if let Some(path) = local_path(upstream) {
            return self.publish_to_path(&path, &remote_ref, oid, expected, moved);
        }
        let lease = format!("--force-with-lease={remote_ref}:{}", expected.unwrap_or(""));
        let options: Vec<String> = push_options
            .iter()
            .map(|o| format!("--push-option={o}"))
            .collect();
        let refspec = format!("{oid}:{remote_ref}");
        let mut args = vec!["push", "--atomic", "--porcelain", "--no-verify", &lease];
        args.extend(options.iter().map(String::as_str));
        args.extend(["--end-of-options", &upstream.url, &refspec]);
        match transfer(self, upstream, &args, None) {
            Ok(out) => {
                let answer = out
                    .lines()
                    .find(|l| l.contains(&remote_ref))
                    .unwrap_or("")
                    .trim()
                    .to_owned();
                Ok(PushAnswer {
                    remote_ref,
                    pushed: true,
                    answer,
                })
            }
            Err(GitError::Failed { stderr, .. }) if stderr.contains("stale info") => {
                // The lease lost: someone moved the branch while we sent.
                // It may be us, in an earlier life: look again.
                let found = self.upstream_head(upstream, branch)?;
                if found.as_deref() == Some(oid) {
                    return Ok(PushAnswer::already(remote_ref));
                }
                Err(moved(found.as_deref()))
            }
            Err(e) => Err(e),
        }
    }

    /// A publication to a local upstream: the commit's objects copied into
    /// it through an alternate (no process runs in it but the worker's
    /// hardened git: no hook, the reference-transaction hook included),
    /// then its ref moved by `update-ref` from `expected` (absent: zeros)
    /// to `oid` — git's own compare-and-swap.
    fn publish_to_path(
        &self,
        path: &Path,
        remote_ref: &str,
        oid: &str,
        expected: Option<&str>,
        moved: impl Fn(Option<&str>) -> GitError,
    ) -> GitResult<PushAnswer> {
        let up = local_repo(self, path)?;
        let have = crate::foreign::list_refs(&up)?;
        let mut revs = format!("{oid}\n--not\n");
        for r in &have {
            revs.push_str(&r.oid);
            revs.push('\n');
        }
        let alternate = crate::foreign::c_quote(&self.path().join("objects"));
        crate::foreign::transfer(&up, &alternate, revs.as_bytes())?;
        let zero = "0".repeat(oid.len());
        let old = expected.unwrap_or(&zero);
        let head = |up: &crate::Git| {
            up.optional(&[
                "rev-parse",
                "--verify",
                "--quiet",
                "--end-of-options",
                remote_ref,
            ])
        };
        match up.output(&[
            "update-ref",
            "-m",
            "airlock: publication",
            remote_ref,
            oid,
            old,
        ]) {
            Ok(_) => Ok(PushAnswer {
                remote_ref: remote_ref.to_owned(),
                pushed: true,
                answer: format!("*\t{oid}:{remote_ref}\t[updated by compare-and-swap]"),
            }),
            Err(GitError::Failed { .. }) => {
                let found = head(&up)?;
                if found.as_deref() == Some(oid) {
                    return Ok(PushAnswer::already(remote_ref.to_owned()));
                }
                Err(moved(found.as_deref()))
            }
            Err(e) => Err(e),
        }
    }

    /// Refuses an authority repository whose own configuration names a
    /// transport program (its config is the worker's, but a transfer is
    /// the one run where git would start one).
    fn refuse_transport_config(&self) -> GitResult<()> {
        for key in [
            "core.sshCommand",
            "core.gitProxy",
            "remote.origin.uploadpack",
        ] {
            if let Some(v) = self.git.optional(&["config", "--local", "--get", key])? {
                return Err(GitError::Refused(Error::with(
                    Code::UPSTREAM_URL_INVALID,
                    format!(
                        "{}: its configuration sets {key} ({v}): remove it",
                        self.path().display()
                    ),
                )));
            }
        }
        Ok(())
    }
}

/// A local upstream's path, when it is one.
fn local_path(upstream: &Upstream) -> Option<PathBuf> {
    (upstream.scheme == Scheme::Local)
        .then(|| airlock_proto::upstream::local_path(&upstream.url).map(PathBuf::from))
        .flatten()
}

/// Checks, before a local upstream is registered (and its path opened to
/// the worker), that `url` names an existing bare git repository by its
/// own path: a directory reached without a symbolic link, holding a bare
/// repository, outside every directory in `reserved` (airlock's own
/// configuration, state and authority repositories). Anything else —
/// `/etc`, a missing path, a work tree, a link — is UPSTREAM_URL_INVALID.
/// A URL of another scheme passes unchecked.
pub fn check_local_upstream(url: &str, reserved: &[&Path]) -> GitResult<()> {
    let Some(path) = airlock_proto::upstream::local_path(url) else {
        return Ok(());
    };
    let path = Path::new(path);
    let refuse = |why: String| {
        GitError::Refused(Error::with(
            Code::UPSTREAM_URL_INVALID,
            format!("local upstream {}: {why}", path.display()),
        ))
    };
    let meta = std::fs::symlink_metadata(path).map_err(|e| refuse(e.to_string()))?;
    if !meta.is_dir() {
        return Err(refuse("not a directory (a bare git repository)".into()));
    }
    let real = std::fs::canonicalize(path).map_err(|e| refuse(e.to_string()))?;
    if real != path {
        return Err(refuse(format!(
            "reached through a symbolic link (it is {}): name it by its own path",
            real.display()
        )));
    }
    if let Some(r) = reserved
        .iter()
        .find(|r| path.starts_with(r) || r.starts_with(path))
    {
        return Err(refuse(format!("overlaps airlock's own {}", r.display())));
    }
    // A bare repository keeps these at its top; a system directory or a
    // work tree does not. Checked before git runs in it at all.
    for (entry, dir) in [("HEAD", false), ("objects", true), ("refs", true)] {
        let ok = std::fs::symlink_metadata(path.join(entry))
            .is_ok_and(|m| if dir { m.is_dir() } else { m.is_file() });
        if !ok {
            return Err(refuse(format!("not a bare git repository (no {entry})")));
        }
    }
    let bare = crate::Git::new(crate::default_program(), path.to_path_buf())
        .output(&["rev-parse", "--is-bare-repository"])
        .map_err(|e| refuse(e.to_string()))?;
    if bare.trim() != "true" {
        return Err(refuse("not a bare git repository".into()));
    }
    Ok(())
}

/// The hardened git on a local upstream (trusted for this run by its own
/// path), after checking it is a bare repository.
fn local_repo(repo: &AuthorityRepo, path: &Path) -> GitResult<crate::Git> {
    let up = crate::Git::new(repo.git.program().to_path_buf(), path.to_path_buf());
    let bare = up.output(&["rev-parse", "--is-bare-repository"])?;
    if bare.trim() != "true" {
        return Err(GitError::NotBare(path.to_path_buf()));
    }
    Ok(up)
}

/// Runs one transfer: the hardened git, the upstream's protocol alone
/// allowed, its credential, bounded in time (and in file size for a
/// fetch). A failure is classified from git's and ssh's words: a refused
/// host key, a refused credential, a refused push, an unreachable host.
fn transfer(
    repo: &AuthorityRepo,
    upstream: &Upstream,
    args: &[&str],
    max_file_bytes: Option<u64>,
) -> GitResult<String> {
    let mut cmd = transfer_command(repo.git.program(), repo.path(), upstream);
    // One pack, never loose objects: what a fetch writes is one file in
    // objects/pack that the bound watches.
    cmd.args(["-c", "fetch.unpackLimit=1", "-c", "transfer.unpackLimit=1"]);
    cmd.args(args);
    let watch = max_file_bytes.map(|limit| (repo.path().join("objects/pack"), limit));
    run_bounded(cmd, upstream.timeout, watch).map_err(|e| classify(e, args[0]))
}

/// The hardened git for a transfer with the upstream.
fn transfer_command(program: &Path, repo: &Path, upstream: &Upstream) -> Command {
    // The hardened base, except the transport-program line: for ssh,
    // GIT_SSH names the launcher (core.sshCommand would win over it, and
    // git runs that through a shell).
    let mut cmd = hardened_except(program, "core.sshCommand=");
    cmd.env("GIT_DIR", repo);
    trust(&mut cmd, repo);
    let allow = format!("protocol.{}.allow=always", upstream.scheme.protocol());
    cmd.args(["-c", &allow]);
    cmd.env("GIT_SSH_VARIANT", "ssh");
    match &upstream.credential {
        Credential::None => {
            cmd.env("GIT_SSH", "/bin/false");
        }
        Credential::SshKey {
            key,
            known_hosts,
            launcher,
        } => {
            cmd.env("GIT_SSH", launcher)
                .env(SSH_KEY_ENV, key)
                .env(SSH_KNOWN_HOSTS_ENV, known_hosts)
                .env(
                    SSH_CONNECT_TIMEOUT_ENV,
                    upstream.timeout.as_secs().clamp(1, 60).to_string(),
                );
        }
        Credential::Token { user, token } => {
            use base64::Engine;
            let basic = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{token}"));
            cmd.env("GIT_SSH", "/bin/false")
                .env("GIT_CONFIG_COUNT", "1")
                .env("GIT_CONFIG_KEY_0", "http.extraHeader")
                .env(
                    "GIT_CONFIG_VALUE_0",
                    format!("Authorization: Basic {basic}"),
                );
        }
    }
    cmd
}

/// The hardened base without its line starting `skip` (which must be one).
fn hardened_except(program: &Path, skip: &str) -> Command {
    debug_assert!(HARDENING.iter().any(|l| l.starts_with(skip)));
    hardened(program, |line| !line.starts_with(skip))
}

/// The largest pack being received in `dir` (git's `tmp_pack_*`).
fn incoming_pack_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("tmp_pack_"))
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .max()
        .unwrap_or(0)
}

/// Runs `cmd` in its own process group, killed whole past `timeout`;
/// with `watch` (a pack directory and a bound), killed too when a pack
/// being received there grows past the bound.
fn run_bounded(
    mut cmd: Command,
    timeout: Duration,
    watch: Option<(PathBuf, u64)>,
) -> GitResult<String> {
    let program = PathBuf::from(cmd.get_program());
    let args: Vec<String> = cmd
        .get_args()
        .map(|a| a.to_string_lossy().into_owned())
        .filter(|a| !a.contains("Authorization"))
        .collect();
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = cmd.spawn().map_err(|source| GitError::Spawn {
        program: program.clone(),
        source,
    })?;
    let pgid = nix::unistd::Pid::from_raw(child.id() as i32);
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let out_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = stdout.read_to_end(&mut v);
        v
    });
    let err_reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = stderr.read_to_end(&mut v);
        v
    });
    let started = Instant::now();
    let mut too_large = false;
    let (status, timed_out) = loop {
        if let Some(status) = child.try_wait()? {
            break (status, false);
        }
        if let Some((dir, limit)) = &watch {
            if incoming_pack_bytes(dir) > *limit {
                too_large = true;
                let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
                break (child.wait()?, false);
            }
        }
        if started.elapsed() >= timeout {
            let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
            break (child.wait()?, true);
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    if too_large {
        // What the killed fetch left behind is garbage: no ref names it.
        if let Some((dir, _)) = &watch {
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                if e.file_name().to_string_lossy().starts_with("tmp_") {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }
    // Whatever is left of the group (ssh's children) goes with it.
    let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
    let out = out_reader.join().unwrap_or_default();
    let err = err_reader.join().unwrap_or_default();
    let tail = tail_of(&String::from_utf8_lossy(&err), 800);
    if too_large {
        let limit = watch.map(|(_, l)| l).unwrap_or(0);
        return Err(GitError::Failed {
            args: args.join(" "),
            status: format!("killed: the pack grew past {limit} bytes"),
            stderr: format!("fetch size limit; {}", tail.trim()),
        });
    }
    if timed_out {
        return Err(GitError::Failed {
            args: args.join(" "),
            status: format!("killed after {} s", timeout.as_secs()),
            stderr: format!("timed out; {}", tail.trim()),
        });
    }
    if !status.success() {
        let status = status.to_string();
        return Err(GitError::Failed {
            args: args.join(" "),
            status,
            stderr: tail.trim().to_owned(),
        });
    }
    String::from_utf8(out).map_err(|e| std::io::Error::other(e.to_string()).into())
}

/// Maps a failed transfer to its code; other errors pass through.
fn classify(e: GitError, verb: &str) -> GitError {
    let GitError::Failed {
        args,
        status,
        stderr,
    } = &e
    else {
        return e;
    };
    let s = stderr.to_ascii_lowercase();
    let says = |words: &[&str]| words.iter().any(|w| s.contains(w));
    let code = if says(&[
        "host key verification failed",
        "remote host identification has changed",
        "no matching host key",
    ]) || (s.contains("host key for") && s.contains("has changed"))
    {
        Code::UPSTREAM_HOST_KEY_CHANGED
    } else if says(&[
        "permission denied (publickey",
        "authentication failed",
        "the requested url returned error: 401",
        "the requested url returned error: 403",
        "could not read username",
        "load key",
        "invalid format",
    ]) {
        Code::UPSTREAM_AUTH_FAILED
    } else if s.starts_with("fetch size limit") || s.starts_with("timed out") {
        if verb == "fetch" {
            Code::UPSTREAM_FETCH_LIMIT
        } else {
            Code::UPSTREAM_UNREACHABLE
        }
    } else if verb == "push"
        && says(&[
            "[remote rejected]",
            "pre-receive hook declined",
            "protected branch",
            "[rejected]",
        ])
    {
        Code::UPSTREAM_PUSH_REFUSED
    } else if says(&[
        "could not resolve",
        "connection refused",
        "connection timed out",
        "no route to host",
        "network is unreachable",
        "connection reset",
        "connection closed",
        "could not read from remote repository",
        "unable to access",
        "kex_exchange_identification",
    ]) {
        Code::UPSTREAM_UNREACHABLE
    } else {
        return e;
    };
    GitError::Refused(Error::with(
        code,
        format!("git {args} ({status}): {}", stderr.trim()),
    ))
}

/// airlock's ssh launcher: what git starts as `GIT_SSH` for an ssh
/// upstream. It runs OpenSSH with the deploy key named by
/// [`SSH_KEY_ENV`] as the only identity, the host keys in
/// [`SSH_KNOWN_HOSTS_ENV`] as the only known hosts (strict checking, so a
/// changed or unknown key is refused), no configuration file, no agent,
/// no forwarding and no prompt, then git's own arguments. It never
/// returns: it becomes ssh, or exits 255 as ssh does on failure.
pub fn ssh_launcher_main() -> ! {
    let key = std::env::var_os(SSH_KEY_ENV).unwrap_or_default();
    let known = std::env::var_os(SSH_KNOWN_HOSTS_ENV).unwrap_or_default();
    let timeout = std::env::var(SSH_CONNECT_TIMEOUT_ENV).unwrap_or_else(|_| "30".into());
    let mut identity = std::ffi::OsString::from("IdentityFile=");
    identity.push(&key);
    let mut hosts = std::ffi::OsString::from("UserKnownHostsFile=");
    hosts.push(&known);
    let mut cmd = Command::new("/usr/bin/ssh");
    cmd.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("LC_ALL", "C");
    if let Some(v) = std::env::var_os("GIT_PROTOCOL") {
        cmd.env("GIT_PROTOCOL", v);
    }
    cmd.args(["-F", "/dev/null"])
        .arg("-o")
        .arg(identity)
        .arg("-o")
        .arg(hosts)
        .args([
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "IdentityAgent=none",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "UpdateHostKeys=no",
            "-o",
            "CheckHostIP=no",
            "-o",
            "BatchMode=yes",
            "-o",
            "PasswordAuthentication=no",
            "-o",
            "KbdInteractiveAuthentication=no",
            "-o",
            "ForwardAgent=no",
            "-o",
            "ForwardX11=no",
            "-o",
            "ClearAllForwardings=yes",
            "-o",
            "PermitLocalCommand=no",
            "-o",
            "ProxyCommand=none",
            "-o",
            "ControlMaster=no",
            "-o",
            "ControlPath=none",
            "-o",
            "LogLevel=ERROR",
        ])
        .arg("-o")
        .arg(format!("ConnectTimeout={timeout}"))
        .args(std::env::args_os().skip(1));
    let e = cmd.exec();
    eprintln!("airlock ssh launcher: cannot run /usr/bin/ssh: {e}");
    std::process::exit(255)
}

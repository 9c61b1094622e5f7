//! A verification environment's setup: the dependency layer a request's
//! commands read, taken from the layer cache or made by running the
//! environment's setup commands.
//!
//! 1. The inputs: every file of the request's workspace (the task's tree
//!    with the change applied) that one of the setup's `inputs` globs
//!    matches; their content and the environment's digest are the layer's
//!    key ([`crate::layer::key`]).
//! 2. A cached layer with that key is used as it is: no setup runs, no
//!    connection is made.
//! 3. Otherwise each setup command runs in the executor's sandbox (the
//!    minimal root only: its uid, Landlock, seccomp, no credentials) on a
//!    workspace holding only the inputs, with HOME on the per-command
//!    tmpfs and each `~/…` output bound there from the layer being made;
//!    its network namespace holds `lo` and the forwarder's listener alone
//!    ([`crate::forward`]), its package clients are pointed there by the
//!    usual proxy variables. A command that fails ends the request with
//!    SETUP_FAILED and its redacted tail; a refusal by the proxy that
//!    only configuration can change (an unlisted host or port, a
//!    forbidden address, a method other than CONNECT, a parent proxy
//!    refusing the route's credential or the connection:
//!    [`FINAL_REFUSALS`]) ends it with the proxy's code, which ends the
//!    task, even when the command ignored the refusal and exited 0.
//! 4. The outputs are moved into the layer, which is sealed (never after
//!    such a refusal).

use crate::error::{Error, Result};
use crate::forward::Forwarder;
use crate::layer::{Layer, LayerCache};
use crate::run::{Runner, WorkspaceSource};
use crate::tree::fs::{chown_tree, file_sha256, remove_tree};
use airlock_config::ResolvedSetup;
use airlock_proto::Code;
use airlock_proto::bundle::{CommandEvidence, EgressDecision, LayerEvidence};
use airlock_proto::egress::{HostPort, Limits, Preamble};
use airlock_proto::envelope::Command;
use airlock_sandbox::ViewMode;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The port the forwarder listens on inside a setup's network namespace.
pub const PROXY_PORT: u16 = 3128;

/// Bounds of one setup's egress session.
pub const SESSION_LIMITS: Limits = Limits {
    max_bytes: 4 << 30,
    max_seconds: 3600,
    max_connections: 4096,
};

/// The forwarder's URL, as the setup's proxy variables name it.
pub fn proxy_url() -> String {
    format!("http://127.0.0.1:{PROXY_PORT}")
}

/// What the setup's package clients are told: the forwarder is their proxy
/// for every scheme, and no host bypasses it.
pub fn proxy_variables() -> Vec<(String, String)> {
    let url = proxy_url();
    let mut v = Vec::new();
    for name in ["HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY"] {
        v.push((name.to_owned(), url.clone()));
        v.push((name.to_ascii_lowercase(), url.clone()));
    }
    for name in ["NO_PROXY", "no_proxy"] {
        v.push((name.to_owned(), String::new()));
    }
    // npm reads its own names first.
    v.push(("npm_config_proxy".into(), url.clone()));
    v.push(("npm_config_https_proxy".into(), url.clone()));
    v.push(("npm_config_noproxy".into(), String::new()));
    v
}

/// Where a request's workspace is, for finding the inputs.
#[derive(Debug)]
pub enum Applied<'a> {
    /// A full copy of the tree with the change applied.
    Dir(&'a Path),
    /// The cached tree under the change's files and whiteouts.
    Layered {
        /// The cached tree.
        lower: &'a Path,
        /// The change's files (whiteouts for deletions).
        upper: &'a Path,
    },
}

/// Everything a setup needs from the executor.
#[derive(Debug)]
pub struct Context<'a> {
    /// The command runner.
    pub runner: &'a Runner,
    /// The layer cache.
    pub layers: &'a LayerCache,
    /// airlock-egress's socket.
    pub egress_socket: &'a Path,
    /// The request's scratch directory.
    pub scratch: &'a Path,
    /// The request's id.
    pub request_id: &'a str,
    /// The task it serves.
    pub task_id: &'a str,
    /// The environment's digest.
    pub environment_digest: &'a str,
    /// The environment's variables.
    pub variables: &'a BTreeMap<String, String>,
}

fn globs(patterns: &[String]) -> Result<globset::GlobSet> {
    let mut b = globset::GlobSetBuilder::new();
    for p in patterns {
        let g = globset::GlobBuilder::new(p)
            .literal_separator(true)
            .build()
            .map_err(|e| Error::SetupRefused {
                code: Code::ENVIRONMENT_INVALID,
                message: format!("environment.setup.inputs: {p:?}: {e}"),
            })?;
        b.add(g);
    }
    b.build().map_err(|e| Error::SetupRefused {
        code: Code::ENVIRONMENT_INVALID,
        message: format!("environment.setup.inputs: {e}"),
    })
}

fn files(root: &Path, dir: &Path, out: &mut BTreeMap<String, (PathBuf, bool)>) -> Result<()> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in rd.flatten() {
        let path = entry.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let Some(rel) = path.strip_prefix(root).ok().and_then(Path::to_str) else {
            continue;
        };
        let rel = rel.to_owned();
        if meta.is_dir() {
            files(root, &path, out)?;
        } else {
            // A character device in an upper directory is a whiteout.
            use std::os::unix::fs::FileTypeExt;
            let whiteout = meta.file_type().is_char_device();
            if meta.is_file() || whiteout {
                out.insert(rel, (path, whiteout));
            }
        }
    }
    Ok(())
}

/// The inputs: `(path, host path, SHA-256)` of every workspace file a glob
/// matches, sorted by path.
pub fn inputs(
    applied: &Applied<'_>,
    patterns: &[String],
) -> Result<Vec<(String, PathBuf, String)>> {
    let set = globs(patterns)?;
    let mut found = BTreeMap::new();
    match applied {
        Applied::Dir(dir) => files(dir, dir, &mut found)?,
        Applied::Layered { lower, upper } => {
            files(lower, lower, &mut found)?;
            let mut above = BTreeMap::new();
            files(upper, upper, &mut above)?;
            found.extend(above);
        }
    }
    let mut out = Vec::new();
    for (rel, (path, whiteout)) in found {
        if whiteout || !set.is_match(&rel) {
            continue;
        }
        let sha = file_sha256(&path)?;
        out.push((rel, path, sha));
    }
    Ok(out)
}

/// The layer for this request: cached, or made now.
pub fn layer(
    ctx: &Context<'_>,
    setup: &ResolvedSetup,
    applied: &Applied<'_>,
) -> Result<(Layer, LayerEvidence)> {
    let inputs = inputs(applied, &setup.inputs)?;
    let keyed: Vec<(String, String)> = inputs
        .iter()
        .map(|(rel, _, sha)| (rel.clone(), sha.clone()))
        .collect();
    let key = crate::layer::key(ctx.environment_digest, &keyed);
    // Made once: a job whose layer another job is making waits for it.
    let _making = ctx.layers.claim(&key);
    if let Some(layer) = ctx.layers.get(&key) {
        let evidence = LayerEvidence {
            key: layer.key.clone(),
            digest: layer.digest.clone(),
            bytes: layer.bytes,
            reused: true,
            setup: Vec::new(),
            egress: Vec::new(),
        };
        return Ok((layer, evidence));
    }
    if ctx.runner.view() != ViewMode::MinimalRoot || !ctx.runner.hello().namespaces.net {
        return Err(Error::SetupRefused {
            code: Code::SETUP_UNAVAILABLE,
            message: format!(
                "the environment's setup needs the minimal root with a network namespace per command; this executor's commands get the {} ({})",
                ctx.runner.view().as_str(),
                ctx.runner
                    .hello()
                    .reason
                    .as_deref()
                    .unwrap_or("no network namespace")
            ),
        });
    }
    let staging = ctx.layers.staging(&key)?;
    let made = make(ctx, setup, &inputs, &staging);
    let (commands, egress) = match made {
        Ok(done) => done,
        Err(e) => {
            remove_tree(&staging);
            return Err(e);
        }
    };
    let layer = ctx.layers.seal(&key, &staging)?;
    let evidence = LayerEvidence {
        key: layer.key.clone(),
        digest: layer.digest.clone(),
        bytes: layer.bytes,
        reused: false,
        setup: commands,
        egress,
    };
    Ok((layer, evidence))
}

fn io(e: std::io::Error, p: &Path) -> Error {
    Error::Setup {
        path: p.to_owned(),
        detail: e.to_string(),
    }
}

/// Runs the setup commands in a workspace of the inputs; moves the outputs
/// into `staging`.
fn make(
    ctx: &Context<'_>,
    setup: &ResolvedSetup,
    inputs: &[(String, PathBuf, String)],
    staging: &Path,
) -> Result<(Vec<CommandEvidence>, Vec<EgressDecision>)> {
    let ws = ctx.scratch.join("setup-ws");
    std::fs::create_dir_all(&ws).map_err(|e| io(e, &ws))?;
    for (rel, path, _) in inputs {
        let dst = ws.join(rel);
        if let Some(parent) = dst.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io(e, parent))?;
        }
        std::fs::copy(path, &dst).map_err(|e| io(e, &dst))?;
    }
    // HOME outputs are bound from the layer being made.
    let home_outputs: Vec<&str> = setup
        .outputs
        .iter()
        .filter_map(|o| o.strip_prefix("~/"))
        .collect();
    for rel in &home_outputs {
        let d = staging.join("layer/home").join(rel);
        std::fs::create_dir_all(&d).map_err(|e| io(e, &d))?;
    }
    if rustix::process::geteuid().is_root() {
        let (uid, gid) = ctx.runner.hello().ids;
        for d in [&ws, &staging.to_path_buf()] {
            chown_tree(d, uid, gid).map_err(|e| io(e, d))?;
        }
    }
    let allow = setup
        .egress
        .iter()
        .map(|e| {
            HostPort::parse(e).map_err(|err| Error::SetupRefused {
                code: Code::ENVIRONMENT_EGRESS_INVALID,
                message: format!("environment.setup.egress: {e}: {err}"),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let preamble = Preamble {
        session: format!("{}.setup", ctx.request_id),
        task_id: ctx.task_id.to_owned(),
        allow,
        limits: SESSION_LIMITS,
    };
    let mut variables = ctx.variables.clone();
    if !preamble.allow.is_empty() {
        for (k, v) in proxy_variables() {
            variables.insert(k, v);
        }
    }
    // What airlock made for the setup, never redacted from its tails: the
    // forwarder's URL (in its environment, so a literal otherwise), the
    // task's id (and so its refs), the request's id, the environment's digest.
    let known = vec![
        proxy_url(),
        ctx.task_id.to_owned(),
        ctx.request_id.to_owned(),
        ctx.environment_digest.to_owned(),
    ];
    let mut evidence = Vec::new();
    let mut decisions = Vec::new();
    for (i, argv) in setup.commands.iter().enumerate() {
        let cmd = Command {
            label: format!("setup-{}", i + 1),
            argv: argv.clone(),
            cwd: ".".into(),
            timeout_seconds: setup.timeout_seconds,
        };
        // No egress entry, no network: the command gets a verification's
        // sandbox (lo down, AF_UNIX sockets only).
        let forwarding = if preamble.allow.is_empty() {
            None
        } else {
            Some(
                Forwarder::start(ctx.egress_socket, &preamble)
                    .map_err(|e| io(e, ctx.egress_socket))?,
            )
        };
        let (forwarder, handoff) = match forwarding {
            Some((f, h)) => (Some(f), Some(h)),
            None => (None, None),
        };
        let nested = home_outputs
            .iter()
            .map(|rel| airlock_sandbox::Nested {
                source: staging.join("layer/home").join(rel),
                target: Path::new("/tmp").join(rel),
                copy_on_write: None,
            })
            .collect();
        let ran = ctx.runner.run(
            &cmd,
            &WorkspaceSource::Dir(ws.clone()),
            ctx.scratch,
            1000 + i,
            crate::run::Extras {
                variables: Some(&variables),
                nested,
                layers: Vec::new(),
                network: handoff.map(|h| (PROXY_PORT, h)),
                home: Vec::new(),
                known: known.clone(),
            },
        );
        if let Some(f) = forwarder {
            decisions.extend(f.finish());
        }
        let (ev, _) = ran?;
        let ok = ev.exit_code == Some(0) && !ev.timed_out;
        evidence.push(ev);
        // A refusal only configuration can change ends the setup whatever
        // the command made of it: one that ignores it and exits 0 seals
        // nothing.
        if !ok || final_refusal(&decisions).is_some() {
            return Err(failed(&evidence, &decisions));
        }
    }
    for out in setup.outputs.iter().filter(|o| !o.starts_with("~/")) {
        let from = ws.join(out);
        if std::fs::symlink_metadata(&from).is_err() {
            continue;
        }
        let to = staging.join("layer/ws").join(out);
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io(e, parent))?;
        }
        std::fs::rename(&from, &to).map_err(|e| io(e, &to))?;
    }
    Ok((evidence, decisions))
}

/// The proxy's refusals that only configuration changes: any one of them
/// ends the setup.
pub const FINAL_REFUSALS: [Code; 6] = [
    Code::EGRESS_HOST_NOT_ALLOWED,
    Code::EGRESS_PORT_NOT_ALLOWED,
    Code::EGRESS_ADDRESS_FORBIDDEN,
    Code::EGRESS_METHOD_NOT_ALLOWED,
    // A route's parent proxy refusing the proxy's credential, or the
    // CONNECT by its own policy: the administrator's to mend.
    Code::EGRESS_PARENT_AUTH_FAILED,
    Code::EGRESS_PARENT_REFUSED,
];

/// The first of `decisions` refused with one of [`FINAL_REFUSALS`]: its
/// code and target.
fn final_refusal(decisions: &[EgressDecision]) -> Option<(Code, String)> {
    decisions.iter().find_map(|d| {
        let code = Code::from_name(d.code.as_deref()?)?;
        FINAL_REFUSALS
            .contains(&code)
            .then(|| (code, d.target.clone()))
    })
}

/// The failure of a setup: the proxy's refusal when it refused something
/// only configuration changes (whatever the command's exit status), else
/// SETUP_FAILED; with the last command's redacted tail.
fn failed(evidence: &[CommandEvidence], decisions: &[EgressDecision]) -> Error {
    let refused = final_refusal(decisions);
    let last = evidence.last();
    let what = last.map_or(String::new(), |e| {
        let status = match (e.exit_code, e.signal, e.timed_out) {
            (_, _, true) => "timed out".to_owned(),
            (Some(c), _, _) => format!("exited {c}"),
            (_, Some(s), _) => format!("was killed by signal {s}"),
            _ => "failed".to_owned(),
        };
        format!("{} {status}", e.label)
    });
    let tail = last.map_or(String::new(), |e| {
        let t = if e.stderr_tail.trim().is_empty() {
            &e.stdout_tail
        } else {
            &e.stderr_tail
        };
        let mut start = t.len().saturating_sub(2048);
        while !t.is_char_boundary(start) {
            start += 1;
        }
        t[start..].to_owned()
    });
    let asked = decisions
        .iter()
        .map(|d| match &d.code {
            None => format!("{} allowed", d.target),
            Some(c) => format!("{} refused {c}", d.target),
        })
        .collect::<Vec<_>>()
        .join(", ");
    match refused {
        Some((code, target)) => Error::SetupRefused {
            code,
            message: format!(
                "setup: the egress proxy refused {target} ({}); {what}; egress: {asked}\n{tail}",
                code.as_str()
            ),
        },
        None => Error::SetupRefused {
            code: Code::SETUP_FAILED,
            message: format!(
                "setup: {what}; egress: {}\n{tail}",
                if asked.is_empty() { "none" } else { &asked }
            ),
        },
    }
}

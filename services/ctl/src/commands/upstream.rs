//! `airlockctl repo add … --upstream URL` and `repo sync`: a repository's
//! upstream as an administrator sets it up (docs/upstream.md).
//!
//! The credential (a deploy key for ssh, a token for https) and the
//! signing key are copied to `/etc/airlock/credentials/` (beside the
//! configuration file; root, 0600, the directory 0700) and handed to the worker alone by systemd: a drop-in
//! `airlock-worker.service.d/upstream-NAME.conf` says `LoadCredential=`
//! (or `LoadCredentialEncrypted=` with `--encrypt-credentials`, where
//! `systemd-creds` works) and opens the worker's network to what the URL
//! needs. Credentials are delivered when a service starts, so the worker
//! is restarted (its tasks resume from their checkpoints). Nothing of a
//! credential is written to the configuration, the bus or a log.
//!
//! `repo sync NAME` asks the worker for a sync by a request file in its
//! state directory (`<worker state>/upstream/NAME.request`) and waits for
//! the answer the worker records beside it (`NAME.json`); both are
//! declared in `airlock_proto::upstream` (`SyncRequest`, `SyncState`).

use crate::client::CtlError;
use crate::output::Ctx;
use airlock_config::{Config, Signing, Upstream};
use airlock_proto::Code;
use airlock_proto::upstream::{Scheme, SyncRequest, SyncState};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

/// Where `repo add` keeps the worker's credentials for systemd to load:
/// `credentials/` beside the configuration file (`/etc/airlock/credentials`).
pub fn credentials_dir(config_path: &Path) -> PathBuf {
    config_path
        .parent()
        .map(|d| d.join("credentials"))
        .unwrap_or_else(|| PathBuf::from("/etc/airlock/credentials"))
}

/// The worker unit's drop-in directory: under `$AIRLOCK_SYSTEMD_UNIT_DIR`
/// (for packagers' and tests' roots), by default `/etc/systemd/system`.
pub fn worker_drop_ins() -> PathBuf {
    std::env::var_os("AIRLOCK_SYSTEMD_UNIT_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/etc/systemd/system"))
        .join("airlock-worker.service.d")
}

/// The upstream options of `repo add`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct UpstreamArgs {
    /// The team's remote: ssh://[user@]host[:port]/path (a deploy key and
    /// --host-key), https://host/path (a token, or none to only fetch a
    /// public remote) or an absolute path. The worker fetches its branches
    /// and tags (never agent/*) and publishes each task's agent branch to
    /// it; without --from the repository starts empty and the worker's
    /// first sync fills it.
    #[arg(long, value_name = "URL")]
    pub upstream: Option<String>,
    /// The worker's credential for the upstream: an SSH private key (a
    /// deploy key with write access) for ssh://, a file holding a token
    /// for https://. Copied where only the worker's unit reads it.
    #[arg(long, value_name = "FILE", requires = "upstream")]
    pub credential: Option<PathBuf>,
    /// A known_hosts line pinning the upstream's SSH host key (as
    /// `ssh-keyscan HOST` prints it; check it out of band). Repeatable;
    /// required for ssh://.
    #[arg(long = "host-key", value_name = "LINE", requires = "upstream")]
    pub host_keys: Vec<String>,
    /// Only follow the upstream; never push agent branches to it.
    #[arg(long, requires = "upstream")]
    pub no_publish: bool,
    /// A git push option sent with every publication (for forges that open
    /// a review request from one). Repeatable.
    #[arg(long = "push-option", value_name = "OPTION", requires = "upstream")]
    pub push_options: Vec<String>,
    /// Seconds between scheduled syncs (jittered by up to a tenth; 0: only
    /// on `repo sync` and when a task needs a base) [default: 300].
    #[arg(long, value_name = "SECONDS", requires = "upstream")]
    pub sync_interval: Option<u32>,
    /// Sign every governed commit with this unencrypted Ed25519 SSH key
    /// (`ssh-keygen -t ed25519 -N ''`); copied where only the worker's
    /// unit reads it.
    #[arg(long, value_name = "FILE", requires = "signer")]
    pub signing_key: Option<PathBuf>,
    /// The signer's principal in allowed-signers files (e.g. an e-mail
    /// address).
    #[arg(long, value_name = "PRINCIPAL", requires = "signing_key")]
    pub signer: Option<String>,
    /// Store the credentials encrypted with `systemd-creds encrypt` and
    /// load them with LoadCredentialEncrypted= (where systemd-creds works).
    #[arg(long)]
    pub encrypt_credentials: bool,
}

/// What `repo add` will register and install, checked before anything
/// is made.
#[derive(Debug)]
pub struct Plan {
    /// `[repository.upstream]`.
    pub upstream: Option<Upstream>,
    /// `[repository.signing]`.
    pub signing: Option<Signing>,
    credential: Option<PathBuf>,
    signing_key: Option<PathBuf>,
    encrypt: bool,
}

impl Plan {
    /// Whether there is anything to install for the worker.
    pub fn needs_worker_restart(&self) -> bool {
        self.upstream.is_some() || self.signing.is_some()
    }
}

fn invalid(code: Code, message: String) -> CtlError {
    CtlError::local(code, message)
}

/// Checks the options: the URL's form, the host keys an ssh:// URL needs,
/// the credential's presence, the signing key's kind.
pub fn plan(args: &UpstreamArgs) -> Result<Plan, CtlError> {
    let upstream = match &args.upstream {
        None => None,
        Some(url) => {
            let scheme = Scheme::of(url).map_err(|e| invalid(e.code, e.to_string()))?;
            if scheme == Scheme::Ssh && args.host_keys.is_empty() {
                return Err(invalid(
                    Code::UPSTREAM_HOST_KEY_CHANGED,
                    format!(
                        "{url}: an ssh:// upstream needs its host key pinned: --host-key \"$(ssh-keyscan -t ed25519 HOST)\" (check the key out of band)"
                    ),
                ));
            }
            if scheme == Scheme::Ssh && args.credential.is_none() {
                return Err(invalid(
                    Code::UPSTREAM_AUTH_FAILED,
                    format!(
                        "{url}: an ssh:// upstream needs the worker's deploy key: --credential FILE"
                    ),
                ));
            }
            let mut up = Upstream::at(url);
            up.publish = !args.no_publish;
            up.push_options = args.push_options.clone();
            up.host_keys = args.host_keys.iter().map(|l| l.trim().to_owned()).collect();
            if let Some(s) = args.sync_interval {
                up.sync_interval_seconds = s;
            }
            Some(up)
        }
    };
    if let Some(file) = &args.credential {
        let meta = std::fs::metadata(file).map_err(|e| {
            invalid(
                Code::UPSTREAM_AUTH_FAILED,
                format!("{}: {e}", file.display()),
            )
        })?;
        if !meta.is_file() || meta.len() == 0 || meta.len() > 64 << 10 {
            return Err(invalid(
                Code::UPSTREAM_AUTH_FAILED,
                format!(
                    "{}: not a credential file (empty, too large or not a file)",
                    file.display()
                ),
            ));
        }
    }
    let signing = match (&args.signing_key, &args.signer) {
        (Some(key), Some(principal)) => {
            airlock_git::Signer::load(key, principal)
                .map_err(|e| invalid(Code::SIGNING_KEY_INVALID, e.to_string()))?;
            Some(Signing {
                principal: principal.clone(),
            })
        }
        _ => None,
    };
    Ok(Plan {
        upstream,
        signing,
        credential: args.credential.clone(),
        signing_key: args.signing_key.clone(),
        encrypt: args.encrypt_credentials,
    })
}

/// Copies the credentials of `name` into [`CREDENTIALS_DIR`] and writes
/// the worker's systemd drop-in. Returns the files written.
pub fn install(config_path: &Path, name: &str, plan: &Plan) -> Result<Vec<PathBuf>, CtlError> {
    let mut written = Vec::new();
    if !plan.needs_worker_restart() {
        return Ok(written);
    }
    let dir = &credentials_dir(config_path);
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |e: std::io::Error| CtlError::generic(format!("{}: {e}", p.display()))
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io(dir))?;
    let (credential, signing) = airlock_config::credential_names(name);
    let mut load = Vec::new();
    for (id, from) in [
        (credential, plan.credential.as_deref()),
        (signing, plan.signing_key.as_deref()),
    ] {
        let Some(from) = from else { continue };
        let to = if plan.encrypt {
            dir.join(format!("{id}.cred"))
        } else {
            dir.join(&id)
        };
        if plan.encrypt {
            let out = Command::new("systemd-creds")
                .args(["encrypt", &format!("--name={id}")])
                .arg(from)
                .arg(&to)
                .output()
                .map_err(|e| CtlError::generic(format!("systemd-creds: {e}")))?;
            if !out.status.success() {
                return Err(CtlError::generic(format!(
                    "systemd-creds encrypt: {} (leave out --encrypt-credentials where it does not work)",
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
        } else {
            let bytes = std::fs::read(from).map_err(io(from))?;
            airlock_config::write_durably(&to, &bytes, 0o600, None).map_err(io(&to))?;
        }
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o600)).map_err(io(&to))?;
        load.push((id, to.clone()));
        written.push(to);
    }
    let drop_ins = &worker_drop_ins();
    std::fs::create_dir_all(drop_ins).map_err(io(drop_ins))?;
    let unit = drop_ins.join(format!("upstream-{name}.conf"));
    airlock_config::write_durably(&unit, unit_text(name, plan, &load).as_bytes(), 0o644, None)
        .map_err(io(&unit))?;
    written.push(unit);
    Ok(written)
}

/// The worker's drop-in for `name`: its credentials, and the network the
/// upstream's URL needs (nothing for a local path but a writable path).
fn unit_text(name: &str, plan: &Plan, load: &[(String, PathBuf)]) -> String {
    let mut text = format!(
        "# Written by `airlockctl repo add {name}`; removed by `airlockctl repo remove {name}`.\n[Service]\n"
    );
    for (id, path) in load {
        let directive = if plan.encrypt {
            "LoadCredentialEncrypted"
        } else {
            "LoadCredential"
        };
        text.push_str(&format!("{directive}={id}:{}\n", path.display()));
    }
    if let Some(up) = &plan.upstream {
        match Scheme::of(&up.url) {
            Ok(Scheme::Local) => {
                // `-`: a path removed later only stops its syncs, never the
                // worker's start.
                if let Some(path) = airlock_proto::upstream::local_path(&up.url) {
                    text.push_str(&format!("ReadWritePaths=-{path}\n"));
                }
            }
            Ok(_) => {
                // The worker's own Landlock rule then allows TCP connect to
                // the upstream's port only (docs/privsep.md).
                text.push_str(
                    "PrivateNetwork=no\nRestrictAddressFamilies=AF_UNIX AF_INET AF_INET6\nIPAddressAllow=any\n",
                );
            }
            Err(_) => {}
        }
    }
    text
}

/// Removes what [`install`] wrote for `name`; the files removed.
pub fn uninstall(config_path: &Path, name: &str) -> Vec<PathBuf> {
    let (credential, signing) = airlock_config::credential_names(name);
    let dir = &credentials_dir(config_path);
    let mut removed = Vec::new();
    for path in [
        dir.join(&credential),
        dir.join(format!("{credential}.cred")),
        dir.join(&signing),
        dir.join(format!("{signing}.cred")),
        worker_drop_ins().join(format!("upstream-{name}.conf")),
    ] {
        if std::fs::remove_file(&path).is_ok() {
            removed.push(path);
        }
    }
    removed
}

/// `systemctl daemon-reload` and a restart of the worker (credentials are
/// delivered at start); false when systemd does not run here.
pub fn restart_worker(ctx: &Ctx) -> bool {
    if !Path::new("/run/systemd/system").is_dir() {
        if !ctx.json {
            println!(
                "systemd is not running: restart the worker with CREDENTIALS_DIRECTORY naming a directory only it reads, holding the installed credentials"
            );
        }
        return false;
    }
    let ok = |args: &[&str]| {
        Command::new("systemctl")
            .args(args)
            .status()
            .is_ok_and(|s| s.success())
    };
    let reloaded = ok(&["daemon-reload"]);
    let restarted = ok(&["try-restart", "airlock-worker.service"]);
    if !(reloaded && restarted) {
        ctx.warn("systemctl daemon-reload / try-restart airlock-worker failed");
    }
    reloaded && restarted
}

/// The worker's upstream state directory, from its journal's.
pub fn state_dir(c: &Config) -> PathBuf {
    c.worker
        .journal
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default()
        .join("upstream")
}

/// The worker's record of `name`'s last sync, if any (one the previous
/// release's worker wrote too); `None` when there is none or it does not
/// read.
pub fn last_sync(c: &Config, name: &str) -> Option<SyncState> {
    let bytes = std::fs::read(state_dir(c).join(format!("{name}.json"))).ok()?;
    SyncState::from_json(&bytes).ok()
}

/// `repo sync NAME`: asks the worker and waits for its answer.
pub fn sync(ctx: &Ctx, c: &Config, name: &str, wait: Duration) -> Result<ExitCode, CtlError> {
    let r = c.repository(name).ok_or_else(|| {
        CtlError::local(
            Code::REPOSITORY_NOT_REGISTERED,
            format!("{name} is not registered"),
        )
    })?;
    if r.upstream.is_none() {
        return Err(CtlError::local(
            Code::UPSTREAM_NOT_CONFIGURED,
            format!("{name} has no upstream (airlockctl repo add {name} --upstream URL)"),
        ));
    }
    let dir = state_dir(c);
    if !dir.is_dir() {
        return Err(CtlError::local(
            Code::RUNTIME_UNAVAILABLE,
            format!(
                "{} does not exist: is the worker running (it makes it at its first sync)?",
                dir.display()
            ),
        ));
    }
    let mut id = [0u8; 8];
    getrandom::getrandom(&mut id).map_err(|e| CtlError::generic(e.to_string()))?;
    let id: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let request = dir.join(format!("{name}.request"));
    let tmp = dir.join(format!(".{name}.request.tmp"));
    let body = serde_json::to_vec(&SyncRequest { id: id.clone() })
        .map_err(|e| CtlError::generic(e.to_string()))?;
    std::fs::write(&tmp, body)
        .and_then(|_| std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644)))
        .and_then(|_| std::fs::rename(&tmp, &request))
        .map_err(|e| CtlError::generic(format!("{}: {e}", request.display())))?;
    if !ctx.json {
        eprintln!(
            "asked the worker to sync {name}; waiting up to {} s…",
            wait.as_secs()
        );
    }
    let deadline = Instant::now() + wait;
    let state = loop {
        if let Some(s) = last_sync(c, name).filter(|s| s.request.as_deref() == Some(id.as_str())) {
            break s;
        }
        if Instant::now() >= deadline {
            return Err(CtlError::local(
                Code::RUNTIME_UNAVAILABLE,
                format!(
                    "the worker did not answer within {} s (is it running?)",
                    wait.as_secs()
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    if ctx.json {
        ctx.print_json(&state);
    } else {
        print_state(&state);
    }
    match state.code.as_deref().and_then(Code::from_name) {
        None => Ok(ExitCode::SUCCESS),
        Some(code) => Ok(ExitCode::from(code.exit_code())),
    }
}

/// The sync record as text.
pub fn print_state(s: &SyncState) {
    match &s.code {
        None => {
            let changes = &s.report.changes;
            println!("  last sync: ok, {} ref(s) changed", changes.len());
            for c in changes {
                let what = if c.new.is_none() {
                    "deleted upstream, pruned"
                } else if c.old.is_none() {
                    "new"
                } else if c.forced {
                    "FORCE-PUSHED upstream, followed"
                } else {
                    "moved"
                };
                println!("    {} {} ({what})", c.name, c.new.as_deref().unwrap_or(""));
            }
        }
        Some(code) => println!(
            "  last sync: FAILED [{code}] {}",
            s.detail.as_deref().unwrap_or("")
        ),
    }
}

/// The directives `repo add --upstream` writes into the worker's drop-in
/// that the hardening verifier checks, with the only values it writes
/// (`ReadWritePaths=` takes the local upstream's path).
const OWN_HARDENING: &[(&str, Option<&str>)] = &[
    ("PrivateNetwork", Some("no")),
    ("RestrictAddressFamilies", Some("AF_UNIX AF_INET AF_INET6")),
    ("IPAddressAllow", Some("any")),
    ("ReadWritePaths", None),
];

/// `unit` as doctor should expect it to run: for the worker, with the
/// hardening lines of each `upstream-NAME.conf` drop-in in `drop_ins`
/// (systemd's DropInPaths) that `repo add --upstream` wrote — a drop-in of
/// that name holding anything else, or another value, adds nothing, so
/// its changes are reported as any drop-in's are.
pub fn expected_with_own_drop_ins(
    unit: &crate::hardening::ShippedUnit,
    drop_ins: &str,
    dir: &Path,
) -> crate::hardening::ShippedUnit {
    if unit.name != "airlock-worker.service" {
        return *unit;
    }
    let mut extra = String::new();
    for path in drop_ins.split_whitespace().map(Path::new) {
        let ours = path.parent() == Some(dir)
            && path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("upstream-") && n.ends_with(".conf"));
        let Some(text) = ours.then(|| std::fs::read_to_string(path).ok()).flatten() else {
            continue;
        };
        let lines = crate::hardening::parse_unit(&text);
        let acceptable = lines.iter().all(|a| {
            a.section == "Service"
                && (a.key.starts_with("LoadCredential")
                    || OWN_HARDENING
                        .iter()
                        .any(|(k, v)| *k == a.key && v.is_none_or(|v| v == a.value)))
        });
        if acceptable {
            extra.push_str("\n[Service]\n");
            for a in lines
                .iter()
                .filter(|a| !a.key.starts_with("LoadCredential"))
            {
                extra.push_str(&format!("{}={}\n", a.key, a.value));
            }
        }
    }
    if extra.is_empty() {
        return *unit;
    }
    let text: &'static str = Box::leak(format!("{}{extra}", unit.text).into_boxed_str());
    crate::hardening::ShippedUnit {
        name: unit.name,
        text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker() -> crate::hardening::ShippedUnit {
        *crate::hardening::SHIPPED_UNITS
            .iter()
            .find(|u| u.name == "airlock-worker.service")
            .unwrap()
    }

    #[test]
    fn only_its_own_upstream_drop_ins_widen_what_doctor_expects() {
        let dir = tempfile::tempdir().unwrap();
        let ours = dir.path().join("upstream-calc.conf");
        std::fs::write(
            &ours,
            "[Service]\nLoadCredential=upstream-calc:/etc/airlock/credentials/upstream-calc\nPrivateNetwork=no\nRestrictAddressFamilies=AF_UNIX AF_INET AF_INET6\nIPAddressAllow=any\n",
        )
        .unwrap();
        let other = dir.path().join("upstream-evil.conf");
        std::fs::write(&other, "[Service]\nPrivateNetwork=no\nNoNewPrivileges=no\n").unwrap();
        let elsewhere = dir.path().join("sub");
        std::fs::create_dir(&elsewhere).unwrap();
        let moved = elsewhere.join("upstream-calc.conf");
        std::fs::copy(&ours, &moved).unwrap();
        let paths = format!("{} {} {}", ours.display(), other.display(), moved.display());
        let u = expected_with_own_drop_ins(&worker(), &paths, dir.path());
        let d = crate::hardening::directives(&u, None);
        let get = |k: &str| {
            d.iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
                .unwrap()
        };
        assert_eq!(get("PrivateNetwork").last().unwrap(), "no");
        assert!(get("RestrictAddressFamilies").contains(&"AF_UNIX AF_INET AF_INET6".to_owned()));
        // The other drop-in (a directive repo add never writes) and the
        // one outside the directory add nothing.
        assert_eq!(get("NoNewPrivileges"), vec!["yes".to_owned()]);
        assert_eq!(u.text.matches("PrivateNetwork=no").count(), 1);
        // None of ours: the shipped unit as it is.
        let u = expected_with_own_drop_ins(&worker(), &other.display().to_string(), dir.path());
        assert_eq!(u.text, worker().text);
    }
}

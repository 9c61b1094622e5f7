//! `airlockctl doctor`: is this machine set up the way airlock needs?
//!
//! Each check passes, warns or fails, and says what to run to fix it. The
//! expected users, groups, directories, owners and modes are read from the
//! files the package ships (`sysusers/airlock.conf`, `tmpfiles/airlock.conf`,
//! compiled in), so the doctor and the package cannot disagree.

use crate::hardening::{self, Host, SHIPPED_UNITS, ShippedUnit, Shown, SyscallGroups};
use crate::output::Ctx;
use nix::unistd::{Group, User};
use serde_json::{Value, json};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

const SYSUSERS: &str = include_str!("../../../../sysusers/airlock.conf");
const TMPFILES: &str = include_str!("../../../../tmpfiles/airlock.conf");
const UNITS: &[&str] = &[
    "airlock-supervisor.service",
    "airlock-worker.service",
    "airlock-executor.service",
    "airlock-retryd.service",
    "airlock-egress.service",
];
const ACTIONS: &[&str] = &[
    "org.airlock.tasks.read",
    "org.airlock.tasks.read-all",
    "org.airlock.tasks.submit",
    "org.airlock.tasks.manage",
];

/// Arguments of `doctor`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The configuration file to validate (airlockctl's global `--config`).
    #[arg(skip = PathBuf::from(airlock_config::DEFAULT_PATH))]
    pub config: PathBuf,
    /// Check a tree other than / (an image or a test root) for files, owners and modes.
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub root: PathBuf,
}

/// How a check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// As it should be.
    Pass,
    /// Works, but not as recommended, or could not be checked.
    Warn,
    /// airlock will not work, or not safely.
    Fail,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

/// One check's outcome.
#[derive(Clone, Debug)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// The verdict.
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// What to run or change, when not passing.
    pub fix: Option<String>,
    /// The unit a hardening check is about.
    pub unit: Option<String>,
    /// The unit directive a hardening check is about, e.g. `PrivateNetwork`.
    pub property: Option<String>,
}

fn check(
    name: impl Into<String>,
    status: Status,
    detail: impl Into<String>,
    fix: Option<&str>,
) -> Check {
    Check {
        name: name.into(),
        status,
        detail: detail.into(),
        fix: fix.map(str::to_owned),
        unit: None,
        property: None,
    }
}

fn under(root: &Path, path: &str) -> PathBuf {
    root.join(path.trim_start_matches('/'))
}

/// Users and groups of the sysusers file.
pub fn users() -> Vec<Check> {
    let fix = Some("systemd-sysusers /usr/lib/sysusers.d/airlock.conf");
    let mut out = Vec::new();
    for line in SYSUSERS
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
    {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            ["u", name, ..] => out.push(match User::from_name(name) {
                Ok(Some(u)) => check(
                    format!("user {name}"),
                    Status::Pass,
                    format!("uid {}", u.uid),
                    None,
                ),
                _ => check(format!("user {name}"), Status::Fail, "missing", fix),
            }),
            ["g", name, ..] => out.push(match Group::from_name(name) {
                Ok(Some(g)) => check(
                    format!("group {name}"),
                    Status::Pass,
                    format!("gid {}", g.gid),
                    None,
                ),
                _ => check(format!("group {name}"), Status::Fail, "missing", fix),
            }),
            ["m", user, group, ..] => {
                let member = Group::from_name(group)
                    .ok()
                    .flatten()
                    .is_some_and(|g| g.mem.iter().any(|m| m == user));
                out.push(if member {
                    check(format!("{user} in {group}"), Status::Pass, "member", None)
                } else {
                    check(
                        format!("{user} in {group}"),
                        Status::Fail,
                        "not a member",
                        fix,
                    )
                });
            }
            _ => {}
        }
    }
    out
}

/// Directories, owners and modes of the tmpfiles file.
pub fn directories(root: &Path) -> Vec<Check> {
    let fix = Some("systemd-tmpfiles --create /usr/lib/tmpfiles.d/airlock.conf");
    let mut out = Vec::new();
    for line in TMPFILES
        .lines()
        .filter(|l| l.starts_with("d ") || l.starts_with("d\t"))
    {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [_, path, mode, user, group, ..] = f.as_slice() else {
            continue;
        };
        let want_mode = u32::from_str_radix(mode, 8).unwrap_or(0);
        let name = format!("directory {path}");
        let meta = match std::fs::symlink_metadata(under(root, path)) {
            Ok(m) => m,
            Err(_) => {
                out.push(check(name, Status::Fail, "missing", fix));
                continue;
            }
        };
        if !meta.is_dir() {
            out.push(check(
                name,
                Status::Fail,
                "not a directory (or a symlink)",
                fix,
            ));
            continue;
        }
        let uid = User::from_name(user).ok().flatten().map(|u| u.uid.as_raw());
        let gid = Group::from_name(group)
            .ok()
            .flatten()
            .map(|g| g.gid.as_raw());
        let mut wrong = Vec::new();
        if uid != Some(meta.uid()) {
            wrong.push(format!("owner uid {} (want {user})", meta.uid()));
        }
        if gid != Some(meta.gid()) {
            wrong.push(format!("group gid {} (want {group})", meta.gid()));
        }
        if meta.mode() & 0o7777 != want_mode {
            wrong.push(format!("mode {:04o} (want {mode})", meta.mode() & 0o7777));
        }
        out.push(if wrong.is_empty() {
            check(name, Status::Pass, format!("{mode} {user}:{group}"), None)
        } else {
            check(name, Status::Fail, wrong.join(", "), fix)
        });
    }
    out
}

/// Kernel features the sandbox needs.
pub fn kernel() -> Vec<Check> {
    let abi = airlock_sandbox::landlock::kernel_abi();
    let landlock = match abi {
        a if a >= 1 => check("Landlock", Status::Pass, format!("ABI {a}"), None),
        _ => check(
            "Landlock",
            Status::Fail,
            "not available: the executor refuses to run without it",
            Some(
                "boot a kernel with CONFIG_SECURITY_LANDLOCK=y and lsm=landlock,... (or set executor.allow_degraded_landlock, which weakens confinement)",
            ),
        ),
    };
    let actions =
        std::fs::read_to_string("/proc/sys/kernel/seccomp/actions_avail").unwrap_or_default();
    let seccomp = if ["errno", "kill_process"]
        .iter()
        .all(|a| actions.split_whitespace().any(|x| x == *a))
    {
        check(
            "seccomp",
            Status::Pass,
            format!("actions: {}", actions.trim()),
            None,
        )
    } else {
        check(
            "seccomp",
            Status::Fail,
            "seccomp filters are not available",
            Some("use a kernel with CONFIG_SECCOMP_FILTER=y"),
        )
    };
    vec![landlock, seccomp]
}

/// The filesystem view verification commands get: what the running
/// executor reported at start (`<work>/sandbox.json`), else what
/// airlock-confine gets when run as the executor's user.
pub fn command_view(root: &Path) -> Check {
    let name = "command view";
    let fix = Some(
        "allow unprivileged user namespaces (sysctl user.max_user_namespaces > 0, kernel.unprivileged_userns_clone=1; on Ubuntu 24.04 an AppArmor profile granting userns to /usr/bin/airlock-executor) and restart airlock-executor",
    );
    let judge = |view: &str, reason: Option<&str>, whose: &str| match view {
        "minimal-root" => check(
            name,
            Status::Pass,
            format!(
                "minimal root: {whose} see only their workspace, /tmp, /proc, /dev and read-only system paths"
            ),
            None,
        ),
        "host-view" => check(
            name,
            Status::Warn,
            format!(
                "host view ({}): {whose} rely on Landlock and seccomp, with every metadata call by path refused, even in the workspace",
                reason.unwrap_or("no reason given")
            ),
            fix,
        ),
        other => check(name, Status::Fail, format!("unknown view {other:?}"), None),
    };
    let status = under(root, "/var/lib/airlock-exec/work/sandbox.json");
    if let Ok(text) = std::fs::read_to_string(&status) {
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        let pid = v["pid"].as_u64().unwrap_or(0);
        return judge(
            v["view"].as_str().unwrap_or(""),
            v["reason"].as_str(),
            &format!("the commands of the executor (pid {pid}, as it reported at start)"),
        );
    }
    let confine = under(root, "/usr/libexec/airlock/airlock-confine");
    let user = nix::unistd::User::from_name("airlock-exec").ok().flatten();
    let (Some(user), true) = (user, confine.is_file()) else {
        return check(
            name,
            Status::Warn,
            "no executor has reported its view, and airlock-confine or user airlock-exec is missing to probe it",
            Some("start airlock-executor (systemctl start airlock-executor)"),
        );
    };
    let mut probe = std::process::Command::new(&confine);
    probe
        .args([
            "--report",
            "/proc/self/fd/1",
            "--timeout",
            "10s",
            "--",
            "/bin/true",
        ])
        .current_dir("/")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    if nix::unistd::geteuid().is_root() {
        use std::os::unix::process::CommandExt;
        probe.uid(user.uid.as_raw()).gid(user.gid.as_raw());
    }
    match probe.output() {
        Ok(out) => {
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            let reason = v["warnings"]
                .as_array()
                .and_then(|w| w.iter().find_map(|x| x.as_str()));
            judge(
                v["view"].as_str().unwrap_or(""),
                reason,
                "commands (probed with airlock-confine as airlock-exec; no executor reported yet)",
            )
        }
        Err(e) => check(
            name,
            Status::Warn,
            format!("cannot probe with {}: {e}", confine.display()),
            Some("start airlock-executor (systemctl start airlock-executor)"),
        ),
    }
}

/// polkit actions installed.
pub fn polkit(root: &Path) -> Check {
    let path = under(root, "/usr/share/polkit-1/actions/org.airlock.policy");
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let missing: Vec<&&str> = ACTIONS
                .iter()
                .filter(|a| !text.contains(&format!("\"{a}\"")))
                .collect();
            if missing.is_empty() {
                check("polkit actions", Status::Pass, ACTIONS.join(", "), None)
            } else {
                check(
                    "polkit actions",
                    Status::Fail,
                    format!("missing {missing:?}"),
                    Some("reinstall the airlock package"),
                )
            }
        }
        Err(_) => check(
            "polkit actions",
            Status::Fail,
            format!("{} is missing", path.display()),
            Some("reinstall the airlock package"),
        ),
    }
}

/// The confinement a running process really has, from /proc/<pid>/status.
pub fn live_hardening(unit: &str, status: &str) -> Check {
    let field = |k: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .map(|v| v.trim().to_owned())
            .unwrap_or_default()
    };
    let (nnp, seccomp, cap) = (field("NoNewPrivs:"), field("Seccomp:"), field("CapEff:"));
    let ok = nnp == "1" && seccomp == "2" && cap.trim_start_matches('0').is_empty();
    check(
        format!("{unit} live hardening"),
        if ok { Status::Pass } else { Status::Fail },
        format!("NoNewPrivs {nnp}, Seccomp {seccomp}, CapEff {cap}"),
        (!ok).then_some("use the shipped unit files (systemctl revert <unit>) and restart"),
    )
}

/// The airlock daemons' program names.
const DAEMONS: &[&str] = &[
    "airlock-supervisor",
    "airlock-worker",
    "airlock-executor",
    "airlock-retryd",
    "airlock-egress",
];

/// A daemon's own lockdown, from /proc/<pid>/status: every daemon confines
/// itself (airlock_sandbox::lockdown), so NoNewPrivs 1 and Seccomp 2 hold
/// however it was started.
pub fn lockdown_status(what: &str, status: &str) -> Check {
    let field = |k: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .map(|v| v.trim().to_owned())
            .unwrap_or_default()
    };
    let (nnp, seccomp) = (field("NoNewPrivs:"), field("Seccomp:"));
    let ok = nnp == "1" && seccomp == "2";
    check(
        format!("{what} lockdown"),
        if ok { Status::Pass } else { Status::Fail },
        format!("NoNewPrivs {nnp}, Seccomp {seccomp}"),
        (!ok).then_some("an airlock binary that does not confine itself: reinstall the package"),
    )
}

/// Airlock daemons running outside their units (by hand, another init):
/// their own lockdown must hold all the same.
fn other_daemons(unit_pids: &[String]) -> Vec<Check> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in entries.flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) || unit_pids.contains(&pid) {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or_default();
        let name = String::from_utf8_lossy(argv0.rsplit(|b| *b == b'/').next().unwrap_or_default())
            .into_owned();
        if !DAEMONS.contains(&name.as_str()) {
            continue;
        }
        if let Ok(status) = std::fs::read_to_string(entry.path().join("status")) {
            out.push(lockdown_status(
                &format!("{name} (pid {pid}, not a unit)"),
                &status,
            ));
        }
    }
    out
}

fn units() -> Vec<Check> {
    let mut out = Vec::new();
    let mut pids = Vec::new();
    for unit in UNITS {
        let shown = Command::new("systemctl")
            .args(["show", "-p", "MainPID", "--value", unit])
            .output();
        let Some(shown) = shown.ok().filter(|o| o.status.success()) else {
            out.push(check(
                unit.to_string(),
                Status::Warn,
                "systemctl not available (not booted with systemd?)",
                None,
            ));
            continue;
        };
        let text = String::from_utf8_lossy(&shown.stdout);
        let pid = text.lines().next().unwrap_or("0").trim().to_owned();
        if pid == "0" || pid.is_empty() {
            // The hardening verifier reports the unit as not running.
            continue;
        }
        pids.push(pid.clone());
        match std::fs::read_to_string(format!("/proc/{pid}/status")) {
            Ok(status) => out.push(live_hardening(unit, &status)),
            Err(e) => out.push(check(
                format!("{unit} live hardening"),
                Status::Warn,
                format!("pid {pid}: {e}"),
                None,
            )),
        }
    }
    out.extend(other_daemons(&pids));
    out
}

/// `systemctl show -p … UNIT`, as properties.
fn systemctl_show(unit: &str, properties: &[String]) -> Result<Shown, String> {
    let mut cmd = Command::new("systemctl");
    cmd.arg("show");
    for p in properties {
        cmd.arg("-p").arg(p);
    }
    let out = cmd
        .arg("--")
        .arg(unit)
        .output()
        .map_err(|e| format!("systemctl: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "systemctl show {unit}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(Shown::parse(&String::from_utf8_lossy(&out.stdout)))
}

/// The running instances of a template (`airlock-agent@*.service`).
fn running_instances(unit: &ShippedUnit) -> Result<Vec<String>, String> {
    let out = Command::new("systemctl")
        .args([
            "list-units",
            "--all",
            "--plain",
            "--no-legend",
            "--no-pager",
            "--",
        ])
        .arg(unit.instance_pattern())
        .output()
        .map_err(|e| format!("systemctl: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_owned());
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // UNIT LOAD ACTIVE SUB DESCRIPTION…
            (f.len() >= 3 && f[1] == "loaded" && f[2] == "active").then(|| f[0].to_owned())
        })
        .collect())
}

/// The hardening verifier: each directive of each shipped unit (and of
/// each running instance of a shipped template), on its own and by name,
/// against what `systemctl show` reports of the running unit
/// ([`crate::hardening`]). A unit that is not running is reported as such.
fn hardening() -> Vec<Check> {
    let mut out = Vec::new();
    // sd_booted(3): systemd is the init when /run/systemd/system exists.
    if !Path::new("/run/systemd/system").is_dir() {
        out.push(check(
            "unit hardening",
            Status::Warn,
            "not booted with systemd: the units' hardening is not checked",
            None,
        ));
        return out;
    }
    let mut host: Option<Host> = None;
    for unit in SHIPPED_UNITS {
        let names: Vec<(String, Option<String>)> = if unit.is_template() {
            match running_instances(unit) {
                Ok(list) if list.is_empty() => {
                    out.push(check(
                        format!("{} hardening", unit.name),
                        Status::Pass,
                        "no instance is running: nothing to check",
                        None,
                    ));
                    continue;
                }
                Ok(list) => list
                    .into_iter()
                    .map(|n| {
                        let instance = n
                            .split_once('@')
                            .and_then(|(_, rest)| rest.rsplit_once('.'))
                            .map(|(i, _)| i.to_owned());
                        (n, instance)
                    })
                    .collect(),
                Err(e) => {
                    out.push(check(
                        format!("{} hardening", unit.name),
                        Status::Fail,
                        format!("cannot list its instances: {e}"),
                        None,
                    ));
                    continue;
                }
            }
        } else {
            vec![(unit.name.to_owned(), None)]
        };
        for (name, instance) in names {
            let mut props = hardening::properties(unit);
            props.extend(
                [
                    "LoadState",
                    "ActiveState",
                    "DropInPaths",
                    "NeedDaemonReload",
                ]
                .map(String::from),
            );
            let shown = match systemctl_show(&name, &props) {
                Ok(s) => s,
                Err(e) => {
                    out.push(check(format!("{name} hardening"), Status::Fail, e, None));
                    continue;
                }
            };
            if shown.get("LoadState") == Some("not-found") {
                out.push(check(
                    format!("{name} hardening"),
                    Status::Warn,
                    "systemd does not know the unit (the package is not installed?): its hardening is not checked",
                    Some("install the airlock package"),
                ));
                continue;
            }
            let state = shown.get("ActiveState").unwrap_or("unknown");
            if !matches!(
                state,
                "active" | "reloading" | "activating" | "deactivating"
            ) {
                out.push(check(
                    format!("{name} hardening"),
                    Status::Warn,
                    format!("not running ({state}): its hardening is not checked"),
                    Some("systemctl start airlock.target"),
                ));
                continue;
            }
            if host.is_none() {
                host = Some(Host {
                    syscall_groups: syscall_groups(),
                });
            }
            let host = host.as_ref().expect("set above");
            if shown.get("NeedDaemonReload") == Some("yes") {
                out.push(check(
                    format!("{name} hardening"),
                    Status::Warn,
                    "its files changed on disk since systemd loaded them: the verdicts below are for the loaded unit",
                    Some("systemctl daemon-reload, then systemctl restart the unit and run doctor again"),
                ));
            }
            let drop_ins = shown.get("DropInPaths").unwrap_or("").trim().to_owned();
            // The drop-ins `repo add --upstream` writes for the worker are
            // part of what is expected (their own directives only).
            let expected = super::upstream::expected_with_own_drop_ins(
                unit,
                &drop_ins,
                &super::upstream::worker_drop_ins(),
            );
            for v in hardening::verify(&expected, instance.as_deref(), &shown, host) {
                let fix = (!v.ok).then(|| {
                    if drop_ins.is_empty() {
                        format!(
                            "the unit file differs from the package's: systemctl revert {name} (or reinstall airlock), then systemctl restart {name}"
                        )
                    } else {
                        format!(
                            "a drop-in changes it ({drop_ins}): remove its {}= line, or systemctl revert {name}; then systemctl daemon-reload and systemctl restart {name}",
                            v.property
                        )
                    }
                });
                let mut c = check(
                    format!("{name} {}", v.property),
                    if v.ok { Status::Pass } else { Status::Fail },
                    v.detail,
                    None,
                );
                c.fix = fix;
                c.unit = Some(name.clone());
                c.property = Some(v.property);
                out.push(c);
            }
        }
    }
    out
}

/// This host's system call groups (`systemd-analyze syscall-filter`); empty
/// when it cannot be run.
fn syscall_groups() -> SyscallGroups {
    Command::new("systemd-analyze")
        .arg("syscall-filter")
        .env("SYSTEMD_COLORS", "0")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| SyscallGroups::parse(&String::from_utf8_lossy(&o.stdout)))
        .unwrap_or_default()
}

/// `PRAGMA integrity_check`, opened read-only.
pub fn database(name: &str, path: &Path) -> Check {
    let text = path.to_string_lossy();
    if text.starts_with("postgresql://") || text.starts_with("postgres://") {
        // airlockctl holds no database credential: the supervisor checks a
        // PostgreSQL store (schema version, triggers) when it opens it.
        return check(
            name,
            Status::Pass,
            format!(
                "PostgreSQL task store {text}: checked by the supervisor at start (docs/postgresql.md)"
            ),
            None,
        );
    }
    if !path.exists() {
        return check(
            name,
            Status::Warn,
            format!("{} does not exist yet", path.display()),
            None,
        );
    }
    let flags =
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let result = rusqlite::Connection::open_with_flags(path, flags).and_then(|c| {
        let mut stmt = c.prepare("PRAGMA integrity_check")?;
        let rows: Result<Vec<String>, _> = stmt.query_map([], |r| r.get(0))?.collect();
        rows
    });
    match result {
        Ok(rows) if rows == ["ok"] => check(
            name,
            Status::Pass,
            format!("{}: integrity ok", path.display()),
            None,
        ),
        Ok(rows) => check(
            name,
            Status::Fail,
            format!("{}: {}", path.display(), rows.join("; ")),
            Some("stop airlock.target, restore the database from a backup"),
        ),
        Err(e) => check(
            name,
            Status::Fail,
            format!("{}: {e}", path.display()),
            Some("check the file's owner and mode, and that it is an airlock database"),
        ),
    }
}

async fn bus_name() -> Check {
    let address = std::env::var("DBUS_SYSTEM_BUS_ADDRESS").ok();
    let conn = match address {
        Some(a) => match zbus::connection::Builder::address(a.as_str()) {
            Ok(b) => b.build().await,
            Err(e) => Err(e),
        },
        None => zbus::Connection::system().await,
    };
    let owned = match conn {
        Ok(conn) => match zbus::fdo::DBusProxy::new(&conn).await {
            Ok(p) => match zbus::names::BusName::try_from(crate::client::BUS_NAME) {
                Ok(name) => p.name_has_owner(name).await.ok(),
                Err(_) => None,
            },
            Err(_) => None,
        },
        Err(_) => None,
    };
    match owned {
        Some(true) => check(
            "bus name",
            Status::Pass,
            format!("{} is owned", crate::client::BUS_NAME),
            None,
        ),
        Some(false) => check(
            "bus name",
            Status::Fail,
            format!("nobody owns {}", crate::client::BUS_NAME),
            Some("systemctl start airlock-supervisor.service; journalctl -u airlock-supervisor"),
        ),
        None => check(
            "bus name",
            Status::Fail,
            "the system bus cannot be reached",
            Some("systemctl start dbus.service"),
        ),
    }
}

fn config(path: &Path) -> (Check, Option<airlock_config::Config>) {
    match airlock_config::Config::load(path) {
        Ok(c) => {
            let n = c.repositories.len();
            let detail = format!(
                "{}: valid, {n} repositor{}",
                path.display(),
                if n == 1 { "y" } else { "ies" }
            );
            (
                check(
                    "configuration",
                    if n == 0 { Status::Warn } else { Status::Pass },
                    detail,
                    (n == 0).then_some("register a repository under [[repository]]"),
                ),
                Some(c),
            )
        }
        Err(e) => (
            check(
                "configuration",
                Status::Fail,
                e.to_string(),
                Some("fix the key named above; see docs/configuration.md"),
            ),
            None,
        ),
    }
}

fn repositories(c: &airlock_config::Config) -> Vec<Check> {
    c.repositories
        .iter()
        .map(|r| {
            let bare = r.path.join("HEAD").is_file() && r.path.join("objects").is_dir();
            if bare {
                check(
                    format!("repository {}", r.name),
                    Status::Pass,
                    r.path.display().to_string(),
                    None,
                )
            } else {
                check(
                    format!("repository {}", r.name),
                    Status::Fail,
                    format!("{} is not a bare git repository", r.path.display()),
                    Some("git init --bare <path> (owned by airlock-worker) or fix repository.path"),
                )
            }
        })
        .chain(c.repositories.iter().filter_map(environment))
        .chain(egress_socket(c))
        .chain(egress_routes(Path::new(EGRESS_ROUTES)))
        .collect()
}

/// airlock-egress's routes file, as its unit passes it.
const EGRESS_ROUTES: &str = "/etc/airlock/egress.toml";

/// airlock-egress's routes (`path`, when it exists): the file holds (else
/// the proxy does not start), and each loopback, link-local or metadata
/// address a route lets tunnels reach is a warning.
pub fn egress_routes(path: &Path) -> Option<Check> {
    if !path.exists() {
        return None;
    }
    let name = "egress routes";
    Some(match airlock_config::routes::Config::load(path) {
        Err(e) => check(
            name,
            Status::Fail,
            format!("{e}; airlock-egress refuses to start (CONFIG_INVALID)"),
            Some("fix the route it names (docs/privsep/egress.md, \"Routes\")"),
        ),
        Ok(routes) => {
            let warnings = routes.warnings();
            if warnings.is_empty() {
                check(
                    name,
                    Status::Pass,
                    format!("{}: {} route(s)", path.display(), routes.routes().len()),
                    None,
                )
            } else {
                check(
                    name,
                    Status::Warn,
                    warnings.join("; "),
                    Some(
                        "list only the addresses a mirror needs; a loopback or metadata address reaches this host's own services",
                    ),
                )
            }
        }
    })
}

/// When a repository's environment has a setup: airlock-egress's socket,
/// the setup's only route out, is there.
pub fn egress_socket(c: &airlock_config::Config) -> Option<Check> {
    use std::os::unix::fs::FileTypeExt;
    let with_setup: Vec<&str> = c
        .repositories
        .iter()
        .filter(|r| r.environment.as_ref().is_some_and(|e| e.setup.is_some()))
        .map(|r| r.name.as_str())
        .collect();
    if with_setup.is_empty() {
        return None;
    }
    let socket = &c.executor.egress_socket;
    let name = "egress proxy socket";
    Some(match std::fs::metadata(socket) {
        Ok(m) if m.file_type().is_socket() => check(
            name,
            Status::Pass,
            format!("{} (setups of {})", socket.display(), with_setup.join(", ")),
            None,
        ),
        Ok(_) => check(
            name,
            Status::Fail,
            format!("{} is not a socket", socket.display()),
            Some("systemctl restart airlock-egress"),
        ),
        Err(e) => check(
            name,
            Status::Fail,
            format!(
                "{}: {e}; the setups of {} cannot fetch (SETUP_FAILED)",
                socket.display(),
                with_setup.join(", ")
            ),
            Some("systemctl enable --now airlock-egress"),
        ),
    })
}

/// A repository's verification environment as this host resolves it:
/// paths present and only root's, programs found, entries well-formed.
pub fn environment(r: &airlock_config::Repository) -> Option<Check> {
    let env = r.environment.as_ref()?;
    let name = format!("environment of {}", r.name);
    Some(match env.resolve() {
        Err(e) => check(
            name,
            Status::Fail,
            format!("{e} [{}]", e.code.as_str()),
            Some("fix the environment in the repository's registration (docs/environments.md)"),
        ),
        Ok(res) => check(
            name,
            Status::Pass,
            format!(
                "{} path(s), program(s) {}{}",
                res.paths.len(),
                res.programs
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                res.setup.as_ref().map_or(String::new(), |s| format!(
                    "; setup of {} command(s), egress {}",
                    s.commands.len(),
                    if s.egress.is_empty() {
                        "none".to_owned()
                    } else {
                        s.egress.join(", ")
                    }
                ))
            ),
            None,
        ),
    })
}

/// One family of checks: what it looks at and what usually fixes a
/// failure. `doctor` runs the families of [`FAMILIES`] in their order; its
/// `--help` and docs/doctor.md are generated from the same table.
#[derive(Debug)]
pub struct Family {
    /// Its name, as `--help` lists it.
    pub name: &'static str,
    /// What its checks look at.
    pub looks_at: &'static str,
    /// What usually fixes a failure (each check names its own fix).
    pub fix: &'static str,
    run: Run,
}

/// How a family is run.
#[derive(Debug)]
enum Run {
    /// From what the host shows.
    Host(fn(&Machine) -> Vec<Check>),
    /// Over the system bus.
    Bus,
}

/// What every family may read: the tree checked and the configuration
/// (loaded once, its own check the configuration family's).
#[derive(Debug)]
pub struct Machine {
    root: PathBuf,
    config: (Check, Option<airlock_config::Config>),
}

/// Every family of checks, in the order `doctor` runs them.
pub const FAMILIES: &[Family] = &[
    Family {
        name: "users",
        looks_at: "the users and groups sysusers/airlock.conf declares exist, with their memberships",
        fix: "systemd-sysusers /usr/lib/sysusers.d/airlock.conf",
        run: Run::Host(|_| users()),
    },
    Family {
        name: "directories",
        looks_at: "the directories tmpfiles/airlock.conf declares (under --root), their owners and modes",
        fix: "systemd-tmpfiles --create /usr/lib/tmpfiles.d/airlock.conf",
        run: Run::Host(|h| directories(&h.root)),
    },
    Family {
        name: "kernel",
        looks_at: "Landlock (its ABI) and seccomp filters (errno and kill_process actions), which the sandbox needs",
        fix: "a kernel with CONFIG_SECURITY_LANDLOCK=y (in lsm=) and CONFIG_SECCOMP_FILTER=y",
        run: Run::Host(|_| kernel()),
    },
    Family {
        name: "command view",
        looks_at: "the file-system view verification commands get: what the running executor reported at start (<work>/sandbox.json), else airlock-confine run as the executor's user",
        fix: "systemctl start airlock-executor",
        run: Run::Host(|h| vec![command_view(&h.root)]),
    },
    Family {
        name: "polkit",
        looks_at: "the polkit actions the package installs (under --root)",
        fix: "reinstall the airlock package",
        run: Run::Host(|h| vec![polkit(&h.root)]),
    },
    Family {
        name: "bus name",
        looks_at: "the supervisor owns org.airlock.Supervisor1 on the system bus (DBUS_SYSTEM_BUS_ADDRESS when set)",
        fix: "systemctl start airlock-supervisor.service; journalctl -u airlock-supervisor",
        run: Run::Bus,
    },
    Family {
        name: "live confinement",
        looks_at: "each running daemon's NoNewPrivs, seccomp mode and capabilities, read from /proc/PID/status, in its unit or started otherwise",
        fix: "restart the daemon from its unit; remove drop-ins that weaken it",
        run: Run::Host(|_| units()),
    },
    Family {
        name: "hardening",
        looks_at: "every directive the shipped unit files set, by name, against systemctl show of the running unit (drop-ins included) and of each running instance of a shipped template",
        fix: "remove or correct the drop-in the check names; systemctl daemon-reload",
        run: Run::Host(|_| hardening()),
    },
    Family {
        name: "configuration",
        looks_at: "the configuration file (airlockctl's --config) parses and validates; at least one repository is registered",
        fix: "fix the key the check names (docs/configuration.md)",
        run: Run::Host(|h| vec![h.config.0.clone()]),
    },
    Family {
        name: "repositories",
        looks_at: "each registered repository is a bare git repository; its verification environment resolves on this host; airlock-egress's socket is there when a setup needs it",
        fix: "git init --bare (owned by airlock-worker), or fix the registration; systemctl enable --now airlock-egress",
        run: Run::Host(|h| h.config.1.as_ref().map(repositories).unwrap_or_default()),
    },
    Family {
        name: "databases",
        looks_at: "the task database and the worker's checkpoint journal pass PRAGMA integrity_check, opened read-only",
        fix: "stop airlock.target and restore the database from a backup",
        run: Run::Host(|h| {
            h.config
                .1
                .as_ref()
                .map(|c| {
                    vec![
                        database("task database", &c.supervisor.database),
                        database("checkpoint journal", &c.worker.journal),
                    ]
                })
                .unwrap_or_default()
        }),
    },
];

/// The families as `doctor --help` lists them.
pub fn families_help() -> String {
    let mut text = String::from(
        "Checks, in the order they run (each passes, warns or fails and names its fix):\n",
    );
    for f in FAMILIES {
        text.push_str(&format!("  {:<18} {}\n", f.name, f.looks_at));
    }
    text
}

/// The families as docs/doctor.md's table shows them.
pub fn families_markdown() -> String {
    let mut text = String::from("| check | what it looks at | the usual fix |\n|---|---|---|\n");
    for f in FAMILIES {
        text.push_str(&format!("| {} | {} | `{}` |\n", f.name, f.looks_at, f.fix));
    }
    text
}

/// Runs every family of [`FAMILIES`], in order.
pub async fn run(ctx: &Ctx, args: Args) -> ExitCode {
    let machine = Machine {
        config: config(&args.config),
        root: args.root,
    };
    let mut checks = Vec::new();
    for family in FAMILIES {
        match family.run {
            Run::Host(f) => checks.extend(f(&machine)),
            Run::Bus => checks.push(bus_name().await),
        }
    }
    report(ctx, &checks)
}

fn report(ctx: &Ctx, checks: &[Check]) -> ExitCode {
    let count = |s: Status| checks.iter().filter(|c| c.status == s).count();
    let (pass, warn, fail) = (
        count(Status::Pass),
        count(Status::Warn),
        count(Status::Fail),
    );
    if ctx.json {
        let list: Vec<Value> = checks
            .iter()
            .map(|c| {
                let mut v = json!({"check": c.name, "status": c.status.as_str(), "detail": c.detail, "fix": c.fix});
                if let (Some(unit), Some(property)) = (&c.unit, &c.property) {
                    v["unit"] = json!(unit);
                    v["property"] = json!(property);
                }
                v
            })
            .collect();
        ctx.print_json(
            &json!({"checks": list, "summary": {"pass": pass, "warn": warn, "fail": fail}}),
        );
    } else {
        for c in checks {
            let mark = match c.status {
                Status::Pass => ctx.paint("32", "pass"),
                Status::Warn => ctx.paint("33", "warn"),
                Status::Fail => ctx.paint("1;31", "FAIL"),
            };
            println!("{mark}  {:<40} {}", c.name, c.detail);
            if let Some(fix) = &c.fix {
                println!("      fix: {fix}");
            }
        }
        println!("\n{pass} passed, {warn} warnings, {fail} failed");
    }
    if fail == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn egress_routes_that_reach_this_host_are_warned_about() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("egress.toml");
        assert!(egress_routes(&path).is_none());
        std::fs::write(
            &path,
            "[[route]]\nhost = \"m.example\"\naddresses = [\"10.0.0.0/8\"]\n",
        )
        .unwrap();
        assert_eq!(egress_routes(&path).unwrap().status, Status::Pass);
        std::fs::write(
            &path,
            "[[route]]\nhost = \"m.example\"\naddresses = [\"127.0.0.1\", \"169.254.169.254\"]\n",
        )
        .unwrap();
        let warned = egress_routes(&path).unwrap();
        assert_eq!(warned.status, Status::Warn);
        assert!(
            warned.detail.contains("127.0.0.1 (loopback)"),
            "{}",
            warned.detail
        );
        assert!(
            warned.detail.contains("169.254.169.254 (link-local)"),
            "{}",
            warned.detail
        );
        std::fs::write(
            &path,
            "[[route]]\nhost = \"m.example\"\naddresses = [\"127.0.0.0/8\"]\n",
        )
        .unwrap();
        let failed = egress_routes(&path).unwrap();
        assert_eq!(failed.status, Status::Fail);
        assert!(
            failed.detail.contains("CONFIG_INVALID"),
            "{}",
            failed.detail
        );
    }

    #[test]
    fn the_egress_socket_is_checked_only_when_a_setup_needs_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = airlock_config::Config::default();
        config.executor.egress_socket = dir.path().join("egress.sock");
        config.repositories.push(airlock_config::Repository {
            name: "calc".into(),
            path: "/srv/airlock/calc.git".into(),
            description: None,
            environment: Some(airlock_config::Environment::default()),
            upstream: None,
            signing: None,
            drop_in: None,
        });
        assert!(egress_socket(&config).is_none());
        config.repositories[0].environment = Some(airlock_config::Environment {
            setup: Some(airlock_config::Setup {
                commands: vec![vec!["true".into()]],
                inputs: vec!["Cargo.lock".into()],
                outputs: vec!["target".into()],
                egress: vec![],
                timeout_seconds: 60,
            }),
            ..Default::default()
        });
        let missing = egress_socket(&config).unwrap();
        assert_eq!(missing.status, Status::Fail);
        assert!(missing.detail.contains("calc"), "{}", missing.detail);
        let _listener =
            std::os::unix::net::UnixListener::bind(&config.executor.egress_socket).unwrap();
        assert_eq!(egress_socket(&config).unwrap().status, Status::Pass);
    }

    #[test]
    fn an_environment_is_checked_against_this_host() {
        let repo = |env: airlock_config::Environment| airlock_config::Repository {
            name: "calc".into(),
            path: "/srv/airlock/calc.git".into(),
            description: None,
            environment: Some(env),
            upstream: None,
            signing: None,
            drop_in: None,
        };
        let good = environment(&repo(airlock_config::Environment {
            paths: vec!["/usr/lib".into()],
            programs: vec!["sh".into()],
            ..Default::default()
        }))
        .unwrap();
        assert_eq!(good.status, Status::Pass, "{}", good.detail);
        let bad = environment(&repo(airlock_config::Environment {
            paths: vec!["/tmp".into()],
            ..Default::default()
        }))
        .unwrap();
        assert_eq!(bad.status, Status::Fail);
        assert!(
            bad.detail.contains("ENVIRONMENT_PATH_UNSAFE"),
            "{}",
            bad.detail
        );
        let missing = environment(&repo(airlock_config::Environment {
            programs: vec!["no-such-program-anywhere".into()],
            ..Default::default()
        }))
        .unwrap();
        assert!(missing.detail.contains("ENVIRONMENT_PROGRAM_UNRESOLVED"));
        // A setup runs only the environment's own programs.
        let with_setup = |programs: Vec<String>| {
            environment(&repo(airlock_config::Environment {
                programs,
                setup: Some(airlock_config::Setup {
                    commands: vec![vec!["true".into()]],
                    inputs: vec!["Cargo.lock".into()],
                    outputs: vec!["target".into()],
                    egress: vec!["pkg.example.org:443".into()],
                    timeout_seconds: 60,
                }),
                ..Default::default()
            }))
            .unwrap()
        };
        let outside = with_setup(Vec::new());
        assert_eq!(outside.status, Status::Fail);
        assert!(
            outside.detail.contains("ENVIRONMENT_PROGRAM_UNRESOLVED")
                && outside.detail.contains("environment.setup.commands[0]"),
            "{}",
            outside.detail
        );
        let setup = with_setup(vec!["true".into()]);
        assert_eq!(setup.status, Status::Pass, "{}", setup.detail);
        assert!(
            setup.detail.contains("setup of 1 command(s)")
                && setup.detail.contains("pkg.example.org:443"),
            "{}",
            setup.detail
        );
    }

    #[test]
    fn live_hardening_reads_proc_status() {
        let good =
            "Name:\tairlock-executor\nNoNewPrivs:\t1\nSeccomp:\t2\nCapEff:\t0000000000000000\n";
        assert_eq!(live_hardening("u", good).status, Status::Pass);
        let caps = good.replace("CapEff:\t0000000000000000", "CapEff:\t0000000000000400");
        assert_eq!(live_hardening("u", &caps).status, Status::Fail);
        let no_filter = good.replace("Seccomp:\t2", "Seccomp:\t0");
        assert_eq!(live_hardening("u", &no_filter).status, Status::Fail);
        // A daemon outside its unit: its own lockdown, capabilities aside.
        assert_eq!(lockdown_status("d", &caps).status, Status::Pass);
        assert_eq!(lockdown_status("d", &no_filter).status, Status::Fail);
        let no_nnp = good.replace("NoNewPrivs:\t1", "NoNewPrivs:\t0");
        assert_eq!(lockdown_status("d", &no_nnp).status, Status::Fail);
    }

    #[test]
    fn directories_follow_the_shipped_tmpfiles_file() {
        let root = tempfile::tempdir().unwrap();
        let checks = directories(root.path());
        assert!(!checks.is_empty());
        assert!(
            checks
                .iter()
                .all(|c| c.status == Status::Fail && c.detail == "missing"),
            "{checks:?}"
        );
        // /etc/airlock is root:root 0755 in the shipped file: make it right and see it pass.
        let etc = root.path().join("etc/airlock");
        std::fs::create_dir_all(&etc).unwrap();
        std::fs::set_permissions(&etc, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let c = directories(root.path())
            .into_iter()
            .find(|c| c.name == "directory /etc/airlock")
            .unwrap();
        if nix::unistd::getuid().is_root() {
            assert_eq!(c.status, Status::Pass, "{c:?}");
            std::fs::set_permissions(&etc, std::os::unix::fs::PermissionsExt::from_mode(0o777))
                .unwrap();
            let c = directories(root.path())
                .into_iter()
                .find(|c| c.name == "directory /etc/airlock")
                .unwrap();
            assert_eq!(c.status, Status::Fail);
            assert!(c.detail.contains("mode 0777 (want 0755)"), "{c:?}");
        }
    }

    #[test]
    fn database_check_finds_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite3");
        assert_eq!(database("db", &path).status, Status::Warn);
        // A PostgreSQL store is the supervisor's to check, not a file here.
        let pg = database("db", Path::new("postgresql://airlock@db.example/airlock"));
        assert_eq!(pg.status, Status::Pass);
        assert!(
            pg.detail.contains("checked by the supervisor"),
            "{}",
            pg.detail
        );
        let c = rusqlite::Connection::open(&path).unwrap();
        c.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (1);")
            .unwrap();
        drop(c);
        assert_eq!(database("db", &path).status, Status::Pass);
        std::fs::write(&path, vec![0x42u8; 8192]).unwrap();
        assert_eq!(database("db", &path).status, Status::Fail);
    }
}

//! The unit files as data, and the checks that need no booted system:
//! `systemd-analyze security --offline=true` and `systemd-analyze verify`
//! against a scratch root that holds the host's units and ours.

use crate::{Out, run, workspace_root};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The `systemd-analyze security` exposure one airlock service may have.
#[derive(Clone, Copy, Debug)]
pub struct ExposureLimit {
    /// The unit, e.g. `airlock-worker.service`.
    pub unit: &'static str,
    /// Of the running service, in the testbed's booted root.
    pub live: f64,
    /// Of its file, `--offline=true` (systemd-analyze scores the file
    /// alone higher than the running unit for some services; both are
    /// checked).
    pub offline: f64,
}

/// Each airlock service's limits, in the order README.md names them. The
/// figures are what systemd 252 (Debian 12) measured on the units as
/// shipped, so a unit that loosens its sandboxing fails the checks; the
/// live figures hold on every release of the testbed (systemd 257 on
/// Debian 13 measures the same). This
/// table is the one source: README.md and tests/systemd/README.md quote
/// [`readme_exposure_statement`] and a test checks that they do.
pub const EXPOSURE_LIMITS: &[ExposureLimit] = &[
    ExposureLimit {
        unit: "airlock-supervisor.service",
        live: 0.2,
        offline: 0.4,
    },
    ExposureLimit {
        unit: "airlock-worker.service",
        live: 0.4,
        offline: 0.6,
    },
    // The executor: its spawner builds each command's view (user, mount,
    // pid namespaces; mount and pivot_root) and, since setups run, a
    // network namespace per command (only lo; a setup's holds the
    // forwarder's listener alone): RestrictNamespaces=~net costs 0.1.
    ExposureLimit {
        unit: "airlock-executor.service",
        live: 1.0,
        offline: 1.0,
    },
    ExposureLimit {
        unit: "airlock-retryd.service",
        live: 0.2,
        offline: 0.4,
    },
    // The egress proxy: the network is its job (AF_INET sockets, no
    // PrivateNetwork= or IPAddressDeny=: the daemon checks each address
    // after resolution), and no PrivateUsers= (SO_PEERCRED must show the
    // executor's real uid). The live figure is not measured yet.
    ExposureLimit {
        unit: "airlock-egress.service",
        live: 1.2,
        offline: 1.2,
    },
    // The agent template: network allowed (model APIs), AF_INET sockets,
    // the readers group and setrlimit (its launcher lowers RLIMIT_AS) are
    // what it costs.
    ExposureLimit {
        unit: "airlock-agent@.service",
        live: 1.4,
        offline: 1.4,
    },
];

/// The limits of one service; `None` for a service the table does not
/// name (which the checks count as a failure).
pub fn max_exposure(unit: &str) -> Option<ExposureLimit> {
    EXPOSURE_LIMITS.iter().find(|l| l.unit == unit).copied()
}

/// What the READMEs say about the exposure, made from [`EXPOSURE_LIMITS`].
pub fn readme_exposure_statement() -> String {
    let limits: Vec<String> = EXPOSURE_LIMITS
        .iter()
        .map(|l| {
            let short = l
                .unit
                .trim_start_matches("airlock-")
                .trim_end_matches(".service");
            format!("{short} {:.1} ({:.1})", l.live, l.offline)
        })
        .collect();
    format!(
        "`systemd-analyze security` exposure at most, live (offline): {}",
        limits.join(", ")
    )
}

/// One file of `units/`.
#[derive(Clone, Debug)]
pub struct UnitFile {
    /// File name, e.g. `airlock-worker.service`.
    pub name: String,
    /// Where it is in the tree.
    pub path: PathBuf,
    /// Its text.
    pub text: String,
}

impl UnitFile {
    /// Every value of `key=` in the file (all sections), in order; a line
    /// holding several space-separated values counts once.
    pub fn values(&self, key: &str) -> Vec<String> {
        self.text
            .lines()
            .map(str::trim)
            .filter(|l| !l.starts_with('#') && !l.starts_with(';'))
            .filter_map(|l| l.split_once('='))
            .filter(|(k, _)| k.trim() == key)
            .map(|(_, v)| v.trim().to_owned())
            .collect()
    }

    /// True for a `.service` file.
    pub fn is_service(&self) -> bool {
        self.name.ends_with(".service")
    }

    /// The programs the unit executes (`ExecStart=` and friends), without
    /// the `-@:+!` prefixes.
    pub fn programs(&self) -> Vec<String> {
        [
            "ExecStart",
            "ExecStartPre",
            "ExecStartPost",
            "ExecStop",
            "ExecReload",
        ]
        .iter()
        .flat_map(|k| self.values(k))
        .filter_map(|v| {
            v.split_whitespace()
                .next()
                .map(|p| p.trim_start_matches(['-', '@', ':', '+', '!']).to_owned())
        })
        .filter(|p| !p.is_empty())
        .collect()
    }

    /// `Documentation=` entries.
    pub fn documentation(&self) -> Vec<String> {
        self.values("Documentation")
            .iter()
            .flat_map(|v| v.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
            .collect()
    }
}

/// The files of `units/`, sorted by name.
pub fn unit_files() -> Result<Vec<UnitFile>, String> {
    let dir = workspace_root().join("units");
    let mut files = Vec::new();
    for e in fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let path = e.map_err(|e| e.to_string())?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        if [".service", ".socket", ".target", ".timer", ".path"]
            .iter()
            .any(|s| name.ends_with(s))
        {
            let text = fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            files.push(UnitFile { name, path, text });
        }
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    if files.is_empty() {
        return Err(format!("no unit files in {}", dir.display()));
    }
    Ok(files)
}

/// The overall exposure in `systemd-analyze security` output.
pub fn parse_exposure(output: &str) -> Option<f64> {
    output
        .lines()
        .find(|l| l.contains("Overall exposure level for"))
        .and_then(|l| l.rsplit_once(": "))
        .and_then(|(_, v)| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// `systemd-analyze security --offline=true` of one unit file.
pub fn offline_exposure(unit: &UnitFile) -> Result<(f64, String), String> {
    let dir = unit.path.parent().ok_or("unit file without a directory")?;
    let out = run(
        Command::new("systemd-analyze")
            .args(["security", "--offline=true", "--no-pager"])
            .arg(&unit.name)
            .current_dir(dir)
            .env("SYSTEMD_COLORS", "0"),
        None,
        Duration::from_secs(60),
    )?;
    let exposure = parse_exposure(&out.stdout)
        .ok_or_else(|| format!("{}: no exposure in the output:\n{}", unit.name, out.both()))?;
    let findings: Vec<&str> = out.stdout.lines().filter(|l| l.starts_with('✗')).collect();
    Ok((exposure, findings.join("\n")))
}

/// A scratch root for `systemd-analyze verify --root`: the host's system
/// units (so that sysinit.target and friends resolve), the airlock units,
/// and each program the units execute. `programs` maps an absolute path to
/// the file to put there; a path without one gets an executable stub,
/// since verify only checks that the path is executable.
pub fn verify_root(dir: &Path, programs: &[(String, Option<PathBuf>)]) -> Result<(), String> {
    let units_dir = dir.join("usr/lib/systemd/system");
    fs::create_dir_all(&units_dir).map_err(|e| e.to_string())?;
    let host_units = ["/usr/lib/systemd/system", "/lib/systemd/system"]
        .iter()
        .map(Path::new)
        .find(|p| p.is_dir())
        .ok_or("the host has no /usr/lib/systemd/system")?;
    let out = run(
        Command::new("cp")
            .arg("-a")
            .arg(format!("{}/.", host_units.display()))
            .arg(&units_dir),
        None,
        Duration::from_secs(60),
    )?;
    if !out.ok() {
        return Err(format!("copying the host's units: {}", out.both()));
    }
    for unit in unit_files()? {
        fs::copy(&unit.path, units_dir.join(&unit.name)).map_err(|e| e.to_string())?;
    }
    fs::create_dir_all(dir.join("etc/systemd/system")).map_err(|e| e.to_string())?;
    for (path, source) in programs {
        let target = dir.join(path.trim_start_matches('/'));
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent).map_err(|e| e.to_string())?;
        }
        match source {
            Some(src) => {
                fs::copy(src, &target).map_err(|e| format!("{}: {e}", src.display()))?;
            }
            None => fs::write(&target, "#!/bin/sh\nexit 0\n").map_err(|e| e.to_string())?,
        }
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&target, fs::Permissions::from_mode(0o755))
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// `systemd-analyze verify --man=no --generators=no --root=DIR UNITS…`.
pub fn verify_in_root(dir: &Path, units: &[String]) -> Result<Out, String> {
    run(
        Command::new("systemd-analyze")
            .args(["verify", "--man=no", "--generators=no"])
            .arg(format!("--root={}", dir.display()))
            .args(units)
            .env("SYSTEMD_COLORS", "0")
            .env("SYSTEMD_LOG_COLOR", "0"),
        None,
        Duration::from_secs(120),
    )
}

/// Man pages the package ships: `(name, section)` of the pages kept in the
/// tree, and of those `scripts/package` generates for the daemons.
pub fn packaged_man_pages() -> Result<Vec<(String, String)>, String> {
    let root = workspace_root();
    let mut pages = vec![
        ("airlockctl".to_owned(), "1".to_owned()),
        ("airlock-confine".to_owned(), "1".to_owned()),
    ];
    for (name, section) in &pages {
        let path = if name == "airlockctl" {
            root.join("services/ctl/airlockctl.1")
        } else {
            root.join("services/confine/airlock-confine.1")
        };
        if !path.is_file() {
            return Err(format!(
                "{name}({section}) is packaged from {}, which is missing",
                path.display()
            ));
        }
    }
    let script = fs::read_to_string(root.join("scripts/package")).map_err(|e| e.to_string())?;
    let block = script
        .split("daemons=(")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .ok_or("scripts/package has no daemons=( … ) list")?;
    for line in block.lines() {
        let name = line.trim().trim_start_matches('"').split(':').next();
        if let Some(name) = name.filter(|n| n.starts_with("airlock")) {
            pages.push((name.to_owned(), "8".to_owned()));
        }
    }
    Ok(pages)
}

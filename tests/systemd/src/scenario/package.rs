//! The packages `scripts/package` built, checked before anything is
//! installed: lintian, the .deb's and the .rpm's structure, the upgrade
//! package, and the RPM's scriptlets on a fresh root.

use super::install::after_install;
use super::status::{PROCS_PY, all_active, expect_paths, main_pids, no_airlock_process};
use super::{SEC, STARTED_BY_TARGET, Settings, file_name, only_agents};
use crate::{Container, Report, run, tail, which, workspace_root};
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Depends the root made by debootstrap satisfies without a network.
const ALLOWED_DEPENDS: &[&str] = &[
    "libc6",
    "libgcc-s1",
    "git",
    "python3",
    "dbus",
    "polkitd",
    "systemd",
];

fn installed_deb(dir: &Path, suffix: &str) -> Result<PathBuf, String> {
    fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("airlock_") && n.ends_with(suffix))
        })
        .ok_or_else(|| format!("no airlock_*{suffix} in {}", dir.display()))
}

/// The packages `scripts/package` built.
#[derive(Clone, Debug)]
pub(super) struct Packages {
    pub(super) deb: PathBuf,
    pub(super) rpm: PathBuf,
    /// cockpit-airlock's .deb (architecture all), built beside them.
    pub(super) cockpit: PathBuf,
    version: String,
}

impl crate::Detail for Packages {
    fn detail(&self) -> String {
        let size = |p: &Path| fs::metadata(p).map(|m| m.len() / 1024).unwrap_or(0);
        format!(
            "{} ({} KiB), {} ({} KiB)",
            file_name(&self.deb),
            size(&self.deb),
            file_name(&self.rpm),
            size(&self.rpm)
        )
    }
}

pub(super) fn package_checks(r: &mut Report, s: &Settings, work: &Path) -> Option<Packages> {
    r.check("host tools present", |_| {
        let missing: Vec<String> = crate::HOST_TOOLS
            .iter()
            .filter(|(tool, _)| which(tool).is_none())
            .map(|(tool, pkg)| format!("{tool} (Debian package {pkg})"))
            .collect();
        if missing.is_empty() {
            Ok(String::new())
        } else {
            Err(format!(
                "missing: {}; scripts/test installs them from AIRLOCK_DEBIAN_PACKAGES in scripts/deps.sh",
                missing.join(", ")
            ))
        }
    })?;
    let pkgs = r.check("scripts/package builds the .deb and the .rpm", |r| {
        let log = work.join("package.log");
        let out = run(
            Command::new(workspace_root().join("scripts/package"))
                .arg("--no-lintian")
                .env("CARGO_TARGET_DIR", &s.target_dir)
                .env("CARGO_TERM_COLOR", "never"),
            None,
            Duration::from_secs(30 * 60),
        )?;
        fs::write(&log, out.both()).map_err(|e| e.to_string())?;
        r.log(&format!("scripts/package output: {}", log.display()));
        let out = out.expect_ok("scripts/package")?;
        let dir = s.target_dir.join("packages");
        let deb = installed_deb(&dir, "_amd64.deb")?;
        let version = file_name(&deb)
            .trim_start_matches("airlock_")
            .trim_end_matches("_amd64.deb")
            .to_owned();
        let rpm = dir.join(format!("airlock-{version}.x86_64.rpm"));
        if !rpm.is_file() {
            return Err(format!(
                "{} is missing\n{}",
                rpm.display(),
                tail(&out.both(), 20)
            ));
        }
        let cockpit = dir.join(format!("cockpit-airlock_{version}_all.deb"));
        let cockpit_rpm = dir.join(format!("cockpit-airlock-{version}.noarch.rpm"));
        for p in [&cockpit, &cockpit_rpm] {
            if !p.is_file() {
                return Err(format!(
                    "{} is missing\n{}",
                    p.display(),
                    tail(&out.both(), 20)
                ));
            }
        }
        Ok(Packages {
            deb,
            rpm,
            cockpit,
            version,
        })
    })?;
    if !only_agents() {
        lintian(r, &pkgs);
    }
    r.check(
        "deb: maintainer scripts name the files it installs; Depends",
        |_| deb_structure(&pkgs.deb),
    );
    r.check("rpm: scriptlets equivalent, same files as the deb", |_| {
        rpm_structure(&pkgs.rpm, &pkgs.deb)
    });
    Some(pkgs)
}

fn lintian(r: &mut Report, pkgs: &Packages) {
    r.check("lintian accepts the .deb (no errors)", |_| {
        let out = run(
            Command::new("lintian")
                .arg("--no-tag-display-limit")
                .arg(&pkgs.deb),
            None,
            Duration::from_secs(600),
        )?;
        let tags: Vec<&str> = out
            .stdout
            .lines()
            .filter(|l| l.len() > 2 && l.as_bytes()[1] == b':')
            .collect();
        let errors: Vec<&&str> = tags.iter().filter(|l| l.starts_with("E:")).collect();
        if !errors.is_empty() || out.code.is_none_or(|c| c > 1) {
            return Err(format!("lintian ({}):\n{}", out.describe(), out.both()));
        }
        let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
        for t in &tags {
            let tag = t.split_whitespace().nth(2).unwrap_or("?");
            *kinds.entry(format!("{} {tag}", &t[..1])).or_default() += 1;
        }
        let summary: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} x{n}")).collect();
        Ok(format!("0 errors; {}", summary.join(", ")))
    });
}

fn deb_structure(deb: &Path) -> Result<String, String> {
    let limit = Duration::from_secs(60);
    let listing = run(Command::new("dpkg-deb").arg("-c").arg(deb), None, limit)?
        .expect_ok("dpkg-deb -c")?
        .stdout;
    let files: Vec<&str> = listing
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .collect();
    let field = |name: &str| -> Result<String, String> {
        Ok(run(
            Command::new("dpkg-deb").args(["-f"]).arg(deb).arg(name),
            None,
            limit,
        )?
        .expect_ok("dpkg-deb -f")?
        .stdout
        .trim()
        .to_owned())
    };
    let info = |name: &str| -> Result<String, String> {
        Ok(run(
            Command::new("dpkg-deb").args(["-I"]).arg(deb).arg(name),
            None,
            limit,
        )?
        .expect_ok(&format!("dpkg-deb -I {name}"))?
        .stdout)
    };
    let mut problems = Vec::new();
    let postinst = info("postinst")?;
    // systemd 257 may leave the retry API's socket failed after the
    // target's restart (`Address already in use`): postinst starts it again.
    if !postinst.contains("systemctl reset-failed airlock-retryd.socket") {
        problems.push(
            "postinst does not start airlock-retryd.socket again when the restart left it failed"
                .to_owned(),
        );
    }
    for (file, command) in [
        (
            "./usr/lib/sysusers.d/airlock.conf",
            "systemd-sysusers airlock.conf",
        ),
        (
            "./usr/lib/tmpfiles.d/airlock.conf",
            "systemd-tmpfiles --create airlock.conf",
        ),
    ] {
        if !files.contains(&file) {
            problems.push(format!("{file} is not in the package"));
        }
        if !postinst.contains(command) {
            problems.push(format!("postinst does not run `{command}`"));
        }
    }
    for expected in [
        "./usr/bin/airlock-supervisor",
        "./usr/bin/airlock-worker",
        "./usr/bin/airlock-executor",
        "./usr/bin/airlock-retryd",
        "./usr/bin/airlock-egress",
        "./usr/lib/systemd/system/airlock-egress.service",
        "./usr/share/man/man8/airlock-egress.8.gz",
        "./usr/bin/airlockctl",
        "./usr/libexec/airlock/airlock-confine",
        "./usr/lib/systemd/system/airlock.target",
        "./usr/share/dbus-1/system.d/org.airlock.Supervisor1.conf",
        "./usr/share/dbus-1/system-services/org.airlock.Supervisor1.service",
        "./usr/share/polkit-1/actions/org.airlock.policy",
        "./usr/share/polkit-1/rules.d/50-airlock-agent.rules",
        "./usr/share/polkit-1/rules.d/50-airlock-supervisor.rules",
        "./usr/lib/systemd/system/airlock-agent@.service",
        "./usr/lib/systemd/catalog/airlock.catalog",
        "./usr/share/man/man1/airlockctl.1.gz",
        "./usr/share/man/man1/airlock-confine.1.gz",
        "./usr/share/doc/airlock/copyright",
        "./usr/share/doc/airlock/changelog.gz",
        "./etc/airlock/airlock.toml",
    ] {
        if !files.contains(&expected) {
            problems.push(format!("{expected} is not in the package"));
        }
    }
    let conffiles = info("conffiles")?;
    if conffiles.trim()
        != "/etc/airlock/airlock.toml\n/etc/airlock/mcp.toml\n/etc/airlock/egress.toml"
    {
        problems.push(format!("conffiles: {conffiles:?}"));
    }
    for script in ["prerm", "postrm"] {
        info(script)?;
    }
    let depends = field("Depends")?;
    for dep in depends.split(',') {
        let name = dep.split_whitespace().next().unwrap_or("");
        if !ALLOWED_DEPENDS.contains(&name) {
            problems.push(format!("Depends on {name}, which the minimal root lacks"));
        }
    }
    if problems.is_empty() {
        Ok(format!("Depends: {depends}"))
    } else {
        Err(problems.join("\n"))
    }
}

fn rpm_structure(rpm: &Path, deb: &Path) -> Result<String, String> {
    let limit = Duration::from_secs(60);
    let query = |fmt: &[&str]| -> Result<String, String> {
        Ok(run(
            Command::new("rpm").arg("-qp").args(fmt).arg(rpm),
            None,
            limit,
        )?
        .expect_ok("rpm -qp")?
        .stdout)
    };
    let mut problems = Vec::new();
    let scripts = query(&["--scripts"])?;
    for needle in [
        "systemd-sysusers airlock.conf",
        "systemd-tmpfiles --create airlock.conf",
        "/etc/airlock/retry-control.token",
        "AIRLOCK_RETRY_AUTHORIZATION_ID=",
        "systemctl enable airlock.target",
        "systemctl start airlock.target",
        "systemctl restart airlock.target",
        "systemctl reset-failed airlock-retryd.socket",
        "systemctl stop airlock.target",
    ] {
        if !scripts.contains(needle) {
            problems.push(format!("the scriptlets lack `{needle}`"));
        }
    }
    for tag in ["POSTIN", "PREUN", "POSTUN"] {
        let body = query(&["--qf", &format!("%{{{tag}}}")])?;
        let sh = run(Command::new("sh").arg("-n"), Some(body.as_bytes()), limit)?;
        if !sh.ok() {
            problems.push(format!("%{tag} is not valid sh: {}", sh.both()));
        }
    }
    let config = query(&["-c"])?;
    if config.trim() != "/etc/airlock/airlock.toml\n/etc/airlock/egress.toml\n/etc/airlock/mcp.toml"
    {
        problems.push(format!("rpm config files: {config:?}"));
    }
    let rpm_files: std::collections::BTreeSet<String> =
        query(&["--qf", "[%{FILEMODES:perms} %{FILENAMES}\n]"])?
            .lines()
            .filter(|l| l.starts_with('-'))
            .filter_map(|l| l.split_whitespace().nth(1).map(str::to_owned))
            .collect();
    let deb_files: std::collections::BTreeSet<String> =
        run(Command::new("dpkg-deb").arg("-c").arg(deb), None, limit)?
            .expect_ok("dpkg-deb -c")?
            .stdout
            .lines()
            .filter(|l| l.starts_with('-'))
            .filter_map(|l| l.split_whitespace().nth(5))
            .map(|p| p.trim_start_matches('.').to_owned())
            .collect();
    if rpm_files != deb_files {
        problems.push(format!(
            "files only in the rpm: {:?}; only in the deb: {:?}",
            rpm_files.difference(&deb_files).collect::<Vec<_>>(),
            deb_files.difference(&rpm_files).collect::<Vec<_>>()
        ));
    }
    if problems.is_empty() {
        Ok(format!("{} files, as in the deb", rpm_files.len()))
    } else {
        Err(problems.join("\n"))
    }
}

/// The same package with version `<version>+testbed1`, to upgrade to.
pub(super) fn upgrade_deb(p: &Packages, dir: &Path) -> Result<PathBuf, String> {
    relabelled(&p.deb, &p.version, &format!("{}+testbed1", p.version), dir)
}

/// `deb` (of `version`) as version `new_version` in `dir`, nothing else
/// changed.
fn relabelled(deb: &Path, version: &str, new_version: &str, dir: &Path) -> Result<PathBuf, String> {
    repacked(deb, version, new_version, dir, |_| Ok(()))
}

/// `deb` (of `version`) unpacked, changed by `edit` (given the unpacked
/// root), and built again as version `new_version` in `dir`.
fn repacked(
    deb: &Path,
    version: &str,
    new_version: &str,
    dir: &Path,
    edit: impl FnOnce(&Path) -> Result<(), String>,
) -> Result<PathBuf, String> {
    let unpacked = dir.join("repack-root");
    if unpacked.exists() {
        fs::remove_dir_all(&unpacked).map_err(|e| e.to_string())?;
    }
    let limit = Duration::from_secs(120);
    run(
        Command::new("dpkg-deb").arg("-R").arg(deb).arg(&unpacked),
        None,
        limit,
    )?
    .expect_ok("dpkg-deb -R")?;
    edit(&unpacked)?;
    let control = unpacked.join("DEBIAN/control");
    let text = fs::read_to_string(&control).map_err(|e| e.to_string())?;
    let text = text.replace(
        &format!("Version: {version}\n"),
        &format!("Version: {new_version}\n"),
    );
    fs::write(&control, text).map_err(|e| e.to_string())?;
    let out = dir.join(format!("airlock_{new_version}_amd64.deb"));
    run(
        Command::new("dpkg-deb")
            .args(["--root-owner-group", "-Zgzip", "-z1", "--build"])
            .arg(&unpacked)
            .arg(&out),
        None,
        limit,
    )?
    .expect_ok("dpkg-deb --build")?;
    fs::remove_dir_all(&unpacked).map_err(|e| e.to_string())?;
    Ok(out)
}

/// The previous release: the head of main when it was released (the last
/// landing before this round's work), whose package the testbed builds and
/// upgrades from.
pub(super) const PREVIOUS_RELEASE: &str = "c28b4b31eebfc733f476d5c1e07c2aa01a1e8795";

/// Whether this clone can build the previous release: false only in a
/// shallow clone that lacks its commit (there is nothing to build it from;
/// a full clone that lacks it fails the check instead).
pub(super) fn previous_release_reachable() -> bool {
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(workspace_root())
            .args(args)
            .output()
            .map(|o| {
                (
                    o.status.success(),
                    String::from_utf8_lossy(&o.stdout).trim().to_owned(),
                )
            })
            .unwrap_or((false, String::new()))
    };
    let present = git(&["cat-file", "-e", &format!("{PREVIOUS_RELEASE}^{{commit}}")]).0;
    let shallow = git(&["rev-parse", "--is-shallow-repository"]).1 == "true";
    present || !shallow
}

/// Builds the previous release's .deb from its own sources (`git archive`
/// of [`PREVIOUS_RELEASE`] from this clone) with its own scripts/package,
/// in this build's target directory and profile, so that the dependencies
/// compiled for this build are reused; the package is moved out of
/// `packages/` into `work` at once and relabelled `<v>~previous1`, older
/// than this build's. Run before this build's own package, which then
/// links its binaries again.
pub(super) fn previous_release_deb(s: &Settings, work: &Path) -> Result<PathBuf, String> {
    let root = workspace_root();
    let git = |args: &[&str]| {
        run(
            Command::new("git").arg("-C").arg(&root).args(args),
            None,
            Duration::from_secs(120),
        )
    };
    let commit = git(&[
        "rev-parse",
        "--verify",
        "--quiet",
        &format!("{PREVIOUS_RELEASE}^{{commit}}"),
    ])?;
    if !commit.ok() {
        return Err(format!(
            "the previous release's commit {PREVIOUS_RELEASE} is not in this clone (a shallow clone?): {}",
            commit.both()
        ));
    }
    let commit = commit.stdout.trim().to_owned();
    let epoch = git(&["log", "-1", "--format=%ct", &commit])?.expect_ok("git log")?;
    let src = work.join("previous-src");
    if src.exists() {
        fs::remove_dir_all(&src).map_err(|e| e.to_string())?;
    }
    fs::create_dir_all(src.join(".cargo")).map_err(|e| e.to_string())?;
    run(
        Command::new("sh")
            .arg("-c")
            .arg("git -C \"$1\" archive --format=tar \"$2\" | tar -x -m -C \"$3\"")
            .arg("sh")
            .arg(&root)
            .arg(&commit)
            .arg(&src),
        None,
        Duration::from_secs(300),
    )?
    .expect_ok("git archive of the previous release")?;
    // Extracted with the time of extraction (`tar -m`), not the commit's:
    // the previous release's workspace crates share this build's target
    // directory and artifact names, so sources older than an artifact this
    // build left there would pass for built and link against this build's
    // crates (seen: a second testbed run after a change to airlock-proto).
    // This build's profile for the dependencies (no debug information),
    // so that their artifacts are shared rather than compiled again.
    fs::write(
        src.join(".cargo/config.toml"),
        "[profile.pkg-dev.package.\"*\"]\ndebug = false\n",
    )
    .map_err(|e| e.to_string())?;
    // Nothing else in packages/: the one .deb there afterwards is the
    // previous release's.
    let packages = s.target_dir.join("packages");
    let _ = fs::remove_dir_all(&packages);
    let log = work.join("previous-package.log");
    let out = run(
        Command::new(src.join("scripts/package"))
            .args(["--no-rpm", "--no-lintian"])
            .current_dir(&src)
            .env("AIRLOCK_PACKAGE_PROFILE", "dev")
            .env("CARGO_TARGET_DIR", &s.target_dir)
            .env("SOURCE_DATE_EPOCH", epoch.stdout.trim())
            .env("CARGO_TERM_COLOR", "never"),
        None,
        Duration::from_secs(30 * 60),
    )?;
    fs::write(&log, out.both()).map_err(|e| e.to_string())?;
    out.expect_ok("the previous release's scripts/package")?;
    let deb = installed_deb(&packages, "_amd64.deb")?;
    let version = file_name(&deb)
        .trim_start_matches("airlock_")
        .trim_end_matches("_amd64.deb")
        .to_owned();
    let dir = work.join("previous");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let previous = relabelled(&deb, &version, &format!("{version}~previous1"), &dir)?;
    fs::remove_dir_all(&packages).map_err(|e| e.to_string())?;
    let _ = fs::remove_dir_all(&src);
    Ok(previous)
}

/// The stand-in for the previous release in a shallow clone that cannot
/// build it: this package as version `<v>~previous1`, with the
/// /etc/airlock/airlock.toml earlier releases installed (the example with
/// every value written out, its `[[repository]]` table commented) and no
/// preinst (they had none). Its binaries are this build's, so it tests the
/// configuration's path through dpkg, not the previous binaries' state.
pub(super) fn previous_stand_in_deb(p: &Packages, dir: &Path) -> Result<PathBuf, String> {
    let example = fs::read_to_string(workspace_root().join("packaging/airlock.toml"))
        .map_err(|e| e.to_string())?;
    let version = format!("{}~previous1", p.version);
    repacked(&p.deb, &p.version, &version, dir, |root| {
        fs::write(
            root.join("etc/airlock/airlock.toml"),
            earlier_airlock_toml(&example),
        )
        .map_err(|e| e.to_string())?;
        fs::remove_file(root.join("DEBIAN/preinst")).map_err(|e| e.to_string())?;
        // dpkg checks no sums at installation; drop the stale line anyway.
        let sums = root.join("DEBIAN/md5sums");
        let text = fs::read_to_string(&sums).map_err(|e| e.to_string())?;
        let text: String = text
            .lines()
            .filter(|l| !l.ends_with(" etc/airlock/airlock.toml"))
            .map(|l| format!("{l}\n"))
            .collect();
        fs::write(&sums, text).map_err(|e| e.to_string())
    })
}

/// What earlier releases installed as /etc/airlock/airlock.toml: the
/// example as it is, but for its `[[repository]]` table, commented out.
fn earlier_airlock_toml(example: &str) -> String {
    let mut inside = false;
    example
        .split('\n')
        .map(|line| {
            if line.trim() == "[[repository]]" {
                inside = true;
            } else if line.starts_with('[') {
                inside = false;
            }
            if inside && !line.trim().is_empty() && !line.starts_with('#') {
                format!("# {line}")
            } else {
                line.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The RPM's scriptlets, run by sh on a freshly booted copy of the root
/// after its payload is unpacked there (rpm itself is not in the Debian
/// root): %post 1 (install), %post 2 (upgrade), %preun 0 and %postun 0
/// (erase, with the payload's files removed in between, as rpm does).
pub(super) fn rpm_scriptlets(
    r: &Report,
    root: &Path,
    tag: &str,
    rpm: &Path,
    work: &Path,
) -> Result<String, String> {
    let mut c = Container::boot(
        root,
        &format!("{tag}-rpm"),
        &[],
        &work.join("nspawn-rpm.log"),
        r,
    )?;
    let limit = Duration::from_secs(120);
    let into = format!("/proc/{}/root", c.leader());
    run(
        Command::new("sh")
            .arg("-c")
            .arg("rpm2archive - < \"$1\" | tar -xzf - -C \"$2\"")
            .arg("sh")
            .arg(rpm)
            .arg(&into),
        None,
        limit,
    )?
    .expect_ok("unpacking the rpm's payload")?;
    let query = |fmt: &str| -> Result<String, String> {
        Ok(run(
            Command::new("rpm").args(["-qp", "--qf", fmt]).arg(rpm),
            None,
            limit,
        )?
        .expect_ok("rpm -qp")?
        .stdout)
    };
    for (tag, file) in [("POSTIN", "post"), ("PREUN", "preun"), ("POSTUN", "postun")] {
        c.write(
            &format!("/tmp/tb/rpm-{file}.sh"),
            &query(&format!("%{{{tag}}}\n"))?,
        )?;
    }
    c.write("/tmp/tb/procs.py", PROCS_PY)?;
    c.sh_ok("sh /tmp/tb/rpm-post.sh 1", 300 * SEC)?;
    let installed = after_install(&c)?;
    all_active(&c, STARTED_BY_TARGET)?;
    let before = main_pids(&c)?;
    c.sh_ok("sh /tmp/tb/rpm-post.sh 2", 300 * SEC)?;
    all_active(&c, STARTED_BY_TARGET)?;
    let after = main_pids(&c)?;
    if before.get("airlock-supervisor.service") == after.get("airlock-supervisor.service") {
        return Err(format!("%post 2 did not restart: {before:?} {after:?}"));
    }
    c.sh_ok("sh /tmp/tb/rpm-preun.sh 0", 300 * SEC)?;
    no_airlock_process(&c)?;
    let files = query("[%{FILEMODES:perms} %{FILENAMES}\n]")?;
    let files: Vec<&str> = files
        .lines()
        .filter(|l| l.starts_with('-'))
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|f| *f != "/etc/airlock/airlock.toml")
        .collect();
    c.sh_ok(&format!("rm -f {}", files.join(" ")), 60 * SEC)?;
    c.sh_ok("sh /tmp/tb/rpm-postun.sh 0", 300 * SEC)?;
    let enabled = c.sh("systemctl is-enabled airlock.target", 10 * SEC)?;
    if enabled.stdout.trim() == "enabled" {
        return Err("airlock.target still enabled after the erase".into());
    }
    expect_paths(
        &c,
        &[
            "/var/lib/airlock/tasks.sqlite3",
            "/etc/airlock/retry-control.token",
        ],
        &["/usr/bin/airlock-supervisor"],
    )?;
    c.shutdown(Duration::from_secs(60))?;
    Ok(format!(
        "%post 1: {installed}, all active; %post 2 restarted; %preun 0 stopped everything; state kept"
    ))
}

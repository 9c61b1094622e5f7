//! What the booted root is and what airlock used of its kernel there, for
//! the run's results and README.md's table of releases (`crate::results`):
//! the distribution (checked to be the release the run meant to boot),
//! systemd, polkit and Cockpit as dpkg has them; the Landlock ABI each
//! daemon's lockdown line reports, Seccomp 2 in each daemon's status, the
//! namespaces the probe's commands ran in (from the executor's result
//! bundle) and the cgroup hierarchy mounted on the root's /sys/fs/cgroup.
//! Run after the sandbox checks, while the daemons run.

use super::confinement::PROBE_MARKER;
use super::{SEC, json, q};
use crate::results::Facts;
use crate::{Container, Release};

/// The daemons whose lockdown and status are read (retryd started by a
/// connection to its socket first).
const DAEMONS: &[&str] = &[
    "airlock-supervisor",
    "airlock-worker",
    "airlock-executor",
    "airlock-retryd",
    "airlock-egress",
];

/// Kernel namespace kinds among the executor's confinement entries (the
/// others, proc, root, shm and tmp, describe the commands' view).
const NAMESPACE_KINDS: &[&str] = &["user", "mount", "pid", "net", "ipc", "uts"];

pub(super) fn gather(c: &Container, release: Option<Release>) -> Result<Facts, String> {
    // retryd runs once its socket had a connection: one, first.
    let mut script = String::from(
        "python3 /tmp/tb/health.py >/dev/null\n\
         . /etc/os-release\n\
         echo \"os=$ID $VERSION_ID $VERSION_CODENAME\"\n\
         dpkg-query -W -f 'pkg=${Package} ${Version}\\n' systemd polkitd cockpit-ws\n\
         echo \"kernel=$(uname -r)\"\n\
         echo \"cgroupfs=$(stat -fc %T /sys/fs/cgroup)\"\n\
         echo \"unified=$(stat -fc %T /sys/fs/cgroup/unified 2>/dev/null)\"\n",
    );
    for d in DAEMONS {
        script.push_str(&format!(
            "echo \"lockdown={d} $(journalctl -b -u {d}.service -o cat | grep 'lockdown {d}: ' | tail -n 1)\"\n\
             pid=$(systemctl show -p MainPID --value {d}.service)\n\
             [ \"$pid\" = 0 ] || echo \"seccomp={d} $(grep '^Seccomp:' /proc/$pid/status | cut -f2)\"\n"
        ));
    }
    let out = c.sh_ok(&script, 60 * SEC)?;
    let values = |key: &str| -> Vec<String> {
        out.lines()
            .filter_map(|l| l.strip_prefix(&format!("{key}=")))
            .map(|v| v.trim().to_owned())
            .collect()
    };
    let one = |key: &str| values(key).into_iter().next().unwrap_or_default();
    let mut problems = Vec::new();

    let os = one("os");
    let os: Vec<&str> = os.split_whitespace().collect();
    let distribution = match os.as_slice() {
        ["debian", version, codename] => format!("Debian {version} ({codename})"),
        _ => {
            problems.push(format!("os-release: {os:?}"));
            String::new()
        }
    };
    if let Some(r) = release
        && distribution != r.label()
    {
        problems.push(format!("booted {distribution}, not {}", r.label()));
    }
    let package = |name: &str| {
        values("pkg")
            .iter()
            .find_map(|l| l.strip_prefix(&format!("{name} ")).map(str::to_owned))
            .unwrap_or_default()
    };
    let (systemd, polkit, cockpit) = (
        package("systemd"),
        package("polkitd"),
        package("cockpit-ws"),
    );
    for (name, v) in [
        ("systemd", &systemd),
        ("polkitd", &polkit),
        ("cockpit-ws", &cockpit),
    ] {
        if v.is_empty() {
            problems.push(format!("{name} is not installed"));
        }
    }

    let cgroup = match (one("cgroupfs").as_str(), one("unified").as_str()) {
        ("cgroup2fs", _) => "v2",
        ("tmpfs", "cgroup2fs") => "hybrid",
        ("tmpfs", _) => "v1",
        (other, _) => {
            problems.push(format!("/sys/fs/cgroup is {other}"));
            ""
        }
    }
    .to_owned();

    // "lockdown airlock-worker: …, landlock full (kernel ABI 7, requested 7), …"
    let number_after = |said: &str, what: &str| {
        said.split(what)
            .nth(1)
            .and_then(|s| s.split(|ch: char| !ch.is_ascii_digit()).next())
            .and_then(|n| n.parse::<u32>().ok())
    };
    let mut abis = Vec::new();
    let mut full = true;
    for line in values("lockdown") {
        let (daemon, said) = line.split_once(' ').unwrap_or((&line, ""));
        if said.is_empty() {
            problems.push(format!("{daemon}: no lockdown line in its journal"));
            continue;
        }
        full &= said.contains("landlock full");
        match (
            number_after(said, "kernel ABI "),
            number_after(said, "requested "),
        ) {
            (Some(kernel), Some(requested)) => abis.push((kernel, requested)),
            _ => problems.push(format!("{daemon}: no Landlock ABI in {said:?}")),
        }
    }
    abis.dedup();
    let (kernel_abi, landlock_abi) = match abis.as_slice() {
        [abi] => *abi,
        other => {
            problems.push(format!(
                "the daemons saw and requested Landlock ABIs {other:?}"
            ));
            (0, 0)
        }
    };
    let mut seccomp: Vec<String> = Vec::new();
    for line in values("seccomp") {
        match line.split_once(' ') {
            Some((daemon, "2")) => seccomp.push(daemon.trim_start_matches("airlock-").to_owned()),
            _ => problems.push(format!("{line}: not Seccomp 2")),
        }
    }
    if seccomp.len() != DAEMONS.len() {
        problems.push(format!(
            "Seccomp 2 on {seccomp:?}, want every daemon of {DAEMONS:?} running"
        ));
    }

    // The probe's commands: from the executor's result bundle.
    let found = json(&c.sh_ok(
        &format!("python3 /tmp/tb/probe_report.py {}", q(PROBE_MARKER)),
        30 * SEC,
    )?)?;
    let confinement = &found[0]["confinement"];
    if confinement.is_null() {
        problems.push("no probe bundle with its confinement".to_owned());
    }
    let unshared: Vec<&str> = confinement["namespaces"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
        .unwrap_or_default();
    let namespaces: Vec<String> = NAMESPACE_KINDS
        .iter()
        .filter(|k| unshared.contains(k))
        .map(|k| (*k).to_owned())
        .collect();
    if !namespaces.iter().any(|n| n == "user") {
        problems.push(format!(
            "the commands ran in no user namespace: {confinement}"
        ));
    }
    if confinement["seccomp"] == true {
        seccomp.push("commands".to_owned());
    } else {
        problems.push(format!("the commands ran without seccomp: {confinement}"));
    }
    full &= confinement["landlock"] == "full";
    if confinement["landlock_abi"] != kernel_abi {
        problems.push(format!(
            "the kernel offered the commands Landlock ABI {}, the daemons {kernel_abi}",
            confinement["landlock_abi"]
        ));
    }
    if !full {
        problems.push("Landlock was not full everywhere".to_owned());
    }
    if !problems.is_empty() {
        return Err(format!("{}\n{out}", problems.join("\n")));
    }
    Ok(Facts {
        distribution,
        systemd,
        polkit,
        cockpit,
        kernel: one("kernel"),
        landlock_abi,
        landlock: "full".to_owned(),
        seccomp,
        namespaces,
        cgroup,
    })
}

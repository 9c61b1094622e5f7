//! The Cockpit page (cockpit-airlock) in a real browser against the booted
//! root's real Cockpit: the package installed beside Debian's cockpit-ws,
//! two users logged in through Cockpit's login page — alice, whom a polkit
//! rule grants every airlock action, and bob, who may only read — and
//! Debian's Chromium, headless, driven through the DevTools protocol by
//! `src/cockpit_browser.py` (run on the host, in the container's network
//! namespace). Each case the script reports is a check of its own; the
//! screenshots stay in the work directory.

use super::package::Packages;
use super::{SEC, file_name};
use crate::{Container, Report, which};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// The cases the browser script reports, in its order.
pub(super) const CASES: &[&str] = &[
    "task list follows a task submitted from airlockctl (TaskChanged, no reload)",
    "task page renders the diff, each verification command, the isolation evidence and the events",
    "a user without the right to decide sees the refusal's code, and nothing changes",
    "administrative access: limited, a sudoer is refused and pointed to it; turned on at login, the decision goes as root",
    "accept from the page decides exactly once (a double click, then a reload)",
    "repositories: every registered repository, as airlockctl repo list has them, with environment and upstream",
    "agents: the held agent shows its hold; clear hold and stop/start work from the page",
    "dark theme follows Cockpit's setting; every control is keyboard reachable",
    "no console errors on the page",
];

/// The testbed's polkit rule: alice may do everything airlock asks polkit
/// about; bob and carol may read tasks and agents (all of them) and
/// nothing else. carol is a sudoer: with Cockpit's administrative access
/// her page's calls come from root, whom polkit lets do everything.
const RULES: &str = r#"// airlock testbed: the Cockpit page's users.
polkit.addRule(function(action, subject) {
    if (action.id.indexOf("org.airlock.") != 0) {
        return polkit.Result.NOT_HANDLED;
    }
    if (subject.user == "alice") {
        return polkit.Result.YES;
    }
    if ((subject.user == "bob" || subject.user == "carol") && (action.id == "org.airlock.tasks.read" ||
        action.id == "org.airlock.tasks.read-all" || action.id == "org.airlock.agents.read")) {
        return polkit.Result.YES;
    }
    return polkit.Result.NOT_HANDLED;
});
"#;

/// Installs cockpit-airlock, lets Cockpit serve plain HTTP on the
/// container's loopback, and makes the two users.
fn install(c: &Container, p: &Packages) -> Result<String, String> {
    let deb = format!("/debs/{}", file_name(&p.cockpit));
    c.sh_ok(
        &format!("apt-get install -y --no-install-recommends {deb} </dev/null"),
        300 * SEC,
    )?;
    c.write(
        "/etc/cockpit/cockpit.conf",
        "[WebService]\n# The testbed's browser connects over loopback without TLS.\nAllowUnencrypted = true\n",
    )?;
    c.write(
        "/etc/polkit-1/rules.d/40-airlock-testbed-cockpit.rules",
        RULES,
    )?;
    c.sh_ok(
        "for u in alice bob carol; do id -u $u >/dev/null 2>&1 || useradd -m -s /bin/bash $u; done\n\
         usermod -aG sudo carol\n\
         printf 'alice:alice-testbed-pw\\nbob:bob-testbed-pw\\ncarol:carol-testbed-pw\\n' | chpasswd\n\
         systemctl restart cockpit.socket",
        60 * SEC,
    )?;
    let listed = c.sh_ok("cockpit-bridge --packages", 30 * SEC)?;
    if !listed
        .lines()
        .any(|l| l.split_whitespace().next() == Some("airlock"))
    {
        return Err(format!(
            "cockpit-bridge --packages does not list airlock:\n{listed}"
        ));
    }
    let version = c.sh_ok("dpkg-query -W -f '${Version}' cockpit-ws", 30 * SEC)?;
    Ok(format!(
        "{} installed; cockpit-ws {version} on :9090 (loopback HTTP); users alice (every airlock action), bob (reads only) and carol (a sudoer, no airlock rule)",
        file_name(&p.cockpit)
    ))
}

/// Runs the browser script; its output, one line per case.
fn browse(c: &Container, work: &Path) -> Result<BTreeMap<String, (bool, String)>, String> {
    which("chromium")
        .ok_or("chromium is not installed (AIRLOCK_DEBIAN_PACKAGES in scripts/deps.sh)")?;
    let script = work.join("cockpit_browser.py");
    std::fs::write(&script, include_str!("../cockpit_browser.py")).map_err(|e| e.to_string())?;
    let out = crate::run(
        Command::new("python3")
            .arg(&script)
            .arg(c.leader().to_string())
            .arg(work),
        None,
        Duration::from_secs(15 * 60),
    )?;
    std::fs::write(work.join("cockpit-browser.log"), out.both()).map_err(|e| e.to_string())?;
    let mut cases = BTreeMap::new();
    for line in out.stdout.lines() {
        let (ok, rest) = if let Some(rest) = line.strip_prefix("PASS ") {
            (true, rest)
        } else if let Some(rest) = line.strip_prefix("FAIL ") {
            (false, rest)
        } else {
            continue;
        };
        // A case's name may hold ": " itself: match the names it knows.
        let (name, detail) = CASES
            .iter()
            .chain(&["browser session"])
            .find_map(|case| {
                let detail = rest.strip_prefix(case)?.strip_prefix(':')?;
                Some((*case, detail.trim_start()))
            })
            .unwrap_or((rest, ""));
        cases.insert(name.to_owned(), (ok, detail.to_owned()));
    }
    if let Some((false, why)) = cases.get("browser session") {
        return Err(format!("the browser session failed: {why}"));
    }
    Ok(cases)
}

/// The Cockpit checks: run while the agents are configured and one is held.
pub(super) fn checks(r: &mut Report, c: &Container, p: &Packages, work: &Path) {
    let names: Vec<String> = CASES.iter().map(|c| format!("cockpit: {c}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    if r.check(
        "cockpit: cockpit-airlock installs beside Debian's cockpit-ws; three users",
        |_| install(c, p),
    )
    .is_none()
    {
        r.skip(&names, "cockpit-airlock is not installed");
        return;
    }
    match r.check(
        "cockpit: headless Chromium logs in through Cockpit's login page and opens the page",
        |_| browse(c, work).map(Cases),
    ) {
        Some(Cases(cases)) => {
            for (case, name) in CASES.iter().zip(&names) {
                r.check(name, |_| match cases.get(*case) {
                    Some((true, detail)) => Ok(detail.clone()),
                    Some((false, why)) => Err(why.clone()),
                    None => Err(
                        "the browser script did not report this case (cockpit-browser.log)"
                            .to_owned(),
                    ),
                });
            }
        }
        None => r.skip(&names, "no browser session"),
    }
    r.check("cockpit: cockpit-airlock removes cleanly", |_| {
        c.sh_ok(
            "apt-get purge -y cockpit-airlock </dev/null >/dev/null && test ! -e /usr/share/cockpit/airlock && rm -f /etc/polkit-1/rules.d/40-airlock-testbed-cockpit.rules",
            120 * SEC,
        )
        .map(|_| "purged; /usr/share/cockpit/airlock is gone".to_owned())
    });
}

/// The browser's cases, by name.
struct Cases(BTreeMap<String, (bool, String)>);

impl crate::Detail for Cases {
    fn detail(&self) -> String {
        let passed = self.0.values().filter(|(ok, _)| *ok).count();
        format!("{passed} of {} cases passed", self.0.len())
    }
}

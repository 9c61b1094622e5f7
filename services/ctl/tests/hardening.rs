//! The hardening verifier of `airlockctl doctor` (airlockctl::hardening)
//! against recorded `systemctl show --all` output: real output of systemd
//! 252 in the testbed's booted Debian root (tests/fixtures/systemd-252/,
//! the shipped units loaded and running, with stand-in programs; the
//! `.weakened.show` files with a drop-in in place, named in each test),
//! and `systemd-analyze syscall-filter` of the same systemd.

use airlockctl::hardening::{
    Host, Kind, RULES, SHIPPED_UNITS, ShippedUnit, Shown, SyscallGroups, UNSET_MEANS_EMPTY,
    directives, expand_specifiers, rule_for, shown_names, split_quoted, verify,
};
use std::collections::BTreeSet;
use std::path::PathBuf;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/systemd-252")
}

fn host() -> Host {
    let text = std::fs::read_to_string(fixtures().join("syscall-filter.txt")).unwrap();
    Host {
        syscall_groups: SyscallGroups::parse(&text),
    }
}

fn shown(file: &str) -> Shown {
    Shown::parse(&std::fs::read_to_string(fixtures().join(file)).unwrap())
}

fn unit(name: &str) -> &'static ShippedUnit {
    SHIPPED_UNITS
        .iter()
        .find(|u| u.name == name)
        .unwrap_or_else(|| panic!("{name} is not a shipped unit"))
}

/// The shipped units with a recorded `systemctl show`.
fn recorded() -> Vec<&'static ShippedUnit> {
    SHIPPED_UNITS
        .iter()
        .filter(|u| fixtures().join(format!("{}.show", u.name)).is_file())
        .collect()
}

fn failing(unit: &ShippedUnit, shown: &Shown) -> BTreeSet<String> {
    verify(unit, None, shown, &host())
        .into_iter()
        .filter(|v| !v.ok)
        .map(|v| v.property)
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn every_directive_of_every_shipped_unit_is_verified_or_has_a_reason() {
    assert!(
        SHIPPED_UNITS
            .iter()
            .any(|u| u.name == "airlock-worker.service"),
        "build.rs compiled in units/"
    );
    let mut problems = Vec::new();
    let mut verified = 0;
    for u in SHIPPED_UNITS {
        let instance = u.is_template().then_some("example");
        for a in u.assignments() {
            let Some(rule) = rule_for(&a.key) else {
                problems.push(format!(
                    "{}: {}= has no row in airlockctl::hardening::RULES (verify it, or list it as Kind::NotVerified with the reason)",
                    u.name, a.key
                ));
                continue;
            };
            match rule.kind {
                Kind::NotVerified(why) => {
                    if why.trim().len() < 10 {
                        problems.push(format!(
                            "{}: {}= is not verified without a reason",
                            u.name, a.key
                        ));
                    }
                }
                kind => {
                    verified += 1;
                    let name = match instance {
                        Some(i) => u.name.replacen("@.", &format!("@{i}."), 1),
                        None => u.name.to_owned(),
                    };
                    let value = expand_specifiers(&a.value, &name, instance.unwrap_or(""));
                    if value.contains("%?") {
                        problems.push(format!(
                            "{}: {}={} uses a specifier the verifier does not expand",
                            u.name, a.key, a.value
                        ));
                    }
                    // With nothing shown, the only failure left is the
                    // missing property: the shipped value itself parses.
                    let err = airlockctl::hardening::compare(
                        kind,
                        std::slice::from_ref(&value),
                        &Shown::default(),
                        &host(),
                    )
                    .expect_err("nothing shown must fail");
                    if !err.contains("does not report") {
                        problems.push(format!("{}: {}={value}: {err}", u.name, a.key));
                    }
                    assert!(!shown_names(kind).is_empty());
                }
            }
        }
    }
    assert!(verified > 150, "{verified} verified directives");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    for r in RULES {
        if let Kind::NotVerified(why) = r.kind {
            assert!(why.len() >= 10, "{}: no reason", r.directive);
        }
    }
}

#[test]
fn recorded_shipped_units_pass_every_property() {
    let units = recorded();
    let names: Vec<&str> = units.iter().map(|u| u.name).collect();
    assert_eq!(
        names,
        [
            "airlock-executor.service",
            "airlock-retryd.service",
            "airlock-retryd.socket",
            "airlock-supervisor.service",
            "airlock-worker.service"
        ]
    );
    for u in units {
        let verdicts = verify(u, None, &shown(&format!("{}.show", u.name)), &host());
        let bad: Vec<String> = verdicts
            .iter()
            .filter(|v| !v.ok)
            .map(|v| format!("{} {}: {}", u.name, v.property, v.detail))
            .collect();
        assert!(bad.is_empty(), "{}", bad.join("\n"));
        let mut verifiable: BTreeSet<String> = u
            .assignments()
            .into_iter()
            .filter(|a| !matches!(rule_for(&a.key).map(|r| r.kind), Some(Kind::NotVerified(_))))
            .map(|a| a.key)
            .collect();
        if u.name.ends_with(".service") {
            verifiable.extend(UNSET_MEANS_EMPTY.iter().map(|k| (*k).to_owned()));
        }
        let checked: BTreeSet<String> = verdicts.iter().map(|v| v.property.clone()).collect();
        assert_eq!(checked, verifiable, "{}", u.name);
        // The filter is compared as the whole expanded set; the names
        // Debian 12's libseccomp does not know are not in effect.
        if let Some(v) = verdicts.iter().find(|v| v.property == "SystemCallFilter") {
            assert!(
                v.detail.starts_with("allow-list of ")
                    && v.detail
                        .ends_with("not in effect: riscv_hwprobe uretprobe)"),
                "{}",
                v.detail
            );
        }
    }
}

/// A drop-in `[Service] PrivateNetwork=no` + `InaccessiblePaths=` on the
/// worker, daemon-reload, restart: recorded.
#[test]
fn a_drop_in_removing_private_network_and_inaccessible_paths_fails_exactly_those() {
    let u = unit("airlock-worker.service");
    let weak = shown("airlock-worker.service.weakened.show");
    assert_eq!(
        failing(u, &weak),
        set(&["InaccessiblePaths", "PrivateNetwork"])
    );
    let verdicts = verify(u, None, &weak, &host());
    let detail = |p: &str| {
        verdicts
            .iter()
            .find(|v| v.property == p)
            .unwrap()
            .detail
            .clone()
    };
    assert_eq!(detail("PrivateNetwork"), "no (want yes)");
    assert!(
        detail("InaccessiblePaths").starts_with("missing -/etc/airlock/retry-control.token"),
        "{}",
        detail("InaccessiblePaths")
    );
}

/// A drop-in on the executor: `SystemCallFilter=ptrace`,
/// `CapabilityBoundingSet=CAP_NET_ADMIN`, `RestrictAddressFamilies=AF_INET`,
/// `ProtectSystem=full`: recorded.
#[test]
fn a_drop_in_widening_the_executor_fails_exactly_the_widened_properties() {
    let u = unit("airlock-executor.service");
    let weak = shown("airlock-executor.service.weakened.show");
    assert_eq!(
        failing(u, &weak),
        set(&[
            "CapabilityBoundingSet",
            "ProtectSystem",
            "RestrictAddressFamilies",
            "SystemCallFilter"
        ])
    );
    let verdicts = verify(u, None, &weak, &host());
    let detail = |p: &str| {
        verdicts
            .iter()
            .find(|v| v.property == p)
            .unwrap()
            .detail
            .clone()
    };
    assert_eq!(
        detail("SystemCallFilter"),
        "allows system calls not shipped: ptrace"
    );
    assert!(
        detail("CapabilityBoundingSet").contains("not shipped cap_net_admin"),
        "{}",
        detail("CapabilityBoundingSet")
    );
    assert!(
        detail("RestrictAddressFamilies").contains("AF_INET"),
        "{}",
        detail("RestrictAddressFamilies")
    );
    assert_eq!(detail("ProtectSystem"), "full (want strict)");

    // Narrowing the filter (a name removed) is not a weakening.
    let mut narrowed = shown("airlock-executor.service.show");
    let list = narrowed
        .get("SystemCallFilter")
        .unwrap()
        .replace(" uname ", " ");
    narrowed.set("SystemCallFilter", &list);
    assert!(failing(u, &narrowed).is_empty());
    // A deny-list in its place is.
    narrowed.set("SystemCallFilter", "~@mount");
    assert_eq!(failing(u, &narrowed), set(&["SystemCallFilter"]));
}

/// Seed 000's verifier contract, per property: a missing field and an
/// unrecognised value each fail that property, and only it.
#[test]
fn each_property_fails_alone_when_missing_or_unrecognised() {
    let mut cases = 0;
    for u in recorded() {
        let good = shown(&format!("{}.show", u.name));
        let mut by_name: Vec<(String, Vec<String>)> = Vec::new();
        let all = directives(u, None);
        for (key, _) in &all {
            let Some(rule) = rule_for(key) else {
                continue;
            };
            for p in shown_names(rule.kind) {
                match by_name.iter_mut().find(|(n, _)| *n == p) {
                    Some((_, ds)) if !ds.contains(key) => ds.push(key.clone()),
                    Some(_) => {}
                    None => by_name.push((p, vec![key.clone()])),
                }
            }
        }
        for (p, directives) in by_name {
            let want: BTreeSet<String> = directives.into_iter().collect();
            let mut missing = good.clone();
            missing.remove(&p);
            assert_eq!(failing(u, &missing), want, "{}: {p} missing", u.name);
            cases += 1;
            for wrong in ["", "unrecognised-☃"] {
                let mut bad = good.clone();
                bad.set(&p, wrong);
                // An empty list is what an empty shipped list shows.
                let empty_is_fine = wrong.is_empty()
                    && want.iter().all(|d| {
                        all.iter()
                            .filter(|(k, _)| k == d)
                            .all(|(_, vs)| vs.iter().all(String::is_empty))
                    });
                let expect = if empty_is_fine {
                    BTreeSet::new()
                } else {
                    want.clone()
                };
                assert_eq!(failing(u, &bad), expect, "{}: {p}={wrong:?}", u.name);
                cases += 1;
            }
        }
    }
    eprintln!("{cases} missing or unrecognised properties, each failing alone");
    assert!(cases > 500, "{cases} cases");
}

/// Directives a unit does not ship are checked as unset where adding one
/// widens it: a writable path, an ambient capability, a group.
#[test]
fn a_drop_in_adding_a_writable_path_or_a_capability_fails() {
    let u = unit("airlock-supervisor.service");
    let mut s = shown("airlock-supervisor.service.show");
    assert!(failing(u, &s).is_empty());
    s.set("ReadWritePaths", "/etc");
    s.set("AmbientCapabilities", "cap_net_admin");
    assert_eq!(
        failing(u, &s),
        set(&["AmbientCapabilities", "ReadWritePaths"])
    );
}

#[test]
fn without_the_host_s_groups_the_system_call_filter_fails() {
    let u = unit("airlock-worker.service");
    let verdicts = verify(
        u,
        None,
        &shown("airlock-worker.service.show"),
        &Host::default(),
    );
    let bad: Vec<&str> = verdicts
        .iter()
        .filter(|v| !v.ok)
        .map(|v| v.property.as_str())
        .collect();
    assert_eq!(bad, ["SystemCallFilter"]);
}

#[test]
fn a_template_is_checked_per_instance_with_its_specifiers_expanded() {
    let t = ShippedUnit {
        name: "airlock-agent@.service",
        text: "[Unit]\nDescription=agent %i\n[Service]\nExecStart=/usr/bin/run-agent --name %i --unit %n\nRuntimeDirectory=airlock-agent/%i\nPrivateNetwork=no\n",
    };
    assert!(t.is_template());
    assert_eq!(t.instance_pattern(), "airlock-agent@*.service");
    let good = Shown::parse(
        "ExecStart={ path=/usr/bin/run-agent ; argv[]=/usr/bin/run-agent --name fixer --unit airlock-agent@fixer.service ; ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }\nRuntimeDirectory=airlock-agent/fixer\nPrivateNetwork=no\nReadWritePaths=\nAmbientCapabilities=\nSupplementaryGroups=\n",
    );
    let v = verify(&t, Some("fixer"), &good, &host());
    assert!(v.iter().all(|v| v.ok), "{v:?}");
    assert_eq!(v.len(), 3 + UNSET_MEANS_EMPTY.len());
    let other = verify(&t, Some("other"), &good, &host());
    let bad: BTreeSet<String> = other
        .into_iter()
        .filter(|v| !v.ok)
        .map(|v| v.property)
        .collect();
    assert_eq!(bad, set(&["ExecStart", "RuntimeDirectory"]));
    assert_eq!(
        expand_specifiers("%i %I %n %N %p %% %j", "a@b.service", "b"),
        "b b a@b.service a@b a % %?j"
    );
}

#[test]
fn values_are_read_as_systemd_writes_them() {
    let h = host();
    let cmp = |kind, shipped: &str, shown_line: &str| {
        airlockctl::hardening::compare(kind, &[shipped.to_owned()], &Shown::parse(shown_line), &h)
    };
    // Time spans: unit files in seconds by default, show with units.
    assert!(cmp(Kind::Timespan("WatchdogUSec"), "60", "WatchdogUSec=1min").is_ok());
    assert!(
        cmp(
            Kind::Timespan("WatchdogUSec"),
            "90",
            "WatchdogUSec=1min 30s"
        )
        .is_ok()
    );
    assert!(cmp(Kind::Timespan("WatchdogUSec"), "60", "WatchdogUSec=0").is_err());
    assert!(
        cmp(
            Kind::Timespan("WatchdogUSec"),
            "500ms",
            "WatchdogUSec=500ms"
        )
        .is_ok()
    );
    // Sizes: base 1024.
    assert!(cmp(Kind::Bytes("MemoryMax"), "4G", "MemoryMax=4294967296").is_ok());
    assert!(cmp(Kind::Bytes("MemoryMax"), "4G", "MemoryMax=infinity").is_err());
    // Booleans in any of systemd's spellings.
    assert!(cmp(Kind::Word("PrivateTmp"), "true", "PrivateTmp=yes").is_ok());
    assert!(cmp(Kind::Word("ProtectSystem"), "strict", "ProtectSystem=yes").is_err());
    // Namespaces as the set allowed.
    assert!(
        cmp(
            Kind::Namespaces,
            "user mnt pid",
            "RestrictNamespaces=mnt pid user"
        )
        .is_ok()
    );
    assert!(cmp(Kind::Namespaces, "yes", "RestrictNamespaces=no").is_err());
    assert!(
        cmp(
            Kind::Namespaces,
            "~net",
            "RestrictNamespaces=cgroup ipc mnt pid user uts"
        )
        .is_ok()
    );
    // Address prefixes: names expanded, order free.
    assert!(
        cmp(
            Kind::IpPrefixes("IPAddressDeny"),
            "any",
            "IPAddressDeny=::/0 0.0.0.0/0"
        )
        .is_ok()
    );
    assert!(
        cmp(
            Kind::IpPrefixes("IPAddressAllow"),
            "localhost",
            "IPAddressAllow=::1/128 127.0.0.0/8"
        )
        .is_ok()
    );
    assert!(cmp(Kind::IpPrefixes("IPAddressDeny"), "any", "IPAddressDeny=").is_err());
    // Errno names against numbers.
    assert!(
        cmp(
            Kind::Errno("SystemCallErrorNumber"),
            "EPERM",
            "SystemCallErrorNumber=1"
        )
        .is_ok()
    );
    assert!(
        cmp(
            Kind::Errno("SystemCallErrorNumber"),
            "EPERM",
            "SystemCallErrorNumber=2147483646"
        )
        .is_err()
    );
    // Address families: a deny-list is not the shipped allow-list.
    assert!(
        cmp(
            Kind::AddressFamilies,
            "AF_UNIX",
            "RestrictAddressFamilies=~AF_UNIX"
        )
        .is_err()
    );
    assert!(cmp(Kind::AddressFamilies, "AF_UNIX", "RestrictAddressFamilies=").is_err());
    // Capabilities: empty is empty.
    assert!(
        cmp(
            Kind::Capabilities("CapabilityBoundingSet"),
            "",
            "CapabilityBoundingSet="
        )
        .is_ok()
    );
    assert!(
        cmp(
            Kind::Capabilities("AmbientCapabilities"),
            "CAP_NET_RAW",
            "AmbientCapabilities=cap_net_raw"
        )
        .is_ok()
    );
    // Command lines: quotes as systemd splits them.
    assert_eq!(
        split_quoted(r#"/bin/sh -c 'kill -HUP "$MAINPID"'"#).unwrap(),
        ["/bin/sh", "-c", r#"kill -HUP "$MAINPID""#]
    );
    assert!(split_quoted("'open").is_none());
}

/// A template's instance, recorded: `airlock-agent@example.service` of the
/// template as it was recorded (`airlock-agent@.service.unit`, kept beside
/// the output so the test does not depend on the template's later edits;
/// the shipped one too, when it is the same file). Weakened by a drop-in
/// `NoNewPrivileges=no` + `RestrictAddressFamilies=`, reloaded and not
/// restarted (what doctor reads is the loaded unit).
#[test]
fn a_recorded_agent_instance_passes_and_a_weakened_one_fails_exactly_that() {
    let text: &'static str = Box::leak(
        std::fs::read_to_string(fixtures().join("airlock-agent@.service.unit"))
            .unwrap()
            .into_boxed_str(),
    );
    let recorded = ShippedUnit {
        name: "airlock-agent@.service",
        text,
    };
    let mut templates = vec![&recorded];
    let shipped = SHIPPED_UNITS
        .iter()
        .find(|u| u.name == recorded.name && u.text == text);
    templates.extend(shipped);
    for t in templates {
        let good = shown("airlock-agent@example.service.show");
        let verdicts = verify(t, Some("example"), &good, &host());
        let bad: Vec<String> = verdicts
            .iter()
            .filter(|v| !v.ok)
            .map(|v| format!("{}: {}", v.property, v.detail))
            .collect();
        assert!(bad.is_empty(), "{}", bad.join("\n"));
        for p in [
            "ExecStart",
            "StateDirectory",
            "WorkingDirectory",
            "EnvironmentFile",
        ] {
            assert!(verdicts.iter().any(|v| v.property == p), "{p} not checked");
        }
        let weak = shown("airlock-agent@example.service.weakened.show");
        let failed: BTreeSet<String> = verify(t, Some("example"), &weak, &host())
            .into_iter()
            .filter(|v| !v.ok)
            .map(|v| v.property)
            .collect();
        assert_eq!(failed, set(&["NoNewPrivileges", "RestrictAddressFamilies"]));
        // Another instance's output is not this one's.
        let other = verify(t, Some("other"), &good, &host());
        assert!(other.iter().any(|v| v.property == "ExecStart" && !v.ok));
    }
}

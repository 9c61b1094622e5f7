//! The hardening verifier behind `airlockctl doctor`: every directive a
//! shipped unit file sets is checked on its own, by name, against the
//! effective unit as `systemctl show` reports it, so that a drop-in which
//! removes `PrivateNetwork=` or `InaccessiblePaths=` is reported as exactly
//! that property failing. A property `systemctl show` does not report, or
//! reports in a form this module does not recognise, fails.
//!
//! The expected values are the unit files of `units/`, compiled in by
//! `build.rs` ([`SHIPPED_UNITS`]), so the verifier and the package cannot
//! disagree; a template (`airlock-agent@.service`) is checked for each of
//! its running instances, its specifiers (`%i`, `%n`, ...) expanded.
//!
//! What "matches" means depends on how systemd reports a directive; each
//! row of [`RULES`] names its [`Kind`], and each kind says how it compares
//! (sets compare as sets, sizes and times as numbers, the system call
//! filter as the expanded set of names). Every directive of every shipped
//! unit has a row: verified, or [`Kind::NotVerified`] with the reason (a
//! test holds the table to the unit files).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// A unit file the package installs.
#[derive(Clone, Copy, Debug)]
pub struct ShippedUnit {
    /// Its file name, e.g. `airlock-worker.service` or `airlock-agent@.service`.
    pub name: &'static str,
    /// Its text.
    pub text: &'static str,
}

include!(concat!(env!("OUT_DIR"), "/shipped_units.rs"));

impl ShippedUnit {
    /// A template (`name@.service`), checked per running instance.
    pub fn is_template(&self) -> bool {
        self.name.contains("@.")
    }

    /// The glob `systemctl list-units` takes for its instances.
    pub fn instance_pattern(&self) -> String {
        self.name.replacen("@.", "@*.", 1)
    }

    /// The directives of the file, in order.
    pub fn assignments(&self) -> Vec<Assignment> {
        parse_unit(self.text)
    }
}

/// One `Key=value` line of a unit file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assignment {
    /// `Unit`, `Service`, `Socket`, `Install`.
    pub section: String,
    /// The directive.
    pub key: String,
    /// Its value, continuation lines joined.
    pub value: String,
}

/// The assignments of a unit file: comments (`#`, `;`) skipped, lines
/// ending in a backslash joined with the next, as systemd reads them.
pub fn parse_unit(text: &str) -> Vec<Assignment> {
    let mut out = Vec::new();
    let mut section = String::new();
    let mut pending = String::new();
    for raw in text.lines() {
        let line = raw.trim();
        if pending.is_empty() && (line.starts_with('#') || line.starts_with(';')) {
            continue;
        }
        if let Some(rest) = line.strip_suffix('\\') {
            pending.push_str(rest);
            pending.push(' ');
            continue;
        }
        let full = std::mem::take(&mut pending) + line;
        let full = full.trim();
        if full.is_empty() {
            continue;
        }
        if let Some(name) = full.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
            section = name.to_owned();
            continue;
        }
        if let Some((k, v)) = full.split_once('=') {
            out.push(Assignment {
                section: section.clone(),
                key: k.trim().to_owned(),
                value: v.trim().to_owned(),
            });
        }
    }
    out
}

/// How a directive is compared with what `systemctl show` reports.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    /// One word, the last assignment wins; booleans (`true`, `on`, `1`,
    /// ...) read as `yes`/`no` on both sides (`ProtectSystem=`,
    /// `ProtectHome=` take booleans as well as words). Equal words match.
    Word(&'static str),
    /// A list: assignments add to it, an empty one resets it. Equal sets
    /// match (paths with their `-` or `+` prefix, as systemd shows them).
    Words(&'static str),
    /// An octal mode (`UMask=`): equal numbers match.
    Octal(&'static str),
    /// A time span (`WatchdogSec=60` is shown as `WatchdogUSec=1min`):
    /// equal microseconds match.
    Timespan(&'static str),
    /// A size in bytes with a K/M/G/T suffix (base 1024) or `infinity`.
    Bytes(&'static str),
    /// A count or `infinity` (`TasksMax=`).
    Count(&'static str),
    /// A resource limit `soft:hard` or one value for both, shown as
    /// `LimitX` (hard) and `LimitXSoft`: both must match.
    Rlimit(&'static str),
    /// An errno name, shown as its number (`EPERM` is `1`).
    Errno(&'static str),
    /// A capability set: assignments add, an empty one empties it; shown
    /// in lower case. Equal sets match.
    Capabilities(&'static str),
    /// `RestrictAddressFamilies=`: an allow-list (or a `~` deny-list),
    /// merged across lines, reset by an empty assignment (no restriction).
    /// Same mode and no family allowed beyond the shipped ones match
    /// (as for [`Kind::SystemCalls`]).
    AddressFamilies,
    /// `RestrictNamespaces=`: `yes` (none), `no` (all), a list or a `~`
    /// list, as the set of namespace types allowed. Equal sets match.
    Namespaces,
    /// `SystemCallFilter=`: shown as the expanded set of system call
    /// names. The expected set is built from the shipped lines the way
    /// systemd builds it (an allow-list starts from `@default`; `~` lines
    /// remove; later lines add back), with the groups expanded by this
    /// host's `systemd-analyze syscall-filter`. It matches when the mode
    /// is the same and the effective list allows nothing the shipped one
    /// does not (no extra name on an allow-list, none missing from a
    /// deny-list); each such name is reported. Names of the shipped set
    /// missing from an allow-list are listed but pass: systemd drops the
    /// names its libseccomp does not know (`riscv_hwprobe` and
    /// `uretprobe` with Debian 12's), and a drop-in that only removes
    /// names narrows the filter.
    SystemCalls,
    /// `IPAddressDeny=`/`IPAddressAllow=`: prefixes, `any`, `localhost`,
    /// `link-local`, `multicast` expanded. Equal sets of prefixes match.
    IpPrefixes(&'static str),
    /// A command line (`ExecStart=`): shown as `{ path=… ; argv[]=… ; … }`.
    /// The same argument lists, in order, match.
    Exec(&'static str),
    /// `EnvironmentFile=`: shown as `EnvironmentFiles=PATH (ignore_errors=yes|no)`.
    EnvironmentFiles,
    /// A socket's `ListenStream=` (or `ListenDatagram=`, ...): shown as
    /// `Listen=ADDRESS (Stream)`. The same addresses of that type match.
    Listen(&'static str),
    /// Not checked, for the reason given.
    NotVerified(&'static str),
}

/// One directive and how it is checked.
#[derive(Clone, Copy, Debug)]
pub struct Rule {
    /// The directive as unit files spell it.
    pub directive: &'static str,
    /// How it is compared.
    pub kind: Kind,
}

const fn rule(directive: &'static str, kind: Kind) -> Rule {
    Rule { directive, kind }
}

const DEPENDENCY: &str = "ordering and dependencies, not confinement; systemctl show merges in the dependencies systemd adds itself, so the shipped list cannot be compared";
const TEXT: &str = "text for people, no bearing on confinement";

/// Every directive the verifier knows, with how it is checked.
pub const RULES: &[Rule] = &[
    // [Unit] and [Install]
    rule("Description", Kind::NotVerified(TEXT)),
    rule("Documentation", Kind::NotVerified(TEXT)),
    rule("After", Kind::NotVerified(DEPENDENCY)),
    rule("Before", Kind::NotVerified(DEPENDENCY)),
    rule("Wants", Kind::NotVerified(DEPENDENCY)),
    rule("Requires", Kind::NotVerified(DEPENDENCY)),
    rule("Requisite", Kind::NotVerified(DEPENDENCY)),
    rule("BindsTo", Kind::NotVerified(DEPENDENCY)),
    rule("PartOf", Kind::NotVerified(DEPENDENCY)),
    rule("Conflicts", Kind::NotVerified(DEPENDENCY)),
    rule("WantedBy", Kind::NotVerified(DEPENDENCY)),
    rule("RequiredBy", Kind::NotVerified(DEPENDENCY)),
    rule("Also", Kind::NotVerified(DEPENDENCY)),
    rule("DefaultInstance", Kind::NotVerified(DEPENDENCY)),
    rule("StopWhenUnneeded", Kind::Word("StopWhenUnneeded")),
    rule("RefuseManualStart", Kind::Word("RefuseManualStart")),
    rule("RefuseManualStop", Kind::Word("RefuseManualStop")),
    rule("DefaultDependencies", Kind::Word("DefaultDependencies")),
    rule(
        "StartLimitIntervalSec",
        Kind::Timespan("StartLimitIntervalUSec"),
    ),
    rule("StartLimitBurst", Kind::Count("StartLimitBurst")),
    // How the service runs and is restarted.
    rule("Type", Kind::Word("Type")),
    rule("BusName", Kind::Word("BusName")),
    rule("NotifyAccess", Kind::Word("NotifyAccess")),
    rule("WatchdogSec", Kind::Timespan("WatchdogUSec")),
    rule("ExecStart", Kind::Exec("ExecStart")),
    rule("ExecStartPre", Kind::Exec("ExecStartPre")),
    rule("ExecStartPost", Kind::Exec("ExecStartPost")),
    rule("ExecStop", Kind::Exec("ExecStop")),
    rule("ExecStopPost", Kind::Exec("ExecStopPost")),
    rule("ExecReload", Kind::Exec("ExecReload")),
    rule("Restart", Kind::Word("Restart")),
    rule("RestartSec", Kind::Timespan("RestartUSec")),
    rule("TimeoutStartSec", Kind::Timespan("TimeoutStartUSec")),
    rule("TimeoutStopSec", Kind::Timespan("TimeoutStopUSec")),
    rule("RuntimeMaxSec", Kind::Timespan("RuntimeMaxUSec")),
    rule("KillMode", Kind::Word("KillMode")),
    rule("SendSIGKILL", Kind::Word("SendSIGKILL")),
    rule("OOMPolicy", Kind::Word("OOMPolicy")),
    rule("WorkingDirectory", Kind::Word("WorkingDirectory")),
    rule("Slice", Kind::Word("Slice")),
    rule("EnvironmentFile", Kind::EnvironmentFiles),
    rule("Environment", Kind::Words("Environment")),
    rule("UnsetEnvironment", Kind::Words("UnsetEnvironment")),
    rule("PassEnvironment", Kind::Words("PassEnvironment")),
    rule(
        "LoadCredential",
        Kind::NotVerified(
            "systemctl show prints [unprintable] for credentials (systemd 252); the retry daemon checks its token at start",
        ),
    ),
    rule(
        "SetCredential",
        Kind::NotVerified("systemctl show prints [unprintable] for credentials (systemd 252)"),
    ),
    // Identity.
    rule("User", Kind::Word("User")),
    rule("Group", Kind::Word("Group")),
    rule("DynamicUser", Kind::Word("DynamicUser")),
    rule("SupplementaryGroups", Kind::Words("SupplementaryGroups")),
    rule("UMask", Kind::Octal("UMask")),
    // Directories.
    rule("StateDirectory", Kind::Words("StateDirectory")),
    rule("StateDirectoryMode", Kind::Octal("StateDirectoryMode")),
    rule("RuntimeDirectory", Kind::Words("RuntimeDirectory")),
    rule("RuntimeDirectoryMode", Kind::Octal("RuntimeDirectoryMode")),
    rule("CacheDirectory", Kind::Words("CacheDirectory")),
    rule("CacheDirectoryMode", Kind::Octal("CacheDirectoryMode")),
    rule("LogsDirectory", Kind::Words("LogsDirectory")),
    rule(
        "ConfigurationDirectory",
        Kind::Words("ConfigurationDirectory"),
    ),
    // The filesystem view.
    rule("ReadWritePaths", Kind::Words("ReadWritePaths")),
    rule("ReadOnlyPaths", Kind::Words("ReadOnlyPaths")),
    rule("InaccessiblePaths", Kind::Words("InaccessiblePaths")),
    rule("ExecPaths", Kind::Words("ExecPaths")),
    rule("NoExecPaths", Kind::Words("NoExecPaths")),
    rule("RootDirectory", Kind::Word("RootDirectory")),
    rule("ProtectSystem", Kind::Word("ProtectSystem")),
    rule("ProtectHome", Kind::Word("ProtectHome")),
    rule("PrivateTmp", Kind::Word("PrivateTmp")),
    rule("PrivateDevices", Kind::Word("PrivateDevices")),
    rule("PrivateMounts", Kind::Word("PrivateMounts")),
    rule("ProtectProc", Kind::Word("ProtectProc")),
    rule("ProcSubset", Kind::Word("ProcSubset")),
    rule("DevicePolicy", Kind::Word("DevicePolicy")),
    // Namespaces, network, IPC.
    rule("PrivateNetwork", Kind::Word("PrivateNetwork")),
    rule("PrivateUsers", Kind::Word("PrivateUsers")),
    rule("PrivateIPC", Kind::Word("PrivateIPC")),
    rule("RestrictNamespaces", Kind::Namespaces),
    rule("RestrictAddressFamilies", Kind::AddressFamilies),
    rule("IPAddressDeny", Kind::IpPrefixes("IPAddressDeny")),
    rule("IPAddressAllow", Kind::IpPrefixes("IPAddressAllow")),
    rule("RemoveIPC", Kind::Word("RemoveIPC")),
    rule("KeyringMode", Kind::Word("KeyringMode")),
    // The kernel.
    rule("ProtectKernelTunables", Kind::Word("ProtectKernelTunables")),
    rule("ProtectKernelModules", Kind::Word("ProtectKernelModules")),
    rule("ProtectKernelLogs", Kind::Word("ProtectKernelLogs")),
    rule("ProtectControlGroups", Kind::Word("ProtectControlGroups")),
    rule("ProtectClock", Kind::Word("ProtectClock")),
    rule("ProtectHostname", Kind::Word("ProtectHostname")),
    rule("LockPersonality", Kind::Word("LockPersonality")),
    rule(
        "MemoryDenyWriteExecute",
        Kind::Word("MemoryDenyWriteExecute"),
    ),
    rule("RestrictRealtime", Kind::Word("RestrictRealtime")),
    rule("RestrictSUIDSGID", Kind::Word("RestrictSUIDSGID")),
    rule("NoNewPrivileges", Kind::Word("NoNewPrivileges")),
    rule(
        "CapabilityBoundingSet",
        Kind::Capabilities("CapabilityBoundingSet"),
    ),
    rule(
        "AmbientCapabilities",
        Kind::Capabilities("AmbientCapabilities"),
    ),
    rule("SystemCallFilter", Kind::SystemCalls),
    rule(
        "SystemCallErrorNumber",
        Kind::Errno("SystemCallErrorNumber"),
    ),
    rule(
        "SystemCallArchitectures",
        Kind::Words("SystemCallArchitectures"),
    ),
    // Resources.
    rule("LimitCORE", Kind::Rlimit("LimitCORE")),
    rule("LimitNOFILE", Kind::Rlimit("LimitNOFILE")),
    rule("LimitNPROC", Kind::Rlimit("LimitNPROC")),
    rule("LimitMEMLOCK", Kind::Rlimit("LimitMEMLOCK")),
    rule("LimitFSIZE", Kind::Rlimit("LimitFSIZE")),
    rule("LimitAS", Kind::Rlimit("LimitAS")),
    rule("TasksMax", Kind::Count("TasksMax")),
    rule("MemoryMax", Kind::Bytes("MemoryMax")),
    rule("MemoryHigh", Kind::Bytes("MemoryHigh")),
    rule("MemorySwapMax", Kind::Bytes("MemorySwapMax")),
    rule(
        "CPUQuota",
        Kind::NotVerified(
            "a share of CPU time, not confinement; systemctl show reports it per second (CPUQuotaPerSecUSec)",
        ),
    ),
    // Sockets.
    rule("ListenStream", Kind::Listen("Stream")),
    rule("ListenDatagram", Kind::Listen("Datagram")),
    rule("ListenSequentialPacket", Kind::Listen("SequentialPacket")),
    rule("Accept", Kind::Word("Accept")),
    rule("NoDelay", Kind::Word("NoDelay")),
    rule("SocketUser", Kind::Word("SocketUser")),
    rule("SocketGroup", Kind::Word("SocketGroup")),
    rule("SocketMode", Kind::Octal("SocketMode")),
];

/// The row of `directive`, if the verifier knows it.
pub fn rule_for(directive: &str) -> Option<&'static Rule> {
    RULES.iter().find(|r| r.directive == directive)
}

/// `systemctl show` output: every value of each property (a property may
/// be printed on several lines).
#[derive(Clone, Debug, Default)]
pub struct Shown(BTreeMap<String, Vec<String>>);

impl Shown {
    /// Reads `Key=value` lines.
    pub fn parse(text: &str) -> Shown {
        let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for line in text.lines() {
            if let Some((k, v)) = line.split_once('=') {
                map.entry(k.to_owned()).or_default().push(v.to_owned());
            }
        }
        Shown(map)
    }

    /// The (last) value of a property, `None` when it was not printed.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.last()).map(String::as_str)
    }

    /// Every value printed for a property.
    pub fn all(&self, key: &str) -> &[String] {
        self.0.get(key).map(Vec::as_slice).unwrap_or_default()
    }

    /// Removes a property (tests: a missing field).
    pub fn remove(&mut self, key: &str) {
        self.0.remove(key);
    }

    /// Replaces a property's value (tests: a wrong value).
    pub fn set(&mut self, key: &str, value: &str) {
        self.0.insert(key.to_owned(), vec![value.to_owned()]);
    }
}

/// The system call groups of this host's systemd (`systemd-analyze
/// syscall-filter`): group name (with its `@`) to entries (names and
/// nested groups).
#[derive(Clone, Debug, Default)]
pub struct SyscallGroups(BTreeMap<String, Vec<String>>);

impl SyscallGroups {
    /// Reads `systemd-analyze syscall-filter` output: a line `@group`, then
    /// its entries indented, `#` lines being descriptions or names outside
    /// every group.
    pub fn parse(text: &str) -> SyscallGroups {
        let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut current: Option<String> = None;
        for line in text.lines() {
            if line.trim().is_empty() {
                current = None;
                continue;
            }
            if !line.starts_with(char::is_whitespace) {
                current = line.trim().starts_with('@').then(|| line.trim().to_owned());
                if let Some(g) = &current {
                    map.entry(g.clone()).or_default();
                }
                continue;
            }
            let entry = line.trim();
            if entry.starts_with('#') {
                continue;
            }
            if let Some(g) = &current {
                map.entry(g.clone()).or_default().push(entry.to_owned());
            }
        }
        SyscallGroups(map)
    }

    /// True when no group was read.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The names a group or a name stands for.
    fn expand(&self, item: &str, out: &mut BTreeSet<String>, depth: usize) -> Result<(), String> {
        if let Some(group) = item.strip_prefix('@').map(|_| item) {
            let entries = self
                .0
                .get(group)
                .ok_or_else(|| format!("{group} is not a group this systemd knows"))?;
            if depth > 16 {
                return Err(format!("{group}: groups nested too deep"));
            }
            for e in entries {
                self.expand(e, out, depth + 1)?;
            }
        } else {
            out.insert(item.to_owned());
        }
        Ok(())
    }
}

/// What the verifier needs besides the unit and `systemctl show`.
#[derive(Clone, Debug, Default)]
pub struct Host {
    /// This host's system call groups; empty when `systemd-analyze` could
    /// not be run (then `SystemCallFilter=` fails: it cannot be judged).
    pub syscall_groups: SyscallGroups,
}

/// The verdict on one directive of one unit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// The directive, e.g. `PrivateNetwork`.
    pub property: String,
    /// Whether the effective unit has it as shipped.
    pub ok: bool,
    /// What was found (and, on a failure, what was wanted).
    pub detail: String,
}

/// Directives checked on every service even where its file does not set
/// them, as unset (empty): a drop-in that adds a writable path, an ambient
/// capability or a group widens the unit as surely as one that changes a
/// shipped line.
pub const UNSET_MEANS_EMPTY: &[&str] = &[
    "ReadWritePaths",
    "AmbientCapabilities",
    "SupplementaryGroups",
];

/// A unit's directives grouped: per directive, its values in file order;
/// for a service, [`UNSET_MEANS_EMPTY`] as an empty assignment when unset.
pub fn directives(unit: &ShippedUnit, instance: Option<&str>) -> Vec<(String, Vec<String>)> {
    let mut order: Vec<(String, Vec<String>)> = Vec::new();
    let name = match instance {
        Some(i) => unit.name.replacen("@.", &format!("@{i}."), 1),
        None => unit.name.to_owned(),
    };
    for a in unit.assignments() {
        let value = expand_specifiers(&a.value, &name, instance.unwrap_or(""));
        match order.iter_mut().find(|(k, _)| *k == a.key) {
            Some((_, v)) => v.push(value),
            None => order.push((a.key, vec![value])),
        }
    }
    if unit.name.ends_with(".service") {
        for key in UNSET_MEANS_EMPTY {
            if !order.iter().any(|(k, _)| k == key) {
                order.push(((*key).to_owned(), vec![String::new()]));
            }
        }
    }
    order
}

/// Expands the unit specifiers airlock's units may use: `%i`/`%I` (the
/// instance), `%n` (the full unit name), `%N` (without its type suffix),
/// `%p` (the prefix, before `@`), `%%`. Any other specifier is left as
/// `%?x` so that the comparison fails visibly.
pub fn expand_specifiers(value: &str, unit: &str, instance: &str) -> String {
    let mut out = String::new();
    let mut chars = value.chars();
    let stem = unit.rsplit_once('.').map_or(unit, |(s, _)| s);
    let prefix = stem.split('@').next().unwrap_or(stem);
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('i' | 'I') => out.push_str(instance),
            Some('n') => out.push_str(unit),
            Some('N') => out.push_str(stem),
            Some('p' | 'P') => out.push_str(prefix),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push_str("%?");
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Every verified directive of `unit` against `shown`, in file order. A
/// template's `instance` expands its specifiers.
pub fn verify(
    unit: &ShippedUnit,
    instance: Option<&str>,
    shown: &Shown,
    host: &Host,
) -> Vec<Verdict> {
    directives(unit, instance)
        .into_iter()
        .filter_map(|(key, values)| {
            let rule = rule_for(&key);
            let kind = match rule {
                Some(r) => r.kind,
                None => {
                    return Some(Verdict {
                        property: key,
                        ok: false,
                        detail: "the verifier has no rule for this directive".to_owned(),
                    });
                }
            };
            if let Kind::NotVerified(_) = kind {
                return None;
            }
            let (ok, detail) = match compare(kind, &values, shown, host) {
                Ok(d) => (true, d),
                Err(d) => (false, d),
            };
            Some(Verdict {
                property: key,
                ok,
                detail,
            })
        })
        .collect()
}

/// The `systemctl show` properties the verified directives of `unit` need.
pub fn properties(unit: &ShippedUnit) -> Vec<String> {
    let mut out = BTreeSet::new();
    for (key, _) in directives(unit, None) {
        let Some(rule) = rule_for(&key) else {
            continue;
        };
        for p in shown_names(rule.kind) {
            out.insert(p);
        }
    }
    out.into_iter().collect()
}

/// The properties a kind reads.
pub fn shown_names(kind: Kind) -> Vec<String> {
    match kind {
        Kind::Word(p)
        | Kind::Words(p)
        | Kind::Octal(p)
        | Kind::Timespan(p)
        | Kind::Bytes(p)
        | Kind::Count(p)
        | Kind::Errno(p)
        | Kind::Capabilities(p)
        | Kind::IpPrefixes(p)
        | Kind::Exec(p) => vec![p.to_owned()],
        Kind::Rlimit(p) => vec![p.to_owned(), format!("{p}Soft")],
        Kind::AddressFamilies => vec!["RestrictAddressFamilies".to_owned()],
        Kind::Namespaces => vec!["RestrictNamespaces".to_owned()],
        Kind::SystemCalls => vec!["SystemCallFilter".to_owned()],
        Kind::EnvironmentFiles => vec!["EnvironmentFiles".to_owned()],
        Kind::Listen(_) => vec!["Listen".to_owned()],
        Kind::NotVerified(_) => Vec::new(),
    }
}

/// The shown value of `p`, or the failure "not reported".
fn need<'a>(shown: &'a Shown, p: &str) -> Result<&'a str, String> {
    shown
        .get(p)
        .ok_or_else(|| format!("systemctl show does not report {p}"))
}

fn last(values: &[String]) -> &str {
    values.last().map_or("", String::as_str)
}

/// Compares one directive; `Ok(what was found)` or `Err(why it fails)`.
pub fn compare(
    kind: Kind,
    values: &[String],
    shown: &Shown,
    host: &Host,
) -> Result<String, String> {
    match kind {
        Kind::Word(p) => {
            let want = word(last(values));
            let have = need(shown, p)?;
            if have.is_empty() {
                return Err(format!("unset (want {want})"));
            }
            if word(have) == want {
                Ok(have.to_owned())
            } else {
                Err(format!("{have} (want {want})"))
            }
        }
        Kind::Words(p) => {
            let want = accumulate(values);
            let have: BTreeSet<String> = need(shown, p)?
                .split_whitespace()
                .map(str::to_owned)
                .collect();
            set_diff(&want, &have, "(none)")
        }
        Kind::Octal(p) => {
            let want = octal(last(values)).ok_or_else(|| {
                format!("the shipped value {:?} is not an octal mode", last(values))
            })?;
            let have = need(shown, p)?;
            match octal(have) {
                Some(h) if h == want => Ok(have.to_owned()),
                Some(_) => Err(format!("{have} (want {want:04o})")),
                None => Err(format!("unrecognised value {have:?}")),
            }
        }
        Kind::Timespan(p) => {
            let want = timespan(last(values), true).ok_or_else(|| {
                format!("the shipped value {:?} is not a time span", last(values))
            })?;
            let have = need(shown, p)?;
            match timespan(have, false) {
                Some(h) if h == want => Ok(have.to_owned()),
                Some(_) => Err(format!("{have} (want {})", last(values))),
                None => Err(format!("unrecognised value {have:?}")),
            }
        }
        Kind::Bytes(p) | Kind::Count(p) => {
            let want = bytes(last(values))
                .ok_or_else(|| format!("the shipped value {:?} is not a number", last(values)))?;
            let have = need(shown, p)?;
            match bytes(have) {
                Some(h) if h == want => Ok(have.to_owned()),
                Some(_) => Err(format!("{have} (want {})", last(values))),
                None => Err(format!("unrecognised value {have:?}")),
            }
        }
        Kind::Rlimit(p) => {
            let v = last(values);
            let (soft, hard) = v.split_once(':').unwrap_or((v, v));
            let (Some(soft), Some(hard)) = (bytes(soft), bytes(hard)) else {
                return Err(format!("the shipped value {v:?} is not a limit"));
            };
            let soft_name = format!("{p}Soft");
            let (have_hard, have_soft) = (need(shown, p)?, need(shown, &soft_name)?);
            match (bytes(have_hard), bytes(have_soft)) {
                (Some(h), Some(s)) if h == hard && s == soft => {
                    Ok(format!("{have_soft} (soft), {have_hard} (hard)"))
                }
                (Some(_), Some(_)) => {
                    Err(format!("{have_soft} (soft), {have_hard} (hard); want {v}"))
                }
                _ => Err(format!(
                    "unrecognised value {p}={have_hard:?} {soft_name}={have_soft:?}"
                )),
            }
        }
        Kind::Errno(p) => {
            let v = last(values);
            let want = errno(v).ok_or_else(|| {
                format!("the shipped value {v:?} is not an errno this verifier knows")
            })?;
            let have = need(shown, p)?;
            let got = have.parse::<i32>().ok().or_else(|| errno(have));
            match got {
                Some(h) if h == want => Ok(format!("{have} ({v})")),
                Some(_) => Err(format!("{have} (want {v}, {want})")),
                None => Err(format!("unrecognised value {have:?}")),
            }
        }
        Kind::Capabilities(p) => {
            let mut want = BTreeSet::new();
            for v in values {
                if v.starts_with('~') {
                    return Err(format!(
                        "the shipped value {v:?}: a ~ capability list is not supported by the verifier"
                    ));
                }
                if v.is_empty() {
                    want.clear();
                }
                want.extend(v.split_whitespace().map(str::to_ascii_lowercase));
            }
            let have: BTreeSet<String> = need(shown, p)?
                .split_whitespace()
                .map(str::to_ascii_lowercase)
                .collect();
            set_diff(&want, &have, "(none)")
        }
        Kind::AddressFamilies => {
            let want = filter_set(values, None, |line, out| {
                out.extend(line.split_whitespace().map(str::to_owned));
                Ok(())
            })?;
            let have = need(shown, "RestrictAddressFamilies")?;
            let have = shown_filter(have)
                .ok_or_else(|| "unset: every address family is allowed".to_owned())?;
            filter_diff(&want, &have, "address families")
        }
        Kind::Namespaces => {
            let mut want: BTreeSet<String> =
                ALL_NAMESPACES.iter().map(|s| (*s).to_owned()).collect();
            let mut first = true;
            for v in values {
                let parsed = namespaces(v)
                    .ok_or_else(|| format!("the shipped value {v:?} is not a namespace list"))?;
                if first || v.is_empty() || matches!(word(v).as_str(), "yes" | "no") {
                    want = parsed;
                } else if v.starts_with('~') {
                    want = want.intersection(&parsed).cloned().collect();
                } else {
                    want.extend(parsed);
                }
                first = false;
            }
            let have = need(shown, "RestrictNamespaces")?;
            let Some(have_set) = namespaces(have) else {
                return Err(format!("unrecognised value {have:?}"));
            };
            if have_set == want {
                Ok(have.to_owned())
            } else {
                let show = |s: &BTreeSet<String>| {
                    if s.is_empty() {
                        "none".to_owned()
                    } else {
                        s.iter().cloned().collect::<Vec<_>>().join(" ")
                    }
                };
                Err(format!(
                    "{have}: allows {} (want {})",
                    show(&have_set),
                    show(&want)
                ))
            }
        }
        Kind::SystemCalls => {
            if host.syscall_groups.is_empty() {
                return Err(
                    "cannot expand the shipped groups: `systemd-analyze syscall-filter` gave nothing"
                        .to_owned(),
                );
            }
            // An allow-list of system calls starts from @default.
            let want = filter_set(values, Some("@default"), |line, out| {
                for item in line.split_whitespace() {
                    let name = item.split(':').next().unwrap_or(item);
                    host.syscall_groups.expand(name, out, 0)?;
                }
                Ok(())
            })?;
            let have = need(shown, "SystemCallFilter")?;
            let have = shown_filter(have)
                .ok_or_else(|| "unset: every system call is allowed".to_owned())?;
            let have = (
                have.0,
                have.1
                    .into_iter()
                    .map(|n| n.split(':').next().unwrap_or(&n).to_owned())
                    .collect(),
            );
            filter_diff(&want, &have, "system calls")
        }
        Kind::IpPrefixes(p) => {
            let mut want = BTreeSet::new();
            for v in values {
                if v.is_empty() {
                    want.clear();
                }
                for t in v.split_whitespace() {
                    want.extend(prefixes(t).ok_or_else(|| {
                        format!("the shipped value {t:?} is not an address prefix")
                    })?);
                }
            }
            let have_text = need(shown, p)?;
            let mut have = BTreeSet::new();
            for t in have_text.split_whitespace() {
                have.extend(prefixes(t).ok_or_else(|| format!("unrecognised value {t:?}"))?);
            }
            let fmt = |s: &BTreeSet<(IpAddr, u8)>| -> BTreeSet<String> {
                s.iter().map(|(a, n)| format!("{a}/{n}")).collect()
            };
            set_diff(&fmt(&want), &fmt(&have), "(none)")
        }
        Kind::Exec(p) => {
            let mut want: Vec<String> = Vec::new();
            for v in values {
                if v.is_empty() {
                    want.clear();
                    continue;
                }
                let v = v.trim_start_matches(['-', '@', ':', '+', '!']);
                let args = split_quoted(v)
                    .ok_or_else(|| format!("the shipped command {v:?} has unbalanced quotes"))?;
                want.push(args.join(" "));
            }
            let have: Vec<String> = shown
                .all(p)
                .iter()
                .flat_map(|line| exec_argvs(line))
                .collect();
            if shown.all(p).is_empty() {
                return Err(format!("systemctl show does not report {p}"));
            }
            if have == want {
                Ok(have.join("; "))
            } else {
                Err(format!(
                    "runs {:?} (want {:?})",
                    have.join("; "),
                    want.join("; ")
                ))
            }
        }
        Kind::EnvironmentFiles => {
            let mut want = BTreeSet::new();
            for v in values {
                if v.is_empty() {
                    want.clear();
                    continue;
                }
                let (path, ignore) = match v.strip_prefix('-') {
                    Some(p) => (p, "yes"),
                    None => (v.as_str(), "no"),
                };
                want.insert(format!("{path} (ignore_errors={ignore})"));
            }
            if shown.all("EnvironmentFiles").is_empty() {
                return Err("systemctl show does not report EnvironmentFiles".to_owned());
            }
            let have: BTreeSet<String> = shown
                .all("EnvironmentFiles")
                .iter()
                .filter(|s| !s.is_empty())
                .cloned()
                .collect();
            set_diff(&want, &have, "(none)")
        }
        Kind::Listen(ty) => {
            let mut want = BTreeSet::new();
            for v in values {
                if v.is_empty() {
                    want.clear();
                } else {
                    want.insert(v.clone());
                }
            }
            if shown.all("Listen").is_empty() {
                return Err("systemctl show does not report Listen".to_owned());
            }
            let suffix = format!(" ({ty})");
            let have: BTreeSet<String> = shown
                .all("Listen")
                .iter()
                .filter_map(|l| l.strip_suffix(&suffix))
                .map(str::to_owned)
                .collect();
            set_diff(&want, &have, "(none)")
        }
        Kind::NotVerified(why) => Ok(format!("not verified: {why}")),
    }
}

/// A list directive's values: an empty assignment resets, later ones
/// add. Tokens are split as systemd splits them (quotes removed).
fn accumulate(values: &[String]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for v in values {
        if v.is_empty() {
            out.clear();
            continue;
        }
        match split_quoted(v) {
            Some(words) => out.extend(words),
            None => {
                out.insert(v.clone());
            }
        }
    }
    out
}

/// `Ok(found)` when the sets are equal, else what is extra and missing.
fn set_diff(
    want: &BTreeSet<String>,
    have: &BTreeSet<String>,
    empty: &str,
) -> Result<String, String> {
    let join = |s: &BTreeSet<String>| {
        if s.is_empty() {
            empty.to_owned()
        } else {
            s.iter().cloned().collect::<Vec<_>>().join(" ")
        }
    };
    if want == have {
        return Ok(join(have));
    }
    let extra: BTreeSet<String> = have.difference(want).cloned().collect();
    let missing: BTreeSet<String> = want.difference(have).cloned().collect();
    let mut parts = Vec::new();
    if !missing.is_empty() {
        parts.push(format!("missing {}", join(&missing)));
    }
    if !extra.is_empty() {
        parts.push(format!("not shipped {}", join(&extra)));
    }
    Err(format!("{} (have {})", parts.join("; "), join(have)))
}

/// An allow- or deny-list built as systemd builds `SystemCallFilter=` and
/// `RestrictAddressFamilies=`: the first line sets the mode (`~`: deny),
/// an allow-list of system calls starts from `@default`; then each line
/// adds (or, with `~` on an allow-list, removes); an empty one resets.
type Filter = (bool, BTreeSet<String>);

fn filter_set(
    values: &[String],
    allow_base: Option<&str>,
    mut items: impl FnMut(&str, &mut BTreeSet<String>) -> Result<(), String>,
) -> Result<Filter, String> {
    let mut mode: Option<bool> = None;
    let mut set = BTreeSet::new();
    for v in values {
        if v.is_empty() {
            mode = None;
            set.clear();
            continue;
        }
        let (invert, body) = match v.strip_prefix('~') {
            Some(b) => (true, b),
            None => (false, v.as_str()),
        };
        let allow = match mode {
            Some(a) => a,
            None => {
                if let (false, Some(base)) = (invert, allow_base) {
                    items(base, &mut set)?;
                }
                mode = Some(!invert);
                !invert
            }
        };
        let mut these = BTreeSet::new();
        items(body, &mut these)?;
        if invert != allow {
            set.extend(these);
        } else {
            for t in these {
                set.remove(&t);
            }
        }
    }
    let allow = mode.ok_or_else(|| "the shipped lines reset the list to nothing".to_owned())?;
    Ok((allow, set))
}

/// A shown filter: `~a b` (deny-list) or `a b` (allow-list); `None` when empty.
fn shown_filter(text: &str) -> Option<Filter> {
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    let (allow, body) = match text.strip_prefix('~') {
        Some(b) => (false, b),
        None => (true, text),
    };
    Some((allow, body.split_whitespace().map(str::to_owned).collect()))
}

fn filter_diff(want: &Filter, have: &Filter, what: &str) -> Result<String, String> {
    let mode = |allow: bool| if allow { "allow-list" } else { "deny-list" };
    if want.0 != have.0 {
        return Err(format!(
            "a {} of {} {what} (want a {} of {})",
            mode(have.0),
            have.1.len(),
            mode(want.0),
            want.1.len()
        ));
    }
    // What the effective list allows beyond the shipped one: extra names
    // on an allow-list, names dropped from a deny-list.
    let (wider, narrower): (Vec<String>, Vec<String>) = if want.0 {
        (
            have.1.difference(&want.1).cloned().collect(),
            want.1.difference(&have.1).cloned().collect(),
        )
    } else {
        (
            want.1.difference(&have.1).cloned().collect(),
            have.1.difference(&want.1).cloned().collect(),
        )
    };
    if !wider.is_empty() {
        let verb = if want.0 { "allows" } else { "no longer denies" };
        return Err(format!("{verb} {what} not shipped: {}", wider.join(" ")));
    }
    let n = have.1.len();
    let listed = if n > 8 {
        format!("{} of {n} {what}", mode(have.0))
    } else {
        format!(
            "{} {}",
            mode(have.0),
            have.1.iter().cloned().collect::<Vec<_>>().join(" ")
        )
    };
    Ok(if narrower.is_empty() {
        format!("{listed}, as shipped")
    } else {
        format!(
            "{listed}, nothing beyond the shipped lines ({} of theirs not in effect: {})",
            narrower.len(),
            narrower.join(" ")
        )
    })
}

const ALL_NAMESPACES: &[&str] = &["cgroup", "ipc", "mnt", "net", "pid", "user", "uts"];

/// `RestrictNamespaces=` as the set of namespace types allowed.
fn namespaces(v: &str) -> Option<BTreeSet<String>> {
    let all: BTreeSet<String> = ALL_NAMESPACES.iter().map(|s| (*s).to_owned()).collect();
    match word(v).as_str() {
        "yes" => return Some(BTreeSet::new()),
        "no" | "" => return Some(all),
        _ => {}
    }
    let (invert, body) = match v.strip_prefix('~') {
        Some(b) => (true, b),
        None => (false, v),
    };
    let listed: BTreeSet<String> = body.split_whitespace().map(str::to_owned).collect();
    if !listed.is_subset(&all) {
        return None;
    }
    Some(if invert {
        all.difference(&listed).cloned().collect()
    } else {
        listed
    })
}

/// systemd's booleans as `yes`/`no`; any other word as it is.
fn word(v: &str) -> String {
    match v.trim() {
        "1" | "yes" | "y" | "true" | "t" | "on" => "yes".to_owned(),
        "0" | "no" | "n" | "false" | "f" | "off" => "no".to_owned(),
        other => other.to_owned(),
    }
}

fn octal(v: &str) -> Option<u32> {
    u32::from_str_radix(v.trim(), 8).ok()
}

/// A size or count: digits with an optional K/M/G/T/P/E suffix (base
/// 1024), or `infinity` (`u64::MAX`).
fn bytes(v: &str) -> Option<u64> {
    let v = v.trim();
    if v == "infinity" {
        return Some(u64::MAX);
    }
    let digits = v.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let n: u64 = digits.parse().ok()?;
    let shift = match &v[digits.len()..] {
        "" | "B" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        "P" => 50,
        "E" => 60,
        _ => return None,
    };
    n.checked_mul(1u64 << shift)
}

/// A systemd time span in microseconds (`u64::MAX` for `infinity`). A
/// bare number is seconds in a unit file (`bare_seconds`) and
/// microseconds... never in `systemctl show`, which always names a unit
/// except for `0`.
fn timespan(v: &str, bare_seconds: bool) -> Option<u64> {
    let v = v.trim();
    if v == "infinity" {
        return Some(u64::MAX);
    }
    if let Ok(n) = v.parse::<u64>() {
        return if bare_seconds {
            n.checked_mul(1_000_000)
        } else {
            (n == 0).then_some(0)
        };
    }
    let mut total: u64 = 0;
    let mut rest = v;
    while !rest.is_empty() {
        rest = rest.trim_start();
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| !c.is_alphabetic())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let micros: f64 = match unit {
            "us" | "usec" | "µs" => 1.0,
            "ms" | "msec" => 1e3,
            "" | "s" | "sec" | "second" | "seconds" => 1e6,
            "m" | "min" | "minute" | "minutes" => 60e6,
            "h" | "hr" | "hour" | "hours" => 3600e6,
            "d" | "day" | "days" => 86_400e6,
            "w" | "week" | "weeks" => 604_800e6,
            "M" | "month" | "months" => 2_629_800e6,
            "y" | "year" | "years" => 31_557_600e6,
            _ => return None,
        };
        total = total.checked_add((number * micros).round() as u64)?;
    }
    Some(total)
}

/// The errno numbers a unit may name in `SystemCallErrorNumber=`.
fn errno(name: &str) -> Option<i32> {
    use nix::libc;
    Some(match name.trim() {
        "EPERM" => libc::EPERM,
        "EACCES" => libc::EACCES,
        "ENOSYS" => libc::ENOSYS,
        "EINVAL" => libc::EINVAL,
        "EOPNOTSUPP" | "ENOTSUP" => libc::EOPNOTSUPP,
        "ENOENT" => libc::ENOENT,
        _ => return None,
    })
}

/// One `IPAddressDeny=`/`IPAddressAllow=` token as prefixes.
fn prefixes(t: &str) -> Option<Vec<(IpAddr, u8)>> {
    let named: &[&str] = match t {
        "any" => &["0.0.0.0/0", "::/0"],
        "localhost" => &["127.0.0.0/8", "::1/128"],
        "link-local" => &["169.254.0.0/16", "fe80::/64"],
        "multicast" => &["224.0.0.0/4", "ff00::/8"],
        _ => &[],
    };
    if !named.is_empty() {
        return named.iter().map(|p| prefix(p)).collect();
    }
    prefix(t).map(|p| vec![p])
}

fn prefix(t: &str) -> Option<(IpAddr, u8)> {
    let (addr, len) = match t.split_once('/') {
        Some((a, l)) => (a, Some(l.parse::<u8>().ok()?)),
        None => (t, None),
    };
    let addr: IpAddr = addr.parse().ok()?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let len = len.unwrap_or(max);
    (len <= max).then_some((addr, len))
}

/// Splits a command line as systemd does: whitespace separates words,
/// single and double quotes group them, a backslash escapes the next
/// character. `None` for an unbalanced quote.
pub fn split_quoted(s: &str) -> Option<Vec<String>> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), '\\') | (None, '\\') => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                    in_word = true;
                }
            }
            (Some(_), c) => cur.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            (None, c) => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if quote.is_some() {
        return None;
    }
    if in_word {
        words.push(cur);
    }
    Some(words)
}

/// The `argv[]=` of each `{ path=… ; argv[]=… ; … }` in a shown command.
fn exec_argvs(line: &str) -> Vec<String> {
    line.split("argv[]=")
        .skip(1)
        .filter_map(|rest| rest.split(" ; ").next())
        .map(|a| a.trim().to_owned())
        .collect()
}

//! The rules: every directive the verifier knows, and how each kind of
//! directive is read from `systemctl show`.

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
    rule(
        "TemporaryFileSystem",
        Kind::NotVerified(
            "airlock-egress's empty /etc/airlock: the proxy's lockdown (Landlock) grants it only its routes file whatever the mounts, and what systemctl show prints of a tmpfs's options is not compared yet",
        ),
    ),
    rule(
        "BindReadOnlyPaths",
        Kind::NotVerified(
            "the routes file bound into airlock-egress's empty /etc/airlock: a weaker drop-in could only bind more files in, which the proxy's Landlock rules still do not grant; not compared yet",
        ),
    ),
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

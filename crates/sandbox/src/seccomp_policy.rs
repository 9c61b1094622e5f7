//! The seccomp policy as reviewed data: one row per denied system call (or
//! argument pattern), each with the reason it is denied.
//!
//! Everything not listed is allowed: the filter narrows the kernel's attack
//! surface and closes escape routes that Landlock and the id switch do not
//! cover; it is not the primary filesystem control. Denied calls fail with
//! EPERM, except `clone3`, which fails with ENOSYS so that glibc falls back
//! to `clone(2)`, whose flags the filter can inspect.
//!
//! Argument matches compare 32-bit values (`Dword`) where the kernel reads
//! an `int`, so high bits set by the caller cannot slip past a rule.
//!
//! [`UNIX_PATH_RULES`] are added when Landlock cannot confine pathname UNIX
//! sockets (a kernel below [`LANDLOCK_ABI_UNIX`]): Landlock then checks no
//! `connect(2)` or `sendto(2)` to a socket file, so without these rows a
//! command could talk to every listening socket its uid may write (the
//! system D-Bus, journald, `/dev/log`, ...), whatever its ruleset says.
//! The price: on such kernels a command cannot connect to a UNIX socket at
//! all, even one it serves in its own workspace; `socketpair(2)` streams
//! still work.

/// How a matching call fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deny {
    /// `EPERM`: "you may not".
    Eperm,
    /// `ENOSYS`: "this kernel has no such call" (callers fall back).
    Enosys,
}

/// Which invocations of the call a row denies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum When {
    /// Every invocation.
    Always,
    /// When the 32-bit argument `arg` differs from `value`.
    ArgNe {
        /// Argument index (0-based).
        arg: u8,
        /// The only value allowed.
        value: u32,
    },
    /// When the 32-bit argument `arg` equals `value`.
    ArgEq {
        /// Argument index (0-based).
        arg: u8,
        /// The value denied.
        value: u32,
    },
    /// When the 32-bit argument `arg`, masked with `mask`, equals `value`.
    ArgMaskedEq {
        /// Argument index (0-based).
        arg: u8,
        /// Bits compared.
        mask: u32,
        /// The masked value denied.
        value: u32,
    },
    /// When the 32-bit argument `arg` is none of `values`.
    ArgNotIn {
        /// Argument index (0-based).
        arg: u8,
        /// The only values allowed.
        values: &'static [u32],
    },
    /// When the 64-bit argument `arg` is not zero (a non-NULL pointer).
    ArgNonZero {
        /// Argument index (0-based).
        arg: u8,
    },
    /// When any bit of `mask` is set in the 64-bit argument `arg`.
    ArgAnyBit {
        /// Argument index (0-based).
        arg: u8,
        /// Bits, any of which denies.
        mask: u64,
    },
}

/// One reviewed rule.
#[derive(Clone, Copy, Debug)]
pub struct Rule {
    /// The system call's name.
    pub name: &'static str,
    /// Its number on this architecture.
    pub nr: libc::c_long,
    /// Which invocations are denied.
    pub when: When,
    /// How they fail.
    pub deny: Deny,
    /// Why (one line, for reviewers and the man page).
    pub reason: &'static str,
}

macro_rules! rule {
    ($name:ident, $when:expr, $deny:ident, $reason:literal) => {
        Rule {
            name: stringify!($name),
            nr: paste_sys!($name),
            when: $when,
            deny: Deny::$deny,
            reason: $reason,
        }
    };
}

macro_rules! paste_sys {
    (socket) => {
        libc::SYS_socket
    };
    (socketpair) => {
        libc::SYS_socketpair
    };
    (connect) => {
        libc::SYS_connect
    };
    (ptrace) => {
        libc::SYS_ptrace
    };
    (process_vm_readv) => {
        libc::SYS_process_vm_readv
    };
    (process_vm_writev) => {
        libc::SYS_process_vm_writev
    };
    (pidfd_getfd) => {
        libc::SYS_pidfd_getfd
    };
    (kcmp) => {
        libc::SYS_kcmp
    };
    (mount) => {
        libc::SYS_mount
    };
    (umount2) => {
        libc::SYS_umount2
    };
    (pivot_root) => {
        libc::SYS_pivot_root
    };
    (chroot) => {
        libc::SYS_chroot
    };
    (fsopen) => {
        libc::SYS_fsopen
    };
    (fsconfig) => {
        libc::SYS_fsconfig
    };
    (fsmount) => {
        libc::SYS_fsmount
    };
    (fspick) => {
        libc::SYS_fspick
    };
    (move_mount) => {
        libc::SYS_move_mount
    };
    (open_tree) => {
        libc::SYS_open_tree
    };
    (mount_setattr) => {
        libc::SYS_mount_setattr
    };
    (unshare) => {
        libc::SYS_unshare
    };
    (setns) => {
        libc::SYS_setns
    };
    (clone) => {
        libc::SYS_clone
    };
    (clone3) => {
        libc::SYS_clone3
    };
    (keyctl) => {
        libc::SYS_keyctl
    };
    (add_key) => {
        libc::SYS_add_key
    };
    (request_key) => {
        libc::SYS_request_key
    };
    (bpf) => {
        libc::SYS_bpf
    };
    (perf_event_open) => {
        libc::SYS_perf_event_open
    };
    (io_uring_setup) => {
        libc::SYS_io_uring_setup
    };
    (io_uring_enter) => {
        libc::SYS_io_uring_enter
    };
    (io_uring_register) => {
        libc::SYS_io_uring_register
    };
    (userfaultfd) => {
        libc::SYS_userfaultfd
    };
    (kexec_load) => {
        libc::SYS_kexec_load
    };
    (kexec_file_load) => {
        libc::SYS_kexec_file_load
    };
    (init_module) => {
        libc::SYS_init_module
    };
    (finit_module) => {
        libc::SYS_finit_module
    };
    (delete_module) => {
        libc::SYS_delete_module
    };
    (ioctl) => {
        libc::SYS_ioctl
    };
    (open_by_handle_at) => {
        libc::SYS_open_by_handle_at
    };
    (acct) => {
        libc::SYS_acct
    };
    (swapon) => {
        libc::SYS_swapon
    };
    (swapoff) => {
        libc::SYS_swapoff
    };
    (reboot) => {
        libc::SYS_reboot
    };
    (syslog) => {
        libc::SYS_syslog
    };
    (quotactl) => {
        libc::SYS_quotactl
    };
    (chmod) => {
        libc::SYS_chmod
    };
    (fchmodat) => {
        libc::SYS_fchmodat
    };
    (fchmodat2) => {
        libc::SYS_fchmodat2
    };
    (chown) => {
        libc::SYS_chown
    };
    (lchown) => {
        libc::SYS_lchown
    };
    (fchownat) => {
        libc::SYS_fchownat
    };
    (utime) => {
        libc::SYS_utime
    };
    (utimes) => {
        libc::SYS_utimes
    };
    (futimesat) => {
        libc::SYS_futimesat
    };
    (utimensat) => {
        libc::SYS_utimensat
    };
    (setxattr) => {
        libc::SYS_setxattr
    };
    (lsetxattr) => {
        libc::SYS_lsetxattr
    };
    (removexattr) => {
        libc::SYS_removexattr
    };
    (lremovexattr) => {
        libc::SYS_lremovexattr
    };
    (setxattrat) => {
        SYS_SETXATTRAT
    };
    (removexattrat) => {
        SYS_REMOVEXATTRAT
    };
    (truncate) => {
        libc::SYS_truncate
    };
    (shmget) => {
        libc::SYS_shmget
    };
    (semget) => {
        libc::SYS_semget
    };
    (msgget) => {
        libc::SYS_msgget
    };
    (mq_open) => {
        libc::SYS_mq_open
    };
}

/// setxattrat(2) (Linux 6.13; one number on every architecture since the
/// unified table), not yet in the libc crate.
const SYS_SETXATTRAT: libc::c_long = 463;
/// removexattrat(2) (Linux 6.13).
const SYS_REMOVEXATTRAT: libc::c_long = 466;

/// Namespace-creating clone flags (CLONE_NEWTIME is only valid for unshare
/// and clone3, both denied outright).
pub const CLONE_NAMESPACE_FLAGS: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWCGROUP) as u64;

const AF_UNIX: u32 = libc::AF_UNIX as u32;
const TIOCSTI: u32 = libc::TIOCSTI as u32;
const TIOCLINUX: u32 = libc::TIOCLINUX as u32;

const AF_INET: u32 = libc::AF_INET as u32;
const AF_INET6: u32 = libc::AF_INET6 as u32;

/// What replaces the `socket` row of [`RULES`] for a daemon whose
/// configuration names a server it reaches over TCP (the supervisor with a
/// PostgreSQL task store on another host): UNIX and IP sockets, nothing
/// else. Landlock then still limits TCP to the configured ports.
pub const SOCKET_UNIX_AND_IP: Rule = rule!(
    socket,
    When::ArgNotIn {
        arg: 0,
        values: &[AF_UNIX, AF_INET, AF_INET6]
    },
    Eperm,
    "only AF_UNIX, AF_INET and AF_INET6 sockets: no netlink, packet, vsock or other families"
);

/// The policy. Review every change to this table.
pub const RULES: &[Rule] = &[
    // --- network ---------------------------------------------------------
    rule!(
        socket,
        When::ArgNe {
            arg: 0,
            value: AF_UNIX
        },
        Eperm,
        "only AF_UNIX sockets: no IP, netlink, packet, vsock or other families"
    ),
    rule!(
        socketpair,
        When::ArgNe {
            arg: 0,
            value: AF_UNIX
        },
        Eperm,
        "only AF_UNIX socket pairs"
    ),
    // --- other processes ---------------------------------------------------
    rule!(
        ptrace,
        When::Always,
        Eperm,
        "no tracing or controlling another process"
    ),
    rule!(
        process_vm_readv,
        When::Always,
        Eperm,
        "no reading another process's memory"
    ),
    rule!(
        process_vm_writev,
        When::Always,
        Eperm,
        "no writing another process's memory"
    ),
    rule!(
        pidfd_getfd,
        When::Always,
        Eperm,
        "no stealing another process's file descriptors"
    ),
    rule!(
        kcmp,
        When::Always,
        Eperm,
        "no probing other processes' kernel objects"
    ),
    // --- filesystem view ---------------------------------------------------
    rule!(
        mount,
        When::Always,
        Eperm,
        "no changing the filesystem view"
    ),
    rule!(
        umount2,
        When::Always,
        Eperm,
        "no uncovering what a mount hides"
    ),
    rule!(pivot_root, When::Always, Eperm, "no changing the root"),
    rule!(chroot, When::Always, Eperm, "no changing the root"),
    rule!(
        fsopen,
        When::Always,
        Eperm,
        "new mount API: no creating filesystems"
    ),
    rule!(
        fsconfig,
        When::Always,
        Eperm,
        "new mount API: no configuring filesystems"
    ),
    rule!(
        fsmount,
        When::Always,
        Eperm,
        "new mount API: no creating mounts"
    ),
    rule!(
        fspick,
        When::Always,
        Eperm,
        "new mount API: no reconfiguring mounts"
    ),
    rule!(
        move_mount,
        When::Always,
        Eperm,
        "new mount API: no attaching mounts"
    ),
    rule!(
        open_tree,
        When::Always,
        Eperm,
        "new mount API: no cloning mount trees"
    ),
    rule!(
        mount_setattr,
        When::Always,
        Eperm,
        "new mount API: no changing mount flags"
    ),
    rule!(
        open_by_handle_at,
        When::Always,
        Eperm,
        "opens by file handle, bypassing path checks"
    ),
    // --- namespaces --------------------------------------------------------
    rule!(
        unshare,
        When::Always,
        Eperm,
        "no new namespaces (a user namespace grants capabilities)"
    ),
    rule!(setns, When::Always, Eperm, "no entering other namespaces"),
    rule!(
        clone,
        When::ArgAnyBit {
            arg: 0,
            mask: CLONE_NAMESPACE_FLAGS
        },
        Eperm,
        "fork and threads yes, new namespaces through clone flags no"
    ),
    rule!(
        clone3,
        When::Always,
        Enosys,
        "its flags are in memory the filter cannot read; ENOSYS makes glibc use clone"
    ),
    // --- kernel keyrings ---------------------------------------------------
    rule!(
        keyctl,
        When::Always,
        Eperm,
        "kernel keyrings outlive and reach beyond the sandbox"
    ),
    rule!(
        add_key,
        When::Always,
        Eperm,
        "kernel keyrings outlive and reach beyond the sandbox"
    ),
    rule!(
        request_key,
        When::Always,
        Eperm,
        "kernel keyrings outlive and reach beyond the sandbox"
    ),
    // --- large kernel attack surface --------------------------------------
    rule!(
        bpf,
        When::Always,
        Eperm,
        "BPF programs and maps: a large kernel attack surface"
    ),
    rule!(
        perf_event_open,
        When::Always,
        Eperm,
        "performance counters: side channels and kernel bugs"
    ),
    rule!(
        io_uring_setup,
        When::Always,
        Eperm,
        "io_uring performs I/O seccomp never sees"
    ),
    rule!(
        io_uring_enter,
        When::Always,
        Eperm,
        "io_uring performs I/O seccomp never sees"
    ),
    rule!(
        io_uring_register,
        When::Always,
        Eperm,
        "io_uring performs I/O seccomp never sees"
    ),
    rule!(
        userfaultfd,
        When::Always,
        Eperm,
        "widens kernel race windows for exploits"
    ),
    // --- the machine itself ------------------------------------------------
    rule!(
        kexec_load,
        When::Always,
        Eperm,
        "no replacing the running kernel"
    ),
    rule!(
        kexec_file_load,
        When::Always,
        Eperm,
        "no replacing the running kernel"
    ),
    rule!(
        init_module,
        When::Always,
        Eperm,
        "no loading kernel modules"
    ),
    rule!(
        finit_module,
        When::Always,
        Eperm,
        "no loading kernel modules"
    ),
    rule!(
        delete_module,
        When::Always,
        Eperm,
        "no unloading kernel modules"
    ),
    rule!(reboot, When::Always, Eperm, "no rebooting the machine"),
    rule!(swapon, When::Always, Eperm, "no changing swap"),
    rule!(swapoff, When::Always, Eperm, "no changing swap"),
    rule!(acct, When::Always, Eperm, "no process accounting"),
    rule!(quotactl, When::Always, Eperm, "no changing disk quotas"),
    rule!(
        syslog,
        When::Always,
        Eperm,
        "the kernel log leaks kernel addresses"
    ),
    // --- terminals ---------------------------------------------------------
    rule!(
        ioctl,
        When::ArgEq {
            arg: 1,
            value: TIOCSTI
        },
        Eperm,
        "TIOCSTI would type commands into the caller's terminal"
    ),
    rule!(
        ioctl,
        When::ArgEq {
            arg: 1,
            value: TIOCLINUX
        },
        Eperm,
        "TIOCLINUX can paste the console selection as input"
    ),
];

/// The Landlock ABI whose `LANDLOCK_ACCESS_FS_RESOLVE_UNIX` confines
/// pathname UNIX sockets to the ruleset (Linux 7.1).
pub const LANDLOCK_ABI_UNIX: u8 = 9;

/// `SOCK_TYPE_MASK`: the socket type bits of `socket(2)`'s second argument
/// (the rest are SOCK_CLOEXEC and SOCK_NONBLOCK).
const SOCK_TYPE_MASK: u32 = 0xf;
const SOCK_DGRAM: u32 = libc::SOCK_DGRAM as u32;

/// Added below [`LANDLOCK_ABI_UNIX`]: every socket is AF_UNIX (see
/// [`RULES`]), and these keep it from reaching any socket by path.
pub const UNIX_PATH_RULES: &[Rule] = &[
    rule!(
        connect,
        When::Always,
        Eperm,
        "Landlock below ABI 9 cannot confine connect(2) to a UNIX socket file: the host's would be reachable"
    ),
    rule!(
        socket,
        When::ArgMaskedEq {
            arg: 1,
            mask: SOCK_TYPE_MASK,
            value: SOCK_DGRAM
        },
        Eperm,
        "a datagram socket reaches any socket file with sendto(2), no connect needed"
    ),
    rule!(
        socketpair,
        When::ArgMaskedEq {
            arg: 1,
            mask: SOCK_TYPE_MASK,
            value: SOCK_DGRAM
        },
        Eperm,
        "a datagram pair can sendto(2) any socket file as well"
    ),
];

/// Added when the command shares the host's filesystem view (no minimal
/// root: user namespaces unavailable). Landlock governs no metadata call,
/// so without these rows a command could chmod, chown, utime or set
/// extended attributes of any file its uid owns outside its workspace (the
/// spool's answers, the tree cache). Every call that names a file by path
/// is refused, inside the workspace too; the descriptor-based calls
/// (`fchmod`, `fchown`, `futimens`, `fsetxattr`, `ftruncate`) still work,
/// because they need a descriptor Landlock only grants beneath the
/// workspace, its tmp and root-owned system paths (an `O_PATH` descriptor
/// does not serve them: the kernel answers EBADF).
pub const METADATA_PATH_RULES: &[Rule] = &[
    rule!(
        chmod,
        When::Always,
        Eperm,
        "fallback view: Landlock does not govern chmod, so no mode change by path"
    ),
    rule!(
        fchmodat,
        When::Always,
        Eperm,
        "fallback view: Landlock does not govern chmod, so no mode change by path"
    ),
    rule!(
        fchmodat2,
        When::Always,
        Eperm,
        "fallback view: Landlock does not govern chmod (AT_EMPTY_PATH would serve an O_PATH descriptor)"
    ),
    rule!(
        chown,
        When::Always,
        Eperm,
        "fallback view: Landlock does not govern chown, so no owner change by path"
    ),
    rule!(
        lchown,
        When::Always,
        Eperm,
        "fallback view: Landlock does not govern chown, so no owner change by path"
    ),
    rule!(
        fchownat,
        When::Always,
        Eperm,
        "fallback view: Landlock does not govern chown (AT_EMPTY_PATH would serve an O_PATH descriptor)"
    ),
    rule!(
        utime,
        When::Always,
        Eperm,
        "fallback view: Landlock does not govern timestamps, so none changed by path"
    ),
    rule!(
        utimes,
        When::Always,
        Eperm,
        "fallback view: Landlock does not govern timestamps, so none changed by path"
    ),
    rule!(
        futimesat,
        When::Always,
        Eperm,
        "fallback view: Landlock does not govern timestamps, so none changed by path"
    ),
    rule!(
        utimensat,
        When::ArgNonZero { arg: 1 },
        Eperm,
        "fallback view: timestamps by path refused; futimens (a NULL path) works on an open descriptor"
    ),
    rule!(
        setxattr,
        When::Always,
        Eperm,
        "fallback view: Landlock does not govern extended attributes, so none set by path"
    ),
    rule!(
        lsetxattr,
        When::Always,
        Eperm,
        "fallback view: Landlock does not govern extended attributes, so none set by path"
    ),
    rule!(
        removexattr,
        When::Always,
        Eperm,
        "fallback view: Landlock does not govern extended attributes, so none removed by path"
    ),
    rule!(
        lremovexattr,
        When::Always,
        Eperm,
        "fallback view: Landlock does not govern extended attributes, so none removed by path"
    ),
    rule!(
        setxattrat,
        When::Always,
        Eperm,
        "fallback view: extended attributes by path (or an O_PATH descriptor) refused"
    ),
    rule!(
        removexattrat,
        When::Always,
        Eperm,
        "fallback view: extended attributes by path (or an O_PATH descriptor) refused"
    ),
];

/// Added in the fallback view when Landlock is older than ABI 3, which
/// first governs truncate(2): a truncate by path is refused everywhere.
pub const TRUNCATE_PATH_RULES: &[Rule] = &[rule!(
    truncate,
    When::Always,
    Eperm,
    "fallback view below Landlock ABI 3: truncate(2) by path is not governed by Landlock"
)];

/// Added when the command has no IPC namespace of its own (the executor's
/// commands share the executor's, which is private to it): a System V
/// object or a POSIX message queue would outlive the command and reach the
/// next one. POSIX shared memory and semaphores live in /dev/shm, which in
/// the minimal root is the command's private /tmp.
pub const SHARED_IPC_RULES: &[Rule] = &[
    rule!(
        shmget,
        When::Always,
        Eperm,
        "no IPC namespace of its own: a System V segment would outlive the command"
    ),
    rule!(
        semget,
        When::Always,
        Eperm,
        "no IPC namespace of its own: a System V semaphore set would outlive the command"
    ),
    rule!(
        msgget,
        When::Always,
        Eperm,
        "no IPC namespace of its own: a System V message queue would outlive the command"
    ),
    rule!(
        mq_open,
        When::Always,
        Eperm,
        "no IPC namespace of its own: a POSIX message queue would outlive the command"
    ),
];

/// The Landlock ABI that first governs truncate(2).
pub const LANDLOCK_ABI_TRUNCATE: u8 = 3;

/// Which optional row sets are in force for one command.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Extras {
    /// [`UNIX_PATH_RULES`]: Landlock does not confine pathname UNIX sockets.
    pub unix_paths: bool,
    /// [`METADATA_PATH_RULES`]: the command shares the host's view.
    pub metadata_paths: bool,
    /// [`TRUNCATE_PATH_RULES`]: the host's view and Landlock below ABI 3.
    pub truncate_paths: bool,
    /// [`SHARED_IPC_RULES`]: no IPC namespace per command.
    pub shared_ipc: bool,
    /// A setup's command: [`SOCKET_UNIX_AND_IP`] replaces the `socket`
    /// row and [`UNIX_PATH_RULES`]' `connect` row is left out (its network
    /// namespace holds only `lo`, Landlock lets it connect over TCP to the
    /// forwarder's port alone, and it runs only in the minimal root, whose
    /// view holds no socket file of the host).
    pub ip_sockets: bool,
}

/// The rows in force: [`RULES`], plus [`UNIX_PATH_RULES`] when Landlock
/// does not confine pathname UNIX sockets.
pub fn active(unix_paths: bool) -> impl Iterator<Item = &'static Rule> {
    active_with(Extras {
        unix_paths,
        ..Extras::default()
    })
}

/// The rows in force for `extras`.
pub fn active_with(extras: Extras) -> impl Iterator<Item = &'static Rule> {
    let pick = |on: bool, rows: &'static [Rule]| if on { rows } else { &[] };
    let ip = std::slice::from_ref(&SOCKET_UNIX_AND_IP);
    pick(extras.ip_sockets, ip)
        .iter()
        .chain(
            RULES
                .iter()
                .filter(move |r| !(extras.ip_sockets && r.name == "socket")),
        )
        // A setup's command needs connect(2) for its proxy; it runs only in
        // the minimal root, whose view holds no socket file of the host.
        .chain(
            pick(extras.unix_paths, UNIX_PATH_RULES)
                .iter()
                .filter(move |r| !(extras.ip_sockets && r.name == "connect")),
        )
        .chain(pick(extras.metadata_paths, METADATA_PATH_RULES))
        .chain(pick(extras.truncate_paths, TRUNCATE_PATH_RULES))
        .chain(pick(extras.shared_ipc, SHARED_IPC_RULES))
}

/// x86-64 only: the x32 ABI numbers its calls with bit 30 set, which no rule
/// above matches; all of them fail with ENOSYS.
pub const X32_SYSCALL_BIT: u32 = 0x4000_0000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rule_has_a_reason() {
        let all = Extras {
            unix_paths: true,
            metadata_paths: true,
            truncate_paths: true,
            shared_ipc: true,
            ip_sockets: true,
        };
        for r in active_with(all) {
            assert!(r.reason.len() > 10, "{} needs a reason", r.name);
            assert!(!r.reason.contains('\n'));
        }
    }

    #[test]
    fn required_denials_are_present() {
        for name in [
            "socket",
            "ptrace",
            "process_vm_readv",
            "process_vm_writev",
            "mount",
            "umount2",
            "pivot_root",
            "chroot",
            "unshare",
            "setns",
            "keyctl",
            "add_key",
            "request_key",
            "bpf",
            "perf_event_open",
            "io_uring_setup",
            "io_uring_enter",
            "io_uring_register",
            "userfaultfd",
            "kexec_load",
            "kexec_file_load",
            "init_module",
            "finit_module",
            "delete_module",
            "ioctl",
            "clone3",
        ] {
            assert!(RULES.iter().any(|r| r.name == name), "{name} missing");
        }
    }

    #[test]
    fn only_clone3_answers_enosys() {
        for r in RULES {
            assert_eq!(r.deny == Deny::Enosys, r.name == "clone3", "{}", r.name);
        }
    }

    #[test]
    fn unix_path_rules_deny_connect_and_datagrams() {
        assert!(
            UNIX_PATH_RULES
                .iter()
                .any(|r| r.name == "connect" && r.when == When::Always)
        );
        for name in ["socket", "socketpair"] {
            assert!(UNIX_PATH_RULES.iter().any(|r| r.name == name
                && r.when
                    == When::ArgMaskedEq {
                        arg: 1,
                        mask: 0xf,
                        value: libc::SOCK_DGRAM as u32
                    }));
        }
        assert_eq!(active(false).count(), RULES.len());
        assert_eq!(active(true).count(), RULES.len() + UNIX_PATH_RULES.len());
    }

    #[test]
    fn metadata_rows_cover_every_path_based_metadata_call() {
        let all = Extras {
            unix_paths: true,
            metadata_paths: true,
            truncate_paths: true,
            shared_ipc: true,
            ip_sockets: false,
        };
        for name in [
            "chmod",
            "fchmodat",
            "fchmodat2",
            "chown",
            "lchown",
            "fchownat",
            "utime",
            "utimes",
            "futimesat",
            "utimensat",
            "setxattr",
            "lsetxattr",
            "removexattr",
            "lremovexattr",
            "setxattrat",
            "removexattrat",
            "truncate",
        ] {
            assert!(active_with(all).any(|r| r.name == name), "{name} missing");
            assert!(
                !RULES.iter().any(|r| r.name == name),
                "{name} always denied"
            );
        }
        // futimens (utimensat with a NULL path) stays allowed.
        assert!(
            METADATA_PATH_RULES
                .iter()
                .any(|r| r.name == "utimensat" && r.when == When::ArgNonZero { arg: 1 })
        );
        assert_eq!(
            active_with(all).count(),
            RULES.len()
                + UNIX_PATH_RULES.len()
                + METADATA_PATH_RULES.len()
                + TRUNCATE_PATH_RULES.len()
                + SHARED_IPC_RULES.len()
        );
    }

    #[test]
    fn one_action_per_syscall() {
        let all = Extras {
            unix_paths: true,
            metadata_paths: true,
            truncate_paths: true,
            shared_ipc: true,
            ip_sockets: true,
        };
        for a in active_with(all) {
            for b in active_with(all) {
                if a.nr == b.nr {
                    assert_eq!(a.deny, b.deny, "{}", a.name);
                    assert_eq!(a.name, b.name);
                }
            }
        }
    }
}

//! The hostile verification commands. Each is Python run as
//! `/usr/bin/python3 -c CODE ARGS` (ARGS: JSON with the fixtures' paths,
//! pids, ports and system call numbers), after `from escape_lib import *`.
//!
//! A probe judges itself ([`Judge::SelfReport`]): it exits 0 only when it
//! reached its goal and 1 with a `BLOCKED:` line naming what stopped it.
//! The harness then checks independently that the side effect did not
//! happen (see [`Check`] and the checks every probe gets in `lib.rs`).
//!
//! Every probe names the errnos that mean "blocked" ([`Probe::errnos`]);
//! a failure with any other errno is inconclusive. And every probe says
//! whether it is evidence for the sandbox ([`Evidence::Sandbox`]: the
//! control run, the same command as the same uid in the same namespace
//! with the same fixtures but without the sandbox, must escape) or blocked
//! by the host anyway ([`Evidence::Host`]: the control cannot escape
//! either, for the reason given; such a probe is run and must be blocked,
//! but it is not counted as evidence for the sandbox).

/// How the outcome of a probe is decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Judge {
    /// Exit 1 with `BLOCKED: how` is blocked, exit 0 with `ESCAPED:` is an
    /// escape, anything else is inconclusive. Harness checks apply as well.
    SelfReport,
    /// The command cannot tell (e.g. it must outlive its own run): only the
    /// harness checks decide.
    Harness,
    /// The command must be killed by the timeout (evidence `timed_out`),
    /// and the harness checks must pass.
    Timeout,
    /// A hole this suite knows is open and the sandbox cannot close on this
    /// kernel in this mode; reported on its own line, not counted. See the
    /// suite's documentation for each.
    KnownGap,
}

/// Harness checks specific to one probe (on top of those every probe gets).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// The probe's own outside file kept its content, size, links and mode.
    OwnFileIntact,
    /// The result carries exactly the change set's file with the content
    /// the change set gave it, and no `.git` path.
    ResultIsTheChangeSet,
    /// The shared `keep` file outside is still there after the executor's
    /// clean-up.
    KeepSurvivesCleanup,
    /// The request's tree in the executor's tree cache kept its content,
    /// mode, modification time and attributes.
    TreeCacheIntact,
}

/// What a probe's "blocked" proves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Evidence {
    /// The control (no sandbox) escapes: blocked under the sandbox means
    /// blocked by the sandbox.
    Sandbox,
    /// The control is blocked too, for this reason (a kernel setting, a
    /// permission the probe's non-root uid lacks anyway, the namespace the
    /// executor requires): blocked by the host anyway.
    Host(&'static str),
}

/// One hostile command.
#[derive(Clone, Copy, Debug)]
pub struct Probe {
    /// Unique, short.
    pub name: &'static str,
    /// What the command tries to achieve.
    pub goal: &'static str,
    /// The Python body.
    pub code: &'static str,
    /// How the outcome is decided.
    pub judge: Judge,
    /// timeout_seconds of the verification command.
    pub timeout: u32,
    /// Extra harness checks.
    pub checks: &'static [Check],
    /// Size in MiB of a private tmpfs put under the executor's work root
    /// (standing for a bounded work volume), if any.
    pub work_tmpfs_mib: Option<u64>,
    /// Fixture this probe needs; missing, the probe is skipped, which
    /// fails a root run (see the test).
    pub needs: Option<&'static str>,
    /// The errnos (names, e.g. `EACCES`) that mean blocked; any other
    /// makes the probe inconclusive. Empty only for a probe whose verdict
    /// involves no errno.
    pub errnos: &'static [&'static str],
    /// Whether the control escapes (evidence for the sandbox) or not.
    pub evidence: Evidence,
}

const fn p(name: &'static str, goal: &'static str, code: &'static str) -> Probe {
    Probe {
        name,
        goal,
        code,
        judge: Judge::SelfReport,
        timeout: 30,
        checks: &[],
        work_tmpfs_mib: None,
        needs: None,
        errnos: &[],
        evidence: Evidence::Sandbox,
    }
}

impl Probe {
    const fn judge(mut self, judge: Judge) -> Self {
        self.judge = judge;
        self
    }
    const fn checks(mut self, checks: &'static [Check]) -> Self {
        self.checks = checks;
        self
    }
    const fn timeout(mut self, t: u32) -> Self {
        self.timeout = t;
        self
    }
    const fn tmpfs(mut self, mib: u64) -> Self {
        self.work_tmpfs_mib = Some(mib);
        self
    }
    const fn needs(mut self, what: &'static str) -> Self {
        self.needs = Some(what);
        self
    }
    const fn errnos(mut self, errnos: &'static [&'static str]) -> Self {
        self.errnos = errnos;
        self
    }
    const fn host(mut self, why: &'static str) -> Self {
        self.evidence = Evidence::Host(why);
        self
    }
}

/// Every metadata call Landlock does not govern, on each path of `targets`
/// (a Python expression): chmod, chown (to its own ids: still a change),
/// utime, setxattr, removexattr of the harness's `user.airlock-keep`,
/// truncate, and fchownat(AT_EMPTY_PATH) on an O_PATH descriptor (which
/// Landlock lets a command open anywhere it may look up).
macro_rules! meta_code {
    ($targets:literal) => {
        concat!(
            "targets = ",
            $targets,
            r##"
did, hows = [], []
def opath_chown(path):
    fd = os.open(path, os.O_PATH)
    try:
        sysx("fchownat", fd, "", os.getuid(), os.getgid(), 0x1000)
    finally:
        os.close(fd)
for path in targets:
    name = os.path.basename(path)
    for what, fn in (("chmod", lambda: os.chmod(path, 0o600)),
                     ("chown", lambda: os.chown(path, os.getuid(), os.getgid())),
                     ("utime", lambda: os.utime(path, (0, 0))),
                     ("setxattr", lambda: os.setxattr(path, "user.airlock-pwned", b"1")),
                     ("removexattr", lambda: os.removexattr(path, "user.airlock-keep")),
                     ("truncate", lambda: os.truncate(path, 0)),
                     ("fchownat O_PATH", lambda: opath_chown(path))):
        try:
            fn()
            did.append(f"{what} {name}")
        except OSError as e:
            hows.append(why(f"{what} {name}", e.errno))
if did: escaped("changed metadata outside: " + ", ".join(did))
blocked("; ".join(hows))"##
        )
    };
}

const META_CODE_OUTSIDE: &str = meta_code!(r#"[A["gap_file"]]"#);
const META_CODE_SPOOL: &str = meta_code!(r#"A["spool_answers"]"#);
const META_CODE_CACHE: &str = meta_code!(r#"[A["tree_cache_file"]]"#);

/// Every probe, in the order they are reported.
pub const PROBES: &[Probe] = &[
    // --- reading secrets ---------------------------------------------------
    p("read_etc_shadow", "read /etc/shadow", r##"attempt("open /etc/shadow", lambda: read("/etc/shadow"))"##)
        .errnos(&["EACCES"])
        .host("/etc/shadow is root's, mode 0640: DAC denies any other uid"),
    p("read_worker_state", "read a file in another uid's 0700 state directory",
      r##"attempt("read state secret", lambda: read(A["state_secret"]))"##)
        .errnos(&["EACCES"])
        .host("the state directory is another uid's, mode 0700: DAC denies it"),
    p("list_worker_state", "list another uid's 0700 state directory",
      r##"attempt("list state dir", lambda: os.listdir(A["state_dir"]))"##)
        .errnos(&["EACCES"])
        .host("the state directory is another uid's, mode 0700: DAC denies it"),
    p("read_run_credentials", "read a credential under /run/credentials that DAC lets it read",
      r##"attempt("read " + A["cred_file"], lambda: read(A["cred_file"]))"##)
        .errnos(&["EACCES"]),
    p("list_run_credentials", "list /run/credentials",
      r##"attempt_all([("list /run/credentials", lambda: os.listdir("/run/credentials")),
             ("list unit dir", lambda: os.listdir(os.path.dirname(A["cred_file"])))])"##)
        .errnos(&["EACCES"]),
    p("read_outside_file", "read a world-readable file outside the workspace",
      r##"attempt("read outside secret", lambda: read(A["outside_secret"]))"##)
        .errnos(&["EACCES"]),
    p("read_sibling_workspace", "read another request's workspace (same uid)",
      r##"attempt("read sibling workspace", lambda: read(A["sibling_secret"]))"##)
        .errnos(&["EACCES"]),
    p("list_etc", "enumerate the host's /etc (shadow, ssh, the airlock configuration)",
      r##"try:
    names = os.listdir("/etc")
except OSError as e:
    blocked(why("list /etc", e.errno))
seen = sorted(set(names) & {"shadow", "gshadow", "ssh", "sudoers", "airlock", "machine-id"})
if seen:
    escaped("list /etc: " + ", ".join(seen))
blocked(f"list /etc: only the sandbox's own {len(names)} entries")"##)
        .errnos(&["EACCES"]),
    p("read_devices", "read raw devices and the kernel log",
      r##"attempt_all([(d, lambda d=d: os.read(os.open(d, os.O_RDONLY | os.O_NONBLOCK), 1))
             for d in ("/dev/mem", "/dev/kmem", "/dev/port", "/dev/kmsg", "/dev/vda", "/dev/sda",
                       "/dev/nvme0n1", "/dev/tty", "/dev/console") if os.path.exists(d)])"##)
        .errnos(&["EACCES", "EPERM", "ENXIO"])
        .host("device nodes are root's or a disk group's, /dev/kmsg needs CAP_SYSLOG (dmesg_restrict), /dev/tty needs a controlling terminal"),
    p("inherited_env", "find the executor's environment (a canary) in its own",
      r##"bad = [k for k, v in os.environ.items() if A["canary"] in v]
extra = sorted(set(os.environ) - set(A["allowed_env"]))
if bad or extra:
    escaped(f"canary in {bad}, unexpected {extra}")
blocked("clean environment: " + ",".join(sorted(os.environ)))"##),
    p("inherited_fds", "use a descriptor inherited from the executor or helper",
      r##"extra = []
for fd in range(3, 1024):
    try:
        os.fstat(fd)
        extra.append(fd)
    except OSError:
        pass
if extra:
    escaped(f"open descriptors {extra}")
blocked("only 0, 1 and 2 are open")"##),
    // --- writing outside ---------------------------------------------------
    p("write_outside", "create a file in a world-writable directory outside",
      r##"attempt("create outside file", lambda: write(A["outside"] + "/pwned-write"))"##)
        .errnos(&["EACCES"]),
    p("write_etc", "create a file in /etc",
      r##"attempt("create in /etc", lambda: write("/etc/airlock-pwned-" + A["tok"]))"##)
        .errnos(&["EACCES"])
        .host("/etc is root's, mode 0755: DAC denies any other uid"),
    p("write_host_tmp", "create files in the host's /tmp, /var/tmp, /dev/shm",
      r##"res = []
for d in ("/tmp", "/var/tmp", "/dev/shm"):
    try:
        write(f"{d}/airlock-pwned-{A['tok']}")
        res.append(f"{d}: written in the command's own view")
    except OSError as e:
        res.append(f"{d}: {en(e.errno)}")
planted("; ".join(res))"##)
        .judge(Judge::Harness),
    p("write_via_symlink", "write a file outside through a symlink planted in the workspace",
      r##"os.symlink(A["target"], "link")
attempt("write through ws/link", lambda: write("link"))"##)
        .errnos(&["EACCES"]),
    p("write_via_dir_symlink", "create a file outside through a planted directory symlink",
      r##"os.symlink(A["outside"], "ldir")
attempt("create ldir/pwned-dirlink", lambda: write("ldir/pwned-dirlink"))"##)
        .errnos(&["EACCES"]),
    p("cleanup_symlink_trap", "make the executor's clean-up delete outside files via planted symlinks",
      r##"os.symlink(A["outside"], "trapdir")
os.symlink(A["keep"], "trapfile")
os.symlink(A["outside"], os.path.join(os.environ["TMPDIR"], "trapdir"))
os.makedirs("deep/er")
os.symlink(A["outside"], "deep/er/trap")
planted("symlinks to the outside directory and file")"##)
        .judge(Judge::Harness)
        .checks(&[Check::KeepSurvivesCleanup]),
    p("hardlink_outside", "hard-link a file outside (of its own uid) into the workspace",
      r##"attempt("link own file into ws", lambda: os.link(A["own"], "hl"))"##)
        .checks(&[Check::OwnFileIntact])
        .errnos(&["EXDEV", "EACCES"]),
    p("rename_out", "move a workspace file out of the workspace",
      r##"write("mine")
attempt("rename ws file out", lambda: os.rename("mine", A["outside"] + "/moved-" + A["tok"]))"##)
        .errnos(&["EACCES", "EXDEV"]),
    p("rename_in", "move a file outside (of its own uid) into the workspace",
      r##"attempt("rename own file in", lambda: os.rename(A["own"], "stolen"))"##)
        .checks(&[Check::OwnFileIntact])
        .errnos(&["EACCES", "EXDEV"]),
    p("truncate_outside", "truncate a file outside (of its own uid)",
      r##"attempt("truncate own file", lambda: os.truncate(A["own"], 0))"##)
        .checks(&[Check::OwnFileIntact])
        .errnos(&["EACCES"]),
    p("chmod_foreign", "change the mode of a root-owned file outside",
      r##"attempt("chmod outside secret", lambda: os.chmod(A["outside_secret"], 0o666))"##)
        .errnos(&["EPERM"])
        .host("the file is root's: only its owner or CAP_FOWNER may chmod it"),
    p("git_hooks", "get a .git hook, a config or extra edits into the commit",
      r##"os.makedirs(".git/hooks", exist_ok=True)
write(".git/hooks/pre-commit", b"#!/bin/sh\necho pwned\n")
fd = os.open(".git/hooks/pre-commit", os.O_RDONLY)
os.fchmod(fd, 0o755)
os.close(fd)
write(".git/config", b"[core]\n\thooksPath = .git/hooks\n")
write("hello.py", b"VALUE = 666\n")
write("extra.py", b"smuggled = True\n")
planted(".git hooks and config, edits after the change set")"##)
        .judge(Judge::Harness)
        .checks(&[Check::ResultIsTheChangeSet]),
    p("forge_report", "write the helper's report (to fake the outcome)",
      r##"d = os.path.dirname(os.environ["TMPDIR"])
attempt_all([(f"write {d}/report-0.json", lambda: write(d + "/report-0.json", b"{}")),
             (f"create in {d}", lambda: write(d + "/x"))])"##)
        .errnos(&["EACCES"]),
    p("forge_result", "write the executor's answer file (--out)",
      r##"attempt("write --out", lambda: write(A["out_path"], b"{}"))"##)
        .errnos(&["EACCES"]),
    // --- network -----------------------------------------------------------
    p("tcp_loopback", "TCP to a listener on 127.0.0.1 in the executor's network namespace",
      r##"import socket
attempt("TCP 127.0.0.1", lambda: socket.create_connection(("127.0.0.1", A["ports"]["tcp"]), 3))"##)
        .errnos(&["EPERM"]),
    p("udp_loopback", "UDP to a listener on 127.0.0.1 in the executor's network namespace",
      r##"import socket
attempt("UDP 127.0.0.1", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"udp_loopback", ("127.0.0.1", A["ports"]["udp"])))"##)
        .errnos(&["EPERM"]),
    p("tcp_host_loopback", "TCP to a listener on 127.0.0.1 in the host's network namespace",
      r##"import socket
attempt("TCP host 127.0.0.1", lambda: socket.create_connection(("127.0.0.1", A["ports"]["host_tcp"]), 3))"##)
        .errnos(&["EPERM", "ECONNREFUSED"])
        .host("the executor refuses a network namespace with any interface but lo (its self-check), so the host's loopback is another namespace's (ECONNREFUSED)"),
    p("tcp_peer", "TCP to a listener at another address (a veth peer namespace)",
      r##"import socket
attempt("TCP " + A["peer"], lambda: socket.create_connection((A["peer"], A["ports"]["peer_tcp"]), 3))"##)
        .errnos(&["EPERM", "ENETUNREACH"])
        .host("the executor refuses a network namespace with any interface but lo (its self-check), so no route to any other address can exist (ENETUNREACH)"),
    p("udp_peer", "UDP to a listener at another address (a veth peer namespace)",
      r##"import socket
attempt("UDP " + A["peer"], lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"udp_peer", (A["peer"], A["ports"]["peer_udp"])))"##)
        .errnos(&["EPERM", "ENETUNREACH"])
        .host("the executor refuses a network namespace with any interface but lo (its self-check), so no route to any other address can exist (ENETUNREACH)"),
    p("ipv6", "TCP over AF_INET6 to ::1",
      r##"import socket
attempt("TCP [::1]", lambda: socket.create_connection(("::1", A["ports"]["tcp6"]), 3))"##)
        .errnos(&["EPERM"]),
    p("netlink", "open a netlink socket (routes, interfaces, audit)",
      r##"import socket
attempt_all([(f"AF_NETLINK proto {n}", lambda n=n: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, n)) for n in (0, 9, 15)])"##)
        .errnos(&["EPERM"]),
    p("packet", "open an AF_PACKET socket (sniff or inject frames)",
      r##"import socket
attempt("AF_PACKET", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3)))"##)
        .errnos(&["EPERM"])
        .host("AF_PACKET needs CAP_NET_RAW"),
    p("raw_and_ping", "raw IP and ICMP sockets",
      r##"import socket
attempt_all([("SOCK_RAW ICMP", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)),
             ("ping socket", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP))])"##)
        .errnos(&["EPERM", "EACCES"]),
    p("vsock", "AF_VSOCK to the hypervisor",
      r##"import socket
attempt("AF_VSOCK", lambda: socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM))"##)
        .errnos(&["EPERM"]),
    p("dns", "resolve a name over the network (listeners on 127.0.0.1:53)",
      r##"import socket
try:
    r = socket.getaddrinfo("airlock-escape.example", 80)
except socket.gaierror as e:
    names = {socket.EAI_AGAIN: "EAI_AGAIN", socket.EAI_NONAME: "EAI_NONAME", socket.EAI_FAIL: "EAI_FAIL"}
    blocked(why(f"getaddrinfo ({e})", names.get(e.errno, str(e.errno))))
escaped(f"resolved {r}")"##)
        .errnos(&["EAI_AGAIN"]),
    p("abstract_unix", "connect to an abstract UNIX socket in the executor's namespace",
      r##"import socket
attempt("connect @" + A["abstract"], lambda: socket.socket(socket.AF_UNIX).connect("\0" + A["abstract"]))"##)
        .errnos(&["EPERM"]),
    p("pathname_unix", "connect to a host UNIX socket outside (like the system bus)",
      r##"import socket
attempt("connect " + A["sock"], lambda: socket.socket(socket.AF_UNIX).connect(A["sock"]))"##)
        .errnos(&["EPERM"]),
    p("unix_dgram", "send a datagram to a host UNIX socket outside (like /dev/log)",
      r##"import socket
def pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.sendto(b"unix_dgram pair", A["dgram"])
attempt_all([("sendto " + A["dgram"], lambda: socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b"unix_dgram", A["dgram"])),
             ("socketpair DGRAM sendto", pair)])"##)
        .errnos(&["EPERM"]),
    // --- other processes ---------------------------------------------------
    p("ptrace", "ptrace the marker, the sandbox's init, or itself",
      r##"m = A["marker"]["pid"]
r, e = sc("ptrace", 16, m, 0, 0)
if r == 0: escaped("PTRACE_ATTACH marker")
r2, e2 = sc("ptrace", 0x4206, 1, 0, 0)
if r2 == 0: escaped("PTRACE_SEIZE init")
r3, e3 = sc("ptrace", 0, 0, 0, 0)
if r3 == 0: escaped("PTRACE_TRACEME")
blocked(f"{why('ATTACH marker', e)}; {why('SEIZE init', e2)}; {why('TRACEME', e3)}")"##)
        .errnos(&["EPERM"]),
    p("process_vm_readv", "read the marker's secret from its memory",
      r##"m = A["marker"]
buf = ctypes.create_string_buffer(m["len"])
class iov(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
local, remote = iov(ctypes.addressof(buf), m["len"]), iov(m["addr"], m["len"])
r, e = sc("process_vm_readv", m["pid"], ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
if r > 0 or e == errno.EFAULT:
    escaped(f"reached the marker's memory: {r} {buf.raw!r}")
r2, e2 = sc("process_vm_writev", 1, ctypes.byref(local), 1, ctypes.byref(local), 1, 0)
if r2 > 0: escaped("wrote the init's memory")
blocked(f"{why('readv marker', e)}; {why('writev init', e2)}")"##)
        .errnos(&["EPERM"]),
    p("kill_marker", "signal a process of the same uid outside the sandbox",
      r##"import signal
attempt_all([(f"signal {s} to marker", lambda s=s: os.kill(A["marker"]["pid"], s)) for s in (signal.SIGTERM, signal.SIGUSR1, 0)])"##)
        .errnos(&["EPERM", "ESRCH"]),
    // kill(-1) reports success even when every target refused (EPERM is
    // not reported), so only the harness can tell: the marker, the
    // executor and the helper (all of the same uid) must get nothing.
    p("kill_everything", "kill(-1): signal every process it may",
      r##"import signal
try:
    os.kill(-1, signal.SIGUSR1)
    r = "0"
except OSError as e:
    r = en(e.errno)
planted(f"kill(-1, SIGUSR1) returned {r}")"##)
        .judge(Judge::Harness),
    p("pidfd_marker", "signal the marker or steal its descriptors through a pidfd",
      r##"import signal
fd, e = sc("pidfd_open", A["marker"]["pid"], 0)
if fd < 0: blocked(why("pidfd_open(marker)", e))
r1, e1 = sc("pidfd_send_signal", fd, signal.SIGUSR1, 0, 0)
r2, e2 = sc("pidfd_getfd", fd, 0, 0)
if r1 == 0 or r2 >= 0: escaped(f"pidfd: signal {r1}, getfd {r2}")
blocked(f"pidfd_open ok (same pid namespace); {why('pidfd_send_signal', e1)}; {why('pidfd_getfd', e2)}")"##)
        .errnos(&["EPERM", "ESRCH"]),
    p("proc_environ", "read the marker's /proc/<pid>/environ",
      r##"attempt("read environ", lambda: read(f"/proc/{A['marker']['pid']}/environ"))"##)
        .errnos(&["EACCES"]),
    p("proc_cmdline", "read the marker's /proc/<pid>/cmdline",
      r##"attempt("read cmdline", lambda: read(f"/proc/{A['marker']['pid']}/cmdline"))"##)
        .errnos(&["EACCES"]),
    p("proc_maps", "read the marker's /proc/<pid>/maps and mem",
      r##"attempt_all([(f, lambda f=f: read(f"/proc/{A['marker']['pid']}/{f}")) for f in ("maps", "smaps", "stat")])"##)
        .errnos(&["EACCES"]),
    p("proc_links", "follow the marker's /proc/<pid>/{cwd,root,exe,fd} links",
      r##"pid = A["marker"]["pid"]
attempt_all([(f, lambda f=f: os.readlink(f"/proc/{pid}/{f}")) for f in ("cwd", "root", "exe", "fd/0")]
            + [("listdir fd", lambda: os.listdir(f"/proc/{pid}/fd"))])"##)
        .errnos(&["EACCES"]),
    p("proc_list", "enumerate the host's processes in /proc",
      r##"try:
    pids = [int(x) for x in os.listdir("/proc") if x.isdigit()]
except OSError as e:
    blocked(why("list /proc", e.errno))
if A["marker"]["pid"] in pids:
    escaped(f"list /proc: the marker's pid among {len(pids)}")
blocked(f"list /proc: only the sandbox's own {len(pids)} processes")"##)
        .errnos(&["EACCES"]),
    p("proc_sys_write", "write kernel knobs in /proc and /sys",
      r##"attempt_all([(f, lambda f=f: write(f, b"1")) for f in ("/proc/sysrq-trigger", "/proc/sys/kernel/hostname", "/sys/kernel/uevent_helper", "/proc/self/oom_score_adj") if os.path.exists(f)])"##)
        .errnos(&["EACCES"]),
    // --- kernel surface ----------------------------------------------------
    p("mount", "mount a tmpfs", r##"attempt_sys("mount tmpfs on ws", "mount", "none", os.getcwd(), "tmpfs", 0, 0)"##)
        .errnos(&["EPERM"])
        .host("mount needs CAP_SYS_ADMIN"),
    p("new_mount_api", "fsopen / open_tree / move_mount",
      r##"r1, e1 = sc("fsopen", "tmpfs", 0)
r2, e2 = sc("open_tree", -100, "/", 1)
if r1 >= 0 or r2 >= 0: escaped(f"fsopen {r1}, open_tree {r2}")
blocked(f"{why('fsopen', e1)}; {why('open_tree', e2)}")"##)
        .errnos(&["EPERM"])
        .host("fsopen and open_tree(OPEN_TREE_CLONE) need CAP_SYS_ADMIN"),
    p("chroot_pivot_root", "chroot or pivot_root",
      r##"r1, e1 = sc("chroot", "/")
r2, e2 = sc("pivot_root", ".", ".")
if r1 == 0 or r2 == 0: escaped("changed root")
blocked(f"{why('chroot', e1)}; {why('pivot_root', e2)}")"##)
        .errnos(&["EPERM"])
        .host("chroot needs CAP_SYS_CHROOT, pivot_root CAP_SYS_ADMIN"),
    p("unshare_user", "a user namespace (capabilities inside it)",
      r##"attempt_sys("unshare(CLONE_NEWUSER)", "unshare", 0x10000000)"##)
        .errnos(&["EPERM"]),
    p("unshare_net_mount", "new network and mount namespaces",
      r##"attempt_sys("unshare(CLONE_NEWNET|CLONE_NEWNS)", "unshare", 0x40000000 | 0x20000)"##)
        .errnos(&["EPERM"])
        .host("new network and mount namespaces need CAP_SYS_ADMIN (without a user namespace: that is unshare_user)"),
    p("clone_namespaces", "clone() and clone3() with CLONE_NEWUSER",
      r##"r, e = sc("clone", 0x10000000 | 17, 0, 0, 0, 0)
if r == 0: os._exit(0)
if r > 0: escaped("clone(CLONE_NEWUSER)")
args = (ctypes.c_uint64 * 11)()
args[0], args[4] = 0x10000000, 17
r2, e2 = sc("clone3", ctypes.byref(args), 88)
if r2 == 0: os._exit(0)
if r2 > 0: escaped("clone3(CLONE_NEWUSER)")
blocked(f"{why('clone', e)}; {why('clone3', e2)}")"##)
        .errnos(&["EPERM", "ENOSYS"]),
    p("setns", "enter another namespace",
      r##"fd, _ = sc("pidfd_open", os.getpid(), 0)
attempt_sys("setns(pidfd of self, CLONE_NEWNET)", "setns", fd if fd >= 0 else 0, 0x40000000)"##)
        .errnos(&["EPERM"])
        .host("setns needs CAP_SYS_ADMIN"),
    p("keyctl", "kernel keyrings",
      r##"r1, e1 = sc("keyctl", 1, 0)
r2, e2 = sc("add_key", "user", "airlock-escape", "x", 1, -3)
r3, e3 = sc("request_key", "user", "airlock-escape", 0, -3)
if r1 >= 0 or r2 >= 0 or r3 >= 0: escaped(f"keyrings {r1} {r2} {r3}")
blocked(f"{why('keyctl', e1)}; {why('add_key', e2)}; {why('request_key', e3)}")"##)
        .errnos(&["EPERM"]),
    p("bpf", "create a BPF map",
      r##"attr = (ctypes.c_uint32 * 32)()
attr[0], attr[1], attr[2], attr[3] = 2, 4, 4, 1
attempt_sys("bpf(BPF_MAP_CREATE)", "bpf", 0, ctypes.byref(attr), 128)"##)
        .errnos(&["EPERM"])
        .host("kernel.unprivileged_bpf_disabled is set"),
    p("perf_event_open", "open a performance counter on itself",
      r##"import struct
attr = ctypes.create_string_buffer(128)
struct.pack_into("IIQ", attr, 0, 1, 128, 0)
struct.pack_into("Q", attr, 40, (1 << 5) | (1 << 6))
attempt_sys("perf_event_open(cpu-clock, self)", "perf_event_open", ctypes.byref(attr), 0, -1, -1, 0)"##)
        .errnos(&["EPERM", "EACCES"]),
    p("io_uring", "set up an io_uring",
      r##"params = ctypes.create_string_buffer(120)
attempt_sys("io_uring_setup", "io_uring_setup", 4, ctypes.byref(params))"##)
        .errnos(&["EPERM"]),
    p("userfaultfd", "create a userfaultfd",
      r##"r1, e1 = sc("userfaultfd", 0o2000000 | 1)
r2, e2 = sc("userfaultfd", 0o2000000)
if r1 >= 0 or r2 >= 0: escaped("userfaultfd")
blocked(f"{why('user-mode-only', e1)}; {why('default', e2)}")"##)
        .errnos(&["EPERM"]),
    p("tiocsti", "push characters into a terminal's input (TIOCSTI, TIOCLINUX)",
      r##"import fcntl, termios
attempt_all([(f"{n} on fd {fd}", lambda fd=fd, req=req: fcntl.ioctl(fd, req, b"x"))
             for fd in (0, 1, 2) for n, req in (("TIOCSTI", termios.TIOCSTI), ("TIOCLINUX", 0x541C))]
            + [("open /dev/tty", lambda: os.open("/dev/tty", os.O_RDWR)), ("openpty", os.openpty)])"##)
        .errnos(&["EPERM", "EACCES", "ENOTTY", "ENXIO", "EIO"]),
    p("syslog", "read the kernel log with syslog(2)",
      r##"buf = ctypes.create_string_buffer(4096)
attempt_sys("syslog(READ_ALL)", "syslog", 3, buf, 4096)"##)
        .errnos(&["EPERM"])
        .host("kernel.dmesg_restrict is set: syslog(2) needs CAP_SYSLOG"),
    p("kernel_modules", "load a kernel module or a new kernel",
      r##"r1, e1 = sc("finit_module", 0, "", 0)
r2, e2 = sc("init_module", 0, 0, "")
r3, e3 = sc("kexec_load", 0, 0, 0, 0)
if 0 in (r1, r2, r3): escaped("module or kexec")
blocked(f"{why('finit_module', e1)}; {why('init_module', e2)}; {why('kexec_load', e3)}")"##)
        .errnos(&["EPERM", "ENOSYS"])
        .host("modules and kexec need CAP_SYS_MODULE and CAP_SYS_BOOT (ENOSYS: a kernel without module support)"),
    p("x32_syscall", "reach filtered calls through the x32 ABI numbering",
      r##"attempt_sys("x32 socket(AF_INET)", "x32_socket", 2, 1, 0)"##)
        .errnos(&["ENOSYS"])
        .host("this kernel does not enable the x32 ABI"),
    p("open_by_handle", "open /etc/shadow by file handle, bypassing path checks",
      r##"fh = ctypes.create_string_buffer(8 + 128)
ctypes.c_uint32.from_buffer(fh).value = 128
mnt = ctypes.c_int(0)
r1, e1 = sc("name_to_handle_at", -100, "/etc/shadow", fh, ctypes.byref(mnt), 0)
dirfd = os.open("/usr", os.O_RDONLY)
attempt_sys(f"open_by_handle_at (name_to_handle_at: {r1} {en(e1)})", "open_by_handle_at", dirfd, fh, 0)"##)
        .errnos(&["EPERM"])
        .host("open_by_handle_at needs CAP_DAC_READ_SEARCH"),
    p("hardware_and_clock", "port I/O, setting the clock, the host name",
      r##"import time, socket
attempt_all([("iopl(3)", lambda: sysx("iopl", 3)),
             ("clock_settime", lambda: time.clock_settime(time.CLOCK_REALTIME, time.time())),
             ("sethostname", lambda: socket.sethostname("pwned"))])"##)
        .errnos(&["EPERM", "ENOSYS"])
        .host("iopl, clock_settime and sethostname need capabilities"),
    // --- privileges --------------------------------------------------------
    p("setuid_binary", "gain euid 0 through a setuid-root binary",
      r##"import subprocess
try:
    out = subprocess.run([A["suid_id"], "-u"], capture_output=True, text=True)
except OSError as e:
    blocked(why("exec", e.errno))
if out.stdout.strip() == "0": escaped("setuid-root id ran with euid 0")
blocked(f"setuid-root id ran with euid {out.stdout.strip()} (no_new_privs)")"##)
        .needs("suid_id")
        .errnos(&["EPERM"]),
    p("file_capabilities", "gain CAP_SETUID through a binary with file capabilities",
      r##"import subprocess
try:
    out = subprocess.run([A["caps_setpriv"], "--reuid=0", "--regid=0", "--clear-groups", "/usr/bin/id", "-u"], capture_output=True, text=True)
except OSError as e:
    blocked(why("exec", e.errno))
if out.returncode == 0 and out.stdout.strip() == "0": escaped("became uid 0")
blocked(f"setpriv with cap_setuid+ep failed: {out.stderr.strip()[-80:]}")"##)
        .needs("caps_setpriv")
        .errnos(&["EPERM"]),
    p("setuid_root", "become root with setuid/setgid/setgroups",
      r##"attempt_all([("setuid(0)", lambda: os.setuid(0)), ("setgid(0)", lambda: os.setgid(0)), ("setgroups([0])", lambda: os.setgroups([0]))])"##)
        .errnos(&["EPERM", "EINVAL"])
        .host("a non-root uid without CAP_SETUID cannot become root (EINVAL: uid 0 is not mapped in the helper's user namespace)"),
    p("capabilities", "hold any capability",
      r##"hdr = (ctypes.c_uint32 * 2)(0x20080522, 0)
data = (ctypes.c_uint32 * 6)()
r, e = sc("capget", ctypes.byref(hdr), ctypes.byref(data))
if r < 0: escaped(f"capget failed {en(e)}")
if any(data): escaped(f"capabilities {list(data)}")
blocked("effective, permitted and inheritable sets are empty")"##)
        .host("a non-root uid started by setpriv holds no capability"),
    p("raise_rlimits", "raise its resource limits",
      r##"import resource
hows = []
for n in ("RLIMIT_NPROC", "RLIMIT_AS", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_CPU"):
    try:
        resource.setrlimit(getattr(resource, n), (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    except ValueError:  # Python's word for the kernel's EPERM
        hows.append(why(n, errno.EPERM))
        continue
    except OSError as e:
        hows.append(why(n, e.errno))
        continue
    escaped(f"raised {n}")
blocked("hard limits: " + "; ".join(hows))"##)
        .errnos(&["EPERM"]),
    // --- resources ---------------------------------------------------------
    p("fork_bomb", "run 2000 processes",
      r##"import time
n = 0
try:
    while n < 2000:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        n += 1
except OSError as e:
    blocked(why(f"fork #{n + 1}", e.errno) + " (RLIMIT_NPROC)")
escaped(f"{n} processes")"##)
        .errnos(&["EAGAIN"]),
    p("thread_bomb", "run 5000 threads",
      r##"import threading, time
n = 0
try:
    while n < 5000:
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
        n += 1
except RuntimeError as e:
    blocked(f"thread #{n + 1}: {e} (RLIMIT_NPROC)")
escaped(f"{n} threads")"##),
    p("memory_bomb", "map 6 GiB in one process",
      r##"import mmap
# MAP_NORESERVE (0x4000): the host's overcommit heuristic does not refuse
# it, so only RLIMIT_AS can; untouched, it costs the host no memory.
try:
    m = mmap.mmap(-1, 6 << 30, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x4000)
except OSError as e:
    blocked(why("mmap 6 GiB", e.errno) + " (RLIMIT_AS)")
escaped("mapped 6 GiB")"##)
        .errnos(&["ENOMEM"]),
    p("disk_fill_one_file", "write one 400 MiB file",
      r##"chunk, n = b"\0" * (1 << 20), 0
try:
    with open("big", "wb") as f:
        while n < 400:
            f.write(chunk)
            n += 1
except OSError as e:
    os.remove("big")
    blocked(why(f"after {n} MiB", e.errno) + " (RLIMIT_FSIZE)")
escaped(f"wrote a {n} MiB file")"##)
        .errnos(&["EFBIG"]),
    p("disk_fill_many_files", "write 256 MiB in many files",
      r##"import glob
chunk, n, i = b"\0" * (1 << 20), 0, 0
try:
    while n < 256:
        with open(f"fill-{i}", "wb") as f:
            for _ in range(8):
                f.write(chunk)
                n += 1
        i += 1
except OSError as e:
    for f in glob.glob("fill-*"):
        os.remove(f)
    blocked(why(f"after {n} MiB in {i + 1} files", e.errno) + " (the work volume is full)")
escaped(f"wrote {n} MiB")"##)
        .tmpfs(96)
        .errnos(&["ENOSPC"])
        .host("the work volume (a 96 MiB tmpfs here, as in the test both runs share) is full without the sandbox too"),
    p("outlive_timeout", "keep running past the command's timeout, ignoring SIGTERM",
      r##"import signal, time
for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
    signal.signal(s, signal.SIG_IGN)
if os.fork() == 0:
    os.setsid()
    time.sleep(120)
    os._exit(0)
time.sleep(120)
escaped("still running")"##)
        .judge(Judge::Timeout)
        .timeout(2),
    p("daemonize", "leave a daemon running after the command exits",
      r##"import time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for fd in (0, 1, 2):
            os.close(fd)
        time.sleep(120)
        os._exit(0)
    os._exit(0)
time.sleep(0.3)
planted("a double-forked, setsid daemon")"##)
        .judge(Judge::Harness),
    // --- metadata: what Landlock does not govern ---------------------------
    p("metadata_outside", "chmod/chown/utime/set and remove xattrs/truncate a file outside that its uid owns",
      META_CODE_OUTSIDE)
        .errnos(&["EPERM", "EACCES"]),
    p("metadata_spool", "the same on another request's answers in the spool (owned by the executor's uid)",
      META_CODE_SPOOL)
        .errnos(&["EPERM", "EACCES"]),
    p("metadata_tree_cache", "the same on the executor's tree cache (the request's own source tree, owned by its uid)",
      META_CODE_CACHE)
        .checks(&[Check::TreeCacheIntact])
        .errnos(&["EPERM", "EACCES"]),
    // --- the repository's symbolic links (the workspace has them as the tree does) ---
    p("symlink_outside", "read a host file through the tree's links to it (absolute, and a ../ chain past the root)",
      r##"attempt_all([(f"read {l}", lambda l=l: read(l)) for l in links_present(("links/outside_abs", "links/outside_up"))])"##)
        .errnos(&["EACCES"]),
    p("symlink_shadow", "read /etc/shadow through the tree's links to it (absolute, and a ../ chain)",
      r##"attempt_all([(f"read {l}", lambda l=l: read(l)) for l in links_present(("links/shadow_abs", "links/shadow_up"))])"##)
        .errnos(&["EACCES"])
        .host("/etc/shadow is root:shadow 0640: the probe's uid cannot read it either"),
    p("symlink_spool", "read and overwrite another request's spool answer through the tree's links (absolute, ../ chain, relative)",
      r##"ls = links_present(("links/spool_abs", "links/spool_up", "links/spool_rel"))
attempt_all([(f"read {l}", lambda l=l: read(l)) for l in ls]
            + [(f"write {l}", lambda l=l: write(l, b"{}")) for l in ls])"##)
        .errnos(&["EACCES"]),
    p("symlink_tree_cache", "write the executor's tree cache and its blob store through the tree's links to them (absolute, ../ chain, relative)",
      r##"import hashlib
entry = A["tree_cache_file"].split("/trees/", 1)[1]
blob = hashlib.sha1(b"blob 10\0VALUE = 1\n").hexdigest()
links_present(("links/trees_abs", "links/trees_up", "links/trees_rel",
               "links/blobs_abs", "links/blobs_up", "links/blobs_rel"))
attempt_all([(f"write {l}/{entry}", lambda l=l: write(f"{l}/{entry}", b"VALUE = 666\n"))
             for l in ("links/trees_abs", "links/trees_up", "links/trees_rel")]
            + [(f"write {l}/{blob}", lambda l=l: write(f"{l}/{blob}", b"VALUE = 666\n"))
               for l in ("links/blobs_abs", "links/blobs_up", "links/blobs_rel")]
            + [(f"create in {l}", lambda l=l: write(f"{l}/planted"))
               for l in ("links/trees_abs", "links/blobs_abs")])"##)
        .checks(&[Check::TreeCacheIntact])
        .errnos(&["EACCES"]),
];

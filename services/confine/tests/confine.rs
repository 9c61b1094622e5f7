//! Scenario tests that really run `airlock-confine` on this kernel: real
//! namespaces, a real uid switch, real Landlock and seccomp.
//!
//! Most need root (to switch to a distinct uid) and skip otherwise. Each
//! test runs its sandbox under its own uid, because RLIMIT_NPROC counts
//! processes per uid system-wide and the tests run in parallel.

use std::ffi::OsStr;
use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_airlock-confine");
const EPERM: i64 = libc::EPERM as i64;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Fails the test when not root (it switches to distinct uids): a test
/// of the sandbox must not pass without checking it.
macro_rules! require_root {
    () => {
        assert!(
            is_root(),
            "this test of airlock-confine needs root (it runs commands as distinct uids); CI runs the tests as root: run this one as root (sudo), it fails rather than pass without checking"
        );
    };
}

/// A scratch area under /var/tmp (not /tmp, which the sandbox replaces by
/// a private tmpfs): `ws` is owned by the test's uid, the rest by root.
struct Scratch {
    dir: tempfile::TempDir,
    uid: u32,
}

impl Scratch {
    fn new(uid: u32) -> Scratch {
        Scratch::new_in("/var/tmp", uid)
    }

    fn new_in(parent: &str, uid: u32) -> Scratch {
        let dir = tempfile::Builder::new()
            .prefix("airlock-confine-test-")
            .tempdir_in(parent)
            .unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let s = Scratch { dir, uid };
        s.owned_dir("ws");
        s
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn ws(&self) -> PathBuf {
        self.path("ws")
    }

    /// A directory the test uid may write by DAC (so only Landlock stops it).
    fn owned_dir(&self, rel: &str) -> PathBuf {
        let p = self.path(rel);
        fs::create_dir_all(&p).unwrap();
        std::os::unix::fs::chown(&p, Some(self.uid), Some(self.uid)).unwrap();
        p
    }

    fn report_path(&self) -> PathBuf {
        self.path("report.json")
    }

    /// Runs the helper as the test uid with the workspace as --rw.
    fn run(&self, extra: &[&str], command: &[&str]) -> Run {
        let uid = self.uid.to_string();
        let mut args: Vec<&OsStr> = vec!["--uid".as_ref(), uid.as_ref(), "--rw".as_ref()];
        let ws = self.ws();
        args.push(ws.as_os_str());
        let report = self.report_path();
        args.extend([OsStr::new("--report"), report.as_os_str()]);
        args.extend(extra.iter().map(OsStr::new));
        args.push("--".as_ref());
        args.extend(command.iter().map(OsStr::new));
        run_helper(Command::new(BIN).args(args), &report)
    }
}

struct Run {
    status: i32,
    stdout: String,
    stderr: String,
    report: Value,
    elapsed: Duration,
}

fn run_helper(cmd: &mut Command, report: &Path) -> Run {
    let _ = fs::remove_file(report);
    let start = Instant::now();
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    let elapsed = start.elapsed();
    let report = fs::read(report)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null);
    Run {
        status: out
            .status
            .code()
            .expect("the helper itself is never killed by a signal"),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        report,
        elapsed,
    }
}

impl Run {
    fn ok(&self) -> &Self {
        assert_eq!(
            self.status, 0,
            "stdout:\n{}\nstderr:\n{}",
            self.stdout, self.stderr
        );
        self
    }

    /// Lines "name value" printed by a probe, as a lookup.
    fn value(&self, name: &str) -> i64 {
        self.stdout
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or_else(|| panic!("probe printed no {name}:\n{}\n{}", self.stdout, self.stderr))
    }
}

/// Pids of host processes running as `uid`.
fn processes_of(uid: u32) -> Vec<u32> {
    fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
                s.lines().any(|l| {
                    l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some(&uid.to_string())
                })
            })
        })
        .collect()
}

/// Pids of host processes whose command line contains `marker`.
fn processes_with(marker: &str) -> Vec<u32> {
    fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
        })
        .collect()
}

fn assert_nothing_left(run: &Run, uid: u32) {
    assert_eq!(run.report["survivors"], 0, "{}", run.report);
    assert_eq!(
        processes_of(uid),
        Vec::<u32>::new(),
        "processes of uid {uid} survived"
    );
}

/// Python prelude: `sc(nr, *args)` makes a raw system call and returns 0 or
/// the errno.
const PY: &str = r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sc(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return 0 if r >= 0 else ctypes.get_errno()
"#;

fn py(body: &str) -> String {
    format!("{PY}\n{body}")
}

// ---------------------------------------------------------------------------
// ids, capabilities, no_new_privs, seccomp mode

#[test]
fn runs_as_the_requested_ids_with_no_other_groups() {
    require_root!();
    let s = Scratch::new(61001);
    let r = s.run(&[], &["sh", "-c", "id -u; id -g; id -G"]);
    r.ok();
    assert_eq!(r.stdout, "61001\n61001\n61001\n");
    assert_eq!(r.report["uid"], 61001);
    assert_nothing_left(&r, 61001);
}

#[test]
fn proc_status_shows_no_new_privs_seccomp_and_no_capabilities() {
    require_root!();
    let s = Scratch::new(61002);
    let r = s.run(&[], &["cat", "/proc/self/status"]);
    r.ok();
    let field = |name: &str| {
        r.stdout
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .unwrap_or_else(|| panic!("{name} missing"))
            .trim()
            .to_owned()
    };
    assert_eq!(field("NoNewPrivs"), "1");
    assert_eq!(field("Seccomp"), "2");
    for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(field(cap), "0000000000000000", "{cap}");
    }
    let rep = &r.report;
    assert_eq!(rep["schema"], "airlock.confine.report/2");
    assert_eq!(rep["view"], "minimal-root");
    assert_eq!(rep["seccomp"], true);
    assert_eq!(rep["no_new_privs"], true);
    assert_eq!(rep["capabilities_dropped"], true);
    assert_eq!(rep["degraded"], false);
    assert_eq!(rep["landlock"]["status"], "full");
    assert!(rep["landlock"]["kernel_abi"].as_i64().unwrap() >= 1);
    for ns in [
        "pid", "ipc", "uts", "net", "mount", "proc", "tmp", "shm", "root",
    ] {
        assert_eq!(rep["namespaces"][ns], true, "namespace {ns}: {rep}");
    }
    assert_eq!(
        rep["namespaces"]["user"], false,
        "root needs no user namespace"
    );
    assert_eq!(
        rep["outcome"],
        serde_json::json!({"kind": "exited", "code": 0})
    );
}

#[test]
fn uid_0_keeps_no_capability_and_cannot_read_secrets() {
    require_root!();
    let s = Scratch::new(0);
    let r = s.run(
        &["--gid", "0"],
        &[
            "sh",
            "-c",
            "id -u; grep CapEff /proc/self/status; cat /etc/shadow; ls /root",
        ],
    );
    assert_ne!(r.status, 0);
    assert!(
        r.stdout.starts_with("0\nCapEff:\t0000000000000000\n"),
        "{}",
        r.stdout
    );
    // In the minimal root neither exists; in the host view Landlock refuses.
    assert!(
        r.stderr.contains("/etc/shadow: No such file or directory"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("/root"), "{}", r.stderr);
    let host = s.run(
        &["--gid", "0", "--no-namespaces"],
        &["sh", "-c", "id -u; cat /etc/shadow"],
    );
    assert_ne!(host.status, 0);
    assert!(
        host.stderr.contains("/etc/shadow: Permission denied"),
        "{}",
        host.stderr
    );
}

// ---------------------------------------------------------------------------
// Landlock

#[test]
fn writes_only_inside_rw_and_reads_only_granted_paths() {
    require_root!();
    let s = Scratch::new(61003);
    let outside = s.owned_dir("outside");
    let ro = s.owned_dir("ro");
    fs::write(ro.join("data"), "ro-data").unwrap();
    let body = format!(
        r#"
def attempt(name, f):
    try:
        f(); print(name, 0)
    except OSError as e:
        print(name, e.errno)
attempt("write_ws", lambda: open("{ws}/f", "w").write("x"))
attempt("mkdir_ws", lambda: os.mkdir("{ws}/d"))
attempt("write_outside", lambda: open("{outside}/f", "w").write("x"))
attempt("mkdir_outside", lambda: os.mkdir("{outside}/d"))
attempt("write_ro", lambda: open("{ro}/f", "w").write("x"))
attempt("read_ro", lambda: open("{ro}/data").read())
attempt("list_outside", lambda: os.listdir("{outside}"))
attempt("read_shadow", lambda: open("/etc/shadow").read())
attempt("read_home", lambda: os.listdir("/home"))
attempt("write_dev_null", lambda: open("/dev/null", "w").write("x"))
"#,
        ws = s.ws().display(),
        outside = outside.display(),
        ro = ro.display()
    );
    let ro_arg = ro.to_str().unwrap();
    let (enoent, eacces, erofs) = (
        i64::from(libc::ENOENT),
        i64::from(libc::EACCES),
        i64::from(libc::EROFS),
    );
    // The minimal root: what is not granted does not exist; what is bound
    // read-only is a read-only mount (EROFS) as well as Landlock's (EACCES).
    let r = s.run(&["--ro", ro_arg], &["python3", "-c", &py(&body)]);
    r.ok();
    assert_eq!(r.report["view"], "minimal-root");
    assert_eq!(r.value("write_ws"), 0);
    assert_eq!(r.value("mkdir_ws"), 0);
    assert_eq!(r.value("write_outside"), enoent);
    assert_eq!(r.value("mkdir_outside"), enoent);
    assert!(
        [eacces, erofs].contains(&r.value("write_ro")),
        "{}",
        r.stdout
    );
    assert_eq!(r.value("read_ro"), 0);
    assert_eq!(r.value("list_outside"), enoent);
    assert_eq!(r.value("read_shadow"), enoent);
    assert_eq!(r.value("read_home"), enoent);
    assert_eq!(r.value("write_dev_null"), 0);
    assert_eq!(fs::read_to_string(s.ws().join("f")).unwrap(), "x");
    fs::remove_file(s.ws().join("f")).unwrap();
    fs::remove_dir(s.ws().join("d")).unwrap();
    // The host view: Landlock alone refuses.
    let r = s.run(
        &["--ro", ro_arg, "--no-namespaces"],
        &["python3", "-c", &py(&body)],
    );
    r.ok();
    assert_eq!(r.report["view"], "host-view");
    assert_eq!(r.value("write_ws"), 0);
    assert_eq!(r.value("mkdir_ws"), 0);
    assert_eq!(r.value("write_outside"), eacces);
    assert_eq!(r.value("mkdir_outside"), eacces);
    assert_eq!(r.value("write_ro"), eacces);
    assert_eq!(r.value("read_ro"), 0);
    assert_eq!(r.value("list_outside"), eacces);
    assert_eq!(r.value("read_shadow"), eacces);
    assert_eq!(r.value("read_home"), eacces);
    assert_eq!(r.value("write_dev_null"), 0);
    assert_eq!(fs::read_to_string(s.ws().join("f")).unwrap(), "x");
    assert!(!outside.join("f").exists());
}

#[test]
fn degraded_landlock_is_refused_unless_allowed() {
    require_root!();
    // Simulated by requiring a Landlock ABI above the kernel's: the crate's
    // best-effort compatibility then really leaves the ruleset partially
    // enforced, exactly as on an older kernel.
    let kernel = airlock_sandbox_kernel_abi();
    if kernel >= 10 {
        eprintln!("skipped: kernel already has Landlock ABI {kernel}");
        return;
    }
    let s = Scratch::new(61004);
    let outside = s.owned_dir("outside");
    let marker = s.ws().join("ran");
    let script = format!("touch {}; touch {}/f", marker.display(), outside.display());

    let refused = s.run(&["--landlock-min-abi", "10"], &["sh", "-c", &script]);
    assert_eq!(refused.status, 125, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("SANDBOX_UNAVAILABLE"),
        "{}",
        refused.stderr
    );
    assert!(!marker.exists(), "the command must not run");
    let outcome = &refused.report["outcome"];
    assert_eq!(outcome["kind"], "failed");
    assert_eq!(outcome["step"], "landlock");
    assert_eq!(outcome["code"], "SANDBOX_UNAVAILABLE");

    let allowed = s.run(
        &["--landlock-min-abi", "10", "--allow-degraded"],
        &["sh", "-c", &script],
    );
    assert_eq!(
        allowed.status, 1,
        "touch outside must still fail: {}",
        allowed.stderr
    );
    assert!(
        allowed.stderr.contains("WARNING: SANDBOX DEGRADED"),
        "{}",
        allowed.stderr
    );
    assert!(marker.exists());
    assert!(
        !outside.join("f").exists(),
        "what the kernel supports is still enforced"
    );
    assert_eq!(allowed.report["degraded"], true);
    assert_eq!(allowed.report["landlock"]["status"], "partial");
    assert!(
        allowed.report["warnings"][0]
            .as_str()
            .unwrap()
            .contains("degraded")
    );
}

fn airlock_sandbox_kernel_abi() -> i64 {
    // SAFETY: landlock_create_ruleset(NULL, 0, VERSION) reads no memory.
    let v = unsafe { libc::syscall(libc::SYS_landlock_create_ruleset, 0usize, 0usize, 1u32) };
    v.max(0)
}

// ---------------------------------------------------------------------------
// seccomp

#[test]
fn only_unix_sockets() {
    require_root!();
    let s = Scratch::new(61005);
    let body = format!(
        r#"
import socket
def attempt(name, f):
    try:
        f(); print(name, 0)
    except OSError as e:
        print(name, e.errno)
attempt("inet", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
attempt("inet6", lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM))
attempt("netlink", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW))
attempt("packet", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW))
attempt("inet_pair", lambda: socket.socketpair(socket.AF_INET))
attempt("unix", lambda: socket.socket(socket.AF_UNIX).bind("{ws}/sock"))
attempt("unix_pair", lambda: socket.socketpair(socket.AF_UNIX))
print("inet_high_bits", sc({socket}, (1 << 32) | socket.AF_INET, socket.SOCK_STREAM, 0))
"#,
        ws = s.ws().display(),
        socket = libc::SYS_socket
    );
    let r = s.run(&[], &["python3", "-c", &py(&body)]);
    r.ok();
    for name in [
        "inet",
        "inet6",
        "netlink",
        "packet",
        "inet_pair",
        "inet_high_bits",
    ] {
        assert_eq!(r.value(name), EPERM, "{name}");
    }
    assert_eq!(r.value("unix"), 0);
    assert_eq!(r.value("unix_pair"), 0);
}

/// Regression (escape suite, `pathname_unix` and `unix_dgram`): Landlock
/// below ABI 9 does not check connect(2) or sendto(2) on a socket file, so
/// a command reached any host UNIX socket its uid could write (the system
/// bus, journald). seccomp now denies connect and datagram UNIX sockets on
/// such kernels; Landlock's ResolveUnix right does it from ABI 9.
#[test]
fn host_pathname_unix_sockets_are_unreachable() {
    require_root!();
    use std::os::unix::net::{UnixDatagram, UnixListener};
    let s = Scratch::new(61030);
    let outside = s.path("outside");
    fs::create_dir(&outside).unwrap();
    fs::set_permissions(&outside, fs::Permissions::from_mode(0o777)).unwrap();
    let (stream_path, dgram_path) = (outside.join("stream"), outside.join("dgram"));
    let listener = UnixListener::bind(&stream_path).unwrap();
    listener.set_nonblocking(true).unwrap();
    let dgram = UnixDatagram::bind(&dgram_path).unwrap();
    dgram.set_nonblocking(true).unwrap();
    for p in [&stream_path, &dgram_path] {
        fs::set_permissions(p, fs::Permissions::from_mode(0o777)).unwrap();
    }
    let body = format!(
        r#"
import socket
def attempt(name, f):
    try:
        f(); print(name, 0)
    except OSError as e:
        print(name, e.errno)
def stream_pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    a.send(b"x")
    assert b.recv(1) == b"x"
def pair_sendto():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.sendto(b"x", "{dgram}")
attempt("connect", lambda: socket.socket(socket.AF_UNIX).connect("{stream}"))
attempt("sendto", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b"x", "{dgram}"))
attempt("pair_sendto", pair_sendto)
attempt("stream_pair", stream_pair)
attempt("bind_in_ws", lambda: socket.socket(socket.AF_UNIX).bind("{ws}/sock"))
"#,
        stream = stream_path.display(),
        dgram = dgram_path.display(),
        ws = s.ws().display(),
    );
    let r = s.run(&[], &["python3", "-c", &py(&body)]);
    r.ok();
    let expected = if airlock_sandbox_kernel_abi() >= 9 {
        i64::from(libc::EACCES)
    } else {
        EPERM
    };
    for name in ["connect", "sendto", "pair_sendto"] {
        let v = r.value(name);
        assert!(v == expected || v == EPERM, "{name}: {v}\n{}", r.stdout);
    }
    assert_eq!(r.value("stream_pair"), 0, "socketpair streams still work");
    assert_eq!(r.value("bind_in_ws"), 0);
    assert!(listener.accept().is_err(), "the host listener was reached");
    let mut buf = [0u8; 16];
    assert!(
        dgram.recv(&mut buf).is_err(),
        "the host datagram socket was reached"
    );
}

#[test]
fn dangerous_syscalls_fail_with_eperm() {
    require_root!();
    let s = Scratch::new(61006);
    // Arguments are chosen so that, without the filter, most calls would
    // succeed or fail differently (EFAULT, EINVAL, EBADF): EPERM shows the
    // filter answered.
    let calls: &[(&str, libc::c_long, &[i64])] = &[
        ("ptrace", libc::SYS_ptrace, &[0, 0, 0, 0]), // PTRACE_TRACEME would succeed
        (
            "process_vm_readv",
            libc::SYS_process_vm_readv,
            &[1, 0, 0, 0, 0, 0],
        ),
        (
            "process_vm_writev",
            libc::SYS_process_vm_writev,
            &[1, 0, 0, 0, 0, 0],
        ),
        ("pidfd_getfd", libc::SYS_pidfd_getfd, &[-1, 0, 0]),
        ("unshare_none", libc::SYS_unshare, &[0]), // would succeed
        (
            "unshare_user",
            libc::SYS_unshare,
            &[libc::CLONE_NEWUSER as i64],
        ),
        ("setns", libc::SYS_setns, &[-1, 0]), // EBADF otherwise
        (
            "clone_newuser",
            libc::SYS_clone,
            &[(libc::CLONE_NEWUSER | libc::CLONE_FS) as i64, 0, 0, 0, 0],
        ), // EINVAL otherwise
        (
            "clone_newnet",
            libc::SYS_clone,
            &[
                (libc::CLONE_NEWNET | libc::CLONE_FS | libc::CLONE_NEWUSER) as i64,
                0,
                0,
                0,
                0,
            ],
        ),
        ("mount", libc::SYS_mount, &[0, 0, 0, 0, 0]),
        ("umount2", libc::SYS_umount2, &[0, 0]),
        ("pivot_root", libc::SYS_pivot_root, &[0, 0]),
        ("chroot", libc::SYS_chroot, &[0]), // EFAULT otherwise
        ("fsopen", libc::SYS_fsopen, &[0, 0]),
        ("open_tree", libc::SYS_open_tree, &[-1, 0, 0]),
        ("move_mount", libc::SYS_move_mount, &[-1, 0, -1, 0, 0]),
        ("keyctl", libc::SYS_keyctl, &[0, -3, 0]), // KEYCTL_GET_KEYRING_ID would succeed
        ("add_key", libc::SYS_add_key, &[0, 0, 0, 0, 0]), // EFAULT otherwise
        ("request_key", libc::SYS_request_key, &[0, 0, 0, 0]),
        ("bpf", libc::SYS_bpf, &[0, 0, 0]),
        (
            "perf_event_open",
            libc::SYS_perf_event_open,
            &[0, 0, -1, -1, 0],
        ), // EFAULT otherwise
        ("io_uring_setup", libc::SYS_io_uring_setup, &[1, 0]), // EFAULT otherwise
        (
            "io_uring_enter",
            libc::SYS_io_uring_enter,
            &[-1, 0, 0, 0, 0, 0],
        ), // EBADF otherwise
        (
            "io_uring_register",
            libc::SYS_io_uring_register,
            &[-1, 0, 0, 0],
        ),
        ("userfaultfd", libc::SYS_userfaultfd, &[1]), // UFFD_USER_MODE_ONLY would succeed
        ("kexec_load", libc::SYS_kexec_load, &[0, 0, 0, 0]),
        (
            "kexec_file_load",
            libc::SYS_kexec_file_load,
            &[-1, -1, 0, 0, 0],
        ),
        ("init_module", libc::SYS_init_module, &[0, 0, 0]),
        ("finit_module", libc::SYS_finit_module, &[-1, 0, 0]),
        ("delete_module", libc::SYS_delete_module, &[0, 0]),
        ("kcmp", libc::SYS_kcmp, &[1, 1, 0, 0, 0]),
        (
            "open_by_handle_at",
            libc::SYS_open_by_handle_at,
            &[-1, 0, 0],
        ),
        ("syslog", libc::SYS_syslog, &[3, 0, 0]),
        ("reboot", libc::SYS_reboot, &[0, 0, 0, 0]),
    ];
    let body: String = calls
        .iter()
        .map(|(name, nr, args)| {
            let args: Vec<String> = args.iter().map(i64::to_string).collect();
            let sep = if args.is_empty() { "" } else { ", " };
            format!("print({name:?}, sc({nr}{sep}{}))\n", args.join(", "))
        })
        .collect();
    let r = s.run(&[], &["python3", "-c", &py(&body)]);
    r.ok();
    for (name, _, _) in calls {
        assert_eq!(r.value(name), EPERM, "{name}: {}", r.stdout);
    }
}

#[test]
fn clone3_is_enosys_while_fork_threads_and_subprocesses_work() {
    require_root!();
    let s = Scratch::new(61007);
    let body = format!(
        r#"
import threading, subprocess
print("clone3", sc({clone3}, 0, 0))
pid = os.fork()
if pid == 0:
    os._exit(7)
print("fork_child_status", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
out = []
t = threading.Thread(target=lambda: out.append(1)); t.start(); t.join()
print("thread_ran", len(out))
print("subprocess", subprocess.run(["true"]).returncode)
"#,
        clone3 = libc::SYS_clone3
    );
    let r = s.run(&[], &["python3", "-c", &py(&body)]);
    r.ok();
    assert_eq!(r.value("clone3"), i64::from(libc::ENOSYS));
    assert_eq!(r.value("fork_child_status"), 7);
    assert_eq!(r.value("thread_ran"), 1);
    assert_eq!(r.value("subprocess"), 0);
}

#[test]
fn terminal_injection_ioctls_are_denied() {
    require_root!();
    let s = Scratch::new(61008);
    // stdin is /dev/null: without the filter these would fail with ENOTTY.
    let body = format!(
        r#"
c = ctypes.create_string_buffer(b"x")
addr = ctypes.addressof(c)
print("tiocsti", sc({ioctl}, 0, {tiocsti}, addr))
print("tiocsti_high_bits", sc({ioctl}, 0, (1 << 32) | {tiocsti}, addr))
print("tioclinux", sc({ioctl}, 0, {tioclinux}, addr))
print("tcgets", sc({ioctl}, 0, {tcgets}, addr))
"#,
        ioctl = libc::SYS_ioctl,
        tiocsti = libc::TIOCSTI,
        tioclinux = libc::TIOCLINUX,
        tcgets = libc::TCGETS
    );
    let r = s.run(&[], &["python3", "-c", &py(&body)]);
    r.ok();
    assert_eq!(r.value("tiocsti"), EPERM);
    assert_eq!(r.value("tiocsti_high_bits"), EPERM);
    assert_eq!(r.value("tioclinux"), EPERM);
    assert_eq!(
        r.value("tcgets"),
        i64::from(libc::ENOTTY),
        "other ioctls are not filtered"
    );
}

#[cfg(target_arch = "x86_64")]
#[test]
fn x32_system_calls_are_refused() {
    require_root!();
    let s = Scratch::new(61009);
    let body = format!(
        "print('x32_socket', sc(0x40000000 | {}, 2, 1, 0))\nprint('x32_getpid', sc(0x40000000 | {}))\n",
        libc::SYS_socket,
        libc::SYS_getpid
    );
    let r = s.run(&[], &["python3", "-c", &py(&body)]);
    r.ok();
    assert_eq!(r.value("x32_socket"), i64::from(libc::ENOSYS));
    assert_eq!(r.value("x32_getpid"), i64::from(libc::ENOSYS));
}

// ---------------------------------------------------------------------------
// rlimits

#[test]
fn fork_bomb_hits_rlimit_nproc_and_everything_is_killed() {
    require_root!();
    let s = Scratch::new(61010);
    let body = r#"
import time
n = 0
try:
    while n < 1000:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        n += 1
    print("forks", n)
except BlockingIOError:
    print("eagain_after", n)
"#;
    let r = s.run(&["--limit-nproc", "20"], &["python3", "-c", &py(body)]);
    r.ok();
    assert!(r.value("eagain_after") < 20, "{}", r.stdout);
    assert!(r.elapsed < Duration::from_secs(10), "{:?}", r.elapsed);
    assert_nothing_left(&r, 61010);
}

#[test]
fn shell_fork_bomb_is_contained_and_killed_at_the_timeout() {
    require_root!();
    let s = Scratch::new(61011);
    let r = s.run(
        &["--limit-nproc", "30", "--timeout", "2s"],
        &["bash", "-c", "b() { b | b & }; b; sleep 30"],
    );
    assert_eq!(r.status, 124, "{}", r.stderr);
    assert!(r.elapsed < Duration::from_secs(8), "{:?}", r.elapsed);
    assert_eq!(r.report["outcome"]["kind"], "timed_out");
    assert_nothing_left(&r, 61011);
}

#[test]
fn memory_bomb_hits_rlimit_as() {
    require_root!();
    let s = Scratch::new(61012);
    let body = r#"
small = bytearray(16 << 20)
print("small", len(small) >> 20)
try:
    big = bytearray(1 << 30)
    print("big", 0)
except MemoryError:
    print("big", 12)
"#;
    let r = s.run(&["--limit-as", "256M"], &["python3", "-c", &py(body)]);
    r.ok();
    assert_eq!(r.value("small"), 16);
    assert_eq!(
        r.value("big"),
        12,
        "a 1 GiB allocation must fail under a 256 MiB RLIMIT_AS"
    );
}

#[test]
fn file_size_and_core_limits_apply() {
    require_root!();
    let s = Scratch::new(61013);
    let r = s.run(
        &["--limit-fsize", "1M", "--limit-nofile", "64"],
        &[
            "sh",
            "-c",
            "ulimit -c; ulimit -n; ulimit -f; head -c 2000000 /dev/zero > big; echo rc=$?",
        ],
    );
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(&lines[..3], ["0", "64", "2048"], "{}", r.stdout);
    assert!(fs::metadata(s.ws().join("big")).unwrap().len() <= 1 << 20);
    assert!(
        lines[3] != "rc=0",
        "writing past RLIMIT_FSIZE must fail: {}",
        r.stdout
    );
}

// ---------------------------------------------------------------------------
// no residency, timeout, pid namespace

#[test]
fn daemons_do_not_outlive_the_command() {
    require_root!();
    let s = Scratch::new(61014);
    let marker = format!("airlock-daemon-marker-{}", std::process::id());
    let started = s.ws().join("daemon-started");
    let body = format!(
        r#"
import time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        open("{started}", "w").write(str(os.getpid()))
        os.execv("/bin/sleep", ["{marker}", "1000"])
    os._exit(0)
for _ in range(500):
    if os.path.exists("{started}"):
        break
    time.sleep(0.01)
print("daemon_started", int(os.path.exists("{started}")))
"#,
        started = started.display()
    );
    let r = s.run(&[], &["python3", "-c", &py(&body)]);
    r.ok();
    assert_eq!(r.value("daemon_started"), 1);
    assert_eq!(
        processes_with(&marker),
        Vec::<u32>::new(),
        "the daemon survived"
    );
    assert_nothing_left(&r, 61014);
}

#[test]
fn timeout_kills_the_whole_sandbox_with_status_124() {
    require_root!();
    let s = Scratch::new(61015);
    let marker = format!("airlock-timeout-marker-{}", std::process::id());
    let script = format!(
        "(setsid bash -c 'exec -a {marker}-daemon sleep 100' &); exec -a {marker} sleep 100"
    );
    let r = s.run(&["--timeout", "1"], &["bash", "-c", &script]);
    assert_eq!(r.status, 124, "{}", r.stderr);
    assert!(r.elapsed >= Duration::from_millis(900), "{:?}", r.elapsed);
    assert!(r.elapsed < Duration::from_secs(4), "{:?}", r.elapsed);
    assert_eq!(r.report["outcome"]["kind"], "timed_out");
    assert_eq!(processes_with(&marker), Vec::<u32>::new());
    assert_nothing_left(&r, 61015);
}

#[test]
fn proc_shows_only_the_sandbox() {
    require_root!();
    let s = Scratch::new(61016);
    let body = format!(
        r#"
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
print("count", len(pids))
print("max_pid", max(pids))
print("sees_test_runner", int(os.path.exists("/proc/{me}")))
print("init_is_helper", int(b"airlock-confine" in open("/proc/1/cmdline", "rb").read()))
"#,
        me = std::process::id()
    );
    let r = s.run(&[], &["python3", "-c", &py(&body)]);
    r.ok();
    assert!(r.value("count") <= 3, "{}", r.stdout);
    assert!(r.value("max_pid") < 10);
    assert_eq!(r.value("sees_test_runner"), 0);
    assert_eq!(r.value("init_is_helper"), 1);
}

#[test]
fn network_namespace_has_only_a_down_loopback() {
    require_root!();
    let s = Scratch::new(61017);
    let r = s.run(&[], &["cat", "/proc/net/dev"]);
    r.ok();
    let ifaces: Vec<&str> = r
        .stdout
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(str::trim)
        .collect();
    assert_eq!(ifaces, ["lo"]);
    // SIOCGIFFLAGS works on an AF_UNIX socket (the only kind allowed).
    let body = r#"
import socket, fcntl, struct
s = socket.socket(socket.AF_UNIX)
flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, struct.pack("16sH", b"lo", 0))[:18])[1]
print("lo_up", flags & 1)
print("lo_loopback", int(bool(flags & 8)))
"#;
    let r = s.run(&[], &["python3", "-c", &py(body)]);
    r.ok();
    assert_eq!(r.value("lo_loopback"), 1);
    assert_eq!(r.value("lo_up"), 0, "nothing is brought up");
}

// ---------------------------------------------------------------------------
// environment, tmp, descriptors, exit statuses

#[test]
fn environment_is_clean() {
    require_root!();
    let s = Scratch::new(61018);
    let ws = s.ws();
    let report = s.report_path();
    let r = run_helper(
        Command::new(BIN)
            .env("AIRLOCK_TEST_SECRET", "hunter2")
            .args(["--uid", "61018", "--env", "EXTRA=1", "--report"])
            .arg(&report)
            .arg("--rw")
            .arg(&ws)
            .args(["--", "env"]),
        &report,
    );
    r.ok();
    let mut env: Vec<&str> = r.stdout.lines().collect();
    env.sort_unstable();
    let home = format!("HOME={}", ws.display());
    assert_eq!(
        env,
        [
            "EXTRA=1",
            &home,
            "LC_ALL=C.UTF-8",
            "PATH=/usr/local/bin:/usr/bin:/bin",
            "TMPDIR=/tmp"
        ]
    );
}

#[test]
fn private_tmp_is_private() {
    require_root!();
    let s = Scratch::new(61019);
    let name = format!("/tmp/airlock-private-{}", std::process::id());
    let r = s.run(
        &[],
        &["sh", "-c", &format!("echo x > {name} && cat {name} && pwd")],
    );
    r.ok();
    assert_eq!(r.stdout, format!("x\n{}\n", s.ws().display()));
    assert!(
        !Path::new(&name).exists(),
        "the sandbox's /tmp leaked to the host"
    );
    // POSIX semaphores live in the private /dev/shm.
    let r = s.run(
        &[],
        &[
            "python3",
            "-c",
            "import multiprocessing as m; m.Lock(); print('lock')",
        ],
    );
    r.ok();
    assert_eq!(r.stdout, "lock\n");
}

#[test]
fn workspace_under_tmp_keeps_the_host_tmp_hidden_otherwise() {
    require_root!();
    let s = Scratch::new_in("/tmp", 61020);
    let sibling = tempfile::Builder::new()
        .prefix("airlock-host-tmp-sibling")
        .tempfile_in("/tmp")
        .unwrap();
    let r = s.run(
        &[],
        &["sh", "-c", "echo ok > f && echo $TMPDIR && ls -a /tmp"],
    );
    let mut lines = r.stdout.lines();
    assert_eq!(lines.next(), Some(s.ws().to_str().unwrap()), "{}", r.stdout);
    // /tmp in the view is only the way to the workspace, and not listable.
    assert_eq!(lines.next(), None, "{}", r.stdout);
    assert!(
        r.stderr.contains("Permission denied"),
        "host /tmp must not be listable: {}",
        r.stderr
    );
    assert!(
        !r.stdout
            .contains(sibling.path().file_name().unwrap().to_str().unwrap())
    );
    assert_eq!(fs::read_to_string(s.ws().join("f")).unwrap(), "ok\n");
    assert_eq!(r.report["namespaces"]["tmp"], false);
}

#[test]
fn report_fd_is_written_and_never_inherited() {
    require_root!();
    let s = Scratch::new(61021);
    let report = fs::File::create(s.path("fd-report.json")).unwrap();
    let stray = fs::File::open("/etc/hostname").unwrap();
    for f in [&report, &stray] {
        // SAFETY: clearing FD_CLOEXEC on a descriptor we own; no pointers.
        assert_eq!(unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETFD, 0) }, 0);
    }
    let fd = report.as_raw_fd().to_string();
    let r = run_helper(
        Command::new(BIN)
            .args(["--uid", "61021", "--report-fd", &fd, "--rw"])
            .arg(s.ws())
            .args(["--", "ls", "/proc/self/fd"]),
        Path::new("/nonexistent"),
    );
    r.ok();
    drop(report);
    assert_eq!(
        r.stdout, "0\n1\n2\n3\n",
        "only stdio and ls's own directory fd"
    );
    let rep: Value = serde_json::from_slice(&fs::read(s.path("fd-report.json")).unwrap()).unwrap();
    assert_eq!(rep["outcome"]["kind"], "exited");
    assert_eq!(rep["uid"], 61021);
}

#[test]
fn exit_statuses_pass_through() {
    require_root!();
    let s = Scratch::new(61022);
    assert_eq!(s.run(&[], &["sh", "-c", "exit 3"]).status, 3);
    let killed = s.run(&[], &["sh", "-c", "kill -TERM $$"]);
    assert_eq!(killed.status, 128 + libc::SIGTERM);
    assert_eq!(
        killed.report["outcome"],
        serde_json::json!({"kind": "signaled", "signal": libc::SIGTERM})
    );
    let missing = s.run(&[], &["airlock-no-such-command"]);
    assert_eq!(missing.status, 127);
    assert_eq!(missing.report["outcome"]["step"], "exec");
    let not_exec = s.ws().join("script");
    fs::write(&not_exec, "#!/bin/sh\n").unwrap();
    assert_eq!(s.run(&[], &[not_exec.to_str().unwrap()]).status, 126);
    let bad_usage = Command::new(BIN).args(["--no-such-flag"]).output().unwrap();
    assert_eq!(bad_usage.status.code(), Some(125));
    let relative_missing = s.run(&["--ro", "/nonexistent-airlock-path"], &["true"]);
    assert_eq!(relative_missing.status, 125);
    assert_eq!(relative_missing.report["outcome"]["step"], "landlock");
}

// ---------------------------------------------------------------------------
// unprivileged caller (the executor's case: a service user, no root)

#[test]
fn unprivileged_caller_gets_a_user_namespace_and_the_same_confinement() {
    require_root!();
    let uid = 61023;
    let s = Scratch::new(uid);
    let outside = s.owned_dir("outside");
    let report = s.ws().join("report.json");
    // The checkout (and so the built binary) may sit under a directory the
    // test uid cannot traverse, such as /root: run a copy.
    let bin = s.path("airlock-confine");
    fs::copy(BIN, &bin).unwrap();
    fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).unwrap();
    let script = format!(
        "id -u; grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status; touch {}/f; echo rc=$?",
        outside.display()
    );
    let r = run_helper(
        Command::new(&bin)
            .uid(uid)
            .gid(uid)
            .arg("--rw")
            .arg(s.ws())
            .arg("--report")
            .arg(&report)
            .args(["--", "sh", "-c", &script]),
        &report,
    );
    r.ok();
    assert_eq!(
        r.stdout,
        format!(
            "{uid}\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\nrc=1\n"
        )
    );
    assert_eq!(r.report["namespaces"]["user"], true);
    assert_eq!(r.report["namespaces"]["pid"], true);
    assert_eq!(r.report["landlock"]["status"], "full");
    assert_nothing_left(&r, uid);

    // Another uid cannot be had without privilege.
    let refused = run_helper(
        Command::new(&bin)
            .uid(uid)
            .gid(uid)
            .args(["--uid", "0", "--rw"])
            .arg(s.ws())
            .args(["--", "true"]),
        &report,
    );
    assert_eq!(refused.status, 125);
    assert!(
        refused.stderr.contains("only root can switch ids"),
        "{}",
        refused.stderr
    );
}

// ---------------------------------------------------------------------------
// fallbacks and teardown by signal

#[test]
fn without_namespaces_orphans_are_still_found_and_killed() {
    require_root!();
    let uid = 61024;
    let s = Scratch::new(uid);
    let marker = format!("airlock-nons-marker-{}", std::process::id());
    let started = s.ws().join("started");
    let daemon = format!(
        "(setsid bash -c 'touch {started}; exec -a {marker}-a sleep 100' &); \
         while [ ! -e {started} ]; do sleep 0.01; done",
        started = started.display()
    );
    let r = s.run(&["--no-namespaces"], &["bash", "-c", &daemon]);
    r.ok();
    assert!(started.exists());
    assert_eq!(
        r.report["namespaces"],
        serde_json::json!({
            "user": false, "pid": false, "ipc": false, "uts": false,
            "net": false, "mount": false, "proc": false, "tmp": false, "shm": false,
            "root": false
        })
    );
    assert_eq!(r.report["landlock"]["status"], "full");
    assert_eq!(
        processes_with(&marker),
        Vec::<u32>::new(),
        "the orphaned daemon survived"
    );
    assert_nothing_left(&r, uid);

    let timed = s.run(
        &["--no-namespaces", "--timeout", "500ms"],
        &[
            "bash",
            "-c",
            &format!(
                "(setsid bash -c 'exec -a {marker}-b sleep 100' &); exec -a {marker}-c sleep 100"
            ),
        ],
    );
    assert_eq!(timed.status, 124, "{}", timed.stderr);
    assert_eq!(
        processes_with(&marker),
        Vec::<u32>::new(),
        "survived the timeout"
    );
    assert_nothing_left(&timed, uid);
}

#[test]
fn sigterm_to_the_helper_tears_the_sandbox_down() {
    require_root!();
    let uid = 61025;
    let s = Scratch::new(uid);
    let started = s.ws().join("started");
    let report = s.report_path();
    let mut child = Command::new(BIN)
        .args(["--uid", &uid.to_string(), "--rw"])
        .arg(s.ws())
        .arg("--report")
        .arg(&report)
        .args([
            "--",
            "sh",
            "-c",
            "(setsid sleep 100 &); touch started; exec sleep 100",
        ])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !started.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the command never started"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: kill(2) on our own child's pid; no memory involved.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(128 + libc::SIGTERM));
    let rep: Value = serde_json::from_slice(&fs::read(&report).unwrap()).unwrap();
    assert_eq!(
        rep["outcome"],
        serde_json::json!({"kind": "interrupted", "signal": libc::SIGTERM})
    );
    assert_eq!(rep["survivors"], 0);
    assert_eq!(processes_of(uid), Vec::<u32>::new());
}

#[test]
fn cpu_limit_kills_a_busy_loop() {
    require_root!();
    let s = Scratch::new(61026);
    let r = s.run(
        &["--limit-cpu", "1"],
        &["python3", "-c", "while True: pass"],
    );
    // soft = hard: the kernel sends SIGKILL at once (SIGXCPU only below hard).
    assert!(
        [128 + libc::SIGKILL, 128 + libc::SIGXCPU].contains(&r.status),
        "{}: {}",
        r.status,
        r.stderr
    );
    assert!(r.elapsed < Duration::from_secs(10), "{:?}", r.elapsed);
}

#[test]
fn command_leads_its_own_session_in_its_own_uts_namespace() {
    require_root!();
    let s = Scratch::new(61027);
    let body = r#"
import socket
print("session_leader", int(os.getsid(0) == os.getpid()))
print("group_leader", int(os.getpgrp() == os.getpid()))
print("hostname_is_sandbox", int(socket.gethostname() == "airlock-sandbox"))
"#;
    let r = s.run(&[], &["python3", "-c", &py(body)]);
    r.ok();
    assert_eq!(r.value("session_leader"), 1);
    assert_eq!(r.value("group_leader"), 1);
    assert_eq!(r.value("hostname_is_sandbox"), 1);
}

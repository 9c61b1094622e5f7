//! `airlock-escape-no-namespaces PROGRAM [ARG…]`: runs PROGRAM as on a host
//! that refuses namespaces to it (user namespaces disabled by sysctl, or
//! restricted as Ubuntu 24.04's AppArmor does; systemd's
//! `RestrictNamespaces=yes` alike): a seccomp filter makes unshare(2) and
//! setns(2) fail with EPERM, clone(2) with any namespace flag fail with
//! EPERM, and clone3(2) fail with ENOSYS (so that callers fall back to
//! clone). The escape suite runs the executor under it to test the host
//! view: no minimal root, commands on Landlock, seccomp (every metadata
//! call by path refused), rlimits and the subreaper alone.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;

const LD_W_ABS: u16 = 0x20;
const JEQ_K: u16 = 0x15;
const JSET_K: u16 = 0x45;
const RET_K: u16 = 0x06;
const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;
const RET_ALLOW: u32 = 0x7fff_0000;
const RET_ERRNO: u32 = 0x0005_0000;
/// Every namespace flag clone(2) accepts.
const NAMESPACE_FLAGS: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET) as u32;

fn ins(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

fn main() {
    let args: Vec<CString> = std::env::args_os()
        .skip(1)
        .map(|a| CString::new(a.as_bytes()).expect("no NUL in arguments"))
        .collect();
    assert!(
        !args.is_empty(),
        "usage: airlock-escape-no-namespaces PROGRAM [ARG…]"
    );
    let eperm = RET_ERRNO | libc::EPERM as u32;
    let enosys = RET_ERRNO | libc::ENOSYS as u32;
    let nr = |n: libc::c_long| u32::try_from(n).expect("system call number");
    let filter = [
        ins(LD_W_ABS, 0, 0, 4), // arch
        ins(JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
        ins(RET_K, 0, 0, RET_ALLOW),
        ins(LD_W_ABS, 0, 0, 0), // nr
        ins(JEQ_K, 6, 0, nr(libc::SYS_unshare)),
        ins(JEQ_K, 5, 0, nr(libc::SYS_setns)),
        ins(JEQ_K, 6, 0, nr(libc::SYS_clone3)),
        ins(JEQ_K, 1, 0, nr(libc::SYS_clone)),
        ins(RET_K, 0, 0, RET_ALLOW),
        ins(LD_W_ABS, 0, 0, 16), // low word of args[0] (clone's flags)
        ins(JSET_K, 0, 1, NAMESPACE_FLAGS),
        ins(RET_K, 0, 0, eperm),
        ins(RET_K, 0, 0, RET_ALLOW),
        ins(RET_K, 0, 0, enosys),
    ];
    let prog = libc::sock_fprog {
        len: u16::try_from(filter.len()).expect("short filter"),
        filter: filter.as_ptr().cast_mut(),
    };
    // SAFETY: prctl with integer arguments; no memory is passed.
    let r = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    assert_eq!(
        r,
        0,
        "PR_SET_NO_NEW_PRIVS: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: `prog` points at `filter`, both alive for the call; the
    // kernel copies the program.
    let r = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &prog as *const libc::sock_fprog,
        )
    };
    assert_eq!(r, 0, "PR_SET_SECCOMP: {}", std::io::Error::last_os_error());
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    // SAFETY: argv is a NULL-terminated array of valid C strings that
    // outlive the call; execv only returns on failure.
    unsafe { libc::execv(args[0].as_ptr(), argv.as_ptr()) };
    panic!("execv {:?}: {}", args[0], std::io::Error::last_os_error());
}

//! The executor's credentials self-check, as it runs installed: the real
//! binary as a user other than root (65534), in a fresh network namespace,
//! with a private `/run` (a tmpfs in its own mount namespace) holding the
//! `/run/credentials` of each case. Root can read any directory, so the
//! case that matters — a link to a directory the executor cannot read —
//! exists only for a non-root executor.
//!
//! Seed 001 refuses a credentials mount that is a symbolic link
//! (`CREDENTIAL_MOUNT_SYMLINK`) before asking whether it is readable;
//! airlock refuses with `EXECUTOR_NOT_ISOLATED: credentials`.

mod common;

use airlock_proto::Code;
use common::executor_bin;
use std::process::{Command, Output};

/// The uid and gid the executor runs as here.
const NOBODY: u32 = 65534;

/// Runs `serve` as [`NOBODY`] after `setup` (shell, run as root) made the
/// private `/run`.
fn executor_after(setup: &str) -> Output {
    assert!(
        rustix::process::geteuid().is_root(),
        "this test needs root: it makes a mount namespace and runs the executor as uid {NOBODY} \
         (CI runs it as root; run it with sudo)"
    );
    let dir = tempfile::Builder::new()
        .prefix("airlock-selfcheck-")
        .tempdir()
        .unwrap();
    let script = format!(
        "set -e; mount -t tmpfs -o mode=0755 none /run; {setup}; \
         exec unshare -n setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups \
         {} serve --spool {} --worker-uid 0 --work {}",
        executor_bin().display(),
        dir.path().join("spool").display(),
        dir.path().join("work").display(),
    );
    Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .env_clear()
        .env("PATH", "/usr/bin:/bin:/usr/sbin:/sbin")
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn refused(o: &Output, detail: &str) {
    let not_isolated = i32::from(Code::EXECUTOR_NOT_ISOLATED.exit_code());
    assert_eq!(o.status.code(), Some(not_isolated), "{}", stderr(o));
    assert!(
        stderr(o).contains(&format!("EXECUTOR_NOT_ISOLATED: credentials: {detail}")),
        "{}",
        stderr(o)
    );
}

#[test]
fn a_symlinked_credentials_directory_fails_the_self_check_of_a_non_root_executor() {
    // A link to a directory only root may read: the executor cannot list
    // it, and is refused all the same.
    let out = executor_after("mkdir -m 0700 /run/store; ln -s /run/store /run/credentials");
    refused(&out, "/run/credentials is a symbolic link (to /run/store)");
    // A link to nothing (yet).
    let out = executor_after("ln -s /run/later /run/credentials");
    refused(&out, "/run/credentials is a symbolic link (to /run/later)");
    // A link to a directory it can read.
    let out = executor_after("mkdir -m 0755 /run/open; ln -s /run/open /run/credentials");
    refused(&out, "/run/credentials is a symbolic link (to /run/open)");
}

#[test]
fn a_real_credentials_directory_passes_only_when_the_executor_cannot_read_it() {
    // The isolation systemd gives: a directory the executor cannot list.
    // The self-check passes; the executor goes on (and stops later, at its
    // spool, which does not exist here).
    let out = executor_after("mkdir -m 0700 /run/credentials");
    assert!(
        !stderr(&out).contains("EXECUTOR_NOT_ISOLATED"),
        "{}",
        stderr(&out)
    );
    assert_ne!(out.status.code(), Some(0), "{}", stderr(&out));
    // One it can list is refused.
    let out = executor_after("mkdir -m 0755 /run/credentials");
    refused(&out, "/run/credentials is readable");
}

//! The executor's own confinement, applied once at start, after the
//! configuration, spool and work root are opened and the spawner is forked,
//! and before any request is read: the `Executor` role of
//! `airlock_sandbox::role`, applied by `airlock_sandbox::lockdown::lockdown`
//! (capability bounding set, no_new_privs, RLIMIT_CORE, Landlock, seccomp).
//! Its Landlock grants hold no execute right: the executor starts nothing;
//! commands are its spawner's children, forked before this lockdown because
//! Landlock forbids the mounts each command's minimal root is made of. The
//! grants and their reasons are listed in `docs/privsep/confinement.md`.

use crate::error::{Error, Result};
use airlock_sandbox::role::Role;
pub use airlock_sandbox::role::{Paths, Slot};

/// How the executor itself is confined, for the result's report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SelfConfinement {
    /// The kernel's Landlock ABI.
    pub abi: u32,
    /// "full" or "degraded".
    pub status: &'static str,
}

/// Confines the calling process (all its future threads and children
/// included) with the paths resolved from the configuration. Must be called
/// before any thread is started.
pub fn apply(paths: &Paths) -> Result<SelfConfinement> {
    let report = airlock_sandbox::lockdown::lockdown(Role::Executor, paths)
        .map_err(|e| Error::SelfConfine(e.to_string()))?;
    eprintln!("airlock-executor: {report}");
    Ok(SelfConfinement {
        abi: u32::try_from(report.landlock.kernel_abi).unwrap_or(0),
        status: report.status(),
    })
}

//! The executor's own Landlock confinement, applied once at start, after
//! the configuration, spool and helper are opened and before any request
//! is read. Every access right of the kernel's ABI is handled, so what is
//! not granted here is denied to the executor and, inherited, to every
//! airlock-confine it starts and every command:
//!
//! | path | access | why |
//! |---|---|---|
//! | /usr /bin /sbin /lib* /etc | read + execute | the dynamic linker, python3, git |
//! | /proc | read (+ write when not root) | airlock-confine's reaper; its user-namespace id maps |
//! | /dev/null /dev/zero /dev/full | read + write | standard streams of commands |
//! | /dev/random /dev/urandom | read | randomness |
//! | spool requests/ sources/ | read | the worker's files |
//! | spool results/ failed/, work root (, run-once's output directory) | all | what the executor writes |
//! | airlock-confine | read + execute | the only program the executor starts |
//!
//! TCP bind/connect (ABI 4+) and abstract-socket and signal scoping (ABI
//! 6+) are handled with no exception. Landlock also denies mount(2) to a
//! confined process, so the command sandboxes get no fresh /proc and no
//! tmpfs /tmp; the executor gives each command a private TMPDIR in its work
//! root instead (see `run`).

use crate::error::{Error, Result};
use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd,
    Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope,
};
use std::path::{Path, PathBuf};

/// System directories granted read + execute when present.
pub const SYSTEM_READ: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc",
];

/// What the executor may touch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Grants {
    /// Read (+ execute) access.
    pub read: Vec<PathBuf>,
    /// Every access.
    pub write: Vec<PathBuf>,
    /// Single programs the executor may execute.
    pub exec_files: Vec<PathBuf>,
}

/// How the executor itself is confined, for the result's report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SelfConfinement {
    /// The kernel's Landlock ABI.
    pub abi: u32,
    /// "full" or "degraded".
    pub status: &'static str,
}

fn kernel_abi() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a null attribute pointer, size 0 and the VERSION flag,
    // landlock_create_ruleset only returns the ABI number; no memory is
    // read or written.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    i32::try_from(v).unwrap_or(0).max(0)
}

/// Restricts the calling process (all its future children included).
pub fn apply(grants: &Grants, allow_degraded: bool) -> Result<SelfConfinement> {
    let kernel = kernel_abi();
    let abi = ABI::from(kernel.min(9));
    let ll = |e: landlock::RulesetError| Error::SelfConfine(e.to_string());
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))
        .map_err(ll)?;
    if !AccessNet::from_all(abi).is_empty() {
        ruleset = ruleset
            .handle_access(AccessNet::from_all(abi))
            .map_err(ll)?;
    }
    if !Scope::from_all(abi).is_empty() {
        ruleset = ruleset.scope(Scope::from_all(abi)).map_err(ll)?;
    }
    let mut created = ruleset.create().map_err(ll)?;
    let read = AccessFs::from_read(abi);
    let all = AccessFs::from_all(abi);
    let file_rw = AccessFs::ReadFile | AccessFs::WriteFile;
    let root = rustix::process::geteuid().is_root();
    // An unprivileged airlock-confine writes its user namespace's id maps
    // (opened with O_TRUNC, hence Truncate).
    let proc_access = if root {
        read
    } else {
        read | AccessFs::WriteFile | AccessFs::Truncate
    };
    let mut rules: Vec<(PathBuf, BitFlags<AccessFs>, bool)> = Vec::new();
    for p in SYSTEM_READ {
        rules.push((PathBuf::from(p), read, false));
    }
    rules.push((PathBuf::from("/proc"), proc_access, false));
    for p in ["/dev/null", "/dev/zero", "/dev/full"] {
        rules.push((PathBuf::from(p), file_rw, false));
    }
    for p in ["/dev/random", "/dev/urandom"] {
        rules.push((PathBuf::from(p), AccessFs::ReadFile.into(), false));
    }
    for p in &grants.read {
        rules.push((p.clone(), read, true));
    }
    for p in &grants.write {
        rules.push((p.clone(), all, true));
    }
    for p in &grants.exec_files {
        rules.push((p.clone(), AccessFs::ReadFile | AccessFs::Execute, true));
    }
    for (path, access, required) in rules {
        let Some(rule) = rule(&path, access, abi, required)? else {
            continue;
        };
        created = created.add_rule(rule).map_err(ll)?;
    }
    let status = created.restrict_self().map_err(ll)?;
    let full = status.ruleset == RulesetStatus::FullyEnforced;
    if !full && !allow_degraded {
        return Err(Error::SelfConfine(format!(
            "Landlock is {:?} on this kernel (ABI {kernel}) and executor.allow_degraded_landlock is false",
            status.ruleset
        )));
    }
    if !full {
        eprintln!(
            "airlock-executor: WARNING: running with degraded Landlock ({:?}, ABI {kernel})",
            status.ruleset
        );
    }
    Ok(SelfConfinement {
        abi: u32::try_from(kernel).unwrap_or(0),
        status: if full { "full" } else { "degraded" },
    })
}

fn rule(
    path: &Path,
    access: BitFlags<AccessFs>,
    abi: ABI,
    required: bool,
) -> Result<Option<PathBeneath<PathFd>>> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(Error::SelfConfine(format!("{}: {e}", path.display())));
        }
    };
    let access = if meta.is_dir() {
        access
    } else {
        access & AccessFs::from_file(abi)
    };
    let fd =
        PathFd::new(path).map_err(|e| Error::SelfConfine(format!("{}: {e}", path.display())))?;
    Ok(Some(PathBeneath::new(fd, access)))
}

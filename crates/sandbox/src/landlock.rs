//! Landlock: the filesystem view of the command.
//!
//! Every access right of the running kernel's Landlock ABI is handled
//! (filesystem, TCP bind/connect from ABI 4, signal and abstract-socket
//! scoping from ABI 6, ...), so anything not granted below is denied:
//! - read + execute: the policy's `ro` paths and the system paths
//!   ([`crate::policy::SYSTEM_RO`]), /proc when it is the sandbox's own;
//! - everything: the policy's `rw` directories and a private /tmp;
//! - read + write (no ioctl): /dev/null, /dev/zero, /dev/full; read:
//!   /dev/random, /dev/urandom.
//!
//! The requested ABI is the kernel's, raised to the policy's minimum. When
//! the kernel is older than that minimum (or has no Landlock), the crate's
//! best-effort compatibility leaves the ruleset partially enforced or not
//! enforced, which the caller treats as degraded.

use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd,
    Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope,
};

use crate::error::{Error, Result};
use crate::policy::MAX_LANDLOCK_ABI;
use crate::report::LandlockReport;
use crate::seccomp_policy::LANDLOCK_ABI_UNIX;

/// The paths to grant, and how.
#[derive(Clone, Debug, Default)]
pub struct Grants {
    /// Read + execute; each must exist.
    pub ro: Vec<PathBuf>,
    /// Read + execute, skipped when missing (system paths, /proc).
    pub ro_if_present: Vec<PathBuf>,
    /// Every right; each must exist.
    pub rw: Vec<PathBuf>,
    /// Read + write of files, skipped when missing (devices).
    pub rw_files_if_present: Vec<PathBuf>,
    /// Read of files, skipped when missing (devices).
    pub ro_files_if_present: Vec<PathBuf>,
}

/// The kernel's Landlock ABI version, 0 when Landlock is unavailable.
pub fn kernel_abi() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a null attribute pointer, size 0 and the VERSION flag the
    // syscall only returns a number; no memory is read or written.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    v.max(0) as i32
}

/// Builds and enforces the ruleset on the calling thread.
pub fn restrict(grants: &Grants, min_abi: u8) -> Result<LandlockReport> {
    let kernel = kernel_abi();
    let requested = (kernel.clamp(0, i32::from(MAX_LANDLOCK_ABI)) as u8).max(min_abi);
    // The crate discourages building an ABI from the running kernel because
    // behaviour then varies between machines. Here that is the requirement:
    // handle every right this kernel knows. The variation is bounded below
    // by `min_abi` and made visible in the report.
    let abi = ABI::from(i32::from(requested));
    let ll = |e: landlock::RulesetError| Error::Landlock(e.to_string());

    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))
        .map_err(ll)?;
    let net = AccessNet::from_all(abi);
    if !net.is_empty() {
        ruleset = ruleset.handle_access(net).map_err(ll)?;
    }
    let scopes = Scope::from_all(abi);
    if !scopes.is_empty() {
        ruleset = ruleset.scope(scopes).map_err(ll)?;
    }
    let mut created = ruleset.create().map_err(ll)?;

    let read = AccessFs::from_read(abi);
    let all = AccessFs::from_all(abi);
    let file_rw = AccessFs::ReadFile | AccessFs::WriteFile;
    let file_ro: BitFlags<AccessFs> = AccessFs::ReadFile.into();
    let sets: [(&[PathBuf], BitFlags<AccessFs>, bool); 5] = [
        (&grants.ro, read, true),
        (&grants.ro_if_present, read, false),
        (&grants.rw, all, true),
        (&grants.rw_files_if_present, file_rw, false),
        (&grants.ro_files_if_present, file_ro, false),
    ];
    for (paths, access, required) in sets {
        for path in paths {
            let Some(rule) = rule(path, access, abi, required)? else {
                continue;
            };
            created = created.add_rule(rule).map_err(ll)?;
        }
    }
    let status = created.restrict_self().map_err(ll)?;
    let status = match status.ruleset {
        RulesetStatus::FullyEnforced => "full",
        RulesetStatus::PartiallyEnforced => "partial",
        RulesetStatus::NotEnforced => "none",
    };
    Ok(LandlockReport {
        kernel_abi: kernel,
        requested_abi: requested,
        min_abi,
        status: status.into(),
    })
}

/// One rule, restricted to the rights that make sense for a file when the
/// path is not a directory (the kernel refuses directory rights on files).
fn rule(
    path: &Path,
    access: BitFlags<AccessFs>,
    abi: ABI,
    required: bool,
) -> Result<Option<PathBeneath<PathFd>>> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(Error::LandlockPath {
                path: path.into(),
                source,
            });
        }
    };
    let access = if meta.is_dir() {
        access
    } else {
        access & AccessFs::from_file(abi)
    };
    let fd = PathFd::new(path).map_err(|e| Error::LandlockPath {
        path: path.into(),
        source: std::io::Error::other(e.to_string()),
    })?;
    Ok(Some(PathBeneath::new(fd, access)))
}

/// True when the enforced ruleset confines pathname UNIX sockets
/// (`connect(2)`/`sendto(2)` to a socket file need a grant): fully enforced
/// at ABI [`LANDLOCK_ABI_UNIX`] or later. Otherwise seccomp closes that
/// door instead ([`crate::seccomp_policy::UNIX_PATH_RULES`]).
pub fn confines_unix_paths(r: &LandlockReport) -> bool {
    r.status == "full"
        && r.kernel_abi >= i32::from(LANDLOCK_ABI_UNIX)
        && r.requested_abi >= LANDLOCK_ABI_UNIX
}

/// Why a Landlock result is not complete, or `None` when it is.
pub fn degraded_reason(r: &LandlockReport) -> Option<String> {
    match r.status.as_str() {
        "full" => None,
        "none" => Some(format!(
            "Landlock is not available (kernel ABI {})",
            r.kernel_abi
        )),
        _ => Some(format!(
            "Landlock ruleset only partially enforced: kernel ABI {} is below the required {}",
            r.kernel_abi, r.min_abi
        )),
    }
}

/// A warning when the kernel knows Landlock rights this build cannot
/// request (its ABI is newer than [`MAX_LANDLOCK_ABI`]).
pub fn newer_kernel_warning(r: &LandlockReport) -> Option<String> {
    (r.kernel_abi > i32::from(MAX_LANDLOCK_ABI)).then(|| {
        format!(
            "kernel Landlock ABI {} is newer than this build knows ({MAX_LANDLOCK_ABI}): rights added since are not handled",
            r.kernel_abi
        )
    })
}

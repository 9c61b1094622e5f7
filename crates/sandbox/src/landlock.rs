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
    ABI, Access as _, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd,
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
    /// Read (files and directory listings, no execute) beneath each; each
    /// must exist (the minimal root's `/`).
    pub read_dirs: Vec<PathBuf>,
    /// TCP ports connect(2) may reach (a setup's forwarder; from ABI 4).
    pub tcp_connect: Vec<u16>,
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

/// How a path is granted: the rights beneath a directory, or of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Read files and list directories.
    Read,
    /// Read, list and execute.
    ReadExec,
    /// Every right of the ABI: create, write, remove, rename, truncate, ...
    All,
    /// Read a file (devices).
    FileRead,
    /// Read and write a file, no ioctl (devices).
    FileReadWrite,
    /// Read and execute a file (one program).
    FileExec,
    /// Write and truncate files beneath (the /proc id maps).
    FileWrite,
}

impl Access {
    /// The Landlock rights of this grant under `abi`.
    pub fn flags(self, abi: ABI) -> BitFlags<AccessFs> {
        let flags = match self {
            Access::Read => AccessFs::ReadFile | AccessFs::ReadDir,
            Access::ReadExec => AccessFs::from_read(abi),
            Access::All => AccessFs::from_all(abi),
            Access::FileRead => AccessFs::ReadFile.into(),
            Access::FileReadWrite => AccessFs::ReadFile | AccessFs::WriteFile,
            Access::FileExec => AccessFs::ReadFile | AccessFs::Execute,
            Access::FileWrite => AccessFs::WriteFile | AccessFs::Truncate,
        };
        flags & AccessFs::from_all(abi)
    }

    /// How docs name it.
    pub fn describe(self) -> &'static str {
        match self {
            Access::Read => "read",
            Access::ReadExec => "read + execute",
            Access::All => "every right",
            Access::FileRead => "read (file)",
            Access::FileReadWrite => "read + write (file, no ioctl)",
            Access::FileExec => "read + execute (file)",
            Access::FileWrite => "write + truncate",
        }
    }
}

/// One path to grant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// The path (a directory grants beneath it).
    pub path: PathBuf,
    /// The rights.
    pub access: Access,
    /// Refuse when the path is missing (otherwise it is skipped).
    pub required: bool,
}

impl Grants {
    /// The grants as rules, in a fixed order.
    pub fn rules(&self) -> Vec<Rule> {
        let sets: [(&[PathBuf], Access, bool); 6] = [
            (&self.read_dirs, Access::Read, true),
            (&self.ro, Access::ReadExec, true),
            (&self.ro_if_present, Access::ReadExec, false),
            (&self.rw, Access::All, true),
            (&self.rw_files_if_present, Access::FileReadWrite, false),
            (&self.ro_files_if_present, Access::FileRead, false),
        ];
        sets.into_iter()
            .flat_map(|(paths, access, required)| {
                paths.iter().map(move |p| Rule {
                    path: p.clone(),
                    access,
                    required,
                })
            })
            .collect()
    }
}

/// Builds and enforces the ruleset on the calling thread (airlock-confine).
pub fn restrict(grants: &Grants, min_abi: u8) -> Result<LandlockReport> {
    enforce_with_tcp(
        &grants.rules(),
        &grants.tcp_connect,
        min_abi,
        MAX_LANDLOCK_ABI,
    )
}

/// Builds and enforces a ruleset of `rules` on the calling thread. Every
/// right of the kernel's ABI (at most `max_abi`, at least `min_abi`) is
/// handled, so what `rules` do not grant is denied. The one Landlock
/// routine of airlock: airlock-confine and every daemon's lockdown use it.
pub fn enforce(rules: &[Rule], min_abi: u8, max_abi: u8) -> Result<LandlockReport> {
    enforce_with_tcp(rules, &[], min_abi, max_abi)
}

/// [`enforce`], also allowing TCP connect(2) to `tcp_connect_ports` (from
/// ABI 4 Landlock handles TCP, so without a port rule every connection is
/// denied).
pub fn enforce_with_tcp(
    rules: &[Rule],
    tcp_connect_ports: &[u16],
    min_abi: u8,
    max_abi: u8,
) -> Result<LandlockReport> {
    let kernel = kernel_abi();
    let requested = (kernel.clamp(0, i32::from(max_abi)) as u8).max(min_abi);
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
    for r in rules {
        let Some(rule) = rule(&r.path, r.access.flags(abi), abi, r.required)? else {
            continue;
        };
        created = created.add_rule(rule).map_err(ll)?;
    }
    if !net.is_empty() {
        for port in tcp_connect_ports {
            created = created
                .add_rule(landlock::NetPort::new(*port, AccessNet::ConnectTcp))
                .map_err(ll)?;
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

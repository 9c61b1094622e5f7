//! A daemon confines itself: [`lockdown`] applies a [`Role`]'s policy to
//! the calling process, once its configuration is read and its resources
//! are open, before it starts any thread (Landlock and seccomp bind the
//! calling thread and the threads and children it creates afterwards; a
//! thread started before would stay unconfined, so that is refused).
//!
//! The steps, in order, each failing hard:
//! 1. one thread (checked);
//! 2. the capability bounding set emptied, securebits locked (when held);
//! 3. no_new_privs;
//! 4. RLIMIT_CORE 0 and the role's limits;
//! 5. Landlock: the role's grants, every other right of the ABI denied;
//! 6. seccomp, last: the role's deny-list.

use std::fmt;
use std::path::PathBuf;

use nix::sys::resource::{Resource, getrlimit, setrlimit};

use crate::error::{Error, Result, errno};
use crate::landlock::{self, Rule};
use crate::report::LandlockReport;
use crate::role::{Bounding, Degraded, Limit, Paths, Place, Role, Who};
use crate::{caps, no_new_privs, seccomp};

/// What [`lockdown`] did, for the daemon's log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// The role applied.
    pub role: Role,
    /// The capability bounding set: "emptied", "not held" or "kept".
    pub bounding: &'static str,
    /// Landlock's result.
    pub landlock: LandlockReport,
    /// Landlock is not fully enforced (and the role allowed that).
    pub degraded: bool,
    /// Number of seccomp rows installed.
    pub seccomp_rules: usize,
    /// Anything a reader of the log should know.
    pub notes: Vec<String>,
}

impl Report {
    /// "full", "degraded", or "own root" (the spawner in the minimal root,
    /// whose mount namespace is its filesystem confinement).
    pub fn status(&self) -> &'static str {
        if self.landlock.status == OWN_ROOT {
            "not used (own root)"
        } else if self.degraded {
            "degraded"
        } else {
            "full"
        }
    }
}

/// [`LandlockReport::status`] of a spawner that relies on its own root.
const OWN_ROOT: &str = "own-root";

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "lockdown {}: bounding set {}, no_new_privs, RLIMIT_CORE 0, landlock {} (kernel ABI {}, requested {}), seccomp {} rules",
            self.role.program(),
            self.bounding,
            self.status(),
            self.landlock.kernel_abi,
            self.landlock.requested_abi,
            self.seccomp_rules
        )?;
        for n in &self.notes {
            write!(f, "; {n}")?;
        }
        Ok(())
    }
}

/// Confines the calling process as `role`, with `paths` resolved from the
/// daemon's configuration. See the module documentation for the order.
pub fn lockdown(role: Role, paths: &Paths) -> Result<Report> {
    apply(role, paths, true, true)
}

/// Confines the executor's spawner ([`Role::Spawner`]) once it has prepared
/// its sandbox. In the minimal root, Landlock is not applied: it would
/// forbid the mounts each command's view is made of, and the spawner's own
/// mount namespace already holds nothing but the command root's template
/// and the work root. In the host view, Landlock applies with the role's
/// grants.
pub fn lockdown_spawner(
    view: crate::report::ViewMode,
    work_root: &std::path::Path,
    allow_degraded: bool,
) -> Result<Report> {
    let mut paths = Paths::new().with(crate::role::Slot::WorkRoot, work_root);
    paths.allow_degraded = allow_degraded;
    // The minimal root's spawner no longer sees /proc: its sandbox's
    // preparation checked it was single-threaded, and it starts no thread.
    let host_view = view == crate::report::ViewMode::HostView;
    apply(Role::Spawner, &paths, host_view, host_view)
}

fn apply(role: Role, paths: &Paths, use_landlock: bool, check_threads: bool) -> Result<Report> {
    let policy = role.policy();
    let mut notes = Vec::new();
    // 1. One thread: a thread started earlier would escape Landlock.
    let threads = std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count());
    if check_threads && threads != 1 {
        return Err(Error::NotSingleThreaded { threads });
    }
    let root = nix::unistd::geteuid().is_root();
    // 2. The capability bounding set.
    let holds_setpcap = ::caps::has_cap(
        None,
        ::caps::CapSet::Effective,
        ::caps::Capability::CAP_SETPCAP,
    )
    .unwrap_or(false);
    let bounding = match (policy.bounding, holds_setpcap) {
        (Bounding::Empty, true) => {
            caps::drop_bounding()?;
            "emptied"
        }
        (Bounding::Empty, false) => "not held",
        (Bounding::Keep(why), held) => {
            if held {
                notes.push(format!("bounding set kept: {why}"));
            }
            "kept"
        }
    };
    // 3. execve can never grant privileges again.
    no_new_privs::set()?;
    // 4. Resource limits: no core dumps, and the role's.
    let mut limits = vec![(Resource::RLIMIT_CORE, "RLIMIT_CORE", 0)];
    for (limit, value, _) in policy.limits {
        limits.push(match limit {
            Limit::OpenFiles => (Resource::RLIMIT_NOFILE, limit.name(), *value),
        });
    }
    for (resource, name, value) in limits {
        set_limit(resource, name, value)?;
    }
    // 5. Landlock.
    if !use_landlock {
        notes.push(
            "Landlock not applied: the process's own mount namespace holds only the minimal root's template and the work root".into(),
        );
        // The spawner's inits bring up `lo` and listen on it for a setup,
        // in the command's own network namespace (crate::sandbox::Job::
        // network): IP sockets, created before the command exists. The
        // spawner's own namespace is the executor's, which holds only lo.
        let seccomp_rules = role.seccomp_rules_for(role == Role::Spawner);
        seccomp::install_rules(&seccomp_rules)?;
        return Ok(Report {
            role,
            bounding,
            landlock: LandlockReport {
                kernel_abi: landlock::kernel_abi(),
                requested_abi: 0,
                min_abi: 0,
                status: OWN_ROOT.into(),
            },
            degraded: false,
            seccomp_rules: seccomp_rules.len(),
            notes,
        });
    }
    let tcp = !paths.tcp_connect.is_empty();
    if tcp && policy.tcp.is_none() {
        return Err(Error::Landlock(format!(
            "{} never connects over TCP, yet TCP ports were given",
            role.program()
        )));
    }
    let mut rules = landlock_rules(role, paths, root, &mut notes);
    if let Some(tcp_policy) = policy.tcp.filter(|_| tcp) {
        rules.extend(tcp_policy.grants.iter().filter_map(|g| match g.place {
            Place::Fixed(p) => Some(Rule {
                path: PathBuf::from(p),
                access: g.access,
                required: false,
            }),
            Place::Config(_) => None,
        }));
        notes.push(format!("TCP connect to ports {:?}", paths.tcp_connect));
    }
    let landlock = landlock::enforce_with_tcp(&rules, &paths.tcp_connect, 1, policy.max_abi.0)?;
    if let Some(w) = landlock::newer_kernel_warning(&landlock) {
        notes.push(w);
    }
    let degraded = match landlock::degraded_reason(&landlock) {
        None => false,
        Some(reason) => {
            let allowed = match policy.degraded {
                Degraded::Warn => true,
                Degraded::RefuseUnlessAllowed => paths.allow_degraded,
            };
            if !allowed {
                return Err(Error::Degraded { reason });
            }
            eprintln!(
                "{}: WARNING: SANDBOX DEGRADED: {reason}; running without Landlock's filesystem confinement",
                role.program()
            );
            notes.push(format!("DEGRADED: {reason}"));
            true
        }
    };
    // 6. seccomp, last.
    let seccomp_rules = role.seccomp_rules_for(tcp);
    seccomp::install_rules(&seccomp_rules)?;
    #[cfg(feature = "lockdown-probe")]
    crate::probe::arm(role);
    Ok(Report {
        role,
        bounding,
        landlock,
        degraded,
        seccomp_rules: seccomp_rules.len(),
        notes,
    })
}

/// Lowers `resource` to `value` unless it is already at or below (a unit's
/// `LimitCORE=0` under a filter that denies setrlimit(2) then suffices).
fn set_limit(resource: Resource, name: &'static str, value: u64) -> Result<()> {
    if let Ok((soft, hard)) = getrlimit(resource) {
        if soft <= value && hard <= value {
            return Ok(());
        }
    }
    setrlimit(resource, value, value).map_err(|e| Error::Rlimit {
        resource: name,
        source: errno(e),
    })
}

/// The role's grants resolved against `paths`.
fn landlock_rules(role: Role, paths: &Paths, root: bool, notes: &mut Vec<String>) -> Vec<Rule> {
    let mut rules = Vec::new();
    for g in role.grants() {
        if g.who == Who::NotRoot && root {
            continue;
        }
        match g.place {
            Place::Fixed(p) => rules.push(Rule {
                path: PathBuf::from(p),
                access: g.access,
                required: false,
            }),
            Place::Config(slot) => {
                for p in paths.get(slot) {
                    if !g.required && !p.exists() {
                        notes.push(format!("{} does not exist: not granted", p.display()));
                        continue;
                    }
                    rules.push(Rule {
                        path: p.clone(),
                        access: g.access,
                        required: true,
                    });
                }
            }
        }
    }
    rules
}

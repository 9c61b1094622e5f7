//! The cgroups airlock-local delegates to its executor, for the walls
//! between jobs ([`airlock_sandbox::cgroup`]): what systemd's
//! `Delegate=yes` does for the installed unit.
//!
//! Made only where airlock-local runs as root on a machine that mounts the
//! cgroup v1 controllers one per hierarchy (`/sys/fs/cgroup/memory`,
//! `…/pids`, and `…/cpu`, `…/cpuacct` and `…/blkio` when there: CPU
//! shares and quota, CPU time, IO weight): a directory in each, given to the
//! executor's user, named in the executor's `AIRLOCK_EXECUTOR_CGROUP`. A
//! machine with the unified (v2) hierarchy runs the installed units,
//! whose systemd delegates the executor's own cgroup; airlock-local makes
//! none there (the executor could not move itself into one airlock-local
//! made: cgroup v2 lets a process change cgroups only below a common
//! ancestor it may write). Removed when the stack stops.

use crate::layout::Ids;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The v1 hierarchies the walls use, the first two required.
const CONTROLLERS: [&str; 5] = ["memory", "pids", "cpu", "cpuacct", "blkio"];

static MADE: AtomicUsize = AtomicUsize::new(0);

/// The executor's delegated cgroups; removed when dropped.
#[derive(Debug)]
pub struct Delegated {
    dirs: Vec<PathBuf>,
    env: String,
}

/// Whether `dir` is the root of a cgroup v1 hierarchy holding `controller`.
fn v1_hierarchy(dir: &Path, controller: &str) -> bool {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let target = dir.to_string_lossy();
    mounts.lines().any(|l| {
        let mut fields = l.split(" - ");
        let (Some(left), Some(right)) = (fields.next(), fields.next()) else {
            return false;
        };
        left.split(' ').nth(4) == Some(&*target)
            && right.starts_with("cgroup ")
            && right
                .split(' ')
                .nth(2)
                .is_some_and(|opts| opts.split(',').any(|o| o == controller))
    })
}

impl Delegated {
    /// Makes the executor's cgroups for this stack, or `None` (not root,
    /// no v1 memory and pids hierarchies, or a failure, said on stderr).
    pub fn make(ids: &Ids) -> Option<Delegated> {
        if !nix::unistd::geteuid().is_root() {
            return None;
        }
        let root = Path::new("/sys/fs/cgroup");
        // `/sys/fs/cgroup/cpu` may be a link to a hierarchy mounted with
        // cpuacct (`cpu,cpuacct`): its mount point is the link's target,
        // and one directory there serves both.
        let present: Vec<(&str, PathBuf)> = CONTROLLERS
            .into_iter()
            .filter_map(|c| {
                let at = std::fs::canonicalize(root.join(c)).ok()?;
                v1_hierarchy(&at, c).then_some((c, at))
            })
            .collect();
        let has = |name: &str| present.iter().any(|(c, _)| *c == name);
        if !has("memory") || !has("pids") {
            return None;
        }
        let name = format!(
            "airlock-local-{}-{}",
            std::process::id(),
            MADE.fetch_add(1, Ordering::SeqCst)
        );
        let mut made = Delegated {
            dirs: Vec::new(),
            env: String::from("v1:"),
        };
        for (c, at) in present {
            let dir = at.join(&name);
            let made_here = !made.dirs.contains(&dir);
            let given = if made_here {
                std::fs::create_dir(&dir)
            } else {
                Ok(())
            }
            .and_then(|()| {
                std::os::unix::fs::chown(&dir, Some(ids.executor.uid), Some(ids.executor.gid))
            });
            if let Err(e) = given {
                eprintln!(
                    "airlock-local: no walls between jobs: {}: {e}",
                    dir.display()
                );
                return None;
            }
            if !made.env.ends_with(':') {
                made.env.push(',');
            }
            made.env.push_str(&format!("{c}={}", dir.display()));
            if made_here {
                made.dirs.push(dir);
            }
        }
        Some(made)
    }

    /// The executor's environment entry naming them.
    pub fn env(&self) -> (String, String) {
        (airlock_sandbox::cgroup::ENV.to_owned(), self.env.clone())
    }
}

impl Drop for Delegated {
    /// Removes the job cgroups the executor made, then its own; what a
    /// process still holds stays (and is said).
    fn drop(&mut self) {
        for dir in &self.dirs {
            let children = std::fs::read_dir(dir)
                .map(|d| {
                    d.flatten()
                        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                        .map(|e| e.path())
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default();
            for child in children.iter().chain(std::iter::once(dir)) {
                // The jobs' processes die with the executor; give them a
                // moment to be gone.
                let mut tries = 0;
                while let Err(e) = std::fs::remove_dir(child) {
                    tries += 1;
                    if tries > 50 {
                        eprintln!("airlock-local: left {}: {e}", child.display());
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            }
        }
    }
}

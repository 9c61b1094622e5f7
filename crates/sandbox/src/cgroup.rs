//! Walls between jobs: a cgroup for each of the executor's job slots,
//! below a cgroup delegated to the executor, so that each job's commands
//! have memory and process limits of their own, their peaks measured, an
//! equal share of CPU (and an optional quota), an equal IO weight where
//! the kernel has one, and their CPU time counted, while the executor
//! itself stays outside every job's group (a job's OOM never reaches it).
//!
//! ```text
//!  <base>/                    delegated to the executor's user
//!    executor/                v2: the executor itself (a cgroup whose
//!                             children use its controllers holds no process)
//!    job-0/ … job-N/          one per spawner: the spawner and every
//!                             command it starts; memory, pids, cpu
//!                             (and io where the kernel has it)
//! ```
//!
//! What each slot gets, by interface:
//!
//! | wall | v2 | v1 |
//! |---|---|---|
//! | memory, no swap | `memory.max`, `memory.swap.max` 0 | `memory.limit_in_bytes`, `memory.swappiness` 0 |
//! | processes | `pids.max` | `pids.max` |
//! | CPU share, equal | `cpu.weight` 100 | `cpu.shares` 1024 |
//! | CPU quota (`job_cpu_max`) | `cpu.max` | `cpu.cfs_quota_us` / `cpu.cfs_period_us` |
//! | IO weight, equal | `io.weight` 100 | `blkio.weight` 500 (or `blkio.bfq.weight`) |
//! | CPU used | `cpu.stat` `usage_usec` | `cpuacct.usage` |
//!
//! The CPU and IO walls are best effort: a kernel without the controller
//! (or an IO scheduler without weights: this machine's v1 `blkio` has
//! only throttling files) gets none, silently, and [`Walls::io_weight`]
//! says so.
//!
//! Two kernel interfaces, one use ([`Tree`]):
//! - **cgroup v2** (Debian 12 and 13 under systemd: `Delegate=yes` hands
//!   the unit's cgroup to its user): one directory, memory, pids and cpu
//!   enabled for the children, `memory.swap.max` 0;
//! - **cgroup v1** (controllers mounted one per hierarchy, as on machines
//!   without systemd; airlock-local): one directory per controller
//!   (`memory`, `pids`, `cpu`), each given to the executor's user by
//!   whoever starts it.
//!
//! The spawner lives in its job's cgroup with the commands, so a job's OOM
//! takes the job's largest process (the command that grew), never the
//! group as one: `memory.oom.group` would take the spawner too, and its
//! slot with it.
//!
//! Every file a job's limits and counters live in is opened when the walls
//! are made, before the executor confines itself: afterwards it reads and
//! writes them through those descriptors, so its Landlock rules need not
//! name the cgroup file system at all.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The environment variable that names the executor's delegated cgroups
/// ([`Tree::parse`]), set by whoever starts it (airlock-local).
pub const ENV: &str = "AIRLOCK_EXECUTOR_CGROUP";

/// A controller the walls use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Controller {
    /// Memory: the limit, its peak, OOM kills.
    Memory,
    /// Processes: the limit, how often it refused a fork.
    Pids,
    /// CPU: equal shares between jobs, an optional quota.
    Cpu,
    /// v1 only: CPU time used (a hierarchy of its own, or mounted with
    /// `cpu`).
    Cpuacct,
    /// IO: equal weights between jobs, where the scheduler has them.
    Blkio,
}

impl Controller {
    fn name(self) -> &'static str {
        match self {
            Controller::Memory => "memory",
            Controller::Pids => "pids",
            Controller::Cpu => "cpu",
            Controller::Cpuacct => "cpuacct",
            Controller::Blkio => "blkio",
        }
    }
}

/// Where the walls go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tree {
    /// A cgroup v2 directory delegated to the executor's user.
    V2(PathBuf),
    /// cgroup v1: a directory per controller, each delegated.
    V1(Vec<(Controller, PathBuf)>),
}

fn io(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::Cgroup(format!("{what} {}: {e}", path.display()))
}

impl Tree {
    /// Parses [`ENV`]'s value: `v2:/sys/fs/cgroup/…`, or
    /// `v1:memory=/sys/fs/cgroup/memory/…,pids=…[,cpu=…][,cpuacct=…][,blkio=…]`
    /// (memory and pids required). Paths must be absolute.
    pub fn parse(text: &str) -> Result<Tree> {
        let bad = |why: &str| Error::Cgroup(format!("{ENV}={text:?}: {why}"));
        let absolute = |p: &str| {
            let p = PathBuf::from(p);
            if p.is_absolute() && !p.components().any(|c| c.as_os_str() == "..") {
                Ok(p)
            } else {
                Err(bad("paths must be absolute, without .."))
            }
        };
        if let Some(dir) = text.strip_prefix("v2:") {
            return Ok(Tree::V2(absolute(dir)?));
        }
        let Some(list) = text.strip_prefix("v1:") else {
            return Err(bad("expected v1:… or v2:…"));
        };
        let mut dirs = Vec::new();
        for item in list.split(',') {
            let (name, dir) = item
                .split_once('=')
                .ok_or_else(|| bad("expected CONTROLLER=PATH"))?;
            let c = match name {
                "memory" => Controller::Memory,
                "pids" => Controller::Pids,
                "cpu" => Controller::Cpu,
                "cpuacct" => Controller::Cpuacct,
                "blkio" => Controller::Blkio,
                _ => {
                    return Err(bad("controllers are memory, pids, cpu, cpuacct and blkio"));
                }
            };
            dirs.push((c, absolute(dir)?));
        }
        dirs.sort();
        dirs.dedup_by_key(|(c, _)| *c);
        for needed in [Controller::Memory, Controller::Pids] {
            if !dirs.iter().any(|(c, _)| *c == needed) {
                return Err(bad("memory and pids are required"));
            }
        }
        Ok(Tree::V1(dirs))
    }

    /// The executor's own cgroup, when it is a v2 cgroup delegated to it
    /// (its `cgroup.subtree_control` writable, as `Delegate=yes` makes it).
    pub fn delegated_v2() -> Option<Tree> {
        let me = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let rel = me.lines().find_map(|l| l.strip_prefix("0::"))?;
        let dir = Path::new("/sys/fs/cgroup").join(rel.trim_start_matches('/'));
        let control = dir.join("cgroup.subtree_control");
        let writable = nix::unistd::access(&control, nix::unistd::AccessFlags::W_OK).is_ok();
        let has = std::fs::read_to_string(dir.join("cgroup.controllers")).ok()?;
        (writable && has.split_whitespace().any(|c| c == "memory")).then_some(Tree::V2(dir))
    }

    /// The walls' tree: [`ENV`] when set, else a delegated v2 cgroup, else
    /// none.
    pub fn find() -> Result<Option<Tree>> {
        match std::env::var(ENV) {
            Ok(v) if !v.is_empty() => Tree::parse(&v).map(Some),
            _ => Ok(Tree::delegated_v2()),
        }
    }

    /// `v1` or `v2`.
    pub fn version(&self) -> &'static str {
        match self {
            Tree::V1(_) => "v1",
            Tree::V2(_) => "v2",
        }
    }
}

/// A job's limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of memory (and no swap).
    pub memory: u64,
    /// Processes (and threads).
    pub processes: u64,
    /// CPU time per period, in thousandths of a CPU (1000: one CPU's
    /// worth); `None`: no quota, only the equal share.
    pub cpu_max_millis: Option<u64>,
}

/// The CPU quota's period, in microseconds (the kernel's default).
pub const CPU_PERIOD_US: u64 = 100_000;

/// The CPU weight every job slot gets, by interface: the default of
/// siblings, so that jobs share equally and, on v2, the executor's own
/// leaf weighs as one job.
pub const CPU_WEIGHT_V2: u64 = 100;
/// v1's equivalent of [`CPU_WEIGHT_V2`] (`cpu.shares`).
pub const CPU_SHARES_V1: u64 = 1024;
/// v2's default `io.weight`.
pub const IO_WEIGHT_V2: u64 = 100;
/// v1's default `blkio.weight`.
pub const IO_WEIGHT_V1: u64 = 500;

/// `quota period` in microseconds for `millis` thousandths of a CPU.
fn cpu_quota_us(millis: u64) -> u64 {
    (millis.saturating_mul(CPU_PERIOD_US) / 1000).max(1000)
}

/// What one command did against its job's walls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Measure {
    /// Highest memory use seen (bytes), when the kernel reports it.
    pub memory_peak: Option<u64>,
    /// Processes killed by the job's OOM killer meanwhile.
    pub oom_kills: u64,
    /// Forks the process limit refused meanwhile.
    pub fork_refusals: u64,
    /// CPU time the job's cgroup used meanwhile (every process of it,
    /// those no one waited for too), in microseconds, when the kernel
    /// counts it.
    pub cpu_usage_us: Option<u64>,
}

/// The counters read before a command, to subtract afterwards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    oom_kills: u64,
    fork_refusals: u64,
    cpu_usage_us: Option<u64>,
}

/// Where a slot's CPU time is read, and in what unit.
#[derive(Debug)]
enum CpuUsage {
    /// v2 `cpu.stat`: `usage_usec`.
    Stat(File),
    /// v1 `cpuacct.usage`: nanoseconds.
    Nanos(File),
}

impl CpuUsage {
    fn read_us(&self) -> Option<u64> {
        match self {
            CpuUsage::Stat(f) => read_kept(f).lines().find_map(|l| {
                l.strip_prefix("usage_usec ")
                    .and_then(|v| v.trim().parse().ok())
            }),
            CpuUsage::Nanos(f) => read_kept(f).trim().parse::<u64>().ok().map(|ns| ns / 1000),
        }
    }
}

/// A slot's CPU files: the quota, and where its share is set.
#[derive(Debug)]
enum CpuFiles {
    V2 { max: File },
    V1 { quota: File },
}

/// One job slot's files, opened once.
#[derive(Debug)]
struct Slot {
    /// `cgroup.procs` of each of the slot's directories (the spawner moves
    /// itself in by writing its pid there).
    procs: Vec<PathBuf>,
    memory_max: File,
    memory_events: File,
    memory_peak: Option<File>,
    pids_max: File,
    pids_events: File,
    /// v1 only: the peak is reset before each command.
    resettable_peak: bool,
    /// The quota's file, when the cpu controller is there.
    cpu: Option<CpuFiles>,
    cpu_usage: Option<CpuUsage>,
    /// The IO weight set, when the kernel has one.
    io_weight: Option<u64>,
}

/// The walls of every job slot.
#[derive(Debug)]
pub struct Walls {
    tree: Tree,
    slots: Vec<Slot>,
}

/// Writes `value` to `dir/name` when the file is there; whether it took.
fn set_if_there(dir: &Path, name: &str, value: &str) -> bool {
    let path = dir.join(name);
    path.exists() && std::fs::write(&path, value).is_ok()
}

fn open_rw(path: &Path) -> Result<File> {
    File::options()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| io("opening", path, e))
}

fn open_ro(path: &Path) -> Result<File> {
    File::open(path).map_err(|e| io("opening", path, e))
}

fn write_file(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|e| io("writing", path, e))
}

fn mkdir(path: &Path) -> Result<()> {
    match std::fs::DirBuilder::new().mode(0o755).create(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(io("making", path, e)),
    }
}

/// Reads a whole cgroup file through a kept descriptor.
fn read_kept(f: &File) -> String {
    let mut f = f;
    let mut text = String::new();
    if f.seek(SeekFrom::Start(0)).is_ok() {
        let _ = f.read_to_string(&mut text);
    }
    text
}

/// Writes a value through a kept descriptor (one write, as cgroup files
/// want).
fn write_kept(f: &File, text: &str) -> Result<()> {
    f.write_at(text.as_bytes(), 0)
        .map(drop)
        .map_err(|e| Error::Cgroup(format!("writing {text:?}: {e}")))
}

/// The value of `key` in a flat-keyed file (`memory.events`, `pids.events`,
/// v1's `memory.oom_control`).
fn keyed(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
        .unwrap_or(0)
}

impl Walls {
    /// Makes `slots` job cgroups under `tree` (the v2 executor moved into
    /// its own leaf first) and opens their files. Must run before the
    /// executor confines itself and before it forks its spawners.
    pub fn create(tree: &Tree, slots: usize) -> Result<Walls> {
        if let Tree::V2(base) = tree {
            // No process in a cgroup whose controllers its children use:
            // the executor moves into a leaf of its own first; then the
            // controllers are turned on for the children.
            let own = base.join("executor");
            mkdir(&own)?;
            write_file(&own.join("cgroup.procs"), "0")?;
            let control = base.join("cgroup.subtree_control");
            write_file(&control, "+memory +pids")?;
            // CPU shares and IO weights are best effort: a kernel may lack
            // the controller (each is asked for alone, so one missing does
            // not refuse the other).
            let _ = std::fs::write(&control, "+cpu");
            let _ = std::fs::write(&control, "+io");
        }
        let slots = (0..slots)
            .map(|k| match tree {
                Tree::V2(base) => Self::slot_v2(base, k),
                Tree::V1(dirs) => Self::slot_v1(dirs, k),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Walls {
            tree: tree.clone(),
            slots,
        })
    }

    fn slot_v2(base: &Path, k: usize) -> Result<Slot> {
        let dir = base.join(format!("job-{k}"));
        mkdir(&dir)?;
        // No swap to hide in (best effort: swap accounting may be off).
        let _ = std::fs::write(dir.join("memory.swap.max"), "0");
        let cpu = set_if_there(&dir, "cpu.weight", &CPU_WEIGHT_V2.to_string())
            .then(|| open_rw(&dir.join("cpu.max")))
            .transpose()?
            .map(|max| CpuFiles::V2 { max });
        let io_weight = set_if_there(&dir, "io.weight", &format!("default {IO_WEIGHT_V2}"))
            .then_some(IO_WEIGHT_V2);
        Ok(Slot {
            procs: vec![dir.join("cgroup.procs")],
            memory_max: open_rw(&dir.join("memory.max"))?,
            memory_events: open_ro(&dir.join("memory.events"))?,
            memory_peak: File::open(dir.join("memory.peak")).ok(),
            pids_max: open_rw(&dir.join("pids.max"))?,
            pids_events: open_ro(&dir.join("pids.events"))?,
            resettable_peak: false,
            cpu,
            // cpu.stat's usage_usec is kept whether or not the cpu
            // controller is on.
            cpu_usage: File::open(dir.join("cpu.stat")).ok().map(CpuUsage::Stat),
            io_weight,
        })
    }

    fn slot_v1(dirs: &[(Controller, PathBuf)], k: usize) -> Result<Slot> {
        let dir = |c: Controller| {
            dirs.iter()
                .find(|(d, _)| *d == c)
                .map(|(_, p)| p.join(format!("job-{k}")))
                .ok_or_else(|| Error::Cgroup(format!("no {} hierarchy", c.name())))
        };
        let mut procs = Vec::new();
        for (c, _) in dirs {
            let d = dir(*c)?;
            mkdir(&d)?;
            procs.push(d.join("cgroup.procs"));
        }
        let (memory, pids) = (dir(Controller::Memory)?, dir(Controller::Pids)?);
        // No swap where the kernel accounts it (memsw), best effort.
        let _ = std::fs::write(memory.join("memory.swappiness"), "0");
        let cpu = match dir(Controller::Cpu) {
            Ok(d) if set_if_there(&d, "cpu.shares", &CPU_SHARES_V1.to_string()) => {
                write_file(&d.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
                Some(CpuFiles::V1 {
                    quota: open_rw(&d.join("cpu.cfs_quota_us"))?,
                })
            }
            _ => None,
        };
        // cpuacct: its own hierarchy, or mounted with cpu (`cpu,cpuacct`).
        let cpu_usage = [Controller::Cpuacct, Controller::Cpu]
            .into_iter()
            .filter_map(|c| dir(c).ok())
            .find_map(|d| File::open(d.join("cpuacct.usage")).ok())
            .map(CpuUsage::Nanos);
        // blkio.weight only where the IO scheduler has weights (CFQ, or
        // BFQ's own file); none on a kernel that only throttles.
        let w = IO_WEIGHT_V1.to_string();
        let io_weight = dir(Controller::Blkio).ok().and_then(|d| {
            (set_if_there(&d, "blkio.weight", &w) || set_if_there(&d, "blkio.bfq.weight", &w))
                .then_some(IO_WEIGHT_V1)
        });
        Ok(Slot {
            procs,
            memory_max: open_rw(&memory.join("memory.limit_in_bytes"))?,
            memory_events: open_ro(&memory.join("memory.oom_control"))?,
            memory_peak: File::options()
                .read(true)
                .write(true)
                .open(memory.join("memory.max_usage_in_bytes"))
                .ok(),
            pids_max: open_rw(&pids.join("pids.max"))?,
            pids_events: open_ro(&pids.join("pids.events"))?,
            resettable_peak: true,
            cpu,
            cpu_usage,
            io_weight,
        })
    }

    /// The tree the walls are in.
    pub fn tree(&self) -> &Tree {
        &self.tree
    }

    /// How many slots.
    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    /// The `cgroup.procs` files slot `k`'s spawner moves itself into.
    pub fn procs(&self, k: usize) -> Vec<PathBuf> {
        self.slots
            .get(k)
            .map(|s| s.procs.clone())
            .unwrap_or_default()
    }

    /// Sets slot `k`'s limits, for the job about to run in it.
    pub fn set_limits(&self, k: usize, limits: &Limits) -> Result<()> {
        let s = self.slot(k)?;
        write_kept(&s.memory_max, &limits.memory.to_string())?;
        write_kept(&s.pids_max, &limits.processes.to_string())?;
        match (&s.cpu, limits.cpu_max_millis) {
            (Some(CpuFiles::V2 { max }), q) => write_kept(
                max,
                &match q {
                    Some(m) => format!("{} {CPU_PERIOD_US}", cpu_quota_us(m)),
                    None => format!("max {CPU_PERIOD_US}"),
                },
            ),
            (Some(CpuFiles::V1 { quota }), q) => write_kept(
                quota,
                &q.map_or_else(|| "-1".to_owned(), |m| cpu_quota_us(m).to_string()),
            ),
            (None, Some(_)) => Err(Error::Cgroup(
                "a CPU quota is configured but the cpu controller is not delegated".into(),
            )),
            (None, None) => Ok(()),
        }
    }

    /// Whether slots have a CPU share and quota (the cpu controller).
    pub fn cpu(&self) -> bool {
        self.slots.first().is_some_and(|s| s.cpu.is_some())
    }

    /// The IO weight every slot has, when the kernel has IO weights.
    pub fn io_weight(&self) -> Option<u64> {
        self.slots.first().and_then(|s| s.io_weight)
    }

    /// The CPU weight every slot has (in the interface's unit: v2's
    /// `cpu.weight`, v1's `cpu.shares`), when the cpu controller is there.
    pub fn cpu_weight(&self) -> Option<u64> {
        self.cpu().then_some(match self.tree {
            Tree::V2(_) => CPU_WEIGHT_V2,
            Tree::V1(_) => CPU_SHARES_V1,
        })
    }

    fn slot(&self, k: usize) -> Result<&Slot> {
        self.slots
            .get(k)
            .ok_or_else(|| Error::Cgroup(format!("no job slot {k}")))
    }

    /// Before a command in slot `k`: its counters now, and its memory peak
    /// reset where the kernel allows (v1).
    pub fn before(&self, k: usize) -> Counters {
        let Ok(s) = self.slot(k) else {
            return Counters::default();
        };
        if s.resettable_peak {
            if let Some(f) = &s.memory_peak {
                let _ = write_kept(f, "0");
            }
        }
        Counters {
            oom_kills: keyed(&read_kept(&s.memory_events), "oom_kill "),
            fork_refusals: keyed(&read_kept(&s.pids_events), "max "),
            cpu_usage_us: s.cpu_usage.as_ref().and_then(CpuUsage::read_us),
        }
    }

    /// After a command in slot `k`: what it did since `before`.
    pub fn after(&self, k: usize, before: Counters) -> Measure {
        let Ok(s) = self.slot(k) else {
            return Measure::default();
        };
        Measure {
            memory_peak: s
                .memory_peak
                .as_ref()
                .and_then(|f| read_kept(f).trim().parse().ok()),
            oom_kills: keyed(&read_kept(&s.memory_events), "oom_kill ")
                .saturating_sub(before.oom_kills),
            fork_refusals: keyed(&read_kept(&s.pids_events), "max ")
                .saturating_sub(before.fork_refusals),
            cpu_usage_us: s
                .cpu_usage
                .as_ref()
                .and_then(CpuUsage::read_us)
                .zip(before.cpu_usage_us)
                .map(|(now, then)| now.saturating_sub(then)),
        }
    }

    /// Whether slot `k`'s memory peak covers one command (v1), or the whole
    /// life of the slot (v2 before the kernel let it be reset).
    pub fn peak_per_command(&self) -> bool {
        self.slots.first().is_some_and(|s| s.resettable_peak)
    }
}

/// Moves the calling process into every cgroup of `procs` (the spawner,
/// right after it is forked): all it starts from then on is in its job's
/// walls.
pub fn enter(procs: &[PathBuf]) -> Result<()> {
    for p in procs {
        let mut f = File::options()
            .write(true)
            .open(p)
            .map_err(|e| io("opening", p, e))?;
        f.write_all(b"0").map_err(|e| io("joining", p, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trees_parse_strictly() {
        assert_eq!(
            Tree::parse("v2:/sys/fs/cgroup/x").unwrap(),
            Tree::V2("/sys/fs/cgroup/x".into())
        );
        let v1 = Tree::parse("v1:pids=/c/pids/a,memory=/c/memory/a").unwrap();
        assert_eq!(
            v1,
            Tree::V1(vec![
                (Controller::Memory, "/c/memory/a".into()),
                (Controller::Pids, "/c/pids/a".into()),
            ])
        );
        for bad in [
            "",
            "v3:/x",
            "v2:relative",
            "v2:/a/../b",
            "v1:memory=/a",
            "v1:memory=/a,net_cls=/b,pids=/c",
            "v1:memory",
            "v1:pids=/c",
        ] {
            assert!(Tree::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_cpu_and_io_hierarchies_parse_and_quotas_are_per_period() {
        let v1 = Tree::parse("v1:memory=/m,pids=/p,blkio=/b,cpuacct=/a,cpu=/c").unwrap();
        let Tree::V1(dirs) = v1 else { panic!() };
        assert_eq!(
            dirs.iter().map(|(c, _)| c.name()).collect::<Vec<_>>(),
            ["memory", "pids", "cpu", "cpuacct", "blkio"]
        );
        // A thousandth of a CPU is a hundred microseconds of each period,
        // raised to the kernel's floor of a millisecond.
        assert_eq!(cpu_quota_us(1000), CPU_PERIOD_US);
        assert_eq!(cpu_quota_us(2500), 250_000);
        assert_eq!(cpu_quota_us(1), 1000);
    }

    #[test]
    fn cpu_time_is_read_in_microseconds_from_either_interface() {
        let dir = std::env::temp_dir().join(format!("airlock-cgroup-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (stat, usage) = (dir.join("cpu.stat"), dir.join("usage"));
        std::fs::write(&stat, "usage_usec 1234567\nuser_usec 1000000\n").unwrap();
        std::fs::write(&usage, "2500000999\n").unwrap();
        assert_eq!(
            CpuUsage::Stat(File::open(&stat).unwrap()).read_us(),
            Some(1_234_567)
        );
        assert_eq!(
            CpuUsage::Nanos(File::open(&usage).unwrap()).read_us(),
            Some(2_500_000)
        );
        std::fs::write(&stat, "nr_periods 0\n").unwrap();
        assert_eq!(CpuUsage::Stat(File::open(&stat).unwrap()).read_us(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn flat_keyed_files_are_read_by_key() {
        let events = "low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n";
        assert_eq!(keyed(events, "oom_kill "), 2);
        assert_eq!(keyed(events, "max "), 3);
        assert_eq!(
            keyed("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n", "oom_kill "),
            5
        );
        assert_eq!(keyed("", "max "), 0);
    }
}

//! The walls' CPU side on real cgroups (issue 44, item 2): every job slot
//! gets the same CPU weight, a configured quota lands in the kernel's
//! files and holds a spinner to it, no quota is the kernel's "none", and
//! the CPU time a slot used is counted, that of processes no one waited
//! for included.
//!
//! Needs root and the cgroup v1 memory, pids, cpu and cpuacct hierarchies
//! (this machine's and CI's); the v2 side is not provable here (the
//! unified hierarchy holds no controller), docs/privsep/confinement.md
//! says so.

use airlock_sandbox::cgroup::{CPU_PERIOD_US, CPU_SHARES_V1, Limits, Tree, Walls, enter};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The test's own v1 directories, removed when dropped (children first).
struct Scratch(Vec<PathBuf>);

impl Drop for Scratch {
    fn drop(&mut self) {
        for dir in &self.0 {
            if let Ok(d) = std::fs::read_dir(dir) {
                for e in d.flatten().filter(|e| e.path().is_dir()) {
                    let _ = std::fs::remove_dir(e.path());
                }
            }
            let _ = std::fs::remove_dir(dir);
        }
    }
}

fn v1_tree(name: &str) -> (Tree, Scratch) {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root (it makes cgroups): run it as root"
    );
    let mut spec = String::from("v1:");
    let mut dirs = Vec::new();
    for c in ["memory", "pids", "cpu", "cpuacct", "blkio"] {
        let root = PathBuf::from("/sys/fs/cgroup").join(c);
        if !root.join("cgroup.procs").exists() {
            assert!(
                !["memory", "pids", "cpu", "cpuacct"].contains(&c),
                "this test needs the cgroup v1 {c} hierarchy at {}",
                root.display()
            );
            continue;
        }
        let dir = root.join(format!("airlock-test-{name}-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        spec.push_str(&format!("{c}={},", dir.display()));
        dirs.push(dir);
    }
    spec.pop();
    (Tree::parse(&spec).unwrap(), Scratch(dirs))
}

fn read(path: PathBuf) -> String {
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .to_owned()
}

/// Forks a process into slot 0 that forks a grandchild spinning for
/// `spin`, which it never waits for (the parent exits at once), and waits
/// for the grandchild's end through the slot's emptiness.
fn spin_in_slot(walls: &Walls, spin: Duration, cpu_dir: &std::path::Path) {
    let procs = walls.procs(0);
    // SAFETY: the test process is single-threaded at this point of the
    // child (fork then only async-signal-safe work and _exit).
    match unsafe { nix::unistd::fork() }.unwrap() {
        nix::unistd::ForkResult::Child => {
            if enter(&procs).is_err() {
                // SAFETY: leaving the forked child without unwinding.
                unsafe { libc::_exit(2) };
            }
            // SAFETY: as above.
            if let Ok(nix::unistd::ForkResult::Child) = unsafe { nix::unistd::fork() } {
                let end = Instant::now() + spin;
                let mut x = 0u64;
                while Instant::now() < end {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                }
                std::hint::black_box(x);
            }
            // SAFETY: as above.
            unsafe { libc::_exit(0) };
        }
        nix::unistd::ForkResult::Parent { child } => {
            nix::sys::wait::waitpid(child, None).unwrap();
        }
    }
    let job = cpu_dir.join("job-0").join("cgroup.procs");
    let deadline = Instant::now() + spin + Duration::from_secs(30);
    while !read(job.clone()).is_empty() {
        assert!(Instant::now() < deadline, "the spinner never ended");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_cpu_quota_holds_a_spinner_to_it_and_its_cpu_time_is_counted() {
    let (tree, scratch) = v1_tree("cpu");
    let cpu_dir = scratch
        .0
        .iter()
        .find(|d| d.starts_with("/sys/fs/cgroup/cpu/"))
        .unwrap()
        .clone();
    let walls = Walls::create(&tree, 2).unwrap();
    assert!(walls.cpu(), "the cpu controller was delegated but not used");
    assert_eq!(walls.cpu_weight(), Some(CPU_SHARES_V1));
    let quota = Limits {
        memory: 256 << 20,
        processes: 16,
        cpu_max_millis: Some(250),
    };
    for k in 0..2 {
        walls
            .set_limits(
                k,
                &Limits {
                    cpu_max_millis: None,
                    ..quota
                },
            )
            .unwrap();
        let slot = cpu_dir.join(format!("job-{k}"));
        // Equal weights, no quota: the kernel's -1.
        assert_eq!(read(slot.join("cpu.shares")), CPU_SHARES_V1.to_string());
        assert_eq!(read(slot.join("cpu.cfs_quota_us")), "-1");
        assert_eq!(
            read(slot.join("cpu.cfs_period_us")),
            CPU_PERIOD_US.to_string()
        );
    }
    walls.set_limits(0, &quota).unwrap();
    assert_eq!(read(cpu_dir.join("job-0/cpu.cfs_quota_us")), "25000");

    let before = walls.before(0);
    let spin = Duration::from_millis(1500);
    let started = Instant::now();
    spin_in_slot(&walls, spin, &cpu_dir);
    let wall = started.elapsed();
    let m = walls.after(0, before);
    let used = m.cpu_usage_us.expect("cpuacct.usage was not read");
    println!("spun {wall:?} of wall under a quarter CPU: {used} µs of CPU");
    // The orphaned grandchild's CPU is the slot's: it ran at all.
    assert!(
        used > 50_000,
        "{used} µs: the slot's CPU time was not counted"
    );
    // A quarter of a CPU per period, whatever the machine's load: far
    // below what one unthrottled spinner of 1.5 s takes on an idle core.
    let bound = wall.as_micros() as u64 / 4 + 150_000;
    assert!(used <= bound, "{used} µs over the quota's {bound} µs");
    let throttled = read(cpu_dir.join("job-0/cpu.stat"));
    assert!(
        throttled
            .lines()
            .any(|l| l.strip_prefix("nr_throttled ").is_some_and(|n| n != "0")),
        "the quota never throttled the spinner:\n{throttled}"
    );
    drop(walls);
}

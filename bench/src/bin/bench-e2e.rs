//! bench-e2e: end-to-end tasks/s and latency of a trivial task (one file,
//! `/bin/true` as verification) through the real suite — supervisor,
//! worker, executor with full confinement, durable checkpoints at
//! synchronous=FULL — with 1 and 4 tasks in flight, plus the number of
//! fsyncs per task (counted with strace in a separate, untimed run), next
//! to the raw write+fsync rate of the same disk measured in the same run.
//!
//! Then the repository-size axis: the same trivial task (one file written,
//! `/bin/true`) on repositories of about 40, 2,000, 20,000 and 100,000
//! files (`--sizes`), one suite each: the first task's latency (the
//! executor asks for the source and fills its tree cache) and the median
//! of the next `--size-tasks` (warm cache), with the ratio of each warm
//! median to the smallest repository's (target: 20,000 files within 1.5×);
//! then the moving base (`--moves` tasks, each on main advanced by one
//! commit changing one file, then ten files, then renaming a directory of
//! 100 files), against the warm same-base median, with the source bytes
//! each task sent (from the worker's log; target: at most 1.5× warm at
//! 20,000 and 100,000 files);
//! and, per size, how long `airlockctl propose --worktree --dry-run` takes
//! to find one changed file in a git clone (through git's index) beside
//! the same tree as a plain directory (every file compared).
//!
//! With `--environments`, the environment axis: a Node package with a
//! registry dependency whose environment's setup is `npm ci` through
//! airlock-egress (the registry's host learnt at run time): the first
//! task (setup and verification), the next `--environment-tasks` with the
//! dependency layer reused, beside `npm test` run bare on a clean checkout
//! with its dependencies already fetched (target: reused within 1.15× of
//! bare). Needs the package registry.
//! Prints figures; asserts nothing.

use airlock_local::client::{Supervisor, task_on_demo};
use airlock_local::{Suite, Tuning, start_with};
use airlock_proto::task::{Decision, DecisionRequest, TaskState};
use airlock_testkit::git_dir_or_empty as git;
use serde_json::json;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The trivial task (one file written) with `argv` as its verification.
fn task_verified_by(id: &str, base: &str, argv: serde_json::Value) -> serde_json::Value {
    task_on_demo(
        id,
        base,
        1,
        json!({"operation": "write_file", "path": "bench.txt", "content": format!("{id}\n")}),
        json!([{"label": "check", "argv": argv, "timeout_seconds": 120}]),
    )
}

/// Runs `n` tasks keeping `inflight` outstanding; returns (elapsed, latencies).
fn drive(suite: &Suite, prefix: &str, n: usize, inflight: usize) -> (Duration, Vec<Duration>) {
    drive_verified_by(suite, prefix, n, inflight, &json!(["/bin/true"]))
}

/// [`drive`] with `argv` as each task's verification.
fn drive_verified_by(
    suite: &Suite,
    prefix: &str,
    n: usize,
    inflight: usize,
    argv: &serde_json::Value,
) -> (Duration, Vec<Duration>) {
    let client = Supervisor::connect(Some(suite.bus.address())).expect("bus");
    let base = git(
        &suite.layout.repos().join("demo.git"),
        &["rev-parse", "refs/heads/main"],
    );
    let mut pending: Vec<(String, Instant)> = Vec::new();
    let mut latencies = Vec::new();
    let mut next = 0;
    let started = Instant::now();
    while latencies.len() < n {
        while pending.len() < inflight && next < n {
            let id = format!("{prefix}-{next:04}");
            client
                .submit_task(&task_verified_by(&id, &base, argv.clone()))
                .expect("SubmitTask");
            pending.push((id, Instant::now()));
            next += 1;
        }
        let mut still = Vec::new();
        for (id, at) in pending {
            let v = client.get_task(&id).expect("GetTask");
            match v.state {
                TaskState::Succeeded => latencies.push(at.elapsed()),
                TaskState::Failed | TaskState::Cancelled => {
                    panic!("{id} ended {}: {:?}", v.state.as_str(), v.result)
                }
                _ => still.push((id, at)),
            }
        }
        pending = still;
        std::thread::sleep(Duration::from_millis(5));
    }
    (started.elapsed(), latencies)
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

fn raw_fsync_rate(dir: &Path, seconds: f64) -> f64 {
    let path = dir.join("raw-fsync.bin");
    let mut f = std::fs::File::create(&path).expect("raw file");
    let block = [0x5au8; 256];
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed().as_secs_f64() < seconds {
        f.write_all(&block).expect("write");
        f.sync_all().expect("fsync");
        n += 1;
    }
    let _ = std::fs::remove_file(&path);
    n as f64 / started.elapsed().as_secs_f64()
}

/// Counts fsync-family calls of every component while `n` tasks run one at a time.
fn fsyncs_per_task(state: PathBuf, n: usize) -> Option<f64> {
    if Command::new("strace")
        .arg("-V")
        .stdout(Stdio::null())
        .status()
        .is_err()
    {
        return None;
    }
    let suite = start_with(
        state.clone(),
        true,
        &Tuning {
            lease_seconds: 60,
            parallel_tasks: 1,
            ..Default::default()
        },
    )
    .expect("suite");
    drive(&suite, "warm", 1, 1);
    let out = state.join("strace.txt");
    let mut cmd = Command::new("strace");
    cmd.args([
        "-f",
        "-c",
        "-e",
        "trace=fsync,fdatasync,sync_file_range,syncfs",
        "-o",
    ])
    .arg(&out);
    for m in &suite.fleet.members {
        cmd.args(["-p", &m.child.id().to_string()]);
    }
    let mut tracer = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    std::thread::sleep(Duration::from_millis(500));
    drive(&suite, "count", n, 1);
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(tracer.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    );
    let _ = tracer.wait();
    drop(suite);
    let text = std::fs::read_to_string(&out).ok()?;
    let calls: u64 = text
        .lines()
        .filter(|l| {
            ["fsync", "fdatasync", "sync_file_range", "syncfs"]
                .contains(&l.split_whitespace().last().unwrap_or(""))
        })
        .filter_map(|l| l.split_whitespace().nth(3)?.parse::<u64>().ok())
        .sum();
    Some(calls as f64 / n as f64)
}

/// Grows the suite's demo repository to about `files` files in one commit
/// on main (git fast-import: 100 files per directory, each its own small
/// content), then gives it back to its owner.
fn grow_repository(repo: &Path, files: usize) {
    let base = git(repo, &["rev-parse", "refs/heads/main"]);
    let present = git(repo, &["ls-tree", "-r", "--name-only", &base])
        .lines()
        .count();
    let add = files.saturating_sub(present);
    let mut stream = airlock_testkit::numbered_blobs(add);
    let message = "grow for the size axis\n";
    write!(
        stream,
        "commit refs/heads/main\ncommitter bench <bench@airlock.invalid> 1700000000 +0000\ndata {}\n{message}from {base}\n",
        message.len()
    )
    .unwrap();
    airlock_testkit::numbered_paths(&mut stream, add, "tree/");
    airlock_testkit::fast_import(repo, &stream);
    give_back(repo);
}

/// Moves main one commit ahead, dated `time`, with `message` and the
/// fast-import file commands `changes` (each ending in a newline).
fn commit_on_main(repo: &Path, time: usize, message: &str, changes: &str) {
    let head = git(repo, &["rev-parse", "refs/heads/main"]);
    let stream = format!(
        "commit refs/heads/main\ncommitter bench <bench@airlock.invalid> {time} +0000\ndata {}\n{message}from {head}\n{changes}\n",
        message.len()
    );
    airlock_testkit::fast_import(repo, stream.as_bytes());
    give_back(repo);
}

/// Moves main one commit ahead that changes the first `changed` files of
/// its tree (new content each time: `round` is in it).
fn advance_main(repo: &Path, changed: usize, round: usize) {
    let head = git(repo, &["rev-parse", "refs/heads/main"]);
    let paths = git(repo, &["ls-tree", "-r", "--name-only", &head]);
    let mut changes = String::new();
    for path in paths
        .lines()
        .filter(|p| p.starts_with("tree/"))
        .take(changed)
    {
        let content = format!("{path} changed in round {round}\n");
        changes += &format!("M 100644 inline {path}\ndata {}\n{content}", content.len());
    }
    commit_on_main(
        repo,
        1_700_000_000 + round,
        &format!("move the base: {changed} file(s), round {round}\n"),
        &changes,
    );
}

/// Moves main one commit ahead that renames the `round`th directory of
/// the grown tree (100 files) to a new name: its files cross as tree
/// entries alone, the executor holding their blobs by id.
fn rename_dir_on_main(repo: &Path, round: usize) {
    commit_on_main(
        repo,
        1_700_100_000 + round,
        &format!("move the base: a directory renamed, round {round}\n"),
        &format!("R tree/d{round:04} renamed/d{round:04}\n"),
    );
}

/// Bytes of sources the worker has sent so far, whole archives and
/// deltas (its log's "source archive sent" and "source delta sent" lines).
fn archive_bytes_sent(suite: &Suite) -> u64 {
    let log = std::fs::read_to_string(suite.layout.logs().join("worker.log")).unwrap_or_default();
    log.lines()
        .filter(|l| l.contains("source archive sent") || l.contains("source delta sent"))
        .filter_map(|l| {
            let at = l.find("bytes=")? + "bytes=".len();
            let digits: String = l[at..].chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<u64>().ok()
        })
        .sum()
}

/// Gives the repository back to its owner after root wrote to it.
fn give_back(repo: &Path) {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(repo).expect("repository");
    let status = Command::new("chown")
        .arg("-R")
        .arg(format!("{}:{}", meta.uid(), meta.gid()))
        .arg(repo)
        .status()
        .expect("chown");
    assert!(status.success());
}

/// The repository-size axis; see the module documentation.
fn size_axis(base: &Path, sizes: &[usize], tasks: usize, moves: usize) {
    if sizes.is_empty() {
        return;
    }
    println!();
    println!(
        "repository size: a trivial task (one file, /bin/true), {tasks} warm tasks one at a time per size"
    );
    println!(
        "{:>8} {:>10} {:>14} {:>14} {:>12} {:>16}",
        "files", "in tree", "first ms", "warm p50 ms", "warm p90 ms", "warm ÷ smallest"
    );
    let mut smallest = None;
    let mut finding = Vec::new();
    let mut moving = Vec::new();
    for &files in sizes {
        let state = base.join(format!("size-{files}"));
        let suite = start_with(
            state,
            true,
            &Tuning {
                lease_seconds: 60,
                parallel_tasks: 1,
                ..Default::default()
            },
        )
        .expect("suite");
        let repo = suite.layout.repos().join("demo.git");
        grow_repository(&repo, files);
        let head = git(&repo, &["rev-parse", "refs/heads/main"]);
        let in_tree = git(&repo, &["ls-tree", "-r", "--name-only", &head])
            .lines()
            .count();
        let (first, _) = drive(&suite, &format!("first{files}"), 1, 1);
        let (_, mut lat) = drive(&suite, &format!("warm{files}"), tasks, 1);
        lat.sort();
        let p50 = pct(&lat, 0.5);
        let base_p50 = *smallest.get_or_insert(p50);
        let ratio = p50 / base_p50;
        let mark = target_mark((20_000..100_000).contains(&files), ratio, 1.5);
        println!(
            "{files:>8} {in_tree:>10} {:>14.1} {p50:>14.1} {:>12.1} {ratio:>16.2}{mark}",
            first.as_secs_f64() * 1000.0,
            pct(&lat, 0.9),
        );
        // The moving base: main one commit ahead (one file, then ten
        // files changed, then a directory of 100 files renamed) before
        // each task.
        for change in ["1", "10", "rename"] {
            let mut lat = Vec::new();
            let mut bytes = Vec::new();
            for round in 0..moves {
                match change.parse::<usize>() {
                    Ok(changed) => advance_main(&repo, changed, changed * 1000 + round),
                    Err(_) if files >= 200 => rename_dir_on_main(&repo, round),
                    Err(_) => continue,
                }
                let before = archive_bytes_sent(&suite);
                let (t, _) = drive(&suite, &format!("move{files}x{change}r{round}"), 1, 1);
                lat.push(t);
                bytes.push(archive_bytes_sent(&suite) - before);
            }
            if lat.is_empty() {
                continue;
            }
            lat.sort();
            bytes.sort_unstable();
            moving.push((files, change, pct(&lat, 0.5), p50, bytes[bytes.len() / 2]));
        }
        finding.push((files, find_changes(&suite, &repo)));
        drop(suite);
    }
    println!();
    println!(
        "moving base: main one commit ahead before each of {moves} tasks, median (target: at most 1.5x the warm same-base task)"
    );
    println!(
        "{:>8} {:>8} {:>14} {:>14} {:>10} {:>20}",
        "files", "changed", "moved p50 ms", "warm p50 ms", "moved/warm", "source bytes/task"
    );
    for (files, changed, moved, warm, bytes) in moving {
        let ratio = moved / warm;
        let mark = target_mark(files >= 20_000, ratio, 1.5);
        println!(
            "{files:>8} {changed:>8} {moved:>14.1} {warm:>14.1} {ratio:>10.2} {bytes:>20}{mark}"
        );
    }
    println!();
    println!(
        "finding the changes: airlockctl propose --worktree --dry-run, one file changed, median of 5 (target: 0.5 s at 100,000 files)"
    );
    println!(
        "{:>8} {:>22} {:>24} {:>8}",
        "files", "git work tree ms", "plain directory ms", "ratio"
    );
    for (files, (index, full)) in finding {
        let mark = if files >= 100_000 {
            if index <= 500.0 {
                "  [<= 0.5 s] met"
            } else {
                "  [<= 0.5 s] MISSED"
            }
        } else {
            ""
        };
        println!(
            "{files:>8} {index:>22.1} {full:>24.1} {:>8.2}{mark}",
            index / full
        );
    }
}

/// "  [<= target] met" or "MISSED" for a row the target applies to (`applies`),
/// nothing for the others.
fn target_mark(applies: bool, ratio: f64, target: f64) -> String {
    match (applies, ratio <= target) {
        (false, _) => String::new(),
        (true, true) => format!("  [<= {target}] met"),
        (true, false) => format!("  [<= {target}] MISSED"),
    }
}

/// Medians (ms) of `airlockctl propose --worktree --dry-run` with one file
/// changed: in a git clone of `repo` (read through its index) and in the
/// same tree as a plain directory (every file compared), side by side.
fn find_changes(suite: &Suite, repo: &Path) -> (f64, f64) {
    let ctl = airlock_local::sibling("airlockctl").expect("airlockctl");
    let dir = tempfile::tempdir().expect("a directory");
    let clone = dir.path().join("clone");
    let plain = dir.path().join("plain");
    let status = Command::new("git")
        // The repository belongs to the suite's worker: the upload-pack
        // the clone starts in it needs the exception too.
        .args([
            "-c",
            "safe.directory=*",
            "clone",
            "-q",
            "--upload-pack",
            "git -c safe.directory='*' upload-pack",
        ])
        .arg(repo)
        .arg(&clone)
        .status()
        .expect("git clone");
    assert!(status.success(), "git clone");
    let status = Command::new("cp")
        .arg("-a")
        .arg(&clone)
        .arg(&plain)
        .status()
        .expect("cp");
    assert!(status.success(), "cp -a");
    std::fs::remove_dir_all(plain.join(".git")).expect("plain copy");
    for tree in [&clone, &plain] {
        std::fs::write(tree.join("bench-changed.txt"), "one file changed\n").expect("the change");
    }
    let config = suite.layout.config();
    let time = |tree: &Path| {
        let mut runs: Vec<Duration> = (0..5)
            .map(|_| {
                let start = Instant::now();
                let out = Command::new(&ctl)
                    .arg("propose")
                    .arg("--config")
                    .arg(&config)
                    .args(["--repo", "demo", "--base", "main", "--worktree"])
                    .arg(tree)
                    .args(["--verify", "/bin/true", "--dry-run"])
                    .output()
                    .expect("airlockctl");
                let took = start.elapsed();
                assert!(
                    out.status.success(),
                    "propose --dry-run: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                took
            })
            .collect();
        runs.sort();
        pct(&runs, 0.5)
    };
    (time(&clone), time(&plain))
}

/// Runs one `airlockctl propose --wait` of `patch`; its wall time and the
/// task's JSON.
fn propose_cli(
    suite: &Suite,
    repo: &str,
    verify: &str,
    patch: &str,
) -> (Duration, serde_json::Value) {
    let ctl = airlock_local::sibling("airlockctl").expect("airlockctl");
    let config = suite.layout.config();
    let start = Instant::now();
    let task = airlock_testkit::propose_patch(
        &ctl,
        suite.bus.address(),
        &config.display().to_string(),
        repo,
        verify,
        patch,
    );
    (start.elapsed(), task)
}

/// The environment axis; see the module documentation.
fn environment_axis(base: &Path, tasks: usize) {
    let dir = base.join("environments");
    std::fs::create_dir_all(&dir).expect("axis dir");
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755));
    }
    let registry = airlock_testkit::npm_registry(&dir.join("npm-cache"));
    let project = airlock_testkit::node_project(&dir, "web");
    let environment = airlock_testkit::npm_ci_environment(registry.clone(), &[]);
    let suite = start_with(
        dir.join("state"),
        true,
        &Tuning {
            parallel_tasks: 1,
            repositories: vec![("web".into(), project.clone())],
            environments: vec![("web".into(), environment)],
            egress_routes: Some(airlock_testkit::address_routes(&registry)),
            ..Default::default()
        },
    )
    .expect("suite");
    let (first, task) = propose_cli(&suite, "web", "npm test", airlock_testkit::NODE_FIX);
    let layer = &task["result"]["isolation"]["layer"];
    println!();
    println!(
        "environment axis (Node: npm ci as setup through airlock-egress, npm test; {tasks} tasks one at a time):"
    );
    println!(
        "  first task (setup + verification): {:.0} ms, state {}, layer reused {}",
        first.as_secs_f64() * 1000.0,
        task["state"],
        layer["reused"]
    );
    let mut reused = Vec::new();
    for _ in 0..tasks {
        let (t, task) = propose_cli(&suite, "web", "npm test", airlock_testkit::NODE_FIX);
        if task["state"] != "SUCCEEDED" || task["result"]["isolation"]["layer"]["reused"] != true {
            println!("  a reused-layer task did not succeed as one: {task}");
        }
        reused.push(t);
    }
    drop(suite);
    // Bare: a clean checkout with its dependencies fetched, `npm test`.
    let bare_dir = dir.join("bare");
    let _ = Command::new("git")
        .args(["clone", "-q"])
        .arg(&project)
        .arg(&bare_dir)
        .status();
    let patched = Command::new("git")
        .current_dir(&bare_dir)
        .args(["apply", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            c.stdin
                .take()
                .expect("stdin")
                .write_all(airlock_testkit::NODE_FIX.as_bytes())?;
            c.wait()
        });
    let fetched = Command::new("npm")
        .current_dir(&bare_dir)
        .args(["ci", "--ignore-scripts", "--no-audit", "--no-fund"])
        .stdout(Stdio::null())
        .status();
    if !patched.is_ok_and(|s| s.success()) || !fetched.is_ok_and(|s| s.success()) {
        println!("  bare baseline: could not prepare the checkout");
        return;
    }
    let mut bare = Vec::new();
    for _ in 0..tasks {
        let start = Instant::now();
        let ok = Command::new("npm")
            .current_dir(&bare_dir)
            .arg("test")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        bare.push(start.elapsed());
        if !ok {
            println!("  bare npm test failed");
        }
    }
    reused.sort();
    bare.sort();
    let (r, b) = (pct(&reused, 0.5), pct(&bare, 0.5));
    println!(
        "  reused layer, whole task (submit to SUCCEEDED): p50 {r:.0} ms, p90 {:.0} ms",
        pct(&reused, 0.9)
    );
    println!("  bare npm test on a fetched checkout:            p50 {b:.0} ms");
    println!(
        "  reused ÷ bare: {:.2} ({}; the difference, {:.0} ms, is the pipeline: submit, claim, spool, sandbox, commit)",
        r / b,
        if r / b <= 1.15 {
            "[<= 1.15] met"
        } else {
            "[<= 1.15] MISSED"
        },
        r - b
    );
}

/// A verification that spins `seconds` of CPU in one process.
fn spin(seconds: f64) -> serde_json::Value {
    let script = format!(
        "import time\nt = time.process_time()\nwhile time.process_time() - t < {seconds}: pass\n"
    );
    json!(["/usr/bin/python3", "-c", script])
}

/// The CPUs this process may use.
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The concurrency axis (issue 44): (a) N CPU-bound tasks (`cpu_seconds`
/// each) submitted at once against the same N one at a time, and the
/// speed-up against the ideal min(N, cores) (target ≥ 0.8 of it); (b) a
/// trivial task's latency beside a CPU hog (twice the cores' spinners in
/// one task) against alone, the median of `samples` (target ≤ 1.25×).
fn concurrency_axis(base: &Path, counts: &[usize], cpu_seconds: f64, samples: usize) {
    let cores = cores();
    let state = base.join("concurrency");
    let suite = start_with(
        state,
        true,
        &Tuning {
            lease_seconds: 120,
            ..Default::default()
        },
    )
    .expect("suite");
    drive(&suite, "warm-c", 2, 1);
    println!(
        "concurrency axis: {cores} CPUs, executor.parallel_jobs and worker.parallel_tasks at their defaults (the CPUs), each task {cpu_seconds} s of CPU"
    );
    println!(
        "{:>4} {:>12} {:>12} {:>9} {:>7} {:>13}",
        "N", "at once s", "one by one s", "speed-up", "ideal", "of the ideal"
    );
    let argv = spin(cpu_seconds);
    for &n in counts {
        let (together, _) = drive_verified_by(&suite, &format!("par{n}"), n, n, &argv);
        let (serial, _) = drive_verified_by(&suite, &format!("ser{n}"), n, 1, &argv);
        let speedup = serial.as_secs_f64() / together.as_secs_f64();
        let ideal = n.min(cores) as f64;
        println!(
            "{n:>4} {:>12.2} {:>12.2} {speedup:>8.2}× {ideal:>6.0}× {:>12.2}{}",
            together.as_secs_f64(),
            serial.as_secs_f64(),
            speedup / ideal,
            match (n > 1, speedup / ideal >= 0.8) {
                (false, _) => "",
                (true, true) => "  [>= 0.8] met",
                (true, false) => "  [>= 0.8] MISSED",
            }
        );
    }
    // (b): a trivial task alone, then beside a hog spinning 2× the cores.
    let (_, mut alone) = drive(&suite, "alone", samples, 1);
    alone.sort();
    let hog_script = format!(
        "import multiprocessing, time\ndef s():\n    t = time.time()\n    while time.time() - t < 600: pass\nps = [multiprocessing.Process(target=s) for _ in range({})]\n[p.start() for p in ps]\n[p.join() for p in ps]\n",
        2 * cores
    );
    let client = Supervisor::connect(Some(suite.bus.address())).expect("bus");
    let head = git(
        &suite.layout.repos().join("demo.git"),
        &["rev-parse", "refs/heads/main"],
    );
    client
        .submit_task(&task_verified_by(
            "hog",
            &head,
            json!(["/usr/bin/python3", "-c", hog_script]),
        ))
        .expect("SubmitTask");
    std::thread::sleep(Duration::from_secs(3));
    let (_, mut beside) = drive(&suite, "beside", samples, 1);
    beside.sort();
    let view = client.get_task("hog").expect("GetTask");
    let _ = client.cancel_task(&DecisionRequest::about(
        &view,
        Decision::Cancel,
        "bench over",
        None,
    ));
    let ratio = pct(&beside, 0.5) / pct(&alone, 0.5);
    println!(
        "a trivial task's latency, median of {samples}: alone {:.1} ms, beside a hog of {} spinning processes {:.1} ms: {ratio:.2}× {}",
        pct(&alone, 0.5),
        2 * cores,
        pct(&beside, 0.5),
        target_mark(true, ratio, 1.25)
    );
    drop(suite);
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut tasks = 30usize;
    let mut size_tasks = 10usize;
    let mut moves = 5usize;
    let mut keep = false;
    let mut sizes: Vec<usize> = vec![40, 2_000, 20_000, 100_000];
    let mut throughput = true;
    let mut environments = false;
    let mut environment_tasks = 10usize;
    let mut root = PathBuf::from("/var/tmp");
    let mut concurrency = false;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--concurrency" => concurrency = true,
            "--tasks" => tasks = args.next().and_then(|v| v.parse().ok()).expect("--tasks N"),
            "--size-tasks" => {
                size_tasks = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--size-tasks N")
            }
            "--moves" => moves = args.next().and_then(|v| v.parse().ok()).expect("--moves N"),
            "--sizes" => {
                sizes = args
                    .next()
                    .expect("--sizes N,N,…")
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(|s| s.parse().expect("--sizes: numbers"))
                    .collect()
            }
            "--only-sizes" => throughput = false,
            "--keep" => keep = true,
            "--environments" => environments = true,
            "--environment-tasks" => {
                environment_tasks = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--environment-tasks N")
            }
            "--dir" => root = PathBuf::from(args.next().expect("--dir DIR")),
            "-h" | "--help" => {
                println!(
                    "bench-e2e [--tasks N] [--sizes 40,2000,20000,100000] [--size-tasks N] [--moves N] [--only-sizes] [--keep] [--environments] [--environment-tasks N] [--concurrency] [--dir DIR]\n\nEnd-to-end tasks/s and latency of a trivial task through the real suite\n(1 and 4 in flight), fsyncs per task (strace), beside the raw fsync rate of DIR's disk;\nthen the same task on repositories of each size (--sizes; empty: skipped),\nfirst and warm-cache latencies, and --moves tasks each on a base one commit ahead
(one file changed, then ten, then a directory of 100 files renamed, at 200 files and up)
with the source bytes they sent.
--only-sizes skips the throughput part.\n--environments adds the environment axis (a Node package, npm ci as setup through\nairlock-egress; needs the package registry): first task, reused-layer tasks, and\nnpm test bare on a fetched checkout.\n--concurrency runs only the concurrency axis: N = 1, 2, 4, 8 tasks of 2 s of CPU\nsubmitted at once against one at a time and the ideal min(N, CPUs), then a trivial\ntask's median latency beside a CPU hog against alone."
                );
                return;
            }
            other => panic!("unknown argument {other}"),
        }
    }
    let base = root.join(format!("airlock-bench-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&base).expect("bench dir");
    if concurrency {
        concurrency_axis(&base, &[1, 2, 4, 8], 2.0, 5);
        finish(&base, keep);
        return;
    }
    if !throughput {
        size_axis(&base, &sizes, size_tasks, moves);
        if environments {
            environment_axis(&base, environment_tasks);
        }
        finish(&base, keep);
        return;
    }
    let raw = raw_fsync_rate(&base, 2.0);
    println!(
        "raw write+fsync of 256 bytes on {}: {raw:.0}/s",
        root.display()
    );
    println!(
        "{:>9} {:>7} {:>9} {:>10} {:>10} {:>10} {:>14}",
        "in flight", "tasks", "tasks/s", "p50 ms", "p99 ms", "max ms", "÷ raw fsync/s"
    );
    for inflight in [1usize, 4] {
        let state = base.join(format!("run-{inflight}"));
        let suite = start_with(
            state,
            true,
            &Tuning {
                lease_seconds: 60,
                parallel_tasks: inflight as u32,
                ..Default::default()
            },
        )
        .expect("suite");
        drive(&suite, &format!("warm{inflight}"), 2, 1);
        let (elapsed, mut lat) = drive(&suite, &format!("b{inflight}"), tasks, inflight);
        lat.sort();
        let rate = tasks as f64 / elapsed.as_secs_f64();
        println!(
            "{inflight:>9} {tasks:>7} {rate:>9.2} {:>10.1} {:>10.1} {:>10.1} {:>14.4}",
            pct(&lat, 0.5),
            pct(&lat, 0.99),
            pct(&lat, 1.0),
            rate / raw
        );
        drop(suite);
    }
    match fsyncs_per_task(base.join("strace"), 10) {
        Some(n) => println!(
            "fsyncs per task (all components, strace, 10 tasks one at a time): {n:.1}  → at the raw rate alone ≤ {:.0} tasks/s",
            raw / n
        ),
        None => println!("fsyncs per task: n/a (strace not installed)"),
    }
    if !sizes.is_empty() {
        size_axis(&base, &sizes, size_tasks, moves);
    }
    if environments {
        environment_axis(&base, environment_tasks);
    }
    finish(&base, keep);
}

/// Removes the suites' state, or with `--keep` says where it is (their
/// logs time every step).
fn finish(base: &Path, keep: bool) {
    if keep {
        println!("state and logs kept in {}", base.display());
    } else {
        let _ = std::fs::remove_dir_all(base);
    }
}

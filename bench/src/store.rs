//! `airlock-bench store`: what a durable write costs, and what airlock's
//! stores pay on top of it.
//!
//! In every round, on the same directory:
//!
//! 1. **raw append+fsync** (the baseline): append 256 bytes to a file and
//!    `fsync` it (`File::sync_all`), in a loop, side by side with
//! 2. **checkpoint appends** through one [`CheckpointJournal`] at
//!    `synchronous=FULL`, phases cycling through an attempt and a new
//!    attempt after `result_submitted`, one appender;
//! 3. **raw append+fsync ×8**: [`CONCURRENT`] threads doing 1. on one file
//!    at once, side by side with
//! 4. **checkpoint appends ×8**: [`CONCURRENT`] threads appending to the
//!    one journal at once, as the worker's parallel attempts do (group
//!    commit: appends that arrive during a commit share the next one);
//! 5. **raw overwrite+fsync** (context): 1., but rewriting 256 bytes in
//!    place inside a preallocated file, so the file size never changes —
//!    closer to how SQLite reuses its WAL after a checkpoint;
//! 6. **claim→result cycles** of the task store: submit, claim, submit a
//!    passed result with auto-accept (see [`claim_result_cycles`]).
//!
//! "Side by side": the two measurements of a pair run in [`SLICES`]
//! alternating slices of the window, so a load swing on a shared machine
//! reaches both. Each figure is the median over the rounds; latencies are
//! pooled over all rounds.

use airlock_journal::checkpoint::CheckpointJournal;
use airlock_proto::canonical::sha256_hex;
use airlock_proto::checkpoint::{CheckpointBinding, Phase, result_idempotency_key};
use airlock_proto::task::{
    CommandSummary, Outcome, RESULT_SCHEMA, TaskResult, TaskState, TaskSubmission,
};
use airlock_taskdb::tasks::{Actor, SqliteStore};
use serde_json::json;
use std::error::Error;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

type BenchResult<T> = Result<T, Box<dyn Error>>;

/// Bytes written per raw operation.
const RECORD: usize = 256;
/// Slots of the preallocated file of the overwrite baseline.
const OVERWRITE_SLOTS: u64 = 4096;
/// Threads of the concurrent measurements.
const CONCURRENT: usize = 8;
/// Slices per round of each pair measured side by side.
const SLICES: u32 = 5;

/// One measurement: how many operations fit in the window, and how long
/// each took.
#[derive(Debug, Default)]
struct Sample {
    ops: u64,
    elapsed: Duration,
    latencies: Vec<Duration>,
}

impl Sample {
    fn per_second(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    /// Runs `op` until `window` has passed (at least once).
    fn measure(window: Duration, mut op: impl FnMut(u64) -> BenchResult<()>) -> BenchResult<Self> {
        let mut s = Sample::default();
        let start = Instant::now();
        loop {
            let t = Instant::now();
            op(s.ops)?;
            s.latencies.push(t.elapsed());
            s.ops += 1;
            if start.elapsed() >= window {
                break;
            }
        }
        s.elapsed = start.elapsed();
        Ok(s)
    }

    /// Adds a later slice of the same measurement.
    fn append(&mut self, later: Sample) {
        self.ops += later.ops;
        self.elapsed += later.elapsed;
        self.latencies.extend(later.latencies);
    }

    /// Samples taken side by side (one per thread) as one: every
    /// operation, over the longest of their windows.
    fn merge(samples: Vec<Sample>) -> Self {
        let mut all = Sample::default();
        for s in samples {
            all.ops += s.ops;
            all.elapsed = all.elapsed.max(s.elapsed);
            all.latencies.extend(s.latencies);
        }
        all
    }
}

/// Every sample of one kind, across rounds.
#[derive(Debug)]
struct Series {
    name: &'static str,
    rates: Vec<f64>,
    latencies: Vec<Duration>,
}

impl Series {
    fn new(name: &'static str) -> Self {
        Series {
            name,
            rates: Vec::new(),
            latencies: Vec::new(),
        }
    }

    fn push(&mut self, s: Sample) -> f64 {
        let rate = s.per_second();
        self.rates.push(rate);
        self.latencies.extend(s.latencies);
        rate
    }

    fn median(&self) -> Option<f64> {
        median(&self.rates)
    }

    fn latency(&mut self, q: f64) -> Option<Duration> {
        if self.latencies.is_empty() {
            return None;
        }
        self.latencies.sort_unstable();
        let i = ((self.latencies.len() - 1) as f64 * q).round() as usize;
        self.latencies.get(i).copied()
    }
}

fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => None,
        n if n % 2 == 1 => Some(v[n / 2]),
        n => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// Runs the store benchmark in `dir` (or a temporary directory under
/// /var/tmp), `rounds` rounds of `seconds` per measurement.
pub fn run(dir: Option<&Path>, seconds: f64, rounds: u32) -> BenchResult<()> {
    let _temp;
    let dir: PathBuf = match dir {
        Some(d) => {
            fs::create_dir_all(d)?;
            d.to_path_buf()
        }
        None => {
            let t = tempfile::Builder::new()
                .prefix("airlock-bench.")
                .tempdir_in("/var/tmp")?;
            let p = t.path().to_path_buf();
            _temp = t;
            p
        }
    };
    let window = Duration::from_secs_f64(seconds);
    let tag = std::process::id();
    let journal_path = dir.join(format!("bench-{tag}-checkpoints.sqlite3"));
    let tasks_path = dir.join(format!("bench-{tag}-tasks.sqlite3"));
    let raw_path = dir.join(format!("bench-{tag}-raw.bin"));

    println!(
        "airlock-bench store: {} ; {rounds} rounds × {seconds} s per measurement",
        dir.display()
    );
    println!(
        "(raw: {RECORD}-byte records, File::sync_all; checkpoints: SQLite WAL, synchronous=FULL; \
         concurrent: {CONCURRENT} threads, one file)"
    );
    println!();
    println!(
        "{:>5}  {:>11}  {:>13}  {:>11}  {:>11}  {:>11}  {:>11}",
        "round", "raw append", "raw overwrite", "checkpoint", "raw ×8", "ckpt ×8", "claim→result"
    );

    let mut raw_append = Series::new("raw append+fsync");
    let mut raw_overwrite = Series::new("raw overwrite+fsync");
    let mut checkpoints = Series::new("checkpoint append");
    let mut raw_concurrent = Series::new("raw append+fsync ×8");
    let mut concurrent = Series::new("checkpoint append ×8");
    let mut cycles = Series::new("claim→result cycle");
    let journal = CheckpointJournal::open(&journal_path)?;
    let mut batched = Vec::new();
    for round in 1..=rounds {
        // Each pair whose ratio is printed runs in alternating slices, so
        // that load swings on a shared machine reach both alike.
        let slice = window / SLICES;
        let (mut raw, mut single) = (Sample::default(), Sample::default());
        let (mut raw8, mut group) = (Sample::default(), Sample::default());
        let before = journal.commit_stats();
        for k in 0..SLICES {
            raw.append(raw_append_fsync(&raw_path, slice)?);
            single.append(checkpoint_appends(
                &journal,
                &format!("r{round}-s{k}"),
                slice,
            )?);
        }
        let single_stats = journal.commit_stats();
        for k in 0..SLICES {
            raw8.append(raw_concurrent_fsync(&raw_path, slice)?);
            group.append(concurrent_appends(
                &journal,
                &format!("r{round}-s{k}"),
                slice,
            )?);
        }
        let after = journal.commit_stats();
        if single_stats.batches - before.batches != single_stats.appends - before.appends {
            return Err("a lone appender's appends were batched".into());
        }
        batched.push(
            (after.appends - single_stats.appends) as f64
                / (after.batches - single_stats.batches).max(1) as f64,
        );
        let a = raw_append.push(raw);
        let c = checkpoints.push(single);
        let r = raw_concurrent.push(raw8);
        let g = concurrent.push(group);
        let o = raw_overwrite.push(raw_overwrite_fsync(&raw_path, window)?);
        let y = cycles.push(claim_result_cycles(&tasks_path, round, window)?);
        println!(
            "{round:>5}  {a:>9.0}/s  {o:>11.0}/s  {c:>9.0}/s  {r:>9.0}/s  {g:>9.0}/s  {y:>10.0}/s"
        );
    }
    let stats = journal.commit_stats();
    drop(journal);

    println!();
    println!("medians over {rounds} rounds, latency p50 / p99 pooled over all operations:");
    let baseline = raw_append.median().unwrap_or(f64::NAN);
    let mut series = vec![
        raw_append,
        raw_overwrite,
        checkpoints,
        raw_concurrent,
        concurrent,
        cycles,
    ];
    for s in &mut series {
        let (p50, p99) = (s.latency(0.5), s.latency(0.99));
        let ms = |d: Option<Duration>| d.map_or(f64::NAN, |d| d.as_secs_f64() * 1e3);
        println!(
            "  {:<22} {:>9.0}/s   p50 {:>7.3} ms   p99 {:>7.3} ms   ratio to raw append+fsync {:.2}",
            s.name,
            s.median().unwrap_or(f64::NAN),
            ms(p50),
            ms(p99),
            s.median().unwrap_or(f64::NAN) / baseline
        );
    }
    let rate = |i: usize| series[i].median().unwrap_or(f64::NAN);
    println!(
        "  group commit: {:.1} appends per commit (median over rounds; {} appends in {} commits, \
         largest batch {})",
        median(&batched).unwrap_or(f64::NAN),
        stats.appends,
        stats.batches,
        stats.largest_batch
    );
    println!();
    println!(
        "checkpoint appends/s ÷ raw append+fsync/s = {:.2}",
        rate(2) / baseline
    );
    println!(
        "checkpoint appends/s ×{CONCURRENT} (group commit) ÷ raw append+fsync/s = {:.2}",
        rate(4) / baseline
    );
    println!(
        "checkpoint appends/s ×{CONCURRENT} (group commit) ÷ raw append+fsync/s ×{CONCURRENT} = {:.2}",
        rate(4) / rate(3)
    );
    println!(
        "claim→result cycles/s ÷ raw append+fsync/s = {:.2}",
        rate(5) / baseline
    );

    for p in [&journal_path, &tasks_path] {
        for suffix in ["", "-wal", "-shm"] {
            let mut name = p.clone().into_os_string();
            name.push(suffix);
            let _ = fs::remove_file(name);
        }
    }
    let _ = fs::remove_file(&raw_path);
    Ok(())
}

/// Baseline: append a record and fsync, in a loop, to a fresh file.
fn raw_append_fsync(path: &Path, window: Duration) -> BenchResult<Sample> {
    let _ = fs::remove_file(path);
    let mut f = OpenOptions::new()
        .create_new(true)
        .append(true)
        .open(path)?;
    f.sync_all()?;
    let record = [b'r'; RECORD];
    let s = Sample::measure(window, |_| {
        f.write_all(&record)?;
        f.sync_all()?;
        Ok(())
    })?;
    drop(f);
    fs::remove_file(path)?;
    Ok(s)
}

/// Context: rewrite a record in place in a preallocated, synced file and
/// fsync, in a loop. The size never changes.
fn raw_overwrite_fsync(path: &Path, window: Duration) -> BenchResult<Sample> {
    let _ = fs::remove_file(path);
    let mut f: File = OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .open(path)?;
    f.write_all(&vec![0u8; RECORD * OVERWRITE_SLOTS as usize])?;
    f.sync_all()?;
    let record = [b'o'; RECORD];
    let s = Sample::measure(window, |i| {
        f.write_all_at(&record, (i % OVERWRITE_SLOTS) * RECORD as u64)?;
        f.sync_all()?;
        Ok(())
    })?;
    drop(f);
    fs::remove_file(path)?;
    Ok(s)
}

/// The phases one attempt walks through in the benchmark.
const ATTEMPT_PHASES: [Phase; 6] = [
    Phase::Claimed,
    Phase::WorkspacePrepared,
    Phase::VerificationPassed,
    Phase::CommitDone,
    Phase::ResultPending,
    Phase::ResultSubmitted,
];

/// Checkpoint appends of one task: every phase of an attempt, then the
/// next attempt, each with a payload of the size the worker writes (hashes
/// and keys, about 300 bytes).
fn checkpoint_appends(
    journal: &CheckpointJournal,
    tag: &str,
    window: Duration,
) -> BenchResult<Sample> {
    let task_id = format!("bench-task-{tag}");
    let digest = sha256_hex(task_id.as_bytes());
    let binding = |attempt: u32| CheckpointBinding {
        task_id: task_id.clone(),
        attempt,
        execution_digest: digest.clone(),
        job_id: format!("job-{task_id}"),
        repository: "bench".into(),
        base_oid: "a".repeat(40),
        expected_branch_oid: "a".repeat(40),
        target_branch: format!("agent/{task_id}"),
        generation: 1,
    };
    Sample::measure(window, |i| {
        let attempt = u32::try_from(i / ATTEMPT_PHASES.len() as u64 + 1)?;
        let phase = ATTEMPT_PHASES[(i % ATTEMPT_PHASES.len() as u64) as usize];
        let payload = json!({
            "phase": phase.as_str(),
            "result_sha256": sha256_hex(&i.to_le_bytes()),
            "idempotency_key": result_idempotency_key(&task_id, attempt, &digest),
            "lease_epoch": attempt,
        });
        journal.append_value(&binding(attempt), phase, &payload)?;
        Ok(())
    })
}

/// Context for group commit: [`CONCURRENT`] threads, each with its own
/// handle on one file, each appending a record and fsyncing it in a loop —
/// what the journal's appends would cost if every attempt synced its own
/// write (the file system may merge concurrent fsyncs of one file; nothing
/// in user space does).
fn raw_concurrent_fsync(path: &Path, window: Duration) -> BenchResult<Sample> {
    let _ = fs::remove_file(path);
    File::create(path)?.sync_all()?;
    let samples = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..CONCURRENT)
            .map(|_| {
                scope.spawn(move || -> Result<Sample, String> {
                    let mut f = OpenOptions::new()
                        .append(true)
                        .open(path)
                        .map_err(|e| e.to_string())?;
                    let record = [b'c'; RECORD];
                    Sample::measure(window, |_| {
                        f.write_all(&record)?;
                        f.sync_all()?;
                        Ok(())
                    })
                    .map_err(|e| e.to_string())
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().map_err(|_| "a raw writer panicked".to_owned())?)
            .collect::<Result<Vec<_>, String>>()
    })?;
    fs::remove_file(path)?;
    Ok(Sample::merge(samples))
}

/// Group commit: [`CONCURRENT`] threads share the journal (as the worker's
/// parallel attempts do), each walking its own task through
/// [`checkpoint_appends`]; the rate is the total.
fn concurrent_appends(
    journal: &CheckpointJournal,
    tag: &str,
    window: Duration,
) -> BenchResult<Sample> {
    let samples = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..CONCURRENT)
            .map(|t| {
                scope.spawn(move || {
                    checkpoint_appends(journal, &format!("{tag}-t{t}"), window)
                        .map_err(|e| e.to_string())
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().map_err(|_| "an appender panicked".to_owned())?)
            .collect::<Result<Vec<_>, String>>()
    })?;
    Ok(Sample::merge(samples))
}

/// Claim→result cycles/s of the task store at `path`: submit a task, claim
/// it, submit a passed result with `auto_accept` (so it goes straight to
/// SUCCEEDED); repeat for `window`. One cycle is three write transactions,
/// each with its audit event, so it is bounded by about a third of the raw
/// fsync rate.
fn claim_result_cycles(path: &Path, round: u32, window: Duration) -> BenchResult<Sample> {
    let mut store = SqliteStore::open(path)?;
    let planner = Actor::planner(None, "bench-planner");
    let worker = Actor::worker(None, "bench-worker");
    Sample::measure(window, |i| {
        let task_id = format!("bench-r{round}-{i:08}");
        store.submit(&submission(&task_id)?, &planner)?;
        let grant = store
            .claim(&worker, 60_000)?
            .ok_or("the task just submitted was not claimable")?;
        if grant.task_id != task_id {
            return Err(format!("claimed {} instead of {task_id}", grant.task_id).into());
        }
        let digest = grant.envelope["execution_digest"]
            .as_str()
            .ok_or("the envelope has no execution_digest")?
            .to_owned();
        let result = TaskResult {
            schema: RESULT_SCHEMA.into(),
            task_id: task_id.clone(),
            attempt: grant.attempt,
            execution_digest: digest.clone(),
            outcome: Outcome::Passed,
            commit_oid: Some("c".repeat(40)),
            target_branch: format!("agent/{task_id}"),
            exec_result_sha256: Some(sha256_hex(task_id.as_bytes())),
            failure_code: None,
            reconciliation: None,
            publication: None,
            signature: None,
            isolation: Some(airlock_proto::task::Isolation {
                landlock_abi: Some(7),
                landlock: "full".into(),
                seccomp: "enforced".into(),
                namespaces: Some(vec!["user".into(), "mnt".into(), "pid".into()]),
                view: "minimal-root".into(),
                uid: Some(992),
                layer: None,
            }),
            verification: vec![CommandSummary {
                label: "test".into(),
                exit_code: Some(0),
                timed_out: false,
                duration_ms: 1,
                stdout_tail: None,
                stderr_tail: None,
                wall: None,
            }],
            captured: None,
        };
        let receipt = store.submit_result(
            &task_id,
            grant.lease_epoch,
            &grant.lease_token,
            &result_idempotency_key(&task_id, grant.attempt, &digest),
            &result,
            true,
            &worker,
        )?;
        if receipt.task.state != TaskState::Succeeded {
            return Err(format!("{task_id} ended {:?}, not SUCCEEDED", receipt.task.state).into());
        }
        Ok(())
    })
}

/// A deterministic one-command task for the cycle benchmark.
fn submission(task_id: &str) -> BenchResult<TaskSubmission> {
    let head = "b".repeat(40);
    Ok(TaskSubmission::from_value(&json!({
        "schema": "airlock.task.v1",
        "binding": {
            "task_id": task_id, "job_id": format!("job-{task_id}"), "repository": "bench",
            "base_oid": "a".repeat(40), "expected_branch_oid": head,
            "target_branch": format!("agent/{task_id}"), "branch_mode": "CONTINUE_EXISTING",
            "generation": 1, "idempotency_key": format!("submit-{task_id}"),
        },
        "plan": {
            "schema": "airlock.plan.v1", "task_id": task_id, "job_id": format!("job-{task_id}"),
            "source_head_oid": head, "generation": 1,
            "idempotency_key": format!("plan-{task_id}"),
            "execution": {
                "action": "deterministic",
                "change_set": [{"path": "x.txt", "operation": "write_file", "content": "x\n"}],
                "verification": [{"label": "test", "argv": ["/bin/true"]}],
                "capability_scope": ["git.read", "git.test"],
            },
        },
        "max_attempts": 1,
    }))?)
}

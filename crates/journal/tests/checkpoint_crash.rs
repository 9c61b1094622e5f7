//! Crash test on real processes: a child appends checkpoints in a tight
//! loop and the parent `SIGKILL`s it at random moments, [`KILLS`] times
//! once the child has reported its journal open (asserted; kills aimed at
//! the child's start-up are extra and counted apart). After every kill the
//! parent reopens the journal and proves that nothing is corrupt, nothing
//! the child saw committed is lost, and the journal's rules still hold on
//! disk: sequences contiguous from 1 in every attempt, phases monotonic,
//! one binding per attempt, heads equal to the latest rows.
//!
//! What this proves, and what it does not: a process kill leaves the
//! kernel's page cache alone, so this shows that an append is atomic and
//! that an acknowledged append survives the death of the *process*. It
//! says nothing about durability across power loss or a kernel crash: the
//! test would pass just as well with `synchronous=OFF`. That the journal
//! runs at `synchronous=FULL` is checked by `db.rs`'s own test of the
//! pragma; no test here cuts power (docs/privsep/crashes.md).
//!
//! The child is this same test binary, re-executed to run the ignored test
//! [`crash_child_writer`] with [`DB_ENV`] set.

use airlock_journal::checkpoint::{Checkpoint, CheckpointJournal};
use airlock_proto::canonical::sha256_hex;
use airlock_proto::checkpoint::{CheckpointBinding, Phase};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rusqlite::Connection;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Set in the child's environment: the journal it writes.
const DB_ENV: &str = "AIRLOCK_CKPT_CRASH_DB";
/// Set in the child's environment: its random seed.
const SEED_ENV: &str = "AIRLOCK_CKPT_CRASH_SEED";
/// Tasks the child spreads its appends over.
const TASKS: u32 = 12;
/// Kills that must land after the child opened the journal.
const KILLS: u32 = 250;
/// The test fails if [`KILLS`] take longer than this (a few dozen seconds
/// are usual on a 2-core machine).
const TIME_LIMIT: Duration = Duration::from_secs(180);

/// The coordinates of `attempt` of `task`, derived so that a restarted
/// child rebuilds exactly the binding its predecessor used. Every third
/// attempt runs a new plan; generations and expected heads move too.
fn binding(task: &str, attempt: u32) -> CheckpointBinding {
    CheckpointBinding {
        task_id: task.into(),
        attempt,
        execution_digest: sha256_hex(format!("{task}/plan/{}", attempt / 3).as_bytes()),
        job_id: format!("job-{task}"),
        repository: "demo".into(),
        base_oid: "a".repeat(40),
        expected_branch_oid: sha256_hex(format!("{task}/head/{}", attempt / 2).as_bytes())[..40]
            .to_owned(),
        target_branch: format!("agent/{task}"),
        generation: attempt / 4 + 1,
    }
}

/// What the child does next for a task whose latest checkpoint is `head`.
fn next_step(
    rng: &mut StdRng,
    task: &str,
    head: Option<&Checkpoint>,
) -> (CheckpointBinding, Phase) {
    let Some(head) = head else {
        return (binding(task, 1), Phase::Claimed);
    };
    let attempt = head.attempt;
    // Abandon the attempt now and then (a lease lost mid-way).
    if head.phase == Phase::ResultSubmitted || rng.gen_ratio(1, 15) {
        return (binding(task, attempt + 1), Phase::Claimed);
    }
    if rng.gen_ratio(1, 12) {
        return (binding(task, attempt), Phase::ReconciliationRequired);
    }
    let next = match head.phase {
        Phase::Claimed => Phase::WorkspacePrepared,
        Phase::WorkspacePrepared => Phase::VerificationPassed,
        Phase::VerificationPassed if rng.gen_bool(0.5) => Phase::CommitDone,
        Phase::VerificationPassed => Phase::SourceCaptureDone,
        Phase::CommitDone if rng.gen_bool(0.5) => Phase::Published,
        Phase::CommitDone
        | Phase::Published
        | Phase::SourceCaptureDone
        | Phase::ReconciliationRequired => Phase::ResultPending,
        Phase::ResultPending | Phase::ResultSubmitted => Phase::ResultSubmitted,
    };
    (binding(task, attempt), next)
}

/// The child: append until killed. Prints `READY` once the journal is
/// open and `COMMITTED task attempt sequence payload_sha256` after every
/// append that returned (and so is durable).
#[test]
#[ignore = "child process of the crash test; does nothing unless AIRLOCK_CKPT_CRASH_DB is set"]
fn crash_child_writer() {
    let Some(path) = std::env::var_os(DB_ENV) else {
        return;
    };
    let seed: u64 = std::env::var(SEED_ENV).unwrap().parse().unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    let journal = CheckpointJournal::open(Path::new(&path)).unwrap();
    // On a line of its own: the test harness has just printed
    // "test crash_child_writer ... " without a newline.
    println!("\nREADY");
    loop {
        let task = format!("task-{}", rng.gen_range(0..TASKS));
        let head = journal.latest(&task).unwrap();
        if let Some(head) = head.as_ref().filter(|_| rng.gen_ratio(1, 10)) {
            // An exact replay after a restart returns the stored row.
            let again = journal
                .append_value(&head.binding, head.phase, &head.payload)
                .unwrap();
            assert_eq!(&again, head);
            println!("REPLAYED");
            continue;
        }
        let (b, phase) = next_step(&mut rng, &task, head.as_ref());
        // Mostly small payloads; now and then one spanning many pages.
        let pad = if rng.gen_ratio(1, 25) {
            rng.gen_range(64 * 1024..256 * 1024)
        } else {
            rng.gen_range(0..2048)
        };
        let payload =
            json!({"n": rng.r#gen::<u32>(), "phase": phase.as_str(), "pad": "p".repeat(pad)});
        let cp = journal.append_value(&b, phase, &payload).unwrap();
        let expected_sequence = match head {
            Some(h) if h.attempt == cp.attempt => h.sequence + 1,
            _ => 1,
        };
        assert_eq!(cp.sequence, expected_sequence);
        println!(
            "COMMITTED {} {} {} {}",
            cp.task_id, cp.attempt, cp.sequence, cp.payload_sha256
        );
    }
}

/// One committed checkpoint as the child reported it.
type Key = (String, u32, u64, String);

/// What a child's stdout told the parent.
#[derive(Default)]
struct ChildReport {
    committed: Vec<Key>,
    replays: u64,
}

/// Verifies the journal on disk, independently of the journal's own
/// `integrity_check`; returns the number of rows.
fn verify_on_disk(path: &Path, committed: &BTreeSet<Key>) -> usize {
    let conn = Connection::open(path).unwrap();
    let mut stmt = conn
        .prepare(
            "SELECT task_id, attempt, sequence, phase, phase_order, binding_sha256, payload_sha256
               FROM checkpoints ORDER BY task_id, attempt, sequence",
        )
        .unwrap();
    #[allow(clippy::type_complexity)]
    let rows: Vec<(String, u32, u64, String, u32, String, String)> = stmt
        .query_map([], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
                r.get(6)?,
            ))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();

    let mut on_disk = BTreeSet::new();
    let mut last_of_task: BTreeMap<String, (u32, u64, String, String)> = BTreeMap::new();
    let mut prev: Option<&(String, u32, u64, String, u32, String, String)> = None;
    for row in &rows {
        let (task, attempt, seq, phase, order, binding_sha, payload_sha) = row;
        let phase = Phase::parse(phase).unwrap();
        assert_eq!(phase.order(), *order, "rank of {row:?}");
        match prev {
            Some(p) if p.0 == *task && p.1 == *attempt => {
                assert_eq!(*seq, p.2 + 1, "sequence gap before {row:?}");
                assert_eq!(
                    *binding_sha, p.5,
                    "binding changed within the attempt at {row:?}"
                );
                assert!(
                    phase == Phase::ReconciliationRequired || *order >= p.4,
                    "phase regression {p:?} -> {row:?}"
                );
            }
            Some(p) if p.0 == *task => {
                assert!(*attempt > p.1);
                assert_eq!(*seq, 1, "attempt does not start at 1: {row:?}");
            }
            _ => assert_eq!(*seq, 1, "attempt does not start at 1: {row:?}"),
        }
        on_disk.insert((task.clone(), *attempt, *seq, payload_sha.clone()));
        last_of_task.insert(
            task.clone(),
            (
                *attempt,
                *seq,
                phase.as_str().to_owned(),
                payload_sha.clone(),
            ),
        );
        prev = Some(row);
    }
    let missing: Vec<_> = committed.difference(&on_disk).collect();
    assert!(
        missing.is_empty(),
        "committed checkpoints lost: {missing:?}"
    );

    let heads: BTreeMap<String, (u32, u64, String, String)> = conn
        .prepare("SELECT task_id, attempt, sequence, phase, payload_sha256 FROM checkpoint_heads")
        .unwrap()
        .query_map([], |r| {
            Ok((r.get(0)?, (r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(heads, last_of_task, "heads are not the latest rows");
    rows.len()
}

#[test]
#[allow(non_snake_case)]
fn CHECKPOINT_CRASH_sigkill_at_random_moments_never_corrupts_or_loses() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoints.sqlite3");
    let exe = std::env::current_exe().unwrap();
    let seed: u64 = rand::random();
    let mut rng = StdRng::seed_from_u64(seed);
    println!("crash test seed {seed}, journal {}", path.display());

    let started = Instant::now();
    // `kills` land after the child printed READY (its journal open);
    // `start_up_kills` are aimed at its start-up and may land before it
    // opened anything, so they do not count towards KILLS.
    let (mut kills, mut start_up_kills, mut commits, mut replays) = (0u32, 0u32, 0u64, 0u64);
    let mut committed: BTreeSet<Key> = BTreeSet::new();
    let mut rows = 0;
    while kills < KILLS {
        assert!(
            started.elapsed() < TIME_LIMIT,
            "only {kills} of {KILLS} kills after {TIME_LIMIT:?}"
        );
        let stderr_path = dir.path().join("child.stderr");
        let mut child = Command::new(&exe)
            .args(["crash_child_writer", "--exact", "--ignored", "--nocapture"])
            .args(["--test-threads=1"])
            .env(DB_ENV, &path)
            .env(SEED_ENV, rng.r#gen::<u64>().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr_path).unwrap())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (ready_tx, ready_rx) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut report = ChildReport::default();
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let mut words = line.split(' ');
                match words.next() {
                    Some("READY") => {
                        let _ = ready_tx.send(());
                    }
                    Some("REPLAYED") => report.replays += 1,
                    Some("COMMITTED") => {
                        let w: Vec<&str> = words.collect();
                        report.committed.push((
                            w[0].to_owned(),
                            w[1].parse().unwrap(),
                            w[2].parse().unwrap(),
                            w[3].to_owned(),
                        ));
                    }
                    _ => {}
                }
            }
            report
        });

        // One kill in ten is aimed at the child's start-up (open, WAL
        // recovery, migrations); the rest land in the append loop.
        let at_start_up = rng.gen_ratio(1, 10);
        if !at_start_up && ready_rx.recv_timeout(Duration::from_secs(20)).is_err() {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            let _ = child.wait();
            panic!(
                "child never became ready: {}",
                std::fs::read_to_string(&stderr_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_micros(rng.gen_range(0..=30_000)));
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "child exited by itself ({status}): {}",
                std::fs::read_to_string(&stderr_path).unwrap_or_default()
            );
        }
        kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(Signal::SIGKILL as i32), "{status}");
        if at_start_up {
            start_up_kills += 1;
        } else {
            kills += 1;
        }
        let report = reader.join().unwrap();
        commits += report.committed.len() as u64;
        replays += report.replays;
        committed.extend(report.committed);

        // Reopen as the restarted worker would, and check everything.
        let journal = CheckpointJournal::open(&path).unwrap();
        journal.integrity_check().unwrap();
        drop(journal);
        rows = verify_on_disk(&path, &committed);
    }

    let journal = CheckpointJournal::open(&path).unwrap();
    let unfinished = journal.unfinished().unwrap().len();
    println!(
        "crash test: {kills} SIGKILLs with the journal open (+{start_up_kills} aimed at start-up) in {:.1}s; \
         {commits} appends acknowledged, {replays} exact replays, {rows} rows on disk, \
         {unfinished} of {TASKS} tasks unfinished; integrity ok after every kill",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(kills, KILLS);
    assert!(commits > 0, "the child never committed anything");
}

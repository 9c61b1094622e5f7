//! A torn or truncated journal (seed 002: "truncates the durable stream at
//! every offset and asserts what survives is always a contiguous prefix").
//!
//! A real journal is written through `CheckpointJournal` — four tasks, their
//! attempts' phases, payloads of many sizes — and what it shows (every
//! task's history as read back and verified, the unfinished tasks) is kept
//! after every append. Copies of its files are then cut, and each copy is
//! opened with `CheckpointJournal::open`:
//!
//! - **the `-wal` cut** inside its header, on every frame boundary, inside
//!   every frame's header and inside every frame's page, with the database
//!   file whole, in two states (every append in the log; the first appends
//!   checkpointed into the database and the rest in the log): the journal
//!   must open, and show exactly what it showed after the last commit
//!   whose frames survived whole — counted from the log's own frames.
//! - **the database file cut** on every page boundary and inside every
//!   page (at its start, middle and end), with its log whole beside it and
//!   with no log (the journal closed): the journal must either show exactly
//!   what it showed last, or be refused with `STORE_CORRUPT`.
//!
//! Never another answer, another code, or a panic. What this does not
//! cover: a cut log with a database that a checkpoint had already brought
//! past the cut (a checkpoint copies only synced, whole commits, so no
//! crash leaves that), and damage other than truncation.

use airlock_journal::checkpoint::{Checkpoint, CheckpointJournal};
use airlock_proto::Code;
use airlock_proto::canonical::sha256_hex;
use airlock_proto::checkpoint::{CheckpointBinding, Phase};
use serde_json::json;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

const TASKS: [&str; 4] = ["task-a", "task-b", "task-c", "task-d"];
/// The phases of one attempt, in order.
const PHASES: [Phase; 6] = [
    Phase::Claimed,
    Phase::WorkspacePrepared,
    Phase::VerificationPassed,
    Phase::CommitDone,
    Phase::ResultPending,
    Phase::ResultSubmitted,
];
/// Appends made with every commit in the log; then after a checkpoint.
const IN_LOG: usize = 24;
const AFTER_CHECKPOINT: usize = 10;

/// What a journal shows: each task's history, then the unfinished tasks.
type View = (Vec<Vec<Checkpoint>>, Vec<Checkpoint>);

fn view(j: &CheckpointJournal) -> View {
    read_view(j).unwrap()
}

fn read_view(j: &CheckpointJournal) -> Result<View, airlock_journal::SqliteError> {
    Ok((
        TASKS
            .iter()
            .map(|t| j.history(t))
            .collect::<Result<_, _>>()?,
        j.unfinished()?,
    ))
}

fn binding(task: &str, attempt: u32) -> CheckpointBinding {
    CheckpointBinding {
        task_id: task.into(),
        attempt,
        execution_digest: sha256_hex(format!("{task}/{attempt}").as_bytes()),
        job_id: format!("job-{task}"),
        repository: "demo".into(),
        base_oid: "a".repeat(40),
        expected_branch_oid: "b".repeat(40),
        target_branch: format!("agent/{task}"),
        generation: 1,
    }
}

/// The `n`th append: tasks in turn, each through its attempts' phases, the
/// payloads from a few bytes to several pages.
fn append(j: &CheckpointJournal, n: usize) {
    let task = TASKS[n % TASKS.len()];
    let step = n / TASKS.len();
    let attempt = u32::try_from(step / PHASES.len()).unwrap() + 1;
    let phase = PHASES[step % PHASES.len()];
    let filler = "x".repeat((n * 977) % 9000);
    j.append_value(
        &binding(task, attempt),
        phase,
        &json!({"n": n, "filler": filler}),
    )
    .unwrap();
}

/// The frames of a log: `(end offset, is a commit frame)`, those of its
/// current generation (the header's salt) only.
fn frames(wal: &[u8]) -> (usize, Vec<(usize, bool)>) {
    if wal.len() < 32 {
        return (0, Vec::new()); // no header: nothing in it counts
    }
    let page = u32::from_be_bytes(wal[8..12].try_into().unwrap()) as usize;
    let salt = &wal[16..24];
    let mut out = Vec::new();
    let mut at = 32;
    while at + 24 + page <= wal.len() && &wal[at + 8..at + 16] == salt {
        let commit = wal[at + 4..at + 8] != [0, 0, 0, 0];
        at += 24 + page;
        out.push((at, commit));
    }
    (page, out)
}

/// Commits whose frames are whole in the first `cut` bytes of `wal`.
fn commits_within(wal: &[u8], cut: usize) -> usize {
    frames(wal)
        .1
        .iter()
        .filter(|(end, commit)| *commit && *end <= cut)
        .count()
}

/// One state of the journal's files, and what it showed after each commit
/// of its log (`views[0]`: before the first one in the log).
struct Copy {
    name: &'static str,
    db: Vec<u8>,
    wal: Option<Vec<u8>>,
    views: Vec<View>,
}

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap()
}

fn wal_of(p: &Path) -> PathBuf {
    PathBuf::from(format!("{}-wal", p.display()))
}

/// Writes the journal and keeps its three states.
fn fixture(dir: &Path) -> Vec<Copy> {
    let path = dir.join("checkpoints.sqlite3");
    let j = CheckpointJournal::open(&path).unwrap();
    let log_commits =
        |p: &Path| std::fs::read(wal_of(p)).map_or(0, |w| commits_within(&w, w.len()));
    let mut views = vec![view(&j)];
    let before = log_commits(&path);
    for n in 0..IN_LOG {
        append(&j, n);
        assert_eq!(log_commits(&path), before + n + 1, "one commit per append");
        views.push(view(&j));
    }
    // Commits in the log before the first append (the journal's creation,
    // when it left one there) show the empty journal.
    let mut copies = vec![Copy {
        name: "every append in the log",
        db: read(&path),
        wal: Some(read(&wal_of(&path))),
        views: [vec![views[0].clone(); before], views.clone()].concat(),
    }];
    // Checkpoint the log into the database (as SQLite does at 1000 pages),
    // then go on: the first appends are in the database, the rest in a new log.
    let other = rusqlite::Connection::open(&path).unwrap();
    let busy: i64 = other
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))
        .unwrap();
    assert_eq!(busy, 0);
    drop(other);
    assert_eq!(log_commits(&path), 0);
    let mut tail = vec![views.last().unwrap().clone()];
    for n in IN_LOG..IN_LOG + AFTER_CHECKPOINT {
        append(&j, n);
        tail.push(view(&j));
    }
    copies.push(Copy {
        name: "checkpointed, the last appends in the log",
        db: read(&path),
        wal: Some(read(&wal_of(&path))),
        views: tail.clone(),
    });
    drop(j); // the last connection: SQLite checkpoints and removes the log
    assert!(!wal_of(&path).exists());
    copies.push(Copy {
        name: "closed, no log",
        db: read(&path),
        wal: None,
        views: vec![tail.last().unwrap().clone()],
    });
    copies
}

/// What opening a cut copy did.
#[derive(Debug)]
enum Opened {
    /// It opened and showed this.
    Showed(View),
    /// Refused with this code.
    Refused(Code, String),
    /// It opened, and then a read failed with this code.
    ReadFailed(Code, String),
    /// Panicked.
    Panicked,
}

impl Opened {
    /// How it reads in a failure: what it showed as the index of the view
    /// it equals (or that it equals none), or its refusal.
    fn describe(&self, views: &[View]) -> String {
        match self {
            Opened::Showed(v) => match views.iter().position(|w| w == v) {
                Some(k) => format!("opened as after commit {k}"),
                None => "opened showing what the journal never showed".to_owned(),
            },
            Opened::Refused(code, e) => format!("refused {code:?}: {e}"),
            Opened::ReadFailed(code, e) => format!("opened, then a read failed {code:?}: {e}"),
            Opened::Panicked => "panicked".to_owned(),
        }
    }
}

fn open_cut(dir: &Path, n: usize, db: &[u8], wal: Option<&[u8]>) -> Opened {
    let here = dir.join(format!("cut-{n}"));
    std::fs::create_dir(&here).unwrap();
    let path = here.join("checkpoints.sqlite3");
    std::fs::write(&path, db).unwrap();
    if let Some(w) = wal {
        std::fs::write(wal_of(&path), w).unwrap();
    }
    let outcome = catch_unwind(AssertUnwindSafe(|| match CheckpointJournal::open(&path) {
        Ok(j) => match read_view(&j) {
            Ok(v) => Opened::Showed(v),
            Err(e) => Opened::ReadFailed(e.code(), e.to_string()),
        },
        Err(e) => Opened::Refused(e.code(), e.to_string()),
    }))
    .unwrap_or(Opened::Panicked);
    std::fs::remove_dir_all(&here).unwrap();
    outcome
}

/// Offsets on every boundary of `unit`-byte records after `start` bytes,
/// and inside each record at `inside`.
fn cuts(len: usize, start: usize, unit: usize, inside: &[usize]) -> Vec<usize> {
    let mut out: Vec<usize> = vec![0, 1, start / 2, start.saturating_sub(1)];
    let mut at = start;
    while at <= len {
        out.push(at);
        out.extend(inside.iter().map(|i| at + i).filter(|&c| c < len));
        at += unit;
    }
    out.retain(|&c| c <= len);
    out.sort_unstable();
    out.dedup();
    out
}

#[test]
fn a_cut_log_opens_at_its_last_whole_commit_and_a_cut_database_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let copies = fixture(dir.path());
    let mut n = 0;
    let mut failures = Vec::new();
    let (mut log_cuts, mut db_cuts, mut refused, mut whole) = (0, 0, 0, 0);
    for copy in &copies {
        // The log cut, the database whole.
        if let Some(wal) = &copy.wal {
            let (page, _) = frames(wal);
            let frame = 24 + page;
            for cut in cuts(wal.len(), 32, frame, &[1, 24, 24 + page / 2, frame - 1]) {
                n += 1;
                log_cuts += 1;
                let expected = commits_within(wal, cut);
                let got = open_cut(dir.path(), n, &copy.db, Some(&wal[..cut]));
                if !matches!(&got, Opened::Showed(v) if *v == copy.views[expected]) {
                    failures.push(format!(
                        "{}: log cut at {cut} of {}: {}, expected as after commit {expected}",
                        copy.name,
                        wal.len(),
                        got.describe(&copy.views)
                    ));
                }
            }
        }
        // The database cut, the log (if any) whole.
        let page = match u16::from_be_bytes([copy.db[16], copy.db[17]]) {
            1 => 65_536,
            p => usize::from(p),
        };
        let last = copy.views.len() - 1;
        let mut at = cuts(copy.db.len(), page, page, &[1, page / 2, page - 1]);
        at.extend([50, 99, 100, 101]);
        at.sort_unstable();
        at.dedup();
        for cut in at {
            if cut == copy.db.len() {
                continue; // not cut
            }
            n += 1;
            db_cuts += 1;
            let got = open_cut(dir.path(), n, &copy.db[..cut], copy.wal.as_deref());
            match &got {
                Opened::Showed(v) if *v == copy.views[last] => whole += 1,
                Opened::Refused(Code::STORE_CORRUPT, _) => refused += 1,
                _ => failures.push(format!(
                    "{}: database cut at {cut} of {}: {}, expected the journal whole or STORE_CORRUPT",
                    copy.name,
                    copy.db.len(),
                    got.describe(&copy.views)
                )),
            }
        }
    }
    println!(
        "torn journal: {log_cuts} log cuts, each opened at its last whole commit; {db_cuts} database cuts: {refused} refused with STORE_CORRUPT, {whole} opened whole (the cut part was in the log)"
    );
    assert!(
        failures.is_empty(),
        "{} of {n} cuts:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        log_cuts > 100 && db_cuts > 30 && refused > 0,
        "the cuts ran"
    );
}

#[test]
fn an_empty_database_file_is_refused_and_a_new_journal_is_made_whole() {
    let dir = tempfile::tempdir().unwrap();
    // A new journal: no file is ever seen empty, no temporary is left.
    let path = dir.path().join("checkpoints.sqlite3");
    let j = CheckpointJournal::open(&path).unwrap();
    append(&j, 0);
    drop(j);
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["checkpoints.sqlite3"]);
    // Emptied: refused, and not recreated over.
    std::fs::write(&path, b"").unwrap();
    let e = CheckpointJournal::open(&path).unwrap_err();
    assert_eq!(e.code(), Code::STORE_CORRUPT, "{e}");
    assert!(e.to_string().contains("empty"), "{e}");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
    // A log without its database.
    let lone = dir.path().join("lone.sqlite3");
    std::fs::write(wal_of(&lone), vec![1u8; 4096]).unwrap();
    let e = CheckpointJournal::open(&lone).unwrap_err();
    assert_eq!(e.code(), Code::STORE_CORRUPT, "{e}");
    assert!(!lone.exists());
    // What a crash while creating left is removed, and the journal made.
    let fresh = dir.path().join("fresh.sqlite3");
    std::fs::write(dir.path().join("fresh.sqlite3.new"), b"half").unwrap();
    std::fs::write(dir.path().join("fresh.sqlite3.new-wal"), b"half").unwrap();
    CheckpointJournal::open(&fresh).unwrap();
    assert!(!dir.path().join("fresh.sqlite3.new").exists());
    assert!(!dir.path().join("fresh.sqlite3.new-wal").exists());
}

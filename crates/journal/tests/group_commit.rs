//! Group commit on the real journal and the real SQLite: appends that
//! arrive while another append's fsync is in flight go into the next
//! commit together, and each returns only after that commit's fsync.
//!
//! The fsyncs are SQLite's own, reached through [`fault_vfs`]: a VFS
//! registered as this process's default that hands every call to SQLite's
//! unix VFS and only adds a gate in front of the WAL's `xSync` — holding a
//! sync (so that appends demonstrably queue up behind it), counting syncs,
//! or failing one with `SQLITE_IOERR_FSYNC`, the error a real disk's
//! failed flush gives. The journal, its rules and its recovery run
//! unchanged. Each test holds [`serial`] because the gate is per process.
//!
//! Batches are made deterministic by holding the sync of a first append
//! and waiting until [`CheckpointJournal::commit_stats`] shows the others
//! queued, never by sleeping.

use airlock_journal::SqliteError;
use airlock_journal::checkpoint::{Checkpoint, CheckpointJournal};
use airlock_proto::Code;
use airlock_proto::checkpoint::{CheckpointBinding, Phase};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Appends that queue behind the held one.
const QUEUED: usize = 7;

/// The fault-injecting VFS: SQLite's unix VFS with a gate on WAL syncs.
mod fault_vfs {
    use rusqlite::ffi;
    use std::ffi::c_int;
    use std::sync::{Condvar, Mutex, MutexGuard, Once, OnceLock};
    use std::time::{Duration, Instant};

    type SyncFn = unsafe extern "C" fn(*mut ffi::sqlite3_file, c_int) -> c_int;

    /// A pointer SQLite owns for the life of the process.
    #[derive(Clone, Copy)]
    struct Static(usize);

    /// SQLite's own default VFS, which this one forwards to.
    static REAL: OnceLock<Static> = OnceLock::new();
    /// (SQLite's io methods of a WAL file, our copy of them, its xSync).
    static METHODS: Mutex<Vec<(usize, usize, SyncFn)>> = Mutex::new(Vec::new());

    #[derive(Default)]
    struct State {
        /// WAL syncs begun so far in this process.
        entered: u64,
        /// While holding: syncs numbered above this wait.
        allowed: Option<u64>,
        /// Sync numbers that fail with SQLITE_IOERR_FSYNC.
        failing: Vec<u64>,
    }
    static STATE: Mutex<State> = Mutex::new(State {
        entered: 0,
        allowed: None,
        failing: Vec::new(),
    });
    static CHANGED: Condvar = Condvar::new();

    fn state() -> MutexGuard<'static, State> {
        STATE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Registers the VFS as the process's default (once).
    pub fn install() {
        static ONCE: Once = Once::new();
        ONCE.call_once(|| {
            // SAFETY: sqlite3_vfs_find initialises SQLite and returns its
            // default VFS, a static object that lives as long as the
            // process; we only copy it.
            let real = unsafe { ffi::sqlite3_vfs_find(std::ptr::null()) };
            assert!(!real.is_null(), "SQLite has no default VFS");
            REAL.set(Static(real as usize)).ok();
            // SAFETY: `real` is a valid, initialised sqlite3_vfs (above).
            let mut vfs: ffi::sqlite3_vfs = unsafe { *real };
            vfs.zName = c"airlock-fault-vfs".as_ptr();
            vfs.pNext = std::ptr::null_mut();
            vfs.xOpen = Some(open);
            let vfs: &'static mut ffi::sqlite3_vfs = Box::leak(Box::new(vfs));
            // SAFETY: `vfs` is leaked, so it outlives every connection, and
            // every function in it is SQLite's own or `open` below.
            let rc = unsafe { ffi::sqlite3_vfs_register(vfs, 1) };
            assert_eq!(rc, ffi::SQLITE_OK, "registering the fault VFS");
        });
    }

    /// Opens through SQLite's VFS; a WAL file gets a copy of its methods
    /// whose xSync passes the gate first.
    unsafe extern "C" fn open(
        _vfs: *mut ffi::sqlite3_vfs,
        name: ffi::sqlite3_filename,
        file: *mut ffi::sqlite3_file,
        flags: c_int,
        out_flags: *mut c_int,
    ) -> c_int {
        let real = REAL.get().expect("installed").0 as *mut ffi::sqlite3_vfs;
        // SAFETY: `real` is SQLite's default VFS (see `install`); our
        // szOsFile is its szOsFile, so `file` is the size it expects, and
        // the other arguments are SQLite's, passed on unchanged.
        let rc = unsafe { ((*real).xOpen.expect("xOpen"))(real, name, file, flags, out_flags) };
        // SAFETY: after a successful xOpen, `file` is an open sqlite3_file
        // whose pMethods points at SQLite's static io methods.
        unsafe {
            if rc == ffi::SQLITE_OK && flags & ffi::SQLITE_OPEN_WAL != 0 {
                let methods = (*file).pMethods;
                if !methods.is_null() {
                    (*file).pMethods = gated(methods);
                }
            }
        }
        rc
    }

    /// Our copy of `methods` with the gated xSync (one copy per table).
    ///
    /// # Safety
    ///
    /// `methods` points at a static sqlite3_io_methods of SQLite's.
    unsafe fn gated(methods: *const ffi::sqlite3_io_methods) -> *const ffi::sqlite3_io_methods {
        let mut all = METHODS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, copy, _)) = all.iter().find(|(orig, _, _)| *orig == methods as usize) {
            return *copy as *const _;
        }
        // SAFETY: the caller's contract: `methods` is valid and static.
        let mut copy: ffi::sqlite3_io_methods = unsafe { *methods };
        let sync = copy.xSync.expect("xSync");
        copy.xSync = Some(wal_sync);
        let copy: &'static ffi::sqlite3_io_methods = Box::leak(Box::new(copy));
        all.push((methods as usize, copy as *const _ as usize, sync));
        copy
    }

    unsafe extern "C" fn wal_sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
        // SAFETY: SQLite calls xSync with the open file whose pMethods is
        // our copy (set in `open`).
        let methods = unsafe { (*file).pMethods } as usize;
        let sync = METHODS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|(_, copy, _)| *copy == methods)
            .map(|(_, _, sync)| *sync)
            .expect("a gated WAL file");
        let fail = {
            let mut s = state();
            s.entered += 1;
            let n = s.entered;
            CHANGED.notify_all();
            while s.allowed.is_some_and(|a| n > a) {
                s = CHANGED.wait(s).unwrap_or_else(|e| e.into_inner());
            }
            s.failing.contains(&n)
        };
        if fail {
            return ffi::SQLITE_IOERR_FSYNC;
        }
        // SAFETY: SQLite's own xSync of this file, with SQLite's arguments.
        unsafe { sync(file, flags) }
    }

    /// WAL syncs begun so far.
    pub fn entered() -> u64 {
        state().entered
    }

    /// From now on every WAL sync waits for [`release`] (or [`open_gate`]).
    pub fn hold() {
        let mut s = state();
        s.allowed = Some(s.entered);
    }

    /// Lets one more held sync through.
    pub fn release() {
        let mut s = state();
        s.allowed = s.allowed.map(|a| a + 1);
        CHANGED.notify_all();
    }

    /// Stops holding and lets every waiting sync through.
    pub fn open_gate() {
        let mut s = state();
        s.allowed = None;
        CHANGED.notify_all();
    }

    /// Holds nothing and fails nothing.
    pub fn reset() {
        let mut s = state();
        s.allowed = None;
        s.failing.clear();
        CHANGED.notify_all();
    }

    /// The `n`th WAL sync from now fails with SQLITE_IOERR_FSYNC (1: the
    /// next one).
    pub fn fail_nth(n: u64) {
        let mut s = state();
        let at = s.entered + n;
        s.failing.push(at);
    }

    /// Waits until `n` WAL syncs have begun in all.
    pub fn wait_entered(n: u64) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut s = state();
        while s.entered < n {
            assert!(Instant::now() < deadline, "WAL sync {n} never began");
            s = CHANGED
                .wait_timeout(s, Duration::from_millis(50))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// One test at a time: the gate is the process's.
fn serial() -> MutexGuard<'static, ()> {
    static ONE: Mutex<()> = Mutex::new(());
    let guard = ONE.lock().unwrap_or_else(|e| e.into_inner());
    fault_vfs::install();
    fault_vfs::reset();
    guard
}

fn binding(task: &str, attempt: u32) -> CheckpointBinding {
    CheckpointBinding {
        task_id: task.into(),
        attempt,
        execution_digest: "d".repeat(64),
        job_id: format!("job-{task}"),
        repository: "demo".into(),
        base_oid: "a".repeat(40),
        expected_branch_oid: "b".repeat(40),
        target_branch: format!("agent/{task}"),
        generation: 1,
    }
}

/// The phases an attempt walks through, then the next attempt.
const PHASES: [Phase; 6] = [
    Phase::Claimed,
    Phase::WorkspacePrepared,
    Phase::VerificationPassed,
    Phase::CommitDone,
    Phase::ResultPending,
    Phase::ResultSubmitted,
];

/// The `i`th append of `task`'s walk.
fn step(task: &str, i: usize) -> (CheckpointBinding, Phase, serde_json::Value) {
    let attempt = u32::try_from(i / PHASES.len()).unwrap() + 1;
    (
        binding(task, attempt),
        PHASES[i % PHASES.len()],
        json!({"task": task, "i": i}),
    )
}

fn append_step(j: &CheckpointJournal, task: &str, i: usize) -> Result<Checkpoint, SqliteError> {
    let (b, phase, payload) = step(task, i);
    j.append_value(&b, phase, &payload)
}

/// Waits until `n` appends are queued behind the commit in flight.
fn wait_queued(j: &CheckpointJournal, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while j.commit_stats().waiting < n {
        assert!(
            Instant::now() < deadline,
            "only {} appends queued, not {n}",
            j.commit_stats().waiting
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The database and its WAL as they are on disk now, copied to `to` (the
/// live connection keeps its WAL; opening the copy runs SQLite's WAL
/// recovery as a restart after a crash would). `wal_len` cuts the WAL.
fn copy_on_disk(path: &Path, to: &Path, wal_len: Option<u64>) -> PathBuf {
    std::fs::create_dir_all(to).unwrap();
    let db = to.join("checkpoints.sqlite3");
    std::fs::copy(path, &db).unwrap();
    let wal = to.join("checkpoints.sqlite3-wal");
    std::fs::copy(wal_of(path), &wal).unwrap();
    if let Some(len) = wal_len {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&wal)
            .unwrap()
            .set_len(len)
            .unwrap();
    }
    db
}

fn wal_of(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push("-wal");
    PathBuf::from(p)
}

fn wal_len(path: &Path) -> u64 {
    std::fs::metadata(wal_of(path)).unwrap().len()
}

/// One held append (task `t0`'s next step), then [`QUEUED`] appends from
/// other threads queued behind its sync, run by `queued(k)`; the held
/// sync is released when all are queued. Returns the outcomes of the held
/// append and of the queued ones (in thread order).
fn held_then_batch<F>(
    j: &CheckpointJournal,
    held_step: usize,
    queued: F,
    between: impl FnOnce(),
) -> (Checkpoint, Vec<Result<Checkpoint, SqliteError>>)
where
    F: Fn(usize) -> Result<Checkpoint, SqliteError> + Sync,
{
    let before = fault_vfs::entered();
    fault_vfs::hold();
    std::thread::scope(|s| {
        let first = s.spawn(|| append_step(j, "t0", held_step));
        fault_vfs::wait_entered(before + 1);
        let queued = &queued;
        let rest: Vec<_> = (1..=QUEUED).map(|k| s.spawn(move || queued(k))).collect();
        wait_queued(j, QUEUED as u64);
        between();
        fault_vfs::open_gate();
        let first = first.join().unwrap().unwrap();
        (first, rest.into_iter().map(|h| h.join().unwrap()).collect())
    })
}

#[test]
#[allow(non_snake_case)]
fn GROUP_COMMIT_concurrent_appenders_are_all_durable_and_in_order_after_reopen() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoints.sqlite3");
    let j = CheckpointJournal::open(&path).unwrap();
    for t in 0..=QUEUED {
        append_step(&j, &format!("t{t}"), 0).unwrap();
    }

    // A deterministic batch: t1..t6's next appends and one refused append
    // (t0 at attempt 1 under another execution digest, in t7's place) wait
    // behind t0's held sync, then commit together; the refusal changes
    // nothing and disturbs none of the others.
    let stats = j.commit_stats();
    let syncs = fault_vfs::entered();
    let (first, batch) = held_then_batch(
        &j,
        1,
        |k| {
            if k == QUEUED {
                let mut other = binding("t0", 1);
                other.execution_digest = "e".repeat(64);
                j.append_value(&other, Phase::VerificationPassed, &json!({}))
            } else {
                append_step(&j, &format!("t{k}"), 1)
            }
        },
        || {},
    );
    assert_eq!((first.task_id.as_str(), first.sequence), ("t0", 2));
    for (k, outcome) in batch.iter().enumerate().take(QUEUED - 1) {
        let cp = outcome.as_ref().unwrap();
        assert_eq!(
            (cp.task_id.clone(), cp.sequence),
            (format!("t{}", k + 1), 2)
        );
    }
    assert_eq!(
        batch[QUEUED - 1].as_ref().unwrap_err().code(),
        Code::CHECKPOINT_EXECUTION_DIGEST_CONFLICT
    );
    let after = j.commit_stats();
    assert_eq!(after.appends - stats.appends, 1 + QUEUED as u64);
    assert_eq!(
        after.batches - stats.batches,
        2,
        "the held append, then one batch"
    );
    assert!(after.largest_batch >= QUEUED as u64);
    assert_eq!(fault_vfs::entered() - syncs, 2, "one WAL fsync per batch");
    // t7's own step, which the refused append stood in for.
    append_step(&j, &format!("t{QUEUED}"), 1).unwrap();

    // Then eight free-running appenders, 30 appends each.
    let per_thread = 30;
    let acked: Vec<Vec<Checkpoint>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..=QUEUED)
            .map(|t| {
                let j = &j;
                s.spawn(move || {
                    (2..2 + per_thread)
                        .map(|i| append_step(j, &format!("t{t}"), i).unwrap())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let stats = j.commit_stats();
    assert_eq!(stats.waiting, 0);

    // What is on disk, reopened as after a crash: every acknowledged
    // append, in each task's order, and the journal's invariants hold.
    let copy = copy_on_disk(&path, &dir.path().join("copy"), None);
    let reopened = CheckpointJournal::open(&copy).unwrap();
    reopened.integrity_check().unwrap();
    for (t, acks) in acked.iter().enumerate() {
        let task = format!("t{t}");
        let history = reopened.history(&task).unwrap();
        assert_eq!(history.len(), 2 + per_thread, "{task}");
        for (i, cp) in history.iter().enumerate() {
            let (b, phase, payload) = step(&task, i);
            assert_eq!(
                (&cp.binding, cp.phase, &cp.payload),
                (&b, phase, &payload),
                "{task} #{i}"
            );
        }
        assert_eq!(&history[2..], &acks[..], "{task}: as acknowledged");
    }
}

#[test]
#[allow(non_snake_case)]
fn GROUP_COMMIT_a_torn_tail_after_a_batched_write_drops_the_whole_batch() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoints.sqlite3");
    let j = CheckpointJournal::open(&path).unwrap();
    for t in 0..=QUEUED {
        append_step(&j, &format!("t{t}"), 0).unwrap();
    }
    // t0's held append commits alone; the batch of seven waits behind it.
    // The WAL's length is taken once the batch's frames are written and
    // its own sync is held.
    let mut lens = (0, 0);
    let syncs = fault_vfs::entered();
    let (_, batch) = held_then_batch(
        &j,
        1,
        |k| append_step(&j, &format!("t{k}"), 1),
        || {
            lens.0 = wal_len(&path);
            fault_vfs::release();
            fault_vfs::wait_entered(syncs + 2);
            lens.1 = wal_len(&path);
        },
    );
    assert!(batch.iter().all(Result::is_ok));
    let (before, after) = lens;
    assert!(after > before, "the batch wrote WAL frames");

    // Whole: everything. Torn anywhere inside the batch's frames (its
    // commit frame is the last): the batch is gone as a whole, the commit
    // before it stays, and the journal goes on from there.
    for (name, len) in [
        ("whole", after),
        ("last byte lost", after - 1),
        ("half lost", before + (after - before) / 2),
        ("all but a byte lost", before + 1),
    ] {
        let copy = copy_on_disk(&path, &dir.path().join(name.replace(' ', "-")), Some(len));
        let reopened = CheckpointJournal::open(&copy).unwrap();
        reopened.integrity_check().unwrap();
        assert_eq!(reopened.history("t0").unwrap().len(), 2, "{name}: t0");
        let kept = if len == after { 2 } else { 1 };
        for k in 1..=QUEUED {
            let task = format!("t{k}");
            assert_eq!(
                reopened.history(&task).unwrap().len(),
                kept,
                "{name}: {task}"
            );
            if kept == 1 {
                let cp = append_step(&reopened, &task, 1).unwrap();
                assert_eq!(
                    cp.sequence, 2,
                    "{name}: {task} goes on after the torn batch"
                );
            }
        }
        reopened.integrity_check().unwrap();
    }
}

#[test]
#[allow(non_snake_case)]
fn GROUP_COMMIT_an_fsync_error_fails_every_append_of_its_batch() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoints.sqlite3");
    let j = CheckpointJournal::open(&path).unwrap();
    for t in 0..=QUEUED {
        append_step(&j, &format!("t{t}"), 0).unwrap();
    }
    // The held append's sync succeeds; the batch's (the next) fails.
    let (first, batch) = held_then_batch(
        &j,
        1,
        |k| append_step(&j, &format!("t{k}"), 1),
        || fault_vfs::fail_nth(1),
    );
    assert_eq!(first.sequence, 2);
    for (k, outcome) in batch.iter().enumerate() {
        let err = outcome.as_ref().unwrap_err();
        assert_eq!(err.code(), Code::STORE_UNAVAILABLE, "t{}: {err}", k + 1);
        assert!(err.to_string().contains("committing a checkpoint"), "{err}");
    }

    // Nothing of the batch is in the journal, which goes on: each failed
    // append, retried, is stored at the sequence it would have had.
    for k in 1..=QUEUED {
        let task = format!("t{k}");
        assert_eq!(j.history(&task).unwrap().len(), 1, "{task}");
        assert_eq!(append_step(&j, &task, 1).unwrap().sequence, 2, "{task}");
    }
    j.integrity_check().unwrap();
    let copy = copy_on_disk(&path, &dir.path().join("copy"), None);
    let reopened = CheckpointJournal::open(&copy).unwrap();
    reopened.integrity_check().unwrap();
    for k in 0..=QUEUED {
        assert_eq!(reopened.history(&format!("t{k}")).unwrap().len(), 2);
    }

    // A lone append whose fsync fails fails too, and is not acknowledged.
    fault_vfs::fail_nth(1);
    let err = append_step(&j, "t0", 2).unwrap_err();
    assert_eq!(err.code(), Code::STORE_UNAVAILABLE, "{err}");
    assert_eq!(j.history("t0").unwrap().len(), 2);
}

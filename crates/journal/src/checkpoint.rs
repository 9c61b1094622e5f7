//! The worker's checkpoint journal.
//!
//! Every phase of every attempt the worker runs is appended here before
//! the worker acts on it, so that after a crash (or `kill -9`) the worker
//! knows exactly how far each task got and never repeats a side effect.
//!
//! # Rules
//!
//! A checkpoint is bound to a [`CheckpointBinding`]: the task, the attempt,
//! the execution digest and every coordinate (job, repository, base, expected
//! head, branch, generation). [`CheckpointJournal::append`] runs in one
//! `BEGIN IMMEDIATE` transaction and, against the task's *head* (its latest
//! checkpoint):
//!
//! 1. an **exact replay** — same task, attempt, phase and payload digest —
//!    returns the row already stored and adds nothing (a replay under a
//!    different binding is refused, see below);
//! 2. an attempt **older** than the head is `CHECKPOINT_ATTEMPT_REGRESSION`;
//! 3. within the head's attempt, another execution digest is
//!    `CHECKPOINT_EXECUTION_DIGEST_CONFLICT`, any other changed coordinate is
//!    `CHECKPOINT_SCOPE_MISMATCH_DENY`, and a phase ranked below the head's
//!    ([`Phase::order`]) is `CHECKPOINT_PHASE_REGRESSION` — except
//!    `reconciliation_required`, which may be recorded at any point;
//! 4. the sequence is the head's plus one within an attempt, and starts at
//!    1 for a new attempt.
//!
//! # Durability and tamper resistance
//!
//! The file is opened by [`db::open`]: WAL, `synchronous=FULL`, so an
//! `append` that returned is on disk: the order is make durable (the
//! commit's fsync of the WAL), then record (the commit is visible), then
//! acknowledge (`append` returns). Concurrent appends share commits
//! (group commit, [`CheckpointJournal::append`]) without changing that
//! order: each returns only after the fsync of the commit holding it, and
//! a batch is one transaction, found whole or not at all after a crash
//! (SQLite's WAL recovery drops a torn tail up to the last commit frame).
//! The `checkpoints` table is
//! append-only: triggers abort any `UPDATE` or `DELETE`, and a
//! `BEFORE INSERT` trigger re-checks the sequence, attempt and phase rules
//! in SQL, so even a buggy or hand-written insert (including
//! `INSERT OR REPLACE`, whose implicit delete does not fire delete
//! triggers) cannot rewrite history. The `checkpoint_heads` table is a
//! cache of each task's latest row; a foreign key ties every head to a real
//! checkpoint and a trigger only lets it move forward. Every row read back
//! is re-verified: its binding and payload digests are recomputed.
//!
//! # Example
//!
//! ```
//! use airlock_proto::checkpoint::{
//!     CheckpointBinding, ClaimedPayload, Payload, Phase, WorkspacePreparedPayload,
//! };
//! use airlock_journal::checkpoint::CheckpointJournal;
//! use serde_json::json;
//!
//! let dir = tempfile::tempdir()?;
//! let journal = CheckpointJournal::open(&dir.path().join("checkpoints.sqlite3"))?;
//! let binding = CheckpointBinding {
//!     task_id: "task-1".into(),
//!     attempt: 1,
//!     execution_digest: "d".repeat(64),
//!     job_id: "job-1".into(),
//!     repository: "demo".into(),
//!     base_oid: "a".repeat(40),
//!     expected_branch_oid: "a".repeat(40),
//!     target_branch: "agent/task-1".into(),
//!     generation: 1,
//! };
//! let claimed = Payload::Claimed(ClaimedPayload {
//!     lease_epoch: 1,
//!     lease_token: "t".repeat(43),
//!     request_id: "r-1".into(),
//! });
//! journal.append(&binding, &claimed)?;
//! let cp = journal.append(&binding, &Payload::WorkspacePrepared(WorkspacePreparedPayload {
//!     request_id: "r-1".into(),
//!     request_sha256: "e".repeat(64),
//!     source_tree: "f".repeat(40),
//! }))?;
//! assert_eq!(cp.sequence, 2);
//! assert_eq!(journal.latest("task-1")?.unwrap().decode()?, cp.decode()?);
//!
//! // Going back is refused, and the worker resumes unfinished tasks at start.
//! let err = journal.append_value(&binding, Phase::Claimed, &json!({"other": 1})).unwrap_err();
//! assert_eq!(err.code(), airlock_proto::Code::CHECKPOINT_PHASE_REGRESSION);
//! assert_eq!(journal.unfinished()?[0].phase, Phase::WorkspacePrepared);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use airlock_proto::canonical::{sha256_hex, to_canonical_string};
use airlock_proto::checkpoint::{CheckpointBinding, Payload, Phase};
use airlock_proto::{Code, Error};
use airlock_sqlite::clock::{Clock, SystemClock};
use airlock_sqlite::db::{self, Kind, Migration};
use airlock_sqlite::error::{SqliteError, SqliteResult};
use rusqlite::types::ToSql;
use rusqlite::{Connection, OptionalExtension, Row, TransactionBehavior, params, params_from_iter};
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

/// Largest checkpoint payload, in canonical JSON bytes. Payloads carry
/// hashes, keys and small evidence, never file contents.
pub const MAX_PAYLOAD_BYTES: usize = 1024 * 1024;

/// The journal's schema, one step per version.
const MIGRATIONS: &[Migration] = &[Migration {
    version: 1,
    sql: r#"
CREATE TABLE checkpoints(
  task_id TEXT NOT NULL,
  attempt INTEGER NOT NULL CHECK (attempt >= 1),
  sequence INTEGER NOT NULL CHECK (sequence >= 1),
  phase TEXT NOT NULL,
  phase_order INTEGER NOT NULL,
  execution_digest TEXT NOT NULL,
  job_id TEXT NOT NULL,
  repository TEXT NOT NULL,
  base_oid TEXT NOT NULL,
  expected_branch_oid TEXT NOT NULL,
  target_branch TEXT NOT NULL,
  generation INTEGER NOT NULL,
  binding_sha256 TEXT NOT NULL,
  payload_json TEXT NOT NULL,
  payload_sha256 TEXT NOT NULL,
  created_at_ms INTEGER NOT NULL,
  PRIMARY KEY (task_id, attempt, sequence)
);

-- An exact replay (same task, attempt, phase and payload) finds its row here.
CREATE UNIQUE INDEX checkpoints_exact_replay
  ON checkpoints(task_id, attempt, phase, payload_sha256);

-- The latest checkpoint of each task; a cache of the journal, never ahead of it.
CREATE TABLE checkpoint_heads(
  task_id TEXT PRIMARY KEY,
  attempt INTEGER NOT NULL,
  sequence INTEGER NOT NULL,
  phase TEXT NOT NULL,
  phase_order INTEGER NOT NULL,
  execution_digest TEXT NOT NULL,
  binding_sha256 TEXT NOT NULL,
  payload_sha256 TEXT NOT NULL,
  updated_at_ms INTEGER NOT NULL,
  FOREIGN KEY (task_id, attempt, sequence)
    REFERENCES checkpoints(task_id, attempt, sequence)
);

CREATE TRIGGER checkpoints_no_update BEFORE UPDATE ON checkpoints
BEGIN
  SELECT RAISE(ABORT, 'checkpoints are append-only');
END;

CREATE TRIGGER checkpoints_no_delete BEFORE DELETE ON checkpoints
BEGIN
  SELECT RAISE(ABORT, 'checkpoints are append-only');
END;

-- The append rules again, in SQL. BEFORE INSERT runs ahead of conflict
-- resolution, so INSERT OR REPLACE cannot overwrite a row either.
CREATE TRIGGER checkpoints_append_rules BEFORE INSERT ON checkpoints
BEGIN
  SELECT RAISE(ABORT, 'checkpoint already recorded')
   WHERE EXISTS (SELECT 1 FROM checkpoints
                  WHERE task_id = NEW.task_id AND attempt = NEW.attempt
                    AND (sequence = NEW.sequence
                         OR (phase = NEW.phase AND payload_sha256 = NEW.payload_sha256)));
  SELECT RAISE(ABORT, 'checkpoint attempt regresses')
   WHERE NEW.attempt < (SELECT max(attempt) FROM checkpoints WHERE task_id = NEW.task_id);
  SELECT RAISE(ABORT, 'checkpoint sequence is not contiguous')
   WHERE NEW.sequence != 1 + coalesce((SELECT max(sequence) FROM checkpoints
                                        WHERE task_id = NEW.task_id
                                          AND attempt = NEW.attempt), 0);
  SELECT RAISE(ABORT, 'checkpoint binding differs within the attempt')
   WHERE EXISTS (SELECT 1 FROM checkpoints
                  WHERE task_id = NEW.task_id AND attempt = NEW.attempt
                    AND binding_sha256 != NEW.binding_sha256);
  SELECT RAISE(ABORT, 'checkpoint phase regresses')
   WHERE NEW.phase != 'reconciliation_required'
     AND NEW.phase_order < (SELECT phase_order FROM checkpoints
                             WHERE task_id = NEW.task_id AND attempt = NEW.attempt
                             ORDER BY sequence DESC LIMIT 1);
END;

CREATE TRIGGER checkpoint_heads_no_delete BEFORE DELETE ON checkpoint_heads
BEGIN
  SELECT RAISE(ABORT, 'checkpoint heads are never removed');
END;

CREATE TRIGGER checkpoint_heads_forward_only BEFORE UPDATE ON checkpoint_heads
  WHEN NEW.task_id != OLD.task_id
    OR NEW.attempt < OLD.attempt
    OR (NEW.attempt = OLD.attempt AND NEW.sequence <= OLD.sequence)
BEGIN
  SELECT RAISE(ABORT, 'checkpoint heads only move forward');
END;
"#,
}];

/// The columns of a checkpoint row, in the order [`RawRow::read`] expects;
/// the table is always aliased `c`.
const COLUMNS: &str = "c.task_id, c.attempt, c.sequence, c.phase, c.phase_order, \
     c.execution_digest, c.job_id, c.repository, c.base_oid, c.expected_branch_oid, \
     c.target_branch, c.generation, c.binding_sha256, c.payload_json, c.payload_sha256, \
     c.created_at_ms";

/// One stored checkpoint, verified on the way out of the database.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    /// The task.
    pub task_id: String,
    /// The attempt the checkpoint belongs to (1-based).
    pub attempt: u32,
    /// Position within the attempt, from 1 with no gaps.
    pub sequence: u64,
    /// The phase reached.
    pub phase: Phase,
    /// The coordinates the checkpoint is bound to.
    pub binding: CheckpointBinding,
    /// [`CheckpointBinding::binding_sha256`] of `binding`.
    pub binding_sha256: String,
    /// The payload (a JSON object) as recorded.
    pub payload: Value,
    /// SHA-256 of the payload's canonical JSON.
    pub payload_sha256: String,
    /// When the checkpoint was written, unix milliseconds (informational).
    pub created_at_ms: i64,
}

impl Checkpoint {
    /// The typed payload of this checkpoint's phase. A payload that does
    /// not decode as its phase's type (a missing or unknown field, a wrong
    /// type, a malformed digest or id) is `STORE_CORRUPT`.
    pub fn decode(&self) -> Result<Payload, Error> {
        Payload::decode(self.phase, &self.payload).map_err(|e| {
            Error::with(
                e.code,
                format!(
                    "checkpoint {}/{}/{}: {}",
                    self.task_id,
                    self.attempt,
                    self.sequence,
                    e.detail.as_deref().unwrap_or("")
                ),
            )
        })
    }
}

/// The append-only, phase-monotonic journal of one worker.
///
/// One value holds one SQLite connection and is shared by every attempt
/// the worker runs (`&self` throughout; it is `Sync`). Appends that arrive
/// while another append's commit is in flight wait for it and then go
/// together into the next commit (group commit, see
/// [`CheckpointJournal::append`]). Several journals may also open the same
/// file: their writers serialise on `BEGIN IMMEDIATE`.
#[derive(Debug)]
pub struct CheckpointJournal {
    conn: Mutex<Connection>,
    queue: Mutex<Queue>,
    /// Signalled when a batch's results are in `Queue::results`.
    batch_done: Condvar,
    path: PathBuf,
}

/// Appends waiting for a commit, and what the commits did.
#[derive(Debug, Default)]
struct Queue {
    /// Appends not yet taken by a committing append, in arrival order.
    pending: Vec<(u64, Prepared)>,
    /// An append is running a batch (holds the connection) right now.
    committing: bool,
    /// Outcomes of committed batches, until their appends pick them up.
    results: HashMap<u64, SqliteResult<Checkpoint>>,
    next_id: u64,
    stats: CommitStats,
}

/// What the journal's group commit has done since it was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommitStats {
    /// Appends that went through a batch (stored, replayed or refused).
    pub appends: u64,
    /// Batches run: one write transaction, so one commit and one fsync of
    /// the WAL, each.
    pub batches: u64,
    /// The largest batch so far.
    pub largest_batch: u64,
    /// Appends waiting for the next batch right now.
    pub waiting: u64,
}

/// An append checked and digested, ready for a batch.
#[derive(Debug)]
struct Prepared {
    binding: CheckpointBinding,
    phase: Phase,
    payload: Value,
    payload_json: String,
    payload_sha256: String,
    binding_sha256: String,
}

impl CheckpointJournal {
    /// Opens the journal at `path`, creating it whole when there is none:
    /// WAL, `synchronous=FULL`, checked file identity, schema migrations.
    /// A journal found torn — an empty or cut database file, a log without
    /// its database, content that fails [`Self::integrity_check`] — is
    /// refused with `STORE_CORRUPT`; a log cut short opens as it was after
    /// its last whole commit (what is guaranteed: `crate::file`'s docs).
    pub fn open(path: &Path) -> SqliteResult<Self> {
        if crate::file::check_before_open(path)? {
            crate::file::create_whole(path, MIGRATIONS)?;
        }
        let conn = db::open(path, Kind::Checkpoints, MIGRATIONS)?;
        let journal = CheckpointJournal {
            conn: Mutex::new(conn),
            queue: Mutex::new(Queue::default()),
            batch_done: Condvar::new(),
            path: path.to_path_buf(),
        };
        journal.integrity_check().map_err(|e| match e {
            SqliteError::Refused(e) if e.code == Code::STORE_CORRUPT => refused(
                Code::STORE_CORRUPT,
                format!(
                    "checkpoint journal {}: {}",
                    path.display(),
                    e.detail.as_deref().unwrap_or("")
                ),
            ),
            other => other,
        })?;
        Ok(journal)
    }

    /// The journal's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What group commit has done since the journal was opened.
    pub fn commit_stats(&self) -> CommitStats {
        let q = lock(&self.queue);
        CommitStats {
            waiting: q.pending.len() as u64,
            ..q.stats
        }
    }

    /// Records that `binding`'s attempt reached the phase of `payload`,
    /// with that typed payload ([`Payload`]: one type per phase, so a
    /// field cannot go missing on the way in). Read it back with
    /// [`Checkpoint::decode`].
    ///
    /// Returns the stored checkpoint: the new one, or on an exact replay the
    /// one already recorded. Refusals (see the [module docs](self)) change
    /// nothing.
    ///
    /// # Durability and group commit
    ///
    /// When this returns `Ok`, the checkpoint is durable: its commit (and
    /// so the fsync of the WAL, `synchronous=FULL`) finished before any
    /// caller is told. Appends from other threads that arrive while a
    /// commit is in flight queue up; when it ends, one of them takes every
    /// queued append into a single write transaction — each in its own
    /// savepoint, judged by the same rules in arrival order, so a refused
    /// one changes nothing and does not disturb the others — and commits
    /// them with one fsync. If that commit fails (an fsync error, a full
    /// disk), every append of the batch fails with that error, and none of
    /// them was acknowledged; a batch is one transaction, so after a crash
    /// it is found whole or not at all. A failed append may still be found
    /// after a restart (the bytes may have reached the disk although the
    /// fsync reported an error); a retry of it is an exact replay.
    pub fn append(
        &self,
        binding: &CheckpointBinding,
        payload: &Payload,
    ) -> SqliteResult<Checkpoint> {
        self.append_value(binding, payload.phase(), &payload.to_value())
    }

    /// The untyped store beneath [`CheckpointJournal::append`]: records
    /// `phase` with any JSON object of at most [`MAX_PAYLOAD_BYTES`]
    /// canonical bytes, with the same group commit. The journal's own tests
    /// use it to exercise the ordering rules on arbitrary objects, and the
    /// worker's tests to write what an older release (or a damaged file)
    /// holds; the worker itself writes only through `append`.
    pub fn append_value(
        &self,
        binding: &CheckpointBinding,
        phase: Phase,
        payload: &Value,
    ) -> SqliteResult<Checkpoint> {
        if binding.attempt == 0 {
            return Err(refused(
                Code::FIELD_BOUNDS_EXCEEDED,
                "checkpoint attempts start at 1",
            ));
        }
        let payload_json = canonical_payload(payload)?;
        let prepared = Prepared {
            payload_sha256: sha256_hex(payload_json.as_bytes()),
            binding_sha256: binding.binding_sha256(),
            binding: binding.clone(),
            phase,
            payload: payload.clone(),
            payload_json,
        };

        let mut q = lock(&self.queue);
        let id = q.next_id;
        q.next_id += 1;
        q.pending.push((id, prepared));
        loop {
            if let Some(outcome) = q.results.remove(&id) {
                return outcome;
            }
            if q.committing {
                q = self
                    .batch_done
                    .wait(q)
                    .unwrap_or_else(PoisonError::into_inner);
                continue;
            }
            // Nobody is committing: this append runs the next batch, which
            // holds its own append and every one queued behind it.
            q.committing = true;
            let batch = std::mem::take(&mut q.pending);
            drop(q);
            let mut leader = Leader {
                journal: self,
                ids: batch.iter().map(|(id, _)| *id).collect(),
            };
            let outcomes = self.run_batch(batch);
            q = lock(&self.queue);
            leader.ids.clear();
            q.committing = false;
            q.stats.batches += 1;
            q.stats.appends += outcomes.len() as u64;
            q.stats.largest_batch = q.stats.largest_batch.max(outcomes.len() as u64);
            q.results.extend(outcomes);
            self.batch_done.notify_all();
        }
    }

    /// One write transaction for `batch`: each append in its own savepoint,
    /// then one commit. Every append gets its outcome; a failed commit is
    /// every stored append's failure.
    fn run_batch(&self, batch: Vec<(u64, Prepared)>) -> Vec<(u64, SqliteResult<Checkpoint>)> {
        let n = batch.len();
        let mut conn = lock(&self.conn);
        let mut tx = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
            Ok(tx) => tx,
            Err(e) => {
                return batch
                    .into_iter()
                    .map(|(id, _)| (id, Err(batch_failure("starting checkpoint append", &e))))
                    .collect();
            }
        };
        let mut outcomes = Vec::with_capacity(n);
        let mut broken = None;
        for (id, req) in batch {
            if let Some(e) = &broken {
                outcomes.push((id, Err(batch_failure("appending a checkpoint", e))));
                continue;
            }
            let outcome = if n == 1 {
                // Alone in its batch: a refusal drops the transaction below.
                apply(&tx, &req)
            } else {
                match tx.savepoint() {
                    Ok(mut sp) => {
                        let outcome = apply(&sp, &req);
                        let ended = if outcome.is_ok() {
                            sp.commit()
                        } else {
                            sp.rollback().and_then(|()| sp.commit())
                        };
                        if let Err(e) = ended {
                            broken = Some(e);
                        }
                        outcome
                    }
                    Err(e) => {
                        let outcome = Err(batch_failure("starting checkpoint append", &e));
                        broken = Some(e);
                        outcome
                    }
                }
            };
            outcomes.push((id, outcome));
        }
        if let Some(e) = broken {
            // The transaction is in an unknown state: keep nothing of it.
            drop(tx);
            return none_stored(outcomes, "appending a checkpoint", &e);
        }
        if n == 1 && outcomes[0].1.is_err() {
            return outcomes; // dropping `tx` rolls the refusal back
        }
        match tx.commit() {
            Ok(()) => outcomes,
            Err(e) => none_stored(outcomes, "committing a checkpoint", &e),
        }
    }

    /// The task's latest checkpoint (highest attempt, then highest
    /// sequence), if any.
    pub fn latest(&self, task_id: &str) -> SqliteResult<Option<Checkpoint>> {
        self.query_one(
            &format!(
                "SELECT {COLUMNS} FROM checkpoints c WHERE c.task_id = ?1
                  ORDER BY c.attempt DESC, c.sequence DESC LIMIT 1"
            ),
            params![task_id],
        )
    }

    /// The latest checkpoint of one attempt of the task, if any.
    pub fn latest_for_attempt(
        &self,
        task_id: &str,
        attempt: u32,
    ) -> SqliteResult<Option<Checkpoint>> {
        self.query_one(
            &format!(
                "SELECT {COLUMNS} FROM checkpoints c WHERE c.task_id = ?1 AND c.attempt = ?2
                  ORDER BY c.sequence DESC LIMIT 1"
            ),
            params![task_id, attempt],
        )
    }

    /// Every checkpoint of the task, oldest first.
    pub fn history(&self, task_id: &str) -> SqliteResult<Vec<Checkpoint>> {
        self.query_all(
            &format!(
                "SELECT {COLUMNS} FROM checkpoints c WHERE c.task_id = ?1
                  ORDER BY c.attempt, c.sequence"
            ),
            params![task_id],
        )
    }

    /// The latest checkpoint the caller's attempt may resume from.
    ///
    /// - nothing recorded: `None`;
    /// - the journal is at a later attempt than `binding`'s:
    ///   `CHECKPOINT_FUTURE_ATTEMPT` (the caller is stale);
    /// - the latest checkpoint ran another execution digest: `None` (the
    ///   plan changed; start afresh);
    /// - same digest, other coordinates: `CHECKPOINT_SCOPE_MISMATCH_DENY`;
    /// - otherwise that checkpoint, even from an earlier attempt, so a
    ///   later attempt of the identical binding can reuse it.
    pub fn verify_latest_binding(
        &self,
        binding: &CheckpointBinding,
    ) -> SqliteResult<Option<Checkpoint>> {
        let Some(latest) = self.latest(&binding.task_id)? else {
            return Ok(None);
        };
        if latest.attempt > binding.attempt {
            return Err(refused(
                Code::CHECKPOINT_FUTURE_ATTEMPT,
                format!(
                    "task {} has checkpoints of attempt {}, caller is at {}",
                    binding.task_id, latest.attempt, binding.attempt
                ),
            ));
        }
        if latest.binding.execution_digest != binding.execution_digest {
            return Ok(None);
        }
        if latest.binding.scope_sha256() != binding.scope_sha256() {
            return Err(refused(
                Code::CHECKPOINT_SCOPE_MISMATCH_DENY,
                format!(
                    "the latest checkpoint of task {} is bound to other coordinates",
                    binding.task_id
                ),
            ));
        }
        Ok(Some(latest))
    }

    /// The head of every task whose latest checkpoint is not
    /// `result_submitted`, ordered by task id: the work the worker must
    /// resume (or reconcile) when it starts.
    pub fn unfinished(&self) -> SqliteResult<Vec<Checkpoint>> {
        self.query_all(
            &format!(
                "SELECT {COLUMNS} FROM checkpoint_heads h
                   JOIN checkpoints c ON c.task_id = h.task_id AND c.attempt = h.attempt
                                     AND c.sequence = h.sequence
                  WHERE h.phase != ?1
                  ORDER BY h.task_id"
            ),
            params![Phase::ResultSubmitted.as_str()],
        )
    }

    /// `PRAGMA integrity_check`, then the journal's own invariants over
    /// every row: sequences contiguous from 1 in each attempt, one binding
    /// per attempt, no phase ranked below the one before it (bar
    /// `reconciliation_required`), the same rule `append` applies,
    /// phase ranks as [`Phase::order`] says, and one head per task equal to
    /// its latest checkpoint. Any failure is `STORE_CORRUPT`.
    pub fn integrity_check(&self) -> SqliteResult<()> {
        let conn = lock(&self.conn);
        db::integrity_check(&conn)?;
        let ranks = Phase::ALL
            .iter()
            .map(|p| format!("('{}', {})", p.as_str(), p.order()))
            .collect::<Vec<_>>()
            .join(", ");
        let checks: [(&str, String); 6] = [
            (
                "a phase is unknown or has the wrong rank",
                format!(
                    "WITH ranks(name, rank) AS (VALUES {ranks})
                     SELECT count(*) FROM checkpoints c LEFT JOIN ranks r ON r.name = c.phase
                      WHERE r.rank IS NULL OR r.rank != c.phase_order"
                ),
            ),
            (
                "sequences are not contiguous from 1 within an attempt",
                "SELECT count(*) FROM (
                   SELECT min(sequence) AS lo, max(sequence) AS hi, count(*) AS n
                     FROM checkpoints GROUP BY task_id, attempt)
                  WHERE lo != 1 OR hi != n"
                    .into(),
            ),
            (
                "an attempt holds more than one binding",
                "SELECT count(*) FROM (
                   SELECT 1 FROM checkpoints GROUP BY task_id, attempt
                   HAVING count(DISTINCT binding_sha256) > 1)"
                    .into(),
            ),
            (
                "a phase regresses within an attempt",
                "SELECT count(*) FROM (
                   SELECT phase, phase_order,
                          lag(phase_order) OVER (PARTITION BY task_id, attempt
                                                 ORDER BY sequence) AS prev
                     FROM checkpoints)
                  WHERE phase != 'reconciliation_required' AND phase_order < prev"
                    .into(),
            ),
            (
                "a task has no head",
                "SELECT count(DISTINCT task_id) FROM checkpoints
                  WHERE task_id NOT IN (SELECT task_id FROM checkpoint_heads)"
                    .into(),
            ),
            (
                "a head is not its task's latest checkpoint",
                "SELECT count(*) FROM checkpoint_heads h
                  WHERE NOT EXISTS (
                          SELECT 1 FROM checkpoints c
                           WHERE c.task_id = h.task_id AND c.attempt = h.attempt
                             AND c.sequence = h.sequence AND c.phase = h.phase
                             AND c.phase_order = h.phase_order
                             AND c.execution_digest = h.execution_digest
                             AND c.binding_sha256 = h.binding_sha256
                             AND c.payload_sha256 = h.payload_sha256)
                     OR EXISTS (
                          SELECT 1 FROM checkpoints c
                           WHERE c.task_id = h.task_id
                             AND (c.attempt > h.attempt
                                  OR (c.attempt = h.attempt AND c.sequence > h.sequence)))"
                    .into(),
            ),
        ];
        let mut problems = Vec::new();
        for (what, sql) in &checks {
            let bad: i64 = conn
                .query_row(sql, [], |r| r.get(0))
                .map_err(|e| SqliteError::sqlite("checking journal invariants", e))?;
            if bad != 0 {
                problems.push(format!("{what} ({bad})"));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(refused(Code::STORE_CORRUPT, problems.join("; ")))
        }
    }

    fn query_one(
        &self,
        sql: &str,
        params: impl rusqlite::Params,
    ) -> SqliteResult<Option<Checkpoint>> {
        let raw = lock(&self.conn)
            .prepare_cached(sql)
            .and_then(|mut s| s.query_row(params, RawRow::read).optional())
            .map_err(|e| SqliteError::sqlite("reading checkpoints", e))?;
        raw.map(RawRow::verify).transpose()
    }

    fn query_all(&self, sql: &str, params: impl rusqlite::Params) -> SqliteResult<Vec<Checkpoint>> {
        let raws = lock(&self.conn)
            .prepare_cached(sql)
            .and_then(|mut s| {
                s.query_map(params, RawRow::read)?
                    .collect::<rusqlite::Result<Vec<_>>>()
            })
            .map_err(|e| SqliteError::sqlite("reading checkpoints", e))?;
        raws.into_iter().map(RawRow::verify).collect()
    }
}

/// One append inside the batch's transaction (or its savepoint): the
/// rules of the [module docs](self), then the row and the head.
fn apply(conn: &Connection, req: &Prepared) -> SqliteResult<Checkpoint> {
    let binding = &req.binding;
    let phase = req.phase;
    let payload_json = &req.payload_json;
    let payload_sha256 = &req.payload_sha256;
    let binding_sha256 = &req.binding_sha256;

    // 1. Exact replay: the row is already there; add nothing.
    let replay = conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM checkpoints c
              WHERE c.task_id = ?1 AND c.attempt = ?2 AND c.phase = ?3
                AND c.payload_sha256 = ?4"
        ))
        .and_then(|mut s| {
            s.query_row(
                params![
                    binding.task_id,
                    binding.attempt,
                    phase.as_str(),
                    payload_sha256
                ],
                RawRow::read,
            )
            .optional()
        })
        .map_err(|e| SqliteError::sqlite("looking up a checkpoint replay", e))?;
    if let Some(raw) = replay {
        let existing = raw.verify()?;
        if existing.binding_sha256 != *binding_sha256 {
            // Same task, attempt, phase and payload under other
            // coordinates: not a replay, and never a silent success.
            return Err(binding_differs(&existing.binding, binding));
        }
        return Ok(existing);
    }

    // 2.–4. Judge against the head.
    let head = conn
        .prepare_cached(
            "SELECT attempt, sequence, phase_order, execution_digest, binding_sha256
               FROM checkpoint_heads WHERE task_id = ?1",
        )
        .and_then(|mut s| {
            s.query_row([&binding.task_id], |r| {
                Ok(airlock_sqlite::columns!(Head {
                    attempt, sequence, phase_order, execution_digest, binding_sha256
                } from r.get))
            })
            .optional()
        })
        .map_err(|e| SqliteError::sqlite("reading the checkpoint head", e))?;
    let sequence = match head {
        None => 1,
        Some(h) if binding.attempt < h.attempt => {
            return Err(refused(
                Code::CHECKPOINT_ATTEMPT_REGRESSION,
                format!(
                    "task {} is at attempt {}, not {}",
                    binding.task_id, h.attempt, binding.attempt
                ),
            ));
        }
        Some(h) if binding.attempt == h.attempt => {
            if h.execution_digest != binding.execution_digest {
                return Err(refused(
                    Code::CHECKPOINT_EXECUTION_DIGEST_CONFLICT,
                    format!(
                        "attempt {} of task {} runs execution {}",
                        h.attempt, binding.task_id, h.execution_digest
                    ),
                ));
            }
            if h.binding_sha256 != *binding_sha256 {
                return Err(refused(
                    Code::CHECKPOINT_SCOPE_MISMATCH_DENY,
                    format!(
                        "attempt {} of task {} is bound to other coordinates",
                        h.attempt, binding.task_id
                    ),
                ));
            }
            if phase != Phase::ReconciliationRequired && phase.order() < h.phase_order {
                return Err(refused(
                    Code::CHECKPOINT_PHASE_REGRESSION,
                    format!(
                        "{} (rank {}) after rank {} in attempt {} of task {}",
                        phase.as_str(),
                        phase.order(),
                        h.phase_order,
                        h.attempt,
                        binding.task_id
                    ),
                ));
            }
            h.sequence + 1
        }
        Some(_) => 1,
    };

    let created_at_ms = SystemClock.now_ms();
    // The columns both tables start with, in their order.
    let (phase_name, phase_order) = (phase.as_str(), phase.order());
    let head: [&dyn ToSql; 6] = [
        &binding.task_id,
        &binding.attempt,
        &sequence,
        &phase_name,
        &phase_order,
        &binding.execution_digest,
    ];
    conn.prepare_cached(
        "INSERT INTO checkpoints(
           task_id, attempt, sequence, phase, phase_order, execution_digest, job_id,
           repository, base_oid, expected_branch_oid, target_branch, generation,
           binding_sha256, payload_json, payload_sha256, created_at_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
    )
    .and_then(|mut s| {
        let rest: [&dyn ToSql; 10] = [
            &binding.job_id,
            &binding.repository,
            &binding.base_oid,
            &binding.expected_branch_oid,
            &binding.target_branch,
            &binding.generation,
            &binding_sha256,
            &payload_json,
            &payload_sha256,
            &created_at_ms,
        ];
        s.execute(params_from_iter(head.into_iter().chain(rest)))
    })
    .map_err(|e| SqliteError::sqlite("appending a checkpoint", e))?;
    conn.prepare_cached(
        "INSERT INTO checkpoint_heads(
           task_id, attempt, sequence, phase, phase_order, execution_digest,
           binding_sha256, payload_sha256, updated_at_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
         ON CONFLICT(task_id) DO UPDATE SET
           attempt = excluded.attempt,
           sequence = excluded.sequence,
           phase = excluded.phase,
           phase_order = excluded.phase_order,
           execution_digest = excluded.execution_digest,
           binding_sha256 = excluded.binding_sha256,
           payload_sha256 = excluded.payload_sha256,
           updated_at_ms = excluded.updated_at_ms",
    )
    .and_then(|mut s| {
        let rest: [&dyn ToSql; 3] = [&binding_sha256, &payload_sha256, &created_at_ms];
        s.execute(params_from_iter(head.into_iter().chain(rest)))
    })
    .map_err(|e| SqliteError::sqlite("moving the checkpoint head", e))?;

    Ok(Checkpoint {
        task_id: binding.task_id.clone(),
        attempt: binding.attempt,
        sequence,
        phase,
        binding: binding.clone(),
        binding_sha256: req.binding_sha256.clone(),
        payload: req.payload.clone(),
        payload_sha256: req.payload_sha256.clone(),
        created_at_ms,
    })
}

/// Hands out the batch's failure when the committing append unwinds
/// (a panic inside SQLite or the rules), so that no append waits forever.
struct Leader<'a> {
    journal: &'a CheckpointJournal,
    /// The batch's appends, until their outcomes are published.
    ids: Vec<u64>,
}

impl Drop for Leader<'_> {
    fn drop(&mut self) {
        if self.ids.is_empty() {
            return;
        }
        let mut q = lock(&self.journal.queue);
        q.committing = false;
        for id in self.ids.drain(..) {
            q.results.insert(
                id,
                Err(refused(
                    Code::INTERNAL,
                    "the append running this batch panicked",
                )),
            );
        }
        self.journal.batch_done.notify_all();
    }
}

/// Locks `m`; a panic elsewhere leaves the queue and the connection
/// consistent (every change to them is complete before it unlocks), so a
/// poisoned lock is used as it is.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The error of a failed batch, once for each append it fails.
/// A batch's outcomes when its transaction is lost (`context` failed with
/// `e`): each append that would have been stored is that failure; a
/// refusal stays the refusal.
fn none_stored(
    outcomes: Vec<(u64, SqliteResult<Checkpoint>)>,
    context: &str,
    e: &rusqlite::Error,
) -> Vec<(u64, SqliteResult<Checkpoint>)> {
    outcomes
        .into_iter()
        .map(|(id, o)| (id, o.and_then(|_| Err(batch_failure(context, e)))))
        .collect()
}

fn batch_failure(context: &str, e: &rusqlite::Error) -> SqliteError {
    let source = match e {
        rusqlite::Error::SqliteFailure(code, message) => {
            rusqlite::Error::SqliteFailure(*code, message.clone())
        }
        other => rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR),
            Some(other.to_string()),
        ),
    };
    SqliteError::sqlite(context, source)
}

/// The head of a task as `append` needs it.
struct Head {
    attempt: u32,
    sequence: u64,
    phase_order: u32,
    execution_digest: String,
    binding_sha256: String,
}

/// A checkpoint row as stored, not yet verified.
struct RawRow {
    binding: CheckpointBinding,
    sequence: u64,
    phase: String,
    phase_order: i64,
    binding_sha256: String,
    payload_json: String,
    payload_sha256: String,
    created_at_ms: i64,
}

impl RawRow {
    /// Reads the columns listed in [`COLUMNS`].
    fn read(r: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(RawRow {
            binding: CheckpointBinding {
                task_id: r.get(0)?,
                attempt: r.get(1)?,
                execution_digest: r.get(5)?,
                job_id: r.get(6)?,
                repository: r.get(7)?,
                base_oid: r.get(8)?,
                expected_branch_oid: r.get(9)?,
                target_branch: r.get(10)?,
                generation: r.get(11)?,
            },
            sequence: r.get(2)?,
            phase: r.get(3)?,
            phase_order: r.get(4)?,
            binding_sha256: r.get(12)?,
            payload_json: r.get(13)?,
            payload_sha256: r.get(14)?,
            created_at_ms: r.get(15)?,
        })
    }

    /// Recomputes what the row claims: its phase and rank, its binding
    /// digest and its payload digest. A mismatch is `STORE_CORRUPT`.
    fn verify(self) -> SqliteResult<Checkpoint> {
        let at = || {
            format!(
                "checkpoint {}/{}/{}",
                self.binding.task_id, self.binding.attempt, self.sequence
            )
        };
        let phase = Phase::parse(&self.phase)
            .map_err(|_| refused(Code::STORE_CORRUPT, format!("{}: unknown phase", at())))?;
        if i64::from(phase.order()) != self.phase_order {
            return Err(refused(
                Code::STORE_CORRUPT,
                format!("{}: wrong phase rank", at()),
            ));
        }
        if self.binding.binding_sha256() != self.binding_sha256 {
            return Err(refused(
                Code::STORE_CORRUPT,
                format!("{}: binding digest mismatch", at()),
            ));
        }
        if sha256_hex(self.payload_json.as_bytes()) != self.payload_sha256 {
            return Err(refused(
                Code::STORE_CORRUPT,
                format!("{}: payload digest mismatch", at()),
            ));
        }
        let payload = serde_json::from_str(&self.payload_json)
            .map_err(|e| refused(Code::STORE_CORRUPT, format!("{}: payload: {e}", at())))?;
        Ok(Checkpoint {
            task_id: self.binding.task_id.clone(),
            attempt: self.binding.attempt,
            sequence: self.sequence,
            phase,
            binding: self.binding,
            binding_sha256: self.binding_sha256,
            payload,
            payload_sha256: self.payload_sha256,
            created_at_ms: self.created_at_ms,
        })
    }
}

/// The payload's canonical JSON, refused if it is not an object, not
/// canonicalisable, or larger than [`MAX_PAYLOAD_BYTES`].
fn canonical_payload(payload: &Value) -> SqliteResult<String> {
    if !payload.is_object() {
        return Err(refused(
            Code::MESSAGE_INVALID,
            "a checkpoint payload is a JSON object",
        ));
    }
    let text = to_canonical_string(payload)?;
    if text.len() > MAX_PAYLOAD_BYTES {
        return Err(refused(
            Code::FIELD_BOUNDS_EXCEEDED,
            format!(
                "checkpoint payload is {} bytes, limit {MAX_PAYLOAD_BYTES}",
                text.len()
            ),
        ));
    }
    Ok(text)
}

/// The refusal for a replay whose binding differs from the stored row's.
fn binding_differs(stored: &CheckpointBinding, asked: &CheckpointBinding) -> SqliteError {
    if stored.execution_digest != asked.execution_digest {
        refused(
            Code::CHECKPOINT_EXECUTION_DIGEST_CONFLICT,
            format!(
                "attempt {} of task {} runs execution {}",
                stored.attempt, stored.task_id, stored.execution_digest
            ),
        )
    } else {
        refused(
            Code::CHECKPOINT_SCOPE_MISMATCH_DENY,
            format!(
                "attempt {} of task {} is bound to other coordinates",
                stored.attempt, stored.task_id
            ),
        )
    }
}

fn refused(code: Code, detail: impl Into<String>) -> SqliteError {
    SqliteError::Refused(Error::with(code, detail))
}

//! The checkpoint journal's contracts, named after the seed's durable
//! execution gates (CHECKPOINT_DURABLE_WRITE, CHECKPOINT_SCOPE_ISOLATION,
//! RESUME_FROM_CHECKPOINT) and the refusal codes they pin.

use airlock_journal::SqliteError;
use airlock_journal::checkpoint::{CheckpointJournal, MAX_PAYLOAD_BYTES};
use airlock_proto::Code;
use airlock_proto::checkpoint::{CheckpointBinding, Phase};
use rusqlite::Connection;
use serde_json::json;
use std::path::{Path, PathBuf};

const TASK: &str = "task-p1-a";

fn binding(attempt: u32) -> CheckpointBinding {
    CheckpointBinding {
        task_id: TASK.into(),
        attempt,
        execution_digest: "d".repeat(64),
        job_id: "job-p1-a".into(),
        repository: "demo".into(),
        base_oid: "a".repeat(40),
        expected_branch_oid: "b".repeat(40),
        target_branch: format!("agent/{TASK}"),
        generation: 1,
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    path: PathBuf,
    journal: CheckpointJournal,
}

fn journal() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoints.sqlite3");
    let journal = CheckpointJournal::open(&path).unwrap();
    Fixture {
        _dir: dir,
        path,
        journal,
    }
}

fn rows(path: &Path) -> i64 {
    Connection::open(path)
        .unwrap()
        .query_row("SELECT count(*) FROM checkpoints", [], |r| r.get(0))
        .unwrap()
}

fn code(r: Result<impl std::fmt::Debug, SqliteError>) -> Code {
    r.unwrap_err().code()
}

#[test]
#[allow(non_snake_case)]
fn CHECKPOINT_DURABLE_WRITE_survives_reopen_in_a_new_connection() {
    let Fixture {
        _dir,
        path,
        journal,
    } = journal();
    let first = journal
        .append_value(
            &binding(1),
            Phase::Claimed,
            &json!({"phase": "claimed", "attempt": 1}),
        )
        .unwrap();
    let second = journal
        .append_value(
            &binding(1),
            Phase::WorkspacePrepared,
            &json!({"phase": "workspace_prepared", "attempt": 1}),
        )
        .unwrap();
    assert_eq!((first.sequence, second.sequence), (1, 2));
    drop(journal);

    // A plain SQLite connection sees both rows, and the heads table agrees.
    let raw = Connection::open(&path).unwrap();
    let phases: Vec<String> = raw
        .prepare("SELECT phase FROM checkpoints ORDER BY attempt, sequence")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(phases, ["claimed", "workspace_prepared"]);
    let mode: String = raw
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    drop(raw);

    let journal = CheckpointJournal::open(&path).unwrap();
    let latest = journal.latest(TASK).unwrap().unwrap();
    assert_eq!(latest.phase, Phase::WorkspacePrepared);
    assert_eq!(latest.sequence, 2);
    assert_eq!(latest.payload["attempt"], 1);
    assert_eq!(latest, second);
    assert_eq!(journal.history(TASK).unwrap(), [first, second]);
    journal.integrity_check().unwrap();
}

#[test]
#[allow(non_snake_case)]
fn CHECKPOINT_SCOPE_ISOLATION_each_coordinate() {
    type Change = fn(&mut CheckpointBinding);
    let changes: [(&str, Change); 6] = [
        ("repository", |b| b.repository = "other".into()),
        ("target_branch", |b| b.target_branch = "agent/other".into()),
        ("generation", |b| b.generation = 2),
        ("base_oid", |b| b.base_oid = "c".repeat(40)),
        ("expected_branch_oid", |b| {
            b.expected_branch_oid = "e".repeat(40)
        }),
        ("job_id", |b| b.job_id = "job-other".into()),
    ];
    for (what, change) in changes {
        let Fixture {
            _dir,
            path,
            journal,
        } = journal();
        journal
            .append_value(&binding(1), Phase::Claimed, &json!({"phase": "claimed"}))
            .unwrap();

        // Same attempt, one coordinate changed: refused, nothing written.
        let mut changed = binding(1);
        change(&mut changed);
        assert_eq!(
            code(journal.append_value(
                &changed,
                Phase::WorkspacePrepared,
                &json!({"phase": "workspace_prepared"})
            )),
            Code::CHECKPOINT_SCOPE_MISMATCH_DENY,
            "{what}"
        );
        // Even an exact replay of the stored row under other coordinates.
        assert_eq!(
            code(journal.append_value(&changed, Phase::Claimed, &json!({"phase": "claimed"}))),
            Code::CHECKPOINT_SCOPE_MISMATCH_DENY,
            "{what} (replay)"
        );
        assert_eq!(rows(&path), 1, "{what}");

        // A later attempt under other coordinates never reuses the checkpoint.
        let mut later = binding(2);
        change(&mut later);
        assert_eq!(
            code(journal.verify_latest_binding(&later)),
            Code::CHECKPOINT_SCOPE_MISMATCH_DENY,
            "{what} (resume)"
        );
        assert!(
            journal
                .verify_latest_binding(&binding(2))
                .unwrap()
                .is_some()
        );
    }
}

#[test]
#[allow(non_snake_case)]
fn RESUME_FROM_CHECKPOINT_across_attempts_with_the_same_binding() {
    let Fixture { journal, .. } = journal();
    journal
        .append_value(
            &binding(1),
            Phase::SourceCaptureDone,
            &json!({
                "phase": "source_capture_done",
                "attempt": 1,
                "result": {"status": "SUCCEEDED", "classification": "NEEDS_REWORK_SOURCE_CAPTURE"},
            }),
        )
        .unwrap();
    let resumed = journal.verify_latest_binding(&binding(2)).unwrap().unwrap();
    assert_eq!(resumed.attempt, 1);
    assert_eq!(resumed.phase, Phase::SourceCaptureDone);
    assert_eq!(resumed.payload["result"]["status"], "SUCCEEDED");
    // The caller's own attempt resumes from it too.
    assert_eq!(
        journal.verify_latest_binding(&binding(1)).unwrap(),
        Some(resumed)
    );
}

#[test]
fn verify_latest_binding_is_none_for_an_empty_journal_or_another_digest() {
    let Fixture { journal, .. } = journal();
    assert_eq!(journal.verify_latest_binding(&binding(1)).unwrap(), None);
    journal
        .append_value(
            &binding(1),
            Phase::CommitDone,
            &json!({"oid": "f".repeat(40)}),
        )
        .unwrap();
    let mut replanned = binding(2);
    replanned.execution_digest = "e".repeat(64);
    // Even with other coordinates: a different plan simply starts afresh.
    replanned.repository = "other".into();
    assert_eq!(journal.verify_latest_binding(&replanned).unwrap(), None);
}

#[test]
#[allow(non_snake_case)]
fn CHECKPOINT_FUTURE_ATTEMPT_when_the_journal_is_ahead_of_the_caller() {
    let Fixture { journal, .. } = journal();
    journal
        .append_value(&binding(3), Phase::Claimed, &json!({}))
        .unwrap();
    assert_eq!(
        code(journal.verify_latest_binding(&binding(2))),
        Code::CHECKPOINT_FUTURE_ATTEMPT
    );
    assert!(
        journal
            .verify_latest_binding(&binding(3))
            .unwrap()
            .is_some()
    );
}

#[test]
fn new_attempt_restarts_at_sequence_1() {
    let Fixture { journal, .. } = journal();
    for (i, phase) in [
        Phase::Claimed,
        Phase::WorkspacePrepared,
        Phase::ResultSubmitted,
    ]
    .into_iter()
    .enumerate()
    {
        let cp = journal
            .append_value(&binding(1), phase, &json!({"phase": phase.as_str()}))
            .unwrap();
        assert_eq!(cp.sequence, i as u64 + 1);
    }
    let cp = journal
        .append_value(&binding(2), Phase::Claimed, &json!({"phase": "claimed"}))
        .unwrap();
    assert_eq!((cp.attempt, cp.sequence), (2, 1));
    // A new attempt may also carry a new plan (digest) and new coordinates.
    let mut third = binding(4);
    third.execution_digest = "e".repeat(64);
    third.expected_branch_oid = "f".repeat(40);
    let cp = journal
        .append_value(&third, Phase::Claimed, &json!({}))
        .unwrap();
    assert_eq!((cp.attempt, cp.sequence), (4, 1));
    assert_eq!(
        journal
            .latest_for_attempt(TASK, 1)
            .unwrap()
            .unwrap()
            .sequence,
        3
    );
    assert_eq!(
        journal
            .latest_for_attempt(TASK, 2)
            .unwrap()
            .unwrap()
            .sequence,
        1
    );
    assert_eq!(journal.latest_for_attempt(TASK, 3).unwrap(), None);
    assert_eq!(journal.latest(TASK).unwrap().unwrap().attempt, 4);
    journal.integrity_check().unwrap();
}

#[test]
#[allow(non_snake_case)]
fn CHECKPOINT_PHASE_REGRESSION_within_an_attempt() {
    let Fixture {
        _dir,
        path,
        journal,
    } = journal();
    let b = binding(1);
    journal
        .append_value(&b, Phase::Claimed, &json!({}))
        .unwrap();
    journal
        .append_value(&b, Phase::WorkspacePrepared, &json!({}))
        .unwrap();
    journal
        .append_value(&b, Phase::CommitDone, &json!({"oid": "1"}))
        .unwrap();
    for back in [
        Phase::Claimed,
        Phase::WorkspacePrepared,
        Phase::VerificationPassed,
    ] {
        assert_eq!(
            code(journal.append_value(&b, back, &json!({"again": true}))),
            Code::CHECKPOINT_PHASE_REGRESSION,
            "{back:?}"
        );
    }
    // The same rank with a new payload is not a regression (seed rule).
    let cp = journal
        .append_value(&b, Phase::CommitDone, &json!({"oid": "2"}))
        .unwrap();
    assert_eq!(cp.sequence, 4);
    assert_eq!(rows(&path), 4);
}

#[test]
#[allow(non_snake_case)]
fn CHECKPOINT_ATTEMPT_REGRESSION_for_an_older_attempt() {
    let Fixture {
        _dir,
        path,
        journal,
    } = journal();
    journal
        .append_value(&binding(2), Phase::Claimed, &json!({}))
        .unwrap();
    assert_eq!(
        code(journal.append_value(&binding(1), Phase::ResultPending, &json!({}))),
        Code::CHECKPOINT_ATTEMPT_REGRESSION
    );
    assert_eq!(rows(&path), 1);
}

#[test]
#[allow(non_snake_case)]
fn CHECKPOINT_EXECUTION_DIGEST_CONFLICT_within_an_attempt() {
    let Fixture {
        _dir,
        path,
        journal,
    } = journal();
    journal
        .append_value(&binding(1), Phase::Claimed, &json!({}))
        .unwrap();
    let mut other = binding(1);
    other.execution_digest = "e".repeat(64);
    assert_eq!(
        code(journal.append_value(&other, Phase::WorkspacePrepared, &json!({}))),
        Code::CHECKPOINT_EXECUTION_DIGEST_CONFLICT
    );
    // Replaying the stored row under another digest is the same conflict.
    assert_eq!(
        code(journal.append_value(&other, Phase::Claimed, &json!({}))),
        Code::CHECKPOINT_EXECUTION_DIGEST_CONFLICT
    );
    assert_eq!(rows(&path), 1);
}

#[test]
fn exact_replay_returns_the_same_row_and_adds_none() {
    let Fixture {
        _dir,
        path,
        journal,
    } = journal();
    let b = binding(1);
    let first = journal
        .append_value(
            &b,
            Phase::ResultPending,
            &json!({"b": 2, "a": {"key": "k", "sha": "s"}}),
        )
        .unwrap();
    // Key order does not matter: the payload is canonical JSON.
    let again = journal
        .append_value(
            &b,
            Phase::ResultPending,
            &json!({"a": {"sha": "s", "key": "k"}, "b": 2}),
        )
        .unwrap();
    assert_eq!(again, first);
    assert_eq!(rows(&path), 1);

    // A replay is answered even once the attempt (or the task) moved on.
    journal
        .append_value(&b, Phase::ResultSubmitted, &json!({}))
        .unwrap();
    journal
        .append_value(&binding(2), Phase::Claimed, &json!({}))
        .unwrap();
    let late = journal
        .append_value(
            &b,
            Phase::ResultPending,
            &json!({"b": 2, "a": {"key": "k", "sha": "s"}}),
        )
        .unwrap();
    assert_eq!(late, first);
    assert_eq!(rows(&path), 3);
    // But a new payload for the old attempt is an attempt regression.
    assert_eq!(
        code(journal.append_value(&b, Phase::ResultPending, &json!({"b": 3}))),
        Code::CHECKPOINT_ATTEMPT_REGRESSION
    );
}

#[test]
fn reconciliation_required_is_allowed_after_a_later_phase() {
    let Fixture { journal, .. } = journal();
    let b = binding(1);
    journal
        .append_value(&b, Phase::CommitDone, &json!({}))
        .unwrap();
    journal
        .append_value(&b, Phase::ResultPending, &json!({}))
        .unwrap();
    let rec = journal
        .append_value(
            &b,
            Phase::ReconciliationRequired,
            &json!({"why": "ref not visible"}),
        )
        .unwrap();
    assert_eq!(rec.sequence, 3);
    // Twice, with new evidence.
    journal
        .append_value(
            &b,
            Phase::ReconciliationRequired,
            &json!({"why": "still not visible"}),
        )
        .unwrap();
    // After it, nothing ranked below it; the result phases still are.
    assert_eq!(
        code(journal.append_value(&b, Phase::CommitDone, &json!({"redo": true}))),
        Code::CHECKPOINT_PHASE_REGRESSION
    );
    journal
        .append_value(&b, Phase::ResultPending, &json!({"retry": 1}))
        .unwrap();
    journal
        .append_value(&b, Phase::ResultSubmitted, &json!({}))
        .unwrap();
    journal
        .append_value(
            &b,
            Phase::ReconciliationRequired,
            &json!({"why": "late conflict"}),
        )
        .unwrap();
    journal.integrity_check().unwrap();
}

#[test]
fn unknown_phase_names_are_checkpoint_phase_invalid() {
    for name in ["done", "", "CLAIMED", "commit-done", "claimed "] {
        assert_eq!(
            Phase::parse(name).unwrap_err().code,
            Code::CHECKPOINT_PHASE_INVALID,
            "{name:?}"
        );
    }
}

#[test]
fn unfinished_lists_every_head_short_of_result_submitted() {
    let Fixture { journal, .. } = journal();
    let task = |id: &str, attempt: u32| CheckpointBinding {
        task_id: id.into(),
        target_branch: format!("agent/{id}"),
        ..binding(attempt)
    };
    assert!(journal.unfinished().unwrap().is_empty());
    journal
        .append_value(&task("t-done", 1), Phase::ResultSubmitted, &json!({}))
        .unwrap();
    journal
        .append_value(&task("t-commit", 1), Phase::Claimed, &json!({}))
        .unwrap();
    journal
        .append_value(&task("t-commit", 1), Phase::CommitDone, &json!({}))
        .unwrap();
    journal
        .append_value(&task("t-retry", 1), Phase::ResultSubmitted, &json!({}))
        .unwrap();
    journal
        .append_value(&task("t-retry", 2), Phase::Claimed, &json!({}))
        .unwrap();
    journal
        .append_value(
            &task("t-recon", 1),
            Phase::ReconciliationRequired,
            &json!({}),
        )
        .unwrap();
    let open: Vec<(String, u32, Phase)> = journal
        .unfinished()
        .unwrap()
        .into_iter()
        .map(|c| (c.task_id, c.attempt, c.phase))
        .collect();
    assert_eq!(
        open,
        [
            ("t-commit".into(), 1, Phase::CommitDone),
            ("t-recon".into(), 1, Phase::ReconciliationRequired),
            ("t-retry".into(), 2, Phase::Claimed),
        ]
    );
}

#[test]
fn payloads_are_bounded_objects_and_refusals_write_nothing() {
    let Fixture {
        _dir,
        path,
        journal,
    } = journal();
    let b = binding(1);
    let big = json!({"blob": "x".repeat(MAX_PAYLOAD_BYTES)});
    assert_eq!(
        code(journal.append_value(&b, Phase::Claimed, &big)),
        Code::FIELD_BOUNDS_EXCEEDED
    );
    let fits = json!({"blob": "x".repeat(MAX_PAYLOAD_BYTES - r#"{"blob":""}"#.len())});
    assert_eq!(
        code(journal.append_value(&b, Phase::Claimed, &json!([1]))),
        Code::MESSAGE_INVALID
    );
    assert_eq!(
        code(journal.append_value(&b, Phase::Claimed, &json!({"x": 0.5}))),
        Code::CANONICAL_JSON_UNSUPPORTED
    );
    assert_eq!(
        code(journal.append_value(&binding(0), Phase::Claimed, &json!({}))),
        Code::FIELD_BOUNDS_EXCEEDED
    );
    assert_eq!(rows(&path), 0);
    journal.append_value(&b, Phase::Claimed, &fits).unwrap();
    assert_eq!(journal.latest(TASK).unwrap().unwrap().payload, fits);
}

#[test]
fn the_journal_is_append_only_at_the_sql_level() {
    let Fixture {
        _dir,
        path,
        journal,
    } = journal();
    let b = binding(1);
    journal
        .append_value(&b, Phase::Claimed, &json!({}))
        .unwrap();
    let second = journal
        .append_value(&b, Phase::CommitDone, &json!({"oid": "1"}))
        .unwrap();

    let raw = Connection::open(&path).unwrap();
    raw.execute_batch("PRAGMA foreign_keys=ON").unwrap();
    let refused = |sql: &str, why: &str| {
        let err = raw.execute_batch(sql).unwrap_err().to_string();
        assert!(err.contains(why), "{sql}: {err}");
    };
    refused("UPDATE checkpoints SET phase = 'claimed'", "append-only");
    refused(
        "UPDATE checkpoints SET payload_json = '{}' WHERE sequence = 2",
        "append-only",
    );
    refused("DELETE FROM checkpoints", "append-only");
    // REPLACE deletes implicitly (no delete trigger fires); the insert rules catch it.
    refused(
        "INSERT OR REPLACE INTO checkpoints
           SELECT task_id, attempt, sequence, 'result_submitted', 60, execution_digest, job_id,
                  repository, base_oid, expected_branch_oid, target_branch, generation,
                  binding_sha256, payload_json, payload_sha256, created_at_ms
             FROM checkpoints WHERE sequence = 2",
        "already recorded",
    );
    let copy = |seq: &str, phase: &str, order: i64, attempt: &str| {
        format!(
            "INSERT INTO checkpoints
               SELECT task_id, {attempt}, {seq}, '{phase}', {order}, execution_digest, job_id,
                      repository, base_oid, expected_branch_oid, target_branch, generation,
                      binding_sha256, payload_json, 'x' || payload_sha256, created_at_ms
                 FROM checkpoints WHERE sequence = 2"
        )
    };
    refused(
        &copy("5", "result_submitted", 60, "attempt"),
        "not contiguous",
    );
    refused(&copy("3", "claimed", 10, "attempt"), "phase regresses");
    refused(
        "INSERT INTO checkpoints
           SELECT task_id, attempt, 3, phase, phase_order, execution_digest, 'job-x',
                  repository, base_oid, expected_branch_oid, target_branch, generation,
                  'other', payload_json, 'y' || payload_sha256, created_at_ms
             FROM checkpoints WHERE sequence = 2",
        "binding differs",
    );
    refused("DELETE FROM checkpoint_heads", "never removed");
    refused(
        "UPDATE checkpoint_heads SET sequence = 1",
        "only move forward",
    );
    refused(
        "UPDATE checkpoint_heads SET attempt = 0",
        "only move forward",
    );
    // A head that points at no checkpoint breaks the foreign key.
    let err = raw
        .execute_batch("UPDATE checkpoint_heads SET attempt = 9")
        .unwrap_err()
        .to_string();
    assert!(err.contains("FOREIGN KEY"), "{err}");
    drop(raw);

    assert_eq!(rows(&path), 2);
    assert_eq!(journal.latest(TASK).unwrap().unwrap(), second);
    journal.integrity_check().unwrap();
}

#[test]
fn rows_edited_behind_the_journals_back_are_store_corrupt() {
    let Fixture {
        _dir,
        path,
        journal,
    } = journal();
    journal
        .append_value(&binding(1), Phase::Claimed, &json!({"n": 1}))
        .unwrap();
    let raw = Connection::open(&path).unwrap();
    raw.execute_batch(
        "DROP TRIGGER checkpoints_no_update;
         UPDATE checkpoints SET payload_json = '{\"n\":2}';",
    )
    .unwrap();
    assert_eq!(code(journal.latest(TASK)), Code::STORE_CORRUPT);
    raw.execute_batch("UPDATE checkpoints SET payload_json = '{\"n\":1}', repository = 'other';")
        .unwrap();
    assert_eq!(code(journal.latest(TASK)), Code::STORE_CORRUPT);
    raw.execute_batch("UPDATE checkpoints SET repository = 'demo', phase = 'done';")
        .unwrap();
    assert_eq!(code(journal.unfinished()), Code::STORE_CORRUPT);
    assert_eq!(code(journal.integrity_check()), Code::STORE_CORRUPT);
}

#[test]
fn integrity_check_reports_a_broken_sequence() {
    let Fixture {
        _dir,
        path,
        journal,
    } = journal();
    let b = binding(1);
    journal
        .append_value(&b, Phase::Claimed, &json!({}))
        .unwrap();
    journal
        .append_value(&b, Phase::WorkspacePrepared, &json!({}))
        .unwrap();
    journal.integrity_check().unwrap();
    let raw = Connection::open(&path).unwrap();
    raw.execute_batch(
        "DROP TRIGGER checkpoints_no_update;
         UPDATE checkpoints SET sequence = 7 WHERE sequence = 1;",
    )
    .unwrap();
    let err = journal.integrity_check().unwrap_err();
    assert_eq!(err.code(), Code::STORE_CORRUPT);
    assert!(err.to_string().contains("contiguous"), "{err}");
}

#[test]
fn concurrent_writers_on_one_file_keep_sequences_contiguous() {
    let Fixture { _dir, path, .. } = journal();
    let per_thread = 40;
    let threads: Vec<_> = (0..2)
        .map(|t| {
            let path = path.clone();
            std::thread::spawn(move || {
                let j = CheckpointJournal::open(&path).unwrap();
                for n in 0..per_thread {
                    // reconciliation_required is always allowed, so both
                    // writers race on one attempt without refusals.
                    j.append_value(
                        &binding(1),
                        Phase::ReconciliationRequired,
                        &json!({"writer": t, "n": n}),
                    )
                    .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let j = CheckpointJournal::open(&path).unwrap();
    let seqs: Vec<u64> = j
        .history(TASK)
        .unwrap()
        .iter()
        .map(|c| c.sequence)
        .collect();
    assert_eq!(seqs, (1..=2 * per_thread).collect::<Vec<u64>>());
    j.integrity_check().unwrap();
}

#[test]
fn a_task_store_file_is_not_opened_as_a_journal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tasks.sqlite3");
    drop(
        airlock_sqlite::db::open(
            &path,
            airlock_sqlite::db::Kind::Tasks,
            &[airlock_sqlite::db::Migration {
                version: 1,
                sql: "CREATE TABLE t(x);",
            }],
        )
        .unwrap(),
    );
    assert_eq!(
        code(CheckpointJournal::open(&path)),
        Code::STORE_UNAVAILABLE
    );
}

#[test]
fn typed_payloads_round_trip_and_one_that_does_not_decode_is_store_corrupt() {
    use airlock_proto::checkpoint::{ClaimedPayload, Payload, WorkspacePreparedPayload};
    let Fixture { _dir, journal, .. } = journal();
    let claimed = Payload::Claimed(ClaimedPayload {
        lease_epoch: 1,
        lease_token: "t".repeat(43),
        request_id: "r-1".into(),
    });
    let cp = journal.append(&binding(1), &claimed).unwrap();
    assert_eq!(cp.phase, Phase::Claimed);
    assert_eq!(
        journal.latest(TASK).unwrap().unwrap().decode().unwrap(),
        claimed
    );
    // A row whose payload lacks a field of its phase's type (as an older
    // or damaged writer could leave it) reads back, but does not decode.
    journal
        .append_value(
            &binding(1),
            Phase::WorkspacePrepared,
            &json!({"request_id": "r-1", "source_tree": "b".repeat(40)}),
        )
        .unwrap();
    let head = journal.latest(TASK).unwrap().unwrap();
    let err = head.decode().unwrap_err();
    assert_eq!(err.code, Code::STORE_CORRUPT);
    assert!(
        err.to_string()
            .contains("workspace_prepared checkpoint payload")
            && err.to_string().contains("request_sha256"),
        "{err}"
    );
    // The well-formed row before it still decodes: the damage is per row.
    assert_eq!(journal.history(TASK).unwrap()[0].decode().unwrap(), claimed);
    let fine = Payload::WorkspacePrepared(WorkspacePreparedPayload {
        request_id: "r-1".into(),
        request_sha256: "a".repeat(64),
        source_tree: "b".repeat(40),
    });
    assert_eq!(
        journal
            .append(&binding(1), &fine)
            .unwrap()
            .decode()
            .unwrap(),
        fine
    );
}

//! The SQLite task store's schema, as versioned migrations (the
//! PostgreSQL schema is in [`super::postgres`]).

use airlock_sqlite::db::Migration;

/// Every schema step of the task store, oldest first.
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        sql: V1,
    },
    Migration {
        version: 2,
        sql: V2,
    },
    Migration {
        version: 3,
        sql: V3,
    },
    Migration {
        version: 4,
        sql: V4,
    },
    Migration {
        version: 5,
        sql: V5,
    },
    Migration {
        version: 6,
        sql: V6,
    },
    Migration {
        version: 7,
        sql: V7,
    },
    Migration {
        version: 8,
        sql: V8,
    },
];

/// Version 8: fair claims and agents' quotas (`tasks::fair`,
/// `tasks::quota`). `claim_classes` remembers when a claim last served
/// each submitter class (an agent, or a uid: `fair::CLASS_SQL`), so a
/// class served longest ago goes first among equals; empty at first, so
/// every class starts unserved. `results.cpu_ms` is what a result's
/// verification used (`quota::verification_cpu_ms`: the commands'
/// wall-clock `duration_ms`, summed), filled here in the same way for
/// existing results, with the append-only trigger lifted for that one
/// statement; no other column of a result changes. Indexes for the
/// quotas' windows.
const V8: &str = r#"
CREATE TABLE claim_classes (
    class           TEXT    PRIMARY KEY,
    last_claimed_ms INTEGER NOT NULL
);
ALTER TABLE results ADD COLUMN cpu_ms INTEGER;
DROP TRIGGER results_no_update;
UPDATE results SET cpu_ms = (
    SELECT COALESCE(SUM(json_extract(c.value, '$.duration_ms')), 0)
    FROM json_each(results.result_json, '$.verification') c);
CREATE TRIGGER results_no_update BEFORE UPDATE ON results
BEGIN SELECT RAISE(ABORT, 'results are append-only'); END;
CREATE INDEX tasks_by_agent ON tasks (submitter_agent, created_at_ms);
CREATE INDEX results_by_time ON results (received_at_ms);
"#;

/// Version 7: the worker's fence on its attempt (`Worker1.Fence`): until
/// `fenced_until_ms` the task is not cancelled and its lease does not
/// expire, while the holder moves its agent branch or pushes it. Existing
/// rows hold no fence.
const V7: &str = r#"
ALTER TABLE tasks ADD COLUMN fenced_until_ms INTEGER;
"#;

/// Version 6: each task's submitter as columns — the uid the bus reported
/// for the caller that submitted it, and the planner agent's name when
/// the supervisor recognised an agent — so that a read can be bound to
/// its caller in the query itself. Filled for existing tasks from each
/// task's first allowed `TASK_SUBMITTED` event (its actor's uid, and the
/// agent of an actor named `agent:NAME …`: `Actor::agent`); a task with no
/// such event keeps no submitter and is seen by `tasks.read-all` only.
/// A trigger keeps the submitter as it was written.
const V6: &str = r#"
ALTER TABLE tasks ADD COLUMN submitter_uid INTEGER;
ALTER TABLE tasks ADD COLUMN submitter_agent TEXT;
UPDATE tasks SET
    submitter_uid = (
        SELECT e.actor_uid FROM events e
        WHERE e.task_id = tasks.task_id AND e.action = 'TASK_SUBMITTED' AND e.outcome = 'allowed'
        ORDER BY e.id LIMIT 1),
    submitter_agent = (
        SELECT CASE
            WHEN substr(e.actor_name, 1, 6) = 'agent:' AND instr(e.actor_name, ' ') > 7
            THEN substr(e.actor_name, 7, instr(e.actor_name, ' ') - 7)
        END
        FROM events e
        WHERE e.task_id = tasks.task_id AND e.action = 'TASK_SUBMITTED' AND e.outcome = 'allowed'
        ORDER BY e.id LIMIT 1);
CREATE INDEX tasks_by_submitter ON tasks (submitter_uid, submitter_agent, task_id);
CREATE TRIGGER tasks_submitter_fixed BEFORE UPDATE OF submitter_uid, submitter_agent ON tasks
WHEN OLD.submitter_uid IS NOT NEW.submitter_uid OR OLD.submitter_agent IS NOT NEW.submitter_agent
BEGIN SELECT RAISE(ABORT, 'a task''s submitter never changes'); END;
"#;

/// Version 5: reconciliation cases (one row per task and attempt whose
/// branch moved, rewritten as the case moves; the history is in `events`)
/// and administrators' resolutions of them in an append-only slot, one per
/// `(task_id, idempotency_key)`. Existing rows are unchanged.
const V5: &str = r#"
CREATE TABLE reconciliations (
    task_id       TEXT    NOT NULL REFERENCES tasks (task_id),
    attempt       INTEGER NOT NULL,
    status        TEXT    NOT NULL CHECK (status IN ('open', 'adopting', 'adopted', 'failed')),
    case_json     TEXT    NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    PRIMARY KEY (task_id, attempt)
);
CREATE INDEX reconciliations_by_status ON reconciliations (status, task_id);
CREATE TABLE reconciliation_resolutions (
    task_id         TEXT    NOT NULL REFERENCES tasks (task_id),
    idempotency_key TEXT    NOT NULL,
    request_sha256  TEXT    NOT NULL,
    attempt         INTEGER NOT NULL,
    resolution      TEXT    NOT NULL,
    outcome_json    TEXT    NOT NULL,
    actor_name      TEXT    NOT NULL,
    created_at_ms   INTEGER NOT NULL,
    PRIMARY KEY (task_id, idempotency_key)
);
CREATE TRIGGER reconciliation_resolutions_no_update BEFORE UPDATE ON reconciliation_resolutions
BEGIN SELECT RAISE(ABORT, 'resolutions are append-only'); END;
CREATE TRIGGER reconciliation_resolutions_no_delete BEFORE DELETE ON reconciliation_resolutions
BEGIN SELECT RAISE(ABORT, 'resolutions are append-only'); END;
"#;

/// Version 3: admin decisions (Verify, CancelTask) in their own
/// append-only slot, one per `(task_id, idempotency_key)`, with the answer
/// an identical replay returns. Existing tasks and events are unchanged.
const V3: &str = r#"
CREATE TABLE task_decisions (
    task_id          TEXT    NOT NULL REFERENCES tasks (task_id),
    idempotency_key  TEXT    NOT NULL,
    request_sha256   TEXT    NOT NULL,
    decision         TEXT    NOT NULL,
    attempt          INTEGER NOT NULL,
    result_sha256    TEXT,
    applied_revision INTEGER NOT NULL,
    outcome_json     TEXT    NOT NULL,
    actor_name       TEXT    NOT NULL,
    created_at_ms    INTEGER NOT NULL,
    PRIMARY KEY (task_id, idempotency_key)
);
CREATE TRIGGER task_decisions_no_update BEFORE UPDATE ON task_decisions
BEGIN SELECT RAISE(ABORT, 'decisions are append-only'); END;
CREATE TRIGGER task_decisions_no_delete BEFORE DELETE ON task_decisions
BEGIN SELECT RAISE(ABORT, 'decisions are append-only'); END;
"#;

/// Version 4: the planner agents' restart-policy records, one row per
/// agent name, rewritten on every change (the history is in `events`).
/// Existing rows are unchanged.
const V4: &str = r#"
CREATE TABLE agents (
    name          TEXT    PRIMARY KEY,
    record_json   TEXT    NOT NULL,
    updated_at_ms INTEGER NOT NULL
);
"#;

/// Version 2: each task's repository as a column, so a claim can take
/// only the tasks of the repositories a host serves (filled from the
/// stored binding for tasks written by version 1).
const V2: &str = r#"
ALTER TABLE tasks ADD COLUMN repository TEXT NOT NULL DEFAULT '';
UPDATE tasks SET repository = json_extract(binding_json, '$.repository');
CREATE INDEX tasks_by_repository ON tasks (status, repository, seq);
"#;

/// Version 1.
///
/// `tasks` carries the seed's columns (`task_id`, `status`, `attempt`,
/// `max_attempts`, `revision`, `claimed_by`, `lease_token_hash`,
/// `lease_expires_at`, `verification_json`, `result_json`) with the names
/// the retry-extension CAS speaks, plus airlock's own. `seq` orders the
/// queue (oldest submission first) and survives VACUUM, unlike a bare rowid.
/// `results`, `task_retry_extensions` and `events` are append-only: triggers
/// abort any UPDATE or DELETE. The lease columns deliberately carry no
/// cross-column CHECK: the retry extension's own ACTIVE_LEASE_DENY guard is
/// the seed's defence against a terminal task that still holds a lease, and
/// it must stay reachable (and tested) field by field.
const V1: &str = r#"
CREATE TABLE store_clock (
    id            INTEGER PRIMARY KEY CHECK (id = 1),
    high_water_ms INTEGER NOT NULL
);
INSERT INTO store_clock (id, high_water_ms) VALUES (1, 0);

CREATE TABLE tasks (
    seq               INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id           TEXT    NOT NULL UNIQUE,
    status            TEXT    NOT NULL CHECK (status IN
                          ('QUEUED', 'RUNNING', 'VERIFYING', 'SUCCEEDED', 'FAILED', 'CANCELLED')),
    attempt           INTEGER NOT NULL CHECK (attempt >= 0),
    max_attempts      INTEGER NOT NULL CHECK (max_attempts BETWEEN 1 AND 50),
    revision          INTEGER NOT NULL CHECK (revision >= 1),
    lease_epoch       INTEGER NOT NULL CHECK (lease_epoch >= 0),
    claimed_by        TEXT,
    lease_token_hash  TEXT,
    lease_expires_at  INTEGER,
    verification_json TEXT,
    result_json       TEXT,
    binding_json      TEXT    NOT NULL,
    plan_json         TEXT    NOT NULL,
    envelope_json     TEXT    NOT NULL,
    execution_digest  TEXT    NOT NULL,
    plan_digest       TEXT    NOT NULL,
    idempotency_key   TEXT    NOT NULL UNIQUE,
    submission_sha256 TEXT    NOT NULL,
    created_at_ms     INTEGER NOT NULL,
    updated_at_ms     INTEGER NOT NULL,
    CHECK (attempt <= max_attempts)
);
CREATE INDEX tasks_by_status ON tasks (status, seq);

CREATE TABLE results (
    task_id         TEXT    NOT NULL REFERENCES tasks (task_id),
    idempotency_key TEXT    NOT NULL,
    attempt         INTEGER NOT NULL,
    lease_epoch     INTEGER NOT NULL,
    result_sha256   TEXT    NOT NULL,
    result_json     TEXT    NOT NULL,
    received_at_ms  INTEGER NOT NULL,
    PRIMARY KEY (task_id, idempotency_key)
);
CREATE TRIGGER results_no_update BEFORE UPDATE ON results
BEGIN SELECT RAISE(ABORT, 'results are append-only'); END;
CREATE TRIGGER results_no_delete BEFORE DELETE ON results
BEGIN SELECT RAISE(ABORT, 'results are append-only'); END;

CREATE TABLE task_retry_extensions (
    task_id                      TEXT    NOT NULL,
    idempotency_key              TEXT    NOT NULL,
    request_sha256               TEXT    NOT NULL,
    authorization_id             TEXT    NOT NULL,
    previous_verification_sha256 TEXT    NOT NULL,
    previous_max_attempts        INTEGER NOT NULL,
    next_max_attempts            INTEGER NOT NULL,
    expected_revision            INTEGER NOT NULL,
    applied_revision             INTEGER NOT NULL,
    created_at_ms                INTEGER NOT NULL,
    PRIMARY KEY (task_id, idempotency_key)
);
CREATE TRIGGER task_retry_extensions_no_update BEFORE UPDATE ON task_retry_extensions
BEGIN SELECT RAISE(ABORT, 'retry extensions are append-only'); END;
CREATE TRIGGER task_retry_extensions_no_delete BEFORE DELETE ON task_retry_extensions
BEGIN SELECT RAISE(ABORT, 'retry extensions are append-only'); END;

CREATE TABLE events (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id      TEXT,
    at_ms        INTEGER NOT NULL,
    actor_kind   TEXT    NOT NULL,
    actor_uid    INTEGER,
    actor_name   TEXT    NOT NULL,
    action       TEXT    NOT NULL,
    outcome      TEXT    NOT NULL CHECK (outcome IN ('allowed', 'denied')),
    code         TEXT,
    payload_json TEXT    NOT NULL,
    CHECK ((outcome = 'denied') = (code IS NOT NULL))
);
CREATE INDEX events_by_task ON events (task_id, id);
CREATE TRIGGER events_no_update BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
CREATE TRIGGER events_no_delete BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
"#;

//! The PostgreSQL schema, its versions and the migration that brings a
//! database to this build's.

use super::error::{ServerWords, pg_error};
use super::location::PgLocation;
use crate::error::{StoreError, StoreResult};
use airlock_proto::{Code, Error};
use postgres::Client;

/// The group role whose members may use the store (and nothing more).
pub const SUPERVISOR_ROLE: &str = "airlock_supervisor";

/// What `airlock_schema.kind` says in an airlock task store.
pub(super) const KIND: &str = "airlock-tasks";

/// Advisory lock key that serialises migrations ("AIRT").
const MIGRATION_LOCK: i64 = 0x4149_5254;

/// One schema step of the PostgreSQL store.
#[derive(Debug)]
pub struct PgMigration {
    /// `airlock_schema.version` after this step.
    pub version: i64,
    /// SQL run inside the migration transaction.
    pub sql: &'static str,
}

/// Every schema step, oldest first.
pub const MIGRATIONS: &[PgMigration] = &[
    PgMigration {
        version: 1,
        sql: V1,
    },
    PgMigration {
        version: 2,
        sql: V2,
    },
    PgMigration {
        version: 3,
        sql: V3,
    },
    PgMigration {
        version: 4,
        sql: V4,
    },
    PgMigration {
        version: 5,
        sql: V5,
    },
    PgMigration {
        version: 6,
        sql: V6,
    },
    PgMigration {
        version: 7,
        sql: V7,
    },
];

/// Version 7: fair claims and agents' quotas (the SQLite store's version
/// 8): `claim_classes`, when a claim last served each submitter class;
/// `results.cpu_ms`, what a result's verification used, filled for
/// existing results from their commands' `duration_ms` with the
/// append-only trigger disabled for that one statement (nothing else of a
/// result changes, and `tasks_notify` is not involved); indexes for the
/// quotas' windows. The supervisor's role may read, insert and update
/// `claim_classes`; its grants on `results` cover the new column.
const V7: &str = r#"
CREATE TABLE claim_classes (
    class           text   PRIMARY KEY,
    last_claimed_ms bigint NOT NULL
);
REVOKE ALL ON claim_classes FROM PUBLIC;
GRANT SELECT, INSERT, UPDATE ON claim_classes TO airlock_supervisor;
ALTER TABLE results ADD COLUMN cpu_ms bigint;
ALTER TABLE results DISABLE TRIGGER results_append_only;
UPDATE results SET cpu_ms = COALESCE((
    SELECT SUM((c ->> 'duration_ms')::bigint)
    FROM jsonb_array_elements(CASE
        WHEN jsonb_typeof(result_json::jsonb -> 'verification') = 'array'
        THEN result_json::jsonb -> 'verification' ELSE '[]'::jsonb END) c), 0);
ALTER TABLE results ENABLE TRIGGER results_append_only;
CREATE INDEX tasks_by_agent ON tasks (submitter_agent, created_at_ms)
    WHERE submitter_agent IS NOT NULL;
CREATE INDEX results_by_time ON results (received_at_ms);
"#;

/// Version 6: the worker's fence on its attempt (the SQLite store's
/// version 7): until `fenced_until_ms` the task is not cancelled and its
/// lease does not expire. The supervisor's role keeps its grants on
/// `tasks`, which cover the new column.
const V6: &str = r#"
ALTER TABLE tasks ADD COLUMN fenced_until_ms bigint;
"#;

/// Version 5: each task's submitter as columns (the SQLite store's
/// version 6), filled for existing tasks from each task's first allowed
/// `TASK_SUBMITTED` event: its actor's uid, and the agent of an actor
/// named `agent:NAME …` (`Actor::agent`). The fill does not announce
/// itself (`tasks_notify` is off while it runs: no task changed state). A
/// trigger keeps the submitter as it was written; the supervisor's role
/// keeps its grants on `tasks`, which cover the new columns.
const V5: &str = r#"
ALTER TABLE tasks ADD COLUMN submitter_uid bigint, ADD COLUMN submitter_agent text;
ALTER TABLE tasks DISABLE TRIGGER tasks_notify;
UPDATE tasks t SET
    submitter_uid = e.actor_uid,
    submitter_agent = CASE
        WHEN e.actor_name LIKE 'agent:%' AND position(' ' IN e.actor_name) > 7
        THEN substring(e.actor_name FROM 7 FOR position(' ' IN e.actor_name) - 7)
    END
FROM (
    SELECT DISTINCT ON (task_id) task_id, actor_uid, actor_name FROM events
    WHERE action = 'TASK_SUBMITTED' AND outcome = 'allowed' AND task_id IS NOT NULL
    ORDER BY task_id, id
) e
WHERE e.task_id = t.task_id;
ALTER TABLE tasks ENABLE TRIGGER tasks_notify;
CREATE INDEX tasks_by_submitter ON tasks (submitter_uid, submitter_agent, task_id);
CREATE FUNCTION airlock_submitter_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.submitter_uid IS DISTINCT FROM NEW.submitter_uid
        OR OLD.submitter_agent IS DISTINCT FROM NEW.submitter_agent THEN
        RAISE EXCEPTION 'a task''s submitter never changes';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER tasks_submitter_fixed BEFORE UPDATE ON tasks
    FOR EACH ROW EXECUTE FUNCTION airlock_submitter_fixed();
"#;

/// Version 4: reconciliation cases and their resolutions (the SQLite
/// store's version 5). Existing rows are unchanged; the supervisor's role
/// may rewrite a case but only read and insert resolutions.
const V4: &str = r#"
CREATE TABLE reconciliations (
    task_id       text   NOT NULL REFERENCES tasks (task_id),
    attempt       bigint NOT NULL,
    status        text   NOT NULL CHECK (status IN ('open', 'adopting', 'adopted', 'failed')),
    case_json     text   NOT NULL,
    updated_at_ms bigint NOT NULL,
    PRIMARY KEY (task_id, attempt)
);
CREATE INDEX reconciliations_by_status ON reconciliations (status, task_id);
CREATE TABLE reconciliation_resolutions (
    task_id         text   NOT NULL REFERENCES tasks (task_id),
    idempotency_key text   NOT NULL,
    request_sha256  text   NOT NULL,
    attempt         bigint NOT NULL,
    resolution      text   NOT NULL,
    outcome_json    text   NOT NULL,
    actor_name      text   NOT NULL,
    created_at_ms   bigint NOT NULL,
    PRIMARY KEY (task_id, idempotency_key)
);
CREATE TRIGGER reconciliation_resolutions_append_only BEFORE UPDATE OR DELETE
    ON reconciliation_resolutions FOR EACH ROW EXECUTE FUNCTION airlock_append_only();
CREATE TRIGGER reconciliation_resolutions_no_truncate BEFORE TRUNCATE
    ON reconciliation_resolutions FOR EACH STATEMENT EXECUTE FUNCTION airlock_append_only();
REVOKE ALL ON reconciliations, reconciliation_resolutions FROM PUBLIC;
GRANT SELECT, INSERT, UPDATE ON reconciliations TO airlock_supervisor;
GRANT SELECT, INSERT ON reconciliation_resolutions TO airlock_supervisor;
"#;

/// Version 3: the planner agents' restart-policy records (the SQLite
/// store's version 4), one row per agent name, rewritten on every change;
/// every change is also an event. Existing rows are unchanged.
const V3: &str = r#"
CREATE TABLE agents (
    name          text   PRIMARY KEY,
    record_json   text   NOT NULL,
    updated_at_ms bigint NOT NULL
);
REVOKE ALL ON agents FROM PUBLIC;
GRANT SELECT, INSERT, UPDATE ON agents TO airlock_supervisor;
"#;

/// The schema version this build expects.
pub fn latest_version() -> i64 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

/// The triggers the schema relies on (checked by `integrity_check`).
pub(super) const TRIGGERS: &[&str] = &[
    "events_append_only",
    "events_no_truncate",
    "results_append_only",
    "results_no_truncate",
    "task_retry_extensions_append_only",
    "task_retry_extensions_no_truncate",
    "task_decisions_append_only",
    "task_decisions_no_truncate",
    "reconciliation_resolutions_append_only",
    "reconciliation_resolutions_no_truncate",
    "tasks_notify",
    "tasks_submitter_fixed",
];

/// Version 2: admin decisions (Verify, CancelTask) in their own
/// append-only slot (the SQLite store's version 3). Existing rows are
/// unchanged; the supervisor's role may only read and insert decisions.
const V2: &str = r#"
CREATE TABLE task_decisions (
    task_id          text   NOT NULL REFERENCES tasks (task_id),
    idempotency_key  text   NOT NULL,
    request_sha256   text   NOT NULL,
    decision         text   NOT NULL,
    attempt          bigint NOT NULL,
    result_sha256    text,
    applied_revision bigint NOT NULL,
    outcome_json     text   NOT NULL,
    actor_name       text   NOT NULL,
    created_at_ms    bigint NOT NULL,
    PRIMARY KEY (task_id, idempotency_key)
);
CREATE TRIGGER task_decisions_append_only BEFORE UPDATE OR DELETE ON task_decisions
    FOR EACH ROW EXECUTE FUNCTION airlock_append_only();
CREATE TRIGGER task_decisions_no_truncate BEFORE TRUNCATE ON task_decisions
    FOR EACH STATEMENT EXECUTE FUNCTION airlock_append_only();
REVOKE ALL ON task_decisions FROM PUBLIC;
GRANT SELECT, INSERT ON task_decisions TO airlock_supervisor;
"#;

/// Version 1: the SQLite store's version-2 schema in PostgreSQL's types,
/// plus the server clock, the notification trigger and the grants.
///
/// Integers are `bigint` throughout. The append-only triggers fire for
/// every role, the owner included; the supervisor's role additionally has
/// no UPDATE, DELETE or TRUNCATE privilege on those tables, so even a
/// disabled trigger would not let it rewrite history.
const V1: &str = r#"
CREATE TABLE store_clock (
    id            bigint PRIMARY KEY CHECK (id = 1),
    high_water_ms bigint NOT NULL
);
INSERT INTO store_clock (id, high_water_ms) VALUES (1, 0);

-- The one clock every host's leases are judged by: the server's.
CREATE FUNCTION airlock_clock_ms() RETURNS bigint LANGUAGE sql VOLATILE
    AS $$ SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint $$;

CREATE TABLE tasks (
    seq               bigserial PRIMARY KEY,
    task_id           text   NOT NULL UNIQUE,
    status            text   NOT NULL CHECK (status IN
                          ('QUEUED', 'RUNNING', 'VERIFYING', 'SUCCEEDED', 'FAILED', 'CANCELLED')),
    attempt           bigint NOT NULL CHECK (attempt >= 0),
    max_attempts      bigint NOT NULL CHECK (max_attempts BETWEEN 1 AND 50),
    revision          bigint NOT NULL CHECK (revision >= 1),
    lease_epoch       bigint NOT NULL CHECK (lease_epoch >= 0),
    claimed_by        text,
    lease_token_hash  text,
    lease_expires_at  bigint,
    verification_json text,
    result_json       text,
    binding_json      text   NOT NULL,
    plan_json         text   NOT NULL,
    envelope_json     text   NOT NULL,
    execution_digest  text   NOT NULL,
    plan_digest       text   NOT NULL,
    idempotency_key   text   NOT NULL UNIQUE,
    submission_sha256 text   NOT NULL,
    created_at_ms     bigint NOT NULL,
    updated_at_ms     bigint NOT NULL,
    repository        text   NOT NULL,
    CHECK (attempt <= max_attempts)
);
CREATE INDEX tasks_by_status ON tasks (status, seq);
CREATE INDEX tasks_claimable ON tasks (repository, seq) WHERE status = 'QUEUED';
CREATE INDEX tasks_leased ON tasks (lease_expires_at) WHERE status = 'RUNNING';

CREATE TABLE results (
    task_id         text   NOT NULL REFERENCES tasks (task_id),
    idempotency_key text   NOT NULL,
    attempt         bigint NOT NULL,
    lease_epoch     bigint NOT NULL,
    result_sha256   text   NOT NULL,
    result_json     text   NOT NULL,
    received_at_ms  bigint NOT NULL,
    PRIMARY KEY (task_id, idempotency_key)
);

CREATE TABLE task_retry_extensions (
    task_id                      text   NOT NULL,
    idempotency_key              text   NOT NULL,
    request_sha256               text   NOT NULL,
    authorization_id             text   NOT NULL,
    previous_verification_sha256 text   NOT NULL,
    previous_max_attempts        bigint NOT NULL,
    next_max_attempts            bigint NOT NULL,
    expected_revision            bigint NOT NULL,
    applied_revision             bigint NOT NULL,
    created_at_ms                bigint NOT NULL,
    PRIMARY KEY (task_id, idempotency_key)
);

CREATE TABLE events (
    id           bigserial PRIMARY KEY,
    task_id      text,
    at_ms        bigint NOT NULL,
    actor_kind   text   NOT NULL,
    actor_uid    bigint,
    actor_name   text   NOT NULL,
    action       text   NOT NULL,
    outcome      text   NOT NULL CHECK (outcome IN ('allowed', 'denied')),
    code         text,
    payload_json text   NOT NULL,
    CHECK ((outcome = 'denied') = (code IS NOT NULL))
);
CREATE INDEX events_by_task ON events (task_id, id);

CREATE FUNCTION airlock_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only', TG_TABLE_NAME;
END
$$;
CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION airlock_append_only();
CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION airlock_append_only();
CREATE TRIGGER results_append_only BEFORE UPDATE OR DELETE ON results
    FOR EACH ROW EXECUTE FUNCTION airlock_append_only();
CREATE TRIGGER results_no_truncate BEFORE TRUNCATE ON results
    FOR EACH STATEMENT EXECUTE FUNCTION airlock_append_only();
CREATE TRIGGER task_retry_extensions_append_only BEFORE UPDATE OR DELETE ON task_retry_extensions
    FOR EACH ROW EXECUTE FUNCTION airlock_append_only();
CREATE TRIGGER task_retry_extensions_no_truncate BEFORE TRUNCATE ON task_retry_extensions
    FOR EACH STATEMENT EXECUTE FUNCTION airlock_append_only();

-- Every committed change wakes the supervisors of every host.
CREATE FUNCTION airlock_task_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('airlock_task_changed', json_build_object(
        'task_id', NEW.task_id, 'state', NEW.status, 'revision', NEW.revision,
        'repository', NEW.repository)::text);
    RETURN NULL;
END
$$;
CREATE TRIGGER tasks_notify AFTER INSERT OR UPDATE ON tasks
    FOR EACH ROW EXECUTE FUNCTION airlock_task_changed();

-- The supervisors' role: what the store does, and nothing more.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'airlock_supervisor') THEN
        CREATE ROLE airlock_supervisor NOLOGIN;
    END IF;
END
$$;
REVOKE ALL ON store_clock, tasks, results, task_retry_extensions, events, airlock_schema
    FROM PUBLIC;
GRANT SELECT ON airlock_schema TO airlock_supervisor;
GRANT SELECT, UPDATE ON store_clock TO airlock_supervisor;
GRANT SELECT, INSERT, UPDATE ON tasks TO airlock_supervisor;
GRANT SELECT, INSERT ON results, task_retry_extensions, events TO airlock_supervisor;
GRANT USAGE ON SEQUENCE tasks_seq_seq, events_id_seq TO airlock_supervisor;
"#;

/// Brings the schema to [`latest_version`], under an advisory lock so that
/// supervisors starting together migrate once. `user` names the role in
/// the error when it may not.
pub fn migrate(client: &mut Client, user: &str) -> StoreResult<()> {
    let mut tx = client
        .transaction()
        .map_err(|e| pg_error("starting the schema check", e))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .map_err(|e| pg_error("locking the schema", e))?;
    let exists: bool = tx
        .query_one("SELECT to_regclass('airlock_schema') IS NOT NULL", &[])
        .and_then(|r| r.try_get(0))
        .map_err(|e| pg_error("looking for the schema", e))?;
    let version = if exists {
        let row = tx
            .query_opt("SELECT kind, version FROM airlock_schema WHERE id = 1", &[])
            .map_err(|e| pg_error("reading the schema version", e))?;
        let (kind, version): (String, i64) = match row {
            Some(r) => (r.get(0), r.get(1)),
            None => (String::new(), -1),
        };
        if kind != KIND {
            return Err(Error::with(
                Code::STORE_UNAVAILABLE,
                format!("the database is not an airlock task store (schema kind {kind:?})"),
            )
            .into());
        }
        version
    } else {
        0
    };
    let latest = latest_version();
    if version > latest {
        return Err(Error::with(
            Code::SCHEMA_VERSION_UNSUPPORTED,
            format!("schema version {version} is newer than this airlock ({latest})"),
        )
        .into());
    }
    if version == latest {
        return tx
            .commit()
            .map_err(|e| pg_error("ending the schema check", e));
    }
    let cannot = |e: postgres::Error| -> StoreError {
        Error::with(
            Code::SCHEMA_VERSION_UNSUPPORTED,
            format!(
                "the schema is at version {version}, this airlock needs {latest}, and role {user:?} cannot migrate it ({}); run `airlock-supervisor --migrate` as the schema's owner (docs/postgresql.md)",
                ServerWords(&e)
            ),
        )
        .into()
    };
    if !exists {
        tx.batch_execute(
            "CREATE TABLE airlock_schema (\
                 id integer PRIMARY KEY CHECK (id = 1), kind text NOT NULL, version bigint NOT NULL); \
             INSERT INTO airlock_schema (id, kind, version) VALUES (1, 'airlock-tasks', 0);",
        )
        .map_err(cannot)?;
    }
    for m in MIGRATIONS.iter().filter(|m| m.version > version) {
        tx.batch_execute(m.sql).map_err(cannot)?;
        tx.execute(
            "UPDATE airlock_schema SET version = $1 WHERE id = 1",
            &[&m.version],
        )
        .map_err(cannot)?;
    }
    tx.commit()
        .map_err(|e| pg_error("committing the schema migration", e))
}

/// Connects to `location` and migrates its schema (what
/// `airlock-supervisor --migrate` does, as the schema's owner).
pub fn migrate_at(location: &PgLocation) -> StoreResult<i64> {
    let mut client = location.connect()?;
    migrate(&mut client, location.user())?;
    Ok(latest_version())
}

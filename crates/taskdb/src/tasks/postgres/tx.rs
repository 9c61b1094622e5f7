//! The writes of one READ COMMITTED transaction: each rule's SQL.

use super::error::pg_error;
use super::prepared;
use super::rows_of;
use crate::error::StoreResult;
use crate::tasks::fair::{CLASS_SQL, ClassHead};
use crate::tasks::row::{COLUMNS, RawRow, TaskRow};
use crate::tasks::tx::{
    ExtensionCas, Guard, NewCase, NewDecision, NewEvent, NewExtension, NewResolution, NewResult,
    NewTask, Page, StoredDecision, StoredExtension, Tx,
};
use airlock_proto::bus::AgentUsage;
use airlock_proto::{Code, Error};
use postgres::Statement;
use postgres::types::ToSql;
use std::collections::HashMap;

/// A READ COMMITTED transaction at one store time.
pub(super) struct PgTx<'a, 'c> {
    pub(super) tx: &'a mut postgres::Transaction<'c>,
    pub(super) statements: &'a mut HashMap<&'static str, Statement>,
    pub(super) now: i64,
}

impl PgTx<'_, '_> {
    fn query(
        &mut self,
        what: &str,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> StoreResult<Vec<postgres::Row>> {
        let stmt = prepared(self.tx, self.statements, sql)?;
        self.tx.query(&stmt, params).map_err(|e| pg_error(what, e))
    }

    fn execute(
        &mut self,
        what: &str,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> StoreResult<u64> {
        let stmt = prepared(self.tx, self.statements, sql)?;
        self.tx
            .execute(&stmt, params)
            .map_err(|e| pg_error(what, e))
    }

    fn one_task(
        &mut self,
        what: &str,
        sql: &'static str,
        value: &str,
    ) -> StoreResult<Option<TaskRow>> {
        let rows = self.query(what, sql, &[&value])?;
        rows_of(what, rows)?
            .into_iter()
            .next()
            .map(RawRow::into_row)
            .transpose()
    }
}

/// The first key of the advisory locks a claim takes per submitter class
/// ("AIRC"); the second is the class's `hashtext`. Two-key advisory locks
/// are a space of their own, apart from the migration's one-key lock. Two
/// classes whose hashes collide share a lock: while one is being claimed
/// the other is passed over too, until the next claim.
pub const CLASS_LOCK: i32 = 0x4149_5243;

/// The first key of the advisory lock a submission under a quota takes
/// per agent ("AIRQ").
pub const AGENT_LOCK: i32 = 0x4149_5251;

/// A repository filter as a text array parameter (`None`: any).
fn repository_filter(repositories: Option<&[String]>) -> Option<Vec<&str>> {
    repositories.map(|r| r.iter().map(String::as_str).collect())
}

fn epoch_i64(epoch: u64) -> StoreResult<i64> {
    i64::try_from(epoch).map_err(|_| Error::with(Code::INTERNAL, "lease epoch overflow").into())
}

const UPDATE_SET: &str = "UPDATE tasks SET status = $1, attempt = $2, max_attempts = $3, \
     revision = $4, lease_epoch = $5, claimed_by = $6, lease_token_hash = $7, \
     lease_expires_at = $8, verification_json = $9, result_json = $10, plan_json = $11, \
     envelope_json = $12, execution_digest = $13, plan_digest = $14, updated_at_ms = $15, \
     fenced_until_ms = $16 WHERE task_id = $17 AND revision = $18";

impl Tx for PgTx<'_, '_> {
    fn now(&self) -> i64 {
        self.now
    }

    fn load(&mut self, task_id: &str) -> StoreResult<Option<TaskRow>> {
        let sql = sql!("SELECT {COLUMNS} FROM tasks WHERE task_id = $1 FOR UPDATE");
        self.one_task("loading a task", sql, task_id)
    }

    fn load_by_key(&mut self, key: &str) -> StoreResult<Option<TaskRow>> {
        let sql = sql!("SELECT {COLUMNS} FROM tasks WHERE idempotency_key = $1 FOR UPDATE");
        self.one_task("loading a task by idempotency key", sql, key)
    }

    fn insert_task(&mut self, t: &NewTask<'_>) -> StoreResult<()> {
        let now = self.now;
        self.execute(
            "inserting a task",
            "INSERT INTO tasks (task_id, status, attempt, max_attempts, revision, lease_epoch, \
             binding_json, plan_json, envelope_json, execution_digest, plan_digest, \
             idempotency_key, submission_sha256, created_at_ms, updated_at_ms, repository, \
             submitter_uid, submitter_agent) \
             VALUES ($1, $12, 0, $2, 1, 0, $3, $4, $5, $6, $7, $8, $9, $10, $10, $11, $13, $14)",
            &[
                &t.task_id,
                &i64::from(t.max_attempts),
                &t.binding_json,
                &t.plan_json,
                &t.envelope_json,
                &t.execution_digest,
                &t.plan_digest,
                &t.idempotency_key,
                &t.submission_sha256,
                &now,
                &t.repository,
                &t.status.as_str(),
                &t.submitter.uid.map(i64::from),
                &t.submitter.agent,
            ],
        )?;
        Ok(())
    }

    fn update(&mut self, row: &TaskRow, read_revision: i64, guard: Guard<'_>) -> StoreResult<bool> {
        let attempt = i64::from(row.attempt);
        let max_attempts = i64::from(row.max_attempts);
        let lease_epoch = row.lease_epoch_i64()?;
        let status = row.status().as_str();
        let now = self.now;
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![
            &status,
            &attempt,
            &max_attempts,
            &row.revision,
            &lease_epoch,
            &row.claimed_by,
            &row.lease_token_hash,
            &row.lease_expires_at,
            &row.verification_json,
            &row.result_json,
            &row.plan_json,
            &row.envelope_json,
            &row.execution_digest,
            &row.plan_digest,
            &row.updated_at_ms,
            &row.fenced_until,
            &row.task_id,
            &read_revision,
        ];
        let (guard_attempt, guard_epoch, guard_text);
        let sql: &'static str = match guard {
            Guard::Revision => UPDATE_SET,
            Guard::Lease {
                attempt,
                lease_epoch,
                token_hash,
            } => {
                guard_attempt = i64::from(attempt);
                guard_epoch = epoch_i64(lease_epoch)?;
                guard_text = token_hash.to_owned();
                params.extend([
                    &guard_attempt as &(dyn ToSql + Sync),
                    &guard_epoch,
                    &guard_text,
                    &now,
                ]);
                sql!(
                    "{UPDATE_SET} AND status = 'RUNNING' AND attempt = $19 AND lease_epoch = $20 \
                     AND lease_token_hash = $21 AND lease_expires_at > $22"
                )
            }
            Guard::Attempt {
                state,
                attempt,
                lease_epoch,
            } => {
                guard_attempt = i64::from(attempt);
                guard_epoch = epoch_i64(lease_epoch)?;
                guard_text = state.as_str().to_owned();
                params.extend([
                    &guard_text as &(dyn ToSql + Sync),
                    &guard_attempt,
                    &guard_epoch,
                ]);
                sql!("{UPDATE_SET} AND status = $19 AND attempt = $20 AND lease_epoch = $21")
            }
        };
        let changed = self.execute("updating a task", sql, &params)?;
        Ok(changed == 1)
    }

    fn claimable_classes(
        &mut self,
        repositories: Option<&[String]>,
    ) -> StoreResult<Vec<ClassHead>> {
        let what = "finding the claimable submitters";
        let repositories = repository_filter(repositories);
        let sql = sql!(
            "SELECT q.class, q.first_seq, COALESCE(r.n, 0)::bigint, s.last_claimed_ms FROM \
             (SELECT {CLASS_SQL} AS class, MIN(seq) AS first_seq FROM tasks \
              WHERE status = 'QUEUED' AND attempt < max_attempts \
              AND ($1::text[] IS NULL OR repository = ANY ($1::text[])) \
              GROUP BY 1) q \
             LEFT JOIN (SELECT {CLASS_SQL} AS class, COUNT(*) AS n FROM tasks \
              WHERE status = 'RUNNING' GROUP BY 1) r ON r.class = q.class \
             LEFT JOIN claim_classes s ON s.class = q.class"
        );
        let rows = self.query(what, sql, &[&repositories])?;
        rows.iter()
            .map(|r| {
                Ok(airlock_sqlite::columns!(ClassHead {
                    key, first_seq, running, last_claim_ms
                } from r.try_get))
            })
            .collect::<Result<Vec<_>, postgres::Error>>()
            .map_err(|e| pg_error(what, e))
    }

    fn try_lock_class(&mut self, class: &str) -> StoreResult<bool> {
        let what = "locking a submitter's claims";
        let rows = self.query(
            what,
            "SELECT pg_try_advisory_xact_lock($1::int4, hashtext($2::text))",
            &[&CLASS_LOCK, &class],
        )?;
        rows.first()
            .map(|r| r.try_get(0))
            .transpose()
            .map_err(|e| pg_error(what, e))
            .map(|taken| taken.unwrap_or(false))
    }

    fn oldest_of_class(
        &mut self,
        class: &str,
        repositories: Option<&[String]>,
        cap: u32,
    ) -> StoreResult<Option<TaskRow>> {
        let what = "finding a claimable task";
        let repositories = repository_filter(repositories);
        // The count is this statement's: its snapshot is taken after the
        // class's lock, so it sees every claim of the class committed before.
        let sql = sql!(
            "SELECT {COLUMNS} FROM tasks WHERE status = 'QUEUED' AND attempt < max_attempts \
             AND ($1::text[] IS NULL OR repository = ANY ($1::text[])) \
             AND {CLASS_SQL} = $2::text \
             AND ($3::bigint = 0 OR (SELECT COUNT(*) FROM tasks WHERE status = 'RUNNING' \
                  AND {CLASS_SQL} = $2::text) < $3::bigint) \
             ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED"
        );
        let rows = self.query(what, sql, &[&repositories, &class, &i64::from(cap)])?;
        rows_of(what, rows)?
            .into_iter()
            .next()
            .map(RawRow::into_row)
            .transpose()
    }

    fn mark_served(&mut self, class: &str) -> StoreResult<()> {
        let now = self.now;
        self.execute(
            "recording whom a claim served",
            "INSERT INTO claim_classes (class, last_claimed_ms) VALUES ($1, $2) \
             ON CONFLICT (class) DO UPDATE SET last_claimed_ms = excluded.last_claimed_ms",
            &[&class, &now],
        )?;
        Ok(())
    }

    fn lock_agent(&mut self, agent: &str) -> StoreResult<()> {
        self.query(
            "locking an agent's submissions",
            "SELECT pg_advisory_xact_lock($1::int4, hashtext($2::text))",
            &[&AGENT_LOCK, &agent],
        )?;
        Ok(())
    }

    fn agent_usage(
        &mut self,
        agent: &str,
        tasks_after_ms: i64,
        cpu_after_ms: i64,
    ) -> StoreResult<AgentUsage> {
        let what = "counting an agent's use";
        let rows = self.query(
            what,
            "SELECT \
             (SELECT COUNT(*) FROM tasks WHERE submitter_agent = $1 AND created_at_ms > $2)::bigint, \
             (SELECT COALESCE(SUM(r.cpu_ms), 0) FROM results r \
              JOIN tasks t ON t.task_id = r.task_id \
              WHERE t.submitter_agent = $1 AND r.received_at_ms > $3)::bigint, \
             (SELECT COUNT(*) FROM tasks WHERE submitter_agent = $1 AND status = 'RUNNING')::bigint",
            &[&agent, &tasks_after_ms, &cpu_after_ms],
        )?;
        let row = rows
            .first()
            .ok_or_else(|| Error::with(Code::INTERNAL, format!("{what}: no row")))?;
        let get = |i: usize| -> StoreResult<u64> {
            let n: i64 = row.try_get(i).map_err(|e| pg_error(what, e))?;
            Ok(u64::try_from(n).unwrap_or(0))
        };
        Ok(AgentUsage {
            tasks_last_hour: get(0)?,
            cpu_ms_last_day: get(1)?,
            running: get(2)?,
        })
    }

    fn queued(&mut self) -> StoreResult<Vec<TaskRow>> {
        let sql = sql!(
            "SELECT {COLUMNS} FROM tasks WHERE status = 'QUEUED' ORDER BY seq \
             FOR UPDATE SKIP LOCKED"
        );
        let rows = self.query("finding queued tasks", sql, &[])?;
        rows_of("finding queued tasks", rows)?
            .into_iter()
            .map(RawRow::into_row)
            .collect()
    }

    fn expired_leases(&mut self) -> StoreResult<Vec<TaskRow>> {
        let now = self.now;
        let sql = sql!(
            "SELECT {COLUMNS} FROM tasks WHERE status = 'RUNNING' \
             AND (lease_expires_at IS NULL OR lease_expires_at <= $1) \
             ORDER BY seq FOR UPDATE SKIP LOCKED"
        );
        let rows = self.query("finding expired leases", sql, &[&now])?;
        rows_of("finding expired leases", rows)?
            .into_iter()
            .map(RawRow::into_row)
            .collect()
    }

    fn result_sha256(&mut self, task_id: &str, key: &str) -> StoreResult<Option<String>> {
        let rows = self.query(
            "looking up a result",
            "SELECT result_sha256 FROM results WHERE task_id = $1 AND idempotency_key = $2",
            &[&task_id, &key],
        )?;
        rows.first()
            .map(|r| r.try_get(0))
            .transpose()
            .map_err(|e| pg_error("looking up a result", e))
    }

    fn insert_result(&mut self, r: &NewResult<'_>) -> StoreResult<()> {
        let now = self.now;
        self.execute(
            "storing a result",
            "INSERT INTO results (task_id, idempotency_key, attempt, lease_epoch, \
             result_sha256, result_json, received_at_ms, cpu_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            &[
                &r.task_id,
                &r.idempotency_key,
                &i64::from(r.attempt),
                &r.lease_epoch,
                &r.result_sha256,
                &r.result_json,
                &now,
                &r.cpu_ms,
            ],
        )?;
        Ok(())
    }

    fn append_event(&mut self, e: &NewEvent<'_>) -> StoreResult<()> {
        let now = self.now;
        self.execute(
            "appending an event",
            "INSERT INTO events (task_id, at_ms, actor_kind, actor_uid, actor_name, action, \
             outcome, code, payload_json) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            &[
                &e.task_id,
                &now,
                &e.actor.kind.as_str(),
                &e.actor.uid.map(i64::from),
                &e.actor.name,
                &e.action,
                &e.outcome.as_str(),
                &e.code.map(Code::as_str),
                &e.payload_json,
            ],
        )?;
        Ok(())
    }

    fn extension(&mut self, task_id: &str, key: &str) -> StoreResult<Option<StoredExtension>> {
        let rows = self.query(
            "looking up a retry extension",
            "SELECT request_sha256, authorization_id, previous_verification_sha256, \
             next_max_attempts, applied_revision FROM task_retry_extensions \
             WHERE task_id = $1 AND idempotency_key = $2",
            &[&task_id, &key],
        )?;
        rows.first()
            .map(|r| {
                Ok(airlock_sqlite::columns!(StoredExtension {
                    request_sha256, authorization_id, previous_verification_sha256,
                    next_max_attempts, applied_revision
                } from r.try_get))
            })
            .transpose()
            .map_err(|e| pg_error("looking up a retry extension", e))
    }

    fn apply_extension(&mut self, cas: &ExtensionCas<'_>) -> StoreResult<u64> {
        let now = self.now;
        self.execute(
            "applying a retry extension",
            "UPDATE tasks SET status = $10, max_attempts = $1, revision = $2, \
             claimed_by = NULL, lease_token_hash = NULL, lease_expires_at = NULL, \
             updated_at_ms = $3 \
             WHERE task_id = $4 AND status = $5 AND revision = $6 AND attempt = $7 \
             AND max_attempts = $8 AND claimed_by IS NOT DISTINCT FROM $9 \
             AND lease_token_hash IS NULL AND lease_expires_at IS NULL",
            &[
                &cas.next_max_attempts,
                &cas.applied_revision,
                &now,
                &cas.task_id,
                &cas.expected_status,
                &cas.expected_revision,
                &cas.expected_attempt,
                &cas.expected_max_attempts,
                &cas.previous_claimed_by,
                &cas.status.as_str(),
            ],
        )
    }

    fn agent_record(&mut self, name: &str) -> StoreResult<Option<String>> {
        let rows = self.query(
            "reading an agent's record",
            "SELECT record_json FROM agents WHERE name = $1",
            &[&name],
        )?;
        rows.first()
            .map(|r| r.try_get(0))
            .transpose()
            .map_err(|e| pg_error("reading an agent's record", e))
    }

    fn put_agent_record(&mut self, name: &str, record_json: &str) -> StoreResult<()> {
        let now = self.now;
        self.execute(
            "storing an agent's record",
            "INSERT INTO agents (name, record_json, updated_at_ms) VALUES ($1, $2, $3) \
             ON CONFLICT (name) DO UPDATE SET record_json = excluded.record_json, \
             updated_at_ms = excluded.updated_at_ms",
            &[&name, &record_json, &now],
        )?;
        Ok(())
    }

    fn insert_extension(&mut self, e: &NewExtension<'_>) -> StoreResult<()> {
        let now = self.now;
        self.execute(
            "recording a retry extension",
            "INSERT INTO task_retry_extensions (task_id, idempotency_key, request_sha256, \
             authorization_id, previous_verification_sha256, previous_max_attempts, \
             next_max_attempts, expected_revision, applied_revision, created_at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            &[
                &e.task_id,
                &e.idempotency_key,
                &e.request_sha256,
                &e.authorization_id,
                &e.previous_verification_sha256,
                &e.previous_max_attempts,
                &e.next_max_attempts,
                &e.expected_revision,
                &e.applied_revision,
                &now,
            ],
        )?;
        Ok(())
    }

    fn decision(&mut self, task_id: &str, key: &str) -> StoreResult<Option<StoredDecision>> {
        let rows = self.query(
            "looking up a decision",
            "SELECT request_sha256, outcome_json FROM task_decisions \
             WHERE task_id = $1 AND idempotency_key = $2",
            &[&task_id, &key],
        )?;
        rows.first()
            .map(|r| {
                Ok(airlock_sqlite::columns!(StoredDecision {
                    request_sha256, outcome_json
                } from r.try_get))
            })
            .transpose()
            .map_err(|e| pg_error("looking up a decision", e))
    }

    fn case_json(&mut self, task_id: &str, attempt: Option<u32>) -> StoreResult<Option<String>> {
        let attempt = attempt.map(i64::from);
        let rows = self.query(
            "reading a reconciliation case",
            "SELECT case_json FROM reconciliations WHERE task_id = $1 \
             AND ($2::bigint IS NULL OR attempt = $2) ORDER BY attempt DESC LIMIT 1",
            &[&task_id, &attempt],
        )?;
        rows.first()
            .map(|r| r.try_get(0))
            .transpose()
            .map_err(|e| pg_error("reading a reconciliation case", e))
    }

    fn put_case(&mut self, case: &NewCase<'_>) -> StoreResult<()> {
        let now = self.now;
        self.execute(
            "storing a reconciliation case",
            "INSERT INTO reconciliations (task_id, attempt, status, case_json, updated_at_ms) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (task_id, attempt) DO UPDATE SET \
             status = excluded.status, case_json = excluded.case_json, \
             updated_at_ms = excluded.updated_at_ms",
            &[
                &case.task_id,
                &i64::from(case.attempt),
                &case.status,
                &case.case_json,
                &now,
            ],
        )?;
        Ok(())
    }

    fn cases(
        &mut self,
        status: Option<&str>,
        page: Page<'_, Option<&str>>,
    ) -> StoreResult<Vec<String>> {
        let rows = self.query(
            "listing reconciliation cases",
            "SELECT case_json FROM reconciliations WHERE ($1::text IS NULL OR status = $1) \
             AND ($2::text IS NULL OR task_id > $2) \
             AND ($4::bigint IS NULL OR task_id IN (SELECT task_id FROM tasks \
                  WHERE submitter_uid = $4 AND submitter_agent IS NOT DISTINCT FROM $5::text)) \
             ORDER BY task_id, attempt LIMIT $3",
            &[
                &status,
                &page.after,
                &i64::from(page.limit),
                &page.scope.uid(),
                &page.scope.agent(),
            ],
        )?;
        rows.iter()
            .map(|r| r.try_get(0))
            .collect::<Result<Vec<String>, _>>()
            .map_err(|e| pg_error("listing reconciliation cases", e))
    }

    fn resolution(&mut self, task_id: &str, key: &str) -> StoreResult<Option<StoredDecision>> {
        let rows = self.query(
            "looking up a resolution",
            "SELECT request_sha256, outcome_json FROM reconciliation_resolutions \
             WHERE task_id = $1 AND idempotency_key = $2",
            &[&task_id, &key],
        )?;
        rows.first()
            .map(|r| {
                Ok(airlock_sqlite::columns!(StoredDecision {
                    request_sha256, outcome_json
                } from r.try_get))
            })
            .transpose()
            .map_err(|e| pg_error("looking up a resolution", e))
    }

    fn insert_resolution(&mut self, r: &NewResolution<'_>) -> StoreResult<()> {
        let now = self.now;
        self.execute(
            "recording a resolution",
            "INSERT INTO reconciliation_resolutions (task_id, idempotency_key, request_sha256, \
             attempt, resolution, outcome_json, actor_name, created_at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            &[
                &r.task_id,
                &r.idempotency_key,
                &r.request_sha256,
                &r.attempt,
                &r.resolution,
                &r.outcome_json,
                &r.actor_name,
                &now,
            ],
        )?;
        Ok(())
    }

    fn insert_decision(&mut self, d: &NewDecision<'_>) -> StoreResult<()> {
        let now = self.now;
        self.execute(
            "recording a decision",
            "INSERT INTO task_decisions (task_id, idempotency_key, request_sha256, decision, \
             attempt, result_sha256, applied_revision, outcome_json, actor_name, created_at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            &[
                &d.task_id,
                &d.idempotency_key,
                &d.request_sha256,
                &d.decision,
                &d.attempt,
                &d.result_sha256,
                &d.applied_revision,
                &d.outcome_json,
                &d.actor_name,
                &now,
            ],
        )?;
        Ok(())
    }
}

//! The writes of one READ COMMITTED transaction: each rule's SQL.

use super::error::pg_error;
use super::prepared;
use super::rows_of;
use crate::error::StoreResult;
use crate::tasks::ReadScope;
use crate::tasks::row::{COLUMNS, RawRow, TaskRow};
use crate::tasks::tx::{
    ExtensionCas, Guard, NewDecision, NewEvent, NewExtension, NewResolution, NewResult, NewTask,
    StoredDecision, StoredExtension, Tx,
};
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

fn epoch_i64(epoch: u64) -> StoreResult<i64> {
    i64::try_from(epoch).map_err(|_| Error::with(Code::INTERNAL, "lease epoch overflow").into())
}

const UPDATE_SET: &str = "UPDATE tasks SET status = $1, attempt = $2, max_attempts = $3, \
     revision = $4, lease_epoch = $5, claimed_by = $6, lease_token_hash = $7, \
     lease_expires_at = $8, verification_json = $9, result_json = $10, plan_json = $11, \
     envelope_json = $12, execution_digest = $13, plan_digest = $14, updated_at_ms = $15 \
     WHERE task_id = $16 AND revision = $17";

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
                    "{UPDATE_SET} AND status = 'RUNNING' AND attempt = $18 AND lease_epoch = $19 \
                     AND lease_token_hash = $20 AND lease_expires_at > $21"
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
                sql!("{UPDATE_SET} AND status = $18 AND attempt = $19 AND lease_epoch = $20")
            }
        };
        let changed = self.execute("updating a task", sql, &params)?;
        Ok(changed == 1)
    }

    fn next_claimable(&mut self, repositories: Option<&[String]>) -> StoreResult<Option<TaskRow>> {
        let repositories: Option<Vec<&str>> =
            repositories.map(|r| r.iter().map(String::as_str).collect());
        let sql = sql!(
            "SELECT {COLUMNS} FROM tasks WHERE status = 'QUEUED' AND attempt < max_attempts \
             AND ($1::text[] IS NULL OR repository = ANY ($1::text[])) \
             ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED"
        );
        let rows = self.query("finding a claimable task", sql, &[&repositories])?;
        rows_of("finding a claimable task", rows)?
            .into_iter()
            .next()
            .map(RawRow::into_row)
            .transpose()
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
             result_sha256, result_json, received_at_ms) VALUES ($1, $2, $3, $4, $5, $6, $7)",
            &[
                &r.task_id,
                &r.idempotency_key,
                &i64::from(r.attempt),
                &r.lease_epoch,
                &r.result_sha256,
                &r.result_json,
                &now,
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
                Ok(StoredExtension {
                    request_sha256: r.try_get(0)?,
                    authorization_id: r.try_get(1)?,
                    previous_verification_sha256: r.try_get(2)?,
                    next_max_attempts: r.try_get(3)?,
                    applied_revision: r.try_get(4)?,
                })
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
                Ok(StoredDecision {
                    request_sha256: r.try_get(0)?,
                    outcome_json: r.try_get(1)?,
                })
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

    fn put_case(
        &mut self,
        task_id: &str,
        attempt: u32,
        status: &str,
        case_json: &str,
    ) -> StoreResult<()> {
        let now = self.now;
        self.execute(
            "storing a reconciliation case",
            "INSERT INTO reconciliations (task_id, attempt, status, case_json, updated_at_ms) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (task_id, attempt) DO UPDATE SET \
             status = excluded.status, case_json = excluded.case_json, \
             updated_at_ms = excluded.updated_at_ms",
            &[&task_id, &i64::from(attempt), &status, &case_json, &now],
        )?;
        Ok(())
    }

    fn cases(
        &mut self,
        status: Option<&str>,
        after_task_id: Option<&str>,
        limit: u32,
        scope: &ReadScope,
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
                &after_task_id,
                &i64::from(limit),
                &scope.uid(),
                &scope.agent(),
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
                Ok(StoredDecision {
                    request_sha256: r.try_get(0)?,
                    outcome_json: r.try_get(1)?,
                })
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

//! Fixtures shared by the task-store integration tests. Each test binary
//! includes this file with `#[path = "tasks_common.rs"] mod common;`; built
//! on its own it is an empty test binary.
#![allow(dead_code)]

use airlock_pgcluster::{Cluster, StoreDatabase};
use airlock_proto::Code;
use airlock_proto::task::{
    ClaimGrant, CommandSummary, DECISION_SCHEMA, Decision, DecisionRequest, Outcome, RESULT_SCHEMA,
    TaskResult, TaskSubmission, TaskView,
};
use airlock_taskdb::StoreResult;
use airlock_taskdb::clock::ManualClock;
pub use airlock_taskdb::tasks::TaskStore;
use airlock_taskdb::tasks::{Actor, EventOutcome, PgLocation, PgStore, SqliteStore};
use rusqlite::Connection;
use rusqlite::types::ValueRef;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// A decision about a task as it is shown now (what airlockctl does),
/// returning the task after it. For a task that cannot be shown (a bad or
/// unknown id) the request names revision 1, attempt 0 and no result.
pub trait DecideNow {
    fn decide_now(
        &mut self,
        task_id: &str,
        d: Decision,
        reason: &str,
        actor: &Actor,
    ) -> StoreResult<TaskView>;
    fn cancel(&mut self, task_id: &str, reason: &str, actor: &Actor) -> StoreResult<TaskView>;
}

/// The request [`DecideNow`] sends.
pub fn request_now(
    store: &(impl TaskStore + ?Sized),
    task_id: &str,
    d: Decision,
    reason: &str,
) -> DecisionRequest {
    match store.get(task_id) {
        Ok(view) => DecisionRequest::about(&view, d, reason, None),
        Err(_) => DecisionRequest {
            schema: DECISION_SCHEMA.to_owned(),
            task_id: task_id.to_owned(),
            decision: d,
            reason: reason.to_owned(),
            idempotency_key: "decide-unseen-0001".to_owned(),
            expected_revision: 1,
            expected_attempt: 0,
            expected_result_sha256: None,
        },
    }
}

impl<T: TaskStore + ?Sized> DecideNow for T {
    fn decide_now(
        &mut self,
        task_id: &str,
        d: Decision,
        reason: &str,
        actor: &Actor,
    ) -> StoreResult<TaskView> {
        let req = request_now(self, task_id, d, reason);
        self.decide(task_id, &req, actor)?;
        self.get(task_id)
    }

    fn cancel(&mut self, task_id: &str, reason: &str, actor: &Actor) -> StoreResult<TaskView> {
        self.decide_now(task_id, Decision::Cancel, reason, actor)
    }
}

/// A raw SQLite connection to the store's file.
fn raw_sqlite(path: &Path) -> Connection {
    let c = Connection::open(path).expect("raw open");
    c.busy_timeout(std::time::Duration::from_secs(30))
        .expect("busy timeout");
    c
}

/// The seed's base and branch-head commits.
pub const BASE: &str = "a642b045775b9154a00ae78543037fbef4fb447b";
pub const HEAD: &str = "71523aef6e48b1e2fa516c456ca189b7a039104b";
/// The seed's owner authorization id.
pub const AUTH_ID: &str = "owner-scheme-a-20260817";
/// Where the manual clock starts (2026-01-01T00:00:00Z).
pub const T0: i64 = 1_767_225_600_000;
/// A lease long enough that no test trips over it by accident.
pub const LEASE: i64 = 60_000;

/// A deterministic execution request: one file write, one verification command.
pub fn execution(content: &str) -> Value {
    json!({
        "action": "deterministic",
        "change_set": [{"path": "x.py", "operation": "write_file", "content": content}],
        "verification": [{"label": "compile", "argv": ["/usr/bin/python3", "-m", "py_compile", "x.py"]}],
        "capability_scope": ["git.read", "git.test"],
    })
}

/// A plan for `task_id` (CONTINUE_EXISTING, so its source head is HEAD).
pub fn plan_json(task_id: &str, key: &str, content: &str) -> Value {
    json!({
        "schema": "airlock.plan.v1", "task_id": task_id, "job_id": format!("job-{task_id}"),
        "source_head_oid": HEAD, "generation": 1, "idempotency_key": key,
        "execution": execution(content),
    })
}

/// A valid submission as JSON.
pub fn submission_json(task_id: &str, max_attempts: u32) -> Value {
    json!({
        "schema": "airlock.task.v1",
        "binding": {
            "task_id": task_id, "job_id": format!("job-{task_id}"), "repository": "demo",
            "base_oid": BASE, "expected_branch_oid": HEAD,
            "target_branch": format!("agent/{task_id}"), "branch_mode": "CONTINUE_EXISTING",
            "generation": 1, "idempotency_key": format!("submit-{task_id}"),
        },
        "plan": plan_json(task_id, &format!("plan-{task_id}-v1"), "x=1\n"),
        "max_attempts": max_attempts,
    })
}

/// Column values as [`Fixture::row`] renders them.
pub fn texts(values: &[&str]) -> Vec<Option<String>> {
    values.iter().map(|v| Some((*v).to_owned())).collect()
}

/// A valid submission.
pub fn submission(task_id: &str, max_attempts: u32) -> TaskSubmission {
    TaskSubmission::from_value(&submission_json(task_id, max_attempts)).expect("valid fixture")
}

pub fn planner() -> Actor {
    Actor::planner(Some(1001), "planner")
}

pub fn admin() -> Actor {
    Actor::admin(Some(0), "admin")
}

pub fn worker() -> Actor {
    Actor::worker(Some(1002), "worker-1")
}

/// Two planner agents of one user (uid 989), and that user outside any
/// agent: three submitters of one uid.
pub fn alpha() -> Actor {
    Actor::planner(Some(989), "agent:alpha airlock-agent@:1.7")
}
pub fn beta() -> Actor {
    Actor::planner(Some(989), "agent:beta airlock-agent@:1.8")
}
pub fn plain() -> Actor {
    Actor::planner(Some(989), "airlock-agent@:1.9")
}

/// A result for a grant: passed (with a commit), failed (with a code) or captured.
pub fn result_for(grant: &ClaimGrant, outcome: Outcome) -> TaskResult {
    TaskResult {
        schema: RESULT_SCHEMA.into(),
        task_id: grant.task_id.clone(),
        attempt: grant.attempt,
        execution_digest: grant.envelope["execution_digest"]
            .as_str()
            .expect("digest")
            .into(),
        outcome,
        commit_oid: (outcome == Outcome::Passed).then(|| "c".repeat(40)),
        target_branch: grant.envelope["target_branch"]
            .as_str()
            .expect("branch")
            .into(),
        exec_result_sha256: Some("e".repeat(64)),
        failure_code: (outcome == Outcome::Failed).then(|| "VERIFICATION_FAILED".into()),
        reconciliation: None,
        publication: None,
        signature: None,
        isolation: (outcome != Outcome::Failed).then(|| airlock_proto::task::Isolation {
            landlock_abi: Some(7),
            landlock: "full".into(),
            seccomp: "enforced".into(),
            namespaces: Some(vec!["user".into(), "mnt".into(), "pid".into()]),
            view: "minimal-root".into(),
            uid: Some(992),
            layer: None,
        }),
        verification: vec![CommandSummary {
            label: "compile".into(),
            exit_code: Some(if outcome == Outcome::Failed { 1 } else { 0 }),
            timed_out: false,
            duration_ms: 12,
            stdout_tail: None,
            stderr_tail: None,
            wall: None,
        }],
        captured: (outcome == Outcome::Captured).then(|| airlock_proto::task::Capture {
            source_tree: "b".repeat(40),
            captured_in_attempt: grant.attempt,
            source_signals: vec![],
            files: vec![],
            withheld: vec![],
        }),
    }
}

/// The worker's idempotency key for a grant's result.
pub fn result_key(grant: &ClaimGrant) -> String {
    format!("result-{}-{}", grant.task_id, grant.attempt)
}

/// The engine a test runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// An SQLite file.
    Sqlite,
    /// A database in a throwaway PostgreSQL cluster.
    Postgres,
}

/// Declares each named `fn(Backend)` as two tests, `sqlite::NAME` and
/// `postgres::NAME`: every task-store test runs against both engines.
#[macro_export]
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $( #[test] fn $name() { super::$name(super::common::Backend::Sqlite) } )*
        }
        mod postgres {
            $( #[test] fn $name() { super::$name(super::common::Backend::Postgres) } )*
        }
    };
}

/// The store's clock, as a test moves it: a manual clock for SQLite; for
/// PostgreSQL the database's own clock function, replaced by the harness
/// (as superuser) with one that reads a value the test sets — the store
/// itself still takes wall time only from the database — and a manual
/// clock for the client's monotonic reading.
#[derive(Debug, Clone)]
pub enum TestClock {
    Manual(ManualClock),
    Database(Arc<Mutex<Superuser>>, ManualClock),
}

impl TestClock {
    pub fn set(&self, ms: i64) {
        match self {
            TestClock::Manual(c) => c.set(ms),
            TestClock::Database(su, _) => {
                su.lock()
                    .unwrap()
                    .0
                    .execute("UPDATE airlock_test_clock SET ms = $1", &[&ms])
                    .expect("set the test clock");
            }
        }
    }

    pub fn advance(&self, delta: i64) {
        match self {
            TestClock::Manual(c) => c.advance(delta),
            TestClock::Database(su, _) => {
                su.lock()
                    .unwrap()
                    .0
                    .execute("UPDATE airlock_test_clock SET ms = ms + $1", &[&delta])
                    .expect("advance the test clock");
            }
        }
    }

    /// Lets `ms` of real time pass: the wall clock (the database's for
    /// PostgreSQL) and the store's monotonic clock both move. [`Self::set`]
    /// and [`Self::advance`] step the wall clock only.
    pub fn elapse(&self, ms: i64) {
        match self {
            TestClock::Manual(c) => c.elapse(ms),
            TestClock::Database(_, mono) => {
                self.advance(ms);
                mono.elapse(ms);
            }
        }
    }
}

/// The harness's superuser session.
pub struct Superuser(pub postgres::Client);

impl std::fmt::Debug for Superuser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Superuser")
    }
}

/// What a PostgreSQL fixture keeps alive.
#[derive(Debug)]
pub struct PgParts {
    pub cluster: Cluster,
    pub db: StoreDatabase,
    pub superuser: Arc<Mutex<Superuser>>,
}

impl PgParts {
    /// The supervisors' location (their role, with its password).
    pub fn location(&self) -> PgLocation {
        PgLocation::parse(&self.db.url)
            .expect("runtime url")
            .with_password(self.db.password.as_bytes())
    }

    /// The schema owner's location.
    pub fn owner_location(&self) -> PgLocation {
        PgLocation::parse(&self.db.owner_url)
            .expect("owner url")
            .with_password(self.db.owner_password.as_bytes())
    }
}

/// Starts a cluster, creates the store's database and roles as a
/// deployment would, migrates it as the owner and, when `test_clock`,
/// replaces the database's clock function with one the test sets (at
/// [`T0`]).
pub fn pg_parts(test_clock: bool) -> PgParts {
    let cluster = Cluster::start().expect("a throwaway PostgreSQL cluster");
    let db = cluster
        .create_store_database("airlock")
        .expect("the store's database");
    let mut parts = PgParts {
        superuser: Arc::new(Mutex::new(Superuser(
            cluster.superuser(&db.name).expect("superuser session"),
        ))),
        cluster,
        db,
    };
    airlock_taskdb::tasks::postgres::migrate_at(&parts.owner_location())
        .expect("migrate as the owner");
    if test_clock {
        parts
            .superuser
            .lock()
            .unwrap()
            .0
            .batch_execute(&format!(
                "CREATE TABLE airlock_test_clock (ms bigint NOT NULL); \
                 INSERT INTO airlock_test_clock VALUES ({T0}); \
                 GRANT SELECT ON airlock_test_clock TO airlock_supervisor; \
                 CREATE OR REPLACE FUNCTION airlock_clock_ms() RETURNS bigint \
                     LANGUAGE sql VOLATILE AS $$ SELECT ms FROM airlock_test_clock $$;"
            ))
            .expect("the test clock");
    }
    let _ = &mut parts;
    parts
}

/// A store on a fresh file (or database) with a test clock at [`T0`].
#[derive(Debug)]
pub struct Fixture {
    pub backend: Backend,
    pub clock: TestClock,
    pub store: Box<dyn TaskStore>,
    /// SQLite: the directory and the file.
    pub sqlite: Option<(tempfile::TempDir, PathBuf)>,
    /// PostgreSQL: the cluster and the database.
    pub pg: Option<PgParts>,
}

impl Fixture {
    pub fn new(backend: Backend) -> Self {
        match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().expect("tempdir");
                let path = dir.path().join("tasks.sqlite3");
                let clock = ManualClock::at(T0);
                let store =
                    SqliteStore::open_with_clock(&path, Arc::new(clock.clone())).expect("open");
                Fixture {
                    backend,
                    clock: TestClock::Manual(clock),
                    store: Box::new(store),
                    sqlite: Some((dir, path)),
                    pg: None,
                }
            }
            Backend::Postgres => {
                let parts = pg_parts(true);
                let mono = ManualClock::at(0);
                let store = PgStore::open_with_clock(&parts.location(), Arc::new(mono.clone()))
                    .expect("open");
                Fixture {
                    backend,
                    clock: TestClock::Database(Arc::clone(&parts.superuser), mono),
                    store: Box::new(store),
                    sqlite: None,
                    pg: Some(parts),
                }
            }
        }
    }

    /// A second store on the same file or database (and clock).
    pub fn reopen(&self) -> Box<dyn TaskStore> {
        match (&self.sqlite, &self.pg, &self.clock) {
            (Some((_, path)), _, TestClock::Manual(clock)) => Box::new(
                SqliteStore::open_with_clock(path, Arc::new(clock.clone())).expect("reopen"),
            ),
            (_, Some(pg), TestClock::Database(_, mono)) => Box::new(
                PgStore::open_with_clock(&pg.location(), Arc::new(mono.clone())).expect("reopen"),
            ),
            _ => unreachable!("a fixture has one engine"),
        }
    }

    /// Runs literal SQL as the database's owner or superuser (what the API
    /// must not allow, and the seed's hand-made rows); rows changed, or
    /// the engine's error message.
    pub fn exec(&self, sql: &str) -> Result<u64, String> {
        match (&self.sqlite, &self.pg) {
            (Some((_, path)), _) => {
                let c = raw_sqlite(path);
                c.execute(sql, [])
                    .map(|n| n as u64)
                    .map_err(|e| e.to_string())
            }
            (_, Some(pg)) => pg
                .superuser
                .lock()
                .unwrap()
                .0
                .execute(sql, &[])
                .map_err(|e| match e.as_db_error() {
                    Some(db) => format!("{}: {}", db.code().code(), db.message()),
                    None => e.to_string(),
                }),
            _ => unreachable!("a fixture has one engine"),
        }
    }

    /// Every row of a literal query, each column rendered as text (NULL
    /// as `None`).
    pub fn rows(&self, sql: &str) -> Vec<Vec<Option<String>>> {
        match (&self.sqlite, &self.pg) {
            (Some((_, path)), _) => {
                let c = raw_sqlite(path);
                let mut stmt = c.prepare(sql).expect("prepare");
                let n = stmt.column_count();
                let mut rows = stmt.query([]).expect("query");
                let mut out = Vec::new();
                while let Some(row) = rows.next().expect("row") {
                    out.push(
                        (0..n)
                            .map(|i| match row.get_ref(i).expect("col") {
                                ValueRef::Null => None,
                                ValueRef::Integer(v) => Some(v.to_string()),
                                ValueRef::Real(v) => Some(v.to_string()),
                                ValueRef::Text(t) => Some(String::from_utf8_lossy(t).into_owned()),
                                ValueRef::Blob(b) => Some(format!("{b:?}")),
                            })
                            .collect(),
                    );
                }
                out
            }
            (_, Some(pg)) => pg
                .superuser
                .lock()
                .unwrap()
                .0
                .simple_query(sql)
                .expect("query")
                .into_iter()
                .filter_map(|m| match m {
                    postgres::SimpleQueryMessage::Row(r) => {
                        Some((0..r.len()).map(|i| r.get(i).map(str::to_owned)).collect())
                    }
                    _ => None,
                })
                .collect(),
            _ => unreachable!("a fixture has one engine"),
        }
    }

    /// Takes the schema back to before fair claims and quotas (SQLite 7,
    /// PostgreSQL 6): the version's table, indexes and column are gone.
    pub fn drop_fairness(&self) {
        for sql in [
            "DROP TABLE claim_classes",
            "DROP INDEX tasks_by_agent",
            "DROP INDEX results_by_time",
            "ALTER TABLE results DROP COLUMN cpu_ms",
        ] {
            self.exec(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
    }

    pub fn drop_task_columns_since_submitters(&self) {
        self.drop_fairness();
        for sql in [
            "ALTER TABLE tasks DROP COLUMN fenced_until_ms",
            "DROP TRIGGER tasks_submitter_fixed",
            "DROP INDEX tasks_by_submitter",
            "ALTER TABLE tasks DROP COLUMN submitter_agent",
            "ALTER TABLE tasks DROP COLUMN submitter_uid",
        ] {
            let sql = match self.backend {
                Backend::Postgres if sql.starts_with("DROP TRIGGER") => {
                    "DROP TRIGGER tasks_submitter_fixed ON tasks"
                }
                _ => sql,
            };
            self.exec(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
        if self.backend == Backend::Postgres {
            self.exec("DROP FUNCTION airlock_submitter_fixed()")
                .unwrap();
        }
    }

    /// The first row of a literal query.
    pub fn row(&self, sql: &str) -> Vec<Option<String>> {
        self.rows(sql).into_iter().next().expect("a row")
    }

    /// Submits `task_id` with `max_attempts`.
    pub fn submit(&mut self, task_id: &str, max_attempts: u32) -> TaskView {
        let s = submission(task_id, max_attempts);
        self.store.submit(&s, &planner()).expect("submit").task
    }

    /// Claims (expecting a task) with the default worker and lease.
    pub fn claim(&mut self) -> ClaimGrant {
        self.store
            .claim(&worker(), LEASE)
            .expect("claim")
            .expect("something to claim")
    }

    /// Submits a result of `outcome` for `grant`.
    pub fn finish(&mut self, grant: &ClaimGrant, outcome: Outcome, auto_accept: bool) -> TaskView {
        self.store
            .submit_result(
                &grant.task_id,
                grant.lease_epoch,
                &grant.lease_token,
                &result_key(grant),
                &result_for(grant, outcome),
                auto_accept,
                &worker(),
            )
            .expect("submit result")
            .task
    }

    /// Claims and fails the (only) task until it is FAILED with its
    /// attempts exhausted; returns its final view.
    pub fn exhaust(&mut self, task_id: &str) -> TaskView {
        loop {
            let grant = self.claim();
            assert_eq!(grant.task_id, task_id);
            let view = self.finish(&grant, Outcome::Failed, false);
            if view.state == airlock_proto::task::TaskState::Failed {
                return view;
            }
        }
    }

    /// Every column of the task's row, rendered, plus the sizes of the
    /// append-only side tables: what "changed nothing" compares.
    pub fn snapshot(&self, task_id: &str) -> Vec<String> {
        let mut out: Vec<String> = self
            .rows(&format!(
                "SELECT * FROM tasks WHERE task_id = '{}'",
                task_id.replace('\'', "''")
            ))
            .into_iter()
            .flatten()
            .map(|v| v.unwrap_or_else(|| "NULL".to_owned()))
            .collect();
        for table in [
            "tasks",
            "results",
            "task_retry_extensions",
            "task_decisions",
            "reconciliation_resolutions",
        ] {
            let count = self.row(&format!("SELECT COUNT(*) FROM {table}"))[0].clone();
            out.push(format!("{table}={}", count.unwrap_or_default()));
        }
        out.extend(
            self.rows("SELECT task_id, attempt, status, case_json FROM reconciliations ORDER BY task_id, attempt")
                .into_iter()
                .flatten()
                .map(|v| v.unwrap_or_else(|| "NULL".to_owned())),
        );
        out
    }

    /// Highest event id so far (0 when none).
    pub fn last_event_id(&self) -> i64 {
        self.store
            .events(None, 0, u32::MAX)
            .expect("events")
            .last()
            .map_or(0, |e| e.id)
    }

    /// Runs `op`, which must be refused with `code`; asserts it changed
    /// nothing in the task's row or the side tables, and appended exactly one
    /// denied event with that code and `action`, about `event_task`.
    pub fn refused<T: std::fmt::Debug>(
        &mut self,
        task_id: &str,
        code: Code,
        action: &str,
        event_task: Option<&str>,
        op: impl FnOnce(&mut dyn TaskStore) -> StoreResult<T>,
    ) {
        let before = self.snapshot(task_id);
        let view_before = self.store.get(task_id).ok();
        let last = self.last_event_id();
        let err = op(self.store.as_mut()).expect_err("must be refused");
        assert_eq!(err.code(), code, "{err}");
        assert_eq!(self.snapshot(task_id), before, "a refusal changed the task");
        assert_eq!(self.store.get(task_id).ok(), view_before);
        let new = self.store.events(None, last, 100).expect("events");
        assert_eq!(new.len(), 1, "exactly one denial event: {new:?}");
        let e = &new[0];
        assert_eq!(e.outcome, EventOutcome::Denied);
        assert_eq!(e.code, Some(code));
        assert_eq!(e.action, action);
        assert_eq!(e.task_id.as_deref(), event_task);
    }
}

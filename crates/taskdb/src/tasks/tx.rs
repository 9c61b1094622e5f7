//! The seam between the store's rules and a database engine.
//!
//! The rules (what a claim, a result, a decision or a retry extension may
//! do, which refusal wins, which event is written) are written once, in
//! `lifecycle`, `lease`, `retry` and `audit`, against [`Tx`]: a transaction
//! in progress at one store time. Each engine ([`super::sqlite`],
//! [`super::postgres`]) implements [`Backend`] and [`Tx`] with its own SQL
//! and nothing else, so both backends keep the same rules by construction
//! and the same test suites check them.

use super::fair::ClassHead;
use super::row::{RawEvent, RawRow, TaskRow};
use super::{Actor, EventOutcome, ReadScope, Submitter, TaskState};
use crate::error::StoreResult;
use airlock_proto::Code;
use airlock_proto::bus::AgentUsage;

/// A task to insert at attempt 0, revision 1, in `status`
/// ([`airlock_proto::states::SUBMITTED`]).
#[derive(Debug)]
pub struct NewTask<'a> {
    pub task_id: &'a str,
    pub status: TaskState,
    pub repository: &'a str,
    pub max_attempts: u32,
    pub binding_json: &'a str,
    pub plan_json: &'a str,
    pub envelope_json: &'a str,
    pub execution_digest: &'a str,
    pub plan_digest: &'a str,
    pub idempotency_key: &'a str,
    pub submission_sha256: &'a str,
    /// Who submitted it (never changed afterwards).
    pub submitter: &'a Submitter,
}

/// What must still hold for a row written back by [`Tx::update`]. Every
/// guard includes the revision the row was read at.
#[derive(Clone, Copy, Debug)]
pub enum Guard<'a> {
    /// Nothing but the revision (the row was read in this transaction).
    Revision,
    /// The writer's lease: RUNNING, this attempt, this lease epoch, this
    /// token hash, and an expiry after the transaction's time. A renewal or
    /// a result that matches no row has lost its lease.
    Lease {
        attempt: u32,
        lease_epoch: u64,
        token_hash: &'a str,
    },
    /// A decision on one attempt: this state, attempt and lease epoch (a
    /// verifying task holds no lease; its attempt and epoch still name
    /// which attempt the decision is about).
    Attempt {
        state: TaskState,
        attempt: u32,
        lease_epoch: u64,
    },
}

/// A result to record (append-only).
#[derive(Debug)]
pub struct NewResult<'a> {
    pub task_id: &'a str,
    pub idempotency_key: &'a str,
    pub attempt: u32,
    pub lease_epoch: i64,
    pub result_sha256: &'a str,
    pub result_json: &'a str,
    /// What its verification used, as `quota::verification_cpu_ms` reads it.
    pub cpu_ms: i64,
}

/// An event to append.
#[derive(Debug)]
pub struct NewEvent<'a> {
    pub task_id: Option<&'a str>,
    pub actor: &'a Actor,
    pub action: &'a str,
    pub outcome: EventOutcome,
    pub code: Option<Code>,
    pub payload_json: &'a str,
}

/// A stored retry extension, as a replay reads it back.
#[derive(Debug)]
pub struct StoredExtension {
    pub request_sha256: String,
    pub authorization_id: String,
    pub previous_verification_sha256: String,
    pub next_max_attempts: i64,
    pub applied_revision: i64,
}

/// The retry extension's conditional UPDATE: the task's new `status` (as
/// the store's one writer moved it), `next_max_attempts` and revision,
/// `claimed_by` and the lease cleared, where the task still is as read.
#[derive(Debug)]
pub struct ExtensionCas<'a> {
    pub task_id: &'a str,
    pub status: TaskState,
    pub expected_status: &'a str,
    pub expected_revision: i64,
    pub expected_attempt: i64,
    pub expected_max_attempts: i64,
    pub previous_claimed_by: Option<&'a str>,
    pub next_max_attempts: i64,
    pub applied_revision: i64,
}

/// A retry extension to record (append-only).
#[derive(Debug)]
pub struct NewExtension<'a> {
    pub task_id: &'a str,
    pub idempotency_key: &'a str,
    pub request_sha256: &'a str,
    pub authorization_id: &'a str,
    pub previous_verification_sha256: &'a str,
    pub previous_max_attempts: i64,
    pub next_max_attempts: i64,
    pub expected_revision: i64,
    pub applied_revision: i64,
}

/// A stored admin decision, as a replay reads it back.
#[derive(Debug)]
pub struct StoredDecision {
    pub request_sha256: String,
    /// The [`airlock_proto::task::DecisionOutcome`] answered when it applied.
    pub outcome_json: String,
}

/// An admin decision to record (append-only), in its own slot.
#[derive(Debug)]
pub struct NewDecision<'a> {
    pub task_id: &'a str,
    pub idempotency_key: &'a str,
    pub request_sha256: &'a str,
    pub decision: &'a str,
    pub attempt: i64,
    pub result_sha256: Option<&'a str>,
    pub applied_revision: i64,
    pub outcome_json: &'a str,
    pub actor_name: &'a str,
}

/// An administrator's resolution of a reconciliation case to record
/// (append-only), in its own slot.
#[derive(Debug)]
pub struct NewResolution<'a> {
    pub task_id: &'a str,
    pub idempotency_key: &'a str,
    pub request_sha256: &'a str,
    pub attempt: i64,
    pub resolution: &'a str,
    pub outcome_json: &'a str,
    pub actor_name: &'a str,
}

/// A reconciliation case to store under `(task_id, attempt)`.
#[derive(Debug)]
pub struct NewCase<'a> {
    pub task_id: &'a str,
    pub attempt: u32,
    pub status: &'a str,
    pub case_json: &'a str,
}

/// One page of a listing: what comes after `after` (a task id, or an
/// event id), at most `limit`, of what `scope` sees.
#[derive(Clone, Copy, Debug)]
pub struct Page<'a, After> {
    pub after: After,
    pub limit: u32,
    pub scope: &'a ReadScope,
}

impl<'a, After> Page<'a, After> {
    /// The page after `after` of what `scope` sees, `limit` clamped to
    /// [`super::MAX_PAGE`].
    pub fn new(after: After, limit: u32, scope: &'a ReadScope) -> Self {
        Page {
            after,
            limit: limit.min(super::MAX_PAGE),
            scope,
        }
    }
}

/// A transaction in progress. Everything it does commits together or not
/// at all; `now` is the store's time, fixed when the transaction began.
///
/// An engine finds rows and persists them; it never decides a task's
/// state (the rules move a row through [`TaskRow::advance`], the one
/// writer, and then write it back).
pub trait Tx {
    /// The store time of this transaction (unix ms).
    fn now(&self) -> i64;
    /// One task, locked for the rest of the transaction where the engine
    /// locks rows.
    fn load(&mut self, task_id: &str) -> StoreResult<Option<TaskRow>>;
    /// The task whose binding carries `key`, locked likewise.
    fn load_by_key(&mut self, key: &str) -> StoreResult<Option<TaskRow>>;
    /// Inserts a new task.
    fn insert_task(&mut self, t: &NewTask<'_>) -> StoreResult<()>;
    /// Writes the row's mutable columns (already bumped to the new
    /// revision) where the task still is at `read_revision` and `guard`
    /// holds. False when no row matched.
    fn update(&mut self, row: &TaskRow, read_revision: i64, guard: Guard<'_>) -> StoreResult<bool>;
    /// Every submitter class ([`super::fair::CLASS_SQL`]) with a claimable
    /// task (QUEUED, `attempt < max_attempts`, of one of `repositories`
    /// when given): its oldest such task's `seq`, its tasks RUNNING now and
    /// its last claim ([`Tx::mark_served`]), in no particular order.
    fn claimable_classes(&mut self, repositories: Option<&[String]>)
    -> StoreResult<Vec<ClassHead>>;
    /// Takes the class's lock for the rest of the transaction without
    /// waiting; false when another transaction holds it (an engine whose
    /// write transactions exclude each other answers true).
    fn try_lock_class(&mut self, class: &str) -> StoreResult<bool>;
    /// The oldest claimable task of `class` (as [`Tx::claimable_classes`]
    /// finds them), locked where the engine locks rows (rows another
    /// transaction holds are skipped), if the class has fewer than `cap`
    /// tasks RUNNING (0: no cap), counted in the same statement.
    fn oldest_of_class(
        &mut self,
        class: &str,
        repositories: Option<&[String]>,
        cap: u32,
    ) -> StoreResult<Option<TaskRow>>;
    /// Records that a claim took a task of `class` now.
    fn mark_served(&mut self, class: &str) -> StoreResult<()>;
    /// Takes the agent's submission lock for the rest of the transaction,
    /// waiting for another transaction that holds it (an engine whose
    /// write transactions exclude each other does nothing).
    fn lock_agent(&mut self, agent: &str) -> StoreResult<()>;
    /// What `agent` has used: the tasks it submitted after
    /// `tasks_after_ms`, the CPU milliseconds of its tasks' results
    /// received after `cpu_after_ms`, and its tasks RUNNING now.
    fn agent_usage(
        &mut self,
        agent: &str,
        tasks_after_ms: i64,
        cpu_after_ms: i64,
    ) -> StoreResult<AgentUsage>;
    /// Every QUEUED task, in queue order, locked where the engine locks
    /// rows (rows another transaction holds — a claim in flight — are
    /// skipped: they are no longer QUEUED when it commits).
    fn queued(&mut self) -> StoreResult<Vec<TaskRow>>;
    /// Every RUNNING task whose lease expired at `now` (or that has no
    /// expiry), in queue order, locked where the engine locks rows (rows
    /// another transaction holds are skipped).
    fn expired_leases(&mut self) -> StoreResult<Vec<TaskRow>>;
    /// The SHA-256 of the result stored under `(task_id, key)`.
    fn result_sha256(&mut self, task_id: &str, key: &str) -> StoreResult<Option<String>>;
    /// Records a result.
    fn insert_result(&mut self, r: &NewResult<'_>) -> StoreResult<()>;
    /// Appends an event.
    fn append_event(&mut self, e: &NewEvent<'_>) -> StoreResult<()>;
    /// The extension stored under `(task_id, key)`.
    fn extension(&mut self, task_id: &str, key: &str) -> StoreResult<Option<StoredExtension>>;
    /// The extension's compare-and-swap; rows changed.
    fn apply_extension(&mut self, cas: &ExtensionCas<'_>) -> StoreResult<u64>;
    /// Records an extension.
    fn insert_extension(&mut self, e: &NewExtension<'_>) -> StoreResult<()>;
    /// The decision stored under `(task_id, key)`.
    fn decision(&mut self, task_id: &str, key: &str) -> StoreResult<Option<StoredDecision>>;
    /// Records a decision.
    fn insert_decision(&mut self, d: &NewDecision<'_>) -> StoreResult<()>;
    /// The reconciliation case of `(task_id, attempt)` as JSON, or the
    /// task's latest case when `attempt` is `None`.
    fn case_json(&mut self, task_id: &str, attempt: Option<u32>) -> StoreResult<Option<String>>;
    /// Inserts or rewrites the case of `(task_id, attempt)`.
    fn put_case(&mut self, case: &NewCase<'_>) -> StoreResult<()>;
    /// Cases as JSON in `(task_id, attempt)` order, of the page's tasks
    /// (after a task id), only those in `status` when given.
    fn cases(
        &mut self,
        status: Option<&str>,
        page: Page<'_, Option<&str>>,
    ) -> StoreResult<Vec<String>>;
    /// The resolution stored under `(task_id, key)`.
    fn resolution(&mut self, task_id: &str, key: &str) -> StoreResult<Option<StoredDecision>>;
    /// Records a resolution (append-only).
    fn insert_resolution(&mut self, r: &NewResolution<'_>) -> StoreResult<()>;
    /// The stored policy record of the agent `name` (JSON), if any.
    fn agent_record(&mut self, name: &str) -> StoreResult<Option<String>>;
    /// Stores (inserts or replaces) the policy record of the agent `name`.
    fn put_agent_record(&mut self, name: &str, record_json: &str) -> StoreResult<()>;
}

/// A database engine under the store.
pub trait Backend: Send + std::fmt::Debug {
    /// Runs `f` in one transaction at the store's current time, committing
    /// only when it succeeds. An engine may run `f` again after a conflict
    /// it rolled back (a serialisation failure, a lost insert race); `f`
    /// must therefore not keep state between runs.
    fn write<T>(
        &mut self,
        what: &str,
        f: &mut dyn FnMut(&mut dyn Tx) -> StoreResult<T>,
    ) -> StoreResult<T>;
    /// The store's current time, without advancing anything.
    fn now_ms(&self) -> StoreResult<i64>;
    /// One task.
    fn get(&self, task_id: &str) -> StoreResult<Option<RawRow>>;
    /// A page of tasks by id (after a task id), only those in `state`
    /// when given.
    fn list(
        &self,
        state: Option<TaskState>,
        page: Page<'_, Option<&str>>,
    ) -> StoreResult<Vec<RawRow>>;
    /// (status, count) per state present.
    fn counts(&self) -> StoreResult<Vec<(String, i64)>>;
    /// A page of events; with a scope of one submitter, only the events
    /// of its tasks.
    fn events(&self, task_id: Option<&str>, page: Page<'_, i64>) -> StoreResult<Vec<RawEvent>>;
    /// Of the events about no task whose action is one of `actions` and
    /// whose payload's `key` is a string, the newest of each such string,
    /// in id order.
    fn newest_untasked(&self, actions: &[&str], key: &str) -> StoreResult<Vec<RawEvent>>;
    /// The id of the newest event (0 when there is none).
    fn last_event_id(&self) -> StoreResult<i64>;
    /// The engine's own consistency check.
    fn integrity_check(&self) -> StoreResult<()>;
}

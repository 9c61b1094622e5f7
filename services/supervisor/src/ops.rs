//! What the D-Bus methods do once authorised.
//!
//! Each operation takes the [`Authorized`] token of the permission it needs,
//! so a handler cannot reach the task store without having passed the
//! [`crate::authz::Gatekeeper`]. The store ([`crate::store::Store`]) runs
//! one short transaction at a time: a reply is sent only after its change
//! is committed (SQLite `synchronous=FULL`; PostgreSQL's commit).

use crate::authz::{
    AgentsManage, AgentsRead, Authorized, Manage, Read, ReconcileManage, Retry, Scope, Submit,
    Worker,
};
pub use crate::store::{Store, store_error};
use airlock_proto::Error;
use airlock_proto::bus::{AgentLimits, EventCount, FenceGrant, FenceRequest};
use airlock_proto::plan::PlanRequest;
use airlock_proto::reconcile::{
    AdoptionCheck, AdoptionReport, CaseStatus, ReconciliationCase, ResolveOutcome, ResolveRequest,
};
use airlock_proto::retry::{RetryExtensionOutcome, RetryExtensionRequest};
use airlock_proto::task::{
    ClaimGrant, DecisionOutcome, DecisionRequest, TaskPlan, TaskResult, TaskState, TaskSubmission,
    TaskView,
};
use airlock_taskdb::tasks::{
    Actor, AgentQuota, Event, QueueSummary, ResultReceipt, RunningCaps, Submitted, Submitter,
};
use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError, RwLock};

/// The operations behind the bus methods.
#[derive(Clone, Debug)]
pub struct Ops {
    store: Store,
    lease_ms: i64,
    auto_accept: bool,
    shared_queue: bool,
    /// The caps on running tasks and the agents' quotas, from the
    /// configuration (set at start and on every reload).
    limits: Arc<RwLock<Limits>>,
}

/// What the configuration limits: the caps a claim passes over and each
/// agent's quotas, which a submission must fit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// `supervisor.max_running_per_submitter` and each agent's `max_running`.
    pub caps: RunningCaps,
    /// Each configured agent's `tasks_per_hour` and `cpu_seconds_per_day`.
    pub quotas: BTreeMap<String, AgentQuota>,
}

impl Limits {
    /// The limits `max_running_per_submitter` and the `[[agent]]` tables
    /// set.
    pub fn of(max_running_per_submitter: u32, agents: &[airlock_config::Agent]) -> Limits {
        Limits {
            caps: RunningCaps {
                per_submitter: max_running_per_submitter,
                per_agent: agents
                    .iter()
                    .filter(|a| a.max_running > 0)
                    .map(|a| (a.name.clone(), a.max_running))
                    .collect(),
            },
            quotas: agents
                .iter()
                .map(|a| {
                    let quota = AgentQuota {
                        tasks_per_hour: a.tasks_per_hour,
                        cpu_seconds_per_day: a.cpu_seconds_per_day,
                    };
                    (a.name.clone(), quota)
                })
                .filter(|(_, q)| !q.is_none())
                .collect(),
        }
    }

    /// The quota of the agent `agent` (none for a caller that is no agent,
    /// or an agent no longer configured).
    pub fn quota_of(&self, agent: Option<&str>) -> AgentQuota {
        agent
            .and_then(|a| self.quotas.get(a))
            .copied()
            .unwrap_or(AgentQuota::NONE)
    }
}

impl Ops {
    /// Operations on `store`, granting leases of `lease_seconds` and, when
    /// `auto_accept`, accepting a passed result at once.
    pub fn new(store: Store, lease_seconds: u32, auto_accept: bool) -> Self {
        Ops {
            store,
            lease_ms: i64::from(lease_seconds) * 1000,
            auto_accept,
            shared_queue: false,
            limits: Arc::default(),
        }
    }

    /// Replaces the caps and quotas (at start, and on a reload): the next
    /// claim and submission see them.
    pub fn set_limits(&self, limits: Limits) {
        *self.limits.write().unwrap_or_else(PoisonError::into_inner) = limits;
    }

    /// The caps and quotas now.
    pub fn limits(&self) -> Limits {
        self.limits
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// GetAgentLimits: the quotas and cap of the configured agent `agent`
    /// (the caller checked that it is one), and its use of them counted by
    /// the store now.
    pub async fn agent_limits(
        &self,
        _auth: &Authorized<AgentsRead>,
        agent: String,
    ) -> Result<AgentLimits, Error> {
        let limits = self.limits();
        let quota = limits.quota_of(Some(&agent));
        let max_running = limits.caps.of_agent(&agent);
        let name = agent.clone();
        let usage = self.store.call(move |s| s.agent_usage(&name)).await?;
        Ok(AgentLimits {
            name: agent,
            tasks_per_hour: quota.tasks_per_hour,
            cpu_seconds_per_day: quota.cpu_seconds_per_day,
            max_running,
            usage,
        })
    }

    /// Marks the store as a queue other hosts share (PostgreSQL): a
    /// repository this host stops serving may still be served by others.
    pub fn with_shared_queue(mut self, shared: bool) -> Self {
        self.shared_queue = shared;
        self
    }

    /// Whether other hosts share this queue.
    pub fn shared_queue(&self) -> bool {
        self.shared_queue
    }

    /// Events after `after_event_id`, oldest first, for the journal export
    /// (no caller: the supervisor reads its own log).
    pub(crate) async fn events_after(
        &self,
        after_event_id: i64,
        limit: u32,
    ) -> Result<Vec<Event>, Error> {
        self.store
            .call(move |s| s.events(None, after_event_id, limit))
            .await
    }

    /// The newest event's id (0 for an empty log).
    pub(crate) async fn last_event_id(&self) -> Result<i64, Error> {
        self.store.call(|s| s.last_event_id()).await
    }

    /// SubmitTask: a planner agent's submission must fit its quotas
    /// (`AGENT_QUOTA_EXCEEDED`, counted by the store in the submission's
    /// transaction and recorded there as a denial).
    pub async fn submit(
        &self,
        auth: &Authorized<Submit>,
        submission: TaskSubmission,
    ) -> Result<Submitted, Error> {
        let actor = auth.actor().clone();
        let quota = self.limits().quota_of(actor.agent());
        self.store
            .call(move |s| s.submit_within(&submission, &actor, &quota))
            .await
    }

    /// ReplacePlan.
    pub async fn replace_plan(
        &self,
        auth: &Authorized<Submit>,
        task_id: String,
        plan: PlanRequest,
    ) -> Result<TaskView, Error> {
        let actor = auth.actor().clone();
        self.store
            .call(move |s| s.replace_plan(&task_id, &plan, &actor))
            .await
    }

    /// The repository of task `task_id` and who submitted it (the task's
    /// submitter columns, filled from its `TASK_SUBMITTED` event for tasks
    /// older than them), for binding a ReplacePlan to the caller's own
    /// tasks. Neither changes once the task exists, so the answer cannot
    /// go stale before the replacement it guards.
    pub async fn submission_of(
        &self,
        _auth: &Authorized<Submit>,
        task_id: String,
    ) -> Result<(String, Option<Submitter>), Error> {
        self.store
            .call(move |s| {
                let view = s.get(&task_id)?;
                Ok((view.binding.repository, view.submitter))
            })
            .await
    }

    /// Who submitted `task_id` (no caller: for addressing `TaskChanged`
    /// to those who may read it); `None` when it is not on record.
    pub(crate) async fn submitter_of(&self, task_id: String) -> Result<Option<Submitter>, Error> {
        self.store
            .call(move |s| s.get(&task_id).map(|v| v.submitter))
            .await
    }

    /// GetTask: a task outside `scope` is TASK_NOT_FOUND, as one that
    /// does not exist.
    pub async fn get(
        &self,
        _auth: &Authorized<Read>,
        scope: &Scope,
        task_id: String,
    ) -> Result<TaskView, Error> {
        let scope = scope.read_scope().clone();
        self.store.call(move |s| s.get_as(&task_id, &scope)).await
    }

    /// GetPlan: bound as [`Self::get`], a task outside `scope` is
    /// TASK_NOT_FOUND, as one that does not exist.
    pub async fn plan(
        &self,
        _auth: &Authorized<Read>,
        scope: &Scope,
        task_id: String,
    ) -> Result<TaskPlan, Error> {
        let scope = scope.read_scope().clone();
        self.store.call(move |s| s.plan_as(&task_id, &scope)).await
    }

    /// ListTasks, of the tasks `scope` sees.
    pub async fn list(
        &self,
        _auth: &Authorized<Read>,
        scope: &Scope,
        state: Option<TaskState>,
        after_task_id: Option<String>,
        limit: u32,
    ) -> Result<Vec<TaskView>, Error> {
        let scope = scope.read_scope().clone();
        self.store
            .call(move |s| s.list_as(state, after_task_id.as_deref(), limit, &scope))
            .await
    }

    /// ListEvents, of the tasks `scope` sees.
    pub async fn events(
        &self,
        _auth: &Authorized<Read>,
        scope: &Scope,
        task_id: Option<String>,
        after_event_id: i64,
        limit: u32,
    ) -> Result<Vec<Event>, Error> {
        let scope = scope.read_scope().clone();
        self.store
            .call(move |s| s.events_as(task_id.as_deref(), after_event_id, limit, &scope))
            .await
    }

    /// CountEvents: the events of `task_id` that `scope` sees, counted
    /// page by page in one store call (as ListEvents pages them: another's
    /// task counts none).
    pub async fn count_events(
        &self,
        _auth: &Authorized<Read>,
        scope: &Scope,
        task_id: String,
    ) -> Result<EventCount, Error> {
        use airlock_taskdb::tasks::{EventOutcome, MAX_PAGE};
        let scope = scope.read_scope().clone();
        self.store
            .call(move |s| {
                let mut count = EventCount {
                    task_id: task_id.clone(),
                    events: 0,
                    denied: 0,
                    by_action: BTreeMap::new(),
                };
                let mut after = 0;
                loop {
                    let page = s.events_as(Some(&task_id), after, MAX_PAGE, &scope)?;
                    for e in &page {
                        count.events += 1;
                        count.denied += u64::from(e.outcome == EventOutcome::Denied);
                        *count.by_action.entry(e.action.clone()).or_default() += 1;
                    }
                    match page.last() {
                        Some(last) if page.len() >= MAX_PAGE as usize => after = last.id,
                        _ => return Ok(count),
                    }
                }
            })
            .await
    }

    /// ListRepositories: the newest event about no task among `actions`
    /// of each repository that has one, by name. About no task, so no
    /// scope applies.
    pub async fn last_repository_events(
        &self,
        _auth: &Authorized<Read>,
        actions: Vec<&'static str>,
    ) -> Result<BTreeMap<String, Event>, Error> {
        self.store
            .call(move |s| s.last_repository_events(&actions))
            .await
    }

    /// Verify and CancelTask.
    pub async fn decide(
        &self,
        auth: &Authorized<Manage>,
        task_id: String,
        req: DecisionRequest,
    ) -> Result<DecisionOutcome, Error> {
        let actor = auth.actor().clone();
        self.store
            .call(move |s| s.decide(&task_id, &req, &actor))
            .await
    }

    /// Claim: a claimable task of `repositories` (the ones this host
    /// serves now: on a queue shared with other hosts, another host's
    /// repositories are not ours to claim), fairly between submitters and
    /// within the configured caps on running tasks (the store's
    /// `claim_within`).
    pub async fn claim(
        &self,
        auth: &Authorized<Worker>,
        repositories: Vec<String>,
    ) -> Result<Option<ClaimGrant>, Error> {
        let actor = auth.actor().clone();
        let lease_ms = self.lease_ms;
        let caps = self.limits().caps;
        self.store
            .call(move |s| s.claim_within(&actor, lease_ms, Some(&repositories), &caps))
            .await
    }

    /// Renew.
    pub async fn renew(
        &self,
        auth: &Authorized<Worker>,
        task_id: String,
        lease_epoch: u64,
        lease_token: String,
    ) -> Result<i64, Error> {
        let actor = auth.actor().clone();
        let lease_ms = self.lease_ms;
        self.store
            .call(move |s| s.renew(&task_id, lease_epoch, &lease_token, lease_ms, &actor))
            .await
    }

    /// Fence.
    pub async fn fence(
        &self,
        auth: &Authorized<Worker>,
        task_id: String,
        lease_epoch: u64,
        lease_token: String,
        req: FenceRequest,
    ) -> Result<FenceGrant, Error> {
        let actor = auth.actor().clone();
        self.store
            .call(move |s| s.fence(&task_id, lease_epoch, &lease_token, &req, &actor))
            .await
    }

    /// SubmitResult.
    pub async fn submit_result(
        &self,
        auth: &Authorized<Worker>,
        task_id: String,
        lease_epoch: u64,
        lease_token: String,
        idempotency_key: String,
        result: TaskResult,
    ) -> Result<ResultReceipt, Error> {
        let actor = auth.actor().clone();
        let auto_accept = self.auto_accept;
        self.store
            .call(move |s| {
                s.submit_result(
                    &task_id,
                    lease_epoch,
                    &lease_token,
                    &idempotency_key,
                    &result,
                    auto_accept,
                    &actor,
                )
            })
            .await
    }

    /// ListReconciliations, of the tasks `scope` sees.
    pub async fn reconciliations(
        &self,
        _auth: &Authorized<Read>,
        scope: &Scope,
        status: Option<CaseStatus>,
        after_task_id: Option<String>,
        limit: u32,
    ) -> Result<Vec<ReconciliationCase>, Error> {
        let scope = scope.read_scope().clone();
        self.store
            .call(move |s| s.reconciliations_as(status, after_task_id.as_deref(), limit, &scope))
            .await
    }

    /// GetReconciliation: the case of a task outside `scope` is
    /// RECONCILIATION_NOT_FOUND, as for a task with none.
    pub async fn reconciliation(
        &self,
        _auth: &Authorized<Read>,
        scope: &Scope,
        task_id: String,
    ) -> Result<ReconciliationCase, Error> {
        let scope = scope.read_scope().clone();
        self.store
            .call(move |s| s.reconciliation_as(&task_id, &scope))
            .await
    }

    /// ResolveReconciliation.
    pub async fn resolve(
        &self,
        auth: &Authorized<ReconcileManage>,
        task_id: String,
        req: ResolveRequest,
    ) -> Result<ResolveOutcome, Error> {
        let actor = auth.actor().clone();
        self.store
            .call(move |s| s.resolve_reconciliation(&task_id, &req, &actor))
            .await
    }

    /// TakeAdoption.
    pub async fn take_adoption(
        &self,
        _auth: &Authorized<Worker>,
    ) -> Result<Option<AdoptionCheck>, Error> {
        self.store.call(|s| s.take_adoption()).await
    }

    /// SettleAdoption.
    pub async fn settle_adoption(
        &self,
        auth: &Authorized<Worker>,
        report: AdoptionReport,
    ) -> Result<ReconciliationCase, Error> {
        let actor = auth.actor().clone();
        self.store
            .call(move |s| s.settle_adoption(&report, &actor))
            .await
    }

    /// ReportUpstream: the worker's upstream fact, as its event.
    pub async fn record_upstream(
        &self,
        auth: &Authorized<Worker>,
        report: airlock_proto::upstream::UpstreamReport,
    ) -> Result<(), Error> {
        let actor = auth.actor().clone();
        self.store
            .call(move |s| s.record_upstream(&actor, &report))
            .await
    }

    /// ExtendRetry: the store's one-step, compare-and-swap transaction
    /// (a refusal is recorded by the store itself, with its code).
    pub async fn extend_retry(
        &self,
        _auth: &Authorized<Retry>,
        task_id: String,
        request: RetryExtensionRequest,
        authorization_id: String,
    ) -> Result<RetryExtensionOutcome, Error> {
        self.store
            .call(move |s| s.extend_retry(&task_id, &request, &authorization_id))
            .await
    }

    /// The lease sweeper's pass (airlock itself acts; no caller).
    pub async fn sweep(&self) -> Result<Vec<(String, TaskState)>, Error> {
        self.store.call(|s| s.sweep_expired()).await
    }

    /// Fails the queued tasks of repositories not in `registered` (airlock
    /// itself acts, after a start or a reload).
    pub async fn fail_unregistered(&self, registered: Vec<String>) -> Result<Vec<String>, Error> {
        self.store
            .call(move |s| s.fail_unregistered(&registered))
            .await
    }

    /// Cancels the queued tasks the agent `agent` submitted: all of them
    /// (`keep` = `None`), or those for repositories not in `keep`, with
    /// AGENT_REVOKED, as `actor` (airlock itself after a reload, or the
    /// operator).
    pub async fn cancel_agent_queued(
        &self,
        agent: String,
        keep: Option<Vec<String>>,
        reason: String,
        actor: Actor,
    ) -> Result<Vec<String>, Error> {
        self.store
            .call(move |s| s.cancel_agent_queued(&agent, keep.as_deref(), &reason, &actor))
            .await
    }

    /// Records an operator's CancelQueued of the agent `agent`: the reason
    /// and the tasks cancelled (each has its own TASK_CANCELLED).
    pub async fn record_agent_queue_cancelled(
        &self,
        auth: &Authorized<AgentsManage>,
        action: &'static str,
        agent: String,
        reason: String,
        cancelled: Vec<String>,
    ) -> Result<(), Error> {
        let actor = auth.actor().clone();
        let payload = serde_json::json!({
            "agent": agent,
            "reason": reason,
            "code": airlock_proto::Code::AGENT_REVOKED.as_str(),
            "cancelled": cancelled,
        });
        self.store
            .call(move |s| s.record_allowed(&actor, action, &payload))
            .await
    }

    /// Records an operator's command to the planner agent `agent` (the
    /// policy's own changes follow as AGENT_CHANGED events).
    pub async fn record_agent_command(
        &self,
        auth: &Authorized<AgentsManage>,
        action: &'static str,
        agent: String,
    ) -> Result<(), Error> {
        let actor = auth.actor().clone();
        self.store
            .call(move |s| s.record_allowed(&actor, action, &serde_json::json!({ "agent": agent })))
            .await
    }

    /// The store itself (the agent runners keep their records in it).
    pub fn store(&self) -> Store {
        self.store.clone()
    }

    /// Counts per state, for the queue-summary properties and the status
    /// line. Counts only: no task content, so no authorisation.
    pub async fn summary(&self) -> Result<QueueSummary, Error> {
        self.store.call(|s| s.summary()).await
    }

    /// The state and revision of a task, for the TaskChanged signal after a
    /// change made by the worker or the sweeper.
    pub async fn signal_facts(&self, task_id: String) -> Result<(TaskState, i64), Error> {
        self.store
            .call(move |s| s.get(&task_id).map(|v| (v.state, v.revision)))
            .await
    }

    /// A cheap round trip through the store, for the watchdog: the ping
    /// stops when the store stops answering.
    pub async fn probe(&self) -> Result<(), Error> {
        self.store.call(|s| s.now_ms().map(|_| ())).await
    }
}

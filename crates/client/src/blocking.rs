//! The same client for ordinary threads: each call is driven to completion
//! on a tokio runtime the caller owns or lends.

use crate::Supervisor as Async;
use airlock_proto::Error;
use airlock_proto::bus::{
    EventPage, LeaseRef, RepositoryList, ResultReceipt, SubmitReply, TaskPage,
};
use airlock_proto::reconcile::{
    AdoptionCheck, AdoptionReport, ReconciliationCase, ReconciliationPage, ResolveOutcome,
    ResolveRequest,
};
use airlock_proto::retry::{RetryExtensionOutcome, RetryExtensionRequest};
use airlock_proto::task::{
    ClaimGrant, DecisionOutcome, DecisionRequest, TaskPlan, TaskResult, TaskView,
};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::{Handle, Runtime};

#[derive(Debug)]
enum Rt {
    Owned(Runtime),
    Lent(Handle),
}

/// A blocking connection to the supervisor. Clones share the connection.
#[derive(Debug, Clone)]
pub struct Supervisor {
    rt: Arc<Rt>,
    inner: Async,
}

impl Supervisor {
    /// Connects on a runtime of its own (current-thread).
    pub fn connect(address: Option<&str>) -> Result<Supervisor, Error> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::with(airlock_proto::Code::INTERNAL, e.to_string()))?;
        let inner = rt.block_on(Async::connect(address))?;
        Ok(Supervisor {
            rt: Arc::new(Rt::Owned(rt)),
            inner,
        })
    }

    /// Connects on the runtime behind `handle` (a multi-thread runtime
    /// that keeps driving the connection between calls).
    pub fn connect_on(handle: Handle, address: Option<&str>) -> Result<Supervisor, Error> {
        let inner = handle.block_on(Async::connect(address))?;
        Ok(Supervisor {
            rt: Arc::new(Rt::Lent(handle)),
            inner,
        })
    }

    /// Bounds every call by `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.inner = self.inner.with_timeout(timeout);
        self
    }

    /// The async client underneath.
    pub fn inner(&self) -> &Async {
        &self.inner
    }

    /// Runs `f` to completion.
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        match &*self.rt {
            Rt::Owned(rt) => rt.block_on(f),
            Rt::Lent(h) => h.block_on(f),
        }
    }

    /// The runtime handle, to spawn signal followers on.
    pub fn handle(&self) -> Handle {
        match &*self.rt {
            Rt::Owned(rt) => rt.handle().clone(),
            Rt::Lent(h) => h.clone(),
        }
    }

    /// `SubmitTask`.
    pub fn submit_task(&self, submission: &serde_json::Value) -> Result<SubmitReply, Error> {
        self.block_on(self.inner.submit_task(submission))
    }

    /// `ReplacePlan`.
    pub fn replace_plan(&self, task_id: &str, plan: &serde_json::Value) -> Result<TaskView, Error> {
        self.block_on(self.inner.replace_plan(task_id, plan))
    }

    /// `GetTask`.
    pub fn get_task(&self, task_id: &str) -> Result<TaskView, Error> {
        self.block_on(self.inner.get_task(task_id))
    }

    /// `GetPlan`.
    pub fn get_plan(&self, task_id: &str) -> Result<TaskPlan, Error> {
        self.block_on(self.inner.get_plan(task_id))
    }

    /// `ListTasks`.
    pub fn list_tasks(&self, state: &str, after: &str, limit: u32) -> Result<TaskPage, Error> {
        self.block_on(self.inner.list_tasks(state, after, limit))
    }

    /// `ListEvents`.
    pub fn list_events(&self, task_id: &str, after: i64, limit: u32) -> Result<EventPage, Error> {
        self.block_on(self.inner.list_events(task_id, after, limit))
    }

    /// `ListRepositories`.
    pub fn list_repositories(&self) -> Result<RepositoryList, Error> {
        self.block_on(self.inner.list_repositories())
    }

    /// `CancelTask`.
    pub fn cancel_task(&self, req: &DecisionRequest) -> Result<DecisionOutcome, Error> {
        self.block_on(self.inner.cancel_task(req))
    }

    /// `Verify`.
    pub fn verify(&self, req: &DecisionRequest) -> Result<DecisionOutcome, Error> {
        self.block_on(self.inner.verify(req))
    }

    /// `Claim`.
    pub fn claim(&self) -> Result<Option<ClaimGrant>, Error> {
        self.block_on(self.inner.claim())
    }

    /// `Renew`.
    pub fn renew(&self, lease: &LeaseRef) -> Result<i64, Error> {
        self.block_on(self.inner.renew(lease))
    }

    /// `SubmitResult`.
    pub fn submit_result(
        &self,
        lease: &LeaseRef,
        key: &str,
        result: &TaskResult,
    ) -> Result<ResultReceipt, Error> {
        self.block_on(self.inner.submit_result(lease, key, result))
    }

    /// `ListReconciliations`.
    pub fn list_reconciliations(
        &self,
        status: &str,
        after: &str,
        limit: u32,
    ) -> Result<ReconciliationPage, Error> {
        self.block_on(self.inner.list_reconciliations(status, after, limit))
    }

    /// `GetReconciliation`.
    pub fn get_reconciliation(&self, task_id: &str) -> Result<ReconciliationCase, Error> {
        self.block_on(self.inner.get_reconciliation(task_id))
    }

    /// `ResolveReconciliation`.
    pub fn resolve_reconciliation(&self, req: &ResolveRequest) -> Result<ResolveOutcome, Error> {
        self.block_on(self.inner.resolve_reconciliation(req))
    }

    /// `TakeAdoption`.
    pub fn take_adoption(&self) -> Result<Option<AdoptionCheck>, Error> {
        self.block_on(self.inner.take_adoption())
    }

    /// `SettleAdoption`.
    pub fn report_upstream(
        &self,
        report: &airlock_proto::upstream::UpstreamReport,
    ) -> Result<(), Error> {
        self.block_on(self.inner.report_upstream(report))
    }

    /// `SettleAdoption`: what the ref holds; the case as it is now.
    pub fn settle_adoption(&self, report: &AdoptionReport) -> Result<ReconciliationCase, Error> {
        self.block_on(self.inner.settle_adoption(report))
    }

    /// `ExtendRetry`.
    pub fn extend_retry(
        &self,
        task_id: &str,
        request: &RetryExtensionRequest,
        authorization_id: &str,
    ) -> Result<RetryExtensionOutcome, Error> {
        self.block_on(self.inner.extend_retry(task_id, request, authorization_id))
    }

    /// Repeats `call` while the supervisor is unreachable (restarting), for
    /// up to `patience`; a refusal is returned at once.
    pub fn patiently<T>(
        &self,
        patience: Duration,
        mut call: impl FnMut(&Self) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let deadline = Instant::now() + patience;
        loop {
            match call(self) {
                Err(e)
                    if e.code == airlock_proto::Code::RUNTIME_UNAVAILABLE
                        && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(100))
                }
                other => return other,
            }
        }
    }
}

//! `org.airlock.Worker1`: the credentialed worker, admitted by peer uid.
//!
//! Same steps as Tasks1, but the rows reserve every method for the
//! caller's unix uid as the bus daemon reports it (`PEER_UID_DENIED` for
//! anyone but the configured worker). Leases are fenced by epoch and bound
//! to a bearer token only the claimant saw.

use super::error::BusError;
use super::tasks::announce;
use super::{Shared, parse_json};
use crate::authz::Scope;
use crate::authz::Worker as WorkerPermission;
use airlock_proto::bus::worker as rows;
use airlock_proto::bus::{FenceRequest, ResultReceipt};
use airlock_proto::reconcile::AdoptionReport;
use airlock_proto::task::TaskResult;
use airlock_proto::upstream::UpstreamReport;
use airlock_proto::{Code, Error};
use std::sync::Arc;
use zbus::message::Header;
use zbus::object_server::SignalEmitter;
use zbus::{Connection, interface};

/// The Worker1 interface object.
#[derive(Debug)]
pub struct Worker {
    shared: Arc<Shared>,
}

impl Worker {
    /// The interface over `shared`.
    pub fn new(shared: Arc<Shared>) -> Self {
        Worker { shared }
    }
}

#[interface(name = "org.airlock.Worker1")]
impl Worker {
    /// Claims the oldest QUEUED task: a new attempt under a fresh lease.
    /// Returns the grant as JSON (`task_id`, `attempt`, `lease_epoch`,
    /// `lease_token` — shown once —, `lease_expires_at_ms`, `envelope`),
    /// or `null` when nothing is claimable.
    async fn claim(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        #[zbus(signal_emitter)] emitter: SignalEmitter<'_>,
    ) -> Result<String, BusError> {
        let call = self
            .shared
            .enter::<rows::Claim, WorkerPermission>(conn, &hdr, None)
            .await?;
        // The worker hears of every change (it claims any task).
        self.shared
            .watchers
            .watch(call.caller.sender(), Scope::of_worker(&call.auth));
        let grant = self
            .shared
            .ops
            .claim(&call.auth, self.shared.repositories())
            .await?;
        if let Some(g) = &grant {
            if let Ok((state, revision)) = self.shared.ops.signal_facts(g.task_id.clone()).await {
                announce(&self.shared, &emitter, &g.task_id, state, revision).await;
            }
        }
        call.reply(&grant)
    }

    /// Extends the caller's lease; returns the new expiry (unix ms). An
    /// older epoch is LEASE_EPOCH_STALE, a wrong token LEASE_INVALID, an
    /// expired lease LEASE_EXPIRED (never revived).
    async fn renew(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        task_id: String,
        lease_epoch: u64,
        lease_token: String,
    ) -> Result<i64, BusError> {
        let call = self
            .shared
            .enter::<rows::Renew, WorkerPermission>(conn, &hdr, Some(&task_id))
            .await?;
        Ok(self
            .shared
            .ops
            .renew(&call.auth, task_id, lease_epoch, lease_token)
            .await?)
    }

    /// Sets or releases the fence of the caller's attempt (a
    /// [`airlock_proto::bus::FenceRequest`] as JSON) under its current
    /// lease: while it stands the task is not cancelled and its lease does
    /// not expire. Returns the [`airlock_proto::bus::FenceGrant`] as JSON.
    async fn fence(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        task_id: String,
        lease_epoch: u64,
        lease_token: String,
        request: String,
    ) -> Result<String, BusError> {
        let call = self
            .shared
            .enter::<rows::Fence, WorkerPermission>(conn, &hdr, Some(&task_id))
            .await?;
        let parsed = parse_json(&request, "the fence request").and_then(|v| {
            serde_json::from_value::<FenceRequest>(v)
                .map_err(|e| Error::with(Code::MESSAGE_INVALID, format!("the fence request: {e}")))
        });
        let req = call.checked(parsed).await?;
        let grant = self
            .shared
            .ops
            .fence(&call.auth, task_id, lease_epoch, lease_token, req)
            .await?;
        call.reply(&grant)
    }

    /// Submits the result (`airlock.task-result.v1` JSON) of the attempt
    /// the lease belongs to. Returns `{"task": <task>, "idempotent":
    /// <bool>}`; the byte-identical result under the same idempotency key
    /// is a replay. The task goes to VERIFYING, or straight to SUCCEEDED
    /// when auto_accept is on and every verification command passed.
    #[allow(clippy::too_many_arguments)] // the D-Bus signature, plus zbus's injected context
    async fn submit_result(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        #[zbus(signal_emitter)] emitter: SignalEmitter<'_>,
        task_id: String,
        lease_epoch: u64,
        lease_token: String,
        idempotency_key: String,
        result: String,
    ) -> Result<String, BusError> {
        let call = self
            .shared
            .enter::<rows::SubmitResult, WorkerPermission>(conn, &hdr, Some(&task_id))
            .await?;
        let parsed = parse_json(&result, "the result").and_then(|v| {
            serde_json::from_value::<TaskResult>(v)
                .map_err(|e| Error::with(Code::MESSAGE_INVALID, format!("the result: {e}")))
        });
        let result = call.checked(parsed).await?;
        let receipt = self
            .shared
            .ops
            .submit_result(
                &call.auth,
                task_id,
                lease_epoch,
                lease_token,
                idempotency_key,
                result,
            )
            .await?;
        if !receipt.idempotent {
            announce(
                &self.shared,
                &emitter,
                &receipt.task.task_id,
                receipt.task.state,
                receipt.task.revision,
            )
            .await;
        }
        call.reply(&ResultReceipt {
            task: receipt.task,
            idempotent: receipt.idempotent,
        })
    }

    /// A reconciliation case an administrator chose to adopt, for the
    /// worker to check against the ref (`task_id`, `attempt`,
    /// `repository`, `branch`, `observed_head`, `base_oid`), or `null`.
    /// Reading it changes nothing.
    async fn take_adoption(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<String, BusError> {
        let call = self
            .shared
            .enter::<rows::TakeAdoption, WorkerPermission>(conn, &hdr, None)
            .await?;
        let check = self.shared.ops.take_adoption(&call.auth).await?;
        call.reply(&check)
    }

    /// What the worker found on the ref for an adoption it took
    /// (`airlock.reconcile::AdoptionReport` JSON). The branch still at the
    /// head and the head descending from the task's base: the case is
    /// adopted and the task SUCCEEDED; otherwise the case opens again with
    /// the head found and the refusal's code. Returns the case as it is now.
    async fn settle_adoption(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        #[zbus(signal_emitter)] emitter: SignalEmitter<'_>,
        report: String,
    ) -> Result<String, BusError> {
        let task_id = parse_json(&report, "the report")
            .ok()
            .and_then(|v| v["task_id"].as_str().map(str::to_owned));
        let call = self
            .shared
            .enter::<rows::SettleAdoption, WorkerPermission>(conn, &hdr, task_id.as_deref())
            .await?;
        let parsed = parse_json(&report, "the report").and_then(|v| {
            serde_json::from_value::<AdoptionReport>(v)
                .map_err(|e| Error::with(Code::MESSAGE_INVALID, format!("the report: {e}")))
        });
        let report = call.checked(parsed).await?;
        let case = self.shared.ops.settle_adoption(&call.auth, report).await?;
        if case.status == airlock_proto::reconcile::CaseStatus::Adopted {
            if let Ok((state, revision)) = self.shared.ops.signal_facts(case.task_id.clone()).await
            {
                announce(&self.shared, &emitter, &case.task_id, state, revision).await;
            }
        }
        call.reply(&case)
    }

    /// What happened with an upstream (`airlock_proto::upstream::
    /// UpstreamReport` JSON): recorded in the event log as the event its
    /// kind names (UPSTREAM_SYNCED, UPSTREAM_SYNC_FAILED,
    /// UPSTREAM_REF_REWRITTEN, TASK_PUBLICATION_PENDING, TASK_PUBLISHED),
    /// under its task for a publication. Nothing else changes.
    async fn report_upstream(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        report: String,
    ) -> Result<(), BusError> {
        let task_id = parse_json(&report, "the report")
            .ok()
            .and_then(|v| v["task_id"].as_str().map(str::to_owned));
        let call = self
            .shared
            .enter::<rows::ReportUpstream, WorkerPermission>(conn, &hdr, task_id.as_deref())
            .await?;
        let parsed = parse_json(&report, "the report").and_then(|v| {
            serde_json::from_value::<UpstreamReport>(v)
                .map_err(|e| Error::with(Code::MESSAGE_INVALID, format!("the report: {e}")))
                .and_then(|r| r.validate().map(|_| r))
        });
        let report = call.checked(parsed).await?;
        self.shared.ops.record_upstream(&call.auth, report).await?;
        Ok(())
    }
}

//! `org.airlock.Reconcile1`: reconciliation cases (an attempt whose branch
//! moved behind the worker's back), for admins, authorised by polkit:
//! reading needs `org.airlock.tasks.read`, resolving
//! `org.airlock.reconcile.manage`.
//!
//! Same steps as Tasks1: enter with the row, parse strictly, act through
//! [`crate::ops`], announce a task change with `TaskChanged`.

use super::error::BusError;
use super::tasks::announce;
use super::{DEFAULT_PAGE, Shared, non_empty, parse_json};
use crate::authz::{Read, ReconcileManage};
use airlock_proto::bus::reconcile as rows;
use airlock_proto::reconcile::{CaseStatus, ReconciliationPage, ResolveRequest};
use airlock_proto::{Code, Error};
use std::sync::Arc;
use zbus::message::Header;
use zbus::object_server::SignalEmitter;
use zbus::{Connection, interface};

/// The Reconcile1 interface object.
#[derive(Debug)]
pub struct Reconcile {
    shared: Arc<Shared>,
}

impl Reconcile {
    /// The interface over `shared`.
    pub fn new(shared: Arc<Shared>) -> Self {
        Reconcile { shared }
    }
}

#[interface(name = "org.airlock.Reconcile1")]
impl Reconcile {
    /// Cases ordered by task id and attempt: `status` filters (`open`,
    /// `adopting`, `adopted`, `failed`; `""` = all), `after_task_id` pages
    /// (`""` = from the start), `limit` 0 means 100 (at most 1000).
    /// Returns `{"cases": [...], "next_after": <task id or null>}`. Needs
    /// `org.airlock.tasks.read`.
    async fn list_reconciliations(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        status: String,
        after_task_id: String,
        limit: u32,
    ) -> Result<String, BusError> {
        let call = self
            .shared
            .enter::<rows::ListReconciliations, Read>(conn, &hdr, None)
            .await?;
        let status = non_empty(status)
            .map(|s| {
                CaseStatus::parse(&s).ok_or_else(|| {
                    Error::with(
                        Code::MESSAGE_INVALID,
                        format!("{s:?} is not open, adopting, adopted or failed"),
                    )
                })
            })
            .transpose();
        let status = call.checked(status).await?;
        let limit = if limit == 0 { DEFAULT_PAGE } else { limit };
        let scope = self.shared.read_scope(&call).await;
        let cases = self
            .shared
            .ops
            .reconciliations(&call.auth, &scope, status, non_empty(after_task_id), limit)
            .await?;
        let next_after =
            if cases.len() as u64 >= u64::from(limit.min(airlock_taskdb::tasks::MAX_PAGE)) {
                cases.last().map(|c| c.task_id.clone())
            } else {
                None
            };
        call.reply(&ReconciliationPage { cases, next_after })
    }

    /// The task's latest case as JSON (RECONCILIATION_NOT_FOUND when it has
    /// none). Needs `org.airlock.tasks.read`.
    async fn get_reconciliation(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        task_id: String,
    ) -> Result<String, BusError> {
        let call = self
            .shared
            .enter::<rows::GetReconciliation, Read>(conn, &hdr, Some(&task_id))
            .await?;
        let scope = self.shared.read_scope(&call).await;
        let case = self
            .shared
            .ops
            .reconciliation(&call.auth, &scope, task_id)
            .await?;
        call.reply(&case)
    }

    /// Resolves the task's latest case, exactly once: `request` is an
    /// `airlock.reconciliation-resolution.v1` object (adopt or fail, a
    /// reason, an idempotency key, and the attempt, revision and observed
    /// head the admin saw). `fail` ends the case (the task stays FAILED
    /// with RECONCILIATION_REQUIRED and the reason); `adopt` leaves it
    /// `adopting` until the worker has checked that the branch still holds
    /// that head. Returns the outcome; the same request again returns the
    /// stored one. Needs `org.airlock.reconcile.manage`.
    async fn resolve_reconciliation(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        #[zbus(signal_emitter)] emitter: SignalEmitter<'_>,
        task_id: String,
        request: String,
    ) -> Result<String, BusError> {
        let mut call = self
            .shared
            .enter::<rows::ResolveReconciliation, ReconcileManage>(conn, &hdr, Some(&task_id))
            .await?;
        // Whatever polkit said: an agent's task is decided by another.
        self.shared.not_own_decision(&mut call, &task_id).await?;
        let parsed =
            parse_json(&request, "the resolution").and_then(|v| ResolveRequest::from_value(&v));
        let req = call.checked(parsed).await?;
        let out = self.shared.ops.resolve(&call.auth, task_id, req).await?;
        if !out.idempotent {
            if let Ok((state, revision)) = self.shared.ops.signal_facts(out.task_id.clone()).await {
                announce(&self.shared, &emitter, &out.task_id, state, revision).await;
            }
        }
        call.reply(&out)
    }
}

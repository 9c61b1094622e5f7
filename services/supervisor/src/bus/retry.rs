//! `org.airlock.Retry1`: airlock-retryd, admitted by peer uid.
//!
//! The owner's HTTP API holds no database: it asks here, and the
//! supervisor runs the store's retry-extension transaction (one step,
//! compare-and-swap, idempotent, audited). Only the uid of `retry.user`
//! may call; anyone else is `PEER_UID_DENIED`.

use super::error::BusError;
use super::tasks::announce;
use super::{Shared, parse_json};
use crate::authz::Retry as RetryPermission;
use airlock_proto::bus::retry as rows;
use airlock_proto::retry::RetryExtensionRequest;
use std::sync::Arc;
use zbus::message::Header;
use zbus::object_server::SignalEmitter;
use zbus::{Connection, interface};

/// The Retry1 interface object.
#[derive(Debug)]
pub struct Retry {
    shared: Arc<Shared>,
}

impl Retry {
    /// The interface over `shared`.
    pub fn new(shared: Arc<Shared>) -> Self {
        Retry { shared }
    }
}

#[interface(name = "org.airlock.Retry1")]
impl Retry {
    /// Grants the FAILED, exhausted task one more attempt. `request` is
    /// the owner's `RetryExtensionRequest` JSON as airlock-retryd received
    /// it; `authorization_id` the owner id retryd was configured with.
    /// Returns the `RetryExtensionOutcome` JSON (`idempotent` true on a
    /// replay).
    async fn extend_retry(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        #[zbus(signal_emitter)] emitter: SignalEmitter<'_>,
        task_id: String,
        request: String,
        authorization_id: String,
    ) -> Result<String, BusError> {
        let call = self
            .shared
            .enter::<rows::ExtendRetry, RetryPermission>(conn, &hdr, Some(&task_id))
            .await?;
        let parsed = parse_json(&request, "the retry request")
            .and_then(|v| RetryExtensionRequest::from_value(&v));
        let request = call.checked(parsed).await?;
        let outcome = self
            .shared
            .ops
            .extend_retry(&call.auth, task_id, request, authorization_id)
            .await?;
        if !outcome.idempotent {
            if let Ok((state, revision)) =
                self.shared.ops.signal_facts(outcome.task_id.clone()).await
            {
                announce(&self.shared, &emitter, &outcome.task_id, state, revision).await;
            }
        }
        call.reply(&outcome)
    }
}

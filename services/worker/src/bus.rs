//! The worker's side of org.airlock.Worker1.
//!
//! Calls are made from the worker's blocking threads through a tokio
//! handle. A D-Bus error named in the catalogue comes back as that code; a
//! bus that cannot be reached, or a reply that does not parse, is
//! RUNTIME_UNAVAILABLE, which the worker treats as transient.

use airlock_proto::task::{ClaimGrant, TaskResult};
use airlock_proto::{Code, Error};
use serde_json::Value;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use tokio::runtime::Handle;
use zbus::Connection;

const DESTINATION: &str = "org.airlock.Supervisor1";
const PATH: &str = "/org/airlock/Supervisor1";
const INTERFACE: &str = "org.airlock.Worker1";
const TASKS_INTERFACE: &str = "org.airlock.Tasks1";

/// A connection to the supervisor's Worker1 interface.
#[derive(Debug, Clone)]
pub struct Supervisor {
    conn: Connection,
    rt: Handle,
}

/// True for refusals that may go away by themselves (retry later).
pub fn is_transient(code: Code) -> bool {
    matches!(
        code,
        Code::RUNTIME_UNAVAILABLE
            | Code::STORE_UNAVAILABLE
            | Code::AUTHORITY_UNAVAILABLE
            | Code::INTERNAL
    )
}

fn map_err(e: zbus::Error) -> Error {
    match &e {
        zbus::Error::MethodError(name, detail, _) => {
            match Code::from_dbus_error_name(name.as_str()) {
                Some(code) => Error {
                    code,
                    detail: detail.clone(),
                },
                None => Error::with(
                    Code::RUNTIME_UNAVAILABLE,
                    format!("{name}: {}", detail.as_deref().unwrap_or("")),
                ),
            }
        }
        _ => Error::with(Code::RUNTIME_UNAVAILABLE, e.to_string()),
    }
}

impl Supervisor {
    /// Connects to the bus at `address`, or the system bus when `None`.
    pub fn connect(rt: Handle, address: Option<&str>) -> Result<Self, Error> {
        let conn = rt
            .block_on(async {
                match address {
                    Some(a) => zbus::connection::Builder::address(a)?.build().await,
                    None => Connection::system().await,
                }
            })
            .map_err(map_err)?;
        Ok(Supervisor { conn, rt })
    }

    fn call<B>(&self, method: &str, body: &B) -> Result<zbus::Message, Error>
    where
        B: serde::ser::Serialize + zbus::zvariant::DynamicType,
    {
        self.rt
            .block_on(
                self.conn
                    .call_method(Some(DESTINATION), PATH, Some(INTERFACE), method, body),
            )
            .map_err(map_err)
    }

    /// Claims the next task, if any.
    pub fn claim(&self) -> Result<Option<ClaimGrant>, Error> {
        let reply: String = self
            .call("Claim", &())?
            .body()
            .deserialize()
            .map_err(map_err)?;
        let value: Value = serde_json::from_str(&reply)
            .map_err(|e| Error::with(Code::RUNTIME_UNAVAILABLE, e.to_string()))?;
        if value.is_null() {
            return Ok(None);
        }
        serde_json::from_value(value)
            .map(Some)
            .map_err(|e| Error::with(Code::RUNTIME_UNAVAILABLE, e.to_string()))
    }

    /// Renews a lease; returns the new expiry (unix ms).
    pub fn renew(&self, task_id: &str, epoch: u64, token: &str) -> Result<i64, Error> {
        self.call("Renew", &(task_id, epoch, token))?
            .body()
            .deserialize()
            .map_err(map_err)
    }

    /// Submits an attempt's result under its idempotency key. Returns true
    /// when the supervisor already had this exact result (a replay).
    pub fn submit_result(
        &self,
        task_id: &str,
        epoch: u64,
        token: &str,
        key: &str,
        result: &TaskResult,
    ) -> Result<bool, Error> {
        let json = serde_json::to_string(result)
            .map_err(|e| Error::with(Code::INTERNAL, e.to_string()))?;
        let reply: String = self
            .call("SubmitResult", &(task_id, epoch, token, key, json.as_str()))?
            .body()
            .deserialize()
            .map_err(map_err)?;
        let value: Value = serde_json::from_str(&reply)
            .map_err(|e| Error::with(Code::RUNTIME_UNAVAILABLE, e.to_string()))?;
        Ok(value["idempotent"].as_bool().unwrap_or(false))
    }
}

/// Wakes claim loops when the supervisor announces a QUEUED task, so an
/// idle worker claims at once instead of at its next poll.
#[derive(Debug, Default)]
pub struct Wakeup {
    generation: Mutex<u64>,
    ready: Condvar,
}

impl Wakeup {
    /// Marks that work may be waiting and wakes every waiter.
    pub fn notify(&self) {
        if let Ok(mut g) = self.generation.lock() {
            *g = g.wrapping_add(1);
            self.ready.notify_all();
        }
    }

    /// The current generation, to wait past.
    pub fn generation(&self) -> u64 {
        self.generation.lock().map(|g| *g).unwrap_or(0)
    }

    /// Waits until a notification after `seen`, or `timeout`.
    pub fn wait_past(&self, seen: u64, timeout: Duration) {
        if let Ok(g) = self.generation.lock() {
            let _ = self.ready.wait_timeout_while(g, timeout, |g| *g == seen);
        }
    }
}

impl Supervisor {
    /// Follows org.airlock.Tasks1.TaskChanged and notifies `wakeup` for
    /// every task that becomes QUEUED. Polling remains the fallback, so a
    /// lost signal only costs one poll interval.
    pub fn follow_queued(&self, wakeup: Arc<Wakeup>) -> Result<(), Error> {
        use futures_util::StreamExt;
        let rule = zbus::MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .interface(TASKS_INTERFACE)
            .and_then(|b| b.member("TaskChanged"))
            .map(|b| b.build())
            .map_err(map_err)?;
        let conn = self.conn.clone();
        let mut stream = self
            .rt
            .block_on(zbus::MessageStream::for_match_rule(rule, &conn, Some(64)))
            .map_err(map_err)?;
        self.rt.spawn(async move {
            while let Some(Ok(msg)) = stream.next().await {
                if let Ok((_, state, _)) = msg.body().deserialize::<(String, String, i64)>() {
                    if state == "QUEUED" {
                        wakeup.notify();
                    }
                }
            }
        });
        Ok(())
    }
}

//! Wake-ups across hosts: a session that LISTENs for the task trigger's
//! notifications.

use super::error::pg_error;
use super::location::PgLocation;
use crate::error::StoreResult;
use crate::tasks::TaskState;
use postgres::Client;
use std::time::Duration;

/// The channel the task trigger notifies.
pub const CHANNEL: &str = "airlock_task_changed";

/// A change to a task, as the database announced it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskChange {
    /// The task.
    pub task_id: String,
    /// Its state after the change.
    pub state: TaskState,
    /// Its revision after the change.
    pub revision: i64,
    /// Its repository.
    pub repository: String,
}

/// A session that LISTENs for task changes made by any host.
pub struct PgListener {
    location: PgLocation,
    client: Option<Client>,
}

impl std::fmt::Debug for PgListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgListener")
            .field("location", &self.location)
            .field("connected", &self.client.is_some())
            .finish()
    }
}

impl PgListener {
    /// A listener on `location`; it connects on the first [`PgListener::wait`].
    pub fn new(location: &PgLocation) -> Self {
        PgListener {
            location: location.clone(),
            client: None,
        }
    }

    /// Waits up to `timeout` for changes; returns those that arrived (none
    /// after a quiet `timeout`). Fails with `STORE_UNAVAILABLE` when the
    /// server cannot be reached; the next call reconnects (changes made
    /// while no session listened are not replayed: listeners poll too).
    pub fn wait(&mut self, timeout: Duration) -> StoreResult<Vec<TaskChange>> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            self.client = None;
            let mut client = self.location.connect()?;
            client
                .batch_execute(&format!("LISTEN {CHANNEL}"))
                .map_err(|e| pg_error("listening for task changes", e))?;
            self.client = Some(client);
        }
        let Some(mut client) = self.client.take() else {
            return Ok(Vec::new());
        };
        use postgres::fallible_iterator::FallibleIterator;
        let mut changes = Vec::new();
        let mut notifications = client.notifications();
        let first = notifications.timeout_iter(timeout).next();
        let waited: Result<(), postgres::Error> = match first {
            Ok(Some(n)) => {
                changes.extend(parse_change(n.payload()));
                // Take what is already queued without waiting again.
                let mut more = notifications.iter();
                loop {
                    match more.next() {
                        Ok(Some(n)) => changes.extend(parse_change(n.payload())),
                        Ok(None) => break Ok(()),
                        Err(e) => break Err(e),
                    }
                }
            }
            Ok(None) => Ok(()),
            Err(e) => Err(e),
        };
        drop(notifications);
        match waited {
            Ok(()) => {
                self.client = Some(client);
                Ok(changes)
            }
            Err(e) => Err(pg_error("waiting for task changes", e)),
        }
    }
}

fn parse_change(payload: &str) -> Option<TaskChange> {
    let v: serde_json::Value = serde_json::from_str(payload).ok()?;
    Some(TaskChange {
        task_id: v["task_id"].as_str()?.to_owned(),
        state: TaskState::parse(v["state"].as_str()?).ok()?,
        revision: v["revision"].as_i64()?,
        repository: v["repository"].as_str().unwrap_or_default().to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn change_payloads_parse() {
        assert_eq!(
            parse_change(r#"{"task_id":"t-1","state":"QUEUED","revision":3,"repository":"demo"}"#),
            Some(TaskChange {
                task_id: "t-1".into(),
                state: TaskState::Queued,
                revision: 3,
                repository: "demo".into()
            })
        );
        assert_eq!(
            parse_change(r#"{"task_id":"t-1","state":"NOPE","revision":3}"#),
            None
        );
        assert_eq!(parse_change("not json"), None);
    }
}

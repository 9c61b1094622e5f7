//! Whose task a task is: the submitter the supervisor recorded, so that
//! the task tools answer only about this user's own tasks.

use super::AirlockMcp;
use crate::input;
use airlock_client::Supervisor;
use airlock_proto::task::TaskView;
use airlock_proto::{Code, Error};
use serde::Deserialize;
use std::sync::PoisonError;

impl AirlockMcp {
    /// Who submitted `task_id`: the actor of its first allowed
    /// TASK_SUBMITTED event, as the supervisor recorded it from the bus.
    pub(super) async fn submitter(
        &self,
        sup: &Supervisor,
        task_id: &str,
    ) -> Result<Option<u32>, Error> {
        if let Some(known) = self
            .inner
            .submitters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(task_id)
        {
            return Ok(*known);
        }
        let mut after = 0;
        let mut found = None;
        'pages: for _ in 0..10 {
            let page = sup.list_events(task_id, after, 100).await?;
            for e in &page.events {
                if e.action == "TASK_SUBMITTED" && e.outcome == "allowed" {
                    let actor: Actor = serde_json::from_value(e.actor.clone()).map_err(|err| {
                        Error::with(Code::MESSAGE_INVALID, format!("event actor: {err}"))
                    })?;
                    found = Some(actor.uid);
                    break 'pages;
                }
            }
            if page.events.is_empty() || page.next_after == after {
                break;
            }
            after = page.next_after;
        }
        let uid = found.flatten();
        if found.is_some() {
            self.inner
                .submitters
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(task_id.to_owned(), uid);
        }
        Ok(uid)
    }

    pub(super) async fn check_owner(&self, sup: &Supervisor, task_id: &str) -> Result<(), Error> {
        if self.submitter(sup, task_id).await? == Some(self.inner.uid) {
            Ok(())
        } else {
            Err(Error::with(
                Code::TASK_NOT_FOUND,
                format!("{task_id}: no task of yours (uid {})", self.inner.uid),
            ))
        }
    }

    /// The task, if this user submitted it; TASK_NOT_FOUND otherwise, so
    /// a task id alone tells nothing.
    pub(super) async fn own_task(&self, task_id: &str) -> Result<TaskView, Error> {
        input::task_id(task_id)?;
        let sup = self.supervisor().await?;
        let task = sup.get_task(task_id).await?;
        self.check_owner(&sup, task_id).await?;
        Ok(task)
    }
}

#[derive(Deserialize)]
struct Actor {
    uid: Option<u32>,
}

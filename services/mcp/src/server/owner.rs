//! Whose task a task is. The supervisor binds every read to its caller
//! (a task another user or agent submitted answers TASK_NOT_FOUND, as one
//! that does not exist, unless the caller holds
//! `org.airlock.tasks.read-all`), so the task tools show what it answers
//! and filter nothing themselves.

use super::AirlockMcp;
use crate::input;
use airlock_proto::task::TaskView;
use airlock_proto::{Code, Error};

impl AirlockMcp {
    /// The task, as the supervisor shows it to this caller:
    /// TASK_NOT_FOUND for a task it may not read.
    pub(super) async fn own_task(&self, task_id: &str) -> Result<TaskView, Error> {
        input::task_id(task_id)?;
        let sup = self.supervisor().await?;
        sup.get_task(task_id).await
    }

    /// Refuses to take `task` for this user's own submission when another
    /// uid submitted it (an administrator allowed to read every task may
    /// see a task under an id its token would make).
    pub(super) fn submitted_by_me(&self, task: &TaskView) -> Result<(), Error> {
        if task.submitter.as_ref().and_then(|s| s.uid) == Some(self.inner.uid) {
            Ok(())
        } else {
            Err(Error::with(
                Code::TASK_IDEMPOTENCY_CONFLICT,
                format!(
                    "task {} exists and was not submitted by uid {}",
                    task.task_id, self.inner.uid
                ),
            ))
        }
    }
}

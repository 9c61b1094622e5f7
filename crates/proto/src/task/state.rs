//! What a task's state is called on the wire, and which states are final.

use super::TaskState;
use crate::error::{Code, Error, Result};

impl TaskState {
    /// Every state.
    pub const ALL: &'static [TaskState] = &[
        TaskState::Queued,
        TaskState::Running,
        TaskState::Verifying,
        TaskState::Succeeded,
        TaskState::Failed,
        TaskState::Cancelled,
    ];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Queued => "QUEUED",
            TaskState::Running => "RUNNING",
            TaskState::Verifying => "VERIFYING",
            TaskState::Succeeded => "SUCCEEDED",
            TaskState::Failed => "FAILED",
            TaskState::Cancelled => "CANCELLED",
        }
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Result<Self> {
        TaskState::ALL
            .iter()
            .copied()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| Error::with(Code::MESSAGE_INVALID, format!("unknown task state {s:?}")))
    }

    /// No further transition happens on its own.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Succeeded | TaskState::Failed | TaskState::Cancelled
        )
    }
}

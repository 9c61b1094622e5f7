//! The moves the store makes, as its one writer of task state
//! (`TaskRow::advance`, `tasks/row.rs`) made them, for an observer (the
//! supervisor's contract test records them and checks each is a row of
//! [`airlock_proto::states::TRANSITIONS`]).
//!
//! A move is reported only after the transaction that made it committed:
//! the writer collects the moves of the transaction in progress on its
//! thread (every write runs its transaction on the caller's thread), drops
//! them when the transaction rolls back or runs again, and hands them to
//! the observer after the commit. Without an observer nothing is kept.

use airlock_proto::states::{Step, TRANSITIONS, Transition};
use airlock_proto::task::TaskState;
use std::cell::RefCell;
use std::sync::OnceLock;

/// One move: a task in `from`, moved by `step`, now in `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Move {
    /// The state before.
    pub from: TaskState,
    /// What moved it.
    pub step: Step,
    /// The state after.
    pub to: TaskState,
}

impl Move {
    /// The row of [`TRANSITIONS`] this move is (`None`: a move the table
    /// does not have, which the writer never makes).
    pub fn row(&self) -> Option<&'static Transition> {
        TRANSITIONS
            .iter()
            .find(|t| t.from == self.from && t.step == self.step && t.to == self.to)
    }
}

type Observer = Box<dyn Fn(&str, Move) + Send + Sync>;

static OBSERVER: OnceLock<Observer> = OnceLock::new();

thread_local! {
    static PENDING: RefCell<Vec<(String, Move)>> = const { RefCell::new(Vec::new()) };
}

/// Installs the process's observer of moves, called with the task id and
/// the move of every move committed, in order. One per process: false when
/// one was installed already.
pub fn observe(f: impl Fn(&str, Move) + Send + Sync + 'static) -> bool {
    OBSERVER.set(Box::new(f)).is_ok()
}

/// A transaction (or another run of one) begins on this thread.
pub(super) fn begin() {
    if OBSERVER.get().is_some() {
        PENDING.with(|p| p.borrow_mut().clear());
    }
}

/// The writer persisted `m` in the transaction in progress.
pub(super) fn performed(task_id: &str, m: Move) {
    if OBSERVER.get().is_some() {
        PENDING.with(|p| p.borrow_mut().push((task_id.to_owned(), m)));
    }
}

/// The transaction ended: committed (`true`) or rolled back.
pub(super) fn ended(committed: bool) {
    if let Some(f) = OBSERVER.get() {
        let moves = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
        if committed {
            for (task_id, m) in moves {
                f(&task_id, m);
            }
        }
    }
}

//! The task state table: for every operation a caller can ask of the
//! supervisor, in every task state, what happens — the states the task may
//! move to, or the one refusal code. The task database checks its state
//! preconditions through [`check`], `docs/states.md` is generated from
//! [`TABLE`] (`crates/proto/tests/docs.rs`), and the supervisor's contract
//! test calls every method in every state and compares the outcome with
//! this table.

use crate::task::TaskState::{self, Cancelled, Failed, Queued, Running, Succeeded, Verifying};
use crate::{Code, Error};

/// An operation on one task, as the bus offers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// `Tasks1.ReplacePlan`.
    ReplacePlan,
    /// `Tasks1.CancelTask`.
    Cancel,
    /// `Tasks1.Verify` with `accept`.
    Accept,
    /// `Tasks1.Verify` with `rework`.
    Rework,
    /// `Tasks1.Verify` with `reject`.
    Reject,
    /// `Worker1.Claim` (of the oldest claimable task).
    Claim,
    /// `Worker1.Renew` with the current lease.
    Renew,
    /// `Worker1.SubmitResult` of a passed attempt, under the current lease.
    SubmitPassed,
    /// `Worker1.SubmitResult` of a failed attempt, under the current lease.
    SubmitFailed,
    /// `Retry1.ExtendRetry` with what `GetTask` showed.
    ExtendRetry,
}

impl Op {
    /// Every operation, in table order.
    pub const ALL: &'static [Op] = &[
        Op::ReplacePlan,
        Op::Cancel,
        Op::Accept,
        Op::Rework,
        Op::Reject,
        Op::Claim,
        Op::Renew,
        Op::SubmitPassed,
        Op::SubmitFailed,
        Op::ExtendRetry,
    ];

    /// The bus method that performs it, as `Interface.Method (argument)`.
    pub fn method(self) -> &'static str {
        match self {
            Op::ReplacePlan => "Tasks1.ReplacePlan",
            Op::Cancel => "Tasks1.CancelTask",
            Op::Accept => "Tasks1.Verify (accept)",
            Op::Rework => "Tasks1.Verify (rework)",
            Op::Reject => "Tasks1.Verify (reject)",
            Op::Claim => "Worker1.Claim",
            Op::Renew => "Worker1.Renew",
            Op::SubmitPassed => "Worker1.SubmitResult (passed)",
            Op::SubmitFailed => "Worker1.SubmitResult (failed)",
            Op::ExtendRetry => "Retry1.ExtendRetry",
        }
    }
}

/// What an operation does in one state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Applied; the task is then in one of these states (which one depends
    /// on attempts left and `auto_accept`, as `why` says).
    To(&'static [TaskState], &'static str),
    /// Refused with this code; nothing changes.
    Refused(Code, &'static str),
    /// Not applicable: a claim never picks a task in this state (it
    /// returns no grant, or another task's).
    NotClaimed,
}

/// One row per (operation, state).
pub const TABLE: &[(Op, TaskState, Outcome)] = &{
    use Outcome::*;
    const INVALID: Code = Code::TASK_STATE_INVALID;
    [
        (
            Op::ReplacePlan,
            Queued,
            To(&[Queued], "CAS on the previous plan's digest"),
        ),
        (
            Op::ReplacePlan,
            Running,
            Refused(INVALID, "the attempt runs the current plan"),
        ),
        (
            Op::ReplacePlan,
            Verifying,
            Refused(INVALID, "a result of the current plan waits"),
        ),
        (Op::ReplacePlan, Succeeded, Refused(INVALID, "terminal")),
        (Op::ReplacePlan, Failed, Refused(INVALID, "terminal")),
        (Op::ReplacePlan, Cancelled, Refused(INVALID, "terminal")),
        (Op::Cancel, Queued, To(&[Cancelled], "")),
        (
            Op::Cancel,
            Running,
            To(
                &[Cancelled],
                "the lease is cleared; its holder is fenced off",
            ),
        ),
        (Op::Cancel, Verifying, To(&[Cancelled], "")),
        (Op::Cancel, Succeeded, Refused(INVALID, "terminal")),
        (Op::Cancel, Failed, Refused(INVALID, "terminal")),
        (Op::Cancel, Cancelled, Refused(INVALID, "terminal")),
        (
            Op::Accept,
            Queued,
            Refused(INVALID, "no result to decide on"),
        ),
        (
            Op::Accept,
            Running,
            Refused(INVALID, "no result to decide on"),
        ),
        (Op::Accept, Verifying, To(&[Succeeded], "")),
        (Op::Accept, Succeeded, Refused(INVALID, "terminal")),
        (Op::Accept, Failed, Refused(INVALID, "terminal")),
        (Op::Accept, Cancelled, Refused(INVALID, "terminal")),
        (
            Op::Rework,
            Queued,
            Refused(INVALID, "no result to decide on"),
        ),
        (
            Op::Rework,
            Running,
            Refused(INVALID, "no result to decide on"),
        ),
        (
            Op::Rework,
            Verifying,
            To(
                &[Queued, Failed],
                "QUEUED while attempts remain, else FAILED; FAILED at once when the failure is REPOSITORY_NOT_REGISTERED",
            ),
        ),
        (Op::Rework, Succeeded, Refused(INVALID, "terminal")),
        (Op::Rework, Failed, Refused(INVALID, "terminal")),
        (Op::Rework, Cancelled, Refused(INVALID, "terminal")),
        (
            Op::Reject,
            Queued,
            Refused(INVALID, "no result to decide on"),
        ),
        (
            Op::Reject,
            Running,
            Refused(INVALID, "no result to decide on"),
        ),
        (Op::Reject, Verifying, To(&[Failed], "")),
        (Op::Reject, Succeeded, Refused(INVALID, "terminal")),
        (Op::Reject, Failed, Refused(INVALID, "terminal")),
        (Op::Reject, Cancelled, Refused(INVALID, "terminal")),
        (
            Op::Claim,
            Queued,
            To(&[Running], "a new attempt under a fresh lease"),
        ),
        (Op::Claim, Running, NotClaimed),
        (Op::Claim, Verifying, NotClaimed),
        (Op::Claim, Succeeded, NotClaimed),
        (Op::Claim, Failed, NotClaimed),
        (Op::Claim, Cancelled, NotClaimed),
        (Op::Renew, Queued, Refused(INVALID, "no lease")),
        (
            Op::Renew,
            Running,
            To(&[Running], "epoch, token and expiry checked"),
        ),
        (
            Op::Renew,
            Verifying,
            Refused(INVALID, "the attempt is over"),
        ),
        (Op::Renew, Succeeded, Refused(INVALID, "terminal")),
        (Op::Renew, Failed, Refused(INVALID, "terminal")),
        (
            Op::Renew,
            Cancelled,
            Refused(INVALID, "the lease was cleared"),
        ),
        (Op::SubmitPassed, Queued, Refused(INVALID, "no lease")),
        (
            Op::SubmitPassed,
            Running,
            To(
                &[Verifying, Succeeded],
                "SUCCEEDED at once with auto_accept when every command passed fully confined",
            ),
        ),
        (
            Op::SubmitPassed,
            Verifying,
            Refused(
                INVALID,
                "the attempt's result is in (a byte-identical replay is answered as such)",
            ),
        ),
        (Op::SubmitPassed, Succeeded, Refused(INVALID, "terminal")),
        (Op::SubmitPassed, Failed, Refused(INVALID, "terminal")),
        (
            Op::SubmitPassed,
            Cancelled,
            Refused(INVALID, "the lease was cleared"),
        ),
        (Op::SubmitFailed, Queued, Refused(INVALID, "no lease")),
        (
            Op::SubmitFailed,
            Running,
            To(
                &[Queued, Failed],
                "QUEUED while attempts remain, else FAILED; FAILED at once with REPOSITORY_NOT_REGISTERED, and with RECONCILIATION_REQUIRED, which opens a reconciliation case",
            ),
        ),
        (
            Op::SubmitFailed,
            Verifying,
            Refused(INVALID, "the attempt's result is in"),
        ),
        (Op::SubmitFailed, Succeeded, Refused(INVALID, "terminal")),
        (Op::SubmitFailed, Failed, Refused(INVALID, "terminal")),
        (
            Op::SubmitFailed,
            Cancelled,
            Refused(INVALID, "the lease was cleared"),
        ),
        (
            Op::ExtendRetry,
            Queued,
            Refused(Code::RETRY_EXTENSION_CAS_MISMATCH, "only a FAILED task"),
        ),
        (
            Op::ExtendRetry,
            Running,
            Refused(Code::RETRY_EXTENSION_CAS_MISMATCH, "only a FAILED task"),
        ),
        (
            Op::ExtendRetry,
            Verifying,
            Refused(Code::RETRY_EXTENSION_CAS_MISMATCH, "only a FAILED task"),
        ),
        (
            Op::ExtendRetry,
            Succeeded,
            Refused(Code::RETRY_EXTENSION_CAS_MISMATCH, "only a FAILED task"),
        ),
        (
            Op::ExtendRetry,
            Failed,
            To(
                &[Queued],
                "attempts exhausted (else RETRY_EXTENSION_NOT_EXHAUSTED); max_attempts + 1",
            ),
        ),
        (
            Op::ExtendRetry,
            Cancelled,
            Refused(Code::RETRY_EXTENSION_CAS_MISMATCH, "only a FAILED task"),
        ),
    ]
};

/// The outcome of `op` in `state`.
pub fn outcome(op: Op, state: TaskState) -> Outcome {
    TABLE
        .iter()
        .find(|(o, s, _)| *o == op && *s == state)
        .map(|(_, _, out)| *out)
        .unwrap_or(Outcome::Refused(
            Code::TASK_STATE_INVALID,
            "not in the table",
        ))
}

/// Refuses `op` in `state` with the table's code (and names both), or
/// allows it.
pub fn check(op: Op, state: TaskState) -> Result<(), Error> {
    match outcome(op, state) {
        Outcome::To(..) => Ok(()),
        Outcome::Refused(code, why) => Err(Error::with(
            code,
            format!(
                "{} is not allowed while the task is {}: {why}",
                op.method(),
                state.as_str()
            ),
        )),
        Outcome::NotClaimed => Err(Error::with(
            Code::TASK_STATE_INVALID,
            format!("a {} task is never claimed", state.as_str()),
        )),
    }
}

/// True when `op` in `from` may end in `to`.
pub fn may_move(op: Op, from: TaskState, to: TaskState) -> bool {
    matches!(outcome(op, from), Outcome::To(states, _) if states.contains(&to))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operation_has_one_row_per_state() {
        for op in Op::ALL {
            for state in TaskState::ALL {
                let rows = TABLE
                    .iter()
                    .filter(|(o, s, _)| o == op && s == state)
                    .count();
                assert_eq!(rows, 1, "{op:?} in {state:?}");
            }
        }
        assert_eq!(TABLE.len(), Op::ALL.len() * TaskState::ALL.len());
    }

    #[test]
    fn terminal_states_accept_nothing_but_the_owners_retry_of_a_failure() {
        for (op, state, out) in TABLE {
            if state.is_terminal() {
                let allowed = matches!(out, Outcome::To(..));
                assert_eq!(
                    allowed,
                    *op == Op::ExtendRetry && *state == Failed,
                    "{op:?} {state:?}"
                );
            }
        }
    }

    #[test]
    fn check_names_the_operation_and_the_state() {
        let e = check(Op::Cancel, Succeeded).unwrap_err();
        assert_eq!(e.code, Code::TASK_STATE_INVALID);
        let text = e.to_string();
        assert!(
            text.contains("Tasks1.CancelTask") && text.contains("SUCCEEDED"),
            "{text}"
        );
        assert!(check(Op::Rework, Verifying).is_ok());
        assert!(may_move(Op::Rework, Verifying, Failed));
        assert!(!may_move(Op::Accept, Verifying, Failed));
    }
}

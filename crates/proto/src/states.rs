//! The task state table: for every operation a caller can ask of the
//! supervisor, in every task state, what happens — the states the task may
//! move to, or the one refusal code. The task database checks its state
//! preconditions through [`check`], `docs/states.md` is generated from
//! [`TABLE`] (`crates/proto/tests/docs.rs`), and the supervisor's contract
//! test calls every method in every state and compares the outcome with
//! this table.
//!
//! [`TRANSITIONS`] lists, as data, every move the task store makes: rows
//! `(from, step, to)`, each with the attempts it needs. [`next`] is the one
//! rule that picks the row (the task database's one writer of task state,
//! `airlock_taskdb`'s `tasks::moves`, persists only what it decides), and
//! every row of a bus operation agrees with [`TABLE`] (a test here).

use crate::task::TaskState::{self, Cancelled, Failed, Queued, Running, Succeeded, Verifying};
use crate::{Code, Error};

/// An operation on one task, as the bus offers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// `Tasks2.ReplacePlan`.
    ReplacePlan,
    /// `Tasks2.CancelTask`.
    Cancel,
    /// `Tasks2.Verify` with `accept`.
    Accept,
    /// `Tasks2.Verify` with `rework`.
    Rework,
    /// `Tasks2.Verify` with `reject`.
    Reject,
    /// `Worker1.Claim` (of the oldest claimable task).
    Claim,
    /// `Worker1.Renew` with the current lease.
    Renew,
    /// `Worker1.Fence` under the current lease (setting or releasing it).
    Fence,
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
        Op::Fence,
        Op::SubmitPassed,
        Op::SubmitFailed,
        Op::ExtendRetry,
    ];

    /// The bus method that performs it, as `Interface.Method (argument)`.
    pub fn method(self) -> &'static str {
        match self {
            Op::ReplacePlan => "Tasks2.ReplacePlan",
            Op::Cancel => "Tasks2.CancelTask",
            Op::Accept => "Tasks2.Verify (accept)",
            Op::Rework => "Tasks2.Verify (rework)",
            Op::Reject => "Tasks2.Verify (reject)",
            Op::Claim => "Worker1.Claim",
            Op::Renew => "Worker1.Renew",
            Op::Fence => "Worker1.Fence",
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
                "the lease is cleared; its holder is fenced off (refused with TASK_COMMITTING while the holder's fence stands: its ref move or push is under way)",
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
        (Op::Fence, Queued, Refused(INVALID, "no lease")),
        (
            Op::Fence,
            Running,
            To(
                &[Running],
                "epoch, token and expiry checked; until it is released, the task is not cancelled and its lease does not expire",
            ),
        ),
        (
            Op::Fence,
            Verifying,
            Refused(INVALID, "the attempt is over"),
        ),
        (Op::Fence, Succeeded, Refused(INVALID, "terminal")),
        (Op::Fence, Failed, Refused(INVALID, "terminal")),
        (
            Op::Fence,
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
                "QUEUED while attempts remain, else FAILED; FAILED at once with a code that ends the task (REPOSITORY_NOT_REGISTERED; RECONCILIATION_REQUIRED, which opens a reconciliation case; a policy refusal)",
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

pub use step::{Attempts, Step, Transition};

/// The types of [`TRANSITIONS`]. They describe the store's own moves and
/// never cross a boundary (no message carries them), so they sit outside
/// the protocol fingerprint of `crates/proto/tests/protocol.rs`, which
/// covers the top-level declarations of the message modules.
mod step {
    use super::Op;
    use crate::task::TaskState;

    /// What moves a task: a bus operation's effect (one operation may
    /// have several, told apart by what the store found), or the system's.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub enum Step {
        /// `Worker1.Claim`: a new attempt under a fresh lease.
        Claim,
        /// `Worker1.Renew`: the lease's expiry moves; the state does not.
        Renew,
        /// `Worker1.Fence`: a fence is set (the lease's expiry moves past
        /// its end) or released; the state does not change.
        Fence,
        /// `Tasks2.ReplacePlan`: the plan changes; the state does not.
        ReplacePlan,
        /// `Worker1.SubmitResult` of a passed or captured attempt, left for
        /// an administrator.
        SubmitPassed,
        /// `Worker1.SubmitResult` of a passed attempt accepted at once
        /// (`auto_accept`, every command exited 0, fully confined).
        AutoAccept,
        /// `Worker1.SubmitResult` of a failed attempt (an automatic rework).
        SubmitFailed,
        /// `Worker1.SubmitResult` of an attempt failed with a code another
        /// attempt cannot help (`REPOSITORY_NOT_REGISTERED`,
        /// `RECONCILIATION_REQUIRED`).
        SubmitFinal,
        /// `Tasks2.Verify (accept)`.
        Accept,
        /// `Tasks2.Verify (rework)`.
        Rework,
        /// `Tasks2.Verify (reject)`.
        Reject,
        /// `Tasks2.CancelTask`.
        Cancel,
        /// `Retry1.ExtendRetry`: `max_attempts + 1`.
        ExtendRetry,
        /// The lease sweeper found the lease expired.
        ExpireLease,
        /// The task's repository is no longer registered.
        FailUnregistered,
        /// `Reconcile1` resolution `fail`: the verification record says so;
        /// the state does not change.
        ResolveFail,
        /// The worker's check of an adoption found the head adoptable.
        Adopt,
    }

    impl Step {
        /// Every step, in table order.
        pub const ALL: &'static [Step] = &[
            Step::Claim,
            Step::Renew,
            Step::Fence,
            Step::ReplacePlan,
            Step::SubmitPassed,
            Step::AutoAccept,
            Step::SubmitFailed,
            Step::SubmitFinal,
            Step::Accept,
            Step::Rework,
            Step::Reject,
            Step::Cancel,
            Step::ExtendRetry,
            Step::ExpireLease,
            Step::FailUnregistered,
            Step::ResolveFail,
            Step::Adopt,
        ];

        /// A name for humans (`docs/states.md`, refusals).
        pub fn name(self) -> &'static str {
            match self {
                Step::Claim => "claim",
                Step::Renew => "renew",
                Step::Fence => "fence",
                Step::ReplacePlan => "replace plan",
                Step::SubmitPassed => "submit result (passed)",
                Step::AutoAccept => "submit result (passed, auto-accepted)",
                Step::SubmitFailed => "submit result (failed)",
                Step::SubmitFinal => "submit result (failed, final)",
                Step::Accept => "accept",
                Step::Rework => "rework",
                Step::Reject => "reject",
                Step::Cancel => "cancel",
                Step::ExtendRetry => "extend retry",
                Step::ExpireLease => "lease expiry",
                Step::FailUnregistered => "repository unregistered",
                Step::ResolveFail => "reconciliation resolved (fail)",
                Step::Adopt => "reconciliation adopted",
            }
        }

        /// The bus operation of [`super::TABLE`] this step belongs to;
        /// `None` for the system's steps and the reconciliation's (their
        /// table is `crate::reconcile::CASE_TABLE`).
        pub fn op(self) -> Option<Op> {
            match self {
                Step::Claim => Some(Op::Claim),
                Step::Renew => Some(Op::Renew),
                Step::Fence => Some(Op::Fence),
                Step::ReplacePlan => Some(Op::ReplacePlan),
                Step::SubmitPassed | Step::AutoAccept => Some(Op::SubmitPassed),
                Step::SubmitFailed | Step::SubmitFinal => Some(Op::SubmitFailed),
                Step::Accept => Some(Op::Accept),
                Step::Rework => Some(Op::Rework),
                Step::Reject => Some(Op::Reject),
                Step::Cancel => Some(Op::Cancel),
                Step::ExtendRetry => Some(Op::ExtendRetry),
                Step::ExpireLease | Step::FailUnregistered | Step::ResolveFail | Step::Adopt => {
                    None
                }
            }
        }
    }

    /// What a row needs of the task's attempts (`attempt < max_attempts`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Attempts {
        /// Whatever they are.
        Any,
        /// Attempts are left.
        Left,
        /// None is left.
        Exhausted,
    }

    impl Attempts {
        /// True when a task with (`true`) or without attempts left fits.
        pub fn admits(self, attempts_left: bool) -> bool {
            match self {
                Attempts::Any => true,
                Attempts::Left => attempts_left,
                Attempts::Exhausted => !attempts_left,
            }
        }

        /// A name for humans.
        pub fn name(self) -> &'static str {
            match self {
                Attempts::Any => "any",
                Attempts::Left => "attempts left",
                Attempts::Exhausted => "no attempt left",
            }
        }
    }

    /// One move the store makes.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Transition {
        /// The state the task is in.
        pub from: TaskState,
        /// What moves it.
        pub step: Step,
        /// What the row needs of the attempts.
        pub attempts: Attempts,
        /// The state it is in afterwards.
        pub to: TaskState,
        /// What else the move does, for humans.
        pub why: &'static str,
    }
}

/// The state a submitted task starts in (attempt 0, revision 1).
pub const SUBMITTED: TaskState = Queued;

/// Every move the task store makes, derived from what it does: a task in
/// `from` moved by `step` ends in `to`, when its attempts fit. For one
/// `(from, step)` the rows' attempts never overlap, so at most one row
/// applies ([`next`]).
pub const TRANSITIONS: &[Transition] = &{
    use Attempts::{Any, Exhausted, Left};
    const fn t(
        from: TaskState,
        step: Step,
        attempts: Attempts,
        to: TaskState,
        why: &'static str,
    ) -> Transition {
        Transition {
            from,
            step,
            attempts,
            to,
            why,
        }
    }
    [
        t(
            Queued,
            Step::Claim,
            Left,
            Running,
            "attempt + 1, lease epoch + 1, a fresh lease",
        ),
        t(
            Running,
            Step::Renew,
            Any,
            Running,
            "the lease's expiry moves",
        ),
        t(
            Running,
            Step::Fence,
            Any,
            Running,
            "a fence is set (the lease lasts at least until it ends) or released",
        ),
        t(
            Queued,
            Step::ReplacePlan,
            Any,
            Queued,
            "the plan is replaced",
        ),
        t(
            Running,
            Step::SubmitPassed,
            Any,
            Verifying,
            "the lease is cleared; an administrator decides",
        ),
        t(
            Running,
            Step::AutoAccept,
            Any,
            Succeeded,
            "auto_accept: every command exited 0, fully confined",
        ),
        t(
            Running,
            Step::SubmitFailed,
            Left,
            Queued,
            "an automatic rework (NEEDS_REWORK)",
        ),
        t(
            Running,
            Step::SubmitFailed,
            Exhausted,
            Failed,
            "an automatic rework (NEEDS_REWORK)",
        ),
        t(
            Running,
            Step::SubmitFinal,
            Any,
            Failed,
            "a code that ends the task (Code::ends_task): REPOSITORY_NOT_REGISTERED, RECONCILIATION_REQUIRED (a case opens), or a policy refusal (COMMAND_PROGRAM_DENY, PYTHON_MODULE_DENY, GIT_MUTATION_DENY, ENVIRONMENT_*)",
        ),
        t(Verifying, Step::Accept, Any, Succeeded, ""),
        t(Verifying, Step::Rework, Left, Queued, ""),
        t(Verifying, Step::Rework, Exhausted, Failed, ""),
        t(Verifying, Step::Reject, Any, Failed, ""),
        t(Queued, Step::Cancel, Any, Cancelled, ""),
        t(
            Running,
            Step::Cancel,
            Any,
            Cancelled,
            "the lease is cleared; its holder is fenced off",
        ),
        t(Verifying, Step::Cancel, Any, Cancelled, ""),
        t(
            Failed,
            Step::ExtendRetry,
            Exhausted,
            Queued,
            "max_attempts + 1; claimed_by and the lease cleared",
        ),
        t(
            Running,
            Step::ExpireLease,
            Left,
            Queued,
            "the lease is cleared",
        ),
        t(
            Running,
            Step::ExpireLease,
            Exhausted,
            Failed,
            "the lease is cleared; verification record LEASE_EXPIRED",
        ),
        t(
            Queued,
            Step::FailUnregistered,
            Any,
            Failed,
            "verification record REPOSITORY_NOT_REGISTERED",
        ),
        t(
            Failed,
            Step::ResolveFail,
            Any,
            Failed,
            "verification record RECONCILIATION_FAILED",
        ),
        t(
            Failed,
            Step::Adopt,
            Any,
            Succeeded,
            "the head found on the branch becomes the task's commit",
        ),
    ]
};

/// The one rule of task state: where `step` moves a task in `from`, given
/// whether it has attempts left. A step of a bus operation is first held
/// to [`TABLE`] (its refusal code, as [`check`] gives it); then the one row
/// of [`TRANSITIONS`] that fits is the answer, and it must be one of the
/// states the table allows ([`may_move`]). No row: `TASK_STATE_INVALID`.
pub fn next(from: TaskState, step: Step, attempts_left: bool) -> Result<TaskState, Error> {
    if let Some(op) = step.op() {
        check(op, from)?;
    }
    let row = TRANSITIONS
        .iter()
        .find(|t| t.from == from && t.step == step && t.attempts.admits(attempts_left))
        .ok_or_else(|| {
            Error::with(
                Code::TASK_STATE_INVALID,
                format!(
                    "{} does not move a {} task{}",
                    step.name(),
                    from.as_str(),
                    if attempts_left {
                        ""
                    } else {
                        " without attempts left"
                    }
                ),
            )
        })?;
    match step.op() {
        Some(op) if !may_move(op, from, row.to) => Err(Error::with(
            Code::INTERNAL,
            format!(
                "{} would move a {} task to {}, which {} may not",
                step.name(),
                from.as_str(),
                row.to.as_str(),
                op.method()
            ),
        )),
        _ => Ok(row.to),
    }
}

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
            text.contains("Tasks2.CancelTask") && text.contains("SUCCEEDED"),
            "{text}"
        );
        assert!(check(Op::Rework, Verifying).is_ok());
        assert!(may_move(Op::Rework, Verifying, Failed));
        assert!(!may_move(Op::Accept, Verifying, Failed));
    }

    #[test]
    fn every_transition_of_a_bus_operation_is_one_the_table_allows() {
        for t in TRANSITIONS {
            if let Some(op) = t.step.op() {
                assert!(may_move(op, t.from, t.to), "{t:?}");
            }
        }
        // And every move the table allows is made by some row.
        for (op, from, out) in TABLE {
            if let Outcome::To(states, _) = out {
                for to in *states {
                    assert!(
                        TRANSITIONS
                            .iter()
                            .any(|t| t.step.op() == Some(*op) && t.from == *from && t.to == *to),
                        "{op:?}: {from:?} -> {to:?} has no row"
                    );
                }
            }
        }
    }

    #[test]
    fn at_most_one_row_applies_and_every_step_has_one() {
        for step in Step::ALL {
            assert!(TRANSITIONS.iter().any(|t| t.step == *step), "{step:?}");
            for from in TaskState::ALL {
                for left in [true, false] {
                    let rows = TRANSITIONS
                        .iter()
                        .filter(|t| t.step == *step && t.from == *from && t.attempts.admits(left))
                        .count();
                    assert!(rows <= 1, "{step:?} from {from:?} (left: {left})");
                }
            }
        }
    }

    #[test]
    fn next_follows_the_rows_and_refuses_anything_else() {
        assert_eq!(next(Verifying, Step::Rework, true).unwrap(), Queued);
        assert_eq!(next(Verifying, Step::Rework, false).unwrap(), Failed);
        assert_eq!(next(Running, Step::ExpireLease, false).unwrap(), Failed);
        assert_eq!(next(Failed, Step::Adopt, false).unwrap(), Succeeded);
        // The table's own code first.
        let e = next(Succeeded, Step::Cancel, false).unwrap_err();
        assert_eq!(e.code, Code::TASK_STATE_INVALID);
        // A step with no row.
        let e = next(Queued, Step::Adopt, true).unwrap_err();
        assert_eq!(e.code, Code::TASK_STATE_INVALID);
        assert!(next(Queued, Step::Claim, false).is_err());
        assert!(next(Failed, Step::ExtendRetry, true).is_err());
        for from in TaskState::ALL {
            for step in Step::ALL {
                for left in [true, false] {
                    if let Ok(to) = next(*from, *step, left) {
                        assert!(
                            TRANSITIONS
                                .iter()
                                .any(|t| t.from == *from && t.step == *step && t.to == to),
                            "{from:?} {step:?} {to:?}"
                        );
                    }
                }
            }
        }
    }
}

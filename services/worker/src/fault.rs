//! Fault injection for the crash matrix (tests/crash), compiled only with
//! the `fault-injection` feature: packaged binaries are built without it
//! and have no code path that kills the worker on purpose.
//!
//! `AIRLOCK_FAULT_KILL_AFTER=<point>` makes the worker SIGKILL itself the
//! first time it passes `<point>`:
//!
//! - a checkpoint phase name (`claimed`, `workspace_prepared`, …): right
//!   after that checkpoint was durably appended;
//! - `commit_written`: the governed commit's objects are written (and
//!   synced), the agent/ branch not yet moved;
//! - `ref_fenced`: the supervisor fenced the attempt for the branch's
//!   compare-and-swap (no cancel, no lease expiry until the fence ends),
//!   the branch not yet moved;
//! - `ref_updated`: after the compare-and-swap moved the agent/ branch to
//!   the governed commit, before the `commit_done` checkpoint is appended;
//! - `spool_staged`: inside the request's spool publication, its
//!   temporary file written and synced, not yet renamed into place;
//! - `source_staged`: likewise inside the publication of a source (a
//!   delta or a whole archive) the executor asked for: passed only when
//!   the executor lacks the tree, so no attempt counts on passing it
//!   ([`FaultPoint::passed_by`]); tests/crash's source kills arm it;
//! - `result_accepted`: after the supervisor accepted the result
//!   (SubmitResult returned OK), before `result_submitted` is appended.
//!
//! `AIRLOCK_FAULT_STOP_AT=<point>` instead makes it SIGSTOP itself the
//! first time it passes `<point>` (once per process): a worker paused past
//! its lease, as a long GC pause, a frozen VM or a partition would leave it,
//! which continues where it stopped when the harness sends SIGCONT.
//!
//! An unknown name is a start-up error, and so is setting both. Before
//! raising the signal the worker writes `fault injection: SIGKILL at
//! <point> task <task>` (or `SIGSTOP`) to stderr, so the harness can tell
//! this fault from any other.

use airlock_proto::checkpoint::Phase;
use airlock_proto::{Code, Error};

/// The environment variable naming the fault point.
pub const ENV: &str = "AIRLOCK_FAULT_KILL_AFTER";

/// The environment variable naming the point to stop (SIGSTOP) at.
pub const STOP_ENV: &str = "AIRLOCK_FAULT_STOP_AT";

/// What happens at the armed point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// SIGKILL: the process dies there.
    Kill,
    /// SIGSTOP, once: the process pauses there until SIGCONT.
    Stop,
}

/// A fault point and what happens there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Armed {
    /// Where.
    pub point: FaultPoint,
    /// What.
    pub action: Action,
}

/// Where the worker may kill itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultPoint {
    /// Right after this checkpoint phase was appended.
    AfterPhase(Phase),
    /// The governed commit's objects are written; the branch is not yet
    /// moved.
    CommitWritten,
    /// The supervisor fenced the attempt for the branch's compare-and-swap;
    /// the branch is not yet moved.
    RefFenced,
    /// The branch ref was updated; `commit_done` is not yet appended.
    RefUpdated,
    /// The request is written to its temporary name, not yet renamed.
    SpoolStaged,
    /// A source the executor asked for is written to its temporary name,
    /// not yet renamed.
    SourceStaged,
    /// The supervisor accepted the result; `result_submitted` is not yet
    /// appended.
    ResultAccepted,
    /// The publication is about to push (the upstream not yet asked).
    BeforePush,
    /// The supervisor fenced the attempt for the push; the upstream not yet
    /// asked.
    PushFenced,
    /// The upstream took the push; `published` is not yet appended.
    AfterPush,
}

/// The kinds of attempt, by the fault points they pass
/// ([`FaultPoint::passed_by`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// A change verified and committed to a repository without an
    /// upstream (the crash matrix's tasks).
    Commit,
    /// A change verified, committed and pushed to the repository's
    /// upstream.
    Publication,
    /// A read-only source capture.
    Capture,
}

impl FaultPoint {
    /// Every fault point, in the order an attempt passes them: a point
    /// after each checkpoint phase ([`Phase::ALL`]), each side-effect
    /// window just before the checkpoint that records it. A new phase is
    /// a new point here, and [`FaultPoint::passed_by`] must place it.
    pub fn all() -> Vec<FaultPoint> {
        let mut points = Vec::new();
        for &phase in Phase::ALL {
            match phase {
                Phase::WorkspacePrepared => points.push(FaultPoint::SpoolStaged),
                Phase::CommitDone => points.extend([
                    FaultPoint::CommitWritten,
                    FaultPoint::RefFenced,
                    FaultPoint::RefUpdated,
                ]),
                Phase::Published => points.extend([
                    FaultPoint::BeforePush,
                    FaultPoint::PushFenced,
                    FaultPoint::AfterPush,
                ]),
                Phase::ResultSubmitted => points.push(FaultPoint::ResultAccepted),
                Phase::VerificationPassed => points.push(FaultPoint::SourceStaged),
                _ => {}
            }
            points.push(FaultPoint::AfterPhase(phase));
        }
        points
    }

    /// Whether an attempt of this kind that runs to its end without a
    /// failure passes the point (the table at the top of
    /// `attempt/mod.rs`). `reconciliation_required` is passed by none: it
    /// is recorded only when the worker cannot settle an attempt.
    pub fn passed_by(self, attempt: Attempt) -> bool {
        let commits = matches!(attempt, Attempt::Commit | Attempt::Publication);
        match self {
            FaultPoint::AfterPhase(phase) => match phase {
                Phase::Claimed
                | Phase::WorkspacePrepared
                | Phase::VerificationPassed
                | Phase::ResultPending
                | Phase::ResultSubmitted => true,
                Phase::SourceCaptureDone => attempt == Attempt::Capture,
                Phase::CommitDone => commits,
                Phase::Published => attempt == Attempt::Publication,
                Phase::ReconciliationRequired => false,
            },
            FaultPoint::CommitWritten | FaultPoint::RefFenced | FaultPoint::RefUpdated => commits,
            FaultPoint::SpoolStaged | FaultPoint::ResultAccepted => true,
            // Only when the executor lacks the tree.
            FaultPoint::SourceStaged => false,
            FaultPoint::BeforePush | FaultPoint::PushFenced | FaultPoint::AfterPush => {
                attempt == Attempt::Publication
            }
        }
    }

    /// Parses a fault point name.
    pub fn parse(name: &str) -> Result<Self, Error> {
        match name {
            "commit_written" => Ok(FaultPoint::CommitWritten),
            "ref_fenced" => Ok(FaultPoint::RefFenced),
            "ref_updated" => Ok(FaultPoint::RefUpdated),
            "spool_staged" => Ok(FaultPoint::SpoolStaged),
            "source_staged" => Ok(FaultPoint::SourceStaged),
            "result_accepted" => Ok(FaultPoint::ResultAccepted),
            "before_push" => Ok(FaultPoint::BeforePush),
            "push_fenced" => Ok(FaultPoint::PushFenced),
            "after_push" => Ok(FaultPoint::AfterPush),
            other => Phase::parse(other).map(FaultPoint::AfterPhase).map_err(|_| {
                Error::with(
                    Code::CONFIG_INVALID,
                    format!(
                        "{ENV}: unknown fault point {other:?} (a checkpoint phase, commit_written, ref_fenced, ref_updated, spool_staged, source_staged, result_accepted, before_push, push_fenced or after_push)"
                    ),
                )
            }),
        }
    }

    /// The point's name, as parsed.
    pub fn as_str(self) -> &'static str {
        match self {
            FaultPoint::AfterPhase(p) => p.as_str(),
            FaultPoint::CommitWritten => "commit_written",
            FaultPoint::RefFenced => "ref_fenced",
            FaultPoint::RefUpdated => "ref_updated",
            FaultPoint::SpoolStaged => "spool_staged",
            FaultPoint::SourceStaged => "source_staged",
            FaultPoint::ResultAccepted => "result_accepted",
            FaultPoint::BeforePush => "before_push",
            FaultPoint::PushFenced => "push_fenced",
            FaultPoint::AfterPush => "after_push",
        }
    }

    /// The fault the environment arms, if any.
    pub fn from_env() -> Result<Option<Armed>, Error> {
        let read = |var: &str| match std::env::var(var) {
            Ok(name) => FaultPoint::parse(&name).map(Some),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(e) => Err(Error::with(Code::CONFIG_INVALID, format!("{var}: {e}"))),
        };
        let armed = match (read(ENV)?, read(STOP_ENV)?) {
            (Some(_), Some(_)) => {
                return Err(Error::with(
                    Code::CONFIG_INVALID,
                    format!("{ENV} and {STOP_ENV} are both set; arm one fault at a time"),
                ));
            }
            (Some(point), None) => Some(Armed {
                point,
                action: Action::Kill,
            }),
            (None, Some(point)) => Some(Armed {
                point,
                action: Action::Stop,
            }),
            (None, None) => None,
        };
        if let Some(a) = armed {
            tracing::warn!(
                "FAULT INJECTION ACTIVE: this worker {} itself at {}",
                match a.action {
                    Action::Kill => "kills",
                    Action::Stop => "stops",
                },
                a.point.as_str()
            );
        }
        Ok(armed)
    }
}

/// The environment variable arming an injected error:
/// `<phase>:<CODE>` makes the step that follows checkpoint `<phase>` (or
/// `start`, the first step of an attempt) fail with `CODE`, once per
/// process. The honest-failure tests use it to stand in for a git, spool
/// or journal failure at that step, and check the task then ends with
/// that code.
pub const ERROR_ENV: &str = "AIRLOCK_FAULT_ERROR_AT";

/// An armed error: after which phase (`None`: before the first), which code.
pub type InjectedError = (Option<Phase>, Code);

static ERROR_ARMED: std::sync::OnceLock<Option<InjectedError>> = std::sync::OnceLock::new();
static ERROR_FIRED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Parses `<phase>:<CODE>` (`start` for before the first checkpoint).
pub fn parse_error(text: &str) -> Result<InjectedError, Error> {
    let bad = |why: &str| {
        Error::with(
            Code::CONFIG_INVALID,
            format!("{ERROR_ENV}={text:?}: {why} (<phase or start>:<CODE>)"),
        )
    };
    let (phase, code) = text.split_once(':').ok_or_else(|| bad("no colon"))?;
    let phase = match phase {
        "start" => None,
        p => Some(Phase::parse(p).map_err(|_| bad("unknown phase"))?),
    };
    let code = Code::from_name(code).ok_or_else(|| bad("unknown code"))?;
    Ok((phase, code))
}

/// Reads and checks [`ERROR_ENV`] (a start-up error when malformed).
pub fn arm_error_from_env() -> Result<Option<InjectedError>, Error> {
    let armed = match std::env::var(ERROR_ENV) {
        Ok(text) => Some(parse_error(&text)?),
        Err(std::env::VarError::NotPresent) => None,
        Err(e) => {
            return Err(Error::with(
                Code::CONFIG_INVALID,
                format!("{ERROR_ENV}: {e}"),
            ));
        }
    };
    if let Some((phase, code)) = armed {
        tracing::warn!(
            "FAULT INJECTION ACTIVE: the step after {} fails once with {code}",
            phase.map_or("start", Phase::as_str)
        );
    }
    let _ = ERROR_ARMED.set(armed);
    Ok(armed)
}

/// The armed error, the first time an attempt is about to take the step
/// after `phase`.
pub fn injected_error(phase: Option<Phase>, task: &str) -> Option<Error> {
    let (at, code) = (*ERROR_ARMED.get()?)?;
    if at != phase || ERROR_FIRED.swap(true, std::sync::atomic::Ordering::SeqCst) {
        return None;
    }
    eprintln!(
        "fault injection: {code} after {} task {task}",
        phase.map_or("start", Phase::as_str)
    );
    Some(Error::with(code, "injected by AIRLOCK_FAULT_ERROR_AT"))
}

/// The environment variable naming a phase after which an attempt thread
/// wedges: it blocks for good, as a call that never returns would, while
/// the rest of the worker (its lease renewer included) runs on. The
/// watchdog test uses it to show such a worker stops pinging systemd.
pub const WEDGE_ENV: &str = "AIRLOCK_FAULT_WEDGE_AT";

/// Blocks the calling attempt thread for good when [`WEDGE_ENV`] names the
/// phase it is about to leave (`start`: before the first checkpoint).
pub fn wedge(phase: Option<Phase>, task: &str) {
    let Ok(at) = std::env::var(WEDGE_ENV) else {
        return;
    };
    if at != phase.map_or("start", Phase::as_str) {
        return;
    }
    eprintln!("fault injection: wedged after {at} task {task}");
    loop {
        std::thread::park();
    }
}

/// Whether a stop fault already fired in this process.
static STOPPED_ONCE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// SIGKILLs (or, once, SIGSTOPs) this process when `armed` is at `here`.
pub fn hit(armed: Option<Armed>, here: FaultPoint, task: &str) {
    let Some(armed) = armed.filter(|a| a.point == here) else {
        return;
    };
    match armed.action {
        Action::Kill => {
            eprintln!("fault injection: SIGKILL at {} task {task}", here.as_str());
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
        }
        Action::Stop => {
            if !STOPPED_ONCE.swap(true, std::sync::atomic::Ordering::SeqCst) {
                eprintln!("fault injection: SIGSTOP at {} task {task}", here.as_str());
                let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP);
                eprintln!(
                    "fault injection: resumed after SIGSTOP at {} task {task}",
                    here.as_str()
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for name in [
            "claimed",
            "workspace_prepared",
            "verification_passed",
            "commit_done",
            "result_pending",
            "result_submitted",
            "commit_written",
            "ref_updated",
            "spool_staged",
            "source_staged",
            "result_accepted",
        ] {
            assert_eq!(FaultPoint::parse(name).unwrap().as_str(), name);
        }
        assert_eq!(
            FaultPoint::parse("commit_dne").unwrap_err().code,
            Code::CONFIG_INVALID
        );
    }

    #[test]
    fn every_phase_is_a_point_and_each_attempt_passes_its_own() {
        let all = FaultPoint::all();
        for &phase in Phase::ALL {
            assert!(all.contains(&FaultPoint::AfterPhase(phase)), "{phase:?}");
        }
        for p in &all {
            assert_eq!(FaultPoint::parse(p.as_str()).unwrap(), *p);
        }
        let passed = |a: Attempt| -> Vec<&str> {
            all.iter()
                .filter(|p| p.passed_by(a))
                .map(|p| p.as_str())
                .collect()
        };
        // The stretches the attempts share, in the order they are passed.
        let verified = [
            "claimed",
            "spool_staged",
            "workspace_prepared",
            "verification_passed",
        ];
        let committed = ["commit_written", "ref_fenced", "ref_updated", "commit_done"];
        let pushed = ["before_push", "push_fenced", "after_push", "published"];
        let answered = ["result_pending", "result_accepted", "result_submitted"];
        assert_eq!(
            passed(Attempt::Commit),
            [&verified[..], &committed, &answered].concat()
        );
        assert_eq!(
            passed(Attempt::Publication),
            [&verified[..], &committed, &pushed, &answered].concat()
        );
        assert_eq!(
            passed(Attempt::Capture),
            [&verified[..], &["source_capture_done"], &answered].concat()
        );
    }

    #[test]
    fn injected_errors_name_a_phase_and_a_catalogue_code() {
        assert_eq!(
            parse_error("claimed:GIT_FAILED").unwrap(),
            (Some(Phase::Claimed), Code::GIT_FAILED)
        );
        assert_eq!(
            parse_error("start:STORE_CORRUPT").unwrap(),
            (None, Code::STORE_CORRUPT)
        );
        for bad in ["claimed", "claimd:GIT_FAILED", "claimed:NOT_A_CODE"] {
            assert_eq!(parse_error(bad).unwrap_err().code, Code::CONFIG_INVALID);
        }
    }
}

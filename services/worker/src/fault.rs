//! Fault injection for the crash matrix (tests/crash), compiled only with
//! the `fault-injection` feature: packaged binaries are built without it
//! and have no code path that kills the worker on purpose.
//!
//! `AIRLOCK_FAULT_KILL_AFTER=<point>` makes the worker SIGKILL itself the
//! first time it passes `<point>`:
//!
//! - a checkpoint phase name (`claimed`, `workspace_prepared`, …): right
//!   after that checkpoint was durably appended;
//! - `ref_updated`: after the compare-and-swap moved the agent/ branch to
//!   the governed commit, before the `commit_done` checkpoint is appended;
//! - `result_accepted`: after the supervisor accepted the result
//!   (SubmitResult returned OK), before `result_submitted` is appended.
//!
//! An unknown name is a start-up error. Before raising SIGKILL the worker
//! writes `fault injection: SIGKILL at <point> task <task>` to stderr, so
//! the harness can tell this kill from any other.

use airlock_proto::checkpoint::Phase;
use airlock_proto::{Code, Error};

/// The environment variable naming the fault point.
pub const ENV: &str = "AIRLOCK_FAULT_KILL_AFTER";

/// Where the worker may kill itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultPoint {
    /// Right after this checkpoint phase was appended.
    AfterPhase(Phase),
    /// The branch ref was updated; `commit_done` is not yet appended.
    RefUpdated,
    /// The supervisor accepted the result; `result_submitted` is not yet
    /// appended.
    ResultAccepted,
}

impl FaultPoint {
    /// Parses a fault point name.
    pub fn parse(name: &str) -> Result<Self, Error> {
        match name {
            "ref_updated" => Ok(FaultPoint::RefUpdated),
            "result_accepted" => Ok(FaultPoint::ResultAccepted),
            other => Phase::parse(other).map(FaultPoint::AfterPhase).map_err(|_| {
                Error::with(
                    Code::CONFIG_INVALID,
                    format!(
                        "{ENV}: unknown fault point {other:?} (a checkpoint phase, ref_updated or result_accepted)"
                    ),
                )
            }),
        }
    }

    /// The point's name, as parsed.
    pub fn as_str(self) -> &'static str {
        match self {
            FaultPoint::AfterPhase(p) => p.as_str(),
            FaultPoint::RefUpdated => "ref_updated",
            FaultPoint::ResultAccepted => "result_accepted",
        }
    }

    /// The fault point the environment names, if any.
    pub fn from_env() -> Result<Option<Self>, Error> {
        match std::env::var(ENV) {
            Ok(name) => {
                let point = FaultPoint::parse(&name)?;
                tracing::warn!(
                    "FAULT INJECTION ACTIVE: this worker kills itself at {}",
                    point.as_str()
                );
                Ok(Some(point))
            }
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(e) => Err(Error::with(Code::CONFIG_INVALID, format!("{ENV}: {e}"))),
        }
    }
}

/// SIGKILLs this process when `armed` is `here`.
pub fn hit(armed: Option<FaultPoint>, here: FaultPoint, task: &str) {
    if armed == Some(here) {
        eprintln!("fault injection: SIGKILL at {} task {task}", here.as_str());
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
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
            "ref_updated",
            "result_accepted",
        ] {
            assert_eq!(FaultPoint::parse(name).unwrap().as_str(), name);
        }
        assert_eq!(
            FaultPoint::parse("commit_dne").unwrap_err().code,
            Code::CONFIG_INVALID
        );
    }
}

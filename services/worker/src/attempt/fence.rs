//! The fence around every move of a task's branch: before the worker moves
//! the agent branch in the authority repository, or pushes it to the
//! upstream, it asks the supervisor to fence the attempt
//! (`Worker1.Fence`). The supervisor grants it only to the current lease
//! of a RUNNING task, in the same transaction that checks them, and until
//! the fence ends it refuses to cancel the task (`TASK_COMMITTING`) and
//! lets no lease expiry take it. So a cancel acknowledged, or a lease
//! taken, comes either before the fence — which is then refused, and no
//! ref moves — or after the step.
//!
//! The hold covers the step whatever happens to this process: it is the
//! step's own bound plus a start window, and the step is started only
//! within the window, by the worker's monotonic clock counted from before
//! it asked (so the call's own delay counts against the worker). A worker
//! paused in between (a stop, a frozen VM) finds the window gone and asks
//! again instead of moving the ref on an old answer. A worker killed
//! inside a fence leaves its task to wait at most the hold.

use super::{Run, Step};
use airlock_proto::bus::{FenceRequest, FenceStep};
use airlock_proto::{Code, Error};
use std::time::{Duration, Instant};

/// How long after asking the worker may still start a fenced step.
const START_WINDOW: Duration = Duration::from_secs(10);

/// What a local `git update-ref` is given to end in: it takes milliseconds.
const REF_BOUND: Duration = Duration::from_secs(10);

/// The hold asked for the compare-and-swap of the agent branch.
pub(super) const REF_HOLD: Duration = hold_for(REF_BOUND);

/// How often a fence is asked again when its answer came too late to act
/// on (the worker paused between asking and acting).
const ASKS: usize = 3;

/// The hold for a step bounded by `bound` (a push's timeout, after which
/// git is killed): started within the start window, it ends before the
/// hold does.
pub(super) const fn hold_for(bound: Duration) -> Duration {
    bound.saturating_add(START_WINDOW)
}

impl Run<'_> {
    /// Runs `act` — the step that moves the branch to `commit` — under a
    /// fence for `step` held for `hold`, and releases the fence afterwards
    /// (whether `act` succeeded or not; a release that fails leaves the
    /// fence to end by itself). A refused fence is returned as it is: the
    /// task was cancelled or the lease is gone, and `act` never runs.
    pub(super) fn fenced<T>(
        &self,
        step: FenceStep,
        commit: &str,
        hold: Duration,
        act: impl FnOnce() -> Step<T>,
    ) -> Step<T> {
        let request = FenceRequest {
            step,
            commit_oid: Some(commit.to_owned()),
            hold_ms: u64::try_from(hold.as_millis()).unwrap_or(u64::MAX),
        };
        let mut asks = 0;
        loop {
            let asked = Instant::now();
            self.w.bus.fence(&self.grant.lease, &request)?;
            #[cfg(feature = "fault-injection")]
            crate::fault::hit(
                self.w.settings.fault,
                match step {
                    FenceStep::Push => crate::fault::FaultPoint::PushFenced,
                    _ => crate::fault::FaultPoint::RefFenced,
                },
                &self.cb.task_id,
            );
            if asked.elapsed() < START_WINDOW {
                break;
            }
            asks += 1;
            tracing::warn!(task = %self.cb.task_id, "the fence for the {} came {:?} after it was asked; asking again", step.as_str(), asked.elapsed());
            if asks == ASKS {
                return Err(Error::with(
                    Code::RUNTIME_UNAVAILABLE,
                    format!(
                        "the fence for the {} came too late {ASKS} times",
                        step.as_str()
                    ),
                ));
            }
        }
        let outcome = act();
        self.unfence();
        outcome
    }

    /// Releases the attempt's fence, so that a cancel need not wait for
    /// its end. Best effort: an unreleased fence ends by itself.
    fn unfence(&self) {
        let release = FenceRequest {
            step: FenceStep::Release,
            commit_oid: None,
            hold_ms: 0,
        };
        if let Err(e) = self.w.bus.fence(&self.grant.lease, &release) {
            tracing::warn!(task = %self.cb.task_id, "the fence was not released (it ends by itself): {e}");
        }
    }
}

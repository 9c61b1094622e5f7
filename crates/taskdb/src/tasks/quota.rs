//! Planner agents' quotas, counted from the store at submission.
//!
//! Two quotas per agent (`[[agent]] tasks_per_hour`, `cpu_seconds_per_day`),
//! each over a window of the store's clock that ends now: the tasks the
//! agent submitted in the last [`HOUR_MS`] (`tasks.created_at_ms`), and the
//! CPU time its tasks' verification used in the last [`DAY_MS`] (each
//! result's `cpu_ms`, written when the result is recorded, by its
//! `received_at_ms`; every attempt counts). A submission that finds either
//! reached is refused with `AGENT_QUOTA_EXCEEDED` naming the quota and its
//! figures. On PostgreSQL the count and the insert run under the agent's
//! transaction-scoped advisory lock, so two hosts' submissions of one agent
//! never both pass on the same count.

use super::Actor;
use super::tx::Tx;
use crate::error::StoreResult;
use airlock_proto::bus::AgentUsage;
use airlock_proto::task::TaskResult;
use airlock_proto::{Code, Error};
use serde_json::{Value, json};

/// The window of `tasks_per_hour`, in store milliseconds.
pub const HOUR_MS: i64 = 3_600_000;
/// The window of `cpu_seconds_per_day`, in store milliseconds.
pub const DAY_MS: i64 = 86_400_000;

/// The name of the quota on tasks submitted per hour, as refusals, events
/// and metrics name it.
pub const TASKS_PER_HOUR: &str = "tasks_per_hour";
/// The name of the quota on CPU seconds per day.
pub const CPU_SECONDS_PER_DAY: &str = "cpu_seconds_per_day";

/// One agent's quotas (its `[[agent]]` table's); 0: none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AgentQuota {
    /// Most tasks submitted in any [`HOUR_MS`] of store time.
    pub tasks_per_hour: u32,
    /// Most CPU seconds its tasks' verification may use in any
    /// [`DAY_MS`] of store time.
    pub cpu_seconds_per_day: u64,
}

impl AgentQuota {
    /// No quota.
    pub const NONE: AgentQuota = AgentQuota {
        tasks_per_hour: 0,
        cpu_seconds_per_day: 0,
    };

    /// Whether it limits anything.
    pub fn is_none(&self) -> bool {
        self.tasks_per_hour == 0 && self.cpu_seconds_per_day == 0
    }
}

/// The CPU milliseconds one result's verification used: the one place the
/// figure is read. Results do not carry the commands' CPU time yet (the
/// executor's per-command CPU figures are planned, issue 44), so each
/// command counts its wall-clock `duration_ms`, which is at least its CPU
/// time for a single-threaded command and may be less for a parallel one.
/// Recorded with the result (`results.cpu_ms`); schema migrations filled it
/// in the same way for results recorded before it.
pub fn verification_cpu_ms(result: &TaskResult) -> u64 {
    result
        .verification
        .iter()
        .fold(0u64, |sum, c| sum.saturating_add(c.duration_ms))
}

/// A submission a quota refused: which quota, and its figures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct QuotaExceeded {
    pub agent: String,
    pub quota: &'static str,
    /// The limit, in the quota's unit (tasks, CPU seconds).
    pub limit: u64,
    /// The use in its window, in the same unit (CPU seconds rounded down).
    pub used: u64,
}

impl QuotaExceeded {
    /// The refusal as it crosses the bus.
    pub fn error(&self) -> Error {
        let detail = match self.quota {
            TASKS_PER_HOUR => format!(
                "agent {:?} submitted {} tasks in the last 3600 s; its quota {TASKS_PER_HOUR} is {}",
                self.agent, self.used, self.limit
            ),
            _ => format!(
                "agent {:?}'s tasks used {} CPU seconds (their verification commands' wall-clock time) in the last 86400 s; its quota {CPU_SECONDS_PER_DAY} is {}",
                self.agent, self.used, self.limit
            ),
        };
        Error::with(Code::AGENT_QUOTA_EXCEEDED, detail)
    }

    /// What the denied event records beside the detail.
    pub fn payload(&self) -> Value {
        json!({
            "agent": self.agent,
            "quota": self.quota,
            "limit": self.limit,
            "used": self.used,
        })
    }
}

/// The use agent `agent` has made of its quotas, at this transaction's
/// time, and its tasks RUNNING now.
pub(crate) fn usage(tx: &mut dyn Tx, agent: &str) -> StoreResult<AgentUsage> {
    let now = tx.now();
    tx.agent_usage(agent, now - HOUR_MS, now - DAY_MS)
}

/// Refuses a submission by `actor` that `quota` does not allow, counting
/// in `tx` (locked for the agent first, so a concurrent submission of the
/// same agent on another host waits for this one). An actor that is no
/// agent has no quota.
pub(crate) fn check(
    tx: &mut dyn Tx,
    actor: &Actor,
    quota: &AgentQuota,
) -> StoreResult<Result<(), QuotaExceeded>> {
    let Some(agent) = actor.agent() else {
        return Ok(Ok(()));
    };
    if quota.is_none() {
        return Ok(Ok(()));
    }
    tx.lock_agent(agent)?;
    let used = usage(tx, agent)?;
    let over = |quota: &'static str, limit: u64, used: u64| QuotaExceeded {
        agent: agent.to_owned(),
        quota,
        limit,
        used,
    };
    let tasks_limit = u64::from(quota.tasks_per_hour);
    if tasks_limit > 0 && used.tasks_last_hour >= tasks_limit {
        return Ok(Err(over(TASKS_PER_HOUR, tasks_limit, used.tasks_last_hour)));
    }
    let cpu_limit = quota.cpu_seconds_per_day;
    if cpu_limit > 0 && used.cpu_ms_last_day >= cpu_limit.saturating_mul(1000) {
        return Ok(Err(over(
            CPU_SECONDS_PER_DAY,
            cpu_limit,
            used.cpu_ms_last_day / 1000,
        )));
    }
    Ok(Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(quota: &'static str) -> QuotaExceeded {
        QuotaExceeded {
            agent: "planner".into(),
            quota,
            limit: 10,
            used: 12,
        }
    }

    #[test]
    fn a_refusal_names_its_quota_and_figures() {
        let e = refusal(TASKS_PER_HOUR).error();
        assert_eq!(e.code, Code::AGENT_QUOTA_EXCEEDED);
        assert_eq!(
            e.detail.as_deref(),
            Some(
                "agent \"planner\" submitted 12 tasks in the last 3600 s; its quota tasks_per_hour is 10"
            )
        );
        let e = refusal(CPU_SECONDS_PER_DAY).error();
        assert!(
            e.detail
                .as_deref()
                .unwrap()
                .ends_with("its quota cpu_seconds_per_day is 10"),
            "{e}"
        );
        assert_eq!(
            refusal(CPU_SECONDS_PER_DAY).payload()["quota"],
            "cpu_seconds_per_day"
        );
    }
}

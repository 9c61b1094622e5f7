//! Fair claims: which queued task a claim takes.
//!
//! Every task belongs to one *submitter class*: the planner agent that
//! submitted it (`submitter_agent`; an agent is one submitter whichever
//! user it runs as), else the uid that submitted it (`submitter_uid`),
//! else — a task whose submitter is not on record — a class of its own.
//! Among the claimable tasks (QUEUED, attempts left, of the repositories
//! the claimer serves) a claim takes the oldest task (`seq`) of the class
//! that, in this order,
//!
//! 1. has the fewest tasks RUNNING now,
//! 2. was served longest ago (its last claim; a class never served first),
//! 3. has the oldest claimable task,
//!
//! passing over every class at its cap ([`RunningCaps`]). The first rule
//! interleaves submitters while workers run several tasks at once; the
//! second does it when one slot frees at a time, so one submitter's
//! hundred queued tasks never starve another's one: it is the next claim.
//!
//! The rule is written here once; each engine answers three questions in
//! its own SQL ([`Tx::claimable_classes`], [`Tx::try_lock_class`],
//! [`Tx::oldest_of_class`]). On SQLite the write transaction excludes every
//! other writer, so the counts are exact. On PostgreSQL several hosts claim
//! at once: a claim takes its class's transaction-scoped advisory lock
//! without waiting (a class another claim holds is passed over, as `SKIP
//! LOCKED` passes over a row), counts the class's RUNNING tasks again in
//! the statement that locks the row (`FOR UPDATE SKIP LOCKED`), after the
//! lock, so a cap holds across hosts: two claims of one class never
//! commit on the same count.

use super::row::TaskRow;
use super::tx::Tx;
use crate::error::StoreResult;
use std::collections::BTreeMap;

/// A task row's submitter class as SQL, the same text in both engines
/// (`'agent:' || name`, `'uid:' || uid` or `'task:' || task_id`).
pub(crate) const CLASS_SQL: &str = "(CASE WHEN submitter_agent IS NOT NULL \
     THEN 'agent:' || submitter_agent WHEN submitter_uid IS NOT NULL \
     THEN 'uid:' || submitter_uid ELSE 'task:' || task_id END)";

/// How a class key of an agent starts.
const AGENT_CLASS: &str = "agent:";
/// How the key of a class of one task (no submitter on record) starts.
const TASK_CLASS: &str = "task:";

/// Caps on the RUNNING tasks of each submitter class, as a claim takes
/// them (the supervisor passes its configuration's).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunningCaps {
    /// Every submitter's cap (`supervisor.max_running_per_submitter`);
    /// 0: none.
    pub per_submitter: u32,
    /// Agents' own caps (`[[agent]] max_running`), each replacing
    /// `per_submitter` for its agent; 0 or absent: `per_submitter`.
    pub per_agent: BTreeMap<String, u32>,
}

impl RunningCaps {
    /// No cap at all.
    pub const NONE: RunningCaps = RunningCaps {
        per_submitter: 0,
        per_agent: BTreeMap::new(),
    };

    /// The cap of the agent `agent`; 0: none.
    pub fn of_agent(&self, agent: &str) -> u32 {
        match self.per_agent.get(agent) {
            Some(&cap) if cap > 0 => cap,
            _ => self.per_submitter,
        }
    }

    /// The cap of the class `key`; 0: none. A class of one task has none
    /// (it never has more than that task).
    pub(crate) fn of_class(&self, key: &str) -> u32 {
        if let Some(agent) = key.strip_prefix(AGENT_CLASS) {
            self.of_agent(agent)
        } else if key.starts_with(TASK_CLASS) {
            0
        } else {
            self.per_submitter
        }
    }
}

/// What an engine tells of one class that has a claimable task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassHead {
    /// The class ([`CLASS_SQL`]).
    pub key: String,
    /// The `seq` of its oldest claimable task.
    pub first_seq: i64,
    /// Its tasks RUNNING now.
    pub running: i64,
    /// When a claim last took one of its tasks (store time), if ever.
    pub last_claim_ms: Option<i64>,
}

/// The task a claim takes, locked where the engine locks rows, or `None`:
/// the rule of the module docs. The class it came from is marked served
/// at this transaction's time.
pub(super) fn next_claimable(
    tx: &mut dyn Tx,
    repositories: Option<&[String]>,
    caps: &RunningCaps,
) -> StoreResult<Option<TaskRow>> {
    let mut heads = tx.claimable_classes(repositories)?;
    heads.retain(|h| {
        let cap = caps.of_class(&h.key);
        cap == 0 || h.running < i64::from(cap)
    });
    heads.sort_by_key(|h| (h.running, h.last_claim_ms.unwrap_or(i64::MIN), h.first_seq));
    for head in heads {
        if !tx.try_lock_class(&head.key)? {
            continue;
        }
        let cap = caps.of_class(&head.key);
        if let Some(row) = tx.oldest_of_class(&head.key, repositories, cap)? {
            if !head.key.starts_with(TASK_CLASS) {
                tx.mark_served(&head.key)?;
            }
            return Ok(Some(row));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agents_own_cap_replaces_the_submitters_and_a_lone_task_has_none() {
        let caps = RunningCaps {
            per_submitter: 2,
            per_agent: BTreeMap::from([("big".to_owned(), 8), ("zero".to_owned(), 0)]),
        };
        assert_eq!(caps.of_class("agent:big"), 8);
        assert_eq!(caps.of_class("agent:zero"), 2);
        assert_eq!(caps.of_class("agent:other"), 2);
        assert_eq!(caps.of_class("uid:1001"), 2);
        assert_eq!(caps.of_class("task:t-1"), 0);
        assert_eq!(RunningCaps::NONE.of_class("agent:big"), 0);
    }
}

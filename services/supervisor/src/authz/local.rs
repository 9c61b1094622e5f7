//! The local authoriser, for machines without polkit (airlock-local, or a
//! host an administrator runs without a polkit daemon): a fixed list of
//! unix users (`supervisor.local_users`) may do everything Tasks2 offers;
//! everyone else is refused with `AUTHORIZATION_DENIED`. The identity is
//! the uid the bus daemon reports for the caller, as for polkit.
//!
//! It is not a test switch: it decides on real, bus-verified identities
//! and denies by default. It only trades polkit's per-action rules and
//! interactive authentication for an explicit list.

use super::{Action, Authorizer, BoxFuture, Caller, Verdict};
use airlock_proto::{Code, Error};
use std::collections::BTreeSet;

/// The spelling of this authoriser in `supervisor.authorizer`.
pub const LOCAL: &str = "local";

/// Allows the listed uids every action, and the planners' uids reading and
/// submitting tasks only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalAuthorizer {
    uids: BTreeSet<u32>,
    planners: BTreeSet<u32>,
}

impl LocalAuthorizer {
    /// Allows exactly `uids`.
    pub fn new(uids: impl IntoIterator<Item = u32>) -> Self {
        LocalAuthorizer {
            uids: uids.into_iter().collect(),
            planners: BTreeSet::new(),
        }
    }

    /// Also allows `planners` what polkit's rule allows airlock-agent:
    /// reading and submitting tasks (`supervisor.local_planners`).
    pub fn with_planners(mut self, planners: impl IntoIterator<Item = u32>) -> Self {
        self.planners = planners.into_iter().collect();
        self
    }
}

impl Authorizer for LocalAuthorizer {
    fn name(&self) -> String {
        let uids: Vec<String> = self.uids.iter().map(u32::to_string).collect();
        format!("{LOCAL} (uids {})", uids.join(","))
    }

    fn is_for_tests(&self) -> bool {
        false
    }

    fn check<'a>(&'a self, action: Action, caller: &'a Caller) -> BoxFuture<'a, Verdict> {
        let planner = self.planners.contains(&caller.uid())
            && matches!(action, Action::Read | Action::Submit);
        let verdict = if self.uids.contains(&caller.uid()) || planner {
            Verdict::Allow
        } else {
            Verdict::Deny(Error::with(
                Code::AUTHORIZATION_DENIED,
                format!(
                    "uid {} is not in supervisor.local_users (action {})",
                    caller.uid(),
                    action.polkit_id()
                ),
            ))
        };
        Box::pin(async move { verdict })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_the_listed_uids_are_allowed() {
        let a = LocalAuthorizer::new([0, 1000]);
        for uid in [0, 1000] {
            let c = Caller::from_bus(":1.1", uid, None, false);
            assert!(matches!(a.check(Action::Manage, &c).await, Verdict::Allow));
        }
        let c = Caller::from_bus(":1.2", 1001, None, true);
        match a.check(Action::Read, &c).await {
            Verdict::Deny(e) => assert_eq!(e.code, Code::AUTHORIZATION_DENIED),
            Verdict::Allow => panic!("uid 1001 allowed"),
        }
        assert!(!a.is_for_tests());
    }

    #[tokio::test]
    async fn a_planner_may_read_and_submit_only() {
        let a = LocalAuthorizer::new([0]).with_planners([989]);
        let c = Caller::from_bus(":1.3", 989, None, false);
        for action in Action::ALL {
            let allowed = matches!(a.check(*action, &c).await, Verdict::Allow);
            assert_eq!(
                allowed,
                matches!(action, Action::Read | Action::Submit),
                "{action:?}"
            );
        }
    }
}

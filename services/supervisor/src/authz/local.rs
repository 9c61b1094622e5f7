//! The local authoriser, for machines without polkit (airlock-local, or a
//! host an administrator runs without a polkit daemon): a fixed list of
//! unix users (`supervisor.local_users`) may do everything Tasks1 offers;
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

/// Allows the listed uids every action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalAuthorizer {
    uids: BTreeSet<u32>,
}

impl LocalAuthorizer {
    /// Allows exactly `uids`.
    pub fn new(uids: impl IntoIterator<Item = u32>) -> Self {
        LocalAuthorizer {
            uids: uids.into_iter().collect(),
        }
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
        let verdict = if self.uids.contains(&caller.uid()) {
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
}

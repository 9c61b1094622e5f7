//! Authorisers for test harnesses. Never chosen implicitly: only an
//! explicit `authorizer = "allow-all-for-tests"` in the configuration or an
//! explicit `--authorizer` flag selects one, and the daemon announces it in
//! its start-up log and in the `org.airlock.Tasks2.Authorizer` property.

use super::{Action, Authorizer, BoxFuture, Caller, Verdict};
use airlock_proto::{Code, Error};
use std::collections::BTreeSet;

/// Allows a fixed set of actions and denies the rest
/// (`AUTHORIZATION_DENIED`), without asking anyone.
///
/// Spellings (for `--authorizer`):
/// - `allow-all-for-tests`: every action;
/// - `deny-all-for-tests`: none;
/// - `allow-for-tests:read,submit`: the listed actions only;
/// - `interactive-for-tests`: every action, but only for a caller whose
///   message allowed interactive authorisation; others get
///   `INTERACTIVE_AUTHORIZATION_REQUIRED`, as polkit's `auth_admin` does;
/// - `root-admin-for-tests`: uid 0 every action, every other uid reading
///   and submitting only (`read`, `submit`), as the shipped policy and
///   rules let root and the planner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TestAuthorizer {
    allowed: BTreeSet<Action>,
    challenge_unless_interactive: bool,
    root_admin: bool,
}

/// The spelling of the allow-everything test authoriser.
pub const ALLOW_ALL_FOR_TESTS: &str = "allow-all-for-tests";
/// The spelling of the deny-everything test authoriser.
pub const DENY_ALL_FOR_TESTS: &str = "deny-all-for-tests";
/// The spelling of the test authoriser that behaves like `auth_admin`.
pub const INTERACTIVE_FOR_TESTS: &str = "interactive-for-tests";
/// The spelling of the test authoriser under which root alone is an
/// administrator.
pub const ROOT_ADMIN_FOR_TESTS: &str = "root-admin-for-tests";
/// The prefix of the allow-list test authoriser.
pub const ALLOW_FOR_TESTS_PREFIX: &str = "allow-for-tests:";

impl TestAuthorizer {
    /// Allows everything.
    pub fn allow_all() -> Self {
        TestAuthorizer {
            allowed: Action::ALL.iter().copied().collect(),
            challenge_unless_interactive: false,
            root_admin: false,
        }
    }

    /// Allows uid 0 everything, every other uid `read` and `submit`.
    pub fn root_admin() -> Self {
        TestAuthorizer {
            root_admin: true,
            ..TestAuthorizer::allow_all()
        }
    }

    /// Allows everything to callers that allowed interaction, challenges
    /// the rest.
    pub fn interactive() -> Self {
        TestAuthorizer {
            challenge_unless_interactive: true,
            ..TestAuthorizer::allow_all()
        }
    }

    /// Denies everything.
    pub fn deny_all() -> Self {
        TestAuthorizer {
            allowed: BTreeSet::new(),
            challenge_unless_interactive: false,
            root_admin: false,
        }
    }

    /// Allows exactly `actions`.
    pub fn allowing(actions: impl IntoIterator<Item = Action>) -> Self {
        TestAuthorizer {
            allowed: actions.into_iter().collect(),
            challenge_unless_interactive: false,
            root_admin: false,
        }
    }

    /// Parses one of the spellings above; `None` if `s` is not one.
    pub fn parse(s: &str) -> Option<Result<Self, String>> {
        if s == ALLOW_ALL_FOR_TESTS {
            return Some(Ok(TestAuthorizer::allow_all()));
        }
        if s == DENY_ALL_FOR_TESTS {
            return Some(Ok(TestAuthorizer::deny_all()));
        }
        if s == INTERACTIVE_FOR_TESTS {
            return Some(Ok(TestAuthorizer::interactive()));
        }
        if s == ROOT_ADMIN_FOR_TESTS {
            return Some(Ok(TestAuthorizer::root_admin()));
        }
        let list = s.strip_prefix(ALLOW_FOR_TESTS_PREFIX)?;
        let mut allowed = BTreeSet::new();
        for name in list.split(',').filter(|n| !n.is_empty()) {
            match Action::from_short_name(name) {
                Some(a) => {
                    allowed.insert(a);
                }
                None => {
                    return Some(Err(format!(
                        "unknown action {name:?} in {s:?} (expected read, submit, manage)"
                    )));
                }
            }
        }
        Some(Ok(TestAuthorizer::allowing(allowed)))
    }
}

impl Authorizer for TestAuthorizer {
    fn name(&self) -> String {
        if self.root_admin {
            ROOT_ADMIN_FOR_TESTS.to_owned()
        } else if self.challenge_unless_interactive {
            INTERACTIVE_FOR_TESTS.to_owned()
        } else if self.allowed.len() == Action::ALL.len() {
            ALLOW_ALL_FOR_TESTS.to_owned()
        } else if self.allowed.is_empty() {
            DENY_ALL_FOR_TESTS.to_owned()
        } else {
            let names: Vec<&str> = self.allowed.iter().map(|a| a.short_name()).collect();
            format!("{ALLOW_FOR_TESTS_PREFIX}{}", names.join(","))
        }
    }

    fn is_for_tests(&self) -> bool {
        true
    }

    fn check<'a>(&'a self, action: Action, caller: &'a Caller) -> BoxFuture<'a, Verdict> {
        let allowed = if self.root_admin && caller.uid() != 0 {
            matches!(action, Action::Read | Action::Submit)
        } else {
            self.allowed.contains(&action)
        };
        let verdict = if allowed {
            if self.challenge_unless_interactive && !caller.interactive() {
                Verdict::Deny(Error::with(
                    Code::INTERACTIVE_AUTHORIZATION_REQUIRED,
                    format!("{action} requires interactive authentication"),
                ))
            } else {
                Verdict::Allow
            }
        } else {
            Verdict::Deny(Error::with(
                Code::AUTHORIZATION_DENIED,
                format!("{} is denied by the {} authoriser", action, self.name()),
            ))
        };
        Box::pin(std::future::ready(verdict))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_round_trip() {
        for s in [
            ALLOW_ALL_FOR_TESTS,
            DENY_ALL_FOR_TESTS,
            INTERACTIVE_FOR_TESTS,
            ROOT_ADMIN_FOR_TESTS,
            "allow-for-tests:read",
            "allow-for-tests:read,read-all",
            "allow-for-tests:read,submit",
        ] {
            let a = TestAuthorizer::parse(s).unwrap().unwrap();
            assert_eq!(a.name(), s);
        }
        assert!(TestAuthorizer::parse("polkit").is_none());
        assert!(
            TestAuthorizer::parse("allow-for-tests:write")
                .unwrap()
                .is_err()
        );
    }

    #[tokio::test]
    async fn allow_list_decides_per_action() {
        let a = TestAuthorizer::allowing([Action::Read]);
        let c = Caller::from_bus(":1.1", 0, None, false);
        assert_eq!(a.check(Action::Read, &c).await, Verdict::Allow);
        match a.check(Action::Manage, &c).await {
            Verdict::Deny(e) => assert_eq!(e.code, Code::AUTHORIZATION_DENIED),
            Verdict::Allow => panic!("manage must be denied"),
        }
    }

    #[tokio::test]
    async fn root_alone_is_an_administrator_under_root_admin() {
        let a = TestAuthorizer::root_admin();
        let root = Caller::from_bus(":1.1", 0, None, false);
        let planner = Caller::from_bus(":1.2", 1000, None, true);
        for action in Action::ALL {
            assert_eq!(a.check(*action, &root).await, Verdict::Allow, "{action:?}");
            let allowed = a.check(*action, &planner).await == Verdict::Allow;
            assert_eq!(
                allowed,
                matches!(action, Action::Read | Action::Submit),
                "{action:?}"
            );
        }
    }

    #[tokio::test]
    async fn interactive_mode_challenges_callers_that_did_not_allow_interaction() {
        let a = TestAuthorizer::interactive();
        let quiet = Caller::from_bus(":1.1", 0, None, false);
        let asking = Caller::from_bus(":1.1", 0, None, true);
        assert_eq!(a.check(Action::Read, &asking).await, Verdict::Allow);
        match a.check(Action::Read, &quiet).await {
            Verdict::Deny(e) => assert_eq!(e.code, Code::INTERACTIVE_AUTHORIZATION_REQUIRED),
            Verdict::Allow => panic!("must challenge"),
        }
    }
}

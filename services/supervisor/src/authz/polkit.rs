//! The polkit client: `org.freedesktop.PolicyKit1.Authority.CheckAuthorization`.
//!
//! Split in three so the parts that decide can be tested without polkit:
//! [`CheckRequest::new`] builds the call (subject, flags) from the caller,
//! [`PolkitAuthorizer`] sends it, and [`interpret`] turns whatever came
//! back — a `(bba{ss})` result, an error reply, no reply — into a
//! [`Verdict`]. Everything but `is_authorized = true` is a denial.

use super::{Action, Authorizer, BoxFuture, Caller, Verdict};
use airlock_proto::{Code, Error};
use std::collections::HashMap;
use std::time::Duration;
use zbus::message::Message;
use zbus::zvariant::Value;

/// polkit's bus name.
pub const POLKIT_BUS_NAME: &str = "org.freedesktop.PolicyKit1";
/// The authority object.
pub const AUTHORITY_PATH: &str = "/org/freedesktop/PolicyKit1/Authority";
/// The authority interface.
pub const AUTHORITY_INTERFACE: &str = "org.freedesktop.PolicyKit1.Authority";
/// `CheckAuthorizationFlags.AllowUserInteraction`.
pub const ALLOW_USER_INTERACTION: u32 = 1;
/// The subject kind airlock always uses.
pub const SUBJECT_KIND: &str = "system-bus-name";

/// How long a non-interactive check may take before airlock denies.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(25);
/// How long an interactive check (an admin typing a password) may take.
pub const INTERACTIVE_CHECK_TIMEOUT: Duration = Duration::from_secs(300);

/// The arguments of one `CheckAuthorization` call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckRequest {
    /// Always [`SUBJECT_KIND`].
    pub subject_kind: &'static str,
    /// The sender's unique bus name, the subject's only detail (`name`).
    pub subject_name: String,
    /// The polkit action id.
    pub action_id: &'static str,
    /// `0`, or [`ALLOW_USER_INTERACTION`] when the caller allowed it.
    pub flags: u32,
    /// How long to wait for the answer.
    pub timeout: Duration,
}

/// The D-Bus body of `CheckAuthorization`: `((sa{sv}) s a{ss} u s)`.
pub type CheckBody<'a> = (
    (&'a str, HashMap<&'a str, Value<'a>>),
    &'a str,
    HashMap<&'a str, &'a str>,
    u32,
    &'a str,
);

impl CheckRequest {
    /// The request for `action` on behalf of `caller`: the subject is the
    /// caller's bus name (never this daemon's pid), and interaction is
    /// allowed only when the caller's message said so.
    pub fn new(action: Action, caller: &Caller) -> Self {
        let interactive = caller.interactive();
        CheckRequest {
            subject_kind: SUBJECT_KIND,
            subject_name: caller.sender().to_owned(),
            action_id: action.polkit_id(),
            flags: if interactive {
                ALLOW_USER_INTERACTION
            } else {
                0
            },
            timeout: if interactive {
                INTERACTIVE_CHECK_TIMEOUT
            } else {
                CHECK_TIMEOUT
            },
        }
    }

    /// The call's body. No details are passed and no cancellation id.
    pub fn body(&self) -> CheckBody<'_> {
        let subject_details = HashMap::from([("name", Value::from(self.subject_name.as_str()))]);
        (
            (self.subject_kind, subject_details),
            self.action_id,
            HashMap::new(),
            self.flags,
            "",
        )
    }
}

/// polkit's `AuthorizationResult`: is_authorized, is_challenge, details.
pub type AuthorizationResult = (bool, bool, HashMap<String, String>);

/// Turns polkit's answer into a verdict. `reply` is the method return (or
/// the error) of the call; `Err` also covers no reply at all.
pub fn interpret(action: Action, reply: Result<Message, zbus::Error>) -> Verdict {
    let unavailable = |why: String| {
        Verdict::Deny(Error::with(
            Code::AUTHORITY_UNAVAILABLE,
            format!("polkit could not decide {action}: {why}; denying"),
        ))
    };
    let msg = match reply {
        Ok(m) => m,
        Err(zbus::Error::MethodError(name, text, _)) => {
            return unavailable(format!("{name}: {}", text.unwrap_or_default()));
        }
        Err(e) => return unavailable(e.to_string()),
    };
    let body = msg.body();
    // One argument: the AuthorizationResult structure (bba{ss}).
    let parsed: Result<(AuthorizationResult,), _> = body.deserialize();
    match parsed.map(|(r,)| r) {
        Ok((true, _, _)) => Verdict::Allow,
        Ok((false, true, _)) => Verdict::Deny(Error::with(
            Code::INTERACTIVE_AUTHORIZATION_REQUIRED,
            format!("{action} requires interactive authentication"),
        )),
        Ok((false, false, details)) => {
            let dismissed = details.get("polkit.dismissed").is_some_and(|v| v == "true");
            Verdict::Deny(Error::with(
                Code::AUTHORIZATION_DENIED,
                if dismissed {
                    format!("{action} was not authorised (the authentication dialog was dismissed)")
                } else {
                    format!("{action} is not authorised for this caller")
                },
            ))
        }
        Err(e) => unavailable(format!(
            "unexpected reply signature {}: {e}",
            body.signature()
        )),
    }
}

/// Asks polkit on the system bus; denies whenever polkit does not clearly
/// say yes.
#[derive(Clone, Debug)]
pub struct PolkitAuthorizer {
    conn: zbus::Connection,
}

impl PolkitAuthorizer {
    /// Uses `conn` (the daemon's own system-bus connection) to reach polkit.
    pub fn new(conn: zbus::Connection) -> Self {
        PolkitAuthorizer { conn }
    }

    async fn call(&self, req: &CheckRequest) -> Result<Message, zbus::Error> {
        let body = req.body();
        let call = self.conn.call_method(
            Some(POLKIT_BUS_NAME),
            AUTHORITY_PATH,
            Some(AUTHORITY_INTERFACE),
            "CheckAuthorization",
            &body,
        );
        match tokio::time::timeout(req.timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(zbus::Error::Failure(format!(
                "no answer within {} s",
                req.timeout.as_secs()
            ))),
        }
    }
}

impl Authorizer for PolkitAuthorizer {
    fn name(&self) -> String {
        "polkit".to_owned()
    }

    fn is_for_tests(&self) -> bool {
        false
    }

    fn check<'a>(&'a self, action: Action, caller: &'a Caller) -> BoxFuture<'a, Verdict> {
        Box::pin(async move {
            let req = CheckRequest::new(action, caller);
            interpret(action, self.call(&req).await)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zbus::message::Header;

    fn caller(interactive: bool) -> Caller {
        Caller::from_bus(":1.42", 1000, Some("alice".into()), interactive)
    }

    /// A method call like the one the authoriser sends, so replies can be
    /// built against its header exactly as polkit's would be.
    fn call_message(req: &CheckRequest) -> Message {
        Message::method_call(AUTHORITY_PATH, "CheckAuthorization")
            .unwrap()
            .destination(POLKIT_BUS_NAME)
            .unwrap()
            .interface(AUTHORITY_INTERFACE)
            .unwrap()
            .sender(":1.1")
            .unwrap()
            .build(&req.body())
            .unwrap()
    }

    /// Whether the serialised message contains `needle` (the header's
    /// SIGNATURE field is `g`, a length byte, the signature, NUL).
    fn wire_has(msg: &Message, needle: &str) -> bool {
        let bytes: &[u8] = msg.data();
        bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
    }

    /// polkit's recorded answer: an `AuthorizationResult` `(bba{ss})`.
    fn recorded(is_authorized: bool, is_challenge: bool, details: &[(&str, &str)]) -> Message {
        let req = CheckRequest::new(Action::Manage, &caller(false));
        let call = call_message(&req);
        let header: Header<'_> = call.header();
        let details: HashMap<&str, &str> = details.iter().copied().collect();
        let reply = Message::method_return(&header)
            .unwrap()
            .build(&((is_authorized, is_challenge, details),))
            .unwrap();
        // One argument on the wire: the AuthorizationResult structure.
        assert!(wire_has(&reply, "g\0\x09(bba{ss})\0"));
        reply
    }

    fn code_of(v: Verdict) -> Option<Code> {
        match v {
            Verdict::Allow => None,
            Verdict::Deny(e) => Some(e.code),
        }
    }

    #[test]
    fn subject_is_the_senders_bus_name_never_a_pid() {
        let req = CheckRequest::new(Action::Read, &caller(false));
        let ((kind, details), action_id, extra, flags, cancel) = req.body();
        assert_eq!(kind, "system-bus-name");
        assert_eq!(details.len(), 1, "only the name, no pid");
        assert_eq!(details["name"], Value::from(":1.42"));
        assert!(!details.contains_key("pid"));
        assert_eq!(action_id, "org.airlock.tasks.read");
        assert!(extra.is_empty());
        assert_eq!(flags, 0);
        assert_eq!(cancel, "");
    }

    #[test]
    fn interaction_is_allowed_only_when_the_caller_set_the_header_flag() {
        assert_eq!(CheckRequest::new(Action::Submit, &caller(false)).flags, 0);
        assert_eq!(
            CheckRequest::new(Action::Submit, &caller(true)).flags,
            ALLOW_USER_INTERACTION
        );
        assert_eq!(ALLOW_USER_INTERACTION, 1);
        assert!(
            CheckRequest::new(Action::Submit, &caller(true)).timeout
                > CheckRequest::new(Action::Submit, &caller(false)).timeout
        );
    }

    #[test]
    fn body_has_the_check_authorization_signature() {
        let req = CheckRequest::new(Action::Manage, &caller(true));
        let msg = call_message(&req);
        // Five arguments on the wire.
        assert!(wire_has(&msg, "g\0\x10(sa{sv})sa{ss}us\0"));
    }

    #[test]
    fn recorded_authorized_reply_allows() {
        assert_eq!(
            interpret(Action::Manage, Ok(recorded(true, false, &[]))),
            Verdict::Allow
        );
        // polkit may add details to a yes; still yes.
        assert_eq!(
            interpret(
                Action::Manage,
                Ok(recorded(
                    true,
                    false,
                    &[("polkit.retains_authorization_after_challenge", "1")]
                ))
            ),
            Verdict::Allow
        );
    }

    #[test]
    fn recorded_not_authorized_reply_denies() {
        assert_eq!(
            code_of(interpret(Action::Manage, Ok(recorded(false, false, &[])))),
            Some(Code::AUTHORIZATION_DENIED)
        );
        match interpret(
            Action::Manage,
            Ok(recorded(false, false, &[("polkit.dismissed", "true")])),
        ) {
            Verdict::Deny(e) => {
                assert_eq!(e.code, Code::AUTHORIZATION_DENIED);
                assert!(e.detail.unwrap().contains("dismissed"));
            }
            Verdict::Allow => panic!("dismissed must deny"),
        }
    }

    #[test]
    fn recorded_challenge_reply_requires_interactive_authorization() {
        let v = interpret(Action::Submit, Ok(recorded(false, true, &[])));
        assert_eq!(code_of(v), Some(Code::INTERACTIVE_AUTHORIZATION_REQUIRED));
        assert_eq!(
            Code::INTERACTIVE_AUTHORIZATION_REQUIRED.dbus_error_name(),
            "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired"
        );
    }

    #[test]
    fn error_reply_and_no_reply_deny_as_unavailable() {
        let req = CheckRequest::new(Action::Read, &caller(false));
        let call = call_message(&req);
        let err_reply = Message::error(&call.header(), "org.freedesktop.DBus.Error.ServiceUnknown")
            .unwrap()
            .build(&("The name org.freedesktop.PolicyKit1 was not provided",))
            .unwrap();
        let e = zbus::Error::MethodError(
            "org.freedesktop.DBus.Error.ServiceUnknown"
                .try_into()
                .unwrap(),
            Some("The name org.freedesktop.PolicyKit1 was not provided".into()),
            err_reply,
        );
        assert_eq!(
            code_of(interpret(Action::Read, Err(e))),
            Some(Code::AUTHORITY_UNAVAILABLE)
        );
        assert_eq!(
            code_of(interpret(
                Action::Read,
                Err(zbus::Error::InputOutput(
                    std::io::Error::from(std::io::ErrorKind::BrokenPipe).into()
                ))
            )),
            Some(Code::AUTHORITY_UNAVAILABLE)
        );
        assert_eq!(
            code_of(interpret(
                Action::Read,
                Err(zbus::Error::Failure("no answer within 25 s".into()))
            )),
            Some(Code::AUTHORITY_UNAVAILABLE)
        );
    }

    #[test]
    fn malformed_reply_denies() {
        let req = CheckRequest::new(Action::Read, &caller(false));
        let call = call_message(&req);
        let wrong = Message::method_return(&call.header())
            .unwrap()
            .build(&(true,))
            .unwrap();
        assert_eq!(
            code_of(interpret(Action::Read, Ok(wrong))),
            Some(Code::AUTHORITY_UNAVAILABLE)
        );
    }

    #[tokio::test]
    async fn unreachable_polkit_denies() {
        // A bus with no polkit on it: the real call fails, and that is a denial.
        let bus = airlock_localbus::PrivateBus::start().expect("dbus-daemon");
        let conn = zbus::connection::Builder::address(bus.address())
            .unwrap()
            .build()
            .await
            .unwrap();
        let authorizer = PolkitAuthorizer::new(conn);
        let v = authorizer.check(Action::Read, &caller(false)).await;
        assert_eq!(code_of(v), Some(Code::AUTHORITY_UNAVAILABLE));
    }
}

//! Every refusal leaves the supervisor as a D-Bus error whose name is the
//! code's `dbus_error_name()` and whose message is the human detail.

use airlock_proto::{Code, Error};
use zbus::message::{Header, Message};
use zbus::names::{ErrorName, OwnedErrorName};

/// A refusal on its way to the bus.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BusError {
    code: Code,
    name: OwnedErrorName,
    message: String,
}

impl BusError {
    /// The catalogue code.
    pub fn code(&self) -> Code {
        self.code
    }

    /// The human message sent with the error.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl From<Error> for BusError {
    fn from(e: Error) -> Self {
        let name = OwnedErrorName::try_from(e.code.dbus_error_name())
            .unwrap_or_else(|_| OwnedErrorName::try_from("org.airlock.Error.INTERNAL").unwrap());
        // A refusal may quote what the caller sent; it leaves redacted.
        let message = match e.detail {
            Some(d) if !d.is_empty() => airlock_proto::redact::text(&d).into_owned(),
            _ => e.code.meaning().to_owned(),
        };
        BusError {
            code: e.code,
            name,
            message,
        }
    }
}

impl From<Code> for BusError {
    fn from(c: Code) -> Self {
        BusError::from(Error::new(c))
    }
}

impl zbus::DBusError for BusError {
    fn create_reply(&self, call: &Header<'_>) -> zbus::Result<Message> {
        Message::error(call, self.name.as_ref())?.build(&(self.message.as_str(),))
    }

    fn name(&self) -> ErrorName<'_> {
        self.name.as_ref()
    }

    fn description(&self) -> Option<&str> {
        Some(&self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zbus::DBusError;

    #[test]
    fn name_is_the_catalogue_name_and_message_the_detail() {
        let e = BusError::from(Error::with(Code::TASK_NOT_FOUND, "task-x"));
        assert_eq!(e.name().as_str(), "org.airlock.Error.TASK_NOT_FOUND");
        assert_eq!(e.description(), Some("task-x"));
        let e = BusError::from(Error::new(Code::AUTHORIZATION_DENIED));
        assert_eq!(e.name().as_str(), "org.freedesktop.DBus.Error.AccessDenied");
        assert_eq!(e.message(), Code::AUTHORIZATION_DENIED.meaning());
        for code in Code::ALL {
            let e = BusError::from(*code);
            assert_eq!(Code::from_dbus_error_name(e.name().as_str()), Some(*code));
        }
    }
}

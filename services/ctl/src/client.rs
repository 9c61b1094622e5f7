//! The supervisor, seen from the CLI: the shared client (`airlock-client`)
//! on the system bus, calls that carry ALLOW_INTERACTIVE_AUTHORIZATION when
//! a human can answer, and refusals mapped to the CLI's exit codes.

pub use airlock_proto::bus::BUS_NAME;
use airlock_proto::{Class, Code};
use std::fmt;
use std::io::IsTerminal;
use zbus::zvariant::OwnedValue;

/// Why a command failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CtlError {
    /// The catalogue code, when known.
    pub code: Option<Code>,
    /// The D-Bus error name, when the failure came from the bus.
    pub dbus_error: Option<String>,
    /// What happened, for a human.
    pub message: String,
    /// The process exit status.
    pub exit_code: u8,
}

impl CtlError {
    /// A failure decided here, with a catalogue code.
    pub fn local(code: Code, message: impl Into<String>) -> Self {
        CtlError {
            code: Some(code),
            dbus_error: None,
            message: message.into(),
            exit_code: code.exit_code(),
        }
    }

    /// A generic failure (exit 1).
    pub fn generic(message: impl Into<String>) -> Self {
        CtlError {
            code: None,
            dbus_error: None,
            message: message.into(),
            exit_code: 1,
        }
    }

    /// Maps a D-Bus error name (and its message) back to the catalogue.
    /// Bus-level failures to reach the supervisor (no owner of its name, no
    /// reply) are `RUNTIME_UNAVAILABLE`, as the client library says (seed
    /// 001's 503), with the bus's name kept beside it.
    pub fn from_dbus(name: &str, message: Option<String>) -> Self {
        let code = Code::from_dbus_error_name(name)
            .or_else(|| airlock_client::is_unreachable(name).then_some(Code::RUNTIME_UNAVAILABLE));
        let exit_code = match code {
            Some(c) => c.exit_code(),
            None => 1,
        };
        CtlError {
            code,
            dbus_error: Some(name.to_owned()),
            message: message.unwrap_or_else(|| name.to_owned()),
            exit_code,
        }
    }

    /// The catalogue name, or the D-Bus name when there is none.
    pub fn label(&self) -> String {
        match (&self.code, &self.dbus_error) {
            (Some(c), _) => c.as_str().to_owned(),
            (None, Some(n)) => n.clone(),
            (None, None) => "error".to_owned(),
        }
    }

    /// A hint for the human, when there is a useful one.
    pub fn hint(&self) -> Option<&'static str> {
        match self.code? {
            Code::INTERACTIVE_AUTHORIZATION_REQUIRED => {
                Some("run airlockctl from a terminal (without --no-ask-password) to authenticate")
            }
            Code::AUTHORITY_UNAVAILABLE => {
                Some("polkit did not answer the supervisor; is polkit.service running?")
            }
            Code::RUNTIME_UNAVAILABLE => Some(
                "the supervisor is not answering (stopped or restarting): systemctl status airlock-supervisor, then retry",
            ),
            _ => None,
        }
    }
}

impl fmt::Display for CtlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.label(), self.message)
    }
}

impl From<zbus::Error> for CtlError {
    fn from(e: zbus::Error) -> Self {
        match e {
            zbus::Error::MethodError(name, msg, _) => CtlError::from_dbus(name.as_str(), msg),
            zbus::Error::FDO(fdo) => {
                let name = zbus::DBusError::name(fdo.as_ref()).to_string();
                let msg = zbus::DBusError::description(fdo.as_ref()).map(str::to_owned);
                CtlError::from_dbus(&name, msg)
            }
            zbus::Error::InputOutput(io) => CtlError {
                code: Some(Code::RUNTIME_UNAVAILABLE),
                dbus_error: None,
                message: format!("cannot reach the system bus: {io}"),
                exit_code: Class::Unavailable.exit_code(),
            },
            other => CtlError::generic(other.to_string()),
        }
    }
}

/// Whether calls should allow interactive authorisation: stdin is a
/// terminal and the user did not say `--no-ask-password`.
pub fn wants_interaction(no_ask_password: bool) -> bool {
    !no_ask_password && std::io::stdin().is_terminal()
}

impl From<airlock_proto::Error> for CtlError {
    fn from(e: airlock_proto::Error) -> Self {
        CtlError {
            code: Some(e.code),
            dbus_error: Some(e.code.dbus_error_name()),
            message: e
                .detail
                .clone()
                .unwrap_or_else(|| e.code.as_str().to_owned()),
            exit_code: e.code.exit_code(),
        }
    }
}

/// A connection to the supervisor.
#[derive(Debug, Clone)]
pub struct Client {
    sup: airlock_client::Supervisor,
}

impl Client {
    /// Connects to the bus at `address`, or to the system bus
    /// (`DBUS_SYSTEM_BUS_ADDRESS` if set).
    pub async fn connect(interactive: bool, address: Option<&str>) -> Result<Client, CtlError> {
        // A human answering polkit's password prompt needs more time than
        // the default bound on a call.
        let sup = airlock_client::Supervisor::connect(address)
            .await?
            .interactive(interactive)
            .with_timeout(std::time::Duration::from_secs(if interactive {
                300
            } else {
                30
            }));
        Ok(Client { sup })
    }

    /// The typed client: every method of the bus contract.
    pub fn sup(&self) -> &airlock_client::Supervisor {
        &self.sup
    }

    /// The connection, for signal subscriptions.
    pub fn connection(&self) -> &zbus::Connection {
        self.sup.connection()
    }

    /// Whether calls allow interactive authorisation.
    pub fn interactive(&self) -> bool {
        self.sup.is_interactive()
    }

    /// Reads a Tasks2 property.
    pub async fn property<T>(&self, name: &str) -> Result<T, CtlError>
    where
        T: TryFrom<OwnedValue>,
        T::Error: Into<zbus::Error>,
    {
        Ok(self.sup.property::<T>(name).await?)
    }

    /// The unique name currently owning the supervisor's name, if any.
    pub async fn owner(&self) -> Result<Option<String>, CtlError> {
        Ok(self.sup.owner().await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dbus_error_names_map_back_to_catalogue_exit_codes() {
        let e = CtlError::from_dbus("org.airlock.Error.TASK_NOT_FOUND", Some("task-x".into()));
        assert_eq!(e.code, Some(Code::TASK_NOT_FOUND));
        assert_eq!(e.exit_code, Code::TASK_NOT_FOUND.exit_code());
        assert_eq!(e.to_string(), "TASK_NOT_FOUND: task-x");
        let e = CtlError::from_dbus("org.freedesktop.DBus.Error.AccessDenied", None);
        assert_eq!(e.code, Some(Code::AUTHORIZATION_DENIED));
        assert_eq!(e.exit_code, 5);
        let e = CtlError::from_dbus(
            "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired",
            None,
        );
        assert_eq!(e.exit_code, 11);
        assert!(e.hint().is_some());
        for name in [
            "org.freedesktop.DBus.Error.ServiceUnknown",
            "org.freedesktop.DBus.Error.NameHasNoOwner",
            "org.freedesktop.DBus.Error.NoReply",
        ] {
            let e = CtlError::from_dbus(name, None);
            assert_eq!(e.code, Some(Code::RUNTIME_UNAVAILABLE), "{name}");
            assert_eq!(e.exit_code, 9);
            assert_eq!(e.label(), "RUNTIME_UNAVAILABLE");
            assert_eq!(e.dbus_error.as_deref(), Some(name));
        }
        let e = CtlError::from_dbus("com.example.Weird", None);
        assert_eq!(e.exit_code, 1);
        assert_eq!(e.label(), "com.example.Weird");
    }
}

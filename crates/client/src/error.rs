//! D-Bus errors back to the catalogue.

use airlock_proto::{Code, Error};

/// D-Bus errors that mean the supervisor could not be reached (not that
/// it refused).
const UNREACHABLE: &[&str] = &[
    "org.freedesktop.DBus.Error.ServiceUnknown",
    "org.freedesktop.DBus.Error.NameHasNoOwner",
    "org.freedesktop.DBus.Error.NoReply",
    "org.freedesktop.DBus.Error.Timeout",
    "org.freedesktop.DBus.Error.TimedOut",
    "org.freedesktop.DBus.Error.Disconnected",
    "org.freedesktop.DBus.Error.Spawn.ChildExited",
];

/// True for a D-Bus error name that means "not reachable now".
pub fn is_unreachable(name: &str) -> bool {
    UNREACHABLE.contains(&name)
}

fn named(name: &str, detail: Option<String>) -> Error {
    match Code::from_dbus_error_name(name) {
        Some(code) => Error { code, detail },
        None if is_unreachable(name) => Error::with(
            Code::RUNTIME_UNAVAILABLE,
            format!("{name}: {}", detail.unwrap_or_default()),
        ),
        None => Error::with(
            Code::MESSAGE_INVALID,
            format!(
                "unexpected D-Bus error {name}: {}",
                detail.unwrap_or_default()
            ),
        ),
    }
}

/// Maps a zbus error to the catalogue: a named refusal to its code, a bus
/// that cannot be reached to RUNTIME_UNAVAILABLE.
pub fn from_zbus(e: zbus::Error) -> Error {
    match e {
        zbus::Error::MethodError(name, detail, _) => named(name.as_str(), detail),
        zbus::Error::FDO(fdo) => {
            let name = zbus::DBusError::name(fdo.as_ref()).to_string();
            let detail = zbus::DBusError::description(fdo.as_ref()).map(str::to_owned);
            named(&name, detail)
        }
        other => Error::with(Code::RUNTIME_UNAVAILABLE, other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_back_to_codes() {
        let e = named("org.airlock.Error.TASK_NOT_FOUND", Some("task-x".into()));
        assert_eq!(e.code, Code::TASK_NOT_FOUND);
        assert_eq!(
            named("org.freedesktop.DBus.Error.AccessDenied", None).code,
            Code::AUTHORIZATION_DENIED
        );
        assert_eq!(
            named("org.freedesktop.DBus.Error.ServiceUnknown", None).code,
            Code::RUNTIME_UNAVAILABLE
        );
        assert_eq!(named("com.example.Weird", None).code, Code::MESSAGE_INVALID);
    }
}

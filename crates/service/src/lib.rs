//! airlock-service: the start-up steps every airlock daemon shares, so the
//! daemons agree with each other.
//!
//! - **Logging:** one variable, `AIRLOCK_LOG` (an `EnvFilter`, default
//!   `info`), to stderr; under systemd (`JOURNAL_STREAM`) without time
//!   stamps or colours, and a closed stderr never takes a daemon down.
//!   The audit trail ([`AUDIT_TARGET`]) goes to journald natively under
//!   systemd, with its structured fields, at every `AIRLOCK_LOG` level.
//! - **Configuration:** [`load_config`] reads `airlock.toml` with the
//!   `airlock-config` parser and refuses with `CONFIG_INVALID`.
//! - **Users:** [`uid_of`] resolves a configured user (name or numeric uid)
//!   the same way everywhere, naming the key it came from.
//!
//! The bus address is named one way too, in `airlock-client`: a
//! `--bus-address` flag, else `DBUS_SYSTEM_BUS_ADDRESS`, else the system bus.

use airlock_config::Config;
use airlock_proto::{Code, Error};
use std::io::IsTerminal;
use std::path::Path;

/// The variable every daemon reads its log filter from.
pub const LOG_ENV: &str = "AIRLOCK_LOG";

/// The tracing target of the audit trail's journal entries (see the
/// supervisor's `journal` module). Under systemd these go to journald
/// natively, with their fields (`MESSAGE_ID`, `AIRLOCK_*`), whatever
/// `AIRLOCK_LOG` says; elsewhere they are ordinary lines on stderr.
pub const AUDIT_TARGET: &str = "airlock::audit";

/// Installs the daemon's log subscriber (see the crate docs).
pub fn init_logging() {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;

    let filter = tracing_subscriber::EnvFilter::try_from_env(LOG_ENV)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let under_systemd = std::env::var_os("JOURNAL_STREAM").is_some();
    // Field names as given (MESSAGE_ID, AIRLOCK_TASK_ID, ...), not F_-prefixed.
    let journal = under_systemd
        .then(tracing_journald::layer)
        .and_then(Result::ok)
        .map(|l| l.with_field_prefix(None));
    let audit_to_journal = journal.is_some();
    let journal = journal.map(|l| {
        l.with_filter(tracing_subscriber::filter::filter_fn(|m| {
            m.target() == AUDIT_TARGET
        }))
    });
    let fmt = tracing_subscriber::fmt::layer()
        // A closed stderr must not take the service down with it.
        .log_internal_errors(false)
        .with_writer(std::io::stderr);
    let fmt = if under_systemd {
        // The journal stamps time itself and shows no colours.
        fmt.without_time().with_ansi(false).boxed()
    } else {
        let colour = std::io::stderr().is_terminal()
            && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
        fmt.with_ansi(colour).boxed()
    };
    let fmt = fmt
        .with_filter(filter)
        .with_filter(tracing_subscriber::filter::filter_fn(move |m| {
            !(audit_to_journal && m.target() == AUDIT_TARGET)
        }));
    let _ = tracing_subscriber::registry()
        .with(fmt)
        .with(journal)
        .try_init();
}

/// Reads the configuration file at `path`.
pub fn load_config(path: &Path) -> Result<Config, Error> {
    Config::load(path).map_err(|e| Error::with(Code::CONFIG_INVALID, e.to_string()))
}

/// The uid of `user` (a name, or a numeric uid), configured at `key`.
pub fn uid_of(key: &str, user: &str) -> Result<u32, Error> {
    if let Ok(uid) = user.parse::<u32>() {
        return Ok(uid);
    }
    match nix::unistd::User::from_name(user) {
        Ok(Some(u)) => Ok(u.uid.as_raw()),
        Ok(None) => Err(Error::with(
            Code::CONFIG_INVALID,
            format!("{key}: user {user:?} does not exist"),
        )),
        Err(e) => Err(Error::with(
            Code::CONFIG_INVALID,
            format!("{key}: looking up user {user:?}: {e}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_resolve_by_name_or_number_and_name_their_key() {
        assert_eq!(uid_of("x.user", "root").unwrap(), 0);
        assert_eq!(uid_of("x.user", "4242").unwrap(), 4242);
        let e = uid_of("retry.user", "no-such-user-here").unwrap_err();
        assert_eq!(e.code, Code::CONFIG_INVALID);
        assert!(e.to_string().contains("retry.user"), "{e}");
    }
}

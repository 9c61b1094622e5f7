//! The audit trail of the proxy: one journal entry per connection.
//!
//! Every tunnel, when it closes, and every refused connection is one event
//! at [`airlock_service::AUDIT_TARGET`]: under systemd it goes to journald
//! natively with a stable `MESSAGE_ID` and the fields below; elsewhere
//! (airlock-local, the tests) it is a line of the log with the same
//! fields. `journalctl MESSAGE_ID=<TUNNEL> AIRLOCK_TASK_ID=<task>` lists
//! every tunnel a task's setup opened, and `MESSAGE_ID=<REFUSED>` every
//! connection refused.
//!
//! | field | value |
//! |-------|-------|
//! | `MESSAGE_ID` | [`TUNNEL`] or [`REFUSED`] |
//! | `AIRLOCK_OUTCOME` | `closed` or `refused` |
//! | `AIRLOCK_CODE` | the refusal's code; for a tunnel, empty or `EGRESS_LIMIT_EXCEEDED` |
//! | `AIRLOCK_TASK_ID`, `AIRLOCK_EGRESS_SESSION` | the task, and the attempt's session, the preamble named |
//! | `AIRLOCK_EGRESS_PEER_UID` | the uid that connected (SO_PEERCRED) |
//! | `AIRLOCK_EGRESS_TARGET` | the CONNECT's `host:port` |
//! | `AIRLOCK_EGRESS_ROUTE` | the route that served it (`direct (no route)`, `addresses PATTERN`, `via HOST:PORT PATTERN`) |
//! | `AIRLOCK_EGRESS_RESOLVED` | the address connected to (the parent proxy's, through a `via` route) |
//! | `AIRLOCK_EGRESS_BYTES_UP`, `AIRLOCK_EGRESS_BYTES_DOWN` | bytes from the setup, and to it |
//! | `AIRLOCK_EGRESS_DURATION_MS` | from accept to close |
//! | `AIRLOCK_EGRESS_DETAIL` | why, in words (never a credential) |
//!
//! `journalctl -x` explains both ids from `catalog/airlock-egress.catalog`
//! (installed in `/usr/lib/systemd/catalog/`), generated from [`CATALOG`];
//! an id never changes once released.

use std::fmt::Write as _;

/// Every tunnel, as it closes.
pub const TUNNEL: &str = "0c6f980104344503b13afa98a7d56bba";
/// Every refused connection.
pub const REFUSED: &str = "fc4e1d8a93e74000aa17c4c8dc8ed16c";

/// One `MESSAGE_ID`: the id, its subject and its explanation.
#[derive(Debug)]
pub struct CatalogEntry {
    /// 128 bits as 32 lower-case hex digits.
    pub id: &'static str,
    /// The catalogue's one-line subject.
    pub subject: &'static str,
    /// The explanation (`@FIELD@` is the entry's field).
    pub body: &'static str,
}

/// The proxy's journal entries.
pub const CATALOG: &[CatalogEntry] = &[
    CatalogEntry {
        id: TUNNEL,
        subject: "airlock-egress tunnel to @AIRLOCK_EGRESS_TARGET@ closed",
        body: "A setup's tunnel through airlock-egress ended. Task @AIRLOCK_TASK_ID@ (session\n\
@AIRLOCK_EGRESS_SESSION@) reached @AIRLOCK_EGRESS_TARGET@ at @AIRLOCK_EGRESS_RESOLVED@ by the route\n\
@AIRLOCK_EGRESS_ROUTE@: @AIRLOCK_EGRESS_BYTES_UP@ bytes sent, @AIRLOCK_EGRESS_BYTES_DOWN@ received, in\n\
@AIRLOCK_EGRESS_DURATION_MS@ ms. AIRLOCK_CODE is EGRESS_LIMIT_EXCEEDED when the session's bytes or time ran\n\
out. The proxy sees only ciphertext: what was fetched is the task's layer evidence\n\
(`airlockctl show @AIRLOCK_TASK_ID@ --json`, result.isolation.layer).",
    },
    CatalogEntry {
        id: REFUSED,
        subject: "airlock-egress refused @AIRLOCK_EGRESS_TARGET@: @AIRLOCK_CODE@",
        body: "airlock-egress refused a connection of task @AIRLOCK_TASK_ID@ (uid @AIRLOCK_EGRESS_PEER_UID@)\n\
to @AIRLOCK_EGRESS_TARGET@ (route @AIRLOCK_EGRESS_ROUTE@): @AIRLOCK_EGRESS_DETAIL@.\n\
The code @AIRLOCK_CODE@ is explained in /usr/share/doc/airlock/errors.md; a refusal only\n\
configuration can change ends the task. The routes are /etc/airlock/egress.toml.",
    },
];

/// The catalogue file's text.
pub fn catalog_text() -> String {
    let mut out = String::from(
        "# airlock-egress's journal message catalogue: what `journalctl -x` shows for each\n\
         # connection it served or refused. Generated from services/egress/src/audit.rs\n\
         # (UPDATE_DOCS=1 cargo test -p airlock-egress --lib audit); do not edit.\n",
    );
    for e in CATALOG {
        let _ = write!(
            out,
            "\n-- {}\nSubject: {}\nDefined-By: airlock\nSupport: man:airlock-egress(8)\nDocumentation: file:///usr/share/doc/airlock/privsep/egress.md\n\n{}\n",
            e.id, e.subject, e.body
        );
    }
    out
}

/// What one entry says about a connection.
#[derive(Debug, Default)]
pub struct Record {
    /// The peer's uid, once known.
    pub uid: Option<u32>,
    /// The preamble's task.
    pub task_id: String,
    /// The preamble's session.
    pub session: String,
    /// The CONNECT's target.
    pub target: String,
    /// The route's label.
    pub route: String,
    /// The address connected to.
    pub resolved: Option<std::net::SocketAddr>,
}

impl Record {
    fn resolved(&self) -> String {
        self.resolved.map(|a| a.to_string()).unwrap_or_default()
    }

    /// A refused connection.
    pub fn refused(&self, code: &str, detail: &str, duration_ms: u64) {
        tracing::warn!(
            target: airlock_service::AUDIT_TARGET,
            message_id = REFUSED,
            airlock_outcome = "refused",
            airlock_code = code,
            airlock_task_id = %self.task_id,
            airlock_egress_session = %self.session,
            airlock_egress_peer_uid = self.uid,
            airlock_egress_target = %self.target,
            airlock_egress_route = %self.route,
            airlock_egress_resolved = %self.resolved(),
            airlock_egress_bytes_up = 0u64,
            airlock_egress_bytes_down = 0u64,
            airlock_egress_duration_ms = duration_ms,
            airlock_egress_detail = detail,
            "egress refused {}: {code}",
            self.target
        );
    }

    /// A tunnel that ended; `code` is empty unless a limit closed it.
    pub fn closed(&self, code: &str, detail: &str, up: u64, down: u64, duration_ms: u64) {
        tracing::info!(
            target: airlock_service::AUDIT_TARGET,
            message_id = TUNNEL,
            airlock_outcome = "closed",
            airlock_code = code,
            airlock_task_id = %self.task_id,
            airlock_egress_session = %self.session,
            airlock_egress_peer_uid = self.uid,
            airlock_egress_target = %self.target,
            airlock_egress_route = %self.route,
            airlock_egress_resolved = %self.resolved(),
            airlock_egress_bytes_up = up,
            airlock_egress_bytes_down = down,
            airlock_egress_duration_ms = duration_ms,
            airlock_egress_detail = detail,
            "egress tunnel to {} closed{}{code}",
            self.target,
            if code.is_empty() { "" } else { ": " }
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_distinct_and_well_formed() {
        let mut seen = std::collections::HashSet::new();
        for e in CATALOG {
            assert_eq!(e.id.len(), 32, "{}", e.id);
            assert!(
                e.id.bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
            );
            assert!(seen.insert(e.id));
            assert!(!e.subject.contains('\n'));
        }
    }

    /// The file the package installs is this table (ids never reused:
    /// a released id's subject may not change).
    #[test]
    fn the_installed_catalogue_is_this_table() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../catalog/airlock-egress.catalog"
        );
        if std::env::var_os("UPDATE_DOCS").is_some() {
            std::fs::write(path, catalog_text()).unwrap();
            return;
        }
        let installed = std::fs::read_to_string(path).unwrap_or_default();
        assert_eq!(
            installed,
            catalog_text(),
            "catalog/airlock-egress.catalog is stale: UPDATE_DOCS=1 cargo test -p airlock-egress --lib audit"
        );
    }
}

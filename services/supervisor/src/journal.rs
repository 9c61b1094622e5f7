//! The audit trail in the journal.
//!
//! Every event the task store commits is also written to the journal, read
//! back from the event log after its transaction committed: an entry exists
//! only for an event that happened, and it carries what the log carries,
//! already redacted (the log's one insert redacts). Under systemd the entry
//! goes to journald natively (target [`airlock_service::AUDIT_TARGET`]) with
//! its fields:
//!
//! | field | value |
//! |-------|-------|
//! | `MESSAGE_ID` | one per action ([`CATALOG`]); every refusal shares [`REFUSED`] |
//! | `AIRLOCK_EVENT_ID` | the event's id in the log (tells a repeat from a new event) |
//! | `AIRLOCK_ACTION`, `AIRLOCK_OUTCOME`, `AIRLOCK_CODE` | what, allowed or denied, and the refusal's code |
//! | `AIRLOCK_TASK_ID` | the task, when the event concerns one |
//! | `AIRLOCK_ACTOR_KIND`, `AIRLOCK_ACTOR`, `AIRLOCK_ACTOR_UID` | who |
//! | `AIRLOCK_PAYLOAD` | the event's details as canonical JSON, at most [`MAX_PAYLOAD`] bytes |
//!
//! `journalctl -x` explains each `MESSAGE_ID` from the catalogue the package
//! installs (`/usr/lib/systemd/catalog/airlock.catalog`, generated from
//! [`CATALOG`] by [`catalog_text`] and checked by a test). An id must not
//! change once released: a test fails when an id of
//! `catalog/airlock.catalog` is gone or its subject changed (regenerating
//! the file overrides it, visibly in review).
//!
//! Delivery is at least once. With SQLite the id of the last event exported
//! is kept beside the database (`<database>.journal-cursor`), so events
//! committed just before a crash are exported after the restart. With
//! PostgreSQL, a queue several hosts share, each supervisor exports from
//! where the log stood when it started, so every host's journal carries the
//! queue's whole trail while that host runs.

use crate::ops::Ops;
use airlock_proto::Error;
use airlock_taskdb::tasks::{Event, EventOutcome, action};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::watch;

/// One kind of journal entry: its stable id and what `journalctl -x` says.
#[derive(Debug)]
pub struct CatalogEntry {
    /// The event log's action (for [`REFUSED`] and [`OTHER`], a label).
    pub action: &'static str,
    /// The `MESSAGE_ID`: 128 bits as 32 lower-case hex digits, never reused.
    pub id: &'static str,
    /// The catalogue's one-line subject.
    pub subject: &'static str,
    /// The catalogue's explanation (`@FIELD@` is replaced by the entry's field).
    pub body: &'static str,
}

/// Every refused call, whatever its action: `AIRLOCK_ACTION` and
/// `AIRLOCK_CODE` say which and why.
pub const REFUSED: CatalogEntry = CatalogEntry {
    action: "(any action, refused)",
    id: "229810b04d424c38a8a0473d4ae44051",
    subject: "airlock refused @AIRLOCK_ACTION@: @AIRLOCK_CODE@",
    body: "A call to the airlock supervisor was refused and nothing was changed.\n\
Action: @AIRLOCK_ACTION@; task: @AIRLOCK_TASK_ID@; caller: @AIRLOCK_ACTOR_KIND@ @AIRLOCK_ACTOR@ (uid @AIRLOCK_ACTOR_UID@).\n\
The code @AIRLOCK_CODE@ is explained in /usr/share/doc/airlock/errors.md; AIRLOCK_PAYLOAD holds the\n\
refusal's detail (redacted). A run of AUTHZ_DENIED refusals from one caller may be a misconfigured\n\
planner or a probe: `airlockctl events --json` lists them with their times.",
};

/// An action this build's catalogue does not name (an event written by a
/// newer supervisor sharing a PostgreSQL queue).
pub const OTHER: CatalogEntry = CatalogEntry {
    action: "(an action this version does not know)",
    id: "e9a7b0ce61cc425bbee9bfc1b2bae36d",
    subject: "airlock event @AIRLOCK_ACTION@",
    body: "An event whose action this version of airlock does not describe, most likely written by a\n\
newer supervisor sharing the same PostgreSQL task queue. AIRLOCK_PAYLOAD holds its details.",
};

/// One entry per action of the event log, in the log's order.
pub const CATALOG: &[CatalogEntry] = &[
    CatalogEntry {
        action: action::TASK_SUBMITTED,
        id: "30cd7e4400814c929cb61023fca56d03",
        subject: "airlock task @AIRLOCK_TASK_ID@ submitted",
        body: "A planner (@AIRLOCK_ACTOR@, uid @AIRLOCK_ACTOR_UID@) submitted a change plan, and the task\n\
is queued for the worker. Nothing has run yet: the executor applies the plan to a throw-away\n\
copy of the repository and runs its verification commands when the worker claims the task.\n\
`airlockctl show @AIRLOCK_TASK_ID@` shows the plan's repository, base and limits.",
    },
    CatalogEntry {
        action: action::TASK_PLAN_REPLACED,
        id: "330113c34ba94e12823d21c43a3cd735",
        subject: "airlock task @AIRLOCK_TASK_ID@: plan replaced",
        body: "The planner replaced the plan of a queued task (after a rework decision, or before any\n\
worker claimed it). The task's revision went up: a decision taken on the old plan no longer\n\
applies.",
    },
    CatalogEntry {
        action: action::TASK_CLAIMED,
        id: "b31a2b28a4cb41bf9ff5d2aec162d3f5",
        subject: "airlock task @AIRLOCK_TASK_ID@ claimed by the worker",
        body: "The worker claimed the task: a new attempt began under a lease. If the worker stops\n\
renewing the lease (it crashed, or its host went away), the supervisor's sweeper requeues the\n\
task or, when its attempts are used up, fails it with LEASE_EXPIRED.",
    },
    CatalogEntry {
        action: action::TASK_LEASE_RENEWED,
        id: "40594976df91443794ff1a0322df51c1",
        subject: "airlock task @AIRLOCK_TASK_ID@: lease renewed",
        body: "The worker holding the task renewed its lease while its attempt is still running.",
    },
    CatalogEntry {
        action: action::TASK_FENCED,
        id: "c0b815bf64164fa0ba880c31fd02ff3c",
        subject: "airlock task @AIRLOCK_TASK_ID@: fence set or released",
        body: "The worker holding the task fenced its attempt before moving the agent branch or pushing it (until the fence ends the task cannot be cancelled and its lease does not expire), or released the fence when the step was over.",
    },
    CatalogEntry {
        action: action::TASK_LEASE_EXPIRED,
        id: "d7451f5f7d06413ca43dce60c498710e",
        subject: "airlock task @AIRLOCK_TASK_ID@: lease expired",
        body: "The worker holding the task stopped renewing its lease, so the attempt is abandoned: the\n\
task was queued again, or failed with LEASE_EXPIRED when no attempt is left. Look for the\n\
worker's own journal (`journalctl -u airlock-worker.service`) around this time; a late result\n\
from the abandoned attempt is refused.",
    },
    CatalogEntry {
        action: action::TASK_RESULT_SUBMITTED,
        id: "2167501ed0364fbdae5bd821a8632ac6",
        subject: "airlock task @AIRLOCK_TASK_ID@: result submitted",
        body: "The worker reported the outcome of its attempt: a verified commit on the task's agent/*\n\
branch waiting for a decision (or accepted at once when auto_accept allows it), or a failure\n\
with its code. `airlockctl show @AIRLOCK_TASK_ID@` shows the evidence.",
    },
    CatalogEntry {
        action: action::TASK_VERIFIED,
        id: "ee973da9f8f14551835e6ad0646b62fe",
        subject: "airlock task @AIRLOCK_TASK_ID@: decision recorded",
        body: "An administrator (@AIRLOCK_ACTOR@, uid @AIRLOCK_ACTOR_UID@) decided on a verified result:\n\
accept (the task succeeds), rework (the planner is asked for a new plan) or reject (the task\n\
fails). AIRLOCK_PAYLOAD holds the decision and its reason (redacted).",
    },
    CatalogEntry {
        action: action::TASK_CANCELLED,
        id: "66efa8313cfc401b89c04211b5765259",
        subject: "airlock task @AIRLOCK_TASK_ID@ cancelled",
        body: "An administrator (@AIRLOCK_ACTOR@, uid @AIRLOCK_ACTOR_UID@) cancelled the task. A running\n\
attempt's result is refused from now on; a branch already written stays for inspection.",
    },
    CatalogEntry {
        action: action::TASK_RETRY_EXTENSION_AUTHORIZED,
        id: "29187f16e85e4aa6b62a674f8d6e4890",
        subject: "airlock task @AIRLOCK_TASK_ID@: one more attempt granted",
        body: "The owner, through airlock-retryd's HTTP API, raised the attempt budget of a task that\n\
had used up its attempts, and the task is queued again. Only the owner's control token can do\n\
this; the token itself is never recorded.",
    },
    CatalogEntry {
        action: action::TASK_REPOSITORY_UNREGISTERED,
        id: "8112b2c5019147ec8afa400c8f71f6c8",
        subject: "airlock task @AIRLOCK_TASK_ID@ failed: repository no longer registered",
        body: "The repository this queued task names was removed from the configuration\n\
(`airlockctl repo remove`, or its drop-in deleted and the suite reloaded), so the task failed\n\
with REPOSITORY_NOT_REGISTERED. Register the repository again and resubmit to run it.",
    },
    CatalogEntry {
        action: action::AGENT_CHANGED,
        id: "3cc157445a9a4340a13ddadad0ecd600",
        subject: "airlock planner agent changed state",
        body: "The supervisor's crash-loop policy moved a planner agent (its name and new record are in\n\
AIRLOCK_PAYLOAD): started, running, failed and waiting to restart (BACKOFF), stopped, or HELD\n\
after 5 consecutive failures with AGENTOS_CRASH_LOOP. A held agent stays held, across supervisor\n\
restarts too, until `airlockctl agent clear-hold NAME`; `airlockctl agent show NAME` shows its\n\
last exit status and the hold's reason.",
    },
    CatalogEntry {
        action: action::AGENT_START_REQUESTED,
        id: "4f8480e1634e4c53a73b36ac9e9dc964",
        subject: "airlock planner agent start requested",
        body: "An administrator (@AIRLOCK_ACTOR@, uid @AIRLOCK_ACTOR_UID@) asked the supervisor to start a\n\
stopped planner agent (AIRLOCK_PAYLOAD names it); its failure count starts again from zero.",
    },
    CatalogEntry {
        action: action::AGENT_STOP_REQUESTED,
        id: "48ec5eda1b594a59829f75bfd15056d0",
        subject: "airlock planner agent stop requested",
        body: "An administrator (@AIRLOCK_ACTOR@, uid @AIRLOCK_ACTOR_UID@) stopped a planner agent\n\
(AIRLOCK_PAYLOAD names it). A stop is never counted as a failure, and the agent stays stopped,\n\
across supervisor restarts too, until it is started again.",
    },
    CatalogEntry {
        action: action::AGENT_HOLD_CLEARED,
        id: "64510d4fb67f4ecf88d620f4ab082ad7",
        subject: "airlock planner agent hold cleared",
        body: "An administrator (@AIRLOCK_ACTOR@, uid @AIRLOCK_ACTOR_UID@) cleared a planner agent's\n\
crash-loop hold (AIRLOCK_PAYLOAD names it): its failure count is reset and it is started again.",
    },
    CatalogEntry {
        action: action::AGENT_QUEUE_CANCELLED,
        id: "a539ae02571c4be58b6519897efe7623",
        subject: "airlock planner agent's queued tasks cancelled",
        body: "An administrator (@AIRLOCK_ACTOR@, uid @AIRLOCK_ACTOR_UID@) cancelled the queued tasks of a\n\
stopped planner agent (AIRLOCK_PAYLOAD names it and the reason). Each task ended CANCELLED with\n\
AGENT_REVOKED and has its own TASK_CANCELLED event; a running task is the worker's and finishes or\n\
fails as it would.",
    },
    CatalogEntry {
        action: action::TASK_RECONCILIATION_OPENED,
        id: "63925e080bbe4dd5bea2c78dadf4af76",
        subject: "airlock task needs reconciliation",
        body: "The worker found the branch of task @AIRLOCK_TASK_ID@ at another commit than the one its\n\
attempt made (it moved behind the worker's back). The task ended FAILED with\n\
RECONCILIATION_REQUIRED and a reconciliation case opened; AIRLOCK_PAYLOAD names the branch, the\n\
commit made and the head observed. `airlockctl reconcile show @AIRLOCK_TASK_ID@`, then\n\
`airlockctl reconcile resolve @AIRLOCK_TASK_ID@ adopt|fail --reason TEXT`.",
    },
    CatalogEntry {
        action: action::TASK_RECONCILIATION_RESOLVED,
        id: "2622b7102b0f47f1ad096b0f2a5aae46",
        subject: "airlock reconciliation resolved by an administrator",
        body: "An administrator (@AIRLOCK_ACTOR@, uid @AIRLOCK_ACTOR_UID@) resolved the reconciliation case\n\
of task @AIRLOCK_TASK_ID@ (AIRLOCK_PAYLOAD: adopt or fail, the reason, the head seen). Fail ends\n\
the case with the task FAILED; adopt waits for the worker to check that the branch still holds\n\
that head.",
    },
    CatalogEntry {
        action: action::TASK_RECONCILIATION_ADOPTED,
        id: "4092d4b4513c408a97c07085dfad3490",
        subject: "airlock adopted a branch head after reconciliation",
        body: "The worker checked the branch of task @AIRLOCK_TASK_ID@: it still holds the head an\n\
administrator chose to adopt, and that head descends from the task's base. The task SUCCEEDED\n\
with that head as its commit (AIRLOCK_PAYLOAD). When the check fails the entry is a refusal with\n\
RECONCILIATION_HEAD_MOVED or RECONCILIATION_HEAD_UNRELATED and the case is open again.",
    },
];

/// The longest `AIRLOCK_PAYLOAD` written; longer payloads are cut and say so.
pub const MAX_PAYLOAD: usize = 8 * 1024;

/// How often the exporter looks for new events.
const INTERVAL: Duration = Duration::from_secs(1);

/// Events read per store call.
const PAGE: u32 = 500;

/// The catalogue entry of `event`.
pub fn entry_for(event: &Event) -> &'static CatalogEntry {
    if event.outcome == EventOutcome::Denied {
        return &REFUSED;
    }
    CATALOG
        .iter()
        .find(|e| e.action == event.action)
        .unwrap_or(&OTHER)
}

/// The text of `airlock.catalog` (journalctl's catalogue format).
pub fn catalog_text() -> String {
    let mut out = String::from(
        "# airlock's journal message catalogue: what `journalctl -x` shows for each\n\
         # event of the audit trail. Generated from services/supervisor/src/journal.rs\n\
         # (UPDATE_DOCS=1 cargo test -p airlock-supervisor --lib journal); do not edit.\n",
    );
    for e in CATALOG.iter().chain([&REFUSED, &OTHER]) {
        out.push_str(&format!(
            "\n-- {}\nSubject: {}\nDefined-By: airlock\nSupport: man:airlockctl(1)\n\
             Documentation: file:///usr/share/doc/airlock/audit.md\n\n{}\n",
            e.id, e.subject, e.body
        ));
    }
    out
}

/// Writes `event` to the journal (see the module docs for its fields).
pub fn emit(event: &Event) {
    let entry = entry_for(event);
    let payload = airlock_proto::canonical::to_canonical_string(&event.payload)
        .unwrap_or_else(|_| event.payload.to_string());
    // Canonical JSON escapes every control character already: cut only,
    // saying how much was cut.
    let payload = airlock_proto::shown::cut(&payload, MAX_PAYLOAD).into_owned();
    let code = event.code.map(|c| c.as_str());
    let task = event.task_id.as_deref();
    let message = format!(
        "{} {}{}: {} {}{}{}",
        event.action,
        event.outcome.as_str(),
        task.map(|t| format!(" task {t}")).unwrap_or_default(),
        event.actor.kind.as_str(),
        event.actor.name,
        event
            .actor
            .uid
            .map(|u| format!(" (uid {u})"))
            .unwrap_or_default(),
        code.map(|c| format!(": {c}")).unwrap_or_default(),
    );
    macro_rules! entry {
        ($level:ident) => {
            tracing::$level!(
                target: airlock_service::AUDIT_TARGET,
                message_id = entry.id,
                airlock_event_id = event.id,
                airlock_action = event.action.as_str(),
                airlock_outcome = event.outcome.as_str(),
                airlock_code = code,
                airlock_task_id = task,
                airlock_actor_kind = event.actor.kind.as_str(),
                airlock_actor = event.actor.name.as_str(),
                airlock_actor_uid = event.actor.uid,
                airlock_payload = payload.as_str(),
                "{message}"
            )
        };
    }
    match event.outcome {
        EventOutcome::Allowed => entry!(info),
        EventOutcome::Denied => entry!(warn),
    }
}

/// Where the exporter keeps its place: a file beside the SQLite database,
/// or nothing (PostgreSQL: each start begins at the log's end).
#[derive(Clone, Debug)]
pub struct Cursor {
    file: Option<PathBuf>,
}

impl Cursor {
    /// The cursor of the SQLite database at `database`.
    pub fn beside(database: &Path) -> Self {
        let mut name = database.file_name().unwrap_or_default().to_os_string();
        name.push(".journal-cursor");
        Cursor {
            file: Some(database.with_file_name(name)),
        }
    }

    /// No file: export from where the log stands at start.
    pub fn none() -> Self {
        Cursor { file: None }
    }

    /// The last id exported before, if a readable cursor is kept.
    fn load(&self) -> Option<i64> {
        let text = std::fs::read_to_string(self.file.as_ref()?).ok()?;
        text.trim().parse().ok().filter(|id| *id >= 0)
    }

    /// Records `id` as exported: written whole and renamed into place, so a
    /// crash leaves the old value or the new one. Failure is logged; the
    /// worst it costs is exporting some events twice after a restart.
    fn save(&self, id: i64) {
        let Some(file) = &self.file else { return };
        let tmp = file.with_extension("journal-cursor.tmp");
        let result =
            std::fs::write(&tmp, format!("{id}\n")).and_then(|()| std::fs::rename(&tmp, file));
        if let Err(e) = result {
            tracing::warn!(
                "keeping the journal export's place in {}: {e}",
                file.display()
            );
        }
    }
}

/// Exports every event committed after the cursor's place (or, without one,
/// after start-up) until `stop` turns true, then once more for the events
/// of the drain.
pub async fn run(ops: Ops, cursor: Cursor, mut stop: watch::Receiver<bool>) {
    let start = match cursor.load() {
        Some(id) => Ok(id),
        None => ops.last_event_id().await,
    };
    let mut after = match start {
        Ok(id) => id,
        Err(e) => {
            tracing::error!("journal export off: cannot read the event log: {e}");
            return;
        }
    };
    cursor.save(after);
    loop {
        let stopping = *stop.borrow();
        match export(&ops, &cursor, after).await {
            Ok(last) => after = last,
            Err(e) => tracing::warn!("journal export: reading the event log: {e}"),
        }
        if stopping {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(INTERVAL) => {}
            _ = stop.changed() => {}
        }
    }
}

/// Exports the events after `after`; returns the last id exported.
async fn export(ops: &Ops, cursor: &Cursor, mut after: i64) -> Result<i64, Error> {
    loop {
        let page = ops.events_after(after, PAGE).await?;
        let Some(last) = page.last().map(|e| e.id) else {
            return Ok(after);
        };
        for event in &page {
            emit(event);
        }
        after = last;
        cursor.save(after);
        if page.len() < PAGE as usize {
            return Ok(after);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::process::Command;

    const RELEASED: &str = include_str!("../../../catalog/airlock.catalog");

    #[test]
    fn every_action_has_one_entry_and_every_id_is_unique_and_well_formed() {
        let actions: Vec<&str> = CATALOG.iter().map(|e| e.action).collect();
        assert_eq!(
            actions,
            action::ALL,
            "one catalogue entry per action, in order"
        );
        let mut ids = HashSet::new();
        for e in CATALOG.iter().chain([&REFUSED, &OTHER]) {
            assert_eq!(e.id.len(), 32, "{}", e.action);
            assert!(
                e.id.chars()
                    .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()),
                "{}: {}",
                e.action,
                e.id
            );
            assert!(ids.insert(e.id), "{} reuses {}", e.action, e.id);
            assert!(!e.subject.contains('\n'), "{}", e.action);
        }
    }

    /// The ids are the contract: an id in the released catalogue may never
    /// change meaning, and the file the package installs is this table.
    #[test]
    fn the_installed_catalogue_is_this_table_and_no_released_id_moved() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../catalog/airlock.catalog");
        if std::env::var_os("UPDATE_DOCS").is_some() {
            std::fs::write(path, catalog_text()).unwrap();
            return;
        }
        let released: Vec<(&str, &str)> = RELEASED
            .split("\n-- ")
            .skip(1)
            .filter_map(|block| {
                let (id, rest) = block.split_once('\n')?;
                let subject = rest.lines().next()?.strip_prefix("Subject: ")?;
                Some((id.trim(), subject))
            })
            .collect();
        for (id, subject) in &released {
            let now = CATALOG
                .iter()
                .chain([&REFUSED, &OTHER])
                .find(|e| e.id == *id)
                .unwrap_or_else(|| panic!("released MESSAGE_ID {id} ({subject}) is gone"));
            assert_eq!(now.subject, *subject, "MESSAGE_ID {id} changed its subject");
        }
        let now = catalog_text();
        if let Some((n, (was, is))) = RELEASED
            .lines()
            .zip(now.lines())
            .enumerate()
            .find(|(_, (a, b))| a != b)
        {
            panic!(
                "catalog/airlock.catalog is stale from line {}: {was:?} != {is:?}; \
                 UPDATE_DOCS=1 cargo test -p airlock-supervisor --lib journal",
                n + 1
            );
        }
        assert_eq!(
            RELEASED.len(),
            now.len(),
            "catalog/airlock.catalog is stale"
        );
    }

    /// journalctl itself accepts the file: every entry is in its catalogue
    /// database with its subject.
    #[test]
    fn journalctl_compiles_the_catalogue() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("usr/lib/systemd/catalog");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::create_dir_all(root.path().join("var/lib/systemd/catalog")).unwrap();
        std::fs::write(dir.join("airlock.catalog"), catalog_text()).unwrap();
        let run = |args: &[&str]| {
            let out = Command::new("journalctl")
                .arg(format!("--root={}", root.path().display()))
                .args(args)
                .output()
                .expect("journalctl (systemd) is installed on the machines airlock supports");
            assert!(out.status.success(), "journalctl {args:?}: {out:?}");
            String::from_utf8(out.stdout).unwrap()
        };
        run(&["--update-catalog"]);
        let listed = run(&["--list-catalog"]);
        for e in CATALOG.iter().chain([&REFUSED, &OTHER]) {
            assert!(
                listed.contains(&format!("{} airlock: {}", e.id, e.subject)),
                "{} missing from journalctl's catalogue:\n{listed}",
                e.id
            );
        }
    }

    #[test]
    fn refusals_share_one_id_and_unknown_actions_get_their_own() {
        let mut ev = Event {
            id: 7,
            task_id: None,
            at_ms: 0,
            actor: airlock_taskdb::tasks::Actor::new(
                airlock_taskdb::tasks::ActorKind::Admin,
                Some(1000),
                "alice",
            ),
            action: action::TASK_VERIFIED.into(),
            outcome: EventOutcome::Allowed,
            code: None,
            payload: serde_json::json!({}),
        };
        let verified = CATALOG
            .iter()
            .find(|e| e.action == action::TASK_VERIFIED)
            .unwrap();
        assert_eq!(entry_for(&ev).id, verified.id);
        ev.outcome = EventOutcome::Denied;
        assert_eq!(entry_for(&ev).id, REFUSED.id);
        ev.outcome = EventOutcome::Allowed;
        ev.action = "SOMETHING_NEWER".into();
        assert_eq!(entry_for(&ev).id, OTHER.id);
    }

    #[test]
    fn payloads_are_bounded_on_a_character_boundary() {
        let s = "é".repeat(10);
        assert_eq!(airlock_proto::shown::cut(&s, 5), "éé…[16 bytes cut]");
        assert_eq!(airlock_proto::shown::cut("abc", 5), "abc");
    }

    #[test]
    fn the_cursor_survives_a_restart_and_ignores_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let cursor = Cursor::beside(&dir.path().join("tasks.db"));
        assert_eq!(cursor.load(), None);
        cursor.save(42);
        assert_eq!(
            Cursor::beside(&dir.path().join("tasks.db")).load(),
            Some(42)
        );
        std::fs::write(dir.path().join("tasks.db.journal-cursor"), "x\n").unwrap();
        assert_eq!(cursor.load(), None);
        assert_eq!(Cursor::none().load(), None);
    }
}

//! Who hears `TaskChanged`.
//!
//! The signal names a task, its state and its revision, so it is never
//! broadcast: a broadcast signal on the system bus reaches any local user
//! who adds a match rule for it, with no polkit check on the way. Each
//! change is sent instead, addressed to one connection at a time, to every
//! connection that may read the task:
//!
//! - a connection is remembered, with the tasks it may read ([`Scope`]),
//!   once it made an authorised read (its scope: every task with
//!   `org.airlock.tasks.read-all`, its own otherwise), an authorised
//!   submission (its own tasks; a read's scope is not narrowed by it), or
//!   an authorised Worker1 call (every task: the worker claims any);
//! - it is forgotten when it leaves the bus (`NameOwnerChanged`), and its
//!   scope is replaced by the one of its latest read;
//! - a change is sent to each remembered connection whose scope holds the
//!   task's submitter; an unrelated connection receives nothing at all.
//!
//! A client that subscribes must therefore make one call before it relies
//! on the signal (airlockctl and airlock-mcp read the task they follow, or
//! submit it, first); the signal stays a hint, and each client still polls
//! in case one is lost. At most [`CAPACITY`] connections are remembered;
//! past that the oldest is forgotten (it falls back to polling).

use crate::authz::Scope;
use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

/// Most connections remembered at once.
pub const CAPACITY: usize = 4096;

#[derive(Debug)]
struct Entry {
    scope: Scope,
    /// When it was remembered (a counter), for eviction.
    since: u64,
}

/// The connections `TaskChanged` is sent to, by unique name.
#[derive(Debug, Default)]
pub struct Watchers {
    inner: Mutex<(HashMap<String, Entry>, u64)>,
}

impl Watchers {
    /// Remembers `sender` with `scope`, replacing what was known (a read:
    /// its scope as polkit answers now).
    pub fn watch(&self, sender: &str, scope: Scope) {
        self.put(sender, scope, true);
    }

    /// Remembers `sender` with `scope` unless it is known already (a
    /// submission: it follows its own tasks, and a read's wider scope is
    /// kept).
    pub fn watch_unless_known(&self, sender: &str, scope: Scope) {
        self.put(sender, scope, false);
    }

    fn put(&self, sender: &str, scope: Scope, replace: bool) {
        if !sender.starts_with(':') {
            return;
        }
        let mut guard = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let (map, clock) = &mut *guard;
        *clock += 1;
        let since = *clock;
        if let Some(e) = map.get_mut(sender) {
            if replace {
                e.scope = scope;
            }
            return;
        }
        if map.len() >= CAPACITY {
            if let Some(oldest) = map
                .iter()
                .min_by_key(|(_, e)| e.since)
                .map(|(k, _)| k.clone())
            {
                map.remove(&oldest);
            }
        }
        map.insert(sender.to_owned(), Entry { scope, since });
    }

    /// Forgets `name` (it left the bus).
    pub fn forget(&self, name: &str) {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .0
            .remove(name);
    }

    /// Every remembered connection with its scope.
    pub fn snapshot(&self) -> Vec<(String, Scope)> {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .0
            .iter()
            .map(|(k, e)| (k.clone(), e.scope.clone()))
            .collect()
    }

    /// How many connections are remembered.
    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .0
            .len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Forgets each connection of `watchers` that leaves the bus, until the
/// connection closes or the task is aborted.
pub async fn forget_departed(
    conn: zbus::Connection,
    watchers: std::sync::Arc<Watchers>,
) -> Result<(), zbus::Error> {
    use futures_util::StreamExt;
    let dbus = zbus::fdo::DBusProxy::new(&conn).await?;
    let mut changes = dbus.receive_name_owner_changed().await?;
    while let Some(signal) = changes.next().await {
        if let Ok(args) = signal.args() {
            if args.new_owner().is_none() {
                watchers.forget(args.name().as_str());
            }
        }
    }
    Ok(())
}

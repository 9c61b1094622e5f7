//! Who sent a method call, from facts the bus daemon vouches for: the
//! sender's unique name and the uid and pid the daemon reports for it, by
//! the one lookup ([`airlock_client::peer`]); nothing the caller wrote in
//! the message body is used. Unique names are never reused on a bus, so
//! the answer is cached per name, with the user name of the uid.

use crate::authz::Caller;
pub use airlock_client::peer::sender_of;
use airlock_proto::Error;
use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use zbus::Connection;
use zbus::message::{Flags, Header};

/// Most callers remembered before the cache is emptied and refilled.
const CACHE_CAP: usize = 4096;

/// What the bus daemon reported for one sender: uid, process id, user name.
type Known = (u32, Option<u32>, Option<String>);

/// Resolves and caches callers' credentials.
#[derive(Debug, Default)]
pub struct CallerResolver {
    cache: Mutex<HashMap<String, Known>>,
}

/// Whether the message carried ALLOW_INTERACTIVE_AUTHORIZATION.
pub fn allows_interaction(hdr: &Header<'_>) -> bool {
    hdr.primary().flags().contains(Flags::AllowInteractiveAuth)
}

impl CallerResolver {
    /// The caller of the message with header `hdr`, received on `conn`.
    /// Refuses (`AUTHORIZATION_DENIED`) when the message has no sender or
    /// the bus does not report a uid for it.
    pub async fn resolve(&self, conn: &Connection, hdr: &Header<'_>) -> Result<Caller, Error> {
        let sender = sender_of(hdr).ok_or_else(airlock_client::peer::no_sender)?;
        let interactive = allows_interaction(hdr);
        let cached = self
            .cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&sender)
            .cloned();
        let (uid, pid, user) = match cached {
            Some(known) => known,
            None => {
                let creds = airlock_client::peer::of_sender(conn, &sender).await?;
                let (uid, pid) = (creds.uid, creds.pid);
                let user = user_name(uid).await;
                let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
                if cache.len() >= CACHE_CAP {
                    cache.clear();
                }
                cache.insert(sender.clone(), (uid, pid, user.clone()));
                (uid, pid, user)
            }
        };
        Ok(Caller::from_bus(&sender, uid, user, interactive).with_pid(pid))
    }
}

/// The user name of `uid`, if the system knows one.
async fn user_name(uid: u32) -> Option<String> {
    tokio::task::spawn_blocking(move || {
        nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
            .ok()
            .flatten()
            .map(|u| u.name)
    })
    .await
    .ok()
    .flatten()
}

//! Who sent a method call, from facts the bus daemon vouches for.
//!
//! The sender's unique name is stamped on the message by the daemon; the
//! uid is what the daemon reports for that name
//! (`org.freedesktop.DBus.GetConnectionCredentials`, taken from the
//! socket's peer credentials when the peer connected). Nothing the caller
//! wrote in the message body is used. Unique names are never reused on a
//! bus, so the answer is cached per name.

use crate::authz::Caller;
use airlock_proto::{Code, Error};
use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use zbus::Connection;
use zbus::message::{Flags, Header};
use zbus::zvariant::OwnedValue;

/// Most callers remembered before the cache is emptied and refilled.
const CACHE_CAP: usize = 4096;

/// What the bus daemon reported for one sender: uid, process id, user name.
type Known = (u32, Option<u32>, Option<String>);

/// Resolves and caches callers' credentials.
#[derive(Debug, Default)]
pub struct CallerResolver {
    cache: Mutex<HashMap<String, Known>>,
}

/// The sender of a message, before its credentials are known.
pub fn sender_of(hdr: &Header<'_>) -> Option<String> {
    hdr.sender().map(|s| s.to_string())
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
        let sender = sender_of(hdr).ok_or_else(|| {
            Error::with(
                Code::AUTHORIZATION_DENIED,
                "the message has no sender the bus vouches for",
            )
        })?;
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
                let (uid, pid) = peer_credentials(conn, &sender).await?;
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

/// Asks the bus daemon for the uid behind `sender`.
pub async fn peer_uid(conn: &Connection, sender: &str) -> Result<u32, Error> {
    peer_credentials(conn, sender).await.map(|(uid, _)| uid)
}

/// Asks the bus daemon for the uid and, when it knows it, the process id
/// behind `sender` (taken from the socket's peer credentials when the peer
/// connected).
pub async fn peer_credentials(
    conn: &Connection,
    sender: &str,
) -> Result<(u32, Option<u32>), Error> {
    let refuse = |why: String| {
        Error::with(
            Code::AUTHORIZATION_DENIED,
            format!("the bus did not report credentials for {sender}: {why}"),
        )
    };
    let reply = conn
        .call_method(
            Some("org.freedesktop.DBus"),
            "/org/freedesktop/DBus",
            Some("org.freedesktop.DBus"),
            "GetConnectionCredentials",
            &(sender,),
        )
        .await
        .map_err(|e| refuse(e.to_string()))?;
    let body = reply.body();
    let (creds,): (HashMap<String, OwnedValue>,) =
        body.deserialize().map_err(|e| refuse(e.to_string()))?;
    let uid = creds
        .get("UnixUserID")
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| refuse("no UnixUserID".to_owned()))?;
    let pid = creds.get("ProcessID").and_then(|v| u32::try_from(v).ok());
    Ok((uid, pid))
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

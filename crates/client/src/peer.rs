//! Who sent a message, from facts the bus daemon vouches for: the one
//! caller-credential lookup, used by the supervisor for every method call
//! and by airlock-local's agent host.
//!
//! The sender's unique name is stamped on the message by the daemon; its
//! uid and pid are what the daemon reports for that name
//! (`org.freedesktop.DBus.GetConnectionCredentials`, taken from the
//! socket's peer credentials when the peer connected). Nothing the caller
//! wrote in the message body is used, and a sender whose uid the daemon
//! does not report is refused (`AUTHORIZATION_DENIED`): missing
//! credentials are never read as anybody's.

use airlock_proto::{Code, Error};
use std::collections::HashMap;
use zbus::Connection;
use zbus::message::Header;
use zbus::zvariant::OwnedValue;

/// What the bus daemon reported for one sender.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerCredentials {
    /// The sender's unique name (`:1.42`), as the daemon stamped it.
    pub sender: String,
    /// Its unix uid.
    pub uid: u32,
    /// Its process id, when the daemon knows it.
    pub pid: Option<u32>,
}

/// The sender of a message, before its credentials are known.
pub fn sender_of(hdr: &Header<'_>) -> Option<String> {
    hdr.sender().map(|s| s.to_string())
}

/// The credentials of the sender of the message with header `hdr`,
/// received on `conn`. Refuses (`AUTHORIZATION_DENIED`) a message without
/// a sender.
pub async fn of_message(conn: &Connection, hdr: &Header<'_>) -> Result<PeerCredentials, Error> {
    let sender = sender_of(hdr).ok_or_else(no_sender)?;
    of_sender(conn, &sender).await
}

/// The refusal of a message without a sender.
pub fn no_sender() -> Error {
    Error::with(
        Code::AUTHORIZATION_DENIED,
        "the message has no sender the bus vouches for",
    )
}

/// Asks the bus daemon for the uid and, when it knows it, the process id
/// behind `sender`. Refuses (`AUTHORIZATION_DENIED`) when the daemon does
/// not answer or reports no uid.
pub async fn of_sender(conn: &Connection, sender: &str) -> Result<PeerCredentials, Error> {
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
    Ok(PeerCredentials {
        sender: sender.to_owned(),
        uid,
        pid,
    })
}

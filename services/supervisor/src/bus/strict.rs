//! Arguments checked against the row before any handler runs.
//!
//! zbus's `#[interface]` macro dispatches by name and answers a call whose
//! body does not deserialise into the handler's arguments (one missing,
//! one too many, one of another type) with its own error,
//! `org.freedesktop.zbus.Error` ("Signature mismatch"), which names no
//! code of the catalogue and is recorded nowhere. Every interface object
//! is exported wrapped in [`Strict`], which compares the call's body
//! signature with its row's input signature first: a call whose arguments
//! are not the row's is refused with `MESSAGE_INVALID` (or, for a shape
//! an interface no longer takes, [`airlock_proto::bus::tasks_v1::RETIRED`],
//! with `PROTOCOL_VERSION_MISMATCH` naming the method to call instead),
//! before its sender is authorised and before anything is read; the
//! refusal is logged and recorded under the row's event as every other
//! refusal is ([`crate::authz::Gatekeeper::refuse_call`]). A call that
//! matches its row goes to the wrapped object, as does anything that is
//! not a method of the contract (a property, or a method the interface
//! does not serve, which zbus answers as unknown).
//!
//! zbus documents `Interface` as a trait to implement through its macro;
//! this implementation forwards every item to the macro's own (as
//! [`super::tasks_v1`] does), and `Cargo.lock` pins the zbus it was
//! written against.

use super::Shared;
use super::error::BusError;
use airlock_proto::Error;
use airlock_proto::bus::{Method, tasks_v1};
use std::collections::HashMap;
use std::fmt::Write;
use std::sync::Arc;
use zbus::message::{Header, Message};
use zbus::names::{InterfaceName, MemberName};
use zbus::object_server::{DispatchResult, Interface, SignalEmitter};
use zbus::zvariant::{OwnedValue, Value};
use zbus::{Connection, ObjectServer, fdo};

/// An interface object whose calls are checked against their rows.
#[derive(Debug)]
pub struct Strict<I> {
    inner: I,
    shared: Arc<Shared>,
}

impl<I: Interface> Strict<I> {
    /// Serves `inner`, refusing (and recording through `shared`'s
    /// gatekeeper) every call whose arguments are not its row's.
    pub fn new(inner: I, shared: Arc<Shared>) -> Self {
        Strict { inner, shared }
    }
}

/// The row of the call `name` on `interface` with body signature `sent`,
/// and its refusal, when the arguments are not the row's; `None` when they
/// are, or when the call is no method of the contract.
pub fn misshapen(interface: &str, name: &str, sent: &str) -> Option<(&'static Method, Error)> {
    let row = airlock_proto::bus::row(interface, name)?;
    if sent == row.input {
        return None;
    }
    let retired = (interface == tasks_v1::INTERFACE)
        .then(|| super::tasks_v1::retired(name, sent))
        .flatten();
    Some(match retired {
        Some(r) => (row, r.refusal(interface)),
        None => (row, row.wrong_arguments(sent)),
    })
}

impl<I: Interface> Strict<I> {
    /// Answers a call whose arguments are not its row's, if this one is.
    fn refuse<'call>(
        &'call self,
        connection: &'call Connection,
        msg: &'call Message,
        name: &MemberName<'_>,
    ) -> Option<DispatchResult<'call>> {
        let sent = msg.body().signature().to_string_no_parens();
        let (row, refusal) = misshapen(I::name().as_str(), name.as_str(), &sent)?;
        let shared = &self.shared;
        Some(DispatchResult::new_async(connection, msg, async move {
            let hdr: Header<'_> = msg.header();
            shared
                .refuse_misshapen(connection, &hdr, row, &refusal)
                .await;
            Err::<(), BusError>(refusal.into())
        }))
    }
}

#[async_trait::async_trait]
impl<I: Interface> Interface for Strict<I> {
    fn name() -> InterfaceName<'static> {
        I::name()
    }

    fn spawn_tasks_for_methods(&self) -> bool {
        self.inner.spawn_tasks_for_methods()
    }

    async fn get(
        &self,
        property_name: &str,
        server: &ObjectServer,
        connection: &Connection,
        header: Option<&Header<'_>>,
        emitter: &SignalEmitter<'_>,
    ) -> Option<fdo::Result<OwnedValue>> {
        self.inner
            .get(property_name, server, connection, header, emitter)
            .await
    }

    async fn get_all(
        &self,
        server: &ObjectServer,
        connection: &Connection,
        header: Option<&Header<'_>>,
        emitter: &SignalEmitter<'_>,
    ) -> fdo::Result<HashMap<String, OwnedValue>> {
        self.inner
            .get_all(server, connection, header, emitter)
            .await
    }

    fn set<'call>(
        &'call self,
        property_name: &'call str,
        value: &'call Value<'_>,
        server: &'call ObjectServer,
        connection: &'call Connection,
        header: Option<&'call Header<'_>>,
        emitter: &'call SignalEmitter<'_>,
    ) -> DispatchResult<'call> {
        self.inner
            .set(property_name, value, server, connection, header, emitter)
    }

    async fn set_mut(
        &mut self,
        property_name: &str,
        value: &Value<'_>,
        server: &ObjectServer,
        connection: &Connection,
        header: Option<&Header<'_>>,
        emitter: &SignalEmitter<'_>,
    ) -> Option<fdo::Result<()>> {
        self.inner
            .set_mut(property_name, value, server, connection, header, emitter)
            .await
    }

    fn call<'call>(
        &'call self,
        server: &'call ObjectServer,
        connection: &'call Connection,
        msg: &'call Message,
        name: MemberName<'call>,
    ) -> DispatchResult<'call> {
        if let Some(refused) = self.refuse(connection, msg, &name) {
            return refused;
        }
        self.inner.call(server, connection, msg, name)
    }

    fn call_mut<'call>(
        &'call mut self,
        server: &'call ObjectServer,
        connection: &'call Connection,
        msg: &'call Message,
        name: MemberName<'call>,
    ) -> DispatchResult<'call> {
        // `call` answered a misshapen call already; a call reaching here
        // matched its row.
        self.inner.call_mut(server, connection, msg, name)
    }

    fn introspect_to_writer(&self, writer: &mut dyn Write, level: usize) {
        self.inner.introspect_to_writer(writer, level);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_proto::Code;
    use airlock_proto::bus::{ROWS, tasks, worker};

    #[test]
    fn only_a_call_of_another_shape_than_its_row_is_refused() {
        for row in ROWS.iter().flat_map(|r| r.iter()) {
            assert!(
                misshapen(row.interface, row.name, row.input).is_none(),
                "{}",
                row.path()
            );
            let more = format!("{}s", row.input);
            let (got, e) = misshapen(row.interface, row.name, &more)
                .unwrap_or_else(|| panic!("{} with one more argument", row.path()));
            assert_eq!(got, row);
            let retired = row.interface == tasks_v1::INTERFACE
                && super::super::tasks_v1::retired(row.name, &more).is_some();
            let code = if retired {
                Code::PROTOCOL_VERSION_MISMATCH
            } else {
                Code::MESSAGE_INVALID
            };
            assert_eq!(e.code, code, "{}", row.path());
            if !row.input.is_empty() {
                let fewer = &row.input[..row.input.len() - 1];
                let (_, e) = misshapen(row.interface, row.name, fewer)
                    .unwrap_or_else(|| panic!("{} with one argument less", row.path()));
                assert_eq!(e.code, Code::MESSAGE_INVALID, "{}", row.path());
            }
        }
        let (_, e) = misshapen(worker::INTERFACE, worker::RENEW, "sss").unwrap();
        let text = e.to_string();
        assert!(
            text.contains("org.airlock.Worker1.Renew") && text.contains("(sts)"),
            "{text}"
        );
        // Not a method of the contract: zbus answers it as unknown.
        assert!(misshapen(tasks::INTERFACE, "Nope", "s").is_none());
        assert!(misshapen(tasks_v1::INTERFACE, tasks::GET_PLAN, "").is_none());
    }

    #[test]
    fn a_retired_shape_names_what_to_call_instead() {
        let (_, e) = misshapen(tasks_v1::INTERFACE, tasks::VERIFY, "sss").unwrap();
        assert_eq!(e.code, Code::PROTOCOL_VERSION_MISMATCH);
        // On Tasks2 the same shape is only a wrong one.
        let (_, e) = misshapen(tasks::INTERFACE, tasks::VERIFY, "sss").unwrap();
        assert_eq!(e.code, Code::MESSAGE_INVALID);
    }
}

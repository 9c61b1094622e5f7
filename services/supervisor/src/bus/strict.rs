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
//! this implementation (`wrapper_interface!`, which [`super::tasks_v1`]
//! uses too) forwards every item to the macro's own, and `Cargo.lock`
//! pins the zbus it was written against.

use super::Shared;
use super::error::BusError;
use airlock_proto::Error;
use airlock_proto::bus::{Method, tasks_v1};
use std::fmt::Write;
use std::sync::Arc;
use zbus::Connection;
use zbus::message::{Header, Message};
use zbus::names::{InterfaceName, MemberName};
use zbus::object_server::{DispatchResult, Interface};

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

/// Implements zbus's `Interface` for a wrapper of another interface object
/// (its field `inner`): the properties and `spawn_tasks_for_methods` pass to
/// `inner` unchanged; a method call first asks the wrapper's own
/// `refuse(connection, msg, &name)` (and `call_mut`'s `Self::refuse_mut(&name)`)
/// whether to answer it here, and otherwise passes to `inner`. The wrapper
/// writes `name` and `introspect_to_writer` itself, inside the braces.
macro_rules! wrapper_interface {
    ([$($generics:tt)*] $wrapper:ty { $($own:tt)* }) => {
        #[async_trait::async_trait]
        impl<$($generics)*> zbus::object_server::Interface for $wrapper {
            $($own)*

            fn spawn_tasks_for_methods(&self) -> bool {
                self.inner.spawn_tasks_for_methods()
            }

            async fn get(
                &self,
                property_name: &str,
                server: &zbus::ObjectServer,
                connection: &zbus::Connection,
                header: Option<&zbus::message::Header<'_>>,
                emitter: &zbus::object_server::SignalEmitter<'_>,
            ) -> Option<zbus::fdo::Result<zbus::zvariant::OwnedValue>> {
                self.inner
                    .get(property_name, server, connection, header, emitter)
                    .await
            }

            async fn get_all(
                &self,
                server: &zbus::ObjectServer,
                connection: &zbus::Connection,
                header: Option<&zbus::message::Header<'_>>,
                emitter: &zbus::object_server::SignalEmitter<'_>,
            ) -> zbus::fdo::Result<std::collections::HashMap<String, zbus::zvariant::OwnedValue>>
            {
                self.inner
                    .get_all(server, connection, header, emitter)
                    .await
            }

            fn set<'call>(
                &'call self,
                property_name: &'call str,
                value: &'call zbus::zvariant::Value<'_>,
                server: &'call zbus::ObjectServer,
                connection: &'call zbus::Connection,
                header: Option<&'call zbus::message::Header<'_>>,
                emitter: &'call zbus::object_server::SignalEmitter<'_>,
            ) -> zbus::object_server::DispatchResult<'call> {
                self.inner
                    .set(property_name, value, server, connection, header, emitter)
            }

            async fn set_mut(
                &mut self,
                property_name: &str,
                value: &zbus::zvariant::Value<'_>,
                server: &zbus::ObjectServer,
                connection: &zbus::Connection,
                header: Option<&zbus::message::Header<'_>>,
                emitter: &zbus::object_server::SignalEmitter<'_>,
            ) -> Option<zbus::fdo::Result<()>> {
                self.inner
                    .set_mut(property_name, value, server, connection, header, emitter)
                    .await
            }

            fn call<'call>(
                &'call self,
                server: &'call zbus::ObjectServer,
                connection: &'call zbus::Connection,
                msg: &'call zbus::message::Message,
                name: zbus::names::MemberName<'call>,
            ) -> zbus::object_server::DispatchResult<'call> {
                if let Some(answered) = self.refuse(connection, msg, &name) {
                    return answered;
                }
                self.inner.call(server, connection, msg, name)
            }

            fn call_mut<'call>(
                &'call mut self,
                server: &'call zbus::ObjectServer,
                connection: &'call zbus::Connection,
                msg: &'call zbus::message::Message,
                name: zbus::names::MemberName<'call>,
            ) -> zbus::object_server::DispatchResult<'call> {
                if let Some(answered) = Self::refuse_mut(&name) {
                    return answered;
                }
                self.inner.call_mut(server, connection, msg, name)
            }
        }
    };
}
pub(super) use wrapper_interface;

impl<I: Interface> Strict<I> {
    /// `call_mut`'s answer: none, since `call` answered a misshapen call
    /// already; a call reaching `call_mut` matched its row.
    fn refuse_mut<'call>(_name: &MemberName<'_>) -> Option<DispatchResult<'call>> {
        None
    }
}

wrapper_interface! {
    [I: Interface] Strict<I> {
        fn name() -> InterfaceName<'static> {
            I::name()
        }

        fn introspect_to_writer(&self, writer: &mut dyn Write, level: usize) {
            self.inner.introspect_to_writer(writer, level);
        }
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

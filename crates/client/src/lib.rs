//! airlock-client: the one client of `org.airlock.Supervisor1`.
//!
//! Every process that talks to the supervisor — airlockctl, the worker,
//! airlock-retryd, airlock-local and the benchmarks — calls it through
//! [`Supervisor`]: one zbus proxy per interface, built from the names in
//! [`airlock_proto::bus`], typed replies decoded strictly (a missing field
//! is an error, never a default), and every D-Bus error mapped back to its
//! catalogue [`Code`]. Its methods (and their blocking stubs,
//! [`blocking`]) are made from the rows of the contract, one per row
//! ([`airlock_proto::rows!`], `stubs.rs`), and the supervisor's handlers
//! enter by the same rows, so a client call and its handler pair by row.
//!
//! Calls are bounded: each one is raced against [`Supervisor::timeout`]
//! (30 s unless changed) and a late answer is dropped with its future.
//!
//! [`peer`] is the other side of the same bus: the one lookup of a
//! sender's credentials from the bus daemon, for the services that serve
//! methods (the supervisor, airlock-local's agent host).
//!
//! Before its first call a client reads the supervisor's
//! `ProtocolVersion` and refuses a different major version, or one more
//! than one minor ahead of its own, with `PROTOCOL_VERSION_MISMATCH`,
//! naming both (`docs/protocol.md`; seed 002).
//!
//! ```no_run
//! # async fn demo() -> Result<(), airlock_proto::Error> {
//! let sup = airlock_client::Supervisor::connect(None).await?;
//! let task = sup.get_task("task-1").await?;
//! println!("{} is {}", task.task_id, task.state.as_str());
//! # Ok(()) }
//! ```

#[macro_use]
mod stubs;
pub mod blocking;
mod error;
pub mod peer;

pub use error::{from_zbus, is_unreachable};

use airlock_proto::bus::{self, BUS_NAME, Call, OBJECT_PATH};
use airlock_proto::{Code, Error};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::OnceCell;
use zbus::proxy::{CacheProperties, MethodFlags};
use zbus::zvariant::{DynamicType, OwnedValue};

/// Whether `e` says the supervisor serves no such interface or property
/// (a supervisor of an older protocol).
fn names_no_such_interface(e: &zbus::Error) -> bool {
    let name = match e {
        zbus::Error::MethodError(name, _, _) => name.to_string(),
        zbus::Error::FDO(fdo) => zbus::DBusError::name(fdo.as_ref()).to_string(),
        _ => return false,
    };
    [
        "org.freedesktop.DBus.Error.UnknownInterface",
        "org.freedesktop.DBus.Error.UnknownProperty",
        "org.freedesktop.DBus.Error.InvalidArgs",
    ]
    .contains(&name.as_str())
}

/// What the generic call reads from a row's reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReplyShape {
    /// One string: the JSON of the row's reply type.
    Json,
    /// Nothing: the row's reply type is `()`.
    Nothing,
    /// One `x`: the row's reply type is that number (`Renew`'s expiry).
    Int64,
}

/// How the reply of `row` is read, by its output signature.
fn reply_shape(row: &bus::Method) -> Result<ReplyShape, Error> {
    match row.output {
        "s" => Ok(ReplyShape::Json),
        "" => Ok(ReplyShape::Nothing),
        "x" => Ok(ReplyShape::Int64),
        other => Err(Error::with(
            Code::INTERNAL,
            format!(
                "{} answers ({other}), which this client does not read",
                row.path()
            ),
        )),
    }
}

/// The D-Bus signature of the arguments `body` makes (a tuple's fields,
/// without the parentheses of the tuple).
fn body_signature<B: DynamicType>(body: &B) -> String {
    let whole = body.signature().to_string();
    match whole.strip_prefix('(').and_then(|s| s.strip_suffix(')')) {
        Some(fields) => fields.to_owned(),
        None => whole,
    }
}

/// How long a call may take unless [`Supervisor::with_timeout`] says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// A connection to the supervisor, with a proxy per interface.
#[derive(Debug, Clone)]
pub struct Supervisor {
    conn: zbus::Connection,
    tasks: zbus::Proxy<'static>,
    worker: zbus::Proxy<'static>,
    retry: zbus::Proxy<'static>,
    agents: zbus::Proxy<'static>,
    reconcile: zbus::Proxy<'static>,
    interactive: bool,
    timeout: Duration,
    /// The protocol this client speaks, and whether the supervisor's was
    /// found compatible (checked once, before the first call).
    protocol: (u32, u32),
    checked: Arc<OnceCell<()>>,
}

/// Connects to the bus at `address`, or to the system bus
/// (`DBUS_SYSTEM_BUS_ADDRESS` when set) when `None`. This is the one way
/// every airlock process names its bus.
pub async fn connect_bus(address: Option<&str>) -> Result<zbus::Connection, Error> {
    let conn = match address {
        Some(a) => match zbus::connection::Builder::address(a) {
            Ok(b) => b.build().await,
            Err(e) => Err(e),
        },
        None => zbus::Connection::system().await,
    };
    conn.map_err(|e| {
        Error::with(
            Code::RUNTIME_UNAVAILABLE,
            format!(
                "cannot connect to the bus {}: {e}",
                address.unwrap_or("(system)")
            ),
        )
    })
}

async fn proxy(
    conn: &zbus::Connection,
    interface: &'static str,
) -> Result<zbus::Proxy<'static>, Error> {
    zbus::proxy::Builder::new(conn)
        .destination(BUS_NAME)
        .and_then(|b| b.path(OBJECT_PATH))
        .and_then(|b| b.interface(interface))
        .map(|b| b.cache_properties(CacheProperties::No))
        .map_err(from_zbus)?
        .build()
        .await
        .map_err(from_zbus)
}

impl Supervisor {
    /// Connects to the supervisor on the bus at `address` (see [`connect_bus`]).
    pub async fn connect(address: Option<&str>) -> Result<Supervisor, Error> {
        Supervisor::on(connect_bus(address).await?).await
    }

    /// The supervisor on an existing connection.
    pub async fn on(conn: zbus::Connection) -> Result<Supervisor, Error> {
        Ok(Supervisor {
            tasks: proxy(&conn, bus::tasks::INTERFACE).await?,
            worker: proxy(&conn, bus::worker::INTERFACE).await?,
            retry: proxy(&conn, bus::retry::INTERFACE).await?,
            agents: proxy(&conn, bus::agents::INTERFACE).await?,
            reconcile: proxy(&conn, bus::reconcile::INTERFACE).await?,
            conn,
            interactive: false,
            timeout: DEFAULT_TIMEOUT,
            protocol: bus::PROTOCOL_VERSION,
            checked: Arc::new(OnceCell::new()),
        })
    }

    /// Declares the protocol this client speaks (normally this build's,
    /// [`bus::PROTOCOL_VERSION`]); an embedding built against an older
    /// airlock states its own so the check compares the right versions.
    pub fn speaking(mut self, protocol: (u32, u32)) -> Self {
        self.protocol = protocol;
        self.checked = Arc::new(OnceCell::new());
        self
    }

    /// Reads the supervisor's `ProtocolVersion` and refuses another major
    /// version, or a supervisor more than one minor ahead
    /// ([`bus::check_protocol`]; once, later calls reuse the answer). A supervisor older
    /// than 7.0 serves no `Tasks2`: its version is read from `Tasks1`, and
    /// the refusal names both.
    pub async fn check_protocol(&self) -> Result<(), Error> {
        self.checked
            .get_or_try_init(|| async {
                let no_answer = |_| {
                    Error::with(
                        Code::RUNTIME_UNAVAILABLE,
                        "ProtocolVersion: no answer in time",
                    )
                };
                let read = self
                    .tasks
                    .get_property::<String>(bus::tasks::PROTOCOL_VERSION);
                let server = match tokio::time::timeout(self.timeout, read)
                    .await
                    .map_err(no_answer)?
                {
                    Ok(v) => v,
                    Err(e) if names_no_such_interface(&e) => {
                        let old = tokio::time::timeout(self.timeout, self.v1_protocol())
                            .await
                            .map_err(no_answer)??;
                        bus::check_protocol(self.protocol, &old)?;
                        return Err(Error::with(
                            Code::PROTOCOL_VERSION_MISMATCH,
                            format!(
                                "the supervisor serves {} only (protocol {old:?}), this client speaks protocol {} over {}",
                                bus::tasks_v1::INTERFACE,
                                bus::protocol_string(self.protocol),
                                bus::tasks::INTERFACE
                            ),
                        ));
                    }
                    Err(e) => return Err(from_zbus(e)),
                };
                bus::check_protocol(self.protocol, &server)
            })
            .await
            .map(|_| ())
    }

    /// The `ProtocolVersion` a supervisor of before 7.0 shows on `Tasks1`.
    async fn v1_protocol(&self) -> Result<String, Error> {
        let reply = self
            .conn
            .call_method(
                Some(BUS_NAME),
                OBJECT_PATH,
                Some("org.freedesktop.DBus.Properties"),
                "Get",
                &(bus::tasks_v1::INTERFACE, bus::tasks::PROTOCOL_VERSION),
            )
            .await
            .map_err(from_zbus)?;
        let value: OwnedValue = reply.body().deserialize().map_err(from_zbus)?;
        String::try_from(value).map_err(|e| from_zbus(e.into()))
    }

    /// Calls from now on carry ALLOW_INTERACTIVE_AUTHORIZATION when
    /// `interactive` (a human can answer polkit's challenge).
    pub fn interactive(mut self, interactive: bool) -> Self {
        self.interactive = interactive;
        self
    }

    /// Bounds every call by `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The bound on each call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Whether calls allow interactive authorisation.
    pub fn is_interactive(&self) -> bool {
        self.interactive
    }

    /// The connection, for signal subscriptions and the bus daemon.
    pub fn connection(&self) -> &zbus::Connection {
        &self.conn
    }

    async fn bounded<T>(
        &self,
        method: &str,
        call: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        self.check_protocol().await?;
        match tokio::time::timeout(self.timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(Error::with(
                Code::RUNTIME_UNAVAILABLE,
                format!("{method}: no answer within {:?}", self.timeout),
            )),
        }
    }

    async fn raw<B, R>(
        &self,
        proxy: &zbus::Proxy<'static>,
        method: &'static str,
        body: &B,
    ) -> Result<R, Error>
    where
        B: serde::Serialize + DynamicType,
        R: for<'d> zbus::zvariant::DynamicDeserialize<'d>,
    {
        let flags = if self.interactive {
            MethodFlags::AllowInteractiveAuth.into()
        } else {
            Default::default()
        };
        self.bounded(method, async {
            proxy
                .call_with_flags::<_, B, R>(method, flags, body)
                .await
                .map_err(from_zbus)?
                .ok_or_else(|| {
                    Error::with(Code::MESSAGE_INVALID, format!("{method} returned no reply"))
                })
        })
        .await
    }

    /// The proxy of `interface`.
    fn proxy_of(&self, interface: &str) -> Result<&zbus::Proxy<'static>, Error> {
        [
            &self.tasks,
            &self.worker,
            &self.retry,
            &self.agents,
            &self.reconcile,
        ]
        .into_iter()
        .find(|p| p.interface().as_str() == interface)
        .ok_or_else(|| {
            Error::with(
                Code::INTERNAL,
                format!("{interface} is not an interface of the supervisor"),
            )
        })
    }

    /// Calls the method of row `M` with `body`, and decodes its reply
    /// type as the row's output signature says: the JSON of a reply `s`,
    /// nothing from a reply `""` (the reply type is `()`), the number of
    /// a reply `x`. Every method of the client is this call, made from its
    /// row (`stubs.rs`).
    async fn call<M: Call, B>(&self, body: &B) -> Result<M::Reply, Error>
    where
        B: serde::Serialize + DynamicType,
    {
        let row = M::METHOD;
        let proxy = self.proxy_of(row.interface)?;
        // The row's `client` part and its signature disagree: a bug of
        // the table, answered before anything is sent.
        let sent = body_signature(body);
        if sent != row.input {
            return Err(Error::with(
                Code::INTERNAL,
                format!(
                    "the client's {} sends ({sent}); its row takes ({})",
                    row.path(),
                    row.input
                ),
            ));
        }
        match reply_shape(&row)? {
            ReplyShape::Json => {
                let text: String = self.raw(proxy, row.name, body).await?;
                bus::decode(row.name, &text)
            }
            ReplyShape::Nothing => {
                let () = self.raw(proxy, row.name, body).await?;
                bus::decode(row.name, "null")
            }
            ReplyShape::Int64 => {
                let n: i64 = self.raw(proxy, row.name, body).await?;
                bus::decode(row.name, &n.to_string())
            }
        }
    }

    /// Reads a Tasks2 property.
    pub async fn property<T>(&self, name: &str) -> Result<T, Error>
    where
        T: TryFrom<OwnedValue>,
        T::Error: Into<zbus::Error>,
    {
        self.bounded(name, async {
            self.tasks.get_property::<T>(name).await.map_err(from_zbus)
        })
        .await
    }

    /// The unique name owning the supervisor's name, if any.
    pub async fn owner(&self) -> Result<Option<String>, Error> {
        let dbus = zbus::fdo::DBusProxy::new(&self.conn)
            .await
            .map_err(from_zbus)?;
        let name = zbus::names::BusName::try_from(BUS_NAME).map_err(|e| from_zbus(e.into()))?;
        match dbus.get_name_owner(name).await {
            Ok(owner) => Ok(Some(owner.to_string())),
            Err(zbus::fdo::Error::NameHasNoOwner(_)) => Ok(None),
            Err(e) => Err(from_zbus(e.into())),
        }
    }

    /// A stream of `TaskChanged` signals: (task id, state, revision).
    pub async fn task_changes(
        &self,
    ) -> Result<impl futures_util::Stream<Item = (String, String, i64)> + use<>, Error> {
        use futures_util::StreamExt;
        let rule = zbus::MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .sender(BUS_NAME)
            .and_then(|b| b.interface(bus::tasks::INTERFACE))
            .and_then(|b| b.member(bus::tasks::TASK_CHANGED))
            .map(|b| b.build())
            .map_err(from_zbus)?;
        let stream = zbus::MessageStream::for_match_rule(rule, &self.conn, Some(256))
            .await
            .map_err(from_zbus)?;
        Ok(stream.filter_map(|m| async move {
            let m = m.ok()?;
            m.body().deserialize::<(String, String, i64)>().ok()
        }))
    }
}

// Every method of a row with a `client` part: `crates/client/src/stubs.rs`.
airlock_proto::rows!(async_methods);

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_proto::bus::{ROWS, worker};

    #[test]
    fn every_row_the_generic_call_serves_is_read_as_its_output_says() {
        for row in ROWS.iter().flat_map(|r| r.iter()) {
            match (row.output, reply_shape(row)) {
                ("s", Ok(ReplyShape::Json))
                | ("", Ok(ReplyShape::Nothing))
                | ("x", Ok(ReplyShape::Int64)) => {}
                (out, got) => panic!("{} answers ({out}): {got:?}", row.path()),
            }
        }
        let report = <worker::ReportUpstream as Call>::METHOD;
        assert_eq!(reply_shape(&report).unwrap(), ReplyShape::Nothing);
    }

    #[test]
    fn a_reply_of_nothing_decodes_as_the_unit_reply() {
        let () = bus::decode::<<worker::ReportUpstream as Call>::Reply>("ReportUpstream", "null")
            .unwrap();
    }

    #[test]
    fn a_body_has_the_signature_of_its_fields() {
        assert_eq!(body_signature(&()), "");
        assert_eq!(body_signature(&("t",)), "s");
        assert_eq!(body_signature(&("t", 1u64, "x")), "sts");
        assert_eq!(body_signature(&("t", 0i64, 1u32)), "sxu");
        assert_eq!(body_signature(&("t", String::new())), "ss");
    }

    #[test]
    fn a_number_reply_decodes_as_the_rows_number() {
        let n: <worker::Renew as Call>::Reply =
            bus::decode(worker::RENEW, &i64::MIN.to_string()).unwrap();
        assert_eq!(n, i64::MIN);
        let agent_start = <airlock_proto::bus::agent_host::Start as Call>::METHOD;
        assert_eq!(reply_shape(&agent_start).unwrap_err().code, Code::INTERNAL);
    }
}

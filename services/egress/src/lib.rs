//! airlock-egress: the one route out of a verification environment's setup.
//!
//! A setup (`cargo fetch --locked`, `npm ci`, `pip install`) runs in the
//! executor's sandbox, whose network namespace holds only `lo`. The
//! executor's forwarder listens on `127.0.0.1:PORT` inside it; the setup's
//! package clients have `HTTPS_PROXY` (and its kin) pointing there. For
//! each TCP connection the forwarder connects to this daemon's UNIX
//! socket, writes one [`Preamble`] line (the session, the task, the
//! environment's `host:port` list and the session's [`Limits`]), then
//! pipes the setup's bytes both ways. The daemon serves exactly one
//! request per connection: `CONNECT host:port HTTP/1.1` to a listed entry,
//! resolved here, to public unicast addresses only
//! ([`address::check`]) unless the administrator's [`route`] for the host
//! lists other addresses or a parent proxy, then a tunnel metered against
//! the session's bytes, wall time and connections, and one audit event
//! ([`audit`]). The steps are in [`server`].
//!
//! # Why CONNECT only
//!
//! Everything the package registries serve a setup is reachable over
//! HTTPS, and a CONNECT tunnel carries TLS end to end: the proxy never sees
//! or alters the content, and the client checks the server's certificate
//! itself. A plain-HTTP request would pass through the proxy readable and
//! forgeable (by the proxy, or by anyone on the path), so it is refused
//! with 405 (`EGRESS_METHOD_NOT_ALLOWED`).
//!
//! # Trust domain
//!
//! - A compromised **setup** (or forwarder input it controls) can reach the
//!   listed `host:port` entries over a TCP tunnel, within the session's
//!   limits, and nothing else: not another host, not a name that resolves
//!   into loopback, private, link-local or other special ranges, not an
//!   IP literal in them, not plain HTTP.
//! - A compromised **proxy** can reach the network (public addresses on
//!   the ports it was started with, `--connect-port`, and its routes'
//!   parent proxies): that is its job. It holds nothing on the server but
//!   the parent proxy's credential a route may name ([`route`]): it runs
//!   as its own user, and once its socket is bound it confines itself
//!   (`Role::Egress` of airlock_sandbox::role): no file beyond the
//!   libraries and the few resolver files of /etc, no capabilities,
//!   no_new_privs, a seccomp deny-list, Landlock TCP connect to the
//!   `--connect-port` ports only. It sees only ciphertext of the tunnels.
//! - It serves only peers whose uid (SO_PEERCRED) is one of `--allow-uid`.
//!
//! # The protocol, for the executor
//!
//! ```
//! use airlock_egress::{HostPort, Limits, Preamble};
//!
//! let preamble = Preamble {
//!     session: "task-1:1".into(),
//!     task_id: "task-1".into(),
//!     allow: vec![HostPort::parse("pkg.example.org:443").unwrap()],
//!     limits: Limits { max_bytes: 1 << 30, max_seconds: 600, max_connections: 64 },
//! };
//! let line = preamble.to_line().unwrap();
//! assert_eq!(Preamble::parse_line(&line).unwrap(), preamble);
//! // Write `line` first on each connection to the socket, then pipe.
//! ```
//!
//! Refusals are answered `HTTP/1.1 403 Forbidden` (405 for a method other
//! than CONNECT, 400 for a malformed preamble or head, 502/504 when the
//! target cannot be resolved or reached) with `X-Airlock-Refusal: CODE`
//! and the code in the body ([`refusal`]).

pub mod address;
pub mod audit;
pub mod refusal;
/// The routes file (`--config`), parsed by airlock-config so that
/// `airlockctl doctor` reads it as the proxy does.
pub use airlock_config::routes as route;
pub mod server;

pub use airlock_proto::egress::{
    Host, HostPort, HostPortError, Limits, PREAMBLE_MAX, Preamble, PreambleError, hostport,
    preamble,
};

//! The egress channel's wire types: what the executor's forwarder writes
//! first on each connection to airlock-egress ([`Preamble`]), and the
//! `host:port` entries both sides parse alike ([`HostPort`]). The proxy
//! itself is `services/egress`; the forwarder is the executor's.

pub mod hostport;
pub mod preamble;

pub use hostport::{Host, HostPort, HostPortError};
pub use preamble::{Limits, PREAMBLE_MAX, Preamble, PreambleError};

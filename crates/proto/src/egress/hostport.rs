//! `host:port` entries: what an environment allows and what a CONNECT names.
//!
//! One parser for both, so that an entry and a request for it compare equal
//! exactly when they name the same host and port: names are lower-cased,
//! IP literals are kept as addresses (IPv6 in brackets, as in a URL's
//! authority).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Longest DNS name (RFC 1035, without the final dot).
const MAX_NAME: usize = 253;
/// Longest DNS label.
const MAX_LABEL: usize = 63;

/// The host of a [`HostPort`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Host {
    /// A DNS name, lower-cased, without a final dot.
    Name(String),
    /// An IP literal.
    Ip(IpAddr),
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Ip(IpAddr::V4(a)) => write!(f, "{a}"),
            Host::Ip(IpAddr::V6(a)) => write!(f, "[{a}]"),
        }
    }
}

/// A validated `host:port`: a DNS name or an IP literal (IPv6 in brackets)
/// and a port in 1–65535. Serialized as its string form.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HostPort {
    host: Host,
    port: u16,
}

/// Why a `host:port` entry is refused (the message says which rule).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPortError {
    input: String,
    reason: &'static str,
}

impl HostPortError {
    /// The rule the entry breaks.
    pub fn reason(&self) -> &'static str {
        self.reason
    }
}

impl fmt::Display for HostPortError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The input is shown escaped: it may be hostile.
        write!(
            f,
            "{:?} is not a host:port entry: {}",
            self.input.chars().take(300).collect::<String>(),
            self.reason
        )
    }
}

impl std::error::Error for HostPortError {}

impl HostPort {
    /// Parses and validates `host:port`.
    ///
    /// Refused: an empty or missing host or port; a port outside 1–65535
    /// or not plain decimal digits; userinfo (`@`), a scheme, path, query
    /// or fragment; wildcards (`*`); empty labels (`a..b`, a leading or a
    /// final dot); labels longer than 63 or names longer than 253
    /// characters; characters other than letters, digits and inner `-`;
    /// a name whose last label is numeric (an IPv4 literal in disguise,
    /// such as `1.2.3` or `0x7f.1`); an IPv6 literal without brackets or
    /// with a zone.
    pub fn parse(input: &str) -> Result<HostPort, HostPortError> {
        let err = |reason| HostPortError {
            input: input.to_owned(),
            reason,
        };
        if input.contains('@') {
            return Err(err("userinfo (`user@`) is not allowed"));
        }
        if input.contains('/') || input.contains('?') || input.contains('#') {
            return Err(err("a scheme, path, query or fragment is not allowed"));
        }
        if input.contains('*') {
            return Err(err("wildcards are not allowed: list each host"));
        }
        let (host, port) = if let Some(rest) = input.strip_prefix('[') {
            let (inside, after) = rest
                .split_once(']')
                .ok_or_else(|| err("an IPv6 literal has no closing `]`"))?;
            let port = after
                .strip_prefix(':')
                .ok_or_else(|| err("no `:port` after the IPv6 literal"))?;
            if inside.contains('%') {
                return Err(err("an IPv6 zone is not allowed"));
            }
            let ip = Ipv6Addr::from_str(inside).map_err(|_| err("not an IPv6 address"))?;
            (Host::Ip(IpAddr::V6(ip)), port)
        } else {
            let (host, port) = input
                .rsplit_once(':')
                .ok_or_else(|| err("no `:port` (an entry is host:port)"))?;
            if host.contains(':') {
                return Err(err("an IPv6 literal must be in brackets: [addr]:port"));
            }
            (parse_host(host).map_err(err)?, port)
        };
        let port = parse_port(port).map_err(err)?;
        Ok(HostPort { host, port })
    }

    /// The host.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }
}

fn parse_port(port: &str) -> Result<u16, &'static str> {
    if port.is_empty() {
        return Err("the port is empty");
    }
    if !port.bytes().all(|b| b.is_ascii_digit()) || port.len() > 5 {
        return Err("the port is not a decimal number in 1-65535");
    }
    match port.parse::<u16>() {
        Ok(0) | Err(_) => Err("the port is not in 1-65535"),
        Ok(p) => Ok(p),
    }
}

fn parse_host(host: &str) -> Result<Host, &'static str> {
    if host.is_empty() {
        return Err("the host is empty");
    }
    if let Ok(v4) = Ipv4Addr::from_str(host) {
        return Ok(Host::Ip(IpAddr::V4(v4)));
    }
    if host.len() > MAX_NAME {
        return Err("the name is longer than 253 characters");
    }
    let name = host.to_ascii_lowercase();
    let labels: Vec<&str> = name.split('.').collect();
    for label in &labels {
        if label.is_empty() {
            return Err("the name has an empty label (a leading, doubled or final dot)");
        }
        if label.len() > MAX_LABEL {
            return Err("a label is longer than 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err("a name has only letters, digits, `-` and `.`");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err("a label neither starts nor ends with `-`");
        }
    }
    // What resolvers would read as an IPv4 address in another notation
    // (`127.1`, `0x7f.0.0.1`, `2130706433`) is neither a name nor a
    // literal this parser accepts.
    let last = labels.last().copied().unwrap_or_default();
    if last.bytes().all(|b| b.is_ascii_digit())
        || (last.starts_with("0x") && last[2..].bytes().all(|b| b.is_ascii_hexdigit()))
    {
        return Err("the last label is numeric: write an IPv4 address as a.b.c.d");
    }
    Ok(Host::Name(name))
}

impl FromStr for HostPort {
    type Err = HostPortError;

    fn from_str(s: &str) -> Result<HostPort, HostPortError> {
        HostPort::parse(s)
    }
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

impl Serialize for HostPort {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for HostPort {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<HostPort, D::Error> {
        let s = String::deserialize(d)?;
        HostPort::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> String {
        HostPort::parse(s)
            .unwrap_or_else(|e| panic!("{s}: {e}"))
            .to_string()
    }

    #[test]
    fn accepts_names_and_literals_and_lower_cases_names() {
        assert_eq!(ok("Pkg.Example.ORG:443"), "pkg.example.org:443");
        assert_eq!(ok("a-b.c1:1"), "a-b.c1:1");
        assert_eq!(ok("localhost:65535"), "localhost:65535");
        assert_eq!(ok("192.0.2.1:8443"), "192.0.2.1:8443");
        assert_eq!(ok("[2001:DB8::1]:443"), "[2001:db8::1]:443");
        assert_eq!(
            HostPort::parse("[::ffff:127.0.0.1]:1").unwrap().host(),
            &Host::Ip("::ffff:127.0.0.1".parse().unwrap())
        );
        let long = format!("{}.org:443", "a".repeat(63));
        assert!(HostPort::parse(&long).is_ok());
    }

    #[test]
    fn refuses_each_malformed_entry_with_its_reason() {
        for (input, reason) in [
            ("", "no `:port`"),
            ("example.org", "no `:port`"),
            (":443", "the host is empty"),
            ("example.org:", "the port is empty"),
            ("example.org:0", "not in 1-65535"),
            ("example.org:65536", "not in 1-65535"),
            ("example.org:+443", "decimal number"),
            ("example.org:0443x", "decimal number"),
            ("example.org:000000443", "decimal number"),
            ("*.example.org:443", "wildcards"),
            ("user@example.org:443", "userinfo"),
            ("user:pw@example.org:443", "userinfo"),
            ("https://example.org:443", "path"),
            ("example.org:443/simple", "path"),
            ("example.org:443?x", "path"),
            ("example..org:443", "empty label"),
            (".example.org:443", "empty label"),
            ("example.org.:443", "empty label"),
            ("exa_mple.org:443", "only letters"),
            ("exämple.org:443", "only letters"),
            ("ex ample.org:443", "only letters"),
            ("-example.org:443", "`-`"),
            ("example-.org:443", "`-`"),
            ("127.1:443", "numeric"),
            ("2130706433:443", "numeric"),
            ("0x7f.0.0.1:443", "numeric"),
            ("1.2.3.0x7f:443", "numeric"),
            ("010.0.0.1:443", "numeric"),
            ("::1:443", "brackets"),
            ("[::1]443", "no `:port`"),
            ("[::1:443", "closing"),
            ("[fe80::1%eth0]:443", "zone"),
            ("[example.org]:443", "not an IPv6"),
        ] {
            let e = HostPort::parse(input).expect_err(input);
            assert!(e.reason().contains(reason), "{input}: {e}");
            assert!(e.to_string().contains("is not a host:port entry"));
        }
        let long_label = format!("{}.org:443", "a".repeat(64));
        assert!(HostPort::parse(&long_label).is_err());
        let long_name = format!("{}org:443", "abcdefghi.".repeat(26));
        assert!(
            HostPort::parse(&long_name)
                .unwrap_err()
                .reason()
                .contains("253")
        );
    }

    #[test]
    fn serde_round_trips_through_the_string_form_and_validates() {
        let hp: HostPort = serde_json::from_str("\"EXAMPLE.org:443\"").unwrap();
        assert_eq!(serde_json::to_string(&hp).unwrap(), "\"example.org:443\"");
        assert!(serde_json::from_str::<HostPort>("\"*.example.org:443\"").is_err());
        assert!(serde_json::from_str::<HostPort>("443").is_err());
    }
}

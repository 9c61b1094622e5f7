//! Routes: how the proxy reaches each host, set by the administrator in
//! airlock-egress's own configuration file (`--config`,
//! `/etc/airlock/egress.toml` under systemd), never by a planner: an
//! environment only lists the `host:port` entries a setup may ask for;
//! which addresses those names may reach, and through which parent proxy,
//! is this file's.
//!
//! ```toml
//! # An internal mirror: the name must resolve into these ranges.
//! [[route]]
//! host = "mirror.corp.example"
//! addresses = ["10.20.0.0/16"]
//!
//! # Everything else under corp.example through the company's proxy,
//! # its credential in $CREDENTIALS_DIRECTORY/parent-proxy.
//! [[route]]
//! host = "*.corp.example"
//! via = "http://proxy.corp.example:3128"
//! credential = "parent-proxy"
//!
//! [[route]]
//! host = "*"
//! direct = true
//! ```
//!
//! Each `[[route]]` has a `host` pattern (a name, `*.suffix` for the names
//! under a suffix, or `*`) and exactly one way:
//!
//! - `direct = true`: resolve here, public unicast addresses only
//!   (airlock-egress's address check); what a host no route names gets.
//! - `addresses = ["CIDR", …]`: resolve here; every address must lie in
//!   these ranges (private ranges are fine). Loopback, link-local and cloud
//!   metadata addresses only one by one (a `/32` or `/128`, or no prefix),
//!   never in a wider range; each such address is warned about at start.
//!   Unspecified, multicast and reserved ranges are refused outright.
//! - `via = "http://HOST:PORT"`: CONNECT through that parent proxy, which
//!   resolves the name and reaches it by its own policy (an IP literal
//!   target must still be public). `credential = "NAME"` sends the file
//!   `$CREDENTIALS_DIRECTORY/NAME` (`user:password`, one line) as
//!   `Proxy-Authorization: Basic`; the file is read once at start, before
//!   the daemon confines itself, and its content is never logged.
//!
//! The most specific pattern wins: a name, then the longest `*.suffix`,
//! then `*`; two routes with one pattern are refused.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;

use airlock_proto::egress::{Host, HostPort};
use base64::Engine as _;
use serde::Deserialize;

/// Most routes in one file.
pub const MAX_ROUTES: usize = 256;
/// Most ranges in one route's `addresses`.
pub const MAX_RANGES: usize = 256;
/// Longest credential file, in bytes.
const MAX_CREDENTIAL: usize = 1024;

/// The file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    route: Vec<RouteFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteFile {
    host: String,
    #[serde(default)]
    direct: bool,
    addresses: Option<Vec<String>>,
    via: Option<String>,
    credential: Option<String>,
}

/// Which hosts a route serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// Every host.
    Any,
    /// The names under a suffix (stored with its leading dot).
    Under(String),
    /// One host: a name, or an IP literal as it prints.
    Exact(String),
}

impl Pattern {
    fn parse(text: &str) -> Result<Pattern, String> {
        if text == "*" {
            return Ok(Pattern::Any);
        }
        let (wild, rest) = match text.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let host = HostPort::parse(&format!("{rest}:1"))
            .map_err(|e| format!("host {text:?}: {}", e.reason()))?;
        match (wild, host.host()) {
            (true, Host::Ip(_)) => Err(format!("host {text:?}: *. is for names")),
            (true, Host::Name(n)) => Ok(Pattern::Under(format!(".{n}"))),
            (false, h) => Ok(Pattern::Exact(h.to_string())),
        }
    }

    /// How specific: the exact host first, then the longest suffix.
    fn rank(&self) -> usize {
        match self {
            Pattern::Any => 0,
            Pattern::Under(s) => 1 + s.len(),
            Pattern::Exact(_) => usize::MAX,
        }
    }

    fn matches(&self, host: &Host) -> bool {
        match (self, host) {
            (Pattern::Any, _) => true,
            (Pattern::Under(s), Host::Name(n)) => n.ends_with(s.as_str()),
            (Pattern::Under(_), Host::Ip(_)) => false,
            (Pattern::Exact(e), h) => *e == h.to_string(),
        }
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pattern::Any => f.write_str("*"),
            Pattern::Under(s) => write!(f, "*{s}"),
            Pattern::Exact(h) => f.write_str(h),
        }
    }
}

/// An address range, `network/prefix`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    len: u8,
}

impl Cidr {
    /// `a.b.c.d/n`, `x::y/n`, or one address (its full length). An
    /// IPv4-mapped IPv6 range is the IPv4 one.
    pub fn parse(text: &str) -> Result<Cidr, String> {
        let (addr, len) = match text.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (text, None),
        };
        let ip: IpAddr = addr
            .parse()
            .map_err(|_| format!("{text:?} is not an address or CIDR range"))?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let len = match len {
            None => max,
            Some(l) => l
                .parse::<u8>()
                .ok()
                .filter(|l| *l <= max && !l.to_string().starts_with('+'))
                .ok_or_else(|| format!("{text:?}: the prefix length must be 0 to {max}"))?,
        };
        let (ip, len) = match ip {
            IpAddr::V6(v6) if len >= 96 && v6.to_ipv4_mapped().is_some() => (
                IpAddr::V4(v6.to_ipv4_mapped().unwrap_or(Ipv4Addr::UNSPECIFIED)),
                len - 96,
            ),
            other => (other, len),
        };
        let c = Cidr { net: ip, len };
        if c.masked() != ip {
            return Err(format!(
                "{text:?} has host bits set (the network is {}/{len})",
                c.masked()
            ));
        }
        Ok(c)
    }

    fn masked(&self) -> IpAddr {
        match self.net {
            IpAddr::V4(a) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.len)).unwrap_or(0);
                IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask))
            }
            IpAddr::V6(a) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.len))
                    .unwrap_or(0);
                IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask))
            }
        }
    }

    /// Whether `ip` (an IPv4-mapped address as its IPv4 one) is inside.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        Cidr {
            net: ip,
            len: self.len,
        }
        .masked_eq(self)
    }

    fn masked_eq(&self, other: &Cidr) -> bool {
        self.net.is_ipv4() == other.net.is_ipv4() && self.masked() == other.masked()
    }

    /// Whether the two ranges share an address.
    fn overlaps(&self, other: &Cidr) -> bool {
        let len = self.len.min(other.len);
        Cidr { net: self.net, len }.masked_eq(&Cidr {
            net: other.net,
            len,
        })
    }

    fn single(&self) -> bool {
        self.len == if self.net.is_ipv4() { 32 } else { 128 }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.net, self.len)
    }
}

/// Ranges a route may list only one address at a time (and is warned
/// about): what reaches this host itself or its cloud's metadata service.
const ONE_BY_ONE: &[(&str, &str)] = &[
    ("127.0.0.0/8", "loopback"),
    ("::1/128", "loopback"),
    ("169.254.0.0/16", "link-local"),
    ("fe80::/10", "link-local"),
    ("fd00:ec2::254/128", "cloud metadata"),
    ("100.100.100.200/32", "cloud metadata"),
];

/// Ranges no route may list: nothing to connect to there.
const NEVER: &[(&str, &str)] = &[
    ("0.0.0.0/8", "unspecified"),
    ("::/128", "unspecified"),
    ("224.0.0.0/4", "multicast"),
    ("ff00::/8", "multicast"),
    ("240.0.0.0/4", "reserved and broadcast"),
];

fn class(c: &Cidr, table: &[(&str, &'static str)]) -> Option<&'static str> {
    table
        .iter()
        .find(|(range, _)| Cidr::parse(range).is_ok_and(|r| r.overlaps(c)))
        .map(|(_, name)| *name)
}

/// A parent proxy (`via`).
#[derive(Clone, PartialEq, Eq)]
pub struct Parent {
    /// Its host and port, as the URL gave them.
    pub proxy: HostPort,
    /// The credential's name in `$CREDENTIALS_DIRECTORY`, if any.
    pub credential: Option<String>,
    /// `Basic …`, once [`Config::load_credentials`] read it.
    authorization: Option<String>,
}

impl Parent {
    /// The `Proxy-Authorization` value, if the route has a credential.
    pub fn authorization(&self) -> Option<&str> {
        self.authorization.as_deref()
    }
}

impl fmt::Debug for Parent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the credential's content.
        f.debug_struct("Parent")
            .field("proxy", &self.proxy)
            .field("credential", &self.credential)
            .finish_non_exhaustive()
    }
}

/// How a route reaches its hosts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Way {
    /// Resolve here; public unicast only.
    Direct,
    /// Resolve here; every address inside these ranges.
    Addresses(Vec<Cidr>),
    /// CONNECT through a parent proxy.
    Via(Parent),
}

/// One `[[route]]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// Its hosts.
    pub pattern: Pattern,
    /// Its way.
    pub way: Way,
}

/// The route of hosts no `[[route]]` names.
pub static DEFAULT: Route = Route {
    pattern: Pattern::Any,
    way: Way::Direct,
};

impl Route {
    /// How a decision line names it: `direct`, `addresses PATTERN`,
    /// `via PATTERN` (never the parent's credential).
    pub fn label(&self) -> String {
        match &self.way {
            Way::Direct if std::ptr::eq(self, &DEFAULT) => "direct (no route)".to_owned(),
            Way::Direct => format!("direct {}", self.pattern),
            Way::Addresses(_) => format!("addresses {}", self.pattern),
            Way::Via(p) => format!("via {} {}", p.proxy, self.pattern),
        }
    }
}

/// airlock-egress's configuration: its routes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// Most specific first.
    routes: Vec<Route>,
}

impl Config {
    /// Parses and checks the file's text (`origin` names it in errors).
    pub fn parse(text: &str, origin: &str) -> Result<Config, String> {
        let file: File = toml::from_str(text).map_err(|e| format!("{origin}: {e}"))?;
        if file.route.len() > MAX_ROUTES {
            return Err(format!("{origin}: more than {MAX_ROUTES} routes"));
        }
        let mut routes: Vec<Route> = Vec::new();
        for (i, r) in file.route.iter().enumerate() {
            let at = format!("{origin}: route[{i}]");
            let pattern = Pattern::parse(&r.host).map_err(|e| format!("{at}: {e}"))?;
            if routes.iter().any(|o| o.pattern == pattern) {
                return Err(format!("{at}: another route has host {:?}", r.host));
            }
            let way = match (r.direct, &r.addresses, &r.via) {
                (true, None, None) => Way::Direct,
                (false, Some(list), None) => {
                    Way::Addresses(ranges(list).map_err(|e| format!("{at}: addresses: {e}"))?)
                }
                (false, None, Some(url)) => Way::Via(Parent {
                    proxy: parent_url(url).map_err(|e| format!("{at}: via: {e}"))?,
                    credential: r.credential.clone(),
                    authorization: None,
                }),
                _ => {
                    return Err(format!(
                        "{at}: expected exactly one of direct = true, addresses = [...], via = \"http://HOST:PORT\""
                    ));
                }
            };
            if let Some(name) = &r.credential {
                if !matches!(way, Way::Via(_)) {
                    return Err(format!("{at}: credential is for a via route"));
                }
                if !credential_name(name) {
                    return Err(format!(
                        "{at}: credential {name:?}: expected a credential name of 1 to 64 characters [A-Za-z0-9._-], not starting with '.'"
                    ));
                }
            }
            routes.push(Route { pattern, way });
        }
        routes.sort_by_key(|r| std::cmp::Reverse(r.pattern.rank()));
        Ok(Config { routes })
    }

    /// Reads and parses `path`.
    pub fn load(path: &Path) -> Result<Config, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Config::parse(&text, &path.display().to_string())
    }

    /// Reads each `via` route's credential from `dir`
    /// (`$CREDENTIALS_DIRECTORY`): `user:password` on one line.
    pub fn load_credentials(&mut self, dir: Option<&Path>) -> Result<(), String> {
        let mut read: HashMap<String, String> = HashMap::new();
        for r in &mut self.routes {
            let Way::Via(p) = &mut r.way else { continue };
            let Some(name) = &p.credential else { continue };
            if let Some(a) = read.get(name) {
                p.authorization = Some(a.clone());
                continue;
            }
            let dir = dir.ok_or_else(|| {
                format!("route {}: credential {name:?}, but CREDENTIALS_DIRECTORY is not set (systemd's LoadCredential=)", r.pattern)
            })?;
            let path = dir.join(name);
            let bytes = std::fs::read(&path)
                .map_err(|e| format!("route {}: credential {name:?}: {e}", r.pattern))?;
            let text = std::str::from_utf8(&bytes)
                .ok()
                .map(|t| t.strip_suffix('\n').unwrap_or(t))
                .map(|t| t.strip_suffix('\r').unwrap_or(t))
                .filter(|t| {
                    bytes.len() <= MAX_CREDENTIAL
                        && t.contains(':')
                        && !t.chars().any(char::is_control)
                })
                .ok_or_else(|| {
                    format!(
                        "route {}: credential {name:?}: expected one line user:password of at most {MAX_CREDENTIAL} bytes",
                        r.pattern
                    )
                })?;
            let value = format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(text)
            );
            read.insert(name.clone(), value.clone());
            p.authorization = Some(value);
        }
        Ok(())
    }

    /// The route serving `host`: the most specific match, else
    /// [`DEFAULT`].
    pub fn route_for(&self, host: &Host) -> &Route {
        self.routes
            .iter()
            .find(|r| r.pattern.matches(host))
            .unwrap_or(&DEFAULT)
    }

    /// The routes, most specific first.
    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// The ports of the parent proxies (the daemon's Landlock grant).
    pub fn parent_ports(&self) -> Vec<u16> {
        self.routes
            .iter()
            .filter_map(|r| match &r.way {
                Way::Via(p) => Some(p.proxy.port()),
                _ => None,
            })
            .collect()
    }

    /// What the administrator should know at start: each loopback,
    /// link-local or metadata address a route lets a tunnel reach.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        for r in &self.routes {
            if let Way::Addresses(list) = &r.way {
                for c in list {
                    if let Some(what) = class(c, ONE_BY_ONE) {
                        out.push(format!(
                            "route {} lets tunnels reach {} ({what}): a service of this host or its cloud, reachable by every setup whose environment lists a host of this route",
                            r.pattern, c.net
                        ));
                    }
                }
            }
        }
        out
    }
}

fn ranges(list: &[String]) -> Result<Vec<Cidr>, String> {
    if list.is_empty() || list.len() > MAX_RANGES {
        return Err(format!("expected 1 to {MAX_RANGES} ranges"));
    }
    let mut out = Vec::new();
    for text in list {
        let c = Cidr::parse(text)?;
        if let Some(what) = class(&c, NEVER) {
            return Err(format!(
                "{text:?} overlaps {what} addresses, which are never reached"
            ));
        }
        if let Some(what) = class(&c, ONE_BY_ONE).filter(|_| !c.single()) {
            return Err(format!(
                "{text:?} covers {what} addresses: list each one on its own (a single address)"
            ));
        }
        out.push(c);
    }
    Ok(out)
}

/// `http://HOST:PORT` (a trailing `/` allowed; no user, path or query).
fn parent_url(url: &str) -> Result<HostPort, String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{url:?}: expected http://HOST:PORT"))?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains(['@', '/', '?', '#']) {
        return Err(format!(
            "{url:?}: expected http://HOST:PORT, without credentials (those go in the credential file) or a path"
        ));
    }
    HostPort::parse(rest).map_err(|e| format!("{url:?}: {}", e.reason()))
}

fn credential_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(s: &str) -> Host {
        HostPort::parse(&format!("{s}:443")).unwrap().host().clone()
    }

    fn err(text: &str) -> String {
        Config::parse(text, "egress.toml").unwrap_err()
    }

    #[test]
    fn the_most_specific_route_serves_a_host() {
        let c = Config::parse(
            "[[route]]\nhost = \"*\"\nvia = \"http://proxy.corp.example:3128\"\n\
             [[route]]\nhost = \"*.corp.example\"\naddresses = [\"10.0.0.0/8\"]\n\
             [[route]]\nhost = \"*.pkg.corp.example\"\ndirect = true\n\
             [[route]]\nhost = \"mirror.pkg.corp.example\"\naddresses = [\"192.168.7.7\"]\n",
            "egress.toml",
        )
        .unwrap();
        let label = |h: &str| c.route_for(&host(h)).label();
        assert_eq!(
            label("mirror.pkg.corp.example"),
            "addresses mirror.pkg.corp.example"
        );
        assert_eq!(label("a.pkg.corp.example"), "direct *.pkg.corp.example");
        assert_eq!(label("a.corp.example"), "addresses *.corp.example");
        assert_eq!(label("corp.example"), "via proxy.corp.example:3128 *");
        assert_eq!(label("1.2.3.4"), "via proxy.corp.example:3128 *");
        assert_eq!(c.parent_ports(), vec![3128]);
        assert_eq!(
            Config::default().route_for(&host("x.example")).label(),
            "direct (no route)"
        );
    }

    #[test]
    fn ranges_are_checked() {
        let c = Cidr::parse("10.20.0.0/16").unwrap();
        assert!(c.contains("10.20.3.4".parse().unwrap()));
        assert!(c.contains("::ffff:10.20.3.4".parse().unwrap()));
        assert!(!c.contains("10.21.0.1".parse().unwrap()));
        assert!(
            Cidr::parse("::ffff:10.0.0.0/104")
                .unwrap()
                .contains("10.9.9.9".parse().unwrap())
        );
        assert!(
            Cidr::parse("10.20.0.1/16")
                .unwrap_err()
                .contains("host bits")
        );
        assert!(Cidr::parse("10.0.0.0/33").is_err());
        assert!(Cidr::parse("mirror").is_err());
        for (range, why) in [
            ("127.0.0.0/8", "loopback"),
            ("127.0.0.0/31", "loopback"),
            ("0.0.0.0/0", "unspecified"),
            ("128.0.0.0/1", "multicast"),
            ("169.254.0.0/16", "link-local"),
            ("fe80::/64", "link-local"),
            ("::/0", "unspecified"),
            ("224.0.0.1", "multicast"),
        ] {
            let e = err(&format!(
                "[[route]]\nhost = \"m.example\"\naddresses = [\"{range}\"]\n"
            ));
            assert!(e.contains(why), "{range}: {e}");
        }
        let c = Config::parse(
            "[[route]]\nhost = \"localhost\"\naddresses = [\"127.0.0.1\", \"::1\", \"169.254.169.254/32\", \"10.0.0.0/8\"]\n",
            "egress.toml",
        )
        .unwrap();
        let w = c.warnings();
        assert_eq!(w.len(), 3, "{w:?}");
        assert!(w[0].contains("127.0.0.1 (loopback)"), "{w:?}");
        assert!(w[2].contains("169.254.169.254 (link-local)"), "{w:?}");
    }

    #[test]
    fn malformed_routes_are_refused_by_name() {
        for (text, part) in [
            ("[[route]]\nhost = \"a.example\"\n", "exactly one of"),
            (
                "[[route]]\nhost = \"a.example\"\ndirect = true\naddresses = [\"10.0.0.1\"]\n",
                "exactly one of",
            ),
            (
                "[[route]]\nhost = \"a.example\"\naddresses = []\n",
                "1 to 256",
            ),
            (
                "[[route]]\nhost = \"a.example\"\nvia = \"https://p.example:3128\"\n",
                "http://HOST:PORT",
            ),
            (
                "[[route]]\nhost = \"a.example\"\nvia = \"http://u:p@p.example:3128\"\n",
                "without credentials",
            ),
            (
                "[[route]]\nhost = \"a.example\"\nvia = \"http://p.example\"\n",
                "via",
            ),
            (
                "[[route]]\nhost = \"a.example\"\ndirect = true\ncredential = \"x\"\n",
                "for a via route",
            ),
            (
                "[[route]]\nhost = \"a.example\"\nvia = \"http://p.example:1\"\ncredential = \"../x\"\n",
                "credential name",
            ),
            (
                "[[route]]\nhost = \"*.10.0.0.1\"\ndirect = true\n",
                "for names",
            ),
            (
                "[[route]]\nhost = \"a..example\"\ndirect = true\n",
                "route[0]",
            ),
            (
                "[[route]]\nhost = \"a.example\"\ndirect = true\n[[route]]\nhost = \"A.example\"\ndirect = true\n",
                "another route",
            ),
            (
                "[[route]]\nhost = \"a.example\"\ndirect = true\nport = 1\n",
                "unknown field",
            ),
            ("[egress]\n", "unknown field"),
        ] {
            let e = err(text);
            assert!(
                e.contains(part) && e.starts_with("egress.toml"),
                "{text}: {e}"
            );
        }
    }

    #[test]
    fn credentials_are_read_once_and_never_shown() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("parent"), "alice:s3cret\n").unwrap();
        std::fs::write(dir.path().join("bad"), "no-colon\n").unwrap();
        let text =
            "[[route]]\nhost = \"*\"\nvia = \"http://127.0.0.1:3128\"\ncredential = \"parent\"\n";
        let mut c = Config::parse(text, "egress.toml").unwrap();
        c.load_credentials(Some(dir.path())).unwrap();
        let Way::Via(p) = &c.route_for(&host("a.example")).way else {
            panic!()
        };
        assert_eq!(p.authorization(), Some("Basic YWxpY2U6czNjcmV0"));
        assert!(!format!("{c:?}").contains("YWxpY2U6czNjcmV0"));
        let mut c = Config::parse(&text.replace("parent\"", "bad\""), "egress.toml").unwrap();
        assert!(
            c.load_credentials(Some(dir.path()))
                .unwrap_err()
                .contains("user:password")
        );
        let mut c = Config::parse(&text.replace("parent\"", "absent\""), "egress.toml").unwrap();
        assert!(c.load_credentials(Some(dir.path())).is_err());
        let mut c = Config::parse(text, "egress.toml").unwrap();
        assert!(
            c.load_credentials(None)
                .unwrap_err()
                .contains("CREDENTIALS_DIRECTORY")
        );
    }
}

//! A network the test owns, to reach PostgreSQL over TCP and cut the way:
//! the server's own network namespace with a bridge (`br0`, at
//! [`SERVER_ADDRESS`]), and one network namespace per host, each joined
//! to the bridge by a veth pair (`eth0` inside, at `198.18.0.N`). Every
//! address is in 198.18.0.0/24 (RFC 2544's benchmarking range) and exists
//! only inside these namespaces: nothing reaches a real network, and the
//! machine's own namespace is left as it was.
//!
//! A partition ([`Network::cut`]) is a packet filter inside the host's
//! namespace (nftables, Debian's `nftables` package) that drops every
//! packet to and from the server, as a switch that lost a port would:
//! no reset, no ICMP, the peer's packets simply vanish. [`Network::heal`]
//! deletes it. Root only.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// The server's address on the bridge.
pub const SERVER_ADDRESS: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);

/// The nftables table a partition adds in a host's namespace.
const CUT_TABLE: &str = "airlock_partition";

fn run(args: &[&str], stdin: Option<&str>) -> Result<(), String> {
    let mut cmd = Command::new(args[0]);
    cmd.args(&args[1..])
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| format!("{args:?}: {e}"))?;
    if let (Some(text), Some(mut input)) = (stdin, child.stdin.take()) {
        std::io::Write::write_all(&mut input, text.as_bytes())
            .map_err(|e| format!("{args:?}: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("{args:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A named network namespace (`/run/netns/NAME`) with `lo` up, deleted
/// when dropped.
#[derive(Debug)]
pub struct Netns(String);

impl Netns {
    /// Creates namespace `name` (replacing a leftover of that name).
    pub fn new(name: String) -> Result<Netns, String> {
        let _ = Command::new("ip")
            .args(["netns", "del", &name])
            .stderr(Stdio::null())
            .status();
        run(&["ip", "netns", "add", &name], None)?;
        let ns = Netns(name);
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.0
    }

    /// Its path, for `setns(2)`.
    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.0)
    }

    /// `ip ARGS` inside it.
    pub fn ip(&self, args: &[&str]) -> Result<(), String> {
        let mut all = vec!["ip", "-n", &self.0];
        all.extend_from_slice(args);
        run(&all, None)
    }

    /// `nft -f -` inside it, reading `script`.
    fn nft(&self, script: &str) -> Result<(), String> {
        run(
            &["ip", "netns", "exec", &self.0, "nft", "-f", "-"],
            Some(script),
        )
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.0])
            .stderr(Stdio::null())
            .status();
    }
}

/// The server's namespace and its bridge, and the hosts joined to it.
#[derive(Debug)]
pub struct Network {
    prefix: String,
    server: Netns,
    hosts: Vec<Netns>,
}

impl Network {
    /// Creates the server's namespace `PREFIX-pg` with its bridge up at
    /// [`SERVER_ADDRESS`]/24.
    pub fn new(prefix: &str) -> Result<Network, String> {
        let server = Netns::new(format!("{prefix}-pg"))?;
        server.ip(&["link", "add", "br0", "type", "bridge"])?;
        server.ip(&["addr", "add", &format!("{SERVER_ADDRESS}/24"), "dev", "br0"])?;
        server.ip(&["link", "set", "br0", "up"])?;
        Ok(Network {
            prefix: prefix.to_owned(),
            server,
            hosts: Vec::new(),
        })
    }

    /// The server's namespace (start PostgreSQL in it:
    /// [`crate::Cluster::start_in`]).
    pub fn server(&self) -> &Netns {
        &self.server
    }

    /// Adds host namespace `PREFIX-hN` (N from 0), joined to the bridge at
    /// `198.18.0.(N+2)`: returns its index.
    pub fn add_host(&mut self) -> Result<usize, String> {
        let n = self.hosts.len();
        let host = Netns::new(format!("{}-h{n}", self.prefix))?;
        let port = format!("veth{n}");
        self.server.ip(&[
            "link",
            "add",
            &port,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            host.name(),
        ])?;
        self.server
            .ip(&["link", "set", &port, "master", "br0", "up"])?;
        host.ip(&[
            "addr",
            "add",
            &format!("{}/24", Network::host_address(n)),
            "dev",
            "eth0",
        ])?;
        host.ip(&["link", "set", "eth0", "up"])?;
        self.hosts.push(host);
        Ok(n)
    }

    /// Host `n`'s address on the bridge.
    pub fn host_address(n: usize) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, 0, 2 + u8::try_from(n).expect("at most 250 hosts"))
    }

    /// Host `n`'s namespace.
    pub fn host(&self, n: usize) -> &Netns {
        &self.hosts[n]
    }

    /// Cuts host `n` off the server: every packet between them dropped,
    /// in both directions, inside the host's namespace.
    pub fn cut(&self, n: usize) -> Result<(), String> {
        self.hosts[n].nft(&format!(
            "table inet {CUT_TABLE} {{
               chain out {{ type filter hook output priority 0; policy accept; ip daddr {SERVER_ADDRESS} drop; }}
               chain in {{ type filter hook input priority 0; policy accept; ip saddr {SERVER_ADDRESS} drop; }}
             }}\n"
        ))
    }

    /// Heals host `n`'s partition (the filter deleted).
    pub fn heal(&self, n: usize) -> Result<(), String> {
        self.hosts[n].nft(&format!("delete table inet {CUT_TABLE}\n"))
    }
}

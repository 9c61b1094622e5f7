//! The bypass corpus: the ways a setup (or whatever controls the bytes the
//! forwarder passes on) might try to make airlock-egress reach something
//! other than a listed `host:port` at a public address, each a named case
//! asserted refused (with its code) or harmless (and why), against the
//! daemon binary with real sockets.
//!
//! The daemon runs in a network and mount namespace of its own
//! (`unshare --net --mount`), where the test is the whole world:
//! - `lo` also carries `1.2.3.4` (an address of no special range: the
//!   stand-in for a registry), `10.0.0.1` and `fd00::1`;
//! - one TCP listener on `[::]:443` (dual-stack) records every connection
//!   the daemon makes, with the local address it reached, so a case shows
//!   where a tunnel went (only `1.2.3.4` may ever be reached) and that a
//!   refusal connected nowhere; a UDP socket on port 443 records datagrams
//!   (none may arrive);
//! - `/etc/resolv.conf` is bind-mounted to name a DNS responder this test
//!   runs on `127.0.0.53:53` in that namespace, answering from [`zone`]
//!   with TTL 0 (a public A with a private AAAA, rebinding between
//!   lookups, the IPv6 forms that carry a loopback IPv4 address);
//!   `/etc/nsswitch.conf` and `/etc/hosts` are the test's too;
//! - the daemon's routes file (`--config`) lets `mirror.test` and the
//!   names under `corp.test` resolve into 10.0.0.0/8, and only there.
//!
//! The table of cases and outcomes is docs/privsep/egress.md's generated
//! section (`the_corpus_table_in_the_docs_is_current`; rewrite it with
//! `UPDATE_DOCS=1`).

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, TcpListener, UdpSocket};
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use airlock_egress::{HostPort, Limits, Preamble};

/// The stand-in for a listed registry: an address of no special range,
/// on `lo` of the daemon's namespace only.
const PUBLIC: Ipv4Addr = Ipv4Addr::new(1, 2, 3, 4);

/// What a case expects.
#[derive(Clone, Copy, Debug)]
enum Expect {
    /// Refused with this code (`X-Airlock-Refusal`), nothing connected.
    Refused(&'static str),
    /// A tunnel opens, and it reaches the listed host's address only: the
    /// bytes written into it arrive at `1.2.3.4:443`, and nothing else is
    /// connected. The text says why that is harmless.
    Tunnel(&'static str),
    /// As [`Expect::Tunnel`], to this address (which the administrator's
    /// route lists) instead of `1.2.3.4`.
    RoutedTunnel(Ipv4Addr, &'static str),
    /// The daemon's socket does not take the connection at all (the
    /// kernel's answer, not the daemon's).
    NotServed(&'static str),
    /// Asserted by another test, named here.
    Elsewhere(&'static str),
}

/// One case of the corpus.
struct Case {
    name: &'static str,
    /// The preamble's `allow` entries (what the environment lists).
    allow: &'static [&'static str],
    /// What the client writes after the preamble.
    send: Vec<u8>,
    /// How the input reads in the table when `send` is too long to show.
    show: Option<&'static str>,
    expect: Expect,
}

const ALLOWED: &[&str] = &["allowed.test:443"];

fn connect(target: &str) -> Vec<u8> {
    format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").into_bytes()
}

fn raw(s: &str) -> Vec<u8> {
    s.as_bytes().to_vec()
}

fn case(name: &'static str, allow: &'static [&'static str], send: Vec<u8>, expect: Expect) -> Case {
    Case {
        name,
        allow,
        send,
        show: None,
        expect,
    }
}

const LITERAL: Expect = Expect::Refused("EGRESS_REQUEST_INVALID");
const FORBIDDEN: Expect = Expect::Refused("EGRESS_ADDRESS_FORBIDDEN");
const INVALID: Expect = Expect::Refused("EGRESS_REQUEST_INVALID");
const NOT_LISTED: Expect = Expect::Refused("EGRESS_HOST_NOT_ALLOWED");
const METHOD: Expect = Expect::Refused("EGRESS_METHOD_NOT_ALLOWED");

/// The corpus, in the order it runs (the rebinding cases depend on it).
fn cases() -> Vec<Case> {
    vec![
        // The baseline: what every harmless case is measured against.
        case(
            "baseline-listed-name",
            ALLOWED,
            connect("allowed.test:443"),
            Expect::Tunnel("the listed name, resolved by the daemon to a public address"),
        ),
        // IPv4 literals in the spellings inet_aton(3) and URL parsers read.
        case("ipv4-decimal", ALLOWED, connect("2130706433:443"), LITERAL),
        case("ipv4-octal", ALLOWED, connect("0177.0.0.1:443"), LITERAL),
        case("ipv4-hex-short", ALLOWED, connect("0x7f.1:443"), LITERAL),
        case(
            "ipv4-hex-whole",
            ALLOWED,
            connect("0x7f000001:443"),
            LITERAL,
        ),
        case("ipv4-short", ALLOWED, connect("127.1:443"), LITERAL),
        case(
            "ipv4-leading-zeros",
            ALLOWED,
            connect("127.000.000.001:443"),
            LITERAL,
        ),
        // Literals an environment lists: checked as addresses all the same.
        case(
            "listed-loopback-literal",
            &["127.0.0.1:443"],
            connect("127.0.0.1:443"),
            FORBIDDEN,
        ),
        case(
            "listed-private-literal",
            &["10.0.0.1:443"],
            connect("10.0.0.1:443"),
            FORBIDDEN,
        ),
        case(
            "listed-unspecified-literal",
            &["0.0.0.0:443"],
            connect("0.0.0.0:443"),
            FORBIDDEN,
        ),
        case(
            "listed-metadata-literal",
            &["169.254.169.254:443"],
            connect("169.254.169.254:443"),
            FORBIDDEN,
        ),
        case(
            "listed-ipv6-loopback",
            &["[::1]:443"],
            connect("[::1]:443"),
            FORBIDDEN,
        ),
        case(
            "listed-ipv6-unique-local",
            &["[fd00::1]:443"],
            connect("[fd00::1]:443"),
            FORBIDDEN,
        ),
        // IPv6 forms that carry an IPv4 address.
        case(
            "ipv4-mapped-ipv6",
            &["[::ffff:127.0.0.1]:443"],
            connect("[::ffff:127.0.0.1]:443"),
            FORBIDDEN,
        ),
        case(
            "ipv4-mapped-ipv6-hex-spelling",
            &["[::ffff:127.0.0.1]:443"],
            connect("[::ffff:7f00:1]:443"),
            FORBIDDEN,
        ),
        case(
            "ipv4-compatible-ipv6",
            &["[::127.0.0.1]:443"],
            connect("[::127.0.0.1]:443"),
            FORBIDDEN,
        ),
        case(
            "ipv4-translated-ipv6",
            &["[::ffff:0:7f00:1]:443"],
            connect("[::ffff:0:7f00:1]:443"),
            FORBIDDEN,
        ),
        case(
            "nat64-loopback",
            &["[64:ff9b::7f00:1]:443"],
            connect("[64:ff9b::7f00:1]:443"),
            FORBIDDEN,
        ),
        case(
            "nat64-private",
            &["[64:ff9b::a00:1]:443"],
            connect("[64:ff9b::a00:1]:443"),
            FORBIDDEN,
        ),
        case(
            "6to4-loopback",
            &["[2002:7f00:1::1]:443"],
            connect("[2002:7f00:1::1]:443"),
            FORBIDDEN,
        ),
        case(
            "6to4-private",
            &["[2002:a00:1::1]:443"],
            connect("[2002:a00:1::1]:443"),
            FORBIDDEN,
        ),
        case(
            "teredo-loopback-client",
            &["[2001:0:4136:e378:8000:63bf:80ff:fffe]:443"],
            connect("[2001:0:4136:e378:8000:63bf:80ff:fffe]:443"),
            FORBIDDEN,
        ),
        // Trailing dots and case.
        case(
            "trailing-dot-listed-name",
            ALLOWED,
            connect("allowed.test.:443"),
            INVALID,
        ),
        case(
            "trailing-dot-localhost",
            &["localhost:443"],
            connect("localhost.:443"),
            INVALID,
        ),
        case(
            "trailing-dot-literal",
            ALLOWED,
            connect("127.0.0.1.:443"),
            INVALID,
        ),
        case(
            "upper-case-listed-name",
            ALLOWED,
            connect("ALLOWED.Test:443"),
            Expect::Tunnel("names compare case-insensitively: the same listed host"),
        ),
        case(
            "upper-case-localhost",
            &["localhost:443"],
            connect("LocalHost:443"),
            FORBIDDEN,
        ),
        case(
            "lower-case-method",
            ALLOWED,
            raw("connect allowed.test:443 HTTP/1.1\r\n\r\n"),
            METHOD,
        ),
        case(
            "leading-zeros-in-port",
            ALLOWED,
            connect("allowed.test:0443"),
            Expect::Tunnel("0443 is port 443: the same listed entry"),
        ),
        // Zone ids.
        case(
            "ipv6-zone-percent-encoded",
            ALLOWED,
            connect("[fe80::1%25lo]:443"),
            INVALID,
        ),
        case(
            "ipv6-zone-raw",
            ALLOWED,
            connect("[fe80::1%lo]:443"),
            INVALID,
        ),
        case(
            "ipv6-loopback-with-zone",
            &["[::1]:443"],
            connect("[::1%lo]:443"),
            INVALID,
        ),
        // Userinfo and URL forms.
        case(
            "userinfo",
            ALLOWED,
            connect("user@allowed.test:443"),
            INVALID,
        ),
        case(
            "userinfo-before-loopback",
            ALLOWED,
            connect("allowed.test:443@127.0.0.1:443"),
            INVALID,
        ),
        case(
            "absolute-url-authority",
            ALLOWED,
            raw("CONNECT https://allowed.test:443/ HTTP/1.1\r\n\r\n"),
            INVALID,
        ),
        case(
            "percent-encoded-name",
            ALLOWED,
            connect("allowed%2etest:443"),
            INVALID,
        ),
        case(
            "non-ascii-lookalike-name",
            ALLOWED,
            connect("allowed.tеst:443"),
            INVALID,
        ),
        // The Host header.
        case(
            "host-header-names-loopback",
            ALLOWED,
            raw("CONNECT allowed.test:443 HTTP/1.1\r\nHost: 127.0.0.1:443\r\n\r\n"),
            Expect::Tunnel(
                "only the request line's authority is read; the Host header is never used",
            ),
        ),
        case(
            "host-header-names-listed-host",
            ALLOWED,
            raw("CONNECT other.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n"),
            NOT_LISTED,
        ),
        // Protocol versions.
        case(
            "http-1.0-connect",
            ALLOWED,
            raw("CONNECT allowed.test:443 HTTP/1.0\r\n\r\n"),
            Expect::Tunnel("HTTP/1.0 (pip's CONNECT) passes the same checks"),
        ),
        case(
            "http-1.0-connect-loopback",
            &["127.0.0.1:443"],
            raw("CONNECT 127.0.0.1:443 HTTP/1.0\r\n\r\n"),
            FORBIDDEN,
        ),
        case(
            "http2-prior-knowledge",
            ALLOWED,
            raw("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
            INVALID,
        ),
        case(
            "http2-version-on-connect",
            ALLOWED,
            raw("CONNECT allowed.test:443 HTTP/2.0\r\n\r\n"),
            INVALID,
        ),
        case(
            "http-0.9-style-connect",
            ALLOWED,
            raw("CONNECT allowed.test:443\r\n\r\n"),
            INVALID,
        ),
        case(
            "h2c-upgrade",
            ALLOWED,
            raw(
                "GET / HTTP/1.1\r\nHost: allowed.test\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n",
            ),
            METHOD,
        ),
        case(
            "plain-http-absolute-form",
            ALLOWED,
            raw("GET http://allowed.test:443/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n"),
            METHOD,
        ),
        // Two requests in one write.
        case(
            "pipelined-second-connect",
            ALLOWED,
            raw("CONNECT allowed.test:443 HTTP/1.1\r\n\r\nCONNECT 127.0.0.1:443 HTTP/1.1\r\n\r\n"),
            Expect::Tunnel(
                "one request per connection: the second is payload of the first tunnel, and reaches only the listed host",
            ),
        ),
        case(
            "pipelined-after-a-refusal",
            ALLOWED,
            raw("CONNECT other.test:443 HTTP/1.1\r\n\r\nCONNECT allowed.test:443 HTTP/1.1\r\n\r\n"),
            NOT_LISTED,
        ),
        case(
            "pipelined-after-plain-http",
            ALLOWED,
            raw(
                "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\nCONNECT allowed.test:443 HTTP/1.1\r\n\r\n",
            ),
            METHOD,
        ),
        // Long, folded and malformed heads.
        Case {
            name: "overlong-head",
            allow: ALLOWED,
            send: {
                let mut h = raw("CONNECT allowed.test:443 HTTP/1.1\r\nX-Pad: ");
                h.extend(vec![b'a'; 9000]);
                h.extend(b"\r\n\r\n");
                h
            },
            show: Some("CONNECT allowed.test:443 HTTP/1.1, then a 9,000-byte header"),
            expect: INVALID,
        },
        Case {
            name: "too-many-headers",
            allow: ALLOWED,
            send: {
                let mut h = raw("CONNECT allowed.test:443 HTTP/1.1\r\n");
                for i in 0..100 {
                    h.extend(format!("X-{i}: a\r\n").as_bytes());
                }
                h.extend(b"\r\n");
                h
            },
            show: Some("CONNECT allowed.test:443 HTTP/1.1, then 100 headers"),
            expect: INVALID,
        },
        Case {
            name: "overlong-name",
            allow: ALLOWED,
            send: connect(&format!("{}.allowed.test:443", "a.".repeat(130))),
            show: Some("CONNECT with a 270-character name ending in .allowed.test"),
            expect: INVALID,
        },
        case(
            "obs-fold-header",
            ALLOWED,
            raw("CONNECT allowed.test:443 HTTP/1.1\r\nX-A: b\r\n c\r\n\r\n"),
            INVALID,
        ),
        case(
            "obs-fold-request-line",
            ALLOWED,
            raw("CONNECT\r\n allowed.test:443 HTTP/1.1\r\n\r\n"),
            INVALID,
        ),
        case(
            "bare-lf-line-ends",
            ALLOWED,
            raw("CONNECT allowed.test:443 HTTP/1.1\n\n"),
            INVALID,
        ),
        case(
            "tab-separated-request-line",
            ALLOWED,
            raw("CONNECT\tallowed.test:443\tHTTP/1.1\r\n\r\n"),
            INVALID,
        ),
        case(
            "doubled-space-request-line",
            ALLOWED,
            raw("CONNECT  allowed.test:443 HTTP/1.1\r\n\r\n"),
            INVALID,
        ),
        case(
            "nul-in-authority",
            ALLOWED,
            raw("CONNECT allowed.test\0.127.0.0.1:443 HTTP/1.1\r\n\r\n"),
            INVALID,
        ),
        // Names the test's resolver answers with special addresses.
        case(
            "dns-a-loopback",
            &["loop.test:443"],
            connect("loop.test:443"),
            FORBIDDEN,
        ),
        case(
            "dns-a-private",
            &["private.test:443"],
            connect("private.test:443"),
            FORBIDDEN,
        ),
        case(
            "dns-a-unspecified",
            &["zero.test:443"],
            connect("zero.test:443"),
            FORBIDDEN,
        ),
        case(
            "dns-a-metadata",
            &["metadata.test:443"],
            connect("metadata.test:443"),
            FORBIDDEN,
        ),
        case(
            "dns-a-public-and-a-loopback",
            &["mixed.test:443"],
            connect("mixed.test:443"),
            FORBIDDEN,
        ),
        case(
            "dns-a-public-aaaa-unique-local",
            &["split.test:443"],
            connect("split.test:443"),
            FORBIDDEN,
        ),
        case(
            "dns-a-public-aaaa-loopback",
            &["split-loop.test:443"],
            connect("split-loop.test:443"),
            FORBIDDEN,
        ),
        case(
            "dns-aaaa-ipv4-mapped-loopback",
            &["mapped.test:443"],
            connect("mapped.test:443"),
            FORBIDDEN,
        ),
        case(
            "dns-aaaa-nat64-loopback",
            &["nat64.test:443"],
            connect("nat64.test:443"),
            FORBIDDEN,
        ),
        case(
            "dns-aaaa-6to4-loopback",
            &["sixtofour.test:443"],
            connect("sixtofour.test:443"),
            FORBIDDEN,
        ),
        case(
            "dns-aaaa-teredo",
            &["teredo.test:443"],
            connect("teredo.test:443"),
            FORBIDDEN,
        ),
        case(
            "dns-localhost-from-hosts-file",
            &["localhost:443"],
            connect("localhost:443"),
            FORBIDDEN,
        ),
        case(
            "dns-rebinding-first-lookup-public",
            &["rebind.test:443"],
            connect("rebind.test:443"),
            Expect::Tunnel(
                "TTL 0, the next answer loopback: the daemon connects to the very address it checked and never resolves again",
            ),
        ),
        case(
            "dns-rebinding-next-lookup-loopback",
            &["rebind.test:443"],
            connect("rebind.test:443"),
            FORBIDDEN,
        ),
        case(
            "dns-no-such-name",
            &["gone.test:443"],
            connect("gone.test:443"),
            Expect::Refused("EGRESS_RESOLVE_FAILED"),
        ),
        // The administrator's routes (`--config`): `mirror.test` and
        // `*.corp.test` may resolve into 10.0.0.0/8, and only there.
        case(
            "route-addresses-in-the-listed-range",
            &["mirror.test:443"],
            connect("mirror.test:443"),
            Expect::RoutedTunnel(
                Ipv4Addr::new(10, 0, 0, 1),
                "the administrator's route lets this name reach 10.0.0.0/8",
            ),
        ),
        case(
            "route-ipv4-mapped-aaaa-in-the-listed-range",
            &["mapped.corp.test:443"],
            connect("mapped.corp.test:443"),
            Expect::RoutedTunnel(
                Ipv4Addr::new(10, 0, 0, 1),
                "::ffff:10.0.0.1 is 10.0.0.1, inside the route's range",
            ),
        ),
        case(
            "route-addresses-name-resolving-to-loopback",
            &["pkg.corp.test:443"],
            connect("pkg.corp.test:443"),
            FORBIDDEN,
        ),
        case(
            "route-addresses-a-in-range-aaaa-loopback",
            &["split.corp.test:443"],
            connect("split.corp.test:443"),
            FORBIDDEN,
        ),
        case(
            "route-addresses-nat64-of-the-range",
            &["nat64.corp.test:443"],
            connect("nat64.corp.test:443"),
            FORBIDDEN,
        ),
        case(
            "route-suffix-lookalike-name",
            &["evilcorp.test:443"],
            connect("evilcorp.test:443"),
            FORBIDDEN,
        ),
        case(
            "route-suffix-apex-name",
            &["corp.test:443"],
            connect("corp.test:443"),
            FORBIDDEN,
        ),
        // DNS over HTTPS through a listed host.
        case(
            "dns-over-https-to-a-listed-host",
            ALLOWED,
            raw(
                "CONNECT allowed.test:443 HTTP/1.1\r\n\r\nPOST /dns-query HTTP/1.1\r\nHost: allowed.test\r\nContent-Type: application/dns-message\r\n\r\n",
            ),
            Expect::Tunnel(
                "the query reaches only the listed host; whatever it answers, the daemon resolves every CONNECT itself, so an address learnt over it is one more unlisted literal",
            ),
        ),
        case(
            "dns-over-https-answer-as-target",
            ALLOWED,
            connect("127.0.0.1:443"),
            NOT_LISTED,
        ),
        // QUIC and UDP.
        Case {
            name: "quic-initial-on-the-stream",
            allow: ALLOWED,
            send: {
                let mut p = vec![0xc3, 0, 0, 0, 1, 8];
                p.extend([0x5a; 8]);
                p.extend([0u8; 64]);
                p
            },
            show: Some("a QUIC v1 Initial packet's bytes instead of a request"),
            expect: INVALID,
        },
        case(
            "connect-udp-upgrade",
            ALLOWED,
            raw(
                "GET /.well-known/masque/udp/allowed.test/443/ HTTP/1.1\r\nHost: allowed.test\r\nConnection: Upgrade\r\nUpgrade: connect-udp\r\n\r\n",
            ),
            METHOD,
        ),
        case(
            "connect-udp-method",
            ALLOWED,
            raw("CONNECT-UDP allowed.test:443 HTTP/1.1\r\n\r\n"),
            METHOD,
        ),
        case(
            "socks5-greeting",
            ALLOWED,
            vec![5, 1, 0, 5, 1, 0, 1, 127, 0, 0, 1, 1, 187],
            INVALID,
        ),
        Case {
            name: "datagram-socket",
            allow: ALLOWED,
            send: Vec::new(),
            show: Some("connect(2) of an AF_UNIX SOCK_DGRAM socket to the daemon's socket"),
            expect: Expect::NotServed(
                "EPROTOTYPE: the daemon's socket is SOCK_STREAM, it carries TCP CONNECT tunnels only, and it sends no datagram anywhere (the test's UDP port 443 receives none)",
            ),
        },
        // Ports.
        case(
            "listed-name-other-port",
            ALLOWED,
            connect("allowed.test:8443"),
            NOT_LISTED,
        ),
        case(
            "listed-entry-on-a-port-not-reached",
            &["allowed.test:22"],
            connect("allowed.test:22"),
            Expect::Refused("EGRESS_PORT_NOT_ALLOWED"),
        ),
        // A verification command.
        Case {
            name: "setup-relays-a-connect-for-verification",
            allow: ALLOWED,
            send: Vec::new(),
            show: Some(
                "a setup leaves a relay behind for the verification commands to reach the proxy through",
            ),
            expect: Expect::Elsewhere(
                "each setup command's processes die with its PID namespace (services/confine/tests/confine.rs `daemons_do_not_outlive_the_command`), its network namespace and the forwarder's listener with it; verification commands get `lo` down, AF_UNIX sockets only and no listener: services/local/tests/setup.rs shows the proxy's port refused and no name resolving from a verification command",
            ),
        },
    ]
}

// ---------------------------------------------------------------- the world

/// The test's DNS zone: `(rcode, addresses)` for a name and a query type
/// (1: A, 28: AAAA); `rebind` counts the A lookups of `rebind.test`.
fn zone(name: &str, qtype: u16, rebind: &AtomicUsize) -> (u8, Vec<IpAddr>) {
    const A: u16 = 1;
    const AAAA: u16 = 28;
    let v4 = |a: &[Ipv4Addr]| a.iter().copied().map(IpAddr::V4).collect::<Vec<_>>();
    let v6 = |s: &[&str]| {
        s.iter()
            .map(|a| IpAddr::V6(a.parse::<Ipv6Addr>().unwrap()))
            .collect::<Vec<_>>()
    };
    let answers = match (name, qtype) {
        ("allowed.test", A) => v4(&[PUBLIC]),
        ("mirror.test" | "split.corp.test" | "evilcorp.test" | "corp.test", A) => {
            v4(&[Ipv4Addr::new(10, 0, 0, 1)])
        }
        ("split.corp.test", AAAA) => v6(&["::1"]),
        ("mapped.corp.test", AAAA) => v6(&["::ffff:10.0.0.1"]),
        ("nat64.corp.test", AAAA) => v6(&["64:ff9b::a00:1"]),
        ("pkg.corp.test", A) => v4(&[Ipv4Addr::LOCALHOST]),
        ("loop.test", A) => v4(&[Ipv4Addr::LOCALHOST]),
        ("private.test", A) => v4(&[Ipv4Addr::new(10, 0, 0, 1)]),
        ("zero.test", A) => v4(&[Ipv4Addr::UNSPECIFIED]),
        ("metadata.test", A) => v4(&[Ipv4Addr::new(169, 254, 169, 254)]),
        ("mixed.test", A) => v4(&[PUBLIC, Ipv4Addr::LOCALHOST]),
        ("split.test" | "split-loop.test", A) => v4(&[PUBLIC]),
        ("split.test", AAAA) => v6(&["fd00::1"]),
        ("split-loop.test", AAAA) => v6(&["::1"]),
        ("mapped.test", AAAA) => v6(&["::ffff:127.0.0.1"]),
        ("nat64.test", AAAA) => v6(&["64:ff9b::7f00:1"]),
        ("sixtofour.test", AAAA) => v6(&["2002:7f00:1::1"]),
        ("teredo.test", AAAA) => v6(&["2001:0:4136:e378:8000:63bf:80ff:fffe"]),
        ("rebind.test", A) => {
            if rebind.fetch_add(1, Ordering::SeqCst) == 0 {
                v4(&[PUBLIC])
            } else {
                v4(&[Ipv4Addr::LOCALHOST])
            }
        }
        (
            "allowed.test" | "loop.test" | "private.test" | "zero.test" | "metadata.test"
            | "mixed.test" | "split.test" | "split-loop.test" | "mapped.test" | "nat64.test"
            | "sixtofour.test" | "teredo.test" | "rebind.test" | "mirror.test" | "split.corp.test"
            | "evilcorp.test" | "corp.test" | "mapped.corp.test" | "nat64.corp.test"
            | "pkg.corp.test",
            _,
        ) => Vec::new(),
        _ => return (3, Vec::new()), // NXDOMAIN
    };
    (0, answers)
}

/// The answer to one DNS query (RFC 1035 wire format, TTL 0), or `None`
/// for what is not a query.
fn dns_answer(q: &[u8], rebind: &AtomicUsize) -> Option<Vec<u8>> {
    if q.len() < 12 || q[2] & 0x80 != 0 {
        return None;
    }
    let mut i = 12;
    let mut labels = Vec::new();
    loop {
        let len = usize::from(*q.get(i)?);
        i += 1;
        if len == 0 {
            break;
        }
        if len > 63 {
            return None;
        }
        labels.push(String::from_utf8_lossy(q.get(i..i + len)?).to_ascii_lowercase());
        i += len;
    }
    let qtype = u16::from_be_bytes([*q.get(i)?, *q.get(i + 1)?]);
    let question = q.get(12..i + 4)?;
    let (rcode, addrs) = zone(&labels.join("."), qtype, rebind);
    let mut r = Vec::with_capacity(512);
    r.extend(&q[0..2]);
    r.push(0x84 | (q[2] & 0x01)); // QR, AA, RD as asked
    r.push(0x80 | rcode); // RA
    r.extend(1u16.to_be_bytes());
    r.extend((addrs.len() as u16).to_be_bytes());
    r.extend([0, 0, 0, 0]);
    r.extend(question);
    for a in addrs {
        r.extend([0xc0, 0x0c]);
        let (t, data) = match a {
            IpAddr::V4(a) => (1u16, a.octets().to_vec()),
            IpAddr::V6(a) => (28u16, a.octets().to_vec()),
        };
        r.extend(t.to_be_bytes());
        r.extend(1u16.to_be_bytes());
        r.extend(0u32.to_be_bytes()); // TTL 0
        r.extend((data.len() as u16).to_be_bytes());
        r.extend(data);
    }
    Some(r)
}

/// One connection the daemon made to the test's port 443.
#[derive(Clone, Debug)]
struct Hit {
    /// The address it reached (IPv4 unmapped).
    reached: IpAddr,
    /// What arrived, up to a newline or 4 KiB.
    bytes: Vec<u8>,
}

/// The daemon in its namespaces, and the test's servers there.
struct World {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
    /// Every connection made, in order (append-only).
    hits: Arc<Mutex<Vec<Hit>>>,
    /// How many of `hits` earlier cases have looked at.
    seen: Mutex<usize>,
    datagrams: Arc<AtomicUsize>,
    _dir: tempfile::TempDir,
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `f` on a thread inside the network namespace of process `pid`
/// (the sockets it makes stay there).
fn in_netns<T: Send + 'static>(pid: u32, f: impl FnOnce() -> T + Send + 'static) -> T {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/net")).expect("the daemon's netns");
    std::thread::spawn(move || {
        // SAFETY: setns(2) with a descriptor this thread owns changes the
        // network namespace of this thread alone, which ends after `f`.
        let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .expect("the namespace thread")
}

/// Every file handed to `unshare`'s shell, and what it does with them.
const NAMESPACE_SCRIPT: &str = "set -e
ip link set lo up
ip addr add 1.2.3.4/32 dev lo
ip addr add 10.0.0.1/32 dev lo
ip -6 addr add fd00::1/128 dev lo
mount --bind \"$1\" /etc/resolv.conf
mount --bind \"$2\" /etc/nsswitch.conf
mount --bind \"$3\" /etc/hosts
shift 3
exec \"$@\"";

impl World {
    fn start() -> World {
        assert!(
            is_root(),
            "the bypass corpus runs as root (network and mount namespaces)"
        );
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let write = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
            p
        };
        let resolv = write(
            "resolv.conf",
            "nameserver 127.0.0.53\noptions timeout:2 attempts:2\n",
        );
        let nss = write("nsswitch.conf", "hosts: files dns\n");
        let hosts = write("hosts", "127.0.0.1 localhost\n::1 localhost\n");
        let routes = write(
            "egress.toml",
            "[[route]]\nhost = \"mirror.test\"\naddresses = [\"10.0.0.0/8\"]\n\n\
             [[route]]\nhost = \"*.corp.test\"\naddresses = [\"10.0.0.0/8\"]\n",
        );
        let socket = dir.path().join("egress.sock");
        let log = dir.path().join("daemon.log");
        let child = Command::new("unshare")
            .args(["--net", "--mount", "--propagation", "private", "--"])
            .args(["sh", "-c", NAMESPACE_SCRIPT, "sh"])
            .args([&resolv, &nss, &hosts])
            .arg(env!("CARGO_BIN_EXE_airlock-egress"))
            .arg("--socket")
            .arg(&socket)
            .args(["--allow-uid", "0", "--head-timeout", "3", "--config"])
            .arg(&routes)
            .env("AIRLOCK_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("unshare runs");
        let pid = child.id();
        let hits = Arc::new(Mutex::new(Vec::new()));
        let datagrams = Arc::new(AtomicUsize::new(0));
        let world = World {
            child,
            socket,
            log,
            hits,
            seen: Mutex::new(0),
            datagrams,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !world.log().contains("lockdown airlock-egress") {
            assert!(
                Instant::now() < deadline,
                "daemon did not start: {}",
                world.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let (tcp, udp, dns) = in_netns(pid, || {
            let tcp = TcpListener::bind("[::]:443").expect("[::]:443 in the namespace");
            let udp = UdpSocket::bind("[::]:443").expect("udp [::]:443");
            let dns = UdpSocket::bind("127.0.0.53:53").expect("127.0.0.53:53");
            (tcp, udp, dns)
        });
        std::thread::spawn(move || {
            let rebind = AtomicUsize::new(0);
            let mut buf = [0u8; 1500];
            while let Ok((n, peer)) = dns.recv_from(&mut buf) {
                if let Some(r) = dns_answer(&buf[..n], &rebind) {
                    let _ = dns.send_to(&r, peer);
                }
            }
        });
        {
            let datagrams = world.datagrams.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 1500];
                while udp.recv_from(&mut buf).is_ok() {
                    datagrams.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
        {
            let hits = world.hits.clone();
            std::thread::spawn(move || {
                for conn in tcp.incoming() {
                    let Ok(mut conn) = conn else { continue };
                    let reached = conn
                        .local_addr()
                        .map(|a| a.ip().to_canonical())
                        .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
                    let index = {
                        let mut h = hits.lock().unwrap();
                        h.push(Hit {
                            reached,
                            bytes: Vec::new(),
                        });
                        h.len() - 1
                    };
                    let hits = hits.clone();
                    std::thread::spawn(move || {
                        let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
                        let mut buf = [0u8; 4096];
                        loop {
                            match conn.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => {
                                    let mut h = hits.lock().unwrap();
                                    let got = &mut h[index].bytes;
                                    got.extend(&buf[..n]);
                                    if got.len() > 4096 {
                                        break;
                                    }
                                }
                            }
                        }
                    });
                }
            });
        }
        world
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The connections made since the last call.
    fn take_hits(&self) -> Vec<Hit> {
        let hits = self.hits.lock().unwrap();
        let mut seen = self.seen.lock().unwrap();
        let new = hits[*seen..].to_vec();
        *seen = hits.len();
        new
    }

    /// Whether a connection made since the last [`World::take_hits`] has
    /// received bytes ending in `marker`.
    fn arrived(&self, marker: &[u8]) -> bool {
        let hits = self.hits.lock().unwrap();
        let seen = *self.seen.lock().unwrap();
        hits[seen..].iter().any(|h| h.bytes.ends_with(marker))
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid(2) cannot fail and touches no memory.
    unsafe { libc::geteuid() == 0 }
}

fn limits() -> Limits {
    Limits {
        max_bytes: 1 << 20,
        max_seconds: 60,
        max_connections: 100,
    }
}

fn preamble(session: &str, allow: &[&str]) -> Vec<u8> {
    Preamble {
        session: session.into(),
        task_id: "task-bypass".into(),
        allow: allow.iter().map(|a| HostPort::parse(a).unwrap()).collect(),
        limits: limits(),
    }
    .to_line()
    .unwrap()
}

/// Reads a response head (up to the blank line), byte by byte.
fn read_head(s: &mut UnixStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 16 * 1024 {
        match s.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// Runs one case; `Err` says how the daemon's behaviour differs from it.
fn run(world: &World, i: usize, c: &Case) -> Result<(), String> {
    let mut s = UnixStream::connect(&world.socket).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    let mut opening = preamble(&format!("bypass:{i}"), c.allow);
    opening.extend(&c.send);
    s.write_all(&opening).map_err(|e| e.to_string())?;
    match c.expect {
        Expect::Refused(code) => {
            let _ = s.shutdown(Shutdown::Write);
            let mut answer = Vec::new();
            let _ = s.read_to_end(&mut answer);
            let answer = String::from_utf8_lossy(&answer);
            let head = answer.split("\r\n\r\n").next().unwrap_or_default();
            if answer.starts_with("HTTP/1.1 200 ")
                || !head.contains(&format!("\r\nX-Airlock-Refusal: {code}"))
            {
                return Err(format!("wanted a refusal {code}, got:\n{answer}"));
            }
            // Give a wrong connect time to land before looking.
            std::thread::sleep(Duration::from_millis(50));
            let hits = world.take_hits();
            if !hits.is_empty() {
                return Err(format!("refused, yet the daemon connected: {hits:?}"));
            }
        }
        Expect::Tunnel(_) | Expect::RoutedTunnel(..) => {
            let want = match c.expect {
                Expect::RoutedTunnel(ip, _) => ip,
                _ => PUBLIC,
            };
            let head = read_head(&mut s);
            if !head.starts_with("HTTP/1.1 200 ") {
                return Err(format!("wanted a tunnel, got:\n{head}"));
            }
            let marker = format!("bypass-corpus:{}\n", c.name);
            s.write_all(marker.as_bytes()).map_err(|e| e.to_string())?;
            let deadline = Instant::now() + Duration::from_secs(10);
            let hits = loop {
                if world.arrived(marker.as_bytes()) {
                    break world.take_hits();
                }
                if Instant::now() > deadline {
                    return Err(format!(
                        "the tunnel's bytes never arrived: {:?}",
                        world.take_hits()
                    ));
                }
                std::thread::sleep(Duration::from_millis(10));
            };
            drop(s);
            if hits.len() != 1 || hits[0].reached != IpAddr::V4(want) {
                return Err(format!("the tunnel reached other than {want}: {hits:?}"));
            }
        }
        Expect::NotServed(_) => {
            let d = UnixDatagram::unbound().map_err(|e| e.to_string())?;
            match d.connect(&world.socket) {
                Err(e) if e.raw_os_error() == Some(libc::EPROTOTYPE) => {}
                other => return Err(format!("a datagram socket connected: {other:?}")),
            }
            let _ = d.send_to(b"\xc3quic", &world.socket);
            if world.datagrams.load(Ordering::SeqCst) != 0 {
                return Err("a datagram arrived at UDP port 443".into());
            }
        }
        Expect::Elsewhere(_) => {}
    }
    Ok(())
}

#[test]
fn the_bypass_corpus_is_refused_or_harmless() {
    let world = World::start();
    let cases = cases();
    let mut failures = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        if let Err(e) = run(&world, i, c) {
            failures.push(format!("{}: {e}", c.name));
        }
    }
    assert_eq!(world.datagrams.load(Ordering::SeqCst), 0);
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}\n\ndaemon log:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n"),
        world.log()
    );
}

// ----------------------------------------------------------------- the docs

const DOC: &str = "docs/privsep/egress.md";
const BEGIN: &str = "<!-- bypass-corpus:begin (generated from services/egress/tests/bypass.rs: UPDATE_DOCS=1 cargo test -p airlock-egress --test bypass the_corpus_table) -->\n";
const END: &str = "<!-- bypass-corpus:end -->\n";

/// `bytes` as the table shows them: escapes for control bytes, at most
/// 120 characters.
fn shown(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.utf8_chunks() {
        for ch in chunk.valid().chars() {
            match ch {
                '\r' => out.push_str("\\r"),
                '\n' => out.push_str("\\n"),
                '\t' => out.push_str("\\t"),
                '|' => out.push_str("\\|"),
                '`' => out.push('\''),
                c if c.is_control() => {
                    let _ = write!(out, "\\x{:02x}", c as u32);
                }
                c if !c.is_ascii() => {
                    let _ = write!(out, "\\u{{{:x}}}", c as u32);
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    if out.chars().count() > 120 {
        out = out.chars().take(117).collect::<String>() + "…";
    }
    out
}

fn render() -> String {
    let cases = cases();
    let count = |f: fn(&Expect) -> bool| cases.iter().filter(|c| f(&c.expect)).count();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} cases: {} refused with a code, {} harmless tunnels to the listed host, {} not served, {} asserted elsewhere. \
         Each row runs against the daemon binary in a network and mount namespace of its own, where \
         `allowed.test` and the other `.test` names are answered by the test's DNS responder \
         (TTL 0) and `1.2.3.4`, on that namespace's `lo`, stands for a listed registry; a tunnel \
         is harmless when the bytes written into it arrive at `1.2.3.4:443` (or at the address the \
         routes file, `mirror.test` and `*.corp.test` to 10.0.0.0/8, lets a name reach) and nowhere else, a \
         refusal when the code is answered and no connection was made. \
         The input is what follows the preamble, whose `allow` list is shown before it.\n",
        cases.len(),
        count(|e| matches!(e, Expect::Refused(_))),
        count(|e| matches!(e, Expect::Tunnel(_) | Expect::RoutedTunnel(..))),
        count(|e| matches!(e, Expect::NotServed(_))),
        count(|e| matches!(e, Expect::Elsewhere(_))),
    );
    out.push_str("| # | case | allow · input | outcome |\n|---|---|---|---|\n");
    for (i, c) in cases.iter().enumerate() {
        let input = match c.show {
            Some(s) => s.to_owned(),
            None => format!("`{}`", shown(&c.send)),
        };
        let outcome = match c.expect {
            Expect::Refused(code) => format!("refused `{code}`"),
            Expect::Tunnel(why) => format!("harmless: {why}"),
            Expect::RoutedTunnel(ip, why) => format!("harmless (reaches {ip}): {why}"),
            Expect::NotServed(why) => format!("refused by the kernel: {why}"),
            Expect::Elsewhere(why) => format!("harmless, asserted elsewhere: {why}"),
        };
        let _ = writeln!(
            out,
            "| {} | `{}` | `{}` · {input} | {outcome} |",
            i + 1,
            c.name,
            c.allow.join(", "),
        );
    }
    out
}

#[test]
fn the_corpus_table_in_the_docs_is_current() {
    let cases = cases();
    assert!(cases.len() >= 40, "{} cases", cases.len());
    let mut names: Vec<&str> = cases.iter().map(|c| c.name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), cases.len(), "case names are unique");
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(DOC);
    let doc = std::fs::read_to_string(&path).unwrap();
    let (Some(b), Some(e)) = (doc.find(BEGIN), doc.find(END)) else {
        panic!("{DOC} lacks the bypass-corpus markers:\n{BEGIN}{END}");
    };
    let wanted = format!("{}{BEGIN}{}{}", &doc[..b], render(), &doc[e..]);
    if std::env::var_os("UPDATE_DOCS").is_some_and(|v| v == "1") {
        std::fs::write(&path, wanted).unwrap();
        return;
    }
    assert!(
        doc == wanted,
        "{DOC}'s bypass corpus is out of date with services/egress/tests/bypass.rs.\n\
         Regenerate it with:\n\n    UPDATE_DOCS=1 cargo test -p airlock-egress --test bypass the_corpus_table\n"
    );
}

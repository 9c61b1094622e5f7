//! Which addresses the proxy may connect to: public unicast only.
//!
//! Every address a target resolves to (or the literal it names) passes
//! [`check`] before the proxy connects, and the proxy connects to that very
//! address, never to the name again: a DNS answer cannot steer a tunnel
//! into the server's own network (loopback services, the LAN, a cloud
//! metadata endpoint).
//!
//! IPv4: every special-purpose range of the IANA registry that is not
//! globally reachable is refused. IPv6: only global unicast (2000::/3) may
//! pass, minus its special-purpose blocks; the forms that carry an IPv4
//! address (mapped, compatible, NAT64, 6to4) are judged by that address.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A refused address, with the range that refuses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Forbidden {
    /// The range, e.g. "127.0.0.0/8 (loopback)".
    pub range: &'static str,
}

impl fmt::Display for Forbidden {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.range)
    }
}

/// The IPv4 ranges refused: (network, prefix length, name).
const V4_FORBIDDEN: &[(Ipv4Addr, u8, &str)] = &[
    (
        Ipv4Addr::new(0, 0, 0, 0),
        8,
        "0.0.0.0/8 (this network, unspecified)",
    ),
    (Ipv4Addr::new(10, 0, 0, 0), 8, "10.0.0.0/8 (private)"),
    (
        Ipv4Addr::new(100, 64, 0, 0),
        10,
        "100.64.0.0/10 (carrier-grade NAT)",
    ),
    (Ipv4Addr::new(127, 0, 0, 0), 8, "127.0.0.0/8 (loopback)"),
    (
        Ipv4Addr::new(169, 254, 0, 0),
        16,
        "169.254.0.0/16 (link-local)",
    ),
    (Ipv4Addr::new(172, 16, 0, 0), 12, "172.16.0.0/12 (private)"),
    (
        Ipv4Addr::new(192, 0, 0, 0),
        24,
        "192.0.0.0/24 (IETF protocol assignments)",
    ),
    (
        Ipv4Addr::new(192, 0, 2, 0),
        24,
        "192.0.2.0/24 (documentation)",
    ),
    (
        Ipv4Addr::new(192, 88, 99, 0),
        24,
        "192.88.99.0/24 (6to4 relay anycast)",
    ),
    (
        Ipv4Addr::new(192, 168, 0, 0),
        16,
        "192.168.0.0/16 (private)",
    ),
    (
        Ipv4Addr::new(198, 18, 0, 0),
        15,
        "198.18.0.0/15 (benchmarking)",
    ),
    (
        Ipv4Addr::new(198, 51, 100, 0),
        24,
        "198.51.100.0/24 (documentation)",
    ),
    (
        Ipv4Addr::new(203, 0, 113, 0),
        24,
        "203.0.113.0/24 (documentation)",
    ),
    (Ipv4Addr::new(224, 0, 0, 0), 4, "224.0.0.0/4 (multicast)"),
    (
        Ipv4Addr::new(240, 0, 0, 0),
        4,
        "240.0.0.0/4 (reserved, and 255.255.255.255 broadcast)",
    ),
];

/// Blocks inside 2000::/3 that are refused: (network, prefix length, name).
const V6_FORBIDDEN_IN_GLOBAL: &[(Ipv6Addr, u8, &str)] = &[
    (
        Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, 0, 0),
        23,
        "2001::/23 (IETF protocol assignments, Teredo)",
    ),
    (
        Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0),
        32,
        "2001:db8::/32 (documentation)",
    ),
    (
        Ipv6Addr::new(0x3fff, 0, 0, 0, 0, 0, 0, 0),
        20,
        "3fff::/20 (documentation)",
    ),
];

fn in_v4(ip: Ipv4Addr, net: Ipv4Addr, len: u8) -> bool {
    let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
    u32::from(ip) & mask == u32::from(net) & mask
}

fn in_v6(ip: Ipv6Addr, net: Ipv6Addr, len: u8) -> bool {
    let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
    u128::from(ip) & mask == u128::from(net) & mask
}

/// Whether the proxy may connect to `ip`.
pub fn check(ip: IpAddr) -> Result<(), Forbidden> {
    match ip {
        IpAddr::V4(v4) => check_v4(v4),
        IpAddr::V6(v6) => check_v6(v6),
    }
}

fn check_v4(ip: Ipv4Addr) -> Result<(), Forbidden> {
    match V4_FORBIDDEN
        .iter()
        .find(|(net, len, _)| in_v4(ip, *net, *len))
    {
        Some((_, _, range)) => Err(Forbidden { range }),
        None => Ok(()),
    }
}

fn check_v6(ip: Ipv6Addr) -> Result<(), Forbidden> {
    let bits = u128::from(ip);
    let low32 = Ipv4Addr::from((bits & 0xffff_ffff) as u32);
    let embedded = |range: &'static str| match check_v4(low32) {
        Ok(()) => Ok(()),
        Err(_) => Err(Forbidden { range }),
    };
    if ip.is_unspecified() {
        return Err(Forbidden {
            range: "::/128 (unspecified)",
        });
    }
    if ip.is_loopback() {
        return Err(Forbidden {
            range: "::1/128 (loopback)",
        });
    }
    // ::ffff:a.b.c.d — the kernel connects to a.b.c.d.
    if in_v6(ip, Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0), 96) {
        return embedded("::ffff:0:0/96 (IPv4-mapped) of a forbidden IPv4 address");
    }
    // ::a.b.c.d — deprecated IPv4-compatible form: refused outright.
    if in_v6(ip, Ipv6Addr::UNSPECIFIED, 96) {
        return Err(Forbidden {
            range: "::/96 (IPv4-compatible, deprecated)",
        });
    }
    // 64:ff9b::a.b.c.d — a NAT64 gateway connects to a.b.c.d.
    if in_v6(ip, Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0), 96) {
        return embedded("64:ff9b::/96 (NAT64) of a forbidden IPv4 address");
    }
    // 2002:AABB:CCDD::/48 — 6to4 to AA.BB.CC.DD.
    if in_v6(ip, Ipv6Addr::new(0x2002, 0, 0, 0, 0, 0, 0, 0), 16) {
        let v4 = Ipv4Addr::from(((bits >> 80) & 0xffff_ffff) as u32);
        return match check_v4(v4) {
            Ok(()) => Ok(()),
            Err(_) => Err(Forbidden {
                range: "2002::/16 (6to4) of a forbidden IPv4 address",
            }),
        };
    }
    for (net, len, range) in [
        (
            Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0),
            7,
            "fc00::/7 (unique local)",
        ),
        (
            Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0),
            10,
            "fe80::/10 (link-local)",
        ),
        (
            Ipv6Addr::new(0xfec0, 0, 0, 0, 0, 0, 0, 0),
            10,
            "fec0::/10 (site-local, deprecated)",
        ),
        (
            Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0),
            8,
            "ff00::/8 (multicast)",
        ),
    ] {
        if in_v6(ip, net, len) {
            return Err(Forbidden { range });
        }
    }
    if !in_v6(ip, Ipv6Addr::new(0x2000, 0, 0, 0, 0, 0, 0, 0), 3) {
        return Err(Forbidden {
            range: "outside 2000::/3 (not global unicast: NAT64 local use, discard-only, reserved)",
        });
    }
    match V6_FORBIDDEN_IN_GLOBAL
        .iter()
        .find(|(net, len, _)| in_v6(ip, *net, *len))
    {
        Some((_, _, range)) => Err(Forbidden { range }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(s: &str) -> &'static str {
        check(s.parse().unwrap()).expect_err(s).range
    }

    fn allowed(s: &str) {
        assert_eq!(check(s.parse().unwrap()), Ok(()), "{s}");
    }

    #[test]
    fn every_forbidden_ipv4_range_is_refused_at_both_ends() {
        for (net, len, range) in V4_FORBIDDEN {
            let first = u32::from(*net);
            let last = first | (u32::MAX >> len);
            for a in [first, first + 1, last] {
                let ip = Ipv4Addr::from(a);
                assert_eq!(check(IpAddr::V4(ip)).unwrap_err().range, *range, "{ip}");
                // The same address in every IPv6 form that carries it.
                let mapped = ip.to_ipv6_mapped();
                assert!(check(IpAddr::V6(mapped)).is_err(), "{mapped}");
                let nat64 = Ipv6Addr::from(
                    u128::from(Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0)) | u128::from(a),
                );
                assert!(check(IpAddr::V6(nat64)).is_err(), "{nat64}");
                let six_to_four = Ipv6Addr::from(
                    u128::from(Ipv6Addr::new(0x2002, 0, 0, 0, 0, 0, 0, 0)) | (u128::from(a) << 80),
                );
                assert!(check(IpAddr::V6(six_to_four)).is_err(), "{six_to_four}");
            }
        }
    }

    #[test]
    fn named_ranges() {
        assert!(refused("127.0.0.1").contains("loopback"));
        assert!(refused("127.255.255.254").contains("loopback"));
        assert!(refused("0.0.0.0").contains("unspecified"));
        assert!(refused("0.1.2.3").contains("this network"));
        assert!(refused("10.1.2.3").contains("private"));
        assert!(refused("172.16.0.1").contains("private"));
        assert!(refused("172.31.255.255").contains("private"));
        assert!(refused("192.168.1.1").contains("private"));
        assert!(refused("100.64.0.1").contains("carrier-grade"));
        assert!(refused("100.127.255.255").contains("carrier-grade"));
        assert!(refused("169.254.169.254").contains("link-local"));
        assert!(refused("224.0.0.1").contains("multicast"));
        assert!(refused("239.255.255.250").contains("multicast"));
        assert!(refused("255.255.255.255").contains("broadcast"));
        assert!(refused("192.0.2.7").contains("documentation"));
        assert!(refused("198.51.100.7").contains("documentation"));
        assert!(refused("203.0.113.7").contains("documentation"));
        assert!(refused("198.19.0.1").contains("benchmarking"));
        assert!(refused("::").contains("unspecified"));
        assert!(refused("::1").contains("loopback"));
        assert!(refused("fe80::1").contains("link-local"));
        assert!(refused("febf:ffff::1").contains("link-local"));
        assert!(refused("fc00::1").contains("unique local"));
        assert!(refused("fd12:3456::1").contains("unique local"));
        assert!(refused("ff02::1").contains("multicast"));
        assert!(refused("fec0::1").contains("site-local"));
        assert!(refused("2001:db8::1").contains("documentation"));
        assert!(refused("3fff::1").contains("documentation"));
        assert!(refused("2001::1").contains("Teredo"));
        assert!(refused("100::1").contains("outside 2000::/3"));
        assert!(refused("64:ff9b:1::1").contains("outside 2000::/3"));
        assert!(refused("::ffff:127.0.0.1").contains("IPv4-mapped"));
        assert!(refused("::ffff:10.0.0.1").contains("IPv4-mapped"));
        assert!(refused("::ffff:169.254.169.254").contains("IPv4-mapped"));
        assert!(refused("::127.0.0.1").contains("IPv4-compatible"));
        assert!(refused("::8.8.8.8").contains("IPv4-compatible"));
        assert!(refused("64:ff9b::7f00:1").contains("NAT64"));
        assert!(refused("2002:7f00:1::1").contains("6to4"));
        assert!(refused("2002:c0a8:101::1").contains("6to4"));
    }

    #[test]
    fn public_unicast_passes() {
        // Neighbours of the refused ranges, and global unicast.
        for a in [
            "1.1.1.1",
            "9.255.255.255",
            "11.0.0.0",
            "100.63.255.255",
            "100.128.0.0",
            "126.255.255.255",
            "128.0.0.0",
            "169.253.255.255",
            "172.15.255.255",
            "172.32.0.0",
            "192.0.1.255",
            "192.167.255.255",
            "192.169.0.0",
            "198.17.255.255",
            "198.20.0.0",
            "223.255.255.255",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
            "2001:200::1",
            "2600::1",
            "2a00:1450::1",
        ] {
            allowed(a);
        }
    }
}

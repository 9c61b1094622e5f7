//! The value parsers: systemd's words, numbers, sizes, time spans, errno
//! names, address prefixes, namespace lists and quoted command lines, as
//! unit files write them and `systemctl show` prints them.

use std::collections::BTreeSet;
use std::net::IpAddr;

pub(super) const ALL_NAMESPACES: &[&str] = &["cgroup", "ipc", "mnt", "net", "pid", "user", "uts"];

/// `RestrictNamespaces=` as the set of namespace types allowed.
pub(super) fn namespaces(v: &str) -> Option<BTreeSet<String>> {
    let all: BTreeSet<String> = ALL_NAMESPACES.iter().map(|s| (*s).to_owned()).collect();
    match word(v).as_str() {
        "yes" => return Some(BTreeSet::new()),
        "no" | "" => return Some(all),
        _ => {}
    }
    let (invert, body) = match v.strip_prefix('~') {
        Some(b) => (true, b),
        None => (false, v),
    };
    let listed: BTreeSet<String> = body.split_whitespace().map(str::to_owned).collect();
    if !listed.is_subset(&all) {
        return None;
    }
    Some(if invert {
        all.difference(&listed).cloned().collect()
    } else {
        listed
    })
}

/// systemd's booleans as `yes`/`no`; any other word as it is.
pub(super) fn word(v: &str) -> String {
    match v.trim() {
        "1" | "yes" | "y" | "true" | "t" | "on" => "yes".to_owned(),
        "0" | "no" | "n" | "false" | "f" | "off" => "no".to_owned(),
        other => other.to_owned(),
    }
}

pub(super) fn octal(v: &str) -> Option<u32> {
    u32::from_str_radix(v.trim(), 8).ok()
}

/// A size or count: digits with an optional K/M/G/T/P/E suffix (base
/// 1024), or `infinity` (`u64::MAX`).
pub(super) fn bytes(v: &str) -> Option<u64> {
    let v = v.trim();
    if v == "infinity" {
        return Some(u64::MAX);
    }
    let digits = v.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let n: u64 = digits.parse().ok()?;
    let shift = match &v[digits.len()..] {
        "" | "B" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        "P" => 50,
        "E" => 60,
        _ => return None,
    };
    n.checked_mul(1u64 << shift)
}

/// A systemd time span in microseconds (`u64::MAX` for `infinity`). A
/// bare number is seconds in a unit file (`bare_seconds`) and
/// microseconds... never in `systemctl show`, which always names a unit
/// except for `0`.
pub(super) fn timespan(v: &str, bare_seconds: bool) -> Option<u64> {
    let v = v.trim();
    if v == "infinity" {
        return Some(u64::MAX);
    }
    if let Ok(n) = v.parse::<u64>() {
        return if bare_seconds {
            n.checked_mul(1_000_000)
        } else {
            (n == 0).then_some(0)
        };
    }
    let mut total: u64 = 0;
    let mut rest = v;
    while !rest.is_empty() {
        rest = rest.trim_start();
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| !c.is_alphabetic())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let micros: f64 = match unit {
            "us" | "usec" | "µs" => 1.0,
            "ms" | "msec" => 1e3,
            "" | "s" | "sec" | "second" | "seconds" => 1e6,
            "m" | "min" | "minute" | "minutes" => 60e6,
            "h" | "hr" | "hour" | "hours" => 3600e6,
            "d" | "day" | "days" => 86_400e6,
            "w" | "week" | "weeks" => 604_800e6,
            "M" | "month" | "months" => 2_629_800e6,
            "y" | "year" | "years" => 31_557_600e6,
            _ => return None,
        };
        total = total.checked_add((number * micros).round() as u64)?;
    }
    Some(total)
}

/// The errno numbers a unit may name in `SystemCallErrorNumber=`.
pub(super) fn errno(name: &str) -> Option<i32> {
    use nix::libc;
    Some(match name.trim() {
        "EPERM" => libc::EPERM,
        "EACCES" => libc::EACCES,
        "ENOSYS" => libc::ENOSYS,
        "EINVAL" => libc::EINVAL,
        "EOPNOTSUPP" | "ENOTSUP" => libc::EOPNOTSUPP,
        "ENOENT" => libc::ENOENT,
        _ => return None,
    })
}

/// One `IPAddressDeny=`/`IPAddressAllow=` token as prefixes.
pub(super) fn prefixes(t: &str) -> Option<Vec<(IpAddr, u8)>> {
    let named: &[&str] = match t {
        "any" => &["0.0.0.0/0", "::/0"],
        "localhost" => &["127.0.0.0/8", "::1/128"],
        "link-local" => &["169.254.0.0/16", "fe80::/64"],
        "multicast" => &["224.0.0.0/4", "ff00::/8"],
        _ => &[],
    };
    if !named.is_empty() {
        return named.iter().map(|p| prefix(p)).collect();
    }
    prefix(t).map(|p| vec![p])
}

fn prefix(t: &str) -> Option<(IpAddr, u8)> {
    let (addr, len) = match t.split_once('/') {
        Some((a, l)) => (a, Some(l.parse::<u8>().ok()?)),
        None => (t, None),
    };
    let addr: IpAddr = addr.parse().ok()?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let len = len.unwrap_or(max);
    (len <= max).then_some((addr, len))
}

/// Splits a command line as systemd does: whitespace separates words,
/// single and double quotes group them, a backslash escapes the next
/// character. `None` for an unbalanced quote.
pub fn split_quoted(s: &str) -> Option<Vec<String>> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), '\\') | (None, '\\') => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                    in_word = true;
                }
            }
            (Some(_), c) => cur.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            (None, c) => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if quote.is_some() {
        return None;
    }
    if in_word {
        words.push(cur);
    }
    Some(words)
}

/// The `argv[]=` of each `{ path=… ; argv[]=… ; … }` in a shown command.
pub(super) fn exec_argvs(line: &str) -> Vec<String> {
    line.split("argv[]=")
        .skip(1)
        .filter_map(|rest| rest.split(" ; ").next())
        .map(|a| a.trim().to_owned())
        .collect()
}

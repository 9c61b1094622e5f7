//! How each kind of directive is compared with what `systemctl show`
//! reports: one function per [`Kind`], and the set and filter arithmetic
//! they share.

use super::Host;
use super::rules::Kind;
use super::shown::Shown;
use super::values as parse;
use std::collections::BTreeSet;
use std::net::IpAddr;

/// Compares one directive; `Ok(what was found)` or `Err(why it fails)`.
pub fn compare(
    kind: Kind,
    values: &[String],
    shown: &Shown,
    host: &Host,
) -> Result<String, String> {
    match kind {
        Kind::Word(p) => word(p, values, shown),
        Kind::Words(p) => words(p, values, shown),
        Kind::Octal(p) => octal(p, values, shown),
        Kind::Timespan(p) => timespan(p, values, shown),
        Kind::Bytes(p) | Kind::Count(p) => number(p, values, shown),
        Kind::Rlimit(p) => rlimit(p, values, shown),
        Kind::Errno(p) => errno(p, values, shown),
        Kind::Capabilities(p) => capabilities(p, values, shown),
        Kind::AddressFamilies => address_families(values, shown),
        Kind::Namespaces => namespaces(values, shown),
        Kind::SystemCalls => system_calls(values, shown, host),
        Kind::IpPrefixes(p) => ip_prefixes(p, values, shown),
        Kind::Exec(p) => exec(p, values, shown),
        Kind::EnvironmentFiles => environment_files(values, shown),
        Kind::Listen(ty) => listen(ty, values, shown),
        Kind::NotVerified(why) => Ok(format!("not verified: {why}")),
    }
}

/// One word, the last assignment winning, booleans as `yes`/`no`.
fn word(p: &str, values: &[String], shown: &Shown) -> Result<String, String> {
    let want = parse::word(last(values));
    let have = need(shown, p)?;
    if have.is_empty() {
        return Err(format!("unset (want {want})"));
    }
    if parse::word(have) == want {
        Ok(have.to_owned())
    } else {
        Err(format!("{have} (want {want})"))
    }
}

/// A list, as a set.
fn words(p: &str, values: &[String], shown: &Shown) -> Result<String, String> {
    let want = accumulate(values);
    let have: BTreeSet<String> = need(shown, p)?
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    set_diff(&want, &have, "(none)")
}

/// An octal mode, as a number.
fn octal(p: &str, values: &[String], shown: &Shown) -> Result<String, String> {
    let want = parse::octal(last(values))
        .ok_or_else(|| format!("the shipped value {:?} is not an octal mode", last(values)))?;
    let have = need(shown, p)?;
    match parse::octal(have) {
        Some(h) if h == want => Ok(have.to_owned()),
        Some(_) => Err(format!("{have} (want {want:04o})")),
        None => Err(format!("unrecognised value {have:?}")),
    }
}

/// A time span, in microseconds.
fn timespan(p: &str, values: &[String], shown: &Shown) -> Result<String, String> {
    let want = parse::timespan(last(values), true)
        .ok_or_else(|| format!("the shipped value {:?} is not a time span", last(values)))?;
    let have = need(shown, p)?;
    match parse::timespan(have, false) {
        Some(h) if h == want => Ok(have.to_owned()),
        Some(_) => Err(format!("{have} (want {})", last(values))),
        None => Err(format!("unrecognised value {have:?}")),
    }
}

/// A size or a count, as a number.
fn number(p: &str, values: &[String], shown: &Shown) -> Result<String, String> {
    let want = parse::bytes(last(values))
        .ok_or_else(|| format!("the shipped value {:?} is not a number", last(values)))?;
    let have = need(shown, p)?;
    match parse::bytes(have) {
        Some(h) if h == want => Ok(have.to_owned()),
        Some(_) => Err(format!("{have} (want {})", last(values))),
        None => Err(format!("unrecognised value {have:?}")),
    }
}

/// A resource limit: its soft and hard values.
fn rlimit(p: &str, values: &[String], shown: &Shown) -> Result<String, String> {
    let v = last(values);
    let (soft, hard) = v.split_once(':').unwrap_or((v, v));
    let (Some(soft), Some(hard)) = (parse::bytes(soft), parse::bytes(hard)) else {
        return Err(format!("the shipped value {v:?} is not a limit"));
    };
    let soft_name = format!("{p}Soft");
    let (have_hard, have_soft) = (need(shown, p)?, need(shown, &soft_name)?);
    match (parse::bytes(have_hard), parse::bytes(have_soft)) {
        (Some(h), Some(s)) if h == hard && s == soft => {
            Ok(format!("{have_soft} (soft), {have_hard} (hard)"))
        }
        (Some(_), Some(_)) => Err(format!("{have_soft} (soft), {have_hard} (hard); want {v}")),
        _ => Err(format!(
            "unrecognised value {p}={have_hard:?} {soft_name}={have_soft:?}"
        )),
    }
}

/// An errno name, against the number shown.
fn errno(p: &str, values: &[String], shown: &Shown) -> Result<String, String> {
    let v = last(values);
    let want = parse::errno(v)
        .ok_or_else(|| format!("the shipped value {v:?} is not an errno this verifier knows"))?;
    let have = need(shown, p)?;
    let got = have.parse::<i32>().ok().or_else(|| parse::errno(have));
    match got {
        Some(h) if h == want => Ok(format!("{have} ({v})")),
        Some(_) => Err(format!("{have} (want {v}, {want})")),
        None => Err(format!("unrecognised value {have:?}")),
    }
}

/// A capability set, in lower case.
fn capabilities(p: &str, values: &[String], shown: &Shown) -> Result<String, String> {
    let mut want = BTreeSet::new();
    for v in values {
        if v.starts_with('~') {
            return Err(format!(
                "the shipped value {v:?}: a ~ capability list is not supported by the verifier"
            ));
        }
        if v.is_empty() {
            want.clear();
        }
        want.extend(v.split_whitespace().map(str::to_ascii_lowercase));
    }
    let have: BTreeSet<String> = need(shown, p)?
        .split_whitespace()
        .map(str::to_ascii_lowercase)
        .collect();
    set_diff(&want, &have, "(none)")
}

/// `RestrictAddressFamilies=`, as a filter.
fn address_families(values: &[String], shown: &Shown) -> Result<String, String> {
    let want = filter_set(values, None, |line, out| {
        out.extend(line.split_whitespace().map(str::to_owned));
        Ok(())
    })?;
    let have = need(shown, "RestrictAddressFamilies")?;
    let have =
        shown_filter(have).ok_or_else(|| "unset: every address family is allowed".to_owned())?;
    filter_diff(&want, &have, "address families")
}

/// `RestrictNamespaces=`, as the set of namespace types allowed.
fn namespaces(values: &[String], shown: &Shown) -> Result<String, String> {
    let mut want: BTreeSet<String> = parse::ALL_NAMESPACES
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    let mut first = true;
    for v in values {
        let parsed = parse::namespaces(v)
            .ok_or_else(|| format!("the shipped value {v:?} is not a namespace list"))?;
        if first || v.is_empty() || matches!(parse::word(v).as_str(), "yes" | "no") {
            want = parsed;
        } else if v.starts_with('~') {
            want = want.intersection(&parsed).cloned().collect();
        } else {
            want.extend(parsed);
        }
        first = false;
    }
    let have = need(shown, "RestrictNamespaces")?;
    let Some(have_set) = parse::namespaces(have) else {
        return Err(format!("unrecognised value {have:?}"));
    };
    if have_set == want {
        Ok(have.to_owned())
    } else {
        let show = |s: &BTreeSet<String>| {
            if s.is_empty() {
                "none".to_owned()
            } else {
                s.iter().cloned().collect::<Vec<_>>().join(" ")
            }
        };
        Err(format!(
            "{have}: allows {} (want {})",
            show(&have_set),
            show(&want)
        ))
    }
}

/// `SystemCallFilter=`, as a filter of names expanded by this host's groups.
fn system_calls(values: &[String], shown: &Shown, host: &Host) -> Result<String, String> {
    if host.syscall_groups.is_empty() {
        return Err(
            "cannot expand the shipped groups: `systemd-analyze syscall-filter` gave nothing"
                .to_owned(),
        );
    }
    // An allow-list of system calls starts from @default.
    let want = filter_set(values, Some("@default"), |line, out| {
        for item in line.split_whitespace() {
            let name = item.split(':').next().unwrap_or(item);
            host.syscall_groups.expand(name, out, 0)?;
        }
        Ok(())
    })?;
    let have = need(shown, "SystemCallFilter")?;
    let have =
        shown_filter(have).ok_or_else(|| "unset: every system call is allowed".to_owned())?;
    let have = (
        have.0,
        have.1
            .into_iter()
            .map(|n| n.split(':').next().unwrap_or(&n).to_owned())
            .collect(),
    );
    filter_diff(&want, &have, "system calls")
}

/// `IPAddressDeny=`/`IPAddressAllow=`, as a set of prefixes.
fn ip_prefixes(p: &str, values: &[String], shown: &Shown) -> Result<String, String> {
    let mut want = BTreeSet::new();
    for v in values {
        if v.is_empty() {
            want.clear();
        }
        for t in v.split_whitespace() {
            want.extend(
                parse::prefixes(t)
                    .ok_or_else(|| format!("the shipped value {t:?} is not an address prefix"))?,
            );
        }
    }
    let have_text = need(shown, p)?;
    let mut have = BTreeSet::new();
    for t in have_text.split_whitespace() {
        have.extend(parse::prefixes(t).ok_or_else(|| format!("unrecognised value {t:?}"))?);
    }
    let fmt = |s: &BTreeSet<(IpAddr, u8)>| -> BTreeSet<String> {
        s.iter().map(|(a, n)| format!("{a}/{n}")).collect()
    };
    set_diff(&fmt(&want), &fmt(&have), "(none)")
}

/// A command line: the argument lists, in order.
fn exec(p: &str, values: &[String], shown: &Shown) -> Result<String, String> {
    let mut want: Vec<String> = Vec::new();
    for v in values {
        if v.is_empty() {
            want.clear();
            continue;
        }
        let v = v.trim_start_matches(['-', '@', ':', '+', '!']);
        let args = parse::split_quoted(v)
            .ok_or_else(|| format!("the shipped command {v:?} has unbalanced quotes"))?;
        want.push(args.join(" "));
    }
    let have: Vec<String> = shown
        .all(p)
        .iter()
        .flat_map(|line| parse::exec_argvs(line))
        .collect();
    if shown.all(p).is_empty() {
        return Err(format!("systemctl show does not report {p}"));
    }
    if have == want {
        Ok(have.join("; "))
    } else {
        Err(format!(
            "runs {:?} (want {:?})",
            have.join("; "),
            want.join("; ")
        ))
    }
}

/// `EnvironmentFile=`: the files and whether a missing one is ignored.
fn environment_files(values: &[String], shown: &Shown) -> Result<String, String> {
    let mut want = BTreeSet::new();
    for v in values {
        if v.is_empty() {
            want.clear();
            continue;
        }
        let (path, ignore) = match v.strip_prefix('-') {
            Some(p) => (p, "yes"),
            None => (v.as_str(), "no"),
        };
        want.insert(format!("{path} (ignore_errors={ignore})"));
    }
    if shown.all("EnvironmentFiles").is_empty() {
        return Err("systemctl show does not report EnvironmentFiles".to_owned());
    }
    let have: BTreeSet<String> = shown
        .all("EnvironmentFiles")
        .iter()
        .filter(|s| !s.is_empty())
        .cloned()
        .collect();
    set_diff(&want, &have, "(none)")
}

/// A socket's addresses of one type.
fn listen(ty: &str, values: &[String], shown: &Shown) -> Result<String, String> {
    let mut want = BTreeSet::new();
    for v in values {
        if v.is_empty() {
            want.clear();
        } else {
            want.insert(v.clone());
        }
    }
    if shown.all("Listen").is_empty() {
        return Err("systemctl show does not report Listen".to_owned());
    }
    let suffix = format!(" ({ty})");
    let have: BTreeSet<String> = shown
        .all("Listen")
        .iter()
        .filter_map(|l| l.strip_suffix(&suffix))
        .map(str::to_owned)
        .collect();
    set_diff(&want, &have, "(none)")
}

/// The shown value of `p`, or the failure "not reported".
fn need<'a>(shown: &'a Shown, p: &str) -> Result<&'a str, String> {
    shown
        .get(p)
        .ok_or_else(|| format!("systemctl show does not report {p}"))
}

fn last(values: &[String]) -> &str {
    values.last().map_or("", String::as_str)
}

/// A list directive's values: an empty assignment resets, later ones
/// add. Tokens are split as systemd splits them (quotes removed).
fn accumulate(values: &[String]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for v in values {
        if v.is_empty() {
            out.clear();
            continue;
        }
        match parse::split_quoted(v) {
            Some(words) => out.extend(words),
            None => {
                out.insert(v.clone());
            }
        }
    }
    out
}

/// `Ok(found)` when the sets are equal, else what is extra and missing.
fn set_diff(
    want: &BTreeSet<String>,
    have: &BTreeSet<String>,
    empty: &str,
) -> Result<String, String> {
    let join = |s: &BTreeSet<String>| {
        if s.is_empty() {
            empty.to_owned()
        } else {
            s.iter().cloned().collect::<Vec<_>>().join(" ")
        }
    };
    if want == have {
        return Ok(join(have));
    }
    let extra: BTreeSet<String> = have.difference(want).cloned().collect();
    let missing: BTreeSet<String> = want.difference(have).cloned().collect();
    let mut parts = Vec::new();
    if !missing.is_empty() {
        parts.push(format!("missing {}", join(&missing)));
    }
    if !extra.is_empty() {
        parts.push(format!("not shipped {}", join(&extra)));
    }
    Err(format!("{} (have {})", parts.join("; "), join(have)))
}

/// An allow- or deny-list built as systemd builds `SystemCallFilter=` and
/// `RestrictAddressFamilies=`: the first line sets the mode (`~`: deny),
/// an allow-list of system calls starts from `@default`; then each line
/// adds (or, with `~` on an allow-list, removes); an empty one resets.
type Filter = (bool, BTreeSet<String>);

fn filter_set(
    values: &[String],
    allow_base: Option<&str>,
    mut items: impl FnMut(&str, &mut BTreeSet<String>) -> Result<(), String>,
) -> Result<Filter, String> {
    let mut mode: Option<bool> = None;
    let mut set = BTreeSet::new();
    for v in values {
        if v.is_empty() {
            mode = None;
            set.clear();
            continue;
        }
        let (invert, body) = match v.strip_prefix('~') {
            Some(b) => (true, b),
            None => (false, v.as_str()),
        };
        let allow = match mode {
            Some(a) => a,
            None => {
                if let (false, Some(base)) = (invert, allow_base) {
                    items(base, &mut set)?;
                }
                mode = Some(!invert);
                !invert
            }
        };
        let mut these = BTreeSet::new();
        items(body, &mut these)?;
        if invert != allow {
            set.extend(these);
        } else {
            for t in these {
                set.remove(&t);
            }
        }
    }
    let allow = mode.ok_or_else(|| "the shipped lines reset the list to nothing".to_owned())?;
    Ok((allow, set))
}

/// A shown filter: `~a b` (deny-list) or `a b` (allow-list); `None` when empty.
fn shown_filter(text: &str) -> Option<Filter> {
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    let (allow, body) = match text.strip_prefix('~') {
        Some(b) => (false, b),
        None => (true, text),
    };
    Some((allow, body.split_whitespace().map(str::to_owned).collect()))
}

fn filter_diff(want: &Filter, have: &Filter, what: &str) -> Result<String, String> {
    let mode = |allow: bool| if allow { "allow-list" } else { "deny-list" };
    if want.0 != have.0 {
        return Err(format!(
            "a {} of {} {what} (want a {} of {})",
            mode(have.0),
            have.1.len(),
            mode(want.0),
            want.1.len()
        ));
    }
    // What the effective list allows beyond the shipped one: extra names
    // on an allow-list, names dropped from a deny-list.
    let (wider, narrower): (Vec<String>, Vec<String>) = if want.0 {
        (
            have.1.difference(&want.1).cloned().collect(),
            want.1.difference(&have.1).cloned().collect(),
        )
    } else {
        (
            want.1.difference(&have.1).cloned().collect(),
            have.1.difference(&want.1).cloned().collect(),
        )
    };
    if !wider.is_empty() {
        let verb = if want.0 { "allows" } else { "no longer denies" };
        return Err(format!("{verb} {what} not shipped: {}", wider.join(" ")));
    }
    let n = have.1.len();
    let listed = if n > 8 {
        format!("{} of {n} {what}", mode(have.0))
    } else {
        format!(
            "{} {}",
            mode(have.0),
            have.1.iter().cloned().collect::<Vec<_>>().join(" ")
        )
    };
    Ok(if narrower.is_empty() {
        format!("{listed}, as shipped")
    } else {
        format!(
            "{listed}, nothing beyond the shipped lines ({} of theirs not in effect: {})",
            narrower.len(),
            narrower.join(" ")
        )
    })
}

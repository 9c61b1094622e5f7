//! The shipped unit files, compiled in by `build.rs`, read as systemd
//! reads them: assignments, continuation lines, specifiers.

/// A unit file the package installs.
#[derive(Clone, Copy, Debug)]
pub struct ShippedUnit {
    /// Its file name, e.g. `airlock-worker.service` or `airlock-agent@.service`.
    pub name: &'static str,
    /// Its text.
    pub text: &'static str,
}

include!(concat!(env!("OUT_DIR"), "/shipped_units.rs"));

impl ShippedUnit {
    /// A template (`name@.service`), checked per running instance.
    pub fn is_template(&self) -> bool {
        self.name.contains("@.")
    }

    /// The glob `systemctl list-units` takes for its instances.
    pub fn instance_pattern(&self) -> String {
        self.name.replacen("@.", "@*.", 1)
    }

    /// The directives of the file, in order.
    pub fn assignments(&self) -> Vec<Assignment> {
        parse_unit(self.text)
    }
}

/// One `Key=value` line of a unit file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assignment {
    /// `Unit`, `Service`, `Socket`, `Install`.
    pub section: String,
    /// The directive.
    pub key: String,
    /// Its value, continuation lines joined.
    pub value: String,
}

/// The assignments of a unit file: comments (`#`, `;`) skipped, lines
/// ending in a backslash joined with the next, as systemd reads them.
pub fn parse_unit(text: &str) -> Vec<Assignment> {
    let mut out = Vec::new();
    let mut section = String::new();
    let mut pending = String::new();
    for raw in text.lines() {
        let line = raw.trim();
        if pending.is_empty() && (line.starts_with('#') || line.starts_with(';')) {
            continue;
        }
        if let Some(rest) = line.strip_suffix('\\') {
            pending.push_str(rest);
            pending.push(' ');
            continue;
        }
        let full = std::mem::take(&mut pending) + line;
        let full = full.trim();
        if full.is_empty() {
            continue;
        }
        if let Some(name) = full.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
            section = name.to_owned();
            continue;
        }
        if let Some((k, v)) = full.split_once('=') {
            out.push(Assignment {
                section: section.clone(),
                key: k.trim().to_owned(),
                value: v.trim().to_owned(),
            });
        }
    }
    out
}

/// Directives checked on every service even where its file does not set
/// them, as unset (empty): a drop-in that adds a writable path, an ambient
/// capability or a group widens the unit as surely as one that changes a
/// shipped line.
pub const UNSET_MEANS_EMPTY: &[&str] = &[
    "ReadWritePaths",
    "AmbientCapabilities",
    "SupplementaryGroups",
];

/// A unit's directives grouped: per directive, its values in file order;
/// for a service, [`UNSET_MEANS_EMPTY`] as an empty assignment when unset.
pub fn directives(unit: &ShippedUnit, instance: Option<&str>) -> Vec<(String, Vec<String>)> {
    let mut order: Vec<(String, Vec<String>)> = Vec::new();
    let name = match instance {
        Some(i) => unit.name.replacen("@.", &format!("@{i}."), 1),
        None => unit.name.to_owned(),
    };
    for a in unit.assignments() {
        let value = expand_specifiers(&a.value, &name, instance.unwrap_or(""));
        match order.iter_mut().find(|(k, _)| *k == a.key) {
            Some((_, v)) => v.push(value),
            None => order.push((a.key, vec![value])),
        }
    }
    if unit.name.ends_with(".service") {
        for key in UNSET_MEANS_EMPTY {
            if !order.iter().any(|(k, _)| k == key) {
                order.push(((*key).to_owned(), vec![String::new()]));
            }
        }
    }
    order
}

/// Expands the unit specifiers airlock's units may use: `%i`/`%I` (the
/// instance), `%n` (the full unit name), `%N` (without its type suffix),
/// `%p` (the prefix, before `@`), `%%`. Any other specifier is left as
/// `%?x` so that the comparison fails visibly.
pub fn expand_specifiers(value: &str, unit: &str, instance: &str) -> String {
    let mut out = String::new();
    let mut chars = value.chars();
    let stem = unit.rsplit_once('.').map_or(unit, |(s, _)| s);
    let prefix = stem.split('@').next().unwrap_or(stem);
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('i' | 'I') => out.push_str(instance),
            Some('n') => out.push_str(unit),
            Some('N') => out.push_str(stem),
            Some('p' | 'P') => out.push_str(prefix),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push_str("%?");
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

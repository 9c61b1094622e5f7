//! What systemd reports: `systemctl show` properties and this host's
//! system call groups (`systemd-analyze syscall-filter`).

use std::collections::{BTreeMap, BTreeSet};

/// `systemctl show` output: every value of each property (a property may
/// be printed on several lines).
#[derive(Clone, Debug, Default)]
pub struct Shown(BTreeMap<String, Vec<String>>);

impl Shown {
    /// Reads `Key=value` lines.
    pub fn parse(text: &str) -> Shown {
        let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for line in text.lines() {
            if let Some((k, v)) = line.split_once('=') {
                map.entry(k.to_owned()).or_default().push(v.to_owned());
            }
        }
        Shown(map)
    }

    /// The (last) value of a property, `None` when it was not printed.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.last()).map(String::as_str)
    }

    /// Every value printed for a property.
    pub fn all(&self, key: &str) -> &[String] {
        self.0.get(key).map(Vec::as_slice).unwrap_or_default()
    }

    /// Removes a property (tests: a missing field).
    pub fn remove(&mut self, key: &str) {
        self.0.remove(key);
    }

    /// Replaces a property's value (tests: a wrong value).
    pub fn set(&mut self, key: &str, value: &str) {
        self.0.insert(key.to_owned(), vec![value.to_owned()]);
    }
}

/// The system call groups of this host's systemd (`systemd-analyze
/// syscall-filter`): group name (with its `@`) to entries (names and
/// nested groups).
#[derive(Clone, Debug, Default)]
pub struct SyscallGroups(BTreeMap<String, Vec<String>>);

impl SyscallGroups {
    /// Reads `systemd-analyze syscall-filter` output: a line `@group`, then
    /// its entries indented, `#` lines being descriptions or names outside
    /// every group.
    pub fn parse(text: &str) -> SyscallGroups {
        let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut current: Option<String> = None;
        for line in text.lines() {
            if line.trim().is_empty() {
                current = None;
                continue;
            }
            if !line.starts_with(char::is_whitespace) {
                current = line.trim().starts_with('@').then(|| line.trim().to_owned());
                if let Some(g) = &current {
                    map.entry(g.clone()).or_default();
                }
                continue;
            }
            let entry = line.trim();
            if entry.starts_with('#') {
                continue;
            }
            if let Some(g) = &current {
                map.entry(g.clone()).or_default().push(entry.to_owned());
            }
        }
        SyscallGroups(map)
    }

    /// True when no group was read.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The names a group or a name stands for.
    pub(super) fn expand(
        &self,
        item: &str,
        out: &mut BTreeSet<String>,
        depth: usize,
    ) -> Result<(), String> {
        if let Some(group) = item.strip_prefix('@').map(|_| item) {
            let entries = self
                .0
                .get(group)
                .ok_or_else(|| format!("{group} is not a group this systemd knows"))?;
            if depth > 16 {
                return Err(format!("{group}: groups nested too deep"));
            }
            for e in entries {
                self.expand(e, out, depth + 1)?;
            }
        } else {
            out.insert(item.to_owned());
        }
        Ok(())
    }
}

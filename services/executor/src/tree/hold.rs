//! What running jobs use now. A cache entry with a [`Hold`] on it is never
//! evicted, moved or written under the job that holds it; a [`Making`]
//! claim makes sure an entry two jobs want at once is made once, the
//! second waiting for the first. A leaf: it knows no cache.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex, PoisonError};

/// Holds by key, counted: shared by a cache and every [`Hold`] it gave.
#[derive(Clone, Debug, Default)]
pub struct Holds(Arc<Mutex<HashMap<String, usize>>>);

impl Holds {
    /// A hold on `key`, released when dropped.
    pub fn hold(&self, key: &str) -> Hold {
        *self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(key.to_owned())
            .or_default() += 1;
        Hold {
            holds: self.clone(),
            key: key.to_owned(),
        }
    }

    /// Whether a job holds `key` now.
    pub fn is_held(&self, key: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(key)
    }
}

/// One job's hold on one entry.
#[derive(Debug)]
pub struct Hold {
    holds: Holds,
    key: String,
}

impl Clone for Hold {
    fn clone(&self) -> Hold {
        self.holds.hold(&self.key)
    }
}

impl PartialEq for Hold {
    fn eq(&self, other: &Hold) -> bool {
        self.key == other.key
    }
}

impl Eq for Hold {}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut map = self.holds.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = map.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.key);
            }
        }
    }
}

/// The keys being made now, one maker each.
#[derive(Debug, Default)]
pub struct Makers {
    busy: Mutex<HashSet<String>>,
    done: Condvar,
}

impl Makers {
    /// Claims the making of `key`, first waiting while another job makes
    /// it (whose entry the caller then looks up again before making it).
    pub fn claim(&self, key: &str) -> Making<'_> {
        let mut busy = self.busy.lock().unwrap_or_else(PoisonError::into_inner);
        while busy.contains(key) {
            busy = self.done.wait(busy).unwrap_or_else(PoisonError::into_inner);
        }
        busy.insert(key.to_owned());
        Making {
            makers: self,
            key: key.to_owned(),
        }
    }
}

/// The claim on making one key; released (and the waiters woken) when
/// dropped, whether the entry was made or not.
#[derive(Debug)]
pub struct Making<'a> {
    makers: &'a Makers,
    key: String,
}

impl Drop for Making<'_> {
    fn drop(&mut self) {
        self.makers
            .busy
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.key);
        self.makers.done.notify_all();
    }
}

/// What a cache evicts to keep its bounds: from `entries` (last use,
/// bytes, name), least recently used first, the names to remove until at
/// most `max_entries` entries of at most `max_bytes` in all remain,
/// passing over every name `spared` keeps (the entry being made, one a
/// job holds): they count but are never chosen.
pub fn least_recently_used(
    mut entries: Vec<(std::time::SystemTime, u64, String)>,
    max_entries: u64,
    max_bytes: u64,
    spared: impl Fn(&str) -> bool,
) -> Vec<String> {
    entries.sort();
    let mut count = entries.len() as u64;
    let mut bytes: u64 = entries.iter().map(|e| e.1).sum();
    let mut evicted = Vec::new();
    for (_, size, name) in entries {
        if count <= max_entries && bytes <= max_bytes {
            break;
        }
        if spared(&name) {
            continue;
        }
        evicted.push(name);
        count -= 1;
        bytes = bytes.saturating_sub(size);
    }
    evicted
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_key_is_held_until_its_last_hold_goes() {
        let holds = Holds::default();
        let a = holds.hold("k");
        let b = a.clone();
        assert!(holds.is_held("k"));
        drop(a);
        assert!(holds.is_held("k"));
        drop(b);
        assert!(!holds.is_held("k"));
        assert!(!holds.is_held("other"));
    }

    #[test]
    fn a_second_maker_waits_for_the_first() {
        let makers = Makers::default();
        let order = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            let first = makers.claim("k");
            s.spawn(|| {
                let _second = makers.claim("k");
                order.lock().unwrap().push("second");
            });
            std::thread::sleep(Duration::from_millis(100));
            order.lock().unwrap().push("first");
            drop(first);
        });
        assert_eq!(*order.lock().unwrap(), ["first", "second"]);
        // Another key is never kept waiting.
        let _a = makers.claim("a");
        let _b = makers.claim("b");
    }
}

//! The preamble: the first line the executor's forwarder writes on each
//! connection to the proxy's socket, before the setup's own bytes.
//!
//! One JSON object on one line, terminated by `\n`, at most
//! [`PREAMBLE_MAX`] bytes with the newline; unknown fields are refused.
//! Every connection of one setup run carries the same preamble: its
//! [`Preamble::session`] keys the limits, which the first connection of a
//! session fixes.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::hostport::HostPort;

/// Longest preamble line, newline included.
pub const PREAMBLE_MAX: usize = 16 * 1024;
/// Most `allow` entries in one preamble.
pub const MAX_ALLOW: usize = 256;
/// Longest session id.
pub const MAX_SESSION: usize = 200;
/// Highest `max_seconds` (a day).
pub const MAX_SECONDS: u64 = 86_400;
/// Highest `max_connections`.
pub const MAX_CONNECTIONS: u32 = 100_000;

/// What one setup run may do through the proxy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Preamble {
    /// The setup run's id, e.g. `<task id>:<attempt>`: the key of its
    /// limits. `[A-Za-z0-9][A-Za-z0-9._:-]*`, at most 200 characters.
    pub session: String,
    /// The task the setup runs for (logged with every decision).
    pub task_id: String,
    /// The only targets a CONNECT may name.
    pub allow: Vec<HostPort>,
    /// The session's bounds.
    pub limits: Limits,
}

/// Bounds on one session, over all its connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Bytes through all tunnels, both directions together (at least 1).
    pub max_bytes: u64,
    /// Seconds from the session's first connection; a tunnel open at the
    /// end is closed (1 to 86400).
    pub max_seconds: u64,
    /// Connections in the session's whole life, so also at once (1 to
    /// 100000).
    pub max_connections: u32,
}

/// Why a preamble is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreambleError(String);

impl fmt::Display for PreambleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "preamble: {}", self.0)
    }
}

impl std::error::Error for PreambleError {}

impl Preamble {
    /// The line to write: the JSON object and `\n`. Fails when the
    /// preamble would be refused by [`Preamble::parse_line`].
    pub fn to_line(&self) -> Result<Vec<u8>, PreambleError> {
        self.validate()?;
        let mut line =
            serde_json::to_vec(self).map_err(|e| PreambleError(format!("encoding: {e}")))?;
        line.push(b'\n');
        if line.len() > PREAMBLE_MAX {
            return Err(PreambleError(format!(
                "{} bytes, more than {PREAMBLE_MAX}",
                line.len()
            )));
        }
        Ok(line)
    }

    /// Parses one line (with or without its final `\n`) and validates it.
    pub fn parse_line(line: &[u8]) -> Result<Preamble, PreambleError> {
        if line.len() > PREAMBLE_MAX {
            return Err(PreambleError(format!(
                "{} bytes, more than {PREAMBLE_MAX}",
                line.len()
            )));
        }
        let body = line.strip_suffix(b"\n").unwrap_or(line);
        if body.contains(&b'\n') {
            return Err(PreambleError("more than one line".into()));
        }
        let p: Preamble = serde_json::from_slice(body).map_err(|e| PreambleError(e.to_string()))?;
        p.validate()?;
        Ok(p)
    }

    /// Checks the bounds serde cannot express.
    pub fn validate(&self) -> Result<(), PreambleError> {
        let bad = |m: String| Err(PreambleError(m));
        if !id_shaped(&self.session, MAX_SESSION) {
            return bad(format!(
                "session is not of the form [A-Za-z0-9][A-Za-z0-9._:-]{{0,{}}}",
                MAX_SESSION - 1
            ));
        }
        if !crate::binding::is_task_id(&self.task_id) {
            return bad("task_id is not a task id".into());
        }
        if self.allow.is_empty() || self.allow.len() > MAX_ALLOW {
            return bad(format!("allow has 1 to {MAX_ALLOW} entries"));
        }
        let l = self.limits;
        if l.max_bytes == 0 {
            return bad("limits.max_bytes is at least 1".into());
        }
        if !(1..=MAX_SECONDS).contains(&l.max_seconds) {
            return bad(format!("limits.max_seconds is in 1..={MAX_SECONDS}"));
        }
        if !(1..=MAX_CONNECTIONS).contains(&l.max_connections) {
            return bad(format!(
                "limits.max_connections is in 1..={MAX_CONNECTIONS}"
            ));
        }
        Ok(())
    }
}

fn id_shaped(s: &str, max: usize) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= max
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"._:-".contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Preamble {
        Preamble {
            session: "task-1:1".into(),
            task_id: "task-1".into(),
            allow: vec![HostPort::parse("pkg.example.org:443").unwrap()],
            limits: Limits {
                max_bytes: 1 << 20,
                max_seconds: 60,
                max_connections: 4,
            },
        }
    }

    #[test]
    fn round_trips_as_one_line() {
        let line = sample().to_line().unwrap();
        assert_eq!(line.last(), Some(&b'\n'));
        assert_eq!(line.iter().filter(|b| **b == b'\n').count(), 1);
        assert_eq!(Preamble::parse_line(&line).unwrap(), sample());
    }

    #[test]
    fn refuses_unknown_fields_bad_entries_bounds_and_size() {
        let good = String::from_utf8(sample().to_line().unwrap()).unwrap();
        let cases = [
            good.replacen("{", "{\"extra\":1,", 1),
            good.replacen("\"max_connections\":4", "\"max_connections\":4,\"x\":1", 1),
            good.replace("pkg.example.org:443", "*.example.org:443"),
            good.replace("pkg.example.org:443", "pkg.example.org"),
            good.replace("\"session\":\"task-1:1\"", "\"session\":\"\""),
            good.replace("\"session\":\"task-1:1\"", "\"session\":\"a b\""),
            good.replace("\"task_id\":\"task-1\"", "\"task_id\":\"x\""),
            good.replace("[\"pkg.example.org:443\"]", "[]"),
            good.replace("\"max_bytes\":1048576", "\"max_bytes\":0"),
            good.replace("\"max_seconds\":60", "\"max_seconds\":0"),
            good.replace("\"max_seconds\":60", "\"max_seconds\":86401"),
            good.replace("\"max_connections\":4", "\"max_connections\":0"),
            good.replace(",\"max_connections\":4", ""),
            "not json\n".into(),
            "{}\n{}\n".into(),
            format!("{}\n", " ".repeat(PREAMBLE_MAX)),
        ];
        for c in cases {
            assert_ne!(c, good);
            assert!(Preamble::parse_line(c.as_bytes()).is_err(), "{c}");
        }
        let mut many = sample();
        many.allow = (0..=MAX_ALLOW)
            .map(|i| HostPort::parse(&format!("h{i}.example.org:443")).unwrap())
            .collect();
        assert!(many.to_line().is_err());
    }
}

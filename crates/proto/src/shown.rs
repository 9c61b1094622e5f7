//! What a caller sent, as a log line or an audit record may show it.
//!
//! A caller's value — a task id, an agent's name, the detail of a refusal
//! that quotes an argument — reaches a log line or an audit record only
//! through [`shown`] (or [`shown_within`]): redacted ([`crate::redact`]),
//! every control character escaped (so a value cannot end a log line and
//! forge the next, or drive a terminal), and cut to a small bound with a
//! marker that says how many bytes were not shown. A 10 MiB argument costs
//! the log a few hundred bytes, whoever sent it.
//!
//! [`cut`] is the bound alone, for text that is already escaped (canonical
//! JSON).
//!
//! ```
//! use airlock_proto::shown::{MAX_SHOWN, shown};
//! let id = format!("task\n{}", "x".repeat(10 << 20));
//! let s = shown(&id);
//! assert!(s.starts_with("task\\nxxx"));
//! assert!(s.ends_with(&format!("…[{} bytes cut]", id.len() - (MAX_SHOWN - 1))));
//! assert!(s.len() < MAX_SHOWN + 32);
//! assert_eq!(shown("task-1"), "task-1");
//! ```

use std::borrow::Cow;
use std::fmt::Write as _;

/// The most bytes of a caller's value a log line or an audit record shows
/// (escapes included; the marker comes on top). A well-formed task id (at
/// most 180 bytes) is shown whole.
pub const MAX_SHOWN: usize = 256;

/// How much of a value is redacted before it is cut: a secret that starts
/// in the part shown is redacted whole (secrets are shorter than this),
/// and the cost of redacting does not grow with what was sent.
const REDACTION_WINDOW: usize = 16 * 1024;

/// `value` as a log line or an audit record may show it: at most
/// [`MAX_SHOWN`] bytes, see [`shown_within`].
pub fn shown(value: &str) -> String {
    shown_within(value, MAX_SHOWN)
}

/// `value` redacted, with `\`, every control character and every
/// character that reorders or hides text (bidirectional overrides,
/// zero-width characters) escaped (`\n`, `\u{1b}`), cut to at most `max`
/// bytes on a character boundary, and, when cut, followed by
/// `…[N bytes cut]`, N counting the bytes of the (redacted) value not
/// shown.
pub fn shown_within(value: &str, max: usize) -> String {
    let (window, beyond) = prefix(value, REDACTION_WINDOW);
    let redacted = crate::redact::text(window);
    let mut out = String::with_capacity(redacted.len().min(max) + 32);
    let mut used = 0;
    let mut escaped = String::new();
    for c in redacted.chars() {
        escaped.clear();
        escape(c, &mut escaped);
        if out.len() + escaped.len() > max {
            break;
        }
        out.push_str(&escaped);
        used += c.len_utf8();
    }
    let not_shown = redacted.len() - used + beyond;
    if not_shown > 0 {
        let _ = write!(out, "…[{not_shown} bytes cut]");
    }
    out
}

/// `text` cut to at most `max` bytes on a character boundary, followed by
/// `…[N bytes cut]` when cut. No escaping: for text that is escaped
/// already (canonical JSON).
pub fn cut(text: &str, max: usize) -> Cow<'_, str> {
    let (head, beyond) = prefix(text, max);
    if beyond == 0 {
        Cow::Borrowed(text)
    } else {
        Cow::Owned(format!("{head}…[{beyond} bytes cut]"))
    }
}

/// The first `max` bytes of `s` (fewer, to end on a character boundary)
/// and how many bytes follow them.
fn prefix(s: &str, max: usize) -> (&str, usize) {
    if s.len() <= max {
        return (s, 0);
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    (&s[..end], s.len() - end)
}

/// Whether `c` reorders or hides the text around it.
fn hides(c: char) -> bool {
    matches!(c,
        '\u{200B}'..='\u{200F}' // zero-width space, joiners, marks
        | '\u{202A}'..='\u{202E}' // bidirectional embeddings, overrides
        | '\u{2060}'..='\u{2064}' // word joiner, invisible operators
        | '\u{2066}'..='\u{2069}' // bidirectional isolates
        | '\u{FEFF}') // zero-width no-break space
}

fn escape(c: char, out: &mut String) {
    match c {
        '\\' => out.push_str("\\\\"),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c if c.is_control() || hides(c) => {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
        c => out.push(c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_plain_value_is_shown_as_it_is() {
        for v in ["task-1", "a.b:c-d_e", "", "héllo wörld", &"t".repeat(180)] {
            assert_eq!(shown(v), v);
        }
    }

    #[test]
    fn a_long_value_is_cut_with_the_number_of_bytes_cut() {
        let v = "x".repeat(10 << 20);
        let s = shown(&v);
        assert_eq!(
            s,
            format!("{}…[{} bytes cut]", "x".repeat(256), (10 << 20) - 256)
        );
        // Exactly the bound: nothing cut.
        assert_eq!(shown(&"y".repeat(MAX_SHOWN)), "y".repeat(MAX_SHOWN));
        let s = shown(&"y".repeat(MAX_SHOWN + 1));
        assert!(s.ends_with("…[1 bytes cut]"), "{s}");
    }

    #[test]
    fn control_characters_are_escaped_and_cannot_forge_a_line() {
        let v = "id\n2026-01-01 INFO forged\r\u{1b}[2J\t\u{0}\u{7f}\u{85}\\n";
        let s = shown(v);
        assert_eq!(
            s,
            "id\\n2026-01-01 INFO forged\\r\\u{1b}[2J\\t\\u{0}\\u{7f}\\u{85}\\\\n"
        );
        assert!(!s.chars().any(char::is_control), "{s}");
        // Reordering and hiding characters too.
        let s = shown("a\u{202E}b\u{200B}c\u{2066}d\u{FEFF}");
        assert_eq!(s, "a\\u{202e}b\\u{200b}c\\u{2066}d\\u{feff}");
    }

    #[test]
    fn escapes_count_towards_the_bound_and_never_split() {
        let v = "\n".repeat(1000);
        let s = shown(&v);
        // 128 escapes of two bytes each fill the bound.
        assert_eq!(s, format!("{}…[872 bytes cut]", "\\n".repeat(128)));
        let v = "\u{1b}".repeat(100);
        let s = shown_within(&v, 20);
        // "\u{1b}" is 6 bytes: three fit in 20.
        assert_eq!(s, format!("{}…[97 bytes cut]", "\\u{1b}".repeat(3)));
    }

    #[test]
    fn multibyte_characters_are_never_split() {
        let v = "é".repeat(1000);
        let s = shown_within(&v, 11);
        assert_eq!(s, format!("{}…[{} bytes cut]", "é".repeat(5), 2000 - 10));
        let (head, beyond) = prefix(&v, 11);
        assert_eq!((head.len(), beyond), (10, 1990));
    }

    #[test]
    fn secrets_are_redacted_before_they_are_shown() {
        for (kind, secret) in crate::redact::planted() {
            let s = shown_within(&format!("id {secret} and more"), 4096);
            let tail = if kind == "url-password" {
                "hunter2hunter2"
            } else {
                &secret[secret.len() - 12..]
            };
            assert!(!s.contains(tail), "{kind}: {s}");
        }
        // Even at the end of a huge value's shown part.
        let token = crate::redact::planted()
            .into_iter()
            .find(|(k, _)| *k == "github-token")
            .unwrap()
            .1;
        let v = format!("{}{token}{}", "a ".repeat(100), "b".repeat(1 << 20));
        let s = shown(&v);
        assert!(!s.contains(&token[..12]), "{s}");
    }

    #[test]
    fn cut_bounds_without_escaping() {
        assert_eq!(cut("{\"a\":\"b\\n\"}", 100), "{\"a\":\"b\\n\"}");
        assert_eq!(cut("abcdef", 4), "abcd…[2 bytes cut]");
        assert_eq!(cut("ééé", 3), "é…[4 bytes cut]");
    }

    #[test]
    fn a_huge_value_costs_no_more_than_a_small_one() {
        let v = "z".repeat(64 << 20);
        let t = std::time::Instant::now();
        let s = shown(&v);
        assert!(s.len() < MAX_SHOWN + 32);
        assert!(
            t.elapsed() < std::time::Duration::from_secs(2),
            "{:?}",
            t.elapsed()
        );
    }
}

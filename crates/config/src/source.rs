//! The text being parsed, and turning a failure into a [`ConfigError`] that
//! names the key, its place in the file and what was expected.

use std::cell::OnceCell;
use std::ops::Range;
use std::path::Path;

use toml_edit::ImDocument;

use crate::error::{ConfigError, Location};
use crate::{keys, secret};

/// Longest rendering of a found value in a message.
const MAX_FOUND_CHARS: usize = 60;

/// The file name and its text; the span-keeping parse is made only when an
/// error needs a location.
pub(crate) struct Source<'a> {
    file: &'a Path,
    text: &'a str,
    doc: OnceCell<Option<ImDocument<&'a str>>>,
}

impl<'a> Source<'a> {
    pub(crate) fn new(file: &'a Path, text: &'a str) -> Self {
        Source {
            file,
            text,
            doc: OnceCell::new(),
        }
    }

    /// Translates a shape error (syntax, unknown or missing key, wrong type).
    pub(crate) fn shape_error(
        &self,
        err: &serde_path_to_error::Error<toml::de::Error>,
    ) -> ConfigError {
        let inner = err.inner();
        let message = inner.message().trim().replace('\n', "; ");
        let at = inner
            .span()
            .map(|s| Location::of_offset(self.text, s.start));
        let path: Vec<String> = err.path().iter().map(segment).collect();
        if path.is_empty() {
            return ConfigError::Syntax {
                file: self.file.to_owned(),
                at,
                message,
            };
        }
        let key = join(&path);
        let normal = keys::normalise(&key);
        if message.starts_with("unknown field `") {
            let parent = normal.rsplit_once('.').map_or("", |(p, _)| p);
            let known = keys::children(parent);
            let problem = if known.is_empty() {
                "unknown key".to_owned()
            } else {
                format!("unknown key; expected one of: {}", known.join(", "))
            };
            return self.key_error(key, at, problem);
        }
        if let Some(field) = backquoted(&message, "missing field `") {
            let key = format!("{key}.{field}");
            let expected =
                keys::expectation(&keys::normalise(&key)).unwrap_or_else(|| "a value".to_owned());
            return self.key_error(key, at, format!("missing; expected {expected}"));
        }
        let found = inner
            .span()
            .and_then(|s| self.raw(s))
            .or_else(|| self.span_of(&key).and_then(|s| self.raw(s)))
            .map(|raw| shorten(&secret::shown(&normal, raw)));
        let message = secret::scrub(&normal, &message);
        let problem = match (keys::expectation(&normal), found) {
            (Some(expected), Some(found)) => format!("expected {expected}, found {found}"),
            (Some(expected), None) => format!("expected {expected} ({message})"),
            (None, _) => message.into_owned(),
        };
        self.key_error(key, at, problem)
    }

    /// A refusal of the semantic pass: `found` is the value as airlock read
    /// it; when the key is not in the file the value is its default, and the
    /// message says so. A value that may hold a credential is not shown,
    /// and secret shapes in any other are redacted ([`secret`]).
    pub(crate) fn refuse(
        &self,
        key: impl Into<String>,
        expected: impl std::fmt::Display,
        found: impl std::fmt::Display,
    ) -> ConfigError {
        let key = key.into();
        let at = self.location_of(&key);
        let default = if at.is_some() { "" } else { " (the default)" };
        let found = found.to_string();
        let problem = format!(
            "expected {expected}, found {}{default}",
            shorten(&secret::shown(&keys::normalise(&key), &found))
        );
        self.key_error(key, at, problem)
    }

    /// A refusal of the semantic pass where the problem is not "expected X,
    /// found Y" (a key this crate failed to declare, an environment's
    /// refusal); values quoted in it are not shown for a key that may hold
    /// a credential ([`secret::scrub`]).
    pub(crate) fn refuse_with(&self, key: impl Into<String>, problem: String) -> ConfigError {
        let key = key.into();
        let at = self.location_of(&key);
        let problem = secret::scrub(&keys::normalise(&key), &problem).into_owned();
        self.key_error(key, at, problem)
    }

    /// Where the key's value (or table) is in the file, if it is there.
    pub(crate) fn location_of(&self, key: &str) -> Option<Location> {
        self.span_of(key)
            .map(|s| Location::of_offset(self.text, s.start))
    }

    fn key_error(&self, key: String, at: Option<Location>, problem: String) -> ConfigError {
        ConfigError::Key {
            file: self.file.to_owned(),
            at,
            key,
            problem,
        }
    }

    fn doc(&self) -> Option<&ImDocument<&'a str>> {
        self.doc
            .get_or_init(|| ImDocument::parse(self.text).ok())
            .as_ref()
    }

    /// The item at a dotted key with `[n]` indices, as the file has it.
    fn item(&self, key: &str) -> Option<&toml_edit::Item> {
        let mut item = self.doc()?.as_item();
        for part in key.split('.') {
            let (name, indices) = match part.find('[') {
                Some(i) => (&part[..i], &part[i..]),
                None => (part, ""),
            };
            item = item.get(name)?;
            for index in indices
                .split(']')
                .filter_map(|s| s.strip_prefix('['))
                .filter(|s| !s.is_empty())
            {
                item = item.get(index.parse::<usize>().ok()?)?;
            }
        }
        Some(item)
    }

    /// Where the key's value (or table) is, if the file has the key.
    fn span_of(&self, key: &str) -> Option<Range<usize>> {
        let item = self.item(key)?;
        item.span().or_else(|| {
            // A table made implicitly by a dotted key has no span of its
            // own; point at its first key instead.
            item.as_table_like()?
                .iter()
                .find_map(|(k, _)| item.get(k).and_then(toml_edit::Item::span))
        })
    }

    #[cfg(test)]
    fn found_in_file(&self, key: &str) -> Option<String> {
        self.raw(self.span_of(key)?).map(shorten)
    }

    /// The text at `span`, trimmed; `None` when empty.
    fn raw(&self, span: Range<usize>) -> Option<&'a str> {
        let raw = self.text.get(span)?.trim();
        (!raw.is_empty()).then_some(raw)
    }
}

fn segment(seg: &serde_path_to_error::Segment) -> String {
    use serde_path_to_error::Segment;
    match seg {
        Segment::Seq { index } => format!("[{index}]"),
        Segment::Map { key } => key.clone(),
        Segment::Enum { variant } => variant.clone(),
        Segment::Unknown => "?".to_owned(),
    }
}

fn join(path: &[String]) -> String {
    let mut out = String::new();
    for part in path {
        if !out.is_empty() && !part.starts_with('[') {
            out.push('.');
        }
        out.push_str(part);
    }
    out
}

fn backquoted<'m>(message: &'m str, prefix: &str) -> Option<&'m str> {
    message.strip_prefix(prefix)?.split('`').next()
}

/// One line of at most [`MAX_FOUND_CHARS`] characters.
fn shorten(raw: &str) -> String {
    let line = raw.lines().next().unwrap_or("");
    let mut out: String = line.chars().take(MAX_FOUND_CHARS).collect();
    if out.len() < raw.len() {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shortens_to_one_bounded_line() {
        assert_eq!(shorten("-3"), "-3");
        assert_eq!(shorten("[1,\n2]"), "[1,…");
        assert_eq!(
            shorten(&"x".repeat(100)).chars().count(),
            MAX_FOUND_CHARS + 1
        );
    }

    #[test]
    fn finds_values_tables_and_elements() {
        let text =
            "[a]\nb = 1\nc = [\"x\", \"yy\"]\n[[r]]\nn = 1\n[[r]]\nn = 2\n[d.e]\nf = 3\ng.h = 4\n";
        let src = Source::new(Path::new("t.toml"), text);
        assert_eq!(src.found_in_file("a.b").as_deref(), Some("1"));
        assert_eq!(src.found_in_file("a.c[1]").as_deref(), Some("\"yy\""));
        assert_eq!(src.found_in_file("r[1].n").as_deref(), Some("2"));
        assert_eq!(src.found_in_file("d.e.f").as_deref(), Some("3"));
        assert_eq!(src.found_in_file("d.e.g.h").as_deref(), Some("4"));
        assert_eq!(src.found_in_file("g.h"), None);
        let at = |k: &str| src.span_of(k).map(|s| Location::of_offset(text, s.start));
        assert_eq!(at("r[1].n"), Some(Location { line: 7, column: 5 }));
        assert!(at("d.e").is_some());
        // `g` exists only through the dotted key `g.h`: located at `h`'s value.
        assert_eq!(
            at("d.e.g"),
            Some(Location {
                line: 10,
                column: 7
            })
        );
        assert_eq!(at("a.zz"), None);
    }
}

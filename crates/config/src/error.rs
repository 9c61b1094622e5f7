//! The one error type of this crate.

use std::fmt;
use std::path::{Path, PathBuf};

use airlock_proto::Code;

/// A line and column in the configuration file, both counted from 1; the
/// column counts characters, not bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    /// Line, from 1.
    pub line: usize,
    /// Column, from 1.
    pub column: usize,
}

impl Location {
    /// The location of byte `offset` in `text` (clamped to the text).
    pub fn of_offset(text: &str, offset: usize) -> Location {
        let mut offset = offset.min(text.len());
        while !text.is_char_boundary(offset) {
            offset -= 1;
        }
        let before = &text[..offset];
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        Location {
            line: before.matches('\n').count() + 1,
            column: before[line_start..].chars().count() + 1,
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// Why a configuration was refused. The message always starts with the file
/// name; for a key it goes on with `line:column` (when known), the dotted key
/// and what was expected, e.g.
/// `/etc/airlock/airlock.toml:12:13: executor.limits.processes: expected an integer in 1..=4096, found -3`.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be opened or read (missing, permission denied, …).
    Unreadable {
        /// The file.
        file: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// The file was opened but is not something airlock accepts as its
    /// configuration (not a regular file, writable by its group or others,
    /// owned by another user than root, inside a registered repository, too
    /// large, not UTF-8).
    Unacceptable {
        /// The file.
        file: PathBuf,
        /// What was expected, and what was found.
        expected: String,
    },
    /// The text is not valid TOML.
    Syntax {
        /// The file.
        file: PathBuf,
        /// Where the parser stopped, when it said.
        at: Option<Location>,
        /// The parser's message.
        message: String,
    },
    /// A key is unknown, missing, of the wrong type or out of range, or
    /// breaks a rule that ties it to another key.
    Key {
        /// The file.
        file: PathBuf,
        /// Where the key (or its table) is in the file, when it is there.
        at: Option<Location>,
        /// The dotted key, e.g. `executor.limits.processes` or `repository[1].path`.
        key: String,
        /// What was expected and what was found.
        problem: String,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file().display())?;
        let at = |f: &mut fmt::Formatter<'_>, at: &Option<Location>| match at {
            Some(at) => write!(f, ":{at}"),
            None => Ok(()),
        };
        match self {
            ConfigError::Unreadable { source, .. } => write!(
                f,
                ": cannot read the configuration file ({source}); expected a readable TOML file"
            ),
            ConfigError::Unacceptable { expected, .. } => write!(f, ": {expected}"),
            ConfigError::Syntax {
                at: loc, message, ..
            } => {
                at(f, loc)?;
                write!(f, ": not valid TOML: {message}")
            }
            ConfigError::Key {
                at: loc,
                key,
                problem,
                ..
            } => {
                at(f, loc)?;
                write!(f, ": {key}: {problem}")
            }
        }
    }
}

impl ConfigError {
    /// The catalogue code of every configuration refusal: `CONFIG_INVALID`.
    pub fn code(&self) -> Code {
        Code::CONFIG_INVALID
    }

    /// The file the error is about.
    pub fn file(&self) -> &Path {
        match self {
            ConfigError::Unreadable { file, .. }
            | ConfigError::Unacceptable { file, .. }
            | ConfigError::Syntax { file, .. }
            | ConfigError::Key { file, .. } => file,
        }
    }

    /// The dotted key the error is about, if it is about one.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Key { key, .. } => Some(key),
            _ => None,
        }
    }

    /// Where in the file, when known.
    pub fn location(&self) -> Option<Location> {
        match self {
            ConfigError::Syntax { at, .. } | ConfigError::Key { at, .. } => *at,
            _ => None,
        }
    }
}

impl From<ConfigError> for airlock_proto::Error {
    fn from(e: ConfigError) -> Self {
        airlock_proto::Error::with(e.code(), e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_count_lines_and_characters() {
        let text = "a = 1\nbé = 2\n";
        assert_eq!(
            Location::of_offset(text, 0),
            Location { line: 1, column: 1 }
        );
        assert_eq!(
            Location::of_offset(text, 6),
            Location { line: 2, column: 1 }
        );
        // "bé" is three bytes; the '=' after it is in column 4.
        let eq = text[6..].find('=').map(|i| i + 6).unwrap_or(0);
        assert_eq!(
            Location::of_offset(text, eq),
            Location { line: 2, column: 4 }
        );
        assert_eq!(
            Location::of_offset(text, 9999),
            Location { line: 3, column: 1 }
        );
    }
}

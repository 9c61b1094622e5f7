//! What a refusal may show of a value: never a secret (seed 003, two
//! layers, as `airlock_proto::redact` does for the event log).
//!
//! - **By key**: a key whose value may hold a credential ([`SECRET_BEARING`],
//!   each with why) never has its value shown, whatever is wrong with it —
//!   a refusal names the key, where it is and what was expected, and says
//!   the value is not shown. Quoted values in the message of such a
//!   refusal are replaced too ([`scrub`]).
//! - **By shape**: every other value shown runs through
//!   [`airlock_proto::redact::text`] first (a password in a URL, a bearer
//!   token, an API key's shape, `NAME_TOKEN=…`), and is shortened after, so
//!   a secret is never cut in two and half shown.
//!
//! Keys that only name where a secret is (`retry.token_file`,
//! `agent[].credential_file`) or hold none despite a word in their name
//! ([`NAMES_NO_SECRET`]) show their values: a test checks that every key
//! whose name or kind suggests a secret is in one list or the other.

use std::borrow::Cow;

/// Normalised keys (indices as `[]`) whose values may hold a credential,
/// each with why. A key covers everything beneath it (`.x`, `[]`).
pub const SECRET_BEARING: &[(&str, &str)] = &[
    (
        "supervisor.database",
        "a postgresql:// URL may carry a password (in its user part or as password=)",
    ),
    (
        "repository[].upstream.url",
        "an https URL may carry a token, an ssh or scp-like one a password",
    ),
    (
        "repository[].upstream.user",
        "a user written user:token carries the token",
    ),
    (
        "repository[].upstream.push_options",
        "a forge's push option may set a CI variable's value (ci.variable=\"TOKEN=…\")",
    ),
    (
        "repository[].environment.variables",
        "a variable's value may be a token (refused for it, and never shown)",
    ),
    (
        "repository[].environment.setup.commands",
        "an argument may carry a registry token",
    ),
    (
        "repository[].environment.setup.egress",
        "an entry may be written user:password@host:port",
    ),
    ("agent[].command", "an argument may carry an API key"),
    (
        "retry.authorization_id",
        "the owner's authorization id, which every retry request must carry (seed 003 redacts a key named authorization)",
    ),
];

/// Keys whose names or kinds suggest a secret but whose values hold none,
/// each with why.
pub const NAMES_NO_SECRET: &[(&str, &str)] = &[
    (
        "retry.token_file",
        "the path of the file holding the token, not the token",
    ),
    (
        "agent[].credential_file",
        "the path of the file holding the key, not the key",
    ),
    (
        "executor.allow_credential_paths",
        "repository paths that look like credentials (.env, *.pem), not credentials",
    ),
    (
        "supervisor.database_ca_file",
        "the path of public CA certificates",
    ),
    ("supervisor.database_allow_plaintext", "a boolean"),
];

/// What is said instead of a value that is not shown.
pub const NOT_SHOWN: &str = "a value not shown here (it may hold a credential)";

/// Whether the value at the normalised `key` may hold a credential (an
/// environment file's `environment.…` keys are its repository's).
pub fn bears_secret(key: &str) -> bool {
    let key = match key.strip_prefix("environment.") {
        Some(rest) => Cow::Owned(format!("repository[].environment.{rest}")),
        None => Cow::Borrowed(key),
    };
    SECRET_BEARING.iter().any(|(k, _)| {
        key.strip_prefix(k)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
    })
}

/// `found` as a refusal of the normalised `key` may show it.
pub fn shown<'a>(key: &str, found: &'a str) -> Cow<'a, str> {
    if bears_secret(key) {
        Cow::Borrowed(NOT_SHOWN)
    } else {
        airlock_proto::redact::text(found)
    }
}

/// A message about the normalised `key` as a refusal may show it: for a
/// secret-bearing key every double-quoted string in it (how serde, TOML
/// and airlock's own messages quote a value) is replaced; for any key
/// secret shapes are redacted.
pub fn scrub<'a>(key: &str, message: &'a str) -> Cow<'a, str> {
    if !bears_secret(key) {
        return airlock_proto::redact::text(message);
    }
    Cow::Owned(airlock_proto::redact::text(&without_quoted(message)).into_owned())
}

/// `text` with each `"…"` (backslash escapes honoured) replaced by `"…"`
/// holding nothing.
pub fn without_quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        out.push(c);
        if c != '"' {
            continue;
        }
        let mut closed = false;
        while let Some(q) = chars.next() {
            match q {
                '\\' => {
                    chars.next();
                }
                '"' => {
                    closed = true;
                    break;
                }
                _ => {}
            }
        }
        out.push_str("(not shown)");
        if closed {
            out.push('"');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_covers_what_is_beneath_it() {
        assert!(bears_secret("supervisor.database"));
        assert!(!bears_secret("supervisor.database_ca_file"));
        assert!(bears_secret("repository[].upstream.push_options[]"));
        assert!(bears_secret("repository[].environment.variables.NPM_TOKEN"));
        assert!(bears_secret("agent[].command[]"));
        assert!(!bears_secret("agent[].commands"));
        assert!(!bears_secret("repository[].upstream"));
        assert!(bears_secret("environment.setup.egress[0]"));
        assert!(!bears_secret("environment.paths[0]"));
    }

    #[test]
    fn quoted_values_go_and_shapes_are_redacted() {
        assert_eq!(
            without_quoted(r#"invalid type: string "a\"b", expected a map"#),
            r#"invalid type: string "(not shown)", expected a map"#
        );
        assert_eq!(without_quoted(r#"cut "open"#), r#"cut "(not shown)"#);
        assert_eq!(
            scrub("agent[].command[1]", r#"found "--key=sk-abc""#),
            r#"found "(not shown)""#
        );
        let url = "https://user:hunter2secret@example.invalid/x";
        assert!(!shown("repository[].description", url).contains("hunter2secret"));
        assert!(!scrub("repository[].description", url).contains("hunter2secret"));
        assert_eq!(shown("supervisor.database", "anything"), NOT_SHOWN);
    }
}

//! Redaction: secrets never reach the event log, the task database, the
//! journal or airlockctl's output.
//!
//! Every writer runs what it keeps through [`Redactor`] first: the event
//! log's one insert, the reasons and results the task database stores, the
//! denial details the supervisor logs, a verification command's output
//! tails (redacted by the executor as it builds the command's evidence,
//! with the literal values of the command's own environment, before the
//! result is hashed and published; again by the worker for the result it
//! reports).
//! Two layers, as in seed 003:
//!
//! - **keys**: in a JSON object, the value of a key that names a secret
//!   (token, secret, password, passwd, api key, authorization, cookie,
//!   credential, private key, session) is replaced whole;
//! - **shapes**: inside any string, these are replaced, each by
//!   `[REDACTED:<kind>]`: bearer and basic credentials, AWS access keys,
//!   GitHub and GitLab tokens, Slack tokens, JWTs, PEM private key blocks,
//!   passwords in URLs, `sk-` API keys, assignments whose name says secret
//!   (`API_TOKEN=…`), generic high-entropy assignments, and literal secrets
//!   the process holds (a service's own control token).
//!
//! Nesting deeper than [`MAX_DEPTH`] is replaced whole, so the function
//! fails closed; it never panics on odd input. What was redacted is
//! recorded by the marker itself — `[REDACTED:aws-access-key]` says a key
//! was there, never what it was.

use regex::Regex;
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::sync::LazyLock;

/// The marker a redacted value or span is replaced with (plus `:<kind>`
/// inside strings).
pub const REDACTED: &str = "[REDACTED]";
/// Deeper JSON than this is replaced whole.
pub const MAX_DEPTH: usize = 16;

/// Keys whose values are secrets whatever they hold.
static SECRET_KEY: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)(token|secret|passw(or)?d|api[_-]?key|authorization|cookie|credential|private[_-]?key|session[_-]?id)",
    )
    .expect("a valid pattern")
});

/// Secret shapes inside strings, most specific first, each with its kind.
static SHAPES: LazyLock<Vec<(&'static str, Regex)>> = LazyLock::new(|| {
    [
        (
            "private-key",
            r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----(?s:.*?)(-----END [A-Z0-9 ]*PRIVATE KEY-----|\z)",
        ),
        ("jwt", r"\beyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}"),
        ("aws-access-key", r"\b(AKIA|ASIA|AGPA|AIDA|AROA)[0-9A-Z]{16}\b"),
        ("github-token", r"\b(gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})"),
        ("gitlab-token", r"\bglpat-[A-Za-z0-9_-]{20,}"),
        ("slack-token", r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),
        ("api-key", r"\bsk-(proj-|ant-)?[A-Za-z0-9_-]{20,}"),
        ("http-credential", r"(?i)\b(bearer|basic|token)\s+[A-Za-z0-9._~+/=-]{8,}"),
        ("url-password", r"(?i)\b([a-z][a-z0-9+.-]*://[^/\s:@]+):[^@\s/]+@"),
        (
            "secret-assignment",
            r#"(?i)\b([A-Z0-9_.-]*(token|secret|passw(or)?d|api[_-]?key|private[_-]?key|credential)[A-Z0-9_.-]*)(["']?\s*[:=]\s*["']?)[^\s"',;]{4,}"#,
        ),
    ]
    .into_iter()
    .map(|(kind, p)| (kind, Regex::new(p).expect("a valid pattern")))
    .collect()
});

/// `NAME=value` with a long value, judged by its entropy.
static ASSIGNMENT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r#"\b([A-Za-z_][A-Za-z0-9_.-]{1,63})(["']?\s*[:=]\s*["']?)([A-Za-z0-9+/=_.~-]{20,})"#,
    )
    .expect("a valid pattern")
});

/// Bits per character above which a 20+ character assigned value is taken
/// for a generated secret (hex digests sit below it at exactly 4.0 only when
/// every digit occurs evenly, so they are exempted by alphabet instead).
const ENTROPY_BITS: f64 = 4.0;

fn entropy(s: &str) -> f64 {
    let mut counts = [0u32; 256];
    for b in s.bytes() {
        counts[b as usize] += 1;
    }
    let n = s.len() as f64;
    counts
        .iter()
        .filter(|c| **c > 0)
        .map(|c| {
            let p = f64::from(*c) / n;
            -p * p.log2()
        })
        .sum()
}

/// A value that looks generated: long, mixed, high entropy, and not a plain
/// hex digest or a git object id (which airlock shows on purpose).
fn looks_generated(v: &str) -> bool {
    let hex = v.bytes().all(|b| b.is_ascii_hexdigit());
    let has_upper = v.bytes().any(|b| b.is_ascii_uppercase());
    let has_lower = v.bytes().any(|b| b.is_ascii_lowercase());
    let has_digit = v.bytes().any(|b| b.is_ascii_digit());
    !hex && has_digit && (has_upper || has_lower) && entropy(v) >= ENTROPY_BITS
}

/// Redacts what this process holds as literal secrets, and every shape.
#[derive(Clone, Debug, Default)]
pub struct Redactor {
    literals: Vec<String>,
}

impl Redactor {
    /// Shapes and keys only.
    pub fn new() -> Self {
        Redactor::default()
    }

    /// Also replaces `secret` wherever it appears (8 characters or more;
    /// shorter strings would redact ordinary words).
    pub fn with_literal(mut self, secret: &str) -> Self {
        if secret.len() >= 8 {
            self.literals.push(secret.to_owned());
        }
        self
    }

    /// `text` with every secret shape replaced.
    pub fn text<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(text);
        for lit in &self.literals {
            if out.contains(lit.as_str()) {
                out = Cow::Owned(out.replace(lit.as_str(), "[REDACTED:literal]"));
            }
        }
        for (kind, re) in SHAPES.iter() {
            if re.is_match(&out) {
                let marker = format!("[REDACTED:{kind}]");
                let replaced = match *kind {
                    // Keep the scheme and user, drop the password.
                    "url-password" => re.replace_all(&out, format!("$1:{marker}@").as_str()),
                    // Keep the name and the operator, drop the value —
                    // unless the name is a digest's or a file's.
                    "secret-assignment" => re.replace_all(&out, |c: &regex::Captures<'_>| {
                        if is_digest_key(&c[1]) {
                            c[0].to_owned()
                        } else {
                            format!("{}{}{marker}", &c[1], &c[4])
                        }
                    }),
                    _ => re.replace_all(&out, marker.as_str()),
                };
                out = Cow::Owned(replaced.into_owned());
            }
        }
        if ASSIGNMENT.is_match(&out) {
            let replaced = ASSIGNMENT.replace_all(&out, |c: &regex::Captures<'_>| {
                if looks_generated(&c[3]) {
                    format!("{}{}[REDACTED:high-entropy]", &c[1], &c[2])
                } else {
                    c[0].to_owned()
                }
            });
            if let Cow::Owned(s) = replaced {
                out = Cow::Owned(s);
            }
        }
        out
    }

    /// `value` with secret keys' values and secret shapes replaced; deeper
    /// than [`MAX_DEPTH`] is replaced whole.
    pub fn value(&self, value: &Value) -> Value {
        self.value_at(value, 0)
    }

    fn value_at(&self, value: &Value, depth: usize) -> Value {
        if depth >= MAX_DEPTH {
            return Value::String(format!("{REDACTED}:too-deep"));
        }
        match value {
            Value::String(s) => Value::String(self.text(s).into_owned()),
            Value::Array(items) => {
                Value::Array(items.iter().map(|v| self.value_at(v, depth + 1)).collect())
            }
            Value::Object(map) => {
                let mut out = Map::with_capacity(map.len());
                for (k, v) in map {
                    let v = if SECRET_KEY.is_match(k) && !v.is_null() && !is_digest_key(k) {
                        Value::String(format!("{REDACTED}:key"))
                    } else {
                        self.value_at(v, depth + 1)
                    };
                    out.insert(self.text(k).into_owned(), v);
                }
                Value::Object(out)
            }
            other => other.clone(),
        }
    }
}

/// Keys airlock uses for digests, ids and references to secrets, never for
/// the secrets themselves (a token's hash, a token file's path, the owner's
/// `authorization_id`, which is a name and is recorded on purpose).
fn is_digest_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    ["_sha256", "_hash", "_file", "_path", "_id"]
        .iter()
        .any(|suffix| k.ends_with(suffix))
}

/// [`Redactor::text`] with shapes only.
pub fn text(text: &str) -> Cow<'_, str> {
    static PLAIN: LazyLock<Redactor> = LazyLock::new(Redactor::new);
    PLAIN.text(text)
}

/// [`Redactor::value`] with shapes and keys only.
pub fn value(value: &Value) -> Value {
    Redactor::new().value(value)
}

/// For tests of every writer (here and in the services): real-looking
/// secrets of every shape the module promises, each with
/// the kind its marker must name (the secret is the last 12 characters
/// of each, but for the URL, whose password is `hunter2hunter2`). Built
/// at run time, so this file does not itself trip secret scanners.
pub fn planted() -> Vec<(&'static str, String)> {
    let r = |c: char, n: usize| c.to_string().repeat(n);
    vec![
        (
            "http-credential",
            format!("Authorization: Bearer {}x9Q{}", r('a', 12), r('Z', 10)),
        ),
        (
            "http-credential",
            format!(
                "curl -H 'Authorization: Basic {}=='",
                "dXNlcjpwYXNzd29yZDEyMw"
            ),
        ),
        ("aws-access-key", format!("AKIA{}", "IOSFODNN7EXAMPLE")),
        (
            "github-token",
            format!("ghp_{}", "1a2B3c4D5e6F7g8H9i0JkLmNoPqRsTuV"),
        ),
        ("gitlab-token", format!("glpat-{}", "xYz12AbC34dEf56GhI78")),
        (
            "slack-token",
            format!("xoxb-{}", "123456789012-abcdefABCDEF12"),
        ),
        (
            "jwt",
            format!(
                "eyJ{}.eyJ{}.{}",
                "hbGciOiJIUzI1NiJ9",
                "zdWIiOiIxMjM0NTY3ODkwIn0",
                "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
            ),
        ),
        (
            "private-key",
            format!(
                "-----BEGIN RSA PRIVATE KEY-----\nMIIEow{}\n-----END RSA PRIVATE KEY-----",
                "IBAAKCAQEA7bq98s"
            ),
        ),
        (
            "url-password",
            format!("https://deploy:{}@git.example.com/r.git", "hunter2hunter2"),
        ),
        (
            "api-key",
            format!("sk-{}", "proj-AbCdEfGh1234567890IjKlMnOp"),
        ),
        (
            "secret-assignment",
            format!("DATABASE_PASSWORD={}", "correct-horse-battery"),
        ),
        (
            "high-entropy",
            format!("SIGNING_SEED={}", "Zq8vN3kP0wR7tY2uB5xM9cL4jH6gF1dS"),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_planted_shape_is_replaced_and_named() {
        for (kind, secret) in super::planted() {
            let line = format!("before {secret} after");
            let out = text(&line);
            assert!(out.contains(&format!("[REDACTED:{kind}]")), "{kind}: {out}");
            assert!(
                out.starts_with("before ") && out.ends_with(" after"),
                "{kind}: {out}"
            );
            // The secret part is gone: no 8-character run of it survives.
            let core: String = if kind == "url-password" {
                "hunter2hunter2".to_owned()
            } else {
                secret
                    .chars()
                    .rev()
                    .take(12)
                    .collect::<String>()
                    .chars()
                    .rev()
                    .collect()
            };
            assert!(!out.contains(&core), "{kind}: {core:?} survived in {out}");
        }
    }

    #[test]
    fn ordinary_evidence_is_left_alone() {
        for s in [
            "commit 9f2c1e0b7d4a3f5e6c8b1a2d3e4f5a6b7c8d9e0f on agent/task-1",
            "execution_digest=2bad36643ca03fc31ee925cdaecb970256f912fa54c2f9a4787df58cab828d64",
            "FAIL: test_add (test_calc.CalcTest) AssertionError: 1 != 3",
            "python3 -m unittest -v",
            "token_file = /etc/airlock/retry-control.token",
        ] {
            assert_eq!(text(s), s);
        }
    }

    #[test]
    fn keys_naming_secrets_lose_their_values_but_digests_stay() {
        let v = value(&json!({
            "password": "hunter2", "api_key": 42, "Authorization": "x",
            "result_sha256": "ab".repeat(32), "nested": {"cookie": ["a"]}, "plain": "ok",
            "authorization_id": "owner-scheme-a",
        }));
        assert_eq!(v["authorization_id"], "owner-scheme-a");
        assert_eq!(v["password"], "[REDACTED]:key");
        assert_eq!(v["api_key"], "[REDACTED]:key");
        assert_eq!(v["Authorization"], "[REDACTED]:key");
        assert_eq!(v["nested"]["cookie"], "[REDACTED]:key");
        assert_eq!(v["result_sha256"], "ab".repeat(32));
        assert_eq!(v["plain"], "ok");
    }

    #[test]
    fn too_deep_fails_closed() {
        let mut v = json!("AKIAIOSFODNN7EXAMPLE");
        for _ in 0..40 {
            v = json!([v]);
        }
        let out = value(&v).to_string();
        assert!(out.contains("too-deep") && !out.contains("AKIA"), "{out}");
    }

    #[test]
    fn literal_secrets_are_replaced_and_redaction_is_idempotent() {
        let token = "k".repeat(48);
        let r = Redactor::new().with_literal(&token);
        let once = r.text(&format!("GET /v1/{token}/x")).into_owned();
        assert_eq!(once, "GET /v1/[REDACTED:literal]/x");
        assert_eq!(r.text(&once), once);
        for (_, secret) in super::planted() {
            let once = text(&secret).into_owned();
            assert_eq!(text(&once), once, "redacting twice changes {once}");
        }
    }
}

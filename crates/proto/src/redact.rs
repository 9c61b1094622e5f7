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
//!
//! **Known values** are what airlock itself made for the task at hand —
//! its id and branch (and that branch's ref), the request's id, the
//! digests and object ids it computed, the setup forwarder's URL: not
//! secrets, and shown on purpose. A writer that knows them says so
//! ([`Redactor::with_known`], [`Redactor::with_task`],
//! [`Redactor::with_result`]); a redaction is then not made when what it
//! would replace, with every occurrence of a known value taken out of it,
//! no longer calls for it (no longer has the shape, or is empty of the
//! literal). A secret beside or around a known value is still replaced —
//! the known value with it, where they touch.
//!
//! ```
//! use airlock_proto::redact::Redactor;
//! let task = "p-0a1b2c3d4e5f6071";
//! let r = Redactor::new().with_task(task, "agent/p-0a1b2c3d4e5f6071");
//! let answer = format!("*\tf00dcafe:refs/heads/agent/{task}\t[new branch]");
//! assert_eq!(r.text(&answer), answer);
//! let leak = format!("{task}=Zq8vN3kP0wR7tY2uB5xM9cL4jH6gF1dS");
//! assert_eq!(r.text(&leak), format!("{task}=[REDACTED:high-entropy]"));
//! ```

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

/// Redacts what this process holds as literal secrets, and every shape;
/// never the known values it was given (module doc).
#[derive(Clone, Debug, Default)]
pub struct Redactor {
    literals: Vec<String>,
    known: Vec<String>,
}

/// Which bytes of a text belong to an occurrence of a known value.
struct Coverage {
    /// One flag per byte; empty when no known value occurs.
    mask: Vec<bool>,
}

impl Coverage {
    fn of(text: &str, known: &[String]) -> Coverage {
        let mut mask = Vec::new();
        for k in known {
            for (at, _) in text.match_indices(k.as_str()) {
                if mask.is_empty() {
                    mask = vec![false; text.len()];
                }
                mask[at..at + k.len()].fill(true);
            }
        }
        Coverage { mask }
    }

    /// Whether every byte of `text[start..end]` is a known value's.
    fn covers(&self, start: usize, end: usize) -> bool {
        !self.mask.is_empty() && start < end && self.mask[start..end].iter().all(|k| *k)
    }

    /// `text[start..end]` without the bytes of known values (whole
    /// characters: a known value is a string, so it starts and ends on
    /// character boundaries).
    fn strip<'t>(&self, text: &'t str, start: usize, end: usize) -> Cow<'t, str> {
        let span = &text[start..end];
        if self.mask.is_empty() || !self.mask[start..end].iter().any(|k| *k) {
            return Cow::Borrowed(span);
        }
        let kept: Vec<u8> = span
            .bytes()
            .zip(&self.mask[start..end])
            .filter(|(_, known)| !**known)
            .map(|(b, _)| b)
            .collect();
        Cow::Owned(String::from_utf8_lossy(&kept).into_owned())
    }
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

    /// Never redacts `value` (a value airlock made itself: module doc).
    /// An empty value is ignored.
    pub fn with_known(mut self, value: &str) -> Self {
        if !value.is_empty() && !self.known.iter().any(|k| k == value) {
            self.known.push(value.to_owned());
        }
        self
    }

    /// [`Redactor::with_known`] for each of `values`.
    pub fn with_known_all<I, S>(self, values: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        values
            .into_iter()
            .fold(self, |r, v| r.with_known(v.as_ref()))
    }

    /// The task's id and its branch, with that branch's ref
    /// (`refs/heads/…`), as known values.
    pub fn with_task(self, task_id: &str, target_branch: &str) -> Self {
        self.with_known(task_id)
            .with_known(target_branch)
            .with_known(&format!("refs/heads/{target_branch}"))
    }

    /// What a binding names that airlock made or checked (the task and
    /// job ids, the branch and its ref, the commits), and the envelope's
    /// digest, as known values. Never the idempotency key: a caller
    /// chooses it freely.
    pub fn with_binding(self, b: &crate::binding::Binding, execution_digest: &str) -> Self {
        self.with_known_all(binding_values(b, execution_digest))
    }

    /// What `result` names that airlock made (the task, its branch, the
    /// digests and commits, the published ref), as known values: the
    /// redactor of a stored result.
    pub fn with_result(self, r: &crate::task::TaskResult) -> Self {
        let publication = r.publication.as_ref();
        self.with_task(&r.task_id, &r.target_branch)
            .with_known(&r.execution_digest)
            .with_known_all(r.commit_oid.iter())
            .with_known_all(r.exec_result_sha256.iter())
            .with_known_all(publication.map(|p| p.remote_ref.as_str()))
            .with_known_all(publication.map(|p| p.commit_oid.as_str()))
            .with_known_all(r.signature.as_ref().map(|s| s.fingerprint.as_str()))
    }

    /// `text` with every secret shape replaced, known values spared.
    pub fn text<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(text);
        for lit in &self.literals {
            if out.contains(lit.as_str()) {
                // Spared only where it lies wholly inside a known value.
                let known = Coverage::of(&out, &self.known);
                if let Some(replaced) = replace_literal(&out, lit, &known) {
                    out = Cow::Owned(replaced);
                }
            }
        }
        for (kind, re) in SHAPES.iter() {
            if re.is_match(&out) {
                let known = Coverage::of(&out, &self.known);
                let marker = format!("[REDACTED:{kind}]");
                let replaced = re.replace_all(&out, |c: &regex::Captures<'_>| {
                    let whole = c.get(0).expect("a match");
                    // Without the known values in it, no longer a secret's shape.
                    if !re.is_match(&known.strip(&out, whole.start(), whole.end())) {
                        return c[0].to_owned();
                    }
                    match *kind {
                        // Keep the scheme and user, drop the password.
                        "url-password" => format!("{}:{marker}@", &c[1]),
                        // Keep the name and the operator, drop the value —
                        // unless the name is a digest's or a file's.
                        "secret-assignment" if is_digest_key(&c[1]) => c[0].to_owned(),
                        "secret-assignment" => format!("{}{}{marker}", &c[1], &c[4]),
                        _ => marker.clone(),
                    }
                });
                out = Cow::Owned(replaced.into_owned());
            }
        }
        if ASSIGNMENT.is_match(&out) {
            let known = Coverage::of(&out, &self.known);
            let replaced = ASSIGNMENT.replace_all(&out, |c: &regex::Captures<'_>| {
                let value = c.get(3).expect("a value");
                // Judged without the known values in it.
                let rest = known.strip(&out, value.start(), value.end());
                if rest.len() >= 20 && looks_generated(&rest) {
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

/// What [`Redactor::with_binding`] knows: the task and job ids, the
/// branch and its ref, the base and expected commits, and
/// `execution_digest`.
pub fn binding_values(b: &crate::binding::Binding, execution_digest: &str) -> Vec<String> {
    vec![
        b.task_id.clone(),
        b.job_id.clone(),
        b.target_branch.clone(),
        format!("refs/heads/{}", b.target_branch),
        b.base_oid.clone(),
        b.expected_branch_oid.clone(),
        execution_digest.to_owned(),
    ]
}

/// `text` with each occurrence of `lit` replaced, but those lying wholly
/// inside a known value; None when none is replaced.
fn replace_literal(text: &str, lit: &str, known: &Coverage) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for (at, _) in text.match_indices(lit) {
        if known.covers(at, at + lit.len()) {
            continue;
        }
        out.push_str(&text[last..at]);
        out.push_str("[REDACTED:literal]");
        last = at + lit.len();
    }
    (last > 0).then(|| {
        out.push_str(&text[last..]);
        out
    })
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

    /// Issue 41 item 6: a publication's answer lost its task id, and a
    /// setup's tails the forwarder's URL (a literal of its environment).
    #[test]
    fn known_values_are_never_redacted() {
        let task = "p-0a1b2c3d4e5f6071";
        let branch = format!("agent/{task}");
        let answer = format!(
            "*\ta0664778208f3b4c576dd042e260e3ab2749c5ed:refs/heads/{branch}\t[new branch]"
        );
        // The control: without knowing them, the redactor eats the ref.
        assert!(
            text(&answer).contains("[REDACTED:high-entropy]"),
            "{}",
            text(&answer)
        );
        let r = Redactor::new().with_task(task, &branch);
        assert_eq!(r.text(&answer), answer);
        // The task id alone spares its ref too (what is left is no secret).
        assert_eq!(Redactor::new().with_known(task).text(&answer), answer);
        let proxy = "http://127.0.0.1:3128";
        let line = format!("Using proxy {proxy} for {task}");
        let env = Redactor::new().with_literal(proxy);
        assert_eq!(
            env.text(&line),
            format!("Using proxy [REDACTED:literal] for {task}")
        );
        assert_eq!(env.clone().with_known(proxy).text(&line), line);
        // In JSON too, and the result's own values are known for it.
        let v = r.value(&json!({"publication": {"answer": answer}}));
        assert_eq!(v["publication"]["answer"], answer);
    }

    #[test]
    fn a_secret_beside_or_around_a_known_value_is_still_redacted() {
        let task = "p-0a1b2c3d4e5f6071";
        let proxy = "http://127.0.0.1:3128";
        let r = Redactor::new()
            .with_task(task, &format!("agent/{task}"))
            .with_known(proxy)
            .with_literal(&format!("{proxy}/private-mirror-key"))
            .with_literal("k".repeat(24).as_str());
        for (kind, secret) in super::planted() {
            let line = format!("{task} {secret} refs/heads/agent/{task} {proxy}");
            let out = r.text(&line);
            assert!(out.contains(&format!("[REDACTED:{kind}]")), "{kind}: {out}");
            assert!(
                out.starts_with(&format!("{task} "))
                    && out.ends_with(&format!("agent/{task} {proxy}")),
                "{kind}: {out}"
            );
        }
        let seed = "Zq8vN3kP0wR7tY2uB5xM9cL4jH6gF1dS";
        for (line, kept) in [
            // A known name does not spare its value.
            (
                format!("{task}={seed}"),
                format!("{task}=[REDACTED:high-entropy]"),
            ),
            (
                format!("DEPLOY_TOKEN_{task}=hunter2hunter2"),
                format!("DEPLOY_TOKEN_{task}=[REDACTED:secret-assignment]"),
            ),
            // Nor does a known value inside the secret.
            (
                format!("SEED={task}{seed}"),
                "SEED=[REDACTED:high-entropy]".to_owned(),
            ),
            (
                format!("Bearer {task}{seed}"),
                "[REDACTED:http-credential]".to_owned(),
            ),
            // A literal holding a known value, and one beside it.
            (
                format!("{proxy}/private-mirror-key"),
                "[REDACTED:literal]".to_owned(),
            ),
            (
                format!("{task}{}", "k".repeat(24)),
                format!("{task}[REDACTED:literal]"),
            ),
        ] {
            assert_eq!(r.text(&line), kept);
            assert_eq!(r.text(&kept), kept, "idempotent");
        }
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

//! A configuration refusal never shows a secret (seed 003: redact by key,
//! then by shape). Each key that may hold a credential is given a planted
//! secret in every wrong form that reaches a different refusal — a wrong
//! type (the parser's shape error), a wrong value (airlock's own check) —
//! and the refusal must name the key and what it expected, and never
//! contain the secret. A key that holds none has a secret shape in it
//! redacted. Which keys may hold a credential is a reviewed list
//! (`airlock_config::SECRET_BEARING`); a test below fails when a key whose
//! name or kind suggests one is in neither that list nor the list of keys
//! that only name where a secret is.

use airlock_config::{
    Config, ENVIRONMENT_KEYS, KEYS, Kind, NAMES_NO_SECRET, NOT_SHOWN, bears_secret,
};
use std::path::Path;

/// What no refusal may contain.
const SECRET: &str = "pl4nted-S3CRET-value-7f3a";

fn refusal(text: &str) -> String {
    match Config::parse(text, Path::new("/etc/airlock/airlock.toml")) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e.to_string(),
    }
}

const REPO: &str = "[[repository]]\nname = \"r\"\npath = \"/srv/git/r.git\"\n";

/// `(what, the file, the key the refusal must name)`.
fn cases() -> Vec<(&'static str, String, &'static str)> {
    let s = SECRET;
    let upstream = |line: String| format!("{REPO}[repository.upstream]\n{line}\n");
    let upstream_url =
        |line: String| format!("{REPO}[repository.upstream]\nurl = \"/srv/git/up.git\"\n{line}\n");
    let setup = |line: String| {
        format!(
            "{REPO}[repository.environment.setup]\ncommands = [[\"/usr/bin/npm\", \"ci\"]]\ninputs = [\"package.json\"]\noutputs = [\"node_modules\"]\n{line}\n"
        )
    };
    let agent =
        |line: String| format!("{REPO}[[agent]]\nname = \"a\"\nrepositories = [\"r\"]\n{line}\n");
    vec![
        (
            "a PostgreSQL URL with a password",
            format!("[supervisor]\ndatabase = \"postgresql://airlock:{s}@db.example/airlock\"\n"),
            "supervisor.database",
        ),
        (
            "a password without ://",
            format!("[supervisor]\ndatabase = \"postgresql:airlock:{s}@db.example\"\n"),
            "supervisor.database",
        ),
        (
            "a password as a query parameter",
            format!(
                "[supervisor]\ndatabase = \"postgresql://airlock@db.example/a?password={s}\"\n"
            ),
            "supervisor.database",
        ),
        (
            "a URL of the wrong type",
            format!("[supervisor]\ndatabase = [\"postgresql://airlock:{s}@db.example/a\"]\n"),
            "supervisor.database",
        ),
        (
            "a token in an https URL",
            upstream(format!("url = \"https://{s}@git.example/r.git\"")),
            "repository[0].upstream.url",
        ),
        (
            "a token in an scp-like URL",
            upstream(format!("url = \"oauth2:{s}@git.example:group/r.git\"")),
            "repository[0].upstream.url",
        ),
        (
            "a password in an ssh URL",
            upstream(format!("url = \"ssh://git:{s}@git.example/r.git\"")),
            "repository[0].upstream.url",
        ),
        (
            "a URL of the wrong type",
            upstream(format!("url = [\"https://git:{s}@git.example/r.git\"]")),
            "repository[0].upstream.url",
        ),
        (
            "a user written user:token",
            upstream_url(format!("user = \"git:{s}\"")),
            "repository[0].upstream.user",
        ),
        (
            "a user of the wrong type",
            upstream_url(format!("user = [\"{s}\"]")),
            "repository[0].upstream.user",
        ),
        (
            "a push option carrying a CI variable, refused for its line break",
            upstream_url(format!(
                "push_options = [\"ci.variable=DEPLOY_TOKEN={s}\\n\"]"
            )),
            "repository[0].upstream.push_options[0]",
        ),
        (
            "push options of the wrong type",
            upstream_url(format!("push_options = \"ci.variable=TOKEN={s}\"")),
            "repository[0].upstream.push_options",
        ),
        (
            "a variable that is a secret",
            format!("{REPO}[repository.environment.variables]\nNPM_TOKEN = \"{s}\"\n"),
            "repository[0].environment.variables.NPM_TOKEN",
        ),
        (
            "a variable of the wrong type",
            format!("{REPO}[repository.environment.variables]\nREGISTRY = [\"{s}\"]\n"),
            "repository[0].environment.variables.REGISTRY",
        ),
        (
            "variables of the wrong type",
            format!("{REPO}[repository.environment]\nvariables = \"NPM_TOKEN={s}\"\n"),
            "repository[0].environment.variables",
        ),
        (
            "a setup command of the wrong type",
            setup(format!("commands = [\"/usr/bin/npm\", \"--token={s}\"]")).replacen(
                "commands = [[\"/usr/bin/npm\", \"ci\"]]\n",
                "",
                1,
            ),
            "repository[0].environment.setup.commands[0]",
        ),
        (
            "an egress entry with a password",
            setup(format!("egress = [\"proxy:{s}@registry.example:443\"]")),
            "repository[0].environment.setup.egress[0]",
        ),
        (
            "an agent argument with a key, refused for its control character",
            agent(format!(
                "command = [\"/usr/bin/planner\", \"--api-key={s}\\u0007\"]"
            )),
            "agent[0].command[1]",
        ),
        (
            "an agent command line as a string",
            agent(format!("command = \"/usr/bin/planner --api-key={s}\"")),
            "agent[0].command",
        ),
        (
            "an authorization id refused for its form",
            format!("[retry]\nauthorization_id = \"not an id {s}\"\n"),
            "retry.authorization_id",
        ),
        (
            "a description holding a URL with a password (a secret shape in a key that holds none)",
            format!("{REPO}description = \"see https://deploy:{s}@git.example/r \\u0007\"\n"),
            "repository[0].description",
        ),
    ]
}

#[test]
fn no_refusal_shows_a_planted_secret() {
    let mut leaked = Vec::new();
    for (what, text, key) in cases() {
        let message = refusal(&text);
        assert!(
            message.contains(&format!(": {key}:")),
            "{what}: the refusal names {key}: {message}"
        );
        if message.contains(SECRET) {
            leaked.push(format!("{what} ({key}): {message}"));
        }
    }
    assert!(
        leaked.is_empty(),
        "refusals that show the secret:\n{}",
        leaked.join("\n")
    );
    println!(
        "{} refusals of secret-bearing keys: none shows the secret",
        cases().len()
    );
}

#[test]
fn a_refusal_of_a_secret_bearing_key_still_says_what_was_expected() {
    let message = refusal(&format!(
        "[supervisor]\ndatabase = \"postgresql:airlock:{SECRET}@db.example\"\n"
    ));
    assert!(
        message.contains("expected") && message.contains(NOT_SHOWN),
        "{message}"
    );
    // A key that holds no secret still shows what it found.
    let message = refusal("[supervisor]\nlease_seconds = 3\n");
    assert!(message.contains("found 3"), "{message}");
}

/// The names the seed's key layer redacts (seed 003, D-42).
fn sounds_secret(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    [
        "token",
        "secret",
        "password",
        "passwd",
        "apikey",
        "api_key",
        "api-key",
        "authorization",
        "cookie",
        "credential",
        "private_key",
        "private-key",
    ]
    .iter()
    .any(|w| k.contains(w))
}

#[test]
fn every_key_that_may_hold_a_credential_is_judged() {
    let mut unjudged = Vec::new();
    let keys = KEYS
        .iter()
        .map(|s| (s.key, Some(s.kind)))
        .chain(ENVIRONMENT_KEYS.iter().map(|e| (e.key, None)));
    for (key, kind) in keys {
        let suggests = sounds_secret(key)
            || matches!(
                kind,
                Some(Kind::Database | Kind::UpstreamUrl | Kind::Argv { .. })
            )
            || matches!(
                key.rsplit('.').next(),
                Some("variables" | "commands" | "push_options" | "egress")
            );
        let judged = bears_secret(key) || NAMES_NO_SECRET.iter().any(|(k, _)| *k == key);
        if suggests && !judged {
            unjudged.push(key);
        }
    }
    assert!(
        unjudged.is_empty(),
        "keys that may hold a credential, in neither airlock_config::SECRET_BEARING nor NAMES_NO_SECRET (crates/config/src/secret.rs): {unjudged:?}"
    );
    for (key, _) in NAMES_NO_SECRET {
        assert!(
            KEYS.iter().any(|s| s.key == *key),
            "{key} is not a key any more"
        );
    }
}

//! One way to run git in production: no shipped crate but this one starts
//! git itself, and none builds an `--upload-pack` string or hands a
//! command line to a shell. A check over the sources of every crate and
//! service (their `src/`, which is what ships; tests and benchmarks may
//! drive git directly).

use std::path::{Path, PathBuf};

/// What must not appear, and why.
const FORBIDDEN: &[(&str, &str)] = &[
    ("Command::new(\"git\")", "run git through airlock_git::Git"),
    (
        "Command::new(\"/usr/bin/git\")",
        "run git through airlock_git::Git",
    ),
    (
        "Command::new(\"/usr/local/bin/git\")",
        "run git through airlock_git::Git",
    ),
    (
        "\"--upload-pack\")",
        "git runs --upload-pack through a shell",
    ),
    (
        "\"--upload-pack\"]",
        "git runs --upload-pack through a shell",
    ),
    (
        "format!(\"--upload-pack",
        "git runs --upload-pack through a shell",
    ),
    (
        "uploadpack={",
        "git runs a remote's uploadpack through a shell",
    ),
    ("safe.directory=*", "trust one repository, never every one"),
    (
        "Command::new(\"sh\")",
        "no command line is handed to a shell",
    ),
    (
        "Command::new(\"/bin/sh\")",
        "no command line is handed to a shell",
    ),
    (
        "Command::new(\"bash\")",
        "no command line is handed to a shell",
    ),
    (
        "Command::new(\"/bin/bash\")",
        "no command line is handed to a shell",
    ),
];

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_production_crate_runs_git_or_a_shell_outside_crates_git() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = Vec::new();
    for group in ["crates", "services"] {
        for member in std::fs::read_dir(workspace.join(group)).unwrap() {
            let member = member.unwrap().path();
            let name = member.file_name().unwrap().to_string_lossy().into_owned();
            // This crate is the one way; pgcluster is a test fixture
            // (PostgreSQL's throwaway clusters), linked by no shipped binary
            // (services/executor/tests/closure.rs checks that); the test
            // kit lives under tests/, outside this walk.
            if (group == "crates" && matches!(name.as_str(), "git" | "pgcluster"))
                || !member.join("src").is_dir()
            {
                continue;
            }
            sources(&member.join("src"), &mut files);
        }
    }
    assert!(files.len() > 50, "found only {} source files", files.len());
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            for (pattern, why) in FORBIDDEN {
                if line.contains(pattern) {
                    found.push(format!("{}:{}: {pattern} ({why})", file.display(), n + 1));
                }
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn the_check_finds_what_it_looks_for() {
    // The patterns match the code they forbid, as rustfmt writes it.
    let sample = "let out = Command::new(\"git\")\n    .args([\"clone\", \"--upload-pack\"])";
    let hits: Vec<_> = FORBIDDEN
        .iter()
        .filter(|(p, _)| sample.contains(p))
        .collect();
    assert_eq!(hits.len(), 2, "{hits:?}");
}

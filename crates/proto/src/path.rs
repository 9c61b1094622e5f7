//! Relative paths inside a repository, as planners and archives name them.

use crate::error::{Code, Error, Result};
use crate::limits::{MAX_PATH_COMPONENT_LEN, MAX_PATH_LEN};

/// Validates a repository-relative path: non-empty, relative, no `.`, `..`,
/// `.git` or empty components, no NUL or control characters, bounded.
/// Returns it unchanged; no normalisation is ever applied.
pub fn check_relative_path(path: &str) -> Result<&str> {
    let bad = |why: &str| Err(Error::with(Code::PATH_INVALID, format!("{path:?}: {why}")));
    if path.is_empty() {
        return bad("empty");
    }
    if path.len() > MAX_PATH_LEN {
        return Err(Error::with(Code::FIELD_BOUNDS_EXCEEDED, "path too long"));
    }
    if path.starts_with('/') {
        return bad("absolute");
    }
    if path.chars().any(|c| c.is_control()) {
        return bad("control character");
    }
    for component in path.split('/') {
        match component {
            "" => return bad("empty component"),
            "." | ".." => return bad("dot component"),
            c if c.eq_ignore_ascii_case(".git") => return bad(".git component"),
            c if c.len() > MAX_PATH_COMPONENT_LEN => return bad("component too long"),
            _ => {}
        }
    }
    Ok(path)
}

/// Credential paths (after the Realm lockdown list): any component or
/// file name here marks the path as a credential.
const CREDENTIAL_DIRS: &[&str] = &[
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".kube",
    ".docker",
    ".config/gcloud",
];
const CREDENTIAL_FILES: &[&str] = &[
    ".env",
    ".netrc",
    ".git-credentials",
    ".pgpass",
    ".npmrc",
    ".pypirc",
    "credentials.json",
    "service-account.json",
];
const CREDENTIAL_PREFIXES: &[&str] = &["id_rsa", "id_dsa", "id_ecdsa", "id_ed25519", ".env."];
const CREDENTIAL_SUFFIXES: &[&str] = &[".pem", ".key", ".p12", ".pfx", ".kdbx"];

/// True when a repository-relative path names something credential-like
/// (.env, .ssh/, id_rsa…, .aws/credentials, .netrc, .git-credentials,
/// .gnupg/, private keys). Matching ignores ASCII case.
pub fn is_credential_path(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    let components: Vec<&str> = lower.split('/').collect();
    let name = components.last().copied().unwrap_or("");
    let in_dir = CREDENTIAL_DIRS.iter().any(|d| {
        let parts: Vec<&str> = d.split('/').collect();
        components[..components.len().saturating_sub(1)]
            .windows(parts.len())
            .any(|w| w == parts.as_slice())
    });
    in_dir
        || CREDENTIAL_FILES.contains(&name)
        || CREDENTIAL_PREFIXES.iter().any(|p| name.starts_with(p))
        || CREDENTIAL_SUFFIXES.iter().any(|s| name.ends_with(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_every_escape_shape() {
        for bad in [
            "",
            "/etc/passwd",
            "a/../b",
            "..",
            "./a",
            "a//b",
            "a/",
            ".git/hooks/x",
            "x/.GIT/config",
            "a\0b",
            "a\nb",
        ] {
            assert_eq!(
                check_relative_path(bad).unwrap_err().code,
                Code::PATH_INVALID,
                "{bad:?}"
            );
        }
        assert_eq!(
            check_relative_path(&"a/".repeat(3000)).unwrap_err().code,
            Code::FIELD_BOUNDS_EXCEEDED
        );
        for good in [
            "a",
            "src/lib.rs",
            ".github/workflows/ci.yml",
            "a.git",
            "..a",
        ] {
            assert!(check_relative_path(good).is_ok(), "{good}");
        }
    }

    #[test]
    fn knows_credential_paths() {
        for p in [
            ".env",
            "app/.env",
            ".env.local",
            ".ssh/config",
            "home/.ssh/authorized_keys",
            "id_rsa",
            "keys/id_ed25519.pub",
            ".aws/credentials",
            ".netrc",
            ".git-credentials",
            ".gnupg/pubring.kbx",
            "tls/server.key",
            "cert.PEM",
        ] {
            assert!(is_credential_path(p), "{p}");
        }
        for p in [
            "src/env.rs",
            "environment.md",
            "ssh/README",
            "keys.txt",
            "docs/aws.md",
        ] {
            assert!(!is_credential_path(p), "{p}");
        }
    }
}

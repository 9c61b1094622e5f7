//! The crash tests live in `tests/`; this library holds what they share
//! to read what a kill left: git on a repository another uid owns, and the
//! part of a log written since an offset.

use std::path::Path;
use std::process::Command;

/// git on the bare repository `repo` (any owner trusted), no user or
/// system configuration; stdout trimmed, empty when git fails (a
/// `rev-parse --verify --quiet` of a missing ref answers "").
pub fn git(repo: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .args(["-c", "safe.directory=*", "--git-dir"])
        .arg(repo)
        .args(args)
        .output()
        .expect("git runs");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The length of a file now (0 when it does not exist).
pub fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// The text appended to a log since `offset`.
pub fn log_since(path: &Path, offset: u64) -> String {
    let bytes = std::fs::read(path).unwrap_or_default();
    let start = usize::try_from(offset)
        .unwrap_or(usize::MAX)
        .min(bytes.len());
    String::from_utf8_lossy(&bytes[start..]).into_owned()
}

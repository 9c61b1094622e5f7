//! Tool arguments, parsed strictly: unknown fields, wrong types and values
//! out of bounds are refused with a catalogue code before anything is read
//! or sent, and paths and refs are checked the way the reference git
//! server's CVEs taught (no `..`, no absolute path, nothing that starts
//! with `-` and could be taken for an option).

use crate::limits;
use airlock_proto::{Code, Error};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// Parses a tool's arguments into `T` (which refuses unknown fields).
pub fn parse<T: DeserializeOwned>(
    tool: &str,
    args: Option<Map<String, Value>>,
) -> Result<T, Error> {
    let value = Value::Object(args.unwrap_or_default());
    serde_json::from_value(value).map_err(|e| {
        Error::with(
            Code::MESSAGE_INVALID,
            format!("{tool}: the arguments do not match its input schema: {e}"),
        )
    })
}

/// A registered repository id: the shape only (whether it is registered is
/// the configuration's answer).
pub fn repository(id: &str) -> Result<&str, Error> {
    let ok = !id.is_empty()
        && id.len() <= airlock_proto::limits::MAX_REPOSITORY_LEN
        && !id.starts_with(['-', '.'])
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(id)
    } else {
        Err(Error::with(
            Code::REPOSITORY_INVALID,
            format!("{id:?} is not a repository id (list_repositories names them)"),
        ))
    }
}

/// A revision (branch, tag, commit id): printable, bounded, never an option.
pub fn revision(rev: &str) -> Result<&str, Error> {
    let bad = |why: &str| {
        Err(Error::with(
            Code::REVISION_NOT_FOUND,
            format!("{rev:?}: {why}"),
        ))
    };
    if rev.is_empty() || rev.len() > 255 {
        return bad("empty or longer than 255 bytes");
    }
    if rev.starts_with('-') {
        return bad("a revision never starts with '-'");
    }
    if rev.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return bad("control characters or spaces");
    }
    if rev.contains("..") || rev.contains("@{") || rev.contains(':') {
        return bad("ranges, reflog and path syntax are not revisions");
    }
    Ok(rev)
}

/// A normalised repository-relative path: relative, no `.`/`..`/empty
/// components, no component starting with `-`, then the task's own path
/// rules (`airlock_proto::path::check_relative_path`).
pub fn path(p: &str) -> Result<&str, Error> {
    if p.starts_with('/') {
        return Err(Error::with(
            Code::PATH_ESCAPE,
            format!("{p:?}: an absolute path"),
        ));
    }
    if p.split('/').any(|c| c == "..") {
        return Err(Error::with(
            Code::PATH_ESCAPE,
            format!("{p:?}: '..' leaves the repository"),
        ));
    }
    if p.split('/').any(|c| c.starts_with('-')) {
        return Err(Error::with(
            Code::PATH_INVALID,
            format!("{p:?}: a name starting with '-'"),
        ));
    }
    airlock_proto::path::check_relative_path(p)
}

/// A task id's shape.
pub fn task_id(id: &str) -> Result<&str, Error> {
    if airlock_proto::binding::is_task_id(id) {
        Ok(id)
    } else {
        Err(Error::with(
            Code::TASK_ID_INVALID,
            format!("{id:?} is not a task id"),
        ))
    }
}

/// An idempotency token: `[A-Za-z0-9][A-Za-z0-9._:-]{7,127}`.
pub fn idempotency_token(t: &str) -> Result<&str, Error> {
    let ok = (8..=128).contains(&t.len())
        && t.starts_with(|c: char| c.is_ascii_alphanumeric())
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b));
    if ok {
        Ok(t)
    } else {
        Err(Error::with(
            Code::IDEMPOTENCY_KEY_INVALID,
            format!("{t:?}: 8 to 128 of A-Z a-z 0-9 . _ : -, starting with a letter or digit"),
        ))
    }
}

/// `bytes` within `max`, or FIELD_BOUNDS_EXCEEDED naming `what`.
pub fn bounded(what: &str, bytes: usize, max: u64) -> Result<(), Error> {
    if bytes as u64 > max {
        Err(Error::with(
            Code::FIELD_BOUNDS_EXCEEDED,
            format!("{what}: {bytes} bytes, at most {max}"),
        ))
    } else {
        Ok(())
    }
}

/// `n` in `1..=max`, or FIELD_BOUNDS_EXCEEDED naming `what`.
pub fn in_range(what: &str, n: u64, max: u64) -> Result<u64, Error> {
    if (1..=max).contains(&n) {
        Ok(n)
    } else {
        Err(Error::with(
            Code::FIELD_BOUNDS_EXCEEDED,
            format!("{what}: {n} is outside 1..={max}"),
        ))
    }
}

/// A size argument: `given`, or `default` when absent, in `1..=max`
/// ([`in_range`]).
pub fn size(what: &str, given: Option<u64>, default: u64, max: u64) -> Result<usize, Error> {
    Ok(in_range(what, given.unwrap_or(default), max)? as usize)
}

/// list_repositories.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListRepositories {}

/// resolve_ref.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResolveRef {
    pub repository: String,
    #[serde(rename = "ref")]
    pub reference: String,
}

/// list_files.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListFiles {
    pub repository: String,
    pub revision: String,
    pub prefix: Option<String>,
    pub cursor: Option<String>,
    pub limit: Option<u64>,
}

/// read_file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadFile {
    pub repository: String,
    pub revision: String,
    pub path: String,
    pub offset: Option<u64>,
    pub length: Option<u64>,
}

/// One whole file of propose_change.
#[derive(Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileContent {
    pub path: String,
    pub content: String,
}

/// One symbolic link of propose_change.
#[derive(Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct LinkTarget {
    pub path: String,
    pub target: String,
}

/// One verification command of propose_change.
#[derive(Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Verify {
    pub argv: Vec<String>,
    pub timeout_seconds: Option<u32>,
}

/// propose_change.
#[derive(Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProposeChange {
    pub repository: String,
    pub base: String,
    pub patch: Option<String>,
    pub files: Option<Vec<FileContent>>,
    pub symlinks: Option<Vec<LinkTarget>>,
    pub delete: Option<Vec<String>>,
    pub verification: Option<Vec<Verify>>,
    pub presets: Option<Vec<String>>,
    pub idempotency_token: Option<String>,
    pub branch: Option<String>,
    pub max_attempts: Option<u32>,
}

impl ProposeChange {
    /// The size checks, before the repository is read.
    pub fn check_bounds(&self) -> Result<(), Error> {
        if let Some(p) = &self.patch {
            bounded("patch", p.len(), limits::MAX_PATCH_BYTES)?;
        }
        let mut total = 0usize;
        for f in self.files.iter().flatten() {
            if f.content.len() as u64 > limits::MAX_FILE_BYTES {
                return Err(Error::with(
                    Code::FILE_TOO_LARGE,
                    format!(
                        "{}: {} bytes, at most {} per file",
                        f.path,
                        f.content.len(),
                        limits::MAX_FILE_BYTES
                    ),
                ));
            }
            total += f.content.len();
        }
        bounded("files in all", total, limits::MAX_PATCH_BYTES)?;
        let count = self.files.as_ref().map_or(0, Vec::len)
            + self.symlinks.as_ref().map_or(0, Vec::len)
            + self.delete.as_ref().map_or(0, Vec::len);
        if count > airlock_proto::limits::MAX_CHANGES {
            return Err(Error::with(
                Code::FIELD_BOUNDS_EXCEEDED,
                format!(
                    "{count} files, at most {}",
                    airlock_proto::limits::MAX_CHANGES
                ),
            ));
        }
        Ok(())
    }
}

/// A tool that names one task.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskRef {
    pub task_id: String,
}

/// wait_for_task.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitForTask {
    pub task_id: String,
    pub timeout_seconds: Option<u64>,
}

/// list_tasks.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListTasks {
    pub state: Option<String>,
    pub cursor: Option<String>,
    pub limit: Option<u64>,
}

/// cancel_task.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelTask {
    pub task_id: String,
    pub reason: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_that_escape_or_look_like_options_are_refused() {
        assert_eq!(path("../etc/passwd").unwrap_err().code, Code::PATH_ESCAPE);
        assert_eq!(path("a/../../b").unwrap_err().code, Code::PATH_ESCAPE);
        assert_eq!(path("/etc/passwd").unwrap_err().code, Code::PATH_ESCAPE);
        assert_eq!(path("-rf").unwrap_err().code, Code::PATH_INVALID);
        assert_eq!(path("src/--help").unwrap_err().code, Code::PATH_INVALID);
        assert_eq!(path("./a").unwrap_err().code, Code::PATH_INVALID);
        assert_eq!(path("a//b").unwrap_err().code, Code::PATH_INVALID);
        assert_eq!(path(".git/config").unwrap_err().code, Code::PATH_INVALID);
        assert_eq!(path("src/main.rs").unwrap(), "src/main.rs");
    }

    #[test]
    fn revisions_that_look_like_options_or_ranges_are_refused() {
        for bad in [
            "-h",
            "--upload-pack=x",
            "main..x",
            "HEAD@{1}",
            "main:secret",
            "a b",
            "",
        ] {
            assert_eq!(
                revision(bad).unwrap_err().code,
                Code::REVISION_NOT_FOUND,
                "{bad}"
            );
        }
        assert_eq!(revision("main").unwrap(), "main");
        assert_eq!(revision("v1.0^{commit}").unwrap(), "v1.0^{commit}");
    }

    #[test]
    fn unknown_arguments_are_refused() {
        let mut args = Map::new();
        args.insert("task_id".into(), "t-1".into());
        args.insert("sudo".into(), true.into());
        let e = parse::<TaskRef>("task_status", Some(args)).unwrap_err();
        assert_eq!(e.code, Code::MESSAGE_INVALID);
    }
}

//! What an interrupted import leaves in the repository root.
//!
//! `airlockctl repo add` builds `NAME.git` under the temporary name
//! `.NAME.git.tmp-PID` ([`import_temp_name`], PID its own process id) and
//! renames it into place only once it is complete, so a cut or a kill
//! mid-import leaves that directory behind, for good unless someone
//! removes it. [`remove_stale_imports`] does, for whoever starts next and
//! may write the root: the worker at its start (what it owns), airlock-local
//! at its start and `repo add` itself before it imports (as root, all).
//!
//! Only direct entries of the root whose name is exactly that pattern (a
//! valid repository name, a decimal process id) are touched, and only when
//! no process with that id exists: an import in progress is left alone. A
//! directory is removed without following any symbolic link in it; an
//! entry that is itself a link is unlinked, its target untouched.

use std::path::{Path, PathBuf};

/// The name `repo add`, running as process `pid`, builds `NAME.git` under.
pub fn import_temp_name(name: &str, pid: u32) -> String {
    format!(".{name}.git.tmp-{pid}")
}

/// The repository name and process id of `file_name` when it is exactly a
/// temporary import's name ([`import_temp_name`]).
pub fn parse_import_temp(file_name: &str) -> Option<(&str, u32)> {
    let (name, pid) = file_name.strip_prefix('.')?.rsplit_once(".git.tmp-")?;
    let digits = !pid.is_empty() && pid.len() <= 10 && pid.bytes().all(|b| b.is_ascii_digit());
    if !digits || pid.starts_with('0') || !airlock_proto::binding::is_repository_name(name) {
        return None;
    }
    let pid: u32 = pid.parse().ok()?;
    (pid <= i32::MAX as u32).then_some((name, pid))
}

/// One leftover of an interrupted import, and what became of it.
#[derive(Debug)]
pub struct Leftover {
    /// Its path (a direct entry of the root).
    pub path: PathBuf,
    /// The process that was importing it, gone now.
    pub pid: u32,
    /// Removed, or why not (another user's files, for the worker).
    pub removed: std::io::Result<()>,
}

/// Whether a process `pid` exists (kill(2) with no signal: EPERM is
/// another user's process, which exists; only ESRCH says none does).
fn exists(pid: u32) -> bool {
    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    !matches!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), None),
        Err(nix::errno::Errno::ESRCH)
    )
}

/// Removes every leftover of an interrupted import directly in `root`
/// (module doc) and reports each; a root that does not exist has none.
/// An entry that cannot be removed is reported with its error, and the
/// others are still tried.
pub fn remove_stale_imports(root: &Path) -> std::io::Result<Vec<Leftover>> {
    let entries = match std::fs::read_dir(root) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let Some((_, pid)) = name.to_str().and_then(parse_import_temp) else {
            continue;
        };
        if pid == std::process::id() || exists(pid) {
            continue;
        }
        let path = root.join(&name);
        let removed = std::fs::symlink_metadata(&path).and_then(|meta| {
            if meta.is_dir() {
                // std's remove_dir_all opens each directory with
                // O_NOFOLLOW and unlinks links as links.
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            }
        });
        found.push(Leftover { path, pid, removed });
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_pattern_parses() {
        assert_eq!(
            parse_import_temp(".calc.git.tmp-4242"),
            Some(("calc", 4242))
        );
        assert_eq!(
            parse_import_temp(".a.git.tmp-1.git.tmp-77"),
            Some(("a.git.tmp-1", 77))
        );
        assert_eq!(
            parse_import_temp(&import_temp_name("x_y", 9)),
            Some(("x_y", 9))
        );
        for bad in [
            "calc.git.tmp-12",
            ".calc.git.tmp-",
            ".calc.git.tmp-012",
            ".calc.git.tmp-12a",
            ".calc.git.tmp-99999999999",
            "..calc.git.tmp-12",
            "./x.git.tmp-12",
            ".calc.git.tmp--12",
            ".calc.git",
            ".demo.git.tmp",
            "calc.git",
        ] {
            assert_eq!(parse_import_temp(bad), None, "{bad}");
        }
    }
}

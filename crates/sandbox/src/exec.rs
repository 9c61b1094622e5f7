//! The end of the chain: a new session (no controlling terminal, own
//! process group), then execve of the command resolved against the
//! sandbox's PATH.

use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result, errno};

/// setsid(2): the command leads a new session, detached from the caller's
/// terminal and process group.
pub fn new_session() -> Result<()> {
    nix::unistd::setsid()
        .map(drop)
        .map_err(|e| Error::Session(errno(e)))
}

/// Finds `command` the way a shell would: as given when it contains a
/// slash, else in the first PATH directory holding an executable file.
pub fn resolve(command: &OsStr, path_var: &str) -> Result<PathBuf> {
    let not_found = || Error::CommandNotFound {
        command: command.to_string_lossy().into_owned(),
    };
    if command.is_empty() {
        return Err(not_found());
    }
    if command.as_bytes().contains(&b'/') {
        return Ok(PathBuf::from(command));
    }
    for dir in path_var.split(':').filter(|d| !d.is_empty()) {
        let candidate = Path::new(dir).join(command);
        if let Ok(m) = std::fs::metadata(&candidate) {
            if m.is_file() && m.permissions().mode() & 0o111 != 0 {
                return Ok(candidate);
            }
        }
    }
    Err(not_found())
}

/// execve(2); returns only on failure.
pub fn execve(program: &Path, argv: &[CString], envp: &[CString]) -> Error {
    let command = program.to_string_lossy().into_owned();
    let Ok(prog) = CString::new(program.as_os_str().as_bytes()) else {
        return Error::CommandNotFound { command };
    };
    let e = match nix::unistd::execve(&prog, argv, envp) {
        Err(e) => e,
        Ok(never) => match never {},
    };
    if e == nix::errno::Errno::ENOENT {
        Error::CommandNotFound { command }
    } else {
        Error::Exec {
            command,
            source: errno(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_through_path() {
        assert_eq!(
            resolve(OsStr::new("sh"), "/nonexistent:/bin").unwrap(),
            Path::new("/bin/sh")
        );
        assert_eq!(resolve(OsStr::new("./x"), "").unwrap(), Path::new("./x"));
        assert!(matches!(
            resolve(OsStr::new("no-such-cmd-xyz"), "/bin"),
            Err(Error::CommandNotFound { .. })
        ));
        assert!(resolve(OsStr::new(""), "/bin").is_err());
    }
}

//! Before anything starts: can every component reach its paths?
//!
//! Run as root, airlock-local starts each component as its own user. A
//! state directory or a binary under a directory those users cannot
//! traverse (`/root` is 0700) used to fail 20 s later with the supervisor
//! unable to read its configuration. These checks name the directory and
//! the fix instead.

use crate::layout::{Id, Ids, Layout};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// What a component must be able to do with a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    /// Read a file.
    Read,
    /// Execute a program.
    Execute,
    /// Enter a directory.
    Enter,
}

fn allowed(meta: &std::fs::Metadata, who: Id, groups: &[u32], bit: u32) -> bool {
    let mode = meta.mode();
    if who.uid == 0 {
        return bit != 0o1 || mode & 0o111 != 0 || meta.is_dir();
    }
    let shift = if meta.uid() == who.uid {
        6
    } else if meta.gid() == who.gid || groups.contains(&meta.gid()) {
        3
    } else {
        0
    };
    mode & (bit << shift) != 0
}

/// Checks that `who` (with supplementary `groups`) can `want` `path`:
/// every directory on the way must be searchable. Names the first one that
/// is not.
pub fn reach(path: &Path, who: Id, groups: &[u32], want: Want) -> Result<(), (PathBuf, String)> {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut walked = PathBuf::from("/");
    let parts: Vec<_> = absolute.components().skip(1).collect();
    for (i, part) in parts.iter().enumerate() {
        let meta = std::fs::metadata(&walked).map_err(|e| (walked.clone(), e.to_string()))?;
        if !allowed(&meta, who, groups, 0o1) {
            return Err((
                walked.clone(),
                format!(
                    "the user cannot enter it (mode {:04o}, owner uid {})",
                    meta.mode() & 0o7777,
                    meta.uid()
                ),
            ));
        }
        walked.push(part);
        if i + 1 == parts.len() {
            let meta = match std::fs::metadata(&walked) {
                Ok(m) => m,
                // Not there yet: it will be made by someone who can.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err((walked.clone(), e.to_string())),
            };
            let bit = match want {
                Want::Read => 0o4,
                Want::Execute | Want::Enter => 0o1,
            };
            if !allowed(&meta, who, groups, bit) {
                let what = match want {
                    Want::Read => "the user cannot read it",
                    Want::Execute => "the user cannot execute it",
                    Want::Enter => "the user cannot enter it",
                };
                return Err((
                    walked.clone(),
                    format!(
                        "{what} (mode {:04o}, owner uid {})",
                        meta.mode() & 0o7777,
                        meta.uid()
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn components(ids: &Ids) -> [(&'static str, Id); 4] {
    [
        ("supervisor", ids.supervisor),
        ("worker", ids.worker),
        ("executor", ids.executor),
        ("retry API", ids.retry),
    ]
}

/// The state directory and every component binary, for every component
/// user. Nothing to check when everything runs as the caller.
pub fn check(layout: &Layout, ids: &Ids) -> Result<(), String> {
    if !ids.separated {
        return Ok(());
    }
    let mut problems = Vec::new();
    for (role, who) in components(ids) {
        let groups = ids.groups(who);
        let name = ids.name(who);
        if let Err((dir, why)) = reach(&layout.root, who, &groups, Want::Enter) {
            problems.push(format!(
                "the {role} (user {name}) cannot reach the state directory {}: {}: {why}.\n  \
                 Fix: choose a state directory every component user can reach, e.g. --state /var/lib/airlock-local (the default as root), or give others search permission: chmod o+x {}",
                layout.root.display(),
                dir.display(),
                dir.display()
            ));
        }
        for program in [
            "airlock-supervisor",
            "airlock-worker",
            "airlock-executor",
            "airlock-retryd",
            "airlock-confine",
        ] {
            let Ok(path) = crate::sibling(program) else {
                continue;
            };
            let needed = matches!(
                (role, program),
                ("supervisor", "airlock-supervisor")
                    | ("worker", "airlock-worker")
                    | ("executor", "airlock-executor" | "airlock-confine")
                    | ("retry API", "airlock-retryd")
            );
            if !needed {
                continue;
            }
            if let Err((dir, why)) = reach(&path, who, &groups, Want::Execute) {
                problems.push(format!(
                    "the {role} (user {name}) cannot run {}: {}: {why}.\n  \
                     Fix: build or install the binaries where every user can reach them (e.g. a checkout under /opt or /srv, or the package), or chmod o+x {}",
                    path.display(),
                    dir.display(),
                    dir.display()
                ));
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "nothing was started; the component users cannot reach their paths:\n- {}",
            problems.join("\n- ")
        ))
    }
}

/// The written configuration, for every component user.
pub fn check_config(layout: &Layout, ids: &Ids) -> Result<(), String> {
    if !ids.separated {
        return Ok(());
    }
    for (role, who) in components(ids) {
        if let Err((path, why)) = reach(&layout.config(), who, &ids.groups(who), Want::Read) {
            return Err(format!(
                "nothing was started; the {role} (user {}) cannot read its configuration: {}: {why}",
                ids.name(who),
                path.display()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_closed_directory_on_the_way_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let closed = dir.path().join("closed");
        let inner = closed.join("state");
        std::fs::create_dir_all(&inner).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
        let me = nix::unistd::getuid().as_raw();
        let other = Id {
            uid: me.wrapping_add(12345),
            gid: 4242,
        };
        let (at, why) = reach(&inner, other, &[], Want::Enter).unwrap_err();
        assert_eq!(at, closed);
        assert!(why.contains("cannot enter it"), "{why}");
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o711)).unwrap();
        assert!(reach(&inner, other, &[], Want::Enter).is_ok());
        let file = inner.join("airlock.toml");
        std::fs::write(&file, "x").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let (at, why) = reach(&file, other, &[], Want::Read).unwrap_err();
        assert_eq!(at, file);
        assert!(why.contains("cannot read it"), "{why}");
        // The group grants what others are not given.
        let meta = std::fs::metadata(&file).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert!(reach(&file, other, &[meta.gid()], Want::Read).is_ok());
    }
}

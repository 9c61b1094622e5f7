//! Writing a configuration file (or a credential beside it) so that a
//! power loss leaves the old file or the new one, never an empty or torn
//! one: a temporary file in the same directory, given its mode and owner,
//! synced, renamed over the target, then the directory synced so the
//! rename itself is on disk. The power-loss matrix (tests/powerloss) found
//! airlock-local's configuration empty after a power cut when it was
//! written with a plain `write`.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// The write stages of [`write_durably`], each of which a test build can
/// make fail (`fail_at`, in this crate's tests): the temporary file
/// written, synced, renamed over the target, and the directory synced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// The bytes are in the temporary file, and the write reports an error.
    Write,
    /// The temporary file was synced, and the sync reports an error.
    Sync,
    /// The rename over the target fails (nothing is moved).
    Rename,
    /// The rename happened, and the directory's sync reports an error.
    SyncDir,
}

#[cfg(test)]
thread_local! {
    /// The stage this thread's next writes fail at.
    static FAIL_AT: std::cell::Cell<Option<Stage>> = const { std::cell::Cell::new(None) };
}

/// Test builds only: makes this thread's writes fail at `stage` (`None`:
/// at none).
#[cfg(test)]
pub(crate) fn fail_at(stage: Option<Stage>) {
    FAIL_AT.with(|f| f.set(stage));
}

/// The failure a test asked `stage` to have; nothing in other builds.
fn fault(stage: Stage) -> std::io::Result<()> {
    #[cfg(test)]
    if FAIL_AT.with(std::cell::Cell::get) == Some(stage) {
        return Err(std::io::Error::other(format!(
            "injected failure at {stage:?}"
        )));
    }
    let _ = stage;
    Ok(())
}

/// Replaces `path` with `bytes`, durably: mode `mode`, owned by `owner`
/// (uid, gid) when given. On an error before the rename the target is
/// unchanged and the temporary file removed; a failed sync of the
/// directory after it is reported (the new file is in place, its
/// durability unconfirmed).
pub fn write_durably(
    path: &Path,
    bytes: &[u8],
    mode: u32,
    owner: Option<(u32, u32)>,
) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other(format!("{}: no file name", path.display())))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&tmp)?;
        f.write_all(bytes)?;
        fault(Stage::Write)?;
        if let Some((uid, gid)) = owner {
            nix::unistd::fchown(
                std::os::fd::AsRawFd::as_raw_fd(&f),
                Some(nix::unistd::Uid::from_raw(uid)),
                Some(nix::unistd::Gid::from_raw(gid)),
            )
            .map_err(std::io::Error::from)?;
        }
        // The umask may have narrowed the mode; state it exactly.
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.sync_all()?;
        fault(Stage::Sync)?;
        fault(Stage::Rename)?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::File::open(dir)?.sync_all()?;
    fault(Stage::SyncDir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn replaces_the_file_with_its_mode_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("airlock.toml");
        std::fs::write(&path, b"old").unwrap();
        write_durably(&path, b"new", 0o640, None).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o7777, 0o640);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("airlock.toml")]);
    }

    /// Every name in `dir` with its bytes.
    fn contents(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.file_name().to_string_lossy().into_owned(),
                    std::fs::read(e.path()).unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn a_failure_at_each_write_stage_leaves_the_original_byte_for_byte() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("airlock.toml");
        std::fs::write(&path, b"the original\n").unwrap();
        std::fs::write(dir.path().join("other.toml"), b"untouched").unwrap();
        for stage in [Stage::Write, Stage::Sync, Stage::Rename] {
            let before = contents(dir.path());
            fail_at(Some(stage));
            let err = write_durably(&path, b"the new file\n", 0o640, None).unwrap_err();
            fail_at(None);
            assert!(
                err.to_string().contains("injected failure"),
                "{stage:?}: {err}"
            );
            assert_eq!(
                contents(dir.path()),
                before,
                "{stage:?}: the original unchanged, no temporary left"
            );
        }
        // After the rename, a failed directory sync is reported; the new
        // file is in place whole, no temporary left.
        fail_at(Some(Stage::SyncDir));
        let err = write_durably(&path, b"the new file\n", 0o640, None).unwrap_err();
        fail_at(None);
        assert!(err.to_string().contains("SyncDir"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"the new file\n");
        assert_eq!(contents(dir.path()).len(), 2);
    }

    #[test]
    fn a_failed_write_leaves_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub");
        std::fs::create_dir(&path).unwrap();
        // The target is a directory: the rename fails, nothing is left.
        assert!(write_durably(&path, b"new", 0o600, None).is_err());
        assert!(path.is_dir());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}

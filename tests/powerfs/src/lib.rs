//! airlock's power-loss file system for tests: an in-memory FUSE file
//! system, served by a thread of the test process, that simulates a power
//! cut on command.
//!
//! [`PowerFs::mount`] mounts an empty file system on a fresh directory
//! under `/var/tmp` (as root: `allow_other`, with the kernel checking modes
//! against the owners and modes this file system reports, so several uids
//! can use it). Every operation changes the *live* state at once, and reads
//! see it; a second, *durable* state holds what survives a cut.
//! [`PowerFs::power_loss`] replaces the live state with the durable one and
//! the file system stays mounted: what the writer did not make durable is
//! gone, as after a reboot.
//!
//! # Crash models
//!
//! In every [`Mode`], a file's data (contents and size: writes, truncates,
//! fallocate) becomes durable only at fsync or fdatasync of that file, or
//! at once for a write through an `O_SYNC`/`O_DSYNC` descriptor. The modes
//! differ in namespace operations (create, mknod, mkdir, symlink, link,
//! unlink, rmdir, rename) and attributes (chmod, chown, utimens, xattrs):
//!
//! - [`Mode::Data`] (LazyFS's model): namespace operations and attribute
//!   changes are durable at once; a new file is durable empty. A cut drops
//!   only file data not fsynced.
//! - [`Mode::Metadata`] (the ALICE/CrashMonkey model): a namespace
//!   operation becomes durable only when a directory it changed is fsynced
//!   (a rename changes both parents). With it go the earlier pending
//!   operations that linked or unlinked the same inodes, as a journal cannot
//!   commit an operation on an inode before the earlier ones on it; parent
//!   directories are not dependencies, so a new directory needs its parent
//!   fsynced too, and a new file's fsync does not make its name durable. A
//!   directory's attributes are durable at its fsync, a file's at its fsync.
//!   A cut drops the pending operations as well as unsynced data.
//! - [`Mode::Torn`] ([`Mode::STRICTEST`]): as `Metadata`, except that each
//!   write not yet fsynced to a file that survives the cut keeps its bytes
//!   up to its last 4 KiB boundary (`[off, align_down(off + len, 4096))`,
//!   laid over the durable contents in write order): sectors reach the disk
//!   in order and the power goes before a write's last partial sector.
//!
//! Inode numbers are never reused, not even after a cut, so the kernel never
//! mistakes a new inode for one it still remembers; names and attributes are
//! replied with a zero TTL and opens never keep the page cache, so the
//! kernel asks again after a cut.
//!
//! # Not covered
//!
//! - `sync(2)`, `syncfs(2)` and `sync_file_range(2)` do not reach a FUSE
//!   file system: they make nothing durable here.
//! - Dirty pages of a shared writable mmap reach the model only when the
//!   kernel writes them back (at msync, fsync, munmap or on its own); what
//!   the kernel still holds at the cut is not dropped by it.
//! - A descriptor opened before a cut may still read pages the kernel
//!   cached before it; open the file again to read the state after it.
//! - The metadata model commits per directory, not whole transactions as a
//!   journal does: it allows states a journaling file system cannot reach.
//! - Attributes of symlinks and special files become durable with their
//!   creation only (at once in data mode), as they cannot be fsynced.
//! - Files larger than 16 GiB are refused (EFBIG): contents live in memory.
//! - No `O_TMPFILE`, `SEEK_DATA`/`SEEK_HOLE` or `copy_file_range` of its own
//!   (the kernel falls back where it can), no ACLs beyond plain xattrs;
//!   fcntl and flock locks are the kernel's own.
//! - Mounted `nosuid,nodev` (fuser's default, as libfuse's): setuid bits
//!   and device nodes are stored and reported, not honoured.

use std::ffi::CString;
use std::fmt;
use std::fs::Permissions;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::{Arc, Mutex};

use fuser::{BackgroundSession, Config, MountOption, SessionACL};

mod fuse;
mod model;

pub use model::{Cut, Mode};

/// A mounted power-loss file system; unmounted and its directory removed
/// when dropped.
pub struct PowerFs {
    session: Option<BackgroundSession>,
    shared: fuse::Shared,
    mode: Mode,
    // Dropped after `Drop::drop` has unmounted it.
    dir: tempfile::TempDir,
}

impl fmt::Debug for PowerFs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PowerFs")
            .field("path", &self.dir.path())
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl PowerFs {
    /// Mounts a new, empty file system on a fresh directory under /var/tmp
    /// (made 0755, so other uids reach it). Its root directory is 0755 and
    /// owned by the caller. Needs root (or a FUSE that lets the caller mount
    /// with `allow_other`).
    pub fn mount(mode: Mode) -> io::Result<PowerFs> {
        let dir = tempfile::Builder::new()
            .prefix("airlock-powerfs-")
            .tempdir_in("/var/tmp")?;
        std::fs::set_permissions(dir.path(), Permissions::from_mode(0o755))?;
        // The directory was just made by this process: its owner is ours.
        let me = std::fs::metadata(dir.path())?;
        let shared: fuse::Shared = Arc::new(Mutex::new(fuse::State::new(model::Model::new(
            mode,
            me.uid(),
            me.gid(),
        ))));
        let mut config = Config::default();
        config.mount_options = vec![
            MountOption::DefaultPermissions,
            MountOption::FSName("airlock-powerfs".into()),
        ];
        // fuser's form of `allow_other`.
        config.acl = SessionACL::All;
        let fs = fuse::Fs {
            shared: Arc::clone(&shared),
        };
        let session = fuser::spawn_mount(fs, dir.path(), &config).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("mounting powerfs on {}: {e}", dir.path().display()),
            )
        })?;
        Ok(PowerFs {
            session: Some(session),
            shared,
            mode,
            dir,
        })
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The power cut: drops what was not durable, per the mode; returns what
    /// it dropped. The file system stays mounted.
    pub fn power_loss(&self) -> Cut {
        fuse::lock(&self.shared).model.power_loss()
    }

    /// Totals over every cut so far.
    pub fn totals(&self) -> Cut {
        fuse::lock(&self.shared).model.totals()
    }
}

impl Drop for PowerFs {
    fn drop(&mut self) {
        let Some(session) = self.session.take() else {
            return;
        };
        if session.umount_and_join().is_err() {
            // Busy (a descriptor still open in it): detach it, so that the
            // directory can go; the session thread ends when the kernel
            // lets go of the connection.
            if let Ok(path) = CString::new(self.dir.path().as_os_str().as_bytes()) {
                // SAFETY: `path` is a NUL-terminated string that outlives the
                // call; umount2 only reads it.
                unsafe {
                    libc::umount2(path.as_ptr(), libc::MNT_DETACH);
                }
            }
        }
    }
}

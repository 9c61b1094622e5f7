//! Power loss, not only process death: airlock's stores on its own
//! power-loss file system ([`airlock_powerfs`]), which drops on command
//! what the writer never made durable — what a power cut does to the page
//! cache and to a journaling file system's uncommitted operations, and
//! what SIGKILL never does.
//!
//! [`mount`] mounts a fresh one in the mode these tests run in:
//! `AIRLOCK_POWERFS_MODE` (`data`, `metadata` or `torn`) when set, else
//! the strictest, `torn`. Nothing is fetched or built from outside the
//! repository: the file system is a test dependency built by cargo.

pub use airlock_powerfs::{Cut, Mode, PowerFs};

/// The mode these tests run in: `AIRLOCK_POWERFS_MODE`, else the
/// strictest.
pub fn mode() -> Mode {
    match std::env::var("AIRLOCK_POWERFS_MODE") {
        Ok(m) => m.parse().unwrap_or_else(|_| {
            panic!("AIRLOCK_POWERFS_MODE={m:?}: expected data, metadata or torn")
        }),
        Err(_) => Mode::STRICTEST,
    }
}

/// A fresh power-loss file system in [`mode`]; unmounted when dropped.
pub fn mount() -> PowerFs {
    PowerFs::mount(mode()).unwrap_or_else(|e| {
        panic!("mounting the power-loss file system (as root, with /dev/fuse): {e}")
    })
}

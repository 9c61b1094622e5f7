//! inotify wake-ups: block until a file is published in a watched
//! directory, or a timeout passes. No polling loop, no sleeps.

use crate::Kind;
use crate::error::{Error, Result};
use crate::file::io;
use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use rustix::io::Errno;
use std::mem::MaybeUninit;
use std::path::Path;
use std::time::{Duration, Instant};

/// Why [`Watcher::wait`] returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wake {
    /// These `(kind, request_id)` files were published (renamed into place
    /// or closed after writing), in event order, duplicates removed.
    Published(Vec<(Kind, String)>),
    /// The kernel's event queue overflowed: events were lost, rescan the
    /// directories with [`crate::Spool::list`].
    Rescan,
    /// Nothing was published before the timeout.
    Timeout,
}

/// An inotify instance watching some spool directories.
#[derive(Debug)]
pub struct Watcher {
    fd: OwnedFd,
    watches: Vec<(i32, Kind)>,
}

impl Watcher {
    pub(crate) fn new(dirs: &[(Kind, &Path)]) -> Result<Self> {
        let fd = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK)
            .map_err(|e| Error::Wait { source: io(e) })?;
        let mut watches = Vec::new();
        for (kind, path) in dirs {
            let wd = inotify::add_watch(
                &fd,
                *path,
                WatchFlags::MOVED_TO
                    | WatchFlags::CLOSE_WRITE
                    | WatchFlags::ONLYDIR
                    | WatchFlags::DONT_FOLLOW,
            )
            .map_err(|e| Error::Watch {
                path: path.to_path_buf(),
                source: io(e),
            })?;
            watches.push((wd, *kind));
        }
        Ok(Watcher { fd, watches })
    }

    /// Blocks until a correctly named file is published in a watched
    /// directory, the event queue overflows, or `timeout` passes. Events
    /// for other names (temporary files, junk) are consumed and ignored.
    pub fn wait(&mut self, timeout: Duration) -> Result<Wake> {
        let deadline = Instant::now() + timeout;
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Ok(Wake::Timeout);
            }
            let ts = Timespec {
                tv_sec: i64::try_from(remaining.as_secs()).unwrap_or(i64::MAX),
                tv_nsec: i64::from(remaining.subsec_nanos()),
            };
            let mut fds = [PollFd::new(&self.fd, PollFlags::IN)];
            match rustix::event::poll(&mut fds, Some(&ts)) {
                Ok(0) => return Ok(Wake::Timeout),
                Ok(_) => {}
                Err(Errno::INTR) => continue,
                Err(e) => return Err(Error::Wait { source: io(e) }),
            }
            let mut found: Vec<(Kind, String)> = Vec::new();
            let mut overflow = false;
            let mut buf = [MaybeUninit::<u8>::uninit(); 8192];
            let mut reader = inotify::Reader::new(self.fd.as_fd(), &mut buf);
            loop {
                let event = match reader.next() {
                    Ok(event) => event,
                    Err(Errno::AGAIN) => break,
                    Err(Errno::INTR) => continue,
                    Err(e) => return Err(Error::Wait { source: io(e) }),
                };
                if event.events().contains(ReadFlags::QUEUE_OVERFLOW) {
                    overflow = true;
                    continue;
                }
                if !event
                    .events()
                    .intersects(ReadFlags::MOVED_TO | ReadFlags::CLOSE_WRITE)
                {
                    continue;
                }
                let Some(kind) = self
                    .watches
                    .iter()
                    .find(|(wd, _)| *wd == event.wd())
                    .map(|(_, k)| *k)
                else {
                    continue;
                };
                let Some(name) = event.file_name().and_then(|n| n.to_str().ok()) else {
                    continue;
                };
                if let Some(id) = kind.parse_name(name) {
                    let entry = (kind, id.to_owned());
                    if !found.contains(&entry) {
                        found.push(entry);
                    }
                }
            }
            if overflow {
                return Ok(Wake::Rescan);
            }
            if !found.is_empty() {
                return Ok(Wake::Published(found));
            }
        }
    }
}

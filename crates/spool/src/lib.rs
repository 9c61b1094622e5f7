//! Spool exchange: atomic publish, owner-verified read, inotify wait, garbage collection (being written).

//! The journal's files: created whole, and refused when found torn.
//!
//! SQLite keeps the journal in two files: the database
//! (`checkpoints.sqlite3`), which holds whole pages copied there by
//! checkpoints, and its write-ahead log (`-wal`), every commit since, one
//! frame per page, the last frame of each commit marked and every frame
//! checksummed in a chain. What is guaranteed when the journal is opened
//! after either was cut short (seed 002: "a corrupt prefix is
//! unacceptable; a lost tail is expected"):
//!
//! - **A `-wal` cut anywhere** (inside its header, on a frame boundary,
//!   inside a frame) is SQLite's crash case: recovery keeps the frames up to
//!   the last commit frame that is whole and whose checksum chain holds, and
//!   the journal opens exactly as it was after that commit — every append
//!   before it, none after, never part of one. It is not refused: a torn
//!   tail is what a crash during a commit leaves. What nothing in the files
//!   can show is how much was cut: an append that had been acknowledged and
//!   is gone (a disk that lied about its fsync, a hand) is not detected
//!   here; the worker's resumption finds its task at the earlier phase.
//! - **The database file** is refused with `STORE_CORRUPT` at open, naming
//!   why, when it is empty or its `-wal` is there without it (SQLite would
//!   take either for a new database and delete the log), when its header
//!   is cut or damaged, when it ends inside a page the log does not hold
//!   (SQLite reads the missing part as zeros, which no check of its own
//!   sees: a value is silently changed), when, without a log, it is not a
//!   whole number of pages or shorter than the pages its header counts, and
//!   whenever what SQLite reads fails `PRAGMA integrity_check` or the
//!   journal's own invariants
//!   ([`CheckpointJournal::integrity_check`](crate::checkpoint::CheckpointJournal::integrity_check)).
//!   With a log beside it, a database short of whole pages is what a
//!   checkpoint cut short by a crash leaves, and recovery completes it from
//!   the log; only the check of its content tells that from lost pages.
//! - **A new journal is created whole**: made under a temporary name,
//!   migrated, checkpointed into its database file, synced, linked into
//!   place and its directory synced. So an existing empty file is always
//!   damage, never a journal half made.
//!
//! `crates/journal/tests/torn.rs` cuts copies of a real journal at every
//! frame and page boundary and inside them and checks each of these.

use airlock_proto::{Code, Error};
use airlock_sqlite::db::{self, Kind, Migration};
use airlock_sqlite::error::{SqliteError, SqliteResult};
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Bytes of SQLite's database header.
const HEADER: usize = 100;

fn corrupt(path: &Path, why: impl std::fmt::Display) -> SqliteError {
    SqliteError::Refused(Error::with(
        Code::STORE_CORRUPT,
        format!("checkpoint journal {}: {why}", path.display()),
    ))
}

fn unavailable(path: &Path, what: &str, e: std::io::Error) -> SqliteError {
    SqliteError::Refused(Error::with(
        Code::STORE_UNAVAILABLE,
        format!("checkpoint journal {}: {what}: {e}", path.display()),
    ))
}

/// `path` with `suffix` appended to its file name (`-wal`, `.new`).
fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// The size of `path`, `None` when it does not exist (not followed).
fn size(path: &Path) -> SqliteResult<Option<u64>> {
    match std::fs::symlink_metadata(path) {
        Ok(m) => Ok(Some(m.size())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(unavailable(path, "reading its size", e)),
    }
}

/// What the files say before SQLite opens them: `Ok(true)` when there is
/// no journal yet (it is to be created), `Ok(false)` when there is one to
/// open, a refusal when they are found torn.
pub(crate) fn check_before_open(path: &Path) -> SqliteResult<bool> {
    let wal_path = beside(path, "-wal");
    let wal = size(&wal_path)?.unwrap_or(0);
    let Some(len) = size(path)? else {
        if wal > 0 {
            return Err(corrupt(
                path,
                format!("its write-ahead log ({wal} bytes) is there without the database"),
            ));
        }
        return Ok(true);
    };
    if len == 0 {
        return Err(corrupt(
            path,
            "the database file is empty: a journal is created whole, so its checkpoints were lost",
        ));
    }
    // The header is written when the file is made and never shortened:
    // with a log or without, one that is cut or damaged is refused.
    let mut header = [0u8; HEADER];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut header))
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => corrupt(
                path,
                format!("{len} bytes, shorter than SQLite's {HEADER}-byte header"),
            ),
            _ => unavailable(path, "reading its header", e),
        })?;
    if &header[..16] != b"SQLite format 3\0" {
        return Err(corrupt(
            path,
            "not an SQLite database (its header is damaged)",
        ));
    }
    let page = match u16::from_be_bytes([header[16], header[17]]) {
        1 => 65_536,
        n => u64::from(n),
    };
    if !page.is_power_of_two() || !(512..=65_536).contains(&page) {
        return Err(corrupt(
            path,
            format!("its header names a page size of {page}"),
        ));
    }
    if wal > 0 {
        // Recovery reads every page the log holds from the log, so a
        // database file short of pages is what a checkpoint cut short by a
        // crash leaves, and the content check after opening tells lost
        // pages from that. A page cut inside is read as zeros where it
        // ends, which no check of SQLite's sees: it must be one the log
        // holds.
        if len % page != 0 {
            let torn = len / page + 1;
            let logged = std::fs::read(&wal_path)
                .map_err(|e| unavailable(&wal_path, "reading the log", e))?;
            if !logged_pages(&logged, page).contains(&torn) {
                return Err(corrupt(
                    path,
                    format!(
                        "{len} bytes: page {torn} is cut inside ({} of {page} bytes) and the log does not hold it",
                        len % page
                    ),
                ));
            }
        }
        return Ok(false);
    }
    if len % page != 0 {
        return Err(corrupt(
            path,
            format!("{len} bytes is not a whole number of {page}-byte pages: it was cut"),
        ));
    }
    let counted = u64::from(u32::from_be_bytes([
        header[28], header[29], header[30], header[31],
    ]));
    let valid = header[24..28] == header[92..96] && counted > 0;
    if valid && counted * page > len {
        return Err(corrupt(
            path,
            format!(
                "its header counts {counted} pages, the file holds {}: it was cut",
                len / page
            ),
        ));
    }
    Ok(false)
}

/// The pages SQLite's recovery takes from the log `wal` (pages of `page`
/// bytes): those of its frames up to the last commit frame of the
/// unbroken run whose salts match the header and whose checksum chain
/// holds (the WAL format of sqlite.org/fileformat2.html, section 4).
fn logged_pages(wal: &[u8], page: u64) -> std::collections::BTreeSet<u64> {
    let word = |b: &[u8], big: bool| {
        let b = [b[0], b[1], b[2], b[3]];
        if big {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        }
    };
    let sum = |data: &[u8], big: bool, (mut s0, mut s1): (u32, u32)| {
        for pair in data.chunks_exact(8) {
            s0 = s0.wrapping_add(word(&pair[..4], big)).wrapping_add(s1);
            s1 = s1.wrapping_add(word(&pair[4..], big)).wrapping_add(s0);
        }
        (s0, s1)
    };
    let mut pages = std::collections::BTreeSet::new();
    let Ok(page) = usize::try_from(page) else {
        return pages;
    };
    if wal.len() < 32 {
        return pages;
    }
    let magic = u32::from_be_bytes([wal[0], wal[1], wal[2], wal[3]]);
    if magic & !1 != 0x377f_0682 || word(&wal[8..12], true) as usize != page {
        return pages;
    }
    let big = magic & 1 == 1;
    let mut chain = sum(&wal[..24], big, (0, 0));
    if chain != (word(&wal[24..28], true), word(&wal[28..32], true)) {
        return pages;
    }
    let mut pending = Vec::new();
    let mut at = 32;
    while at + 24 + page <= wal.len() {
        let frame = &wal[at..at + 24 + page];
        if frame[8..16] != wal[16..24] {
            break;
        }
        chain = sum(&frame[24..], big, sum(&frame[..8], big, chain));
        if chain != (word(&frame[16..20], true), word(&frame[20..24], true)) {
            break;
        }
        pending.push(u64::from(word(&frame[..4], true)));
        if word(&frame[4..8], true) != 0 {
            pages.extend(pending.drain(..));
        }
        at += 24 + page;
    }
    pages
}

/// Creates the journal at `path` whole (see the module docs).
pub(crate) fn create_whole(path: &Path, migrations: &[Migration]) -> SqliteResult<()> {
    let new = beside(path, ".new");
    // What a crash while creating left: never a journal, removed.
    for leftover in [new.clone(), beside(&new, "-wal"), beside(&new, "-shm")] {
        match std::fs::remove_file(&leftover) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(unavailable(&leftover, "removing a half-made journal", e)),
        }
    }
    let conn = db::open(&new, Kind::Checkpoints, migrations)?;
    let (busy, _, _): (i64, i64, i64) = conn
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .map_err(|e| SqliteError::sqlite("checkpointing a new journal", e))?;
    conn.close()
        .map_err(|(_, e)| SqliteError::sqlite("closing a new journal", e))?;
    if busy != 0 || size(&beside(&new, "-wal"))?.unwrap_or(0) > 0 {
        return Err(corrupt(
            &new,
            "a new journal's log could not be checkpointed into its file",
        ));
    }
    std::fs::File::open(&new)
        .and_then(|f| f.sync_all())
        .map_err(|e| unavailable(&new, "syncing a new journal", e))?;
    // A link never replaces: a journal made meanwhile by another is kept.
    match std::fs::hard_link(&new, path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(unavailable(path, "linking a new journal into place", e)),
    }
    std::fs::remove_file(&new).map_err(|e| unavailable(&new, "removing its temporary name", e))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| unavailable(dir, "syncing the journal's directory", e))
}

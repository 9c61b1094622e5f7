//! The tree wing: the source trees the executor holds, keyed by their git
//! tree id ([`TreeCache`]), and the file helpers the executor's modules
//! share ([`fs`]).
//!
//! ```text
//!  open ─────▶ <work>/trees read: half-made fills removed, an interrupted
//!    │         delta rolled back onto its base (journal.rs); no file read
//!    ▼
//!  get ─hit──▶ use: checked on its first use in this process (stamp.rs)
//!    │ miss
//!    ▼
//!  receive ─┬─ a whole archive ─▶ fill: extract.rs writes and hashes it
//!           └─ a source delta ──▶ advance: delta.rs parses and plans it,
//!              │                  advance.rs takes the held entry (moved,
//!              │                  or copied when pinned) and changes it
//!              ▼
//!  seal ─────▶ seal.rs + stamp.rs; every file a link into blobs.rs
//!    ▼
//!  use ─────▶ evict: least recently used first, never one a job holds
//!             (hold.rs) or a worker may send a delta against (pinned)
//! ```
//!
//! | file | owns |
//! |---|---|
//! | `cache.rs` | [`TreeCache`]: open, get, fill, receive, advance, evict, pins — the one writer of `<work>/trees` |
//! | `advance.rs` | the delta's application to a held entry: taken (moved or copied), changed, sealed, or put back |
//! | `journal.rs` | the journal a moved entry carries while it changes, and its roll-back |
//! | `delta.rs` | a source delta parsed and hash-checked, and its plan against the base (reads only) |
//! | `extract.rs` | a whole source archive written beneath an entry's root, checked member by member, hashed to its tree id |
//! | `blobs.rs` | the blob store every entry's files are hard links into |
//! | `stamp.rs` | an entry's [`Stamp`], and hashing it in full |
//! | `seal.rs` | an entry's seal and tree objects on disk; the boot id |
//! | `hold.rs` | what running jobs hold (never evicted, moved or written under them) and what one job is making (made once, the others waiting): a leaf |
//! | `fs.rs` | the file helpers (remove, clone, copy, chown, walk, hash a file): a leaf |
//!
//! Who may call what: outside the wing, the request and the binary use
//! [`TreeCache`] and the archive bounds ([`extract::ArchiveLimits`]); the
//! request, the layer cache, a setup and the runner use `fs.rs`, the
//! layer cache `hold.rs`; nothing else. Jobs run side by side: only the
//! serve loop's own thread fills or advances the cache, one entry at a
//! time; a job holds the entry it runs on until it ends. Inside, only `cache.rs` calls `advance.rs` and `journal.rs`, and
//! only with a base it has checked; the other files keep no state of
//! their own and write only where they are told to. Imports point down
//! the table, never up; `fs.rs` imports nothing of the crate but its
//! error, so no circle can pass through it.

pub mod advance;
pub mod blobs;
pub mod cache;
pub mod delta;
pub mod extract;
pub mod fs;
pub mod hold;
pub mod journal;
pub mod seal;
pub mod stamp;

pub use cache::{CacheLimits, Cached, TreeCache, Verified};
pub use seal::boot_id;
pub use stamp::Stamp;

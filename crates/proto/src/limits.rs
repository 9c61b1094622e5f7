//! Bounds on every string, list and size that crosses a boundary.
//!
//! One place, so a reviewer can see every limit at once and so that the
//! sender and the receiver cannot disagree.

/// Largest JSON message accepted on any channel (D-Bus argument, spool file, HTTP body excepted).
pub const MAX_MESSAGE_BYTES: usize = 32 * 1024 * 1024;
/// Largest HTTP request body the retry API reads.
pub const MAX_HTTP_BODY_BYTES: usize = 64 * 1024;
/// Longest task id, job id or idempotency key.
pub const MAX_ID_LEN: usize = 180;
/// Longest repository name.
pub const MAX_REPOSITORY_LEN: usize = 64;
/// Longest relative path in a change, capture or archive.
pub const MAX_PATH_LEN: usize = 4096;
/// Longest single path component.
pub const MAX_PATH_COMPONENT_LEN: usize = 255;
/// Most changes in one change set.
pub const MAX_CHANGES: usize = 1000;
/// Largest content of one write_file, or old/new text of one replace_text.
pub const MAX_CHANGE_CONTENT_BYTES: usize = 4 * 1024 * 1024;
/// Largest sum of all change contents in one change set.
pub const MAX_CHANGE_SET_BYTES: usize = 16 * 1024 * 1024;
/// Most verification commands in one envelope.
pub const MAX_COMMANDS: usize = 32;
/// Most argv elements of one command.
pub const MAX_ARGV: usize = 256;
/// Longest single argv element.
pub const MAX_ARG_LEN: usize = 4096;
/// Longest command label.
pub const MAX_LABEL_LEN: usize = 64;
/// Shortest and longest verification timeout, in seconds.
pub const COMMAND_TIMEOUT_RANGE: std::ops::RangeInclusive<u32> = 1..=1800;
/// Verification timeout when a plan does not name one.
pub const DEFAULT_COMMAND_TIMEOUT_SECONDS: u32 = 300;
/// Most capabilities in a scope, and the longest capability name.
pub const MAX_CAPABILITIES: usize = 32;
/// Longest capability name.
pub const MAX_CAPABILITY_LEN: usize = 120;
/// Most source-capture signals kept after normalisation.
pub const MAX_SOURCE_SIGNALS: usize = 16;
/// Most source-capture signals accepted before normalisation.
pub const MAX_SOURCE_SIGNALS_IN: usize = 256;
/// Longest source-capture signal kept (in characters) after normalisation.
pub const MAX_SOURCE_SIGNAL_CHARS: usize = 512;
/// Most files a source_capture may ask for.
pub const MAX_CAPTURE_PATHS: usize = 64;
/// Largest sum of the contents a source capture returns (the files travel
/// in the task result, which is bounded by [`MAX_RESULT_BYTES`]).
pub const MAX_CAPTURE_BYTES: usize = 128 * 1024;
/// Largest attempt budget a task may ever have (the retry-extension cap).
pub const MAX_ATTEMPTS_CAP: u32 = 50;
/// Attempt budget when a submission does not name one.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;
/// Longest human reason (verification decision, cancel).
pub const MAX_REASON_LEN: usize = 1024;
/// Longest stdout/stderr tail kept in evidence.
pub const MAX_OUTPUT_TAIL_BYTES: usize = 4096;
/// Most bytes of each output tail a task result keeps for a failed command
/// (the evidence a planner reads to see which test failed).
pub const MAX_SUMMARY_TAIL_BYTES: usize = 2048;
/// Largest task result accepted by the supervisor, canonical bytes.
pub const MAX_RESULT_BYTES: usize = 256 * 1024;

/// Longest a worker's fence may hold off a task's cancel and lease expiry
/// (`Worker1.Fence`): a push bounded by its own timeout fits, a worker gone
/// for good releases the task within this.
pub const MAX_FENCE_MS: u64 = 30 * 60 * 1000;

//! Bounds on what airlock-mcp reads and returns. Clients cap a tool's
//! output at about 25,000 tokens and mirror it twice (structured and as
//! text), so every result stays well below that, and says when it was cut.

/// Bytes read_file returns per call at most.
pub const MAX_READ_BYTES: u64 = 32 * 1024;
/// Bytes read_file returns when no length is given.
pub const DEFAULT_READ_BYTES: u64 = 16 * 1024;
/// Paths list_files returns per page at most.
pub const MAX_FILES_PAGE: u64 = 500;
/// Paths per page when no limit is given.
pub const DEFAULT_FILES_PAGE: u64 = 200;
/// Tasks list_tasks returns per page at most.
pub const MAX_TASKS_PAGE: u64 = 50;
/// Tasks per page when no limit is given.
pub const DEFAULT_TASKS_PAGE: u64 = 20;
/// Tasks of all users list_tasks looks through per call.
pub const MAX_TASKS_SCANNED: usize = 500;
/// Repositories list_repositories returns at most.
pub const MAX_REPOSITORIES: usize = 200;
/// Seconds wait_for_task waits at most: below the usual 60 s tool timeout
/// of MCP clients.
pub const MAX_WAIT_SECONDS: u64 = 45;
/// Bytes of command output get_task_log returns in all.
pub const MAX_LOG_BYTES: usize = 24 * 1024;
/// Bytes of one file's content propose_change accepts (the task's own
/// bound, airlock_proto::limits::MAX_CHANGE_CONTENT_BYTES).
pub const MAX_FILE_BYTES: u64 = airlock_proto::limits::MAX_CHANGE_CONTENT_BYTES as u64;
/// Bytes of a patch propose_change accepts (the task's change-set bound).
pub const MAX_PATCH_BYTES: u64 = airlock_proto::limits::MAX_CHANGE_SET_BYTES as u64;
/// Bytes of one JSON-RPC message on stdin; a longer line ends the session.
pub const MAX_MESSAGE_BYTES: usize = 24 * 1024 * 1024;

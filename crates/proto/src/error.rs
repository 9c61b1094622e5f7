//! The one error-code catalogue.
//!
//! Every refusal anywhere in airlock carries a [`Code`]. Each code has exactly
//! one meaning and is mapped here, once, to an HTTP status, a D-Bus error name
//! and a CLI exit code. Nothing else in the tree may invent a mapping.

use std::fmt;

/// How a refusal is classified; the class decides the HTTP status and the
/// CLI exit code, so two codes of one class always map alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Class {
    /// The input is malformed or violates a bound (HTTP 400).
    Invalid,
    /// No or a wrong credential was presented (HTTP 401).
    Unauthenticated,
    /// The caller is known but not allowed to do this (HTTP 403).
    Denied,
    /// The named object does not exist (HTTP 404).
    NotFound,
    /// The request is well formed but conflicts with current state (HTTP 409).
    Conflict,
    /// The request is larger than allowed (HTTP 413).
    TooLarge,
    /// A dependency (database, polkit, bus, sandbox) is not available (HTTP 503).
    Unavailable,
    /// A bug or an invariant violation inside airlock (HTTP 500).
    Internal,
    /// The caller must authenticate interactively first (HTTP 401).
    InteractiveRequired,
}

impl Class {
    /// The HTTP status of every code in this class.
    pub const fn http_status(self) -> u16 {
        match self {
            Class::Invalid => 400,
            Class::Unauthenticated | Class::InteractiveRequired => 401,
            Class::Denied => 403,
            Class::NotFound => 404,
            Class::Conflict => 409,
            Class::TooLarge => 413,
            Class::Unavailable => 503,
            Class::Internal => 500,
        }
    }

    /// The process exit status `airlockctl` uses for every code in this
    /// class. 1 is a generic failure and 2 a usage error (clap), so classes
    /// start at 3.
    pub const fn exit_code(self) -> u8 {
        match self {
            Class::Invalid => 3,
            Class::Unauthenticated => 4,
            Class::Denied => 5,
            Class::NotFound => 6,
            Class::Conflict => 7,
            Class::TooLarge => 8,
            Class::Unavailable => 9,
            Class::Internal => 10,
            Class::InteractiveRequired => 11,
        }
    }
}

/// Prefix of airlock's own D-Bus error names.
pub const DBUS_ERROR_PREFIX: &str = "org.airlock.Error.";

macro_rules! catalogue {
    ($( $(#[doc = $doc:literal])+ $variant:ident => $class:ident, $dbus:expr; )+) => {
        /// A stable refusal code. The doc comment of each variant is its
        /// meaning; `as_str` is the SCREAMING_SNAKE name that crosses every
        /// boundary.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[allow(non_camel_case_types)]
        pub enum Code {
            $( $(#[doc = $doc])+ $variant, )+
        }

        impl Code {
            /// Every code, in catalogue order.
            pub const ALL: &'static [Code] = &[ $( Code::$variant, )+ ];

            /// The SCREAMING_SNAKE name of the code.
            pub const fn as_str(self) -> &'static str {
                match self { $( Code::$variant => stringify!($variant), )+ }
            }

            /// The class that decides HTTP status and exit code.
            pub const fn class(self) -> Class {
                match self { $( Code::$variant => Class::$class, )+ }
            }

            /// One-line meaning, for `--help`, logs and documentation.
            pub fn meaning(self) -> &'static str {
                match self { $( Code::$variant => concat!($($doc),+).trim_ascii(), )+ }
            }

            fn dbus_override(self) -> Option<&'static str> {
                match self { $( Code::$variant => $dbus, )+ }
            }
        }
    };
}

catalogue! {
    // ---- generic message handling -------------------------------------
    /// A message is not valid JSON, has a wrong type, or an unknown or missing field.
    MESSAGE_INVALID => Invalid, None;
    /// A string, list or number in a message is outside its bound.
    FIELD_BOUNDS_EXCEEDED => Invalid, None;
    /// A message's declared schema is not the one this endpoint accepts.
    SCHEMA_INVALID => Invalid, None;
    /// The client speaks another major version of the bus protocol than the supervisor.
    PROTOCOL_VERSION_MISMATCH => Conflict, None;
    /// A JSON value cannot be put in canonical form (floats, or nesting too deep).
    CANONICAL_JSON_UNSUPPORTED => Invalid, None;

    // ---- binding coordinates -------------------------------------------
    /// The task id is missing or not of the form [A-Za-z0-9][A-Za-z0-9._:-]{2,179}.
    TASK_ID_INVALID => Invalid, None;
    /// The job id is missing.
    JOB_ID_REQUIRED => Invalid, None;
    /// The job id is not of the task-id form.
    JOB_ID_INVALID => Invalid, None;
    /// The repository name is missing or malformed.
    REPOSITORY_INVALID => Invalid, None;
    /// The repository is not registered in the configuration.
    REPOSITORY_NOT_REGISTERED => Denied, None;
    /// base_oid is not a full lowercase hexadecimal object id.
    BASE_OID_INVALID => Invalid, None;
    /// expected_branch_oid is not a full lowercase hexadecimal object id.
    EXPECTED_BRANCH_OID_INVALID => Invalid, None;
    /// target_branch is not of the form agent/<name>.
    TARGET_BRANCH_INVALID => Invalid, None;
    /// target_branch names a protected ref (main, master, release/, tags, refs/, …).
    PROTECTED_REF_DENY => Denied, None;
    /// branch_mode is missing.
    BRANCH_MODE_MISSING => Invalid, None;
    /// branch_mode is neither CREATE_NEW nor CONTINUE_EXISTING.
    BRANCH_MODE_INVALID => Invalid, None;
    /// generation is not a positive integer.
    GENERATION_INVALID => Invalid, None;
    /// CREATE_NEW requires expected_branch_oid to equal base_oid.
    EXPECTED_BASE_CONFLICT => Invalid, None;
    /// An idempotency key is missing or not of the form [A-Za-z0-9][A-Za-z0-9._:-]{7,159}.
    IDEMPOTENCY_KEY_INVALID => Invalid, None;

    // ---- envelope against binding: one code per coordinate ---------------
    /// The envelope names another task than its binding.
    TASK_BINDING_CONFLICT => Conflict, None;
    /// The envelope names another job than its binding.
    JOB_BINDING_CONFLICT => Conflict, None;
    /// The envelope names another repository than its binding.
    WRONG_REPOSITORY_ENVELOPE_DENY => Conflict, None;
    /// The envelope names another base_oid than its binding.
    WRONG_BASE_ENVELOPE_DENY => Conflict, None;
    /// The envelope names another expected_branch_oid than its binding.
    WRONG_EXPECTED_HEAD_ENVELOPE_DENY => Conflict, None;
    /// The envelope names another target_branch than its binding.
    WRONG_BRANCH_ENVELOPE_DENY => Conflict, None;
    /// The envelope names another generation than its binding.
    WRONG_GENERATION_ENVELOPE_DENY => Conflict, None;
    /// The envelope names another branch_mode than its binding.
    BRANCH_MODE_BINDING_CONFLICT => Conflict, None;
    /// The envelope names another idempotency key than its binding.
    IDEMPOTENCY_BINDING_CONFLICT => Conflict, None;

    // ---- execution envelope ----------------------------------------------
    /// The envelope has no action.
    EXECUTION_ACTION_MISSING => Invalid, None;
    /// The action is neither deterministic nor source_capture.
    EXECUTION_ACTION_UNSUPPORTED => Invalid, None;
    /// capability_scope is not a bounded list of short non-empty strings.
    CAPABILITY_SCOPE_INVALID => Invalid, None;
    /// The envelope asks for a capability the executing side does not have.
    CAPABILITY_MISMATCH_DENY => Denied, None;
    /// The governance object is missing or malformed.
    GOVERNANCE_POLICY_REQUIRED => Invalid, None;
    /// The commit idempotency key is malformed.
    COMMIT_IDEMPOTENCY_KEY_INVALID => Invalid, None;
    /// writer_lease does not match the action (true exactly for deterministic).
    WRITER_LEASE_POLICY_DENY => Denied, None;
    /// A governance flag (main, production, tag, baseline write, force push, protected-ref bypass) is not false.
    POLICY_DENY => Denied, None;
    /// change_set or verification is not a list.
    EXECUTION_OPERATIONS_INVALID => Invalid, None;
    /// A source_capture envelope carries changes or verification commands.
    SOURCE_CAPTURE_MUTATION_DENY => Denied, None;
    /// source_signals are not the bounded, normalised list the projection produces.
    SOURCE_CAPTURE_SIGNALS_INVALID => Invalid, None;
    /// A deterministic envelope has an empty or malformed change set.
    CHANGE_SET_INVALID => Invalid, None;
    /// The declared execution_digest is not the digest of the envelope.
    EXECUTION_DIGEST_INVALID => Conflict, None;
    /// The stored envelope differs from the one the binding projects.
    EXECUTION_PROJECTION_CONFLICT => Conflict, None;

    // ---- change operations and paths ---------------------------------------
    /// A path is empty, absolute, or has '.', '..', '.git' or empty components.
    PATH_INVALID => Invalid, None;
    /// A path resolves outside the root it must stay under.
    PATH_ESCAPE => Denied, None;
    /// A change operation is not write_file, replace_text, write_symlink or delete_file.
    CHANGE_OPERATION_INVALID => Invalid, None;
    /// A write_symlink target is empty, absolute, or leaves the tree (lexically, from the link's directory).
    SYMLINK_TARGET_INVALID => Invalid, None;
    /// write_file content is missing or not text.
    WRITE_CONTENT_INVALID => Invalid, None;
    /// replace_text found a different number of occurrences than declared.
    REPLACE_COUNT_INVALID => Conflict, None;
    /// replace_text names a file that does not exist.
    REPLACE_SOURCE_MISSING => Conflict, None;
    /// A file's SHA-256 differs from the change's expected_sha256 guard.
    SOURCE_DRIFT => Conflict, None;
    /// A change or capture touches a credential path the policy does not allow.
    CREDENTIAL_PATH_DENIED => Denied, None;
    /// A verification command is malformed (empty argv, bad label or cwd).
    COMMAND_INVALID => Invalid, None;
    /// A verification command's program is not allowlisted.
    COMMAND_PROGRAM_DENY => Denied, None;
    /// python3 -m names a module that is not allowlisted.
    PYTHON_MODULE_DENY => Denied, None;
    /// A git verification command is not a read-only subcommand.
    GIT_MUTATION_DENY => Denied, None;
    /// A verification timeout is outside 1..=1800 seconds.
    COMMAND_TIMEOUT_INVALID => Invalid, None;

    // ---- proposals (the task builder: airlockctl propose) ------------------------
    /// A proposal adds or edits a file that is not UTF-8 text; binary content cannot be proposed.
    PROPOSAL_BINARY_CHANGE => Invalid, None;
    /// A proposal sets or clears a file's executable bit; file modes cannot be proposed.
    PROPOSAL_MODE_CHANGE => Invalid, None;
    /// A proposal changes a submodule, or turns a file into a symbolic link or back.
    PROPOSAL_SYMLINK_CHANGE => Invalid, None;
    /// A proposal changes nothing relative to its base.
    PROPOSAL_EMPTY => Invalid, None;
    /// A patch is not a unified diff the task builder can read (the detail names the line).
    PATCH_INVALID => Invalid, None;
    /// A patch hunk does not apply to the base (the detail names the file and the hunk's line).
    PATCH_HUNK_FAILED => Conflict, None;
    /// A revision does not name a commit in the repository.
    REVISION_NOT_FOUND => NotFound, None;
    /// The repository's files cannot be read by this user (not in the readers group, or not there).
    SOURCE_ACCESS_DENIED => Denied, None;
    /// A repository of that name is already registered, or its directory already exists.
    REPOSITORY_EXISTS => Conflict, None;
    /// The path given to repo add (or airlock-local --repo) is not a git repository.
    REPOSITORY_SOURCE_INVALID => Invalid, None;

    // ---- plan store ----------------------------------------------------------
    /// The plan's schema is not airlock.plan.v1.
    EXECUTION_PLAN_SCHEMA_INVALID => Invalid, None;
    /// The plan names another task or job than the binding.
    EXECUTION_PLAN_BINDING_CONFLICT => Conflict, None;
    /// The plan names another generation than the binding.
    EXECUTION_PLAN_GENERATION_CONFLICT => Conflict, None;
    /// The plan's source_head_oid is not the binding's source head.
    EXECUTION_PLAN_SOURCE_HEAD_CONFLICT => Conflict, None;
    /// The plan's idempotency key is malformed.
    EXECUTION_PLAN_IDEMPOTENCY_INVALID => Invalid, None;
    /// A registered plan must name its execution: a deterministic change or a source capture.
    EXECUTION_PLAN_DETERMINISTIC_REQUIRED => Invalid, None;
    /// The same plan idempotency key was used with other content.
    EXECUTION_PLAN_IDEMPOTENCY_CONFLICT => Conflict, None;
    /// A replacement did not name the digest of the plan it replaces.
    EXECUTION_PLAN_REPLACEMENT_CAS_MISMATCH => Conflict, None;
    /// A replacement was made against another source head than the stored plan.
    EXECUTION_PLAN_STALE_REPLACEMENT_DENY => Conflict, None;
    /// The stored plan's source head no longer matches the binding.
    EXECUTION_PLAN_SOURCE_HEAD_DRIFT => Conflict, None;
    /// A stored plan record is malformed.
    EXECUTION_PLAN_RECORD_INVALID => Internal, None;

    // ---- task store ------------------------------------------------------------
    /// No task has this id.
    TASK_NOT_FOUND => NotFound, None;
    /// The operation is not allowed in the task's current state.
    TASK_STATE_INVALID => Conflict, None;
    /// The task's attempt is moving its agent branch, or pushing it, under a fence (Worker1.Fence): it cannot be cancelled until the step ends (the detail says by when); cancel it again then.
    TASK_COMMITTING => Conflict, None;
    /// A task with this idempotency key exists with different content.
    TASK_IDEMPOTENCY_CONFLICT => Conflict, None;
    /// max_attempts is outside 1..=50.
    MAX_ATTEMPTS_INVALID => Invalid, None;
    /// The lease token does not match the task's current lease.
    LEASE_INVALID => Denied, None;
    /// The lease has expired.
    LEASE_EXPIRED => Conflict, None;
    /// The lease epoch is older than the task's current epoch (a fenced stale holder).
    LEASE_EPOCH_STALE => Conflict, None;
    /// The same result idempotency key was used with a different result.
    RESULT_IDEMPOTENCY_CONFLICT => Conflict, None;
    /// A verification decision is not accept, rework or reject, or has no reason.
    VERIFICATION_DECISION_INVALID => Invalid, None;
    /// The stored verification record is not valid JSON.
    TASK_VERIFICATION_INVALID => Conflict, None;
    /// The decision's idempotency key was used on this task with another decision.
    DECISION_IDEMPOTENCY_CONFLICT => Conflict, None;
    /// The task's revision or attempt is not the one the decision names: the task moved on since the admin looked.
    DECISION_CAS_MISMATCH => Conflict, None;
    /// The task's result is not the one whose SHA-256 the decision names.
    DECISION_RESULT_DRIFT => Conflict, None;
    /// expected_result_sha256 is neither null nor 64 lowercase hex digits.
    RESULT_SHA256_INVALID => Invalid, None;

    // ---- reconciliation cases (Reconcile1) -----------------------------------------
    /// No reconciliation case is recorded for that task (or that attempt of it).
    RECONCILIATION_NOT_FOUND => NotFound, None;
    /// A resolution is not adopt or fail, or its request is malformed.
    RECONCILIATION_RESOLUTION_INVALID => Invalid, None;
    /// The resolution's idempotency key was used on this task with another resolution.
    RECONCILIATION_IDEMPOTENCY_CONFLICT => Conflict, None;
    /// The case's attempt, revision or observed head is not the one the resolution names: the case changed since the admin looked.
    RECONCILIATION_CAS_MISMATCH => Conflict, None;
    /// The case is not open (already being adopted, adopted or failed).
    RECONCILIATION_CLOSED => Conflict, None;
    /// The branch moved again after the case recorded its head: the worker found another head when it checked an adoption; the case is open again with the new head.
    RECONCILIATION_HEAD_MOVED => Conflict, None;
    /// The head cannot be adopted: the branch is missing, or its head does not descend from the commit the task started from.
    RECONCILIATION_HEAD_UNRELATED => Conflict, None;

    // ---- retry extension (owner-controlled) -------------------------------------
    /// The request does not have exactly the retry-extension field set.
    RETRY_EXTENSION_FIELDS_INVALID => Invalid, None;
    /// expected_status is not FAILED.
    EXPECTED_STATUS_INVALID => Invalid, None;
    /// An integer field is not a non-negative integer.
    RETRY_EXTENSION_INTEGER_INVALID => Invalid, None;
    /// The task has attempts left; only an exhausted task may be extended.
    RETRY_EXTENSION_NOT_EXHAUSTED => Conflict, None;
    /// next_max_attempts must be exactly expected_max_attempts + 1.
    RETRY_EXTENSION_MUST_BE_BOUNDED_ONE_STEP => Invalid, None;
    /// next_max_attempts would exceed the cap of 50.
    RETRY_EXTENSION_LIMIT_EXCEEDED => Invalid, None;
    /// previous_verification_sha256 is not 64 lowercase hex digits.
    VERIFICATION_SHA256_INVALID => Invalid, None;
    /// authorization_id is malformed.
    AUTHORIZATION_ID_INVALID => Invalid, None;
    /// The service has no configured owner authorization id.
    TASK_RETRY_AUTHORIZATION_ID_MISSING => Unavailable, None;
    /// The configured owner authorization id is malformed.
    TASK_RETRY_AUTHORIZATION_ID_INVALID => Unavailable, None;
    /// The request's authorization_id is not the configured one.
    RETRY_EXTENSION_AUTHORIZATION_ID_MISMATCH => Denied, None;
    /// The idempotency key was used before with another request.
    RETRY_EXTENSION_IDEMPOTENCY_CONFLICT => Conflict, None;
    /// The task's verification record changed since the owner looked at it.
    RETRY_EXTENSION_VERIFICATION_DRIFT => Conflict, None;
    /// status, revision, attempt or max_attempts differ from the expected values.
    RETRY_EXTENSION_CAS_MISMATCH => Conflict, None;
    /// The task still holds a lease.
    RETRY_EXTENSION_ACTIVE_LEASE_DENY => Conflict, None;
    /// The control token file is missing, not a regular file, or a symlink.
    TASK_RETRY_CONTROL_CREDENTIAL_UNAVAILABLE => Unavailable, None;
    /// The control token is shorter than 32 characters.
    TASK_RETRY_CONTROL_CREDENTIAL_INVALID => Unavailable, None;

    // ---- HTTP front door ----------------------------------------------------------
    /// No bearer token, a wrong scheme, or a wrong token.
    UNAUTHORIZED => Unauthenticated, None;
    /// No such route.
    NOT_FOUND => NotFound, None;
    /// The Content-Length header is missing or malformed.
    CONTENT_LENGTH_INVALID => Invalid, None;
    /// The request body is empty or larger than allowed.
    REQUEST_SIZE_INVALID => TooLarge, None;
    /// The request body is not a JSON object in UTF-8.
    REQUEST_INVALID => Invalid, None;
    /// The service's runtime (its store) is not available.
    RUNTIME_UNAVAILABLE => Unavailable, None;

    // ---- checkpoint journal ----------------------------------------------------------
    /// The phase name is unknown.
    CHECKPOINT_PHASE_INVALID => Invalid, None;
    /// A checkpoint names an older attempt than the journal's head.
    CHECKPOINT_ATTEMPT_REGRESSION => Conflict, None;
    /// A checkpoint for the head attempt carries another execution digest.
    CHECKPOINT_EXECUTION_DIGEST_CONFLICT => Conflict, None;
    /// A checkpoint's binding (repository, branch, generation, …) differs from the journal's.
    CHECKPOINT_SCOPE_MISMATCH_DENY => Denied, None;
    /// A checkpoint goes back to an earlier phase of the same attempt.
    CHECKPOINT_PHASE_REGRESSION => Conflict, None;
    /// The journal holds a later attempt than the caller's.
    CHECKPOINT_FUTURE_ATTEMPT => Conflict, None;

    // ---- authorisation ---------------------------------------------------------------
    /// The authority (polkit) denied the action.
    AUTHORIZATION_DENIED => Denied, Some("org.freedesktop.DBus.Error.AccessDenied");
    /// The action needs interactive authentication and the caller did not allow it.
    INTERACTIVE_AUTHORIZATION_REQUIRED => InteractiveRequired, Some("org.freedesktop.DBus.Error.InteractiveAuthorizationRequired");
    /// The authority (polkit) could not be reached; airlock denies.
    AUTHORITY_UNAVAILABLE => Denied, None;
    /// The caller's unix uid is not the one this method is reserved for.
    PEER_UID_DENIED => Denied, None;
    /// A planner agent may not decide on a task it submitted (Verify, CancelTask, ResolveReconciliation), whatever polkit lets its user do: what an agent proposes is decided by someone else. Nothing changes; the refusal is recorded.
    SELF_APPROVAL_FORBIDDEN => Denied, None;

    // ---- executor ------------------------------------------------------------------
    /// The executor found a credential, a secret or a network it must not have.
    EXECUTOR_NOT_ISOLATED => Unavailable, None;
    /// The sandbox could not be fully applied and degraded mode is not allowed.
    SANDBOX_UNAVAILABLE => Unavailable, None;
    /// The source archive is missing, not regular, or too large.
    SOURCE_ARCHIVE_INVALID => Invalid, None;
    /// The source archive's SHA-256 differs from the request's.
    SOURCE_ARCHIVE_SHA_MISMATCH => Conflict, None;
    /// An archive member has an absolute, '..' or '.git' path.
    SOURCE_ARCHIVE_PATH_INVALID => Denied, None;
    /// An archive member is a hard link, or a symbolic link with an empty or over-long target.
    SOURCE_ARCHIVE_LINK_DENY => Denied, None;
    /// An archive member is a device, FIFO or other special file, or has setuid/setgid bits.
    SOURCE_ARCHIVE_MEMBER_DENY => Denied, None;
    /// The archive has too many entries, too many bytes, or expands like a bomb.
    SOURCE_ARCHIVE_LIMIT_EXCEEDED => TooLarge, None;
    /// An entry of the executor's tree cache, or a blob of the store it is built on, no longer holds what it was sealed with (changed on disk behind the executor's back): the entry is removed, and the next request for its tree fetches what it needs again.
    TREE_CACHE_CORRUPT => Conflict, None;
    /// A verification command exited non-zero, was killed, or timed out.
    VERIFICATION_FAILED => Conflict, None;
    /// A verification command failed after its job reached its memory limit (`executor.limits.job_memory_mib`, its cgroup's): the job's OOM killer ended a process of it. The command's evidence records the limit and the peak.
    COMMAND_MEMORY_EXCEEDED => Conflict, None;
    /// A verification command failed after its job reached its process limit (`executor.limits.job_processes`, its cgroup's `pids.max`): a fork was refused. The command's evidence records the limit and how many forks were refused.
    COMMAND_PROCESS_LIMIT => Conflict, None;
    /// A verification command was killed because its job wrote more than its disk quota (`executor.limits.job_disk_mib`) to its workspace and scratch: the executor watches what a job writes and kills the job's processes past it. The command's evidence records the quota and the peak written.
    COMMAND_DISK_EXCEEDED => Conflict, None;
    /// A verification command was killed because, while its job wrote, the free space of the executor's work file system fell below `executor.min_free_disk_mib` (the host's reserve): the job may have written less than its own quota; a later attempt, once space is freed, may pass. The command's evidence records what it had written.
    HOST_DISK_RESERVE => Conflict, None;
    /// A setup command of the repository's environment exited non-zero, was killed, or timed out: the dependency layer was not made (its output tail is in the failure); the attempt ends, and a later one may fetch again.
    SETUP_FAILED => Conflict, None;
    /// This executor cannot run the environment's setup: it needs the minimal root with a network namespace per command and airlock-egress's socket (see `airlockctl doctor`).
    SETUP_UNAVAILABLE => Unavailable, None;
    /// A changed or captured file is larger than allowed.
    FILE_TOO_LARGE => TooLarge, None;
    /// A spool file is not a regular file owned by its expected producer, or is too large.
    SPOOL_FILE_REJECTED => Denied, None;
    /// A spool file's digest does not match the request that caused it.
    SPOOL_DIGEST_MISMATCH => Conflict, None;
    /// The branch no longer holds the commit the worker made for the attempt (it moved behind the worker's back); the attempt is reported failed and the worker's journal keeps the head it observed.
    RECONCILIATION_REQUIRED => Conflict, None;
    /// The executor returned other paths than exactly the change set's, or than a capture's (an extra, a missing or a repeated path).
    CHANGED_PATHS_MISMATCH => Conflict, None;
    /// The spool could not be read, written, listed or watched (an I/O error, not a rejected file).
    SPOOL_UNAVAILABLE => Unavailable, None;
    /// The worker is stopping; an attempt it was driving resumes from its journal when it starts again.
    WORKER_STOPPING => Unavailable, None;

    // ---- egress proxy (airlock-egress) -------------------------------------------
    /// The process that connected to the egress proxy's socket runs as a uid the proxy does not serve (--allow-uid).
    EGRESS_PEER_DENIED => Denied, None;
    /// The egress connection's preamble is not one JSON line of the expected fields within its bounds, or names a session with other limits or hosts than its first connection.
    EGRESS_PREAMBLE_INVALID => Invalid, None;
    /// The request head sent to the egress proxy is malformed, too large, or not sent in time.
    EGRESS_REQUEST_INVALID => Invalid, None;
    /// The egress proxy serves CONNECT only: a plain-HTTP request could be read and forged on the way.
    EGRESS_METHOD_NOT_ALLOWED => Denied, None;
    /// The CONNECT target is not one of the environment's allowed host:port entries.
    EGRESS_HOST_NOT_ALLOWED => Denied, None;
    /// The CONNECT target's port is not one the egress proxy was started to reach (--connect-port).
    EGRESS_PORT_NOT_ALLOWED => Denied, None;
    /// The target is, or resolves to, an address the egress proxy never reaches (loopback, private, link-local, multicast, documentation and other special ranges).
    EGRESS_ADDRESS_FORBIDDEN => Denied, None;
    /// The egress proxy could not resolve the target's name.
    EGRESS_RESOLVE_FAILED => Unavailable, None;
    /// The egress proxy could not connect to any address of the target in time.
    EGRESS_CONNECT_FAILED => Unavailable, None;
    /// The session's bytes, wall time or connections are used up; the tunnel is closed or refused.
    EGRESS_LIMIT_EXCEEDED => TooLarge, None;
    /// The parent proxy of the target's route (its `via`) answered 401 or 407: the credential airlock-egress holds for it is missing or wrong. Only the administrator can mend it (the credential file, or the route).
    EGRESS_PARENT_AUTH_FAILED => Denied, None;
    /// The parent proxy of the target's route (its `via`) refused the CONNECT by its own policy (an answer other than 2xx, 401, 407 or a gateway failure).
    EGRESS_PARENT_REFUSED => Denied, None;

    // ---- git ----------------------------------------------------------------------
    /// The ref's current value is not the expected one (compare-and-swap lost).
    REF_CAS_MISMATCH => Conflict, None;
    /// A git object named by the binding is missing from the authority repository.
    GIT_OBJECT_MISSING => Conflict, None;
    /// A git operation failed.
    GIT_FAILED => Internal, None;

    // ---- upstream repositories ------------------------------------------------------
    /// The repository has no upstream (`repository[].upstream`) for what was asked.
    UPSTREAM_NOT_CONFIGURED => Invalid, None;
    /// The upstream's URL is not an ssh://, https:// or absolute local path one, or names what airlock never contacts.
    UPSTREAM_URL_INVALID => Invalid, None;
    /// The upstream could not be reached in time (network, DNS, connection refused); tried again with backoff.
    UPSTREAM_UNREACHABLE => Unavailable, None;
    /// The upstream refused the worker's credential (deploy key or token), or none is installed for it.
    UPSTREAM_AUTH_FAILED => Unauthenticated, None;
    /// The upstream's SSH host key is not the one pinned for the repository (or none is pinned).
    UPSTREAM_HOST_KEY_CHANGED => Denied, None;
    /// The upstream refused the push by its own policy (a protected branch, a hook, a read-only key).
    UPSTREAM_PUSH_REFUSED => Denied, None;
    /// The upstream's agent branch is neither where the task expects it nor at the task's commit: airlock never force-pushes; a reconciliation case settles it.
    UPSTREAM_BRANCH_MOVED => Conflict, None;
    /// A fetch from the upstream wrote more than `upstream.max_fetch_bytes` or ran past its time limit.
    UPSTREAM_FETCH_LIMIT => TooLarge, None;
    /// The repository's signing key is missing, unreadable or not an unencrypted Ed25519 SSH key.
    SIGNING_KEY_INVALID => Invalid, None;

    // ---- planner agents --------------------------------------------------------------
    /// No agent of that name is configured ([[agent]] in airlock.toml).
    AGENT_NOT_FOUND => NotFound, None;
    /// An agent proposed for a repository its [[agent]] table does not list.
    AGENT_REPOSITORY_DENIED => Denied, None;
    /// Not answered since protocol 8.0 (kept so that older peers still name it): replacing the plan of a task the caller did not submit is TASK_NOT_FOUND, as for a task that does not exist.
    AGENT_TASK_DENIED => Denied, None;
    /// The task was QUEUED when its submitting agent's right to it was withdrawn: the agent was removed from the configuration, or its repositories narrowed to exclude the task's, on a reload; or an operator cancelled a stopped agent's queued tasks (`airlockctl agent cancel-queued`). The task ended CANCELLED; submit it again from an agent that may.
    AGENT_REVOKED => Denied, None;
    /// The agent is running (or starting, or waiting to restart): stop it first (`airlockctl agent stop NAME`), so that it queues no more while its queue is cancelled.
    AGENT_RUNNING => Conflict, None;
    /// A planner agent's submission would take it over one of its quotas (`[[agent]] tasks_per_hour`: tasks it submitted in the last 3,600 s of the store's clock; `cpu_seconds_per_day`: what its tasks' verification used in the last 86,400 s); the detail names the quota and its figures. Nothing is stored and the refusal is recorded. Not retryable in a loop: a submission is accepted again once enough of the window's use has aged out.
    AGENT_QUOTA_EXCEEDED => Denied, None;
    /// The agent failed 5 times in a row and is held: nothing restarts it until an operator clears the hold (retryable once cleared).
    AGENTOS_CRASH_LOOP => Unavailable, None;

    // ---- configuration, storage, internals -----------------------------------------
    /// The configuration file is missing or invalid.
    CONFIG_INVALID => Invalid, None;
    /// A repository's verification environment is malformed (a key, a path, a program name, a list).
    ENVIRONMENT_INVALID => Invalid, None;
    /// A verification environment's path is not a root-owned directory that only root may write (or a directory above it is not).
    ENVIRONMENT_PATH_UNSAFE => Denied, None;
    /// A verification environment's program is not an executable file, or a bare name is in none of its PATH directories.
    ENVIRONMENT_PROGRAM_UNRESOLVED => Invalid, None;
    /// A verification environment's variable looks like a secret; credentials never go into an environment.
    ENVIRONMENT_VARIABLE_SECRET => Denied, None;
    /// A verification environment's egress entry is not host:port.
    ENVIRONMENT_EGRESS_INVALID => Invalid, None;
    /// The database could not be opened or written.
    STORE_UNAVAILABLE => Unavailable, None;
    /// The database failed its integrity check.
    STORE_CORRUPT => Internal, None;
    /// The database was written by a newer airlock than this one.
    SCHEMA_VERSION_UNSUPPORTED => Unavailable, None;
    /// An internal invariant failed; this is a bug.
    INTERNAL => Internal, None;
}

impl Code {
    /// The D-Bus error name: `org.airlock.Error.<CODE>` unless the code maps
    /// to one of the standard freedesktop names clients already understand.
    pub fn dbus_error_name(self) -> String {
        match self.dbus_override() {
            Some(name) => name.to_owned(),
            None => format!("{DBUS_ERROR_PREFIX}{}", self.as_str()),
        }
    }

    /// HTTP status for this code.
    pub const fn http_status(self) -> u16 {
        self.class().http_status()
    }

    /// CLI exit code for this code.
    pub const fn exit_code(self) -> u8 {
        self.class().exit_code()
    }

    /// Whether the same request may succeed later unchanged, once the
    /// condition clears (a dependency is back, an operator cleared a hold):
    /// the codes of [`Class::Unavailable`]. Every other refusal stays a
    /// refusal until the request changes.
    pub const fn retryable(self) -> bool {
        matches!(self.class(), Class::Unavailable)
    }

    /// Whether the condition may clear by itself, so the same step may be
    /// tried again unchanged: the worker retries a transient failure in
    /// place (while its lease holds) instead of failing the attempt. The
    /// same set as [`Code::retryable`], in the worker's words.
    pub const fn transient(self) -> bool {
        self.retryable()
    }

    /// Whether the worker, meeting this code while it drives an attempt,
    /// ends the attempt with a failed result carrying the code (so the
    /// supervisor records the real reason, and an administrator sees it in
    /// `airlockctl show`). False for transient codes (retried in place) and
    /// for the codes that say the worker no longer owns the attempt — its
    /// lease is gone or fenced, the task moved on, the supervisor holds
    /// another result, its journal belongs to another attempt or scope —
    /// after which it must not report anything: it records
    /// `reconciliation_required` instead.
    pub const fn fails_attempt(self) -> bool {
        !self.transient()
            && !matches!(
                self,
                Code::LEASE_INVALID
                    | Code::LEASE_EXPIRED
                    | Code::LEASE_EPOCH_STALE
                    | Code::TASK_STATE_INVALID
                    | Code::TASK_NOT_FOUND
                    | Code::RESULT_IDEMPOTENCY_CONFLICT
                    | Code::CHECKPOINT_PHASE_INVALID
                    | Code::CHECKPOINT_ATTEMPT_REGRESSION
                    | Code::CHECKPOINT_EXECUTION_DIGEST_CONFLICT
                    | Code::CHECKPOINT_SCOPE_MISMATCH_DENY
                    | Code::CHECKPOINT_PHASE_REGRESSION
                    | Code::CHECKPOINT_FUTURE_ATTEMPT
                    | Code::PEER_UID_DENIED
                    | Code::AUTHORIZATION_DENIED
                    | Code::PROTOCOL_VERSION_MISMATCH
            )
    }

    /// Whether a failed attempt with this code ends its task at once:
    /// another attempt of the same plan cannot go differently. The
    /// repository is gone, the branch moved behind the worker's back (a
    /// reconciliation case settles it), or a policy refused the plan — a
    /// program, a module or a git subcommand its repository does not
    /// allow, an environment unusable on this host, a setup asking the
    /// egress proxy for what its environment does not list or a parent proxy
    /// refusing airlock-egress's credential, or an upstream
    /// that refuses the worker's key, host key or push, or is not set up —
    /// which only an administrator's change, not a retry, alters.
    pub const fn ends_task(self) -> bool {
        matches!(
            self,
            Code::REPOSITORY_NOT_REGISTERED
                | Code::RECONCILIATION_REQUIRED
                | Code::COMMAND_PROGRAM_DENY
                | Code::PYTHON_MODULE_DENY
                | Code::GIT_MUTATION_DENY
                | Code::ENVIRONMENT_INVALID
                | Code::ENVIRONMENT_PATH_UNSAFE
                | Code::ENVIRONMENT_PROGRAM_UNRESOLVED
                | Code::ENVIRONMENT_VARIABLE_SECRET
                | Code::ENVIRONMENT_EGRESS_INVALID
                | Code::SETUP_UNAVAILABLE
                | Code::EGRESS_HOST_NOT_ALLOWED
                | Code::EGRESS_PORT_NOT_ALLOWED
                | Code::EGRESS_ADDRESS_FORBIDDEN
                | Code::EGRESS_METHOD_NOT_ALLOWED
                | Code::EGRESS_PARENT_AUTH_FAILED
                | Code::EGRESS_PARENT_REFUSED
                | Code::UPSTREAM_NOT_CONFIGURED
                | Code::UPSTREAM_URL_INVALID
                | Code::UPSTREAM_AUTH_FAILED
                | Code::UPSTREAM_HOST_KEY_CHANGED
                | Code::UPSTREAM_PUSH_REFUSED
                | Code::SIGNING_KEY_INVALID
        )
    }

    /// Looks a code up by its SCREAMING_SNAKE name.
    pub fn from_name(name: &str) -> Option<Code> {
        Code::ALL.iter().copied().find(|c| c.as_str() == name)
    }

    /// Looks a code up by its D-Bus error name.
    pub fn from_dbus_error_name(name: &str) -> Option<Code> {
        Code::ALL
            .iter()
            .copied()
            .find(|c| c.dbus_error_name() == name)
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A refusal: a catalogue code plus a human detail (never a secret).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code}{}", detail.as_deref().map(|d| format!(": {d}")).unwrap_or_default())]
pub struct Error {
    /// The stable code.
    pub code: Code,
    /// What exactly was wrong, for a human. Never part of the contract.
    pub detail: Option<String>,
}

impl Error {
    /// A refusal with no further detail.
    pub fn new(code: Code) -> Self {
        Error { code, detail: None }
    }

    /// A refusal with a detail for the human reading it.
    pub fn with(code: Code, detail: impl Into<String>) -> Self {
        Error {
            code,
            detail: Some(detail.into()),
        }
    }
}

impl From<Code> for Error {
    fn from(code: Code) -> Self {
        Error::new(code)
    }
}

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn every_code_has_one_name_and_round_trips() {
        let mut names = HashSet::new();
        for code in Code::ALL {
            assert!(names.insert(code.as_str()), "duplicate {code}");
            assert_eq!(Code::from_name(code.as_str()), Some(*code));
            assert_eq!(
                Code::from_dbus_error_name(&code.dbus_error_name()),
                Some(*code)
            );
            assert!(
                code.as_str()
                    .bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_'),
                "{code} is not SCREAMING_SNAKE"
            );
            assert!(!code.meaning().is_empty());
        }
    }

    #[test]
    fn dbus_names_are_valid_error_names() {
        for code in Code::ALL {
            let name = code.dbus_error_name();
            assert!(name.len() <= 255);
            for element in name.split('.') {
                assert!(!element.is_empty());
                assert!(!element.as_bytes()[0].is_ascii_digit());
                assert!(
                    element
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_')
                );
            }
        }
    }

    #[test]
    fn classes_map_to_distinct_exit_codes_and_expected_statuses() {
        assert_eq!(Code::TASK_NOT_FOUND.http_status(), 404);
        assert_eq!(Code::RETRY_EXTENSION_CAS_MISMATCH.http_status(), 409);
        assert_eq!(
            Code::RETRY_EXTENSION_AUTHORIZATION_ID_MISMATCH.http_status(),
            403
        );
        assert_eq!(Code::REQUEST_SIZE_INVALID.http_status(), 413);
        assert_eq!(Code::UNAUTHORIZED.http_status(), 401);
        assert_eq!(Code::RUNTIME_UNAVAILABLE.http_status(), 503);
        assert_eq!(
            Code::INTERACTIVE_AUTHORIZATION_REQUIRED.dbus_error_name(),
            "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired"
        );
        let exits: HashSet<u8> = Code::ALL.iter().map(|c| c.class().exit_code()).collect();
        let classes: HashSet<Class> = Code::ALL.iter().map(|c| c.class()).collect();
        assert_eq!(exits.len(), classes.len());
        assert!(exits.iter().all(|e| *e >= 3));
    }

    #[test]
    fn a_policy_refusal_ends_its_task_and_a_failing_test_does_not() {
        for c in [
            Code::COMMAND_PROGRAM_DENY,
            Code::PYTHON_MODULE_DENY,
            Code::GIT_MUTATION_DENY,
            Code::ENVIRONMENT_PATH_UNSAFE,
            Code::REPOSITORY_NOT_REGISTERED,
        ] {
            assert!(c.ends_task() && c.fails_attempt(), "{c:?}");
        }
        for c in [
            Code::VERIFICATION_FAILED,
            Code::SOURCE_DRIFT,
            Code::SANDBOX_UNAVAILABLE,
        ] {
            assert!(!c.ends_task(), "{c:?}");
        }
    }

    #[test]
    fn a_crash_loop_is_retryable_and_a_denial_is_not() {
        assert!(Code::AGENTOS_CRASH_LOOP.retryable());
        assert_eq!(Code::AGENTOS_CRASH_LOOP.http_status(), 503);
        assert!(Code::STORE_UNAVAILABLE.retryable());
        assert!(!Code::AGENT_REPOSITORY_DENIED.retryable());
        assert!(!Code::AGENT_TASK_DENIED.retryable());
        assert!(!Code::AGENT_NOT_FOUND.retryable());
        assert!(!Code::AGENT_QUOTA_EXCEEDED.retryable());
        assert!(!Code::MESSAGE_INVALID.retryable());
    }

    #[test]
    fn the_worker_fails_an_attempt_only_with_a_permanent_code_about_the_attempt() {
        for c in [
            Code::GIT_FAILED,
            Code::GIT_OBJECT_MISSING,
            Code::STORE_CORRUPT,
            Code::CHANGED_PATHS_MISMATCH,
            Code::SPOOL_DIGEST_MISMATCH,
            Code::SPOOL_FILE_REJECTED,
            Code::CAPABILITY_MISMATCH_DENY,
            Code::REF_CAS_MISMATCH,
            Code::INTERNAL,
        ] {
            assert!(c.fails_attempt() && !c.transient(), "{c:?}");
        }
        for c in [
            Code::SPOOL_UNAVAILABLE,
            Code::STORE_UNAVAILABLE,
            Code::RUNTIME_UNAVAILABLE,
            Code::WORKER_STOPPING,
        ] {
            assert!(c.transient() && !c.fails_attempt(), "{c:?}");
        }
        for c in [
            Code::LEASE_EXPIRED,
            Code::RESULT_IDEMPOTENCY_CONFLICT,
            Code::CHECKPOINT_SCOPE_MISMATCH_DENY,
        ] {
            assert!(!c.transient() && !c.fails_attempt(), "{c:?}");
        }
    }

    #[test]
    fn display_carries_code_and_detail() {
        assert_eq!(Error::new(Code::PATH_ESCAPE).to_string(), "PATH_ESCAPE");
        assert_eq!(
            Error::with(Code::SOURCE_DRIFT, "a.txt").to_string(),
            "SOURCE_DRIFT: a.txt"
        );
    }
}

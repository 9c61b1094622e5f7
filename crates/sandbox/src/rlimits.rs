//! Resource limits, soft = hard so the command cannot raise them:
//! processes, address space, file size, open files, CPU time, and never a
//! core dump (a core could hold whatever the command read).

use nix::sys::resource::{Resource, setrlimit};

use crate::error::{Error, Result, errno};
use crate::policy::Limits;

/// Applies `limits` and RLIMIT_CORE = 0.
pub fn apply(limits: &Limits) -> Result<()> {
    let table: [(Resource, &'static str, Option<u64>); 6] = [
        (Resource::RLIMIT_CORE, "RLIMIT_CORE", Some(0)),
        (Resource::RLIMIT_NPROC, "RLIMIT_NPROC", limits.nproc),
        (Resource::RLIMIT_AS, "RLIMIT_AS", limits.address_space),
        (Resource::RLIMIT_FSIZE, "RLIMIT_FSIZE", limits.file_size),
        (Resource::RLIMIT_NOFILE, "RLIMIT_NOFILE", limits.open_files),
        (Resource::RLIMIT_CPU, "RLIMIT_CPU", limits.cpu_seconds),
    ];
    for (resource, name, value) in table {
        if let Some(v) = value {
            setrlimit(resource, v, v).map_err(|e| Error::Rlimit {
                resource: name,
                source: errno(e),
            })?;
        }
    }
    Ok(())
}

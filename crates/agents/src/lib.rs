//! airlock-agents: planner agents the supervisor runs.
//!
//! - [`policy`]: seed 000's crash-loop restart policy as a pure state
//!   machine (time and jitter are arguments), whose whole state is one
//!   [`AgentRecord`] the supervisor stores;
//! - [`driver`]: the port (start, probe, stop) every driver implements;
//! - [`runner`]: one task per agent that races every driver call against a
//!   timeout, feeds the policy and stores its record after every change;
//! - [`process`]: the process driver (airlock-local, no systemd), each
//!   agent in a cgroup of its own ([`cgroup`]);
//! - [`systemd`]: the systemd driver (`airlock-agent@NAME.service` over
//!   `org.freedesktop.systemd1`).
//!
//! # Example
//!
//! ```
//! use airlock_agents::policy::{self, AgentRecord, Exit, Input, Policy, Status};
//!
//! let p = Policy::SEED;
//! let mut r = AgentRecord::new(0);
//! policy::step(&p, &mut r, Input::OperatorStart, 0, 0.0);
//! for i in 0..5u64 {
//!     policy::step(&p, &mut r, Input::Tick, 100_000 * i, 0.0);
//!     policy::step(&p, &mut r, Input::StartFailed(Exit::default()), 100_000 * i, 0.0);
//! }
//! assert_eq!(r.status, Status::Held);
//! assert_eq!(
//!     policy::step(&p, &mut r, Input::OperatorStart, 600_000, 0.0).refused,
//!     Some(airlock_proto::Code::AGENTOS_CRASH_LOOP)
//! );
//! ```
//!
//! Owns: planner agents' supervision: the crash-loop policy, the systemd
//! and process drivers, which agent is calling.
//! Never: open the task store, run git or task code, or decide a task:
//! agents reach tasks only through the supervisor's bus interface.

pub mod cgroup;
pub mod driver;
pub mod host;
pub mod policy;
pub mod process;
pub mod runner;
pub mod systemd;

use std::collections::HashMap;
use std::sync::Mutex;

pub use driver::{Driver, DriverError, Liveness};
pub use policy::{AgentRecord, Exit, Now, Policy, Status};
pub use runner::{AgentHandle, Clock, Command, Options, RecordStore, StoreError, SystemClock};

/// Records kept in memory: tests, and a store that need not outlive the
/// process.
#[derive(Debug, Default)]
pub struct MemoryStore {
    records: Mutex<HashMap<String, AgentRecord>>,
}

impl RecordStore for MemoryStore {
    fn load(&self, name: &str) -> Result<Option<AgentRecord>, StoreError> {
        let records = self
            .records
            .lock()
            .map_err(|_| StoreError("poisoned".into()))?;
        Ok(records.get(name).cloned())
    }

    fn save(&self, name: &str, record: &AgentRecord) -> Result<(), StoreError> {
        let mut records = self
            .records
            .lock()
            .map_err(|_| StoreError("poisoned".into()))?;
        records.insert(name.to_owned(), record.clone());
        Ok(())
    }
}

//! Launching the job's executors (node daemons and trainers) and following them.
//!
//! A [`Launcher`] starts processes and tells how they ended; [`supervise`] decides, as pure
//! functions, what to launch again under the job's failover rules. [`local`] runs executors as
//! processes on this machine, each under a small supervisor (`sluice shim`) in its own session, so
//! they outlive an AM that is killed, and a new AM of the same job adopts them.

pub mod local;
pub mod supervise;

use crate::error::Result;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

pub use supervise::{ExecutorRecord, ExecutorState, Executors, Exit, LaunchAction};

/// One process the AM runs for a job.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ExecutorId {
    /// The node daemon of node `n`.
    Daemon(u32),
    /// A trainer of a role, by its rank in the job.
    Trainer {
        /// The role's name.
        role: String,
        /// The rank.
        rank: u32,
    },
}

impl fmt::Display for ExecutorId {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExecutorId::Daemon(node) => write!(formatter, "daemon-{node}"),
            ExecutorId::Trainer { role, rank } => write!(formatter, "trainer-{role}-{rank}"),
        }
    }
}

/// What to start for an executor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchSpec {
    /// The executor.
    pub id: ExecutorId,
    /// The program and its arguments.
    pub command: Vec<String>,
    /// Environment variables added to the launcher's own.
    pub env: BTreeMap<String, String>,
}

/// What a launcher sees of an executor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observation {
    /// The launcher never started it, or forgot it.
    Unknown,
    /// It runs.
    Running,
    /// It ended.
    Exited(Exit),
}

/// Starts executors and tells how they are doing.
pub trait Launcher: Send + Sync + fmt::Debug {
    /// Starts an executor; an earlier process of the same executor must have ended.
    fn launch(&self, spec: &LaunchSpec) -> Result<()>;
    /// Tells how an executor is doing.
    fn observe(&self, id: &ExecutorId) -> Observation;
    /// Asks an executor to end (SIGTERM to it and everything it started): it may finish what it
    /// is doing first; [`Launcher::kill`] ends it for good.
    fn terminate(&self, id: &ExecutorId);
    /// Stops an executor and everything it started.
    fn kill(&self, id: &ExecutorId);
}

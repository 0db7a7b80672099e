//! Launching the job's executors (node daemons and trainers) and following them.
//!
//! A [`Launcher`] starts processes and tells, as a stream of [`ExecutorEvent`]s, how they ended;
//! [`supervise`] decides, as pure functions, what to launch again under the job's failover rules.
//! [`local`] runs executors as processes on this machine, each under a small supervisor (`sluice
//! shim`) in its own session, so they outlive an AM that is killed, and a new AM of the same job
//! adopts them. [`slurm`] runs each executor as a step of the Slurm allocation the AM runs in.

pub mod local;
pub mod slurm;
pub mod supervise;

use crate::error::Result;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Mutex;
use tokio::sync::mpsc;

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
    /// The node it runs on: a daemon's own node, or the node that feeds a trainer's rank.
    pub node: u32,
    /// The program and its arguments.
    pub command: Vec<String>,
    /// Environment variables added to the launcher's own.
    pub env: BTreeMap<String, String>,
}

/// What a launcher saw happen to an executor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecutorEvent {
    /// The executor ended. Every executor launched or adopted ends with exactly one such event.
    Exited {
        /// The executor.
        id: ExecutorId,
        /// How it ended; an executor the launcher knows nothing of counts as killed.
        exit: Exit,
        /// What the launcher knows of why, beyond the exit (`OOMKilled`, an eviction, an image
        /// that cannot be pulled), for the job's error.
        cause: Option<String>,
    },
}

/// The stream of a launcher's [`ExecutorEvent`]s: the launcher sends, and the AM that supervises
/// the executors takes the receiving end once.
#[derive(Debug)]
pub struct EventChannel {
    sender: mpsc::UnboundedSender<ExecutorEvent>,
    receiver: Mutex<Option<mpsc::UnboundedReceiver<ExecutorEvent>>>,
}

impl Default for EventChannel {
    fn default() -> EventChannel {
        let (sender, receiver) = mpsc::unbounded_channel();
        EventChannel {
            sender,
            receiver: Mutex::new(Some(receiver)),
        }
    }
}

impl EventChannel {
    /// Sends an event; it is kept until the AM takes it.
    pub fn send(&self, event: ExecutorEvent) {
        // The receiver lives as long as the channel unless the AM dropped it, when no one is left
        // to tell.
        let _ = self.sender.send(event);
    }

    /// The receiving end, the first time only.
    pub fn take(&self) -> Option<mpsc::UnboundedReceiver<ExecutorEvent>> {
        self.receiver
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take()
    }
}

/// Starts executors, stops them, and tells as events how they end: the AM never asks a launcher
/// how an executor is doing, so that a launcher backed by a cluster's own watch (Slurm's steps,
/// Kubernetes' pods) plugs in as it is.
pub trait Launcher: Send + Sync + fmt::Debug {
    /// Starts an executor; an earlier process of the same executor must have ended. Its end comes
    /// as an [`ExecutorEvent::Exited`].
    fn launch(&self, spec: &LaunchSpec) -> Result<()>;
    /// Follows an executor that an earlier AM of the job launched and the journal says runs, so
    /// that its end comes as an event too; one the launcher cannot find is reported ended at once.
    fn adopt(&self, id: &ExecutorId);
    /// Asks an executor to end (SIGTERM to it and everything it started): it may finish what it
    /// is doing first; [`Launcher::kill`] ends it for good.
    fn terminate(&self, id: &ExecutorId);
    /// Stops an executor and everything it started.
    fn kill(&self, id: &ExecutorId);
    /// The executors' events, to the first caller only.
    fn events(&self) -> Option<mpsc::UnboundedReceiver<ExecutorEvent>>;
    /// Whether executors run on other hosts than the AM's, and so reach it at its advertised
    /// address rather than at loopback.
    fn remote(&self) -> bool {
        false
    }
}

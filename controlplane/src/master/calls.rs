//! What daemons, trainers and operators ask of the master, and what it answers, in the master's
//! own terms. The service turns the `sluice.v1` messages into these and back (`crate::wire`), so
//! that the master never sees a wire type.
//!
//! Two things stay wire types on purpose: a daemon's pipeline and ring statistics
//! ([`Heartbeat::stages`], [`Heartbeat::rings`]), which the master only keeps to show them again
//! (what it decides on, each ring's batches per epoch, comes apart as [`Heartbeat::ring_batches`]),
//! and the status views (`Master::status`), which are a projection onto the status reply and
//! nothing else; a domain copy of either would repeat the proto field by field and decide nothing.

use crate::decide::{Assignment, NodeId, Refusal, ReportOutcome, TaskId, TaskProgress};
use sluice_proto::v1;

/// What the master tells a daemon to do, in the order given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeCommand {
    /// Run these tasks (new ones, or ones the daemon resumes after registering).
    Assign(Vec<Assignment>),
    /// Deliver `task`'s rows only up to `row`.
    Stop {
        /// The task to cut.
        task: TaskId,
        /// The first row not to deliver.
        row: u64,
    },
    /// Drop every task and the unread ring contents, then register again holding nothing.
    Fence,
    /// A role was scaled or a checkpoint restored: give every task and ring back, then register
    /// again.
    Release,
    /// The job is over: stop.
    Shutdown,
    /// The request, or part of it, was not applied.
    Refuse(Refusal),
    /// With `data.even_batches`: the current epoch, where a ring opened now starts, and the
    /// batches every ring pads up to in the epochs settled, the latest last.
    Settled {
        /// The current epoch.
        current: u32,
        /// Settled epochs and their counts.
        epochs: Vec<(u32, u64)>,
        /// With `drop`, the batches every ring may write in the epochs not settled yet.
        allowed: Vec<(u32, u64)>,
    },
}

/// A daemon registers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// The node the daemon serves.
    pub node: NodeId,
    /// The job the daemon was started for; empty when it takes whatever job the AM runs.
    pub job_id: String,
    /// The daemon's host name, for the status views, and its node's name when `by_host`.
    pub hostname: String,
    /// The tasks it still holds, with their counts.
    pub held: Vec<TaskProgress>,
    /// Whether the daemon was started without a node id, so that the master picks its node by its
    /// host name ([`Master::register`](super::Master::register)); `node` is then the node whose
    /// rings it found on its host, if it found any.
    pub by_host: bool,
}

/// The master's answer to a registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    /// The node the daemon serves.
    pub node: NodeId,
    /// What the daemon does first.
    pub commands: Vec<NodeCommand>,
    /// The trainer ranks it opens rings for.
    pub ranks: Vec<u32>,
    /// The number of ranks those belong to.
    pub world_size: u32,
    /// Whether the node serves the trainers that announce themselves to it (the external
    /// launcher), rather than `ranks`.
    pub attach: bool,
    /// The job's current epoch, where the rings it opens empty start.
    pub current_epoch: u32,
}

/// A ring's batches in one epoch, as its daemon counted them, pads included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochBatches {
    /// The epoch.
    pub epoch: u32,
    /// The batches handed to the ring's writer in it.
    pub batches: u64,
}

/// A daemon reports liveness, counts and pipeline statistics.
#[derive(Debug, Clone, PartialEq)]
pub struct Heartbeat {
    /// The node reporting.
    pub node: NodeId,
    /// Its tasks' counts.
    pub progress: Vec<TaskProgress>,
    /// Its pipeline's stages, as shown in status.
    pub stages: Vec<v1::StageStats>,
    /// Its rings, as shown in status.
    pub rings: Vec<v1::RingStats>,
    /// Per ring, in the order of `rings`, its batches in its last epochs (`data.even_batches`).
    pub ring_batches: Vec<Vec<EpochBatches>>,
    /// How it tunes its reading, as shown in status.
    pub tuning: Option<v1::ReadTuning>,
    /// Its host's name; empty when unknown.
    pub hostname: String,
    /// The daemon keeps reporting a task consumed to its end until the AM's journal mark says its
    /// end is durable, so that the AM may answer before it is.
    pub keeps_finished_until_durable: bool,
    /// The rows of its tasks it skipped because they did not decode, reported again with the
    /// tasks' counts.
    pub bad: Vec<(TaskId, super::BadRange)>,
    /// Per task, the rows handed to its ring's writer, relative to the task's start; read before
    /// the rings' batch counts in `rings`.
    pub handed: Vec<(TaskId, u64)>,
    /// The rows of its tasks its rings left out of their epoch (`data.even_batches: drop`),
    /// reported again with the tasks' counts: split rows `(first_row, row_count)`.
    pub dropped: Vec<(TaskId, (u64, u64))>,
}

/// A daemon ends a task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskReport {
    /// The node reporting.
    pub node: NodeId,
    /// The task it ends.
    pub task: TaskId,
    /// Rows of the task its trainers consumed.
    pub consumed: u64,
    /// How the task ended.
    pub outcome: ReportOutcome,
}

/// A role's size before and after a scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scaled {
    /// The trainers the role had.
    pub previous_num: u32,
    /// The trainers it has now.
    pub num: u32,
}

/// Where a job stands as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobPhase {
    /// No daemon has registered yet.
    Starting,
    /// Daemons feed trainers.
    Running,
    /// A stop was asked for, or the job ended and daemons are still being shut down.
    Stopping,
    /// Every row was delivered (or every trainer exited with success).
    Succeeded,
    /// A task or an executor failed for good.
    Failed,
    /// Stopped on request before its end.
    Stopped,
}

impl JobPhase {
    /// Whether the job has ended.
    pub fn is_over(self) -> bool {
        matches!(
            self,
            JobPhase::Succeeded | JobPhase::Failed | JobPhase::Stopped
        )
    }
}

/// One rank's data position at a training step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RankCommit {
    /// The training step.
    pub step: u64,
    /// The rank committing.
    pub rank: u32,
    /// The number of ranks that commit this step.
    pub world_size: u32,
    /// The epoch the rank reads.
    pub epoch: u32,
    /// Per task the rank has read: the row its reading ended at.
    pub positions: Vec<(TaskId, u64)>,
}

/// What a restore does beyond the task table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestoreEffect {
    /// The job already stands at the checkpoint: nothing changes.
    AlreadyThere,
    /// The AM restarts the trainers, which load their state again.
    TrainersRestart,
    /// The AM launches nothing: the rings are replaced, and the trainers reading them go on.
    RingsReplaced,
}

/// The master's answer to a restore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// The step the checkpoint was committed at (0 when this AM did not store it).
    pub step: u64,
    /// The epoch the job reads from the checkpoint on.
    pub epoch: u32,
    /// What the restore does beyond the task table.
    pub effect: RestoreEffect,
    /// The stored checkpoints of steps after this one, which belong to the run the restore left:
    /// the job forgets their steps, and under `checkpoint.keep` their objects are deleted.
    pub forgotten: Vec<String>,
}

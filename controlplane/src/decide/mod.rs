//! The task table and the AM's decisions, as pure functions of the form
//! `decide(state, event) -> actions`.
//!
//! # Implementation
//! The input is a list of splits, each known here only by its row count and its index. An epoch cuts
//! every split into tasks of at most `task_rows` rows, `(task_id, epoch, split, [start, end))`, and
//! hands them out in an order that is a permutation seeded by `(job seed, epoch)`. Epoch `e + 1` is
//! planned when every row of epoch `e` is consumed or belongs to a failed task.
//!
//! Rows here are positions in a split's delivery order. A daemon reports per task two counts
//! relative to the task's `start`: `enqueued` (rows written into its rings) and `consumed` (rows its
//! trainers released). A ring is FIFO, so the consumed rows are always `[start, start + consumed)`.
//!
//! The protocol, event by event:
//! - **Register.** A daemon registers with the tasks it still holds. A daemon that restarts before
//!   its heartbeat timeout keeps the tasks it reports, with their counts, and gets their assignments
//!   again ([`Action::Resume`]) to resume them; a task the AM gave it and it does not report is
//!   queued again from its last consumed count.
//! - **Acquire.** A daemon pulls up to N tasks: re-queued tasks first, then the epoch's order.
//! - **Heartbeat.** Progress counts. A task whose consumed count reaches its length is done.
//! - **Re-split.** When nothing is pending and an idle daemon asks for work, the AM picks the task
//!   with the most rows not yet enqueued and tells its holder to stop at row `k`, at least
//!   `resplit_margin_rows` past what the holder last reported enqueued. The holder acknowledges with
//!   the row `k' >= k` where it really stops (it cannot take back rows already in a ring). Only then
//!   does the AM cut the task at `k'` and queue `[k', end)` as a new task. Nothing is ever handed out
//!   twice, so no row is delivered twice.
//!   With `even_batches`, any node with a ring that ran dry that asks for work while nothing is
//!   pending may trigger a re-split, of another node's task or of its own (a node whose one ring
//!   ran dry while another holds the rest of the epoch), with no margin and down to one row:
//!   trainers that step in lockstep stop at a dry ring, and the rows still to be handed to a full
//!   ring must move to it. So the pieces, and every task queued again, go only to a node that says
//!   it has a dry ring ([`Event::AcquireEven`]).
//! - **Report.** A daemon reports a task done (its consumed count equals its length) or failed. A
//!   failed task's consumed count is final: the daemon reports failure only once the rows it
//!   enqueued for the task are consumed or dropped from its rings. The task is queued again from
//!   that count, until it has failed `max_task_attempts` times; then its remaining rows are failed.
//!   A node with `blacklist_after_failures` failures is blacklisted.
//! - **Tick.** A daemon not heard from within `heartbeat_timeout_ms` is lost: its tasks are queued
//!   again from their last reported consumed counts. Rows its trainers consumed after that report
//!   are lost with the node.
//!
//! A node that is lost or blacklisted is fenced: any later event from it changes nothing and gets
//! exactly one action, [`Action::Fence`] (lost: drop everything and register again, holding
//! nothing) or [`Action::Refuse`] with [`Refusal::Blacklisted`]. An unknown node gets
//! [`Refusal::UnknownNode`]. Late news is never silently accepted.
//!
//! - **Splits added.** A followed source grew: the new splits' tasks are appended to the current
//!   epoch, after every task planned before them, in a seeded order of their own. A job that
//!   follows a source does not succeed while it follows, however many of its rows are consumed;
//!   once following ends ([`Event::FollowEnded`]) it succeeds as any other.
//!
//! The job ends early by the failover percentages, computed on rows: it fails once an epoch's
//! failed rows reach `task_failed_percent`, or once so many have failed that `task_success_percent`
//! can no longer be reached; it succeeds once the last epoch's consumed rows reach
//! `task_success_percent`. Task failures and lost nodes together past `max_total_failures` fail it.

mod chunks;
mod mix;
mod order;
mod position;
mod state;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

pub use mix::MixedSource;
pub use position::{
    DataPosition, NodeRecord, RestoreError, RestoreMode, TableSnapshot, TaskRecord, TaskStatus,
};
pub use state::{JobState, NodeStatus, NodeView, PlanError, TaskCounts, TaskInFlight, TaskSpan};

use crate::spec::{EvenBatches, JobSpec};
use serde::{Deserialize, Serialize};
pub use sluice_proto::{NodeId, TaskId};

/// The settings the decisions need, taken from the job spec.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DecideConfig {
    /// The job seed (`data.shuffle.seed`).
    pub seed: u64,
    /// Passes over the data.
    pub epochs: u32,
    /// Target rows per task.
    pub task_rows: u64,
    /// Failures of one task before it is failed.
    pub max_task_attempts: u32,
    /// Task failures on one node before it is blacklisted.
    pub blacklist_after_failures: u32,
    /// Task failures plus lost nodes that fail the job when exceeded.
    pub max_total_failures: u32,
    /// Silence after which a node is lost.
    pub heartbeat_timeout_ms: u64,
    /// Percentage of rows consumed at which the last epoch, and so the job, succeeds.
    pub task_success_percent: f64,
    /// Percentage of an epoch's rows failed at which the job fails.
    pub task_failed_percent: f64,
    /// Rows past the holder's reported enqueued count that a re-split leaves to the holder.
    pub resplit_margin_rows: u64,
    /// The smallest piece worth re-splitting off to an idle node.
    pub resplit_min_rows: u64,
    /// Whether a source is followed: splits may be added while the job runs, and the job does not
    /// succeed before [`Event::FollowEnded`].
    pub follow: bool,
    /// Whether the rings get the same number of batches in each epoch (`data.even_batches`): then
    /// the tail of an epoch is re-split to any node that asks for work, its own tasks included, down
    /// to one row and with no margin, so that every row gets handed to a ring while trainers that
    /// step in lockstep wait on a ring that ran dry (see the module documentation).
    pub even_batches: bool,
}

impl DecideConfig {
    /// Takes the decision settings from a validated job spec.
    pub fn from_spec(spec: &JobSpec) -> DecideConfig {
        let even_batches = spec.data.even_batches != EvenBatches::Off;
        DecideConfig {
            seed: spec.data.shuffle.seed,
            epochs: spec.data.epochs,
            task_rows: spec.data.task_rows,
            max_task_attempts: spec.failover.max_task_attempts,
            blacklist_after_failures: spec.failover.blacklist_after_failures,
            max_total_failures: spec.failover.max_total_failures,
            heartbeat_timeout_ms: spec.failover.heartbeat_timeout_ms,
            task_success_percent: spec.failover.task_success_percent,
            task_failed_percent: spec.failover.task_failed_percent,
            resplit_margin_rows: if even_batches {
                0
            } else {
                spec.data.resplit_margin_rows
            },
            resplit_min_rows: if even_batches {
                1
            } else {
                spec.data.resplit_min_rows
            },
            follow: spec
                .data
                .sources
                .iter()
                .any(|source| source.follow.is_some()),
            even_batches,
        }
    }
}

/// A daemon's counts for one task, relative to the task's `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskProgress {
    /// The task.
    pub task: TaskId,
    /// Rows written into the node's rings.
    pub enqueued: u64,
    /// Rows released by the node's trainers; a prefix of the task's rows.
    pub consumed: u64,
}

/// How a daemon ended a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReportOutcome {
    /// Every row was consumed.
    Done,
    /// The task could not be read further; the consumed count is final.
    Failed {
        /// The daemon's explanation, for logs and status.
        reason: String,
    },
}

/// Something that happened, as the AM learns it. Time enters only through `now_ms`, in
/// milliseconds on one monotonic clock chosen by the caller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    /// A daemon starts, or starts again, and lists the tasks it still holds.
    Register {
        /// The daemon.
        node: NodeId,
        /// When the AM received it.
        now_ms: u64,
        /// The tasks it still holds, with their counts.
        held: Vec<TaskProgress>,
    },
    /// A daemon is alive and reports its counts.
    Heartbeat {
        /// The daemon.
        node: NodeId,
        /// When the AM received it.
        now_ms: u64,
        /// Counts of the tasks it holds.
        progress: Vec<TaskProgress>,
    },
    /// A daemon asks for up to `max_tasks` more tasks.
    Acquire {
        /// The daemon.
        node: NodeId,
        /// When the AM received it.
        now_ms: u64,
        /// The most tasks it wants now.
        max_tasks: u32,
    },
    /// A daemon acknowledges a stop request: it delivers the task's rows up to `stop_row` only.
    StopAck {
        /// The daemon.
        node: NodeId,
        /// When the AM received it.
        now_ms: u64,
        /// The task.
        task: TaskId,
        /// The split row where it stops, at or after the requested one.
        stop_row: u64,
    },
    /// A daemon ends a task.
    Report {
        /// The daemon.
        node: NodeId,
        /// When the AM received it.
        now_ms: u64,
        /// The task.
        task: TaskId,
        /// Its final consumed count.
        consumed: u64,
        /// Done or failed.
        outcome: ReportOutcome,
    },
    /// Time passes; nodes silent for longer than the heartbeat timeout are lost.
    Tick {
        /// The current time.
        now_ms: u64,
    },
    /// A followed source grew: splits with these row counts follow the job's last split, in
    /// order, and their tasks join the current epoch.
    SplitsAdded {
        /// The row count of each new split.
        split_rows: Vec<u64>,
    },
    /// No followed source will add splits any more: the job ends once the planned rows are.
    FollowEnded,
    /// A followed source cannot be followed further; the job fails.
    FollowFailed {
        /// What went wrong, naming the source and the fix.
        reason: String,
    },
    /// The job fails for a reason outside the task table: a trainer hangs and the spec's
    /// `failover.hang.action` is `fail`.
    Failed {
        /// What went wrong, naming the trainer and the fix.
        reason: String,
    },
    /// A daemon asks for up to `max_tasks` more tasks, and the pending tasks `near` come first if
    /// they are still pending and among the next [`NEAR_WINDOW`] of the epoch's order: tasks of
    /// splits the node read before, whose blocks its cache may hold (locality). Tasks queued again
    /// still come before them.
    AcquireNear {
        /// The daemon.
        node: NodeId,
        /// When the AM received it.
        now_ms: u64,
        /// The most tasks it wants now.
        max_tasks: u32,
        /// The tasks to hand out first, in order.
        near: Vec<TaskId>,
    },
    /// A source was added to the running job (`sluice source add`): splits with these row counts
    /// follow the job's last split, in order, their tasks join the current epoch, and every later
    /// epoch has them.
    SourceAdded {
        /// The row count of each new split.
        split_rows: Vec<u64>,
    },
    /// A daemon of a job with `even_batches` asks for tasks as [`Event::AcquireNear`] does, and
    /// tells whether one of its rings has nothing left to write (`dry`). Tasks queued again
    /// (re-split pieces, tasks back from a failure or a lost node) go only to a daemon with a dry
    /// ring, and only its request re-splits: a piece cut for a ring that ran dry must not go back to
    /// a daemon whose rings are full, which holds it while the trainers in lockstep wait on the dry
    /// one.
    AcquireEven {
        /// The daemon.
        node: NodeId,
        /// When the AM received it.
        now_ms: u64,
        /// The most tasks it wants now.
        max_tasks: u32,
        /// The tasks to hand out first, in order.
        near: Vec<TaskId>,
        /// Whether one of its rings has nothing left to write.
        dry: bool,
    },
    /// These tasks of the current epoch, those still pending in its order, are handed out first,
    /// in the order given (`data.even_batches: drop`: the tasks of the splits whose rows the epoch
    /// before left out).
    Front {
        /// The tasks.
        tasks: Vec<TaskId>,
    },
    /// These split rows of the current epoch's pending tasks are cut out of their tasks into tasks
    /// of their own, handed out first in the order given; the rest of each cut task keeps its place
    /// (`data.even_batches: drop` without a shuffle: the rows the epoch before left out, so that
    /// they are read at the head of the rings, far from the epoch's tail where drops fall).
    CarveFront {
        /// The rows, by split.
        rows: Vec<TaskSpan>,
    },
}

/// How far into the epoch's order of pending tasks [`Event::AcquireNear`] looks: a node takes a
/// task of a split it read before over at most this many tasks ahead of it, so the order of the
/// epoch moves only locally and every node still gets work at once.
pub const NEAR_WINDOW: usize = 64;

impl Event {
    /// When the AM received the event, for the events that carry a time.
    pub fn now_ms(&self) -> Option<u64> {
        match self {
            Event::Register { now_ms, .. }
            | Event::Heartbeat { now_ms, .. }
            | Event::Acquire { now_ms, .. }
            | Event::AcquireNear { now_ms, .. }
            | Event::AcquireEven { now_ms, .. }
            | Event::StopAck { now_ms, .. }
            | Event::Report { now_ms, .. }
            | Event::Tick { now_ms } => Some(*now_ms),
            Event::SplitsAdded { .. }
            | Event::SourceAdded { .. }
            | Event::FollowEnded
            | Event::FollowFailed { .. }
            | Event::Failed { .. }
            | Event::Front { .. }
            | Event::CarveFront { .. } => None,
        }
    }
}

/// One task handed to a daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    /// The task.
    pub task: TaskId,
    /// Its epoch.
    pub epoch: u32,
    /// The index of its split in the job's split list.
    pub split: u32,
    /// First row, inclusive.
    pub start: u64,
    /// Last row, exclusive.
    pub end: u64,
}

/// Why the AM refused an event or part of one. The event, or that part, changed nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Refusal {
    /// The node never registered.
    UnknownNode,
    /// The node is blacklisted and gets no more work.
    Blacklisted,
    /// The task id is not one of the current epoch's tasks.
    UnknownTask(TaskId),
    /// The task is not in flight on this node.
    NotHeld(TaskId),
    /// A count is larger than the task, or consumed exceeds enqueued.
    CountOutOfRange {
        /// The task.
        task: TaskId,
        /// The reported enqueued count.
        enqueued: u64,
        /// The reported consumed count.
        consumed: u64,
        /// The task's length in rows.
        rows: u64,
    },
    /// A stop acknowledgement for a task with no stop requested.
    NoStopRequested(TaskId),
    /// A stop row before what was already enqueued or past the task's end.
    StopRowOutOfRange {
        /// The task.
        task: TaskId,
        /// The acknowledged row.
        stop_row: u64,
        /// The smallest acceptable row.
        min: u64,
        /// The largest acceptable row.
        max: u64,
    },
    /// A task reported done before all its rows were consumed.
    DoneBeforeEnd {
        /// The task.
        task: TaskId,
        /// The reported consumed count.
        consumed: u64,
        /// The task's length in rows.
        rows: u64,
    },
}

/// How the job ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobOutcome {
    /// Every epoch reached `task_success_percent`.
    Succeeded,
    /// A failover rule stopped the job.
    Failed {
        /// Which rule, with the numbers.
        reason: String,
    },
}

/// What the AM does in answer to an event. Commands name the node they go to; notices record a
/// change of the task table for the journal, logs and status page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Action {
    /// Command: run these tasks.
    Assign {
        /// The daemon.
        node: NodeId,
        /// The tasks.
        tasks: Vec<Assignment>,
    },
    /// Command: you kept these tasks when you registered again; here are their assignments, with
    /// the start your counts are relative to, so that you resume each after its enqueued rows.
    Resume {
        /// The daemon.
        node: NodeId,
        /// The tasks, as the table has them.
        tasks: Vec<Assignment>,
    },
    /// Command: deliver this task's rows only up to `row` (exclusive), then acknowledge the row
    /// where you stop.
    StopAt {
        /// The daemon.
        node: NodeId,
        /// The task.
        task: TaskId,
        /// The requested stop row.
        row: u64,
    },
    /// Command: you were declared lost; drop every task and ring content, then register again
    /// holding nothing.
    Fence {
        /// The daemon.
        node: NodeId,
    },
    /// Command: the event, or part of it, was not applied.
    Refuse {
        /// The daemon.
        node: NodeId,
        /// Why.
        reason: Refusal,
    },
    /// Command: the job is over; stop.
    Shutdown {
        /// The daemon.
        node: NodeId,
    },
    /// Notice: a node registered; `kept` of its tasks stay with it, `requeued` went back to the queue.
    Registered {
        /// The daemon.
        node: NodeId,
        /// Tasks it reported and keeps.
        kept: u32,
        /// Tasks it no longer had, queued again.
        requeued: u32,
    },
    /// Notice: a task was cut at `at_row` after a stop acknowledgement; `child` holds the rest.
    TaskSplit {
        /// The cut task, now ending at `at_row`.
        parent: TaskId,
        /// The new task `[at_row, old end)`.
        child: TaskId,
        /// The cut.
        at_row: u64,
    },
    /// Notice: all of a task's rows were consumed.
    TaskDone {
        /// The task.
        task: TaskId,
    },
    /// Notice: a task went back to the queue, now starting at `from_row`.
    TaskRequeued {
        /// The task.
        task: TaskId,
        /// Its new first row.
        from_row: u64,
    },
    /// Notice: a task failed for good; its remaining rows are not delivered.
    TaskFailed {
        /// The task.
        task: TaskId,
        /// How often it failed.
        attempts: u32,
        /// The last failure's explanation.
        reason: String,
    },
    /// Notice: a node missed its heartbeat timeout.
    NodeLost {
        /// The daemon.
        node: NodeId,
        /// Its tasks, queued again.
        requeued: u32,
    },
    /// Notice: a node failed too many tasks and gets no more work.
    NodeBlacklisted {
        /// The daemon.
        node: NodeId,
        /// Its tasks, queued again.
        requeued: u32,
    },
    /// Notice: splits of a followed source were added, with their tasks.
    TasksAdded {
        /// The new splits.
        splits: u32,
        /// Their tasks, pending at the end of the current epoch's order.
        tasks: u32,
    },
    /// Notice: an epoch's tasks were planned.
    EpochStarted {
        /// The epoch.
        epoch: u32,
        /// Its planned tasks.
        tasks: u32,
    },
    /// Notice: the job ended.
    JobFinished {
        /// How.
        outcome: JobOutcome,
    },
}

/// Applies one event to the task table and returns what to do about it.
pub fn decide(state: &mut JobState, event: Event) -> Vec<Action> {
    let mut actions = Vec::new();
    match event {
        Event::Register { node, now_ms, held } => {
            state.on_register(node, now_ms, held, &mut actions)
        }
        Event::Heartbeat {
            node,
            now_ms,
            progress,
        } => state.on_heartbeat(node, now_ms, progress, &mut actions),
        Event::Acquire {
            node,
            now_ms,
            max_tasks,
        } => state.on_acquire(node, now_ms, max_tasks, &[], None, &mut actions),
        Event::AcquireNear {
            node,
            now_ms,
            max_tasks,
            near,
        } => state.on_acquire(node, now_ms, max_tasks, &near, None, &mut actions),
        Event::AcquireEven {
            node,
            now_ms,
            max_tasks,
            near,
            dry,
        } => state.on_acquire(node, now_ms, max_tasks, &near, Some(dry), &mut actions),
        Event::StopAck {
            node,
            now_ms,
            task,
            stop_row,
        } => state.on_stop_ack(node, now_ms, task, stop_row, &mut actions),
        Event::Report {
            node,
            now_ms,
            task,
            consumed,
            outcome,
        } => state.on_report(node, now_ms, task, consumed, outcome, &mut actions),
        Event::Tick { now_ms } => state.on_tick(now_ms, &mut actions),
        Event::SplitsAdded { split_rows } => state.on_splits_added(split_rows, &mut actions),
        Event::SourceAdded { split_rows } => state.on_source_added(split_rows, &mut actions),
        Event::FollowEnded => state.on_follow_ended(&mut actions),
        Event::Front { tasks } => state.bring_to_front(&tasks),
        Event::CarveFront { rows } => state.carve_to_front(&rows),
        Event::FollowFailed { reason } | Event::Failed { reason } => {
            state.on_failed(reason, &mut actions)
        }
    }
    actions
}

//! The AM's state machine around the task table: requests in, commands and journal entries out.
//!
//! # Implementation
//! [`Master`] owns the [`JobState`] and everything the AM keeps beside it: the commands waiting for
//! a node's next call (a stop request meant for the holder of a task being re-split goes out with
//! that holder's next heartbeat), what each node last said about its pipeline, the ranks' pending
//! data-checkpoint reports, and a stop request. It does no IO and reads no clock: the service hands
//! it the time, journals the [`Entry`]s each call returns before it answers, and stores data
//! checkpoints. Replaying the journal through [`Master::replay`] rebuilds the same state, because
//! every change of state is an entry and [`decide`] is deterministic.

pub mod checkpoint;
mod convert;

#[cfg(test)]
mod tests;

use crate::decide::{
    Action, DataPosition, DecideConfig, Event, JobOutcome, JobState, NodeId, NodeStatus,
    RestoreMode, TaskId, TaskStatus, decide,
};
use crate::error::{AmError, Result};
use crate::plan::JobPlan;
use crate::spec::JobSpec;
use checkpoint::RankPositions;
use serde::{Deserialize, Serialize};
use sluice_proto::v1;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

/// One change of the AM's state, in journal order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Entry {
    /// An event applied to the task table.
    Event(Event),
    /// A rank reported its data position at a step.
    RankCommitted {
        /// The trainer's step.
        step: u64,
        /// The rank.
        rank: u32,
        /// Ranks that report for the step.
        world_size: u32,
        /// The rank's epoch.
        epoch: u32,
        /// Split row up to which the rank consumed each task it read.
        positions: RankPositions,
    },
    /// Every rank of a step reported and the checkpoint was stored under `token`.
    CheckpointStored {
        /// The trainer's step.
        step: u64,
        /// The token that names the stored position.
        token: String,
    },
    /// The task table was reset to a stored data checkpoint.
    Restored {
        /// The checkpoint's token.
        token: String,
        /// The position it holds.
        position: DataPosition,
        /// When the AM reset the table.
        now_ms: u64,
    },
    /// A stop of the job was requested.
    StopRequested {
        /// Why, for logs and status.
        reason: String,
    },
}

/// What a node last said about its pipeline, and when the AM last heard from it.
#[derive(Debug, Clone, Default)]
struct NodeInfo {
    hostname: String,
    last_heard_ms: u64,
    stages: Vec<v1::StageStats>,
    rings: Vec<v1::RingStats>,
}

/// A step's data checkpoint while ranks are still reporting.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PendingCheckpoint {
    world_size: u32,
    epoch: u32,
    ranks: BTreeMap<u32, RankPositions>,
}

/// Where each task of the current epoch began: planned tasks where the cut rule put them, pieces
/// where a re-split cut them off.
#[derive(Debug, Clone)]
pub struct TaskOrigins {
    task_rows: u64,
    /// The slot of each split's first planned task.
    first_slot: Vec<u32>,
    planned: u32,
    pieces: BTreeMap<TaskId, u64>,
}

impl TaskOrigins {
    fn new(split_rows: &[u64], task_rows: u64) -> TaskOrigins {
        let task_rows = task_rows.max(1);
        let mut first_slot = Vec::with_capacity(split_rows.len());
        let mut planned = 0u32;
        for rows in split_rows {
            first_slot.push(planned);
            planned += rows.div_ceil(task_rows) as u32;
        }
        TaskOrigins {
            task_rows,
            first_slot,
            planned,
            pieces: BTreeMap::new(),
        }
    }

    /// The split row where the task in `slot` of the current epoch began.
    fn origin(&self, table: &JobState, slot: u32) -> u64 {
        if slot < self.planned {
            let split = table.slots[slot as usize].split as usize;
            u64::from(slot - self.first_slot[split]) * self.task_rows
        } else {
            let task = TaskId(table.first_task_id + u64::from(slot));
            let origin = self.pieces.get(&task).copied();
            debug_assert!(origin.is_some(), "every re-split piece has a recorded cut");
            origin.unwrap_or(table.slots[slot as usize].start)
        }
    }
}

/// A data checkpoint whose ranks have all reported: the service stores `position` under `token`,
/// journals [`Entry::CheckpointStored`], then answers with the token.
#[derive(Debug, Clone)]
pub struct ReadyCheckpoint {
    /// The trainer's step.
    pub step: u64,
    /// The token that names it.
    pub token: String,
    /// The position at the step.
    pub position: DataPosition,
}

/// The outcome of a rank's commit.
#[derive(Debug, Clone)]
pub enum CommitOutcome {
    /// Other ranks of the step have not reported yet.
    Pending {
        /// Ranks reported so far.
        reported: u32,
        /// Ranks that must report.
        world_size: u32,
    },
    /// The step's checkpoint was stored earlier under this token.
    Stored(String),
    /// Every rank has reported: store it.
    Ready(ReadyCheckpoint),
}

/// What one call did: the answer for the caller and the entries to journal before answering.
#[derive(Debug)]
pub struct Applied<T> {
    /// The answer.
    pub reply: T,
    /// The changes to journal, in order.
    pub entries: Vec<Entry>,
}

/// Samples of consumed rows over time, for rows per second.
#[derive(Debug, Clone, Default)]
struct Throughput {
    samples: VecDeque<(u64, u64)>,
}

/// How many samples [`Throughput`] keeps, one per tick.
const THROUGHPUT_SAMPLES: usize = 8;

impl Throughput {
    fn record(&mut self, now_ms: u64, rows: u64) {
        if self.samples.len() == THROUGHPUT_SAMPLES {
            self.samples.pop_front();
        }
        self.samples.push_back((now_ms, rows));
    }

    fn rows_per_second(&self) -> f64 {
        match (self.samples.front(), self.samples.back()) {
            (Some((first_ms, first_rows)), Some((last_ms, last_rows))) if last_ms > first_ms => {
                (last_rows - first_rows) as f64 * 1000.0 / (last_ms - first_ms) as f64
            }
            _ => 0.0,
        }
    }
}

/// The AM's state: the task table and what the AM keeps beside it.
#[derive(Debug)]
pub struct Master {
    spec: Arc<JobSpec>,
    plan: Arc<JobPlan>,
    config: DecideConfig,
    table: JobState,
    origins: TaskOrigins,
    outbox: BTreeMap<NodeId, Vec<v1::Command>>,
    nodes: BTreeMap<NodeId, NodeInfo>,
    checkpoints: BTreeMap<u64, PendingCheckpoint>,
    stored: BTreeMap<u64, String>,
    stop_reason: Option<String>,
    shut_down: BTreeSet<NodeId>,
    throughput: Throughput,
}

impl Master {
    /// Plans the first epoch of a job over its planned splits.
    pub fn new(spec: Arc<JobSpec>, plan: Arc<JobPlan>) -> Result<Master> {
        let config = DecideConfig::from_spec(&spec);
        let split_rows = plan.split_rows();
        let origins = TaskOrigins::new(&split_rows, config.task_rows);
        let table = JobState::new(config, split_rows)?;
        Ok(Master {
            spec,
            plan,
            config,
            table,
            origins,
            outbox: BTreeMap::new(),
            nodes: BTreeMap::new(),
            checkpoints: BTreeMap::new(),
            stored: BTreeMap::new(),
            stop_reason: None,
            shut_down: BTreeSet::new(),
            throughput: Throughput::default(),
        })
    }

    /// The job's name, which is its id on the wire.
    pub fn job_id(&self) -> &str {
        &self.spec.name
    }

    /// The task table.
    pub fn table(&self) -> &JobState {
        &self.table
    }

    /// The number of trainer ranks in the job: the processes of every role.
    pub fn world_size(&self) -> u32 {
        self.spec.roles.iter().map(|role| role.num).sum()
    }

    /// The trainer ranks node `node` feeds: the job's ranks in contiguous blocks over its nodes.
    pub fn ranks_of(&self, node: NodeId) -> Vec<u32> {
        let nodes = u64::from(self.spec.nodes.max(1));
        let world = u64::from(self.world_size());
        (0..world)
            .filter(|rank| rank * nodes / world.max(1) == node.0)
            .map(|rank| rank as u32)
            .collect()
    }

    /// Applies a journal entry during recovery; commands it would send are dropped, since the
    /// daemons they were meant for ask again.
    pub fn replay(&mut self, entry: Entry) -> Result<()> {
        match entry {
            Entry::Event(event) => {
                self.apply_event(None, event);
            }
            Entry::RankCommitted {
                step,
                rank,
                world_size,
                epoch,
                positions,
            } => {
                self.record_rank(step, rank, world_size, epoch, positions)?;
            }
            Entry::CheckpointStored { step, token } => {
                self.checkpoints.remove(&step);
                self.stored.insert(step, token);
            }
            Entry::Restored {
                position, now_ms, ..
            } => self.reset_to(position, now_ms)?,
            Entry::StopRequested { reason } => self.stop_reason = Some(reason),
        }
        Ok(())
    }

    /// Queues again the commands the table implies after a recovery: a stop request for every
    /// task whose stop is not yet acknowledged.
    pub fn resume_commands(&mut self) {
        for (index, record) in self.table.position().tasks.iter().enumerate() {
            if let TaskStatus::InFlight {
                node,
                stop_at: Some(row),
                ..
            } = record.status
            {
                let task = TaskId(self.table.first_task_id + index as u64);
                self.outbox
                    .entry(node)
                    .or_default()
                    .push(convert::stop_command(task, row));
            }
        }
    }

    /// Gives every live node a full heartbeat timeout from `now_ms` to report in, as after an AM
    /// restart.
    pub fn grant_grace(&mut self, now_ms: u64) -> Result<()> {
        let position = self.table.position();
        self.table = JobState::restore(
            self.config,
            self.plan.split_rows(),
            position,
            RestoreMode::Resume { now_ms },
        )?;
        Ok(())
    }

    /// A daemon registers, listing the tasks it still holds.
    pub fn register(
        &mut self,
        request: v1::RegisterRequest,
        now_ms: u64,
    ) -> Result<Applied<v1::RegisterReply>> {
        if !request.job_id.is_empty() && request.job_id != self.spec.name {
            return Err(AmError::FailedPrecondition(format!(
                "daemon node-{} belongs to job {:?} but this AM runs job {:?}; point its --am at the AM of its job",
                request.node_id, request.job_id, self.spec.name
            )));
        }
        let node = NodeId(request.node_id);
        if node.0 >= u64::from(self.spec.nodes) {
            return Err(AmError::InvalidRequest(format!(
                "daemon {node}: the job has {} nodes, numbered 0 to {}; start the daemon with --node-id in that range or raise `nodes` in the job spec",
                self.spec.nodes,
                self.spec.nodes.saturating_sub(1)
            )));
        }
        let info = self.nodes.entry(node).or_default();
        info.hostname = request.hostname;
        info.last_heard_ms = now_ms;
        self.shut_down.remove(&node);
        // A registering daemon starts from what it reports: commands queued for its earlier life
        // are void, and the ones still due are issued again by the table.
        self.outbox.remove(&node);
        let event = Event::Register {
            node,
            now_ms,
            held: request.held.iter().map(convert::progress).collect(),
        };
        let (commands, entries) = self.apply_and_log(node, event);
        Ok(Applied {
            reply: v1::RegisterReply {
                job_id: self.spec.name.clone(),
                heartbeat_interval_ms: self.spec.failover.heartbeat_interval_ms,
                commands,
                data: Some(convert::job_data(&self.spec)),
                ranks: self.ranks_of(node),
                world_size: self.world_size(),
            },
            entries,
        })
    }

    /// A daemon reports liveness, counts and pipeline statistics.
    pub fn heartbeat(
        &mut self,
        request: v1::HeartbeatRequest,
        now_ms: u64,
    ) -> Applied<v1::HeartbeatReply> {
        let node = NodeId(request.node_id);
        if let Some(info) = self.nodes.get_mut(&node) {
            info.last_heard_ms = now_ms;
            info.stages = request.stages;
            info.rings = request.rings;
        }
        let event = Event::Heartbeat {
            node,
            now_ms,
            progress: request.progress.iter().map(convert::progress).collect(),
        };
        let (commands, entries) = self.apply_and_log(node, event);
        Applied {
            reply: v1::HeartbeatReply { commands },
            entries,
        }
    }

    /// A daemon asks for more tasks.
    pub fn acquire(
        &mut self,
        request: v1::AcquireTasksRequest,
        now_ms: u64,
    ) -> Applied<v1::AcquireTasksReply> {
        let node = NodeId(request.node_id);
        self.heard_from(node, now_ms);
        let event = Event::Acquire {
            node,
            now_ms,
            max_tasks: request.max_tasks,
        };
        let (commands, entries) = self.apply_and_log(node, event);
        Applied {
            reply: v1::AcquireTasksReply { commands },
            entries,
        }
    }

    /// A daemon ends a task.
    pub fn report(
        &mut self,
        request: v1::ReportTaskRequest,
        now_ms: u64,
    ) -> Result<Applied<v1::ReportTaskReply>> {
        let node = NodeId(request.node_id);
        let outcome = match request.outcome {
            Some(v1::report_task_request::Outcome::Done(_)) => crate::decide::ReportOutcome::Done,
            Some(v1::report_task_request::Outcome::Failed(failed)) => {
                crate::decide::ReportOutcome::Failed {
                    reason: failed.reason,
                }
            }
            None => {
                return Err(AmError::InvalidRequest(format!(
                    "report of task-{} by {node} has no outcome; set `done` or `failed`",
                    request.task_id
                )));
            }
        };
        self.heard_from(node, now_ms);
        let event = Event::Report {
            node,
            now_ms,
            task: TaskId(request.task_id),
            consumed: request.consumed,
            outcome,
        };
        let (commands, entries) = self.apply_and_log(node, event);
        Ok(Applied {
            reply: v1::ReportTaskReply { commands },
            entries,
        })
    }

    /// A daemon acknowledges a stop request with the row where it really stops.
    pub fn ack_stop(
        &mut self,
        request: v1::AckStopRequest,
        now_ms: u64,
    ) -> Applied<v1::AckStopReply> {
        let node = NodeId(request.node_id);
        self.heard_from(node, now_ms);
        let event = Event::StopAck {
            node,
            now_ms,
            task: TaskId(request.task_id),
            stop_row: request.stop_row,
        };
        let (commands, entries) = self.apply_and_log(node, event);
        Applied {
            reply: v1::AckStopReply { commands },
            entries,
        }
    }

    /// Time passes: declares silent nodes lost and samples the throughput.
    pub fn tick(&mut self, now_ms: u64) -> Applied<()> {
        let rows = self.rows_consumed_total();
        self.throughput.record(now_ms, rows);
        let event = Event::Tick { now_ms };
        // A tick changes the table only when it declares a node lost; only such a tick is journaled.
        if !self.table.has_expired_nodes(now_ms) {
            return Applied {
                reply: (),
                entries: Vec::new(),
            };
        }
        let entries = vec![Entry::Event(event.clone())];
        self.apply_event(None, event);
        Applied { reply: (), entries }
    }

    /// Asks the job to stop: every daemon is shut down at its next call.
    pub fn stop(&mut self, reason: String) -> Applied<v1::JobState> {
        if self.table.outcome().is_some() || self.stop_reason.is_some() {
            return Applied {
                reply: self.job_state(),
                entries: Vec::new(),
            };
        }
        self.stop_reason = Some(reason.clone());
        Applied {
            reply: self.job_state(),
            entries: vec![Entry::StopRequested { reason }],
        }
    }

    /// Records one rank's data position at a step.
    pub fn commit_checkpoint(
        &mut self,
        request: v1::CommitDataCheckpointRequest,
    ) -> Result<Applied<CommitOutcome>> {
        let v1::CommitDataCheckpointRequest {
            step,
            rank,
            world_size,
            positions,
            epoch,
        } = request;
        if let Some(token) = self.stored.get(&step) {
            return Ok(Applied {
                reply: CommitOutcome::Stored(token.clone()),
                entries: Vec::new(),
            });
        }
        let positions: RankPositions = positions
            .iter()
            .map(|position| (TaskId(position.task_id), position.end_row))
            .collect();
        let entry = Entry::RankCommitted {
            step,
            rank,
            world_size,
            epoch,
            positions: positions.clone(),
        };
        let outcome = self.record_rank(step, rank, world_size, epoch, positions)?;
        Ok(Applied {
            reply: outcome,
            entries: vec![entry],
        })
    }

    /// Makes the position of a step whose every rank reported, and names it.
    fn record_rank(
        &mut self,
        step: u64,
        rank: u32,
        world_size: u32,
        epoch: u32,
        positions: RankPositions,
    ) -> Result<CommitOutcome> {
        if world_size == 0 || rank >= world_size {
            return Err(AmError::InvalidRequest(format!(
                "data checkpoint of step {step}: rank {rank} is not below world size {world_size}; pass SLUICE_RANK and SLUICE_WORLD_SIZE as the AM set them"
            )));
        }
        let pending = self
            .checkpoints
            .entry(step)
            .or_insert_with(|| PendingCheckpoint {
                world_size,
                epoch,
                ranks: BTreeMap::new(),
            });
        if pending.world_size != world_size || pending.epoch != epoch {
            return Err(AmError::InvalidRequest(format!(
                "data checkpoint of step {step}: rank {rank} reports world size {world_size} in epoch {epoch}, but other ranks reported world size {} in epoch {}; every rank must checkpoint the same step",
                pending.world_size, pending.epoch
            )));
        }
        pending.ranks.insert(rank, positions);
        if pending.ranks.len() < world_size as usize {
            return Ok(CommitOutcome::Pending {
                reported: pending.ranks.len() as u32,
                world_size,
            });
        }
        let position =
            checkpoint::position_at_step(&self.table, &self.origins, epoch, &pending.ranks)?;
        let digest = crc32c::crc32c(
            &serde_json::to_vec(&position).expect("a data position serializes to JSON"),
        );
        Ok(CommitOutcome::Ready(ReadyCheckpoint {
            step,
            token: format!("{}-step{step}-{digest:08x}", self.spec.name),
            position,
        }))
    }

    /// Records that the checkpoint of `step` was stored under `token`.
    pub fn checkpoint_stored(&mut self, step: u64, token: String) -> Applied<()> {
        self.checkpoints.remove(&step);
        self.stored.insert(step, token.clone());
        Applied {
            reply: (),
            entries: vec![Entry::CheckpointStored { step, token }],
        }
    }

    /// Resets the task table to a stored data checkpoint: every in-flight task goes back to the
    /// queue and every daemon is fenced, dropping what it holds.
    pub fn restore(
        &mut self,
        token: String,
        position: DataPosition,
        now_ms: u64,
    ) -> Result<Applied<v1::RestoreDataCheckpointReply>> {
        let epoch = position.epoch;
        self.reset_to(position.clone(), now_ms)?;
        let fenced: Vec<NodeId> = self
            .table
            .nodes
            .iter()
            .filter(|(_, entry)| entry.status == NodeStatus::Alive)
            .map(|(node, _)| *node)
            .collect();
        for node in fenced {
            self.outbox.insert(node, vec![convert::fence_command()]);
        }
        let step = self
            .stored
            .iter()
            .find(|(_, stored)| **stored == token)
            .map_or(0, |(step, _)| *step);
        Ok(Applied {
            reply: v1::RestoreDataCheckpointReply { step, epoch },
            entries: vec![Entry::Restored {
                token,
                position,
                now_ms,
            }],
        })
    }

    fn reset_to(&mut self, position: DataPosition, now_ms: u64) -> Result<()> {
        let pieces = self.pieces_of(&position);
        self.table = JobState::restore(
            self.config,
            self.plan.split_rows(),
            position,
            RestoreMode::Requeue { now_ms },
        )?;
        self.origins.pieces = pieces;
        self.checkpoints.clear();
        self.stop_reason = None;
        Ok(())
    }

    /// The origins of the re-split pieces of a position over the same epoch's tasks, kept from the
    /// current table when it is in that epoch.
    fn pieces_of(&self, position: &DataPosition) -> BTreeMap<TaskId, u64> {
        if position.epoch == self.table.epoch()
            && position.first_task_id == self.table.first_task_id
        {
            self.origins.pieces.clone()
        } else {
            BTreeMap::new()
        }
    }

    fn heard_from(&mut self, node: NodeId, now_ms: u64) {
        if let Some(info) = self.nodes.get_mut(&node) {
            info.last_heard_ms = now_ms;
        }
    }

    /// Applies an event for `caller` and returns its commands and the entry to journal.
    fn apply_and_log(&mut self, caller: NodeId, event: Event) -> (Vec<v1::Command>, Vec<Entry>) {
        if self.stop_reason.is_some() && self.table.outcome().is_none() {
            self.shut_down.insert(caller);
            let mut commands = self.outbox.remove(&caller).unwrap_or_default();
            commands.push(convert::shutdown_command());
            return (commands, Vec::new());
        }
        let entries = vec![Entry::Event(event.clone())];
        let commands = self.apply_event(Some(caller), event);
        (commands, entries)
    }

    /// Applies an event; returns the commands for `caller`, queueing those for other nodes.
    fn apply_event(&mut self, caller: Option<NodeId>, event: Event) -> Vec<v1::Command> {
        let actions = decide(&mut self.table, event);
        let mut mine = caller
            .and_then(|node| self.outbox.remove(&node))
            .unwrap_or_default();
        for action in actions {
            let (node, command) = match action {
                Action::Assign { node, tasks } => {
                    (node, convert::assign_command(&self.plan, &tasks))
                }
                Action::StopAt { node, task, row } => (node, convert::stop_command(task, row)),
                Action::Fence { node } => (node, convert::fence_command()),
                Action::Refuse { node, reason } => (node, convert::refuse_command(&reason)),
                Action::Shutdown { node } => {
                    self.shut_down.insert(node);
                    (node, convert::shutdown_command())
                }
                notice => {
                    self.notice(notice);
                    continue;
                }
            };
            if Some(node) == caller {
                mine.push(command);
            } else {
                self.outbox.entry(node).or_default().push(command);
            }
        }
        mine
    }

    /// Logs a change of the task table and keeps what the AM tracks beside it.
    fn notice(&mut self, action: Action) {
        match action {
            Action::TaskSplit {
                parent,
                child,
                at_row,
            } => {
                tracing::info!(%parent, %child, at_row, "task re-split");
                self.origins.pieces.insert(child, at_row);
            }
            Action::EpochStarted { epoch, tasks } => {
                tracing::info!(epoch, tasks, "epoch started");
                self.origins.pieces.clear();
            }
            Action::JobFinished { outcome } => match outcome {
                JobOutcome::Succeeded => tracing::info!("job succeeded"),
                JobOutcome::Failed { reason } => tracing::warn!(%reason, "job failed"),
            },
            Action::NodeLost { node, requeued } => {
                tracing::warn!(%node, requeued, "node lost: no heartbeat within the timeout")
            }
            Action::NodeBlacklisted { node, requeued } => {
                tracing::warn!(%node, requeued, "node blacklisted after repeated task failures")
            }
            Action::TaskFailed {
                task,
                attempts,
                reason,
            } => tracing::warn!(%task, attempts, %reason, "task failed for good"),
            Action::TaskRequeued { task, from_row } => {
                tracing::info!(%task, from_row, "task queued again")
            }
            Action::Registered {
                node,
                kept,
                requeued,
            } => tracing::info!(%node, kept, requeued, "node registered"),
            Action::TaskDone { task } => tracing::debug!(%task, "task done"),
            command => debug_assert!(false, "not a notice: {command:?}"),
        }
    }

    /// Rows consumed over every epoch so far.
    fn rows_consumed_total(&self) -> u64 {
        u64::from(self.table.epoch()) * self.table.epoch_rows() + self.table.done_rows()
    }

    /// The job's state on the wire.
    pub fn job_state(&self) -> v1::JobState {
        match (self.table.outcome(), &self.stop_reason) {
            (Some(JobOutcome::Succeeded), _) => v1::JobState::Succeeded,
            (Some(JobOutcome::Failed { .. }), _) => v1::JobState::Failed,
            (None, Some(_)) if self.all_shut_down() => v1::JobState::Stopped,
            (None, Some(_)) => v1::JobState::Stopping,
            (None, None) if self.nodes.is_empty() => v1::JobState::Starting,
            (None, None) => v1::JobState::Running,
        }
    }

    /// Whether the job is over and every live daemon was told to shut down, so the AM may exit.
    pub fn finished(&self) -> bool {
        (self.table.outcome().is_some() || self.stop_reason.is_some()) && self.all_shut_down()
    }

    fn all_shut_down(&self) -> bool {
        self.table
            .nodes
            .iter()
            .filter(|(_, entry)| entry.status == NodeStatus::Alive)
            .all(|(node, _)| self.shut_down.contains(node))
    }

    /// The job's status, for `sluice status` and the status page.
    pub fn status(&self, now_ms: u64) -> v1::StatusReply {
        let position = self.table.position();
        let count = |wanted: fn(&TaskStatus) -> bool| {
            position
                .tasks
                .iter()
                .filter(|record| wanted(&record.status))
                .count() as u64
        };
        let held = |node: NodeId| {
            self.table
                .nodes
                .get(&node)
                .map_or(0, |entry| entry.held.len() as u32)
        };
        let nodes = self
            .table
            .nodes
            .iter()
            .map(|(node, entry)| {
                let info = self.nodes.get(node).cloned().unwrap_or_default();
                v1::NodeStatus {
                    node_id: node.0,
                    hostname: info.hostname,
                    state: convert::node_state(entry.status) as i32,
                    since_last_heartbeat_ms: now_ms.saturating_sub(info.last_heard_ms),
                    tasks_held: held(*node),
                    task_failures: entry.failures,
                    stages: info.stages,
                    rings: info.rings,
                }
            })
            .collect();
        let failure_reason = match (self.table.outcome(), &self.stop_reason) {
            (Some(JobOutcome::Failed { reason }), _) => Some(reason.clone()),
            _ => None,
        };
        v1::StatusReply {
            job_id: self.spec.name.clone(),
            state: self.job_state() as i32,
            failure_reason,
            epoch: self.table.epoch(),
            epochs: self.spec.data.epochs,
            roles: self
                .spec
                .roles
                .iter()
                .map(|role| v1::RoleStatus {
                    name: role.name.clone(),
                    num: role.num,
                    ..v1::RoleStatus::default()
                })
                .collect(),
            nodes,
            trainers: Vec::new(),
            tasks: Some(v1::TaskCounts {
                pending: self.table.pending_count() as u64,
                in_flight: self.table.in_flight_count() as u64,
                done: count(|status| matches!(status, TaskStatus::Done)),
                failed: count(|status| matches!(status, TaskStatus::Failed)),
                rows_total: self.table.epoch_rows(),
                rows_consumed: self.table.done_rows(),
                rows_failed: self.table.failed_rows(),
            }),
            rows_per_second: self.throughput.rows_per_second(),
        }
    }

    /// The current epoch's task table for the status page: the tasks in flight, in task order,
    /// with their progress, and the count of tasks in each state.
    pub fn task_table(&self) -> crate::status::TaskTable {
        use crate::status::{InFlightTask, TaskStateCounts, TaskTable};
        let position = self.table.position();
        let mut counts = TaskStateCounts::default();
        let mut in_flight = Vec::new();
        for (index, record) in position.tasks.iter().enumerate() {
            match record.status {
                TaskStatus::Pending => counts.pending += 1,
                TaskStatus::Done => counts.done += 1,
                TaskStatus::Failed => counts.failed += 1,
                TaskStatus::InFlight {
                    node,
                    enqueued,
                    consumed,
                    ..
                } => {
                    counts.in_flight += 1;
                    let split = &self.plan.splits[record.split as usize].split;
                    in_flight.push(InFlightTask {
                        task_id: position.first_task_id + index as u64,
                        node_id: node.0,
                        uri: split.uri.clone(),
                        first_row: split.first_row + record.start,
                        rows: record.end - record.start,
                        enqueued,
                        consumed,
                    });
                }
            }
        }
        TaskTable {
            epoch: position.epoch,
            counts,
            in_flight,
        }
    }
}

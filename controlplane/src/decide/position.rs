//! Snapshots of the task table ([`DataPosition`]) and restoring a table from one.

use super::state::{InFlight, JobState, NodeEntry, NodeStatus, SlotState, TaskSlot};
use super::{DecideConfig, JobOutcome, NodeId, TaskId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

/// A job's data position: the current epoch's tasks (done, pending, failed and in flight with their
/// counts), the pending order, the nodes and the counters. It restores to exactly that point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DataPosition {
    /// The current epoch.
    pub epoch: u32,
    /// The id of the epoch's first task; task `i` of `tasks` has id `first_task_id + i`.
    pub first_task_id: u64,
    /// Every task of the epoch, including re-split pieces.
    pub tasks: Vec<TaskRecord>,
    /// The pending tasks, in the order they will be handed out.
    pub pending: Vec<TaskId>,
    /// How many of the first `pending` tasks are queued again (re-split pieces, tasks back from a
    /// failure or a lost node) rather than next in the epoch's order: a task queued again later
    /// goes after them but before the rest of the order.
    #[serde(default)]
    pub requeued: usize,
    /// Every node that registered.
    pub nodes: Vec<NodeRecord>,
    /// Rows of the epoch consumed.
    pub done_rows: u64,
    /// Rows of the epoch in failed tasks.
    pub failed_rows: u64,
    /// Task failures and lost nodes so far.
    pub total_failures: u32,
    /// How the job ended, if it has.
    pub outcome: Option<JobOutcome>,
    /// How many splits the tasks are cut from, when known: splits a followed source added after
    /// the position was taken are planned again when it is restored.
    #[serde(default)]
    pub splits: Option<u32>,
    /// Whether splits could still be added when the position was taken.
    #[serde(default)]
    pub following: bool,
}

/// One task in a [`DataPosition`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// The split index.
    pub split: u32,
    /// First row of the current assignment (rows before it are consumed).
    pub start: u64,
    /// Last row, exclusive.
    pub end: u64,
    /// Failed attempts so far.
    pub failures: u32,
    /// Where the task stands.
    pub status: TaskStatus,
}

/// Where one task stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskStatus {
    /// Waiting in the queue.
    Pending,
    /// Held by a node.
    InFlight {
        /// The holder.
        node: NodeId,
        /// Rows it wrote into its rings.
        enqueued: u64,
        /// Rows its trainers consumed.
        consumed: u64,
        /// A stop row asked of it and not yet acknowledged.
        stop_at: Option<u64>,
    },
    /// Every row consumed.
    Done,
    /// Failed for good.
    Failed,
}

/// One node in a [`DataPosition`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// The node.
    pub node: NodeId,
    /// Its liveness.
    pub status: NodeStatus,
    /// Task failures on it.
    pub failures: u32,
}

/// How to treat in-flight tasks when restoring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestoreMode {
    /// The AM restarts and the daemons carry on: in-flight tasks stay with their holders, and every
    /// live node gets a full heartbeat timeout from `now_ms` to report in.
    Resume {
        /// The time of the restore.
        now_ms: u64,
    },
    /// Trainers roll back to the checkpoint that holds this position: every in-flight task goes back
    /// to the front of the queue from its consumed count, and the daemons register again.
    Requeue {
        /// The time of the restore.
        now_ms: u64,
    },
}

/// Why a data position cannot be restored over the job's splits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RestoreError {
    /// A task names a split the job does not have.
    #[error(
        "data position: task {task} names split {split} but the job has {splits} splits; restore it with the same sources and task size"
    )]
    UnknownSplit {
        /// The task.
        task: TaskId,
        /// Its split.
        split: u32,
        /// The job's split count.
        splits: usize,
    },
    /// A task's rows lie outside its split, or its counts outside its rows.
    #[error(
        "data position: task {task} has rows or counts outside split {split}; the position does not belong to this data"
    )]
    BadRange {
        /// The task.
        task: TaskId,
        /// Its split.
        split: u32,
    },
    /// The pending list does not list exactly the pending tasks, once each.
    #[error(
        "data position: the pending list does not match the pending tasks ({detail}); the position is damaged"
    )]
    PendingMismatch {
        /// What does not match.
        detail: String,
    },
    /// An in-flight task's holder is missing or not alive.
    #[error(
        "data position: task {task} is held by {node}, which is not a live node in it; the position is damaged"
    )]
    BadHolder {
        /// The task.
        task: TaskId,
        /// The holder.
        node: NodeId,
    },
    /// The row counters do not add up.
    #[error(
        "data position: done {done} + failed {failed} + open {open} rows is not the epoch's {epoch_rows}; restore it with the same sources and task size"
    )]
    RowsMismatch {
        /// Done rows.
        done: u64,
        /// Failed rows.
        failed: u64,
        /// Rows not yet consumed.
        open: u64,
        /// Rows in an epoch of this data.
        epoch_rows: u64,
    },
    /// The epoch is past the job's last epoch.
    #[error("data position: epoch {epoch} is past the job's {epochs} epochs; check data.epochs")]
    EpochOutOfRange {
        /// The position's epoch.
        epoch: u32,
        /// The job's epochs.
        epochs: u32,
    },
    /// The position was taken over more splits than the job has.
    #[error(
        "data position: it covers {covered} splits but the job has {splits}; restore it with the same sources, or with the job's journal"
    )]
    SplitsMissing {
        /// The splits the position covers.
        covered: u32,
        /// The job's split count.
        splits: usize,
    },
    /// There are more tasks than the table can index.
    #[error("data position: {tasks} tasks are more than one epoch can hold")]
    TooManyTasks {
        /// How many there are.
        tasks: usize,
    },
}

impl JobState {
    /// Takes a snapshot of the task table.
    pub fn position(&self) -> DataPosition {
        let tasks = self
            .slots
            .iter()
            .enumerate()
            .map(|(slot, task_slot)| TaskRecord {
                split: task_slot.split,
                start: task_slot.start,
                end: task_slot.end,
                failures: u32::from(task_slot.failures),
                status: match task_slot.state {
                    SlotState::Pending => TaskStatus::Pending,
                    SlotState::Done => TaskStatus::Done,
                    SlotState::Failed => TaskStatus::Failed,
                    SlotState::InFlight => {
                        let flight = self
                            .in_flight
                            .get(&(slot as u32))
                            .expect("every in-flight slot has an in-flight record");
                        TaskStatus::InFlight {
                            node: flight.node,
                            enqueued: flight.enqueued,
                            consumed: flight.consumed,
                            stop_at: flight.stop_at,
                        }
                    }
                },
            })
            .collect();
        let pending = self
            .requeued
            .iter()
            .chain(self.order[self.cursor..].iter())
            .map(|slot| self.task_id(*slot))
            .collect();
        let nodes = self
            .nodes
            .iter()
            .map(|(node, entry)| NodeRecord {
                node: *node,
                status: entry.status,
                failures: entry.failures,
            })
            .collect();
        DataPosition {
            epoch: self.epoch,
            first_task_id: self.first_task_id,
            tasks,
            pending,
            requeued: self.requeued.len(),
            nodes,
            done_rows: self.done_rows,
            failed_rows: self.failed_rows,
            total_failures: self.total_failures,
            outcome: self.outcome.clone(),
            splits: Some(self.split_rows.len() as u32),
            following: self.following,
        }
    }

    /// Rebuilds a task table from a snapshot over the same splits, checking that the snapshot
    /// belongs to them.
    ///
    /// Splits added after the position was taken (a followed source that grew since) get their
    /// tasks again, pending after the position's own.
    pub fn restore(
        config: DecideConfig,
        mut split_rows: Vec<u64>,
        position: DataPosition,
        mode: RestoreMode,
    ) -> Result<JobState, RestoreError> {
        let covered = position
            .splits
            .map_or(split_rows.len(), |splits| splits as usize);
        if covered > split_rows.len() {
            return Err(RestoreError::SplitsMissing {
                covered: covered as u32,
                splits: split_rows.len(),
            });
        }
        let added = split_rows.split_off(covered);
        if position.epoch >= config.epochs {
            return Err(RestoreError::EpochOutOfRange {
                epoch: position.epoch,
                epochs: config.epochs,
            });
        }
        if position.tasks.len() as u64 > u64::from(u32::MAX) {
            return Err(RestoreError::TooManyTasks {
                tasks: position.tasks.len(),
            });
        }
        let now_ms = match mode {
            RestoreMode::Resume { now_ms } | RestoreMode::Requeue { now_ms } => now_ms,
        };
        let mut nodes: BTreeMap<NodeId, NodeEntry> = position
            .nodes
            .iter()
            .map(|record| {
                (
                    record.node,
                    NodeEntry {
                        status: record.status,
                        last_seen_ms: now_ms,
                        failures: record.failures,
                        held: BTreeSet::new(),
                    },
                )
            })
            .collect();
        let first_task_id = position.first_task_id;
        let mut slots = Vec::with_capacity(position.tasks.len());
        let mut in_flight = HashMap::new();
        let mut open = 0u64;
        for (index, record) in position.tasks.iter().enumerate() {
            let task = TaskId(first_task_id + index as u64);
            let split_rows_of =
                *split_rows
                    .get(record.split as usize)
                    .ok_or(RestoreError::UnknownSplit {
                        task,
                        split: record.split,
                        splits: split_rows.len(),
                    })?;
            let bad_range = RestoreError::BadRange {
                task,
                split: record.split,
            };
            if record.start > record.end || record.end > split_rows_of {
                return Err(bad_range);
            }
            let rows = record.end - record.start;
            let state = match &record.status {
                TaskStatus::Pending => {
                    open += rows;
                    SlotState::Pending
                }
                TaskStatus::Done => SlotState::Done,
                TaskStatus::Failed => SlotState::Failed,
                TaskStatus::InFlight {
                    node,
                    enqueued,
                    consumed,
                    stop_at,
                } => {
                    if consumed > enqueued || *enqueued > rows || *consumed >= rows {
                        return Err(bad_range);
                    }
                    let holder = nodes
                        .get_mut(node)
                        .filter(|entry| entry.status == NodeStatus::Alive)
                        .ok_or(RestoreError::BadHolder { task, node: *node })?;
                    holder.held.insert(index as u32);
                    open += rows - consumed;
                    in_flight.insert(
                        index as u32,
                        InFlight {
                            node: *node,
                            enqueued: *enqueued,
                            consumed: *consumed,
                            stop_at: *stop_at,
                        },
                    );
                    SlotState::InFlight
                }
            };
            slots.push(TaskSlot {
                start: record.start,
                end: record.end,
                split: record.split,
                failures: u16::try_from(record.failures).unwrap_or(u16::MAX),
                state,
            });
        }
        let epoch_rows: u64 = split_rows.iter().sum();
        if position.done_rows + position.failed_rows + open != epoch_rows {
            return Err(RestoreError::RowsMismatch {
                done: position.done_rows,
                failed: position.failed_rows,
                open,
                epoch_rows,
            });
        }
        let mut order = Vec::with_capacity(position.pending.len());
        let mut listed = vec![false; slots.len()];
        for task in &position.pending {
            let slot = task
                .0
                .checked_sub(first_task_id)
                .filter(|slot| *slot < slots.len() as u64)
                .ok_or_else(|| RestoreError::PendingMismatch {
                    detail: format!("{task} is not a task of the epoch"),
                })? as usize;
            if slots[slot].state != SlotState::Pending || listed[slot] {
                return Err(RestoreError::PendingMismatch {
                    detail: format!("{task} is listed twice or is not pending"),
                });
            }
            listed[slot] = true;
            order.push(slot as u32);
        }
        let pending_slots = slots
            .iter()
            .filter(|task_slot| task_slot.state == SlotState::Pending)
            .count();
        if pending_slots != order.len() {
            return Err(RestoreError::PendingMismatch {
                detail: format!(
                    "{pending_slots} tasks are pending but {} are listed",
                    order.len()
                ),
            });
        }
        let requeued: VecDeque<u32> = order.drain(..position.requeued.min(order.len())).collect();
        let mut state = JobState {
            config,
            split_rows,
            epoch: position.epoch,
            first_task_id,
            epoch_rows,
            slots,
            order,
            cursor: 0,
            requeued,
            in_flight,
            nodes,
            done_rows: position.done_rows,
            failed_rows: position.failed_rows,
            total_failures: position.total_failures,
            outcome: position.outcome,
            following: position.following,
        };
        if let RestoreMode::Requeue { .. } = mode {
            state.requeue_all_in_flight();
        }
        if !added.is_empty() {
            let tasks = state.slots.len() as u64
                + added
                    .iter()
                    .map(|rows| rows.div_ceil(config.task_rows.max(1)))
                    .sum::<u64>();
            if tasks > u64::from(u32::MAX) {
                return Err(RestoreError::TooManyTasks {
                    tasks: tasks as usize,
                });
            }
            state.append_splits(added);
        }
        Ok(state)
    }

    /// Puts every in-flight task back at the front of the queue, from its consumed count, in task
    /// order.
    fn requeue_all_in_flight(&mut self) {
        let mut held: Vec<u32> = self.in_flight.keys().copied().collect();
        held.sort_unstable();
        for slot in held.into_iter().rev() {
            if let Some(flight) = self.in_flight.remove(&slot) {
                let task_slot = &mut self.slots[slot as usize];
                task_slot.start += flight.consumed;
                task_slot.state = SlotState::Pending;
                self.requeued.push_front(slot);
            }
        }
        for entry in self.nodes.values_mut() {
            entry.held.clear();
        }
    }
}

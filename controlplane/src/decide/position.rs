//! Snapshots of the task table ([`DataPosition`]) and restoring a table from one.
//!
//! # Implementation
//! A [`DataPosition`] copies the table: 72 bytes a task. The journal's snapshots do not build one:
//! [`JobState::capture`] clones the table's chunked slots and order (shared until the table writes
//! to them) with the small parts (the tasks in flight, the queue of tasks back, the nodes), and the
//! [`TableSnapshot`] it returns encodes, task by task, to exactly the bytes of the position it
//! stands for. So the master's lock is held for the capture only, and the encoding runs elsewhere.

use super::chunks::ChunkedVec;
use super::mix::MixedSource;
use super::state::{
    InFlight, JobState, MixState, NodeEntry, NodeStatus, PlanError, SlotState, TaskSlot,
};
use super::{DecideConfig, JobOutcome, NodeId, TaskId};
use serde::ser::SerializeSeq;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fmt;

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
    /// The mixed sources' epoch could not be drawn again.
    #[error("data position: {0}")]
    Plan(#[from] PlanError),
}

impl JobState {
    /// Takes a snapshot of the task table.
    pub fn position(&self) -> DataPosition {
        let tasks = task_records(&self.slots, &self.in_flight).collect();
        let pending =
            pending_tasks(self.first_task_id, &self.requeued, &self.order, self.cursor).collect();
        DataPosition {
            epoch: self.epoch,
            first_task_id: self.first_task_id,
            tasks,
            pending,
            requeued: self.requeued.len(),
            nodes: self.node_records(),
            done_rows: self.done_rows,
            failed_rows: self.failed_rows,
            total_failures: self.total_failures,
            outcome: self.outcome.clone(),
            splits: Some(self.split_rows.len() as u32),
            following: self.following,
        }
    }

    /// Captures the task table for a snapshot: what [`JobState::position`] holds, without copying
    /// the tasks. The slots and the order are shared with the table until it writes to them; the
    /// tasks in flight, the queue of tasks back and the nodes are copied, and they are bounded by
    /// the nodes, not by the data.
    pub fn capture(&self) -> TableSnapshot {
        TableSnapshot(Table::Captured(Box::new(CapturedTable {
            epoch: self.epoch,
            first_task_id: self.first_task_id,
            slots: self.slots.clone(),
            in_flight: self.in_flight.clone(),
            requeued: self.requeued.clone(),
            order: self.order.clone(),
            cursor: self.cursor,
            nodes: self.node_records(),
            done_rows: self.done_rows,
            failed_rows: self.failed_rows,
            total_failures: self.total_failures,
            outcome: self.outcome.clone(),
            splits: self.split_rows.len() as u32,
            following: self.following,
        })))
    }

    fn node_records(&self) -> Vec<NodeRecord> {
        self.nodes
            .iter()
            .map(|(node, entry)| NodeRecord {
                node: *node,
                status: entry.status,
                failures: entry.failures,
            })
            .collect()
    }

    /// Rebuilds a task table from a snapshot over the same splits, checking that the snapshot
    /// belongs to them.
    ///
    /// Splits added after the position was taken (a followed source that grew since) get their
    /// tasks again, pending after the position's own.
    pub fn restore(
        config: DecideConfig,
        split_rows: Vec<u64>,
        position: DataPosition,
        mode: RestoreMode,
    ) -> Result<JobState, RestoreError> {
        JobState::restored(config, split_rows, None, position, mode)
    }

    /// Rebuilds the task table of a job that mixes `sources` from a snapshot over the same splits,
    /// drawing the epochs before the snapshot's again to find where the mix stands.
    pub fn restore_mixed(
        config: DecideConfig,
        split_rows: Vec<u64>,
        sources: &[MixedSource],
        position: DataPosition,
        mode: RestoreMode,
    ) -> Result<JobState, RestoreError> {
        JobState::restored(config, split_rows, Some(sources), position, mode)
    }

    fn restored(
        config: DecideConfig,
        mut split_rows: Vec<u64>,
        sources: Option<&[MixedSource]>,
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
        let mut slots = ChunkedVec::new();
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
        slots.shrink_to_fit();
        let mut mix = sources
            .map(|sources| MixState::new(&config, &split_rows, sources, position.epoch))
            .transpose()?;
        let epoch_rows: u64 = match &mut mix {
            Some(mix) => mix.plan()?.iter().map(|slot| slot.end - slot.start).sum(),
            None => split_rows.iter().sum(),
        };
        if position.done_rows + position.failed_rows + open != epoch_rows {
            return Err(RestoreError::RowsMismatch {
                done: position.done_rows,
                failed: position.failed_rows,
                open,
                epoch_rows,
            });
        }
        let requeued_count = position.requeued.min(position.pending.len());
        let mut requeued = VecDeque::with_capacity(requeued_count);
        let mut order = ChunkedVec::new();
        let mut listed = vec![false; slots.len()];
        for (index, task) in position.pending.iter().enumerate() {
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
            if index < requeued_count {
                requeued.push_back(slot as u32);
            } else {
                order.push(slot as u32);
            }
        }
        order.shrink_to_fit();
        let pending_slots = slots
            .iter()
            .filter(|task_slot| task_slot.state == SlotState::Pending)
            .count();
        if pending_slots != position.pending.len() {
            return Err(RestoreError::PendingMismatch {
                detail: format!(
                    "{pending_slots} tasks are pending but {} are listed",
                    position.pending.len()
                ),
            });
        }
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
            mix,
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

/// Every task of the table as a [`TaskRecord`], in slot order.
fn task_records<'table>(
    slots: &'table ChunkedVec<TaskSlot>,
    in_flight: &'table HashMap<u32, InFlight>,
) -> impl Iterator<Item = TaskRecord> + 'table {
    slots
        .iter()
        .enumerate()
        .map(move |(slot, task_slot)| TaskRecord {
            split: task_slot.split,
            start: task_slot.start,
            end: task_slot.end,
            failures: u32::from(task_slot.failures),
            status: match task_slot.state {
                SlotState::Pending => TaskStatus::Pending,
                SlotState::Done => TaskStatus::Done,
                SlotState::Failed => TaskStatus::Failed,
                SlotState::InFlight => {
                    let flight = in_flight
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
}

/// The pending tasks in the order they will be handed out: the queue of tasks back, then the
/// epoch's order from `cursor`.
fn pending_tasks<'table>(
    first_task_id: u64,
    requeued: &'table VecDeque<u32>,
    order: &'table ChunkedVec<u32>,
    cursor: usize,
) -> impl Iterator<Item = TaskId> + 'table {
    requeued
        .iter()
        .chain(order.iter_from(cursor))
        .map(move |slot| TaskId(first_task_id + u64::from(*slot)))
}

/// The task table in a snapshot: captured from a live table by [`JobState::capture`], or decoded
/// from a journal. It encodes exactly as the [`DataPosition`] it stands for, and decodes as one.
#[derive(Clone)]
pub struct TableSnapshot(Table);

#[derive(Clone)]
enum Table {
    Captured(Box<CapturedTable>),
    Decoded(DataPosition),
}

/// What [`JobState::position`] reads, shared or copied from the table at the capture.
#[derive(Clone)]
struct CapturedTable {
    epoch: u32,
    first_task_id: u64,
    slots: ChunkedVec<TaskSlot>,
    in_flight: HashMap<u32, InFlight>,
    requeued: VecDeque<u32>,
    order: ChunkedVec<u32>,
    cursor: usize,
    nodes: Vec<NodeRecord>,
    done_rows: u64,
    failed_rows: u64,
    total_failures: u32,
    outcome: Option<JobOutcome>,
    splits: u32,
    following: bool,
}

impl TableSnapshot {
    /// The position the snapshot stands for. Copies the tasks of a captured table.
    pub fn into_position(self) -> DataPosition {
        match self.0 {
            Table::Decoded(position) => position,
            Table::Captured(table) => table.position(),
        }
    }

    fn to_position(&self) -> DataPosition {
        self.clone().into_position()
    }
}

impl CapturedTable {
    fn pending(&self) -> impl Iterator<Item = TaskId> + '_ {
        pending_tasks(self.first_task_id, &self.requeued, &self.order, self.cursor)
    }

    fn pending_count(&self) -> usize {
        self.requeued.len() + self.order.len().saturating_sub(self.cursor)
    }

    fn position(&self) -> DataPosition {
        DataPosition {
            epoch: self.epoch,
            first_task_id: self.first_task_id,
            tasks: task_records(&self.slots, &self.in_flight).collect(),
            pending: self.pending().collect(),
            requeued: self.requeued.len(),
            nodes: self.nodes.clone(),
            done_rows: self.done_rows,
            failed_rows: self.failed_rows,
            total_failures: self.total_failures,
            outcome: self.outcome.clone(),
            splits: Some(self.splits),
            following: self.following,
        }
    }
}

/// A sequence of known length encoded element by element, without collecting it first.
struct Streamed<F>(F);

impl<F, I> Serialize for Streamed<F>
where
    F: Fn() -> (usize, I),
    I: Iterator,
    I::Item: Serialize,
{
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let (length, items) = (self.0)();
        let mut sequence = serializer.serialize_seq(Some(length))?;
        let mut written = 0;
        for item in items {
            sequence.serialize_element(&item)?;
            written += 1;
        }
        debug_assert_eq!(
            written, length,
            "a streamed sequence has the length it declared"
        );
        sequence.end()
    }
}

/// [`DataPosition`] field by field, borrowing a captured table: the encodings of the two must stay
/// identical (the journal's snapshots are decoded as a `DataPosition`), which the module's tests
/// check and the recorded journal of `tests/journal_format.rs` guards.
#[derive(Serialize)]
#[serde(
    rename = "DataPosition",
    bound(serialize = "Streamed<Tasks>: Serialize, Streamed<Pending>: Serialize")
)]
struct PositionFields<'table, Tasks, Pending> {
    epoch: u32,
    first_task_id: u64,
    tasks: Streamed<Tasks>,
    pending: Streamed<Pending>,
    requeued: usize,
    nodes: &'table [NodeRecord],
    done_rows: u64,
    failed_rows: u64,
    total_failures: u32,
    outcome: &'table Option<JobOutcome>,
    splits: Option<u32>,
    following: bool,
}

impl Serialize for TableSnapshot {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let table = match &self.0 {
            Table::Decoded(position) => return position.serialize(serializer),
            Table::Captured(table) => table,
        };
        PositionFields {
            epoch: table.epoch,
            first_task_id: table.first_task_id,
            tasks: Streamed(|| {
                (
                    table.slots.len(),
                    task_records(&table.slots, &table.in_flight),
                )
            }),
            pending: Streamed(|| (table.pending_count(), table.pending())),
            requeued: table.requeued.len(),
            nodes: &table.nodes,
            done_rows: table.done_rows,
            failed_rows: table.failed_rows,
            total_failures: table.total_failures,
            outcome: &table.outcome,
            splits: Some(table.splits),
            following: table.following,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for TableSnapshot {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<TableSnapshot, D::Error> {
        DataPosition::deserialize(deserializer)
            .map(|position| TableSnapshot(Table::Decoded(position)))
    }
}

impl From<DataPosition> for TableSnapshot {
    fn from(position: DataPosition) -> TableSnapshot {
        TableSnapshot(Table::Decoded(position))
    }
}

impl PartialEq for TableSnapshot {
    /// Compares the positions the two stand for, copying the tasks of a captured table.
    fn eq(&self, other: &TableSnapshot) -> bool {
        self.to_position() == other.to_position()
    }
}

impl fmt::Debug for TableSnapshot {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Table::Decoded(position) => formatter
                .debug_tuple("TableSnapshot::Decoded")
                .field(position)
                .finish(),
            Table::Captured(table) => formatter
                .debug_struct("TableSnapshot::Captured")
                .field("epoch", &table.epoch)
                .field("first_task_id", &table.first_task_id)
                .field("tasks", &table.slots.len())
                .field("pending", &table.pending_count())
                .field("in_flight", &table.in_flight.len())
                .finish_non_exhaustive(),
        }
    }
}

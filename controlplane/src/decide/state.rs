//! The task table and the handlers behind [`decide`](super::decide).
//!
//! # Implementation
//! Per-task state is kept small, because a job may have ten million tasks: a [`TaskSlot`] is 24
//! bytes (row range, split index, failure count, state) and the epoch's order adds 4 bytes per task,
//! so one task costs 28 bytes and ten million cost about 280 MB. What only in-flight tasks need (the
//! holder and the two counts, and a pending stop row) lives in a map keyed by slot, whose size is
//! bounded by the nodes' queues, not by the data.
//!
//! The slots and the order are [`ChunkedVec`]s: chunks of 4096 shared copy-on-write, so that a
//! snapshot captures the table ([`JobState::capture`]) in a few thousand reference-count
//! increments under the master's lock and encodes it elsewhere, while the table keeps changing.
//!
//! A task's slot index is its id minus the epoch's first task id. Pending tasks are, in order, the
//! `requeued` queue (re-split pieces at its front, tasks back from a failure or a lost node at its
//! back) and then `order[cursor..]`, the epoch's seeded order not yet handed out.

use super::chunks::ChunkedVec;
use super::mix::{MixCursor, MixedSource, Mixer};
use super::order::epoch_order;
use super::{
    Action, Assignment, DecideConfig, JobOutcome, NEAR_WINDOW, NodeId, Refusal, ReportOutcome,
    TaskId, TaskProgress,
};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

/// Why a job's data cannot be planned into tasks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The splits hold no rows at all.
    #[error("the job's {splits} splits hold no rows; check the sources and the filter")]
    NoRows {
        /// How many splits there were.
        splits: usize,
    },
    /// An epoch would have more tasks than the table can index.
    #[error(
        "an epoch would have {tasks} tasks, more than {max}; raise data.task_rows to {task_rows} or more so there are fewer"
    )]
    TooManyTasks {
        /// The tasks the epoch would have.
        tasks: u64,
        /// The most an epoch may have.
        max: u64,
        /// The least `task_rows` that makes few enough.
        task_rows: u64,
    },
    /// There are more splits than the table can index.
    #[error(
        "the job has {splits} splits, more than {max}; merge small files or raise the split size"
    )]
    TooManySplits {
        /// How many splits there were.
        splits: usize,
        /// The most a job may have.
        max: u64,
    },
    /// A source of a mix holds no rows, so its share cannot be drawn.
    #[error(
        "data.sources[{index}] holds no rows, so its weight's share of the mix cannot be drawn; check the source and its filter, or leave it out"
    )]
    MixedSourceEmpty {
        /// The source's index in `data.sources`.
        index: usize,
    },
    /// A source of a mix names a split the plan does not have.
    #[error(
        "data.sources[{index}] is mixed with split {split}, which the job's plan does not have"
    )]
    MixedSplitUnknown {
        /// The source's index in `data.sources`.
        index: usize,
        /// The split.
        split: u32,
    },
}

/// How many tasks of an epoch are in each state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TaskCounts {
    /// Waiting in the queue.
    pub pending: u64,
    /// Held by a node.
    pub in_flight: u64,
    /// Every row consumed.
    pub done: u64,
    /// Failed for good.
    pub failed: u64,
}

/// The lifecycle of one task slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum SlotState {
    Pending,
    InFlight,
    Done,
    Failed,
}

/// One task of the current epoch; 24 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct TaskSlot {
    /// First row not yet consumed by anyone before the current assignment.
    pub(super) start: u64,
    pub(super) end: u64,
    pub(super) split: u32,
    pub(super) failures: u16,
    pub(super) state: SlotState,
}

/// What the AM knows of a task in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct InFlight {
    pub(super) node: NodeId,
    pub(super) enqueued: u64,
    pub(super) consumed: u64,
    /// The stop row asked of the holder and not yet acknowledged.
    pub(super) stop_at: Option<u64>,
}

/// The liveness of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum NodeStatus {
    /// Heard from within the heartbeat timeout.
    Alive,
    /// Missed its heartbeat timeout; fenced until it registers again holding nothing.
    Lost,
    /// Failed too many tasks; refused for the rest of the job.
    Blacklisted,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct NodeEntry {
    pub(super) status: NodeStatus,
    pub(super) last_seen_ms: u64,
    pub(super) failures: u32,
    /// Slots in flight on this node.
    pub(super) held: BTreeSet<u32>,
}

/// What the task table knows of one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeView {
    /// The node's standing.
    pub status: NodeStatus,
    /// When the AM last heard from it, on the AM's clock.
    pub last_seen_ms: u64,
    /// Its task failures so far.
    pub failures: u32,
    /// The tasks it holds.
    pub tasks_held: u32,
}

/// Where a task of the current epoch stands in its split: its rows `[start, end)`, from the first
/// row not consumed before its current assignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TaskSpan {
    /// The index of its split in the job's split list.
    pub split: u32,
    /// First row, inclusive.
    pub start: u64,
    /// Last row, exclusive.
    pub end: u64,
}

/// A task held by a node, with the counts the node last reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskInFlight {
    /// The task.
    pub task: TaskId,
    /// Its rows.
    pub span: TaskSpan,
    /// The node that holds it.
    pub node: NodeId,
    /// Rows written into the node's rings, relative to the span's start.
    pub enqueued: u64,
    /// Rows the node's trainers released, relative to the span's start.
    pub consumed: u64,
    /// The stop row asked of the holder and not yet acknowledged.
    pub stop_at: Option<u64>,
}

/// The AM's task table: the current epoch's tasks, the nodes, and the job's counters.
#[derive(Debug, Clone)]
pub struct JobState {
    pub(super) config: DecideConfig,
    pub(super) split_rows: Vec<u64>,
    pub(super) epoch: u32,
    pub(super) first_task_id: u64,
    pub(super) epoch_rows: u64,
    pub(super) slots: ChunkedVec<TaskSlot>,
    pub(super) order: ChunkedVec<u32>,
    pub(super) cursor: usize,
    pub(super) requeued: VecDeque<u32>,
    pub(super) in_flight: HashMap<u32, InFlight>,
    pub(super) nodes: BTreeMap<NodeId, NodeEntry>,
    pub(super) done_rows: u64,
    pub(super) failed_rows: u64,
    pub(super) total_failures: u32,
    pub(super) outcome: Option<JobOutcome>,
    /// Whether splits may still be added; the job does not succeed while they may.
    pub(super) following: bool,
    /// With sources mixed by weight, how the epochs are drawn.
    pub(super) mix: Option<MixState>,
}

/// The draws of a job that mixes its sources, and where the current epoch's tasks began.
#[derive(Debug, Clone)]
pub(super) struct MixState {
    mixer: Arc<Mixer>,
    /// The cursor at the start of the next epoch.
    next: MixCursor,
    /// The first row of each task the current epoch planned, by slot.
    starts: Arc<Vec<u64>>,
}

impl MixState {
    /// Mixes `sources`, ready to plan `epoch`.
    pub(super) fn new(
        config: &DecideConfig,
        split_rows: &[u64],
        sources: &[MixedSource],
        epoch: u32,
    ) -> Result<MixState, PlanError> {
        let mixer = Mixer::new(sources, split_rows, config.task_rows, config.seed)?;
        let next = mixer.cursor_at(epoch)?;
        Ok(MixState {
            mixer: Arc::new(mixer),
            next,
            starts: Arc::default(),
        })
    }

    /// Draws the next epoch's tasks, in the order they are handed out.
    pub(super) fn plan(&mut self) -> Result<Vec<TaskSlot>, PlanError> {
        let (drawn, next) = self.mixer.draw_epoch(&self.next)?;
        self.next = next;
        self.starts = Arc::new(drawn.iter().map(|task| task.start).collect());
        Ok(drawn
            .into_iter()
            .map(|task| TaskSlot {
                start: task.start,
                end: task.end,
                split: task.split,
                failures: 0,
                state: SlotState::Pending,
            })
            .collect())
    }
}

/// The largest number of splits, so that a split index fits in `u32`.
const MAX_SLOTS: u64 = u32::MAX as u64;

/// The most tasks an epoch may have: the table keeps a few dozen bytes per task (about 300 MiB at
/// ten million, see BENCHMARKS.md), so this bounds the AM's memory near 1.5 GiB.
pub const MAX_EPOCH_TASKS: u64 = 50_000_000;

impl JobState {
    /// Plans epoch 0 over splits with the given row counts; a split's index in `split_rows` is the
    /// split index carried by its tasks.
    pub fn new(config: DecideConfig, split_rows: Vec<u64>) -> Result<JobState, PlanError> {
        JobState::planned(config, split_rows, None)
    }

    /// Plans epoch 0 over splits drawn from the mixed `sources` by weight (see
    /// [`mix`](super::mix)); a split's index in `split_rows` is the split index carried by its
    /// tasks.
    pub fn mixed(
        config: DecideConfig,
        split_rows: Vec<u64>,
        sources: &[MixedSource],
    ) -> Result<JobState, PlanError> {
        JobState::planned(config, split_rows, Some(sources))
    }

    fn planned(
        config: DecideConfig,
        split_rows: Vec<u64>,
        sources: Option<&[MixedSource]>,
    ) -> Result<JobState, PlanError> {
        if split_rows.len() as u64 > MAX_SLOTS {
            return Err(PlanError::TooManySplits {
                splits: split_rows.len(),
                max: MAX_SLOTS,
            });
        }
        let epoch_rows: u64 = split_rows.iter().sum();
        // A followed source may start empty: its rows come while the job runs.
        if epoch_rows == 0 && !config.follow {
            return Err(PlanError::NoRows {
                splits: split_rows.len(),
            });
        }
        let task_rows = config.task_rows.max(1);
        let tasks: u64 = split_rows.iter().map(|rows| rows.div_ceil(task_rows)).sum();
        let mix = sources
            .map(|sources| MixState::new(&config, &split_rows, sources, 0))
            .transpose()?;
        if tasks > MAX_EPOCH_TASKS && mix.is_none() {
            return Err(PlanError::TooManyTasks {
                tasks,
                max: MAX_EPOCH_TASKS,
                task_rows: epoch_rows.div_ceil(MAX_EPOCH_TASKS),
            });
        }
        let mut state = JobState {
            config,
            split_rows,
            epoch: 0,
            first_task_id: 0,
            epoch_rows,
            slots: ChunkedVec::new(),
            order: ChunkedVec::new(),
            cursor: 0,
            requeued: VecDeque::new(),
            in_flight: HashMap::new(),
            nodes: BTreeMap::new(),
            done_rows: 0,
            failed_rows: 0,
            total_failures: 0,
            outcome: None,
            following: config.follow,
            mix,
        };
        state.plan_epoch(0)?;
        Ok(state)
    }

    /// Cuts every split into tasks for `epoch` and shuffles their order; with mixed sources, draws
    /// the epoch's tasks instead, in the order drawn.
    fn plan_epoch(&mut self, epoch: u32) -> Result<(), PlanError> {
        let mut slots = ChunkedVec::new();
        if let Some(mix) = &mut self.mix {
            for slot in mix.plan()? {
                slots.push(slot);
            }
            self.order = (0..slots.len() as u32).collect();
            self.epoch_rows = slots.iter().map(|slot| slot.end - slot.start).sum();
        } else {
            let task_rows = self.config.task_rows.max(1);
            for (split, rows) in self.split_rows.iter().enumerate() {
                let mut start = 0;
                while start < *rows {
                    let end = (start + task_rows).min(*rows);
                    slots.push(TaskSlot {
                        start,
                        end,
                        split: split as u32,
                        failures: 0,
                        state: SlotState::Pending,
                    });
                    start = end;
                }
            }
            self.order = epoch_order(slots.len() as u32, self.config.seed, epoch)
                .into_iter()
                .collect();
        }
        slots.shrink_to_fit();
        self.order.shrink_to_fit();
        self.slots = slots;
        self.epoch = epoch;
        self.cursor = 0;
        self.requeued.clear();
        self.in_flight.clear();
        self.done_rows = 0;
        self.failed_rows = 0;
        Ok(())
    }

    /// Where the task in `slot` of the current epoch began, when the sources are mixed and the
    /// epoch planned it: a mixed epoch's tasks are not laid out split by split.
    pub fn mixed_origin(&self, slot: u32) -> Option<u64> {
        self.mix.as_ref()?.starts.get(slot as usize).copied()
    }

    /// The rows of the epochs before the current one.
    pub fn rows_before_epoch(&self) -> u64 {
        match &self.mix {
            Some(mix) => mix.next.rows_drawn() - self.epoch_rows,
            None => u64::from(self.epoch) * self.epoch_rows,
        }
    }

    /// Whether the sources are mixed by weight.
    pub fn is_mixed(&self) -> bool {
        self.mix.is_some()
    }

    /// Whether splits may still be added to the job.
    pub fn following(&self) -> bool {
        self.following
    }

    /// How splits with these row counts would take the table past its limits, if they would.
    pub fn past_limits(&self, split_rows: &[u64]) -> Option<String> {
        let task_rows = self.config.task_rows.max(1);
        let splits = self.split_rows.len() as u64 + split_rows.len() as u64;
        let tasks = self.slots.len() as u64
            + split_rows
                .iter()
                .map(|rows| rows.div_ceil(task_rows))
                .sum::<u64>();
        (splits > MAX_SLOTS || tasks > MAX_EPOCH_TASKS).then(|| {
            format!(
                "the job would have {splits} splits and {tasks} tasks, more than {MAX_SLOTS} splits or {MAX_EPOCH_TASKS} tasks"
            )
        })
    }

    /// How many splits the job has, the added ones included.
    pub fn split_count(&self) -> usize {
        self.split_rows.len()
    }

    /// The current epoch.
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// How the job ended, once it has.
    pub fn outcome(&self) -> Option<&JobOutcome> {
        self.outcome.as_ref()
    }

    /// Tasks in the current epoch's table, including re-split pieces.
    pub fn task_count(&self) -> usize {
        self.slots.len()
    }

    /// Rows of the current epoch consumed so far.
    pub fn done_rows(&self) -> u64 {
        self.done_rows
    }

    /// Rows of the current epoch that belong to failed tasks.
    pub fn failed_rows(&self) -> u64 {
        self.failed_rows
    }

    /// Rows in one epoch.
    pub fn epoch_rows(&self) -> u64 {
        self.epoch_rows
    }

    /// Tasks waiting to be handed out.
    pub fn pending_count(&self) -> usize {
        self.requeued.len() + (self.order.len() - self.cursor)
    }

    /// Tasks currently held by nodes.
    pub fn in_flight_count(&self) -> usize {
        self.in_flight.len()
    }

    /// The id of the current epoch's first task; the epoch's tasks are numbered on from it.
    pub fn first_task_id(&self) -> u64 {
        self.first_task_id
    }

    /// The rows of the task at `index` of the current epoch (its id minus
    /// [`JobState::first_task_id`]), if the epoch has that many tasks.
    pub fn task_span(&self, index: u32) -> Option<TaskSpan> {
        self.slots.get(index as usize).map(|task_slot| TaskSpan {
            split: task_slot.split,
            start: task_slot.start,
            end: task_slot.end,
        })
    }

    /// Every task of the current epoch, in task order: its rows, and whether it is done.
    pub fn task_spans(&self) -> impl Iterator<Item = (TaskSpan, bool)> + '_ {
        self.slots.iter().map(|task_slot| {
            let span = TaskSpan {
                split: task_slot.split,
                start: task_slot.start,
                end: task_slot.end,
            };
            (span, task_slot.state == SlotState::Done)
        })
    }

    /// The split of every task of the current epoch, in task order.
    pub fn task_splits(&self) -> impl Iterator<Item = u32> + '_ {
        self.slots.iter().map(|task_slot| task_slot.split)
    }

    /// Every node that ever registered, in node order.
    pub fn nodes(&self) -> impl Iterator<Item = (NodeId, NodeView)> + '_ {
        self.nodes.iter().map(|(node, entry)| {
            (
                *node,
                NodeView {
                    status: entry.status,
                    last_seen_ms: entry.last_seen_ms,
                    failures: entry.failures,
                    tasks_held: entry.held.len() as u32,
                },
            )
        })
    }

    /// The nodes alive now, in node order.
    pub fn alive_nodes(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.nodes
            .iter()
            .filter(|(_, entry)| entry.status == NodeStatus::Alive)
            .map(|(node, _)| *node)
    }

    /// The tasks in flight, in no particular order.
    pub fn tasks_in_flight(&self) -> impl Iterator<Item = TaskInFlight> + '_ {
        self.in_flight.iter().map(|(slot, flight)| {
            let task_slot = &self.slots[*slot as usize];
            TaskInFlight {
                task: self.task_id(*slot),
                span: TaskSpan {
                    split: task_slot.split,
                    start: task_slot.start,
                    end: task_slot.end,
                },
                node: flight.node,
                enqueued: flight.enqueued,
                consumed: flight.consumed,
                stop_at: flight.stop_at,
            }
        })
    }

    /// Sets when the AM last heard from each node listed that the table knows, as a snapshot
    /// recorded it; nodes it does not list keep their time.
    pub fn restore_last_seen(&mut self, last_seen_ms: &BTreeMap<NodeId, u64>) {
        for (node, seen_ms) in last_seen_ms {
            if let Some(entry) = self.nodes.get_mut(node) {
                entry.last_seen_ms = *seen_ms;
            }
        }
    }

    /// How many tasks of the current epoch are in each state, counted without copying the table.
    pub fn task_counts(&self) -> TaskCounts {
        let mut counts = TaskCounts::default();
        for task_slot in self.slots.iter() {
            match task_slot.state {
                SlotState::Pending => counts.pending += 1,
                SlotState::InFlight => counts.in_flight += 1,
                SlotState::Done => counts.done += 1,
                SlotState::Failed => counts.failed += 1,
            }
        }
        counts
    }

    /// The status of a node, if it ever registered.
    pub fn node_status(&self, node: NodeId) -> Option<NodeStatus> {
        self.nodes.get(&node).map(|entry| entry.status)
    }

    /// An estimate of the heap and inline bytes the table uses: the task slots, the order, the
    /// queues, the in-flight map and the nodes. Allocator overhead is not counted.
    pub fn memory_estimate_bytes(&self) -> usize {
        use std::mem::size_of;
        let in_flight_entry = size_of::<(u32, InFlight)>() + 1; // hashbrown: one control byte each
        let held_entry = size_of::<u32>() * 2; // B-tree nodes are at least half full
        size_of::<JobState>()
            + self.split_rows.capacity() * size_of::<u64>()
            + self.slots.memory_bytes()
            + self.order.memory_bytes()
            + self.requeued.capacity() * size_of::<u32>()
            + self.in_flight.capacity() * in_flight_entry
            + self.nodes.len() * (size_of::<(NodeId, NodeEntry)>() + size_of::<usize>())
            + self.in_flight.len() * held_entry
    }

    pub(super) fn task_id(&self, slot: u32) -> TaskId {
        TaskId(self.first_task_id + u64::from(slot))
    }

    /// The assignment of a slot as the table has it now: its rows from the current assignment's start.
    fn assignment_of(&self, slot: u32) -> Assignment {
        let task_slot = &self.slots[slot as usize];
        Assignment {
            task: self.task_id(slot),
            epoch: self.epoch,
            split: task_slot.split,
            start: task_slot.start,
            end: task_slot.end,
        }
    }

    pub(super) fn slot_of(&self, task: TaskId) -> Option<u32> {
        let slot = task.0.checked_sub(self.first_task_id)?;
        (slot < self.slots.len() as u64).then_some(slot as u32)
    }

    /// Checks the node's standing and records that it was heard from. Returns `false`, after
    /// pushing the one answer, when the event must not be applied.
    fn admit(&mut self, node: NodeId, now_ms: u64, actions: &mut Vec<Action>) -> bool {
        let Some(entry) = self.nodes.get_mut(&node) else {
            actions.push(Action::Refuse {
                node,
                reason: Refusal::UnknownNode,
            });
            return false;
        };
        match entry.status {
            NodeStatus::Lost => {
                actions.push(Action::Fence { node });
                false
            }
            NodeStatus::Blacklisted => {
                actions.push(Action::Refuse {
                    node,
                    reason: Refusal::Blacklisted,
                });
                false
            }
            NodeStatus::Alive => {
                entry.last_seen_ms = entry.last_seen_ms.max(now_ms);
                if self.outcome.is_some() {
                    actions.push(Action::Shutdown { node });
                    return false;
                }
                true
            }
        }
    }

    pub(super) fn on_register(
        &mut self,
        node: NodeId,
        now_ms: u64,
        held: Vec<TaskProgress>,
        actions: &mut Vec<Action>,
    ) {
        match self.nodes.get(&node).map(|entry| entry.status) {
            None | Some(NodeStatus::Lost) => {
                if !held.is_empty() {
                    // A new node, or one that was declared lost, must start from nothing: what it
                    // holds may have been handed to someone else.
                    actions.push(Action::Fence { node });
                    return;
                }
                let failures = self.nodes.get(&node).map_or(0, |entry| entry.failures);
                self.nodes.insert(
                    node,
                    NodeEntry {
                        status: NodeStatus::Alive,
                        last_seen_ms: now_ms,
                        failures,
                        held: BTreeSet::new(),
                    },
                );
                if self.outcome.is_some() {
                    actions.push(Action::Shutdown { node });
                    return;
                }
                actions.push(Action::Registered {
                    node,
                    kept: 0,
                    requeued: 0,
                });
            }
            Some(NodeStatus::Blacklisted) => actions.push(Action::Refuse {
                node,
                reason: Refusal::Blacklisted,
            }),
            Some(NodeStatus::Alive) => {
                if !self.admit(node, now_ms, actions) {
                    return;
                }
                let reported: BTreeSet<TaskId> =
                    held.iter().map(|progress| progress.task).collect();
                let mut kept = 0;
                for progress in held {
                    if self.apply_progress(node, progress, actions) {
                        kept += 1;
                    }
                }
                let forgotten: Vec<u32> = self
                    .nodes
                    .get(&node)
                    .map(|entry| {
                        entry
                            .held
                            .iter()
                            .copied()
                            .filter(|slot| !reported.contains(&self.task_id(*slot)))
                            .collect()
                    })
                    .unwrap_or_default();
                let requeued = forgotten.len() as u32;
                for slot in forgotten {
                    self.requeue_in_flight(slot, false, actions);
                }
                actions.push(Action::Registered {
                    node,
                    kept,
                    requeued,
                });
                // The restarted daemon knows the tasks it kept by their ids and counts only; it
                // resumes them from the assignments as the table has them.
                let resumed: Vec<Assignment> = self
                    .nodes
                    .get(&node)
                    .map(|entry| {
                        entry
                            .held
                            .iter()
                            .map(|slot| self.assignment_of(*slot))
                            .collect()
                    })
                    .unwrap_or_default();
                if !resumed.is_empty() {
                    actions.push(Action::Resume {
                        node,
                        tasks: resumed,
                    });
                }
                // The restarted daemon forgot any stop it was asked for; ask again.
                let stops: Vec<(u32, u64)> = self
                    .nodes
                    .get(&node)
                    .map(|entry| {
                        entry
                            .held
                            .iter()
                            .filter_map(|slot| {
                                let stop = self.in_flight.get(slot)?.stop_at?;
                                Some((*slot, stop))
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                for (slot, row) in stops {
                    actions.push(Action::StopAt {
                        node,
                        task: self.task_id(slot),
                        row,
                    });
                }
                self.check_outcome(actions);
            }
        }
    }

    pub(super) fn on_heartbeat(
        &mut self,
        node: NodeId,
        now_ms: u64,
        progress: Vec<TaskProgress>,
        actions: &mut Vec<Action>,
    ) {
        if !self.admit(node, now_ms, actions) {
            return;
        }
        for entry in progress {
            self.apply_progress(node, entry, actions);
        }
        self.check_outcome(actions);
    }

    /// Finds the in-flight record of `task` on `node`, or pushes the refusal.
    fn held_slot(&self, node: NodeId, task: TaskId, actions: &mut Vec<Action>) -> Option<u32> {
        let Some(slot) = self.slot_of(task) else {
            actions.push(Action::Refuse {
                node,
                reason: Refusal::UnknownTask(task),
            });
            return None;
        };
        match self.in_flight.get(&slot) {
            Some(flight) if flight.node == node => Some(slot),
            _ => {
                actions.push(Action::Refuse {
                    node,
                    reason: Refusal::NotHeld(task),
                });
                None
            }
        }
    }

    /// Applies one task's counts; returns whether they were accepted.
    fn apply_progress(
        &mut self,
        node: NodeId,
        progress: TaskProgress,
        actions: &mut Vec<Action>,
    ) -> bool {
        // A daemon may report a task consumed to its end again until it learns that the AM's
        // record of its end is durable: there is nothing more to take from it.
        if self
            .slot_of(progress.task)
            .is_some_and(|slot| self.slots[slot as usize].state == SlotState::Done)
        {
            return false;
        }
        let Some(slot) = self.held_slot(node, progress.task, actions) else {
            return false;
        };
        let task_slot = self.slots[slot as usize];
        let rows = task_slot.end - task_slot.start;
        if progress.enqueued > rows || progress.consumed > progress.enqueued {
            actions.push(Action::Refuse {
                node,
                reason: Refusal::CountOutOfRange {
                    task: progress.task,
                    enqueued: progress.enqueued,
                    consumed: progress.consumed,
                    rows,
                },
            });
            return false;
        }
        self.record_consumed(slot, progress.consumed);
        if let Some(flight) = self.in_flight.get_mut(&slot) {
            flight.enqueued = flight.enqueued.max(progress.enqueued);
        }
        self.complete_if_consumed(slot, actions);
        true
    }

    /// Raises a slot's consumed count (counts never go back) and the epoch's done rows with it.
    fn record_consumed(&mut self, slot: u32, consumed: u64) {
        if let Some(flight) = self.in_flight.get_mut(&slot)
            && consumed > flight.consumed
        {
            self.done_rows += consumed - flight.consumed;
            flight.consumed = consumed;
            flight.enqueued = flight.enqueued.max(consumed);
        }
    }

    /// Marks a slot done if every row of it is consumed.
    fn complete_if_consumed(&mut self, slot: u32, actions: &mut Vec<Action>) {
        let task_slot = self.slots[slot as usize];
        let Some(flight) = self.in_flight.get(&slot) else {
            return;
        };
        if flight.consumed < task_slot.end - task_slot.start {
            return;
        }
        let holder = flight.node;
        self.in_flight.remove(&slot);
        if let Some(entry) = self.nodes.get_mut(&holder) {
            entry.held.remove(&slot);
        }
        self.slots[slot as usize].state = SlotState::Done;
        actions.push(Action::TaskDone {
            task: self.task_id(slot),
        });
    }

    /// Takes a slot off its holder and queues the rows not yet consumed; `front` puts it first.
    fn requeue_in_flight(&mut self, slot: u32, front: bool, actions: &mut Vec<Action>) {
        let Some(flight) = self.in_flight.remove(&slot) else {
            return;
        };
        if let Some(entry) = self.nodes.get_mut(&flight.node) {
            entry.held.remove(&slot);
        }
        let task_slot = &mut self.slots[slot as usize];
        task_slot.start += flight.consumed;
        debug_assert!(
            task_slot.start < task_slot.end,
            "a fully consumed slot is done"
        );
        task_slot.state = SlotState::Pending;
        let from_row = task_slot.start;
        if front {
            self.requeued.push_front(slot);
        } else {
            self.requeued.push_back(slot);
        }
        actions.push(Action::TaskRequeued {
            task: self.task_id(slot),
            from_row,
        });
    }

    /// Moves the tasks `near` that are pending among the next [`NEAR_WINDOW`] of the order to its
    /// front, in the order given, each swapping places with the task it displaces.
    fn bring_forward(&mut self, near: &[TaskId]) {
        let end = self.order.len().min(self.cursor + NEAR_WINDOW);
        let mut front = self.cursor;
        for task in near {
            let Some(slot) = task
                .0
                .checked_sub(self.first_task_id)
                .and_then(|index| u32::try_from(index).ok())
            else {
                continue;
            };
            if let Some(at) = (front..end).find(|at| self.order[*at] == slot) {
                let displaced = self.order[front];
                self.order[front] = slot;
                self.order[at] = displaced;
                front += 1;
            }
        }
    }

    /// Moves the tasks `first` that are pending in the epoch's order to its front, in the order
    /// given; the tasks they displace keep their order after them. A task handed out already, or
    /// of another epoch, is passed over.
    pub(super) fn bring_to_front(&mut self, first: &[TaskId]) {
        let mut rank: HashMap<u32, usize> = HashMap::new();
        for task in first {
            if let Some(slot) = self.slot_of(*task) {
                let next = rank.len();
                rank.entry(slot).or_insert(next);
            }
        }
        if rank.is_empty() {
            return;
        }
        let pending: Vec<u32> = self.order.iter_from(self.cursor).copied().collect();
        let (mut front, rest): (Vec<u32>, Vec<u32>) = pending
            .into_iter()
            .partition(|slot| rank.contains_key(slot));
        front.sort_by_key(|slot| rank[slot]);
        for (at, slot) in front.into_iter().chain(rest).enumerate() {
            self.order[self.cursor + at] = slot;
        }
    }

    /// Cuts the split rows `rows` out of the pending tasks of the epoch's order that hold them, into
    /// tasks of their own at the order's front, in the order given; each cut task keeps the rest of
    /// its rows at its place in the order, in as many pieces as the cuts leave. Rows of no task
    /// pending in the order (handed out already, or queued again) are passed over, and so is every
    /// cut of a mixed epoch, whose tasks are not laid out split by split, or one past the tasks an
    /// epoch can hold.
    pub(super) fn carve_to_front(&mut self, rows: &[TaskSpan]) {
        if self.mix.is_some() || rows.is_empty() {
            return;
        }
        // The spans of each split by first row, with where each stands in `rows`.
        let mut by_split: HashMap<u32, Vec<(u64, u64, usize)>> = HashMap::new();
        for (rank, span) in rows.iter().enumerate() {
            if span.start < span.end {
                by_split
                    .entry(span.split)
                    .or_default()
                    .push((span.start, span.end, rank));
            }
        }
        // Overlapping spans merge, at the first rank, so that their ends rise with their starts.
        for spans in by_split.values_mut() {
            spans.sort_unstable();
            let mut merged: Vec<(u64, u64, usize)> = Vec::with_capacity(spans.len());
            for &(start, end, rank) in spans.iter() {
                match merged.last_mut() {
                    Some(last) if start < last.1 => {
                        last.1 = last.1.max(end);
                        last.2 = last.2.min(rank);
                    }
                    _ => merged.push((start, end, rank)),
                }
            }
            *spans = merged;
        }
        let pending: Vec<u32> = self.order.iter_from(self.cursor).copied().collect();
        // The carved tasks, keyed by where their rows stand in `rows`; the rest, in order.
        let mut front: Vec<(usize, u64, u32)> = Vec::new();
        let mut rest: Vec<u32> = Vec::with_capacity(pending.len());
        for slot in pending {
            let task_slot = self.slots[slot as usize];
            let Some(spans) = by_split.get(&task_slot.split) else {
                rest.push(slot);
                continue;
            };
            // Each piece: its rows, and the rank of the span it carves, if it does.
            let mut pieces: Vec<(u64, u64, Option<usize>)> = Vec::new();
            let mut at = task_slot.start;
            let first = spans.partition_point(|span| span.1 <= task_slot.start);
            for &(start, end, rank) in &spans[first..] {
                if start >= task_slot.end {
                    break;
                }
                let (start, end) = (start.max(at), end.min(task_slot.end));
                if at < start {
                    pieces.push((at, start, None));
                }
                pieces.push((start, end, Some(rank)));
                at = end;
            }
            if pieces.is_empty() || self.slots.len() + pieces.len() > MAX_SLOTS as usize {
                rest.push(slot);
                continue;
            }
            if at < task_slot.end {
                pieces.push((at, task_slot.end, None));
            }
            for (index, (start, end, rank)) in pieces.into_iter().enumerate() {
                let piece = if index == 0 {
                    self.slots[slot as usize].end = end;
                    slot
                } else {
                    self.slots.push(TaskSlot {
                        start,
                        end,
                        ..task_slot
                    });
                    self.slots.len() as u32 - 1
                };
                match rank {
                    Some(rank) => front.push((rank, start, piece)),
                    None => rest.push(piece),
                }
            }
        }
        front.sort_unstable();
        let carved = front.into_iter().map(|(_, _, slot)| slot);
        for (at, slot) in carved.chain(rest).enumerate() {
            let index = self.cursor + at;
            if index < self.order.len() {
                self.order[index] = slot;
            } else {
                self.order.push(slot);
            }
        }
    }

    /// The next [`NEAR_WINDOW`] tasks of the epoch's order not yet handed out, with their rows.
    pub fn pending_window(&self) -> impl Iterator<Item = (TaskId, TaskSpan)> + '_ {
        self.order
            .iter_from(self.cursor)
            .take(NEAR_WINDOW)
            .map(|slot| {
                let task_slot = &self.slots[*slot as usize];
                let span = TaskSpan {
                    split: task_slot.split,
                    start: task_slot.start,
                    end: task_slot.end,
                };
                (self.task_id(*slot), span)
            })
    }

    /// The next task to hand out: a task queued again first, unless `order_only`.
    fn next_pending(&mut self, order_only: bool) -> Option<u32> {
        if !order_only && let Some(slot) = self.requeued.pop_front() {
            return Some(slot);
        }
        let slot = *self.order.get(self.cursor)?;
        self.cursor += 1;
        Some(slot)
    }

    /// Hands `node` up to `max_tasks` tasks. `dry` is whether one of its rings has nothing left to
    /// write, when it tells (`even_batches`): a node that has none gets no task queued again and
    /// triggers no re-split.
    pub(super) fn on_acquire(
        &mut self,
        node: NodeId,
        now_ms: u64,
        max_tasks: u32,
        near: &[TaskId],
        dry: Option<bool>,
        actions: &mut Vec<Action>,
    ) {
        if !self.admit(node, now_ms, actions) {
            return;
        }
        self.bring_forward(near);
        let full = dry == Some(false);
        let mut tasks = Vec::new();
        while tasks.len() < max_tasks as usize {
            let Some(slot) = self.next_pending(full) else {
                break;
            };
            let task_slot = &mut self.slots[slot as usize];
            debug_assert_eq!(task_slot.state, SlotState::Pending);
            task_slot.state = SlotState::InFlight;
            let assignment = self.assignment_of(slot);
            self.in_flight.insert(
                slot,
                InFlight {
                    node,
                    enqueued: 0,
                    consumed: 0,
                    stop_at: None,
                },
            );
            if let Some(entry) = self.nodes.get_mut(&node) {
                entry.held.insert(slot);
            }
            tasks.push(assignment);
        }
        if !tasks.is_empty() {
            actions.push(Action::Assign { node, tasks });
            return;
        }
        let idle = self
            .nodes
            .get(&node)
            .is_some_and(|entry| entry.held.is_empty());
        if (idle || (self.config.even_batches && !full)) && max_tasks > 0 {
            self.request_resplit(node, actions);
        }
    }

    /// Asks the holder of the task with the most rows not yet enqueued to stop early, so that an
    /// idle node can take the rest once the holder acknowledges.
    fn request_resplit(&mut self, idle: NodeId, actions: &mut Vec<Action>) {
        if self.slots.len() as u64 >= MAX_SLOTS {
            return;
        }
        let margin = self.config.resplit_margin_rows;
        let victim = self
            .in_flight
            .iter()
            .filter(|(_, flight)| {
                (flight.node != idle || self.config.even_batches) && flight.stop_at.is_none()
            })
            .map(|(slot, flight)| {
                let task_slot = &self.slots[*slot as usize];
                let position = task_slot.start + flight.enqueued;
                (task_slot.end - position, std::cmp::Reverse(*slot), position)
            })
            .max();
        let Some((unread, std::cmp::Reverse(slot), position)) = victim else {
            return;
        };
        if unread <= margin {
            return;
        }
        // The holder keeps the margin and half of what is beyond it; the idle node gets the rest.
        let beyond_margin = unread - margin;
        let stop_row = position + margin + beyond_margin / 2;
        let end = self.slots[slot as usize].end;
        if end - stop_row < self.config.resplit_min_rows.max(1) {
            return;
        }
        let Some(flight) = self.in_flight.get_mut(&slot) else {
            return;
        };
        flight.stop_at = Some(stop_row);
        let holder = flight.node;
        actions.push(Action::StopAt {
            node: holder,
            task: self.task_id(slot),
            row: stop_row,
        });
    }

    pub(super) fn on_stop_ack(
        &mut self,
        node: NodeId,
        now_ms: u64,
        task: TaskId,
        stop_row: u64,
        actions: &mut Vec<Action>,
    ) {
        if !self.admit(node, now_ms, actions) {
            return;
        }
        let Some(slot) = self.held_slot(node, task, actions) else {
            return;
        };
        let Some(flight) = self.in_flight.get(&slot).copied() else {
            return;
        };
        if flight.stop_at.is_none() {
            actions.push(Action::Refuse {
                node,
                reason: Refusal::NoStopRequested(task),
            });
            return;
        }
        let task_slot = self.slots[slot as usize];
        let min = task_slot.start + flight.enqueued.max(flight.consumed);
        if stop_row < min || stop_row > task_slot.end {
            actions.push(Action::Refuse {
                node,
                reason: Refusal::StopRowOutOfRange {
                    task,
                    stop_row,
                    min,
                    max: task_slot.end,
                },
            });
            return;
        }
        if let Some(flight) = self.in_flight.get_mut(&slot) {
            flight.stop_at = None;
        }
        if stop_row < task_slot.end {
            let child = self.slots.len() as u32;
            self.slots.push(TaskSlot {
                start: stop_row,
                end: task_slot.end,
                split: task_slot.split,
                failures: 0,
                state: SlotState::Pending,
            });
            self.slots[slot as usize].end = stop_row;
            self.requeued.push_front(child);
            actions.push(Action::TaskSplit {
                parent: task,
                child: self.task_id(child),
                at_row: stop_row,
            });
            self.complete_if_consumed(slot, actions);
        }
        self.check_outcome(actions);
    }

    pub(super) fn on_report(
        &mut self,
        node: NodeId,
        now_ms: u64,
        task: TaskId,
        consumed: u64,
        outcome: ReportOutcome,
        actions: &mut Vec<Action>,
    ) {
        if !self.admit(node, now_ms, actions) {
            return;
        }
        let Some(slot) = self.held_slot(node, task, actions) else {
            return;
        };
        let task_slot = self.slots[slot as usize];
        let rows = task_slot.end - task_slot.start;
        if consumed > rows {
            actions.push(Action::Refuse {
                node,
                reason: Refusal::CountOutOfRange {
                    task,
                    enqueued: consumed,
                    consumed,
                    rows,
                },
            });
            return;
        }
        match outcome {
            ReportOutcome::Done => {
                if consumed != rows {
                    actions.push(Action::Refuse {
                        node,
                        reason: Refusal::DoneBeforeEnd {
                            task,
                            consumed,
                            rows,
                        },
                    });
                    return;
                }
                self.record_consumed(slot, consumed);
                self.complete_if_consumed(slot, actions);
            }
            ReportOutcome::Failed { reason } => {
                self.record_consumed(slot, consumed);
                self.complete_if_consumed(slot, actions);
                if self.in_flight.contains_key(&slot) {
                    self.fail_attempt(node, slot, reason, actions);
                }
            }
        }
        self.check_outcome(actions);
    }

    /// Counts one failed attempt of an in-flight slot against the task, the node and the job.
    fn fail_attempt(&mut self, node: NodeId, slot: u32, reason: String, actions: &mut Vec<Action>) {
        self.total_failures = self.total_failures.saturating_add(1);
        let failures = {
            let task_slot = &mut self.slots[slot as usize];
            task_slot.failures = task_slot.failures.saturating_add(1);
            u32::from(task_slot.failures)
        };
        if failures >= self.config.max_task_attempts {
            let Some(flight) = self.in_flight.remove(&slot) else {
                return;
            };
            if let Some(entry) = self.nodes.get_mut(&node) {
                entry.held.remove(&slot);
            }
            let task_slot = &mut self.slots[slot as usize];
            task_slot.start += flight.consumed;
            task_slot.state = SlotState::Failed;
            self.failed_rows += task_slot.end - task_slot.start;
            actions.push(Action::TaskFailed {
                task: self.task_id(slot),
                attempts: failures,
                reason,
            });
        } else {
            self.requeue_in_flight(slot, false, actions);
        }
        let node_failures = match self.nodes.get_mut(&node) {
            Some(entry) => {
                entry.failures = entry.failures.saturating_add(1);
                entry.failures
            }
            None => return,
        };
        if node_failures >= self.config.blacklist_after_failures {
            self.take_node_out(node, NodeStatus::Blacklisted, actions);
        }
    }

    /// Marks a node lost or blacklisted and queues its tasks again.
    fn take_node_out(&mut self, node: NodeId, status: NodeStatus, actions: &mut Vec<Action>) {
        let held: Vec<u32> = match self.nodes.get_mut(&node) {
            Some(entry) => {
                entry.status = status;
                entry.held.iter().copied().collect()
            }
            None => return,
        };
        let requeued = held.len() as u32;
        for slot in held {
            self.requeue_in_flight(slot, false, actions);
        }
        match status {
            NodeStatus::Lost => actions.push(Action::NodeLost { node, requeued }),
            NodeStatus::Blacklisted => {
                actions.push(Action::NodeBlacklisted { node, requeued });
                actions.push(Action::Fence { node });
            }
            NodeStatus::Alive => {}
        }
    }

    /// Gives every node a full heartbeat timeout from `now_ms` before it can be declared lost, as
    /// [`RestoreMode::Resume`](super::RestoreMode::Resume) does, without rebuilding the table: an AM
    /// taking a job of ten million tasks over would otherwise hold a copy of the table as a
    /// [`DataPosition`](super::DataPosition) (72 bytes a task) beside two tables.
    pub fn grant_grace(&mut self, now_ms: u64) {
        for entry in self.nodes.values_mut() {
            entry.last_seen_ms = now_ms;
        }
    }

    /// Whether a live node has been silent for longer than the heartbeat timeout at `now_ms`: the
    /// only case in which a tick changes the table.
    pub fn has_expired_nodes(&self, now_ms: u64) -> bool {
        self.expired_nodes(now_ms).next().is_some()
    }

    fn expired_nodes(&self, now_ms: u64) -> impl Iterator<Item = NodeId> + '_ {
        let timeout = self.config.heartbeat_timeout_ms;
        self.nodes
            .iter()
            .filter(move |(_, entry)| {
                entry.status == NodeStatus::Alive
                    && now_ms.saturating_sub(entry.last_seen_ms) > timeout
            })
            .map(|(node, _)| *node)
    }

    pub(super) fn on_tick(&mut self, now_ms: u64, actions: &mut Vec<Action>) {
        let expired: Vec<NodeId> = self.expired_nodes(now_ms).collect();
        for node in expired {
            self.total_failures = self.total_failures.saturating_add(1);
            self.take_node_out(node, NodeStatus::Lost, actions);
        }
        self.check_outcome(actions);
    }

    pub(super) fn on_splits_added(&mut self, split_rows: Vec<u64>, actions: &mut Vec<Action>) {
        if self.outcome.is_some() {
            return;
        }
        if !self.following {
            self.finish(
                JobOutcome::Failed {
                    reason: format!(
                        "{} splits were added to a job that no longer follows its sources",
                        split_rows.len()
                    ),
                },
                actions,
            );
            return;
        }
        self.add_splits(split_rows, "following", "end following sooner", actions);
    }

    /// The splits of a source added at run time join the plan, and their tasks the current epoch:
    /// refused once the job is over (the master refuses the source before then).
    pub(super) fn on_source_added(&mut self, split_rows: Vec<u64>, actions: &mut Vec<Action>) {
        if self.outcome.is_some() {
            return;
        }
        self.add_splits(split_rows, "adding a source", "add fewer sources", actions);
    }

    /// Appends splits and their tasks, or fails the job when the table would grow past its limits
    /// (`doing` names what added them, `fix` what to do instead of raising `data.task_rows`).
    fn add_splits(
        &mut self,
        split_rows: Vec<u64>,
        doing: &str,
        fix: &str,
        actions: &mut Vec<Action>,
    ) {
        if let Some(past) = self.past_limits(&split_rows) {
            let reason = format!("{doing}: {past}; raise data.task_rows or {fix}");
            self.finish(JobOutcome::Failed { reason }, actions);
            return;
        }
        let added_splits = split_rows.len() as u32;
        let added_tasks = self.append_splits(split_rows);
        actions.push(Action::TasksAdded {
            splits: added_splits,
            tasks: added_tasks,
        });
        self.check_outcome(actions);
    }

    /// Appends splits and their pending tasks, in a seeded order of their own after every task
    /// already queued; returns how many tasks were added. The caller checks the table's limits.
    pub(super) fn append_splits(&mut self, split_rows: Vec<u64>) -> u32 {
        let task_rows = self.config.task_rows.max(1);
        let first_slot = self.slots.len() as u32;
        for rows in split_rows {
            let split = self.split_rows.len() as u32;
            self.split_rows.push(rows);
            self.epoch_rows += rows;
            let mut start = 0;
            while start < rows {
                let end = (start + task_rows).min(rows);
                self.slots.push(TaskSlot {
                    start,
                    end,
                    split,
                    failures: 0,
                    state: SlotState::Pending,
                });
                start = end;
            }
        }
        let added = self.slots.len() as u32 - first_slot;
        let seed = self.config.seed ^ u64::from(first_slot).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.order.extend(
            epoch_order(added, seed, self.epoch)
                .into_iter()
                .map(|offset| first_slot + offset),
        );
        added
    }

    pub(super) fn on_follow_ended(&mut self, actions: &mut Vec<Action>) {
        self.following = false;
        self.check_outcome(actions);
    }

    pub(super) fn on_failed(&mut self, reason: String, actions: &mut Vec<Action>) {
        if self.outcome.is_none() {
            self.finish(JobOutcome::Failed { reason }, actions);
        }
    }

    /// Applies the failover stop rules and starts the next epoch when this one is resolved.
    fn check_outcome(&mut self, actions: &mut Vec<Action>) {
        if self.outcome.is_some() {
            return;
        }
        let config = self.config;
        let total = self.epoch_rows as f64;
        let failed = self.failed_rows as f64;
        let done = self.done_rows as f64;
        let failure = if self.total_failures > config.max_total_failures {
            Some(format!(
                "{} failures (task failures and lost nodes) exceed failover.max_total_failures ({})",
                self.total_failures, config.max_total_failures
            ))
        } else if self.failed_rows > 0 && failed * 100.0 >= config.task_failed_percent * total {
            Some(format!(
                "epoch {}: {:.2}% of rows belong to failed tasks, reaching failover.task_failed_percent ({})",
                self.epoch,
                failed * 100.0 / total,
                config.task_failed_percent
            ))
        } else if failed * 100.0 > (100.0 - config.task_success_percent) * total {
            Some(format!(
                "epoch {}: {:.2}% of rows belong to failed tasks, so failover.task_success_percent ({}) cannot be reached",
                self.epoch,
                failed * 100.0 / total,
                config.task_success_percent
            ))
        } else {
            None
        };
        if let Some(reason) = failure {
            self.finish(JobOutcome::Failed { reason }, actions);
            return;
        }
        let last_epoch = self.epoch + 1 >= config.epochs;
        if last_epoch && !self.following && done * 100.0 >= config.task_success_percent * total {
            self.finish(JobOutcome::Succeeded, actions);
            return;
        }
        if !last_epoch && self.done_rows + self.failed_rows == self.epoch_rows {
            debug_assert!(self.in_flight.is_empty());
            let first_task_id = self.first_task_id + self.slots.len() as u64;
            if let Err(error) = self.plan_epoch(self.epoch + 1) {
                let reason = format!("epoch {}: {error}", self.epoch + 1);
                self.finish(JobOutcome::Failed { reason }, actions);
                return;
            }
            self.first_task_id = first_task_id;
            actions.push(Action::EpochStarted {
                epoch: self.epoch,
                tasks: self.slots.len() as u32,
            });
        }
    }

    fn finish(&mut self, outcome: JobOutcome, actions: &mut Vec<Action>) {
        self.outcome = Some(outcome.clone());
        actions.push(Action::JobFinished { outcome });
    }

    /// Checks the table's invariants: the open ranges of every split are disjoint, and done,
    /// failed and open rows add up to the epoch's rows; the queues and the in-flight map agree with
    /// the slots' states, and each node holds exactly its in-flight slots.
    #[cfg(test)]
    pub(super) fn check_invariants(&self) -> Result<(), String> {
        let mut open_rows = 0;
        let mut open_ranges: Vec<(u32, u64, u64)> = Vec::new();
        for (index, task_slot) in self.slots.iter().enumerate() {
            let slot = index as u32;
            if task_slot.start > task_slot.end {
                return Err(format!("slot {slot} has start past end: {task_slot:?}"));
            }
            match task_slot.state {
                SlotState::Pending => {
                    open_rows += task_slot.end - task_slot.start;
                    open_ranges.push((task_slot.split, task_slot.start, task_slot.end));
                    if self.in_flight.contains_key(&slot) {
                        return Err(format!("pending slot {slot} is in flight"));
                    }
                }
                SlotState::InFlight => {
                    let flight = self
                        .in_flight
                        .get(&slot)
                        .ok_or(format!("in-flight slot {slot} has no record"))?;
                    let rows = task_slot.end - task_slot.start;
                    if flight.consumed > rows || flight.enqueued > rows {
                        return Err(format!("slot {slot} counts past its end: {flight:?}"));
                    }
                    open_rows += rows - flight.consumed;
                    open_ranges.push((
                        task_slot.split,
                        task_slot.start + flight.consumed,
                        task_slot.end,
                    ));
                    let holder = self
                        .nodes
                        .get(&flight.node)
                        .ok_or(format!("slot {slot} held by unknown {}", flight.node))?;
                    if holder.status != NodeStatus::Alive || !holder.held.contains(&slot) {
                        return Err(format!(
                            "slot {slot} held by {} which does not hold it",
                            flight.node
                        ));
                    }
                }
                SlotState::Done | SlotState::Failed => {
                    if self.in_flight.contains_key(&slot) {
                        return Err(format!("finished slot {slot} is in flight"));
                    }
                }
            }
        }
        if self.done_rows + self.failed_rows + open_rows != self.epoch_rows {
            return Err(format!(
                "done {} + failed {} + open {open_rows} != epoch rows {}",
                self.done_rows, self.failed_rows, self.epoch_rows
            ));
        }
        // A mixed epoch may draw a source's pass twice (`next_pass`): its rows are open twice.
        if self.mix.is_some() {
            open_ranges.clear();
        }
        open_ranges.sort_unstable();
        for pair in open_ranges.windows(2) {
            if pair[0].0 == pair[1].0 && pair[0].2 > pair[1].1 {
                return Err(format!(
                    "open ranges overlap: {:?} and {:?}",
                    pair[0], pair[1]
                ));
            }
        }
        let mut queued: Vec<u32> = self.requeued.iter().copied().collect();
        queued.extend(self.order.iter_from(self.cursor).copied());
        let queued_count = queued.len();
        queued.sort_unstable();
        queued.dedup();
        let pending_count = self
            .slots
            .iter()
            .filter(|task_slot| task_slot.state == SlotState::Pending)
            .count();
        if queued.len() != queued_count || queued_count != pending_count {
            return Err(format!(
                "queues hold {queued_count} entries ({} distinct) for {pending_count} pending slots",
                queued.len()
            ));
        }
        if let Some(slot) = queued
            .iter()
            .find(|slot| self.slots[**slot as usize].state != SlotState::Pending)
        {
            return Err(format!("queued slot {slot} is not pending"));
        }
        let held_total: usize = self.nodes.values().map(|entry| entry.held.len()).sum();
        if held_total != self.in_flight.len() {
            return Err(format!(
                "nodes hold {held_total} slots but {} are in flight",
                self.in_flight.len()
            ));
        }
        Ok(())
    }
}
